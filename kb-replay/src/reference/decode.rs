//! The reference's own element decoder: little-endian elements of each
//! dtype as f64, exactly (no `half`, no [`crate::dtype`]: a bug in the
//! replay's codecs cannot be mirrored here).

use kb_format::Dtype;

/// Decode little-endian elements of `dtype` as f64 (exact for every
/// dtype): `out` gets one element per `dtype` element of `b` (a trailing
/// partial element is ignored), the dtype chosen once.
pub fn decode_into(dtype: Dtype, b: &[u8], out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2(dtype: Dtype, b: &[u8], out: &mut [f64]) {
            decode_each(dtype, b, out)
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: a `target_feature` function may be called where the
            // CPU has the feature, which was just checked.
            #[allow(unsafe_code)]
            unsafe {
                avx2(dtype, b, out)
            };
            return;
        }
    }
    decode_each(dtype, b, out)
}

/// [`decode_into`]'s loops, compiled for the baseline and AVX2 (the same
/// bits: integer steps and exact conversions).
#[inline(always)]
fn decode_each(dtype: Dtype, b: &[u8], out: &mut [f64]) {
    // Indexed over slices cut to one length first: the loop over
    // `chunks_exact` did not vectorise.
    #[inline(always)]
    fn each<const N: usize>(b: &[u8], out: &mut [f64], f: impl Fn([u8; N]) -> f64) {
        let n = out.len().min(b.len() / N);
        let (out, b) = (&mut out[..n], &b[..N * n]);
        for i in 0..n {
            out[i] = f(b[N * i..N * i + N].try_into().expect("N bytes"));
        }
    }
    match dtype {
        Dtype::F32 => each(b, out, |c| f32::from_le_bytes(c) as f64),
        Dtype::F16 => each(b, out, |c| f16_to_f64(u16::from_le_bytes(c))),
        Dtype::Bf16 => each(b, out, |c| {
            f32::from_bits((u16::from_le_bytes(c) as u32) << 16) as f64
        }),
        Dtype::I8 => each(b, out, |c: [u8; 1]| c[0] as i8 as f64),
        Dtype::U8 => each(b, out, |c: [u8; 1]| c[0] as f64),
        Dtype::I32 => each(b, out, |c| i32::from_le_bytes(c) as f64),
    }
}

/// An f16's bits as f64, exactly: each case's bits built and the
/// element's picked by a select, no branch (the decode loop vectorises;
/// a `match` on the exponent was a tenth of an f16 attention trace's
/// `--verify`, mispredicted on every other element).
#[inline(always)]
fn f16_to_f64(h: u16) -> f64 {
    let h = h as u64;
    let sign = (h >> 15) << 63;
    let exp = (h >> 10) & 0x1f;
    let mant = h & 0x3ff;
    // Normal: the exponent rebiased (15 -> 1023), the mantissa widened.
    let normal = sign | ((exp + 1008) << 52) | (mant << 42);
    // Zero and subnormals: mant x 2^-24 (mant as f64 through 2^52 + mant,
    // an integer conversion AVX2 lacks).
    let mant_f = f64::from_bits(0x4330_0000_0000_0000 | mant) - 4_503_599_627_370_496.0;
    let sub = sign | (mant_f * f64::from_bits(0x3e70_0000_0000_0000)).to_bits();
    // Infinities and NaNs: every exponent bit, the mantissa (a NaN's
    // payload) kept.
    let special = sign | (0x7ff << 52) | (mant << 42);
    // The case by masks (as `if`s the compiler kept the branches).
    let is_sub = ((exp == 0) as u64).wrapping_neg();
    let is_special = ((exp == 0x1f) as u64).wrapping_neg();
    f64::from_bits((sub & is_sub) | (special & is_special) | (normal & !(is_sub | is_special)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(dtype: Dtype, b: &[u8]) -> Vec<f64> {
        let mut out = vec![0.0; b.len() / dtype.size()];
        decode_into(dtype, b, &mut out);
        out
    }

    #[test]
    fn decoder_is_exact_for_every_dtype() {
        assert_eq!(
            decode(Dtype::F16, &[0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00]),
            [1.0, -2.0, 2f64.powi(-24)]
        );
        assert_eq!(decode(Dtype::F16, &[0x00, 0x7c]), [f64::INFINITY]);
        assert!(decode(Dtype::F16, &[0x01, 0x7c])[0].is_nan());
        // 0x3555 = 0.333251953125 (f16 nearest to 1/3).
        assert_eq!(decode(Dtype::F16, &[0x55, 0x35]), [0.333251953125]);
        assert_eq!(decode(Dtype::Bf16, &[0x49, 0x40]), [3.140625]);
        assert_eq!(decode(Dtype::I8, &[0xff]), [-1.0]);
        assert_eq!(decode(Dtype::U8, &[0xff]), [255.0]);
        assert_eq!(decode(Dtype::I32, &(-5i32).to_le_bytes()), [-5.0]);
        // Every f16, against the `half` crate's conversion, in the widest
        // compilation the CPU runs and in the baseline one.
        let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut base = vec![0.0; 1 << 16];
        decode_each(Dtype::F16, &all, &mut base);
        for (h, (got, base)) in (0..=u16::MAX).zip(decode(Dtype::F16, &all).into_iter().zip(base)) {
            let want = half::f16::from_bits(h).to_f64();
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
            assert_eq!(got.to_bits(), base.to_bits(), "{h:#06x}");
        }
        // Every dtype: the widest compilation and the baseline one give
        // the same bits (NaN payloads too), a trailing partial element
        // ignored.
        let bytes: Vec<u8> = (0..4099u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for dtype in Dtype::ALL {
            let n = bytes.len() / dtype.size();
            let mut base = vec![0.0; n];
            decode_each(dtype, &bytes, &mut base);
            let got = decode(dtype, &bytes);
            assert_eq!(got.len(), n);
            assert!(
                got.iter()
                    .zip(&base)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype:?}"
            );
        }
    }
}
