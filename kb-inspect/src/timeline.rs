//! `timeline`: the trace as a timeline Perfetto UI opens, in two formats:
//! Chrome trace-event JSON (`{"traceEvents": [...]}`, also chrome://tracing)
//! and Perfetto's native protobuf ([`crate::perfetto`]: streamed, interned,
//! several times smaller). Both hold the same things:
//!
//! - **Ops**: one slice per op, named by op name, category = op kind, on
//!   its component's track. Args: op id, start/end in ns, component,
//!   bytes and route (memory ops: `SRC -> DST`, as `stats --by route`),
//!   FLOPs, `shape` (gemm `MxK @ KxN -> MxN`, math its inputs and output,
//!   memory `rows x cols` or `rows x bytes`), `dtype`, launch and kernel
//!   (files; a stream's launches come at its end); the JSON also carries
//!   the fingerprint. The protobuf carries op id, launch and kernel as
//!   args of their own and the rest (route, bytes, FLOPs, shape, dtype:
//!   the JSON's keys and values) as one `details` arg, a JSON object:
//!   interned, ops share it, so an op costs a few bytes for all of it;
//!   start/end ns are the slice's own times there. Times are rounded to the nearest nanosecond (half
//!   up): Perfetto keeps integer ns, and sub-ns values would make
//!   back-to-back ops overlap after its rounding.
//! - **Processes**: one per PE, `sipS.cubeC.peP` (its units' tracks:
//!   `pe_dma`, `pe_cpu`...), one per `sipN.cubeM` for the cube's other
//!   components and counters, one per SIP for SIP-level components, and
//!   `host` for everything else (and the launches). **Tracks**: one per
//!   component; ops that overlap on one component (pipelined DMA) go to
//!   extra lanes `COMPONENT#1`, `#2`..., so slices on a track never
//!   overlap.
//! - **Launches and kernels**: a slice per launch on the host's `launches`
//!   track (args: grid, PEs, FLOPs executed and useful), and per kernel
//!   run a `kernel` slice on its PE's `kernel` track, above the units
//!   (JSON sort order): from the PE's `kernel_start` to its `kernel_end`
//!   sync record (or a `kernel` span record); a PE of a launch without
//!   them spans its ops of the launch (a stream: the launch's window).
//!   Sync records (waits, signals, the kernel_start/kernel_end instants,
//!   launch, map) are slices of their own on their component's track,
//!   zero-length for instants (flows end on them).
//! - **Dependencies**: a flow arrow from each op to each op that depends
//!   on it on another component (dependencies along one track are its
//!   order already), named by the edge's kind in the JSON (`data`,
//!   `program`...; the protobuf's flows have no names); dependencies on
//!   ops more than [`DEP_WINDOW`] op ids back, or on ops written later,
//!   get none.
//! - **Critical paths** (`--critical-path`, [`Options::critical_path`]):
//!   the ops on each launch's critical path ([`crate::critical`], from a
//!   first pass) get args `critical: true` and `critical_launch`, and a
//!   flow arrow (category `critical`) from the path's previous op, when
//!   that one starts no later (arrows go forward in time: a wait that
//!   began before its cause gets none).
//! - **Counters**, sampled in [`BINS`] time bins (the width doubles as the
//!   run grows, so memory is fixed): per cube `hbm GB/s` (memory ops
//!   reading or writing its HBM), `link -> sipS.cubeC GB/s` (copies to
//!   another cube or SIP), `util pe_dma|pe_gemm|pe_math` (busy fraction
//!   of the cube's units of that kind that have ops: union of each
//!   unit's active intervals, the time it computes or transfers, as
//!   `kb_format::usage` defines busy); per PE `peN noc GB/s` (bytes its DMA moved)
//!   and `peN tcm high-water bytes` (the highest TCM byte its ops wrote,
//!   since the PE's current launch began: the kernel allocator fills TCM
//!   from the bottom, so this tracks the footprint).
//! - **HBM pseudo channels** ([`Channels`], `--channels`), from the
//!   trace's channels chunk: `slices` (the default) one track per channel
//!   that served anything (`hbm_ctrl.chN` in its cube's process), a `busy`
//!   slice (category `hbm_channel`, args exact `start_ps`/`end_ps`) per
//!   interval the channel was serving; `counters` a counter track per
//!   channel, `util hbm_ctrl.chN`, the fraction of each time bin it was
//!   serving; `none` leaves them out. The time window
//!   selects intervals as it selects ops; a component glob selects
//!   channels by the name `sipS.cubeC.hbm_ctrl.chN`; a name or kind filter
//!   (which select ops) leaves them out. The trace has no records per NoC
//!   link, so there are no link tracks (the link counters above come from
//!   the copies' routes).
//! - `--from/--to` (and the other `ops` filters) select ops as `ops` does;
//!   launches, kernels and counters follow the selected ops.
//!
//! Times: integer nanoseconds (rounded, half up) in both formats, exact
//! picoseconds only in args (`start_ns`/`end_ns` with three decimals,
//! `*_ps`): Perfetto's trace processor keeps integer ns whatever the
//! input (a protobuf clock's unit is a whole number of ns; JSON `ts` is
//! rounded to ns on import), so sub-ns times would only make back-to-back
//! ops overlap after its rounding.
//!
//! One pass; memory is bounded by components, lanes, launches x PEs and
//! kernel runs and the counter bins, not by the number of records
//! (`--critical-path` adds a first pass that keeps every record, as
//! `critical-path` does).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::path::Path;

use kb_format::{Launch, Meta, OpKind, Params, Ps, Record, Space, Strings};
use serde_json::json;

use crate::columns::{Launches, Place, Places};
use crate::ops::{Filter, Matcher};
use crate::perfetto::{PerfettoWriter, UNIT_SIZE_BYTES, UNIT_UNSPECIFIED, Val};
use crate::progress::Progress;
use crate::render::{self, Endpoint, natural_cmp};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Error, Result};

/// Counter bins (the bin width doubles as the run grows).
pub const BINS: usize = 512;
/// Dependencies on ops more than this many op ids back draw no arrow.
pub const DEP_WINDOW: usize = 1 << 16;

/// Output format of `timeline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Chrome trace-event JSON.
    #[default]
    Json,
    /// Perfetto's protobuf trace format.
    Perfetto,
}

impl Format {
    /// From the file name: `.json` JSON; `.pftrace`, `.perfetto-trace`,
    /// `.pb` or `.proto` Perfetto; anything else JSON.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("pftrace" | "perfetto-trace" | "pb" | "proto") => Format::Perfetto,
            _ => Format::Json,
        }
    }
}

/// What `timeline --channels` draws of the HBM pseudo channels (the
/// trace's channels chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Channels {
    /// Nothing (the chunk is not read).
    None,
    /// A counter track per channel, `util hbm_ctrl.chN` in its cube's
    /// process: the fraction of each time bin it was serving.
    Counters,
    /// A track per channel, `hbm_ctrl.chN`, with a `busy` slice per
    /// interval it served (the default: exact, but on a long run nearly
    /// all of the timeline).
    #[default]
    Slices,
}

/// What a timeline holds beyond the ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub channels: Channels,
    /// Mark each launch's critical path (`critical-path`'s walk): its ops
    /// get the args `critical: true` and `critical_launch`, and flow arrows
    /// chain them in path order. A file only: the paths come from a first
    /// pass that keeps every record (as `critical-path` does).
    pub critical_path: bool,
}

/// Split a component name into (process, track name): a PE's units go to
/// the PE's process (`sipS.cubeC.peP`, tracks `pe_dma`, `pe_cpu`...), a
/// cube's other components to the cube's, SIP-level ones to the SIP's,
/// the rest to `host`.
pub fn split_component(name: &str) -> (String, String) {
    fn numbered(s: &str, prefix: &str) -> bool {
        s.strip_prefix(prefix)
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    }
    let parts: Vec<&str> = name.splitn(4, '.').collect();
    match parts[..] {
        [sip, cube, pe, rest]
            if numbered(sip, "sip") && numbered(cube, "cube") && numbered(pe, "pe") =>
        {
            (format!("{sip}.{cube}.{pe}"), rest.to_string())
        }
        [sip, cube, ..] if numbered(sip, "sip") && numbered(cube, "cube") && parts.len() > 2 => {
            let n = sip.len() + cube.len() + 2;
            (format!("{sip}.{cube}"), name[n..].to_string())
        }
        [sip, ..] if numbered(sip, "sip") && name.len() > sip.len() => {
            (sip.to_string(), name[sip.len() + 1..].to_string())
        }
        _ => ("host".to_string(), name.to_string()),
    }
}

/// What a timeline holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Info {
    /// Op slices.
    pub events: u64,
    pub processes: usize,
    pub tracks: usize,
    pub launches: u64,
    pub kernels: u64,
    /// Dependency arrows.
    pub flows: u64,
    /// Ops marked on a critical path (`--critical-path`), and the arrows
    /// chaining them.
    pub critical_ops: u64,
    pub critical_flows: u64,
    pub counter_tracks: usize,
    pub counter_values: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// A track: a lane of a component, a kernel track, the launches track or
/// a counter.
#[derive(Debug, Clone)]
struct Track {
    pid: u32,
    tid: u32,
    name: String,
    /// Lane index within its base name (sort key).
    lane: usize,
    counter: bool,
}

#[derive(Debug)]
struct Comp {
    pid: u32,
    track: String,
    json: String,
    place: Place,
    /// (end of the last op in ns, tid) per lane.
    lanes: Vec<(u64, u32)>,
    /// Its ops' active intervals not yet final, for utilisation
    /// (`kb_format::usage`: busy is the union of the active intervals).
    busy: kb_format::usage::Intervals,
    unit_series: Option<usize>,
}

/// A counter series in bins of the shared width.
#[derive(Debug)]
pub(crate) struct Series {
    tid: u32,
    /// Sum: values add up per bin (GB/s from bytes, busy ps); Max: the
    /// largest value in the bin.
    max: bool,
    /// Divisor of the bin's sum: bin width (ps) x units; bytes per ps
    /// is 1000 GB/s.
    units: f64,
    scale: f64,
    pub(crate) bins: Vec<f64>,
    pub(crate) used: Vec<bool>,
}

/// Shared time bins: `BINS` bins of `width` ps, doubling.
#[derive(Debug)]
pub(crate) struct Bins {
    pub(crate) width: Ps,
    pub(crate) series: Vec<Series>,
}

impl Bins {
    /// No series yet, 1 ns bins.
    pub(crate) fn new() -> Bins {
        Bins {
            width: 1000,
            series: Vec::new(),
        }
    }

    /// A new summing series; returns its index.
    pub(crate) fn push(&mut self) -> usize {
        self.series.push(Series {
            tid: 0,
            max: false,
            units: 1.0,
            scale: 1.0,
            bins: vec![0.0; BINS],
            used: vec![false; BINS],
        });
        self.series.len() - 1
    }

    pub(crate) fn fit(&mut self, t: Ps) {
        while t >= self.width.saturating_mul(BINS as u64) && self.width < Ps::MAX / 4 {
            self.width *= 2;
            for s in &mut self.series {
                for i in 0..BINS / 2 {
                    let (a, b) = (s.bins[2 * i], s.bins[2 * i + 1]);
                    s.bins[i] = if s.max { a.max(b) } else { a + b };
                    s.used[i] = s.used[2 * i] || s.used[2 * i + 1];
                }
                for i in BINS / 2..BINS {
                    s.bins[i] = 0.0;
                    s.used[i] = false;
                }
            }
        }
    }

    /// Spread `amount` over `[t0, t1)` (a point at t0 when empty).
    pub(crate) fn add(&mut self, k: usize, t0: Ps, t1: Ps, amount: f64) {
        self.fit(t1.max(t0));
        let w = self.width;
        let s = &mut self.series[k];
        if t1 <= t0 {
            let i = ((t0 / w) as usize).min(BINS - 1);
            s.bins[i] += amount;
            s.used[i] = true;
            return;
        }
        let per_ps = amount / (t1 - t0) as f64;
        let (first, last) = ((t0 / w) as usize, (((t1 - 1) / w) as usize).min(BINS - 1));
        for i in first..=last {
            let b0 = (i as u64 * w).max(t0);
            let b1 = ((i as u64 + 1) * w).min(t1);
            s.bins[i] += per_ps * (b1 - b0) as f64;
            s.used[i] = true;
        }
    }

    fn max(&mut self, k: usize, t: Ps, v: f64) {
        self.fit(t);
        let i = ((t / self.width) as usize).min(BINS - 1);
        let s = &mut self.series[k];
        s.bins[i] = s.bins[i].max(v);
        s.used[i] = true;
    }
}

/// (launch, PE) and its kernel's [start, end] in ns.
type KernelSpan = ((u32, [u32; 3]), (u64, u64));

/// A kernel's run on a PE from its sync records: (PE, start ps, end ps).
type KernelRun = ([u32; 3], Ps, Ps);

/// One recent op, for dependency arrows.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    op_id: u64,
    valid: bool,
    comp: u32,
    tid: u32,
    t0: u64,
    /// Protobuf: its held-back slice's number (flows out go on it).
    slice: u64,
}

enum Out<W: Write> {
    Json { w: io::BufWriter<W>, first: bool },
    Pb(Box<PerfettoWriter<io::BufWriter<W>>>),
}

