//! Reading records: [`RecordDecoder`] range-checks every field it reads
//! and names the stream offset of anything malformed.

use super::*;

/// Decodes the records of one chunk payload.
#[derive(Debug)]
pub struct RecordDecoder<'a> {
    pub(super) cur: Cur<'a>,
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
    pub(super) fn cursor_error(&self, at: usize, what: &str) -> FormatError {
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
