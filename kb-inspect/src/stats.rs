//! `stats --by component|op_name|op_kind|route|channel [--name GLOB]`: per group,
//! the op count, busy time, utilisation over the run, bytes moved, FLOPs,
//! achieved bandwidth and FLOP rate.
//!
//! Definitions:
//! - **busy time**: the length of the union of the group's op intervals
//!   `[t_start, t_end)`, so overlapping ops (pipelined DMA) count once;
//!   **op time** is the plain sum of durations.
//! - **run time**: the simulated time, the run's end as the trace's footer
//!   records it (kb-sim's own figure: at least the end of the last op,
//!   past it by the frees and unmaps that follow; time starts at 0);
//!   **utilisation** = busy time / run time.
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
//!   serving (back-to-back service merged; the access latency is not busy),
//!   bytes = read + written. Channels that served nothing have no row.
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
//! only once per group, at the end), so it runs over traces of any length.

use std::io::Write;

use std::collections::HashMap;

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
}

/// Running totals of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acc {
    pub count: u64,
    pub op_time: Ps,
    pub bytes: u64,
    pub flops: u64,
    busy_done: Ps,
    cur: Option<(Ps, Ps)>,
}

impl Acc {
    /// Add an op; ops must come in t_start order.
    pub fn add(&mut self, t0: Ps, t1: Ps, bytes: u64, flops: u64) {
        self.count += 1;
        let t1 = t1.max(t0);
        self.op_time = self.op_time.saturating_add(t1 - t0);
        self.bytes = self.bytes.saturating_add(bytes);
        self.flops = self.flops.saturating_add(flops);
        self.cur = match self.cur {
            Some((s, e)) if t0 <= e => Some((s, e.max(t1))),
            Some((s, e)) => {
                self.busy_done += e - s;
                Some((t0, t1))
            }
            None => Some((t0, t1)),
        };
    }

    /// Length of the union of the intervals added.
    pub fn busy(&self) -> Ps {
        self.busy_done + self.cur.map_or(0, |(s, e)| e - s)
    }
}

/// One row of the result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: String,
    pub count: u64,
    pub busy: Ps,
    pub op_time: Ps,
    pub bytes: u64,
    pub flops: u64,
    /// busy / run time; `None` when the run time is 0.
    pub utilisation: Option<f64>,
    /// bytes per ns (= GB/s); `None` when busy time is 0.
    pub gbps: Option<f64>,
    /// FLOPs per ns (= GFLOP/s); `None` when busy time is 0.
    pub gflops: Option<f64>,
}

/// The result of `stats`.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub by: GroupBy,
    pub run_time: Ps,
    /// Records in the trace.
    pub records: u64,
    /// Records counted in the rows: those the name filter kept and, by
    /// route, only memory ops.
    pub counted: u64,
    /// The `--name` globs (empty: no filter).
    pub names: Vec<String>,
    pub rows: Vec<Row>,
}

/// Accumulates per-group totals in one pass; usable by other commands.
#[derive(Debug, Default)]
pub struct Collector {
    pub by: GroupBy,
    /// Totals by group index: a string id, a kind code, or (by route) the
    /// index of the route in `routes`.
    groups: Vec<Acc>,
    /// By route: the route of each group, and the group of each route.
    routes: Vec<Route>,
    route_ids: HashMap<Route, usize>,
    /// The `--name` globs, compiled (glob results cached per string id).
    names: Vec<String>,
    matcher: Option<Matcher>,
    run_time: Ps,
    records: u64,
    counted: u64,
    pub result: Option<Stats>,
}

impl Collector {
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

    /// Add a record, unfiltered (the name filter needs the strings: the
    /// [`Visitor`] applies it). Records must come in t_start order.
    pub fn add(&mut self, r: &Record) {
        self.see(r);
        self.count(r);
    }

    /// Note a record of the run, counted or not.
    fn see(&mut self, r: &Record) {
        self.run_time = self.run_time.max(r.t_end);
        self.records += 1;
    }

    /// Count a record in its group (by route: memory ops only).
    fn count(&mut self, r: &Record) {
        let key = match self.by {
            GroupBy::Component => r.component as usize,
            GroupBy::OpName => r.op_name as usize,
            GroupBy::OpKind => r.kind.code() as usize,
            GroupBy::Channel => return,
            GroupBy::Route => {
                let Some(route) = render::route(r) else {
                    return;
                };
                *self.route_ids.entry(route).or_insert_with(|| {
                    self.routes.push(route);
                    self.routes.len() - 1
                })
            }
        };
        if key >= self.groups.len() {
            self.groups.resize(key + 1, Acc::default());
        }
        self.groups[key].add(r.t_start, r.t_end, render::bytes_moved(r), render::flops(r));
        self.counted += 1;
    }

