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

/// Elements converted at a time through a stack buffer.
const CHUNK: usize = 256;

/// The first `out.len()` words of `b` (little-endian) into `out`: one
/// copy on a little-endian target (`out`'s bytes are its words there).
fn load_le<T: bytemuck::Pod, const N: usize>(b: &[u8], out: &mut [T], from: fn([u8; N]) -> T) {
    let b = &b[..out.len() * N];
    if cfg!(target_endian = "little") && std::mem::size_of::<T>() == N {
        bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(b);
    } else {
        for (o, w) in out.iter_mut().zip(words::<N>(b)) {
            *o = from(w);
        }
    }
}

/// `vals` into `out` as little-endian words (exactly their bytes): one
/// copy on a little-endian target.
fn store_le<T: bytemuck::Pod, const N: usize>(vals: &[T], out: &mut [u8], to: fn(T) -> [u8; N]) {
    if cfg!(target_endian = "little") && std::mem::size_of::<T>() == N {
        out.copy_from_slice(bytemuck::cast_slice(vals));
    } else {
        put_words(out, vals, to);
    }
}

/// Decode the first `out.len()` elements of `b` (elements of `d`) into
/// `out`, as [`to_f64`] does (exact for every dtype), without allocating.
pub fn decode_f64(d: Dtype, b: &[u8], out: &mut [f64]) {
    match d {
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::I8 | Dtype::U8 => {
            // Through f32, which holds each exactly (f16 widened by F16C
            // where the CPU has it), then widened in one loop.
            let mut v = [0f32; CHUNK];
            let es = d.size();
            for (o, c) in out.chunks_mut(CHUNK).zip(b.chunks(CHUNK * es)) {
                let v = &mut v[..o.len()];
                decode_f32(d, c, v);
                for (o, &x) in o.iter_mut().zip(v.iter()) {
                    *o = x as f64;
                }
            }
        }
        Dtype::I32 => {
            let mut v = [0i32; CHUNK];
            for (o, c) in out.chunks_mut(CHUNK).zip(b.chunks(CHUNK * 4)) {
                let v = &mut v[..o.len()];
                load_le(c, v, i32::from_le_bytes);
                for (o, &x) in o.iter_mut().zip(v.iter()) {
                    *o = x as f64;
                }
            }
        }
    }
}

/// Decode the first `out.len()` elements of `b` (elements of `d`) into
/// `out`, as [`to_f32`] does, without allocating.
pub fn decode_f32(d: Dtype, b: &[u8], out: &mut [f32]) {
    match d {
        Dtype::F32 => load_le(b, out, f32::from_le_bytes),
        Dtype::F16 | Dtype::Bf16 => {
            let mut h = [0u16; CHUNK];
            for (o, c) in out.chunks_mut(CHUNK).zip(b.chunks(CHUNK * 2)) {
                let h = &mut h[..o.len()];
                load_le(c, h, u16::from_le_bytes);
                if d == Dtype::F16 {
                    // Through half's slice conversion (F16C where the CPU
                    // has it).
                    h.reinterpret_cast::<f16>().convert_to_f32_slice(o);
                } else {
                    // bf16 is the top half of an f32: widening is a shift.
                    for (o, &x) in o.iter_mut().zip(h.iter()) {
                        *o = f32::from_bits((x as u32) << 16);
                    }
                }
            }
        }
        Dtype::I8 => {
            for (o, &x) in out.iter_mut().zip(b) {
                *o = x as i8 as f32;
            }
        }
        Dtype::U8 => {
            for (o, &x) in out.iter_mut().zip(b) {
                *o = x as f32;
            }
        }
        Dtype::I32 => {
            let mut v = [0i32; CHUNK];
            for (o, c) in out.chunks_mut(CHUNK).zip(b.chunks(CHUNK * 4)) {
                let v = &mut v[..o.len()];
                load_le(c, v, i32::from_le_bytes);
                for (o, &x) in o.iter_mut().zip(v.iter()) {
                    *o = x as f32;
                }
            }
        }
    }
}

/// Encode `vals` as `d` into `out` (exactly `vals.len()` elements of `d`),
/// rounding as [`extend_f64`] does.
pub fn encode_f64(d: Dtype, vals: &[f64], out: &mut [u8]) {
    match d {
        Dtype::F32 => {
            let mut v = [0f32; CHUNK];
            for (c, o) in vals.chunks(CHUNK).zip(out.chunks_mut(CHUNK * 4)) {
                let v = &mut v[..c.len()];
                for (v, &x) in v.iter_mut().zip(c) {
                    *v = x as f32;
                }
                store_le(v, o, f32::to_le_bytes);
            }
        }
        Dtype::F16 => put_words(out, vals, |v| f16::from_f64(v).to_le_bytes()),
        Dtype::Bf16 => put_words(out, vals, |v| bf16::from_f64(v).to_le_bytes()),
        Dtype::I8 => {
            for (o, &v) in out.iter_mut().zip(vals) {
                *o = v as i8 as u8;
            }
        }
        Dtype::U8 => {
            for (o, &v) in out.iter_mut().zip(vals) {
                *o = v as u8;
            }
        }
        Dtype::I32 => put_words(out, vals, |v| (v as i32).to_le_bytes()),
    }
}

