//! `timeline`: Chrome trace-event JSON (`{"traceEvents": [...]}`) that
//! Perfetto UI and chrome://tracing open.
//!
//! - Every op is a complete event (`"ph": "X"`) with `ts` and `dur` in
//!   **microseconds**, `name` = op name, `cat` = op kind, and `args` = op
//!   id, exact start and end in picoseconds, component, bytes, FLOPs and
//!   fingerprint. Memory ops always carry `bytes` (write extent bytes,
//!   even 0) and `route` (`SRC -> DST`, as `stats --by route` names it:
//!   where the copy went); other ops carry bytes and FLOPs when non-zero.
//!   `ts` and the event end are rounded to the nearest
//!   nanosecond (half up) and written as exact decimals: Perfetto keeps
//!   integer nanoseconds, rounding each of `ts` and `dur`, so sub-ns
//!   values would make back-to-back ops overlap after its rounding.
//! - Processes: one per `sipN.cubeM` (components `sipN.cubeM.*`), one per
//!   SIP for SIP-level components (`sipN.*`, e.g. `sipN.pcie_ep`), and one
//!   named `host` for everything else. Named by `process_name` metadata
//!   events and ordered by `process_sort_index`.
//! - Tracks (threads): one per component, named by `thread_name` metadata
//!   with the component name minus its process prefix (`pe3.pe_dma`).
//!   Perfetto requires complete events on one thread to nest, so ops that
//!   overlap on one component (pipelined DMA, concurrent channels) are
//!   placed greedily on extra lanes, separate tracks named `pe3.pe_dma#1`,
//!   `#2`...: complete events on one track never overlap (in the rounded
//!   nanoseconds written, and so in Perfetto).
//! - HBM pseudo channels: one track per channel that served anything
//!   (`hbm_ctrl.chN` in its cube's process), a `busy` event (category
//!   `hbm_channel`) per interval the channel was serving, from the trace's
//!   channels chunk. The time window selects intervals as it selects ops;
//!   a component glob selects channels by the name
//!   `sipS.cubeC.hbm_ctrl.chN`; a name or kind filter (which select ops)
//!   leaves the channel tracks out.
//! - `--from/--to` (and the other `ops` filters) select ops as `ops` does.
//!
//! One pass; memory is bounded by the number of components and lanes.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use kb_format::{Meta, OpKind, Ps, Record, Strings};
use serde_json::json;

use crate::ops::{Filter, Matcher};
use crate::render::{self, natural_cmp};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Error, Result};

