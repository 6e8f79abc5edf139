//! Encoding of op records inside a records chunk: LEB128 varints, with
//! op ids, start times, effect sequence numbers and addresses delta-coded
//! against the previous value in the same chunk. Each chunk starts from a
//! zero state, so any records chunk decodes on its own (random access).
//!
//! Addresses code against predictors held per (component, op name)
//! context, because one context's records walk nearby addresses while
//! different contexts interleave in time. Each context has four: read-side
//! and write-side params addresses, read and write range addresses (apart
//! from the params, which carry the VA or LA a kernel used while ranges
//! carry PAs). docs/trace-format.md gives the exact layout and the context
//! table.

use crate::atomic::{AtomicOp, AtomicParams, AtomicValues};
use crate::cursor::{Cur, V};
use crate::error::{FormatError, Result};
use crate::types::*;

const F_FINGERPRINT: u8 = 1 << 0;
const F_READ: u8 = 1 << 1;
const F_WRITE: u8 = 1 << 2;
/// Dependencies, all data ones (before format 3.4): a count, then each
/// as a signed varint `op_id - dep`. Read, never written.
const F_DEPS: u8 = 1 << 3;
/// An active interval follows the duration (format 3.3): two varints,
/// `start - t_start` and `end - start`.
const F_ACTIVE: u8 = 1 << 4;
/// Causal edges (format 3.4): a count, then each as a varint
/// `(op_id - dep) << 3 | kind`.
const F_EDGES: u8 = 1 << 5;
/// An atomic op (kind 4, set exactly on those records): a reader built
/// before atomics refuses the record (unknown flags) instead of skipping
/// its effects as an unknown kind's. The trace's version stays 3.4.
const F_ATOMIC: u8 = 1 << 6;
const F_KNOWN: u8 = F_FINGERPRINT | F_READ | F_WRITE | F_DEPS | F_ACTIVE | F_EDGES | F_ATOMIC;

/// Address predictor of the read-side params.
const RD: usize = 0;
/// Address predictor of the write-side params.
const WR: usize = 1;

/// Largest number of math inputs, effect ranges and dependencies a record
/// may have (the decoder refuses more; the writer checks before encoding).
pub const MAX_MATH_INPUTS: usize = 64;
pub const MAX_RANGES: usize = 1 << 20;
pub const MAX_DEPS: usize = 1 << 20;

/// Offset of the range predictors from the params ones.
const RANGES: usize = 2;

/// Delta-coding state shared by the encoder and decoder.
#[derive(Debug, Default, Clone)]
struct State {
    op_id: u64,
    t_start: u64,
    seq: u64,
    /// The slot of the current record's context in `ctx`.
    slot: usize,
    /// The address predictors of each (component, op name) context: a
    /// context's records move similar addresses, while records of
    /// different contexts interleave in time (PEs, loads and stores).
    ctx: Contexts,
}

/// Predictors by (component, op name) context: a direct-mapped table of
/// `CONTEXTS` slots, the slot being the top bits of
/// `(component << 32 | op_name) * 0x9E37_79B9_7F4A_7C15` (wrapping). A
/// context not in its slot starts from zero predictors and takes the slot
/// over. Each slot holds four predictors: read-side params, write-side
/// params, read ranges, write ranges. No allocation per record; both sides
/// evict the same way.
#[derive(Debug, Clone)]
struct Contexts(Box<[(u64, [u64; 4]); CONTEXTS]>);

/// Slots of the context table (a power of two).
const CONTEXTS: usize = 256;

impl Default for Contexts {
    fn default() -> Self {
        Contexts(Box::new([(u64::MAX, [0; 4]); CONTEXTS]))
    }
}

impl State {
    /// Selects the context of a record's (component, op name).
    #[inline(always)]
    fn enter(&mut self, component: u32, op_name: u32) {
        let key = (component as u64) << 32 | op_name as u64;
        let slot = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CONTEXTS.trailing_zeros()))
            as usize
            & (CONTEXTS - 1);
        if self.ctx.0[slot].0 != key {
            // A new context starts from the previous record's predictors:
            // its first addresses are often near those.
            let from = self.ctx.0[self.slot & (CONTEXTS - 1)].1;
            self.ctx.0[slot] = (key, from);
        }
        self.slot = slot;
    }

    /// The current context's predictor `side`.
    #[inline(always)]
    fn addr(&mut self, side: usize) -> &mut u64 {
        &mut self.ctx.0[self.slot & (CONTEXTS - 1)].1[side & 3]
    }
}

#[inline(always)]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// An upper bound of the encoded size of `r`, so that the encoder can
/// write into a slice sized once per record.
fn size_bound(r: &Record) -> usize {
    let effect = |e: &Option<Effect>| e.as_ref().map_or(0, |e| 3 * V + e.ranges.len() * 4 * V);
    let params = match &r.params {
        Params::None => 0,
        Params::Raw(b) => b.len(),
        Params::Memory(_) => 2 * (1 + V) + 4 * V + 1,
        Params::Gemm(_) => 4 * (1 + V) + 1 + 3 * V + 4,
        Params::Math(m) => 1 + V + m.inputs.len() * (2 + 3 * V + 1) + (1 + V) + 2 * V + 2,
        Params::Atomic(_) => 2 + 4 * (1 + V) + 2 + 8 + 4 * V,
    };
    let active = if r.active.is_some() { 2 * V } else { 0 };
    2 + 5 * V + active + 8 + V + r.deps.len() * V + effect(&r.read) + effect(&r.write) + V + params
}

