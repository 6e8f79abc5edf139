//! Writing records: [`RecordEncoder`] appends each record through a
//! cursor into space reserved from the record's size bound.

use super::*;

/// A cursor writing into a slice known to be large enough.
pub(super) struct Out<'a> {
    pub(super) b: &'a mut [u8],
    pub(super) pos: usize,
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
    pub(super) fn varint(&mut self, v: u64) {
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

pub(super) fn encode_varint(mut v: u64, out: &mut [u8; V]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}
