//! `diff A B`: how two traces differ.
//!
//! Reported, each as a difference (exit 1) when present:
//! - run metadata: tool and version, benchmark, seed, params (by key),
//!   topology (name, address model, resolved YAML), tensors (by name),
//!   host tensor data (by content hash), the verification spec. The command
//!   line is shown as a note only (two runs writing different output files
//!   are still the same run);
//! - the resolved topology, leaf by leaf, each change named by its dotted
//!   field path (`links.cube_link.bw_gbs: 256.0 -> 32.0`; list items by
//!   index, `a.b[2]`);
//! - the simulated time (as `summary` reports it: `summary::run_end`) and record
//!   counts;
//! - **where the time went**, per launch (paired by index; differing
//!   launch counts or kernels are said): the change in the launch's span,
//!   then in busy time by unit kind, by route (memory ops) and by op name,
//!   largest change first, each with A, B and B - A (one sign convention
//!   throughout: positive = more in B). A group's busy time is the sum over
//!   units (components) of each unit's busy time for the group's ops within
//!   the launch's window ([`kb_format::usage`]: the union of active
//!   intervals), so it adds up like `stats --by unit`; a trace without
//!   launches is one window, the whole run. JSON also lists it by
//!   component;
//! - the **first divergent op by timing**: records are paired by position
//!   in trace order ((t_start, op_id)); the first pair that differs in op
//!   id, start, end, component, op name or kind, with both records;
//! - the first op whose params, dependencies or read/write effects differ
//!   (same pairing);
//! - the **first divergent op by data fingerprint**: records are paired by
//!   op id; of the pairs whose fingerprints differ, the one earliest in A.
//!   Ops whose partner is more than [`PENDING_CAP`] records away are not
//!   paired (reported as incomplete).
//!
//! Both traces are read once, concurrently (one may be standard input).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use kb_format::usage::{self, Totals};
use kb_format::{Fingerprinter, Launch, Meta, OpKind, Ps, Record, Strings, VerifySpec};
use serde_json::{Value, json};

use crate::render::{Route, expr_string, natural_cmp, ns, record_json, record_line};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::summary::{LaunchTimes, run_end, window};
use crate::{Error, Result, out_err};

/// Unpaired records kept while pairing fingerprints by op id.
pub const PENDING_CAP: usize = 1 << 18;
const BATCH: usize = 1024;

/// One differing field.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub field: String,
    pub a: Value,
    pub b: Value,
}

/// A record as shown in a report.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub line: String,
    pub json: Value,
}

/// The first pair of records that differ in some respect.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// Position of the record in A's trace order (in B's when A has ended).
    pub position: u64,
    pub fields: Vec<String>,
    /// `None` when that trace has no record there.
    pub a: Option<Shown>,
    pub b: Option<Shown>,
}

impl Divergence {
    /// The op id the divergence is named by (A's when present).
    pub fn op_id(&self) -> Option<u64> {
        self.a
            .as_ref()
            .or(self.b.as_ref())
            .and_then(|s| s.json["op_id"].as_u64())
    }
}

/// One group's busy time in each trace (0 where it has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub a: Ps,
    pub b: Ps,
}

impl Row {
    /// B - A.
    pub fn delta(&self) -> i128 {
        self.b as i128 - self.a as i128
    }
}

/// What busy time is grouped by, in report order.
pub const GROUPINGS: [&str; 4] = ["unit_kind", "route", "op_name", "component"];

/// Where one launch's time went in A and in B.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    /// The launch's index; `None`: a trace without launches, the whole run.
    pub launch: Option<usize>,
    pub kernel: (String, String),
    pub span: (Ps, Ps),
    /// Busy time by each of [`GROUPINGS`]: rows largest |B - A| first.
    pub groups: [Vec<Row>; 4],
}

impl Attribution {
    fn identical(&self) -> bool {
        self.kernel.0 == self.kernel.1
            && self.span.0 == self.span.1
            && self.groups.iter().flatten().all(|r| r.a == r.b)
    }
}

/// The result of a diff.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub a: String,
    pub b: String,
    pub meta: Vec<Change>,
    /// Resolved topology leaves that differ, `field` their dotted path.
    pub topology: Vec<Change>,
    /// Informational differences (command line).
    pub notes: Vec<Change>,
    pub sim_time: (Ps, Ps),
    pub records: (u64, u64),
    /// Launches in each trace.
    pub launch_counts: (usize, usize),
    /// Per launch paired by index (or the whole runs, without launches).
    pub attribution: Vec<Attribution>,
    pub timing: Option<Divergence>,
    pub other: Option<Divergence>,
    pub data: Option<Divergence>,
    /// Records with an op id the other trace does not have (A, B).
    pub unpaired: (u64, u64),
    /// True when pairing by op id gave up (more than [`PENDING_CAP`] apart).
    pub data_incomplete: bool,
}

impl Report {
    pub fn identical(&self) -> bool {
        self.meta.is_empty()
            && self.topology.is_empty()
            && self.sim_time.0 == self.sim_time.1
            && self.records.0 == self.records.1
            && self.launch_counts.0 == self.launch_counts.1
            && self.attribution.iter().all(Attribution::identical)
            && self.timing.is_none()
            && self.other.is_none()
            && self.data.is_none()
            && self.unpaired == (0, 0)
            && !self.data_incomplete
    }
}

// ---- producer side: one thread per trace ----

struct Batch {
    strings: Option<Strings>,
    records: Vec<Record>,
}

/// A group of ops whose busy time is attributed, on one unit (component
/// string id): busy times are summed over units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Unit(u32),
    Route(Route, u32),
    Name(u32, u32),
}

/// One launch's (or the run's) busy time in one trace, by grouping.
#[derive(Debug, Default)]
struct LaunchUse {
    kernel: String,
    span: Ps,
    /// By each of [`GROUPINGS`].
    groups: [HashMap<String, Ps>; 4],
}

/// What a producer knows at the end of its trace.
#[derive(Debug, Default)]
struct SideInfo {
    meta: Meta,
    verify: VerifySpec,
    records: u64,
    sim_time: Ps,
    launch_count: usize,
    launches: Vec<LaunchUse>,
    tensor_hash: Vec<Option<u64>>,
}

struct Producer {
    tx: SyncSender<Batch>,
    batch: Vec<Record>,
    sent_strings: usize,
    times: LaunchTimes<Key>,
    last_end: Ps,
    hashers: Vec<Option<Fingerprinter>>,
    info: SideInfo,
}

