//! Atomic read-modify-write ops (op kind 4, `OpKind::Atomic`): Triton's
//! `tl.atomic_add/max/min/xchg/cas/and/or/xor` on a block of a tensor in
//! device memory, performed at the memory's side.
//!
//! The record's effects: `read` lists the values tile (TCM; none for a
//! scalar value), the mask
//! tile if any (TCM, one byte per element), then the target block (its
//! old bytes); `write` lists the target block (its new bytes), then the
//! tile that receives the old values (TCM). Both share one `seq`: replay
//! reads, then writes, as one step, in the order Phase 1 applied them.
//! [`AtomicParams::apply`] is the arithmetic both passes use.

use crate::types::{Addr, Dtype, Space};

/// The operator of an atomic op. Codes are the params' first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// `old + v` (f32: rounded to f32 per update; i32: wrapping).
    Add = 0,
    /// The larger of `old` and `v` (`v` when `v > old`: a NaN never
    /// replaces, a NaN old value stays).
    Max = 1,
    /// The smaller (`v` when `v < old`).
    Min = 2,
    /// `v` (the old value comes back).
    Xchg = 3,
    /// `v` where `old == cmp` (integers).
    Cas = 4,
    /// Bitwise `old & v` (integers).
    And = 5,
    /// Bitwise `old | v`.
    Or = 6,
    /// Bitwise `old ^ v`.
    Xor = 7,
}

impl AtomicOp {
    pub const ALL: [AtomicOp; 8] = [
        AtomicOp::Add,
        AtomicOp::Max,
        AtomicOp::Min,
        AtomicOp::Xchg,
        AtomicOp::Cas,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
    ];

    pub fn from_code(code: u8) -> Option<AtomicOp> {
        AtomicOp::ALL.get(code as usize).copied()
    }

    /// The op name records carry (`atomic_add`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "atomic_add",
            AtomicOp::Max => "atomic_max",
            AtomicOp::Min => "atomic_min",
            AtomicOp::Xchg => "atomic_xchg",
            AtomicOp::Cas => "atomic_cas",
            AtomicOp::And => "atomic_and",
            AtomicOp::Or => "atomic_or",
            AtomicOp::Xor => "atomic_xor",
        }
    }

    /// Whether the operator is defined on `dtype`: add, max, min and xchg
    /// on f32 and i32; cas and the bitwise ones on i32.
    pub fn allows(self, dtype: Dtype) -> bool {
        match self {
            AtomicOp::Add | AtomicOp::Max | AtomicOp::Min | AtomicOp::Xchg => {
                matches!(dtype, Dtype::F32 | Dtype::I32)
            }
            AtomicOp::Cas | AtomicOp::And | AtomicOp::Or | AtomicOp::Xor => dtype == Dtype::I32,
        }
    }
}

/// The operand of an atomic: a tile in TCM (the block's shape and dtype)
/// or one value for every element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AtomicValues {
    Tile(Addr),
    /// Converted to the dtype: f32 rounds to nearest; i32 must be an
    /// integer in range (the reader refuses another).
    Scalar(f64),
}

/// Params of an atomic op: `op` applied element-wise to the `rows` x
/// `cols` block at `target` (rows `stride` bytes apart) with `values`;
/// the old values go to the tile at `old`. Tiles are
/// row-major and contiguous in TCM. Where the mask tile (u8, one byte per
/// element) is zero, the element is left alone and its old value still
/// comes back. `cmp` is cas's compare value (0 for the other ops).
/// Addresses are the ones the kernel used (PA, VA or LA); replay uses the
/// effects' ranges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AtomicParams {
    pub op: AtomicOp,
    pub dtype: Dtype,
    pub target: Addr,
    pub values: AtomicValues,
    pub old: Addr,
    pub mask: Option<Addr>,
    pub rows: u32,
    pub cols: u32,
    /// Bytes between the target's rows (not stored when `rows <= 1`: it
    /// reads back as the row's bytes).
    pub stride: u64,
    pub cmp: i64,
}