/// A cursor writing into a slice known to be large enough.
struct Out<'a> {
    b: &'a mut [u8],
    pos: usize,
}

impl Out<'_> {
    #[inline(always)]
    fn byte(&mut self, v: u8) {
        self.b[self.pos] = v;
        self.pos += 1;
    }

    /// Values up to 56 bits are spread into one 8-byte little-endian store
    /// (the size bound leaves 10 bytes per varint, so the store fits; the
    /// bytes past the varint are overwritten or truncated later).
    #[inline(always)]
    fn varint(&mut self, v: u64) {
        if v < 0x80 {
            self.byte(v as u8);
        } else if v < 0x4000 {
            self.b[self.pos..self.pos + 2].copy_from_slice(&[(v as u8) | 0x80, (v >> 7) as u8]);
            self.pos += 2;
        } else if v < 1 << 56 {
            let x = (v & 0x7f)
                | ((v << 1) & (0x7f << 8))
                | ((v << 2) & (0x7f << 16))
                | ((v << 3) & (0x7f << 24))
                | ((v << 4) & (0x7f << 32))
                | ((v << 5) & (0x7f << 40))
                | ((v << 6) & (0x7f << 48))
                | ((v << 7) & (0x7f << 56));
            let n = (64 - v.leading_zeros() as usize).div_ceil(7); // 2..=8
            let cont = 0x8080_8080_8080_8080u64 >> (64 - 8 * (n - 1));
            self.b[self.pos..self.pos + 8].copy_from_slice(&(x | cont).to_le_bytes());
            self.pos += n;
        } else {
            let mut v = v;
            while v >= 0x80 {
                self.byte((v as u8) | 0x80);
                v >>= 7;
            }
            self.byte(v as u8);
        }
    }

    #[inline(always)]
    fn signed(&mut self, d: i64) {
        self.varint(zigzag(d));
    }

    #[inline(always)]
    fn fixed(&mut self, v: u64) {
        self.b[self.pos..self.pos + 8].copy_from_slice(&v.to_le_bytes());
        self.pos += 8;
    }

    #[inline(always)]
    fn addr(&mut self, st: &mut State, side: usize, a: u64) {
        let p = st.addr(side);
        let d = a.wrapping_sub(*p);
        *p = a;
        self.signed(d as i64);
    }

    #[inline(always)]
    fn space_addr(&mut self, st: &mut State, side: usize, a: Addr) {
        self.byte(a.space as u8);
        self.addr(st, side, a.addr);
    }

    #[inline(always)]
    fn effect(&mut self, st: &mut State, side: usize, e: &Effect, t_start: Ps) {
        self.signed(e.time.wrapping_sub(t_start) as i64);
        self.signed(e.seq.wrapping_sub(st.seq) as i64);
        st.seq = e.seq;
        self.varint(e.ranges.len() as u64);
        let mut pa = *st.addr(side + RANGES);
        for x in &e.ranges {
            self.signed(x.pa.wrapping_sub(pa) as i64);
            pa = x.pa;
            self.varint(x.len);
            self.varint(x.rows as u64);
            if x.rows > 1 {
                self.varint(x.stride);
            }
        }
        *st.addr(side + RANGES) = pa;
    }

    fn params(&mut self, st: &mut State, p: &Params) {
        match p {
            Params::None => {}
            Params::Raw(bytes) => {
                self.b[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
                self.pos += bytes.len();
            }
            Params::Memory(m) => {
                self.space_addr(st, RD, m.src);
                self.space_addr(st, WR, m.dst);
                self.varint(m.rows as u64);
                self.varint(m.row_bytes);
                if m.rows > 1 {
                    self.varint(m.src_stride);
                    self.varint(m.dst_stride);
                }
                self.byte(m.dtype.map_or(0xff, |d| d as u8));
            }
            Params::Gemm(g) => {
                self.space_addr(st, RD, g.a);
                self.space_addr(st, RD, g.b);
                self.space_addr(st, WR, g.out);
                match g.acc {
                    Some(a) => {
                        self.byte(1);
                        self.space_addr(st, RD, a);
                    }
                    None => self.byte(0),
                }
                self.varint(g.m as u64);
                self.varint(g.k as u64);
                self.varint(g.n as u64);
                self.byte(g.dtype_in as u8);
                self.byte(g.dtype_acc as u8);
                self.byte(g.dtype_out as u8);
                let bits = (g.transpose_a as u8)
                    | (g.transpose_b as u8) << 1
                    | ((g.layout_a == Layout::ColMajor) as u8) << 2
                    | ((g.layout_b == Layout::ColMajor) as u8) << 3
                    | ((g.layout_out == Layout::ColMajor) as u8) << 4;
                self.byte(bits);
            }
            Params::Math(m) => {
                self.byte(m.op as u8);
                self.varint(m.inputs.len() as u64);
                for i in &m.inputs {
                    match *i {
                        MathInput::Tile {
                            addr,
                            rows,
                            cols,
                            dtype,
                        } => {
                            self.byte(0);
                            self.space_addr(st, RD, addr);
                            self.varint(rows as u64);
                            self.varint(cols as u64);
                            self.byte(dtype as u8);
                        }
                        MathInput::Scalar(v) => {
                            self.byte(1);
                            self.fixed(v.to_bits());
                        }
                    }
                }
                self.space_addr(st, WR, m.out);
                self.varint(m.rows as u64);
                self.varint(m.cols as u64);
                self.byte(m.dtype as u8);
                self.byte(m.axis.unwrap_or(0xff));
            }
            Params::Atomic(a) => {
                self.byte(a.op as u8);
                self.byte(a.dtype as u8);
                self.space_addr(st, WR, a.target);
                match a.values {
                    AtomicValues::Tile(v) => {
                        self.byte(0);
                        self.space_addr(st, RD, v);
                    }
                    AtomicValues::Scalar(v) => {
                        self.byte(1);
                        self.fixed(v.to_bits());
                    }
                }
                self.space_addr(st, WR, a.old);
                match a.mask {
                    Some(m) => {
                        self.byte(1);
                        self.space_addr(st, RD, m);
                    }
                    None => self.byte(0),
                }
                self.varint(a.rows as u64);
                self.varint(a.cols as u64);
                if a.rows > 1 {
                    self.varint(a.stride);
                }
                if a.op == AtomicOp::Cas {
                    self.signed(a.cmp);
                }
            }
        }
    }
}

