//! `summary`: what a trace is (tool, command line, topology, benchmark,
//! params) and what it holds (simulated time, record counts by kind,
//! kernel launches with what bound each, tensors, verification spec),
//! from one pass over its records.
//!
//! Also the per-launch busy-time accumulator `LaunchTimes` that `diff`
//! attributes time with, and `run_end`, the one simulated time.

use std::collections::HashMap;
use std::hash::Hash;
use std::io::Write;

use kb_format::usage::{self, Totals, UnitTime};
use kb_format::{ChannelUsage, Footer, Launch, Meta, OpKind, Ps, Record, Strings, VerifySpec};
use serde_json::{Value, json};

use crate::render::{self, expr_string, human_bytes, kind_name, natural_cmp, ns};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Result, out_err};

/// Everything `summary` reports.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub input: String,
    pub meta: Meta,
    pub verify: VerifySpec,
    /// The host program's kernel launches, in launch order.
    pub launches: Vec<Launch>,
    pub records: u64,
    /// Record counts by kind code (index = `OpKind::code`).
    pub by_kind: Vec<(String, u64)>,
    pub first_start: Option<Ps>,
    /// End of the last op: the simulated time.
    pub sim_time: Ps,
    pub components: usize,
    pub op_names: usize,
    pub bytes_moved: u64,
    pub flops: u64,
    pub chunks: u64,
    pub strings: u64,
    /// Host data bytes present per tensor (index as in `meta.tensors`).
    pub tensor_bytes: Vec<u64>,
    /// Per launch, what bound it (`loads`: most loaded class first).
    pub bound: Vec<Vec<Load>>,
}

impl Summary {
    /// The useful part of the FLOPs (on data, not padding), as the
    /// launches record it; `None` for a trace without launches.
    pub fn useful_flops(&self) -> Option<u64> {
        (!self.launches.is_empty()).then(|| {
            self.launches
                .iter()
                .fold(0u64, |a, l| a.saturating_add(l.useful_flops))
        })
    }
}

/// `useful` as a percentage of `of` ("-" when `of` is 0).
fn percent(useful: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.1} %", useful as f64 * 100.0 / of as f64)
    }
}

/// The simulated time: the run's end as the trace's footer states it
/// (past the last record: the frees and unmaps after it), or the last
/// record's end where that is later. `summary`, `stats` and `diff` report
/// this one figure.
pub(crate) fn run_end(last_end: Ps, footer: &Footer) -> Ps {
    last_end.max(footer.counts.max_t_end)
}

/// A launch's window `[t_start, t_end)`, as `stats --launch N` takes it.
pub(crate) fn window(l: &Launch) -> (Ps, Ps) {
    (l.t_start, l.t_end.max(l.t_start))
}

/// Busy and held time ([`kb_format::usage`]) per group `K` within each
/// of a set of windows (launches), from spans given in t_start order. A
/// file's windows are known before its records; a stream's come at its
/// end, so its spans wait (a few numbers each) until
/// [`Self::set_windows`]. A window is totalled, and its accumulators
/// dropped, once the spans have passed its end: memory follows the
/// windows still open.
#[derive(Debug)]
pub(crate) struct LaunchTimes<K> {
    windows: Option<Vec<(Ps, Ps)>>,
    /// Window indices by start; `by_start[..live]` are totalled.
    by_start: Vec<usize>,
    live: usize,
    open: Vec<HashMap<K, UnitTime>>,
    done: Vec<HashMap<K, Totals>>,
    pending: Vec<(K, Ps, Ps, (Ps, Ps))>,
}

impl<K: Copy + Eq + Hash> LaunchTimes<K> {
    pub fn new() -> Self {
        LaunchTimes {
            windows: None,
            by_start: Vec::new(),
            live: 0,
            open: Vec::new(),
            done: Vec::new(),
            pending: Vec::new(),
        }
    }

    pub fn known(&self) -> bool {
        self.windows.is_some()
    }