impl AtomicParams {
    /// Whether atomic params read back as written and make sense: the
    /// operator defined on the dtype, the tiles in TCM, the target in device
    /// memory, sizes that fit in 64 bits, rows no closer than their bytes.
    pub fn check(&self) -> Result<(), String> {
        let a = self;
        if !a.op.allows(a.dtype) {
            return Err(format!("{} is not defined on {}", a.op.name(), a.dtype));
        }
        let values = match a.values {
            AtomicValues::Tile(v) => Some(v),
            AtomicValues::Scalar(v) => {
                let fits = match a.dtype {
                    Dtype::I32 => {
                        v.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&v)
                    }
                    _ => true,
                };
                if !fits {
                    return Err(format!("{}'s value {v} is not an {}", a.op.name(), a.dtype));
                }
                None
            }
        };
        for (what, addr) in [("values", values), ("old", Some(a.old)), ("mask", a.mask)] {
            if let Some(addr) = addr
                && addr.space != Space::Tcm
            {
                return Err(format!(
                    "{}'s {what} tile is in {}, not tcm",
                    a.op.name(),
                    addr.space.name()
                ));
            }
        }
        if a.target.space == Space::Host {
            return Err(format!("{}'s target is in host memory", a.op.name()));
        }
        let Some(row) = a.row_bytes() else {
            return Err(format!("{}'s row size overflows", a.op.name()));
        };
        if a.input_len().is_none() {
            return Err(format!("{}'s block size overflows", a.op.name()));
        }
        if a.rows > 1 && a.stride < row {
            return Err(format!(
                "{}'s row stride {} is less than its row's {row} bytes",
                a.op.name(),
                a.stride
            ));
        }
        if i32::try_from(a.cmp).is_err() {
            return Err(format!(
                "{}'s compare value {} is not an i32",
                a.op.name(),
                a.cmp
            ));
        }
        if a.op != AtomicOp::Cas && a.cmp != 0 {
            return Err(format!("{} has a compare value (cas only)", a.op.name()));
        }
        Ok(())
    }

    /// Bytes of one row of the block, `None` on overflow.
    pub fn row_bytes(&self) -> Option<u64> {
        (self.cols as u64).checked_mul(self.dtype.size() as u64)
    }

    /// Bytes of the block (and of the values and old tiles).
    pub fn nbytes(&self) -> Option<u64> {
        self.row_bytes()?.checked_mul(self.rows as u64)
    }

    /// Elements of the block (bytes of the mask tile).
    pub fn elements(&self) -> u64 {
        self.rows as u64 * self.cols as u64
    }

    /// The bytes of the values tile (0 for a scalar).
    pub fn values_len(&self) -> Option<u64> {
        match self.values {
            AtomicValues::Tile(_) => self.nbytes(),
            AtomicValues::Scalar(_) => Some(0),
        }
    }

    /// The bytes the op reads, in its read effect's order: values, mask,
    /// target.
    pub fn input_len(&self) -> Option<u64> {
        let n = self.nbytes()?;
        let mask = if self.mask.is_some() {
            self.elements()
        } else {
            0
        };
        n.checked_add(self.values_len()?)?.checked_add(mask)
    }

    /// The bytes it writes: the target's new bytes, then the old ones.
    pub fn output_len(&self) -> Option<u64> {
        self.nbytes()?.checked_mul(2)
    }

    /// Apply the op: `input` is the read effect's bytes (values, mask if
    /// any, then the target's old bytes); returns the write effect's
    /// bytes (the target's new bytes, then the old ones). An error if the
    /// operator is not defined on the dtype or the input has the wrong
    /// length.
    pub fn apply(&self, input: &[u8]) -> Result<Vec<u8>, String> {
        if !self.op.allows(self.dtype) {
            return Err(format!(
                "{} is not defined on {}",
                self.op.name(),
                self.dtype
            ));
        }
        let (Some(n), Some(want)) = (self.nbytes(), self.input_len()) else {
            return Err("the block's size overflows".into());
        };
        if input.len() as u64 != want {
            return Err(format!(
                "{} takes {want} bytes of operands, got {}",
                self.op.name(),
                input.len()
            ));
        }
        let n = n as usize;
        let vn = self.values_len().unwrap_or(0) as usize;
        let scalar = match self.values {
            AtomicValues::Scalar(v) => Some(match self.dtype {
                Dtype::F32 => (v as f32).to_le_bytes(),
                _ => (v as i32).to_le_bytes(),
            }),
            AtomicValues::Tile(_) => None,
        };
        let values = &input[..vn];
        let (mask, old) = if self.mask.is_some() {
            let e = self.elements() as usize;
            (Some(&input[vn..vn + e]), &input[vn + e..])
        } else {
            (None, &input[vn..])
        };
        let value = |i: usize| -> [u8; 4] {
            match scalar {
                Some(s) => s,
                None => <[u8; 4]>::try_from(&values[4 * i..4 * i + 4]).expect("4 bytes"),
            }
        };
        let mut out = Vec::with_capacity(2 * n);
        out.extend_from_slice(old);
        for (i, new) in out.chunks_exact_mut(4).enumerate() {
            if mask.is_some_and(|m| m[i] == 0) {
                continue;
            }
            let (o, v) = (<[u8; 4]>::try_from(&*new).expect("4 bytes"), value(i));
            let r = match self.dtype {
                Dtype::F32 => {
                    f32_op(self.op, f32::from_le_bytes(o), f32::from_le_bytes(v)).to_le_bytes()
                }
                _ => i32_op(
                    self.op,
                    i32::from_le_bytes(o),
                    i32::from_le_bytes(v),
                    self.cmp as i32,
                )
                .to_le_bytes(),
            };
            new.copy_from_slice(&r);
        }
        out.extend_from_slice(old);
        Ok(out)
    }
}

