//! `stats --by component|op_name|op_kind`: per group, the op count, busy
//! time, utilisation over the run, bytes moved, FLOPs, achieved bandwidth
//! and FLOP rate.
//!
//! Definitions:
//! - **busy time**: the length of the union of the group's op intervals
//!   `[t_start, t_end)`, so overlapping ops (pipelined DMA) count once;
//!   **op time** is the plain sum of durations.
//! - **run time**: the simulated time, the end of the last op (time starts
//!   at 0); **utilisation** = busy time / run time.
//! - **bytes** and **FLOPs**: see [`crate::render`] (memory ops: write
//!   extent bytes; gemm `2*m*n*k`; math `rows*cols`).
//! - **bandwidth** = bytes / busy time (GB/s = bytes per ns), **FLOP rate**
//!   = FLOPs / busy time (GFLOP/s).
//!
//! One pass, memory bounded by the number of groups (string ids), so it
//! runs over traces of any length.

use std::io::Write;

use kb_format::{OpKind, Ps, Record, Strings};
use serde_json::{Value, json};

use crate::render::{self, csv, kind_name, natural_cmp, ns};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Result, out_err};

/// What to group records by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    #[default]
    Component,
    OpName,
    OpKind,
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
    pub records: u64,
    pub rows: Vec<Row>,
}

/// Accumulates per-group totals in one pass; usable by other commands.
#[derive(Debug, Default)]
pub struct Collector {
    pub by: GroupBy,
    groups: Vec<Acc>,
    run_time: Ps,
    records: u64,
    pub result: Option<Stats>,
}

impl Collector {
    pub fn new(by: GroupBy) -> Collector {
        Collector {
            by,
            ..Default::default()
        }
    }

    pub fn add(&mut self, r: &Record) {
        let key = match self.by {
            GroupBy::Component => r.component as usize,
            GroupBy::OpName => r.op_name as usize,
            GroupBy::OpKind => r.kind.code() as usize,
        };
        if key >= self.groups.len() {
            self.groups.resize(key + 1, Acc::default());
        }
        self.groups[key].add(r.t_start, r.t_end, render::bytes_moved(r), render::flops(r));
        self.run_time = self.run_time.max(r.t_end);
        self.records += 1;
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
            rows,
        }
    }
}

impl Visitor for Collector {
    fn record(&mut self, r: &Record, _: &Strings) -> Result<Flow> {
        self.add(r);
        Ok(Flow::Continue)
    }

    fn end(&mut self, end: &End<'_>) -> Result<()> {
        self.result = Some(self.finish(end.strings));
        Ok(())
    }
}

/// Compute statistics over `input`.
pub fn compute(input: &Input, by: GroupBy) -> Result<Stats> {
    let mut c = Collector::new(by);
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
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "by": self.by_name(),
            "run_time_ps": self.run_time,
            "records": self.records,
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
                    "{},count,busy_ps,op_time_ps,utilisation,bytes,flops,bandwidth_gbps,gflops",
                    self.by_name()
                )?;
                for r in &self.rows {
                    writeln!(
                        w,
                        "{},{},{},{},{},{},{},{},{}",
                        csv(&r.key),
                        r.count,
                        r.busy,
                        r.op_time,
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
                writeln!(
                    w,
                    "run time {} ns, {} records, by {}",
                    ns(self.run_time),
                    self.records,
                    self.by_name()
                )?;
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

/// Run `stats` and print it.
pub fn run(input: &Input, by: GroupBy, format: Format, w: &mut dyn Write) -> Result<Stats> {
    let s = compute(input, by)?;
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
        assert!(c.starts_with("component,count,busy_ps"));
        assert!(
            c.contains("\nsip0.cube0.pe0.pe_dma,3,4000,5000,0.4,224,0,56,0\n"),
            "{c}"
        );
    }
}
