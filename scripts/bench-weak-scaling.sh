#!/usr/bin/env bash
# Issue 37's weak scaling: gemm_tiled with one 64 x 64 C tile per PE on
# `large` (256 PEs) and on large grown to 4,096 PEs (32 SiPs of 16 cubes),
# ROUNDS rounds, the kb-sim binaries alternating. Prints records, user and
# system CPU seconds, max RSS (KiB) and records per CPU second per run.
#   scripts/bench-weak-scaling.sh ROUNDS KB_SIM [KB_SIM...]
# KB_INSPECT names the kb-inspect that counts the records (default: on PATH).
# SMALL_REPEATS (default 16) runs the 256-PE point that many times back to
# back inside one timing: alone it takes 0.1-0.2 CPU s, which
# /usr/bin/time resolves to 10 ms, too coarse for the share it decides.
# CALLGRIND=1 counts instructions instead (valgrind's callgrind, each point
# once per round; minutes at 4,096 PEs): the same on every run, where this
# VM's CPU seconds move 2 x between rounds. It prints instructions per
# record and the 4,096-PE point's share of the 256-PE point's records per
# instruction; the bar itself is in CPU time.
set -euo pipefail
rounds=${1:?rounds}; shift
[ $# -gt 0 ] || { echo "usage: $0 ROUNDS KB_SIM [KB_SIM...]" >&2; exit 2; }
inspect=${KB_INSPECT:-kb-inspect}
bins=("$@")
small_repeats=${SMALL_REPEATS:-16}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ "${CALLGRIND:-}" = 1 ]; then
  command -v valgrind > /dev/null || { echo "CALLGRIND=1 needs valgrind" >&2; exit 2; }
  for _ in $(seq "$rounds"); do
    for bin in "${bins[@]}"; do
      per=()
      for cfg in "4 8" "32 16"; do
        read -r sips cubes <<< "$cfg"
        all=$((sips * cubes)); pes=$((all * 8))
        valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" -q -t large -b gemm_tiled \
          -p grid=2d -p m=$((64 * all)) -p n=512 -p k=1024 \
          --set counts.sips="$sips" --set counts.cubes_per_sip="$cubes" -o "$tmp/ws.kbt" 2> "$tmp/cg"
        ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/cg")
        [ -n "$ir" ] || { cat "$tmp/cg" >&2; exit 1; }
        records=$("$inspect" summary "$tmp/ws.kbt" | awk '/^records:/ {print $2}')
        per+=("$(awk -v i="$ir" -v r="$records" 'BEGIN { printf "%.1f", i / r }')")
        echo "$bin PEs=$pes records=$records instructions=$ir instructions_per_record=${per[-1]}"
      done
      awk -v b="$bin" -v s="${per[0]}" -v l="${per[1]}" 'BEGIN { printf "%s share (256-PE instructions per record / 4,096-PE): %.1f %%\n", b, 100 * s / l }'
    done
  done
  exit 0
fi
for _ in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    for cfg in "4 8" "32 16"; do
      read -r sips cubes <<< "$cfg"
      all=$((sips * cubes)); pes=$((all * 8))
      reps=1; [ "$pes" -eq 256 ] && reps=$small_repeats
      /usr/bin/time -f "%U %S %M" -o "$tmp/time" bash -c 'for _ in $(seq "$1"); do "$2" -q -t large -b gemm_tiled \
        -p grid=2d -p m="$3" -p n=512 -p k=1024 \
        --set counts.sips="$4" --set counts.cubes_per_sip="$5" -o "$6" || exit; done' _ \
        "$reps" "$bin" $((64 * all)) "$sips" "$cubes" "$tmp/ws.kbt"
      records=$(( $("$inspect" summary "$tmp/ws.kbt" | awk '/^records:/ {print $2}') * reps ))
      read -r user sys rss < "$tmp/time"
      awk -v b="$bin" -v p="$pes" -v r="$records" -v u="$user" -v s="$sys" -v m="$rss" 'BEGIN {
        printf "%s PEs=%d records=%d user=%.2f sys=%.2f cpu=%.2f rss_kib=%d records_per_cpu_s=%.0f\n", b, p, r, u, s, u + s, m, r / (u + s) }'
    done
  done
done
