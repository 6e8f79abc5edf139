//! Shared rendering and derived quantities: time units, bytes and FLOPs of
//! a record, records as JSON or one line of text, expressions, CSV quoting
//! and natural ordering of component names.
//!
//! Derived quantities (documented in `--help` of `stats`):
//! - **bytes moved** of a memory op: the sum of its write extents' bytes
//!   (`Extent::bytes`); a memory op without a write effect counts its
//!   params' `rows * row_bytes`. An atomic moves its block's bytes
//!   (`rows * cols * dtype`). Compute ops move 0 bytes.
//! - **FLOPs**: gemm `2*m*n*k`; math one FLOP per element of its
//!   `rows x cols` tile (`rows*cols`, whatever the operator); memory 0.
//! - **route** of a memory op ([`route`]): `SRC -> DST`, the memories
//!   ([`Endpoint`]) holding the first range of its read effect and of its
//!   write effect. Compute ops have no route.

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::io::Write as _;

use kb_format::pa::{self, Pa};
use kb_format::{
    Addr, Dep, Effect, Expr, Extent, MathInput, OpKind, Params, Ps, Record, Space, Strings,
};
use serde_json::{Value, json};

/// Picoseconds as exact decimal nanoseconds (`1234567` -> `1234.567`).
pub fn ns(ps: Ps) -> String {
    format!("{}.{:03}", ps / 1000, ps % 1000)
}

/// Picoseconds as exact decimal microseconds (`1234567` -> `1.234567`).
pub fn us(ps: Ps) -> String {
    format!("{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// Parse a time in nanoseconds (fractional allowed, e.g. `1.5`) to ps.
pub fn parse_ns(s: &str) -> Result<Ps, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of nanoseconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?}: a time must be a finite number >= 0"));
    }
    let ps = (v * 1000.0).round();
    if ps >= u64::MAX as f64 {
        return Err(format!("{s:?} ns is out of range"));
    }
    Ok(ps as Ps)
}

/// Parse an op kind: `memory`, `gemm`, `math`, `sync`, `unknown` (any unknown
/// kind) or a numeric kind code.
pub fn parse_kind(s: &str) -> Result<KindSel, String> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "memory" | "mem" => KindSel::Kind(OpKind::Memory),
        "gemm" => KindSel::Kind(OpKind::Gemm),
        "math" => KindSel::Kind(OpKind::Math),
        "sync" => KindSel::Kind(OpKind::Sync),
        "atomic" => KindSel::Kind(OpKind::Atomic),
        "unknown" => KindSel::AnyUnknown,
        other => match other.parse::<u8>() {
            Ok(c) => KindSel::Kind(OpKind::from_code(c)),
            Err(_) => {
                return Err(format!(
                    "unknown op kind {s:?} (memory, gemm, math, sync, atomic, unknown or a code 0-255)"
                ));
            }
        },
    })
}

/// An op kind selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindSel {
    Kind(OpKind),
    AnyUnknown,
}

impl KindSel {
    pub fn matches(self, k: OpKind) -> bool {
        match self {
            KindSel::Kind(x) => x == k,
            KindSel::AnyUnknown => matches!(k, OpKind::Unknown(_)),
        }
    }
}

/// Name of an op kind, with the code for unknown kinds (`unknown(7)`).
pub fn kind_name(k: OpKind) -> String {
    match k {
        OpKind::Unknown(c) => format!("unknown({c})"),
        k => k.name().to_string(),
    }
}

/// Bytes moved by a record (see the module doc).
pub fn bytes_moved(r: &Record) -> u64 {
    if let Params::Atomic(a) = &r.params {
        // An atomic moves its block's bytes (values out, old values back).
        return if r.kind == OpKind::Atomic {
            a.nbytes().unwrap_or(0)
        } else {
            0
        };
    }
    if r.kind != OpKind::Memory {
        return 0;
    }
    match (&r.write, &r.params) {
        (Some(w), _) => w
            .ranges
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.bytes())),
        (None, Params::Memory(p)) => p.nbytes(),
        (None, _) => 0,
    }
}

/// FLOPs of a record (see the module doc).
pub fn flops(r: &Record) -> u64 {
    r.params.flops()
}

/// A physical address for display: decoded device PA, host tensor byte,
/// or hex when it is neither.
pub fn pa_string(a: u64) -> String {
    if let Some(p) = Pa::decode(a) {
        return p.to_string();
    }
    if let Some((t, off)) = pa::split_host(a) {
        return format!("host.t{t}+{off:#x}");
    }
    format!("{a:#x}")
}