    /// Fix the windows, and count the spans that waited for them.
    pub fn set_windows(&mut self, windows: Vec<(Ps, Ps)>) {
        let mut by_start: Vec<usize> = (0..windows.len()).collect();
        by_start.sort_by_key(|&i| windows[i].0);
        self.by_start = by_start;
        self.live = 0;
        self.open = windows.iter().map(|_| HashMap::new()).collect();
        self.done = windows.iter().map(|_| HashMap::new()).collect();
        self.windows = Some(windows);
        for (k, t0, t1, a) in std::mem::take(&mut self.pending) {
            self.add(k, t0, t1, a);
        }
    }

    /// Add group `key`'s span `[t0, t1)`, active during `active` (within
    /// it); spans must come in t_start order.
    pub fn add(&mut self, key: K, t0: Ps, t1: Ps, active: (Ps, Ps)) {
        if t1 <= t0 {
            return; // no time in any window
        }
        let Some(w) = &self.windows else {
            self.pending.push((key, t0, t1, active));
            return;
        };
        // A window that ended by t0 gets nothing more: later spans start later.
        while let Some(&i) = self.by_start.get(self.live)
            && w[i].1 <= t0
        {
            self.done[i] = total(std::mem::take(&mut self.open[i]), w[i]);
            self.live += 1;
        }
        for &i in &self.by_start[self.live..] {
            let (w0, w1) = w[i];
            if w0 >= t1 {
                break;
            }
            if w1 > t0 {
                self.open[i]
                    .entry(key)
                    .or_insert_with(|| UnitTime::new((w0, w1)))
                    .add_span(t0, t1, active);
            }
        }
    }

    /// Each window's totals per group, in the order the windows were given.
    pub fn finish(mut self) -> Vec<HashMap<K, Totals>> {
        if let Some(w) = &self.windows {
            for &i in &self.by_start[self.live..] {
                self.done[i] = total(std::mem::take(&mut self.open[i]), w[i]);
            }
        }
        self.done
    }
}

fn total<K: Eq + Hash>(open: HashMap<K, UnitTime>, w: (Ps, Ps)) -> HashMap<K, Totals> {
    open.into_iter()
        .map(|(k, mut t)| (k, t.finish(w)))
        .collect()
}

/// The unit kinds whose busy time can bound a launch, then the classes
/// measured otherwise, in tie-break order.
const BUSY_KINDS: [&str; 4] = ["pe_gemm", "pe_math", "pe_dma", "tcm"];
const CLASSES: [&str; 6] = [
    "pe_gemm",
    "pe_math",
    "pe_dma",
    "tcm",
    "hbm channel",
    "sync wait",
];

/// A unit whose time `summary`'s bound-by line ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    /// Busy time of a component (string id) of one of [`BUSY_KINDS`].
    Busy(u32),
    /// Time a component waited (its `wait_signal`/`barrier` records).
    Wait(u32),
}

/// The most loaded unit of one resource class in a launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub class: &'static str,
    pub unit: String,
    /// Busy time (waiting time for `sync wait`) within the launch's window.
    pub time: Ps,
    /// `time` / the launch's span.
    pub fraction: f64,
}

