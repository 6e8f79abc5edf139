//! Element codecs for op replay: little-endian bytes of a [`Dtype`] to and
//! from the arithmetic types the ops compute in.
//!
//! Conversions follow Rust's `as`: float to integer truncates toward zero
//! and saturates (NaN becomes 0); integer to narrower integer wraps (as
//! numpy's `astype` does); to f16/bf16 rounds to nearest even.
//!
//! The reference evaluation does not use this module (it has its own f64
//! decoder), so a bug here cannot make a wrong replay agree with its
//! reference.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use kb_format::Dtype;

/// True for integer dtypes.
pub fn is_int(d: Dtype) -> bool {
    matches!(d, Dtype::I8 | Dtype::I32 | Dtype::U8)
}

fn words<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    // Through a fixed-size array (a load), not `copy_from_slice` of a
    // length the compiler may not see (a call to memmove per element).
    b.chunks_exact(N)
        .map(|c| <[u8; N]>::try_from(c).unwrap_or([0; N]))
}

/// Write `vals` encoded by `enc` into `out`, N bytes each (the output's
/// counterpart of [`words`]).
pub(crate) fn put_words<T: Copy, const N: usize>(
    out: &mut [u8],
    vals: &[T],
    enc: impl Fn(T) -> [u8; N],
) {
    for (c, &v) in out.chunks_exact_mut(N).zip(vals) {
        if let Ok(c) = <&mut [u8; N]>::try_from(c) {
            *c = enc(v);
        }
    }
}

/// Decode elements as f64 (exact for every dtype).
pub fn to_f64(d: Dtype, b: &[u8]) -> Vec<f64> {
    match d {
        Dtype::F32 => words::<4>(b)
            .map(|w| f32::from_le_bytes(w) as f64)
            .collect(),
        Dtype::F16 => words::<2>(b)
            .map(|w| f16::from_le_bytes(w).to_f64())
            .collect(),
        Dtype::Bf16 => words::<2>(b)
            .map(|w| bf16::from_le_bytes(w).to_f64())
            .collect(),
        Dtype::I8 => b.iter().map(|&x| x as i8 as f64).collect(),
        Dtype::U8 => b.iter().map(|&x| x as f64).collect(),
        Dtype::I32 => words::<4>(b)
            .map(|w| i32::from_le_bytes(w) as f64)
            .collect(),
    }
}

/// Decode elements as f32 (exact except for large i32 values).
pub fn to_f32(d: Dtype, b: &[u8]) -> Vec<f32> {
    match d {
        Dtype::F32 => words::<4>(b).map(f32::from_le_bytes).collect(),
        Dtype::F16 => {
            // Through half's slice conversion (F16C where the CPU has it).
            let bits: Vec<u16> = words::<2>(b).map(u16::from_le_bytes).collect();
            let mut out = vec![0f32; bits.len()];
            bits.reinterpret_cast::<f16>()
                .convert_to_f32_slice(&mut out);
            out
        }
        // bf16 is the top half of an f32: widening is a shift.
        Dtype::Bf16 => words::<2>(b)
            .map(|w| f32::from_bits((u16::from_le_bytes(w) as u32) << 16))
            .collect(),
        Dtype::I8 => b.iter().map(|&x| x as i8 as f32).collect(),
        Dtype::U8 => b.iter().map(|&x| x as f32).collect(),
        Dtype::I32 => words::<4>(b)
            .map(|w| i32::from_le_bytes(w) as f32)
            .collect(),
    }
}

