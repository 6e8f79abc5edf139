#!/usr/bin/env bash
# Issue 37's weak scaling: gemm_tiled with one 64 x 64 C tile per PE on
# `large` (256 PEs) and on large grown to 4,096 PEs (32 SiPs of 16 cubes),
# ROUNDS rounds, the kb-sim binaries alternating. Prints records, user and
# system CPU seconds, max RSS (KiB) and records per CPU second per run.
#   scripts/bench-weak-scaling.sh ROUNDS KB_SIM [KB_SIM...]
# KB_INSPECT names the kb-inspect that counts the records (default: on PATH).
set -euo pipefail
rounds=${1:?rounds}; shift
[ $# -gt 0 ] || { echo "usage: $0 ROUNDS KB_SIM [KB_SIM...]" >&2; exit 2; }
inspect=${KB_INSPECT:-kb-inspect}
bins=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for _ in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    for cfg in "4 8" "32 16"; do
      read -r sips cubes <<< "$cfg"
      all=$((sips * cubes)); pes=$((all * 8))
      /usr/bin/time -f "%U %S %M" -o "$tmp/time" "$bin" -q -t large -b gemm_tiled \
        -p grid=2d -p m=$((64 * all)) -p n=512 -p k=1024 \
        --set counts.sips="$sips" --set counts.cubes_per_sip="$cubes" -o "$tmp/ws.kbt"
      records=$("$inspect" summary "$tmp/ws.kbt" | awk '/^records:/ {print $2}')
      read -r user sys rss < "$tmp/time"
      awk -v b="$bin" -v p="$pes" -v r="$records" -v u="$user" -v s="$sys" -v m="$rss" 'BEGIN {
        printf "%s PEs=%d records=%d user=%.2f sys=%.2f cpu=%.2f rss_kib=%d records_per_cpu_s=%.0f\n", b, p, r, u, s, u + s, m, r / (u + s) }'
    done
  done
done
