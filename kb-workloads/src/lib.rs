//! The built-in workloads of `kb-sim`, one module each, written only
//! against kb-sim's public surface ([`kb_sim::kernel`] for kernels,
//! [`kb_sim::workload`] for host programs), as a user's own crate would be.
//!
//! Owns: the workloads' kernels, tensors, launch sequences and reference
//! expressions. Does not own: the simulator, the CLI (kb-sim) or the
//! replay (kb-replay).

mod copy;
mod gather;
mod gemm;
mod gemm_tiled;
mod softmax;
mod vector_add;

pub use copy::Copy;
pub use gather::Gather;
pub use gemm::Gemm;
pub use gemm_tiled::GemmTiled;
pub use softmax::Softmax;
pub use vector_add::VectorAdd;

use kb_format::{Dtype, Expr, Tolerance};
use kb_sim::workload::Workload;

/// Every built-in workload; the first is `kb-sim`'s default.
pub fn all() -> Vec<Box<dyn Workload>> {
    vec![
        Box::new(Gemm),
        Box::new(GemmTiled),
        Box::new(Copy),
        Box::new(VectorAdd),
        Box::new(Softmax),
        Box::new(Gather),
    ]
}

/// A reference to tensor `name`.
fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}

/// The tolerance of a GEMM of depth `k`: an f32 result accumulates
/// rounding error that grows with k (about k x 2^-24 relative for random
/// inputs), so past k = 84 ADR-0020's f32 tolerance of 1e-5 widens to
/// k x 2^-23; other dtypes keep their defaults.
fn gemm_tolerance(dtype: Dtype, k: u64) -> Option<Tolerance> {
    (dtype == Dtype::F32).then(|| {
        let t = (k as f64 * f64::powi(2.0, -23)).max(1e-5);
        Tolerance { rtol: t, atol: t }
    })
}

/// Output dtype of a GEMM: the input dtype for floats (rounded from the
/// f32 accumulator), i32 for integers (exact only in the accumulator).
fn gemm_output_dtype(dtype: Dtype) -> Dtype {
    match kb_sim::kernel::accumulation_dtype(dtype) {
        Dtype::I32 => Dtype::I32,
        _ => dtype,
    }
}
