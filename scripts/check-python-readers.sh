#!/usr/bin/env bash
# Open kb's tables the way analysts do: pandas, pyarrow, polars and DuckDB
# read `kb-inspect export` (Parquet and CSV) and a `kb-sim sweep` table,
# and the values must match kb-inspect's own JSON. Not part of CI (it
# installs Python packages from PyPI into a private venv).
#
#   scripts/check-python-readers.sh            # venv in target/pyreaders
#   KB_PYENV=/some/venv scripts/check-python-readers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KB_PYENV:-target/pyreaders}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
fi
"$venv/bin/pip" install -q pandas pyarrow polars duckdb
cargo build --release --locked -q -p kb-workloads -p kb-inspect -p kb-replay
bin=target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Two traces with different op mixes: a CSV column must keep its type in both.
"$bin/kb-sim" -q -b gemm_tiled -p m=100 -p n=72 -p k=40 -o "$work/tiled.kbt"
"$bin/kb-sim" -q -t small -b copy -o "$work/copy.kbt"
for t in tiled copy; do
    "$bin/kb-inspect" export "$work/$t.kbt" -o "$work/$t.parquet"
    "$bin/kb-inspect" export "$work/$t.kbt" -o "$work/$t.csv"
    "$bin/kb-inspect" ops "$work/$t.kbt" --format json > "$work/$t.json"
done
"$bin/kb-sim" sweep -t small -b gemm --set hbm.channel_bw_gbs=16,64 -p m=64,128 \
    --verify -o "$work/sweep" 2> "$work/sweep.log"
"$venv/bin/python" - "$work" <<'EOF'
import json, sys
import duckdb, pandas as pd, polars as pl, pyarrow, pyarrow.parquet as pq

work = sys.argv[1]
passed = failed = 0
def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what} {detail}")

for t in ["tiled", "copy"]:
    ref = json.load(open(f"{work}/{t}.json"))
    pf = f"{work}/{t}.parquet"
    df = pd.read_parquet(pf)
    check(f"{t}: pandas rows", len(df) == len(ref), f"{len(df)} vs {len(ref)}")
    check(f"{t}: pandas op_id", list(df.op_id) == [r["op_id"] for r in ref])
    check(f"{t}: pandas start_ps", list(df.start_ps) == [r["t_start_ps"] for r in ref])
    check(f"{t}: pandas start_ns", all(abs(a - r["t_start_ps"] / 1000) < 1e-9 for a, r in zip(df.start_ns, ref)))
    check(f"{t}: pandas deps", [list(d) for d in df.deps] == [[d["op"] for d in r["deps"]] for r in ref])
    check(f"{t}: pandas dep_kinds", [list(k) for k in df.dep_kinds] == [[d["kind"] for d in r["deps"]] for r in ref])
    check(f"{t}: pandas flops", list(df.flops) == [r["flops"] for r in ref])
    check(f"{t}: dtypes", str(df.op_id.dtype) == "uint64" and str(df.start_ns.dtype) == "float64",
          str(df.dtypes.to_dict()))
    gemm = [r for r in ref if r["kind"] == "gemm"]
    if gemm:
        g = df[df.kind == "gemm"]
        check(f"{t}: gemm m/n/k", list(g.m.astype(int)) == [r["params"]["m"] for r in gemm])
    tbl = pq.read_table(pf)
    check(f"{t}: pyarrow deps is a list", str(tbl.schema.field("deps").type).startswith("list<"))
    pl_df = pl.read_parquet(pf)
    check(f"{t}: polars rows", pl_df.height == len(ref))
    check(f"{t}: polars bytes", pl_df["bytes"].sum() == sum(r["bytes"] for r in ref))
    n, f, b = duckdb.sql(f"select count(*), sum(flops), sum(bytes) from '{pf}'").fetchall()[0]
    check(f"{t}: duckdb sums", (n, f, b) == (len(ref), sum(r["flops"] for r in ref), sum(r["bytes"] for r in ref)),
          f"{(n, f, b)}")
    nd = duckdb.sql(f"select count(*) from '{pf}' where len(deps) > 0").fetchall()[0][0]
    check(f"{t}: duckdb deps list", nd == sum(1 for r in ref if r["deps"]))
    c = pd.read_csv(f"{work}/{t}.csv")
    check(f"{t}: csv rows", len(c) == len(ref))
    check(f"{t}: csv deps are text", pd.api.types.is_string_dtype(c.deps) and all(json.loads(d) == [x["op"] for x in r["deps"]] for d, r in zip(c.deps, ref)))
    check(f"{t}: csv times", list(c.start_ps) == [r["t_start_ps"] for r in ref] and str(c.start_ns.dtype) == "float64")
    cn = pd.read_csv(f"{work}/{t}.csv", dtype_backend="numpy_nullable")
    check(f"{t}: csv nullable m is Int", str(cn.m.dtype) in ("Int64", "UInt64"), str(cn.m.dtype))

# One type per CSV column across the two traces.
a = pd.read_csv(f"{work}/tiled.csv", dtype_backend="numpy_nullable")
b = pd.read_csv(f"{work}/copy.csv", dtype_backend="numpy_nullable")
for col in ["deps", "fingerprint", "start_ns", "start_ps", "bytes", "flops", "kind", "in_shapes"]:
    check(f"csv {col} type stable", str(a[col].dtype) == str(b[col].dtype), f"{a[col].dtype} vs {b[col].dtype}")

s = pd.read_parquet(f"{work}/sweep.parquet")
check("sweep rows", len(s) == 4, str(len(s)))
check("sweep swept columns", {"hbm.channel_bw_gbs", "m"} <= set(s.columns), str(list(s.columns)))
check("sweep verdicts", list(s.verdict) == ["PASS"] * 4, str(list(s.verdict)))
check("sweep sim_ns", s.sim_ns.dtype == "float64" and (s.sim_ns > 0).all())
sc = pd.read_csv(f"{work}/sweep.csv")
check("sweep csv = parquet", list(sc.sim_ns) == list(s.sim_ns) and list(sc.m) == list(s.m))
floats = [c for c in s.columns if str(s[c].dtype) == "float64"]
check("sweep csv float columns stay float", all(str(sc[c].dtype) == "float64" for c in floats),
      str({c: str(sc[c].dtype) for c in floats if str(sc[c].dtype) != "float64"}))
meta = pq.read_metadata(f"{work}/sweep.parquet").metadata
check("sweep provenance metadata", meta[b"kb.sweep.id"].decode() == s.sweep_id[0] and b"kb.sweep.spec" in meta,
      str(meta.keys()))
check("sweep polars", pl.read_parquet(f"{work}/sweep.parquet").height == 4)
best = duckdb.sql(f"select \"hbm.channel_bw_gbs\", m, sim_ns from '{work}/sweep.parquet' order by sim_ns limit 1").fetchall()[0]
check("sweep duckdb", best is not None)
print(f"pandas {pd.__version__}, pyarrow {pyarrow.__version__}, polars {pl.__version__}, duckdb {duckdb.__version__}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
