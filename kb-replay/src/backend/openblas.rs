//! The `openblas` feature's backend: the system OpenBLAS through CBLAS
//! (Debian: `apt-get install libopenblas-dev`), declared by `cblas-sys`
//! and linked as `-lopenblas`. (`openblas-src` with its `system` feature
//! would do the linking too, but its build script needs a TLS stack for
//! downloads it never makes here.)
//!
//! OpenBLAS's own threads are turned off (`openblas_set_num_threads(1)`):
//! the engine already runs independent GEMMs on its rayon pool, and
//! OpenBLAS threads under that would oversubscribe the cores. A large
//! multiply is split into blocks of [`ROWS`] rows of `c` that run on the
//! pool, each a single-threaded `cblas_?gemm`. The split depends only on
//! the shape, so the bits never depend on the thread count.
//!
//! FFI calls are `unsafe`; each checks the slice lengths first.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Once;

use cblas_sys::{CblasNoTrans, CblasRowMajor, cblas_dgemm, cblas_sgemm};
use rayon::prelude::*;

use super::{Dims, GemmBackend, GemmCrate};

// Links the library; cblas-sys's cblas_* symbols come from it too.
#[link(name = "openblas")]
unsafe extern "C" {
    fn openblas_set_num_threads(n: c_int);
}

/// Rows of `c` per parallel block of a large multiply.
pub const ROWS: usize = 256;
/// Multiplies with at least this many multiply-adds (m*n*k) are split.
pub const SPLIT_WORK: usize = 1 << 22;

/// System OpenBLAS; see the module docs.
#[derive(Debug)]
pub struct OpenBlas(());

impl OpenBlas {
    pub fn new() -> OpenBlas {
        static SINGLE: Once = Once::new();
        // SAFETY: sets a global in the library; no pointers involved.
        SINGLE.call_once(|| unsafe { openblas_set_num_threads(1) });
        OpenBlas(())
    }
}

impl Default for OpenBlas {
    fn default() -> Self {
        OpenBlas::new()
    }
}

fn fits(d: Dims) -> bool {
    [d.m, d.n, d.k].iter().all(|&x| c_int::try_from(x).is_ok())
}

/// Split `c` into fixed row blocks when the multiply is large, and run
/// `one` on each (in parallel) or on the whole.
fn split<T: Send + Sync>(
    d: Dims,
    a: &[T],
    b: &[T],
    c: &mut [T],
    one: impl Fn(Dims, &[T], &[T], &mut [T]) + Sync,
) {
    let work = d.m.saturating_mul(d.n).saturating_mul(d.k);
    if work < SPLIT_WORK || d.m < 2 * ROWS {
        return one(d, a, b, c);
    }
    c.par_chunks_mut(ROWS * d.n)
        .zip(a.par_chunks(ROWS * d.k))
        .with_max_len(1)
        .for_each(|(cb, ab)| {
            one(
                Dims {
                    m: cb.len() / d.n,
                    ..d
                },
                ab,
                b,
                cb,
            )
        });
}

impl GemmBackend for OpenBlas {
    fn name(&self) -> &'static str {
        "openblas"
    }

    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        d.check(a, b, c);
        if d.m == 0 || d.n == 0 || d.k == 0 {
            return;
        }
        if !fits(d) {
            return GemmCrate.gemm_f32(d, a, b, c);
        }
        split(d, a, b, c, |d, a, b, c| {
            // SAFETY: lengths checked above (a block keeps them: m rows of
            // a, b whole, m rows of c); row-major with leading dimensions
            // k, n, n, all fitting c_int; `c` is a unique borrow.
            unsafe {
                cblas_sgemm(
                    CblasRowMajor,
                    CblasNoTrans,
                    CblasNoTrans,
                    d.m as c_int,
                    d.n as c_int,
                    d.k as c_int,
                    1.0,
                    a.as_ptr(),
                    d.k as c_int,
                    b.as_ptr(),
                    d.n as c_int,
                    1.0,
                    c.as_mut_ptr(),
                    d.n as c_int,
                )
            }
        });
    }

    fn gemm_f64(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]) {
        d.check(a, b, c);
        if d.m == 0 || d.n == 0 || d.k == 0 {
            return;
        }
        if !fits(d) {
            return GemmCrate.gemm_f64(d, a, b, c);
        }
        split(d, a, b, c, |d, a, b, c| {
            // SAFETY: as in gemm_f32.
            unsafe {
                cblas_dgemm(
                    CblasRowMajor,
                    CblasNoTrans,
                    CblasNoTrans,
                    d.m as c_int,
                    d.n as c_int,
                    d.k as c_int,
                    1.0,
                    a.as_ptr(),
                    d.k as c_int,
                    b.as_ptr(),
                    d.n as c_int,
                    1.0,
                    c.as_mut_ptr(),
                    d.n as c_int,
                )
            }
        });
    }
}
