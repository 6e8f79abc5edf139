//! The op log as typed, flattened columns: one schema for `export`
//! (Apache Parquet) and `ops --format csv`.
//!
//! | column | type | what |
//! |---|---|---|
//! | `op_id` | u64 | the record's op id |
//! | `start_ns`, `end_ns`, `dur_ns` | f64 | simulated times in nanoseconds (what people read) |
//! | `start_ps`, `end_ps`, `dur_ps` | u64 | the same, exact integer picoseconds |
//! | `component` | str | the serving component (`sip0.cube1.pe3.pe_dma`) |
//! | `sip`, `cube`, `pe` | u32, null where the component has none | its coordinates |
//! | `unit` | str | the component less its coordinates (`pe_dma`, `hbm_ctrl`, `host`) |
//! | `kind`, `name` | str | op kind (`memory`, `gemm`, `math`, `sync`, `unknown(N)`) and op name |
//! | `bytes` | u64 | bytes moved (memory ops' write extents; 0 for compute) |
//! | `flops` | u64 | FLOPs executed (gemm `2*m*n*k`, math one per element), padding of edge tiles included: a launch's useful FLOPs are in `summary` |
//! | `fingerprint` | str | hex data fingerprint (memory ops Phase 1 knew), else null |
//! | `dtype` | str | element type: a memory op's, a gemm's inputs', a math op's output |
//! | `dtype_acc`, `dtype_out` | str | a gemm's accumulator and output types |
//! | `m`, `n`, `k` | u32 | a gemm's shape |
//! | `math_op`, `axis` | str, u32 | a math op's operator and reduction axis |
//! | `rows`, `cols`, `row_bytes` | u32, u64, u64 | a math op's output tile; a memory op's rows, elements per row (when it has a dtype) and bytes per row |
//! | `in_shapes` | list of [rows, cols] | operand shapes: gemm `[[m,k],[k,n]]` (+ `[m,n]` with an accumulator), math its tile inputs |
//! | `out_shape` | [rows, cols] | the output shape (gemm `[m,n]`, math, memory with a dtype) |
//! | `src_space`, `src_addr`, `dst_space`, `dst_addr` | str, u64 | addresses as the kernel used them: memory src/dst; gemm a/out; math first tile input/out |
//! | `read_pa`, `write_pa` | u64 | first physical address of the read and write effects |
//! | `route_src`, `route_dst` | str | a memory op's route endpoints (as `stats --by route`) |
//! | `deps` | list of u64 | causal edges: the op ids that had to happen before this op could start |
//! | `dep_kinds` | list of str | each edge's kind, parallel to `deps`: `data`, `program`, `sync`, `host`, `resource` |
//! | `launch`, `kernel` | u32, str | the launch (index in `summary`'s list) and kernel whose window on the op's PE holds the op's start; null for ops off PEs, and when reading standard input (launches come at the end of a stream) |
//!
//! In CSV every column keeps one type: lists are written as JSON text
//! (`[3,4]`, `[]`), `fingerprint` as hex text, nulls as empty cells.

use std::collections::HashMap;
use std::fmt::Write as _;

use kb_format::{Dtype, Launch, MathInput, MathOp, Params, Record, Space, Strings};

use crate::render::{self, kind_name};

/// A component name split into coordinates and unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub sip: Option<u32>,
    pub cube: Option<u32>,
    pub pe: Option<u32>,
    pub unit: String,
}

fn numbered(s: &str, prefix: &str) -> Option<u32> {
    let d = s.strip_prefix(prefix)?;
    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    d.parse().ok()
}

/// Split `sip0.cube1.pe3.pe_dma` into (0, 1, 3, `pe_dma`); coordinates
/// are taken in that order from the front, the rest is the unit.
pub fn place(name: &str) -> Place {
    let segs: Vec<&str> = name.split('.').collect();
    let mut i = 0;
    let mut take = |prefix: &str| {
        let v = segs.get(i).and_then(|s| numbered(s, prefix));
        if v.is_some() && i + 1 < segs.len() {
            i += 1;
            v
        } else {
            None
        }
    };
    let sip = take("sip");
    let cube = sip.and_then(|_| take("cube"));
    let pe = cube.and_then(|_| take("pe"));
    Place {
        sip,
        cube,
        pe,
        unit: segs[i..].join("."),
    }
}