/// Appends records to a buffer.
#[derive(Debug, Default)]
pub struct RecordEncoder {
    state: State,
    pub(crate) buf: Vec<u8>,
    pub(crate) count: u64,
    pub(crate) first: Option<(Ps, u64)>,
}

impl RecordEncoder {
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records encoded since the last reset.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The encoded records: a records chunk payload.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Forget the buffered chunk and start a new one.
    pub fn reset(&mut self) {
        self.state = State::default();
        self.buf.clear();
        self.count = 0;
        self.first = None;
    }

    /// Encode one record. The caller guarantees (t_start, op_id) order
    /// within the chunk (the writer does); a record out of order encodes,
    /// but the chunk will not decode.
    pub fn push(&mut self, r: &Record) {
        debug_assert!(r.t_start >= self.state.t_start || self.count == 0);
        if self.first.is_none() {
            self.first = Some((r.t_start, r.op_id));
        }
        let start = self.buf.len();
        self.buf.resize(start + size_bound(r), 0);
        let mut o = Out {
            b: &mut self.buf[start..],
            pos: 0,
        };
        let st = &mut self.state;
        let flags = ((r.fingerprint.is_some() as u8) * F_FINGERPRINT)
            | ((r.read.is_some() as u8) * F_READ)
            | ((r.write.is_some() as u8) * F_WRITE)
            | ((!r.deps.is_empty() as u8) * F_EDGES)
            | ((r.active.is_some() as u8) * F_ACTIVE)
            | (((r.kind == OpKind::Atomic) as u8) * F_ATOMIC);
        o.byte(flags);
        o.byte(r.kind.code());
        o.signed(r.op_id.wrapping_sub(st.op_id) as i64);
        st.op_id = r.op_id;
        o.varint(r.t_start.wrapping_sub(st.t_start));
        st.t_start = r.t_start;
        o.varint(r.t_end.saturating_sub(r.t_start));
        if let Some((a0, a1)) = r.active {
            // The writer refuses an interval outside the span; saturating
            // keeps a direct caller's bad interval from panicking.
            o.varint(a0.saturating_sub(r.t_start));
            o.varint(a1.saturating_sub(a0));
        }
        o.varint(r.component as u64);
        o.varint(r.op_name as u64);
        st.enter(r.component, r.op_name);
        if let Some(fp) = r.fingerprint {
            o.fixed(fp);
        }
        if !r.deps.is_empty() {
            o.varint(r.deps.len() as u64);
            for d in &r.deps {
                // The writer checks that a dependency precedes the op and
                // that the distance fits in 61 bits.
                o.varint(r.op_id.wrapping_sub(d.op) << 3 | d.kind as u64);
            }
        }
        if let Some(e) = &r.read {
            o.effect(st, RD, e, r.t_start);
        }
        if let Some(e) = &r.write {
            o.effect(st, WR, e, r.t_start);
        }
        // Params are length-prefixed so that readers can skip kinds they do
        // not know. Encode in place after one reserved length byte; a body
        // of 128 bytes or more moves up to make room for a longer length.
        let len_at = o.pos;
        o.pos += 1;
        o.params(st, &r.params);
        let body_len = o.pos - len_at - 1;
        if body_len < 0x80 {
            o.b[len_at] = body_len as u8;
        } else {
            let mut tmp = [0u8; V];
            let n = encode_varint(body_len as u64, &mut tmp);
            o.b.copy_within(len_at + 1..o.pos, len_at + n);
            o.b[len_at..len_at + n].copy_from_slice(&tmp[..n]);
            o.pos += n - 1;
        }
        let end = start + o.pos;
        self.buf.truncate(end);
        self.count += 1;
    }
}

