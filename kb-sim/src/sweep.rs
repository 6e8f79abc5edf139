//! `kb-sim sweep`: run the product of topology overrides (`--set
//! KEY=V1,V2`) and workload parameters (`-p KEY=V1,V2`) and collect one
//! results table (CSV and Parquet, [`kb_table`]).
//!
//! Each point runs as a child `kb-sim run` process (the same executable,
//! so a user crate's workloads sweep too), `-j N` at a time (default: all
//! cores); a child that fails costs only its point. Its trace is read
//! back for the row: simulated time, the kernels' window (first launch
//! start to last launch end), bytes moved, FLOPs executed and useful,
//! achieved bandwidth and FLOP rate over the kernel window, and per unit
//! kind (`pe_dma`, `pe_gemm`, `pe_math`, `hbm_ctrl`, ...) the busy time,
//! held time and utilisations as [`kb_format::usage`] defines them: busy
//! is the union of each unit's active intervals (when it computes or
//! transfers) within the window, held the union of its op spans (when it
//! holds work, waiting included), each summed over the units of that kind;
//! `K_util` = busy / (units x window), `K_held_util` = held / (units x
//! window). HBM channels (`hbm_channel`) are timed by the trace's channels
//! chunk, whose intervals are service time: busy = held there. With
//! `--verify` each trace is replayed by `kb-replay --verify` and the
//! verdict recorded. `--traces DIR` keeps each point's trace.
//!
//! For clusters, `--emit-jobs DIR` writes the points as a job list
//! (`jobs.txt`, one `kb-sim sweep --point I` command per line), a Slurm
//! job-array script (`sweep.sbatch`) running line `$SLURM_ARRAY_TASK_ID`,
//! and the directories their one-row tables and logs go to; `kb-inspect
//! merge DIR/results/*.parquet -o sweep.parquet` joins the rows.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kb_format::usage::{self, UnitTime};
use kb_format::{MmapTrace, OpKind, Params};
use kb_table::{Table, Values};

use crate::machine::Machine;
use crate::overrides;
use crate::topology::Topology;

/// One swept dimension: a topology field or a workload parameter and its
/// values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axis {
    /// `--set` (topology field) rather than `-p` (workload parameter).
    pub topology: bool,
    /// The field path or parameter name (the table's column name).
    pub key: String,
    /// The values, in the order given.
    pub values: Vec<String>,
}

impl Axis {
    /// Parse `KEY=V1,V2,...` (values trimmed, none empty).
    pub fn parse(s: &str, topology: bool) -> Result<Axis, String> {
        let flag = if topology { "--set" } else { "-p" };
        let (k, v) = s
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("{flag}: expected KEY=VALUE[,VALUE...], got {s:?}"))?;
        let values: Vec<String> = v.split(',').map(|x| x.trim().to_string()).collect();
        if values.iter().any(String::is_empty) {
            return Err(format!("{flag} {k}: an empty value in {v:?}"));
        }
        Ok(Axis {
            topology,
            key: k.to_string(),
            values,
        })
    }
}

/// What a sweep runs.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The base topology (embedded name or file).
    pub topology: String,
    /// The workload (`-b`); `None`: the executable's default.
    pub bench: Option<String>,
    /// Seed of every point.
    pub seed: u64,
    /// Swept dimensions, the first varying slowest.
    pub axes: Vec<Axis>,
    /// `--input NAME=FILE.npy`, passed to every point.
    pub inputs: Vec<(String, String)>,
    /// `--races`, passed to every point.
    pub races: String,
    /// Points run at once.
    pub jobs: usize,
    /// Keep each point's trace here (`point-NNNN.kbt`).
    pub traces: Option<PathBuf>,
    /// Replay each trace with `kb-replay --verify`.
    pub verify: bool,
    /// The kb-replay executable (default: beside this one, else `PATH`).
    pub replay: Option<PathBuf>,
    /// The table's path without extension: `.csv` and `.parquet` are written.
    pub out: PathBuf,
    /// Run only this point (job arrays).
    pub point: Option<usize>,
    /// The kb-sim executable the points run with.
    pub exe: PathBuf,
}

