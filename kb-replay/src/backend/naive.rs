//! The reference backend: straightforward loops (i, p, j order), summing k
//! in increasing order. Slow; the tests compare the others with it.

use super::{Dims, GemmBackend};

/// Plain loops; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct NaiveGemm;

/// `c[i][j] = madd(c[i][j], a[i][p], b[p][j])` for p in increasing order.
fn gemm_with<T: Copy>(d: Dims, a: &[T], b: &[T], c: &mut [T], madd: impl Fn(T, T, T) -> T) {
    d.check(a, b, c);
    if d.n == 0 {
        return;
    }
    for (i, crow) in c.chunks_exact_mut(d.n).enumerate() {
        for p in 0..d.k {
            let av = a[i * d.k + p];
            let brow = &b[p * d.n..(p + 1) * d.n];
            for (cv, &bv) in crow.iter_mut().zip(brow) {
                *cv = madd(*cv, av, bv);
            }
        }
    }
}

fn gemm_float<T>(d: Dims, a: &[T], b: &[T], c: &mut [T])
where
    T: Copy + std::ops::Mul<Output = T> + std::ops::Add<Output = T>,
{
    gemm_with(d, a, b, c, |c, a, b| c + a * b);
}

/// Wrapping i32 `c += a . b` (also the default of [`GemmBackend::gemm_i32`]).
pub fn gemm_i32(d: Dims, a: &[i32], b: &[i32], c: &mut [i32]) {
    gemm_with(d, a, b, c, |c, a, b| c.wrapping_add(a.wrapping_mul(b)));
}

impl GemmBackend for NaiveGemm {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        gemm_float(d, a, b, c);
    }

    fn gemm_f64(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]) {
        gemm_float(d, a, b, c);
    }
}
