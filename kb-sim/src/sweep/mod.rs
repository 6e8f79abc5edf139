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
//! verdict recorded (a FAIL or an error fails the point: the sweep exits
//! as kb-replay does, [`Summary::exit_code`]). `--traces DIR` keeps each
//! point's trace. Every table carries the sweep's [`Provenance`] (its
//! [`spec`] and [`sweep_id`]), the machine's [`Peaks`], and the workload,
//! topology, seed and kb version of its runs.
//!
//! For clusters, `--emit-jobs DIR` writes the sweep's command once
//! (`jobs.txt`), a Slurm job-array script (`sweep.sbatch`) whose task runs
//! [`Jobs::points_per_task`] points with `--point I`, `submit.sh` with one
//! `sbatch` per array of at most [`Jobs::max_array_size`] tasks, and the
//! directories their one-row tables and logs go to; `kb-inspect merge
//! DIR/results/*.parquet -o sweep.parquet` joins the rows.

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

mod analyze;
mod jobs;
mod table;

pub use analyze::*;
pub use jobs::*;
pub use table::*;

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
    /// The workload (`-b`, resolved: the executable's default when not
    /// given).
    pub bench: String,
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
    /// Run (or emit) a sweep of more than [`MAX_POINTS`] points.
    pub force: bool,
}

/// The points of the product: for each, one value index per axis (the
/// first axis varying slowest). Materialises every point: for tests and
/// small sweeps; [`point_count`] and [`point_values`] do not.
pub fn points(axes: &[Axis]) -> Vec<Vec<usize>> {
    let n = point_count(axes).unwrap_or(0);
    (0..n).map(|p| point_values(axes, p)).collect()
}

/// How many points the product has; `None` when the count overflows.
pub fn point_count(axes: &[Axis]) -> Option<usize> {
    axes.iter()
        .try_fold(1usize, |n, a| n.checked_mul(a.values.len()))
}

/// Point `p`'s value index on each axis (`p` < [`point_count`]).
pub fn point_values(axes: &[Axis], p: usize) -> Vec<usize> {
    let mut idx = vec![0; axes.len()];
    let mut rest = p;
    for (i, a) in axes.iter().enumerate().rev() {
        let n = a.values.len().max(1);
        idx[i] = rest % n;
        rest /= n;
    }
    idx
}

/// The most points a sweep runs (or emits) without `--force`.
pub const MAX_POINTS: usize = 100_000;

/// A finished point: its row's values.
#[derive(Debug, Clone)]
struct Outcome {
    point: usize,
    status: String,
    stats: Option<PointStats>,
    verdict: Option<String>,
    trace: Option<PathBuf>,
    wall_s: f64,
    peaks: Peaks,
}

/// The `kb-sim run` arguments of point `p` (values `idx`), writing to `out`.
fn run_args(cfg: &SweepConfig, idx: &[usize], out: &Path) -> Vec<String> {
    let mut a = vec!["run".to_string(), "-t".into(), cfg.topology.clone()];
    a.extend(["-b".into(), cfg.bench.clone()]);
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

/// Whether a signal has asked the sweep to stop ([`kb_format::signals`]).
fn interrupted() -> Option<i32> {
    #[cfg(unix)]
    return kb_format::signals::pending();
    #[cfg(not(unix))]
    None
}

/// The most bytes of a child's stdout or stderr kept (its last ones).
const STDERR_TAIL: usize = 64 << 10;

/// What a child printed and how it ended: its status, the last
/// [`STDERR_TAIL`] bytes of its stdout (kb-replay's verdict lines) and of
/// its stderr (errors).
type ChildEnd = (std::process::ExitStatus, Vec<u8>, Vec<u8>);

/// Read `from` to its end on a thread, keeping the last [`STDERR_TAIL`]
/// bytes.
fn tail_of(mut from: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let (mut tail, mut buf) = (Vec::new(), vec![0u8; 8192]);
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 2 * STDERR_TAIL {
                tail.drain(..tail.len() - STDERR_TAIL);
            }
        }
        tail
    })
}

