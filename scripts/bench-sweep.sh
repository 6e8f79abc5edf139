#!/usr/bin/env bash
# Sweep speed-up: the same 16-point sweep run one point after another
# (-j 1, which is what running the points by hand costs) and on all cores
# (-j N, default 2), side by side, on the release build. Prints wall times
# and their ratio (issue 18 target: -j 2 <= 0.6 x -j 1 on 2 cores).
#
#   scripts/bench-sweep.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-2}
cargo build --release --locked -q -p kb-workloads
sim=target/release/kb-sim
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(sweep -t default -b gemm_tiled --set hbm.channel_bw_gbs=16,32,64,128 -p m=1024,2048,3072,4096 -p n=1024 -p k=1024)
t() { local s=$(date +%s.%N); "$@" 2> "$work/log"; local e=$(date +%s.%N); echo "$e - $s" | bc; }
seq_s=$(t "$sim" "${args[@]}" -j 1 -o "$work/seq")
par_s=$(t "$sim" "${args[@]}" -j "$jobs" -o "$work/par")
# The two tables hold the same results.
cut -d, -f1-12 "$work/seq.csv" > "$work/a"; cut -d, -f1-12 "$work/par.csv" > "$work/b"
cmp -s "$work/a" "$work/b" || { echo "tables differ"; exit 1; }
echo "16 points: -j 1 ${seq_s} s, -j ${jobs} ${par_s} s, ratio $(echo "scale=3; $par_s / $seq_s" | bc)"