/// Encode f32 `vals` as `d` into `out` (exactly `vals.len()` elements of
/// `d`): f32 verbatim, integers as Rust's `as` (a 0/1 mask to u8), f16 and
/// bf16 rounded to nearest even.
pub fn encode_f32(d: Dtype, vals: &[f32], out: &mut [u8]) {
    match d {
        Dtype::F32 => store_le(vals, out, f32::to_le_bytes),
        Dtype::U8 => {
            for (o, &v) in out.iter_mut().zip(vals) {
                *o = v as u8;
            }
        }
        Dtype::I8 => {
            for (o, &v) in out.iter_mut().zip(vals) {
                *o = v as i8 as u8;
            }
        }
        Dtype::I32 => put_words(out, vals, |v| (v as i32).to_le_bytes()),
        Dtype::F16 => put_words(out, vals, |v| f16::from_f32(v).to_le_bytes()),
        Dtype::Bf16 => put_words(out, vals, |v| bf16::from_f32(v).to_le_bytes()),
    }
}

/// Whether [`convert_f32_f16`] converts from `from` to `to` (one of them
/// f32, the other f16).
pub fn converts_f32_f16(from: Dtype, to: Dtype) -> bool {
    matches!(
        (from, to),
        (Dtype::F32, Dtype::F16) | (Dtype::F16, Dtype::F32)
    )
}

/// `b` (elements of `from`) converted into `out` (as many elements of
/// `to`) when one dtype is f32 and the other f16; `false` (nothing
/// written) otherwise: the same bits as going through f64 ([`to_f64`],
/// [`extend_f64`]), through half's slice conversions (F16C where the CPU
/// has it), a stack buffer at a time.
pub fn convert_f32_f16(from: Dtype, to: Dtype, b: &[u8], out: &mut [u8]) -> bool {
    match (from, to) {
        (Dtype::F32, Dtype::F16) => {
            let (mut v, mut h) = ([0f32; CHUNK], [f16::ZERO; CHUNK]);
            for (o, c) in out.chunks_mut(CHUNK * 2).zip(b.chunks(CHUNK * 4)) {
                let n = o.len() / 2;
                decode_f32(Dtype::F32, c, &mut v[..n]);
                h[..n].convert_from_f32_slice(&v[..n]);
                store_le(h[..n].reinterpret_cast(), o, u16::to_le_bytes);
            }
            true
        }
        (Dtype::F16, Dtype::F32) => {
            let mut v = [0f32; CHUNK];
            for (o, c) in out.chunks_mut(CHUNK * 4).zip(b.chunks(CHUNK * 2)) {
                let n = o.len() / 4;
                decode_f32(Dtype::F16, c, &mut v[..n]);
                store_le(&v[..n], o, f32::to_le_bytes);
            }
            true
        }
        _ => false,
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
        let mut fast = vec![0u8; b.len() / 2];
        assert!(convert_f32_f16(Dtype::F32, Dtype::F16, &b, &mut fast));
        let mut slow = Vec::new();
        extend_f64(Dtype::F16, &to_f64(Dtype::F32, &b), &mut slow);
        assert!(fast == slow);
        let h: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        let mut fast = vec![0u8; h.len() * 2];
        assert!(convert_f32_f16(Dtype::F16, Dtype::F32, &h, &mut fast));
        let mut slow = Vec::new();
        extend_f64(Dtype::F32, &to_f64(Dtype::F16, &h), &mut slow);
        assert!(fast == slow);
        let mut none = vec![0u8; b.len() / 2];
        assert!(!convert_f32_f16(Dtype::F32, Dtype::Bf16, &b, &mut none));
        assert!(none.iter().all(|&x| x == 0), "nothing written");
    }

    /// The allocation-free block codecs give what the vector ones give,
    /// for every dtype, over lengths that are not a multiple of their
    /// stack chunk, reading only the front of a longer slice.
    #[test]
    fn block_codecs_match_the_vector_ones() {
        let mut x = 0x2545_f491u32;
        let raw: Vec<u8> = (0..4 * 1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for d in [
            Dtype::F32,
            Dtype::F16,
            Dtype::Bf16,
            Dtype::I8,
            Dtype::U8,
            Dtype::I32,
        ] {
            for n in [0, 1, 7, 255, 256, 257, 600] {
                let b = &raw[..(n + 3) * d.size()];
                let want64 = to_f64(d, &b[..n * d.size()]);
                let mut got64 = vec![0.0; n];
                decode_f64(d, b, &mut got64);
                assert!(
                    got64
                        .iter()
                        .zip(&want64)
                        .all(|(g, w)| g.to_bits() == w.to_bits()),
                    "decode_f64 {d} n={n}"
                );
                let want32 = to_f32(d, &b[..n * d.size()]);
                let mut got32 = vec![0.0f32; n];
                decode_f32(d, b, &mut got32);
                assert!(
                    got32
                        .iter()
                        .zip(&want32)
                        .all(|(g, w)| g.to_bits() == w.to_bits()),
                    "decode_f32 {d} n={n}"
                );
                // Encoding: the f64 values of random f32 bits (NaNs,
                // infinities, subnormals, out-of-range integers).
                let vals = to_f64(Dtype::F32, &raw[..n * 4]);
                let mut want = Vec::new();
                extend_f64(d, &vals, &mut want);
                let mut got = vec![0u8; n * d.size()];
                encode_f64(d, &vals, &mut got);
                assert_eq!(got, want, "encode_f64 {d} n={n}");
                let v32 = to_f32(Dtype::F32, &raw[..n * 4]);
                let mut want = Vec::new();
                v32.iter().for_each(|&v| push_f32(d, v, &mut want));
                let mut got = vec![0u8; n * d.size()];
                encode_f32(d, &v32, &mut got);
                assert_eq!(got, want, "encode_f32 {d} n={n}");
            }
        }
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