fn encode_varint(mut v: u64, out: &mut [u8; V]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

/// Decodes the records of one chunk payload.
#[derive(Debug)]
pub struct RecordDecoder<'a> {
    cur: Cur<'a>,
    /// Stream offset of the payload's first byte, for error messages.
    base: u64,
    state: State,
    remaining: u64,
}

impl<'a> RecordDecoder<'a> {
    /// `count` is the record count from the chunk header.
    pub fn new(buf: &'a [u8], base: u64, count: u64) -> Self {
        RecordDecoder {
            cur: Cur::new(buf),
            base,
            state: State::default(),
            remaining: count,
        }
    }

    /// Stream offset of the next byte to decode.
    pub fn offset(&self) -> u64 {
        self.base + self.cur.p as u64
    }

    #[cold]
    #[inline(never)]
    fn err(&self, detail: String) -> FormatError {
        FormatError::malformed(self.offset(), "record", detail)
    }

    /// The cursor's first failure as an error.
    #[cold]
    #[inline(never)]
    fn cursor_error(&self, at: usize, what: &str) -> FormatError {
        FormatError::malformed(self.base + at as u64, "record", what)
    }

    #[inline(always)]
    fn addr(&mut self, side: usize) -> u64 {
        let d = self.cur.signed();
        let p = self.state.addr(side);
        let a = p.wrapping_add(d);
        *p = a;
        a
    }

    #[inline(always)]
    fn space_addr(&mut self, side: usize) -> Result<Addr> {
        let code = self.cur.byte();
        let Some(space) = Space::from_code(code) else {
            return Err(self.err(format!("unknown memory space code {code}")));
        };
        Ok(Addr {
            space,
            addr: self.addr(side),
        })
    }

    #[inline(always)]
    fn dtype(&mut self) -> Result<Dtype> {
        let code = self.cur.byte();
        match Dtype::from_code(code) {
            Some(d) => Ok(d),
            None => Err(self.err(format!("unknown dtype code {code}"))),
        }
    }

    #[inline(always)]
    fn effect(&mut self, side: usize, t_start: Ps, e: &mut Effect) {
        e.time = t_start.wrapping_add(self.cur.signed());
        self.state.seq = self.state.seq.wrapping_add(self.cur.signed());
        e.seq = self.state.seq;
        let n = self.cur.count(MAX_RANGES);
        // Overwrite the ranges the reused record already holds, then grow
        // or shrink: no per-range capacity checks in the common case.
        e.ranges.resize(n, Extent::contiguous(0, 0));
        // The predictor stays in a register through the loop.
        let mut pa = *self.state.addr(side + RANGES);
        for x in e.ranges.iter_mut() {
            pa = pa.wrapping_add(self.cur.signed());
            x.pa = pa;
            x.len = self.cur.varint();
            x.rows = self.cur.varint_u32();
            x.stride = if x.rows > 1 { self.cur.varint() } else { 0 };
        }
        *self.state.addr(side + RANGES) = pa;
    }

    #[inline(always)]
    fn opt_effect(&mut self, present: bool, side: usize, t_start: Ps, slot: &mut Option<Effect>) {
        if present {
            let e = slot.get_or_insert_with(Effect::default);
            self.effect(side, t_start, e)
        } else {
            *slot = None;
        }
    }

