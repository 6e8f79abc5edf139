//! Encoding of op records inside a records chunk: LEB128 varints, with
//! op ids, start times, effect sequence numbers and addresses delta-coded
//! against the previous value in the same chunk. Each chunk starts from a
//! zero state, so any records chunk decodes on its own (random access).

use crate::error::{FormatError, Result};
use crate::types::*;

const F_FINGERPRINT: u8 = 1 << 0;
const F_READ: u8 = 1 << 1;
const F_WRITE: u8 = 1 << 2;
const F_DEPS: u8 = 1 << 3;
const F_KNOWN: u8 = F_FINGERPRINT | F_READ | F_WRITE | F_DEPS;

/// Delta-coding state shared by the encoder and decoder.
#[derive(Debug, Default, Clone, Copy)]
struct State {
    op_id: u64,
    t_start: u64,
    seq: u64,
    addr: u64,
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
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

    /// Forget the buffered chunk and start a new one.
    pub fn reset(&mut self) {
        self.state = State::default();
        self.buf.clear();
        self.count = 0;
        self.first = None;
    }

    #[inline]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    #[inline]
    fn signed(&mut self, d: i64) {
        self.varint(zigzag(d));
    }

    #[inline]
    fn addr(&mut self, a: u64) {
        let d = a.wrapping_sub(self.state.addr) as i64;
        self.signed(d);
        self.state.addr = a;
    }

    fn space_addr(&mut self, a: Addr) {
        self.buf.push(a.space as u8);
        self.addr(a.addr);
    }

    fn effect(&mut self, e: &Effect, t_start: Ps) {
        self.signed(e.time.wrapping_sub(t_start) as i64);
        self.signed(e.seq.wrapping_sub(self.state.seq) as i64);
        self.state.seq = e.seq;
        self.varint(e.ranges.len() as u64);
        for x in &e.ranges {
            self.addr(x.pa);
            self.varint(x.len);
            self.varint(x.rows as u64);
            if x.rows > 1 {
                self.varint(x.stride);
            }
        }
    }

    /// Encode one record. The caller guarantees (t_start, op_id) order
    /// within the chunk; t_start never decreases.
    pub fn push(&mut self, r: &Record) {
        debug_assert!(r.t_start >= self.state.t_start || self.count == 0);
        if self.first.is_none() {
            self.first = Some((r.t_start, r.op_id));
        }
        let mut flags = 0u8;
        if r.fingerprint.is_some() {
            flags |= F_FINGERPRINT;
        }
        if r.read.is_some() {
            flags |= F_READ;
        }
        if r.write.is_some() {
            flags |= F_WRITE;
        }
        if !r.deps.is_empty() {
            flags |= F_DEPS;
        }
        self.buf.push(flags);
        self.buf.push(r.kind.code());
        self.signed(r.op_id.wrapping_sub(self.state.op_id) as i64);
        self.state.op_id = r.op_id;
        self.varint(r.t_start - self.state.t_start);
        self.state.t_start = r.t_start;
        self.varint(r.t_end.saturating_sub(r.t_start));
        self.varint(r.component as u64);
        self.varint(r.op_name as u64);
        if let Some(fp) = r.fingerprint {
            self.buf.extend_from_slice(&fp.to_le_bytes());
        }
        if !r.deps.is_empty() {
            self.varint(r.deps.len() as u64);
            for &d in &r.deps {
                self.signed(r.op_id.wrapping_sub(d) as i64);
            }
        }
        if let Some(e) = &r.read {
            self.effect(e, r.t_start);
        }
        if let Some(e) = &r.write {
            self.effect(e, r.t_start);
        }
        // Params are length-prefixed so that readers can skip kinds they do
        // not know. Encode in place, then move the body behind its length.
        // One length byte is reserved; longer lengths shift the body.
        let len_at = self.buf.len();
        self.buf.push(0);
        self.params(&r.params);
        let body_len = (self.buf.len() - len_at - 1) as u64;
        if body_len < 0x80 {
            self.buf[len_at] = body_len as u8;
        } else {
            let mut tmp = [0u8; 10];
            let n = encode_varint(body_len, &mut tmp);
            self.buf
                .splice(len_at..len_at + 1, tmp[..n].iter().copied());
        }
        self.count += 1;
    }

