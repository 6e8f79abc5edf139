//! Elementary functions in f64 for the math ops: `exp`, `log`, `erf`,
//! `tanh`, `sigmoid` and `rsqrt`, written so that a loop over a slice
//! compiles to vector code (no branches: every range is computed and
//! selected, and integer steps are adds and shifts on the bits), with the
//! same bits on every CPU (plain IEEE adds, multiplies and divisions, no
//! fused multiply-add, nothing from the platform's libm).
//!
//! Error bounds, in ulps of the f64 result against the exact value (ulps
//! of the exact result's binade; a subnormal result's ulp is the smallest
//! subnormal). The tests measure each function against an independent f64
//! implementation, the `libm` crate (a port of musl, within 1 ulp), over
//! the whole f64 range (every binade's edges, random bit patterns, both
//! signs, subnormals) plus dense sweeps of each function's working range
//! and interval edges, and assert the measured column:
//!
//! | function  | bound | measured against `libm` |
//! | --------- | ----- | ----------------------- |
//! | `exp`     | 2     | <= 1                    |
//! | `log`     | 2     | <= 1                    |
//! | `erf`     | 2     | <= 1                    |
//! | `tanh`    | 4     | <= 3                    |
//! | `sigmoid` | 4     | <= 2 (against its formula on `libm::exp`) |
//! | `rsqrt`   | 2     | <= 1 (against `libm::pow(x, -0.5)`) |
//!
//! Special values follow IEEE / C99: NaN gives NaN; `exp(-inf) = 0`,
//! `exp(inf) = inf`, overflow gives inf and underflow rounds through the
//! subnormals to 0; `log(0) = -inf`, `log(x < 0) = NaN`, `log(inf) = inf`;
//! `erf(+-inf) = tanh(+-inf) = +-1`, `erf(-0) = tanh(-0) = -0`;
//! `sigmoid(-inf) = 0`, `sigmoid(inf) = 1`; `rsqrt(+-0) = +-inf`,
//! `rsqrt(x < 0) = NaN` (-inf included).
//!
//! The slice forms (`exp_in_place`, ...) are what the math ops call: one
//! loop per function, compiled for the baseline, AVX2 and AVX-512 and run
//! in the widest the CPU has (`unsafe` only to call a `target_feature`
//! function after checking the feature); all give the scalar function's
//! bits (tested in every width the CPU runs).
//!
//! The math ops round the f64 value once to the output dtype, so an f32
//! output is the correctly rounded one except where the exact value lies
//! within these few f64 ulps of an f32 rounding boundary (about 2^-28 of
//! inputs).

/// `if c { a } else { b }`, for values already computed (a select, not a
/// branch, once inlined into a vector loop).
#[inline(always)]
fn sel(c: bool, a: f64, b: f64) -> f64 {
    if c { a } else { b }
}

/// ln 2 split: `LN2_HI` has 32 significant bits, so `k * LN2_HI` is exact
/// for |k| < 2^21 (fdlibm's split).
const LN2_HI: f64 = 0.693_147_180_369_123_8; // 0x3fe62e42fee00000
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10; // 0x3dea39ef35793c76
/// 1.5 * 2^52: adding it rounds to an integer held in the low mantissa bits.
const SHIFT: f64 = 6_755_399_441_055_744.0;
/// 2^52: an integer below 2^52 in the low mantissa bits of 2^52 + n.
const TWO52: f64 = 4_503_599_627_370_496.0;

/// 1/k! for k = 0..=13: the Taylor series of e^r on |r| <= ln2/2, whose
/// truncation error (r^14/14! < 5e-18) is below 1/20 ulp.
const EXP_TAYLOR: [f64; 14] = [
    1.0,
    1.0,
    0.5,
    0.166_666_666_666_666_66,
    0.041_666_666_666_666_664,
    0.008_333_333_333_333_333,
    0.001_388_888_888_888_889,
    0.000_198_412_698_412_698_4,
    2.480_158_730_158_73e-5,
    2.755_731_922_398_589_3e-6,
    2.755_731_922_398_589e-7,
    2.505_210_838_544_172e-8,
    2.087_675_698_786_81e-9,
    1.605_904_383_682_161_3e-10,
];

