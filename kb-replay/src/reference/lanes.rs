//! The reference's exp and erf, written to run over whole slices in
//! vector lanes and still give the `libm` crate's bits.
//!
//! `libm::exp` and `libm::erf` (fdlibm's algorithms: exp within 1 ulp,
//! erf within 1 ulp where exp is) branch on the argument's range, so a
//! loop calling them runs one element at a time: an mlp trace's GELU was
//! a tenth of its `--verify`. Here each function computes every range's
//! formula, with the same operations in the same order as `libm`, and
//! picks the lane's by a select; no operation depends on another lane
//! and none is a branch, so compiled for AVX2 a slice's loop runs four
//! elements an instruction. Rust never contracts a multiply and an add
//! into one rounding, so every compilation gives the same bits, and the
//! tests hold them to `libm`'s, bit for bit, over dense sweeps of every
//! range, their boundaries and the special values. A verdict does not
//! depend on which CPU checked it (the system libm's `f64::exp`, which
//! this replaces, varies between C libraries).
//!
//! Independence: neither function shares code or algorithm with op
//! replay's math (`crate::ops::fmath`).

// fdlibm's constants as its source prints them (more digits than an f64
// holds; each reads back to the bits fdlibm documents, which the tests'
// bit-for-bit comparison with `libm` confirms).
#![allow(clippy::excessive_precision, clippy::approx_constant)]

/// Where [`map`] applies a function to every element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Exp,
    Erf,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

impl Func {
    #[inline(always)]
    fn at(self, x: f64) -> f64 {
        match self {
            Func::Exp => exp(x),
            Func::Erf => erf(x),
            Func::Sigmoid => 1.0 / (1.0 + exp(-x)),
        }
    }
}

/// `f` of each element of `xs`, in place: the AVX2 compilation where the
/// CPU has it (the same bits either way).
pub(crate) fn map(f: Func, xs: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2(f: Func, xs: &mut [f64]) {
            each(f, xs)
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: a `target_feature` function may be called where the
            // CPU has the feature, which was just checked.
            #[allow(unsafe_code)]
            unsafe {
                avx2(f, xs)
            };
            return;
        }
    }
    each(f, xs)
}

/// The loop, the function chosen outside it (one loop each, so each
/// vectorises on its own). Plain loops and `inline(always)` throughout:
/// an iterator adapter left out of line is compiled without AVX2.
#[inline(always)]
fn each(f: Func, xs: &mut [f64]) {
    match f {
        Func::Exp => {
            for v in xs {
                *v = exp(*v);
            }
        }
        Func::Erf => {
            for v in xs {
                *v = erf(*v);
            }
        }
        Func::Sigmoid => {
            for v in xs {
                *v = Func::Sigmoid.at(*v);
            }
        }
    }
}

/// High word of |x|, as fdlibm compares ranges.
#[inline(always)]
fn high_abs(x: f64) -> u64 {
    (x.to_bits() >> 32) & 0x7fff_ffff
}

/// 2^k for an integral `k` in -1022..=1023, from its bits (the integer
/// taken from the low bits of k + 1.5 x 2^52, which converts without
/// an f64-to-integer instruction AVX2 lacks).
#[inline(always)]
fn pow2(k: f64) -> f64 {
    let t = (k + 6_755_399_441_055_744.0).to_bits();
    let n = t.wrapping_sub(0x4338_0000_0000_0000);
    f64::from_bits(n.wrapping_add(1023) << 52)
}

const LN2HI: f64 = 6.931_471_803_691_238_164_90e-1;
const LN2LO: f64 = 1.908_214_929_270_587_700_02e-10;
const INVLN2: f64 = 1.442_695_040_888_963_387_00;
const P1: f64 = 1.666_666_666_666_660_190_37e-1;
const P2: f64 = -2.777_777_777_701_559_338_42e-3;
const P3: f64 = 6.613_756_321_437_934_361_17e-5;
const P4: f64 = -1.653_390_220_546_525_153_90e-6;
const P5: f64 = 4.138_136_797_057_238_460_39e-8;

