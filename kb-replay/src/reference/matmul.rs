//! The reference's f64 matmul: `c = a @ b`, blocked for cache and
//! registers, rows on the rayon pool, one fused multiply-add per
//! product in ascending k, so its bits are the plain triple loop's for
//! every thread count and vector width.

/// `c = a @ b` for row-major `a` (m x k), `b` (k x n), `c` (m x n; what it
/// held is overwritten). Every element sums its products in ascending k
/// from zero, each added by one fused multiply-add (`c = a * b + c`, one
/// rounding), as the triple loop of `f64::mul_add` does, so the result is
/// the same bits however the loops are blocked and whichever threads (the
/// current rayon pool) take which rows: the blocking only keeps slices of
/// B in cache while tiles of C run down them. Fused, the products cost
/// half the instructions (measured: the reference of a 2048 x 2048 x 1024
/// GEMM 0.46 -> 0.26 s of CPU). Each row block is zeroed by the thread
/// that computes it: a fresh `vec![0.0; len]` is untouched memory, whose
/// first touch is then a write (the tiles read C first, and a read maps
/// the shared zero page, which the first write copies and flushes from
/// every thread's TLB: measured, 5 % of a reference matmul's samples).
pub(super) fn matmul_into(a: &[f64], b: &[f64], k: usize, n: usize, c: &mut [f64]) {
    use rayon::prelude::*;
    const ROWS: usize = 64;
    if n == 0 {
        return;
    }
    let isa = Isa::best();
    let packed = pack_panels(b, k, n);
    c.par_chunks_mut(ROWS * n)
        .enumerate()
        .for_each(|(blk, block)| {
            block.fill(0.0);
            if k > 0 {
                row_block(isa, a, b, &packed, k, n, blk * ROWS, block);
            }
        });
}

/// The columns of `b` (k x n, row-major) in panels of [`TILE_COLS`], each
/// panel's k rows back to back, so a [`tile`] reads its panel in order;
/// the last `n % TILE_COLS` columns are not packed. Panels are packed on
/// the pool (a 2048 x 2048 B is 32 MiB, first touched here).
fn pack_panels(b: &[f64], k: usize, n: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let panels = n / TILE_COLS;
    let mut out = vec![0.0; panels * k * TILE_COLS];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(k * TILE_COLS)
        .enumerate()
        .for_each(|(jp, panel)| {
            let j0 = jp * TILE_COLS;
            for (p, row) in panel.chunks_exact_mut(TILE_COLS).enumerate() {
                row.copy_from_slice(&b[p * n + j0..p * n + j0 + TILE_COLS]);
            }
        });
    out
}

/// Which vector instructions [`row_block`] runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Base,
    Avx2,
    Avx512,
}

impl Isa {
    fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Base
    }
}

/// The rows `i0..` of `c` that `block` holds, `c += a @ b`, compiled for
/// the baseline, AVX2 + FMA and AVX-512 (wider vectors over j; each
/// element's products still added one at a time in ascending k, each by a
/// fused multiply-add, in software on CPUs without FMA: the same bits in
/// every version).
#[allow(clippy::too_many_arguments)]
fn row_block(
    isa: Isa,
    a: &[f64],
    b: &[f64],
    packed: &[f64],
    k: usize,
    n: usize,
    i0: usize,
    block: &mut [f64],
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        fn avx2(
            a: &[f64],
            b: &[f64],
            packed: &[f64],
            k: usize,
            n: usize,
            i0: usize,
            block: &mut [f64],
        ) {
            row_block_body::<AVX2>(a, b, packed, k, n, i0, block)
        }
        #[target_feature(enable = "avx512f")]
        fn avx512(
            a: &[f64],
            b: &[f64],
            packed: &[f64],
            k: usize,
            n: usize,
            i0: usize,
            block: &mut [f64],
        ) {
            row_block_body::<AVX512>(a, b, packed, k, n, i0, block)
        }
        match isa {
            // SAFETY: a `target_feature` function may be called where the
            // CPU has the feature, which `Isa::best` checked.
            Isa::Avx512 => {
                #[allow(unsafe_code)]
                unsafe {
                    avx512(a, b, packed, k, n, i0, block)
                }
            }
            // SAFETY: as above, for AVX2 and FMA.
            Isa::Avx2 => {
                #[allow(unsafe_code)]
                unsafe {
                    avx2(a, b, packed, k, n, i0, block)
                }
            }
            Isa::Base => row_block_body::<PORTABLE>(a, b, packed, k, n, i0, block),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        row_block_body::<PORTABLE>(a, b, packed, k, n, i0, block)
    }
}