/// The points of the product: for each, one value index per axis.
pub fn points(axes: &[Axis]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for a in axes {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..a.values.len()).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

/// What one point's trace says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PointStats {
    /// Simulated time: the end of the last op (ps).
    pub sim_ps: u64,
    /// The kernels' window: first launch start to last launch end (ps);
    /// the whole run when there are no launches.
    pub kernel_window_ps: (u64, u64),
    /// Records in the trace.
    pub records: u64,
    /// Bytes moved by every memory op (write extents).
    pub bytes: u64,
    /// Bytes moved by memory ops that start within the kernel window.
    pub kernel_bytes: u64,
    /// FLOPs executed by the launches.
    pub flops: u64,
    /// The useful part of them (padding of edge tiles left out).
    pub useful_flops: u64,
    /// Per unit kind: busy and held time within the kernel window summed
    /// over its units, and the units of that kind in the machine.
    pub units: BTreeMap<String, UnitUse>,
}

/// One unit kind's time in a point's kernel window ([`kb_format::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitUse {
    /// Active time (computing or transferring), summed over the units (ps).
    pub busy: u64,
    /// Held time (op spans, waiting included), summed over the units (ps).
    pub held: u64,
    /// Units of that kind in the machine.
    pub units: u64,
}

/// The unit kind of a node or component name: the name less its leading
/// `sipN.`, `cubeN.`, `peN.` coordinates (`sip0.cube1.pe3.pe_dma` ->
/// `pe_dma`); [`kb_format::usage::unit_kind`].
pub fn unit_kind(name: &str) -> &str {
    usage::unit_kind(name)
}

/// Units of each kind in a machine (`pe_dma` -> 32 on `default`).
pub fn unit_counts(machine: &Machine) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for n in &machine.nodes {
        *counts.entry(unit_kind(&n.name).to_string()).or_default() += 1;
    }
    // HBM pseudo channels are not nodes: the trace's channels chunk times
    // them (`hbm_channel_*` columns).
    let c = machine.topo.counts;
    counts.insert(
        "hbm_channel".into(),
        u64::from(c.sips * c.cubes_per_sip) * u64::from(machine.topo.hbm.pseudo_channels),
    );
    counts
}