/// e^x: `libm::exp`'s bits (fdlibm's e_exp.c: x = k ln2 + r, |r| <= ln2/2,
/// e^r by a rational form of a degree-5 polynomial in r^2, then 2^k).
#[inline(always)]
pub(crate) fn exp(x: f64) -> f64 {
    let hx = high_abs(x);
    let neg = x.is_sign_negative();
    // Past +-746 the result is fixed below; the lanes stay finite.
    let xc = x.clamp(-746.0, 710.0);
    let half = if neg { -0.5 } else { 0.5 };
    // k: nearest to x / ln2 from |x| >= 1.5 ln2, +-1 from ln2 / 2, else 0
    // (the thresholds on the high word, as fdlibm's).
    let sign1 = if neg { -1.0 } else { 1.0 };
    let k = if hx >= 0x3ff0_a2b2 {
        (INVLN2 * xc + half).trunc()
    } else if hx > 0x3fd6_2e42 {
        sign1
    } else {
        0.0
    };
    let hi = xc - k * LN2HI;
    let lo = k * LN2LO;
    let r = hi - lo;
    let rr = r * r;
    let c = r - rr * (P1 + rr * (P2 + rr * (P3 + rr * (P4 + rr * P5))));
    let y = 1.0 + (r * c / (2.0 - c) - lo + hi);
    // y 2^k in two exact-range steps (k is -1076..=1025 here): the first
    // product is exact, the second rounds once, as scalbn's result.
    let k1 = (k * 0.5).floor();
    let scaled = y * pow2(k1) * pow2(k - k1);
    let v = if hx <= 0x3e30_0000 { 1.0 + x } else { scaled };
    let v = if x > 709.782_712_893_383_973_096 {
        x * f64::from_bits(0x7fe0_0000_0000_0000)
    } else {
        v
    };
    let v = if x < -745.133_219_101_941_108_42 {
        0.0
    } else {
        v
    };
    if x.is_nan() { x } else { v }
}

const ERX: f64 = 8.450_629_115_104_675_292_97e-1;
const EFX8: f64 = 1.027_033_336_764_100_690_53;
const PP: [f64; 5] = [
    1.283_791_670_955_125_585_61e-1,
    -3.250_421_072_470_014_993_70e-1,
    -2.848_174_957_559_851_047_66e-2,
    -5.770_270_296_489_441_591_57e-3,
    -2.376_301_665_665_016_260_84e-5,
];
const QQ: [f64; 5] = [
    3.979_172_239_591_553_528_19e-1,
    6.502_224_998_876_729_444_85e-2,
    5.081_306_281_875_765_627_76e-3,
    1.324_947_380_043_216_445_26e-4,
    -3.960_228_278_775_368_123_20e-6,
];
const PA: [f64; 7] = [
    -2.362_118_560_752_659_440_77e-3,
    4.148_561_186_837_483_316_66e-1,
    -3.722_078_760_357_013_238_47e-1,
    3.183_466_199_011_617_536_74e-1,
    -1.108_946_942_823_966_774_76e-1,
    3.547_830_432_561_823_593_71e-2,
    -2.166_375_594_868_790_843_00e-3,
];
const QA: [f64; 6] = [
    1.064_208_804_008_442_282_86e-1,
    5.403_979_177_021_710_489_37e-1,
    7.182_865_441_419_626_628_68e-2,
    1.261_712_198_087_616_421_12e-1,
    1.363_708_391_202_905_073_62e-2,
    1.198_449_984_679_910_741_70e-2,
];
/// erfc's numerator on [1.25, 1/0.35) (RA) and [1/0.35, 28) (RB, one
/// coefficient shorter: a trailing 0 adds nothing, `c + s * 0 = c`).
const RA: [f64; 8] = [
    -9.864_944_034_847_148_227_05e-3,
    -6.938_585_727_071_817_643_72e-1,
    -1.055_862_622_532_329_098_14e1,
    -6.237_533_245_032_600_603_96e1,
    -1.623_966_694_625_734_703_55e2,
    -1.846_050_929_067_110_359_94e2,
    -8.128_743_550_630_659_342_46e1,
    -9.814_329_344_169_145_485_92,
];
const RB: [f64; 8] = [
    -9.864_942_924_700_099_285_97e-3,
    -7.992_832_376_805_230_065_74e-1,
    -1.775_795_491_775_475_198_89e1,
    -1.606_363_848_558_219_160_62e2,
    -6.375_664_433_683_896_277_22e2,
    -1.025_095_131_611_077_249_54e3,
    -4.835_191_916_086_513_970_19e2,
    0.0,
];
const SA: [f64; 8] = [
    1.965_127_166_743_925_712_92e1,
    1.376_577_541_435_190_426_00e2,
    4.345_658_774_752_292_288_21e2,
    6.453_872_717_332_678_803_36e2,
    4.290_081_400_275_678_333_86e2,
    1.086_350_055_417_794_351_34e2,
    6.570_249_770_319_281_701_35,
    -6.042_441_521_485_809_874_38e-2,
];
const SB: [f64; 8] = [
    3.033_806_074_348_245_829_24e1,
    3.257_925_129_965_739_188_26e2,
    1.536_729_586_084_436_959_94e3,
    3.199_858_219_508_595_539_08e3,
    2.553_050_406_433_164_425_83e3,
    4.745_285_412_069_553_672_15e2,
    -2.244_095_244_658_581_833_62e1,
    0.0,
];

