//! The sweep's results table: a row per point, the axes' columns, and
//! the [`Provenance`] every table carries ([`spec`], [`sweep_id`]).

use super::*;

/// An axis's values as one typed column (integers, numbers or names).
fn axis_column(ax: &Axis, rows: &[Vec<usize>]) -> Values {
    let vals: Vec<&str> = rows.iter().map(|r| ax.values[r[0]].as_str()).collect();
    if vals.iter().all(|v| v.parse::<u64>().is_ok()) {
        Values::U64(vals.iter().map(|v| v.parse().ok()).collect())
    } else if vals.iter().all(|v| v.parse::<f64>().is_ok()) {
        Values::F64(vals.iter().map(|v| v.parse().ok()).collect())
    } else {
        Values::Str(vals.iter().map(|v| Some(v.to_string())).collect())
    }
}

/// What identifies a sweep and the runs of its points: stored in every
/// table it writes (columns, and Parquet key-value metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// [`sweep_id`] of [`Provenance::spec`].
    pub id: String,
    /// [`spec`]: everything that determines the points' runs.
    pub spec: String,
    /// Points in the whole sweep (a `--point` table holds one of them).
    pub points: usize,
}

/// The kb version that writes tables (and the traces they read).
pub const KB_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The topology as a table names it: an embedded name, or the file's
/// absolute path (so a job run from another directory names the same).
pub fn topology_name(topology: &str) -> String {
    if crate::topology::EMBEDDED
        .iter()
        .any(|(n, _)| *n == topology)
    {
        return topology.to_string();
    }
    absolute(Path::new(topology)).display().to_string()
}

/// `p` as an absolute path: canonical where it exists, else joined to the
/// current directory.
pub fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or(p.to_path_buf())
        }
    })
}

/// A sweep's spec: everything that determines its points and their runs,
/// one item a line in a fixed order (the kb version, workload, seed, race
/// policy, whether points are verified, each axis with its values in
/// order, the inputs by absolute path, and the base topology as resolved
/// YAML, so an edited topology file is another sweep). Where the
/// topology and inputs were named from, and where outputs go, are left
/// out: a job run from another directory has the same spec.
pub fn spec(cfg: &SweepConfig, base: &Topology) -> String {
    use std::fmt::Write as _;
    let mut s = String::from("kb-sim sweep spec 1\n");
    let _ = writeln!(s, "kb_version={KB_VERSION}");
    let _ = writeln!(s, "workload={}", cfg.bench);
    let _ = writeln!(s, "seed={}", cfg.seed);
    let _ = writeln!(s, "races={}", cfg.races);
    let _ = writeln!(s, "verify={}", cfg.verify);
    for a in &cfg.axes {
        let flag = if a.topology { "--set" } else { "-p" };
        let _ = writeln!(s, "{flag} {}={}", a.key, a.values.join(","));
    }
    for (k, v) in &cfg.inputs {
        let _ = writeln!(s, "--input {k}={}", absolute(Path::new(v)).display());
    }
    s += "topology:\n";
    s += &base.to_yaml();
    s
}

/// A sweep's id: the 64-bit xxh3 of its [`spec`], as 16 hex digits.
pub fn sweep_id(spec: &str) -> String {
    format!("{:016x}", kb_format::fingerprint(spec.as_bytes()))
}