/// Split `x` (already clamped to a finite range, or NaN) as `k ln2 + r`,
/// |r| <= ln2/2 (plus a rounding), returning `(k + 1075, r)`.
#[inline(always)]
fn reduce_ln2(x: f64) -> (u64, f64) {
    let t = x * std::f64::consts::LOG2_E + SHIFT;
    let kf = t - SHIFT;
    // k - (-1075): t's bits minus SHIFT's are k (two's complement).
    let biased = t.to_bits().wrapping_sub(SHIFT.to_bits()).wrapping_add(1075);
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    (biased, r)
}

/// e^x. Error <= 2 ulp (see the module docs).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    // exp(709.8) overflows and exp(-745.2) rounds to 0; a NaN stays NaN
    // (both comparisons are false).
    let x = sel(x > 709.8, 709.8, sel(x < -745.2, -745.2, x));
    let (biased, r) = reduce_ln2(x);
    let mut p = EXP_TAYLOR[13];
    for &c in EXP_TAYLOR[..13].iter().rev() {
        p = p * r + c;
    }
    // 2^k in two normal factors (k in [-1075, 1024]): p * 2^k1 is exact and
    // the second product rounds once, into the subnormals where it must.
    let h = biased >> 1; // k1 = h - 537
    let s1 = f64::from_bits((h + 486) << 52);
    let s2 = f64::from_bits((biased - h + 485) << 52);
    p * s1 * s2
}

/// e^y - 1 for y in [0, 40] or NaN, accurate relative to the result for
/// tiny y. Error <= 2 ulp.
#[inline(always)]
fn expm1_small_range(y: f64) -> f64 {
    let (biased, r) = reduce_ln2(y);
    // expm1(r) = r + r^2 (1/2 + r/6 + ...), Taylor to r^15.
    let mut p = EXP_TAYLOR[13] / 14.0 / 15.0;
    p = p * r + EXP_TAYLOR[13] / 14.0;
    for &c in EXP_TAYLOR[2..14].iter().rev() {
        p = p * r + c;
    }
    let em = r + r * r * p;
    // 2^k (1 + em) - 1 = 2^k em + (2^k - 1); k in [0, 58].
    // k = 0 gives em exactly (r is y then); a NaN y gives NaN whatever
    // its bits make of the scale.
    let scale = f64::from_bits(biased.wrapping_sub(1075 - 1023) << 52);
    scale * em + (scale - 1.0)
}

/// tanh x = e / (e + 2) with e = expm1(2|x|), signed. Error <= 4 ulp.
#[inline(always)]
pub fn tanh(x: f64) -> f64 {
    let a = x.abs();
    // tanh(20) rounds to 1; a NaN stays NaN.
    let y = 2.0 * sel(a > 20.0, 20.0, a);
    let e = expm1_small_range(y);
    (e / (e + 2.0)).copysign(x)
}

/// 1 / (1 + e^-x), as e^-|x| / (1 + e^-|x|) for negative x so that it
/// stays accurate down to the subnormals. Error <= 4 ulp.
#[inline(always)]
pub fn sigmoid(x: f64) -> f64 {
    let e = exp(-x.abs());
    sel(x >= 0.0, 1.0, e) / (1.0 + e)
}

/// 1 / sqrt(x): two correctly rounded steps, error <= 2 ulp.
#[inline(always)]
pub fn rsqrt(x: f64) -> f64 {
    1.0 / x.sqrt()
}

/// 2/(2k+1) for k = 1..=11: log(1+f) = 2 atanh(s), s = f/(2+f), whose
/// series in z = s^2 <= 0.0295 is cut where the next term is below 2^-58
/// relative.
const LOG_ATANH: [f64; 11] = [
    2.0 / 3.0,
    2.0 / 5.0,
    2.0 / 7.0,
    2.0 / 9.0,
    2.0 / 11.0,
    2.0 / 13.0,
    2.0 / 15.0,
    2.0 / 17.0,
    2.0 / 19.0,
    2.0 / 21.0,
    2.0 / 23.0,
];

