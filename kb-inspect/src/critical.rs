//! `critical-path [--launch N]`: the chain of ops and waits that set a
//! launch's end, read back along the trace's causal edges
//! (`Record::deps`: op `d.op` had to happen before the record's op could
//! start, for reason `d.kind`).
//!
//! Per launch, over its window W = [launch start, launch end]:
//!
//! 1. **End op** E: of the records that end in W (`t_end` in
//!    `(W.start, W.end]`), the last to end; on a tie a sync record named
//!    `kernel` or `kernel_end` (a kernel's run or end on its PE), then the
//!    largest op id. When E ends before W does, nothing recorded explains
//!    `[E.t_end, W.end]`: it is an *unexplained* segment.
//! 2. **Walk back** from X = E with `upto` = E's end. X's *binding* edge D
//!    is the edge to the op that ended last (of those that exist and end
//!    by X's end; ties: the largest op id): the last thing X waited for.
//!    X's own segment is `[max(X.t_start, D.t_end), upto]` clamped to W:
//!    the part of X after its last cause was met. When D ended before X
//!    started, `[D.t_end, X.t_start]` is a *wait* of D's kind (`program`:
//!    the kernel's issue and notice latency; `resource`: the unit was
//!    held; `sync`: a signal or barrier; `host`; `data`). Then X = D and
//!    `upto` = where the segments so far begin.
//! 3. The walk stops at an op without a usable edge, or at W's start; what
//!    is left, `[W.start, upto]`, is *unexplained* (reported, never hidden).
//!
//! **Guarantee**: each segment ends where the next begins, so the segments
//! are disjoint and cover W exactly: op time + wait time + unexplained time
//! = the launch's span, whatever the trace holds. Edges to ops the trace
//! lacks are skipped; edges point to smaller op ids, so a walk ends, and
//! it is bounded by the number of records all the same (a damaged trace).
//! Every op segment lies in its op's span, every wait between the two ops.
//!
//! Memory: all records are kept, a few numbers each (times, ids, string
//! ids, kind, route, edges), so a trace of millions of records fits; a
//! stream (standard input) is read the same way, its launches at the end.

use std::io::Write;

use kb_format::usage::unit_kind;
use kb_format::{Dep, DepKind, Launch, OpKind, Ps, Record, Strings};
use serde_json::{Value, json};

use crate::render::{Route, csv, kind_name, natural_cmp, ns};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::stats::launch_at;
use crate::{Error, Result, out_err};

/// What a walk needs of a record.
#[derive(Debug, Clone, Copy)]
struct Rec {
    op_id: u64,
    t_start: Ps,
    t_end: Ps,
    /// Its edges: `Graph::deps[deps.0..deps.1]`.
    deps: (usize, usize),
    component: u32,
    op_name: u32,
    kind: OpKind,
    /// A sync record named `kernel` or `kernel_end`: preferred as a
    /// launch's end op.
    kernel: bool,
    route: Option<Route>,
}

/// The records of a trace, indexed by op id and by end time.
#[derive(Debug, Default)]
struct Graph {
    recs: Vec<Rec>,
    deps: Vec<Dep>,
    /// (op id, index into `recs`), sorted.
    by_id: Vec<(u64, u32)>,
    /// Indices into `recs` sorted by (t_end, kernel, op id): a window's
    /// end op is the last one ending by the window's end.
    by_end: Vec<u32>,
    /// Per op-name string id: whether it names a kernel record.
    kernel_names: Vec<Option<bool>>,
}

impl Graph {
    fn add(&mut self, r: &Record, s: &Strings) -> Result<()> {
        let i = u32::try_from(self.recs.len())
            .map_err(|_| Error::usage("critical-path: more than 2^32 records"))?;
        let kernel = r.kind == OpKind::Sync && self.is_kernel(r.op_name, s);
        let d0 = self.deps.len();
        self.deps.extend_from_slice(&r.deps);
        self.recs.push(Rec {
            op_id: r.op_id,
            t_start: r.t_start,
            t_end: r.t_end.max(r.t_start),
            deps: (d0, self.deps.len()),
            component: r.component,
            op_name: r.op_name,
            kind: r.kind,
            kernel,
            route: crate::render::route(r),
        });
        self.by_id.push((r.op_id, i));
        Ok(())
    }

    fn is_kernel(&mut self, name: u32, s: &Strings) -> bool {
        let n = name as usize;
        if n >= self.kernel_names.len() {
            self.kernel_names.resize(n + 1, None);
        }
        *self.kernel_names[n]
            .get_or_insert_with(|| matches!(&*s.name(name), "kernel" | "kernel_end"))
    }

    /// Build the indices, once every record is in.
    fn seal(&mut self) {
        self.by_id.sort_unstable();
        let recs = &self.recs;
        self.by_end = (0..recs.len() as u32).collect();
        self.by_end.sort_unstable_by_key(|&i| {
            let r = &recs[i as usize];
            (r.t_end, r.kernel, r.op_id)
        });
    }

    fn rec(&self, i: u32) -> &Rec {
        &self.recs[i as usize]
    }