/// The results table of `outcomes` (ordered by point).
pub(super) fn table(cfg: &SweepConfig, prov: &Provenance, outcomes: &[Outcome]) -> Table {
    let mut t = Table::default();
    t.push(
        "point",
        Values::U64(outcomes.iter().map(|o| Some(o.point as u64)).collect()),
    );
    for (a, ax) in cfg.axes.iter().enumerate() {
        let rows: Vec<Vec<usize>> = outcomes
            .iter()
            .map(|o| vec![point_values(&cfg.axes, o.point)[a]])
            .collect();
        t.push(ax.key.clone(), axis_column(ax, &rows));
    }
    t.push(
        "status",
        Values::Str(outcomes.iter().map(|o| Some(o.status.clone())).collect()),
    );
    let st = |f: &dyn Fn(&PointStats) -> Option<f64>| -> Values {
        Values::F64(
            outcomes
                .iter()
                .map(|o| o.stats.as_ref().and_then(f))
                .collect(),
        )
    };
    let su = |f: &dyn Fn(&PointStats) -> u64| -> Values {
        Values::U64(outcomes.iter().map(|o| o.stats.as_ref().map(f)).collect())
    };
    let kernel_ns = |s: &PointStats| (s.kernel_window_ps.1 - s.kernel_window_ps.0) as f64 / 1e3;
    let rate = |x: u64, s: &PointStats| {
        let ns = kernel_ns(s);
        (ns > 0.0).then(|| x as f64 / ns)
    };
    t.push("sim_ns", st(&|s| Some(s.sim_ps as f64 / 1e3)));
    t.push(
        "kernel_start_ns",
        st(&|s| Some(s.kernel_window_ps.0 as f64 / 1e3)),
    );
    t.push("kernel_ns", st(&|s| Some(kernel_ns(s))));
    t.push("records", su(&|s| s.records));
    t.push("bytes", su(&|s| s.bytes));
    t.push("kernel_bytes", su(&|s| s.kernel_bytes));
    t.push("achieved_gbs", st(&|s| rate(s.kernel_bytes, s)));
    t.push("flops", su(&|s| s.flops));
    t.push("useful_flops", su(&|s| s.useful_flops));
    t.push("achieved_gflops", st(&|s| rate(s.useful_flops, s)));
    t.push("executed_gflops", st(&|s| rate(s.flops, s)));
    t.push(
        "arithmetic_intensity",
        st(&|s| (s.kernel_bytes > 0).then(|| s.useful_flops as f64 / s.kernel_bytes as f64)),
    );
    // The machine's peaks (every point has them, failed ones too): a
    // roofline needs no other file.
    let peak = |f: &dyn Fn(&Peaks) -> f64| {
        Values::F64(outcomes.iter().map(|o| Some(f(&o.peaks))).collect())
    };
    for (i, d) in PEAK_DTYPES.iter().enumerate() {
        t.push(format!("peak_gemm_gflops_{d}"), peak(&|p| p.gemm_gflops[i]));
    }
    for (i, d) in PEAK_DTYPES.iter().enumerate() {
        t.push(format!("peak_math_gflops_{d}"), peak(&|p| p.math_gflops[i]));
    }
    t.push("peak_hbm_gbs", peak(&|p| p.hbm_gbs));
    let mut kinds: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.stats.as_ref())
        .flat_map(|s| s.units.keys().cloned())
        .collect();
    kinds.sort();
    kinds.dedup();
    for k in &kinds {
        let unit = |s: &PointStats| s.units.get(k).copied().unwrap_or_default();
        t.push(format!("{k}_units"), su(&|s| unit(s).units));
        t.push(
            format!("{k}_busy_ns"),
            st(&|s| Some(unit(s).busy as f64 / 1e3)),
        );
        t.push(
            format!("{k}_util"),
            st(&|s| usage::utilisation(unit(s).busy, unit(s).units, s.kernel_window_ps)),
        );
        t.push(
            format!("{k}_held_ns"),
            st(&|s| Some(unit(s).held as f64 / 1e3)),
        );
        t.push(
            format!("{k}_held_util"),
            st(&|s| usage::utilisation(unit(s).held, unit(s).units, s.kernel_window_ps)),
        );
    }
    if cfg.verify {
        t.push(
            "verdict",
            Values::Str(outcomes.iter().map(|o| o.verdict.clone()).collect()),
        );
    }
    if cfg.traces.is_some() {
        t.push(
            "trace",
            Values::Str(
                outcomes
                    .iter()
                    .map(|o| o.trace.as_ref().map(|p| p.display().to_string()))
                    .collect(),
            ),
        );
    }
    t.push(
        "wall_s",
        Values::F64(outcomes.iter().map(|o| Some(o.wall_s)).collect()),
    );
    // Provenance: which sweep each row belongs to (kb-inspect merge
    // refuses rows of another sweep and finds missing points by it).
    let same = |v: String| Values::Str(outcomes.iter().map(|_| Some(v.clone())).collect());
    t.push("workload", same(cfg.bench.clone()));
    t.push("topology", same(topology_name(&cfg.topology)));
    t.push(
        "seed",
        Values::U64(outcomes.iter().map(|_| Some(cfg.seed)).collect()),
    );
    if !cfg.inputs.is_empty() {
        let inputs: Vec<String> = cfg
            .inputs
            .iter()
            .map(|(k, v)| format!("{k}={}", absolute(Path::new(v)).display()))
            .collect();
        t.push("inputs", same(inputs.join(" ")));
    }
    t.push("kb_version", same(KB_VERSION.into()));
    t.push("sweep_id", same(prov.id.clone()));
    t.push(
        "sweep_points",
        Values::U64(outcomes.iter().map(|_| Some(prov.points as u64)).collect()),
    );
    t.meta = vec![
        ("kb.sweep.id".into(), prov.id.clone()),
        ("kb.sweep.points".into(), prov.points.to_string()),
        ("kb.sweep.spec".into(), prov.spec.clone()),
        ("kb.version".into(), KB_VERSION.into()),
    ];
    t
}

/// The two output paths of `-o PREFIX` (`.csv`, `.parquet`; an extension
/// given is replaced).
pub fn out_paths(prefix: &Path) -> (PathBuf, PathBuf) {
    let base = match prefix.extension().and_then(|e| e.to_str()) {
        Some("csv" | "parquet") => prefix.with_extension(""),
        _ => prefix.to_path_buf(),
    };
    let mut csv = base.clone().into_os_string();
    csv.push(".csv");
    let mut pq = base.into_os_string();
    pq.push(".parquet");
    (PathBuf::from(csv), PathBuf::from(pq))
}