struct Writer<W: Write> {
    m: Matcher,
    opts: Options,
    progress: Progress,
    out: Out<W>,
    comps: Vec<Option<Comp>>,
    places: Places,
    procs: Vec<String>,
    proc_ids: HashMap<String, u32>,
    tracks: Vec<Track>,
    /// tid of named tracks (kernel tracks, launches, counters) by (pid, name).
    named: HashMap<(u32, String), u32>,
    names: Vec<Option<String>>,
    meta: Meta,
    launches: Option<Launches>,
    /// Per (launch, PE): first op start and last op end (ns), for PEs
    /// whose kernels have no sync records.
    kernels: HashMap<(u32, [u32; 3]), (u64, u64)>,
    /// Per PE: the starts (ps) of `kernel_start` records not yet ended.
    kernel_open: HashMap<[u32; 3], VecDeque<Ps>>,
    /// Kernel runs from `kernel_start`/`kernel_end` pairs (or `kernel` spans).
    kernel_runs: Vec<KernelRun>,
    /// Critical paths: per op id on one, (launch, its index on the path).
    critical: HashMap<u64, Vec<(u32, u32)>>,
    /// Per launch, the path's ops written so far (by index on the path).
    critical_written: Vec<Vec<Option<Recent>>>,
    /// The last flow id given.
    flow_id: u64,
    /// TCM high-water per PE, and the launch it belongs to.
    tcm: HashMap<[u32; 3], (u64, Option<u32>, usize)>,
    bins: Bins,
    /// Counter series by key.
    series_ids: HashMap<String, usize>,
    /// Units seen per (cube process, unit kind).
    unit_counts: HashMap<(u32, String), u64>,
    recent: Vec<Recent>,
    /// Flows into the op being written: (id, name, category).
    flow_in: Vec<(u64, &'static str, &'static str)>,
    args_buf: String,
    info: Info,
}

/// What a kernel sync record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KernelMark {
    Start,
    End,
    /// A `kernel` span (the whole run in one record).
    Span,
}

/// `"ts":..,"dur":..` of `[t0, t1)` in whole ns: microseconds as exact
/// decimals.
struct TsDur(u64, u64);

impl std::fmt::Display for TsDur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (t0, d) = (self.0, self.1 - self.0);
        write!(
            f,
            "\"ts\":{}.{:03},\"dur\":{}.{:03}",
            t0 / 1000,
            t0 % 1000,
            d / 1000,
            d % 1000
        )
    }
}