fn f32_op(op: AtomicOp, old: f32, v: f32) -> f32 {
    match op {
        AtomicOp::Add => old + v,
        AtomicOp::Max if v > old => v,
        AtomicOp::Min if v < old => v,
        AtomicOp::Xchg => v,
        _ => old,
    }
}

fn i32_op(op: AtomicOp, old: i32, v: i32, cmp: i32) -> i32 {
    match op {
        AtomicOp::Add => old.wrapping_add(v),
        AtomicOp::Max => old.max(v),
        AtomicOp::Min => old.min(v),
        AtomicOp::Xchg => v,
        AtomicOp::Cas if old == cmp => v,
        AtomicOp::Cas => old,
        AtomicOp::And => old & v,
        AtomicOp::Or => old | v,
        AtomicOp::Xor => old ^ v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Space;

    fn params(op: AtomicOp, dtype: Dtype, mask: bool) -> AtomicParams {
        AtomicParams {
            op,
            dtype,
            target: Addr::default(),
            values: AtomicValues::Tile(Addr {
                space: Space::Tcm,
                addr: 0,
            }),
            old: Addr {
                space: Space::Tcm,
                addr: 64,
            },
            mask: mask.then_some(Addr {
                space: Space::Tcm,
                addr: 128,
            }),
            rows: 1,
            cols: 3,
            stride: 12,
            cmp: if op == AtomicOp::Cas { 5 } else { 0 },
        }
    }

    fn i32s(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn each_integer_op_gives_the_new_and_the_old_values() {
        let old = [5, -7, i32::MAX];
        let v = [3, 9, 1];
        for (op, new) in [
            (AtomicOp::Add, [8, 2, i32::MIN]),
            (AtomicOp::Max, [5, 9, i32::MAX]),
            (AtomicOp::Min, [3, -7, 1]),
            (AtomicOp::Xchg, [3, 9, 1]),
            // Only the first element equals cmp (5).
            (AtomicOp::Cas, [3, -7, i32::MAX]),
            (AtomicOp::And, [5 & 3, -7 & 9, i32::MAX & 1]),
            (AtomicOp::Or, [5 | 3, -7 | 9, i32::MAX | 1]),
            (AtomicOp::Xor, [5 ^ 3, -7 ^ 9, i32::MAX ^ 1]),
        ] {
            let p = params(op, Dtype::I32, false);
            let out = p.apply(&[i32s(&v), i32s(&old)].concat()).unwrap();
            assert_eq!(out, [i32s(&new), i32s(&old)].concat(), "{op:?}");
        }
    }

    #[test]
    fn f32_add_rounds_per_update_and_a_mask_leaves_elements_alone() {
        let p = params(AtomicOp::Add, Dtype::F32, true);
        let old = [1.0e8f32, 2.0, f32::NAN];
        let v = [1.0f32, 0.5, 1.0];
        let input = [f32s(&v), vec![1, 1, 0], f32s(&old)].concat();
        let out = p.apply(&input).unwrap();
        // 1e8 + 1 rounds back to 1e8 in f32.
        assert_eq!(&out[..4], &1.0e8f32.to_le_bytes());
        assert_eq!(&out[4..8], &2.5f32.to_le_bytes());
        assert_eq!(&out[8..12], &f32::NAN.to_le_bytes());
        assert_eq!(&out[12..], &f32s(&old)[..]);
        // Max: a NaN value never replaces.
        let p = params(AtomicOp::Max, Dtype::F32, false);
        let out = p
            .apply(&[f32s(&[f32::NAN, 3.0, 1.0]), f32s(&[1.0, 2.0, 2.0])].concat())
            .unwrap();
        assert_eq!(&out[..12], &f32s(&[1.0, 3.0, 2.0])[..]);
    }

    #[test]
    fn a_scalar_value_takes_no_bytes_and_applies_to_every_element() {
        let mut p = params(AtomicOp::Add, Dtype::I32, false);
        p.values = AtomicValues::Scalar(1.0);
        assert_eq!(p.input_len(), Some(12));
        let out = p.apply(&i32s(&[0, 41, -1])).unwrap();
        assert_eq!(out, [i32s(&[1, 42, 0]), i32s(&[0, 41, -1])].concat());
    }

    #[test]
    fn undefined_ops_and_wrong_lengths_are_errors() {
        let e = params(AtomicOp::Xor, Dtype::F32, false)
            .apply(&[0; 24])
            .unwrap_err();
        assert!(e.contains("atomic_xor is not defined on f32"), "{e}");
        let e = params(AtomicOp::Add, Dtype::I32, false)
            .apply(&[0; 23])
            .unwrap_err();
        assert!(e.contains("takes 24 bytes"), "{e}");
        assert!(!AtomicOp::Add.allows(Dtype::F16));
        assert_eq!(AtomicOp::from_code(8), None);
    }

    fn record(p: AtomicParams) -> crate::types::Record {
        crate::types::Record {
            kind: crate::types::OpKind::Atomic,
            params: crate::types::Params::Atomic(p),
            ..Default::default()
        }
    }

    fn encode(r: &crate::types::Record) -> Vec<u8> {
        let mut e = crate::record_codec::RecordEncoder::default();
        e.push(r);
        e.as_bytes().to_vec()
    }

    fn decode(b: &[u8]) -> Result<crate::types::Record, String> {
        let mut d = crate::record_codec::RecordDecoder::new(b, 0, 1);
        let mut r = crate::types::Record::default();
        d.next_into(&mut r).map_err(|e| e.to_string())?;
        Ok(r)
    }

    #[test]
    fn atomic_records_round_trip_with_flag_bit_6() {
        let mut cas = params(AtomicOp::Cas, Dtype::I32, true);
        cas.rows = 3;
        cas.cmp = -9;
        let mut scalar = params(AtomicOp::Max, Dtype::F32, false);
        scalar.values = AtomicValues::Scalar(-2.5);
        for p in [params(AtomicOp::Add, Dtype::F32, false), cas, scalar] {
            let r = record(p);
            let b = encode(&r);
            assert_eq!(b[0] & 0x40, 0x40, "flag bit 6");
            assert_eq!(b[1], 4, "kind 4");
            assert_eq!(decode(&b).unwrap(), r);
        }
    }

    #[test]
    fn forged_atomic_records_are_refused_not_panicked_on() {
        let good = encode(&record(params(AtomicOp::Add, Dtype::I32, false)));
        // Without flag bit 6, and the flag on another kind.
        let mut b = good.clone();
        b[0] &= !0x40;
        assert!(decode(&b).unwrap_err().contains("flag bit 6"));
        let mut b = good.clone();
        b[1] = 2;
        assert!(decode(&b).unwrap_err().contains("flag bit 6"));
        // The params body ends the record: op code, then dtype.
        let at = good.len() - params_len(&good);
        let mut b = good.clone();
        b[at] = 8;
        assert!(decode(&b).unwrap_err().contains("unknown atomic op code 8"));
        let mut b = good.clone();
        b[at] = AtomicOp::Add as u8;
        b[at + 1] = Dtype::F16 as u8;
        assert!(
            decode(&b)
                .unwrap_err()
                .contains("atomic_add is not defined on f16")
        );
        // Every truncation and every byte value of the params: an error
        // or a record, never a panic.
        for cut in 0..good.len() {
            let _ = decode(&good[..cut]);
        }
        for i in at..good.len() {
            for v in [0u8, 1, 2, 3, 0x7f, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                if let Ok(r) = decode(&b) {
                    let crate::types::Params::Atomic(p) = r.params else {
                        panic!("atomic params")
                    };
                    assert!(p.check().is_ok());
                }
            }
        }
        // A values tile outside TCM, a cmp on add: refused when written.
        let mut p = params(AtomicOp::Add, Dtype::I32, false);
        p.cmp = 3;
        assert!(p.check().unwrap_err().contains("compare value"));
        let mut p = params(AtomicOp::Add, Dtype::I32, false);
        p.values = AtomicValues::Tile(Addr::default());
        assert!(p.check().unwrap_err().contains("values tile is in hbm"));
        p.values = AtomicValues::Scalar(0.5);
        assert!(p.check().unwrap_err().contains("not an i32"));
        let mut p = params(AtomicOp::Cas, Dtype::I32, false);
        p.cmp = 1 << 40;
        assert!(
            p.check()
                .unwrap_err()
                .contains("compare value 1099511627776")
        );
    }

    /// The params body's length (its bytes end the record).
    fn params_len(rec: &[u8]) -> usize {
        // The same record with no params has only the length byte.
        let r = decode(rec).unwrap();
        let bare = encode(&crate::types::Record {
            params: crate::types::Params::None,
            ..r
        });
        rec.len() - bare.len()
    }
}
