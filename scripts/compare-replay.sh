#!/usr/bin/env bash
# kb-replay builds side by side on one trace: runs each binary in turn,
# ROUNDS times (alternating, so the VM's drift hits them alike), and
# prints each one's least and median wall time (the report's
# wall_seconds) and median CPU time (perf's task-clock when perf is
# there, else /usr/bin/time's user + system).
#   scripts/compare-replay.sh TRACE ROUNDS BIN [BIN...]
# A BIN may carry arguments or environment: "env FOO=1 path/kb-replay -j 1".
set -euo pipefail
trace=${1:?trace}; rounds=${2:?rounds}; shift 2
[ $# -gt 0 ] || { echo "usage: $0 TRACE ROUNDS BIN [BIN...]" >&2; exit 2; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
perf_ok=0; perf stat -e task-clock true 2>/dev/null && perf_ok=1
for _ in $(seq "$rounds"); do
  for i in $(seq 0 $(($# - 1))); do
    bin=${*:$((i + 1)):1}
    if [ $perf_ok = 1 ]; then
      # shellcheck disable=SC2086
      perf stat -x, -e task-clock -o "$dir/cpu" $bin "$trace" -q --report "$dir/r.json" >/dev/null
      cpu=$(grep task-clock "$dir/cpu" | cut -d, -f1)
    else
      # shellcheck disable=SC2086
      /usr/bin/time -f "%U %S" -o "$dir/cpu" $bin "$trace" -q --report "$dir/r.json" >/dev/null
      cpu=$(awk '{print ($1 + $2) * 1000}' "$dir/cpu")
    fi
    wall=$(python3 -c "import json; print(json.load(open('$dir/r.json'))['wall_seconds'])")
    echo "$i $wall $cpu" >> "$dir/runs"
  done
done
python3 - "$dir/runs" "$@" <<'PY'
import sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    i, wall, cpu = line.split()
    runs[int(i)].append((float(wall), float(cpu)))
for i in sorted(runs):
    w = sorted(r[0] for r in runs[i]); c = sorted(r[1] for r in runs[i])
    print(f"{sys.argv[2 + i]}: wall least {w[0] * 1000:.1f} ms, median {w[len(w) // 2] * 1000:.1f} ms; "
          f"CPU median {c[len(c) // 2]:.0f} ms ({len(w)} runs)")
PY