/// `b` (elements of `from`) converted to `to` when one is f32 and the
/// other f16 (`None` otherwise): the same bits as going through f64
/// ([`to_f64`], [`extend_f64`]), faster.
pub fn convert_f32_f16(from: Dtype, to: Dtype, b: &[u8]) -> Option<Vec<u8>> {
    if !cfg!(target_endian = "little") {
        return None;
    }
    match (from, to) {
        (Dtype::F32, Dtype::F16) => {
            let src: Vec<f32> = words::<4>(b).map(f32::from_le_bytes).collect();
            let mut out = vec![f16::ZERO; src.len()];
            out.convert_from_f32_slice(&src);
            Some(out.iter().flat_map(|h| h.to_le_bytes()).collect())
        }
        (Dtype::F16, Dtype::F32) => Some(
            to_f32(Dtype::F16, b)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        _ => None,
    }
}

/// Decode elements as i32 (integers exactly; floats truncate toward zero,
/// saturating).
pub fn to_i32(d: Dtype, b: &[u8]) -> Vec<i32> {
    match d {
        Dtype::I8 => b.iter().map(|&x| x as i8 as i32).collect(),
        Dtype::U8 => b.iter().map(|&x| x as i32).collect(),
        Dtype::I32 => words::<4>(b).map(i32::from_le_bytes).collect(),
        _ => to_f64(d, b).into_iter().map(|v| v as i32).collect(),
    }
}

/// Decode elements as i64 (floats truncate toward zero, saturating).
pub fn to_i64(d: Dtype, b: &[u8]) -> Vec<i64> {
    match d {
        Dtype::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
        Dtype::U8 => b.iter().map(|&x| x as i64).collect(),
        Dtype::I32 => words::<4>(b)
            .map(|w| i32::from_le_bytes(w) as i64)
            .collect(),
        _ => to_f64(d, b).into_iter().map(|v| v as i64).collect(),
    }
}

/// Append `v` encoded as `d`.
pub fn push_f64(d: Dtype, v: f64, out: &mut Vec<u8>) {
    match d {
        Dtype::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
        Dtype::I8 => out.push(v as i8 as u8),
        Dtype::U8 => out.push(v as u8),
        Dtype::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
    }
}

/// Append every value of `vals` encoded as `d` (as [`push_f64`], with the
/// dtype dispatch outside the loop).
pub fn extend_f64(d: Dtype, vals: &[f64], out: &mut Vec<u8>) {
    // Written in place (one loop per dtype over fixed-size chunks, which
    // vectorises), not pushed a byte at a time.
    fn put<const N: usize>(vals: &[f64], out: &mut Vec<u8>, enc: impl Fn(f64) -> [u8; N]) {
        let start = out.len();
        out.resize(start + vals.len() * N, 0);
        put_words(&mut out[start..], vals, enc);
    }
    match d {
        Dtype::F32 if cfg!(target_endian = "little") => {
            // Rounded in one loop, then the f32s' bytes (their
            // little-endian encoding on this target) in one copy.
            let v32: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            out.extend_from_slice(bytemuck::cast_slice(&v32));
        }
        Dtype::F32 => put(vals, out, |v| (v as f32).to_le_bytes()),
        Dtype::F16 => put(vals, out, |v| f16::from_f64(v).to_le_bytes()),
        Dtype::Bf16 => put(vals, out, |v| bf16::from_f64(v).to_le_bytes()),
        Dtype::I8 => put(vals, out, |v| [v as i8 as u8]),
        Dtype::U8 => put(vals, out, |v| [v as u8]),
        Dtype::I32 => put(vals, out, |v| (v as i32).to_le_bytes()),
    }
}

/// Append every value of `vals` encoded as `d` (as [`push_i64`]).
pub fn extend_i64(d: Dtype, vals: &[i64], out: &mut Vec<u8>) {
    out.reserve(vals.len() * d.size());
    match d {
        Dtype::I8 => out.extend(vals.iter().map(|&v| v as i8 as u8)),
        Dtype::U8 => out.extend(vals.iter().map(|&v| v as u8)),
        Dtype::I32 => out.extend(vals.iter().flat_map(|&v| (v as i32).to_le_bytes())),
        _ => vals.iter().for_each(|&v| push_f64(d, v as f64, out)),
    }
}

/// Append `v` encoded as `d`.
pub fn push_f32(d: Dtype, v: f32, out: &mut Vec<u8>) {
    match d {
        Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => push_f64(d, v as f64, out),
    }
}

/// Append `v` encoded as `d` (integers wrap to the width of `d`).
pub fn push_i64(d: Dtype, v: i64, out: &mut Vec<u8>) {
    match d {
        Dtype::I8 => out.push(v as i8 as u8),
        Dtype::U8 => out.push(v as u8),
        Dtype::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        _ => push_f64(d, v as f64, out),
    }
}

/// Round `v` through the precision of `d` (for accumulators kept in f32).
pub fn round_f32(d: Dtype, v: f32) -> f32 {
    match d {
        Dtype::F16 => f16::from_f32(v).to_f32(),
        Dtype::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast f32 <-> f16 casts give the f64 path's bits (the whole
    /// f32 range was checked once with a scratch program; here a sample:
    /// specials, subnormals, rounding ties, NaN payloads, random bits).
    #[test]
    fn fast_f16_casts_match_the_f64_path() {
        let mut bits: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0xffc0_1234,
            0x3380_0000,
            0x3380_0001,
            0x337f_ffff,
            0x3880_0000,
            0x477f_e000,
            0x477f_f000,
            0x477f_efff,
            0x0000_0001,
            0x3f80_1000,
            0x3f80_3000,
        ];
        let mut x = 0x9e37_79b9u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bits.push(x);
        }
        let b: Vec<u8> = bits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let fast = convert_f32_f16(Dtype::F32, Dtype::F16, &b).unwrap();
        let mut slow = Vec::new();
        extend_f64(Dtype::F16, &to_f64(Dtype::F32, &b), &mut slow);
        assert!(fast == slow);
        let h: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        let fast = convert_f32_f16(Dtype::F16, Dtype::F32, &h).unwrap();
        let mut slow = Vec::new();
        extend_f64(Dtype::F32, &to_f64(Dtype::F16, &h), &mut slow);
        assert!(fast == slow);
        assert!(convert_f32_f16(Dtype::F32, Dtype::Bf16, &b).is_none());
    }

    fn round_trip(d: Dtype, vals: &[f64]) -> Vec<f64> {
        let mut b = Vec::new();
        for &v in vals {
            push_f64(d, v, &mut b);
        }
        assert_eq!(b.len(), vals.len() * d.size());
        to_f64(d, &b)
    }

    #[test]
    fn exactly_representable_values_round_trip() {
        let vals = [0.0, 1.0, -2.5, 96.0, -128.0];
        for d in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            assert_eq!(round_trip(d, &vals), vals, "{d}");
        }
        assert_eq!(
            round_trip(Dtype::I8, &[-128.0, 127.0, 3.0]),
            [-128.0, 127.0, 3.0]
        );
        assert_eq!(round_trip(Dtype::I32, &[-70000.0]), [-70000.0]);
    }

    #[test]
    fn narrowing_rounds_and_saturates() {
        // f16 has 11 significant bits: 2049 rounds to even (2048).
        assert_eq!(round_trip(Dtype::F16, &[2049.0]), [2048.0]);
        // bf16 has 8: 257 rounds to 256.
        assert_eq!(round_trip(Dtype::Bf16, &[257.0]), [256.0]);
        // Float to int saturates and truncates; NaN becomes 0.
        assert_eq!(
            round_trip(Dtype::I8, &[300.0, -1.7, f64::NAN]),
            [127.0, -1.0, 0.0]
        );
        // Integer to integer wraps.
        let mut b = Vec::new();
        push_i64(Dtype::I8, 200, &mut b);
        assert_eq!(to_i64(Dtype::I8, &b), [-56]);
    }

    #[test]
    fn known_bit_patterns_decode() {
        // f16 0x3c00 = 1.0, bf16 0x3f80 = 1.0, f32 0x40490fdb = pi.
        assert_eq!(to_f64(Dtype::F16, &[0x00, 0x3c]), [1.0]);
        assert_eq!(to_f64(Dtype::Bf16, &[0x80, 0x3f]), [1.0]);
        assert_eq!(
            to_f32(Dtype::F32, &0x4049_0fdbu32.to_le_bytes()),
            [std::f32::consts::PI]
        );
        assert_eq!(to_i64(Dtype::U8, &[255]), [255]);
    }
}