/// Read a point's trace back: the numbers of its row (`counts`: units of
/// each kind in the point's machine, [`unit_counts`]).
pub fn analyze(trace: &Path, counts: &BTreeMap<String, u64>) -> Result<PointStats, String> {
    let t = MmapTrace::open(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let launches = t.launches();
    let mut s = PointStats {
        flops: launches.iter().map(|l| l.flops).sum(),
        useful_flops: launches.iter().map(|l| l.useful_flops).sum(),
        ..Default::default()
    };
    let window = usage::kernel_window(launches);
    // Without launches the whole run (its end is known only after the
    // records: clip at u64::MAX, which the run cannot pass).
    let clip = window.unwrap_or((0, u64::MAX));
    let mut time: Vec<Option<UnitTime>> = Vec::new();
    t.for_each_record(|r, _| {
        s.records += 1;
        s.sim_ps = s.sim_ps.max(r.t_end);
        let b = if r.kind == OpKind::Memory {
            match (&r.write, &r.params) {
                (Some(w), _) => w.ranges.iter().map(|x| x.bytes()).sum(),
                (None, Params::Memory(p)) => p.nbytes(),
                _ => 0,
            }
        } else {
            0
        };
        s.bytes = s.bytes.saturating_add(b);
        let (k0, k1) = clip;
        if r.t_start >= k0 && r.t_start <= k1 {
            s.kernel_bytes = s.kernel_bytes.saturating_add(b);
        }
        // Sync records (kernels, waits, signals, maps) are not a unit's
        // work: no busy time, and no held time in a unit kind's column.
        if r.kind == OpKind::Sync {
            return Ok(());
        }
        let i = r.component as usize;
        if i >= time.len() {
            time.resize(i + 1, None);
        }
        time[i].get_or_insert_with(|| UnitTime::new(clip)).add(r);
        Ok(())
    })
    .map_err(|e| format!("{}: {e}", trace.display()))?;
    // The simulated time is the footer's end time (kb-sim's, which may pass
    // the last record's end), as `kb-inspect summary` reports it.
    s.sim_ps = s.sim_ps.max(t.footer().counts.max_t_end);
    s.kernel_window_ps = window.unwrap_or((0, s.sim_ps));
    let strings = t.strings();
    for (id, u) in time.iter_mut().enumerate() {
        let Some(u) = u else { continue };
        let total = u.finish(clip);
        let name = strings.name(id as u32);
        let kind = unit_kind(&name).to_string();
        let units = counts.get(&kind).copied().unwrap_or(1);
        let e = s.units.entry(kind).or_insert(UnitUse {
            units,
            ..UnitUse::default()
        });
        e.busy += total.busy;
        e.held += total.held;
    }
    // Components with no ops were idle: the unit kinds that compute or move
    // data always get a column.
    for k in ["pe_dma", "pe_gemm", "pe_math"] {
        if let Some(&units) = counts.get(k) {
            s.units.entry(k.to_string()).or_insert(UnitUse {
                units,
                ..UnitUse::default()
            });
        }
    }
    // HBM channels: their busy intervals in the kernel window (service
    // time: held = busy).
    if let Some(&units) = counts.get("hbm_channel") {
        let (k0, k1) = clip;
        let busy = t
            .channels()
            .map_err(|e| format!("{}: {e}", trace.display()))?
            .iter()
            .flat_map(|c| c.busy.iter())
            .map(|&(a, b)| b.min(k1).saturating_sub(a.max(k0)))
            .fold(0u64, u64::saturating_add);
        s.units.insert(
            "hbm_channel".into(),
            UnitUse {
                busy,
                held: busy,
                units,
            },
        );
    }
    // Op-name strings are not components: drop kinds no node has.
    s.units
        .retain(|k, v| counts.contains_key(k) && (v.held > 0 || v.units > 0));
    Ok(s)
}

/// A finished point: its row's values.
#[derive(Debug, Clone)]
struct Outcome {
    point: usize,
    status: String,
    stats: Option<PointStats>,
    verdict: Option<String>,
    trace: Option<PathBuf>,
    wall_s: f64,
}

/// The `kb-sim run` arguments of point `p` (values `idx`), writing to `out`.
fn run_args(cfg: &SweepConfig, idx: &[usize], out: &Path) -> Vec<String> {
    let mut a = vec!["run".to_string(), "-t".into(), cfg.topology.clone()];
    if let Some(b) = &cfg.bench {
        a.extend(["-b".into(), b.clone()]);
    }
    a.extend(["--seed".into(), cfg.seed.to_string()]);
    for (ax, &i) in cfg.axes.iter().zip(idx) {
        let flag = if ax.topology { "--set" } else { "-p" };
        a.extend([flag.into(), format!("{}={}", ax.key, ax.values[i])]);
    }
    for (k, v) in &cfg.inputs {
        a.extend(["--input".into(), format!("{k}={v}")]);
    }
    a.extend([
        "--races".into(),
        cfg.races.clone(),
        "-q".into(),
        "-o".into(),
        out.display().to_string(),
    ]);
    a
}

fn replay_exe(cfg: &SweepConfig) -> PathBuf {
    if let Some(p) = &cfg.replay {
        return p.clone();
    }
    let beside = cfg.exe.with_file_name("kb-replay");
    if beside.is_file() {
        beside
    } else {
        PathBuf::from("kb-replay")
    }
}

fn last_line(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

fn run_point(
    cfg: &SweepConfig,
    point: usize,
    idx: &[usize],
    counts: &BTreeMap<String, u64>,
) -> Outcome {
    let wall = Instant::now();
    let (trace, keep) = match &cfg.traces {
        Some(d) => (d.join(format!("point-{point:04}.kbt")), true),
        None => (
            std::env::temp_dir().join(format!("kb-sweep-{}-{point:04}.kbt", std::process::id())),
            false,
        ),
    };
    let mut o = Outcome {
        point,
        status: "ok".into(),
        stats: None,
        verdict: None,
        trace: keep.then(|| trace.clone()),
        wall_s: 0.0,
    };
    let res = Command::new(&cfg.exe)
        .args(run_args(cfg, idx, &trace))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match res {
        Err(e) => o.status = format!("error: running {}: {e}", cfg.exe.display()),
        Ok(out) if !out.status.success() => {
            o.status = format!("error: {}", last_line(&out.stderr));
            o.trace = None;
        }
        Ok(_) => {
            match analyze(&trace, counts) {
                Ok(s) => o.stats = Some(s),
                Err(e) => o.status = format!("error: {e}"),
            }
            if cfg.verify {
                let r = Command::new(replay_exe(cfg))
                    .arg(&trace)
                    .args(["--verify", "-q", "-j", "1"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .output();
                o.verdict = Some(match r {
                    Ok(r) if r.status.code() == Some(0) => "PASS".into(),
                    Ok(r) if r.status.code() == Some(1) => "FAIL".into(),
                    Ok(r) => format!("ERROR: {}", last_line(&r.stderr)),
                    Err(e) => format!("ERROR: running {}: {e}", replay_exe(cfg).display()),
                });
            }
        }
    }
    if !keep {
        let _ = std::fs::remove_file(&trace);
    }
    o.wall_s = wall.elapsed().as_secs_f64();
    o
}

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

/// The results table of `outcomes` (ordered by point).
fn table(cfg: &SweepConfig, all: &[Vec<usize>], outcomes: &[Outcome]) -> Table {
    let mut t = Table::default();
    t.push(
        "point",
        Values::U64(outcomes.iter().map(|o| Some(o.point as u64)).collect()),
    );
    for (a, ax) in cfg.axes.iter().enumerate() {
        let rows: Vec<Vec<usize>> = outcomes.iter().map(|o| vec![all[o.point][a]]).collect();
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

/// Check every axis and point before anything runs: keys are unique,
/// every topology override applies. Returns each point's unit counts.
#[allow(clippy::type_complexity)]
fn check(
    cfg: &SweepConfig,
    all: &[Vec<usize>],
) -> Result<Vec<Option<BTreeMap<String, u64>>>, String> {
    for (i, a) in cfg.axes.iter().enumerate() {
        if cfg.axes[..i].iter().any(|b| b.key == a.key) {
            return Err(format!("sweep: {} is swept twice", a.key));
        }
        if ["point", "status", "verdict", "trace", "wall_s"].contains(&a.key.as_str()) {
            return Err(format!(
                "sweep: {} names a column of the results table",
                a.key
            ));
        }
    }
    let base = Topology::load(&cfg.topology).map_err(|e| e.to_string())?;
    let mut machines = Vec::new();
    for (p, idx) in all.iter().enumerate() {
        if cfg.point.is_some_and(|q| q != p) {
            machines.push(None);
            continue;
        }
        let sets: Vec<(String, String)> = cfg
            .axes
            .iter()
            .zip(idx)
            .filter(|(a, _)| a.topology)
            .map(|(a, &i)| (a.key.clone(), a.values[i].clone()))
            .collect();
        let t = overrides::apply(&base, &sets).map_err(|e| format!("point {p}: {e}"))?;
        machines.push(Some(unit_counts(&Machine::build(&t))));
    }
    Ok(machines)
}

/// Run the sweep; write the table. Returns the number of failed points.
pub fn run(cfg: &SweepConfig) -> Result<usize, String> {
    let all = points(&cfg.axes);
    if let Some(p) = cfg.point
        && p >= all.len()
    {
        return Err(format!(
            "--point {p}: the sweep has {} points (0..{})",
            all.len(),
            all.len().saturating_sub(1)
        ));
    }
    let (csv, pq) = out_paths(&cfg.out);
    for p in [&csv, &pq] {
        if kb_format::is_terminal_path(p) {
            return Err(format!(
                "refusing to write a table to a terminal ({})",
                p.display()
            ));
        }
    }
    let machines = check(cfg, &all)?;
    if let Some(d) = &cfg.traces {
        std::fs::create_dir_all(d).map_err(|e| format!("--traces {}: {e}", d.display()))?;
    }
    let todo: Vec<usize> = match cfg.point {
        Some(p) => vec![p],
        None => (0..all.len()).collect(),
    };
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let workers = cfg.jobs.clamp(1, todo.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&p) = todo.get(i) else { break };
                    let m = machines[p].as_ref().expect("checked");
                    let o = run_point(cfg, p, &all[p], m);
                    let desc: Vec<String> = cfg
                        .axes
                        .iter()
                        .zip(&all[p])
                        .map(|(a, &v)| format!("{}={}", a.key, a.values[v]))
                        .collect();
                    let what = match (&o.stats, &o.verdict) {
                        (Some(st), v) => format!(
                            "simulated {} ns, kernels {} ns{}",
                            crate_ns(st.sim_ps),
                            crate_ns(st.kernel_window_ps.1 - st.kernel_window_ps.0),
                            v.as_ref().map(|v| format!(", {v}")).unwrap_or_default()
                        ),
                        (None, _) => o.status.clone(),
                    };
                    say!(
                        "kb-sim sweep: point {p} ({}): {what} [{:.2} s]",
                        desc.join(" "),
                        o.wall_s
                    );
                    done.lock().expect("no worker panics holding it").push(o);
                }
            });
        }
    });
    let mut outcomes = done.into_inner().expect("workers finished");
    outcomes.sort_by_key(|o| o.point);
    let failed = outcomes.iter().filter(|o| o.status != "ok").count();
    let t = table(cfg, &all, &outcomes);
    t.save(&csv).map_err(|e| e.to_string())?;
    t.save(&pq).map_err(|e| e.to_string())?;
    say!(
        "kb-sim sweep: {} point{}{}: wrote {} and {}",
        outcomes.len(),
        if outcomes.len() == 1 { "" } else { "s" },
        if failed > 0 {
            format!(" ({failed} failed: see status)")
        } else {
            String::new()
        },
        csv.display(),
        pq.display()
    );
    Ok(failed)
}