/// Split a component name into (process, track name).
pub fn split_component(name: &str) -> (String, String) {
    fn numbered(s: &str, prefix: &str) -> bool {
        s.strip_prefix(prefix)
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    }
    let parts: Vec<&str> = name.splitn(3, '.').collect();
    match parts[..] {
        [sip, cube, rest] if numbered(sip, "sip") && numbered(cube, "cube") => {
            (format!("{sip}.{cube}"), rest.to_string())
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
    pub events: u64,
    pub processes: usize,
    pub tracks: usize,
}

#[derive(Debug)]
struct Comp {
    pid: u32,
    track: String,
    /// The component name as a JSON string.
    json: String,
    /// (end of the last op in ns, tid) per lane.
    lanes: Vec<(u64, u32)>,
}

#[derive(Debug)]
struct Writer<W: Write> {
    m: Matcher,
    w: W,
    comps: Vec<Option<Comp>>,
    procs: Vec<String>,
    proc_ids: HashMap<String, u32>,
    /// (pid, tid, track name, lane) of every track.
    tracks: Vec<(u32, u32, String, usize)>,
    /// Escaped JSON strings of op names, by string id.
    names: Vec<Option<String>>,
    meta: Meta,
    events: u64,
}

impl<W: Write> Writer<W> {
    fn comp(&mut self, id: u32, s: &Strings) -> &mut Comp {
        let i = id as usize;
        if i >= self.comps.len() {
            self.comps.resize_with(i + 1, || None);
        }
        if self.comps[i].is_none() {
            let full = s.name(id);
            let (proc, track) = split_component(&full);
            let json = json_str(&full);
            let next = self.procs.len() as u32 + 1;
            let pid = *self.proc_ids.entry(proc.clone()).or_insert_with(|| {
                self.procs.push(proc);
                next
            });
            self.comps[i] = Some(Comp {
                pid,
                track,
                json,
                lanes: Vec::new(),
            });
        }
        self.comps[i].as_mut().expect("just set")
    }

    /// The tid of a free lane of component `id` for an op [t0, t1) (ns).
    fn lane(&mut self, id: u32, t0: u64, t1: u64, s: &Strings) -> (u32, u32) {
        let next_tid = self.tracks.len() as u32 + 1;
        let c = self.comp(id, s);
        let pid = c.pid;
        if let Some(l) = c.lanes.iter_mut().find(|l| l.0 <= t0) {
            l.0 = t1;
            return (pid, l.1);
        }
        c.lanes.push((t1, next_tid));
        let lane = c.lanes.len() - 1;
        let name = if lane == 0 {
            c.track.clone()
        } else {
            format!("{}#{lane}", c.track)
        };
        self.tracks.push((pid, next_tid, name, lane));
        (pid, next_tid)
    }

    /// Cache the JSON string of op name `id`.
    fn op_name(&mut self, id: u32, s: &Strings) {
        let i = id as usize;
        if i >= self.names.len() {
            self.names.resize_with(i + 1, || None);
        }
        self.names[i].get_or_insert_with(|| json_str(&s.name(id)));
    }

    fn event(&mut self, r: &Record, s: &Strings) -> io::Result<()> {
        let (t0, t1) = (round_ns(r.t_start), round_ns(r.t_end));
        let (pid, tid) = self.lane(r.component, t0, t1, s);
        let sep = if self.events == 0 { "\n" } else { ",\n" };
        self.events += 1;
        self.op_name(r.op_name, s);
        let name = self.names[r.op_name as usize].as_deref().unwrap_or("\"?\"");
        let comp = self.comps[r.component as usize]
            .as_ref()
            .map_or("\"?\"", |c| c.json.as_str());
        let kind = match r.kind {
            OpKind::Unknown(_) => "unknown",
            k => k.name(),
        };
        write!(
            self.w,
            "{sep}{{\"ph\":\"X\",\"name\":{name},\"cat\":\"{kind}\",{},\"pid\":{pid},\"tid\":{tid},\"args\":{{\"op_id\":{},\"start_ps\":{},\"end_ps\":{},\"component\":{comp}",
            TsDur(r.t_start, r.t_end),
            r.op_id,
            r.t_start,
            r.t_end,
        )?;
        let b = render::bytes_moved(r);
        if let Some(route) = render::route(r) {
            // Endpoint names need no JSON escaping.
            write!(self.w, ",\"route\":\"{route}\",\"bytes\":{b}")?;
        } else if b > 0 {
            write!(self.w, ",\"bytes\":{b}")?;
        }
        let f = render::flops(r);
        if f > 0 {
            write!(self.w, ",\"flops\":{f}")?;
        }
        if let Some(fp) = r.fingerprint {
            write!(self.w, ",\"fingerprint\":\"{fp:#018x}\"")?;
        }
        self.w.write_all(b"}}")
    }

    /// One track per HBM pseudo channel (`hbm_ctrl.chN` in its cube's
    /// process), an event per busy interval the filter selects.
    fn channel_events(&mut self, channels: &[kb_format::ChannelUsage]) -> io::Result<()> {
        for c in channels {
            let name = format!("sip{}.cube{}.hbm_ctrl.ch{}", c.sip, c.cube, c.channel);
            let mut tid = None;
            for &(start, end) in &c.busy {
                if !self.m.selects_interval(&name, start, end) {
                    continue;
                }
                let tid = *tid.get_or_insert_with(|| {
                    let (proc, track) = split_component(&name);
                    let next = self.procs.len() as u32 + 1;
                    let pid = *self.proc_ids.entry(proc.clone()).or_insert_with(|| {
                        self.procs.push(proc);
                        next
                    });
                    let tid = self.tracks.len() as u32 + 1;
                    self.tracks.push((pid, tid, track, 0));
                    (pid, tid)
                });
                let sep = if self.events == 0 { "\n" } else { ",\n" };
                self.events += 1;
                write!(
                    self.w,
                    "{sep}{{\"ph\":\"X\",\"name\":\"busy\",\"cat\":\"hbm_channel\",{},\"pid\":{},\"tid\":{},\"args\":{{\"start_ps\":{start},\"end_ps\":{end},\"channel\":\"{name}\"}}}}",
                    TsDur(start, end),
                    tid.0,
                    tid.1,
                )?;
            }
        }
        Ok(())
    }

    fn metadata(&mut self) -> io::Result<()> {
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
        let mut tracks: Vec<&(u32, u32, String, usize)> = self.tracks.iter().collect();
        tracks.sort_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                let (ta, tb) = (a.2.split('#').next(), b.2.split('#').next());
                natural_cmp(ta.unwrap_or(""), tb.unwrap_or("")).then(a.3.cmp(&b.3))
            })
        });
        for (rank, (pid, tid, name, _)) in tracks.into_iter().enumerate() {
            out.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                "args": {"name": name}}),
            );
            out.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                "args": {"sort_index": rank}}),
            );
        }
        for (i, e) in out.iter().enumerate() {
            let sep = if self.events == 0 && i == 0 {
                "\n"
            } else {
                ",\n"
            };
            write!(self.w, "{sep}{e}")?;
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
            "time_unit": "ts and dur in microseconds, rounded to the nanosecond; args.start_ps/end_ps exact",
        });
        write!(
            self.w,
            "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{other}\n}}\n"
        )?;
        self.w.flush()
    }
}

