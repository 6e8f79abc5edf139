//! `stats --by component|op_name|op_kind|route|channel|unit [--name GLOB]
//! [--launch N]`: per group, the op count, busy and held time, utilisation
//! over the kernel window, bytes moved, FLOPs, achieved bandwidth and
//! FLOP rate.
//!
//! Definitions (`kb_format::usage`, the same as `kb-sim sweep`'s):
//! - **window**: the kernel window, from the first launch's start to the
//!   last launch's end (`--launch N`: launch N's, by its index in
//!   `summary`'s list); a trace without launches: the whole run, and the
//!   output says so. Only records that overlap the window are counted
//!   (an empty record: one that lies in it), and their times are
//!   clipped to it.
//! - **busy time**: the time the group computes or transfers, the length
//!   of the union of its records' active intervals (`Record::active`, the
//!   whole span where a record has none), so overlapping ops (pipelined
//!   DMA) count once; **held time**: the time it holds work, the union of
//!   its op spans `[t_start, t_end)` (operand streaming, setup, waiting
//!   for a producer included); **op time**: the plain sum of durations.
//! - **utilisation** = busy / (units x window length), **held
//!   utilisation** = held / (units x window length); a group is one unit,
//!   except `--by unit`: a unit kind (`pe_dma`, `pe_gemm`, `hbm_ctrl`:
//!   the component name less its `sipN.cubeN.peN.` coordinates), whose
//!   units are counted in the trace's topology (`Meta.topology.resolved`:
//!   its counts, per PE, cube or SIP by where the kind's components
//!   live), idle ones included; no utilisation when the topology has no
//!   counts.
//! - **run time**: the simulated time, the run's end as the trace's footer
//!   records it (kb-sim's own figure: at least the end of the last op,
//!   past it by the frees and unmaps that follow; time starts at 0).
//! - **bytes** and **FLOPs**: see [`crate::render`] (memory ops: write
//!   extent bytes; gemm `2*m*n*k`; math `rows*cols`).
//! - **bandwidth** = bytes / busy time (GB/s = bytes per ns), **FLOP rate**
//!   = FLOPs / busy time (GFLOP/s).
//! - **route** ([`crate::render::route`]): a memory op's `SRC -> DST`, the
//!   memories of the first range of its read and of its write effect
//!   (`sipS.cubeC.peP.tcm`, `sipS.cubeC.sram`, `sipS.cubeC.hbm`, `host`;
//!   `?` without one). Only memory ops have a route: `--by route` leaves
//!   gemm, math and unknown-kind records out of its rows.
//! - **channel**: one row per HBM pseudo channel (`sipS.cubeC.chN`), from
//!   the trace's channels chunk (kb-sim's HBM controllers' own account,
//!   not the records): count = busy intervals, busy time = when it was
//!   serving within the window (back-to-back service merged; the access
//!   latency is not busy; held = busy), op time = serving over the run,
//!   bytes = read + written over the run, GB/s = bytes / op time.
//!   Channels that served nothing have no row.
//!   No record is counted; `--name` does not apply.
//! - **`--name GLOB`** (repeatable): only ops whose name matches one of the
//!   globs are counted, in every `--by` mode; the same matching as `ops
//!   --name` (a name without glob characters matches exactly).
//!
//! Rows are sorted by key in natural order (`pe2` before `pe10`). The
//! result also says how many records the trace holds and how many were
//! counted in the rows.
//!
//! One pass, memory bounded by the number of groups (string ids, op kinds
//! or distinct routes: a route is keyed by a small `Copy` value and named
//! only once per group, at the end) and the ops in flight, so it runs over
//! files of any length. Standard input is the exception: its launches
//! come after its records, so the records (a few numbers each) wait until
//! the window is known, and memory grows with them.

use std::io::Write;

use std::collections::HashMap;

use kb_format::usage::{self, UnitTime};
use kb_format::{OpKind, Ps, Record, Strings};
use serde_json::{Value, json};

use crate::ops::{Filter, Matcher};
use crate::render::{self, Route, csv, kind_name, natural_cmp, ns};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Result, out_err};

/// What to group records by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    #[default]
    Component,
    OpName,
    OpKind,
    /// Memory ops by route (`SRC -> DST`); other kinds are left out.
    Route,
    /// HBM pseudo channels, from the trace's channels chunk (no records).
    Channel,
    /// Unit kinds (`pe_dma`, `pe_gemm`, ...: a component name less its
    /// `sipN.cubeN.peN.` coordinates), utilisation over the kind's units
    /// in the trace's topology.
    Unit,
}

/// Running totals of one group.
#[derive(Debug, Clone)]
pub struct Acc {
    pub count: u64,
    pub op_time: Ps,
    pub bytes: u64,
    pub flops: u64,
    /// Busy (active) and held (span) time, clipped to the window.
    time: UnitTime,
}

impl Acc {
    fn new(window: Option<(Ps, Ps)>) -> Acc {
        Acc {
            count: 0,
            op_time: 0,
            bytes: 0,
            flops: 0,
            time: window.map_or_else(UnitTime::deferred, UnitTime::new),
        }
    }

    /// Add an op; ops must come in t_start order.
    fn add(&mut self, t0: Ps, t1: Ps, active: (Ps, Ps), bytes: u64, flops: u64) {
        self.count += 1;
        let t1 = t1.max(t0);
        self.op_time = self.op_time.saturating_add(t1 - t0);
        self.bytes = self.bytes.saturating_add(bytes);
        self.flops = self.flops.saturating_add(flops);
        self.time.add_span(t0, t1, active);
    }
}

/// One row of the result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: String,
    pub count: u64,
    /// Active time (computing or transferring) in the window.
    pub busy: Ps,
    /// Held time (op spans, waiting included) in the window.
    pub held: Ps,
    pub op_time: Ps,
    pub bytes: u64,
    pub flops: u64,
    /// Units in the group: 1, or by unit the units of that kind in the
    /// topology (`None`: not known).
    pub units: Option<u64>,
    /// busy / (units x window); `None` when the window is empty or the
    /// units unknown.
    pub utilisation: Option<f64>,
    /// held / (units x window).
    pub held_utilisation: Option<f64>,
    /// bytes per ns (= GB/s); `None` when busy time is 0.
    pub gbps: Option<f64>,
    /// FLOPs per ns (= GFLOP/s); `None` when busy time is 0.
    pub gflops: Option<f64>,
}

