#!/usr/bin/env bash
# Two kb-sim builds side by side on one run: alternates OLD and NEW
# ROUNDS times under /usr/bin/time, checks their traces are byte-identical,
# and prints each one's least user time (the steadiest figure on a shared
# machine) with its wall time.
#   scripts/compare-sim.sh OLD_KB_SIM NEW_KB_SIM [TOPOLOGY] [ROUNDS] [kb-sim args...]
# Default run: gemm_tiled 2048^3 f32 on `default`, 5 rounds.
set -euo pipefail
old=${1:?old kb-sim binary}; new=${2:?new kb-sim binary}
topo=${3:-default}; rounds=${4:-5}; shift $(( $# < 4 ? $# : 4 ))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b gemm_tiled -p m=2048 -p n=2048 -p k=2048 -p dtype=f32)
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
for _ in $(seq "$rounds"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    /usr/bin/time -f "$which %U %e" -a -o "$dir/times" \
      "$bin" -t "$topo" "${args[@]}" -q -o "$dir/$which.kbt"
  done
  cmp -s "$dir/old.kbt" "$dir/new.kbt" || { echo "traces differ" >&2; exit 1; }
done
echo "$topo ${args[*]}: traces identical in $rounds rounds"
for which in old new; do
  grep "^$which " "$dir/times" | sort -k2 -n | head -1 |
    awk '{printf "%s: least user %.2f s (wall %.2f s)\n", $1, $2, $3}'
done
