#!/usr/bin/env bash
# kb-replay benchmarks, side by side with numpy in one run (BENCHMARKS.md,
# kb-replay section). Prints each figure as it goes and the ratios last.
#
#   scripts/bench-replay.sh            # all cores
#   THREADS=2 RUNS=5 scripts/bench-replay.sh
#   ONLY=defaults BASE_REPLAY=old/kb-replay scripts/bench-replay.sh  # issue 15 traces only
#   ONLY=layers BASE_REPLAY=old/kb-replay scripts/bench-replay.sh    # mlp and attention (issue 38)
#   ONLY=verify BASE_REPLAY=old/kb-replay scripts/bench-replay.sh    # --verify's cost on issue 38's four traces
#   ONLY=issue38 BASE_REPLAY=old/kb-replay scripts/bench-replay.sh   # issue 38's four traces against numpy
#
# Needs python3 (numpy goes into a private venv, target/replay-venv, or
# VENV=path/to/a/venv with numpy). When
# the system has OpenBLAS (Debian: apt-get install libopenblas-dev) the
# `openblas` backend is measured too.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${THREADS:-$(nproc)}
RUNS=${RUNS:-3}
OUT=target/bench-replay
mkdir -p "$OUT"
echo "# kb-replay benchmarks: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, threads=$THREADS, best of $RUNS"
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), load: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- numpy -------------------------------------------------------------
VENV=${VENV:-target/replay-venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q numpy
fi
"$VENV/bin/python" - "$RUNS" > "$OUT/numpy.txt" <<'EOF'
import sys, time
import numpy as np
runs = int(sys.argv[1])
def best(f):
    f()
    t = []
    for _ in range(max(runs, 3)):
        s = time.perf_counter(); f(); t.append(time.perf_counter() - s)
    return min(t)
rng = np.random.default_rng(0)
for n in (1024, 2048):
    a = rng.random((n, n), dtype=np.float32); b = rng.random((n, n), dtype=np.float32)
    print(f"numpy f32 n={n}: {2 * n**3 / best(lambda: a @ b) / 1e9:.1f} GFLOP/s")
n = 256
a = rng.random((n, n)).astype(np.float16); b = rng.random((n, n)).astype(np.float16)
print(f"numpy f16 n={n}: {2 * n**3 / best(lambda: a @ b) / 1e9:.2f} GFLOP/s")
print(f"numpy {np.__version__}")
EOF
cat "$OUT/numpy.txt"

# ---- builds ------------------------------------------------------------
FEATURES=()
BACKENDS=(gemm)
if pkg-config --exists openblas 2>/dev/null || ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so '; then
    FEATURES=(--features openblas)
    BACKENDS+=(openblas)
fi
# Two builds: the default backend is measured from a binary without
# OpenBLAS, whose thread pool spins (sched_yield) at start-up and after
# each call and would take CPU from kb-replay's own threads; the openblas
# backend runs with OPENBLAS_NUM_THREADS=1 (kb-replay parallelises across
# and within GEMMs itself).
TARGET=${CARGO_TARGET_DIR:-target}
cargo build -q --release -p kb-workloads # the kb-sim binary
build_replay() { # name, cargo feature args...
    local name=$1
    shift
    cargo build -q --release -p kb-replay "$@"
    cp "$TARGET/release/kb-replay" "$OUT/kb-replay-$name"
    [ -n "${ONLY:-}" ] && return 0
    cargo bench -q -p kb-replay "$@" --bench backend --no-run 2>/dev/null
    cp "$(ls -t "$TARGET"/release/deps/backend-* | grep -v '\.d$' | head -1)" "$OUT/backend-$name"
}
build_replay gemm
[ ${#FEATURES[@]} -gt 0 ] && build_replay openblas "${FEATURES[@]}"
export OPENBLAS_NUM_THREADS=1
SIM=$TARGET/release/kb-sim
REPLAY=$OUT/kb-replay-gemm
replay_for() { echo "$OUT/kb-replay-$1"; }
bench_for() { echo "$OUT/backend-$1"; }

if [ -z "${ONLY:-}" ]; then
# ---- backends called directly ------------------------------------------
: > "$OUT/backend.txt"
for be in "${BACKENDS[@]}"; do
    "$(bench_for "$be")" --backend "$be" --threads "$THREADS" square 1024 square 2048 f16 256 f16 1024 | tee -a "$OUT/backend.txt"
done

# ---- replay of a GEMM-heavy trace vs the backend on the same shapes -----
# gemm_tiled on the small topology (4 PEs): 256x256x256 f32 tiles, the
# largest that fit the 1 MiB TCM with an f32 accumulator.
HEAVY=$OUT/gemm-heavy.kbt
$SIM -q -t small -b gemm_tiled -p m=1024 -p n=1024 -p k=1024 \
    -p block_m=256 -p block_n=256 -p block_k=256 -p dtype=f32 -o "$HEAVY"
# Replay and the backend called directly, alternating RUNS times (the VM's
# speed drifts; alternating keeps the pair comparable), best of each:
# replay GFLOP/s (GEMM flops over the replay time, the report's `gflops`)
# and over the whole run (`gemm_flops / wall_seconds`); direct one call at
# a time and batched.
replay_once() { # trace backend threads -> "replay_gflops wall_gflops replay_seconds"
    "$(replay_for "$2")" "$1" --backend "$2" --threads "$3" --report "$OUT/r.json" -q
    python3 -c "import json; r=json.load(open('$OUT/r.json')); print(r['gflops'], r['gemm_flops']/r['wall_seconds']/1e9, r['replay_seconds'])"
}
: > "$OUT/heavy.txt"
for be in "${BACKENDS[@]}"; do
    best="0 0 0"
    : > "$OUT/direct.txt"
    for _ in $(seq "$RUNS"); do
        cur=$(replay_once "$HEAVY" "$be" "$THREADS")
        best=$(python3 -c "a='$best'.split(); b='$cur'.split(); print(' '.join(b if float(b[0]) > float(a[0]) else a))")
        "$(bench_for "$be")" --backend "$be" --threads "$THREADS" trace "$HEAVY" >> "$OUT/direct.txt"
    done
    read -r rg wg _ <<< "$best"
    echo "replay gemm-heavy backend=$be threads=$THREADS: $rg GFLOP/s replay, $wg GFLOP/s wall" | tee -a "$OUT/heavy.txt"
    python3 - "$OUT/direct.txt" <<'PY' | tee -a "$OUT/heavy.txt"
import re, sys
best = {}
for line in open(sys.argv[1]):
    m = re.match(r"(.* (direct|direct-batched) backend=\S+ threads=\d+): ([\d.]+) GFLOP/s", line)
    if m and float(m.group(3)) > best.get(m.group(2), (0, ""))[0]:
        best[m.group(2)] = (float(m.group(3)), m.group(1))
for k in ("direct", "direct-batched"):
    if k in best:
        print(f"{best[k][1]}: {best[k][0]:.1f} GFLOP/s")
PY
done
"$REPLAY" "$HEAVY" --verify --threads "$THREADS" 2>&1 | tail -1 | tee -a "$OUT/heavy.txt" || true

# ---- threads: a batch-heavy trace, 1 vs 2 threads ----------------------
# gemm_tiled on the default topology (32 PEs doing the same 128^3 GEMMs).
BATCHY=$OUT/batch-heavy.kbt
$SIM -q -b gemm_tiled -p m=1024 -p n=1024 -p k=1024 \
    -p block_m=128 -p block_n=128 -p block_k=128 -p dtype=f32 -o "$BATCHY"
# 1 and 2 threads alternating, best (lowest) replay time of each.
t1=999
t2=999
for _ in $(seq "$RUNS"); do
    read -r _ _ s1 < <(replay_once "$BATCHY" gemm 1)
    read -r _ _ s2 < <(replay_once "$BATCHY" gemm 2)
    t1=$(python3 -c "print(min($t1, $s1))")
    t2=$(python3 -c "print(min($t2, $s2))")
done
echo "batch-heavy replay seconds: 1 thread $t1, 2 threads $t2" | tee "$OUT/threads.txt"
"$REPLAY" "$BATCHY" --threads 2 --report "$OUT/r.json" -q
python3 -c "import json; e=json.load(open('$OUT/r.json'))['engine']; print(f\"batch-heavy engine: {e['gemm_batches']} batched calls of {e['gemm_batched_ops']} GEMMs, {e['tasks']} parallel tasks\")" | tee -a "$OUT/threads.txt"

fi

# ---- --verify's cost (issue 38): wall seconds with and without it ---------
# The four traces of issue 38; each binary (this one, and BASE_REPLAY if
# given) runs each trace without and with --verify, alternating RUNS times,
# best (lowest) wall of each; the ratio is the issue's figure (<= 1.5).
if [ "${ONLY:-}" = verify ]; then
    VERIFY_TRACES=(
        "gemm:-t default -b gemm -p m=2048 -p n=2048 -p k=1024 -p dtype=f32"
        "gemm_tiled:-t default -b gemm_tiled -p m=2048 -p n=2048 -p k=2048 -p dtype=f32"
        "mlp:-t default -b mlp -p m=2048 -p d=512 -p h=1024"
        "attention_2048:-t default -b attention -p seq=2048 -p d=128"
    )
    bins=("$REPLAY")
    [ -n "${BASE_REPLAY:-}" ] && bins+=("$BASE_REPLAY")
    wall() { # command... -> wall seconds
        local s e
        s=$(date +%s.%N)
        "$@" > /dev/null || { echo "failed: $*" >&2; return 1; }
        e=$(date +%s.%N)
        python3 -c "print($e - $s)"
    }
    : > "$OUT/verify.txt"
    for spec in "${VERIFY_TRACES[@]}"; do
        name=${spec%%:*}
        # shellcheck disable=SC2086
        $SIM -q ${spec#*:} -o "$OUT/verify-$name.kbt"
        for i in "${!bins[@]}"; do
            plain=999
            checked=999
            for _ in $(seq "$RUNS"); do
                p=$(wall "${bins[$i]}" "$OUT/verify-$name.kbt" -q --threads "$THREADS")
                c=$(wall "${bins[$i]}" "$OUT/verify-$name.kbt" -q --verify --threads "$THREADS")
                plain=$(python3 -c "print(min($plain, $p))")
                checked=$(python3 -c "print(min($checked, $c))")
            done
            python3 -c "print(f'verify $name bin=${bins[$i]}: replay {$plain:.3f} s, with --verify {$checked:.3f} s, ratio {$checked / $plain:.2f}')" |
                tee -a "$OUT/verify.txt"
        done
    done
    exit 0
fi

# ---- everyday traces: the workloads' default tiles (issue 15) ------------
# Whole replays (no --verify: the f64 reference is not replay) of traces
# at the workloads' default tile sizes, against numpy computing the same
# thing with the trace's shapes and dtype. `wall` is the report's
# wall_seconds (reading the trace, loading inputs, replaying); `replay`
# its replay_seconds. numpy, this kb-replay and (with
# BASE_REPLAY=path/to/another/kb-replay) that binary alternate RUNS times,
# best of each: the VM's speed drifts with other tenants, and alternating
# keeps the figures of one round comparable. The report's
# bytes_copied_per_gemm_flop, the main thread's work (plan + queue) and
# the part of it no window ran beside (`serial_seconds`; plan + queue for
# a kb-replay without that field) are printed too, from the run with the
# best replay time. ONLY=defaults runs just this section.
cat > "$OUT/np_same.py" <<'PY'
import sys, time
import numpy as np
rng = np.random.default_rng(0)
def attention(q, k, v):
    s = (q @ k.T) / q.dtype.type(np.sqrt(q.shape[1]))
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v
def mm(m, n, k, dt):
    a = rng.random((m, k)).astype(dt); b = rng.random((k, n)).astype(dt)
    return lambda: a @ b
def att(dt):
    q, k, v = (rng.standard_normal((256, 64)).astype(dt) for _ in range(3))
    return lambda: attention(q, k, v)
def mlp(m, d, h, dt):
    # numpy has no erf: GELU by its tanh form (the same elementwise work
    # class: a transcendental and a few multiply-adds per element).
    x = rng.random((m, d)).astype(dt) - dt(0.5)
    w1 = (rng.random((d, h)).astype(dt) - dt(0.5)) / dt(np.sqrt(d))
    w2 = (rng.random((h, d)).astype(dt) - dt(0.5)) / dt(np.sqrt(h))
    c = dt(np.sqrt(2 / np.pi))
    def f():
        hid = x @ w1
        g = dt(0.5) * hid * (dt(1) + np.tanh(c * (hid + dt(0.044715) * hid * hid * hid)))
        return g @ w2
    return f
def att_shape(s, s_kv, d, dt):
    q = rng.standard_normal((s, d)).astype(dt)
    k, v = (rng.standard_normal((s_kv, d)).astype(dt) for _ in range(2))
    return lambda: attention(q, k, v)
f = {
    "mlp": mlp(2048, 512, 1024, np.float32),
    "attention_2048": att_shape(2048, 256, 128, np.float16),
    "attention_2048_f32": att_shape(2048, 256, 128, np.float32),
    "gemm": mm(2048, 2048, 1024, np.float32),
    "gemm_tiled": mm(2048, 2048, 2048, np.float32),
    "attention": att(np.float16),
    "attention_f32": att(np.float32),
    "gemm_f16": mm(1024, 1024, 1024, np.float16),
}[sys.argv[1]]
s = time.perf_counter(); f(); first = time.perf_counter() - s
t = []
for _ in range(3 if first < 0.5 else 1):
    s = time.perf_counter(); f(); t.append(time.perf_counter() - s)
print(min(t))
PY
SIM_DEFAULTS=(
    "gemm:-t default -b gemm -p m=2048 -p n=2048 -p k=1024 -p dtype=f32"
    "gemm_tiled:-t default -b gemm_tiled -p m=2048 -p n=2048 -p k=2048 -p dtype=f32"
    "attention:-t default -b attention"
    "gemm_f16:-t small -b gemm -p m=1024 -p n=1024 -p k=1024 -p dtype=f16"
)
# Layers (issue 38): numpy's mlp is f32 with a tanh GELU; attention with
# the trace's shapes (seq 2048, seq_kv 256, d 128), in f16 and f32.
if [ "${ONLY:-}" = layers ]; then
    SIM_DEFAULTS=(
        "mlp:-t default -b mlp -p m=2048 -p d=512 -p h=1024"
        "attention_2048:-t default -b attention -p seq=2048 -p d=128"
    )
fi
# Issue 38's table: its four traces against numpy in one run.
if [ "${ONLY:-}" = issue38 ]; then
    SIM_DEFAULTS=(
        "gemm:-t default -b gemm -p m=2048 -p n=2048 -p k=1024 -p dtype=f32"
        "gemm_tiled:-t default -b gemm_tiled -p m=2048 -p n=2048 -p k=2048 -p dtype=f32"
        "mlp:-t default -b mlp -p m=2048 -p d=512 -p h=1024"
        "attention_2048:-t default -b attention -p seq=2048 -p d=128"
    )
fi
: > "$OUT/defaults.txt"
for spec in "${SIM_DEFAULTS[@]}"; do
    name=${spec%%:*}
    # shellcheck disable=SC2086
    $SIM -q ${spec#*:} -o "$OUT/default-$name.kbt"
    "$REPLAY" "$OUT/default-$name.kbt" --verify -q --threads "$THREADS" ||
        echo "default $name: verification FAILED" | tee -a "$OUT/defaults.txt"
    bins=("$REPLAY")
    [ -n "${BASE_REPLAY:-}" ] && bins+=("$BASE_REPLAY")
    for i in "${!bins[@]}"; do : > "$OUT/runs-$name-$i.txt"; done
    nps=("$name")
    case $name in attention*) nps+=("${name}_f32") ;; esac
    for n in "${nps[@]}"; do : > "$OUT/np-$n.txt"; done
    for _ in $(seq "$RUNS"); do
        for n in "${nps[@]}"; do "$VENV/bin/python" "$OUT/np_same.py" "$n" >> "$OUT/np-$n.txt"; done
        for i in "${!bins[@]}"; do
            "${bins[$i]}" "$OUT/default-$name.kbt" --threads "$THREADS" --report "$OUT/r.json" -q
            python3 -c "import json; r=json.load(open('$OUT/r.json')); e=r['engine']; pq = e.get('plan_seconds', 0) + e.get('queue_seconds', 0); print(r['wall_seconds'], r['replay_seconds'], r.get('bytes_copied_per_gemm_flop', -1), pq, r['gemm_flops'], e.get('serial_seconds', pq))" >> "$OUT/runs-$name-$i.txt"
        done
    done
    for n in "${nps[@]}"; do
        echo "numpy $n: $(sort -g "$OUT/np-$n.txt" | head -1) s" | tee -a "$OUT/defaults.txt"
    done
    for i in "${!bins[@]}"; do
        python3 - "$OUT/runs-$name-$i.txt" "$name" "${bins[$i]}" <<'PY' | tee -a "$OUT/defaults.txt"
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
w = min(rows, key=lambda r: r[0])
r = min(rows, key=lambda r: r[1])
print(f"default {sys.argv[2]} bin={sys.argv[3]}: wall {w[0]:.4f} s, replay {r[1]:.4f} s, "
      f"plan+queue {r[3]:.4f} s, serial {r[5]:.4f} s ({100 * r[5] / r[0]:.1f} % of its wall), "
      f"bytes copied per GEMM flop {r[2]:.4g}, GEMM GFLOP {r[4] / 1e9:.2f}")
PY
    done
done
python3 - "$OUT/defaults.txt" <<'PY'
import re, sys
d = open(sys.argv[1]).read()
for name in ("gemm", "gemm_tiled", "attention", "gemm_f16", "mlp", "attention_2048"):
    for np_name in (name, name + "_f32"):
        m = re.search(rf"numpy {np_name}: ([\d.e-]+) s", d)
        if not m:
            continue
        n = float(m.group(1))
        for r in re.finditer(rf"default {name} bin=(\S+): wall ([\d.]+) s, replay ([\d.]+) s", d):
            print(f"default {name} ({r.group(1)}): numpy {np_name} time / kb-replay time: "
                  f"wall {n / float(r.group(2)):.3f}, replay {n / float(r.group(3)):.3f} (numpy {n:.4f} s)")
PY
[ -n "${ONLY:-}" ] && exit 0

# ---- streaming memory: a trace and one 10x longer, through a pipe -------
# copy with 10-row tiles, then 1-row tiles: the same 16 MiB of data, ten
# times the ops. Replay only (verification then holds the output and its
# reference in f64: about 5x the output's bytes more, the same for both).
: > "$OUT/stream.txt"
for tr in 10 1; do
    $SIM -q -b copy -p rows=8000 -p cols=512 -p tile_rows=$tr -o "$OUT/copy-$tr.kbt"
    "$REPLAY" "$OUT/copy-$tr.kbt" --verify 2>&1 | tail -1
    rss=$( { /usr/bin/time -f "%M" "$REPLAY" - -q --report "$OUT/r.json" < "$OUT/copy-$tr.kbt"; } 2>&1 | tail -1)
    recs=$(python3 -c "import json; r=json.load(open('$OUT/r.json')); print(r['records'], r['engine']['max_pending_records'])")
    echo "stream copy tile_rows=$tr: records/max held $recs, peak RSS $rss KB" | tee -a "$OUT/stream.txt"
done
# The same through kb-sim's pipe (replay starts before kb-sim finishes).
rss=$( { $SIM -q -b copy -p rows=8000 -p cols=512 -p tile_rows=1 | /usr/bin/time -f "%M" "$REPLAY" - -q; } 2>&1 | tail -1)
echo "stream copy tile_rows=1 from kb-sim's pipe: peak RSS $rss KB" | tee -a "$OUT/stream.txt"

# ---- ratios --------------------------------------------------------------
echo "# ratios"
python3 - "$OUT" <<'EOF'
import re, sys
out = sys.argv[1]
def nums(path, pat):
    return [float(x) for x in re.findall(pat, open(f"{out}/{path}").read())]
np32 = dict(zip((1024, 2048), nums("numpy.txt", r"numpy f32 n=\d+: ([\d.]+)")))
np16 = nums("numpy.txt", r"numpy f16 n=\d+: ([\d.]+)")[0]
be = open(f"{out}/backend.txt").read()
for name in ("gemm", "openblas"):
    for n in (1024, 2048):
        m = re.search(rf"square f32 n={n} backend={name} \S+: ([\d.]+)", be)
        if m:
            print(f"{name} f32 n={n} / numpy: {float(m.group(1)) / np32[n]:.2f}")
    for n in (256, 1024):
        m = re.search(rf"f16 n={n} backend={name} \S+: ([\d.]+)", be)
        if m:
            print(f"{name} f16 n={n} / numpy f16 n=256: {float(m.group(1)) / np16:.0f}x")
heavy = open(f"{out}/heavy.txt").read()
for name in ("gemm", "openblas"):
    r = re.search(rf"replay gemm-heavy backend={name} \S+: ([\d.]+) GFLOP/s replay, ([\d.]+) GFLOP/s wall", heavy)
    d = re.search(rf"direct backend={name} \S+: ([\d.]+)", heavy)
    db = re.search(rf"direct-batched backend={name} \S+: ([\d.]+)", heavy)
    if r and d:
        print(f"{name} replay / direct on the same shapes: {float(r.group(1)) / float(d.group(1)):.2f} "
              f"(wall {float(r.group(2)) / float(d.group(1)):.2f}; vs direct-batched {float(r.group(1)) / float(db.group(1)):.2f})")
t = nums("threads.txt", r"(\d+\.\d+)")
print(f"batch-heavy 2 threads / 1 thread speed-up: {t[0] / t[1]:.2f}")
s = nums("stream.txt", r"peak RSS (\d+) KB")
print(f"streaming peak RSS, 10x longer / base: {s[1] / s[0]:.2f}")
EOF