/// The window utilisation is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// First launch start to last launch end, of all `launches`.
    Kernels { launches: usize },
    /// Launch `index` alone.
    Launch { index: usize },
    /// The trace has no launches: the whole run.
    Run,
    /// `--from`/`--to` (within launch `launch`'s window if given).
    Range { launch: Option<usize> },
}

/// Which window `stats` counts over: launch N's (or all launches'), cut
/// to `[from, to)` when given (ps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowArgs {
    pub launch: Option<usize>,
    pub from: Option<Ps>,
    pub to: Option<Ps>,
}

/// Launch `index`'s window `[t_start, t_end]` in ps, from a trace file
/// (`--launch` of `ops`, `timeline`, `export`: a stream's launches come
/// after its records, too late to filter them).
pub fn launch_window(input: &Input, index: usize) -> Result<(Ps, Ps)> {
    let Input::Path(path) = input else {
        return Err(crate::Error::usage(
            "--launch needs a trace file: a stream's launches come after its records",
        ));
    };
    let m = kb_format::MmapTrace::open(path).map_err(|source| crate::Error::Trace {
        input: path.display().to_string(),
        source,
    })?;
    let l = launch_at(m.launches(), index)
        .map_err(|e| crate::Error::usage(format!("{}: {e}", path.display())))?;
    Ok((l.t_start, l.t_end.max(l.t_start)))
}

/// The result of `stats`.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub by: GroupBy,
    pub run_time: Ps,
    /// What the window is, and its bounds `[start, end)` in ps.
    pub window_kind: Window,
    pub window: (Ps, Ps),
    /// Records in the trace.
    pub records: u64,
    /// Records counted in the rows: those in the window the name filter
    /// kept and, by route, only memory ops.
    pub counted: u64,
    /// The `--name` globs (empty: no filter).
    pub names: Vec<String>,
    pub rows: Vec<Row>,
}

/// A record of a stream kept until the window is known.
#[derive(Debug, Clone, Copy)]
struct Pending {
    key: usize,
    t_start: Ps,
    t_end: Ps,
    active: (Ps, Ps),
    bytes: u64,
    flops: u64,
}

/// Accumulates per-group totals in one pass; usable by other commands.
#[derive(Debug, Default)]
pub struct Collector {
    pub by: GroupBy,
    /// Totals by group index: a string id, a kind code, (by route) the
    /// index of the route in `routes` or (by unit) of the kind in `kinds`.
    groups: Vec<Option<Acc>>,
    /// By route: the route of each group, and the group of each route.
    routes: Vec<Route>,
    route_ids: HashMap<Route, usize>,
    /// By unit: the unit kinds with their level (0 host, 1 per SIP, 2 per
    /// cube, 3 per PE: the `sipN.`/`cubeN.`/`peN.` prefixes of their
    /// components' names), and each component string id's kind.
    kinds: Vec<(String, usize)>,
    kind_of: Vec<Option<usize>>,
    /// The `--name` globs, compiled (glob results cached per string id).
    names: Vec<String>,
    matcher: Option<Matcher>,
    /// `--launch N`.
    launch: Option<usize>,
    /// `--from`/`--to` (ps).
    range: (Option<Ps>, Option<Ps>),
    /// The window, once known (a file's launches come before its records;
    /// a stream's at the end, so its records wait in `pending`).
    window: Option<(Ps, Ps)>,
    window_kind: Option<Window>,
    pending: Vec<Pending>,
    run_time: Ps,
    records: u64,
    counted: u64,
    pub result: Option<Stats>,
}

impl Collector {
    /// A collector over the whole run (records given to [`Self::add`]).
    pub fn new(by: GroupBy) -> Collector {
        Collector {
            by,
            ..Default::default()
        }
    }

    /// A collector that counts only ops whose name matches one of `names`
    /// (globs, as `ops --name`); no names: every op. Errors on a bad glob.
    pub fn with_names(by: GroupBy, names: &[String]) -> Result<Collector> {
        if by == GroupBy::Channel && !names.is_empty() {
            return Err(crate::Error::usage(
                "--name selects ops, and --by channel counts HBM channel service, not ops",
            ));
        }
        let matcher = if names.is_empty() {
            None
        } else {
            Some(Matcher::new(&Filter {
                names: names.to_vec(),
                ..Default::default()
            })?)
        };
        Ok(Collector {
            by,
            names: names.to_vec(),
            matcher,
            ..Default::default()
        })
    }

    /// Restrict the window to launch `index` (`--launch`).
    pub fn with_launch(mut self, index: Option<usize>) -> Collector {
        self.launch = index;
        self
    }

    /// Restrict the window as `w` says (`--launch`, `--from`, `--to`).
    pub fn with_window(mut self, w: WindowArgs) -> Collector {
        self.launch = w.launch;
        self.range = (w.from, w.to);
        self
    }

    /// Add a record, unfiltered, over the whole run (the name filter and
    /// the window need the trace: the [`Visitor`] applies them). Records
    /// must come in t_start order.
    pub fn add(&mut self, r: &Record) {
        if self.window.is_none() {
            self.window = Some((0, Ps::MAX));
            self.window_kind = Some(Window::Run);
        }
        self.see(r);
        if let Some(key) = self.key(r, None) {
            self.tally(key, r);
        }
    }

    /// Note a record of the run, counted or not.
    fn see(&mut self, r: &Record) {
        self.run_time = self.run_time.max(r.t_end);
        self.records += 1;
    }

