//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1,
//! 2, 3", SC 2011), the counter-based generator behind Triton's
//! `tl.rand(seed, offsets)`: what the `rand` math op computes, shared by
//! kb-sim (which knows a `rand` result in Phase 1 when its offsets are
//! known) and kb-replay, so both produce the same bits.
//!
//! `rand(seed, offset)`: the counter is `(offset, 0, 0, 0)`, the key
//! `(seed mod 2^32, seed >> 32)`; the first output word `x`, read as an
//! i32, is folded to `[0, 2^31)` (`!x` where negative, Triton's
//! `-x - 1`) and scaled in f32 by `4.6566127342e-10` (about 2^-31).

/// The round multipliers.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// The key increments (the golden ratio and sqrt(3) - 1, in 32 bits).
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Triton's scale from a non-negative i32 to [0, 1).
pub const SCALE: f32 = 4.656_612_7e-10;

/// Ten Philox rounds of `ctr` under `key`.
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for _ in 0..10 {
        let p0 = u64::from(M0) * u64::from(ctr[0]);
        let p1 = u64::from(M1) * u64::from(ctr[2]);
        ctr = [
            (p1 >> 32) as u32 ^ ctr[1] ^ key[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ ctr[3] ^ key[1],
            p0 as u32,
        ];
        key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
    }
    ctr
}

/// The 32 random bits `tl.randint(seed, offset)` gives.
pub fn randint(seed: u64, offset: u32) -> u32 {
    philox4x32_10([offset, 0, 0, 0], [seed as u32, (seed >> 32) as u32])[0]
}

/// The uniform f32 `tl.rand(seed, offset)` gives.
pub fn rand(seed: u64, offset: u32) -> f32 {
    let x = randint(seed, offset) as i32;
    let x = if x < 0 { !x } else { x };
    x as f32 * SCALE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors (kat_vectors, philox4x32 10).
    #[test]
    fn known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn scale_is_tritons_constant() {
        assert_eq!(SCALE, "4.6566127342e-10".parse::<f32>().unwrap());
    }

    #[test]
    fn rand_is_in_the_unit_interval_and_spread() {
        let v: Vec<f32> = (0..4096).map(|i| rand(42, i)).collect();
        assert!(v.iter().all(|&x| (0.0..=1.0).contains(&x)));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert_ne!(rand(42, 7), rand(43, 7));
    }
}