    /// The record of op `op` (the first, should a damaged trace repeat it).
    fn find(&self, op: u64) -> Option<u32> {
        let k = self.by_id.partition_point(|&(id, _)| id < op);
        self.by_id.get(k).filter(|e| e.0 == op).map(|e| e.1)
    }

    /// The end op of window `(w0, w1)` (step 1 of the module doc).
    fn end_op(&self, (w0, w1): (Ps, Ps)) -> Option<u32> {
        let n = self.by_end.partition_point(|&i| self.rec(i).t_end <= w1);
        let i = *self.by_end[..n].last()?;
        (self.rec(i).t_end > w0).then_some(i)
    }

    /// X's binding edge: to the op that ended last, by X's end.
    fn binding(&self, x: u32) -> Option<(u32, DepKind)> {
        let r = self.rec(x);
        self.deps[r.deps.0..r.deps.1]
            .iter()
            .filter(|d| d.op != r.op_id)
            .filter_map(|d| {
                let i = self.find(d.op)?;
                let t = self.rec(i).t_end;
                (t <= r.t_end).then_some((t, d.op, i, d.kind))
            })
            .max_by_key(|&(t, op, _, _)| (t, op))
            .map(|(_, _, i, kind)| (i, kind))
    }

    /// The segments of window `w`, in time order, and its end op.
    fn walk(&self, (w0, w1): (Ps, Ps)) -> (Option<u32>, Vec<Seg>) {
        // Built from the end backwards: each segment ends at `upto`.
        let mut segs = Vec::new();
        let mut push = |start: Ps, end: Ps, part: SegPart| {
            if end > start {
                segs.push(Seg { start, end, part });
            }
        };
        let end = self.end_op((w0, w1));
        let mut upto = w1;
        if let Some(e) = end {
            upto = self.rec(e).t_end;
            push(upto, w1, SegPart::Unexplained);
            let mut x = e;
            // Edges go to earlier ops, so this ends; the bound guards a
            // damaged trace's cycle.
            for _ in 0..=self.recs.len() {
                let d = self.binding(x);
                let r = self.rec(x);
                let ready = d.map_or(r.t_start, |(i, _)| r.t_start.max(self.rec(i).t_end));
                let s = ready.clamp(w0, upto);
                push(s, upto, SegPart::Op(x));
                upto = s;
                let Some((dep, kind)) = d else { break };
                let w = self.rec(dep).t_end.clamp(w0, upto);
                push(
                    w,
                    upto,
                    SegPart::Wait {
                        kind,
                        after: dep,
                        op: x,
                    },
                );
                upto = w;
                x = dep;
                if upto <= w0 {
                    break;
                }
            }
        }
        push(w0, upto, SegPart::Unexplained);
        segs.reverse();
        (end, segs)
    }

    /// Launch `index`'s path, names resolved.
    fn path(&self, index: usize, l: &Launch, s: &Strings) -> Path {
        let w = (l.t_start, l.t_end.max(l.t_start));
        let (end, segs) = self.walk(w);
        let op = |i: u32| {
            let r = self.rec(i);
            OpRef {
                op: r.op_id,
                name: s.name(r.op_name).into_owned(),
                component: s.name(r.component).into_owned(),
                kind: r.kind,
                route: r.route,
            }
        };
        let segments = segs
            .into_iter()
            .map(|g| Segment {
                start: g.start,
                end: g.end,
                part: match g.part {
                    SegPart::Op(i) => Part::Op(op(i)),
                    SegPart::Wait { kind, after, op } => Part::Wait {
                        kind,
                        after: self.rec(after).op_id,
                        op: self.rec(op).op_id,
                    },
                    SegPart::Unexplained => Part::Unexplained,
                },
            })
            .collect();
        Path {
            launch: index,
            kernel: l.kernel.clone(),
            start: w.0,
            end: w.1,
            end_op: end.map(op),
            segments,
        }
    }
}

/// A segment as the walk finds it (record indices).
#[derive(Debug, Clone, Copy)]
struct Seg {
    start: Ps,
    end: Ps,
    part: SegPart,
}

#[derive(Debug, Clone, Copy)]
enum SegPart {
    Op(u32),
    Wait { kind: DepKind, after: u32, op: u32 },
    Unexplained,
}

/// An op on a path.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRef {
    pub op: u64,
    pub name: String,
    pub component: String,
    pub kind: OpKind,
    /// A memory op's route.
    pub route: Option<Route>,
}

impl OpRef {
    /// Its unit kind, `(sync)` added for a sync record (`pe_cpu (sync)`).
    pub fn unit(&self) -> String {
        let u = unit_kind(&self.component);
        if self.kind == OpKind::Sync {
            format!("{u} (sync)")
        } else {
            u.to_string()
        }
    }
}

/// What a segment of a path is.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Op time: the op ran (or, a sync record, waited or was in flight).
    Op(OpRef),
    /// Op `op` could have started, but for op `after` ending (`kind`).
    Wait { kind: DepKind, after: u64, op: u64 },
    /// Time no recorded edge explains.
    Unexplained,
}