/// Natural logarithm. Error <= 2 ulp.
#[inline(always)]
pub fn log(x: f64) -> f64 {
    // Subnormals scaled into the normals (zero, negatives and NaN are
    // patched at the end).
    let sub = x < f64::MIN_POSITIVE;
    let xs = sel(sub, x * 18_014_398_509_481_984.0, x); // 2^54
    let bits = xs.to_bits();
    let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    let big = m > std::f64::consts::SQRT_2;
    let m = sel(big, m * 0.5, m);
    // The biased exponent as an f64, exactly (magic-number conversion).
    let ebits = f64::from_bits(0x4330_0000_0000_0000 | ((bits >> 52) & 0x7ff)) - TWO52;
    let e = ebits - 1023.0 + sel(big, 1.0, 0.0) - sel(sub, 54.0, 0.0);
    // fdlibm's formulation: log(1+f) = f - (hfsq - s (hfsq + R)), so that
    // the rounding of s only touches a term below f^2/2.
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut r = LOG_ATANH[10];
    for &c in LOG_ATANH[..10].iter().rev() {
        r = r * z + c;
    }
    let r = r * z;
    let hfsq = 0.5 * f * f;
    let res = e * LN2_HI - ((hfsq - (s * (hfsq + r) + e * LN2_LO)) - f);
    let res = sel(x == f64::INFINITY, x, res);
    let res = sel(x == 0.0, f64::NEG_INFINITY, res);
    let res = sel(x < 0.0, f64::NAN, res);
    sel(x.is_nan(), x, res)
}

/// erf(x) / x on |x| < 1 as `1 + ERF_SMALL_0 + z Q(z)`, z = x^2: a
/// Chebyshev interpolant of degree 13 in z (computed with 70-digit
/// arithmetic; within 1e-18 of the function), split so that erf(x) =
/// x + x (ERF_SMALL_0 + z Q(z)) adds a small correction to x.
const ERF_SMALL_0: f64 = 0.128_379_167_095_512_6;
const ERF_SMALL: [f64; 13] = [
    -0.376_126_389_031_837_54,
    0.112_837_916_709_551_2,
    -0.026_866_170_645_129_84,
    0.005_223_977_625_423_298_5,
    -0.000_854_832_702_193_483,
    0.000_120_553_329_028_887_36,
    -1.492_564_756_751_933_2e-5,
    1.646_204_544_146_841_8e-6,
    -1.636_464_215_816_761_6e-7,
    1.479_240_120_940_481_3e-8,
    -1.216_456_005_728_345e-9,
    8.709_045_129_053_106e-11,
    -4.230_945_824_295_338e-12,
];

/// erfc(x) e^(x^2) on [1, 2), [2, 3.5) and [3.5, 6): Chebyshev
/// interpolants of degree 16 (computed with 70-digit arithmetic, within
/// 3e-16 relative of the function) as polynomials in `x - centre`.
const ERFCX_CENTRE: [f64; 3] = [1.5, 2.75, 4.75];
const ERFCX: [[f64; 17]; 3] = [
    [
        0.321_585_416_454_317_5,
        -0.163_622_917_732_560_05,
        0.076_151_039_855_477_4,
        -0.032_930_905_299_565_27,
        0.013_377_340_953_067_394,
        -0.005_145_957_547_837_782_6,
        0.001_886_134_876_991_997_5,
        -0.000_661_930_070_108_431_5,
        0.000_223_309_945_300_441_1,
        -7.265_887_301_589_559e-5,
        2.286_429_960_812_774_6e-5,
        -6.975_362_227_858_43e-6,
        2.067_065_791_215_665_4e-6,
        -5.944_961_119_917_664e-7,
        1.671_429_290_192_812_6e-7,
        -4.954_580_783_890_160_3e-8,
        1.324_254_150_684_958_6e-8,
    ],
    [
        0.193_662_096_279_068_7,
        -0.063_237_637_560_634_79,
        0.019_758_592_987_322_854,
        -0.005_934_337_897_002_171,
        0.001_719_581_885_290_098_6,
        -0.000_482_195_084_876_792_43,
        0.000_131_181_800_508_456_1,
        -3.469_861_074_039_318e-5,
        8.940_156_292_984_54e-6,
        -2.247_366_566_986_457e-6,
        5.519_743_740_073_735e-7,
        -1.326_483_901_446_381_8e-7,
        3.121_415_013_712_102e-8,
        -7.156_467_021_431_838e-9,
        1.620_732_718_899_106_5e-9,
        -4.056_754_880_659_121e-10,
        8.831_959_586_426_476e-11,
    ],
    [
        0.116_302_707_210_247_31,
        -0.023_503_448_598_162_904,
        0.004_661_326_368_972_3,
        -0.000_908_098_897_037_306_5,
        0.000_173_928_304_041_868_73,
        -3.277_578_106_652_811_6e-5,
        6.081_114_539_531e-6,
        -1.111_567_993_115_672_8e-6,
        2.002_920_135_090_727e-7,
        -3.559_516_800_059_069_6e-8,
        6.242_341_780_249_905e-9,
        -1.081_455_682_633_195e-9,
        1.849_140_276_993_934e-10,
        -3.075_098_042_647_340_6e-11,
        5.138_680_596_045_611e-12,
        -1.027_793_248_602_430_2e-12,
        1.672_245_719_005_653_4e-13,
    ],
];

