//! `diff A B`: how two traces differ.
//!
//! Reported, each as a difference (exit 1) when present:
//! - run metadata: tool and version, benchmark, seed, params (by key),
//!   topology (name, address model, resolved YAML), tensors (by name),
//!   host tensor data (by content hash), the verification spec. The command
//!   line is shown as a note only (two runs writing different output files
//!   are still the same run);
//! - simulated time and record counts, and busy time per component (the
//!   union of its op intervals, as in `stats`) where it differs;
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

use kb_format::{Fingerprinter, Meta, Ps, Record, Strings, VerifySpec};
use serde_json::{Value, json};

use crate::render::{expr_string, natural_cmp, ns, record_json, record_line};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::stats::{Collector, GroupBy};
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

/// Busy time of one component in each trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyDelta {
    pub component: String,
    pub a: Option<Ps>,
    pub b: Option<Ps>,
}

impl BusyDelta {
    pub fn delta(&self) -> i128 {
        self.b.unwrap_or(0) as i128 - self.a.unwrap_or(0) as i128
    }
}

/// The result of a diff.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub a: String,
    pub b: String,
    pub meta: Vec<Change>,
    /// Informational differences (command line).
    pub notes: Vec<Change>,
    pub sim_time: (Ps, Ps),
    pub records: (u64, u64),
    pub busy: Vec<BusyDelta>,
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
            && self.sim_time.0 == self.sim_time.1
            && self.records.0 == self.records.1
            && self.busy.is_empty()
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

/// What a producer knows at the end of its trace.
#[derive(Debug, Default)]
struct SideInfo {
    meta: Meta,
    verify: VerifySpec,
    records: u64,
    sim_time: Ps,
    busy: HashMap<String, Ps>,
    tensor_hash: Vec<Option<u64>>,
}

struct Producer {
    tx: SyncSender<Batch>,
    batch: Vec<Record>,
    sent_strings: usize,
    busy: Collector,
    hashers: Vec<Option<Fingerprinter>>,
    info: SideInfo,
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
        self.busy.add(r);
        self.info.records += 1;
        self.info.sim_time = self.info.sim_time.max(r.t_end);
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
        self.info.busy = self
            .busy
            .finish(end.strings)
            .rows
            .into_iter()
            .map(|r| (r.key, r.busy))
            .collect();
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
        busy: Collector::new(GroupBy::Component),
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
    if ma.topology.resolved != mb.topology.resolved {
        let (n, x, y) = first_line_diff(&ma.topology.resolved, &mb.topology.resolved);
        out.push(change(format!("topology.resolved line {n}"), x, y));
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
    let mut busy: Vec<BusyDelta> = ia
        .busy
        .keys()
        .chain(ib.busy.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| BusyDelta {
            component: k.clone(),
            a: ia.busy.get(k).copied(),
            b: ib.busy.get(k).copied(),
        })
        .filter(|d| d.a != d.b)
        .collect();
    busy.sort_by(|x, y| {
        y.delta()
            .abs()
            .cmp(&x.delta().abs())
            .then_with(|| natural_cmp(&x.component, &y.component))
    });
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
        notes,
        sim_time: (ia.sim_time, ib.sim_time),
        records: (ia.records, ib.records),
        busy,
        timing: pairing.timing,
        other: pairing.other,
        data: pairing.data,
        unpaired,
        data_incomplete: pairing.incomplete,
    })
}

fn signed_ns(d: i128) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{} ns", ns(d.unsigned_abs() as u64))
}

fn opt_ns(v: Option<Ps>) -> String {
    v.map_or("-".into(), |v| format!("{} ns", ns(v)))
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
            "notes": ch(&self.notes),
            "sim_time_ps": {"a": self.sim_time.0, "b": self.sim_time.1,
                "delta": self.sim_time.1 as i128 - self.sim_time.0 as i128},
            "records": {"a": self.records.0, "b": self.records.1},
            "busy_ps": self.busy.iter().map(|d| json!({
                "component": d.component, "a": d.a, "b": d.b, "delta": d.delta(),
            })).collect::<Vec<_>>(),
            "first_timing_divergence": div_json(&self.timing),
            "first_record_divergence": div_json(&self.other),
            "first_data_divergence": div_json(&self.data),
            "unpaired_ops": {"a": self.unpaired.0, "b": self.unpaired.1},
            "data_comparison_incomplete": self.data_incomplete,
        })
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
        for c in &self.notes {
            writeln!(w, "note: {} differs: {} -> {}", c.field, c.a, c.b)?;
        }
        let (ta, tb) = self.sim_time;
        writeln!(
            w,
            "simulated time: {} ns -> {} ns ({})",
            ns(ta),
            ns(tb),
            signed_ns(tb as i128 - ta as i128)
        )?;
        writeln!(w, "records: {} -> {}", self.records.0, self.records.1)?;
        if self.busy.is_empty() {
            writeln!(w, "busy time by component: no differences")?;
        } else {
            writeln!(
                w,
                "busy time by component ({} differ, largest first):",
                self.busy.len()
            )?;
            for d in self.busy.iter().take(20) {
                writeln!(
                    w,
                    "  {}: {} -> {} ({})",
                    d.component,
                    opt_ns(d.a),
                    opt_ns(d.b),
                    signed_ns(d.delta())
                )?;
            }
            if self.busy.len() > 20 {
                writeln!(
                    w,
                    "  ... {} more (--format json lists all)",
                    self.busy.len() - 20
                )?;
            }
        }
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
        testutil::build(
            &testutil::sample_meta(),
            &testutil::sample_tensors(),
            ops,
            &testutil::sample_verify(),
        )
    }

    #[test]
    fn identical_traces() {
        let t = testutil::sample_trace();
        let mut meta = testutil::sample_meta();
        meta.command_line.push("-o=other.kbt".into());
        let t2 = testutil::build(
            &meta,
            &testutil::sample_tensors(),
            &testutil::sample_ops(),
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
        let dma = r
            .busy
            .iter()
            .find(|d| d.component == testutil::PE_DMA)
            .unwrap();
        // Busy is pe_dma's active time (testutil::sample_ops): 1900 ps.
        assert_eq!((dma.a, dma.b, dma.delta()), (Some(1900), Some(2400), 500));
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
        assert!(r.busy.is_empty());
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
            fields,
            [
                "tool_version",
                "seed",
                "topology.resolved line 2",
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
