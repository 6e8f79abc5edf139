//! `ops`: list records matching filters, as a table, JSON, JSON lines or CSV.
//!
//! Filters (all must hold; a repeated flag matches any of its values):
//! - `--component GLOB`, `--name GLOB`: glob over the component / op name
//!   (`*` matches any characters, dots included: `sip0.*.pe_dma`);
//! - `--kind K`: `memory`, `gemm`, `math`, `unknown` or a kind code;
//! - `--from NS` / `--to NS`: the op overlaps the window: it starts before
//!   `--to` and ends after `--from` (an instantaneous op at `--from` counts);
//! - `--limit N`: stop after N matches.

use std::io::Write;

use globset::{Glob, GlobSet, GlobSetBuilder};
use kb_format::{Ps, Record, Strings};

use crate::render::{self, KindSel, kind_name, ns};
use crate::source::{self, Flow, Input, Visitor};
use crate::{Error, Result, out_err};

/// What to select.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub components: Vec<String>,
    pub names: Vec<String>,
    pub kinds: Vec<KindSel>,
    pub from: Option<Ps>,
    pub to: Option<Ps>,
}

fn globset(pats: &[String], what: &str) -> Result<Option<GlobSet>> {
    if pats.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in pats {
        b.add(Glob::new(p).map_err(|e| Error::usage(format!("bad {what} glob {p:?}: {e}")))?);
    }
    b.build()
        .map(Some)
        .map_err(|e| Error::usage(format!("bad {what} globs: {e}")))
}

/// A compiled [`Filter`]; glob results are cached per string id.
#[derive(Debug)]
pub struct Matcher {
    comp: Option<GlobSet>,
    name: Option<GlobSet>,
    kinds: Vec<KindSel>,
    from: Ps,
    to: Option<Ps>,
    comp_cache: Vec<u8>,
    name_cache: Vec<u8>,
}

fn cached(set: &Option<GlobSet>, cache: &mut Vec<u8>, id: u32, s: &Strings) -> bool {
    let Some(set) = set else { return true };
    let i = id as usize;
    if i >= cache.len() {
        cache.resize(i + 1, 0);
    }
    if cache[i] == 0 {
        cache[i] = if set.is_match(&*s.name(id)) { 2 } else { 1 };
    }
    cache[i] == 2
}

impl Matcher {
    pub fn new(f: &Filter) -> Result<Matcher> {
        if let (Some(a), Some(b)) = (f.from, f.to)
            && a > b
        {
            return Err(Error::usage(format!(
                "--from {} ns is after --to {} ns",
                ns(a),
                ns(b)
            )));
        }
        Ok(Matcher {
            comp: globset(&f.components, "component")?,
            name: globset(&f.names, "op name")?,
            kinds: f.kinds.clone(),
            from: f.from.unwrap_or(0),
            to: f.to,
            comp_cache: Vec::new(),
            name_cache: Vec::new(),
        })
    }

    /// Whether busy interval `[t0, t1)` of an HBM channel (named as a
    /// component, `sipS.cubeC.hbm_ctrl.chN`) is selected: no op name or
    /// kind filter is set (they select ops), the component globs, if any,
    /// match its name, and it overlaps the window.
    pub fn selects_interval(&self, name: &str, t0: Ps, t1: Ps) -> bool {
        self.name.is_none()
            && self.kinds.is_empty()
            && self.comp.as_ref().is_none_or(|g| g.is_match(name))
            && self.to.is_none_or(|to| t0 < to)
            && (t1 > self.from || t0 >= self.from)
    }

    /// True once no later record can match: records come in t_start order.
    pub fn past_window(&self, r: &Record) -> bool {
        self.to.is_some_and(|to| r.t_start >= to)
    }

    pub fn in_window(&self, r: &Record) -> bool {
        !self.past_window(r) && (r.t_end > self.from || r.t_start >= self.from)
    }