/// Finds the launch an op on a PE belongs to.
#[derive(Debug, Default)]
pub struct Launches {
    /// Per PE: (t_start, t_end, launch index), by t_start.
    by_pe: HashMap<[u32; 3], Vec<(u64, u64, u32)>>,
    kernels: Vec<String>,
}

impl Launches {
    pub fn new(launches: &[Launch]) -> Launches {
        let mut by_pe: HashMap<[u32; 3], Vec<(u64, u64, u32)>> = HashMap::new();
        for (i, l) in launches.iter().enumerate() {
            for pe in &l.pes {
                by_pe
                    .entry(*pe)
                    .or_default()
                    .push((l.t_start, l.t_end, i as u32));
            }
        }
        for v in by_pe.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        Launches {
            by_pe,
            kernels: launches.iter().map(|l| l.kernel.clone()).collect(),
        }
    }

    /// The launch holding time `t` on PE `pe`: the latest started one
    /// whose window `[t_start, t_end]` contains `t`.
    pub fn find(&self, pe: [u32; 3], t: u64) -> Option<u32> {
        let v = self.by_pe.get(&pe)?;
        let n = v.partition_point(|x| x.0 <= t);
        v[..n].iter().rev().find(|x| t <= x.1).map(|x| x.2)
    }

    pub fn kernel(&self, i: u32) -> Option<&str> {
        self.kernels.get(i as usize).map(String::as_str)
    }
}

/// One record's columns. Types and spaces are kept as enums (named by
/// `name()` where written): the Parquet export keys its text columns by
/// them.
#[derive(Debug, Default, Clone)]
pub struct Flat {
    pub op_id: u64,
    pub start_ps: u64,
    pub end_ps: u64,
    pub bytes: u64,
    pub flops: u64,
    pub fingerprint: Option<u64>,
    pub dtype: Option<Dtype>,
    pub dtype_acc: Option<Dtype>,
    pub dtype_out: Option<Dtype>,
    pub m: Option<u32>,
    pub n: Option<u32>,
    pub k: Option<u32>,
    pub math_op: Option<MathOp>,
    pub axis: Option<u32>,
    pub rows: Option<u32>,
    pub cols: Option<u64>,
    pub row_bytes: Option<u64>,
    pub in_shapes: Vec<[u64; 2]>,
    pub out_shape: Option<[u64; 2]>,
    pub src_space: Option<Space>,
    pub src_addr: Option<u64>,
    pub dst_space: Option<Space>,
    pub dst_addr: Option<u64>,
    pub read_pa: Option<u64>,
    pub write_pa: Option<u64>,
    pub route: Option<render::Route>,
    pub launch: Option<u32>,
}

impl Flat {
    /// Flatten `r` (its place, for the launch lookup, from `place`).
    pub fn of(r: &Record, place: &Place, launches: Option<&Launches>) -> Flat {
        let mut f = Flat::default();
        f.fill(r, place, launches);
        f
    }

