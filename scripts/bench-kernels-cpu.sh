#!/usr/bin/env bash
# Issue 37's kernel-bench bar: kb-sim's coroutine executor against the fair
# SimPy + greenlet peer (shared/peer/simpy_greenlet_fair.py, 64 PEs x 200
# iterations), by CPU time, ROUNDS rounds alternating (peer, then ours),
# medians of each side and their ratio. BENCH_BIN is what `cargo bench -p
# kb-sim --bench kernels --no-run` prints as its executable. Needs a
# virtualenv with simpy, greenlet and numpy (KB_PEER_VENV, default
# target/peer-venv, as scripts/bench-kernels.sh makes it); installs nothing.
#   scripts/bench-kernels-cpu.sh ROUNDS BENCH_BIN
set -euo pipefail
rounds=${1:?rounds}; bin=${2:?bench binary}
cd "$(dirname "$0")/.."
py=${KB_PEER_VENV:-target/peer-venv}/bin/python
fair=${KB_FAIR_PEER:-../shared/peer/simpy_greenlet_fair.py}
[ -x "$py" ] || { echo "no virtualenv at $py (run scripts/bench-kernels.sh once)" >&2; exit 2; }
peers=(); ours=()
for i in $(seq "$rounds"); do
  p=$("$py" "$fair" 64 200 | sed -n 's/.*kernel_ops_per_cpu_s=\([0-9]*\).*/\1/p')
  o=$(KB_EXECUTOR=coroutine KB_BENCH_RUNS=1 "$bin" |
    sed -n 's/.*CPU, Coroutine: .*kernel_ops_per_cpu_s=\([0-9]*\).*/\1/p')
  [ -n "$p" ] && [ -n "$o" ] || { echo "round $i: a side printed no kernel_ops_per_cpu_s" >&2; exit 1; }
  awk -v i="$i" -v p="$p" -v o="$o" 'BEGIN { printf "round %d: fair peer %d, kb-sim %d kernel ops per CPU s (%.1f x)\n", i, p, o, o / p }'
  peers+=("$p"); ours+=("$o")
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
mp=$(median "${peers[@]}"); mo=$(median "${ours[@]}")
awk -v p="$mp" -v o="$mo" -v d="$(date -u +%FT%TZ)" -v l="$(cut -d' ' -f1-3 /proc/loadavg)" \
  'BEGIN { printf "median: fair peer %d, kb-sim %d kernel ops per CPU s: %.1f x (%s, load %s)\n", p, o, o / p, d, l }'