/// Run `cmd` (stdin closed, stdout and stderr collected: their last
/// [`STDERR_TAIL`] bytes); `Ok(None)` when a signal stopped the sweep
/// first: the child is asked to stop (SIGTERM: kb's tools remove their
/// partial output) and waited for.
fn run_child(cmd: &mut Command) -> std::io::Result<Option<ChildEnd>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = tail_of(child.stdout.take().expect("stdout is piped"));
    let err = tail_of(child.stderr.take().expect("stderr is piped"));
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some((
                status,
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            )));
        }
        if interrupted().is_some() {
            #[cfg(unix)]
            kb_format::signals::terminate(child.id());
            #[cfg(not(unix))]
            let _ = child.kill();
            let _ = child.wait();
            let _ = out.join();
            let _ = err.join();
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn run_point(cfg: &SweepConfig, point: usize, idx: &[usize], machine: &MachineInfo) -> Outcome {
    let counts = &machine.units;
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
        peaks: machine.peaks,
    };
    let stopped = "error: stopped by a signal".to_string();
    match run_child(Command::new(&cfg.exe).args(run_args(cfg, idx, &trace))) {
        Err(e) => o.status = format!("error: running {}: {e}", cfg.exe.display()),
        Ok(None) => {
            o.status = stopped;
            o.trace = None;
        }
        Ok(Some((status, _, stderr))) if !status.success() => {
            o.status = format!("error: {}", last_line(&stderr));
            o.trace = None;
        }
        Ok(Some(_)) => {
            match analyze(&trace, counts) {
                Ok(s) => o.stats = Some(s),
                Err(e) => o.status = format!("error: {e}"),
            }
            if cfg.verify {
                let r = run_child(
                    Command::new(replay_exe(cfg))
                        .arg(&trace)
                        .args(["--verify", "-q", "-j", "1"]),
                );
                // kb-replay's exit status: 0 PASS, 1 FAIL (an output
                // does not match), anything else an error. The status
                // column says so too: a point that fails verification or
                // cannot be verified is a failed point.
                let error = |why: String| {
                    (
                        format!("ERROR: {why}"),
                        Some(format!("error: kb-replay --verify: {why}")),
                    )
                };
                let (verdict, status) = match r {
                    Ok(Some((st, _, _))) if st.code() == Some(0) => ("PASS".to_string(), None),
                    // The FAIL lines are kb-replay's verdict, on stdout
                    // (a failed --check-intermediates says why on stderr).
                    Ok(Some((st, out, err))) if st.code() == Some(1) => (
                        "FAIL".into(),
                        Some(format!(
                            "fail: kb-replay --verify: {}",
                            match last_line(&out) {
                                l if l.is_empty() => last_line(&err),
                                l => l,
                            }
                        )),
                    ),
                    Ok(Some((_, _, err))) => error(last_line(&err)),
                    Ok(None) => error("stopped by a signal".into()),
                    Err(e) => error(format!("running {}: {e}", replay_exe(cfg).display())),
                };
                o.verdict = Some(verdict);
                if let Some(st) = status
                    && o.status == "ok"
                {
                    o.status = st;
                }
            }
        }
    }
    if !keep {
        let _ = std::fs::remove_file(&trace);
    }
    o.wall_s = wall.elapsed().as_secs_f64();
    o
}

/// Column names a swept key may not take: the table's own.
const RESERVED: &[&str] = &[
    "point",
    "status",
    "verdict",
    "trace",
    "wall_s",
    "workload",
    "topology",
    "seed",
    "inputs",
    "kb_version",
    "sweep_id",
    "sweep_points",
];

/// Machines by the value indices of the topology axes (`--set`).
type Counts = BTreeMap<Vec<usize>, MachineInfo>;

/// The value indices of point `idx`'s topology axes: points that share
/// them share a machine.
fn topology_key(cfg: &SweepConfig, idx: &[usize]) -> Vec<usize> {
    cfg.axes
        .iter()
        .zip(idx)
        .filter(|(a, _)| a.topology)
        .map(|(_, &i)| i)
        .collect()
}