    pub fn matches(&mut self, r: &Record, s: &Strings) -> bool {
        self.in_window(r)
            && (self.kinds.is_empty() || self.kinds.iter().any(|k| k.matches(r.kind)))
            && cached(&self.comp, &mut self.comp_cache, r.component, s)
            && cached(&self.name, &mut self.name_cache, r.op_name, s)
    }
}

/// Output format of `ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Jsonl,
    Csv,
}

struct Lister<'w> {
    m: Matcher,
    limit: Option<u64>,
    n: u64,
    format: Format,
    w: &'w mut dyn Write,
    buf: Vec<u8>,
    line: String,
    places: crate::columns::Places,
    launches: Option<crate::columns::Launches>,
}

/// The CSV columns: the export's ([`crate::columns`]).
pub use crate::columns::CSV_HEADER;

impl Lister<'_> {
    fn header(&mut self) -> std::io::Result<()> {
        match self.format {
            Format::Table => writeln!(
                self.w,
                "{:>8} {:>14} {:>14} {:>12}  {:28} {:16} {:7} {:>10} {:>12}  params",
                "op_id",
                "start_ns",
                "end_ns",
                "dur_ns",
                "component",
                "op_name",
                "kind",
                "bytes",
                "flops"
            ),
            Format::Json => write!(self.w, "["),
            Format::Jsonl => Ok(()),
            Format::Csv => writeln!(self.w, "{CSV_HEADER}"),
        }
    }

    fn row(&mut self, r: &Record, s: &Strings) -> std::io::Result<()> {
        match self.format {
            Format::Table => writeln!(
                self.w,
                "{:>8} {:>14} {:>14} {:>12}  {:28} {:16} {:7} {:>10} {:>12}  {}",
                r.op_id,
                ns(r.t_start),
                ns(r.t_end),
                ns(r.t_end.saturating_sub(r.t_start)),
                s.name(r.component),
                s.name(r.op_name),
                kind_name(r.kind),
                render::bytes_moved(r),
                render::flops(r),
                render::params_brief(r)
            ),
            Format::Json | Format::Jsonl => {
                if self.format == Format::Json {
                    write!(self.w, "{}\n  ", if self.n == 0 { "" } else { "," })?;
                }
                self.buf.clear();
                render::push_record_json(&mut self.buf, r, s);
                if self.format == Format::Jsonl {
                    self.buf.push(b'\n');
                }
                self.w.write_all(&self.buf)
            }
            Format::Csv => {
                self.line.clear();
                let place = self.places.get(r.component, s).clone();
                crate::columns::push_csv(&mut self.line, r, s, &place, self.launches.as_ref());
                self.w.write_all(self.line.as_bytes())
            }
        }
    }

    fn footer(&mut self) -> std::io::Result<()> {
        match self.format {
            Format::Json => writeln!(self.w, "{}]", if self.n == 0 { "" } else { "\n" }),
            _ => Ok(()),
        }
    }
}

