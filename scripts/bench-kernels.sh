#!/usr/bin/env bash
# Issue 4's comparisons, side by side in one run:
#  - handshake round trip: kb-sim's executors vs greenlet's switch;
#  - kernel ops/s: kb-sim vs the SimPy + greenlet peers on the same
#    workload shape: shared/peer/simpy_greenlet_fair.py (real 128x128 f16
#    arrays in its store, returned by reference: the peer to compare with)
#    and shared/peer/simpy_greenlet_ref.py (the original, beside it)
#    (64 PEs x 200 iterations of load 128x128 f16 -> dot -> store),
#    by wall time and, for the coroutine executor and the fair peer, by
#    CPU time (on a loaded machine wall time measures the load too).
# Installs simpy, greenlet and numpy into a private virtualenv (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
peer=${KB_PEER:-../shared/peer/simpy_greenlet_ref.py}
fair=${KB_FAIR_PEER:-../shared/peer/simpy_greenlet_fair.py}
venv=${KB_PEER_VENV:-target/peer-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q simpy greenlet numpy
fi
py="$venv/bin/python"

greenlet_ns=$("$py" - <<'PY'
import time
from greenlet import greenlet
main = greenlet.getcurrent()
def child(x):
    while True:
        x = main.switch(x + 1)
g = greenlet(child)
v = g.switch(0)
samples = []
for _ in range(7):
    n = 200_000
    t = time.perf_counter()
    for _ in range(n):
        v = g.switch(v)
    samples.append((time.perf_counter() - t) / n * 1e9)
samples.sort()
print(f"{samples[3]:.1f}")
PY
)
echo "greenlet switch round trip: ${greenlet_ns} ns (median of 7 x 200000)"

peer_out=$("$py" "$peer" 64 200)
echo "$peer_out" | sed 's/^/peer: /'
peer_ops=$(echo "$peer_out" | sed -n 's/.*kernel_ops_per_s=\([0-9]*\).*/\1/p')
fair_out=$("$py" "$fair" 64 200)
echo "$fair_out" | sed 's/^/fair peer: /'
fair_ops=$(echo "$fair_out" | sed -n 's/.*kernel_ops_per_s=\([0-9]*\).*/\1/p')
fair_cpu_ops=$(echo "$fair_out" | sed -n 's/.*kernel_ops_per_cpu_s=\([0-9]*\).*/\1/p')

ours=$(cargo bench -q -p kb-sim --bench kernels 2>/dev/null)
echo "$ours"
co_ns=$(echo "$ours" | sed -n 's/handshake round trip, Coroutine executor: \([0-9.]*\) ns.*/\1/p')
th_ns=$(echo "$ours" | sed -n 's/handshake round trip, Thread executor: \([0-9.]*\) ns.*/\1/p')
co_ops=$(echo "$ours" | sed -n 's/.*Coroutine: .*kernel_ops_per_s=\([0-9]*\).*/\1/p')
co_cpu_ops=$(echo "$ours" | sed -n 's/.*CPU, Coroutine: .*kernel_ops_per_cpu_s=\([0-9]*\).*/\1/p')
th_ops=$(echo "$ours" | sed -n 's/.*Thread: .*kernel_ops_per_s=\([0-9]*\).*/\1/p')
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
awk -v g="$greenlet_ns" -v c="$co_ns" -v t="$th_ns" -v p="$peer_ops" -v f="$fair_ops" -v co="$co_ops" -v th="$th_ops" \
    -v fc="${fair_cpu_ops:-0}" -v cc="${co_cpu_ops:-0}" 'BEGIN {
  printf "handshake: coroutine %.1f ns = %.3f x greenlet; thread %.1f ns = %.2f x greenlet (lower is better)\n", c, c / g, t, t / g
  printf "kernel ops/s vs fair peer: coroutine %.1f x, thread %.2f x\n", co / f, th / f
  # Per CPU second on both sides: what neither side lost to other load.
  if (fc > 0 && cc > 0) printf "kernel ops per CPU s vs fair peer: coroutine %.1f x (%d vs %d)\n", cc / fc, cc, fc
  printf "kernel ops/s vs reference peer: coroutine %.1f x, thread %.2f x\n", co / p, th / p
}'