    /// The rows, naming groups with `strings`, sorted by key.
    pub fn finish(&self, strings: &Strings) -> Stats {
        let run = self.run_time;
        let rate = |x: u64, busy: Ps| (busy > 0).then(|| x as f64 * 1000.0 / busy as f64);
        let mut rows: Vec<Row> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, a)| a.count > 0)
            .map(|(k, a)| {
                let busy = a.busy();
                Row {
                    key: match self.by {
                        GroupBy::OpKind => kind_name(OpKind::from_code(k as u8)),
                        GroupBy::Route => self.routes[k].to_string(),
                        _ => strings.name(k as u32).into_owned(),
                    },
                    count: a.count,
                    busy,
                    op_time: a.op_time,
                    bytes: a.bytes,
                    flops: a.flops,
                    utilisation: (run > 0).then(|| busy as f64 / run as f64),
                    gbps: rate(a.bytes, busy),
                    gflops: rate(a.flops, busy),
                }
            })
            .collect();
        rows.sort_by(|a, b| natural_cmp(&a.key, &b.key));
        Stats {
            by: self.by,
            run_time: run,
            records: self.records,
            counted: self.counted,
            names: self.names.clone(),
            rows,
        }
    }
}

impl Visitor for Collector {
    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        self.see(r);
        if self.matcher.as_mut().is_none_or(|m| m.matches(r, s)) {
            self.count(r);
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        let mut stats = self.finish(end.strings);
        // The run's end as the trace records it (past the last record: the
        // frees and unmaps after it).
        stats.run_time = stats.run_time.max(end.footer.counts.max_t_end);
        if self.by == GroupBy::Channel {
            stats.rows = channel_rows(end.channels()?, stats.run_time);
        }
        self.result = Some(stats);
        Ok(())
    }
}