/// Which register tile [`row_block_body`] runs: the portable [`tile`],
/// [`tile_avx2`] (only from `row_block`'s AVX2 + FMA version) or
/// [`tile_avx512`] (only from its AVX-512 version).
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// `TILES`: which register tile runs ([`PORTABLE`], [`AVX2`], [`AVX512`]).
#[inline(always)]
fn row_block_body<const TILES: u8>(
    a: &[f64],
    b: &[f64],
    packed: &[f64],
    k: usize,
    n: usize,
    i0: usize,
    block: &mut [f64],
) {
    let rows = block.len() / n;
    let full = n - n % TILE_COLS;
    // Register tiles of `step` x TILE_COLS elements of C (AVX2: 6 rows,
    // then one tile of 4 if 4 or more rows are left), running down k a
    // DEPTH slice at a time; the rows and columns no tile covers go one
    // row at a time (`row_span`).
    let step = if TILES == AVX2 { AVX2_ROWS } else { TILE_ROWS };
    let big = rows - rows % step;
    let tiled = if TILES == AVX2 && rows - big >= TILE_ROWS {
        big + TILE_ROWS
    } else {
        big
    };
    A_TILES.with_borrow_mut(|a_tiles| {
        if TILES == AVX2 {
            a_tiles.clear();
            a_tiles.resize(tiled * k, 0.0);
            for (t, out) in a_tiles[..big * k]
                .chunks_exact_mut(AVX2_ROWS * k)
                .enumerate()
            {
                interleave::<AVX2_ROWS>(a, k, i0 + t * AVX2_ROWS, out);
            }
            if tiled > big {
                interleave::<TILE_ROWS>(a, k, i0 + big, &mut a_tiles[big * k..]);
            }
        }
        for j0 in (0..full).step_by(TILE_COLS) {
            let panel = &packed[j0 * k..(j0 + TILE_COLS) * k];
            // A slice of DEPTH rows of the panel stays in L1 while the
            // block's tiles run down it; each tile's sums wait in C in
            // between (still in ascending k).
            for p0 in (0..k).step_by(DEPTH) {
                let ps = p0..(p0 + DEPTH).min(k);
                for r in (0..big).step_by(step) {
                    let c = &mut block[r * n..];
                    let ps = ps.clone();
                    #[cfg(target_arch = "x86_64")]
                    match TILES {
                        // SAFETY (all): `TILES` is AVX512 only in
                        // `row_block`'s AVX-512 version, which runs where
                        // `Isa::best` found AVX-512F, and AVX2 only in its
                        // AVX2 version, which runs where it found AVX2 and
                        // FMA.
                        #[allow(unsafe_code)]
                        AVX512 => unsafe { tile_avx512(a, panel, k, n, i0 + r, j0, ps, c) },
                        #[allow(unsafe_code)]
                        AVX2 => unsafe {
                            let at = &a_tiles[r * k..(r + AVX2_ROWS) * k];
                            tile_avx2::<AVX2_ROWS>(at, panel, n, j0, ps, c)
                        },
                        _ => tile(a, panel, k, n, i0 + r, j0, ps, c),
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    tile(a, panel, k, n, i0 + r, j0, ps, c);
                }
                #[cfg(target_arch = "x86_64")]
                if tiled > big {
                    // SAFETY: as above (`tiled > big` only for AVX2).
                    #[allow(unsafe_code)]
                    unsafe {
                        let at = &a_tiles[big * k..tiled * k];
                        tile_avx2::<TILE_ROWS>(at, panel, n, j0, ps, &mut block[big * n..])
                    }
                }
            }
            for r in tiled..rows {
                row_span(a, b, k, n, i0 + r, j0..j0 + TILE_COLS, &mut block[r * n..]);
            }
        }
    });
    if full < n {
        for r in 0..rows {
            row_span(a, b, k, n, i0 + r, full..n, &mut block[r * n..]);
        }
    }
}

thread_local! {
    /// A row block's tiles of A, interleaved for [`tile_avx2`]: kept by
    /// each pool thread for its next block (its pages first touched once).
    static A_TILES: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `i..i + R` of `a` (`k` columns) into `out` (`k x R`): k step `p`'s
/// `R` values side by side, so a tile's strips read its A as one stream.
/// Read in place, a tile's rows of A were R streams k apart, and a
/// block's rows over a depth slice crowded the panel's out of L1.
/// Measured with 6-row tiles against 4-row tiles read in place (2048 x
/// 1024 by 1024 x 2048, seven alternating pairs on two cores): 1.07 x the
/// GFLOP/s (median; 1.01-1.14), best 70.7 against 65.0.
fn interleave<const R: usize>(a: &[f64], k: usize, i: usize, out: &mut [f64]) {
    let out = &mut out[..k * R];
    for r in 0..R {
        let row = &a[(i + r) * k..(i + r + 1) * k];
        for (o, &x) in out[r..].iter_mut().step_by(R).zip(row) {
            *o = x;
        }
    }
}

/// `c[cols] += a[i] @ b[.., cols]` for one row of C (from `c[0]`), one
/// row of B at a time, a fused multiply-add per product in ascending k:
/// the rows and columns no register tile covers.
#[inline(always)]
fn row_span(
    a: &[f64],
    b: &[f64],
    k: usize,
    n: usize,
    i: usize,
    cols: std::ops::Range<usize>,
    c: &mut [f64],
) {
    let crow = &mut c[cols.clone()];
    for (p, &av) in a[i * k..(i + 1) * k].iter().enumerate() {
        let brow = &b[p * n + cols.start..p * n + cols.end];
        for (cv, &bv) in crow.iter_mut().zip(brow) {
            *cv = av.mul_add(bv, *cv);
        }
    }
}

/// Rows and columns of C one tile keeps running: 4 x 32 f64 are 16
/// AVX-512 registers ([`tile_avx512`]); in AVX2 a tile has
/// [`AVX2_ROWS`] rows (a block's last may have 4) and runs as four strips
/// of 8 columns ([`tile_avx2`]); the portable [`tile`] spills them
/// (still ahead of a row at a time, which loads and stores C for every
/// k).
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = 32;
/// Rows of an AVX2 tile: its strips' 6 x 8 running sums are 12 of the 16
/// registers (with A interleaved, 4 x 8 strips ran at 50 and 6 x 8 at
/// 61-62 GFLOP/s on two cores in alternating runs; alike on one).
const AVX2_ROWS: usize = 6;
/// Rows of k a tile runs down at a time: a 64 x 32 slice of a panel is
/// 16 KiB, half an L1 data cache, leaving room for the rows of A (64 and
/// 128 measured alike, within the loaded VM's noise).
const DEPTH: usize = 64;

/// [`tile`] in AVX-512 registers, written out: the compiler kept the
/// portable version's running sums on the stack (measured: a load and a
/// store per product). The same operations in the same order (a fused
/// multiply-add per element and k), so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
fn tile_avx512(
    a: &[f64],
    panel: &[f64],
    k: usize,
    n: usize,
    i: usize,
    j0: usize,
    ps: std::ops::Range<usize>,
    c: &mut [f64],
) {
    use std::arch::x86_64::{
        __m512d, _mm512_fmadd_pd, _mm512_loadu_pd, _mm512_set1_pd, _mm512_storeu_pd,
    };
    const _: () = assert!(TILE_ROWS == 4 && TILE_COLS == 32);
    let a = &a[i * k..(i + TILE_ROWS) * k];
    let panel = &panel[..k * TILE_COLS];
    let c = &mut c[..(TILE_ROWS - 1) * n + j0 + TILE_COLS];
    let load = |x: &[f64]| -> __m512d {
        let x: &[f64; 8] = x.try_into().expect("8 lanes");
        // SAFETY: `x` is 8 f64s, the 64 bytes the unaligned load reads.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_loadu_pd(x.as_ptr())
        }
    };
    let mut acc = [[_mm512_set1_pd(0.0); 4]; TILE_ROWS];
    for (r, row) in acc.iter_mut().enumerate() {
        for (q, v) in row.iter_mut().enumerate() {
            let at = r * n + j0 + q * 8;
            *v = load(&c[at..at + 8]);
        }
    }
    for p in ps {
        let bp = &panel[p * TILE_COLS..(p + 1) * TILE_COLS];
        let b = [
            load(&bp[0..8]),
            load(&bp[8..16]),
            load(&bp[16..24]),
            load(&bp[24..32]),
        ];
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_pd(a[r * k + p]);
            for (v, bq) in row.iter_mut().zip(b) {
                *v = _mm512_fmadd_pd(av, bq, *v);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (q, v) in row.iter().enumerate() {
            let at = r * n + j0 + q * 8;
            let out: &mut [f64; 8] = (&mut c[at..at + 8]).try_into().expect("8 lanes");
            // SAFETY: `out` is 8 f64s, the 64 bytes the unaligned store
            // writes.
            #[allow(unsafe_code)]
            unsafe {
                _mm512_storeu_pd(out.as_mut_ptr(), *v)
            };
        }
    }
}

/// [`tile`] in AVX2 registers for `R` rows, its 32 columns as four
/// strips of 8 ([`strip_avx2`]), A read from the tile's [`interleave`]d
/// rows (`a_tile`, k x R): the portable version's running sums spilled
/// to the stack and its rows of A went through a call per element
/// (measured: the reference of a 2048 x 2048 x 1024 GEMM at 8 GFLOP/s on
/// two cores). The same operations in the same order for every element
/// (a fused multiply-add per k, ascending), so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const R: usize>(
    a_tile: &[f64],
    panel: &[f64],
    n: usize,
    j0: usize,
    ps: std::ops::Range<usize>,
    c: &mut [f64],
) {
    const _: () = assert!(TILE_COLS.is_multiple_of(STRIP));
    let len = ps.len();
    let a_steps = &a_tile[ps.start * R..][..len * R];
    let steps = &panel[ps.start * TILE_COLS..][..len * TILE_COLS];
    let c = &mut c[..(R - 1) * n + j0 + TILE_COLS];
    for q in (0..TILE_COLS).step_by(STRIP) {
        strip_avx2::<R>(a_steps, steps, n, j0, q, c);
    }
}

/// Columns of C a [`strip_avx2`] keeps in registers: 6 x 8 running sums
/// are 12 of the 16 AVX2 registers, with the panel's two vectors and A's
/// broadcast beside them (4 x 12 strips ran slower: 19 against 24-29
/// GFLOP/s on one core, with A read in place).
const STRIP: usize = 8;

/// Columns `q..q + STRIP` of a [`tile_avx2`]: `a_steps` are the tile's R
/// rows of A over its k slice, interleaved (`R` values a step), `steps`
/// the panel's rows over the same slice (`TILE_COLS` apart), `c` the
/// tile's rows of C (`n` apart, from column `j0`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn strip_avx2<const R: usize>(
    a_steps: &[f64],
    steps: &[f64],
    n: usize,
    j0: usize,
    q: usize,
    c: &mut [f64],
) {
    use std::arch::x86_64::{_mm256_fmadd_pd, _mm256_loadu_pd, _mm256_set1_pd, _mm256_storeu_pd};
    const V: usize = STRIP / 4;
    let len = steps.len() / TILE_COLS;
    assert!(q + STRIP <= TILE_COLS && a_steps.len() == len * R);
    assert!(R > 0 && c.len() >= (R - 1) * n + j0 + q + STRIP);
    let mut acc = [[_mm256_set1_pd(0.0); V]; R];
    for (r, row) in acc.iter_mut().enumerate() {
        for (h, v) in row.iter_mut().enumerate() {
            // SAFETY: r < R and h < V, so the 4 lanes at
            // r * n + j0 + q + 4h end within `c` (asserted above).
            #[allow(unsafe_code)]
            unsafe {
                *v = _mm256_loadu_pd(c.as_ptr().add(r * n + j0 + q + h * 4));
            }
        }
    }
    // The loop reads through pointers: with a slice index per element
    // the bounds checks outnumbered the multiply-adds (measured).
    for t in 0..len {
        let mut b = [_mm256_set1_pd(0.0); V];
        for (h, bh) in b.iter_mut().enumerate() {
            // SAFETY: t < len, h < V and q + STRIP <= TILE_COLS, so the 4
            // lanes at t * TILE_COLS + q + 4h end within `steps`
            // (len * TILE_COLS long).
            #[allow(unsafe_code)]
            unsafe {
                *bh = _mm256_loadu_pd(steps.as_ptr().add(t * TILE_COLS + q + h * 4));
            }
        }
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: `a_steps` is len * R long (asserted), t < len, r < R.
            #[allow(unsafe_code)]
            let av = _mm256_set1_pd(unsafe { *a_steps.get_unchecked(t * R + r) });
            for (v, bh) in row.iter_mut().zip(b) {
                *v = _mm256_fmadd_pd(av, bh, *v);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (h, v) in row.iter().enumerate() {
            // SAFETY: as for the loads of `c` above.
            #[allow(unsafe_code)]
            unsafe {
                _mm256_storeu_pd(c.as_mut_ptr().add(r * n + j0 + q + h * 4), *v);
            }
        }
    }
}

/// `c[r][j0..j0 + TILE_COLS] += a[i + r] @ b[.., j0..]` for the
/// [`TILE_ROWS`] rows of C from `c[0]` (`n` apart), row `i` of `a` first,
/// with `panel` those columns of `b` packed ([`pack_panels`]): each
/// element a running sum in registers, its products added in ascending k
/// over `ps`, each by a fused multiply-add.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile(
    a: &[f64],
    panel: &[f64],
    k: usize,
    n: usize,
    i: usize,
    j0: usize,
    ps: std::ops::Range<usize>,
    c: &mut [f64],
) {
    let mut acc = [[0.0f64; TILE_COLS]; TILE_ROWS];
    for r in 0..TILE_ROWS {
        acc[r].copy_from_slice(&c[r * n + j0..r * n + j0 + TILE_COLS]);
    }
    let a = &a[i * k..(i + TILE_ROWS) * k];
    for (p, brow) in panel[ps.start * TILE_COLS..ps.end * TILE_COLS]
        .chunks_exact(TILE_COLS)
        .enumerate()
    {
        let p = ps.start + p;
        let brow: &[f64; TILE_COLS] = brow.try_into().expect("a tile's columns");
        let av: [f64; TILE_ROWS] = std::array::from_fn(|r| a[r * k + p]);
        for r in 0..TILE_ROWS {
            for j in 0..TILE_COLS {
                acc[r][j] = av[r].mul_add(brow[j], acc[r][j]);
            }
        }
    }
    for r in 0..TILE_ROWS {
        c[r * n + j0..r * n + j0 + TILE_COLS].copy_from_slice(&acc[r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_parallel_matmul_is_the_triple_loop_bit_for_bit() {
        // Shapes that cut every block edge (row blocks, register tiles,
        // panels, depth slices), values whose sums round.
        let (m, k, n) = (137, 301, 523);
        let val = |i: usize| ((i * 7919 % 1013) as f64 - 506.0) / 97.0 + 1e-9 * i as f64;
        let a: Vec<f64> = (0..m * k).map(val).collect();
        let b: Vec<f64> = (0..k * n).map(|i| val(i + 17)).collect();
        let mut want = vec![0.0; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    want[i * n + j] = a[i * k + p].mul_add(b[p * n + j], want[i * n + j]);
                }
            }
        }
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut got = vec![0.0; m * n];
            pool.install(|| matmul_into(&a, &b, k, n, &mut got));
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{threads} threads"
            );
        }
        // Every vector width this CPU runs (the `unsafe` calls), on the
        // whole of C as one block.
        let mut isas = vec![Isa::Base];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                isas.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
        }
        for isa in isas {
            let mut got = vec![0.0; m * n];
            row_block(isa, &a, &b, &pack_panels(&b, k, n), k, n, 0, &mut got);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{isa:?}"
            );
        }
        // C's old contents do not count; an empty sum is zero.
        let mut got = vec![7.0; m * n];
        matmul_into(&a, &b, k, n, &mut got);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
        let mut c = vec![1.0; 3];
        matmul_into(&[], &[], 0, 3, &mut c);
        assert_eq!(c, [0.0; 3]);
    }
}
