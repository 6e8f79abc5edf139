#!/usr/bin/env bash
# kb-sim kernel-benchmark builds side by side: runs each bench binary's
# coroutine executor in turn, ROUNDS times (alternating, so the VM's drift
# hits them alike), and prints each one's kernel ops/s by wall time,
# sorted, with the median. A bench binary is what
# `cargo bench -p kb-sim --bench kernels --no-run` prints as its
# executable; copy it aside before building the other side.
#   scripts/compare-kernels.sh ROUNDS BENCH_BIN [BENCH_BIN...]
set -euo pipefail
rounds=${1:?rounds}; shift
[ $# -gt 0 ] || { echo "usage: $0 ROUNDS BENCH_BIN [BENCH_BIN...]" >&2; exit 2; }
declare -A got
for _ in $(seq "$rounds"); do
  for bin in "$@"; do
    ops=$(KB_EXECUTOR=coroutine "$bin" |
      sed -n 's/.*Coroutine: .*kernel_ops_per_s=\([0-9]*\).*/\1/p')
    [ -n "$ops" ] || { echo "$bin printed no kernel_ops_per_s" >&2; exit 1; }
    got[$bin]="${got[$bin]:-} $ops"
  done
done
for bin in "$@"; do
  # shellcheck disable=SC2086
  sorted=$(printf '%s\n' ${got[$bin]} | sort -n | tr '\n' ' ')
  median=$(printf '%s\n' ${got[$bin]} | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
  echo "$bin: median $median kernel ops/s (all: $sorted)"
done