/// One row per HBM pseudo channel (`sipS.cubeC.chN`): busy intervals,
/// busy time, bytes read and written, utilisation over `run` and the
/// bandwidth while busy.
fn channel_rows(channels: &[kb_format::ChannelUsage], run: Ps) -> Vec<Row> {
    let mut rows: Vec<Row> = channels
        .iter()
        .map(|c| {
            let busy = c.busy_ps();
            let bytes = c.bytes_read.saturating_add(c.bytes_written);
            Row {
                key: format!("sip{}.cube{}.ch{}", c.sip, c.cube, c.channel),
                count: c.busy.len() as u64,
                busy,
                op_time: busy,
                bytes,
                flops: 0,
                utilisation: (run > 0).then(|| busy as f64 / run as f64),
                gbps: (busy > 0).then(|| bytes as f64 * 1000.0 / busy as f64),
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
    let mut c = Collector::with_names(by, names)?;
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
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "by": self.by_name(),
            "names": self.names,
            "run_time_ps": self.run_time,
            "records": self.records,
            "counted": self.counted,
            "groups": self.rows.iter().map(|r| json!({
                "key": r.key,
                "count": r.count,
                "busy_ps": r.busy,
                "op_time_ps": r.op_time,
                "utilisation": r.utilisation,
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
                    "{},count,busy_ns,op_time_ns,utilisation,bytes,flops,bandwidth_gbps,gflops",
                    self.by_name()
                )?;
                for r in &self.rows {
                    writeln!(
                        w,
                        "{},{},{},{},{},{},{},{},{}",
                        csv(&r.key),
                        r.count,
                        ns(r.busy),
                        ns(r.op_time),
                        r.utilisation.map_or(String::new(), |u| u.to_string()),
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
                    "run time {} ns, {} records, by {}",
                    ns(self.run_time),
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
                    "{:width$}  {:>10}  {:>14}  {:>14}  {:>7}  {:>14}  {:>14}  {:>10}  {:>10}",
                    self.by_name(),
                    "count",
                    "busy_ns",
                    "op_time_ns",
                    "util%",
                    "bytes",
                    "flops",
                    "GB/s",
                    "GFLOP/s"
                )?;
                for r in &self.rows {
                    writeln!(
                        w,
                        "{:width$}  {:>10}  {:>14}  {:>14}  {:>7}  {:>14}  {:>14}  {:>10}  {:>10}",
                        r.key,
                        r.count,
                        ns(r.busy),
                        ns(r.op_time),
                        opt(r.utilisation.map(|u| u * 100.0), 2),
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
    format: Format,
    w: &mut dyn Write,
) -> Result<Stats> {
    let s = compute_named(input, by, names)?;
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
        let mut a = Acc::default();
        a.add(0, 10, 0, 0);
        a.add(5, 20, 0, 0); // overlaps: [0, 20)
        a.add(20, 25, 0, 0); // touches: [0, 25)
        a.add(30, 31, 0, 0); // gap
        a.add(30, 30, 0, 0); // empty
        assert_eq!(a.busy(), 26);
        assert_eq!(a.op_time, 10 + 15 + 5 + 1);
        assert_eq!(a.count, 5);
    }

    #[test]
    fn per_component_numbers_match_a_hand_computation() {
        let s = stats(GroupBy::Component);
        assert_eq!(s.run_time, 10_000);
        assert_eq!(s.records, 7);
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "host",
                "sip0.cube0.pe0.gemm",
                "sip0.cube0.pe0.pe_dma",
                "sip0.cube1.pe0.vec",
                "sip0.pcie_ep"
            ]
        );
        // pe_dma: ops [1000,3000) [2000,4000) [5000,6000): busy 3000 + 1000.
        let dma = &s.rows[2];
        assert_eq!(dma.count, 3);
        assert_eq!(dma.busy, 4000);
        assert_eq!(dma.op_time, 5000);
        assert_eq!(dma.bytes, 224);
        assert_eq!(dma.flops, 0);
        assert_eq!(dma.utilisation, Some(0.4));
        assert_eq!(dma.gbps, Some(56.0)); // 224 B / 4 ns
        let gemm = &s.rows[1];
        assert_eq!((gemm.busy, gemm.flops), (2000, 48));
        assert_eq!(gemm.gflops, Some(24.0)); // 48 FLOP / 2 ns
        assert_eq!(gemm.utilisation, Some(0.2));
        let pcie = &s.rows[4];
        assert_eq!(pcie.bytes, 256);
        assert_eq!(pcie.utilisation, Some(0.3));
    }

    #[test]
    fn by_op_name_and_kind() {
        let s = stats(GroupBy::OpName);
        let dr = s.rows.iter().find(|r| r.key == "dma_read").unwrap();
        assert_eq!(
            (dr.count, dr.busy, dr.op_time, dr.bytes),
            (2, 3000, 4000, 192)
        );
        let s = stats(GroupBy::OpKind);
        let keys: Vec<&str> = s.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["gemm", "math", "memory"]);
        let mem = &s.rows[2];
        // memory ops: [0,1000) [1000,3000) [2000,4000) [5000,6000) [7000,10000)
        assert_eq!(mem.count, 5);
        assert_eq!(mem.busy, 4000 + 1000 + 3000);
        assert_eq!(mem.bytes, 544);
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
        let line = t.lines().find(|l| l.contains("pe_dma")).unwrap();
        for want in ["4.000", "5.000", "40.00", "224", "56.000"] {
            assert!(line.contains(want), "{want} in {line}");
        }
        let mut j = Vec::new();
        s.write(Format::Json, &mut j).unwrap();
        let j: Value = serde_json::from_slice(&j).unwrap();
        assert_eq!(j["groups"][2]["busy_ps"], 4000);
        assert_eq!(j["groups"][2]["bandwidth_gbps"], 56.0);
        assert_eq!(j["groups"][0]["gflops"], 0.0);
        let mut c = Vec::new();
        s.write(Format::Csv, &mut c).unwrap();
        let c = String::from_utf8(c).unwrap();
        assert!(c.starts_with("component,count,busy_ns"));
        assert!(
            c.contains("\nsip0.cube0.pe0.pe_dma,3,4.000,5.000,0.4,224,0,56,0\n"),
            "{c}"
        );
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
            "run time 10.000 ns, 10 records, by route, name ipcq_copy: 4 counted (memory ops)"
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
            c.contains("\nsip0.cube0.pe0.tcm -> sip0.cube1.sram,1,1.000,1.000,0.1,32,0,32,0\n"),
            "{c}"
        );
        // Without a filter and by component every record counts: the
        // header is as before.
        let s = route_stats(GroupBy::Component, &[]);
        let mut t = Vec::new();
        s.write(Format::Table, &mut t).unwrap();
        let t = String::from_utf8(t).unwrap();
        assert!(
            t.starts_with("run time 10.000 ns, 10 records, by component\n"),
            "{t}"
        );
    }
}