/// `"ts":..,"dur":..` of `[start, end)` ps: microseconds with the ends
/// rounded to the nanosecond, as exact decimals.
struct TsDur(Ps, Ps);

impl std::fmt::Display for TsDur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (t0, t1) = (round_ns(self.0), round_ns(self.1));
        let d = t1 - t0;
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

impl<W: Write> Visitor for Writer<W> {
    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        self.meta = meta.clone();
        self.w.write_all(b"{\"traceEvents\":[").map_err(wio)?;
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        if self.m.past_window(r) {
            return Ok(Flow::Stop);
        }
        if self.m.matches(r, s) {
            self.event(r, s).map_err(wio)?;
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        self.channel_events(end.channels).map_err(wio)?;
        self.metadata().map_err(wio)
    }
}

/// Write the timeline of `input` to `w`.
pub fn write<W: Write>(input: &Input, filter: &Filter, w: W) -> Result<Info> {
    let mut t = Writer {
        m: Matcher::new(filter)?,
        w: io::BufWriter::with_capacity(1 << 20, w),
        comps: Vec::new(),
        procs: Vec::new(),
        proc_ids: HashMap::new(),
        tracks: Vec::new(),
        names: Vec::new(),
        meta: Meta::default(),
        events: 0,
    };
    source::visit(input, &mut t)?;
    Ok(Info {
        events: t.events,
        processes: t.procs.len(),
        tracks: t.tracks.len(),
    })
}

/// `timeline -o FILE`: write to a file (atomically) or stdout (`-`).
pub fn run(input: &Input, filter: &Filter, out: &Path) -> Result<Info> {
    crate::write_output(out, |w| write(input, filter, w))
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
        let info = write(&Input::Path(p), filter, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        // The stream source gives the same bytes.
        let mut out2 = Vec::new();
        let mut t = Writer {
            m: Matcher::new(filter).unwrap(),
            w: &mut out2,
            comps: vec![],
            procs: vec![],
            proc_ids: HashMap::new(),
            tracks: vec![],
            names: vec![],
            meta: Meta::default(),
            events: 0,
        };
        source::visit_reader("-", bytes, &mut t).unwrap();
        assert_eq!(out, out2);
        (info, v)
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
                    assert!(e["args"]["op_id"].is_u64());
                    xs.push(e.clone());
                }
                other => panic!("unexpected phase {other}"),
            }
        }
        let mut by_track: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
        for e in &xs {
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
        assert_eq!(op1["args"]["start_ps"], 1000);
        assert_eq!(op1["args"]["end_ps"], 3000);
        assert_eq!(op1["args"]["component"], testutil::PE_DMA);
        // Processes: host, sip0 (pcie_ep), sip0.cube0, sip0.cube1.
        let evs = v["traceEvents"].as_array().unwrap();
        let names = |kind: &str| -> BTreeSet<String> {
            evs.iter()
                .filter(|e| e["name"] == kind)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names("process_name"),
            ["host", "sip0", "sip0.cube0", "sip0.cube1"]
                .map(String::from)
                .into()
        );
        assert_eq!(
            names("thread_name"),
            [
                "host",
                "pcie_ep",
                "pe0.gemm",
                "pe0.pe_dma",
                "pe0.pe_dma#1",
                "pe0.vec"
            ]
            .map(String::from)
            .into()
        );
        // Ops 1 and 2 overlap on pe_dma: same process, different tracks;
        // op 4 reuses the first lane.
        let op = |id: u64| xs.iter().find(|e| e["args"]["op_id"] == id).unwrap();
        assert_eq!(op(1)["pid"], op(2)["pid"]);
        assert_ne!(op(1)["tid"], op(2)["tid"]);
        assert_eq!(op(4)["tid"], op(1)["tid"]);
        assert_eq!(info.processes, 4);
        assert_eq!(info.tracks, 6);
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
        assert_eq!(get(2)["args"]["end_ps"], 40_960);
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
        assert_eq!(info.processes, 1);
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
    }

    #[test]
    fn component_names_split_into_process_and_track() {
        let s = |n: &str| split_component(n);
        assert_eq!(
            s("sip0.cube1.pe3.pe_dma"),
            ("sip0.cube1".into(), "pe3.pe_dma".into())
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
}
