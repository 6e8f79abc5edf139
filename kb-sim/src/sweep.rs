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
    /// xxh3 of every record's id, times, component, name, kind, active
    /// interval and data fingerprint: points with equal digests ran the
    /// same ops at the same times on the same data.
    pub digest: u64,
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

/// A machine's peak rates, for a roofline beside the achieved ones.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Peaks {
    /// Every PE's GEMM unit at its peak, per dtype (f32, f16, bf16, i8),
    /// GFLOP/s.
    pub gemm_gflops: [f64; 4],
    /// Every PE's vector unit at its peak, per dtype, GFLOP/s.
    pub math_gflops: [f64; 4],
    /// Every HBM pseudo channel at its bandwidth, GB/s.
    pub hbm_gbs: f64,
}

/// The dtypes of [`Peaks`]' arrays, in order.
pub const PEAK_DTYPES: [&str; 4] = ["f32", "f16", "bf16", "i8"];

impl Peaks {
    /// The peaks of topology `t`.
    pub fn of(t: &Topology) -> Peaks {
        let pes = f64::from(t.total_pes());
        let per = |d: &crate::topology::PerDtype, scale: f64| {
            [d.f32.0, d.f16.0, d.bf16.0, d.i8.0].map(|x| x * scale * pes)
        };
        let c = t.counts;
        Peaks {
            gemm_gflops: per(&t.pe_gemm.tflops, 1e3),
            math_gflops: per(&t.pe_math.gflops, 1.0),
            hbm_gbs: f64::from(c.sips * c.cubes_per_sip)
                * f64::from(t.hbm.pseudo_channels)
                * t.hbm.channel_bw_gbs.0,
        }
    }
}