/// `[start, end)` of a path, in ps.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub start: Ps,
    pub end: Ps,
    pub part: Part,
}

impl Segment {
    pub fn dur(&self) -> Ps {
        self.end - self.start
    }

    fn type_name(&self) -> &'static str {
        match self.part {
            Part::Op(_) => "op",
            Part::Wait { .. } => "wait",
            Part::Unexplained => "unexplained",
        }
    }

    /// Its group in breakdown `by`, if it has one there.
    fn key(&self, by: By) -> Option<String> {
        match (&self.part, by) {
            (Part::Op(o), By::Unit) => Some(o.unit()),
            (Part::Op(o), By::OpName) => Some(o.name.clone()),
            (Part::Op(o), By::Route) => o.route.map(|r| r.to_string()),
            (Part::Wait { kind, .. }, By::Wait) => Some(format!("{} wait", kind.name())),
            (Part::Unexplained, By::Wait) => Some("unexplained".into()),
            _ => None,
        }
    }

    /// Its contribution in the summary line: `dma_read on pe_dma`,
    /// `program wait`, `unexplained`.
    fn contribution(&self) -> String {
        match &self.part {
            Part::Op(o) => format!("{} on {}", o.name, o.unit()),
            _ => self.key(By::Wait).unwrap_or_default(),
        }
    }

    /// What it is, for people: `op 3 dma_read on sip0.cube0.pe0.pe_dma`,
    /// `wait (program) op 2 -> op 3`, `unexplained`.
    fn what(&self) -> String {
        match &self.part {
            Part::Op(o) => format!("op {} {} on {}", o.op, o.name, o.component),
            Part::Wait { kind, after, op } => {
                format!("wait ({}) op {after} -> op {op}", kind.name())
            }
            Part::Unexplained => "unexplained (no recorded cause)".into(),
        }
    }
}

/// A breakdown of a path's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Op time by unit kind (sync records as `UNIT (sync)`).
    Unit,
    /// Op time by op name.
    OpName,
    /// Memory ops' time by route.
    Route,
    /// Wait time by edge kind, and the unexplained time.
    Wait,
}

const BREAKDOWNS: [(By, &str); 4] = [
    (By::Unit, "unit"),
    (By::OpName, "op_name"),
    (By::Route, "route"),
    (By::Wait, "wait"),
];

/// The critical path of one launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    /// The launch's index in `summary`'s list, and its kernel.
    pub launch: usize,
    pub kernel: String,
    /// Its window, in ps.
    pub start: Ps,
    pub end: Ps,
    /// The op whose end the walk started from (none: nothing ends in W).
    pub end_op: Option<OpRef>,
    /// In time order, disjoint, covering `[start, end]`.
    pub segments: Vec<Segment>,
}

/// `x` as a percentage of `span` (0 for an empty span).
fn pct(x: Ps, span: Ps) -> f64 {
    if span == 0 {
        0.0
    } else {
        x as f64 * 100.0 / span as f64
    }
}

/// Sum `(key, ps)` pairs by key, largest first (ties: natural key order).
fn ranked(items: impl Iterator<Item = (String, Ps)>) -> Vec<(String, Ps)> {
    let mut v: Vec<(String, Ps)> = Vec::new();
    for (k, t) in items {
        match v.iter_mut().find(|e| e.0 == k) {
            Some(e) => e.1 += t,
            None => v.push((k, t)),
        }
    }
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| natural_cmp(&a.0, &b.0)));
    v
}