impl Visitor for Lister<'_> {
    fn launches(&mut self, launches: &[kb_format::Launch]) -> Result<()> {
        self.launches = Some(crate::columns::Launches::new(launches));
        Ok(())
    }

    fn meta(&mut self, _: &kb_format::Meta) -> Result<Flow> {
        self.header().map_err(out_err)?;
        Ok(if self.limit == Some(0) {
            Flow::Stop
        } else {
            Flow::Continue
        })
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        if self.m.past_window(r) {
            return Ok(Flow::Stop);
        }
        if self.m.matches(r, s) {
            self.row(r, s).map_err(out_err)?;
            self.n += 1;
            if Some(self.n) == self.limit {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }
}

/// Run `ops`: write the matching records to `w`; returns how many matched.
pub fn run(
    input: &Input,
    filter: &Filter,
    limit: Option<u64>,
    format: Format,
    w: &mut dyn Write,
) -> Result<u64> {
    let mut l = Lister {
        m: Matcher::new(filter)?,
        limit,
        n: 0,
        format,
        w,
        buf: Vec::new(),
        line: String::new(),
        places: Default::default(),
        launches: None,
    };
    source::visit(input, &mut l)?;
    l.footer().map_err(out_err)?;
    Ok(l.n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::parse_kind;
    use crate::testutil;
    use serde_json::Value;

    fn ops(filter: Filter, limit: Option<u64>, format: Format) -> (u64, String) {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let mut out = Vec::new();
        let n = run(&Input::Path(p), &filter, limit, format, &mut out).unwrap();
        (n, String::from_utf8(out).unwrap())
    }

    fn ids(filter: Filter, limit: Option<u64>) -> Vec<u64> {
        let (n, out) = ops(filter, limit, Format::Jsonl);
        let v: Vec<u64> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["op_id"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(v.len() as u64, n);
        v
    }

    #[test]
    fn filters_select_by_glob_kind_window_and_limit() {
        assert_eq!(ids(Filter::default(), None), [0, 1, 2, 3, 4, 5, 6]);
        let comp = |g: &[&str]| Filter {
            components: g.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(ids(comp(&["*.pe_dma"]), None), [1, 2, 4]);
        assert_eq!(ids(comp(&["sip0.cube*"]), None), [1, 2, 3, 4, 5]);
        assert_eq!(ids(comp(&["host", "sip0.pcie_ep"]), None), [0, 6]);
        assert_eq!(ids(comp(&["nothing"]), None), Vec::<u64>::new());
        let names = Filter {
            names: vec!["dma_*".into()],
            ..Default::default()
        };
        assert_eq!(ids(names, None), [1, 2, 4]);
        let kind = |k: &str| Filter {
            kinds: vec![parse_kind(k).unwrap()],
            ..Default::default()
        };
        assert_eq!(ids(kind("gemm"), None), [3]);
        assert_eq!(ids(kind("math"), None), [5]);
        assert_eq!(ids(kind("memory"), None), [0, 1, 2, 4, 6]);
        // Window [3.5 ns, 5 ns): ops overlapping it.
        let win = Filter {
            from: Some(3500),
            to: Some(5000),
            ..Default::default()
        };
        assert_eq!(ids(win, None), [2, 3]);
        // An op ending exactly at --from is outside; starting at --to too.
        let win = Filter {
            from: Some(4000),
            to: Some(6000),
            ..Default::default()
        };
        assert_eq!(ids(win, None), [3, 4]);
        assert_eq!(ids(Filter::default(), Some(2)), [0, 1]);
        assert_eq!(ids(Filter::default(), Some(0)), Vec::<u64>::new());
        let both = Filter {
            components: vec!["*pe_dma".into()],
            from: Some(2500),
            ..Default::default()
        };
        assert_eq!(ids(both, Some(2)), [1, 2]);
    }

    #[test]
    fn bad_filters_are_errors() {
        let f = Filter {
            components: vec!["[".into()],
            ..Default::default()
        };
        assert!(Matcher::new(&f).unwrap_err().to_string().contains("glob"));
        let f = Filter {
            from: Some(5),
            to: Some(1),
            ..Default::default()
        };
        assert!(Matcher::new(&f).is_err());
    }

    #[test]
    fn table_format() {
        let (n, out) = ops(Filter::default(), Some(3), Format::Table);
        assert_eq!(n, 3);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains("op_id") && lines[0].contains("component"));
        assert!(lines[2].contains("1.000") && lines[2].contains("3.000"));
        assert!(lines[2].contains(testutil::PE_DMA) && lines[2].contains("dma_read"));
        assert!(lines[2].contains("memory") && lines[2].contains(" 64 "));
    }

    #[test]
    fn json_format_is_one_array() {
        let (_, out) = ops(Filter::default(), None, Format::Json);
        let v: Value = serde_json::from_str(&out).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 7);
        assert_eq!(a[3]["kind"], "gemm");
        assert_eq!(a[3]["params"]["m"], 2);
        assert_eq!(a[3]["flops"], 48);
        assert_eq!(a[1]["component"], testutil::PE_DMA);
        assert_eq!(a[1]["fingerprint"], "0x0000000000001001");
        assert_eq!(a[1]["write"]["ranges"][0]["rows"], 2);
        assert_eq!(a[1]["deps"], serde_json::json!([{"op": 0, "kind": "data"}]));
        let (_, out) = ops(
            Filter {
                names: vec!["zzz".into()],
                ..Default::default()
            },
            None,
            Format::Json,
        );
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap(),
            serde_json::json!([])
        );
    }

    #[test]
    fn csv_columns_are_typed_and_flat() {
        let (_, out) = ops(Filter::default(), None, Format::Csv);
        let t = kb_table::Table::read_csv(&out, "ops.csv").unwrap();
        let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.join(","), CSV_HEADER);
        assert_eq!(t.rows(), 7);
        let col = |n: &str| &t.column(n).unwrap().values;
        use kb_table::Values;
        // One type per column, whatever the rows hold.
        assert!(matches!(col("start_ns"), Values::F64(_)));
        assert!(matches!(col("start_ps"), Values::U64(_)));
        assert!(matches!(col("deps"), Values::Str(_)));
        assert!(matches!(col("fingerprint"), Values::Str(_)));
        assert!(matches!(col("m"), Values::U64(_)));
        // op 3: the gemm, [4000, 6000) ps on sip0.cube0.pe0.gemm, m=2 n=3 k=4.
        assert_eq!(col("start_ns").f64(3), Some(4.0));
        assert_eq!(col("dur_ns").f64(3), Some(2.0));
        assert_eq!(col("end_ps").text(3), "6000");
        assert_eq!(col("component").text(3), "sip0.cube0.pe0.gemm");
        assert_eq!(
            (col("sip").text(3), col("cube").text(3), col("pe").text(3)),
            ("0".into(), "0".into(), "0".into())
        );
        assert_eq!(col("unit").text(3), "gemm");
        assert_eq!(col("kind").text(3), "gemm");
        assert_eq!(
            (col("m").text(3), col("n").text(3), col("k").text(3)),
            ("2".into(), "3".into(), "4".into())
        );
        assert_eq!(col("flops").text(3), "48");
        assert_eq!(col("dtype").text(3), "f16");
        assert_eq!(col("dtype_out").text(3), "f16");
        assert_eq!(col("in_shapes").text(3), "[[2,4],[4,3]]");
        assert_eq!(col("out_shape").text(3), "[2,3]");
        assert_eq!(col("deps").text(3), "[]");
        assert_eq!(col("deps").text(2), "[1]");
        assert_eq!(col("dep_kinds").text(3), "[]");
        assert_eq!(col("dep_kinds").text(2), r#"["data"]"#);
        assert_eq!(col("launch").text(3), "0");
        assert_eq!(col("kernel").text(3), "gemm");
        // op 1: a memory op with a route and a fingerprint.
        assert_eq!(col("fingerprint").text(1), "0x0000000000001001");
        assert_eq!(col("bytes").text(1), "64");
        assert_eq!(col("route_src").text(1), "host");
        assert_eq!(col("rows").text(1), "2");
        assert_eq!(col("row_bytes").text(1), "32");
        assert_eq!(col("cols").text(1), "16"); // 32 B of f16
        assert_eq!(col("src_space").text(1), "host");
        assert_eq!(col("dst_space").text(1), "hbm");
        assert_eq!(col("dst_addr").text(1), "64");
        // Off-PE ops have no coordinates below their SIP and no launch.
        assert_eq!(col("unit").text(0), "host");
        assert_eq!(col("sip").text(0), "");
        assert_eq!(col("launch").text(0), "");
        assert_eq!(col("sip").text(6), "0");
        assert_eq!(col("pe").text(6), "");
        // The softmax launch holds the math op on cube 1.
        assert_eq!(col("launch").text(5), "1");
        assert_eq!(col("math_op").text(5), "exp");
    }
}
