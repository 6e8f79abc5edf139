#!/usr/bin/env bash
# Bandwidth fidelity figures (issue 16), for one or more kb-sim builds side
# by side:
#   scripts/bench-dma.sh [KB_SIM ...]        # default: target/release/kb-sim
# - lone DMA: one load of N bytes on `small` (copy of a single row): its
#   dma_read record's duration, and N / duration against the narrowest
#   stage (the 256 GB/s pe_dma <-> noc link);
# - copy: HBM bytes moved (read + written) / the launch's duration, against
#   the configured HBM bandwidth (channels x channel_bw_gbs x cubes);
# - LA 1:1 vs n:1 on copy and on gather's 256 B rows.
# Needs python3 (for the JSON) and a release kb-inspect.
set -euo pipefail
cd "$(dirname "$0")/.."
inspect=${KB_INSPECT:-target/release/kb-inspect}
sims=("$@")
[ ${#sims[@]} -eq 0 ] && sims=(target/release/kb-sim)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

launch_ns() { "$inspect" summary "$1" --format json | python3 -c '
import json, sys; d = json.load(sys.stdin); l = d["launches"][0]
print((l["t_end_ps"] - l["t_start_ps"]) / 1e3)'; }

dma_ns() { "$inspect" ops "$1" --name dma_read --format json | python3 -c '
import json, sys; r = json.load(sys.stdin)[0]
print((r["t_end_ps"] - r["t_start_ps"]) / 1e3)'; }


for sim in "${sims[@]}"; do
  echo "## $sim"
  for bytes in 64 4096 65536 1048576; do
    cols=$((bytes / 4))
    "$sim" -q -t small -b copy -p rows=1 -p cols=$cols -p tile_rows=1 -o "$tmp/d.kbt"
    ns=$(dma_ns "$tmp/d.kbt")
    python3 -c "b=$bytes; ns=$ns; print(f'lone dma_read {b} B on small: {ns:.3f} ns, {b/ns:.1f} GB/s = {100*b/ns/256:.1f} % of the 256 GB/s link')"
  done
  # topology, PEs, channels per cube, GB/s per channel, cubes
  for spec in "small 4 32 32 1" "default 32 64 32 4"; do
    set -- $spec; topo=$1; pes=$2; ch=$3; bw=$4; cubes=$5
    # The same work per PE on both (512 rows of x), then copy's defaults.
    for tiles in "8 512" "64 512" "64 1024" "default"; do
      if [ "$tiles" = default ]; then
        rows=2048; cols=512; tr=8; p=()
      else
        set -- $tiles; tr=$1; cols=$2; rows=$((512 * pes))
        p=(-p rows=$rows -p cols=$cols -p tile_rows=$tr)
      fi
      "$sim" -q -t $topo -b copy "${p[@]}" -o "$tmp/c.kbt"
      ns=$(launch_ns "$tmp/c.kbt")
      python3 -c "
moved = 2 * $rows * $cols * 4; ns = $ns; cap = $ch * $bw * $cubes
what = 'defaults, ' if '$tiles' == 'default' else ''
print(f'copy on $topo, {what}{$rows}x{$cols} f32, {$tr}-row tiles ({$tr*$cols*4} B): {ns:.1f} ns, {moved/ns:.1f} GB/s of HBM traffic = {100*moved/ns/cap:.1f} % of {cap} GB/s')"
    done
  done
  for b in copy gather; do
    for t in la-1to1 la-nto1; do
      "$sim" -q -t $t -b $b -o "$tmp/l.kbt"
      echo "$b on $t: launch $(launch_ns "$tmp/l.kbt") ns"
    done
  done
done
