//! Op execution, separate from the data plane: each op is a pure function
//! from the bytes its read ranges hold (concatenated in order) to the bytes
//! its write ranges receive. The engine gathers, calls, and scatters; GEMMs
//! can also run in batches ([`gemm::prepare`], [`gemm::compute_batch`],
//! [`gemm::finish`]) with the same bits as one by one.

pub mod gemm;
pub mod math;

use kb_format::{OpKind, Params, Record};

pub use crate::backend::{Dims, GemmBackend, GemmCrate, NaiveGemm};

/// What a record's op needs and gives, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Memory op: the read bytes are written unchanged.
    Move,
    /// Compute op with these operand and output sizes.
    Compute { input: u64, output: u64 },
    /// An op kind this build does not know: skipped.
    Skip,
}

/// Work out what a record needs; an error names what is inconsistent.
pub fn plan(r: &Record) -> Result<Plan, String> {
    let overflow = || "operand sizes overflow".to_string();
    match (r.kind, &r.params) {
        (OpKind::Memory, _) => Ok(Plan::Move),
        (OpKind::Unknown(_), _) => Ok(Plan::Skip),
        (OpKind::Gemm, Params::Gemm(p)) => Ok(Plan::Compute {
            input: gemm::input_len(p).ok_or_else(overflow)?,
            output: gemm::output_len(p).ok_or_else(overflow)?,
        }),
        (OpKind::Math, Params::Math(p)) => Ok(Plan::Compute {
            input: math::input_len(p).ok_or_else(overflow)?,
            output: math::output_len(p).ok_or_else(overflow)?,
        }),
        (kind, _) => Err(format!(
            "a {} op without {} params",
            kind.name(),
            kind.name()
        )),
    }
}

/// Run a compute op (gemm or math) on its operand bytes.
pub fn compute(r: &Record, input: &[u8], backend: &dyn GemmBackend) -> Result<Vec<u8>, String> {
    match &r.params {
        Params::Gemm(p) => gemm::execute(p, input, backend),
        Params::Math(p) => math::execute(p, input),
        _ => Err(format!("{} op has no compute params", r.kind.name())),
    }
}

/// Floating-point operations a record performs (2mnk for gemm, else 0).
pub fn flops(r: &Record) -> u64 {
    match &r.params {
        Params::Gemm(p) if r.kind == OpKind::Gemm => gemm::flops(p),
        _ => 0,
    }
}