    fn params(&mut self, p: &Params) {
        match p {
            Params::None => {}
            Params::Raw(bytes) => self.buf.extend_from_slice(bytes),
            Params::Memory(m) => {
                self.space_addr(m.src);
                self.space_addr(m.dst);
                self.varint(m.rows as u64);
                self.varint(m.row_bytes);
                if m.rows > 1 {
                    self.varint(m.src_stride);
                    self.varint(m.dst_stride);
                }
                self.buf.push(m.dtype.map_or(0xff, |d| d as u8));
            }
            Params::Gemm(g) => {
                self.space_addr(g.a);
                self.space_addr(g.b);
                self.space_addr(g.out);
                match g.acc {
                    Some(a) => {
                        self.buf.push(1);
                        self.space_addr(a);
                    }
                    None => self.buf.push(0),
                }
                self.varint(g.m as u64);
                self.varint(g.k as u64);
                self.varint(g.n as u64);
                self.buf.push(g.dtype_in as u8);
                self.buf.push(g.dtype_acc as u8);
                self.buf.push(g.dtype_out as u8);
                let bits = (g.transpose_a as u8)
                    | (g.transpose_b as u8) << 1
                    | ((g.layout_a == Layout::ColMajor) as u8) << 2
                    | ((g.layout_b == Layout::ColMajor) as u8) << 3
                    | ((g.layout_out == Layout::ColMajor) as u8) << 4;
                self.buf.push(bits);
            }
            Params::Math(m) => {
                self.buf.push(m.op as u8);
                self.varint(m.inputs.len() as u64);
                for i in &m.inputs {
                    match *i {
                        MathInput::Tile {
                            addr,
                            rows,
                            cols,
                            dtype,
                        } => {
                            self.buf.push(0);
                            self.space_addr(addr);
                            self.varint(rows as u64);
                            self.varint(cols as u64);
                            self.buf.push(dtype as u8);
                        }
                        MathInput::Scalar(v) => {
                            self.buf.push(1);
                            self.buf.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                self.space_addr(m.out);
                self.varint(m.rows as u64);
                self.varint(m.cols as u64);
                self.buf.push(m.dtype as u8);
                self.buf.push(m.axis.unwrap_or(0xff));
            }
        }
    }
}

fn encode_varint(mut v: u64, out: &mut [u8; 10]) -> usize {
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
    buf: &'a [u8],
    pos: usize,
    /// Stream offset of `buf[0]`, for error messages.
    base: u64,
    state: State,
    remaining: u64,
}

impl<'a> RecordDecoder<'a> {
    /// `count` is the record count from the chunk header.
    pub fn new(buf: &'a [u8], base: u64, count: u64) -> Self {
        RecordDecoder {
            buf,
            pos: 0,
            base,
            state: State::default(),
            remaining: count,
        }
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn err(&self, detail: impl Into<String>) -> FormatError {
        FormatError::malformed(self.offset(), "record", detail)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.err("record runs past the end of its chunk")),
        }
    }

    #[inline]
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(self.err("varint longer than 10 bytes"));
            }
        }
    }

    fn varint_u32(&mut self, what: &str) -> Result<u32> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.err(format!("{what} {v} does not fit in 32 bits")))
    }

    #[inline]
    fn signed(&mut self) -> Result<i64> {
        Ok(unzigzag(self.varint()?))
    }

    fn u64_fixed(&mut self) -> Result<u64> {
        let end = self.pos + 8;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| self.err("record runs past the end of its chunk"))?;
        self.pos = end;
        Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }

    fn addr(&mut self) -> Result<u64> {
        let d = self.signed()?;
        self.state.addr = self.state.addr.wrapping_add(d as u64);
        Ok(self.state.addr)
    }

    fn space_addr(&mut self) -> Result<Addr> {
        let code = self.byte()?;
        let space = Space::from_code(code)
            .ok_or_else(|| self.err(format!("unknown memory space code {code}")))?;
        Ok(Addr {
            space,
            addr: self.addr()?,
        })
    }

    fn dtype(&mut self) -> Result<Dtype> {
        let code = self.byte()?;
        Dtype::from_code(code).ok_or_else(|| self.err(format!("unknown dtype code {code}")))
    }

    /// A count of items that each take at least one byte: bounded by the
    /// bytes left, so a corrupt count never drives a large allocation.
    fn count(&mut self, what: &str, limit: usize) -> Result<usize> {
        let n = self.varint()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n > left || n > limit as u64 {
            return Err(FormatError::BadLength {
                offset: self.offset(),
                what: what.to_string(),
                len: n,
                limit: left.min(limit as u64),
            });
        }
        Ok(n as usize)
    }

    fn effect(&mut self, t_start: Ps, e: &mut Effect) -> Result<()> {
        e.time = t_start.wrapping_add(self.signed()? as u64);
        self.state.seq = self.state.seq.wrapping_add(self.signed()? as u64);
        e.seq = self.state.seq;
        let n = self.count("effect range count", 1 << 20)?;
        e.ranges.clear();
        for _ in 0..n {
            let pa = self.addr()?;
            let len = self.varint()?;
            let rows = self.varint_u32("range rows")?;
            let stride = if rows > 1 { self.varint()? } else { 0 };
            e.ranges.push(Extent {
                pa,
                len,
                rows,
                stride,
            });
        }
        Ok(())
    }

    /// Decode the next record into `r`, reusing its allocations.
    /// Returns false after the last record of the chunk.
    pub fn next_into(&mut self, r: &mut Record) -> Result<bool> {
        if self.remaining == 0 {
            if self.pos != self.buf.len() {
                return Err(self.err(format!(
                    "{} bytes after the last record",
                    self.buf.len() - self.pos
                )));
            }
            return Ok(false);
        }
        self.remaining -= 1;
        let flags = self.byte()?;
        if flags & !F_KNOWN != 0 {
            return Err(self.err(format!("unknown record flags {flags:#04x}")));
        }
        r.kind = OpKind::from_code(self.byte()?);
        r.op_id = self.state.op_id.wrapping_add(self.signed()? as u64);
        self.state.op_id = r.op_id;
        let dt = self.varint()?;
        r.t_start = self
            .state
            .t_start
            .checked_add(dt)
            .ok_or_else(|| self.err("t_start overflows 64 bits"))?;
        self.state.t_start = r.t_start;
        let dur = self.varint()?;
        r.t_end = r
            .t_start
            .checked_add(dur)
            .ok_or_else(|| self.err("t_end overflows 64 bits"))?;
        r.component = self.varint_u32("component id")?;
        r.op_name = self.varint_u32("op name id")?;
        r.fingerprint = if flags & F_FINGERPRINT != 0 {
            Some(self.u64_fixed()?)
        } else {
            None
        };
        r.deps.clear();
        if flags & F_DEPS != 0 {
            let n = self.count("dependency count", 1 << 20)?;
            for _ in 0..n {
                let d = r.op_id.wrapping_sub(self.signed()? as u64);
                r.deps.push(d);
            }
        }
        decode_opt_effect(self, flags & F_READ != 0, r.t_start, &mut r.read)?;
        decode_opt_effect(self, flags & F_WRITE != 0, r.t_start, &mut r.write)?;
        let plen = self.varint()?;
        let left = (self.buf.len() - self.pos) as u64;
        if plen > left {
            return Err(FormatError::BadLength {
                offset: self.offset(),
                what: "record params".into(),
                len: plen,
                limit: left,
            });
        }
        let end = self.pos + plen as usize;
        r.params = self.params(r.kind, end)?;
        if self.pos != end {
            return Err(self.err(format!(
                "params of op {} ({}) take {} bytes, but {} were declared",
                r.op_id,
                r.kind.name(),
                self.pos as i64 - (end as i64 - plen as i64),
                plen
            )));
        }
        Ok(true)
    }

    fn params(&mut self, kind: OpKind, end: usize) -> Result<Params> {
        if self.pos == end {
            return Ok(Params::None);
        }
        Ok(match kind {
            OpKind::Unknown(_) => {
                let raw = self.buf[self.pos..end].to_vec();
                self.pos = end;
                Params::Raw(raw)
            }
            OpKind::Memory => {
                let src = self.space_addr()?;
                let dst = self.space_addr()?;
                let rows = self.varint_u32("rows")?;
                let row_bytes = self.varint()?;
                let (src_stride, dst_stride) = if rows > 1 {
                    (self.varint()?, self.varint()?)
                } else {
                    (row_bytes, row_bytes)
                };
                let code = self.byte()?;
                let dtype = if code == 0xff {
                    None
                } else {
                    Some(
                        Dtype::from_code(code)
                            .ok_or_else(|| self.err(format!("unknown dtype code {code}")))?,
                    )
                };
                Params::Memory(MemoryParams {
                    src,
                    dst,
                    rows,
                    row_bytes,
                    src_stride,
                    dst_stride,
                    dtype,
                })
            }
            OpKind::Gemm => {
                let a = self.space_addr()?;
                let b = self.space_addr()?;
                let out = self.space_addr()?;
                let acc = match self.byte()? {
                    0 => None,
                    1 => Some(self.space_addr()?),
                    v => return Err(self.err(format!("bad accumulator flag {v}"))),
                };
                let m = self.varint_u32("m")?;
                let k = self.varint_u32("k")?;
                let n = self.varint_u32("n")?;
                let dtype_in = self.dtype()?;
                let dtype_acc = self.dtype()?;
                let dtype_out = self.dtype()?;
                let bits = self.byte()?;
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
                Params::Gemm(GemmParams {
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
                })
            }
            OpKind::Math => {
                let code = self.byte()?;
                let op = MathOp::from_code(code)
                    .ok_or_else(|| self.err(format!("unknown math op code {code}")))?;
                let n = self.count("math input count", 64)?;
                let mut inputs = Vec::with_capacity(n);
                for _ in 0..n {
                    inputs.push(match self.byte()? {
                        0 => {
                            let addr = self.space_addr()?;
                            let rows = self.varint_u32("rows")?;
                            let cols = self.varint_u32("cols")?;
                            let dtype = self.dtype()?;
                            MathInput::Tile {
                                addr,
                                rows,
                                cols,
                                dtype,
                            }
                        }
                        1 => MathInput::Scalar(f64::from_bits(self.u64_fixed()?)),
                        v => return Err(self.err(format!("bad math input tag {v}"))),
                    });
                }
                let out = self.space_addr()?;
                let rows = self.varint_u32("rows")?;
                let cols = self.varint_u32("cols")?;
                let dtype = self.dtype()?;
                let axis = match self.byte()? {
                    0xff => None,
                    a => Some(a),
                };
                Params::Math(MathParams {
                    op,
                    inputs,
                    out,
                    rows,
                    cols,
                    dtype,
                    axis,
                })
            }
        })
    }
}

fn decode_opt_effect(
    d: &mut RecordDecoder<'_>,
    present: bool,
    t_start: Ps,
    slot: &mut Option<Effect>,
) -> Result<()> {
    if present {
        let e = slot.get_or_insert_with(Effect::default);
        d.effect(t_start, e)
    } else {
        *slot = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let buf = [0xffu8; 11];
        let mut d = RecordDecoder::new(&buf, 100, 1);
        let err = d.varint().unwrap_err();
        assert!(
            err.to_string().contains("offset 110") && err.to_string().contains("overflows"),
            "{err}"
        );
    }
}