    /// [`Flat::of`] into `self`, keeping `in_shapes`' allocation (the
    /// export flattens every record into one `Flat`).
    pub fn fill(&mut self, r: &Record, place: &Place, launches: Option<&Launches>) {
        let mut in_shapes = std::mem::take(&mut self.in_shapes);
        in_shapes.clear();
        *self = Flat {
            op_id: r.op_id,
            start_ps: r.t_start,
            end_ps: r.t_end,
            bytes: render::bytes_moved(r),
            flops: render::flops(r),
            fingerprint: r.fingerprint,
            read_pa: r.read.as_ref().and_then(|e| e.ranges.first()).map(|x| x.pa),
            write_pa: r
                .write
                .as_ref()
                .and_then(|e| e.ranges.first())
                .map(|x| x.pa),
            route: render::route(r),
            in_shapes,
            ..Default::default()
        };
        let f = self;
        match &r.params {
            Params::Memory(p) => {
                f.dtype = p.dtype;
                f.rows = Some(p.rows);
                f.row_bytes = Some(p.row_bytes);
                f.cols = p.dtype.map(|d| p.row_bytes / d.size() as u64);
                f.out_shape = f.cols.map(|c| [p.rows as u64, c]);
                (f.src_space, f.src_addr) = (Some(p.src.space), Some(p.src.addr));
                (f.dst_space, f.dst_addr) = (Some(p.dst.space), Some(p.dst.addr));
            }
            Params::Gemm(g) => {
                f.dtype = Some(g.dtype_in);
                f.dtype_acc = Some(g.dtype_acc);
                f.dtype_out = Some(g.dtype_out);
                (f.m, f.n, f.k) = (Some(g.m), Some(g.n), Some(g.k));
                let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
                f.in_shapes.extend([[m, k], [k, n]]);
                if g.acc.is_some() {
                    f.in_shapes.push([m, n]);
                }
                f.out_shape = Some([m, n]);
                (f.src_space, f.src_addr) = (Some(g.a.space), Some(g.a.addr));
                (f.dst_space, f.dst_addr) = (Some(g.out.space), Some(g.out.addr));
            }
            Params::Math(m) => {
                f.dtype = Some(m.dtype);
                f.dtype_out = Some(m.dtype);
                f.math_op = Some(m.op);
                f.axis = m.axis.map(u32::from);
                f.rows = Some(m.rows);
                f.cols = Some(m.cols as u64);
                f.out_shape = Some([m.rows as u64, m.cols as u64]);
                for i in &m.inputs {
                    if let MathInput::Tile {
                        addr, rows, cols, ..
                    } = i
                    {
                        f.in_shapes.push([*rows as u64, *cols as u64]);
                        if f.src_addr.is_none() {
                            (f.src_space, f.src_addr) = (Some(addr.space), Some(addr.addr));
                        }
                    }
                }
                (f.dst_space, f.dst_addr) = (Some(m.out.space), Some(m.out.addr));
            }
            Params::Atomic(a) => {
                f.dtype = Some(a.dtype);
                f.dtype_out = Some(a.dtype);
                f.rows = Some(a.rows);
                f.cols = Some(a.cols as u64);
                f.out_shape = Some([a.rows as u64, a.cols as u64]);
                if let kb_format::AtomicValues::Tile(v) = a.values {
                    (f.src_space, f.src_addr) = (Some(v.space), Some(v.addr));
                }
                (f.dst_space, f.dst_addr) = (Some(a.target.space), Some(a.target.addr));
            }
            Params::None | Params::Raw(_) => {}
        }
        if let (Some(l), Some(sip), Some(cube), Some(pe)) =
            (launches, place.sip, place.cube, place.pe)
        {
            f.launch = l.find([sip, cube, pe], r.t_start);
        }
    }
}

/// The CSV header: the columns of the module doc, in order.
pub const CSV_HEADER: &str = "op_id,start_ns,end_ns,dur_ns,start_ps,end_ps,dur_ps,component,sip,cube,pe,unit,kind,name,bytes,flops,fingerprint,dtype,dtype_acc,dtype_out,m,n,k,math_op,axis,rows,cols,row_bytes,in_shapes,out_shape,src_space,src_addr,dst_space,dst_addr,read_pa,write_pa,route_src,route_dst,deps,dep_kinds,launch,kernel";

fn opt<T: std::fmt::Display>(out: &mut String, v: Option<T>) {
    out.push(',');
    if let Some(v) = v {
        let _ = write!(out, "{v}");
    }
}

fn shape_json(out: &mut String, s: &[u64; 2]) {
    let _ = write!(out, "[{},{}]", s[0], s[1]);
}