    /// Decode the next record into `r`, reusing its allocations.
    /// Returns false after the last record of the chunk.
    pub fn next_into(&mut self, r: &mut Record) -> Result<bool> {
        if self.remaining == 0 {
            if self.cur.left() != 0 {
                let n = self.cur.left();
                return Err(self.err(format!("{n} bytes after the last record")));
            }
            return Ok(false);
        }
        self.remaining -= 1;
        let start = self.cur.p;
        let flags = self.cur.byte();
        if flags & !F_KNOWN != 0 {
            self.cur.p = start;
            return Err(self.err(format!("unknown record flags {flags:#04x}")));
        }
        r.kind = OpKind::from_code(self.cur.byte());
        if (flags & F_ATOMIC != 0) != (r.kind == OpKind::Atomic) {
            self.cur.p = start;
            return Err(self.err(format!(
                "a {} record with flags {flags:#04x} (flag bit 6 goes with atomic ops, and only with them)",
                r.kind.name()
            )));
        }
        r.op_id = self.state.op_id.wrapping_add(self.cur.signed());
        self.state.op_id = r.op_id;
        let dt = self.cur.varint();
        let dur = self.cur.varint();
        let (Some(t_start), Some(t_end)) = (
            self.state.t_start.checked_add(dt),
            self.state.t_start.wrapping_add(dt).checked_add(dur),
        ) else {
            return Err(self.err("t_start or t_end overflows 64 bits".into()));
        };
        r.t_start = t_start;
        r.t_end = t_end;
        self.state.t_start = t_start;
        r.active = if flags & F_ACTIVE != 0 {
            let off = self.cur.varint();
            let len = self.cur.varint();
            if let Some((at, what)) = self.cur.bad {
                return Err(self.cursor_error(at, what));
            }
            match t_start
                .checked_add(off)
                .and_then(|a0| Some((a0, a0.checked_add(len)?)))
            {
                Some((a0, a1)) if a1 <= t_end => Some((a0, a1)),
                _ => {
                    return Err(self.err(format!(
                        "op {}: active interval (+{off} ps, {len} ps long) is not within its span [{t_start}, {t_end}] ps",
                        r.op_id
                    )));
                }
            }
        } else {
            None
        };
        r.component = self.cur.varint_u32();
        r.op_name = self.cur.varint_u32();
        self.state.enter(r.component, r.op_name);
        r.fingerprint = if flags & F_FINGERPRINT != 0 {
            Some(self.cur.fixed())
        } else {
            None
        };
        r.deps.clear();
        if flags & (F_DEPS | F_EDGES) != 0 {
            if flags & F_DEPS != 0 && flags & F_EDGES != 0 {
                self.cur.fail("both dependency flags set");
            }
            let n = self.cur.count(MAX_DEPS);
            if n == 0 {
                // The flag says there are some (a writer omits the field
                // otherwise); also the count after a failure.
                self.cur.fail("dependency flag set, but no dependencies");
            }
            for _ in 0..n {
                let d = if flags & F_EDGES != 0 {
                    let v = self.cur.varint();
                    let Some(kind) = DepKind::from_code((v & 7) as u8) else {
                        self.cur.fail("unknown dependency kind");
                        break;
                    };
                    Dep {
                        op: r.op_id.wrapping_sub(v >> 3),
                        kind,
                    }
                } else {
                    Dep::data(r.op_id.wrapping_sub(self.cur.signed()))
                };
                r.deps.push(d);
            }
        }
        self.opt_effect(flags & F_READ != 0, RD, t_start, &mut r.read);
        self.opt_effect(flags & F_WRITE != 0, WR, t_start, &mut r.write);
        let plen = self.cur.varint();
        if let Some((at, what)) = self.cur.bad {
            return Err(self.cursor_error(at, what));
        }
        if plen > self.cur.left() as u64 {
            return Err(FormatError::BadLength {
                offset: self.offset(),
                what: "record params".into(),
                len: plen,
                limit: self.cur.left() as u64,
            });
        }
        let end = self.cur.p + plen as usize;
        self.params(r, end)?;
        if let Some((at, what)) = self.cur.bad {
            return Err(self.cursor_error(at, what));
        }
        if self.cur.p != end {
            let used = self.cur.p as i64 - (end as i64 - plen as i64);
            return Err(self.err(format!(
                "params of op {} ({}) take {used} bytes, but {plen} were declared",
                r.op_id,
                r.kind.name(),
            )));
        }
        Ok(true)
    }