    /// The group of a record (by route: memory ops only; by unit: with
    /// the strings, its component's kind).
    fn key(&mut self, r: &Record, strings: Option<&Strings>) -> Option<usize> {
        Some(match self.by {
            GroupBy::Component => r.component as usize,
            GroupBy::OpName => r.op_name as usize,
            GroupBy::OpKind => r.kind.code() as usize,
            GroupBy::Channel => return None,
            GroupBy::Route => {
                let route = render::route(r)?;
                *self.route_ids.entry(route).or_insert_with(|| {
                    self.routes.push(route);
                    self.routes.len() - 1
                })
            }
            // Sync records (kernels, waits, signals, maps) are no unit's
            // work: left out of unit utilisation, as the sweep's.
            GroupBy::Unit if r.kind == OpKind::Sync => return None,
            GroupBy::Unit => {
                let c = r.component as usize;
                if c >= self.kind_of.len() {
                    self.kind_of.resize(c + 1, None);
                }
                match self.kind_of[c] {
                    Some(_) => {}
                    None => {
                        let name = strings?.name(r.component);
                        let kind = usage::unit_kind(&name);
                        let level = name.split('.').count() - kind.split('.').count();
                        let k = match self.kinds.iter().position(|x| x.0 == kind) {
                            Some(k) => k,
                            None => {
                                self.kinds.push((kind.to_string(), level));
                                self.kinds.len() - 1
                            }
                        };
                        self.kind_of[c] = Some(k);
                    }
                }
                // Each unit (component) keeps its own unions: the kind's
                // busy time is their sum (`finish_with`), as sweep's.
                c
            }
        })
    }

    fn tally(&mut self, key: usize, r: &Record) {
        let p = Pending {
            key,
            t_start: r.t_start,
            t_end: r.t_end,
            active: usage::active(r),
            bytes: render::bytes_moved(r),
            flops: render::flops(r),
        };
        match self.window {
            Some(w) => self.count(w, p),
            None => self.pending.push(p),
        }
    }

    /// Count a record in its group if it overlaps the window (an empty
    /// one: if it lies in it).
    fn count(&mut self, (w0, w1): (Ps, Ps), p: Pending) {
        let inside = if p.t_end > p.t_start {
            p.t_start < w1 && p.t_end > w0
        } else {
            (w0..w1).contains(&p.t_start)
        };
        if !inside {
            return;
        }
        if p.key >= self.groups.len() {
            self.groups.resize(p.key + 1, None);
        }
        self.groups[p.key]
            .get_or_insert_with(|| Acc::new(Some((w0, w1))))
            .add(p.t_start, p.t_end, p.active, p.bytes, p.flops);
        self.counted += 1;
    }

    /// Fix the window from the trace's launches (`--launch`: that one).
    fn set_window(&mut self, launches: &[kb_format::Launch]) -> Result<()> {
        let (window, kind) = match self.launch {
            Some(i) => {
                let l = launch_at(launches, i)?;
                (
                    (l.t_start, l.t_end.max(l.t_start)),
                    Window::Launch { index: i },
                )
            }
            None => match usage::kernel_window(launches) {
                Some(w) => (
                    w,
                    Window::Kernels {
                        launches: launches.len(),
                    },
                ),
                None => ((0, Ps::MAX), Window::Run),
            },
        };
        let (window, kind) = match self.range {
            (None, None) => (window, kind),
            (from, to) => {
                let w0 = from.map_or(window.0, |f| f.max(window.0));
                let w1 = to.map_or(window.1, |t| t.min(window.1));
                (
                    (w0, w1.max(w0)),
                    Window::Range {
                        launch: self.launch,
                    },
                )
            }
        };
        self.window = Some(window);
        self.window_kind = Some(kind);
        for p in std::mem::take(&mut self.pending) {
            self.count(window, p);
        }
        Ok(())
    }

    /// The rows, naming groups with `strings`, sorted by key; `units`
    /// gives the units of a unit kind (by unit).
    pub fn finish(&mut self, strings: &Strings) -> Stats {
        self.finish_with(strings, &|_| None)
    }

    fn finish_with(&mut self, strings: &Strings, units: &dyn Fn(usize) -> Option<u64>) -> Stats {
        let run = self.run_time;
        let kind = self.window_kind.unwrap_or(Window::Run);
        let clip = self.window.unwrap_or((0, Ps::MAX));
        // The run's window ends with the run.
        let window = match kind {
            Window::Run => (0, run),
            Window::Range { .. } if clip.1 == Ps::MAX => (clip.0, run.max(clip.0)),
            _ => clip,
        };
        let rate = |x: u64, busy: Ps| (busy > 0).then(|| x as f64 * 1000.0 / busy as f64);
        // Totals per row: by unit, the sums over the kind's components.
        let mut sums: Vec<(String, Option<u64>, Acc, usage::Totals)> = Vec::new();
        for (k, a) in self.groups.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            let t = a.time.finish(clip);
            let (key, n) = match self.by {
                GroupBy::OpKind => (kind_name(OpKind::from_code(k as u8)), Some(1)),
                GroupBy::Route => (self.routes[k].to_string(), Some(1)),
                GroupBy::Unit => {
                    let Some(Some(kind)) = self.kind_of.get(k).copied() else {
                        continue;
                    };
                    (self.kinds[kind].0.clone(), units(self.kinds[kind].1))
                }
                _ => (strings.name(k as u32).into_owned(), Some(1)),
            };
            match sums.iter_mut().find(|s| s.0 == key) {
                Some(s) => {
                    s.2.count += a.count;
                    s.2.op_time = s.2.op_time.saturating_add(a.op_time);
                    s.2.bytes = s.2.bytes.saturating_add(a.bytes);
                    s.2.flops = s.2.flops.saturating_add(a.flops);
                    s.3.busy = s.3.busy.saturating_add(t.busy);
                    s.3.held = s.3.held.saturating_add(t.held);
                }
                None => sums.push((key, n, a.clone(), t)),
            }
        }
        let mut rows = Vec::new();
        for (key, n, a, t) in sums {
            let util = |x: Ps| n.and_then(|n| usage::utilisation(x, n, window));
            rows.push(Row {
                count: a.count,
                busy: t.busy,
                held: t.held,
                op_time: a.op_time,
                bytes: a.bytes,
                flops: a.flops,
                units: n,
                utilisation: util(t.busy),
                held_utilisation: util(t.held),
                gbps: rate(a.bytes, t.busy),
                gflops: rate(a.flops, t.busy),
                key,
            });
        }
        rows.sort_by(|a, b| natural_cmp(&a.key, &b.key));
        Stats {
            by: self.by,
            run_time: run,
            window_kind: kind,
            window,
            records: self.records,
            counted: self.counted,
            names: self.names.clone(),
            rows,
        }
    }
}