/// The sweep's point count, refused past [`MAX_POINTS`] without `--force`
/// (before anything is allocated for them).
fn count(cfg: &SweepConfig) -> Result<usize, String> {
    let n = point_count(&cfg.axes);
    match n {
        Some(n) if n <= MAX_POINTS || cfg.force => Ok(n),
        _ => Err(format!(
            "sweep: {} points ({}) is more than {MAX_POINTS}; --force runs it anyway",
            n.map_or("too many".to_string(), |n| n.to_string()),
            cfg.axes
                .iter()
                .map(|a| format!("{} x{}", a.key, a.values.len()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Check every axis and point before anything runs: keys are unique,
/// every topology override applies (each combination of `--set` values
/// once; with `--point`, that point's). Returns the sweep's provenance and
/// the unit counts of each combination.
fn check(cfg: &SweepConfig, points: usize) -> Result<(Provenance, Counts), String> {
    for (i, a) in cfg.axes.iter().enumerate() {
        if cfg.axes[..i].iter().any(|b| b.key == a.key) {
            return Err(format!("sweep: {} is swept twice", a.key));
        }
        if RESERVED.contains(&a.key.as_str()) {
            return Err(format!(
                "sweep: {} names a column of the results table",
                a.key
            ));
        }
    }
    let base = Topology::load(&cfg.topology).map_err(|e| e.to_string())?;
    let text = spec(cfg, &base);
    let prov = Provenance {
        id: sweep_id(&text),
        spec: text,
        points,
    };
    let topo: Vec<Axis> = cfg.axes.iter().filter(|a| a.topology).cloned().collect();
    let keys: Vec<Vec<usize>> = match cfg.point {
        Some(p) => vec![topology_key(cfg, &point_values(&cfg.axes, p))],
        None => points_of(&topo),
    };
    let mut counts = Counts::new();
    for key in keys {
        let sets: Vec<(String, String)> = topo
            .iter()
            .zip(&key)
            .map(|(a, &i)| (a.key.clone(), a.values[i].clone()))
            .collect();
        let t = overrides::apply(&base, &sets).map_err(|e| {
            let which: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("--set {}: {e}", which.join(" --set "))
        })?;
        counts.insert(
            key,
            MachineInfo {
                units: unit_counts(&Machine::build(&t)),
                peaks: Peaks::of(&t),
            },
        );
    }
    Ok((prov, counts))
}

/// Every point of `axes` (their count is at most the sweep's).
fn points_of(axes: &[Axis]) -> Vec<Vec<usize>> {
    points(axes)
}

/// How a sweep ended: its points, and how many failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Points run.
    pub points: usize,
    /// Points with an error (the run, reading its trace, or kb-replay).
    pub errors: usize,
    /// Points whose outputs failed `kb-replay --verify`.
    pub fails: usize,
    /// The signal that stopped the sweep (no table was written).
    pub signal: Option<i32>,
}

impl Summary {
    /// The exit status: 128 + the signal that stopped the sweep; else, as
    /// kb-replay's, 2 when a point had an error, 1 when a point failed
    /// verification, 0 when every point ran (and verified).
    pub fn exit_code(&self) -> u8 {
        if let Some(sig) = self.signal {
            (128 + sig).clamp(0, 255) as u8
        } else if self.errors > 0 {
            2
        } else if self.fails > 0 {
            1
        } else {
            0
        }
    }
}

/// Axes whose values change nothing: wherever points differ only in that
/// axis's value (and ran), their traces are identical ([`PointStats::
/// digest`]: the same ops at the same times on the same data). A field
/// the workload never reads (`pe_gemm.tflops.f32` on an f16 GEMM) is the
/// usual cause. One message per such axis.
fn unchanged(cfg: &SweepConfig, outcomes: &[Outcome]) -> Vec<String> {
    let mut out = Vec::new();
    for (a, axis) in cfg.axes.iter().enumerate() {
        if axis.values.len() < 2 {
            continue;
        }
        // The digests of each group of points equal but for axis `a`.
        let mut groups: BTreeMap<Vec<usize>, Vec<u64>> = BTreeMap::new();
        for o in outcomes {
            let Some(st) = &o.stats else { continue };
            let mut key = point_values(&cfg.axes, o.point);
            key.remove(a);
            groups.entry(key).or_default().push(st.digest);
        }
        let compared = groups.values().filter(|d| d.len() > 1).count();
        if compared > 0 && groups.values().all(|d| d.iter().all(|&x| x == d[0])) {
            let flag = if axis.topology { "--set" } else { "-p" };
            out.push(format!(
                "{flag} {}={}: changed nothing: points that differ only in it have identical \
                 traces (the same ops at the same times on the same data; does {} read it?)",
                axis.key,
                axis.values.join(","),
                cfg.bench
            ));
        }
    }
    out
}

/// Threads per available core `-j` may ask for (as kb-replay's
/// `--threads`): more only adds switching.
pub const JOBS_PER_CORE: usize = 4;

/// The most points a sweep runs at once: [`JOBS_PER_CORE`] per core.
pub fn max_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) * JOBS_PER_CORE
}

/// Run the sweep; write the table (also when points fail: their rows say
/// why). Returns how the points ended. SIGINT, SIGTERM and SIGHUP stop
/// the points running (each child asked to stop, removing its partial
/// trace; finished temporary traces removed) and write no table.
pub fn run(cfg: &SweepConfig) -> Result<Summary, String> {
    let n = count(cfg)?;
    if let Some(p) = cfg.point
        && p >= n
    {
        return Err(format!(
            "--point {p}: the sweep has {n} points (0..{})",
            n.saturating_sub(1)
        ));
    }
    if cfg.jobs == 0 {
        return Err("-j: at least 1 point at a time".into());
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
    let (prov, machines) = check(cfg, n)?;
    if let Some(d) = &cfg.traces {
        std::fs::create_dir_all(d).map_err(|e| format!("--traces {}: {e}", d.display()))?;
    }
    let todo: Vec<usize> = match cfg.point {
        Some(p) => vec![p],
        None => (0..n).collect(),
    };
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let workers = cfg.jobs.min(max_jobs()).clamp(1, todo.len().max(1));
    // Signals are noted while points run: the workers stop their children
    // and remove their traces, then the sweep exits 128 + the signal.
    #[cfg(unix)]
    kb_format::signals::defer();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    if interrupted().is_some() {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&p) = todo.get(i) else { break };
                    let idx = point_values(&cfg.axes, p);
                    let m = &machines[&topology_key(cfg, &idx)];
                    let o = run_point(cfg, p, &idx, m);
                    if interrupted().is_some() {
                        break;
                    }
                    let desc: Vec<String> = cfg
                        .axes
                        .iter()
                        .zip(&idx)
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
    // From here a signal removes the tables' temporary files and exits.
    #[cfg(unix)]
    kb_format::signals::undefer();
    let mut outcomes = done.into_inner().expect("workers finished");
    if let Some(sig) = interrupted() {
        #[cfg(unix)]
        let name = kb_format::signals::name(sig);
        #[cfg(not(unix))]
        let name = "a signal";
        say!(
            "kb-sim sweep: stopped by {name} after {} of {} points: the points running were \
             stopped and their temporary traces removed; no table written",
            outcomes.len(),
            todo.len()
        );
        return Ok(Summary {
            points: outcomes.len(),
            signal: Some(sig),
            ..Summary::default()
        });
    }
    outcomes.sort_by_key(|o| o.point);
    let summary = Summary {
        points: outcomes.len(),
        errors: outcomes
            .iter()
            .filter(|o| o.status.starts_with("error"))
            .count(),
        fails: outcomes
            .iter()
            .filter(|o| o.status.starts_with("fail"))
            .count(),
        signal: None,
    };
    for w in unchanged(cfg, &outcomes) {
        say!("kb-sim sweep: warning: {w}");
    }
    let t = table(cfg, &prov, &outcomes);
    // Both files or neither: each is written in full to a temporary file
    // before either replaces an older table.
    Table::save_set(&[(&t, &csv), (&t, &pq)]).map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    if summary.errors > 0 {
        failed.push(format!("{} with errors", summary.errors));
    }
    if summary.fails > 0 {
        failed.push(format!("{} failing verification", summary.fails));
    }
    say!(
        "kb-sim sweep: {} point{}{} (sweep {}): wrote {} and {}",
        outcomes.len(),
        if outcomes.len() == 1 { "" } else { "s" },
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({}: see status)", failed.join(", "))
        },
        prov.id,
        csv.display(),
        pq.display()
    );
    Ok(summary)
}

fn crate_ns(ps: u64) -> String {
    format!("{}.{:03}", ps / 1000, ps % 1000)
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

    fn config(axes: Vec<Axis>) -> SweepConfig {
        SweepConfig {
            topology: "small".into(),
            bench: "gemm".into(),
            seed: 0,
            axes,
            inputs: vec![],
            races: "warn".into(),
            jobs: 1,
            traces: None,
            verify: false,
            replay: None,
            out: PathBuf::from("sweep"),
            point: None,
            exe: PathBuf::from("kb-sim"),
            force: false,
        }
    }

    #[test]
    fn points_are_indexed_without_listing_them_and_big_sweeps_need_force() {
        let axes = vec![
            Axis::parse("a=1,2,3", true).unwrap(),
            Axis::parse("b=x,y", false).unwrap(),
        ];
        let all = points(&axes);
        for (p, idx) in all.iter().enumerate() {
            assert_eq!(&point_values(&axes, p), idx);
        }
        assert_eq!(point_count(&axes), Some(6));
        // 1,000 x 1,000 values: refused before any point is listed.
        let many: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        let big = vec![
            Axis::parse(&format!("m={}", many.join(",")), false).unwrap(),
            Axis::parse(&format!("n={}", many.join(",")), false).unwrap(),
        ];
        let mut cfg = config(big);
        let e = count(&cfg).unwrap_err();
        assert!(
            e.contains("1000000 points") && e.contains("--force") && e.contains("m x1000"),
            "{e}"
        );
        cfg.force = true;
        assert_eq!(count(&cfg), Ok(1_000_000));
        assert_eq!(point_values(&cfg.axes, 999_999), [999, 999]);
        assert_eq!(point_values(&cfg.axes, 1001), [1, 1]);
        // A product that overflows usize is refused even with --force.
        let huge: Vec<Axis> = (0..10)
            .map(|i| Axis::parse(&format!("k{i}={}", many.join(",")), false).unwrap())
            .collect();
        let mut cfg = config(huge);
        cfg.force = true;
        assert!(count(&cfg).unwrap_err().contains("too many points"));
    }

    #[test]
    fn exit_codes_follow_kb_replay() {
        let s = |errors, fails, signal| Summary {
            points: 4,
            errors,
            fails,
            signal,
        };
        assert_eq!(s(0, 0, None).exit_code(), 0);
        assert_eq!(s(0, 1, None).exit_code(), 1);
        assert_eq!(s(1, 1, None).exit_code(), 2);
        assert_eq!(s(0, 0, Some(15)).exit_code(), 143);
    }

    #[test]
    fn the_sweep_id_is_its_spec_and_nothing_else() {
        let base = Topology::load("small").unwrap();
        let axes = || vec![Axis::parse("m=64,128", false).unwrap()];
        let a = config(axes());
        let id = |c: &SweepConfig| sweep_id(&spec(c, &base));
        // Where outputs go, -j, --traces: not the spec.
        let mut b = config(axes());
        b.out = PathBuf::from("elsewhere/x");
        b.jobs = 7;
        b.traces = Some(PathBuf::from("t"));
        assert_eq!(id(&a), id(&b));
        assert_eq!(id(&a).len(), 16);
        // The seed, the values' order, the workload, the topology: another sweep.
        let mut c = config(axes());
        c.seed = 1;
        assert_ne!(id(&a), id(&c));
        let c = config(vec![Axis::parse("m=128,64", false).unwrap()]);
        assert_ne!(id(&a), id(&c));
        let mut c = config(axes());
        c.bench = "copy".into();
        assert_ne!(id(&a), id(&c));
        let other = overrides::apply(&base, &[("hbm.channel_bw_gbs".into(), "9".into())]).unwrap();
        assert_ne!(id(&a), sweep_id(&spec(&a, &other)));
    }

    /// An axis whose points' traces are identical wherever only it differs
    /// is named; one that changes a trace anywhere is not.
    #[test]
    fn axes_that_change_nothing_are_named() {
        let cfg = config(vec![
            Axis::parse("pe_gemm.tflops.f32=1,2", true).unwrap(),
            Axis::parse("m=64,128", false).unwrap(),
        ]);
        // Points: (f32, m) = (1,64) (1,128) (2,64) (2,128); digests depend
        // on m only.
        let outcome = |point, digest| Outcome {
            point,
            status: "ok".into(),
            stats: Some(PointStats {
                digest,
                ..PointStats::default()
            }),
            verdict: None,
            trace: None,
            wall_s: 0.0,
            peaks: Peaks::default(),
        };
        let o = [
            outcome(0, 10),
            outcome(1, 20),
            outcome(2, 10),
            outcome(3, 20),
        ];
        let w = unchanged(&cfg, &o);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("--set pe_gemm.tflops.f32=1,2: changed nothing"),
            "{w:?}"
        );
        // One pair differs: the axis changed something.
        let o = [
            outcome(0, 10),
            outcome(1, 20),
            outcome(2, 10),
            outcome(3, 21),
        ];
        assert!(unchanged(&cfg, &o).is_empty());
        // Failed points are not compared.
        let mut o = [
            outcome(0, 10),
            outcome(1, 20),
            outcome(2, 10),
            outcome(3, 20),
        ];
        o[2].stats = None;
        o[3].stats = None;
        assert!(unchanged(&cfg, &o).is_empty());
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
            grid: [1, 1, 1],
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
            peaks: Peaks::default(),
        };
        let cfg = SweepConfig {
            topology: "small".into(),
            bench: "gemm".into(),
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
            force: false,
        };
        let prov = Provenance {
            id: "0123456789abcdef".into(),
            spec: "spec".into(),
            points: 1,
        };
        let t = table(&cfg, &prov, &[o]);
        let col = |name: &str| t.column(name).and_then(|c| c.values.f64(0));
        assert_eq!(col("pe_gemm_busy_ns"), Some(0.7));
        assert_eq!(col("pe_gemm_util"), Some(700.0 / 16000.0));
        assert_eq!(col("pe_gemm_held_ns"), Some(2.0));
        assert_eq!(col("pe_gemm_held_util"), Some(2000.0 / 16000.0));
        assert_eq!(col("pe_dma_util"), Some(900.0 / 16000.0));
        assert_eq!(col("pe_dma_held_util"), Some(0.125));
    }
}