/// The memory a physical address lies in, as a route endpoint: a PE's
/// TCM (`sipS.cubeC.peP.tcm`), a cube's SRAM (`sipS.cubeC.sram`), a cube's
/// HBM (`sipS.cubeC.hbm`: HBM is per cube, its PE partitions are not told
/// apart) or host space (`host`); `?` when there is no address (no effect,
/// or one without ranges) or it is not a valid PA. Small and `Copy`:
/// `stats --by route` groups by it without building strings per record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    Unknown,
    Host,
    Hbm { sip: u8, cube: u8 },
    Sram { sip: u8, cube: u8 },
    Tcm { sip: u8, cube: u8, pe: u8 },
}

impl Endpoint {
    /// The endpoint of a 51-bit address (device or host).
    pub fn of_pa(a: u64) -> Endpoint {
        if pa::space_of(a) == Some(Space::Host) {
            return Endpoint::Host;
        }
        let Some(p) = Pa::decode(a) else {
            return Endpoint::Unknown;
        };
        // Pa::decode masks sip to 5 bits and cube and pe to 4.
        let (sip, cube, pe) = (p.sip as u8, p.cube as u8, p.pe as u8);
        match p.space {
            Space::Hbm => Endpoint::Hbm { sip, cube },
            Space::Sram => Endpoint::Sram { sip, cube },
            Space::Tcm => Endpoint::Tcm { sip, cube, pe },
            Space::Host => Endpoint::Host,
        }
    }

    /// The endpoint of an effect: that of its first range.
    pub fn of_effect(e: Option<&Effect>) -> Endpoint {
        e.and_then(|e| e.ranges.first())
            .map_or(Endpoint::Unknown, |x| Endpoint::of_pa(x.pa))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Endpoint::Unknown => f.write_str("?"),
            Endpoint::Host => f.write_str("host"),
            Endpoint::Hbm { sip, cube } => write!(f, "sip{sip}.cube{cube}.hbm"),
            Endpoint::Sram { sip, cube } => write!(f, "sip{sip}.cube{cube}.sram"),
            Endpoint::Tcm { sip, cube, pe } => write!(f, "sip{sip}.cube{cube}.pe{pe}.tcm"),
        }
    }
}

/// Where a memory op moved bytes: displayed as `SRC -> DST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    pub src: Endpoint,
    pub dst: Endpoint,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

/// The route of a memory op (see the module doc); `None` for other kinds.
pub fn route(r: &Record) -> Option<Route> {
    (r.kind == OpKind::Memory).then(|| Route {
        src: Endpoint::of_effect(r.read.as_ref()),
        dst: Endpoint::of_effect(r.write.as_ref()),
    })
}

fn addr_json(a: &Addr) -> Value {
    json!({ "space": a.space.name(), "addr": format!("{:#x}", a.addr) })
}

fn extent_json(e: &Extent) -> Value {
    json!({
        "pa": format!("{:#x}", e.pa),
        "at": pa_string(e.pa),
        "len": e.len,
        "rows": e.rows,
        "stride": e.stride,
        "bytes": e.bytes(),
    })
}

fn effect_json(e: &Option<Effect>) -> Value {
    match e {
        None => Value::Null,
        Some(e) => json!({
            "time_ps": e.time,
            "seq": e.seq,
            "ranges": e.ranges.iter().map(extent_json).collect::<Vec<_>>(),
        }),
    }
}