impl Visitor for Collector {
    fn launches(&mut self, launches: &[kb_format::Launch]) -> Result<()> {
        self.set_window(launches)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        self.see(r);
        if self.matcher.as_mut().is_none_or(|m| m.matches(r, s))
            && let Some(key) = self.key(r, Some(s))
        {
            self.tally(key, r);
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        if self.window.is_none() {
            // A stream: its launches come now.
            self.set_window(end.launches)?;
        }
        // The run's end as the trace records it (past the last record: the
        // frees and unmaps after it).
        self.run_time = self.run_time.max(end.footer.counts.max_t_end);
        let topo = Topology::parse(&end.meta.topology.resolved);
        let mut stats = self.finish_with(end.strings, &|level| topo.units(level));
        if self.by == GroupBy::Channel {
            stats.rows = channel_rows(end.channels()?, stats.window);
        }
        self.result = Some(stats);
        Ok(())
    }
}

/// Launch `i` (`--launch i`: its index in `summary`'s list), or an error
/// saying how many launches the trace has.
pub(crate) fn launch_at(launches: &[kb_format::Launch], i: usize) -> Result<&kb_format::Launch> {
    launches.get(i).ok_or_else(|| {
        crate::Error::usage(format!(
            "--launch {i}: the trace has {} launches (kb-inspect summary lists them, from 0)",
            launches.len()
        ))
    })
}

/// The counts of a resolved topology (`Meta.topology.resolved`): enough
/// to count the units of a kind.
#[derive(Debug, Default, serde::Deserialize)]
struct Counts {
    sips: u64,
    cubes_per_sip: u64,
    pes_per_cube: u64,
}

#[derive(Debug, Default)]
struct Topology {
    counts: Option<Counts>,
}

impl Topology {
    fn parse(yaml: &str) -> Topology {
        #[derive(serde::Deserialize)]
        struct Doc {
            counts: Counts,
        }
        Topology {
            counts: serde_yaml_ng::from_str::<Doc>(yaml).ok().map(|d| d.counts),
        }
    }

    /// Units at `level`: 1 for the host (0), one per SIP (1), per cube
    /// (2) or per PE (3); `None` without counts in the topology.
    fn units(&self, level: usize) -> Option<u64> {
        let c = self.counts.as_ref()?;
        Some(match level {
            0 => 1,
            1 => c.sips,
            2 => c.sips * c.cubes_per_sip,
            _ => c.sips * c.cubes_per_sip * c.pes_per_cube,
        })
    }
}

/// One row per HBM pseudo channel (`sipS.cubeC.chN`): busy intervals,
/// busy time within `window` (op time: over the run), bytes read and
/// written over the run, utilisation over `window` and the bandwidth
/// while busy (run bytes over run service).
fn channel_rows(channels: &[kb_format::ChannelUsage], window: (Ps, Ps)) -> Vec<Row> {
    let (w0, w1) = window;
    let mut rows: Vec<Row> = channels
        .iter()
        .map(|c| {
            let busy = c
                .busy
                .iter()
                .map(|&(a, b)| b.min(w1).saturating_sub(a.max(w0)))
                .fold(0, u64::saturating_add);
            let bytes = c.bytes_read.saturating_add(c.bytes_written);
            let util = usage::utilisation(busy, 1, window);
            Row {
                key: format!("sip{}.cube{}.ch{}", c.sip, c.cube, c.channel),
                count: c.busy.len() as u64,
                busy,
                held: busy,
                op_time: c.busy_ps(),
                bytes,
                flops: 0,
                units: Some(1),
                utilisation: util,
                held_utilisation: util,
                // Bytes over the whole run, so over all its service.
                gbps: (c.busy_ps() > 0).then(|| bytes as f64 * 1000.0 / c.busy_ps() as f64),
                gflops: None,
            }
        })
        .collect();
    rows.sort_by(|a, b| natural_cmp(&a.key, &b.key));
    rows
}

/// Compute statistics over `input`.
pub fn compute(input: &Input, by: GroupBy) -> Result<Stats> {
    compute_named(input, by, &[])
}

/// Compute statistics over the ops of `input` whose name matches one of
/// `names` (globs; none: every op).
pub fn compute_named(input: &Input, by: GroupBy, names: &[String]) -> Result<Stats> {
    compute_in(input, by, names, None)
}

/// Compute statistics as [`compute_named`], over launch `launch`'s window
/// alone when given (its index in `summary`'s list).
pub fn compute_in(
    input: &Input,
    by: GroupBy,
    names: &[String],
    launch: Option<usize>,
) -> Result<Stats> {
    compute_window(
        input,
        by,
        names,
        WindowArgs {
            launch,
            ..WindowArgs::default()
        },
    )
}

/// [`compute_in`] over the window `w` gives.
pub fn compute_window(
    input: &Input,
    by: GroupBy,
    names: &[String],
    w: WindowArgs,
) -> Result<Stats> {
    let mut c = Collector::with_names(by, names)?.with_window(w);
    source::visit(input, &mut c)?;
    Ok(c.result.expect("end sets the result"))
}

/// Output format of `stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Csv,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

impl Stats {
    fn by_name(&self) -> &'static str {
        match self.by {
            GroupBy::Component => "component",
            GroupBy::OpName => "op_name",
            GroupBy::OpKind => "op_kind",
            GroupBy::Route => "route",
            GroupBy::Channel => "channel",
            GroupBy::Unit => "unit",
        }
    }