/// erf on |x| < 1 (any other x: a meaningless value; NaN: NaN).
#[inline(always)]
fn erf_small(x: f64) -> f64 {
    let z = x * x;
    let mut q = ERF_SMALL[12];
    for &c in ERF_SMALL[..12].iter().rev() {
        q = q * z + c;
    }
    x + x * (ERF_SMALL_0 + z * q)
}

/// erf on |x| >= 6, or NaN.
#[inline(always)]
fn erf_one(x: f64) -> f64 {
    sel(x.is_nan(), x, 1.0f64.copysign(x))
}

/// The error function: x (1 + ERF_SMALL_0 + x^2 Q(x^2)) for |x| < 1,
/// 1 - e^(-x^2) erfcx(|x|) up to 6, +-1 beyond (erfc(6) < 2.2e-17).
/// Error <= 2 ulp.
#[inline(always)]
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let small = erf_small(x);
    // 1 <= |x| < 6: each element picks its interval's coefficients.
    let ac = sel(a < 6.0, a, 6.0);
    let (i2, i3) = (ac >= 2.0, ac >= 3.5);
    let pick = |k: usize| sel(i3, ERFCX[2][k], sel(i2, ERFCX[1][k], ERFCX[0][k]));
    let t = ac
        - sel(
            i3,
            ERFCX_CENTRE[2],
            sel(i2, ERFCX_CENTRE[1], ERFCX_CENTRE[0]),
        );
    let mut g = pick(16);
    for k in (0..16).rev() {
        g = g * t + pick(k);
    }
    let large = (1.0 - exp(-(ac * ac)) * g).copysign(x);
    let res = sel(a < 1.0, small, sel(a < 6.0, large, erf_one(x)));
    sel(x.is_nan(), x, res)
}

/// [`erf`] of every element. A run of 32 elements all below 1 in
/// magnitude, or all at least 6, takes only that range's formula (the
/// same bits as [`erf`]: it is the value [`erf`] selects there); other
/// runs compute every range.
#[inline(always)]
fn erf_loop(xs: &mut [f64]) {
    for run in xs.chunks_mut(32) {
        // NaNs are left out of both bounds: the small formula and
        // `erf_one` give them NaN as `erf` does.
        let (lo, hi) = run.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v.abs()), hi.max(v.abs()))
        });
        if hi < 1.0 {
            for v in run {
                *v = erf_small(*v);
            }
        } else if lo >= 6.0 {
            for v in run {
                *v = erf_one(*v);
            }
        } else {
            for v in run {
                *v = erf(*v);
            }
        }
    }
}

/// Which vector instructions a slice kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The build's baseline (SSE2 on x86-64: two f64 lanes).
    Base,
    /// AVX2 (four lanes).
    Avx2,
    /// AVX-512F (eight lanes).
    Avx512,
}

impl Isa {
    /// The widest this CPU runs.
    pub(crate) fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Base
    }

    /// Every kind this CPU runs (for tests: each must give the same bits).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Base];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }
}