impl Path {
    /// The ops on the path, in path (time) order: each op once (the
    /// timeline marks them).
    pub fn op_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = Vec::new();
        for g in &self.segments {
            if let Part::Op(o) = &g.part
                && v.last() != Some(&o.op)
            {
                v.push(o.op);
            }
        }
        v
    }

    pub fn span(&self) -> Ps {
        self.end - self.start
    }

    /// Op, wait and unexplained time: together, the span.
    pub fn totals(&self) -> (Ps, Ps, Ps) {
        let sum = |t: &str| {
            self.segments
                .iter()
                .filter(|s| s.type_name() == t)
                .map(Segment::dur)
                .sum()
        };
        (sum("op"), sum("wait"), sum("unexplained"))
    }

    /// Time by group, largest first.
    pub fn breakdown(&self, by: By) -> Vec<(String, Ps)> {
        ranked(
            self.segments
                .iter()
                .filter_map(|s| Some((s.key(by)?, s.dur()))),
        )
    }

    /// The three largest contributions (an op name on a unit kind, a wait
    /// kind, the unexplained time): `74.0 % dma_read on pe_dma, ...`.
    pub fn summary(&self) -> String {
        let top = ranked(self.segments.iter().map(|s| (s.contribution(), s.dur())));
        let parts: Vec<String> = top
            .iter()
            .take(3)
            .map(|(k, t)| format!("{:.1} % {k}", pct(*t, self.span())))
            .collect();
        if parts.is_empty() {
            "empty launch".into()
        } else {
            parts.join(", ")
        }
    }

    pub fn to_json(&self) -> Value {
        let span = self.span();
        let (op, wait, unexplained) = self.totals();
        let op_json = |o: &OpRef| {
            json!({
                "op": o.op,
                "op_name": o.name,
                "component": o.component,
                "unit": unit_kind(&o.component),
                "kind": kind_name(o.kind),
            })
        };
        let segments: Vec<Value> = self
            .segments
            .iter()
            .map(|s| {
                let mut v = json!({
                    "type": s.type_name(),
                    "start_ps": s.start,
                    "end_ps": s.end,
                    "dur_ps": s.dur(),
                    "percent": pct(s.dur(), span),
                });
                match &s.part {
                    Part::Op(o) => {
                        v["op"] = json!(o.op);
                        v["op_name"] = json!(o.name);
                        v["component"] = json!(o.component);
                        v["unit"] = json!(unit_kind(&o.component));
                        v["kind"] = json!(kind_name(o.kind));
                        v["route"] = json!(o.route.map(|r| r.to_string()));
                    }
                    Part::Wait { kind, after, op } => {
                        v["wait_kind"] = json!(kind.name());
                        v["after"] = json!(after);
                        v["op"] = json!(op);
                    }
                    Part::Unexplained => {}
                }
                v
            })
            .collect();
        let mut v = json!({
            "launch": self.launch,
            "kernel": self.kernel,
            "start_ps": self.start,
            "end_ps": self.end,
            "span_ps": span,
            "end_op": self.end_op.as_ref().map(op_json),
            "op_ps": op,
            "wait_ps": wait,
            "unexplained_ps": unexplained,
            "segments": segments,
            "summary": self.summary(),
        });
        for (by, name) in BREAKDOWNS {
            v[format!("by_{name}")] = self
                .breakdown(by)
                .iter()
                .map(|(k, t)| json!({ "key": k, "ps": t, "percent": pct(*t, span) }))
                .collect();
        }
        v
    }

    fn write_table(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let span = self.span();
        let end_op = self
            .end_op
            .as_ref()
            .map_or("none (no op ends in the window)".into(), |o| {
                format!("op {} {} on {}", o.op, o.name, o.component)
            });
        writeln!(
            w,
            "launch {} ({}): {}..{} ns, span {} ns; end op: {end_op}",
            self.launch,
            self.kernel,
            ns(self.start),
            ns(self.end),
            ns(span)
        )?;
        let (op, wait, unexplained) = self.totals();
        let part = |t: Ps| format!("{} ns ({:.1} %)", ns(t), pct(t, span));
        writeln!(
            w,
            "path: ops {} + waits {} + unexplained {} = {} ns, the span",
            part(op),
            part(wait),
            part(unexplained),
            ns(op + wait + unexplained)
        )?;
        writeln!(w, "{:>14} {:>12} {:>6}  what", "start_ns", "dur_ns", "%")?;
        for s in &self.segments {
            writeln!(
                w,
                "{:>14} {:>12} {:>6.1}  {}",
                ns(s.start),
                ns(s.dur()),
                pct(s.dur(), span),
                s.what()
            )?;
        }
        for (by, name) in BREAKDOWNS {
            let rows = self.breakdown(by);
            if rows.is_empty() {
                continue;
            }
            writeln!(w, "by {}:", name.replace('_', " "))?;
            for (k, t) in rows {
                writeln!(w, "  {k:40} {:>12} ns {:>6.1} %", ns(t), pct(t, span))?;
            }
        }
        writeln!(w, "summary: {}", self.summary())
    }
}

/// The CSV header: one row per segment.
pub const CSV_HEADER: &str = "launch,start_ns,end_ns,dur_ns,start_ps,end_ps,dur_ps,percent,type,op_id,op_name,component,unit,kind,route,wait_kind,after_op";

fn write_csv(paths: &[Path], w: &mut dyn Write) -> std::io::Result<()> {
    writeln!(w, "{CSV_HEADER}")?;
    for p in paths {
        for s in &p.segments {
            write!(
                w,
                "{},{},{},{},{},{},{},{},{},",
                p.launch,
                ns(s.start),
                ns(s.end),
                ns(s.dur()),
                s.start,
                s.end,
                s.dur(),
                pct(s.dur(), p.span()),
                s.type_name()
            )?;
            match &s.part {
                Part::Op(o) => writeln!(
                    w,
                    "{},{},{},{},{},{},,",
                    o.op,
                    csv(&o.name),
                    csv(&o.component),
                    csv(unit_kind(&o.component)),
                    kind_name(o.kind),
                    o.route.map_or(String::new(), |r| csv(&r.to_string()))
                )?,
                Part::Wait { kind, after, op } => writeln!(w, "{op},,,,,,{},{after}", kind.name())?,
                Part::Unexplained => writeln!(w, ",,,,,,,")?,
            }
        }
    }
    Ok(())
}

/// Output format of `critical-path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Csv,
}

/// Collects the records, then walks the chosen launches.
struct Collect {
    name: String,
    launch: Option<usize>,
    graph: Graph,
    paths: Vec<Path>,
}