    /// The window, in words.
    fn window_words(&self) -> String {
        let (w0, w1) = self.window;
        match self.window_kind {
            Window::Kernels { launches } => format!(
                "kernel window {}..{} ns ({launches} launch{})",
                ns(w0),
                ns(w1),
                if launches == 1 { "" } else { "es" }
            ),
            Window::Launch { index } => {
                format!("launch {index} window {}..{} ns", ns(w0), ns(w1))
            }
            Window::Run => "no launches: utilisation over the whole run".into(),
            Window::Range { launch } => format!(
                "window {}..{} ns (--from/--to{})",
                ns(w0),
                ns(w1),
                launch.map_or(String::new(), |i| format!(" within launch {i}"))
            ),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "by": self.by_name(),
            "names": self.names,
            "run_time_ps": self.run_time,
            "window": match self.window_kind {
                Window::Kernels { .. } => "kernels",
                Window::Launch { .. } => "launch",
                Window::Run => "run",
                Window::Range { .. } => "range",
            },
            "launch": match self.window_kind {
                Window::Launch { index } | Window::Range { launch: Some(index) } => Some(index),
                _ => None,
            },
            "window_start_ps": self.window.0,
            "window_end_ps": self.window.1,
            "records": self.records,
            "counted": self.counted,
            "groups": self.rows.iter().map(|r| json!({
                "key": r.key,
                "count": r.count,
                "busy_ps": r.busy,
                "held_ps": r.held,
                "op_time_ps": r.op_time,
                "units": r.units,
                "utilisation": r.utilisation,
                "held_utilisation": r.held_utilisation,
                "bytes": r.bytes,
                "flops": r.flops,
                "bandwidth_gbps": r.gbps,
                "gflops": r.gflops,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn write(&self, format: Format, w: &mut dyn Write) -> std::io::Result<()> {
        match format {
            Format::Json => {
                serde_json::to_writer_pretty(&mut *w, &self.to_json())
                    .map_err(std::io::Error::other)?;
                writeln!(w)
            }
            Format::Csv => {
                writeln!(
                    w,
                    "{},count,busy_ns,held_ns,op_time_ns,utilisation,held_utilisation,bytes,flops,bandwidth_gbps,gflops",
                    self.by_name()
                )?;
                for r in &self.rows {
                    writeln!(
                        w,
                        "{},{},{},{},{},{},{},{},{},{},{}",
                        csv(&r.key),
                        r.count,
                        ns(r.busy),
                        ns(r.held),
                        ns(r.op_time),
                        r.utilisation.map_or(String::new(), |u| u.to_string()),
                        r.held_utilisation.map_or(String::new(), |u| u.to_string()),
                        r.bytes,
                        r.flops,
                        r.gbps.map_or(String::new(), |u| u.to_string()),
                        r.gflops.map_or(String::new(), |u| u.to_string()),
                    )?;
                }
                Ok(())
            }
            Format::Table => {
                write!(
                    w,
                    "run time {} ns, {}, {} records, by {}",
                    ns(self.run_time),
                    self.window_words(),
                    self.records,
                    self.by_name()
                )?;
                if !self.names.is_empty() {
                    write!(w, ", name {}", self.names.join("|"))?;
                }
                if self.by == GroupBy::Channel {
                    write!(
                        w,
                        ": HBM pseudo channels, count = busy intervals, bytes read + written"
                    )?;
                    if self.rows.is_empty() {
                        write!(w, " (none: the trace has no channels chunk)")?;
                    }
                } else if self.counted != self.records {
                    let what = if self.by == GroupBy::Route {
                        " (memory ops)"
                    } else {
                        ""
                    };
                    write!(w, ": {} counted{what}", self.counted)?;
                }
                writeln!(w)?;
                let width = self
                    .rows
                    .iter()
                    .map(|r| r.key.len())
                    .max()
                    .unwrap_or(0)
                    .max(self.by_name().len());
                writeln!(
                    w,
                    "{:width$}  {:>10}  {:>14}  {:>14}  {:>14}  {:>7}  {:>7}  {:>14}  {:>14}  {:>10}  {:>10}",
                    self.by_name(),
                    "count",
                    "busy_ns",
                    "held_ns",
                    "op_time_ns",
                    "util%",
                    "held%",
                    "bytes",
                    "flops",
                    "GB/s",
                    "GFLOP/s"
                )?;
                for r in &self.rows {
                    writeln!(
                        w,
                        "{:width$}  {:>10}  {:>14}  {:>14}  {:>14}  {:>7}  {:>7}  {:>14}  {:>14}  {:>10}  {:>10}",
                        r.key,
                        r.count,
                        ns(r.busy),
                        ns(r.held),
                        ns(r.op_time),
                        opt(r.utilisation.map(|u| u * 100.0), 2),
                        opt(r.held_utilisation.map(|u| u * 100.0), 2),
                        r.bytes,
                        r.flops,
                        opt(r.gbps, 3),
                        opt(r.gflops, 3),
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Run `stats` over the ops named by `names` (globs; none: every op) and
/// print it.
pub fn run(
    input: &Input,
    by: GroupBy,
    names: &[String],
    window: WindowArgs,
    format: Format,
    w: &mut dyn Write,
) -> Result<Stats> {
    let s = compute_window(input, by, names, window)?;
    s.write(format, w).map_err(out_err)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    fn stats(by: GroupBy) -> Stats {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        compute(&Input::Path(p), by).unwrap()
    }

    #[test]
    fn busy_time_is_the_union_of_intervals() {
        let mut a = Acc::new(Some((0, Ps::MAX)));
        a.add(0, 10, (0, 10), 0, 0);
        a.add(5, 20, (5, 20), 0, 0); // overlaps: [0, 20)
        a.add(20, 25, (20, 25), 0, 0); // touches: [0, 25)
        a.add(30, 31, (30, 31), 0, 0); // gap
        a.add(30, 30, (30, 30), 0, 0); // empty
        assert_eq!(a.time.finish((0, Ps::MAX)).busy, 26);
        assert_eq!(a.op_time, 10 + 15 + 5 + 1);
        assert_eq!(a.count, 5);
    }

    #[test]
    fn per_component_numbers_match_a_hand_computation() {
        // testutil::sample_ops; kernel window [0, 7000) from the two
        // launches [0, 5000) and [6000, 7000).
        let s = stats(GroupBy::Component);
        assert_eq!(s.run_time, 10_000);
        assert_eq!(s.window, (0, 7000));
        assert_eq!(s.window_kind, Window::Kernels { launches: 2 });
        // The d2h op [7000, 10000) lies past the window.
        assert_eq!((s.records, s.counted), (7, 6));
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "host",
                "sip0.cube0.pe0.gemm",
                "sip0.cube0.pe0.pe_dma",
                "sip0.cube1.pe0.vec",
            ]
        );
        // pe_dma: spans [1000,3000) [2000,4000) [5000,6000): held 3000 +
        // 1000; active [2500,3000) [2000,2400) and all of [5000,6000):
        // busy 500 + 400 + 1000.
        let dma = &s.rows[2];
        assert_eq!(dma.count, 3);
        assert_eq!((dma.busy, dma.held), (1900, 4000));
        assert_eq!(dma.op_time, 5000);
        assert_eq!(dma.bytes, 224);
        assert_eq!(dma.flops, 0);
        assert_eq!(dma.units, Some(1));
        assert_eq!(dma.utilisation, Some(1900.0 / 7000.0));
        assert_eq!(dma.held_utilisation, Some(4000.0 / 7000.0));
        assert_eq!(dma.gbps, Some(224.0 * 1000.0 / 1900.0)); // 224 B / 1.9 ns
        // gemm: [4000,6000) held, active [5500,6000).
        let gemm = &s.rows[1];
        assert_eq!((gemm.busy, gemm.held, gemm.flops), (500, 2000, 48));
        assert_eq!(gemm.gflops, Some(96.0)); // 48 FLOP / 0.5 ns
        assert_eq!(gemm.utilisation, Some(500.0 / 7000.0));
        // The host's upload: no active interval, all of it busy.
        let host = &s.rows[0];
        assert_eq!((host.busy, host.held), (1000, 1000));
    }

    #[test]
    fn from_and_to_cut_the_window() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let at = |launch, from, to| {
            let w = WindowArgs { launch, from, to };
            compute_window(&Input::Path(p.clone()), GroupBy::Component, &[], w).unwrap()
        };
        // Within launch 0 ([0, 5000)) from 2500: pe_dma's ops [1000, 3000)
        // and [2000, 4000) hold [2500, 4000); of their active [2000, 2400)
        // and [2500, 3000) only the second is in.
        let s = at(Some(0), Some(2500), None);
        assert_eq!(
            (s.window, s.window_kind),
            ((2500, 5000), Window::Range { launch: Some(0) })
        );
        let dma = s.rows.iter().find(|r| r.key.ends_with("pe_dma")).unwrap();
        assert_eq!((dma.busy, dma.held), (500, 1500));
        assert_eq!(dma.utilisation, Some(500.0 / 2500.0));
        // Over the kernel window, [2500, 3000): both ops hold all of it.
        let s = at(None, Some(2500), Some(3000));
        assert_eq!(s.window, (2500, 3000));
        let dma = s.rows.iter().find(|r| r.key.ends_with("pe_dma")).unwrap();
        assert_eq!((dma.busy, dma.held, dma.utilisation), (500, 500, Some(1.0)));
        let mut out = Vec::new();
        s.write(Format::Table, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("window 2.500..3.000 ns (--from/--to)"),
            "{text}"
        );
    }

    #[test]
    fn a_launch_window_counts_only_what_overlaps_it_clipped() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        // Launch 0: [0, 5000). pe_dma's ops 1 and 2 count; op 4 [5000,
        // 6000) does not. The gemm [4000,6000) is clipped to [4000,5000):
        // held 1000, its active [5500,6000) outside: busy 0.
        let s = compute_in(&Input::Path(p.clone()), GroupBy::Component, &[], Some(0)).unwrap();
        assert_eq!(
            (s.window, s.window_kind),
            ((0, 5000), Window::Launch { index: 0 })
        );
        let row = |k: &str| s.rows.iter().find(|r| r.key.ends_with(k)).unwrap();
        let dma = row("pe_dma");
        assert_eq!(
            (dma.count, dma.busy, dma.held, dma.bytes),
            (2, 900, 3000, 192)
        );
        assert_eq!(dma.utilisation, Some(900.0 / 5000.0));
        let gemm = row("gemm");
        assert_eq!((gemm.count, gemm.busy, gemm.held), (1, 0, 1000));
        assert_eq!((gemm.utilisation, gemm.gflops), (Some(0.0), None));
        assert!(s.rows.iter().all(|r| !r.key.ends_with("vec")));
        // Launch 1: [6000, 7000): only the exp.
        let s = compute_in(&Input::Path(p.clone()), GroupBy::Component, &[], Some(1)).unwrap();
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["sip0.cube1.pe0.vec"]);
        assert_eq!(s.rows[0].utilisation, Some(1.0));
        // A launch the trace does not have.
        let e = compute_in(&Input::Path(p), GroupBy::Component, &[], Some(2)).unwrap_err();
        assert!(
            e.to_string()
                .contains("--launch 2: the trace has 2 launches"),
            "{e}"
        );
        // Standard input gets its launches at the end: the same numbers.
        let mut c = Collector::with_names(GroupBy::Component, &[])
            .unwrap()
            .with_launch(Some(0));
        source::visit_reader("-", &bytes[..], &mut c).unwrap();
        let d = c.result.unwrap();
        let dma = d.rows.iter().find(|r| r.key.ends_with("pe_dma")).unwrap();
        assert_eq!((dma.count, dma.busy, dma.held), (2, 900, 3000));
    }

    #[test]
    fn by_unit_counts_the_topologys_units() {
        // A topology of 2 SIPs x 2 cubes x 4 PEs: 16 PE units.
        let mut meta = testutil::sample_meta();
        meta.topology.resolved =
            "name: t\ncounts:\n  sips: 2\n  cubes_per_sip: 2\n  pes_per_cube: 4\n".into();
        // A wait on a PE's CPU in the window: sync, no unit's work.
        let mut ops = testutil::sample_ops();
        let last = ops.iter().map(|o| o.rec.op_id).max().unwrap();
        ops.push(testutil::sync(
            last + 1,
            6000,
            6500,
            "sip0.cube0.pe0.pe_cpu",
            "wait_signal",
        ));
        ops.sort_by_key(|o| (o.rec.t_start, o.rec.op_id));
        let bytes = testutil::build_with_launches(
            &meta,
            &testutil::sample_tensors(),
            &ops,
            &testutil::sample_launches(),
            &testutil::sample_verify(),
        );
        let (_d, p) = testutil::write_temp(&bytes);
        let s = compute(&Input::Path(p), GroupBy::Unit).unwrap();
        let rows: Vec<(&str, Option<u64>, Ps)> = s
            .rows
            .iter()
            .map(|r| (r.key.as_str(), r.units, r.busy))
            .collect();
        assert_eq!(
            rows,
            [
                ("gemm", Some(16), 500),
                ("host", Some(1), 1000),
                ("pe_dma", Some(16), 1900),
                ("vec", Some(16), 1000),
            ]
        );
        assert_eq!(s.rows[2].utilisation, Some(1900.0 / (16.0 * 7000.0)));
        // The sample's topology has no counts: no utilisation by unit.
        let s = stats(GroupBy::Unit);
        assert!(
            s.rows
                .iter()
                .all(|r| r.units.is_none() && r.utilisation.is_none())
        );
    }

    #[test]
    fn by_op_name_and_kind() {
        let s = stats(GroupBy::OpName);
        let dr = s.rows.iter().find(|r| r.key == "dma_read").unwrap();
        assert_eq!(
            (dr.count, dr.busy, dr.held, dr.op_time, dr.bytes),
            (2, 900, 3000, 4000, 192)
        );
        let s = stats(GroupBy::OpKind);
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["gemm", "math", "memory"]);
        let mem = &s.rows[2];
        // memory ops in the window: [0,1000) [1000,3000) [2000,4000)
        // [5000,6000) ([7000,10000) is past it); active: all of [0,1000),
        // [2000,2400) [2500,3000), all of [5000,6000).
        assert_eq!(mem.count, 4);
        assert_eq!((mem.busy, mem.held), (1000 + 900 + 1000, 4000 + 1000));
        assert_eq!(mem.bytes, 288);
    }

    #[test]
    fn zero_busy_time_and_empty_runs_have_no_rates() {
        let mut c = Collector::new(GroupBy::OpKind);
        let mut r = testutil::sample_ops()[1].rec.clone();
        r.t_start = 0;
        r.t_end = 0;
        c.add(&r);
        let s = c.finish(&Strings::default());
        assert_eq!(s.rows[0].key, "memory");
        assert_eq!((s.rows[0].gbps, s.rows[0].utilisation), (None, None));
        let j = s.to_json();
        assert_eq!(j["groups"][0]["bandwidth_gbps"], Value::Null);
    }

    #[test]
    fn formats() {
        let s = stats(GroupBy::Component);
        let mut t = Vec::new();
        s.write(Format::Table, &mut t).unwrap();
        let t = String::from_utf8(t).unwrap();
        assert!(
            t.starts_with(
                "run time 10.000 ns, kernel window 0.000..7.000 ns (2 launches), 7 records"
            ),
            "{t}"
        );
        let line = t.lines().find(|l| l.contains("pe_dma")).unwrap();
        // busy 1.9 ns, held 4, op time 5, util 27.14 %, held 57.14 %.
        for want in [
            "1.900", "4.000", "5.000", "27.14", "57.14", "224", "117.895",
        ] {
            assert!(line.contains(want), "{want} in {line}");
        }
        let mut j = Vec::new();
        s.write(Format::Json, &mut j).unwrap();
        let j: Value = serde_json::from_slice(&j).unwrap();
        assert_eq!(j["groups"][2]["busy_ps"], 1900);
        assert_eq!(j["groups"][2]["held_ps"], 4000);
        assert_eq!(j["groups"][2]["held_utilisation"], 4000.0 / 7000.0);
        assert_eq!(
            (j["window_start_ps"].as_u64(), j["window_end_ps"].as_u64()),
            (Some(0), Some(7000))
        );
        assert_eq!(j["window"], "kernels");
        assert_eq!(j["groups"][0]["gflops"], 0.0);
        let mut c = Vec::new();
        s.write(Format::Csv, &mut c).unwrap();
        let c = String::from_utf8(c).unwrap();
        assert!(c.starts_with(
            "component,count,busy_ns,held_ns,op_time_ns,utilisation,held_utilisation,"
        ));
        let dma = format!(
            "\nsip0.cube0.pe0.pe_dma,3,1.900,4.000,5.000,{},{},224,0,{},0\n",
            1900.0 / 7000.0,
            4000.0 / 7000.0,
            224.0 * 1000.0 / 1900.0
        );
        assert!(c.contains(&dma), "{c}");
    }

    #[test]
    fn by_channel_reads_the_channels_chunk() {
        let bytes = testutil::channel_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let s = compute(&Input::Path(p), GroupBy::Channel).unwrap();
        // No record is counted; the run is the sample's 10 us.
        assert_eq!((s.counted, s.run_time), (0, 10_000));
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["sip0.cube0.ch2", "sip0.cube1.ch10"]);
        let r = &s.rows[1];
        // Busy 1000 + 500 ps; 8 KiB in 1.5 ns.
        assert_eq!((r.count, r.busy, r.bytes), (2, 1500, 8192));
        assert_eq!(r.utilisation, Some(0.15));
        assert_eq!(r.gbps, Some(8192.0 / 1.5));
        // A trace without the chunk has no rows, and says so.
        let plain = stats(GroupBy::Channel);
        assert!(plain.rows.is_empty());
        let mut t = Vec::new();
        plain.write(Format::Table, &mut t).unwrap();
        let t = String::from_utf8(t).unwrap();
        assert!(t.contains("no channels chunk"), "{t}");
        // --name selects ops, which channels are not.
        let e = Collector::with_names(GroupBy::Channel, &["dma_*".into()]).unwrap_err();
        assert!(e.to_string().contains("--name"), "{e}");
    }

    fn route_stats(by: GroupBy, names: &[&str]) -> Stats {
        let bytes = testutil::route_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let s = compute_named(&Input::Path(p), by, &names).unwrap();
        // One pass over standard input gives the same result.
        let mut c = Collector::with_names(by, &names).unwrap();
        source::visit_reader("-", &bytes[..], &mut c).unwrap();
        assert_eq!(c.result.as_ref(), Some(&s));
        s
    }

    /// (key, count, busy, op time, bytes) of each row.
    fn rows(s: &Stats) -> Vec<(&str, u64, Ps, Ps, u64)> {
        s.rows
            .iter()
            .map(|r| (r.key.as_str(), r.count, r.busy, r.op_time, r.bytes))
            .collect()
    }

    #[test]
    fn by_route_rows_match_a_hand_computation() {
        // testutil::route_ops documents the ops; the run ends at 10 000 ps.
        let s = route_stats(GroupBy::Route, &[]);
        assert_eq!((s.run_time, s.records), (10_000, 10));
        // The gemm (op 4) and the math op (op 7) are not routes.
        assert_eq!(s.counted, 8);
        assert_eq!(
            rows(&s),
            [
                // op 9: no read effect; HBM named per cube.
                ("? -> sip0.cube0.hbm", 1, 1000, 1000, 32),
                // op 0: host space to HBM (PE partition 1).
                ("host -> sip0.cube0.hbm", 1, 1000, 1000, 256),
                // ops 1 and 6: [1000,2000) + [6000,7000); op 6's HBM is PE
                // partition 3 and its second range is in cube 1: the first
                // range names the endpoint.
                (
                    "sip0.cube0.hbm -> sip0.cube0.pe0.tcm",
                    2,
                    2000,
                    2000,
                    64 + 64
                ),
                // ops 2 and 3 overlap: [2000,4000) u [3000,5000) = 3000 ps
                // busy, 4000 ps op time; 2 rows x 64 B + 64 B.
                (
                    "sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm",
                    2,
                    3000,
                    4000,
                    2 * 64 + 64
                ),
                ("sip0.cube0.pe0.tcm -> sip0.cube1.sram", 1, 1000, 1000, 32),
                // Natural order: pe10 is a number.
                (
                    "sip1.cube0.pe2.tcm -> sip1.cube0.pe10.tcm",
                    1,
                    1000,
                    1000,
                    16
                ),
            ]
        );
        let copies = &s.rows[3];
        assert_eq!(copies.gbps, Some(64.0)); // 192 B / 3 ns
        assert_eq!(copies.utilisation, Some(0.3));
        assert_eq!((copies.flops, copies.gflops), (0, Some(0.0)));
    }

    #[test]
    fn name_filter_counts_only_matching_ops_in_every_mode() {
        let s = route_stats(GroupBy::Route, &["ipcq_copy"]);
        assert_eq!((s.run_time, s.records, s.counted), (10_000, 10, 4));
        assert_eq!(
            rows(&s),
            [
                (
                    "sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm",
                    2,
                    3000,
                    4000,
                    192
                ),
                ("sip0.cube0.pe0.tcm -> sip0.cube1.sram", 1, 1000, 1000, 32),
                (
                    "sip1.cube0.pe2.tcm -> sip1.cube0.pe10.tcm",
                    1,
                    1000,
                    1000,
                    16
                ),
            ]
        );
        // Utilisation stays over the whole run.
        assert_eq!(s.rows[1].utilisation, Some(0.1));
        // By component: pe_dma's copies [2000,5000) and [5000,6000) touch.
        let s = route_stats(GroupBy::Component, &["ipcq_copy"]);
        assert_eq!(
            rows(&s),
            [
                (testutil::PE_DMA, 3, 4000, 5000, 224),
                ("sip1.cube0.pe2.pe_dma", 1, 1000, 1000, 16),
            ]
        );
        let s = route_stats(GroupBy::OpKind, &["ipcq_copy"]);
        assert_eq!(rows(&s), [("memory", 4, 5000, 6000, 240)]);
        // Globs and repeated names, as for `ops --name`.
        let s = route_stats(GroupBy::OpName, &["dma_*", "gemm"]);
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["dma_read", "dma_write", "gemm"]);
        assert_eq!(s.counted, 4);
        assert_eq!(s.rows[2].flops, 48);
        // A name matching only compute ops has no routes.
        let s = route_stats(GroupBy::Route, &["gemm"]);
        assert_eq!((s.records, s.counted, s.rows.len()), (10, 0, 0));
        // A bad glob is a usage error.
        let e = Collector::with_names(GroupBy::Route, &["[".into()]).unwrap_err();
        assert!(e.to_string().contains("glob"), "{e}");
    }

    #[test]
    fn route_rows_in_every_format() {
        let s = route_stats(GroupBy::Route, &["ipcq_copy"]);
        let mut t = Vec::new();
        s.write(Format::Table, &mut t).unwrap();
        let t = String::from_utf8(t).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "run time 10.000 ns, no launches: utilisation over the whole run, 10 records, by route, name ipcq_copy: 4 counted (memory ops)"
        );
        assert!(lines[1].starts_with("route "), "{t}");
        assert_eq!(lines.len(), 5, "{t}");
        let line = lines[2];
        assert!(line.starts_with("sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm  "));
        for want in [" 2 ", "3.000", "4.000", "30.00", "192", "64.000"] {
            assert!(line.contains(want), "{want} in {line}");
        }
        let mut j = Vec::new();
        s.write(Format::Json, &mut j).unwrap();
        let j: Value = serde_json::from_slice(&j).unwrap();
        assert_eq!(j["by"], "route");
        assert_eq!(j["names"], json!(["ipcq_copy"]));
        assert_eq!(
            (j["records"].as_u64(), j["counted"].as_u64()),
            (Some(10), Some(4))
        );
        assert_eq!(
            j["groups"][0]["key"],
            "sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm"
        );
        assert_eq!(j["groups"][0]["busy_ps"], 3000);
        assert_eq!(j["groups"][0]["bytes"], 192);
        assert_eq!(j["groups"][0]["bandwidth_gbps"], 64.0);
        let mut c = Vec::new();
        s.write(Format::Csv, &mut c).unwrap();
        let c = String::from_utf8(c).unwrap();
        assert!(c.starts_with("route,count,busy_ns,"), "{c}");
        assert!(
            c.contains(
                "\nsip0.cube0.pe0.tcm -> sip0.cube1.sram,1,1.000,1.000,1.000,0.1,0.1,32,0,32,0\n"
            ),
            "{c}"
        );
        // Without a filter and by component every record counts: the
        // header names no count.
        let s = route_stats(GroupBy::Component, &[]);
        let mut t = Vec::new();
        s.write(Format::Table, &mut t).unwrap();
        let t = String::from_utf8(t).unwrap();
        assert!(
            t.starts_with(
                "run time 10.000 ns, no launches: utilisation over the whole run, 10 records, by component\n"
            ),
            "{t}"
        );
    }
}