/// The windows busy time is attributed over: each launch's, or the
/// whole run for a trace without launches.
fn windows(launches: &[Launch]) -> Vec<(Ps, Ps)> {
    if launches.is_empty() {
        vec![(0, Ps::MAX)]
    } else {
        launches.iter().map(window).collect()
    }
}

/// Name and sum one window's busy times by grouping.
fn launch_use(kernel: String, span: Ps, times: HashMap<Key, Totals>, s: &Strings) -> LaunchUse {
    let mut u = LaunchUse {
        kernel,
        span,
        ..Default::default()
    };
    for (k, t) in times {
        let mut add = |g: usize, key: String| *u.groups[g].entry(key).or_default() += t.busy;
        match k {
            Key::Unit(c) => {
                let name = s.name(c);
                add(0, usage::unit_kind(&name).to_string());
                add(3, name.into_owned());
            }
            Key::Route(r, _) => add(1, r.to_string()),
            Key::Name(n, _) => add(2, s.name(n).into_owned()),
        }
    }
    u
}

impl Producer {
    fn send(&mut self, strings: &Strings) -> Result<()> {
        let s = (strings.len() != self.sent_strings).then(|| strings.clone());
        self.sent_strings = strings.len();
        let records = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.tx
            .send(Batch {
                strings: s,
                records,
            })
            .map_err(|_| Error::usage("diff: the comparison stopped"))
    }
}

impl Visitor for Producer {
    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        self.hashers = (0..meta.tensors.len()).map(|_| None).collect();
        Ok(Flow::Continue)
    }

    fn launches(&mut self, launches: &[Launch]) -> Result<()> {
        self.times.set_windows(windows(launches));
        Ok(())
    }

    fn tensor(&mut self, t: u32, off: u64, data: &[u8]) -> Result<Flow> {
        if let Some(h) = self.hashers.get_mut(t as usize) {
            let h = h.get_or_insert_with(Fingerprinter::new);
            h.update(&off.to_le_bytes());
            h.update(&(data.len() as u64).to_le_bytes());
            h.update(data);
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        // Sync records are never busy: nothing to attribute.
        if r.kind != OpKind::Sync {
            let (t0, t1, a, c) = (r.t_start, r.t_end, usage::active(r), r.component);
            self.times.add(Key::Unit(c), t0, t1, a);
            self.times.add(Key::Name(r.op_name, c), t0, t1, a);
            if let Some(route) = crate::render::route(r) {
                self.times.add(Key::Route(route, c), t0, t1, a);
            }
        }
        self.info.records += 1;
        self.last_end = self.last_end.max(r.t_end);
        self.batch.push(r.clone());
        if self.batch.len() >= BATCH {
            self.send(s)?;
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        self.sent_strings = usize::MAX; // always send the final table
        self.send(end.strings)?;
        self.info.meta = end.meta.clone();
        self.info.verify = end.verify.clone();
        self.info.sim_time = run_end(self.last_end, end.footer);
        if !self.times.known() {
            // A stream: its launches come now.
            self.times.set_windows(windows(end.launches));
        }
        let times = std::mem::replace(&mut self.times, LaunchTimes::new()).finish();
        self.info.launch_count = end.launches.len();
        self.info.launches = match end.launches {
            [] => times
                .into_iter()
                .map(|t| launch_use(String::new(), self.info.sim_time, t, end.strings))
                .collect(),
            ls => ls
                .iter()
                .zip(times)
                .map(|(l, t)| {
                    let span = l.t_end.saturating_sub(l.t_start);
                    launch_use(l.kernel.clone(), span, t, end.strings)
                })
                .collect(),
        };
        self.info.tensor_hash = self
            .hashers
            .iter()
            .map(|h| h.as_ref().map(|h| h.digest()))
            .collect();
        Ok(())
    }
}

fn produce(input: &Input, tx: SyncSender<Batch>) -> Result<SideInfo> {
    let mut p = Producer {
        tx,
        batch: Vec::with_capacity(BATCH),
        sent_strings: 0,
        times: LaunchTimes::new(),
        last_end: 0,
        hashers: Vec::new(),
        info: SideInfo::default(),
    };
    source::visit(input, &mut p)?;
    Ok(p.info)
}

// ---- consumer side: pairs the two record streams ----

struct Cursor {
    rx: Receiver<Batch>,
    strings: Strings,
    buf: std::vec::IntoIter<Record>,
}

impl Cursor {
    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.buf.next() {
                return Some(r);
            }
            let b = self.rx.recv().ok()?;
            if let Some(s) = b.strings {
                self.strings = s;
            }
            self.buf = b.records.into_iter();
        }
    }
}

fn shown(r: &Record, s: &Strings) -> Shown {
    Shown {
        line: record_line(r, s),
        json: record_json(r, s),
    }
}

#[derive(Default)]
struct Pairing {
    timing: Option<Divergence>,
    other: Option<Divergence>,
    data: Option<Divergence>,
    /// Unpaired records by op id: (position in A or B, record).
    pending_a: HashMap<u64, (u64, Record)>,
    pending_b: HashMap<u64, (u64, Record)>,
    incomplete: bool,
}

impl Pairing {
    fn data_pair(&mut self, pos_a: u64, a: &Record, sa: &Strings, b: &Record, sb: &Strings) {
        if a.fingerprint != b.fingerprint && self.data.as_ref().is_none_or(|d| pos_a < d.position) {
            self.data = Some(Divergence {
                position: pos_a,
                fields: vec!["fingerprint".into()],
                a: Some(shown(a, sa)),
                b: Some(shown(b, sb)),
            });
        }
    }

    fn unpaired_a(&mut self, pos: u64, a: Record, sa: &Strings, sb: &Strings) {
        if self.incomplete {
            return;
        }
        if let Some((_, b)) = self.pending_b.remove(&a.op_id) {
            self.data_pair(pos, &a, sa, &b, sb);
        } else {
            self.pending_a.insert(a.op_id, (pos, a));
            self.check_cap();
        }
    }

    fn unpaired_b(&mut self, pos: u64, b: Record, sa: &Strings, sb: &Strings) {
        if self.incomplete {
            return;
        }
        if let Some((pa, a)) = self.pending_a.remove(&b.op_id) {
            self.data_pair(pa, &a, sa, &b, sb);
        } else {
            self.pending_b.insert(b.op_id, (pos, b));
            self.check_cap();
        }
    }

