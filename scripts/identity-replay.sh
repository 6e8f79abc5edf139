#!/usr/bin/env bash
# Whether two kb-replay builds compute the same bytes: traces of every
# workload `kb-sim list` names (default parameters) on default, small and
# topologies/la-1to1.yaml, and issue 38's four layer traces, each replayed
# by both binaries with --verify at -j 1 and -j 2, every output dumped
# (--dump-outputs). Each pair must exit alike and dump byte-identical
# files. Prints each difference and a count; exits 1 on any. A refactor
# or a speed-up of kb-replay passes this unchanged.
#   scripts/identity-replay.sh KB_SIM OLD_KB_REPLAY NEW_KB_REPLAY
set -uo pipefail
sim=${1:?kb-sim binary}; old=${2:?old kb-replay binary}; new=${3:?new kb-replay binary}
cd "$(dirname "$0")/.."
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
traces=0; runs=0; differ=0
# Replay $dir/t.kbt with both binaries at each thread count; compare.
compare() {
  traces=$((traces + 1))
  for j in 1 2; do
    runs=$((runs + 1))
    rm -rf "$dir/old" "$dir/new"
    "$old" "$dir/t.kbt" -q --verify -j "$j" --dump-outputs "$dir/old" > /dev/null 2>&1; local a=$?
    "$new" "$dir/t.kbt" -q --verify -j "$j" --dump-outputs "$dir/new" > /dev/null 2>&1; local b=$?
    if [ "$a" -ne "$b" ] || ! diff -rq "$dir/old" "$dir/new" > /dev/null 2>&1; then
      echo "differ (exit $a / $b, -j $j): kb-sim $*"
      differ=$((differ + 1))
    fi
  done
}
benches=$("$sim" list | awk '/^[a-z_0-9]+ / {print $1}')
[ -n "$benches" ] || { echo "$sim list named no workloads" >&2; exit 2; }
for b in $benches; do
  for t in default small topologies/la-1to1.yaml; do
    "$sim" -q -t "$t" -b "$b" -o "$dir/t.kbt" 2> /dev/null || continue
    compare -t "$t" -b "$b"
  done
done
while read -r args; do
  # shellcheck disable=SC2086
  "$sim" -q -t default $args -o "$dir/t.kbt" && compare -t default $args
done <<'EOF'
-b gemm -p m=2048 -p n=2048 -p k=1024 -p dtype=f32
-b gemm_tiled -p m=2048 -p n=2048 -p k=2048 -p dtype=f32
-b mlp -p m=2048 -p d=512 -p h=1024
-b attention -p seq=2048 -p d=128
EOF
echo "$traces traces, $runs replay pairs, $differ differing"
[ "$differ" -eq 0 ]