    /// Decode params ending at `end` into `r.params`, reusing the math
    /// inputs and raw bytes allocations when the variant repeats.
    #[inline]
    fn params(&mut self, r: &mut Record, end: usize) -> Result<()> {
        if self.cur.p == end {
            r.params = Params::None;
            return Ok(());
        }
        match r.kind {
            OpKind::Sync => {
                return Err(self.err(format!(
                    "sync op {} has params (sync ops have none)",
                    r.op_id
                )));
            }
            OpKind::Unknown(_) => {
                let bytes = &self.cur.b[self.cur.p..end];
                if let Params::Raw(v) = &mut r.params {
                    v.clear();
                    v.extend_from_slice(bytes);
                } else {
                    r.params = Params::Raw(bytes.to_vec());
                }
                self.cur.p = end;
            }
            OpKind::Memory => {
                let src = self.space_addr(RD)?;
                let dst = self.space_addr(WR)?;
                let rows = self.cur.varint_u32();
                let row_bytes = self.cur.varint();
                let (src_stride, dst_stride) = if rows > 1 {
                    (self.cur.varint(), self.cur.varint())
                } else {
                    (row_bytes, row_bytes)
                };
                let code = self.cur.byte();
                let dtype = if code == 0xff {
                    None
                } else {
                    Some(
                        Dtype::from_code(code)
                            .ok_or_else(|| self.err(format!("unknown dtype code {code}")))?,
                    )
                };
                r.params = Params::Memory(MemoryParams {
                    src,
                    dst,
                    rows,
                    row_bytes,
                    src_stride,
                    dst_stride,
                    dtype,
                });
            }
            OpKind::Gemm => {
                let a = self.space_addr(RD)?;
                let b = self.space_addr(RD)?;
                let out = self.space_addr(WR)?;
                let acc = match self.cur.byte() {
                    0 => None,
                    1 => Some(self.space_addr(RD)?),
                    v => return Err(self.err(format!("bad accumulator flag {v}"))),
                };
                let m = self.cur.varint_u32();
                let k = self.cur.varint_u32();
                let n = self.cur.varint_u32();
                let dtype_in = self.dtype()?;
                let dtype_acc = self.dtype()?;
                let dtype_out = self.dtype()?;
                let bits = self.cur.byte();
                if bits & !0x1f != 0 {
                    return Err(self.err(format!("unknown gemm flag bits {bits:#04x}")));
                }
                let layout = |bit: u8| {
                    if bits & bit != 0 {
                        Layout::ColMajor
                    } else {
                        Layout::RowMajor
                    }
                };
                r.params = Params::Gemm(GemmParams {
                    a,
                    b,
                    out,
                    acc,
                    m,
                    k,
                    n,
                    dtype_in,
                    dtype_acc,
                    dtype_out,
                    transpose_a: bits & 1 != 0,
                    transpose_b: bits & 2 != 0,
                    layout_a: layout(4),
                    layout_b: layout(8),
                    layout_out: layout(16),
                });
            }
            OpKind::Math => {
                let code = self.cur.byte();
                let Some(op) = MathOp::from_code(code) else {
                    return Err(self.err(format!("unknown math op code {code}")));
                };
                let n = self.cur.count(MAX_MATH_INPUTS);
                let mut inputs = match std::mem::take(&mut r.params) {
                    Params::Math(m) => m.inputs,
                    _ => Vec::new(),
                };
                inputs.clear();
                inputs.reserve(n);
                for _ in 0..n {
                    inputs.push(match self.cur.byte() {
                        0 => {
                            let addr = self.space_addr(RD)?;
                            let rows = self.cur.varint_u32();
                            let cols = self.cur.varint_u32();
                            let dtype = self.dtype()?;
                            MathInput::Tile {
                                addr,
                                rows,
                                cols,
                                dtype,
                            }
                        }
                        1 => MathInput::Scalar(f64::from_bits(self.cur.fixed())),
                        v => return Err(self.err(format!("bad math input tag {v}"))),
                    });
                }
                let out = self.space_addr(WR)?;
                let rows = self.cur.varint_u32();
                let cols = self.cur.varint_u32();
                let dtype = self.dtype()?;
                let axis = match self.cur.byte() {
                    0xff => None,
                    a => Some(a),
                };
                r.params = Params::Math(MathParams {
                    op,
                    inputs,
                    out,
                    rows,
                    cols,
                    dtype,
                    axis,
                });
            }
            OpKind::Atomic => {
                let code = self.cur.byte();
                let Some(op) = AtomicOp::from_code(code) else {
                    return Err(self.err(format!("unknown atomic op code {code}")));
                };
                let dtype = self.dtype()?;
                let target = self.space_addr(WR)?;
                let values = match self.cur.byte() {
                    0 => AtomicValues::Tile(self.space_addr(RD)?),
                    1 => AtomicValues::Scalar(f64::from_bits(self.cur.fixed())),
                    v => return Err(self.err(format!("bad atomic values tag {v}"))),
                };
                let old = self.space_addr(WR)?;
                let mask = match self.cur.byte() {
                    0 => None,
                    1 => Some(self.space_addr(RD)?),
                    v => return Err(self.err(format!("bad atomic mask flag {v}"))),
                };
                let rows = self.cur.varint_u32();
                let cols = self.cur.varint_u32();
                let stride = if rows > 1 {
                    self.cur.varint()
                } else {
                    (cols as u64).saturating_mul(dtype.size() as u64)
                };
                let cmp = if op == AtomicOp::Cas {
                    self.cur.signed() as i64
                } else {
                    0
                };
                if let Some((at, what)) = self.cur.bad {
                    return Err(self.cursor_error(at, what));
                }
                let a = AtomicParams {
                    op,
                    dtype,
                    target,
                    values,
                    old,
                    mask,
                    rows,
                    cols,
                    stride,
                    cmp,
                };
                if let Err(e) = a.check() {
                    return Err(self.err(format!("op {}: {e}", r.op_id)));
                }
                r.params = Params::Atomic(a);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::unzigzag;

    fn varint(d: &mut RecordDecoder<'_>) -> Result<u64> {
        let v = d.cur.varint();
        match d.cur.bad {
            Some((at, what)) => Err(d.cursor_error(at, what)),
            None => Ok(v),
        }
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn varints_decode_the_same_on_both_paths() {
        let mut values = vec![0u64, 1, 127, 128, 255, 16383, 16384, u64::MAX, u64::MAX - 1];
        for shift in 0..64 {
            values.push(1 << shift);
            values.push((1 << shift) - 1);
        }
        for v in values {
            let mut tmp = [0u8; 10];
            let n = encode_varint(v, &mut tmp);
            // At the end of the buffer (byte by byte) and with slack after
            // it (the unchecked path).
            for slack in [0usize, 1, 10] {
                let mut buf = tmp[..n].to_vec();
                buf.resize(n + slack, 0x80);
                let mut d = RecordDecoder::new(&buf, 0, 1);
                assert_eq!(varint(&mut d).unwrap(), v, "{v} with {slack} bytes after");
                assert_eq!(d.cur.p, n);
            }
        }
        // A 10-byte varint whose last byte carries more than bit 63.
        for slack in [0usize, 5] {
            let mut buf = vec![0x80u8; 9];
            buf.push(0x02);
            buf.resize(10 + slack, 0);
            let mut d = RecordDecoder::new(&buf, 0, 1);
            assert!(
                varint(&mut d)
                    .unwrap_err()
                    .to_string()
                    .contains("overflows")
            );
        }
        // Truncated varints.
        for len in 1..10 {
            let buf = vec![0x80u8; len];
            let mut d = RecordDecoder::new(&buf, 0, 1);
            assert!(
                varint(&mut d)
                    .unwrap_err()
                    .to_string()
                    .contains("past the end")
            );
        }
    }

    #[test]
    fn encoder_varints_match_the_plain_encoding() {
        let mut values = vec![0u64, 127, 128, u64::MAX, (1 << 56) - 1, 1 << 56];
        for shift in 0..64 {
            values.push(1 << shift);
            values.push((1 << shift) - 1);
            values.push((1u64 << shift).wrapping_mul(0x9e37_79b9));
        }
        for v in values {
            let mut want = [0u8; V];
            let n = encode_varint(v, &mut want);
            let mut buf = [0xaau8; V + 8];
            let mut o = Out {
                b: &mut buf,
                pos: 0,
            };
            o.varint(v);
            assert_eq!(o.pos, n, "{v:#x}");
            assert_eq!(&buf[..n], &want[..n], "{v:#x}");
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let buf = [0xffu8; 11];
        let mut d = RecordDecoder::new(&buf, 100, 1);
        let err = varint(&mut d).unwrap_err();
        assert!(
            err.to_string().contains("offset 110") && err.to_string().contains("overflows"),
            "{err}"
        );
    }

    /// A record with one read range and nothing else.
    fn read_at(op_id: u64, component: u32, pa: u64) -> Record {
        Record {
            op_id,
            component,
            read: Some(Effect {
                time: 0,
                seq: 0,
                ranges: vec![Extent::contiguous(pa, 64)],
            }),
            ..Record::default()
        }
    }

    /// Encodes `records` and returns each record's bytes.
    fn encode_each(records: &[Record]) -> Vec<Vec<u8>> {
        let mut enc = RecordEncoder::default();
        let mut out = Vec::new();
        for r in records {
            let before = enc.len();
            enc.push(r);
            out.push(enc.as_bytes()[before..].to_vec());
        }
        out
    }

    fn decode_all(bytes: &[u8], n: usize) -> Vec<Record> {
        let mut d = RecordDecoder::new(bytes, 0, n as u64);
        let mut out = Vec::new();
        let mut r = Record::default();
        while d.next_into(&mut r).unwrap() {
            out.push(r.clone());
        }
        out
    }

    #[test]
    fn a_context_codes_against_its_own_last_address() {
        // Context (0, 0) lives in slot 0; (1, 0) in slot 0x7f (the top
        // byte of 2^32 * 0x9E3779B97F4A7C15), so they do not collide.
        let records = [
            read_at(0, 0, 0x1000),
            read_at(1, 1, 0x9000_0000),
            read_at(2, 0, 0x1040),
        ];
        let bytes = encode_each(&records);
        // flags (read), kind, op_id +0, dt, duration, component, op_name,
        // time, seq, 1 range, pa, len 64, rows 1, no params.
        let head = [0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        // pa 0x1000 against zero: zigzag 0x2000.
        assert_eq!(
            bytes[0],
            [&head[..], &[0x80, 0x40, 0x40, 0x01, 0x00]].concat()
        );
        // A new context starts from the previous record's predictors:
        // 0x9000_0000 - 0x1000, zigzag 0x1_1fff_e000.
        let mut second = head;
        second[2] = 0x02; // op_id +1
        second[5] = 0x01; // component 1
        let pa = [0x80, 0xc0, 0xff, 0xff, 0x11];
        assert_eq!(bytes[1], [&second[..], &pa, &[0x40, 0x01, 0x00]].concat());
        // Back in context (0, 0): 0x1040 against its own 0x1000, not
        // against the other context's 0x9000_0000.
        let mut third = head;
        third[2] = 0x02;
        assert_eq!(
            bytes[2],
            [&third[..], &[0x80, 0x01, 0x40, 0x01, 0x00]].concat()
        );
        assert_eq!(decode_all(&bytes.concat(), 3), records);
    }

    #[test]
    fn contexts_that_share_a_slot_evict_each_other() {
        // (360, 0) shares slot 0 with (0, 0): its record takes the slot
        // over, so (0, 0) then starts again from (360, 0)'s predictors.
        let records = [
            read_at(0, 0, 0x1000),
            read_at(1, 360, 0x5000),
            read_at(2, 0, 0x1040),
        ];
        let bytes = encode_each(&records);
        // 0x1040 against 0x5000: zigzag(-0x3fc0) = 0x7f7f.
        assert_eq!(&bytes[2][10..13], &[0xff, 0xfe, 0x01]);
        assert_eq!(decode_all(&bytes.concat(), 3), records);
    }

    #[test]
    fn an_active_interval_is_two_varints_after_the_duration() {
        let r = Record {
            op_id: 0,
            t_start: 1000,
            t_end: 1500,
            active: Some((1100, 1400)),
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        // flags (active), kind, op_id, t_start 1000, duration 500,
        // active: +100, 300 long; component, op_name, params length.
        assert_eq!(
            bytes,
            [
                0x10, 0x00, 0x00, 0xe8, 0x07, 0xf4, 0x03, 0x64, 0xac, 0x02, 0x00, 0x00, 0x00
            ]
        );
        assert_eq!(decode_all(&bytes, 1), [r]);
    }

    fn decode_err(bytes: &[u8]) -> String {
        let mut d = RecordDecoder::new(bytes, 0, 1);
        d.next_into(&mut Record::default()).unwrap_err().to_string()
    }

    #[test]
    fn an_active_interval_outside_the_span_is_refused() {
        // Span [5, 15]: the interval +4 (at 9), 7 long, ends at 16.
        let past_end = [0x10, 0x00, 0x00, 0x05, 0x0a, 0x04, 0x07, 0x00, 0x00, 0x00];
        let e = decode_err(&past_end);
        assert!(
            e.contains(
                "op 0: active interval (+4 ps, 7 ps long) is not within its span [5, 15] ps"
            ),
            "{e}"
        );
        // +4 and 6 long ends at 15 exactly: accepted.
        let mut at_end = past_end;
        at_end[6] = 0x06;
        assert_eq!(decode_all(&at_end, 1)[0].active, Some((9, 15)));
        // A start past 2^64: t_start 5 plus a 10-byte varint of u64::MAX.
        let mut overflow = vec![0x10, 0x00, 0x00, 0x05, 0x0a];
        overflow.extend([0xff; 9]);
        overflow.extend([0x01, 0x00, 0x00, 0x00, 0x00]);
        let e = decode_err(&overflow);
        assert!(e.contains("is not within its span"), "{e}");
        // Truncated inside the interval.
        let e = decode_err(&past_end[..6]);
        assert!(e.contains("past the end"), "{e}");
    }

    #[test]
    fn edges_carry_their_kind_in_the_low_three_bits() {
        let r = Record {
            op_id: 9,
            deps: vec![
                Dep {
                    op: 7,
                    kind: DepKind::Resource,
                },
                Dep::data(1),
            ],
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        // flags (edges), kind, op_id zigzag(9), t_start, duration,
        // component, op_name; 2 edges: 2 << 3 | 4, 8 << 3 | 0; params.
        assert_eq!(
            bytes,
            [
                0x20, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x02, 0x14, 0x40, 0x00
            ]
        );
        assert_eq!(decode_all(&bytes, 1), [r]);
    }

    #[test]
    fn dependencies_before_3_4_read_as_data_edges() {
        // Flag bit 3: a count, then signed deltas (zigzag(9 - 7) = 4).
        let old = [0x08, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00];
        assert_eq!(decode_all(&old, 1)[0].deps, [Dep::data(7)]);
        // Both forms at once, and edge kinds 5 to 7, are refused.
        let mut both = old;
        both[0] = 0x28;
        assert!(decode_err(&both).contains("both dependency flags"));
        let unknown = [0x20, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x15, 0x00];
        assert!(decode_err(&unknown).contains("unknown dependency kind"));
    }

    #[test]
    fn the_newest_math_ops_round_trip_and_the_next_code_is_refused() {
        let rec = |op| Record {
            kind: OpKind::Math,
            params: Params::Math(MathParams {
                op,
                inputs: vec![MathInput::Scalar(1.0)],
                out: Addr::default(),
                rows: 1,
                cols: 1,
                dtype: Dtype::F32,
                axis: None,
            }),
            ..Record::default()
        };
        let (a, b) = (rec(MathOp::Rand), rec(MathOp::Clamp));
        let (ea, eb) = (
            encode_each(std::slice::from_ref(&a)).concat(),
            encode_each(std::slice::from_ref(&b)).concat(),
        );
        assert_eq!(decode_all(&ea, 1), [a]);
        // The one byte that differs is the op code (51, 50): 52 is unknown.
        let diff: Vec<usize> = (0..ea.len()).filter(|&i| ea[i] != eb[i]).collect();
        assert_eq!(diff.len(), 1);
        assert_eq!((ea[diff[0]], eb[diff[0]]), (51, 50));
        let mut next = ea.clone();
        next[diff[0]] = 52;
        assert!(decode_err(&next).contains("unknown math op code 52"));
    }

    #[test]
    fn a_sync_op_has_no_params() {
        let r = Record {
            kind: OpKind::Sync,
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        assert_eq!(decode_all(&bytes, 1), [r]);
        // The same record with one params byte.
        let mut with = bytes.clone();
        *with.last_mut().unwrap() = 1;
        with.push(0);
        assert!(
            decode_err(&with).contains("sync op 0 has params"),
            "{}",
            decode_err(&with)
        );
    }

    #[test]
    fn many_contexts_round_trip() {
        // More contexts than slots, interleaved, with both effects and
        // params: the encoder and decoder evict alike.
        let records: Vec<Record> = (0..4000u64)
            .map(|i| {
                let h = i.wrapping_mul(0x2545_F491_4F6C_DD1D);
                let pa = 0x1_0000_0000 + (h >> 40) * 64;
                let mut r = read_at(i, (h >> 20) as u32 % 700, pa);
                r.op_name = (h >> 10) as u32 % 3;
                r.write = Some(Effect {
                    time: 5,
                    seq: 1,
                    ranges: vec![Extent::contiguous(pa ^ 0x4000_0000, 64)],
                });
                r.params = Params::Memory(MemoryParams {
                    src: Addr {
                        space: Space::Hbm,
                        addr: pa + 7,
                    },
                    dst: Addr {
                        space: Space::Tcm,
                        addr: h >> 50,
                    },
                    rows: 1,
                    row_bytes: 64,
                    src_stride: 64,
                    dst_stride: 64,
                    dtype: None,
                });
                r
            })
            .collect();
        let bytes = encode_each(&records).concat();
        assert_eq!(decode_all(&bytes, records.len()), records);
    }
}