impl Collect {
    /// The launches to walk; an error naming the trace when there are none
    /// or `--launch` is out of range.
    fn chosen(&self, launches: &[Launch]) -> Result<Vec<usize>> {
        if launches.is_empty() {
            return Err(Error::usage(format!(
                "{}: the trace has no launches: a critical path ends a launch \
                 (kb-sim records one per kernel launch)",
                self.name
            )));
        }
        match self.launch {
            Some(i) => launch_at(launches, i)
                .map(|_| vec![i])
                .map_err(|e| Error::usage(format!("{}: {e}", self.name))),
            None => Ok((0..launches.len()).collect()),
        }
    }
}

impl Visitor for Collect {
    /// A file's launches come first: refuse a bad `--launch` before
    /// reading millions of records.
    fn launches(&mut self, launches: &[Launch]) -> Result<()> {
        self.chosen(launches).map(drop)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        self.graph.add(r, s)?;
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        let chosen = self.chosen(end.launches)?;
        self.graph.seal();
        self.paths = chosen
            .into_iter()
            .map(|i| self.graph.path(i, &end.launches[i], end.strings))
            .collect();
        Ok(())
    }
}

/// The critical paths of `input`'s launches: launch `launch` alone, or
/// every launch in order.
pub fn compute(input: &Input, launch: Option<usize>) -> Result<Vec<Path>> {
    let mut c = Collect {
        name: input.to_string(),
        launch,
        graph: Graph::default(),
        paths: Vec::new(),
    };
    source::visit(input, &mut c)?;
    Ok(c.paths)
}

/// Write the paths: tables one after another; JSON one object for
/// `--launch`, else an array; CSV one row per segment.
pub fn write(paths: &[Path], one: bool, format: Format, w: &mut dyn Write) -> std::io::Result<()> {
    match format {
        Format::Table => {
            for (i, p) in paths.iter().enumerate() {
                if i > 0 {
                    writeln!(w)?;
                }
                p.write_table(w)?;
            }
            Ok(())
        }
        Format::Json => {
            let v = match paths {
                [p] if one => p.to_json(),
                _ => paths.iter().map(Path::to_json).collect(),
            };
            serde_json::to_writer_pretty(&mut *w, &v).map_err(std::io::Error::other)?;
            writeln!(w)
        }
        Format::Csv => write_csv(paths, w),
    }
}