/// Picoseconds to the nearest nanosecond, half up.
fn round_ns(ps: Ps) -> u64 {
    ps / 1000 + u64::from(ps % 1000 >= 500)
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

fn wio(e: io::Error) -> Error {
    Error::io("writing the timeline", e)
}

/// (shape, dtype) of an op, for args.
pub fn shape_and_dtype(r: &Record) -> (Option<String>, Option<String>) {
    match &r.params {
        Params::Gemm(g) => (
            Some(format!(
                "{}x{} @ {}x{} -> {}x{}{}",
                g.m,
                g.k,
                g.k,
                g.n,
                g.m,
                g.n,
                if g.acc.is_some() { " (+acc)" } else { "" }
            )),
            Some(format!(
                "{} -> {} (acc {})",
                g.dtype_in, g.dtype_out, g.dtype_acc
            )),
        ),
        Params::Math(m) => {
            let ins: Vec<String> = m
                .inputs
                .iter()
                .map(|i| match i {
                    kb_format::MathInput::Tile { rows, cols, .. } => format!("{rows}x{cols}"),
                    kb_format::MathInput::Scalar(v) => format!("{v}"),
                })
                .collect();
            (
                Some(format!(
                    "{}({}) -> {}x{}",
                    m.op.name(),
                    ins.join(", "),
                    m.rows,
                    m.cols
                )),
                Some(m.dtype.name().to_string()),
            )
        }
        Params::Memory(p) => match p.dtype {
            Some(d) => (
                Some(format!("{}x{}", p.rows, p.row_bytes / d.size() as u64)),
                Some(d.name().to_string()),
            ),
            None => (Some(format!("{}x{}B", p.rows, p.row_bytes)), None),
        },
        Params::Atomic(a) => (
            Some(format!("{} {}x{}", a.op.name(), a.rows, a.cols)),
            Some(a.dtype.name().to_string()),
        ),
        _ => (None, None),
    }
}

impl<W: Write> Writer<W> {
    fn new(m: Matcher, out: Out<W>) -> Self {
        Writer {
            m,
            opts: Options::default(),
            progress: Progress::hidden(),
            out,
            comps: Vec::new(),
            places: Places::default(),
            procs: Vec::new(),
            proc_ids: HashMap::new(),
            tracks: Vec::new(),
            named: HashMap::new(),
            names: Vec::new(),
            meta: Meta::default(),
            launches: None,
            kernels: HashMap::new(),
            kernel_open: HashMap::new(),
            kernel_runs: Vec::new(),
            critical: HashMap::new(),
            critical_written: Vec::new(),
            flow_id: 0,
            tcm: HashMap::new(),
            bins: Bins {
                width: 1000,
                series: Vec::new(),
            },
            series_ids: HashMap::new(),
            unit_counts: HashMap::new(),
            recent: vec![Recent::default(); DEP_WINDOW],
            flow_in: Vec::new(),
            args_buf: String::new(),
            info: Info::default(),
        }
    }

    /// The pid of process `name`, made (and, for protobuf, described) on
    /// first use.
    fn pid(&mut self, name: &str) -> io::Result<u32> {
        if let Some(&p) = self.proc_ids.get(name) {
            return Ok(p);
        }
        let pid = self.procs.len() as u32 + 1;
        self.procs.push(name.to_string());
        self.proc_ids.insert(name.to_string(), pid);
        if let Out::Pb(pb) = &mut self.out {
            pb.process(proc_uuid(pid), pid, name)?;
        }
        Ok(pid)
    }

    /// A new track in `pid`.
    fn new_track(
        &mut self,
        pid: u32,
        name: String,
        lane: usize,
        counter: Option<u64>,
    ) -> io::Result<u32> {
        let tid = self.tracks.len() as u32 + 1;
        if let Out::Pb(pb) = &mut self.out {
            pb.track(track_uuid(tid), proc_uuid(pid), &name, counter)?;
        }
        self.tracks.push(Track {
            pid,
            tid,
            name,
            lane,
            counter: counter.is_some(),
        });
        Ok(tid)
    }

    /// The track named `name` in `pid` (kernels, launches, counters).
    fn named_track(&mut self, pid: u32, name: &str, counter: Option<u64>) -> io::Result<u32> {
        if let Some(&t) = self.named.get(&(pid, name.to_string())) {
            return Ok(t);
        }
        let t = self.new_track(pid, name.to_string(), 0, counter)?;
        self.named.insert((pid, name.to_string()), t);
        Ok(t)
    }

    fn comp(&mut self, id: u32, s: &Strings) -> io::Result<()> {
        let i = id as usize;
        if i >= self.comps.len() {
            self.comps.resize_with(i + 1, || None);
        }
        if self.comps[i].is_none() {
            let full = s.name(id);
            let (proc, track) = split_component(&full);
            let pid = self.pid(&proc)?;
            let place = self.places.get(id, s).clone();
            let unit_series = match (place.sip, place.cube, place.unit.as_str()) {
                (Some(sip), Some(cube), u @ ("pe_dma" | "pe_gemm" | "pe_math")) => {
                    // Per cube, over its units of the kind.
                    let cpid = self.pid(&format!("sip{sip}.cube{cube}"))?;
                    *self.unit_counts.entry((cpid, u.to_string())).or_default() += 1;
                    Some(self.series(cpid, &format!("util {u}"), false, UNIT_UNSPECIFIED)?)
                }
                _ => None,
            };
            self.comps[i] = Some(Comp {
                pid,
                track,
                json: json_str(&full),
                place,
                lanes: Vec::new(),
                busy: Default::default(),
                unit_series,
            });
        }
        Ok(())
    }

    /// The tid of a free lane of component `id` for an op [t0, t1) (ns).
    fn lane(&mut self, id: u32, t0: u64, t1: u64) -> io::Result<(u32, u32)> {
        let c = self.comps[id as usize].as_mut().expect("made by comp()");
        let pid = c.pid;
        if let Some(l) = c.lanes.iter_mut().find(|l| l.0 <= t0) {
            l.0 = t1;
            return Ok((pid, l.1));
        }
        let lane = c.lanes.len();
        let name = if lane == 0 {
            c.track.clone()
        } else {
            format!("{}#{lane}", c.track)
        };
        let tid = self.new_track(pid, name, lane, None)?;
        let c = self.comps[id as usize].as_mut().expect("made by comp()");
        c.lanes.push((t1, tid));
        Ok((pid, tid))
    }

    /// The counter series `name` of process `pid`.
    fn series(&mut self, pid: u32, name: &str, max: bool, unit: u64) -> io::Result<usize> {
        let key = format!("{pid}/{name}");
        if let Some(&k) = self.series_ids.get(&key) {
            return Ok(k);
        }
        let tid = self.named_track(pid, name, Some(unit))?;
        let k = self.bins.series.len();
        self.bins.series.push(Series {
            tid,
            max,
            units: 1.0,
            // bytes per ps -> GB/s (x 1000); busy ps per ps -> fraction.
            scale: if name.ends_with("GB/s") { 1000.0 } else { 1.0 },
            bins: vec![0.0; BINS],
            used: vec![false; BINS],
        });
        self.series_ids.insert(key, k);
        Ok(k)
    }

    /// Cache the JSON string of op name `id`.
    fn op_name(&mut self, id: u32, s: &Strings) {
        let i = id as usize;
        if i >= self.names.len() {
            self.names.resize_with(i + 1, || None);
        }
        self.names[i].get_or_insert_with(|| s.name(id).into_owned());
    }

    fn counters(&mut self, r: &Record) -> io::Result<()> {
        let c = self.comps[r.component as usize].as_ref().expect("made");
        let (pid, place, unit_series) = (c.pid, c.place.clone(), c.unit_series);
        // Utilisation: the union of the unit's active intervals, binned
        // as each merged interval becomes final.
        if let Some(k) = unit_series {
            let c = self.comps[r.component as usize].as_mut().expect("made");
            let bins = &mut self.bins;
            c.busy
                .settle(r.t_start, |s, e| bins.add(k, s, e, (e - s) as f64));
            let (a0, a1) = kb_format::usage::active(r);
            c.busy.insert(a0, a1);
        }
        if r.kind != OpKind::Memory {
            return Ok(());
        }
        let bytes = render::bytes_moved(r) as f64;
        let route = render::route(r);
        if let Some(rt) = route {
            // HBM traffic of the cube whose HBM is read or written.
            let mut hbm: Vec<(u8, u8)> = Vec::new();
            for e in [rt.src, rt.dst] {
                if let Endpoint::Hbm { sip, cube } = e
                    && !hbm.contains(&(sip, cube))
                {
                    hbm.push((sip, cube));
                }
            }
            for (sip, cube) in hbm {
                let p = self.pid(&format!("sip{sip}.cube{cube}"))?;
                let k = self.series(p, "hbm GB/s", false, UNIT_UNSPECIFIED)?;
                self.bins.add(k, r.t_start, r.t_end, bytes);
            }
            // Links between cubes or SIPs.
            let cube_of = |e: Endpoint| match e {
                Endpoint::Hbm { sip, cube }
                | Endpoint::Sram { sip, cube }
                | Endpoint::Tcm { sip, cube, .. } => Some((sip, cube)),
                _ => None,
            };
            if let (Some(a), Some(b)) = (cube_of(rt.src), cube_of(rt.dst))
                && a != b
            {
                let p = self.pid(&format!("sip{}.cube{}", a.0, a.1))?;
                let k = self.series(
                    p,
                    &format!("link -> sip{}.cube{} GB/s", b.0, b.1),
                    false,
                    UNIT_UNSPECIFIED,
                )?;
                self.bins.add(k, r.t_start, r.t_end, bytes);
            }
        }
        if let (Some(sip), Some(cube), Some(pe)) = (place.sip, place.cube, place.pe) {
            // `pid` is the PE's process.
            if place.unit == "pe_dma" {
                let k = self.series(pid, "noc GB/s", false, UNIT_UNSPECIFIED)?;
                self.bins.add(k, r.t_start, r.t_end, bytes);
            }
            // TCM high-water: the highest byte written into this PE's TCM.
            let top = r
                .write
                .iter()
                .flat_map(|e| e.ranges.iter())
                .filter_map(|x| {
                    let p = kb_format::pa::Pa::decode(x.pa)?;
                    (p.space == Space::Tcm && (p.sip, p.cube, p.pe) == (sip, cube, pe)).then(|| {
                        p.offset
                            .saturating_add(x.stride.saturating_mul(u64::from(x.rows.max(1)) - 1))
                            .saturating_add(x.len)
                    })
                })
                .max();
            if let Some(top) = top {
                let launch = self
                    .launches
                    .as_ref()
                    .and_then(|l| l.find([sip, cube, pe], r.t_start));
                let k = self.series(pid, "tcm high-water bytes", true, UNIT_SIZE_BYTES)?;
                let e = self.tcm.entry([sip, cube, pe]).or_insert((0, launch, k));
                if e.1 != launch {
                    *e = (0, launch, k);
                }
                e.0 = e.0.max(top);
                let hw = e.0 as f64;
                self.bins.max(k, r.t_end, hw);
            }
        }
        Ok(())
    }

    /// A flow arrow from the op written at `from` into the op being
    /// written (its id goes to `flow_in`).
    fn flow_from(&mut self, from: Recent, name: &'static str, cat: &'static str) -> io::Result<()> {
        self.flow_id += 1;
        let id = self.flow_id;
        self.flow_in.push((id, name, cat));
        match &mut self.out {
            Out::Json { w, .. } => {
                let src = &self.tracks[from.tid as usize - 1];
                write!(
                    w,
                    ",\n{{\"ph\":\"s\",\"id\":{id},\"name\":\"{name}\",\"cat\":\"{cat}\",\"pid\":{},\"tid\":{},\"ts\":{}.{:03}}}",
                    src.pid,
                    from.tid,
                    from.t0 / 1000,
                    from.t0 % 1000
                )
            }
            Out::Pb(pb) => {
                if pb.flow_out(from.slice, id) {
                    Ok(())
                } else {
                    pb.flow_source(track_uuid(from.tid), from.t0, id, name)
                }
            }
        }
    }

    /// Note a kernel's sync records on its PE (`kernel_start`,
    /// `kernel_end`, or a `kernel` span), whatever the filters select:
    /// they give the PE's kernel slices.
    fn kernel_record(&mut self, r: &Record, s: &Strings) {
        if r.kind != OpKind::Sync {
            return;
        }
        self.op_name(r.op_name, s);
        let mark = match self.names[r.op_name as usize].as_deref() {
            Some("kernel_start") => KernelMark::Start,
            Some("kernel_end") => KernelMark::End,
            Some("kernel") => KernelMark::Span,
            _ => return,
        };
        let p = self.places.get(r.component, s);
        let (Some(sip), Some(cube), Some(pe)) = (p.sip, p.cube, p.pe) else {
            return;
        };
        let pe = [sip, cube, pe];
        match mark {
            KernelMark::Start => self.kernel_open.entry(pe).or_default().push_back(r.t_start),
            KernelMark::End => {
                if let Some(t0) = self.kernel_open.get_mut(&pe).and_then(VecDeque::pop_front) {
                    self.kernel_runs.push((pe, t0, r.t_end.max(t0)));
                }
            }
            KernelMark::Span => self.kernel_runs.push((pe, r.t_start, r.t_end)),
        }
    }

    fn event(&mut self, r: &Record, s: &Strings) -> io::Result<()> {
        let (t0, t1) = (round_ns(r.t_start), round_ns(r.t_end));
        self.comp(r.component, s)?;
        let (pid, tid) = self.lane(r.component, t0, t1)?;
        self.info.events += 1;
        self.op_name(r.op_name, s);
        let kind = match r.kind {
            OpKind::Unknown(_) => "unknown",
            k => k.name(),
        };
        let place = self.comps[r.component as usize]
            .as_ref()
            .expect("made")
            .place
            .clone();
        let launch = match (&self.launches, place.sip, place.cube, place.pe) {
            (Some(l), Some(sip), Some(cube), Some(pe)) => {
                let found = l.find([sip, cube, pe], r.t_start);
                if let Some(i) = found {
                    let e = self.kernels.entry((i, [sip, cube, pe])).or_insert((t0, t1));
                    e.0 = e.0.min(t0);
                    e.1 = e.1.max(t1);
                }
                found
            }
            _ => None,
        };
        // Dependency arrows from ops on other components, named by the
        // edge's kind (JSON; the protobuf's flows carry no name).
        self.flow_in.clear();
        for d in &r.deps {
            let slot = self.recent[d.op as usize % DEP_WINDOW];
            if slot.valid && slot.op_id == d.op && slot.comp != r.component {
                self.info.flows += 1;
                self.flow_from(slot, d.kind.name(), "dep")?;
            }
        }
        let me = Recent {
            op_id: r.op_id,
            valid: true,
            comp: r.component,
            tid,
            t0,
            slice: 0,
        };
        self.recent[r.op_id as usize % DEP_WINDOW] = me;
        // A critical path's op: an arrow from the path's previous op, when
        // that one is written already (an op that starts before its cause
        // on the path, a wait, gets none: an arrow cannot go back in time).
        let on_path = self.critical.get(&r.op_id).cloned();
        let critical_launch = on_path.as_ref().and_then(|v| v.first()).map(|x| x.0);
        if let Some(v) = &on_path {
            self.info.critical_ops += 1;
            for &(l, i) in v {
                let prev = i
                    .checked_sub(1)
                    .and_then(|j| self.critical_written[l as usize][j as usize]);
                if let Some(prev) = prev {
                    self.info.critical_flows += 1;
                    self.flow_from(prev, "critical_path", "critical")?;
                }
                self.critical_written[l as usize][i as usize] = Some(me);
            }
        }
        let (shape, dtype) = shape_and_dtype(r);
        let bytes = render::bytes_moved(r);
        let flops = render::flops(r);
        let route = render::route(r).map(|rt| rt.to_string());
        let kernel = launch.and_then(|i| {
            self.launches
                .as_ref()
                .and_then(|l| l.kernel(i))
                .map(str::to_string)
        });
        let name = self.names[r.op_name as usize].as_deref().unwrap_or("?");
        match &mut self.out {
            Out::Json { w, first } => {
                let comp = &self.comps[r.component as usize]
                    .as_ref()
                    .expect("made")
                    .json;
                let sep = if *first { "\n" } else { ",\n" };
                *first = false;
                let a = &mut self.args_buf;
                a.clear();
                use std::fmt::Write as _;
                let _ = write!(
                    a,
                    "\"op_id\":{},\"start_ns\":{},\"end_ns\":{},\"component\":{comp}",
                    r.op_id,
                    render::ns(r.t_start),
                    render::ns(r.t_end)
                );
                if let Some(rt) = &route {
                    // Endpoint names need no JSON escaping.
                    let _ = write!(a, ",\"route\":\"{rt}\",\"bytes\":{bytes}");
                } else if bytes > 0 {
                    let _ = write!(a, ",\"bytes\":{bytes}");
                }
                if flops > 0 {
                    let _ = write!(a, ",\"flops\":{flops}");
                }
                if let Some(x) = &shape {
                    let _ = write!(a, ",\"shape\":{}", json_str(x));
                }
                if let Some(x) = &dtype {
                    let _ = write!(a, ",\"dtype\":{}", json_str(x));
                }
                if let Some(fp) = r.fingerprint {
                    let _ = write!(a, ",\"fingerprint\":\"{fp:#018x}\"");
                }
                if let (Some(i), Some(k)) = (launch, &kernel) {
                    let _ = write!(a, ",\"launch\":{i},\"kernel\":{}", json_str(k));
                }
                if let Some(l) = critical_launch {
                    let _ = write!(a, ",\"critical\":true,\"critical_launch\":{l}");
                }
                write!(
                    w,
                    "{sep}{{\"ph\":\"X\",\"name\":{},\"cat\":\"{kind}\",{},\"pid\":{pid},\"tid\":{tid},\"args\":{{{a}}}}}",
                    json_str(name),
                    TsDur(t0, t1),
                )?;
                for &(id, name, cat) in &self.flow_in {
                    write!(
                        w,
                        ",\n{{\"ph\":\"f\",\"bp\":\"e\",\"id\":{id},\"name\":\"{name}\",\"cat\":\"{cat}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{}.{:03}}}",
                        t0 / 1000,
                        t0 % 1000
                    )?;
                }
            }
            Out::Pb(pb) => {
                // The op's description (the JSON's args between the
                // component and the fingerprint, the same keys and values)
                // as one JSON object, interned: ops repeat a few of them,
                // so an op pays a few bytes for all of it.
                let d = &mut self.args_buf;
                d.clear();
                use std::fmt::Write as _;
                if let Some(rt) = &route {
                    let _ = write!(d, ",\"route\":\"{rt}\",\"bytes\":{bytes}");
                } else if bytes > 0 {
                    let _ = write!(d, ",\"bytes\":{bytes}");
                }
                if flops > 0 {
                    let _ = write!(d, ",\"flops\":{flops}");
                }
                if let Some(x) = &shape {
                    let _ = write!(d, ",\"shape\":{}", json_str(x));
                }
                if let Some(x) = &dtype {
                    let _ = write!(d, ",\"dtype\":{}", json_str(x));
                }
                if !d.is_empty() {
                    d.replace_range(..1, "{");
                    d.push('}');
                }
                let mut args: Vec<(&str, Val<'_>)> = vec![("op_id", Val::U(r.op_id))];
                if !d.is_empty() {
                    args.push(("details", Val::S(d)));
                }
                if let (Some(i), Some(k)) = (launch, &kernel) {
                    args.push(("launch", Val::U(u64::from(i))));
                    args.push(("kernel", Val::S(k)));
                }
                if let Some(l) = critical_launch {
                    args.push(("critical", Val::B(true)));
                    args.push(("critical_launch", Val::U(u64::from(l))));
                }
                let ids: Vec<u64> = self.flow_in.iter().map(|f| f.0).collect();
                let n = pb.op_slice(track_uuid(tid), t0, t1, name, kind, &args, &ids)?;
                self.recent[r.op_id as usize % DEP_WINDOW].slice = n;
                for &(l, i) in on_path.iter().flatten() {
                    if let Some(x) = &mut self.critical_written[l as usize][i as usize] {
                        x.slice = n;
                    }
                }
            }
        }
        self.counters(r)
    }

    /// Whether the timeline has PE `pe`'s process (some op of it is shown).
    fn shows_pe(&self, pe: [u32; 3]) -> bool {
        self.proc_ids
            .contains_key(&format!("sip{}.cube{}.pe{}", pe[0], pe[1], pe[2]))
    }

    /// Launch slices, kernel slices and counters: written at the end.
    fn finish_extras(&mut self, launches: &[Launch]) -> io::Result<()> {
        // Launches on the host's `launches` track (lanes when they overlap).
        if !launches.is_empty() && self.info.events > 0 {
            let host = self.pid("host")?;
            let mut lanes: Vec<(u64, u32)> = Vec::new();
            for (i, l) in launches.iter().enumerate() {
                let (t0, t1) = (round_ns(l.t_start), round_ns(l.t_end.max(l.t_start)));
                if !self.m.in_window(&Record {
                    t_start: l.t_start,
                    t_end: l.t_end,
                    ..Default::default()
                }) {
                    continue;
                }
                let tid = match lanes.iter_mut().find(|x| x.0 <= t0) {
                    Some(x) => {
                        x.0 = t1;
                        x.1
                    }
                    None => {
                        let name = if lanes.is_empty() {
                            "launches".to_string()
                        } else {
                            format!("launches#{}", lanes.len())
                        };
                        let lane = lanes.len();
                        let tid = self.new_track(host, name, lane, None)?;
                        lanes.push((t1, tid));
                        tid
                    }
                };
                let useful = if l.flops > 0 {
                    l.useful_flops as f64 / l.flops as f64
                } else {
                    1.0
                };
                let grid = l.grid_label();
                self.info.launches += 1;
                self.slice(
                    host,
                    tid,
                    t0,
                    t1,
                    &l.kernel,
                    "launch",
                    &[
                        ("launch", Val::U(i as u64)),
                        ("grid", Val::S(&grid)),
                        ("pes", Val::U(l.pes.len() as u64)),
                        ("flops", Val::U(l.flops)),
                        ("useful_flops", Val::U(l.useful_flops)),
                        ("useful_fraction", Val::F(useful)),
                    ],
                )?;
            }
            // Kernels: per launch and PE, on the PE's `kernel` track above
            // its units: from its kernel_start to its kernel_end record
            // (each run, should a PE run several programs of a launch);
            // a PE without them spans its ops of the launch (a file) or
            // the launch's window (a stream, whose launches came last).
            let by_pe = Launches::new(launches);
            let mut spans: Vec<KernelSpan> = Vec::new();
            let mut from_records: std::collections::HashSet<(u32, [u32; 3])> = Default::default();
            // Kernels the window cut before their end run to their launch's.
            let open = std::mem::take(&mut self.kernel_open);
            let runs = std::mem::take(&mut self.kernel_runs);
            let mut all: Vec<KernelRun> = runs;
            for (pe, q) in open {
                for t0 in q {
                    if let Some(i) = by_pe.find(pe, t0) {
                        all.push((pe, t0, launches[i as usize].t_end.max(t0)));
                    }
                }
            }
            all.sort_unstable();
            for (pe, t0, t1) in all {
                let Some(i) = by_pe.find(pe, t0) else {
                    continue;
                };
                from_records.insert((i, pe));
                let win = Record {
                    t_start: t0,
                    t_end: t1,
                    ..Default::default()
                };
                if self.m.in_window(&win) && self.shows_pe(pe) {
                    spans.push(((i, pe), (round_ns(t0), round_ns(t1))));
                }
            }
            if self.launches.is_some() {
                spans.extend(
                    self.kernels
                        .iter()
                        .filter(|(k, _)| !from_records.contains(k))
                        .map(|(k, v)| (*k, *v)),
                );
            } else {
                for (i, l) in launches.iter().enumerate() {
                    let win = Record {
                        t_start: l.t_start,
                        t_end: l.t_end,
                        ..Default::default()
                    };
                    if !self.m.in_window(&win) {
                        continue;
                    }
                    for pe in &l.pes {
                        if !from_records.contains(&(i as u32, *pe)) && self.shows_pe(*pe) {
                            spans.push((
                                (i as u32, *pe),
                                (round_ns(l.t_start), round_ns(l.t_end.max(l.t_start))),
                            ));
                        }
                    }
                }
            }
            spans.sort_by_key(|&((i, pe), (t0, t1))| (pe, t0, t1, i));
            // Per PE, the end of each lane's last kernel.
            let mut lanes: HashMap<[u32; 3], Vec<u64>> = HashMap::new();
            for ((i, pe), (t0, t1)) in spans {
                let pid = self.pid(&format!("sip{}.cube{}.pe{}", pe[0], pe[1], pe[2]))?;
                // Overlapping kernels on one PE (a stream's windows) take lanes.
                let ends = lanes.entry(pe).or_default();
                let lane = match ends.iter().position(|&e| e <= t0) {
                    Some(j) => j,
                    None => {
                        ends.push(0);
                        ends.len() - 1
                    }
                };
                ends[lane] = t1;
                let name = if lane == 0 {
                    "kernel".to_string()
                } else {
                    format!("kernel#{lane}")
                };
                let tid = self.named_track(pid, &name, None)?;
                let l = &launches[i as usize];
                self.info.kernels += 1;
                self.slice(
                    pid,
                    tid,
                    t0,
                    t1,
                    &l.kernel,
                    "kernel",
                    &[
                        ("launch", Val::U(u64::from(i))),
                        ("pe", Val::U(u64::from(pe[2]))),
                    ],
                )?;
            }
        }
        // Counters: one value per bin that changed.
        let width = self.bins.width;
        let units: HashMap<usize, f64> = self
            .series_ids
            .iter()
            .filter_map(|(key, &k)| {
                let (pid, name) = key.split_once('/')?;
                let u = name.strip_prefix("util ")?;
                let pid: u32 = pid.parse().ok()?;
                Some((k, *self.unit_counts.get(&(pid, u.to_string()))? as f64))
            })
            .collect();
        for (k, s) in self.bins.series.iter_mut().enumerate() {
            s.units = units.get(&k).copied().unwrap_or(1.0);
        }
        let series = std::mem::take(&mut self.bins.series);
        self.info.counter_tracks = series.len();
        for s in &series {
            let track = &self.tracks[s.tid as usize - 1];
            let (pid, name) = (track.pid, track.name.clone());
            let last_used = s.used.iter().rposition(|&u| u);
            let Some(last_used) = last_used else { continue };
            let mut prev: Option<f64> = None;
            for i in 0..=(last_used + 1).min(BINS - 1) {
                let v = if s.max {
                    if !s.used[i] {
                        continue;
                    }
                    s.bins[i]
                } else {
                    s.bins[i] * s.scale / (width as f64 * s.units)
                };
                if prev == Some(v) {
                    continue;
                }
                prev = Some(v);
                let ts = (i as u64).saturating_mul(width) / 1000;
                self.info.counter_values += 1;
                match &mut self.out {
                    Out::Json { w, first } => {
                        let sep = if *first { "\n" } else { ",\n" };
                        *first = false;
                        write!(
                            w,
                            "{sep}{{\"ph\":\"C\",\"name\":{},\"pid\":{pid},\"tid\":0,\"ts\":{}.{:03},\"args\":{{\"value\":{}}}}}",
                            json_str(&name),
                            ts / 1000,
                            ts % 1000,
                            if v.is_finite() { v } else { 0.0 }
                        )?;
                    }
                    Out::Pb(pb) => pb.counter(track_uuid(s.tid), ts, v)?,
                }
            }
        }
        self.bins.series = series;
        Ok(())
    }

    /// HBM channel `c`'s component name and the busy intervals the filter
    /// selects.
    fn selected_busy(&self, c: &kb_format::ChannelUsage) -> (String, Vec<(u64, u64)>) {
        let name = format!("sip{}.cube{}.hbm_ctrl.ch{}", c.sip, c.cube, c.channel);
        let busy = c
            .busy
            .iter()
            .copied()
            .filter(|&(start, end)| self.m.selects_interval(&name, start, end))
            .collect();
        (name, busy)
    }

    /// One track per HBM pseudo channel (`hbm_ctrl.chN` in its cube's
    /// process), a `busy` slice per interval the filter selects.
    fn channel_tracks(&mut self, channels: &[kb_format::ChannelUsage]) -> io::Result<()> {
        for c in channels {
            let (name, busy) = self.selected_busy(c);
            if busy.is_empty() {
                continue;
            }
            let (proc, lane) = split_component(&name);
            let pid = self.pid(&proc)?;
            let tid = self.named_track(pid, &lane, None)?;
            for (start, end) in busy {
                self.slice(
                    pid,
                    tid,
                    round_ns(start),
                    round_ns(end),
                    "busy",
                    "hbm_channel",
                    &[
                        ("start_ps", Val::U(start)),
                        ("end_ps", Val::U(end)),
                        ("channel", Val::S(&name)),
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// A utilisation counter per HBM pseudo channel (`util hbm_ctrl.chN`
    /// in its cube's process) from the intervals the filter selects: the
    /// fraction of each bin the channel was serving.
    fn channel_counters(&mut self, channels: &[kb_format::ChannelUsage]) -> io::Result<()> {
        for c in channels {
            let (_, busy) = self.selected_busy(c);
            if busy.is_empty() {
                continue;
            }
            let pid = self.pid(&format!("sip{}.cube{}", c.sip, c.cube))?;
            let k = self.series(
                pid,
                &format!("util hbm_ctrl.ch{}", c.channel),
                false,
                UNIT_UNSPECIFIED,
            )?;
            for (start, end) in busy {
                self.bins
                    .add(k, start, end, end.saturating_sub(start) as f64);
            }
        }
        Ok(())
    }

    /// A slice with args on a track (launches, kernels, HBM channels).
    #[allow(clippy::too_many_arguments)]
    fn slice(
        &mut self,
        pid: u32,
        tid: u32,
        t0: u64,
        t1: u64,
        name: &str,
        cat: &str,
        args: &[(&str, Val<'_>)],
    ) -> io::Result<()> {
        match &mut self.out {
            Out::Json { w, first } => {
                let sep = if *first { "\n" } else { ",\n" };
                *first = false;
                let mut a = serde_json::Map::new();
                for (k, v) in args {
                    a.insert(
                        k.to_string(),
                        match v {
                            Val::U(x) => json!(x),
                            Val::F(x) => json!(x),
                            Val::S(x) => json!(x),
                            Val::B(x) => json!(x),
                        },
                    );
                }
                write!(
                    w,
                    "{sep}{{\"ph\":\"X\",\"name\":{},\"cat\":\"{cat}\",{},\"pid\":{pid},\"tid\":{tid},\"args\":{}}}",
                    json_str(name),
                    TsDur(t0, t1),
                    serde_json::Value::Object(a)
                )
            }
            Out::Pb(pb) => pb.slice(track_uuid(tid), t0, t1, name, cat, args, &[]),
        }
    }

    fn metadata(&mut self) -> io::Result<()> {
        let Out::Json { w, first } = &mut self.out else {
            if let Out::Pb(pb) = &mut self.out {
                self.info.bytes = pb.bytes;
                pb.flush()?;
            }
            return Ok(());
        };
        let mut order: Vec<usize> = (0..self.procs.len()).collect();
        order.sort_by(|&a, &b| natural_cmp(&self.procs[a], &self.procs[b]));
        let mut out = Vec::new();
        for (rank, &i) in order.iter().enumerate() {
            let pid = i + 1;
            out.push(
                json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": self.procs[i]}}),
            );
            out.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "args": {"sort_index": rank}}),
            );
        }
        let mut tracks: Vec<&Track> = self.tracks.iter().filter(|t| !t.counter).collect();
        // In a process, the launches and kernel tracks above the units'.
        let top = |n: &str| !matches!(n, "launches" | "kernel");
        tracks.sort_by(|a, b| {
            a.pid.cmp(&b.pid).then_with(|| {
                let (ta, tb) = (a.name.split('#').next(), b.name.split('#').next());
                let (ta, tb) = (ta.unwrap_or(""), tb.unwrap_or(""));
                top(ta)
                    .cmp(&top(tb))
                    .then_with(|| natural_cmp(ta, tb))
                    .then(a.lane.cmp(&b.lane))
            })
        });
        for (rank, t) in tracks.into_iter().enumerate() {
            out.push(
                json!({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid,
                "args": {"name": t.name}}),
            );
            out.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": t.pid, "tid": t.tid,
                "args": {"sort_index": rank}}),
            );
        }
        for e in out.iter() {
            let sep = if *first { "\n" } else { ",\n" };
            *first = false;
            write!(w, "{sep}{e}")?;
        }
        let m = &self.meta;
        let other = json!({
            "tool": m.tool,
            "tool_version": m.tool_version,
            "benchmark": m.benchmark,
            "topology": m.topology.name,
            "address_model": m.topology.address_model,
            "seed": m.seed,
            "params": m.params.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "time_unit": "ts and dur in microseconds, rounded to the nanosecond; args.start_ns/end_ns exact",
        });
        write!(
            w,
            "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{other}\n}}\n"
        )?;
        w.flush()
    }
}

fn proc_uuid(pid: u32) -> u64 {
    (1 << 40) | u64::from(pid)
}

/// A track's uuid is its tid: small, so a varint of a byte or two in
/// every event (process uuids are above 2^40 and never collide).
fn track_uuid(tid: u32) -> u64 {
    u64::from(tid)
}

impl<W: Write> Visitor for Writer<W> {
    fn launches(&mut self, launches: &[Launch]) -> Result<()> {
        self.launches = Some(Launches::new(launches));
        Ok(())
    }

    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        self.meta = meta.clone();
        if let Out::Json { w, .. } = &mut self.out {
            w.write_all(b"{\"traceEvents\":[").map_err(wio)?;
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        self.progress.record();
        if self.m.past_window(r) {
            return Ok(Flow::Stop);
        }
        self.kernel_record(r, s);
        if self.m.matches(r, s) {
            self.event(r, s).map_err(wio)?;
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        // The units' last active intervals are final now.
        for c in self.comps.iter_mut().flatten() {
            if let Some(k) = c.unit_series {
                let bins = &mut self.bins;
                c.busy
                    .settle(Ps::MAX, |s, e| bins.add(k, s, e, (e - s) as f64));
            }
        }
        self.progress
            .message("writing launches, kernels, channels and counters");
        if let Out::Pb(pb) = &mut self.out {
            pb.write_all_deferred().map_err(wio)?;
        }
        match self.opts.channels {
            Channels::None => {}
            Channels::Counters => self.channel_counters(end.channels()?).map_err(wio)?,
            Channels::Slices => self.channel_tracks(end.channels()?).map_err(wio)?,
        }
        self.finish_extras(end.launches).map_err(wio)?;
        self.metadata().map_err(wio)
    }
}

/// Write the timeline of `input` to `w` (default options).
pub fn write<W: Write>(input: &Input, filter: &Filter, format: Format, w: W) -> Result<Info> {
    write_with(
        input,
        filter,
        format,
        &Options::default(),
        &Progress::hidden(),
        w,
    )
}

/// Each launch's critical path as op ids in path order (time order),
/// from a first pass over `input` (a trace file: it is read again for
/// the timeline).
fn critical_paths(input: &Input) -> Result<Vec<Vec<u64>>> {
    let file = match input {
        Input::Path(p) => std::fs::metadata(p).is_ok_and(|m| m.is_file()),
        Input::Stdin => false,
    };
    if !file {
        return Err(Error::usage(format!(
            "{input}: --critical-path reads the trace twice (the paths, then the timeline): \
             give a trace file, not standard input or a pipe"
        )));
    }
    Ok(crate::critical::compute(input, None)?
        .iter()
        .map(crate::critical::Path::op_ids)
        .collect())
}

/// [`write()`] with `opts`, counting the records read on `progress`.
pub fn write_with<W: Write>(
    input: &Input,
    filter: &Filter,
    format: Format,
    opts: &Options,
    progress: &Progress,
    w: W,
) -> Result<Info> {
    let m = Matcher::new(filter)?;
    let paths = if opts.critical_path {
        critical_paths(input)?
    } else {
        Vec::new()
    };
    let w = io::BufWriter::with_capacity(1 << 20, w);
    let out = match format {
        Format::Json => Out::Json { w, first: true },
        Format::Perfetto => Out::Pb(Box::new(PerfettoWriter::new(w))),
    };
    let mut t = Writer::new(m, out);
    t.opts = *opts;
    t.progress = progress.clone();
    for (l, ops) in paths.iter().enumerate() {
        for (i, &op) in ops.iter().enumerate() {
            t.critical.entry(op).or_default().push((l as u32, i as u32));
        }
        t.critical_written.push(vec![None; ops.len()]);
    }
    source::visit(input, &mut t)?;
    t.info.processes = t.procs.len();
    t.info.tracks = t.tracks.iter().filter(|x| !x.counter).count();
    Ok(t.info)
}

/// `timeline -o FILE`: write to a file (atomically) or stdout (`-`);
/// the binary Perfetto format never to a terminal.
pub fn run(input: &Input, filter: &Filter, format: Format, out: &Path) -> Result<Info> {
    run_with(
        input,
        filter,
        format,
        &Options::default(),
        &Progress::hidden(),
        out,
    )
}

/// [`run`] with `opts`, counting the records read on `progress` (the
/// binary's bar).
pub fn run_with(
    input: &Input,
    filter: &Filter,
    format: Format,
    opts: &Options,
    progress: &Progress,
    out: &Path,
) -> Result<Info> {
    if format == Format::Perfetto && crate::is_terminal_path(out) {
        return Err(Error::usage(format!(
            "refusing to write a binary Perfetto trace to a terminal ({}): give a file",
            out.display()
        )));
    }
    crate::write_output(out, |w| {
        write_with(input, filter, format, opts, progress, w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, Op, mem};
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};

    fn timeline(bytes: &[u8], filter: &Filter) -> (Info, Value) {
        let (_d, p) = testutil::write_temp(bytes);
        let mut out = Vec::new();
        let info = write(&Input::Path(p), filter, Format::Json, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        // The stream source gives the same ops, flows and counters (kernel
        // slices span the launches' windows there).
        let mut out2 = Vec::new();
        let mut t = Writer::new(
            Matcher::new(filter).unwrap(),
            Out::Json {
                w: io::BufWriter::new(&mut out2),
                first: true,
            },
        );
        source::visit_reader("-", bytes, &mut t).unwrap();
        drop(t);
        let v2: Value = serde_json::from_slice(&out2).unwrap();
        let ops = |v: &Value| -> Vec<Value> {
            v["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] != "M" && e["cat"] != "kernel")
                .map(|e| {
                    let mut e = e.clone();
                    if let Some(a) = e["args"].as_object_mut() {
                        a.remove("launch");
                        a.remove("kernel");
                    }
                    e
                })
                .collect()
        };
        assert_eq!(ops(&v), ops(&v2));
        (info, v)
    }

    /// Every slice track as `PROCESS/TRACK`.
    fn tracks(v: &Value) -> BTreeSet<String> {
        let evs = v["traceEvents"].as_array().unwrap();
        let process = |pid: &Value| {
            evs.iter()
                .find(|m| m["name"] == "process_name" && m["pid"] == *pid)
                .unwrap()["args"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        };
        evs.iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| {
                format!(
                    "{}/{}",
                    process(&e["pid"]),
                    e["args"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    /// Integer nanoseconds back from microseconds, as Perfetto reads them
    /// (`llround(ts * 1000)`); the value must be a whole number of ns.
    fn ns(v: &Value) -> u64 {
        let x = v.as_f64().unwrap() * 1000.0;
        assert!((x - x.round()).abs() < 1e-6, "{v} is not whole ns");
        x.round() as u64
    }

    /// The structure Perfetto needs: fields and units of every event,
    /// names for every process and track, and no overlapping complete
    /// events on one track.
    fn check_structure(v: &Value) -> Vec<Value> {
        let evs = v["traceEvents"].as_array().unwrap();
        assert_eq!(v["displayTimeUnit"], "ns");
        let mut procs = BTreeMap::new();
        let mut threads = BTreeMap::new();
        let mut xs = Vec::new();
        let mut all_x = Vec::new();
        let mut flows = Vec::new();
        for e in evs {
            let pid = e["pid"].as_u64().expect("pid");
            let tid = e["tid"].as_u64().expect("tid");
            let name = e["name"].as_str().expect("name");
            match e["ph"].as_str().unwrap() {
                "M" => match name {
                    "process_name" => {
                        procs.insert(pid, e["args"]["name"].as_str().unwrap().to_string());
                    }
                    "thread_name" => {
                        threads.insert((pid, tid), e["args"]["name"].as_str().unwrap().to_string());
                    }
                    "process_sort_index" | "thread_sort_index" => {
                        assert!(e["args"]["sort_index"].is_u64());
                    }
                    other => panic!("unexpected metadata {other}"),
                },
                "X" => {
                    assert!(e["ts"].is_number() && e["dur"].is_number(), "{e}");
                    assert!(e["dur"].as_f64().unwrap() >= 0.0);
                    assert!(e["cat"].is_string());
                    if e["cat"] != "launch" && e["cat"] != "kernel" {
                        assert!(e["args"]["op_id"].is_u64());
                    }
                    all_x.push(e.clone());
                    if e["args"]["op_id"].is_u64() {
                        xs.push(e.clone());
                    }
                }
                "s" | "f" => {
                    assert!(e["id"].is_u64() && e["ts"].is_number(), "{e}");
                    flows.push(e.clone());
                }
                "C" => {
                    assert!(e["args"]["value"].is_number(), "{e}");
                    assert!(procs.contains_key(&pid) || pid > 0, "{e}");
                }
                other => panic!("unexpected phase {other}"),
            }
        }
        // Every flow has its start and its end.
        let mut ids: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for f in &flows {
            ids.entry(f["id"].as_u64().unwrap())
                .or_default()
                .push(f["ph"].as_str().unwrap().to_string());
        }
        for (id, phs) in ids {
            assert_eq!(phs, ["s", "f"], "flow {id}");
        }
        let mut by_track: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
        for e in &all_x {
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            assert!(procs.contains_key(&key.0), "no process_name for {e}");
            assert!(threads.contains_key(&key), "no thread_name for {e}");
            let t0 = ns(&e["ts"]);
            by_track
                .entry(key)
                .or_default()
                .push((t0, t0 + ns(&e["dur"])));
        }
        for (k, mut iv) in by_track {
            iv.sort();
            for w in iv.windows(2) {
                assert!(w[0].1 <= w[1].0, "overlap on track {k:?}: {w:?}");
            }
        }
        xs
    }

    #[test]
    fn hbm_channels_get_a_track_each_with_their_busy_intervals() {
        let bytes = testutil::channel_trace();
        let busy = |v: &Value| -> Vec<(String, u64, u64, u64)> {
            let ev = v["traceEvents"].as_array().unwrap();
            ev.iter()
                .filter(|e| e["cat"] == "hbm_channel")
                .map(|e| {
                    let track = ev
                        .iter()
                        .find(|m| {
                            m["name"] == "thread_name"
                                && m["pid"] == e["pid"]
                                && m["tid"] == e["tid"]
                        })
                        .unwrap();
                    let process = ev
                        .iter()
                        .find(|m| m["name"] == "process_name" && m["pid"] == e["pid"])
                        .unwrap();
                    (
                        format!(
                            "{}/{}",
                            process["args"]["name"].as_str().unwrap(),
                            track["args"]["name"].as_str().unwrap()
                        ),
                        e["args"]["start_ps"].as_u64().unwrap(),
                        e["args"]["end_ps"].as_u64().unwrap(),
                        (e["dur"].as_f64().unwrap() * 1000.0).round() as u64,
                    )
                })
                .collect()
        };
        let (_, v) = timeline(&bytes, &Filter::default());
        assert_eq!(
            busy(&v),
            [
                ("sip0.cube0/hbm_ctrl.ch2".to_string(), 9000, 9002, 0),
                ("sip0.cube1/hbm_ctrl.ch10".to_string(), 1000, 2000, 1),
                ("sip0.cube1/hbm_ctrl.ch10".to_string(), 4000, 4500, 1),
            ]
        );
        // The window selects intervals; a component glob selects channels;
        // a name filter selects ops only.
        let window = Filter {
            from: Some(3000),
            to: Some(9000),
            ..Default::default()
        };
        let (_, v) = timeline(&bytes, &window);
        assert_eq!(busy(&v).len(), 1);
        assert_eq!(busy(&v)[0].1, 4000);
        let comp = Filter {
            components: vec!["*.cube0.hbm_ctrl.*".into()],
            ..Default::default()
        };
        let (_, v) = timeline(&bytes, &comp);
        assert_eq!(busy(&v).len(), 1);
        assert_eq!(busy(&v)[0].0, "sip0.cube0/hbm_ctrl.ch2");
        let names = Filter {
            names: vec!["dma_read".into()],
            ..Default::default()
        };
        let (_, v) = timeline(&bytes, &names);
        assert!(busy(&v).is_empty());
    }

    #[test]
    fn timeline_json_has_the_structure_perfetto_needs() {
        let (info, v) = timeline(&testutil::sample_trace(), &Filter::default());
        let xs = check_structure(&v);
        assert_eq!(xs.len(), 7);
        assert_eq!(info.events, 7);
        // Units: op 1 runs [1000, 3000) ps = [0.001, 0.003) us.
        let op1 = xs.iter().find(|e| e["args"]["op_id"] == 1).unwrap();
        assert_eq!(op1["ts"].as_f64(), Some(0.001));
        assert_eq!(op1["dur"].as_f64(), Some(0.002));
        assert_eq!(op1["name"], "dma_read");
        assert_eq!(op1["cat"], "memory");
        assert_eq!(op1["args"]["bytes"], 64);
        assert_eq!(op1["args"]["start_ns"], 1.0);
        assert_eq!(op1["args"]["end_ns"], 3.0);
        assert_eq!(op1["args"]["shape"], "2x16");
        assert_eq!(op1["args"]["dtype"], "f16");
        assert_eq!(op1["args"]["launch"], 0);
        assert_eq!(op1["args"]["kernel"], "gemm");
        let gemm = xs.iter().find(|e| e["args"]["op_id"] == 3).unwrap();
        assert_eq!(gemm["args"]["shape"], "2x4 @ 4x3 -> 2x3");
        assert_eq!(gemm["args"]["dtype"], "f16 -> f16 (acc f32)");
        assert_eq!(op1["args"]["component"], testutil::PE_DMA);
        // Processes: host, sip0 (pcie_ep), sip0.cube0 (its counters) and
        // one per PE with its units' tracks and its kernel track.
        let evs = v["traceEvents"].as_array().unwrap();
        let names = |kind: &str| -> BTreeSet<String> {
            evs.iter()
                .filter(|e| e["name"] == kind)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names("process_name"),
            [
                "host",
                "sip0",
                "sip0.cube0",
                "sip0.cube0.pe0",
                "sip0.cube1.pe0"
            ]
            .map(String::from)
            .into()
        );
        assert_eq!(
            tracks(&v),
            [
                "host/host",
                "host/launches",
                "sip0/pcie_ep",
                "sip0.cube0.pe0/gemm",
                "sip0.cube0.pe0/kernel",
                "sip0.cube0.pe0/pe_dma",
                "sip0.cube0.pe0/pe_dma#1",
                "sip0.cube1.pe0/kernel",
                "sip0.cube1.pe0/vec",
            ]
            .map(String::from)
            .into()
        );
        // The kernel track comes first in its PE's process (sort index).
        let rank = |pid: &Value, name: &str| {
            let tid = &evs
                .iter()
                .find(|e| {
                    e["name"] == "thread_name" && e["pid"] == *pid && e["args"]["name"] == name
                })
                .unwrap()["tid"];
            evs.iter()
                .find(|e| e["name"] == "thread_sort_index" && e["tid"] == *tid)
                .unwrap()["args"]["sort_index"]
                .as_u64()
                .unwrap()
        };
        assert!(rank(&op1["pid"], "kernel") < rank(&op1["pid"], "gemm"));
        // Ops 1 and 2 overlap on pe_dma: same process, different tracks;
        // op 4 reuses the first lane.
        let op = |id: u64| xs.iter().find(|e| e["args"]["op_id"] == id).unwrap();
        assert_eq!(op(1)["pid"], op(2)["pid"]);
        assert_ne!(op(1)["tid"], op(2)["tid"]);
        assert_eq!(op(4)["tid"], op(1)["tid"]);
        assert_eq!(info.processes, 5);
        // 6 op tracks, the launches track and a kernel track per PE.
        assert_eq!(info.tracks, 9);
        assert_eq!((info.launches, info.kernels), (2, 2));
    }

    #[test]
    fn heavy_overlap_gets_as_many_lanes_as_needed() {
        // Eight DMAs in flight at once, then a second wave.
        let mut ops: Vec<Op> = Vec::new();
        for i in 0..16u64 {
            let t0 = (i / 8) * 10_000 + i * 10;
            ops.push(mem(i, t0, t0 + 5_000, testutil::PE_DMA, "dma_read", 64));
        }
        let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
        let (info, v) = timeline(&bytes, &Filter::default());
        check_structure(&v);
        assert_eq!(info.tracks, 8);
        assert_eq!(info.events, 16);
    }

    #[test]
    fn unaligned_times_round_to_ns_without_overlap() {
        // Back-to-back ops at sub-ns boundaries stay on one track; the
        // written times are whole ns and consistent with Perfetto's rounding.
        let c = testutil::PE_DMA;
        let ops = vec![
            mem(0, 0, 1_500, c, "a", 64),       // [0, 2) ns
            mem(1, 1_500, 2_499, c, "b", 64),   // [2, 2) ns
            mem(2, 2_499, 40_960, c, "c", 64),  // [2, 41) ns
            mem(3, 40_000, 41_000, c, "d", 64), // overlaps c: lane 1
            mem(4, 40_960, 41_200, c, "e", 64), // [41, 41) ns: lane 0
        ];
        let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
        let (info, v) = timeline(&bytes, &Filter::default());
        let xs = check_structure(&v);
        assert_eq!(info.tracks, 2);
        let get = |id: u64| xs.iter().find(|e| e["args"]["op_id"] == id).unwrap();
        assert_eq!(get(0)["ts"].as_f64(), Some(0.0));
        assert_eq!(get(0)["dur"].as_f64(), Some(0.002));
        assert_eq!(get(2)["dur"].as_f64(), Some(0.039));
        assert_eq!(get(2)["args"]["end_ns"], 40.96);
        for id in [0, 1, 2, 4] {
            assert_eq!(get(id)["tid"], get(0)["tid"], "op {id}");
        }
        assert_ne!(get(3)["tid"], get(0)["tid"]);
        assert_eq!(round_ns(499), 0);
        assert_eq!(round_ns(500), 1);
    }

    #[test]
    fn window_selects_overlapping_ops() {
        let f = Filter {
            from: Some(3500),
            to: Some(5000),
            ..Default::default()
        };
        let (info, v) = timeline(&testutil::sample_trace(), &f);
        let xs = check_structure(&v);
        let ids: Vec<u64> = xs
            .iter()
            .map(|e| e["args"]["op_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [2, 3]);
        // Their PE, its cube (the util counters), and the host for the
        // launch that overlaps the window.
        assert_eq!(info.processes, 3);
        assert_eq!(info.launches, 1);
    }

    #[test]
    fn empty_selection_is_still_valid_json() {
        let f = Filter {
            components: vec!["nothing".into()],
            ..Default::default()
        };
        let (info, v) = timeline(&testutil::sample_trace(), &f);
        assert_eq!(info.events, 0);
        assert_eq!(v["traceEvents"], serde_json::json!([]));
        assert_eq!((info.launches, info.counter_values), (0, 0));
    }

    #[test]
    fn component_names_split_into_process_and_track() {
        let s = |n: &str| split_component(n);
        assert_eq!(
            s("sip0.cube1.pe3.pe_dma"),
            ("sip0.cube1.pe3".into(), "pe_dma".into())
        );
        assert_eq!(
            s("sip0.cube0.hbm_ctrl.ch12"),
            ("sip0.cube0".into(), "hbm_ctrl.ch12".into())
        );
        assert_eq!(s("sip0.cube0.pe3"), ("sip0.cube0".into(), "pe3".into()));
        assert_eq!(
            s("sip0.cube0.pe3.a.b"),
            ("sip0.cube0.pe3".into(), "a.b".into())
        );
        assert_eq!(
            s("sip0.cube0.hbm_ctrl"),
            ("sip0.cube0".into(), "hbm_ctrl".into())
        );
        assert_eq!(s("sip2.pcie_ep"), ("sip2".into(), "pcie_ep".into()));
        assert_eq!(s("host"), ("host".into(), "host".into()));
        assert_eq!(s("sip0"), ("host".into(), "sip0".into()));
        assert_eq!(s("sipx.cube0.a"), ("host".into(), "sipx.cube0.a".into()));
        assert_eq!(s("sip1.cube2"), ("sip1".into(), "cube2".into()));
    }

    #[test]
    fn memory_events_carry_route_and_bytes() {
        let mut ops = testutil::route_ops();
        // A memory op that moved no bytes still says so.
        let pe0 = testutil::dev(kb_format::Space::Tcm, 0, 0, 0, 0);
        ops.push(testutil::copy(
            10,
            10_000,
            10_000,
            testutil::PE_DMA,
            "ipcq_copy",
            &[pe0],
            &[pe0],
            0,
            1,
        ));
        let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
        let (info, v) = timeline(&bytes, &Filter::default());
        let xs = check_structure(&v);
        assert_eq!(info.events, 11);
        let get = |id: u64| xs.iter().find(|e| e["args"]["op_id"] == id).unwrap();
        let copy = &get(2)["args"];
        assert_eq!(get(2)["name"], "ipcq_copy");
        assert_eq!(copy["route"], "sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm");
        assert_eq!(copy["bytes"], 128);
        assert_eq!(copy["component"], testutil::PE_DMA);
        assert_eq!(
            get(5)["args"]["route"],
            "sip0.cube0.pe0.tcm -> sip0.cube1.sram"
        );
        assert_eq!(get(0)["args"]["route"], "host -> sip0.cube0.hbm");
        assert_eq!(get(9)["args"]["route"], "? -> sip0.cube0.hbm");
        assert_eq!(get(10)["args"]["bytes"], 0);
        // Compute ops have no route and no bytes.
        for id in [4, 7] {
            let args = get(id)["args"].as_object().unwrap();
            assert!(!args.contains_key("route") && !args.contains_key("bytes"));
        }
        assert_eq!(get(4)["args"]["flops"], 48);
    }

    #[test]
    fn cross_component_dependencies_get_flow_arrows() {
        // Sample deps: 1 <- 0 (host -> pe_dma), 2 <- 1 (same track: none),
        // 4 <- 3 (gemm -> pe_dma), 6 <- 5 (vec -> pcie_ep).
        let (info, v) = timeline(&testutil::sample_trace(), &Filter::default());
        check_structure(&v);
        assert_eq!(info.flows, 3);
        let evs = v["traceEvents"].as_array().unwrap();
        let op = |id: u64| {
            evs.iter()
                .find(|e| e["ph"] == "X" && e["args"]["op_id"] == id)
                .unwrap()
        };
        let flow = |ph: &str| -> Vec<(u64, u64, f64)> {
            evs.iter()
                .filter(|e| e["ph"] == ph)
                .map(|e| {
                    (
                        e["pid"].as_u64().unwrap(),
                        e["tid"].as_u64().unwrap(),
                        e["ts"].as_f64().unwrap(),
                    )
                })
                .collect()
        };
        let at = |id: u64| {
            let e = op(id);
            (
                e["pid"].as_u64().unwrap(),
                e["tid"].as_u64().unwrap(),
                e["ts"].as_f64().unwrap(),
            )
        };
        // Each arrow starts on the producer's slice and ends on the consumer's.
        assert_eq!(flow("s"), [at(0), at(3), at(5)]);
        assert_eq!(flow("f"), [at(1), at(4), at(6)]);
    }

    /// The JSON timeline of a trace file with `opts`.
    fn timeline_opts(bytes: &[u8], opts: Options) -> (Info, Value) {
        let (_d, p) = testutil::write_temp(bytes);
        let mut out = Vec::new();
        let info = write_with(
            &Input::Path(p),
            &Filter::default(),
            Format::Json,
            &opts,
            &Progress::hidden(),
            &mut out,
        )
        .unwrap();
        (info, serde_json::from_slice(&out).unwrap())
    }

    /// Kernel slices as (PROCESS/TRACK, start ns, end ns, launch).
    fn kernel_slices(v: &Value) -> Vec<(String, u64, u64, u64)> {
        let evs = v["traceEvents"].as_array().unwrap();
        let name = |pid: &Value, tid: &Value| {
            let n = |kind: &str, with_tid: bool| {
                evs.iter()
                    .find(|m| {
                        m["name"] == kind && m["pid"] == *pid && (!with_tid || m["tid"] == *tid)
                    })
                    .unwrap()["args"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            };
            format!("{}/{}", n("process_name", false), n("thread_name", true))
        };
        let mut k: Vec<(String, u64, u64, u64)> = evs
            .iter()
            .filter(|e| e["cat"] == "kernel")
            .map(|e| {
                let t0 = ns(&e["ts"]);
                (
                    name(&e["pid"], &e["tid"]),
                    t0,
                    t0 + ns(&e["dur"]),
                    e["args"]["launch"].as_u64().unwrap(),
                )
            })
            .collect();
        k.sort();
        k
    }

    #[test]
    fn kernel_slices_run_from_kernel_start_to_kernel_end() {
        // One launch [1, 20] ns on PE0 and PE1. PE0 runs two programs,
        // each from a kernel_start to a kernel_end instant on its pe_cpu;
        // PE1 has no kernel records: its kernel spans its ops.
        let cpu0 = "sip0.cube0.pe0.pe_cpu";
        let dma1 = "sip0.cube0.pe1.pe_dma";
        let ops = vec![
            testutil::sync(0, 1_500, 1_500, cpu0, "kernel_start"),
            mem(1, 2_000, 5_000, testutil::PE_DMA, "dma_read", 64),
            mem(2, 3_000, 4_000, dma1, "dma_read", 64),
            mem(3, 6_000, 8_000, dma1, "dma_write", 64),
            testutil::sync(4, 9_000, 9_000, cpu0, "kernel_end"),
            testutil::sync(5, 10_000, 10_000, cpu0, "kernel_start"),
            testutil::sync(6, 12_000, 12_000, cpu0, "kernel_end"),
        ];
        let launches = vec![kb_format::Launch {
            kernel: "k".into(),
            grid: [3, 1, 1],
            pes: vec![[0, 0, 0], [0, 0, 1]],
            t_start: 1_000,
            t_end: 20_000,
            flops: 0,
            useful_flops: 0,
        }];
        let bytes = testutil::build_with_launches(
            &testutil::sample_meta(),
            &[],
            &ops,
            &launches,
            &Default::default(),
        );
        let (info, v) = timeline(&bytes, &Filter::default());
        check_structure(&v);
        let want = |pe1: (u64, u64)| {
            vec![
                ("sip0.cube0.pe0/kernel".to_string(), 2, 9, 0),
                ("sip0.cube0.pe0/kernel".to_string(), 10, 12, 0),
                ("sip0.cube0.pe1/kernel".to_string(), pe1.0, pe1.1, 0),
            ]
        };
        assert_eq!(kernel_slices(&v), want((3, 8)));
        assert_eq!(info.kernels, 3);
        // The instants stay on pe_cpu (flows end on them).
        assert!(tracks(&v).contains("sip0.cube0.pe0/pe_cpu"));
        // A stream: PE0's the same, PE1's the launch's window.
        let mut out = Vec::new();
        let mut t = Writer::new(
            Matcher::new(&Filter::default()).unwrap(),
            Out::Json {
                w: io::BufWriter::new(&mut out),
                first: true,
            },
        );
        source::visit_reader("-", &bytes[..], &mut t).unwrap();
        drop(t);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(kernel_slices(&v), want((1, 20)));
        // A window that cuts PE0's first kernel before its end: it runs to
        // the launch's end.
        let f = Filter {
            to: Some(4_500),
            ..Default::default()
        };
        let (_, v) = timeline(&bytes, &f);
        let k = kernel_slices(&v);
        assert_eq!(k[0], ("sip0.cube0.pe0/kernel".to_string(), 2, 20, 0));
    }

    #[test]
    fn channels_can_be_counters_or_left_out() {
        let bytes = testutil::channel_trace();
        let (info, v) = timeline_opts(
            &bytes,
            Options {
                channels: Channels::Counters,
                ..Default::default()
            },
        );
        check_structure(&v);
        let evs = v["traceEvents"].as_array().unwrap();
        assert!(!evs.iter().any(|e| e["cat"] == "hbm_channel"));
        let process = |pid: &Value| {
            evs.iter()
                .find(|m| m["name"] == "process_name" && m["pid"] == *pid)
                .unwrap()["args"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let series = |name: &str| -> Vec<(String, u64, f64)> {
            evs.iter()
                .filter(|e| e["ph"] == "C" && e["name"] == name)
                .map(|e| {
                    (
                        process(&e["pid"]),
                        ns(&e["ts"]),
                        e["args"]["value"].as_f64().unwrap(),
                    )
                })
                .collect()
        };
        // Channel 10 of cube 1 served [1, 2) and [4, 4.5) ns: 1 ns bins.
        let c1 = |t, x| ("sip0.cube1".to_string(), t, x);
        assert_eq!(
            series("util hbm_ctrl.ch10"),
            [c1(0, 0.0), c1(1, 1.0), c1(2, 0.0), c1(4, 0.5), c1(5, 0.0)]
        );
        // Channel 2 of cube 0: 2 ps of bin 9.
        let c0 = |t, x| ("sip0.cube0".to_string(), t, x);
        assert_eq!(
            series("util hbm_ctrl.ch2"),
            [c0(0, 0.0), c0(9, 0.002), c0(10, 0.0)]
        );
        let (slices, _) = timeline(&bytes, &Filter::default());
        assert_eq!(info.counter_tracks, slices.counter_tracks + 2);
        assert_eq!(info.tracks, slices.tracks - 2);
        // none: neither tracks nor counters.
        let (none, v) = timeline_opts(
            &bytes,
            Options {
                channels: Channels::None,
                ..Default::default()
            },
        );
        let evs = v["traceEvents"].as_array().unwrap();
        assert!(!evs.iter().any(|e| {
            e["cat"] == "hbm_channel"
                || e["name"].as_str().unwrap().contains("hbm_ctrl")
                || e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("hbm_ctrl"))
        }));
        assert_eq!(none.tracks, info.tracks);
        assert_eq!(none.counter_tracks, slices.counter_tracks);
        assert_eq!(none.events, 7);
    }

    #[test]
    fn critical_path_ops_are_marked_and_chained() {
        // testutil::critical_ops' paths (critical::tests): launch 0 through
        // ops 1, 2, 3, 4 (PE0's load, gemm, store, signal), 5 (PE1's
        // wait), 6, 7, 8; launch 1 op 11.
        let bytes = testutil::critical_trace();
        let opts = Options {
            critical_path: true,
            ..Default::default()
        };
        let (info, v) = timeline_opts(&bytes, opts);
        let xs = check_structure(&v);
        let marked: Vec<(u64, u64)> = xs
            .iter()
            .filter(|e| e["args"]["critical"] == true)
            .map(|e| {
                (
                    e["args"]["op_id"].as_u64().unwrap(),
                    e["args"]["critical_launch"].as_u64().unwrap(),
                )
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(
            marked,
            [
                (1, 0),
                (2, 0),
                (3, 0),
                (4, 0),
                (5, 0),
                (6, 0),
                (7, 0),
                (8, 0),
                (11, 1)
            ]
        );
        assert_eq!(info.critical_ops, 9);
        // Arrows in path order, each from an op to the next: op 5 (the
        // wait) started before op 4, so 4 -> 5 has none.
        let evs = v["traceEvents"].as_array().unwrap();
        let at = |pid: &Value, tid: &Value, ts: &Value| -> u64 {
            xs.iter()
                .find(|e| e["pid"] == *pid && e["tid"] == *tid && e["ts"] == *ts)
                .unwrap()["args"]["op_id"]
                .as_u64()
                .unwrap()
        };
        let ends = |ph: &str| -> BTreeMap<u64, u64> {
            evs.iter()
                .filter(|e| e["ph"] == ph && e["cat"] == "critical")
                .map(|e| {
                    assert_eq!(e["name"], "critical_path");
                    (
                        e["id"].as_u64().unwrap(),
                        at(&e["pid"], &e["tid"], &e["ts"]),
                    )
                })
                .collect()
        };
        let (from, to) = (ends("s"), ends("f"));
        let mut chain: Vec<(u64, u64)> = from.iter().map(|(id, a)| (*a, to[id])).collect();
        chain.sort();
        assert_eq!(chain, [(1, 2), (2, 3), (3, 4), (5, 6), (6, 7), (7, 8)]);
        assert_eq!(info.critical_flows, 6);
        // Dependency arrows are named by their edge's kind (5's sync edge
        // from 4, which starts later, has none).
        let kinds: BTreeSet<&str> = evs
            .iter()
            .filter(|e| e["ph"] == "s" && e["cat"] == "dep")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["data", "host", "program"].into());
        // Off by default: nothing marked.
        let (plain, v) = timeline_opts(&bytes, Options::default());
        assert_eq!((plain.critical_ops, plain.critical_flows), (0, 0));
        assert!(
            !v["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["args"]["critical"] == true || e["cat"] == "critical")
        );
        assert_eq!(plain.flows, info.flows);
    }

    #[test]
    fn critical_path_needs_a_file_with_launches() {
        let opts = Options {
            critical_path: true,
            ..Default::default()
        };
        let mut out = Vec::new();
        let err = write_with(
            &Input::Stdin,
            &Filter::default(),
            Format::Json,
            &opts,
            &Progress::hidden(),
            &mut out,
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("<stdin>: --critical-path"),
            "{err}"
        );
        // No launches: critical-path's error, naming the file.
        let bytes = testutil::build(
            &testutil::sample_meta(),
            &[],
            &testutil::sample_ops(),
            &Default::default(),
        );
        let (_d, p) = testutil::write_temp(&bytes);
        let err = write_with(
            &Input::Path(p.clone()),
            &Filter::default(),
            Format::Perfetto,
            &opts,
            &Progress::hidden(),
            &mut out,
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with(&p.display().to_string()), "{msg}");
        assert!(msg.contains("no launches"), "{msg}");
    }

    #[test]
    fn counters_are_bandwidth_and_utilisation_per_bin() {
        // 64 B from the host into HBM by a PE's DMA in [0, 1) ns, then
        // 128 B over [2, 4) ns: 64 GB/s in bin 0, 64 GB/s in bins 2 and 3.
        let ops = vec![
            mem(0, 0, 1000, testutil::PE_DMA, "a", 64),
            mem(1, 2000, 4000, testutil::PE_DMA, "b", 128),
        ];
        let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
        let (info, v) = timeline(&bytes, &Filter::default());
        check_structure(&v);
        let evs = v["traceEvents"].as_array().unwrap();
        let series = |name: &str| -> Vec<(f64, f64)> {
            evs.iter()
                .filter(|e| e["ph"] == "C" && e["name"] == name)
                .map(|e| {
                    (
                        e["ts"].as_f64().unwrap(),
                        e["args"]["value"].as_f64().unwrap(),
                    )
                })
                .collect()
        };
        // Values change at 0, 1, 2 and 4 ns (equal neighbours are merged).
        let want = [(0.0, 64.0), (0.001, 0.0), (0.002, 64.0), (0.004, 0.0)];
        assert_eq!(series("hbm GB/s"), want);
        assert_eq!(series("noc GB/s"), want);
        // One pe_dma unit, busy [0,1) and [2,4): fully busy in those bins.
        assert_eq!(
            series("util pe_dma"),
            [(0.0, 1.0), (0.001, 0.0), (0.002, 1.0), (0.004, 0.0)]
        );
        assert!(info.counter_tracks >= 3);
    }

    #[test]
    fn utilisation_counts_the_units_active_intervals() {
        // One pe_dma: op b spans [2, 4) ns but moves bytes in [3, 4); op c,
        // which starts later, in [2.6, 2.9): busy 0.3 of bin 2, all of
        // bin 3.
        let mut b = mem(0, 2000, 4000, testutil::PE_DMA, "b", 128);
        b.rec.active = Some((3000, 4000));
        let mut c = mem(1, 2500, 3500, testutil::PE_DMA, "c", 64);
        c.rec.active = Some((2600, 2900));
        let bytes = testutil::build(&testutil::sample_meta(), &[], &[b, c], &Default::default());
        let (_, v) = timeline(&bytes, &Filter::default());
        let util: Vec<(f64, f64)> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "util pe_dma")
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["value"].as_f64().unwrap(),
                )
            })
            .collect();
        let want = [(0.0, 0.0), (0.002, 0.3), (0.003, 1.0), (0.004, 0.0)];
        assert_eq!(util.len(), want.len(), "{util:?}");
        for ((t, u), (wt, wu)) in util.iter().zip(want) {
            assert_eq!(*t, wt);
            assert!((u - wu).abs() < 1e-9, "{util:?}");
        }
    }

    #[test]
    fn bins_double_and_keep_totals() {
        let mut b = Bins {
            width: 1000,
            series: vec![Series {
                tid: 1,
                max: false,
                units: 1.0,
                scale: 1.0,
                bins: vec![0.0; BINS],
                used: vec![false; BINS],
            }],
        };
        b.add(0, 0, 1000, 5.0);
        b.add(0, 500, 1500, 10.0);
        assert_eq!((b.series[0].bins[0], b.series[0].bins[1]), (10.0, 5.0));
        // A time past the last bin doubles the width until it fits.
        b.add(0, 3000 * BINS as u64, 3000 * BINS as u64 + 1, 1.0);
        assert_eq!(b.width, 4000);
        assert_eq!(b.series[0].bins[0], 15.0);
        assert_eq!(b.series[0].bins.iter().sum::<f64>(), 16.0);
    }

    /// The Perfetto protobuf, decoded against the vendored schema
    /// (proto/perfetto_trace.proto) by rust-protobuf's dynamic messages:
    /// every field is known to the schema, and the content is the JSON
    /// timeline's.
    mod perfetto_decode {
        use super::*;
        use protobuf::MessageDyn;
        use protobuf::reflect::{FileDescriptor, ReflectFieldRef, ReflectValueRef};
        use serde_json::json;

        fn to_json(m: &dyn MessageDyn) -> Value {
            assert_eq!(
                m.unknown_fields_dyn().iter().count(),
                0,
                "fields unknown to the schema in {}",
                m.descriptor_dyn().full_name()
            );
            let mut o = serde_json::Map::new();
            for f in m.descriptor_dyn().fields() {
                match f.get_reflect(m) {
                    ReflectFieldRef::Optional(v) => {
                        if let Some(v) = v.value() {
                            o.insert(f.name().to_string(), val(v));
                        }
                    }
                    ReflectFieldRef::Repeated(r) => {
                        if !r.is_empty() {
                            let a = (0..r.len()).map(|i| val(r.get(i))).collect();
                            o.insert(f.name().to_string(), Value::Array(a));
                        }
                    }
                    ReflectFieldRef::Map(_) => panic!("no maps in the schema"),
                }
            }
            Value::Object(o)
        }

        fn val(v: ReflectValueRef<'_>) -> Value {
            match v {
                ReflectValueRef::U32(x) => json!(x),
                ReflectValueRef::U64(x) => json!(x),
                ReflectValueRef::I32(x) => json!(x),
                ReflectValueRef::I64(x) => json!(x),
                ReflectValueRef::F32(x) => json!(x),
                ReflectValueRef::F64(x) => json!(x),
                ReflectValueRef::Bool(x) => json!(x),
                ReflectValueRef::String(x) => json!(x),
                ReflectValueRef::Bytes(x) => json!(String::from_utf8_lossy(x)),
                ReflectValueRef::Enum(d, n) => {
                    json!(d.value_by_number(n).map(|e| e.name().to_string()))
                }
                ReflectValueRef::Message(m) => to_json(&*m),
            }
        }

        fn decode(bytes: &[u8]) -> Vec<Value> {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
            let parsed = protobuf_parse::Parser::new()
                .pure()
                .include(&dir)
                .input(dir.join("perfetto_trace.proto"))
                .parse_and_typecheck()
                .unwrap();
            let fd = FileDescriptor::new_dynamic(
                parsed.file_descriptors.into_iter().next().unwrap(),
                &[],
            )
            .unwrap();
            let trace = fd.message_by_package_relative_name("Trace").unwrap();
            let m = trace
                .parse_from_bytes(bytes)
                .expect("a valid perfetto.protos.Trace");
            let v = to_json(&*m);
            v["packet"].as_array().cloned().unwrap_or_default()
        }

        /// (track name, name, category, begin ns, end ns, args) of a slice.
        type Slice = (String, String, String, u64, u64, BTreeMap<String, Value>);
        /// An open slice: (name, category, begin ns, args).
        type Open = (String, String, u64, BTreeMap<String, Value>);

        /// The decoded trace as (op slices, tracks by uuid, counters, flows).
        #[derive(Debug, Default)]
        struct Seen {
            slices: Vec<Slice>,
            counters: Vec<(String, u64, f64)>,
            flow_sources: Vec<(String, u64, u64)>,
            flow_ends: Vec<(String, u64, u64)>,
            /// The flow sources on an op's BEGIN (not an instant).
            begin_flow_sources: Vec<(String, u64, u64)>,
            processes: BTreeSet<String>,
        }

        /// A sequence's incremental state, as trace processor keeps it.
        #[derive(Debug, Default)]
        struct SeqState {
            names: BTreeMap<u64, String>,
            cats: BTreeMap<u64, String>,
            anames: BTreeMap<u64, String>,
            svals: BTreeMap<u64, String>,
            /// TrackEventDefaults.track_uuid.
            track: Option<u64>,
            /// The incremental clock's value (set by the snapshot).
            clock: Option<u64>,
        }

        fn interpret(packets: &[Value]) -> Seen {
            let mut seqs: BTreeMap<u64, SeqState> = BTreeMap::new();
            let mut tracks: BTreeMap<u64, (String, bool)> = BTreeMap::new();
            let mut open: BTreeMap<u64, Vec<Open>> = BTreeMap::new();
            let mut seen = Seen::default();
            for (i, p) in packets.iter().enumerate() {
                let seq = p["trusted_packet_sequence_id"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("packet {i} has no sequence: {p}"));
                let first = !seqs.contains_key(&seq);
                let st = seqs.entry(seq).or_default();
                // The first packet of a sequence clears its incremental
                // state; those that use interned names, the sequence's
                // defaults or its incremental clock (every packet of an op
                // track's sequence) say they need it; the rest
                // (descriptors, sequence 1's slice ends and counters)
                // carry no flags.
                let needs = p["track_event"].get("name_iid").is_some() || seq != 1;
                let flags = match (first, needs) {
                    (true, _) => json!(1),
                    (_, true) => json!(2),
                    _ => Value::Null,
                };
                assert_eq!(
                    p.get("sequence_flags").cloned().unwrap_or(Value::Null),
                    flags,
                    "packet {i}"
                );
                if let Some(d) = p.get("trace_packet_defaults") {
                    assert!(first && seq != 1, "defaults only open op sequences");
                    // A sequence-scoped clock (64..127) and the track.
                    assert_eq!(d["timestamp_clock_id"], 64);
                    st.track = Some(d["track_event_defaults"]["track_uuid"].as_u64().unwrap());
                }
                if let Some(c) = p.get("clock_snapshot") {
                    // The incremental clock against BOOTTIME, equal: its
                    // values are trace times.
                    let clocks = c["clocks"].as_array().unwrap();
                    assert_eq!(clocks.len(), 2);
                    let (inc, boot) = (&clocks[0], &clocks[1]);
                    assert_eq!(inc["clock_id"], 64);
                    assert_eq!(inc["is_incremental"], true);
                    assert_eq!(boot["clock_id"], 6);
                    assert!(boot.get("is_incremental").is_none());
                    assert_eq!(inc["timestamp"], boot["timestamp"]);
                    st.clock = Some(inc["timestamp"].as_u64().unwrap());
                    assert!(p.get("track_event").is_none());
                }
                if let Some(d) = p.get("interned_data") {
                    for (field, map) in [
                        ("event_names", &mut st.names),
                        ("event_categories", &mut st.cats),
                        ("debug_annotation_names", &mut st.anames),
                    ] {
                        for e in d[field].as_array().into_iter().flatten() {
                            let iid = e["iid"].as_u64().unwrap();
                            assert!(
                                map.insert(iid, e["name"].as_str().unwrap().into())
                                    .is_none()
                            );
                        }
                    }
                    for e in d["debug_annotation_string_values"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let iid = e["iid"].as_u64().unwrap();
                        assert!(
                            st.svals
                                .insert(iid, e["str"].as_str().unwrap().into())
                                .is_none()
                        );
                    }
                }
                if let Some(td) = p.get("track_descriptor") {
                    assert_eq!(seq, 1);
                    let uuid = td["uuid"].as_u64().unwrap();
                    if let Some(pd) = td.get("process") {
                        let name = pd["process_name"].as_str().unwrap().to_string();
                        assert!(pd["pid"].as_i64().unwrap() > 0);
                        seen.processes.insert(name.clone());
                        tracks.insert(uuid, (name, false));
                    } else {
                        let parent = td["parent_uuid"].as_u64().unwrap();
                        let pname = tracks
                            .get(&parent)
                            .expect("parent described first")
                            .0
                            .clone();
                        let name = format!("{pname}/{}", td["name"].as_str().unwrap());
                        tracks.insert(uuid, (name, td.get("counter").is_some()));
                    }
                }
                if let Some(te) = p.get("track_event") {
                    let raw = p["timestamp"].as_u64().unwrap();
                    // Absolute on sequence 1 or with an explicit BOOTTIME
                    // clock; else a delta on the sequence's clock.
                    let ts = match (p.get("timestamp_clock_id"), st.clock.as_mut()) {
                        (Some(c), _) => {
                            assert_eq!(c, 6);
                            raw
                        }
                        (None, Some(clock)) => {
                            *clock += raw;
                            *clock
                        }
                        (None, None) => {
                            assert_eq!(seq, 1, "an op sequence without its clock");
                            raw
                        }
                    };
                    let uuid = match (te["track_uuid"].as_u64(), st.track) {
                        (Some(u), None) => u,
                        (None, Some(u)) => u,
                        (Some(_), Some(_)) => panic!("track given on a sequence with a default"),
                        (None, None) => panic!("no track: {p}"),
                    };
                    let (track, counter) =
                        tracks.get(&uuid).expect("track described first").clone();
                    let name = te["name_iid"].as_u64().map(|i| st.names[&i].clone());
                    match te["type"].as_str().unwrap() {
                        "TYPE_SLICE_BEGIN" => {
                            assert!(!counter);
                            let cat = st.cats[&te["category_iids"][0].as_u64().unwrap()].clone();
                            let mut args = BTreeMap::new();
                            for a in te["debug_annotations"].as_array().into_iter().flatten() {
                                let k = st.anames[&a["name_iid"].as_u64().unwrap()].clone();
                                let v = if let Some(i) = a["string_value_iid"].as_u64() {
                                    json!(st.svals[&i])
                                } else if let Some(x) = a.get("uint_value") {
                                    x.clone()
                                } else if let Some(x) = a.get("bool_value") {
                                    x.clone()
                                } else {
                                    a["double_value"].clone()
                                };
                                if k == "details" {
                                    // An op's description: a JSON object
                                    // of the args it stands for.
                                    let o: Value = serde_json::from_str(v.as_str().unwrap())
                                        .expect("details are a JSON object");
                                    for (k, v) in o.as_object().unwrap() {
                                        assert!(args.insert(k.clone(), v.clone()).is_none());
                                    }
                                    continue;
                                }
                                assert!(args.insert(k, v).is_none());
                            }
                            // Flows out of an op held back start on its BEGIN.
                            for id in te["flow_ids_old"].as_array().into_iter().flatten() {
                                let f = (track.clone(), ts, id.as_u64().unwrap());
                                seen.flow_sources.push(f.clone());
                                seen.begin_flow_sources.push(f);
                            }
                            for id in te["terminating_flow_ids_old"]
                                .as_array()
                                .into_iter()
                                .flatten()
                            {
                                seen.flow_ends
                                    .push((track.clone(), ts, id.as_u64().unwrap()));
                            }
                            let st = open.entry(uuid).or_default();
                            // Slices on one track never nest: one open at a time.
                            assert!(st.is_empty(), "overlap on {track} at {ts}");
                            st.push((name.unwrap(), cat, ts, args));
                        }
                        "TYPE_SLICE_END" => {
                            let (n, c, t0, args) =
                                open.get_mut(&uuid).unwrap().pop().expect("begun");
                            assert!(ts >= t0);
                            seen.slices.push((track.clone(), n, c, t0, ts, args));
                        }
                        "TYPE_INSTANT" => {
                            let ids = te["flow_ids_old"].as_array().unwrap();
                            seen.flow_sources
                                .push((track.clone(), ts, ids[0].as_u64().unwrap()));
                        }
                        "TYPE_COUNTER" => {
                            assert!(counter);
                            seen.counters.push((
                                track,
                                ts,
                                te["double_counter_value"].as_f64().unwrap(),
                            ));
                        }
                        other => panic!("event type {other}"),
                    }
                }
            }
            assert!(open.values().all(Vec::is_empty), "unterminated slices");
            seen
        }

        /// The JSON timeline as the same tuples.
        fn from_json(v: &Value) -> Seen {
            let evs = v["traceEvents"].as_array().unwrap();
            let mut procs = BTreeMap::new();
            let mut threads = BTreeMap::new();
            for e in evs.iter().filter(|e| e["ph"] == "M") {
                let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                match e["name"].as_str().unwrap() {
                    "process_name" => {
                        procs.insert(pid, e["args"]["name"].as_str().unwrap().to_string());
                    }
                    "thread_name" => {
                        threads.insert((pid, tid), e["args"]["name"].as_str().unwrap().to_string());
                    }
                    _ => {}
                }
            }
            let track = |e: &Value| {
                let pid = e["pid"].as_u64().unwrap();
                format!(
                    "{}/{}",
                    procs[&pid],
                    threads[&(pid, e["tid"].as_u64().unwrap())]
                )
            };
            let ns = |x: &Value| (x.as_f64().unwrap() * 1000.0).round() as u64;
            let mut seen = Seen {
                processes: procs.values().cloned().collect(),
                ..Default::default()
            };
            for e in evs {
                match e["ph"].as_str().unwrap() {
                    "X" => {
                        let t0 = ns(&e["ts"]);
                        let args: BTreeMap<String, Value> = e["args"]
                            .as_object()
                            .unwrap()
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        seen.slices.push((
                            track(e),
                            e["name"].as_str().unwrap().into(),
                            e["cat"].as_str().unwrap().into(),
                            t0,
                            t0 + ns(&e["dur"]),
                            args,
                        ));
                    }
                    "C" => {
                        let pid = e["pid"].as_u64().unwrap();
                        seen.counters.push((
                            format!("{}/{}", procs[&pid], e["name"].as_str().unwrap()),
                            ns(&e["ts"]),
                            e["args"]["value"].as_f64().unwrap(),
                        ));
                    }
                    "s" => {
                        seen.flow_sources
                            .push((track(e), ns(&e["ts"]), e["id"].as_u64().unwrap()))
                    }
                    "f" => seen
                        .flow_ends
                        .push((track(e), ns(&e["ts"]), e["id"].as_u64().unwrap())),
                    _ => {}
                }
            }
            seen
        }

        /// Counters equal up to JSON's float parsing (serde_json may be
        /// one ulp off without its float_roundtrip feature).
        fn same_counters(a: &[(String, u64, f64)], b: &[(String, u64, f64)]) {
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(b) {
                assert_eq!((&x.0, x.1), (&y.0, y.1));
                assert!(
                    (x.2 - y.2).abs() <= 1e-12 * x.2.abs().max(1.0),
                    "{x:?} vs {y:?}"
                );
            }
        }

        fn both(bytes: &[u8]) -> (Seen, Seen, Info) {
            both_with(bytes, Options::default())
        }

        fn both_with(bytes: &[u8], opts: Options) -> (Seen, Seen, Info) {
            let (_d, p) = testutil::write_temp(bytes);
            let mut pb = Vec::new();
            let hidden = Progress::hidden();
            let f = Filter::default();
            let input = Input::Path(p);
            let info = write_with(&input, &f, Format::Perfetto, &opts, &hidden, &mut pb).unwrap();
            assert_eq!(info.bytes, pb.len() as u64);
            let mut js = Vec::new();
            write_with(&input, &f, Format::Json, &opts, &hidden, &mut js).unwrap();
            let js: Value = serde_json::from_slice(&js).unwrap();
            (interpret(&decode(&pb)), from_json(&js), info)
        }

        #[test]
        fn perfetto_trace_decodes_and_holds_what_the_json_holds() {
            let (pb, _, _) = same_content(&testutil::sample_trace(), Options::default());
            assert_eq!(pb.flow_sources.len(), 3);
        }

        #[test]
        fn critical_marks_and_channel_counters_are_the_jsons_too() {
            // Every op of critical_ops has a PE, HBM channels as counters.
            let opts = Options {
                channels: Channels::Counters,
                critical_path: true,
            };
            let (pb, _, info) = same_content(&testutil::critical_trace(), opts);
            let marked = pb
                .slices
                .iter()
                .filter(|s| s.5.get("critical") == Some(&json!(true)))
                .count() as u64;
            assert_eq!(marked, info.critical_ops);
            assert_eq!(marked, 9);
            let (_, _, info) = same_content(
                &testutil::channel_trace(),
                Options {
                    critical_path: false,
                    ..opts
                },
            );
            assert!(info.counter_tracks >= 2);
        }

        /// The protobuf holds the JSON's slices, args, counters and flows
        /// (dependencies' and critical paths').
        fn same_content(bytes: &[u8], opts: Options) -> (Seen, Seen, Info) {
            let (pb, js, info) = both_with(bytes, opts);
            assert_eq!(pb.processes, js.processes);
            let sorted = |mut v: Vec<Slice>| {
                v.sort_by(|a, b| (&a.0, a.3, &a.1).cmp(&(&b.0, b.3, &b.1)));
                v
            };
            let (ps, jsl) = (sorted(pb.slices.clone()), sorted(js.slices.clone()));
            assert_eq!(ps.len(), jsl.len());
            assert_eq!(ps.len() as u64, info.events + info.launches + info.kernels);
            for (a, b) in ps.iter().zip(&jsl) {
                assert_eq!((&a.0, &a.1, &a.2, a.3, a.4), (&b.0, &b.1, &b.2, b.3, b.4));
                // Every protobuf arg is the JSON's (the JSON has a few more:
                // exact times, the component, the fingerprint).
                let mut want: BTreeSet<&String> = b.5.keys().collect();
                for k in ["start_ns", "end_ns", "component", "fingerprint"] {
                    want.remove(&k.to_string());
                }
                assert_eq!(a.5.keys().collect::<BTreeSet<_>>(), want, "{}", a.1);
                for (k, v) in &a.5 {
                    let want = &b.5[k];
                    assert!(
                        v == want || v.as_f64() == want.as_f64(),
                        "{} {k}: {v} vs {want}",
                        a.1
                    );
                }
                if a.2 == "memory" || a.2 == "gemm" {
                    assert!(
                        a.5.contains_key("shape") && a.5.contains_key("op_id"),
                        "{a:?}"
                    );
                }
            }
            same_counters(&pb.counters, &js.counters);
            assert!(!pb.counters.is_empty());
            assert_eq!(pb.flow_ends, js.flow_ends);
            assert_eq!(
                pb.flow_sources.len() as u64,
                info.flows + info.critical_flows
            );
            // Protobuf flows start on the producer's slice (or an instant
            // on its track at its start), written when the producer is:
            // by id they are the JSON's.
            let mut pbs = pb.flow_sources.clone();
            pbs.sort_by_key(|f| f.2);
            assert_eq!(pbs, js.flow_sources);
            let src: Vec<(String, u64)> = pbs.iter().map(|f| (f.0.clone(), f.1)).collect();
            let jsrc: Vec<(String, u64)> =
                js.flow_sources.iter().map(|f| (f.0.clone(), f.1)).collect();
            assert_eq!(src, jsrc);
            (pb, js, info)
        }

        #[test]
        fn op_slices_out_of_time_order_get_absolute_timestamps() {
            // The timeline keeps each track's slices in time order; were
            // one earlier than its track's last, it is written with an
            // absolute BOOTTIME timestamp and the deltas go on.
            let mut pb = Vec::new();
            let mut w = PerfettoWriter::new(&mut pb);
            w.process(proc_uuid(1), 1, "p").unwrap();
            w.track(5, proc_uuid(1), "t", None).unwrap();
            for (t0, t1, name) in [
                (1000, 1500, "a"),
                (1600, 1600, "b"),
                (200, 300, "c"),
                (2000, 2600, "d"),
            ] {
                let args = [("op_id", Val::U(t0)), ("shape", Val::S("1x2"))];
                w.op_slice(5, t0, t1, name, "memory", &args, &[]).unwrap();
            }
            w.flush().unwrap();
            drop(w);
            let packets = decode(&pb);
            let absolute = packets
                .iter()
                .filter(|p| p.get("timestamp_clock_id").is_some())
                .count();
            assert_eq!(absolute, 2, "c's begin and end");
            let seen = interpret(&packets);
            let got: Vec<(&str, u64, u64, &Value)> = seen
                .slices
                .iter()
                .map(|s| (s.1.as_str(), s.3, s.4, &s.5["op_id"]))
                .collect();
            assert_eq!(
                got,
                [
                    ("a", 1000, 1500, &json!(1000)),
                    ("b", 1600, 1600, &json!(1600)),
                    ("c", 200, 300, &json!(200)),
                    ("d", 2000, 2600, &json!(2000)),
                ]
            );
        }

        #[test]
        fn large_traces_decode_too() {
            let mut ops = Vec::new();
            for i in 0..3000u64 {
                let c = if i % 3 == 0 {
                    testutil::PE_DMA
                } else {
                    "sip0.cube0.pe1.pe_dma"
                };
                ops.push(mem(i, i * 700, i * 700 + 1500, c, "dma_read", 64 + i));
            }
            let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
            let (pb, js, info) = both(&bytes);
            assert_eq!(info.events, 3000);
            assert_eq!(pb.slices.len(), js.slices.len());
            same_counters(&pb.counters, &js.counters);
            assert_eq!(pb.flow_ends.len() as u64, info.flows);
            assert_eq!(pb.flow_sources.len() as u64, info.flows);
        }

        #[test]
        fn flows_out_of_slices_already_written_get_an_instant() {
            // Op slices are held back for DEFER later ones: a flow out of a
            // held one goes on its BEGIN; out of one written, on an instant.
            let n = crate::perfetto::DEFER as u64 + 8;
            let mut ops = Vec::new();
            for i in 0..n {
                let mut op = mem(i, i * 700, i * 700 + 500, testutil::PE_DMA, "dma_read", 64);
                op.rec.deps.clear();
                ops.push(op);
            }
            let mut last = mem(
                n,
                n * 700,
                n * 700 + 500,
                "sip0.cube0.pe1.pe_dma",
                "dma_read",
                64,
            );
            last.rec.deps = vec![kb_format::Dep::data(0), kb_format::Dep::data(n - 1)];
            ops.push(last);
            let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
            let (_d, p) = testutil::write_temp(&bytes);
            let mut pbytes = Vec::new();
            let info = write(
                &Input::Path(p),
                &Filter::default(),
                Format::Perfetto,
                &mut pbytes,
            )
            .unwrap();
            assert_eq!(info.flows, 2);
            let packets = decode(&pbytes);
            let instants: Vec<&Value> = packets
                .iter()
                .filter(|p| p["track_event"]["type"] == "TYPE_INSTANT")
                .collect();
            assert_eq!(instants.len(), 1, "op 0 was written before op {n}");
            assert_eq!(instants[0]["timestamp"], 0);
            let seen = interpret(&packets);
            assert_eq!(seen.begin_flow_sources.len(), 1);
            assert_eq!(seen.begin_flow_sources[0].1, ((n - 1) * 700 + 500) / 1000);
            let mut ids: Vec<u64> = seen.flow_sources.iter().map(|f| f.2).collect();
            ids.sort_unstable();
            assert_eq!(ids, [1, 2]);
            assert_eq!(seen.flow_ends.len(), 2);
        }
    }
}