fn crate_ns(ps: u64) -> String {
    format!("{}.{:03}", ps / 1000, ps % 1000)
}

/// Quote a word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `--emit-jobs DIR`: write `DIR/jobs.txt` (one `kb-sim sweep --point I`
/// command per point), `DIR/sweep.sbatch` (a Slurm job array over them)
/// and the `results/` and `logs/` directories; run nothing. Returns the
/// number of points.
pub fn emit_jobs(cfg: &SweepConfig, dir: &Path) -> Result<usize, String> {
    let all = points(&cfg.axes);
    check(cfg, &all)?;
    let io = |what: &Path, e: std::io::Error| format!("--emit-jobs: {}: {e}", what.display());
    std::fs::create_dir_all(dir.join("results")).map_err(|e| io(dir, e))?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| io(dir, e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| io(dir, e))?;
    let abs = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or(p.to_path_buf())
        }
    };
    let exe = abs(&cfg.exe);
    let mut jobs = String::new();
    for p in 0..all.len() {
        let mut a: Vec<String> = vec![
            "sweep".into(),
            "-t".into(),
            cfg.topology.clone(),
            "--seed".into(),
            cfg.seed.to_string(),
        ];
        if let Some(b) = &cfg.bench {
            a.extend(["-b".into(), b.clone()]);
        }
        for ax in &cfg.axes {
            let flag = if ax.topology { "--set" } else { "-p" };
            a.extend([flag.into(), format!("{}={}", ax.key, ax.values.join(","))]);
        }
        for (k, v) in &cfg.inputs {
            a.extend([
                "--input".into(),
                format!("{k}={}", abs(Path::new(v)).display()),
            ]);
        }
        a.extend(["--races".into(), cfg.races.clone(), "-j".into(), "1".into()]);
        if cfg.verify {
            a.push("--verify".into());
            if let Some(r) = &cfg.replay {
                a.extend(["--replay".into(), abs(r).display().to_string()]);
            }
        }
        if let Some(t) = &cfg.traces {
            a.extend(["--traces".into(), abs(t).display().to_string()]);
        }
        a.extend([
            "--point".into(),
            p.to_string(),
            "-o".into(),
            dir.join("results")
                .join(format!("point-{p:04}"))
                .display()
                .to_string(),
        ]);
        let words: Vec<String> = a.iter().map(|w| shell_quote(w)).collect();
        jobs += &format!(
            "\"${{KB_SIM:-{}}}\" {}\n",
            exe.display()
                .to_string()
                .replace(['"', '$', '`', '\\'], "_"),
            words.join(" ")
        );
    }
    let n = all.len();
    let jobs_path = dir.join("jobs.txt");
    let script = format!(
        "#!/usr/bin/env bash
# A kb-sim design-space sweep of {n} points as a Slurm job array, written by
# `kb-sim sweep --emit-jobs`. Submit it with
#     sbatch {script}
# Array task I runs line I+1 of jobs.txt: one point, `kb-sim sweep --point I`,
# writing a one-row table to results/point-NNNN.{{csv,parquet}}. When every
# task has finished, join the rows:
#     kb-inspect merge {results}/point-*.parquet -o sweep.parquet
# KB_SIM overrides the kb-sim executable (the default is the one that wrote
# this file); the nodes need it (and kb-replay, with --verify) at that path.
#SBATCH --job-name=kb-sweep
#SBATCH --array=0-{last}
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --output={logs}/point-%a.out
set -euo pipefail
line=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" {jobs})
if [ -z \"$line\" ]; then
    echo \"no job line $((SLURM_ARRAY_TASK_ID + 1)) in {jobs}\" >&2
    exit 2
fi
eval \"$line\"
",
        script = shell_quote(&dir.join("sweep.sbatch").display().to_string()),
        results = shell_quote(&dir.join("results").display().to_string()),
        logs = dir.join("logs").display(),
        jobs = shell_quote(&jobs_path.display().to_string()),
        last = n - 1,
    );
    let write = |p: &Path, text: &str| -> Result<(), String> {
        let mut f = kb_format::AtomicFile::create(p)
            .map_err(|e| io(p, e))?
            .remove_on_signal();
        f.write_all(text.as_bytes()).map_err(|e| io(p, e))?;
        f.commit().map_err(|e| io(p, e))
    };
    write(&jobs_path, &jobs)?;
    let sbatch = dir.join("sweep.sbatch");
    write(&sbatch, &script)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&sbatch, std::fs::Permissions::from_mode(0o755));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_parse_and_points_are_the_product() {
        let a = Axis::parse("hbm.channel_bw_gbs=16, 32,64", true).unwrap();
        assert_eq!(a.values, ["16", "32", "64"]);
        assert!(Axis::parse("m=1,,2", false).is_err());
        assert!(Axis::parse("=1", false).is_err());
        let b = Axis::parse("m=1024,2048", false).unwrap();
        let p = points(&[a, b]);
        assert_eq!(p.len(), 6);
        assert_eq!(p[0], [0, 0]);
        assert_eq!(p[1], [0, 1]);
        assert_eq!(p[5], [2, 1]);
        assert_eq!(points(&[]), vec![Vec::<usize>::new()]);
    }

    #[test]
    fn unit_kinds_and_quoting() {
        assert_eq!(unit_kind("sip0.cube1.pe3.pe_dma"), "pe_dma");
        assert_eq!(unit_kind("sip0.cube1.hbm_ctrl"), "hbm_ctrl");
        assert_eq!(unit_kind("sip1.io_cpu"), "io_cpu");
        assert_eq!(unit_kind("host"), "host");
        assert_eq!(shell_quote("a=b,c"), "a=b,c");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
        let (c, p) = out_paths(Path::new("out/sweep.parquet"));
        assert_eq!(
            (c.to_str(), p.to_str()),
            (Some("out/sweep.csv"), Some("out/sweep.parquet"))
        );
        let (c, _) = out_paths(Path::new("res"));
        assert_eq!(c.to_str(), Some("res.csv"));
    }

    /// A trace of two PE GEMM units and one DMA engine, kernel window
    /// [1000, 5000) from two launches, some records with active intervals.
    #[test]
    fn busy_is_active_time_and_held_the_spans_in_the_kernel_window() {
        use kb_format::{Launch, Meta, Record, TraceWriter, VerifySpec};
        let mut w = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
        let g0 = w.intern("sip0.cube0.pe0.pe_gemm");
        let g1 = w.intern("sip0.cube0.pe1.pe_gemm");
        let dma = w.intern("sip0.cube0.pe0.pe_dma");
        let host = w.intern("host");
        let recs = [
            // Host upload before the window: not counted anywhere.
            (host, 0, 1000, None),
            // DMA: two transfers in flight, moving bytes out of order.
            (dma, 1000, 3000, Some((2500, 3000))),
            (dma, 1500, 2500, Some((2000, 2400))),
            // GEMM pe0: held [1200,2200) active [2000,2200); then [4500,
            // 6000) active [5500,6000), past the window's end.
            (g0, 1200, 2200, Some((2000, 2200))),
            (g0, 4500, 6000, Some((5500, 6000))),
            // GEMM pe1: no active interval (all of it busy).
            (g1, 3000, 3500, None),
        ];
        let mut sorted = recs.to_vec();
        sorted.sort_by_key(|r| r.1);
        for (i, (c, t0, t1, active)) in sorted.into_iter().enumerate() {
            w.push(Record {
                op_id: i as u64,
                t_start: t0,
                t_end: t1,
                component: c,
                op_name: c,
                active,
                ..Record::default()
            })
            .unwrap();
        }
        let launch = |t_start, t_end| Launch {
            kernel: "k".into(),
            grid: [1, 1],
            pes: vec![[0, 0, 0]],
            t_start,
            t_end,
            flops: 0,
            useful_flops: 0,
        };
        let bytes = w
            .finish_with_launches(
                &[launch(1000, 3000), launch(3000, 5000)],
                &VerifySpec::default(),
            )
            .unwrap();
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t.kbt");
        std::fs::write(&path, bytes).unwrap();
        let counts: BTreeMap<String, u64> =
            [("pe_gemm", 4), ("pe_dma", 4), ("pe_math", 4), ("host", 1)]
                .into_iter()
                .map(|(k, n)| (k.to_string(), n))
                .collect();
        let s = analyze(&path, &counts).unwrap();
        assert_eq!(s.kernel_window_ps, (1000, 5000));
        let u = |k: &str| s.units[k];
        // DMA: active [2000,2400) u [2500,3000) = 900; held [1000,3000).
        assert_eq!(
            u("pe_dma"),
            UnitUse {
                busy: 900,
                held: 2000,
                units: 4
            }
        );
        // GEMM: pe0 active 200 (+ 0 in the window), held 1000 + 500;
        // pe1 500 and 500.
        assert_eq!(
            u("pe_gemm"),
            UnitUse {
                busy: 700,
                held: 2000,
                units: 4
            }
        );
        assert_eq!(
            u("pe_math"),
            UnitUse {
                busy: 0,
                held: 0,
                units: 4
            }
        );
        // The host's upload lies before the window.
        assert_eq!(
            u("host"),
            UnitUse {
                busy: 0,
                held: 0,
                units: 1
            }
        );
        // The table: util = busy / (4 x 4000 ps).
        let o = Outcome {
            point: 0,
            status: "ok".into(),
            stats: Some(s),
            verdict: None,
            trace: None,
            wall_s: 0.0,
        };
        let cfg = SweepConfig {
            topology: "small".into(),
            bench: None,
            seed: 0,
            axes: vec![],
            inputs: vec![],
            races: String::new(),
            jobs: 1,
            traces: None,
            verify: false,
            replay: None,
            out: PathBuf::new(),
            point: None,
            exe: PathBuf::new(),
        };
        let t = table(&cfg, &[vec![]], &[o]);
        let col = |name: &str| t.column(name).and_then(|c| c.values.f64(0));
        assert_eq!(col("pe_gemm_busy_ns"), Some(0.7));
        assert_eq!(col("pe_gemm_util"), Some(700.0 / 16000.0));
        assert_eq!(col("pe_gemm_held_ns"), Some(2.0));
        assert_eq!(col("pe_gemm_held_util"), Some(2000.0 / 16000.0));
        assert_eq!(col("pe_dma_util"), Some(900.0 / 16000.0));
        assert_eq!(col("pe_dma_held_util"), Some(0.125));
    }
}