/// What bound a launch: per resource class, its most loaded unit, most
/// loaded class first; the first is the one the launch is **bound by**.
///
/// For each class: the busiest single unit's time within the launch's
/// window `[t_start, t_end)`, divided by the launch's span `t_end -
/// t_start` (the utilisation of the class's most loaded unit). Classes:
/// - `pe_gemm`, `pe_math` (compute), `pe_dma`, `tcm` (the TCM port):
///   each component of that unit kind on one of the launch's PEs, its
///   busy time as [`kb_format::usage`] defines it (the union of its
///   records' active intervals, clipped to the window);
/// - `hbm channel`: each HBM pseudo channel's service, any cube (the
///   trace's channels chunk: its busy intervals clipped to the window);
/// - `sync wait`: each component on the launch's PEs, the union of the
///   spans of its sync records named `wait_signal` or `barrier` (the
///   time it waited), clipped to the window.
///
/// Traces hold no per-link data, so NoC links are not a class. A class
/// whose units have no time in the window is left out. Ties: the class
/// first in [`CLASSES`], within a class the unit first in natural order.
fn loads(
    l: &Launch,
    times: &HashMap<Unit, Totals>,
    strings: &Strings,
    channels: &[ChannelUsage],
) -> Vec<Load> {
    let span = l.t_end.saturating_sub(l.t_start);
    if span == 0 {
        return Vec::new();
    }
    let mut best: Vec<Load> = Vec::new();
    let mut offer = |class: &'static str, unit: String, time: Ps| {
        if time == 0 {
            return;
        }
        let load = Load {
            class,
            unit,
            time,
            fraction: time as f64 / span as f64,
        };
        match best.iter_mut().find(|b| b.class == class) {
            None => best.push(load),
            Some(b) => {
                if time > b.time || (time == b.time && natural_cmp(&load.unit, &b.unit).is_lt()) {
                    *b = load;
                }
            }
        }
    };
    for (&k, t) in times {
        let (c, time, class) = match k {
            Unit::Busy(c) => (c, t.busy, None),
            Unit::Wait(c) => (c, t.held, Some("sync wait")),
        };
        let name = strings.name(c);
        if !on_launch(l, &name) {
            continue;
        }
        let kind = usage::unit_kind(&name);
        let Some(class) = class.or_else(|| BUSY_KINDS.into_iter().find(|&k| k == kind)) else {
            continue;
        };
        offer(class, name.into_owned(), time);
    }
    let (w0, w1) = window(l);
    for c in channels {
        let busy = c
            .busy
            .iter()
            .map(|&(a, b)| b.min(w1).saturating_sub(a.max(w0)))
            .fold(0, Ps::saturating_add);
        let unit = format!("sip{}.cube{}.ch{}", c.sip, c.cube, c.channel);
        offer("hbm channel", unit, busy);
    }
    let rank = |c: &str| CLASSES.iter().position(|&x| x == c);
    best.sort_by(|a, b| b.time.cmp(&a.time).then(rank(a.class).cmp(&rank(b.class))));
    best
}

/// Whether a component counts for launch `l`: it is on one of the
/// launch's PEs, or not on a PE (a launch without PEs: every component).
fn on_launch(l: &Launch, component: &str) -> bool {
    let mut parts = component.split('.');
    let mut num = |p: &str| parts.next()?.strip_prefix(p)?.parse::<u32>().ok();
    let pe = (|| Some([num("sip")?, num("cube")?, num("pe")?]))();
    l.pes.is_empty() || pe.is_none_or(|pe| l.pes.contains(&pe))
}

/// `summary`'s bound-by text: the bounding class and its unit, then the
/// next two classes.
fn bound_line(loads: &[Load]) -> String {
    let Some((first, rest)) = loads.split_first() else {
        return "- (no compute, DMA, TCM, HBM channel or wait time in the window)".into();
    };
    let pct = |l: &Load| format!("{:.1} %", l.fraction * 100.0);
    let verb = if first.class == "sync wait" {
        "waiting"
    } else {
        "busy"
    };
    let mut s = format!(
        "{} ({} {verb} {} of the span)",
        first.class,
        first.unit,
        pct(first)
    );
    if !rest.is_empty() {
        let next: Vec<String> = rest
            .iter()
            .take(2)
            .map(|l| format!("{} {}", l.class, pct(l)))
            .collect();
        s += &format!("; next: {}", next.join(", "));
    }
    s
}

#[derive(Debug)]
struct Acc {
    kinds: [u64; 256],
    n: u64,
    first: Option<Ps>,
    last_end: Ps,
    comps: Vec<bool>,
    names: Vec<bool>,
    bytes: u64,
    flops: u64,
    tensor_bytes: Vec<u64>,
    /// Per launch, the time of the units that can bound it.
    times: LaunchTimes<Unit>,
    /// Per component string id: whether it is of one of [`BUSY_KINDS`].
    busy_comp: Vec<Option<bool>>,
    /// Per op name string id: whether it names a wait (`wait_signal`, `barrier`).
    wait_name: Vec<Option<bool>>,
    out: Summary,
}

/// `f(name of id)`, computed once per string id.
fn cached(v: &mut Vec<Option<bool>>, id: u32, f: impl FnOnce() -> bool) -> bool {
    let i = id as usize;
    if i >= v.len() {
        v.resize(i + 1, None);
    }
    *v[i].get_or_insert_with(f)
}

