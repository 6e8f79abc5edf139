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

use crate::render::{self, KindSel, csv, kind_name, ns};
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
}

const CSV_HEADER: &str =
    "op_id,t_start_ps,t_end_ps,dur_ps,component,op_name,kind,bytes,flops,fingerprint,deps,params";

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
                let deps: Vec<String> = r.deps.iter().map(u64::to_string).collect();
                writeln!(
                    self.w,
                    "{},{},{},{},{},{},{},{},{},{},{},{}",
                    r.op_id,
                    r.t_start,
                    r.t_end,
                    r.t_end.saturating_sub(r.t_start),
                    csv(&s.name(r.component)),
                    csv(&s.name(r.op_name)),
                    csv(&kind_name(r.kind)),
                    render::bytes_moved(r),
                    render::flops(r),
                    render::fingerprint_string(r.fingerprint).unwrap_or_default(),
                    deps.join(";"),
                    csv(&render::params_brief(r))
                )
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
        assert_eq!(a[1]["deps"], serde_json::json!([0]));
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
    fn csv_format() {
        let (_, out) = ops(Filter::default(), None, Format::Csv);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 8);
        let f: Vec<&str> = lines[4].split(',').collect();
        assert_eq!(
            &f[..9],
            [
                "3",
                "4000",
                "6000",
                "2000",
                "sip0.cube0.pe0.gemm",
                "gemm",
                "gemm",
                "0",
                "48"
            ]
        );
        let f: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(f[9], "0x0000000000001001");
        assert_eq!(f[10], "0");
        assert_eq!(f.len(), 12);
    }
}