/// What a point's machine gives its row: unit counts and peaks.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineInfo {
    /// Units of each kind ([`unit_counts`]).
    pub units: BTreeMap<String, u64>,
    /// Peak rates ([`Peaks::of`]).
    pub peaks: Peaks,
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
    let mut digest = kb_format::Fingerprinter::new();
    t.for_each_record(|r, _| {
        s.records += 1;
        let (a0, a1) = r.active.unwrap_or((r.t_start, r.t_end));
        for x in [
            r.op_id,
            r.t_start,
            r.t_end,
            u64::from(r.component),
            u64::from(r.op_name),
            u64::from(r.kind.code()),
            a0,
            a1,
            r.fingerprint.unwrap_or(0),
        ] {
            digest.update(&x.to_le_bytes());
        }
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
    s.digest = digest.digest();
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

/// The most bytes of a child's stderr kept (its last ones).
const STDERR_TAIL: usize = 64 << 10;

/// Run `cmd` (stdin and stdout closed, stderr collected: its last
/// [`STDERR_TAIL`] bytes); `Ok(None)` when a signal stopped the sweep
/// first: the child is asked to stop (SIGTERM: kb's tools remove their
/// partial output) and waited for.
fn run_child(cmd: &mut Command) -> std::io::Result<Option<(std::process::ExitStatus, Vec<u8>)>> {
    use std::io::Read as _;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let (mut tail, mut buf) = (Vec::new(), vec![0u8; 8192]);
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 2 * STDERR_TAIL {
                tail.drain(..tail.len() - STDERR_TAIL);
            }
        }
        tail
    });
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some((status, reader.join().unwrap_or_default())));
        }
        if interrupted().is_some() {
            #[cfg(unix)]
            kb_format::signals::terminate(child.id());
            #[cfg(not(unix))]
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
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
        Ok(Some((status, stderr))) if !status.success() => {
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
                    Ok(Some((st, _))) if st.code() == Some(0) => ("PASS".to_string(), None),
                    Ok(Some((st, err))) if st.code() == Some(1) => (
                        "FAIL".into(),
                        Some(format!("fail: kb-replay --verify: {}", last_line(&err))),
                    ),
                    Ok(Some((_, err))) => error(last_line(&err)),
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
fn table(cfg: &SweepConfig, prov: &Provenance, outcomes: &[Outcome]) -> Table {
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

/// How `--emit-jobs` lays a sweep out on Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jobs {
    /// Points each array task runs, one after another (`--points-per-task`).
    pub points_per_task: usize,
    /// The most tasks in one job array (`--max-array-size`; Slurm's
    /// `MaxArraySize` is 1001 by default, so indices 0..999): more tasks
    /// are submitted as several arrays.
    pub max_array_size: usize,
    /// `#SBATCH --time` (`--time`).
    pub time: Option<String>,
    /// `#SBATCH --mem` (`--mem`).
    pub mem: Option<String>,
    /// More `#SBATCH` lines, as given (`--sbatch=--partition=gpu`).
    pub sbatch: Vec<String>,
}

impl Default for Jobs {
    fn default() -> Jobs {
        Jobs {
            points_per_task: 1,
            max_array_size: 1000,
            time: None,
            mem: None,
            sbatch: Vec::new(),
        }
    }
}

/// A value that goes on an `#SBATCH` line: one line, no shell or Slurm
/// surprises (no newline or NUL).
fn sbatch_value(flag: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.contains(['\n', '\r', '\0']) {
        return Err(format!("{flag}: {v:?} is not one #SBATCH value"));
    }
    Ok(())
}

/// `--emit-jobs DIR`: write `DIR/jobs.txt` (the sweep's command, once:
/// each point runs it with `--point I -o DIR/results/point-NNNN`),
/// `DIR/sweep.sbatch` (a Slurm job array whose task T runs points
/// `T * points_per_task` onwards, offset by `KB_TASK_OFFSET`),
/// `DIR/submit.sh` (one `sbatch` per array of at most `max_array_size`
/// tasks) and the `results/` and `logs/` directories; run nothing. Every
/// path in them is absolute and quoted. Returns the number of points and
/// of arrays.
pub fn emit_jobs(cfg: &SweepConfig, dir: &Path, jobs: &Jobs) -> Result<(usize, usize), String> {
    if jobs.points_per_task == 0 {
        return Err("--points-per-task: at least 1".into());
    }
    if jobs.max_array_size == 0 {
        return Err("--max-array-size: at least 1".into());
    }
    for (flag, v) in [("--time", &jobs.time), ("--mem", &jobs.mem)] {
        if let Some(v) = v {
            sbatch_value(flag, v)?;
        }
    }
    for v in &jobs.sbatch {
        sbatch_value("--sbatch", v)?;
    }
    let n = count(cfg)?;
    let (prov, _) = check(cfg, n)?;
    let io = |what: &Path, e: std::io::Error| format!("--emit-jobs: {}: {e}", what.display());
    std::fs::create_dir_all(dir.join("results")).map_err(|e| io(dir, e))?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| io(dir, e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| io(dir, e))?;
    let exe = absolute(&cfg.exe);
    // The command every point runs, less `--point I -o OUT`: the grid
    // once, whatever the number of points.
    let mut a: Vec<String> = vec![
        "sweep".into(),
        "-t".into(),
        topology_name(&cfg.topology),
        "--seed".into(),
        cfg.seed.to_string(),
        "-b".into(),
        cfg.bench.clone(),
    ];
    for ax in &cfg.axes {
        let flag = if ax.topology { "--set" } else { "-p" };
        a.extend([flag.into(), format!("{}={}", ax.key, ax.values.join(","))]);
    }
    for (k, v) in &cfg.inputs {
        a.extend([
            "--input".into(),
            format!("{k}={}", absolute(Path::new(v)).display()),
        ]);
    }
    a.extend(["--races".into(), cfg.races.clone(), "-j".into(), "1".into()]);
    if cfg.force {
        a.push("--force".into());
    }
    if cfg.verify {
        a.push("--verify".into());
        if let Some(r) = &cfg.replay {
            a.extend(["--replay".into(), absolute(r).display().to_string()]);
        }
    }
    if let Some(t) = &cfg.traces {
        std::fs::create_dir_all(t).map_err(|e| io(t, e))?;
        a.extend(["--traces".into(), absolute(t).display().to_string()]);
    }
    let words: Vec<String> = a.iter().map(|w| shell_quote(w)).collect();
    let ppt = jobs.points_per_task;
    let tasks = n.div_ceil(ppt);
    let arrays = tasks.div_ceil(jobs.max_array_size);
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let jobs_text = format!(
        "# kb-sim sweep --emit-jobs: {n} points (sweep id {id}), {ppt} per task, {tasks} tasks.
# Point I runs this command with `--point I -o {results}/point-NNNN`
# (NNNN: I, at least 4 digits); KB_SIM overrides the kb-sim executable.
\"${{KB_SIM:-{exe}}}\" {cmd}
",
        id = prov.id,
        results = dir.join("results").display(),
        exe = exe
            .display()
            .to_string()
            .replace(['"', '$', '`', '\\'], "_"),
        cmd = words.join(" "),
    );
    let mut directives = vec![
        "--job-name=kb-sweep".to_string(),
        format!("--array=0-{}", tasks.min(jobs.max_array_size) - 1),
        "--ntasks=1".into(),
        "--cpus-per-task=1".into(),
        format!("--output={}/logs/task-%A_%a.out", dir.display()),
    ];
    if let Some(t) = &jobs.time {
        directives.push(format!("--time={t}"));
    }
    if let Some(m) = &jobs.mem {
        directives.push(format!("--mem={m}"));
    }
    directives.extend(jobs.sbatch.iter().cloned());
    let sbatch = dir.join("sweep.sbatch");
    let submit = dir.join("submit.sh");
    let script = format!(
        "#!/usr/bin/env bash
# A kb-sim design-space sweep of {n} points as Slurm job arrays, written by
# `kb-sim sweep --emit-jobs` (sweep id {id}: every table it writes says so).
# Submit every array with
#     {submit_q}
# ({arrays} array{arrays_s} of at most {max} tasks; with one array, `sbatch {sbatch_q}`
# does the same). Task T (SLURM_ARRAY_TASK_ID + KB_TASK_OFFSET) runs points
# T * {ppt} onwards, {ppt} of them, each `kb-sim sweep --point I` (the command in
# jobs.txt) writing a one-row table to results/point-NNNN.{{csv,parquet}}; the task
# exits with the worst point's status (1: a point failed --verify, 2: an error).
# When every task has finished, join the rows:
#     kb-inspect merge {results_q}/point-*.parquet -o sweep.parquet
# KB_SIM overrides the kb-sim executable (the default is the one that wrote
# this file); the nodes need it (and kb-replay, with --verify) at that path.
{directives}
set -uo pipefail
points={n}
per_task={ppt}
jobs={jobs_q}
results={results_q}
task=$(( ${{KB_TASK_OFFSET:-0}} + SLURM_ARRAY_TASK_ID ))
first=$(( task * per_task ))
if (( first >= points )); then
    echo \"task $task: past the sweep's $points points\" >&2
    exit 2
fi
last=$(( first + per_task ))
(( last > points )) && last=$points
cmd=$(grep -v '^#' \"$jobs\" | head -n 1)
if [ -z \"$cmd\" ]; then
    echo \"no command in $jobs\" >&2
    exit 2
fi
rc=0
for (( p = first; p < last; p++ )); do
    out=$(printf '%s/point-%04d' \"$results\" \"$p\")
    eval \"$cmd --point $p -o \\\"\\$out\\\"\"
    s=$?
    (( s > rc )) && rc=$s
done
exit $rc
",
        id = prov.id,
        arrays_s = if arrays == 1 { "" } else { "s" },
        max = jobs.max_array_size,
        directives = directives
            .iter()
            .map(|d| format!("#SBATCH {d}"))
            .collect::<Vec<_>>()
            .join("\n"),
        submit_q = q(&submit),
        sbatch_q = q(&sbatch),
        results_q = q(&dir.join("results")),
        jobs_q = q(&dir.join("jobs.txt")),
    );
    let mut submit_text = format!(
        "#!/usr/bin/env bash
# Submit the kb-sim sweep's {tasks} tasks ({n} points, sweep id {id}) as {arrays} Slurm
# job array{arrays_s} of at most {max} tasks each (Slurm's MaxArraySize).
set -euo pipefail
",
        id = prov.id,
        arrays_s = if arrays == 1 { "" } else { "s" },
        max = jobs.max_array_size,
    );
    for i in 0..arrays {
        let offset = i * jobs.max_array_size;
        let size = (tasks - offset).min(jobs.max_array_size);
        submit_text += &format!(
            "sbatch --array=0-{} --export=ALL,KB_TASK_OFFSET={offset} {}\n",
            size - 1,
            q(&sbatch)
        );
    }
    let write = |p: &Path, text: &str| -> Result<(), String> {
        let mut f = kb_format::AtomicFile::create(p)
            .map_err(|e| io(p, e))?
            .remove_on_signal();
        f.write_all(text.as_bytes()).map_err(|e| io(p, e))?;
        f.commit().map_err(|e| io(p, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if text.starts_with("#!") {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
            }
        }
        Ok(())
    };
    write(&dir.join("jobs.txt"), &jobs_text)?;
    write(&sbatch, &script)?;
    write(&submit, &submit_text)?;
    Ok((n, arrays))
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