    fn check_cap(&mut self) {
        if self.pending_a.len() + self.pending_b.len() > PENDING_CAP {
            self.incomplete = true;
            self.pending_a = HashMap::new();
            self.pending_b = HashMap::new();
        }
    }

    fn compare(&mut self, pos: u64, a: Record, sa: &Strings, b: Record, sb: &Strings) {
        if self.timing.is_none() {
            let mut f = Vec::new();
            if a.op_id != b.op_id {
                f.push("op_id");
            }
            if a.t_start != b.t_start {
                f.push("t_start");
            }
            if a.t_end != b.t_end {
                f.push("t_end");
            }
            if sa.get(a.component) != sb.get(b.component) {
                f.push("component");
            }
            if sa.get(a.op_name) != sb.get(b.op_name) {
                f.push("op_name");
            }
            if a.kind != b.kind {
                f.push("kind");
            }
            if !f.is_empty() {
                self.timing = Some(Divergence {
                    position: pos,
                    fields: f.into_iter().map(String::from).collect(),
                    a: Some(shown(&a, sa)),
                    b: Some(shown(&b, sb)),
                });
            }
        }
        if self.other.is_none() {
            let mut f = Vec::new();
            if a.params != b.params {
                f.push("params");
            }
            if a.deps != b.deps {
                f.push("deps");
            }
            if a.read != b.read {
                f.push("read");
            }
            if a.write != b.write {
                f.push("write");
            }
            if !f.is_empty() {
                self.other = Some(Divergence {
                    position: pos,
                    fields: f.into_iter().map(String::from).collect(),
                    a: Some(shown(&a, sa)),
                    b: Some(shown(&b, sb)),
                });
            }
        }
        if a.op_id == b.op_id {
            self.data_pair(pos, &a, sa, &b, sb);
        } else {
            self.unpaired_a(pos, a, sa, sb);
            self.unpaired_b(pos, b, sa, sb);
        }
    }

    /// One trace has ended: the first extra record is a timing divergence.
    fn extra(&mut self, pos: u64, r: Record, s: &Strings, in_a: bool, other: &Strings) {
        if self.timing.is_none() {
            let sh = Some(shown(&r, s));
            self.timing = Some(Divergence {
                position: pos,
                fields: vec![if in_a { "only in A" } else { "only in B" }.into()],
                a: if in_a { sh.clone() } else { None },
                b: if in_a { None } else { sh },
            });
        }
        if in_a {
            self.unpaired_a(pos, r, s, other);
        } else {
            self.unpaired_b(pos, r, other, s);
        }
    }
}

fn change(field: impl Into<String>, a: impl Into<Value>, b: impl Into<Value>) -> Change {
    Change {
        field: field.into(),
        a: a.into(),
        b: b.into(),
    }
}

fn first_line_diff(a: &str, b: &str) -> (usize, String, String) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut n = 1;
    loop {
        match (la.next(), lb.next()) {
            (x, y) if x != y => {
                return (
                    n,
                    x.unwrap_or("<end>").to_string(),
                    y.unwrap_or("<end>").to_string(),
                );
            }
            (None, None) => return (n, String::new(), String::new()),
            _ => n += 1,
        }
    }
}