/// Slice forms: the function applied to every element in place, one loop
/// with the function inlined into it (so that it vectorises), compiled
/// for the baseline, AVX2 and AVX-512 and run in the widest the CPU has.
/// Every version is the same sequence of IEEE adds, multiplies, divisions,
/// square roots and bit operations (fused multiply-add is not enabled), so
/// they give the same bits; the tests compare each with the scalar
/// function.
macro_rules! in_place {
    ($($(#[$m:meta])* $name:ident, $with:ident = $body:expr;)*) => {$(
        $(#[$m])*
        pub fn $name(xs: &mut [f64]) {
            $with(xs, Isa::best())
        }

        pub(crate) fn $with(xs: &mut [f64], isa: Isa) {
            #[inline(always)]
            fn body(xs: &mut [f64]) {
                ($body)(xs)
            }
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2(xs: &mut [f64]) {
                    body(xs)
                }
                #[target_feature(enable = "avx512f")]
                fn avx512(xs: &mut [f64]) {
                    body(xs)
                }
                match isa {
                    // SAFETY: a `target_feature` function may be called
                    // where the CPU has the feature; `isa` is `Isa::best()`
                    // or one of `Isa::available()`, which checked it.
                    Isa::Avx512 => {
                        #[allow(unsafe_code)]
                        unsafe {
                            avx512(xs)
                        }
                    }
                    // SAFETY: as above, for AVX2.
                    Isa::Avx2 => {
                        #[allow(unsafe_code)]
                        unsafe {
                            avx2(xs)
                        }
                    }
                    Isa::Base => body(xs),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = isa;
                body(xs)
            }
        }
    )*};
}

/// One element at a time through `f` (inlined: `f` is `#[inline(always)]`).
#[inline(always)]
fn each(xs: &mut [f64], f: impl Fn(f64) -> f64) {
    for v in xs {
        *v = f(*v);
    }
}

in_place! {
    /// [`exp`] of every element.
    exp_in_place, exp_with = |xs| each(xs, exp);
    /// [`log`] of every element.
    log_in_place, log_with = |xs| each(xs, log);
    /// [`tanh`] of every element.
    tanh_in_place, tanh_with = |xs| each(xs, tanh);
    /// [`sigmoid`] of every element.
    sigmoid_in_place, sigmoid_with = |xs| each(xs, sigmoid);
    /// [`rsqrt`] of every element.
    rsqrt_in_place, rsqrt_with = |xs| each(xs, rsqrt);
    /// [`erf`] of every element.
    erf_in_place, erf_with = erf_loop;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in ulps of `got` from `want` (an f64 within 1 ulp of the
    /// exact value), in units of the exact value's ulp; NaN must match NaN
    /// and infinities must be equal.
    fn ulps(got: f64, want: f64) -> f64 {
        if want.is_nan() || got.is_nan() {
            return if want.is_nan() && got.is_nan() {
                0.0
            } else {
                f64::INFINITY
            };
        }
        if want.is_infinite() || got.is_infinite() {
            return if got == want { 0.0 } else { f64::INFINITY };
        }
        if got == want {
            return 0.0;
        }
        // The ulp of |want|'s binade (the smallest subnormal below 2^-1022).
        let w = want.abs();
        let ulp = if w < f64::MIN_POSITIVE {
            f64::from_bits(1)
        } else {
            f64::from_bits(w.to_bits() & 0x7ff0_0000_0000_0000) * f64::EPSILON
        };
        (got - want).abs() / ulp
    }

    /// Inputs over the whole f64 range: every binade's edges and random
    /// bit patterns (both signs, subnormals included), plus special values.
    fn inputs() -> Vec<f64> {
        let mut v = vec![
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            -f64::from_bits(1),
            f64::MAX,
            f64::MIN,
            1.0,
            -1.0,
            2.0,
            3.5,
            6.0,
            -6.0,
            20.0,
            709.78,
            709.79,
            -708.4,
            -745.13,
            -745.14,
            std::f64::consts::SQRT_2,
            std::f64::consts::FRAC_1_SQRT_2,
        ];
        for e in 0..2047u64 {
            for m in [0u64, 1, 0x000f_ffff_ffff_ffff, 0x0008_0000_0000_0000] {
                let x = f64::from_bits((e << 52) | m);
                v.extend([x, -x]);
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            v.push(f64::from_bits(s));
        }
        v
    }

    /// Inputs dense where a function changes: uniform in [-lim, lim] and
    /// around each interval boundary.
    fn dense(lim: f64, edges: &[f64]) -> Vec<f64> {
        let mut v: Vec<f64> = (0..=400_000)
            .map(|i| -lim + 2.0 * lim * i as f64 / 400_000.0)
            .collect();
        for &e in edges {
            for d in -64i64..=64 {
                let x = f64::from_bits((e.to_bits() as i64 + d) as u64);
                v.extend([x, -x]);
            }
        }
        v
    }

    /// The worst error of `f` against `want` over `xs`, and where.
    fn worst(f: fn(f64) -> f64, want: &dyn Fn(f64) -> f64, xs: &[f64]) -> (f64, f64) {
        let mut out = vec![0.0; xs.len()];
        // Through a slice loop, as the math ops call them (vector code).
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = f(x);
        }
        xs.iter().zip(&out).fold((0.0, 0.0), |w, (&x, &got)| {
            let u = ulps(got, want(x));
            if u > w.0 { (u, x) } else { w }
        })
    }

    fn check(name: &str, f: fn(f64) -> f64, want: &dyn Fn(f64) -> f64, bound: f64, xs: &[f64]) {
        let (u, x) = worst(f, want, xs);
        eprintln!("{name}: worst {u} ulp from libm, at {x:e}");
        assert!(
            u <= bound,
            "{name}({x:e}) is {u} ulp from libm's {:e} (got {:e}), bound {bound}",
            want(x),
            f(x)
        );
    }

    // libm's functions are within 1 ulp of the exact value, so a function
    // within `b` ulp of libm is within `b + 1` of the exact value: the
    // bounds below are the module's bounds less one.

    #[test]
    fn exp_within_its_bound() {
        let xs = [inputs(), dense(750.0, &[709.78, -708.39, -745.13, 0.5])].concat();
        check("exp", exp, &libm::exp, 1.0, &xs);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp(709.79), f64::INFINITY);
        assert_eq!(exp(-745.14), 0.0);
        // The smallest subnormal, and one binade of subnormals up.
        assert_eq!(exp(-745.13), f64::from_bits(1));
        assert!(ulps(exp(-740.0), libm::exp(-740.0)) <= 1.0);
        assert!(exp(f64::NAN).is_nan());
    }

    #[test]
    fn log_within_its_bound() {
        let xs = [inputs(), dense(4.0, &[1.0, std::f64::consts::SQRT_2])].concat();
        check("log", log, &libm::log, 1.0, &xs);
        assert_eq!(log(1.0), 0.0);
        assert_eq!(log(0.0), f64::NEG_INFINITY);
        assert_eq!(log(-0.0), f64::NEG_INFINITY);
        assert_eq!(log(f64::INFINITY), f64::INFINITY);
        assert!(log(-1.0).is_nan() && log(f64::NEG_INFINITY).is_nan() && log(f64::NAN).is_nan());
        // The smallest subnormal: -1074 ln 2.
        assert!(ulps(log(f64::from_bits(1)), -744.440_071_921_381_3) <= 1.0);
    }

    #[test]
    fn erf_within_its_bound() {
        let xs = [inputs(), dense(7.0, &[1.0, 2.0, 3.5, 6.0])].concat();
        check("erf", erf, &libm::erf, 1.0, &xs);
        // Tabulated: erf(0.5) = 0.5204998778130465, erf(1) =
        // 0.8427007929497149, erf(2) = 0.9953222650189527.
        assert!(ulps(erf(0.5), 0.520_499_877_813_046_5) <= 1.0);
        assert!(ulps(erf(1.0), 0.842_700_792_949_714_9) <= 1.0);
        assert!(ulps(erf(-2.0), -0.995_322_265_018_952_7) <= 1.0);
        assert_eq!(erf(6.0), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert_eq!(erf(-0.0).to_bits(), (-0.0f64).to_bits());
        // Tiny x: erf(x) = 2x/sqrt(pi), into the subnormals.
        assert_eq!(erf(1e-300), std::f64::consts::FRAC_2_SQRT_PI * 1e-300);
        assert!(erf(f64::NAN).is_nan());
    }

    /// The slice forms give the scalar functions' bits, in every vector
    /// width this CPU runs (the `unsafe` calls of the AVX2 and AVX-512
    /// versions), and erf's shortcuts whichever ranges a run holds (all
    /// small, all large, mixed, with NaNs).
    #[test]
    fn slice_forms_match_the_scalar_functions_in_every_width() {
        let mut xs: Vec<f64> = (0..320).map(|i| (i as f64 - 160.0) / 200.0).collect();
        xs.extend((0..64).map(|i| 6.0 + i as f64));
        xs.extend((0..64).map(|i| -6.0 - i as f64 * 1e-3));
        xs.extend([f64::NAN, 0.5, -0.0, 1e-310]);
        xs.extend((0..60).map(|i| (i as f64 - 30.0) * 0.3));
        xs.extend([f64::NAN; 32]);
        xs.extend((0..31).map(|i| 7.0 + i as f64));
        xs.push(f64::NAN);
        // Runs with a few elements in [1, 6) among small ones, large ones
        // and NaNs, and the ranges' edges.
        xs.extend((0..96).map(|i| match i % 11 {
            3 => 1.0 + i as f64 * 0.05,
            7 => -(i as f64),
            9 => f64::NAN,
            _ => (i as f64 - 48.0) * 0.02,
        }));
        xs.extend([1.0, -1.0, 6.0, -6.0, 5.999, -1.0000001, 0.9999999]);
        xs.extend([f64::INFINITY, f64::NEG_INFINITY, 2.0, 3.5, -2.0, -3.5]);
        xs.extend((0..19).map(|i| i as f64 * 0.01));
        xs.extend(inputs().into_iter().take(20_000));
        type Slice = fn(&mut [f64], Isa);
        type Scalar = fn(f64) -> f64;
        let fns: [(&str, Slice, Scalar); 6] = [
            ("exp", exp_with, exp),
            ("log", log_with, log),
            ("tanh", tanh_with, tanh),
            ("sigmoid", sigmoid_with, sigmoid),
            ("rsqrt", rsqrt_with, rsqrt),
            ("erf", erf_with, erf),
        ];
        let isas = Isa::available();
        assert!(isas.contains(&Isa::best()));
        for (name, slice, scalar) in fns {
            for &isa in &isas {
                // Odd lengths and offsets: the vector loops' remainders.
                for (start, len) in [(0, xs.len()), (3, 37), (1, 1000)] {
                    let part = &xs[start..start + len];
                    let mut got = part.to_vec();
                    slice(&mut got, isa);
                    for (&x, &g) in part.iter().zip(&got) {
                        let want = std::hint::black_box(scalar)(x);
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{name}({x:e}) {isa:?}: {g:e} vs {want:e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn tanh_within_its_bound() {
        let xs = [inputs(), dense(25.0, &[0.3466, 20.0])].concat();
        check("tanh", tanh, &libm::tanh, 3.0, &xs);
        assert_eq!(tanh(f64::INFINITY), 1.0);
        assert_eq!(tanh(f64::NEG_INFINITY), -1.0);
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(tanh(1e-300), 1e-300);
        assert!(tanh(f64::NAN).is_nan());
    }

    #[test]
    fn sigmoid_within_its_bound() {
        // The reference, from libm's pieces: exact enough that it is
        // within 2 ulp (e^x / (1 + e^x) below zero, where 1 / (1 + e^-x)
        // loses the subnormals).
        let want = |x: f64| {
            if x >= 0.0 {
                1.0 / (1.0 + libm::exp(-x))
            } else {
                let e = libm::exp(x);
                e / (1.0 + e)
            }
        };
        let xs = [inputs(), dense(800.0, &[0.0, -745.13])].concat();
        check("sigmoid", sigmoid, &want, 2.0, &xs);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(f64::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(f64::INFINITY), 1.0);
        assert_eq!(sigmoid(-745.14), 0.0);
        assert!(sigmoid(f64::NAN).is_nan());
    }

    #[test]
    fn rsqrt_within_its_bound() {
        // pow(-0, -0.5) is +inf and pow(-inf, -0.5) is 0; 1/sqrt(-0)
        // keeps the sign and a negative x (-inf too) gives NaN, as IEEE's
        // rSqrt and the replay always have.
        let want = |x: f64| {
            if x == 0.0 {
                1.0 / x
            } else if x < 0.0 {
                f64::NAN
            } else {
                libm::pow(x, -0.5)
            }
        };
        check("rsqrt", rsqrt, &want, 1.0, &inputs());
        assert_eq!(rsqrt(0.0), f64::INFINITY);
        assert_eq!(rsqrt(-0.0), f64::NEG_INFINITY);
        assert_eq!(rsqrt(4.0), 0.5);
        assert_eq!(rsqrt(f64::INFINITY), 0.0);
        assert!(rsqrt(-1.0).is_nan() && rsqrt(f64::NEG_INFINITY).is_nan());
    }
}