/// `kb-inspect critical-path`.
pub fn run(
    input: &Input,
    launch: Option<usize>,
    format: Format,
    out: &mut dyn Write,
) -> Result<()> {
    let paths = compute(input, launch)?;
    write(&paths, launch.is_some(), format, out).map_err(out_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, Op, copy, dev, gemm, sync, with_deps};
    use kb_format::DepKind::*;
    use kb_format::Space;

    /// A segment as (start, end, what) for comparing with hand-made lists.
    fn brief(p: &Path) -> Vec<(Ps, Ps, String)> {
        p.segments
            .iter()
            .map(|s| (s.start, s.end, s.what()))
            .collect()
    }

    fn rows(v: &[(&str, Ps)]) -> Vec<(String, Ps)> {
        v.iter().map(|&(k, t)| (k.to_string(), t)).collect()
    }

    /// The segments are contiguous and cover the window: the guarantee.
    fn assert_covers(p: &Path) {
        let mut at = p.start;
        for s in &p.segments {
            assert_eq!(s.start, at, "launch {}: {:?}", p.launch, p.segments);
            assert!(s.end > s.start);
            at = s.end;
        }
        assert_eq!(at, p.end);
        let (o, w, u) = p.totals();
        assert_eq!(o + w + u, p.span());
    }

    fn paths_of(bytes: &[u8], launch: Option<usize>) -> Vec<Path> {
        let (_d, p) = testutil::write_temp(bytes);
        let paths = compute(&Input::Path(p), launch).unwrap();
        paths.iter().for_each(assert_covers);
        paths
    }

    fn one_launch(ops: &[Op], t0: Ps, t1: Ps) -> Vec<u8> {
        let mut l = testutil::critical_launches().remove(0);
        (l.t_start, l.t_end) = (t0, t1);
        testutil::build_with_launches(
            &testutil::sample_meta(),
            &[],
            ops,
            &[l],
            &Default::default(),
        )
    }

    const DMA0: &str = "sip0.cube0.pe0.pe_dma";

    #[test]
    fn two_pe_program_follows_the_signal_back_to_the_launch() {
        // testutil::critical_ops, by hand: PE1's kernel record ends with
        // its store at 14 000 (the kernel record wins the tie), the store
        // waited for the math, the math for PE1's load, issued 100 ps after
        // the wait for PE0's signal ended 100 ps after the signal arrived;
        // the signal followed PE0's store, gemm and load.
        let paths = paths_of(&testutil::critical_trace(), None);
        assert_eq!(paths.len(), 2);
        let p = &paths[0];
        assert_eq!(
            (p.launch, p.kernel.as_str(), p.span()),
            (0, "two_pe", 13_000)
        );
        assert_eq!(p.end_op.as_ref().unwrap().op, 10);
        let want: Vec<(Ps, Ps, &str)> = vec![
            (1000, 1100, "wait (host) op 0 -> op 1"),
            (1100, 3000, "op 1 dma_read on sip0.cube0.pe0.pe_dma"),
            (3000, 3200, "wait (program) op 1 -> op 2"),
            (3200, 6000, "op 2 gemm on sip0.cube0.pe0.pe_gemm"),
            (6000, 7000, "op 3 dma_write on sip0.cube0.pe0.pe_dma"),
            (7000, 7500, "op 4 signal on sip0.cube0.pe0.pe_cpu"),
            (7500, 7600, "op 5 wait_signal on sip0.cube0.pe1.pe_cpu"),
            (7600, 7700, "wait (program) op 5 -> op 6"),
            (7700, 9000, "op 6 dma_read on sip0.cube0.pe1.pe_dma"),
            (9000, 12000, "op 7 exp on sip0.cube0.pe1.pe_math"),
            (12000, 14000, "op 8 dma_write on sip0.cube0.pe1.pe_dma"),
        ];
        let want: Vec<(Ps, Ps, String)> =
            want.into_iter().map(|(a, b, w)| (a, b, w.into())).collect();
        assert_eq!(brief(p), want);
        assert_eq!(p.totals(), (12_600, 400, 0));
        assert_eq!(
            p.breakdown(By::Unit),
            rows(&[
                ("pe_dma", 6200),
                ("pe_math", 3000),
                ("pe_gemm", 2800),
                ("pe_cpu (sync)", 600)
            ])
        );
        assert_eq!(
            p.breakdown(By::OpName),
            rows(&[
                ("dma_read", 3200),
                ("dma_write", 3000),
                ("exp", 3000),
                ("gemm", 2800),
                ("signal", 500),
                ("wait_signal", 100)
            ])
        );
        assert_eq!(
            p.breakdown(By::Route),
            rows(&[
                ("sip0.cube0.pe1.tcm -> sip0.cube0.hbm", 2000),
                ("sip0.cube0.hbm -> sip0.cube0.pe0.tcm", 1900),
                ("sip0.cube0.hbm -> sip0.cube0.pe1.tcm", 1300),
                ("sip0.cube0.pe0.tcm -> sip0.cube0.hbm", 1000)
            ])
        );
        assert_eq!(
            p.breakdown(By::Wait),
            rows(&[("program wait", 300), ("host wait", 100)])
        );
        // 3200 / 13000 = 24.6 %, 3000 / 13000 = 23.1 %.
        assert_eq!(
            p.summary(),
            "24.6 % dma_read on pe_dma, 23.1 % dma_write on pe_dma, 23.1 % exp on pe_math"
        );
        // Launch 1 starts when launch 0's last kernel ends: the host's
        // 200 ps to start PE0's load, then the load.
        let q = &paths[1];
        assert_eq!(
            brief(q),
            [
                (14000, 14200, "wait (host) op 10 -> op 11".to_string()),
                (14200, 15000, format!("op 11 dma_read on {DMA0}")),
            ]
        );
        assert_eq!(q.summary(), "80.0 % dma_read on pe_dma, 20.0 % host wait");
        // --launch 1 alone, and standard input: the same paths.
        assert_eq!(
            paths_of(&testutil::critical_trace(), Some(1)),
            std::slice::from_ref(q)
        );
        let mut c = Collect {
            name: "-".into(),
            launch: None,
            graph: Graph::default(),
            paths: vec![],
        };
        source::visit_reader("-", &testutil::critical_trace()[..], &mut c).unwrap();
        assert_eq!(c.paths, paths);
    }

    #[test]
    fn outputs_carry_the_same_numbers() {
        let paths = paths_of(&testutil::critical_trace(), None);
        let mut out = Vec::new();
        write(&paths, false, Format::Json, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        let j = &v[0];
        assert_eq!(
            (
                &j["span_ps"],
                &j["op_ps"],
                &j["wait_ps"],
                &j["unexplained_ps"]
            ),
            (&json!(13_000), &json!(12_600), &json!(400), &json!(0))
        );
        assert_eq!(j["end_op"]["op"], 10);
        assert_eq!(j["segments"].as_array().unwrap().len(), 11);
        // (JSON text keeps floats to within an ulp.)
        let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
        let mut wait = j["segments"][2].clone();
        assert!(close(&wait["percent"], 200.0 * 100.0 / 13_000.0));
        wait["percent"] = json!(null);
        assert_eq!(
            wait,
            json!({"type": "wait", "start_ps": 3000, "end_ps": 3200, "dur_ps": 200,
                   "percent": null, "wait_kind": "program", "after": 1, "op": 2})
        );
        assert_eq!(
            j["segments"][1]["route"],
            "sip0.cube0.hbm -> sip0.cube0.pe0.tcm"
        );
        assert_eq!(j["segments"][5]["kind"], "sync");
        assert_eq!(j["by_unit"][0]["key"], "pe_dma");
        assert_eq!(j["by_unit"][0]["ps"], 6200);
        assert!(close(
            &j["by_unit"][0]["percent"],
            6200.0 * 100.0 / 13_000.0
        ));
        assert_eq!(j["by_wait"][1]["key"], "host wait");
        assert_eq!(v[1]["launch"], 1);
        let mut out = Vec::new();
        write(&paths[..1], true, Format::Json, &mut out).unwrap();
        let one: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(&one, j);

        let mut out = Vec::new();
        write(&paths, false, Format::Table, &mut out).unwrap();
        let t = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "launch 0 (two_pe): 1.000..14.000 ns, span 13.000 ns; end op: op 10 kernel on sip0.cube0.pe1.pe_cpu"
        );
        assert_eq!(
            lines[1],
            "path: ops 12.600 ns (96.9 %) + waits 0.400 ns (3.1 %) + unexplained 0.000 ns (0.0 %) = 13.000 ns, the span"
        );
        assert_eq!(
            lines[5],
            "         3.000        0.200    1.5  wait (program) op 1 -> op 2"
        );
        assert!(t.contains("\nby unit:\n  pe_dma "), "{t}");
        assert!(t.contains("\n  pe_cpu (sync) "), "{t}");
        assert!(t.contains("\nsummary: 24.6 % dma_read on pe_dma,"), "{t}");
        assert!(t.contains("\n\nlaunch 1 (tail): 14.000..15.000 ns"), "{t}");

        let mut out = Vec::new();
        write(&paths, false, Format::Csv, &mut out).unwrap();
        let csv = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 1 + 11 + 2);
        assert_eq!(
            lines[1],
            "0,1.000,1.100,0.100,1000,1100,100,0.7692307692307693,wait,1,,,,,,host,0"
        );
        assert_eq!(
            lines[2],
            "0,1.100,3.000,1.900,1100,3000,1900,14.615384615384615,op,1,dma_read,sip0.cube0.pe0.pe_dma,pe_dma,memory,sip0.cube0.hbm -> sip0.cube0.pe0.tcm,,"
        );
        let cols = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == cols), "{csv}");
    }

    #[test]
    fn gaps_no_edge_explains_are_unexplained() {
        // Launch [0, 10 000]: the gemm has no edges (its start, 5000, is
        // unexplained back to the launch's start); nothing ends after the
        // store at 9000 (the last 1000 ps are unexplained). Op 2's edge to
        // op 0, which the trace lacks, is skipped; op 1 is not on the path.
        let hbm = dev(Space::Hbm, 0, 0, 0, 0);
        let tcm = dev(Space::Tcm, 0, 0, 0, 0);
        let ops = vec![
            copy(1, 1000, 3000, DMA0, "dma_read", &[hbm], &[tcm], 64, 1),
            with_deps(
                gemm(2, 5000, 8000, "sip0.cube0.pe0.pe_gemm", 4, 4, 4),
                &[(0, Data)],
            ),
            with_deps(
                copy(3, 8000, 9000, DMA0, "dma_write", &[tcm], &[hbm], 64, 1),
                &[(2, Data)],
            ),
        ];
        let p = &paths_of(&one_launch(&ops, 0, 10_000), None)[0];
        assert_eq!(
            brief(p),
            [
                (0, 5000, "unexplained (no recorded cause)".to_string()),
                (5000, 8000, "op 2 gemm on sip0.cube0.pe0.pe_gemm".into()),
                (8000, 9000, format!("op 3 dma_write on {DMA0}")),
                (9000, 10_000, "unexplained (no recorded cause)".into()),
            ]
        );
        assert_eq!(p.totals(), (4000, 0, 6000));
        assert_eq!(p.breakdown(By::Wait), rows(&[("unexplained", 6000)]));
        assert_eq!(
            p.summary(),
            "60.0 % unexplained, 30.0 % gemm on pe_gemm, 10.0 % dma_write on pe_dma"
        );
        // A window nothing ends in: all of it unexplained.
        let p = &paths_of(&one_launch(&ops, 9500, 9800), None)[0];
        assert_eq!(p.end_op, None);
        assert_eq!(p.totals(), (0, 0, 300));
        // An empty launch: no segments.
        let p = &paths_of(&one_launch(&ops, 4000, 4000), None)[0];
        assert!(p.segments.is_empty());
        assert_eq!(p.summary(), "empty launch");
    }

    #[test]
    fn a_unit_held_by_another_op_is_a_resource_wait() {
        // Two loads on one DMA engine: the second starts 500 ps after the
        // first frees the engine; the gemm needs its data; PE0's kernel
        // ends with the gemm (its instant `kernel_end` record).
        let hbm = dev(Space::Hbm, 0, 0, 0, 0);
        let tcm = dev(Space::Tcm, 0, 0, 0, 0);
        let ops = vec![
            copy(0, 0, 2000, DMA0, "dma_read", &[hbm], &[tcm], 64, 1),
            with_deps(
                copy(1, 2500, 4000, DMA0, "dma_read", &[hbm], &[tcm], 64, 1),
                &[(0, Resource)],
            ),
            with_deps(
                gemm(2, 4000, 6000, "sip0.cube0.pe0.pe_gemm", 4, 4, 4),
                &[(1, Data), (0, Data)],
            ),
            with_deps(
                sync(3, 6000, 6000, "sip0.cube0.pe0.pe_cpu", "kernel_end"),
                &[(2, Program)],
            ),
            // Ends as late, with a larger id, on another PE: the kernel's
            // end record still wins the tie.
            copy(
                4,
                5000,
                6000,
                "sip0.cube0.pe1.pe_dma",
                "dma_write",
                &[tcm],
                &[hbm],
                64,
                1,
            ),
        ];
        let p = &paths_of(&one_launch(&ops, 0, 6000), None)[0];
        assert_eq!(p.end_op.as_ref().unwrap().op, 3);
        assert_eq!(
            brief(p),
            [
                (0, 2000, format!("op 0 dma_read on {DMA0}")),
                (2000, 2500, "wait (resource) op 0 -> op 1".into()),
                (2500, 4000, format!("op 1 dma_read on {DMA0}")),
                (4000, 6000, "op 2 gemm on sip0.cube0.pe0.pe_gemm".into()),
            ]
        );
        assert_eq!(p.breakdown(By::Wait), rows(&[("resource wait", 500)]));
        assert_eq!(
            p.breakdown(By::Unit),
            rows(&[("pe_dma", 3500), ("pe_gemm", 2000)])
        );
    }

    #[test]
    fn launch_errors_name_the_trace() {
        let (_d, path) = testutil::write_temp(&testutil::critical_trace());
        let e = compute(&Input::Path(path.clone()), Some(2)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "{}: --launch 2: the trace has 2 launches",
                path.display()
            )),
            "{msg}"
        );
        let (_d, path) = testutil::write_temp(&testutil::route_trace());
        let msg = compute(&Input::Path(path.clone()), None)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with(&format!("{}: the trace has no launches", path.display())),
            "{msg}"
        );
    }

    #[test]
    fn a_cycle_in_a_damaged_trace_still_ends() {
        // The writer refuses edges to later ops; a graph built by hand
        // need not: 1 <-> 2, both ending at 500.
        let mut g = Graph::default();
        let s = Strings::default();
        for (id, dep) in [(1, 2), (2, 1)] {
            let r = Record {
                op_id: id,
                t_start: 100,
                t_end: 500,
                deps: vec![Dep::data(dep)],
                ..Default::default()
            };
            g.add(&r, &s).unwrap();
        }
        g.seal();
        let (end, segs) = g.walk((0, 1000));
        assert!(end.is_some());
        let total: Ps = segs.iter().map(|s| s.end - s.start).sum();
        assert_eq!(total, 1000);
        // The walk goes round without progress until its bound, then
        // leaves the rest unexplained.
        assert!(segs.iter().all(|s| matches!(s.part, SegPart::Unexplained)));
    }

    /// Random DAGs (edges of random kinds to random earlier ops, some to
    /// ops the trace lacks) and random windows: the segments always cover
    /// the window exactly, every op segment lies in its op's span and
    /// every wait between its two ops.
    #[test]
    fn random_traces_always_sum_to_the_span() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let comps = ["sip0.cube0.pe0.pe_dma", "sip0.cube0.pe0.pe_cpu", "host"];
        for _ in 0..40 {
            let n = 1 + rnd(60);
            let mut ops = Vec::new();
            let mut spans = std::collections::HashMap::new();
            for id in 0..n {
                let t0 = rnd(20_000);
                let t1 = t0 + rnd(3000);
                let mut op = sync(id, t0, t1, comps[rnd(3) as usize], "op");
                if rnd(2) == 0 {
                    op.rec.kind = OpKind::Unknown(9);
                    op.rec.params = kb_format::Params::Raw(vec![]);
                }
                if id > 0 && rnd(2) == 0 {
                    op.name = "kernel";
                }
                for _ in 0..rnd(4) {
                    if id > 0 {
                        op.rec.deps.push(Dep {
                            op: rnd(id),
                            kind: DepKind::ALL[rnd(5) as usize],
                        });
                    }
                }
                spans.insert(id, (t0, t1));
                // Some ops are left out: edges to them dangle.
                if rnd(8) != 0 {
                    ops.push(op);
                } else {
                    spans.remove(&id);
                }
            }
            let mut launches = Vec::new();
            for _ in 0..3 {
                let mut l = testutil::critical_launches().remove(0);
                l.t_start = rnd(20_000);
                l.t_end = l.t_start + rnd(8000);
                launches.push(l);
            }
            let bytes = testutil::build_with_launches(
                &testutil::sample_meta(),
                &[],
                &ops,
                &launches,
                &Default::default(),
            );
            for p in paths_of(&bytes, None) {
                for s in &p.segments {
                    match &s.part {
                        Part::Op(o) => {
                            let (t0, t1) = spans[&o.op];
                            assert!(t0 <= s.start && s.end <= t1, "{s:?} {t0} {t1}");
                        }
                        Part::Wait { after, op, .. } => {
                            assert!(spans[after].1 <= s.start && s.end <= spans[op].0, "{s:?}");
                        }
                        Part::Unexplained => {}
                    }
                }
            }
        }
    }
}