/// Append one CSV line (with its newline) for a record.
#[allow(clippy::too_many_arguments)]
pub fn push_csv(
    out: &mut String,
    r: &Record,
    s: &Strings,
    place: &Place,
    launches: Option<&Launches>,
) {
    let f = Flat::of(r, place, launches);
    let dur = r.t_end.saturating_sub(r.t_start);
    let _ = write!(
        out,
        "{},{},{},{},{},{},{},",
        r.op_id,
        render::ns(r.t_start),
        render::ns(r.t_end),
        render::ns(dur),
        r.t_start,
        r.t_end,
        dur
    );
    out.push_str(&render::csv(&s.name(r.component)));
    opt(out, place.sip);
    opt(out, place.cube);
    opt(out, place.pe);
    out.push(',');
    out.push_str(&render::csv(&place.unit));
    out.push(',');
    out.push_str(&render::csv(&kind_name(r.kind)));
    out.push(',');
    out.push_str(&render::csv(&s.name(r.op_name)));
    let _ = write!(out, ",{},{}", f.bytes, f.flops);
    opt(out, f.fingerprint.map(|x| format!("{x:#018x}")));
    opt(out, f.dtype.map(Dtype::name));
    opt(out, f.dtype_acc.map(Dtype::name));
    opt(out, f.dtype_out.map(Dtype::name));
    opt(out, f.m);
    opt(out, f.n);
    opt(out, f.k);
    opt(out, f.math_op.map(MathOp::name));
    opt(out, f.axis);
    opt(out, f.rows);
    opt(out, f.cols);
    opt(out, f.row_bytes);
    out.push_str(",\"[");
    for (i, sh) in f.in_shapes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        shape_json(out, sh);
    }
    out.push_str("]\",");
    if let Some(sh) = &f.out_shape {
        out.push('"');
        shape_json(out, sh);
        out.push('"');
    }
    opt(out, f.src_space.map(Space::name));
    opt(out, f.src_addr);
    opt(out, f.dst_space.map(Space::name));
    opt(out, f.dst_addr);
    opt(out, f.read_pa);
    opt(out, f.write_pa);
    opt(out, f.route.map(|r| render::csv(&r.src.to_string())));
    opt(out, f.route.map(|r| render::csv(&r.dst.to_string())));
    out.push_str(",\"[");
    for (i, d) in r.deps.iter().enumerate() {
        let _ = write!(out, "{}{}", if i == 0 { "" } else { "," }, d.op);
    }
    // The kinds as a JSON list of strings, its quotes doubled for CSV.
    out.push_str("]\",\"[");
    for (i, d) in r.deps.iter().enumerate() {
        let _ = write!(
            out,
            "{}\"\"{}\"\"",
            if i == 0 { "" } else { "," },
            d.kind.name()
        );
    }
    out.push_str("]\"");
    opt(out, f.launch);
    opt(
        out,
        f.launch
            .and_then(|i| launches.and_then(|l| l.kernel(i)))
            .map(render::csv),
    );
    out.push('\n');
}

/// Places of components, cached by string id.
#[derive(Debug, Default)]
pub struct Places(Vec<Option<Place>>);

impl Places {
    pub fn get(&mut self, id: u32, s: &Strings) -> &Place {
        let i = id as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, None);
        }
        self.0[i].get_or_insert_with(|| place(&s.name(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_split_into_coordinates_and_unit() {
        let p = place("sip0.cube1.pe3.pe_dma");
        assert_eq!(
            (p.sip, p.cube, p.pe, p.unit.as_str()),
            (Some(0), Some(1), Some(3), "pe_dma")
        );
        let p = place("sip2.cube10.hbm_ctrl");
        assert_eq!(
            (p.sip, p.cube, p.pe, p.unit.as_str()),
            (Some(2), Some(10), None, "hbm_ctrl")
        );
        let p = place("sip1.pcie_ep");
        assert_eq!(
            (p.sip, p.cube, p.pe, p.unit.as_str()),
            (Some(1), None, None, "pcie_ep")
        );
        let p = place("host");
        assert_eq!((p.sip, p.unit.as_str()), (None, "host"));
        // A bare coordinate is a unit name, not a coordinate.
        let p = place("sip0.cube1");
        assert_eq!((p.sip, p.cube, p.unit.as_str()), (Some(0), None, "cube1"));
        let p = place("sip0.cube1.pe2.x.y");
        assert_eq!((p.pe, p.unit.as_str()), (Some(2), "x.y"));
    }

    #[test]
    fn launches_are_found_by_pe_and_time() {
        let l = |k: &str, pes: Vec<[u32; 3]>, t0, t1| Launch {
            kernel: k.into(),
            grid: [1, 1, 1],
            pes,
            t_start: t0,
            t_end: t1,
            flops: 0,
            useful_flops: 0,
        };
        let ls = Launches::new(&[
            l("a", vec![[0, 0, 0], [0, 0, 1]], 100, 200),
            l("b", vec![[0, 0, 1]], 150, 300),
            l("c", vec![[0, 0, 0]], 400, 500),
        ]);
        assert_eq!(ls.find([0, 0, 0], 99), None);
        assert_eq!(ls.find([0, 0, 0], 100), Some(0));
        assert_eq!(ls.find([0, 0, 0], 200), Some(0));
        assert_eq!(ls.find([0, 0, 0], 300), None);
        assert_eq!(ls.find([0, 0, 0], 450), Some(2));
        // Overlapping windows on one PE: the latest started holds it.
        assert_eq!(ls.find([0, 0, 1], 120), Some(0));
        assert_eq!(ls.find([0, 0, 1], 160), Some(1));
        assert_eq!(ls.find([0, 0, 2], 160), None);
        assert_eq!(ls.kernel(1), Some("b"));
    }
}