/// Every leaf where two resolved topologies differ, named by its dotted
/// path (list items by index: `a.b[2].c`; null where a side lacks it);
/// where either is not YAML, the first differing line.
fn topology_changes(a: &str, b: &str) -> Vec<Change> {
    use serde_yaml_ng::Value as Y;
    if a == b {
        return Vec::new();
    }
    let parse = |t: &str| serde_yaml_ng::from_str::<Y>(t).ok();
    let (Some(ya), Some(yb)) = (parse(a), parse(b)) else {
        let (n, x, y) = first_line_diff(a, b);
        return vec![change(format!("(resolved YAML line {n})"), x, y)];
    };
    fn key(k: &Y) -> String {
        match k {
            Y::String(s) => s.clone(),
            Y::Number(n) => n.to_string(),
            Y::Bool(b) => b.to_string(),
            other => format!("{other:?}"),
        }
    }
    fn walk(path: String, a: Option<&Y>, b: Option<&Y>, out: &mut Vec<Change>) {
        let join = |k: String| {
            if path.is_empty() {
                k
            } else {
                format!("{path}.{k}")
            }
        };
        match (a, b) {
            (Some(Y::Mapping(ma)), Some(Y::Mapping(mb))) => {
                // A's keys in order, then those only B has.
                for k in ma.keys().chain(mb.keys().filter(|k| !ma.contains_key(*k))) {
                    walk(join(key(k)), ma.get(k), mb.get(k), out);
                }
            }
            (Some(Y::Sequence(sa)), Some(Y::Sequence(sb))) => {
                for i in 0..sa.len().max(sb.len()) {
                    walk(format!("{path}[{i}]"), sa.get(i), sb.get(i), out);
                }
            }
            (x, y) if x != y => {
                let v = |v: Option<&Y>| v.and_then(|v| serde_json::to_value(v).ok());
                out.push(change(
                    path,
                    v(x).unwrap_or_default(),
                    v(y).unwrap_or_default(),
                ));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(String::new(), Some(&ya), Some(&yb), &mut out);
    out
}

/// Pair the launches of A and B by index (the whole runs when neither
/// has launches; nothing when only one has), each group's rows largest
/// |B - A| first.
fn attribute(a: &SideInfo, b: &SideInfo) -> Vec<Attribution> {
    if (a.launch_count == 0) != (b.launch_count == 0) {
        return Vec::new();
    }
    let run = a.launch_count == 0;
    a.launches
        .iter()
        .zip(&b.launches)
        .enumerate()
        .map(|(i, (x, y))| Attribution {
            launch: (!run).then_some(i),
            kernel: (x.kernel.clone(), y.kernel.clone()),
            span: (x.span, y.span),
            groups: std::array::from_fn(|g| rows(&x.groups[g], &y.groups[g])),
        })
        .collect()
}

/// One row per key of either side, largest |B - A| first, then by key.
fn rows(a: &HashMap<String, Ps>, b: &HashMap<String, Ps>) -> Vec<Row> {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut v: Vec<Row> = keys
        .into_iter()
        .map(|k| Row {
            key: k.clone(),
            a: a.get(k).copied().unwrap_or(0),
            b: b.get(k).copied().unwrap_or(0),
        })
        .collect();
    v.sort_by(|x, y| {
        y.delta()
            .abs()
            .cmp(&x.delta().abs())
            .then_with(|| natural_cmp(&x.key, &y.key))
    });
    v
}

fn meta_changes(a: &SideInfo, b: &SideInfo) -> (Vec<Change>, Vec<Change>) {
    let (ma, mb) = (&a.meta, &b.meta);
    let mut out = Vec::new();
    if ma.tool != mb.tool {
        out.push(change("tool", ma.tool.clone(), mb.tool.clone()));
    }
    if ma.tool_version != mb.tool_version {
        out.push(change(
            "tool_version",
            ma.tool_version.clone(),
            mb.tool_version.clone(),
        ));
    }
    if ma.benchmark != mb.benchmark {
        out.push(change(
            "benchmark",
            ma.benchmark.clone(),
            mb.benchmark.clone(),
        ));
    }
    if ma.seed != mb.seed {
        out.push(change("seed", ma.seed, mb.seed));
    }
    let ta = (&ma.topology.name, &ma.topology.address_model);
    let tb = (&mb.topology.name, &mb.topology.address_model);
    if ta.0 != tb.0 {
        out.push(change("topology.name", ta.0.clone(), tb.0.clone()));
    }
    if ta.1 != tb.1 {
        out.push(change("topology.address_model", ta.1.clone(), tb.1.clone()));
    }
    let pa: BTreeMap<&str, &str> = ma
        .params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let pb: BTreeMap<&str, &str> = mb
        .params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for k in pa
        .keys()
        .chain(pb.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (x, y) = (pa.get(k), pb.get(k));
        if x != y {
            out.push(change(
                format!("params.{k}"),
                x.map_or(Value::Null, |s| json!(s)),
                y.map_or(Value::Null, |s| json!(s)),
            ));
        }
    }
    let tensor_json = |t: &kb_format::TensorMeta| {
        json!({
            "dtype": t.dtype.name(), "shape": t.shape, "address": format!("{:#x}", t.address),
            "host_data": t.host_data, "shards": t.shards.len(),
        })
    };
    let names: std::collections::BTreeSet<&str> = ma
        .tensors
        .iter()
        .chain(&mb.tensors)
        .map(|t| t.name.as_str())
        .collect();
    for n in names {
        let x = ma.tensor(n);
        let y = mb.tensor(n);
        match (x, y) {
            (Some((ia, ta)), Some((ib, tb))) => {
                if ta != tb {
                    out.push(change(
                        format!("tensors.{n}"),
                        tensor_json(ta),
                        tensor_json(tb),
                    ));
                }
                let ha = a.tensor_hash.get(ia as usize).copied().flatten();
                let hb = b.tensor_hash.get(ib as usize).copied().flatten();
                if ha != hb {
                    let h = |v: Option<u64>| v.map_or(Value::Null, |v| json!(format!("{v:#018x}")));
                    out.push(change(format!("tensor_data.{n}"), h(ha), h(hb)));
                }
            }
            (x, y) => out.push(change(
                format!("tensors.{n}"),
                x.map_or(Value::Null, |t| tensor_json(t.1)),
                y.map_or(Value::Null, |t| tensor_json(t.1)),
            )),
        }
    }
    if a.verify != b.verify {
        let v = |s: &VerifySpec| {
            Value::from(
                s.outputs
                    .iter()
                    .map(|o| format!("{} = {}", o.tensor, expr_string(&o.reference)))
                    .collect::<Vec<_>>(),
            )
        };
        out.push(change("verify", v(&a.verify), v(&b.verify)));
    }
    let mut notes = Vec::new();
    if ma.command_line != mb.command_line {
        notes.push(change(
            "command_line",
            ma.command_line.clone(),
            mb.command_line.clone(),
        ));
    }
    (out, notes)
}

/// Compare two traces.
pub fn compare(a: &Input, b: &Input) -> Result<Report> {
    if a.is_stdin() && b.is_stdin() {
        return Err(Error::usage(
            "diff: at most one of the two traces can be standard input (-)",
        ));
    }
    let (txa, rxa) = sync_channel::<Batch>(8);
    let (txb, rxb) = sync_channel::<Batch>(8);
    let (pairing, pos_a, pos_b, ia, ib) = std::thread::scope(|sc| {
        let ha = sc.spawn(move || produce(a, txa));
        let hb = sc.spawn(move || produce(b, txb));
        let mut ca = Cursor {
            rx: rxa,
            strings: Strings::default(),
            buf: Vec::new().into_iter(),
        };
        let mut cb = Cursor {
            rx: rxb,
            strings: Strings::default(),
            buf: Vec::new().into_iter(),
        };
        let mut p = Pairing::default();
        let (mut na, mut nb) = (0u64, 0u64);
        loop {
            let (ra, rb) = (ca.next(), cb.next());
            match (ra, rb) {
                (None, None) => break,
                (Some(x), Some(y)) => {
                    p.compare(na, x, &ca.strings, y, &cb.strings);
                    na += 1;
                    nb += 1;
                }
                (Some(x), None) => {
                    p.extra(na, x, &ca.strings, true, &cb.strings);
                    na += 1;
                }
                (None, Some(y)) => {
                    p.extra(nb, y, &cb.strings, false, &ca.strings);
                    nb += 1;
                }
            }
        }
        // Close the channels so that a producer still sending fails fast.
        drop(ca);
        drop(cb);
        let ia = ha.join().expect("diff reader thread panicked");
        let ib = hb.join().expect("diff reader thread panicked");
        (p, na, nb, ia, ib)
    });
    let (ia, ib) = (ia?, ib?);
    debug_assert_eq!((pos_a, pos_b), (ia.records, ib.records));
    let (meta, notes) = meta_changes(&ia, &ib);
    let topology = topology_changes(&ia.meta.topology.resolved, &ib.meta.topology.resolved);
    let unpaired = if pairing.incomplete {
        (0, 0)
    } else {
        (
            pairing.pending_a.len() as u64,
            pairing.pending_b.len() as u64,
        )
    };
    Ok(Report {
        a: a.to_string(),
        b: b.to_string(),
        meta,
        topology,
        notes,
        sim_time: (ia.sim_time, ib.sim_time),
        records: (ia.records, ib.records),
        launch_counts: (ia.launch_count, ib.launch_count),
        attribution: attribute(&ia, &ib),
        timing: pairing.timing,
        other: pairing.other,
        data: pairing.data,
        unpaired,
        data_incomplete: pairing.incomplete,
    })
}

/// `d` ps in ns with its sign: `+1.500`, `-0.250`.
fn signed(d: i128) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!(
        "{sign}{}",
        ns(d.unsigned_abs().min(u64::MAX as u128) as u64)
    )
}

/// B - A relative to A: `+1.62 %`, or `new` where A is 0.
fn rel(a: Ps, b: Ps) -> String {
    let d = b as i128 - a as i128;
    match (a, d) {
        (_, 0) => "+0.00 %".into(),
        (0, _) => "new".into(),
        _ => format!("{:+.2} %", d as f64 * 100.0 / a as f64),
    }
}

/// `A -> B (B - A, relative)` in ns.
fn change_ns((a, b): (Ps, Ps)) -> String {
    format!(
        "{} ns -> {} ns ({} ns, {})",
        ns(a),
        ns(b),
        signed(b as i128 - a as i128),
        rel(a, b)
    )
}

/// Rows shown per grouping in text (JSON lists all).
const SHOWN: usize = 8;
const GROUP_TITLES: [&str; 3] = ["unit kind", "route (memory ops)", "op name"];

impl Attribution {
    fn to_json(&self) -> Value {
        let rows = |v: &Vec<Row>| {
            v.iter()
                .map(|r| json!({"key": r.key, "a": r.a, "b": r.b, "delta": r.delta()}))
                .collect::<Vec<_>>()
        };
        let busy: serde_json::Map<String, Value> = GROUPINGS
            .iter()
            .zip(&self.groups)
            .map(|(g, v)| (g.to_string(), rows(v).into()))
            .collect();
        json!({
            "launch": self.launch,
            "kernel": {"a": self.kernel.0, "b": self.kernel.1},
            "span_ps": {"a": self.span.0, "b": self.span.1,
                "delta": self.span.1 as i128 - self.span.0 as i128},
            "busy_ps": busy,
        })
    }

    fn write_text(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let (ka, kb) = &self.kernel;
        let what = match self.launch {
            None => "whole run (no launches)".to_string(),
            Some(i) if ka == kb => format!("launch #{i} {ka}"),
            Some(i) => {
                format!("launch #{i} {ka} in A, {kb} in B (kernels differ; paired by index)")
            }
        };
        writeln!(w, "{what}: span {}", change_ns(self.span))?;
        for (title, v) in GROUP_TITLES.iter().zip(&self.groups) {
            let changed: Vec<&Row> = v.iter().filter(|r| r.a != r.b).collect();
            if changed.is_empty() {
                writeln!(w, "  busy by {title}: no change")?;
                continue;
            }
            let shown = &changed[..changed.len().min(SHOWN)];
            let kw = shown.iter().map(|r| r.key.len()).max().unwrap_or(0).max(8);
            writeln!(
                w,
                "  busy by {title}:\n    {:kw$}  {:>14}  {:>14}  {:>14}",
                "", "A ns", "B ns", "B - A ns"
            )?;
            for r in shown {
                writeln!(
                    w,
                    "    {:kw$}  {:>14}  {:>14}  {:>14}  ({})",
                    r.key,
                    ns(r.a),
                    ns(r.b),
                    signed(r.delta()),
                    rel(r.a, r.b)
                )?;
            }
            if changed.len() > SHOWN {
                writeln!(
                    w,
                    "    ... {} more changed (--format json lists all)",
                    changed.len() - SHOWN
                )?;
            }
        }
        Ok(())
    }
}

fn div_json(d: &Option<Divergence>) -> Value {
    match d {
        None => Value::Null,
        Some(d) => json!({
            "position": d.position,
            "op_id": d.op_id(),
            "fields": d.fields,
            "a": d.a.as_ref().map(|s| s.json.clone()),
            "b": d.b.as_ref().map(|s| s.json.clone()),
        }),
    }
}

impl Report {
    pub fn to_json(&self) -> Value {
        let ch = |v: &Vec<Change>| {
            v.iter()
                .map(|c| json!({"field": c.field, "a": c.a, "b": c.b}))
                .collect::<Vec<_>>()
        };
        json!({
            "a": self.a,
            "b": self.b,
            "identical": self.identical(),
            "meta": ch(&self.meta),
            "topology": self.topology.iter()
                .map(|c| json!({"path": c.field, "a": c.a, "b": c.b}))
                .collect::<Vec<_>>(),
            "notes": ch(&self.notes),
            "sign": "B - A",
            "sim_time_ps": {"a": self.sim_time.0, "b": self.sim_time.1,
                "delta": self.sim_time.1 as i128 - self.sim_time.0 as i128},
            "records": {"a": self.records.0, "b": self.records.1},
            "launches": {"a": self.launch_counts.0, "b": self.launch_counts.1},
            "attribution": self.attribution.iter().map(Attribution::to_json).collect::<Vec<_>>(),
            "first_timing_divergence": div_json(&self.timing),
            "first_record_divergence": div_json(&self.other),
            "first_data_divergence": div_json(&self.data),
            "unpaired_ops": {"a": self.unpaired.0, "b": self.unpaired.1},
            "data_comparison_incomplete": self.data_incomplete,
        })
    }

    /// Where the time went, launch by launch.
    fn write_attribution(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let (na, nb) = self.launch_counts;
        if na != nb {
            let compared = if na == 0 || nb == 0 {
                "no launch is compared".to_string()
            } else {
                format!("the first {} are compared, by index", na.min(nb))
            };
            writeln!(w, "launches differ: A has {na}, B has {nb}; {compared}")?;
        }
        if self.attribution.is_empty() {
            return Ok(());
        }
        writeln!(
            w,
            "where the time went (B - A: positive = more time in B; busy = the sum over units \
             of each unit's busy time in the launch's window):"
        )?;
        for a in &self.attribution {
            a.write_text(w)?;
        }
        Ok(())
    }

    pub fn write_text(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let verdict = if self.identical() {
            "identical"
        } else {
            "different"
        };
        writeln!(w, "A: {}\nB: {}\nresult: {verdict}", self.a, self.b)?;
        if !self.meta.is_empty() {
            writeln!(w, "metadata:")?;
            for c in &self.meta {
                writeln!(w, "  {}: {} -> {}", c.field, c.a, c.b)?;
            }
        }
        if !self.topology.is_empty() {
            writeln!(w, "topology (resolved, by field path):")?;
            for c in &self.topology {
                writeln!(w, "  {}: {} -> {}", c.field, c.a, c.b)?;
            }
        }
        for c in &self.notes {
            writeln!(w, "note: {} differs: {} -> {}", c.field, c.a, c.b)?;
        }
        writeln!(w, "simulated time: {}", change_ns(self.sim_time))?;
        writeln!(w, "records: {} -> {}", self.records.0, self.records.1)?;
        self.write_attribution(w)?;
        let div = |w: &mut dyn Write, title: &str, d: &Option<Divergence>| -> std::io::Result<()> {
            match d {
                None => writeln!(w, "{title}: none"),
                Some(d) => {
                    let what = if d.a.is_some() && d.b.is_some() {
                        format!("differs in {}", d.fields.join(", "))
                    } else {
                        d.fields.join(", ")
                    };
                    writeln!(
                        w,
                        "{title}: op {} (record #{}; {what})",
                        d.op_id().map_or("?".into(), |i| i.to_string()),
                        d.position,
                    )?;
                    let line = |s: &Option<Shown>| {
                        s.as_ref().map_or("<no record>".into(), |s| s.line.clone())
                    };
                    writeln!(w, "  A: {}", line(&d.a))?;
                    writeln!(w, "  B: {}", line(&d.b))
                }
            }
        };
        div(w, "first divergent op by timing", &self.timing)?;
        div(w, "first divergent op by params/effects", &self.other)?;
        div(w, "first divergent op by data fingerprint", &self.data)?;
        if self.unpaired != (0, 0) {
            writeln!(
                w,
                "ops without a partner (by op id): {} only in A, {} only in B",
                self.unpaired.0, self.unpaired.1
            )?;
        }
        if self.data_incomplete {
            writeln!(
                w,
                "note: the traces diverge too far to pair every op by id; the fingerprint comparison is incomplete"
            )?;
        }
        Ok(())
    }
}

/// Output format of `diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// Run `diff`: print the report; returns true when the traces are identical.
pub fn run(a: &Input, b: &Input, format: Format, w: &mut dyn Write) -> Result<bool> {
    let r = compare(a, b)?;
    match format {
        Format::Text => r.write_text(w).map_err(out_err)?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut *w, &r.to_json())
                .map_err(|e| out_err(std::io::Error::other(e)))?;
            writeln!(w).map_err(out_err)?;
        }
    }
    Ok(r.identical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, Op};

    fn files(a: &[u8], b: &[u8]) -> (tempfile::TempDir, Input, Input) {
        let d = tempfile::tempdir().unwrap();
        let (pa, pb) = (d.path().join("a.kbt"), d.path().join("b.kbt"));
        std::fs::write(&pa, a).unwrap();
        std::fs::write(&pb, b).unwrap();
        (d, Input::Path(pa), Input::Path(pb))
    }

    fn trace(ops: &[Op]) -> Vec<u8> {
        testutil::build_with_launches(
            &testutil::sample_meta(),
            &testutil::sample_tensors(),
            ops,
            &testutil::sample_launches(),
            &testutil::sample_verify(),
        )
    }

    #[test]
    fn identical_traces() {
        let t = testutil::sample_trace();
        let mut meta = testutil::sample_meta();
        meta.command_line.push("-o=other.kbt".into());
        let t2 = testutil::build_with_launches(
            &meta,
            &testutil::sample_tensors(),
            &testutil::sample_ops(),
            &testutil::sample_launches(),
            &testutil::sample_verify(),
        );
        let (_d, a, b) = files(&t, &t2);
        let r = compare(&a, &b).unwrap();
        assert!(r.identical(), "{r:#?}");
        assert_eq!(r.notes.len(), 1); // the command line, a note only
        let mut out = Vec::new();
        assert!(run(&a, &b, Format::Text, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("result: identical"), "{text}");
    }

    #[test]
    fn timing_divergence_names_the_first_op_with_both_records() {
        let mut ops = testutil::sample_ops();
        ops[4].rec.t_end += 500; // op 4 (dma_write) ends later
        ops[6].rec.t_end += 500;
        let (_d, a, b) = files(&testutil::sample_trace(), &trace(&ops));
        let r = compare(&a, &b).unwrap();
        assert!(!r.identical());
        let t = r.timing.as_ref().unwrap();
        assert_eq!(t.op_id(), Some(4));
        assert_eq!(t.position, 4);
        assert_eq!(t.fields, ["t_end"]);
        assert_eq!(t.a.as_ref().unwrap().json["t_end_ps"], 6000);
        assert_eq!(t.b.as_ref().unwrap().json["t_end_ps"], 6500);
        assert!(r.data.is_none());
        assert_eq!(r.sim_time, (10_000, 10_500));
        // Op 4 [5000, 6000) lay between the launches ([0, 5000) and [6000,
        // 7000)); in B it reaches into launch 1 by 500 ps, all active.
        assert_eq!(r.attribution.len(), 2);
        assert!(r.attribution[0].identical());
        let pe_dma = &r.attribution[1].groups[0][0];
        assert_eq!(
            (pe_dma.key.as_str(), pe_dma.a, pe_dma.b),
            ("pe_dma", 0, 500)
        );
        let mut out = Vec::new();
        assert!(!run(&a, &b, Format::Text, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("first divergent op by timing: op 4 (record #4; differs in t_end)"),
            "{text}"
        );
        assert!(text.contains("  A: op 4 [5.000 .. 6.000 ns]"), "{text}");
        assert!(text.contains("  B: op 4 [5.000 .. 6.500 ns]"), "{text}");
        let mut out = Vec::new();
        run(&a, &b, Format::Json, &mut out).unwrap();
        let j: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(j["identical"], false);
        assert_eq!(j["first_timing_divergence"]["op_id"], 4);
        assert_eq!(j["first_timing_divergence"]["b"]["t_end_ps"], 6500);
        assert_eq!(j["sim_time_ps"]["delta"], 500);
    }

    #[test]
    fn fingerprint_divergence_names_the_first_op_with_both_records() {
        let mut ops = testutil::sample_ops();
        ops[2].rec.fingerprint = Some(0xdead);
        ops[6].rec.fingerprint = Some(0xbeef);
        let (_d, a, b) = files(&testutil::sample_trace(), &trace(&ops));
        let r = compare(&a, &b).unwrap();
        assert!(!r.identical());
        assert!(r.timing.is_none());
        let d = r.data.as_ref().unwrap();
        assert_eq!(d.op_id(), Some(2));
        assert_eq!(
            d.a.as_ref().unwrap().json["fingerprint"],
            "0x0000000000001002"
        );
        assert_eq!(
            d.b.as_ref().unwrap().json["fingerprint"],
            "0x000000000000dead"
        );
        assert!(r.attribution.iter().all(Attribution::identical));
    }

    #[test]
    fn a_dependency_of_another_kind_is_a_divergence() {
        // The same edge 2 <- 1, for another reason: the records differ.
        let mut ops = testutil::sample_ops();
        ops[2].rec.deps[0].kind = kb_format::DepKind::Resource;
        let (_d, a, b) = files(&trace(&testutil::sample_ops()), &trace(&ops));
        let r = compare(&a, &b).unwrap();
        assert!(!r.identical());
        assert!(r.timing.is_none());
        let o = r.other.as_ref().unwrap();
        assert_eq!(
            (o.op_id(), o.fields.as_slice()),
            (Some(2), &["deps".to_string()][..])
        );
        assert_eq!(o.b.as_ref().unwrap().json["deps"][0]["kind"], "resource");
        assert!(o.b.as_ref().unwrap().line.ends_with(" deps 1:resource"));
    }

    #[test]
    fn fingerprints_pair_by_op_id_after_a_reordering() {
        // B runs op 1 later than op 2: positions shift, ids still pair.
        let mut ops = testutil::sample_ops();
        ops[1].rec.t_start = 2500;
        ops[1].rec.t_end = 3500;
        ops[2].rec.fingerprint = Some(0x77);
        let (_d, a, b) = files(&testutil::sample_trace(), &trace(&ops));
        let r = compare(&a, &b).unwrap();
        let t = r.timing.as_ref().unwrap();
        assert_eq!(t.position, 1);
        assert!(t.fields.contains(&"op_id".to_string()));
        let d = r.data.as_ref().unwrap();
        assert_eq!(d.op_id(), Some(2));
        assert_eq!(d.b.as_ref().unwrap().json["op_id"], 2);
        assert_eq!(r.unpaired, (0, 0));
    }

    #[test]
    fn metadata_and_length_differences() {
        let mut meta = testutil::sample_meta();
        meta.seed = 8;
        meta.params[1].1 = "8".into();
        meta.params.push(("extra".into(), "1".into()));
        meta.tool_version = "0.2.0".into();
        meta.topology.resolved = "sips: 1\ncubes: 4\n".into();
        let mut tensors = testutil::sample_tensors();
        tensors[2].2[0] ^= 1;
        let ops = &testutil::sample_ops()[..5];
        let b = testutil::build(&meta, &tensors, ops, &testutil::sample_verify());
        let (_d, a, bi) = files(&testutil::sample_trace(), &b);
        let r = compare(&a, &bi).unwrap();
        let fields: Vec<&str> = r.meta.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            r.topology,
            [change("cubes", 2, 4)],
            "the resolved topology's leaf, by path"
        );
        assert_eq!(
            fields,
            [
                "tool_version",
                "seed",
                "params.extra",
                "params.seed",
                "tensor_data.b"
            ]
        );
        assert_eq!(r.records, (7, 5));
        let t = r.timing.as_ref().unwrap();
        assert_eq!(t.op_id(), Some(5));
        assert_eq!(t.fields, ["only in A"]);
        assert!(t.b.is_none());
        let mut out = Vec::new();
        r.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("first divergent op by timing: op 5 (record #5; only in A)\n  A: op 5 ["),
            "{text}"
        );
        assert!(text.contains("  B: <no record>"), "{text}");
        assert_eq!(r.unpaired, (2, 0));
    }

    #[test]
    fn topology_changes_are_named_by_field_path() {
        let a = "name: t\nlinks:\n  cube_link:\n    bw_gbs: 256.0\n    latency_ns: 20.0\n\
                 hbm:\n  channels: [1, 2, 3]\nold: 1\n";
        let b = "name: t\nlinks:\n  cube_link:\n    bw_gbs: 32.0\n    latency_ns: 20.0\n\
                 hbm:\n  channels: [1, 5]\nnew: {x: 1}\n";
        assert_eq!(
            topology_changes(a, b),
            [
                change("links.cube_link.bw_gbs", 256.0, 32.0),
                change("hbm.channels[1]", 2, 5),
                change("hbm.channels[2]", 3, Value::Null),
                change("old", 1, Value::Null),
                change("new", Value::Null, json!({"x": 1})),
            ]
        );
        assert!(topology_changes(a, a).is_empty());
        // Not YAML on one side: the first differing line.
        assert_eq!(
            topology_changes(a, "name: t\nlinks: [\n"),
            [change("(resolved YAML line 2)", "links:", "links: [")]
        );
    }

    /// One launch `k` on PE0 and PE1 (times in ps); B's ipcq_copy moves
    /// its bytes 2000 ps longer and the launch ends 1000 ps later.
    ///
    /// | id | component | name | span A | active A | span B | active B | route |
    /// |---|---|---|---|---|---|---|---|
    /// | 0 | host | h2d | 0..2000 | all | same | | host -> sip0.cube0.hbm |
    /// | 1 | pe0.pe_dma | dma_read | 1000..3000 | all | same | | sip0.cube0.hbm -> sip0.cube0.pe0.tcm |
    /// | 2 | pe1.pe_dma | dma_read | 1000..2000 | all | same | | sip0.cube0.hbm -> sip0.cube0.pe1.tcm |
    /// | 3 | pe0.pe_cpu | kernel (sync) | 1000..9000 | - | 1000..10000 | - | |
    /// | 4 | pe1.pe_dma | ipcq_copy | 2000..4000 | 3000..4000 | 2000..6000 | 3000..6000 | sip0.cube0.pe1.tcm -> sip0.cube1.pe0.tcm |
    /// | 5 | pe0.pe_gemm | gemm | 3000..5000 | all | 6000..8000 | all | |
    fn attribution_trace(b: bool) -> Vec<u8> {
        use kb_format::Space;
        let hbm = testutil::dev(Space::Hbm, 0, 0, 0, 0);
        let tcm = |cube, pe| testutil::dev(Space::Tcm, 0, cube, pe, 0);
        let (pe0_dma, pe1_dma) = ("sip0.cube0.pe0.pe_dma", "sip0.cube0.pe1.pe_dma");
        let copy = |id, t0, t1, comp, name, src, dst| {
            testutil::copy(id, t0, t1, comp, name, &[src], &[dst], 64, 1)
        };
        let mut ipcq = copy(4, 2000, 4000, pe1_dma, "ipcq_copy", tcm(0, 1), tcm(1, 0));
        ipcq.rec.active = Some((3000, 4000));
        let mut gemm = testutil::gemm(5, 3000, 5000, "sip0.cube0.pe0.pe_gemm", 2, 2, 2);
        let mut kernel = testutil::sync(3, 1000, 9000, "sip0.cube0.pe0.pe_cpu", "kernel");
        let mut end = 9000;
        if b {
            ipcq.rec.t_end = 6000;
            ipcq.rec.active = Some((3000, 6000));
            (gemm.rec.t_start, gemm.rec.t_end) = (6000, 8000);
            kernel.rec.t_end = 10_000;
            end = 10_000;
        }
        let ops = [
            copy(0, 0, 2000, "host", "h2d", kb_format::pa::host(0, 0), hbm),
            copy(1, 1000, 3000, pe0_dma, "dma_read", hbm, tcm(0, 0)),
            copy(2, 1000, 2000, pe1_dma, "dma_read", hbm, tcm(0, 1)),
            kernel,
            ipcq,
            gemm,
        ];
        let launch = kb_format::Launch {
            kernel: "k".into(),
            grid: [2, 1, 1],
            pes: vec![[0, 0, 0], [0, 0, 1]],
            t_start: 1000,
            t_end: end,
            flops: 0,
            useful_flops: 0,
        };
        testutil::build_with_launches(
            &testutil::sample_meta(),
            &[],
            &ops,
            &[launch],
            &VerifySpec::default(),
        )
    }

    #[test]
    fn attribution_sums_units_busy_time_per_launch_with_b_minus_a() {
        let (_d, a, b) = files(&attribution_trace(false), &attribution_trace(true));
        let r = compare(&a, &b).unwrap();
        assert_eq!(r.launch_counts, (1, 1));
        let at = &r.attribution[0];
        assert_eq!(
            (at.launch, at.span, at.kernel.0.as_str()),
            (Some(0), (8000, 9000), "k")
        );
        let row = |k: &str, a, b| Row {
            key: k.into(),
            a,
            b,
        };
        // Window [1000, 9000) in A, [1000, 10000) in B. pe_dma: pe0 2000
        // + pe1 (1000 + 1000) = 4000 in A, pe0 2000 + pe1 (1000 + 3000) =
        // 6000 in B (summed over units: their union would be 3000 in A).
        // host: h2d clipped to [1000, 2000) = 1000. The kernel record
        // (sync) is never busy.
        assert_eq!(
            at.groups[0],
            [
                row("pe_dma", 4000, 6000),
                row("host", 1000, 1000),
                row("pe_gemm", 2000, 2000),
            ]
        );
        assert_eq!(
            at.groups[1],
            [
                row("sip0.cube0.pe1.tcm -> sip0.cube1.pe0.tcm", 1000, 3000),
                row("host -> sip0.cube0.hbm", 1000, 1000),
                row("sip0.cube0.hbm -> sip0.cube0.pe0.tcm", 2000, 2000),
                row("sip0.cube0.hbm -> sip0.cube0.pe1.tcm", 1000, 1000),
            ]
        );
        // dma_read on two units: 2000 + 1000.
        assert_eq!(
            at.groups[2],
            [
                row("ipcq_copy", 1000, 3000),
                row("dma_read", 3000, 3000),
                row("gemm", 2000, 2000),
                row("h2d", 1000, 1000),
            ]
        );
        assert_eq!(at.groups[3][0], row("sip0.cube0.pe1.pe_dma", 2000, 4000));
        assert!(!r.identical());

        let mut out = Vec::new();
        r.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "launch #0 k: span 8.000 ns -> 9.000 ns (+1.000 ns, +12.50 %)\n",
            "    pe_dma             4.000           6.000          +2.000  (+50.00 %)\n",
            "  busy by route (memory ops):\n",
            "    ipcq_copy           1.000           3.000          +2.000  (+200.00 %)\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(text.contains("B - A: positive = more time in B"), "{text}");
        // Rows that did not change are left out of the text.
        assert!(!text.contains("    pe_gemm"), "{text}");

        let mut out = Vec::new();
        run(&a, &b, Format::Json, &mut out).unwrap();
        let j: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(j["sign"], "B - A");
        let l = &j["attribution"][0];
        assert_eq!(l["span_ps"], json!({"a": 8000, "b": 9000, "delta": 1000}));
        assert_eq!(
            l["busy_ps"]["unit_kind"][0],
            json!({"key": "pe_dma", "a": 4000, "b": 6000, "delta": 2000})
        );
        assert_eq!(l["busy_ps"]["component"][0]["key"], "sip0.cube0.pe1.pe_dma");
        // Swapped, every delta flips sign.
        let r2 = compare(&b, &a).unwrap();
        assert_eq!(r2.attribution[0].groups[0][0].delta(), -2000);
    }

    #[test]
    fn differing_launches_are_said() {
        let mut launches = testutil::sample_launches();
        launches[1].kernel = "other".into();
        let b = testutil::build_with_launches(
            &testutil::sample_meta(),
            &testutil::sample_tensors(),
            &testutil::sample_ops(),
            &launches,
            &testutil::sample_verify(),
        );
        let (_d, pa, pb) = files(&testutil::sample_trace(), &b);
        let r = compare(&pa, &pb).unwrap();
        assert!(!r.identical(), "a different kernel is a difference");
        let mut out = Vec::new();
        r.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "launch #1 softmax in A, other in B (kernels differ; paired by index): span"
            ),
            "{text}"
        );
        // One launch fewer in B.
        let b = testutil::build_with_launches(
            &testutil::sample_meta(),
            &testutil::sample_tensors(),
            &testutil::sample_ops(),
            &launches[..1],
            &testutil::sample_verify(),
        );
        let (_d, pa, pb) = files(&testutil::sample_trace(), &b);
        let r = compare(&pa, &pb).unwrap();
        assert_eq!((r.launch_counts, r.attribution.len()), ((2, 1), 1));
        let mut out = Vec::new();
        r.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("launches differ: A has 2, B has 1; the first 1 are compared, by index"),
            "{text}"
        );
    }

    #[test]
    fn both_on_stdin_is_an_error() {
        let e = compare(&Input::Stdin, &Input::Stdin).unwrap_err();
        assert!(e.to_string().contains("standard input"));
    }

    #[test]
    fn a_corrupt_side_is_an_error_not_a_report() {
        let t = testutil::sample_trace();
        let mut bad = t.clone();
        let n = bad.len();
        bad[n / 2] ^= 0xff;
        let (_d, a, b) = files(&t, &bad);
        let e = compare(&a, &b).unwrap_err();
        assert!(matches!(e, Error::Trace { .. }), "{e}");
        assert!(e.to_string().contains("b.kbt"), "{e}");
    }
}
