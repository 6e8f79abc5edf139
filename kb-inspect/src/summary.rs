//! `summary`: what a trace is (tool, command line, topology, benchmark,
//! params) and what it holds (simulated time, record counts by kind,
//! kernel launches, tensors, verification spec), from one pass over its
//! records.

use std::io::Write;

use kb_format::{Launch, Meta, Ps, Record, Strings, VerifySpec};
use serde_json::{Value, json};

use crate::render::{self, expr_string, human_bytes, kind_name, ns};
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
    out: Summary,
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

    fn tensor(&mut self, tensor: u32, _offset: u64, data: &[u8]) -> Result<Flow> {
        if let Some(b) = self.tensor_bytes.get_mut(tensor as usize) {
            *b += data.len() as u64;
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, _s: &Strings) -> Result<Flow> {
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
        self.out = Summary {
            input: std::mem::take(&mut self.out.input),
            meta: end.meta.clone(),
            verify: end.verify.clone(),
            launches: end.launches.to_vec(),
            records: self.n,
            by_kind,
            first_start: self.first,
            // The run's end as the trace states it (after the last
            // record: frees, unmaps), or the last record's end.
            sim_time: self.last_end.max(end.footer.counts.max_t_end),
            components: self.comps.iter().filter(|&&b| b).count(),
            op_names: self.names.iter().filter(|&&b| b).count(),
            bytes_moved: self.bytes,
            flops: self.flops,
            chunks: end.footer.counts.chunks,
            strings: end.footer.counts.strings,
            tensor_bytes: std::mem::take(&mut self.tensor_bytes),
        };
        Ok(())
    }
}

/// Read `input` and summarise it.
pub fn summarize(input: &Input) -> Result<Summary> {
    let mut acc = Acc {
        kinds: [0; 256],
        n: 0,
        first: None,
        last_end: 0,
        comps: Vec::new(),
        names: Vec::new(),
        bytes: 0,
        flops: 0,
        tensor_bytes: Vec::new(),
        out: Summary {
            input: input.to_string(),
            ..Default::default()
        },
    };
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
            "launches": self.launches.iter().map(|l| json!({
                "kernel": l.kernel,
                "grid": l.grid,
                "pes": l.pes.iter().map(|p| format!("sip{}.cube{}.pe{}", p[0], p[1], p[2])).collect::<Vec<_>>(),
                "t_start_ps": l.t_start,
                "t_end_ps": l.t_end,
                "flops": l.flops,
                "useful_flops": l.useful_flops,
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
                "  #{i} {}  grid {} x {} on {} PE{}  {} .. {} ns  {} FLOPs ({} useful)",
                l.kernel,
                l.grid[0],
                l.grid[1],
                l.pes.len(),
                if l.pes.len() == 1 { "" } else { "s" },
                ns(l.t_start),
                ns(l.t_end),
                l.flops,
                l.useful_flops
            )?;
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
        let mut b = Acc {
            kinds: [0; 256],
            n: 0,
            first: None,
            last_end: 0,
            comps: vec![],
            names: vec![],
            bytes: 0,
            flops: 0,
            tensor_bytes: vec![],
            out: Summary::default(),
        };
        source::visit_reader("-", &bytes[..], &mut b).unwrap();
        let (mut ja, mut jb) = (a.to_json(), b.out.to_json());
        ja["input"] = Value::Null;
        jb["input"] = Value::Null;
        assert_eq!(ja, jb);
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(
            shell_join(&["a".into(), "b c".into(), "it's".into(), "".into()]),
            "a 'b c' 'it'\\''s' ''"
        );
    }
}