/// JSON form of a record's params.
pub fn params_json(p: &Params) -> Value {
    match p {
        Params::None => Value::Null,
        Params::Memory(m) => json!({
            "src": addr_json(&m.src),
            "dst": addr_json(&m.dst),
            "rows": m.rows,
            "row_bytes": m.row_bytes,
            "src_stride": m.src_stride,
            "dst_stride": m.dst_stride,
            "dtype": m.dtype.map(|d| d.name()),
        }),
        Params::Gemm(g) => json!({
            "a": addr_json(&g.a),
            "b": addr_json(&g.b),
            "out": addr_json(&g.out),
            "acc": g.acc.as_ref().map(addr_json),
            "m": g.m, "n": g.n, "k": g.k,
            "dtype_in": g.dtype_in.name(),
            "dtype_acc": g.dtype_acc.name(),
            "dtype_out": g.dtype_out.name(),
            "transpose_a": g.transpose_a,
            "transpose_b": g.transpose_b,
            "layout_a": format!("{:?}", g.layout_a),
            "layout_b": format!("{:?}", g.layout_b),
            "layout_out": format!("{:?}", g.layout_out),
        }),
        Params::Math(m) => json!({
            "op": m.op.name(),
            "inputs": m.inputs.iter().map(|i| match i {
                MathInput::Tile { addr, rows, cols, dtype } => json!({
                    "tile": addr_json(addr), "rows": rows, "cols": cols, "dtype": dtype.name(),
                }),
                MathInput::Scalar(v) => json!({ "scalar": v }),
            }).collect::<Vec<_>>(),
            "out": addr_json(&m.out),
            "rows": m.rows,
            "cols": m.cols,
            "dtype": m.dtype.name(),
            "axis": m.axis,
        }),
        Params::Atomic(a) => json!({
            "op": a.op.name(),
            "dtype": a.dtype.name(),
            "target": addr_json(&a.target),
            "values": match a.values {
                kb_format::AtomicValues::Tile(v) => json!({ "tile": addr_json(&v) }),
                kb_format::AtomicValues::Scalar(v) => json!({ "scalar": v }),
            },
            "old": addr_json(&a.old),
            "mask": a.mask.as_ref().map(addr_json),
            "rows": a.rows,
            "cols": a.cols,
            "stride": a.stride,
            "cmp": (a.op == kb_format::AtomicOp::Cas).then_some(a.cmp),
        }),
        Params::Raw(b) => json!({ "raw": hex(b) }),
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub fn fingerprint_string(f: Option<u64>) -> Option<String> {
    f.map(|f| format!("{f:#018x}"))
}

/// A causal edge as JSON: `{"op": 3, "kind": "program"}`.
pub fn dep_json(d: &Dep) -> Value {
    json!({ "op": d.op, "kind": d.kind.name() })
}

/// A record's edges as text: `3:program,5:data` (empty without any).
pub fn deps_brief(deps: &[Dep]) -> String {
    let mut s = String::new();
    for (i, d) in deps.iter().enumerate() {
        let _ = write!(
            s,
            "{}{}:{}",
            if i == 0 { "" } else { "," },
            d.op,
            d.kind.name()
        );
    }
    s
}

/// The full record as JSON (names resolved; times in ps).
pub fn record_json(r: &Record, s: &Strings) -> Value {
    json!({
        "op_id": r.op_id,
        "t_start_ps": r.t_start,
        "t_end_ps": r.t_end,
        "dur_ps": r.t_end.saturating_sub(r.t_start),
        "active_start_ps": kb_format::usage::active(r).0,
        "active_end_ps": kb_format::usage::active(r).1,
        "component": s.name(r.component),
        "op_name": s.name(r.op_name),
        "kind": kind_name(r.kind),
        "bytes": bytes_moved(r),
        "flops": flops(r),
        "fingerprint": fingerprint_string(r.fingerprint),
        "deps": r.deps.iter().map(dep_json).collect::<Vec<_>>(),
        "params": params_json(&r.params),
        "read": effect_json(&r.read),
        "write": effect_json(&r.write),
    })
}

fn push_str_json(out: &mut Vec<u8>, v: &str) {
    serde_json::to_writer(&mut *out, v).expect("writing to a Vec cannot fail");
}

fn push_addr_json(out: &mut Vec<u8>, a: &Addr) {
    let _ = write!(
        out,
        "{{\"space\":\"{}\",\"addr\":\"{:#x}\"}}",
        a.space.name(),
        a.addr
    );
}

fn push_effect_json(out: &mut Vec<u8>, e: &Option<Effect>) {
    let Some(e) = e else {
        out.extend_from_slice(b"null");
        return;
    };
    let _ = write!(
        out,
        "{{\"time_ps\":{},\"seq\":{},\"ranges\":[",
        e.time, e.seq
    );
    for (i, x) in e.ranges.iter().enumerate() {
        let _ = write!(
            out,
            "{}{{\"pa\":\"{:#x}\",\"at\":\"{}\",\"len\":{},\"rows\":{},\"stride\":{},\"bytes\":{}}}",
            if i == 0 { "" } else { "," },
            x.pa,
            pa_string(x.pa),
            x.len,
            x.rows,
            x.stride,
            x.bytes()
        );
    }
    out.extend_from_slice(b"]}");
}

/// Append [`record_json`]'s value as compact JSON text (the same content,
/// in a readable key order), without building a `Value`: the fast path
/// for listing millions of records.
pub fn push_record_json(out: &mut Vec<u8>, r: &Record, s: &Strings) {
    let _ = write!(
        out,
        "{{\"op_id\":{},\"t_start_ps\":{},\"t_end_ps\":{},\"dur_ps\":{},\"active_start_ps\":{},\"active_end_ps\":{},\"component\":",
        r.op_id,
        r.t_start,
        r.t_end,
        r.t_end.saturating_sub(r.t_start),
        kb_format::usage::active(r).0,
        kb_format::usage::active(r).1
    );
    push_str_json(out, &s.name(r.component));
    out.extend_from_slice(b",\"op_name\":");
    push_str_json(out, &s.name(r.op_name));
    let _ = write!(
        out,
        ",\"kind\":\"{}\",\"bytes\":{},\"flops\":{},\"fingerprint\":",
        kind_name(r.kind),
        bytes_moved(r),
        flops(r)
    );
    match r.fingerprint {
        Some(f) => {
            let _ = write!(out, "\"{f:#018x}\"");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"deps\":[");
    for (i, d) in r.deps.iter().enumerate() {
        let _ = write!(
            out,
            "{}{{\"op\":{},\"kind\":\"{}\"}}",
            if i == 0 { "" } else { "," },
            d.op,
            d.kind.name()
        );
    }
    out.extend_from_slice(b"],\"params\":");
    match &r.params {
        Params::Memory(m) => {
            out.extend_from_slice(b"{\"src\":");
            push_addr_json(out, &m.src);
            out.extend_from_slice(b",\"dst\":");
            push_addr_json(out, &m.dst);
            let _ = write!(
                out,
                ",\"rows\":{},\"row_bytes\":{},\"src_stride\":{},\"dst_stride\":{},\"dtype\":",
                m.rows, m.row_bytes, m.src_stride, m.dst_stride
            );
            match m.dtype {
                Some(d) => {
                    let _ = write!(out, "\"{d}\"}}");
                }
                None => out.extend_from_slice(b"null}"),
            }
        }
        p => serde_json::to_writer(&mut *out, &params_json(p)).expect("writing to a Vec"),
    }
    out.extend_from_slice(b",\"read\":");
    push_effect_json(out, &r.read);
    out.extend_from_slice(b",\"write\":");
    push_effect_json(out, &r.write);
    out.push(b'}');
}

/// A short description of the params (table output).
pub fn params_brief(r: &Record) -> String {
    match &r.params {
        Params::None => String::new(),
        Params::Memory(m) => {
            let mut s = format!(
                "{}:{:#x} -> {}:{:#x} {}x{}B",
                m.src.space.name(),
                m.src.addr,
                m.dst.space.name(),
                m.dst.addr,
                m.rows,
                m.row_bytes
            );
            if let Some(d) = m.dtype {
                let _ = write!(s, " {d}");
            }
            s
        }
        Params::Gemm(g) => format!(
            "m={} n={} k={} {}->{}{}{}",
            g.m,
            g.n,
            g.k,
            g.dtype_in,
            g.dtype_out,
            if g.transpose_a { " tA" } else { "" },
            if g.transpose_b { " tB" } else { "" }
        ),
        Params::Math(m) => format!("{} {}x{} {}", m.op.name(), m.rows, m.cols, m.dtype),
        Params::Atomic(a) => format!(
            "{} {}:{:#x} {}x{} {}{}",
            a.op.name(),
            a.target.space.name(),
            a.target.addr,
            a.rows,
            a.cols,
            a.dtype,
            if a.mask.is_some() { " masked" } else { "" }
        ),
        Params::Raw(b) => format!("{} raw bytes", b.len()),
    }
}

/// One line describing a record (diff output).
pub fn record_line(r: &Record, s: &Strings) -> String {
    let mut line = format!(
        "op {} [{} .. {} ns] {} {} ({})",
        r.op_id,
        ns(r.t_start),
        ns(r.t_end),
        s.name(r.component),
        s.name(r.op_name),
        kind_name(r.kind)
    );
    if let Some(f) = r.fingerprint {
        let _ = write!(line, " fingerprint {f:#018x}");
    }
    let b = params_brief(r);
    if !b.is_empty() {
        let _ = write!(line, " {b}");
    }
    if !r.deps.is_empty() {
        let _ = write!(line, " deps {}", deps_brief(&r.deps));
    }
    line
}

/// An expression as text: `softmax(matmul(a, transpose(b)), axis=1)`.
pub fn expr_string(e: &Expr) -> String {
    fn un(name: &str, a: &Expr) -> String {
        format!("{name}({})", expr_string(a))
    }
    fn bin(name: &str, a: &Expr, b: &Expr) -> String {
        format!("{name}({}, {})", expr_string(a), expr_string(b))
    }
    match e {
        Expr::Tensor(t) => t.clone(),
        Expr::Scalar(v) => format!("{v}"),
        Expr::Matmul(a, b) => bin("matmul", a, b),
        Expr::Transpose(a) => un("transpose", a),
        Expr::Add(a, b) => bin("add", a, b),
        Expr::Sub(a, b) => bin("sub", a, b),
        Expr::Mul(a, b) => bin("mul", a, b),
        Expr::Div(a, b) => bin("div", a, b),
        Expr::Exp(a) => un("exp", a),
        Expr::Softmax { input, axis } => format!("softmax({}, axis={axis})", expr_string(input)),
        Expr::Gather { table, indices } => bin("gather", table, indices),
        Expr::Sum { input, axis } => format!("sum({}, axis={axis})", expr_string(input)),
        Expr::Max { input, axis } => format!("max({}, axis={axis})", expr_string(input)),
        Expr::Sqrt(a) => un("sqrt", a),
        Expr::Rsqrt(a) => un("rsqrt", a),
        Expr::Log(a) => un("log", a),
        Expr::Abs(a) => un("abs", a),
        Expr::Neg(a) => un("neg", a),
        Expr::Tanh(a) => un("tanh", a),
        Expr::Erf(a) => un("erf", a),
        Expr::Sigmoid(a) => un("sigmoid", a),
        Expr::Maximum(a, b) => bin("maximum", a, b),
        Expr::Minimum(a, b) => bin("minimum", a, b),
        Expr::Pow(a, b) => bin("pow", a, b),
        Expr::Lt(a, b) => bin("lt", a, b),
        Expr::Le(a, b) => bin("le", a, b),
        Expr::Gt(a, b) => bin("gt", a, b),
        Expr::Ge(a, b) => bin("ge", a, b),
        Expr::Eq(a, b) => bin("eq", a, b),
        Expr::Ne(a, b) => bin("ne", a, b),
        Expr::Where { cond, a, b } => format!(
            "where({}, {}, {})",
            expr_string(cond),
            expr_string(a),
            expr_string(b)
        ),
        Expr::Mean { input, axis } => format!("mean({}, axis={axis})", expr_string(input)),
        Expr::Min { input, axis } => format!("min({}, axis={axis})", expr_string(input)),
        Expr::SumBlocks { input, blocks } => {
            format!("sum_blocks({}, blocks={blocks})", expr_string(input))
        }
        Expr::Tile { input, reps } => format!("tile({}, reps={reps})", expr_string(input)),
        Expr::Iota { rows, cols, axis } => format!("iota({rows}x{cols}, axis={axis})"),
        Expr::Tril { input, diagonal } => format!("tril({}, k={diagonal})", expr_string(input)),
        Expr::Triu { input, diagonal } => format!("triu({}, k={diagonal})", expr_string(input)),
        Expr::And(a, b) => bin("and", a, b),
        Expr::Or(a, b) => bin("or", a, b),
        Expr::Xor(a, b) => bin("xor", a, b),
        Expr::Not(a) => un("not", a),
        Expr::Log2(a) => un("log2", a),
        Expr::Sin(a) => un("sin", a),
        Expr::Cos(a) => un("cos", a),
        Expr::Floor(a) => un("floor", a),
        Expr::Ceil(a) => un("ceil", a),
        Expr::Rem(a, b) => bin("rem", a, b),
        Expr::Clamp { input, lo, hi } => format!(
            "clamp({}, {}, {})",
            expr_string(input),
            expr_string(lo),
            expr_string(hi)
        ),
        Expr::Cumsum { input, axis } => format!("cumsum({}, axis={axis})", expr_string(input)),
        Expr::Cumprod { input, axis } => format!("cumprod({}, axis={axis})", expr_string(input)),
        Expr::Cummax { input, axis } => format!("cummax({}, axis={axis})", expr_string(input)),
        Expr::Reshape { input, rows, cols } => {
            format!("reshape({}, {rows}x{cols})", expr_string(input))
        }
        Expr::Slice {
            input,
            row,
            col,
            rows,
            cols,
        } => format!(
            "slice({}, at=({row}, {col}), {rows}x{cols})",
            expr_string(input)
        ),
        Expr::Concat { a, b, axis } => format!(
            "concat({}, {}, axis={axis})",
            expr_string(a),
            expr_string(b)
        ),
        Expr::Rand { seed, offsets } => format!("rand(seed={seed}, {})", expr_string(offsets)),
        Expr::BatchedMatmul { a, b, batch } => format!(
            "batched_matmul({}, {}, batch={batch})",
            expr_string(a),
            expr_string(b)
        ),
    }
}

/// Quote a CSV field when it needs it (RFC 4180).
pub fn csv(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Order names with embedded numbers numerically: `pe2` < `pe10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (da, db) = (trim_zeros(&a[..na]), trim_zeros(&b[..nb]));
                let o = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[na..];
                b = &b[nb..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&c| c == b'0').count();
    &d[n.min(d.len().saturating_sub(1))..]
}

/// Bytes with a binary unit (`1.5 KiB`).
pub fn human_bytes(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use kb_format::Space;

    #[test]
    fn times_are_exact_decimals() {
        assert_eq!(ns(1_234_567), "1234.567");
        assert_eq!(ns(5), "0.005");
        assert_eq!(us(1_234_567), "1.234567");
        assert_eq!(us(3), "0.000003");
        assert_eq!(parse_ns("1.5"), Ok(1500));
        assert_eq!(parse_ns("2"), Ok(2000));
        assert_eq!(parse_ns("0.0004"), Ok(0));
        assert!(parse_ns("-1").is_err());
        assert!(parse_ns("abc").is_err());
        assert!(parse_ns("inf").is_err());
        assert!(parse_ns("1e30").is_err());
    }

    #[test]
    fn bytes_and_flops_follow_the_documented_rules() {
        let ops = testutil::sample_ops();
        let b: Vec<u64> = ops.iter().map(|o| bytes_moved(&o.rec)).collect();
        assert_eq!(b, [64, 64, 128, 0, 32, 0, 256]);
        let f: Vec<u64> = ops.iter().map(|o| flops(&o.rec)).collect();
        assert_eq!(f, [0, 0, 0, 48, 0, 16, 0]);
        // Without a write effect, a memory op counts its params.
        let mut r = ops[2].rec.clone();
        r.write = None;
        assert_eq!(bytes_moved(&r), 128);
    }

    #[test]
    fn fast_record_json_matches_the_value_form() {
        let bytes = testutil::sample_trace();
        let mut n = 0;
        let mut v = crate::source::Records(|r: &Record, s: &Strings| {
            let mut out = Vec::new();
            push_record_json(&mut out, r, s);
            let fast: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(fast, record_json(r, s), "op {}", r.op_id);
            n += 1;
            Ok(crate::Flow::Continue)
        });
        crate::source::visit_reader("t", &bytes[..], &mut v).unwrap();
        assert_eq!(n, 7);
        // Names needing escapes, no effects, no fingerprint, raw params.
        let mut r = testutil::sample_ops()[1].rec.clone();
        (r.read, r.write, r.fingerprint) = (None, None, None);
        r.kind = OpKind::Unknown(9);
        r.deps = vec![
            Dep::data(0),
            Dep {
                op: 5,
                kind: kb_format::DepKind::Program,
            },
        ];
        r.params = Params::Raw(vec![1, 2, 0xff]);
        let s = Strings::default();
        let mut out = Vec::new();
        push_record_json(&mut out, &r, &s);
        let fast: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(fast, record_json(&r, &s));
        assert_eq!(fast["params"]["raw"], "0102ff");
        assert_eq!(
            fast["deps"],
            json!([{"op": 0, "kind": "data"}, {"op": 5, "kind": "program"}])
        );
        assert!(record_line(&r, &s).ends_with(" deps 0:data,5:program"));
    }

    #[test]
    fn kinds_parse() {
        assert_eq!(parse_kind("GEMM"), Ok(KindSel::Kind(OpKind::Gemm)));
        assert_eq!(parse_kind("9"), Ok(KindSel::Kind(OpKind::Unknown(9))));
        assert!(parse_kind("unknown").unwrap().matches(OpKind::Unknown(200)));
        assert!(!parse_kind("unknown").unwrap().matches(OpKind::Math));
        assert_eq!(parse_kind("sync"), Ok(KindSel::Kind(OpKind::Sync)));
        assert_eq!(parse_kind("3"), Ok(KindSel::Kind(OpKind::Sync)));
        assert_eq!(kind_name(OpKind::Sync), "sync");
        assert!(parse_kind("dma").is_err());
        assert_eq!(kind_name(OpKind::Unknown(7)), "unknown(7)");
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["sip0.cube10", "sip0.cube2", "sip1", "sip0.cube02x", "host"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            ["host", "sip0.cube2", "sip0.cube02x", "sip0.cube10", "sip1"]
        );
    }

    #[test]
    fn expressions_and_csv() {
        let v = testutil::sample_verify();
        assert_eq!(
            expr_string(&v.outputs[0].reference),
            "softmax(matmul(a, transpose(b)), axis=1)"
        );
        assert_eq!(csv("a,b"), "\"a,b\"");
        assert_eq!(csv("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(csv("plain"), "plain");
    }

    #[test]
    fn sum_blocks_and_tile_render() {
        // An all-reduce's reference: the blocks summed, then one copy per PE.
        let e = Expr::Tile {
            input: Box::new(Expr::SumBlocks {
                input: Box::new(Expr::Tensor("x".into())),
                blocks: 8,
            }),
            reps: 8,
        };
        assert_eq!(expr_string(&e), "tile(sum_blocks(x, blocks=8), reps=8)");
    }

    #[test]
    fn addresses_display() {
        let p = Pa {
            space: Space::Hbm,
            sip: 1,
            cube: 2,
            pe: 3,
            offset: 0x40,
        }
        .encode()
        .unwrap();
        assert_eq!(pa_string(p), "sip1.cube2.pe3.hbm+0x40");
        assert_eq!(pa_string(pa::host(2, 16)), "host.t2+0x10");
        assert_eq!(pa_string(1 << 60), "0x1000000000000000");
    }

    #[test]
    fn memory_endpoints_and_routes_are_named_from_the_first_ranges() {
        let dev = testutil::dev;
        let name = |a: u64| Endpoint::of_pa(a).to_string();
        assert_eq!(name(dev(Space::Tcm, 1, 2, 3, 0x40)), "sip1.cube2.pe3.tcm");
        assert_eq!(
            name(dev(Space::Tcm, 31, 15, 15, 0)),
            "sip31.cube15.pe15.tcm"
        );
        assert_eq!(name(dev(Space::Sram, 0, 4, 0, 0x10)), "sip0.cube4.sram");
        // HBM is per cube: its PE partitions are one endpoint.
        assert_eq!(name(dev(Space::Hbm, 2, 1, 5, 0)), "sip2.cube1.hbm");
        assert_eq!(
            Endpoint::of_pa(dev(Space::Hbm, 2, 1, 5, 0)),
            Endpoint::of_pa(dev(Space::Hbm, 2, 1, 0, 0x1234))
        );
        assert_eq!(name(pa::host(7, 0x100)), "host");
        // Not a valid PA: bits above 50, or a space code past sram.
        assert_eq!(name(1 << 60), "?");
        assert_eq!(name(5 << 48), "?");
        assert_eq!(Endpoint::of_effect(None), Endpoint::Unknown);
        let ops = testutil::route_ops();
        let routes: Vec<Option<String>> = ops
            .iter()
            .map(|o| route(&o.rec).map(|r| r.to_string()))
            .collect();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            routes,
            [
                some("host -> sip0.cube0.hbm"),
                some("sip0.cube0.hbm -> sip0.cube0.pe0.tcm"),
                some("sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm"),
                some("sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm"),
                None,
                some("sip0.cube0.pe0.tcm -> sip0.cube1.sram"),
                some("sip0.cube0.hbm -> sip0.cube0.pe0.tcm"),
                None,
                some("sip1.cube0.pe2.tcm -> sip1.cube0.pe10.tcm"),
                some("? -> sip0.cube0.hbm"),
            ]
        );
        // An effect without ranges, and a missing write, are `?` too; an
        // unknown kind has no route.
        let mut r = ops[2].rec.clone();
        r.read.as_mut().unwrap().ranges.clear();
        r.write = None;
        assert_eq!(route(&r).unwrap().to_string(), "? -> ?");
        r.kind = OpKind::Unknown(9);
        assert_eq!(route(&r), None);
    }
}