/// `c[0] + s * (c[1] + s * (... + s * c[N-1]))`, fdlibm's order.
#[inline(always)]
fn horner<const N: usize>(s: f64, c: [f64; N]) -> f64 {
    let mut acc = c[N - 1];
    let mut i = N - 1;
    while i > 0 {
        i -= 1;
        acc = c[i] + s * acc;
    }
    acc
}

/// `1 + s * (c[0] + s * (...))`: fdlibm's denominators.
#[inline(always)]
fn one_plus<const N: usize>(s: f64, c: [f64; N]) -> f64 {
    1.0 + s * horner(s, c)
}

/// The error function: `libm::erf`'s bits (fdlibm's s_erf.c: x + x R(x^2)
/// below 0.84375, erf(1) + a rational in |x| - 1 below 1.25, 1 - erfc by
/// exp(-x^2 - 0.5625 + R/S(1/x^2)) / x below 6, then 1).
#[inline(always)]
pub(crate) fn erf(x: f64) -> f64 {
    let ix = high_abs(x);
    let a = x.abs();
    // |x| < 0.84375 (below 2^-28 a form that cannot underflow).
    let z = x * x;
    let y = horner(z, PP) / one_plus(z, QQ);
    let small = if ix < 0x3e30_0000 {
        0.125 * (8.0 * x + EFX8 * x)
    } else {
        x + x * y
    };
    // 0.84375 <= |x| < 1.25: 1 - erfc1.
    let s = a - 1.0;
    let mid = 1.0 - (1.0 - ERX - horner(s, PA) / one_plus(s, QA));
    // 1.25 <= |x| < 6: 1 - erfc2, whose coefficients depend on 1/0.35.
    let s = 1.0 / (a * a);
    let near = ix < 0x4006_db6d;
    let pick = |p: [f64; 8], q: [f64; 8]| -> [f64; 8] {
        let mut c = q;
        let mut i = 0;
        while i < 8 {
            if near {
                c[i] = p[i];
            }
            i += 1;
        }
        c
    };
    let r = horner(s, pick(RA, RB));
    let big_s = one_plus(s, pick(SA, SB));
    let zz = f64::from_bits(a.to_bits() & 0xffff_ffff_0000_0000);
    let far = 1.0 - exp(-zz * zz - 0.5625) * exp((zz - a) * (zz + a) + r / big_s) / a;
    let y = if ix < 0x3ff4_0000 { mid } else { far };
    let y = if ix >= 0x4018_0000 {
        1.0 - f64::from_bits(0x0010_0000_0000_0000)
    } else {
        y
    };
    let signed = if x.is_sign_negative() { -y } else { y };
    let v = if ix < 0x3feb_0000 { small } else { signed };
    if ix >= 0x7ff0_0000 {
        let sign = if x.is_sign_negative() { 1.0 } else { 0.0 };
        1.0 - 2.0 * sign + 1.0 / x
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values around every threshold both functions test, dense sweeps
    /// of each range, and the special values.
    fn arguments() -> Vec<f64> {
        let mut xs = vec![
            0.0,
            -0.0,
            f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
            1e-300,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            709.782_712_893_383_973_096,
            709.782_712_893_384,
            -708.396_418_532_264_106_22,
            -745.133_219_101_941_108_42,
            -745.2,
            -750.0,
            710.0,
            1e10,
            -1e10,
        ];
        // Thresholds on the high word: the last values below and the
        // first above each.
        for hw in [
            0x3e30_0000u64,
            0x3fd6_2e42,
            0x3ff0_a2b2,
            0x3feb_0000,
            0x3ff4_0000,
            0x4006_db6d,
            0x4018_0000,
            0x4086_232b,
        ] {
            for d in [-2i64, -1, 0, 1] {
                let base = ((hw as i64 + d) as u64) << 32;
                for low in [0u64, 1, 0x8000_0000, 0xffff_ffff] {
                    let v = f64::from_bits(base | low);
                    xs.extend([v, -v]);
                }
            }
        }
        // Dense sweeps, ranges by their scale.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        for (lo, hi, n) in [
            (-1e-8, 1e-8, 2_000),
            (-1.0, 1.0, 40_000),
            (-7.0, 7.0, 60_000),
            (-30.0, 30.0, 20_000),
            (-760.0, 720.0, 40_000),
        ] {
            xs.extend((0..n).map(|_| rng.random_range(lo..hi)));
        }
        // Random bit patterns: every exponent.
        xs.extend((0..20_000).map(|_| f64::from_bits(rng.random())));
        xs
    }

    fn same(got: f64, want: f64) -> bool {
        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
    }

    fn check(f: Func, want: fn(f64) -> f64) {
        let xs = arguments();
        // Both compilations: the slice (AVX2 where the CPU has it) and the
        // scalar one, element by element.
        let mut vals = xs.clone();
        map(f, &mut vals);
        for (&x, &got) in xs.iter().zip(&vals) {
            let w = want(x);
            assert!(
                same(got, w),
                "{f:?}({x:e} = {:#x}): {got:e}, libm {w:e}",
                x.to_bits()
            );
            assert!(same(f.at(x), w), "{f:?}({x:e}) scalar");
        }
    }

    #[test]
    fn exp_is_libm_bit_for_bit() {
        check(Func::Exp, libm::exp);
    }

    #[test]
    fn erf_is_libm_bit_for_bit() {
        check(Func::Erf, libm::erf);
    }

    #[test]
    fn sigmoid_is_its_formula_on_libm_exp() {
        check(Func::Sigmoid, |x| 1.0 / (1.0 + libm::exp(-x)));
    }

    #[test]
    fn known_values() {
        assert_eq!(exp(0.0), 1.0);
        // Within an ulp (fdlibm's e is one above the nearest double).
        assert_eq!(exp(1.0).to_bits() - std::f64::consts::E.to_bits(), 1);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp(800.0), f64::INFINITY);
        // The smallest subnormal, 2^-1074, is e^-744.44.
        assert_eq!(exp(-744.4), 5e-324);
        assert!((exp(-700.0) / 9.859_676_543_759_77e-305 - 1.0).abs() < 4e-16);
        assert_eq!(erf(0.0), 0.0);
        assert!(erf(-0.0).is_sign_negative());
        assert_eq!(erf(6.5), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
        // erf(0.5) and erf(2) to 17 digits.
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 2e-16);
        assert!((erf(-2.0) + 0.995_322_265_018_952_7).abs() < 2e-16);
    }
}
