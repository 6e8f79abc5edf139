//! The default backend: the pure-Rust `gemm` crate.
//!
//! The crate's entry point takes raw pointers and strides, so this module
//! uses `unsafe` (as do the OpenBLAS calls and the data plane's TCM
//! regions): one call per dtype, after [`Dims::check`] has checked every
//! slice length. It is here because it
//! matters: on the shapes kb-sim's kernels use (8x64x64 to 256^3) the crate
//! runs 1.2-2x faster than the safe alternatives measured (ndarray's
//! `matrixmultiply`, `faer`); see BENCHMARKS.md.
//!
//! Threads: `Parallelism::Rayon(0)` uses the pool the call runs in; the
//! crate splits only the m and n loops across threads (never k) and picks
//! its blocking from the shape and the cache sizes alone, so the bits do
//! not depend on the thread count (tested in `backend::tests`). A batch
//! runs its items on the pool, each single-threaded when there are at
//! least as many items as threads; `*_one_thread` is `Parallelism::None`.
#![allow(unsafe_code)]

use gemm::Parallelism;
use rayon::prelude::*;

use super::{Dims, GemmArgs, GemmBackend, MatMut, MatRef};

/// The `gemm` crate; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct GemmCrate;

/// `c += a . b` through `gemm::gemm` for any element type the crate has.
fn call<T: 'static + Copy + Send + Sync + num_one::One>(
    d: Dims,
    a: &[T],
    b: &[T],
    c: &mut [T],
    par: Parallelism,
) {
    d.check(a, b, c);
    if d.m == 0 || d.n == 0 || d.k == 0 {
        return;
    }
    tune();
    // Strides in elements; the lengths are at most isize::MAX bytes (they
    // are slices), so these fit.
    let (k, n) = (d.k as isize, d.n as isize);
    // SAFETY: `check` proved a.len() == m*k, b.len() == k*n and
    // c.len() == m*n. With column stride 1 and row strides k, n and n, the
    // crate touches a[i*k + p], b[p*n + j] and c[i*n + j] for i < m, p < k,
    // j < n: all in bounds. `c` is a unique borrow, so it does not alias
    // `a` or `b`, and no other thread can touch it during the call; the
    // crate reads `c` (read_dst = true) before writing it.
    unsafe {
        gemm::gemm(
            d.m,
            d.n,
            d.k,
            c.as_mut_ptr(),
            1,
            n,
            true,
            a.as_ptr(),
            1,
            k,
            b.as_ptr(),
            1,
            n,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// `c += a . b` on strided f32 views: the crate reads the rows where they
/// lie. Only for m and n of at least 2: the crate picks its kernel from
/// the strides for vectors (m or n of 1), and the dense call's strides
/// would pick another, so those go through dense buffers (the same bits).
/// For larger shapes the bits are the dense call's (tested).
fn call_view(
    d: Dims,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    mut c: MatMut<'_, f32>,
    par: Parallelism,
) {
    d.check_views(&a, &b, &c);

    if d.m == 0 || d.n == 0 || d.k == 0 {
        return;
    }
    tune();
    let (ars, brs, crs) = (
        a.stride() as isize,
        b.stride() as isize,
        c.stride() as isize,
    );
    // SAFETY: `MatRef::new`/`MatMut::new` proved each slice runs from the
    // matrix's first element to its last: element (i, j) is at
    // i * stride + j < len for i < rows, j < cols, and `check_views` that
    // the rows and columns are the dims' (a: m x k, b: k x n, c: m x n).
    // Column strides are 1. `c` is a unique borrow (no aliasing with `a`
    // or `b`, no other writer during the call); its rows do not overlap
    // (stride >= cols). The crate reads `c` before writing it.
    unsafe {
        gemm::gemm(
            d.m,
            d.n,
            d.k,
            c.data_mut().as_mut_ptr(),
            1,
            crs,
            true,
            a.data().as_ptr(),
            1,
            ars,
            b.data().as_ptr(),
            1,
            brs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

/// The crate packs its left operand (here `b`: it computes `c^T = b^T
/// a^T` for row-major `c`) for every single-threaded call whose other
/// side is wider than 8 x 6 columns: a copy of the whole tile per call,
/// although a dense 64-column tile already lies as a packed panel
/// (profile of gemm_tiled 2048^3 at its default 64^3 tiles: 7 % of all
/// CPU time in packing). Packing only from 11 x 6 = 66 columns on leaves
/// such tiles as they are; wider ones are packed as before. Which operand
/// is packed never changes a bit (the kernels read the same values in the
/// same order).
const LHS_PACKING_THRESHOLD_SINGLE_THREAD: usize = 11;

fn tune() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        gemm::set_lhs_packing_threshold_single_thread(LHS_PACKING_THRESHOLD_SINGLE_THREAD);
    });
}

/// The value one in the element types this backend calls the crate with.
mod num_one {
    pub trait One {
        const ONE: Self;
    }
    impl One for f32 {
        const ONE: f32 = 1.0;
    }
    impl One for f64 {
        const ONE: f64 = 1.0;
    }
}

impl GemmBackend for GemmCrate {
    fn name(&self) -> &'static str {
        "gemm"
    }

    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        call(d, a, b, c, Parallelism::Rayon(0));
    }

    fn gemm_f64(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]) {
        call(d, a, b, c, Parallelism::Rayon(0));
    }

    fn gemm_f32_one_thread(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        call(d, a, b, c, Parallelism::None);
    }

    fn gemm_f64_one_thread(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]) {
        call(d, a, b, c, Parallelism::None);
    }

    fn gemm_f32_view(
        &self,
        d: Dims,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        c: MatMut<'_, f32>,
        share_pool: bool,
    ) {
        let par = if share_pool {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        if d.m >= 2 && d.n >= 2 && b.is_dense() {
            call_view(d, a, b, c, par);
        } else if d.m >= 2 && d.n >= 2 {
            // The crate reads `b` in its kernels' inner loop, row after
            // row, unpacked for the shapes tiles have: rows far apart (a
            // tile of a wide matrix) then miss the cache at every step
            // (measured: half the speed). Its rows back to back first.
            let mut db = crate::pool::F32.take(d.k * d.n);
            b.to_dense(&mut db);
            let bd = MatRef::dense(&db, d.k, d.n).expect("sized");
            call_view(d, a, bd, c, par);
            crate::pool::F32.give(db);
        } else {
            // Vectors: dense buffers (see `call_view`).
            let (mut da, mut db) = (Vec::new(), Vec::new());
            a.to_dense(&mut da);
            b.to_dense(&mut db);
            let mut c = c;
            let mut dc = Vec::with_capacity(d.m * d.n);
            for i in 0..c.rows() {
                dc.extend_from_slice(c.row_mut(i));
            }
            call(d, &da, &db, &mut dc, par);
            for i in 0..c.rows() {
                c.row_mut(i).copy_from_slice(&dc[i * d.n..(i + 1) * d.n]);
            }
        }
    }

    fn gemm_f32_batch(&self, d: Dims, batch: &mut [GemmArgs<'_, f32>]) {
        let par = inner(batch.len());
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| call(d, g.a, g.b, g.c, par));
    }

    fn gemm_f64_batch(&self, d: Dims, batch: &mut [GemmArgs<'_, f64>]) {
        let par = inner(batch.len());
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| call(d, g.a, g.b, g.c, par));
    }
}

