#!/usr/bin/env bash
# Whether two kb-sim builds write the same traces: every workload `kb-sim
# list` names, at its default parameters, on the embedded topologies and
# every topologies/*.yaml, plus the runs issue 37 measures (weak scaling
# on large, allreduce group=all, gemm_tiled with --races off). Each pair
# must exit alike, print the same stderr and, when it succeeds, write
# byte-identical traces. Prints each difference and a count; exits 1 on
# any. A refactor or a speed-up of kb-sim passes this unchanged.
#   scripts/identity-sim.sh OLD_KB_SIM NEW_KB_SIM
set -uo pipefail
old=${1:?old kb-sim binary}; new=${2:?new kb-sim binary}
cd "$(dirname "$0")/.."
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
runs=0; differ=0
# One run of both binaries with the same arguments.
compare() {
  runs=$((runs + 1))
  "$old" -q "$@" -o "$dir/old.kbt" 2> "$dir/old.err"; local a=$?
  "$new" -q "$@" -o "$dir/new.kbt" 2> "$dir/new.err"; local b=$?
  if [ "$a" -ne "$b" ] || ! cmp -s "$dir/old.err" "$dir/new.err" ||
    { [ "$a" -eq 0 ] && ! cmp -s "$dir/old.kbt" "$dir/new.kbt"; }; then
    echo "differ (exit $a / $b): kb-sim $*"
    differ=$((differ + 1))
  fi
  rm -f "$dir/old.kbt" "$dir/new.kbt"
}
benches=$("$old" list | awk '/^[a-z_0-9]+ / {print $1}')
[ -n "$benches" ] || { echo "$old list named no workloads" >&2; exit 2; }
for b in $benches; do
  for t in default small large topologies/*.yaml; do
    compare -t "$t" -b "$b"
  done
done
compare -t large -b gemm_tiled -p grid=2d -p m=2048 -p n=512 -p k=1024
compare -t large -b gemm_tiled -p grid=2d -p m=32768 -p n=512 -p k=1024 \
  --set counts.sips=32 --set counts.cubes_per_sip=16
compare -t large -b allreduce -p group=all
compare -t large -b gemm_tiled -p m=1024 -p n=1024 -p k=1024 --races off
echo "$runs runs, $differ differing"
[ "$differ" -eq 0 ]