impl Acc {
    fn new(input: String) -> Acc {
        Acc {
            kinds: [0; 256],
            n: 0,
            first: None,
            last_end: 0,
            comps: Vec::new(),
            names: Vec::new(),
            bytes: 0,
            flops: 0,
            tensor_bytes: Vec::new(),
            times: LaunchTimes::new(),
            busy_comp: Vec::new(),
            wait_name: Vec::new(),
            out: Summary {
                input,
                ..Default::default()
            },
        }
    }

    /// Feed the bound-by accumulators: busy time of compute, DMA and TCM
    /// units, waiting time of waits.
    fn time(&mut self, r: &Record, s: &Strings) {
        if r.kind == OpKind::Sync {
            if cached(&mut self.wait_name, r.op_name, || {
                matches!(&*s.name(r.op_name), "wait_signal" | "barrier")
            }) {
                let none = (r.t_start, r.t_start); // a wait is held time, never busy
                self.times
                    .add(Unit::Wait(r.component), r.t_start, r.t_end, none);
            }
        } else if cached(&mut self.busy_comp, r.component, || {
            BUSY_KINDS.contains(&usage::unit_kind(&s.name(r.component)))
        }) {
            let a = usage::active(r);
            self.times
                .add(Unit::Busy(r.component), r.t_start, r.t_end, a);
        }
    }
}

fn mark(v: &mut Vec<bool>, id: u32) {
    let i = id as usize;
    if i >= v.len() {
        v.resize(i + 1, false);
    }
    v[i] = true;
}

impl Visitor for Acc {
    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        self.tensor_bytes = vec![0; meta.tensors.len()];
        Ok(Flow::Continue)
    }

    fn launches(&mut self, launches: &[Launch]) -> Result<()> {
        self.times
            .set_windows(launches.iter().map(window).collect());
        Ok(())
    }

    fn tensor(&mut self, tensor: u32, _offset: u64, data: &[u8]) -> Result<Flow> {
        if let Some(b) = self.tensor_bytes.get_mut(tensor as usize) {
            *b += data.len() as u64;
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        self.time(r, s);
        self.kinds[r.kind.code() as usize] += 1;
        self.n += 1;
        self.first.get_or_insert(r.t_start);
        self.last_end = self.last_end.max(r.t_end);
        mark(&mut self.comps, r.component);
        mark(&mut self.names, r.op_name);
        self.bytes = self.bytes.saturating_add(render::bytes_moved(r));
        self.flops = self.flops.saturating_add(render::flops(r));
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        let by_kind = (0..=255u8)
            .filter(|&c| self.kinds[c as usize] > 0)
            .map(|c| {
                (
                    kind_name(kb_format::OpKind::from_code(c)),
                    self.kinds[c as usize],
                )
            })
            .collect();
        if !self.times.known() {
            // A stream: its launches come now.
            self.times
                .set_windows(end.launches.iter().map(window).collect());
        }
        let times = std::mem::replace(&mut self.times, LaunchTimes::new()).finish();
        let channels = if end.launches.is_empty() {
            &[][..]
        } else {
            end.channels()?
        };
        let bound = end
            .launches
            .iter()
            .zip(&times)
            .map(|(l, t)| loads(l, t, end.strings, channels))
            .collect();
        self.out = Summary {
            input: std::mem::take(&mut self.out.input),
            meta: end.meta.clone(),
            verify: end.verify.clone(),
            launches: end.launches.to_vec(),
            records: self.n,
            by_kind,
            first_start: self.first,
            sim_time: run_end(self.last_end, end.footer),
            components: self.comps.iter().filter(|&&b| b).count(),
            op_names: self.names.iter().filter(|&&b| b).count(),
            bytes_moved: self.bytes,
            flops: self.flops,
            chunks: end.footer.counts.chunks,
            strings: end.footer.counts.strings,
            tensor_bytes: std::mem::take(&mut self.tensor_bytes),
            bound,
        };
        Ok(())
    }
}

/// Read `input` and summarise it.
pub fn summarize(input: &Input) -> Result<Summary> {
    let mut acc = Acc::new(input.to_string());
    source::visit(input, &mut acc)?;
    Ok(acc.out)
}

fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Summary {
    pub fn to_json(&self) -> Value {
        let m = &self.meta;
        json!({
            "input": self.input,
            "tool": m.tool,
            "tool_version": m.tool_version,
            "command_line": m.command_line,
            "topology": {
                "name": m.topology.name,
                "address_model": m.topology.address_model,
                "resolved": m.topology.resolved,
            },
            "benchmark": m.benchmark,
            "seed": m.seed,
            "params": m.params.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "sim_time_ps": self.sim_time,
            "first_start_ps": self.first_start,
            "records": self.records,
            "records_by_kind": self.by_kind.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "components": self.components,
            "op_names": self.op_names,
            "bytes_moved": self.bytes_moved,
            "flops": self.flops,
            "useful_flops": self.useful_flops(),
            "chunks": self.chunks,
            "strings": self.strings,
            "launches": self.launches.iter().zip(self.bound.iter().chain(std::iter::repeat(&Vec::new()))).map(|(l, b)| json!({
                "kernel": l.kernel,
                "grid": if l.grid[2] == 1 { &l.grid[..2] } else { &l.grid[..] },
                "pes": l.pes.iter().map(|p| format!("sip{}.cube{}.pe{}", p[0], p[1], p[2])).collect::<Vec<_>>(),
                "t_start_ps": l.t_start,
                "t_end_ps": l.t_end,
                "flops": l.flops,
                "useful_flops": l.useful_flops,
                "span_ps": l.t_end.saturating_sub(l.t_start),
                "bound_by": b.first().map(|x| x.class),
                "loads": b.iter().map(|x| json!({
                    "class": x.class, "unit": x.unit, "time_ps": x.time, "fraction": x.fraction,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "tensors": m.tensors.iter().zip(self.tensor_bytes.iter().chain(std::iter::repeat(&0))).map(|(t, &have)| json!({
                "name": t.name,
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "bytes": crate::tensor::nbytes(t),
                "host_data": t.host_data,
                "host_bytes_present": have,
                "address": format!("{:#x}", t.address),
                "shards": t.shards.len(),
            })).collect::<Vec<_>>(),
            "verify": self.verify.outputs.iter().map(|o| json!({
                "tensor": o.tensor,
                "reference": expr_string(&o.reference),
                "tolerance": o.tolerance.map(|t| json!({"rtol": t.rtol, "atol": t.atol})),
            })).collect::<Vec<_>>(),
        })
    }

    pub fn write_text(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let m = &self.meta;
        writeln!(w, "trace:          {}", self.input)?;
        writeln!(w, "tool:           {} {}", m.tool, m.tool_version)?;
        writeln!(w, "command line:   {}", shell_join(&m.command_line))?;
        writeln!(
            w,
            "topology:       {} (address model {}; resolved topology {} lines)",
            m.topology.name,
            m.topology.address_model,
            m.topology.resolved.lines().count()
        )?;
        writeln!(w, "benchmark:      {} (seed {})", m.benchmark, m.seed)?;
        let params: Vec<String> = m.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(w, "params:         {}", params.join(" "))?;
        writeln!(
            w,
            "simulated time: {} ns (first op starts at {} ns)",
            ns(self.sim_time),
            ns(self.first_start.unwrap_or(0))
        )?;
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        writeln!(
            w,
            "records:        {}{}",
            self.records,
            if kinds.is_empty() {
                String::new()
            } else {
                format!(" ({})", kinds.join(", "))
            }
        )?;
        writeln!(
            w,
            "components:     {} ({} op names, {} strings, {} chunks)",
            self.components, self.op_names, self.strings, self.chunks
        )?;
        let useful = match self.useful_flops() {
            Some(u) => format!(" ({u} useful, {})", percent(u, self.flops)),
            None => String::new(),
        };
        writeln!(
            w,
            "moved / FLOPs:  {} ({} bytes), {} FLOPs{useful}",
            human_bytes(self.bytes_moved),
            self.bytes_moved,
            self.flops
        )?;
        writeln!(w, "launches:       {}", self.launches.len())?;
        for (i, l) in self.launches.iter().enumerate() {
            writeln!(
                w,
                "  #{i} {}  grid {} on {} PE{}  {} .. {} ns  {} FLOPs ({} useful)",
                l.kernel,
                l.grid_label(),
                l.pes.len(),
                if l.pes.len() == 1 { "" } else { "s" },
                ns(l.t_start),
                ns(l.t_end),
                l.flops,
                l.useful_flops
            )?;
            if let Some(b) = self.bound.get(i) {
                writeln!(w, "     bound by: {}", bound_line(b))?;
            }
        }
        writeln!(w, "tensors:        {}", m.tensors.len())?;
        let width = m.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for (i, t) in m.tensors.iter().enumerate() {
            let have = self.tensor_bytes.get(i).copied().unwrap_or(0);
            let size = crate::tensor::nbytes(t);
            let data = if t.host_data {
                format!("host data {have} of {} bytes", size.unwrap_or(0))
            } else {
                format!("no host data ({} shards)", t.shards.len())
            };
            writeln!(
                w,
                "  {:width$}  {:4}  {:?}  {}",
                t.name,
                t.dtype.name(),
                t.shape,
                data
            )?;
        }
        writeln!(w, "verification:   {} outputs", self.verify.outputs.len())?;
        for o in &self.verify.outputs {
            let tol = match o.tolerance {
                Some(t) => format!("rtol={} atol={}", t.rtol, t.atol),
                None => "default tolerance".into(),
            };
            writeln!(w, "  {} = {}  ({tol})", o.tensor, expr_string(&o.reference))?;
        }
        Ok(())
    }
}

/// Run `summary` and print it (`json` or text).
pub fn run(input: &Input, json: bool, w: &mut dyn Write) -> Result<()> {
    let s = summarize(input)?;
    if json {
        serde_json::to_writer_pretty(&mut *w, &s.to_json())
            .map_err(|e| out_err(std::io::Error::other(e)))?;
        writeln!(w).map_err(out_err)
    } else {
        s.write_text(w).map_err(out_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    #[test]
    fn summary_reports_meta_counts_and_spec() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let s = summarize(&Input::Path(p)).unwrap();
        assert_eq!(s.records, 7);
        assert_eq!(
            s.by_kind,
            vec![
                ("memory".to_string(), 5),
                ("gemm".to_string(), 1),
                ("math".to_string(), 1)
            ]
        );
        assert_eq!(s.sim_time, 10_000);
        assert_eq!(s.first_start, Some(0));
        assert_eq!(s.components, 5);
        assert_eq!(s.op_names, 6);
        assert_eq!(s.bytes_moved, 64 + 64 + 128 + 32 + 256);
        assert_eq!(s.flops, 48 + 16);
        assert_eq!(s.tensor_bytes, vec![12, 8, 0]);

        let mut text = Vec::new();
        s.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for want in [
            "tool:           kb-sim 0.1.0",
            "command line:   kb-sim run sample",
            "topology:       tiny (address model pa; resolved topology 2 lines)",
            "benchmark:      sample (seed 7)",
            "params:         m=2 seed=7",
            "simulated time: 10.000 ns",
            "records:        7 (memory 5, gemm 1, math 1)",
            "launches:       2",
            "  #0 gemm  grid 2 x 1 on 2 PEs  0.000 .. 5.000 ns  48 FLOPs (30 useful)",
            "  #1 softmax  grid 4 x 2 on 1 PE  6.000 .. 7.000 ns  16 FLOPs (16 useful)",
            // pe_dma's active [2000, 2400) and [2500, 3000) of [0, 5000).
            "     bound by: pe_dma (sip0.cube0.pe0.pe_dma busy 18.0 % of the span)\n",
            "     bound by: - (no compute",
            "64 FLOPs (46 useful, 71.9 %)",
            "host data 12 of 12 bytes",
            "no host data (1 shards)",
            "c = softmax(matmul(a, transpose(b)), axis=1)  (rtol=0.001 atol=0.00001)",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }

        let j = s.to_json();
        assert_eq!(j["records_by_kind"]["memory"], 5);
        assert_eq!(j["sim_time_ps"], 10_000);
        assert_eq!(j["topology"]["address_model"], "pa");
        assert_eq!(j["tensors"][1]["dtype"], "bf16");
        assert_eq!(j["verify"][0]["tensor"], "c");
        assert_eq!(j["launches"][0]["kernel"], "gemm");
        assert_eq!(
            j["launches"][0]["pes"],
            json!(["sip0.cube0.pe0", "sip0.cube0.pe1"])
        );
        assert_eq!(j["launches"][1]["grid"], json!([4, 2]));
        // A 3-D grid shows its third axis; 2-D ones keep two.
        let mut s3 = s.clone();
        s3.launches[1].grid = [4, 2, 3];
        let mut text = Vec::new();
        s3.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("  #1 softmax  grid 4 x 2 x 3 on 1 PE  6.000 .. 7.000 ns")
                && text.contains("  #0 gemm  grid 2 x 1 on 2 PEs"),
            "{text}"
        );
        let j3 = s3.to_json();
        assert_eq!(j3["launches"][1]["grid"], json!([4, 2, 3]));
        assert_eq!(j3["launches"][0]["grid"], json!([2, 1]));
        assert_eq!(j["launches"][1]["t_start_ps"], 6_000);
        assert_eq!(j["launches"][1]["t_end_ps"], 7_000);
        assert_eq!(j["launches"][0]["useful_flops"], 30);
        assert_eq!(
            (j["flops"].clone(), j["useful_flops"].clone()),
            (json!(64), json!(46))
        );
    }

    #[test]
    fn stream_and_file_summaries_agree() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let a = summarize(&Input::Path(p)).unwrap();
        let mut b = Acc::new(String::new());
        source::visit_reader("-", &bytes[..], &mut b).unwrap();
        let (mut ja, mut jb) = (a.to_json(), b.out.to_json());
        ja["input"] = Value::Null;
        jb["input"] = Value::Null;
        assert_eq!(ja, jb);
    }

    /// Launch 0 `k` on PE0 and PE1 over [1000, 11000) (span 10000 ps),
    /// launch 1 `t` on PE0 over [11000, 13000) (span 2000 ps):
    ///
    /// | component | name | span | active |
    /// |---|---|---|---|
    /// | pe0.pe_dma | dma_read | 1000..5000 | 2000..5000 |
    /// | pe0.pe_dma | dma_write | 4000..8000 | all (busy union 2000..8000 = 6000) |
    /// | pe1.pe_dma | dma_read | 1000..3000 | all |
    /// | pe5.pe_dma | dma_read | 1000..13000 | all (not a launch's PE) |
    /// | pe0.pe_cpu | signal (sync) | 1000..10000 | (not a wait) |
    /// | pe1.pe_cpu | wait_signal (sync) | 1000..5000 | |
    /// | pe1.pe_cpu | barrier (sync) | 4000..6500 | (waits union 1000..6500 = 5500) |
    /// | pe0.pe_gemm | gemm | 5000..7000 | all |
    /// | pe1.pe_math | exp | 8000..9000 | all |
    /// | pe0.pe_gemm | gemm | 11000..12000 | all |
    /// | pe1.pe_math | exp | 11500..13000 | all (PE1 is not launch 1's) |
    /// | pe0.pe_dma | dma_write | 12500..14000 | all (in launch 1: 500) |
    ///
    /// HBM channels ([`testutil::sample_channels`]): cube 1 ch10 busy
    /// [1000, 2000) and [4000, 4500) = 1500 in launch 0; cube 0 ch2 [9000,
    /// 9002) = 2.
    fn bound_trace() -> Vec<u8> {
        let dma = |pe| {
            [
                "sip0.cube0.pe0.pe_dma",
                "sip0.cube0.pe1.pe_dma",
                "sip0.cube0.pe5.pe_dma",
            ][pe]
        };
        let active = |mut op: testutil::Op, a0, a1| {
            op.rec.active = Some((a0, a1));
            op
        };
        let ops = [
            active(
                testutil::mem(0, 1000, 5000, dma(0), "dma_read", 64),
                2000,
                5000,
            ),
            testutil::mem(1, 1000, 3000, dma(1), "dma_read", 64),
            testutil::mem(2, 1000, 13000, dma(2), "dma_read", 64),
            testutil::sync(3, 1000, 10000, "sip0.cube0.pe0.pe_cpu", "signal"),
            testutil::sync(4, 1000, 5000, "sip0.cube0.pe1.pe_cpu", "wait_signal"),
            testutil::mem(5, 4000, 8000, dma(0), "dma_write", 64),
            testutil::sync(6, 4000, 6500, "sip0.cube0.pe1.pe_cpu", "barrier"),
            testutil::gemm(7, 5000, 7000, "sip0.cube0.pe0.pe_gemm", 2, 2, 2),
            testutil::math(8, 8000, 9000, "sip0.cube0.pe1.pe_math", 2, 2),
            testutil::gemm(9, 11000, 12000, "sip0.cube0.pe0.pe_gemm", 2, 2, 2),
            testutil::math(10, 11500, 13000, "sip0.cube0.pe1.pe_math", 2, 2),
            testutil::mem(11, 12500, 14000, dma(0), "dma_write", 64),
        ];
        let launch = |kernel: &str, pes: Vec<[u32; 3]>, t_start, t_end| Launch {
            kernel: kernel.into(),
            grid: [1, 1, 1],
            pes,
            t_start,
            t_end,
            flops: 0,
            useful_flops: 0,
        };
        let launches = [
            launch("k", vec![[0, 0, 0], [0, 0, 1]], 1000, 11000),
            launch("t", vec![[0, 0, 0]], 11000, 13000),
        ];
        let mut w = kb_format::TraceWriter::new(Vec::new(), &testutil::sample_meta()).unwrap();
        for op in ops {
            let mut r = op.rec;
            r.component = w.intern(op.comp);
            r.op_name = w.intern(op.name);
            w.push(r).unwrap();
        }
        w.channels(testutil::sample_channels()).unwrap();
        w.finish_with_launches(&launches, &VerifySpec::default())
            .unwrap()
    }

    #[test]
    fn bound_by_is_the_most_loaded_unit_of_each_class() {
        let bytes = bound_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let s = summarize(&Input::Path(p)).unwrap();
        let brief = |v: &[Load]| -> Vec<(&str, String, Ps)> {
            v.iter()
                .map(|l| (l.class, l.unit.clone(), l.time))
                .collect()
        };
        assert_eq!(
            brief(&s.bound[0]),
            [
                ("pe_dma", "sip0.cube0.pe0.pe_dma".into(), 6000),
                ("sync wait", "sip0.cube0.pe1.pe_cpu".into(), 5500),
                ("pe_gemm", "sip0.cube0.pe0.pe_gemm".into(), 2000),
                ("hbm channel", "sip0.cube1.ch10".into(), 1500),
                ("pe_math", "sip0.cube0.pe1.pe_math".into(), 1000),
            ]
        );
        assert_eq!(s.bound[0][0].fraction, 0.6);
        // Launch 1: only PE0's units, clipped to [11000, 13000).
        assert_eq!(
            brief(&s.bound[1]),
            [
                ("pe_gemm", "sip0.cube0.pe0.pe_gemm".into(), 1000),
                ("pe_dma", "sip0.cube0.pe0.pe_dma".into(), 500),
            ]
        );

        let mut text = Vec::new();
        s.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for want in [
            "\n     bound by: pe_dma (sip0.cube0.pe0.pe_dma busy 60.0 % of the span); next: sync wait 55.0 %, pe_gemm 20.0 %\n",
            "\n     bound by: pe_gemm (sip0.cube0.pe0.pe_gemm busy 50.0 % of the span); next: pe_dma 25.0 %\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let j = s.to_json();
        assert_eq!(j["launches"][0]["span_ps"], 10_000);
        assert_eq!(j["launches"][0]["bound_by"], "pe_dma");
        assert_eq!(
            j["launches"][0]["loads"][1],
            json!({"class": "sync wait", "unit": "sip0.cube0.pe1.pe_cpu",
                "time_ps": 5500, "fraction": 0.55})
        );

        // A stream's launches come after its records: the same result.
        let mut b = Acc::new(String::new());
        source::visit_reader("-", &bytes[..], &mut b).unwrap();
        assert_eq!(b.out.bound, s.bound);
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(
            shell_join(&["a".into(), "b c".into(), "it's".into(), "".into()]),
            "a 'b c' 'it'\\''s' ''"
        );
    }
}