/// Threads inside each call of a batch: none when the batch alone has an
/// item for every thread (nesting only adds overhead), else the pool's.
/// Either gives the same bits.
fn inner(items: usize) -> Parallelism {
    if items >= rayon::current_num_threads() {
        Parallelism::None
    } else {
        Parallelism::Rayon(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::values;
    use crate::backend::{Dims, GemmBackend};

    /// The threshold decides only whether the crate copies an operand
    /// into a panel before its kernels read it: the bits must not move,
    /// for tiles on either side of it (here set to both values in turn;
    /// other tests running meanwhile get the same bits either way).
    #[test]
    fn lhs_packing_never_changes_a_bit() {
        for &(m, k, n) in &[
            (64, 64, 64),
            (64, 64, 48),
            (40, 96, 64),
            (64, 32, 128),
            (17, 64, 66),
        ] {
            let d = Dims { m, k, n };
            let (a, b, c0) = (values(m * k, 1), values(k * n, 2), values(m * n, 3));
            let run = |threshold: usize| {
                tune();
                gemm::set_lhs_packing_threshold_single_thread(threshold);
                let mut c = c0.clone();
                GemmCrate.gemm_f32_one_thread(d, &a, &b, &mut c);
                gemm::set_lhs_packing_threshold_single_thread(LHS_PACKING_THRESHOLD_SINGLE_THREAD);
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            // 1: packs every operand; 64: packs none of these.
            assert_eq!(run(1), run(64), "{m}x{k}x{n}");
            assert_eq!(
                run(gemm::DEFAULT_LHS_PACKING_THRESHOLD_SINGLE_THREAD),
                run(64)
            );
        }
    }
}
