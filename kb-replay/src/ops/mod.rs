//! Op execution, separate from the data plane: each op is a pure function
//! from the bytes its read ranges hold (concatenated in order) to the bytes
//! its write ranges receive. The engine gathers, calls, and scatters; GEMMs
//! can also run in batches ([`gemm::prepare`], [`gemm::compute_batch`],
//! [`gemm::finish`]) with the same bits as one by one.

pub mod fmath;
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
    /// A sync op (nothing to do), or an op kind this build does not
    /// know: skipped.
    Skip,
}

/// Work out what a record needs; an error names what is inconsistent.
/// The bytes its read and write ranges cover must be what its params say
/// it moves or computes on: a trace is distrusted even when its checksums
/// hold, so a forged range cannot make replay allocate for bytes the op
/// does not have.
pub fn plan(r: &Record) -> Result<Plan, String> {
    let plan = plan_params(r)?;
    let covered = |e: &Option<kb_format::Effect>| {
        e.as_ref().map(|e| {
            e.ranges
                .iter()
                .fold(0u64, |a, x| a.saturating_add(x.bytes()))
        })
    };
    let (read_want, write_want) = match (plan, &r.params) {
        (Plan::Compute { input, output }, _) => (input, output),
        (Plan::Move, Params::Memory(p)) => (p.nbytes(), p.nbytes()),
        _ => return Ok(plan),
    };
    for (side, got, want) in [
        ("read", covered(&r.read), read_want),
        ("write", covered(&r.write), write_want),
    ] {
        if let Some(got) = got
            && got != want
        {
            return Err(format!(
                "its {side} ranges cover {got} bytes, but its params say {want}"
            ));
        }
    }
    Ok(plan)
}

fn plan_params(r: &Record) -> Result<Plan, String> {
    let overflow = || "operand sizes overflow".to_string();
    match (r.kind, &r.params) {
        (OpKind::Memory, _) => Ok(Plan::Move),
        (OpKind::Unknown(_), _) => Ok(Plan::Skip),
        // Synchronization on record: timing only, no data to move.
        (OpKind::Sync, _) if r.read.is_none() && r.write.is_none() => Ok(Plan::Skip),
        (OpKind::Sync, _) => Err("a sync op has data effects (sync ops have none)".into()),
        (OpKind::Gemm, Params::Gemm(p)) => Ok(Plan::Compute {
            input: gemm::input_len(p).ok_or_else(overflow)?,
            output: gemm::output_len(p).ok_or_else(overflow)?,
        }),
        (OpKind::Math, Params::Math(p)) => Ok(Plan::Compute {
            input: math::input_len(p).ok_or_else(overflow)?,
            output: math::output_len(p).ok_or_else(overflow)?,
        }),
        // An atomic is a pure function too: values, mask and the target's
        // old bytes in; the target's new bytes and the old ones out. Replay
        // applies atomics on the same bytes in `seq` order, Phase 1's.
        (OpKind::Atomic, Params::Atomic(p)) => Ok(Plan::Compute {
            input: p.input_len().ok_or_else(overflow)?,
            output: p.output_len().ok_or_else(overflow)?,
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
        Params::Atomic(p) => p.apply(input),
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

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::{Addr, Dtype, Effect, Extent, MathInput, MathOp, MathParams, Space};

    /// A 16 x 64 f32 exp reading and writing TCM, with the given read range.
    fn exp_reading(read: Extent) -> Record {
        let tcm = |addr| Addr {
            space: Space::Tcm,
            addr,
        };
        let effect = |x| Effect {
            time: 0,
            seq: 0,
            ranges: vec![x],
        };
        Record {
            kind: OpKind::Math,
            params: Params::Math(MathParams {
                op: MathOp::Exp,
                inputs: vec![MathInput::Tile {
                    addr: tcm(0),
                    rows: 16,
                    cols: 64,
                    dtype: Dtype::F32,
                }],
                out: tcm(4096),
                rows: 16,
                cols: 64,
                dtype: Dtype::F32,
                axis: None,
            }),
            read: Some(effect(read)),
            write: Some(effect(Extent::contiguous(4096, 4096))),
            ..Record::default()
        }
    }

    #[test]
    fn ranges_must_cover_what_the_params_say() {
        let ok = exp_reading(Extent::contiguous(0, 4096));
        assert_eq!(
            plan(&ok),
            Ok(Plan::Compute {
                input: 4096,
                output: 4096
            })
        );
        // The forged range of the hardening report: 12,582,911 bytes x 1,024 rows.
        let forged = exp_reading(Extent {
            pa: 0,
            len: 12_582_911,
            rows: 1024,
            stride: 12_582_912,
        });
        let e = plan(&forged).unwrap_err();
        assert!(
            e.contains("read ranges cover 12884900864 bytes, but its params say 4096"),
            "{e}"
        );
        let mut short_write = ok.clone();
        short_write.write.as_mut().unwrap().ranges[0].len = 100;
        assert!(
            plan(&short_write)
                .unwrap_err()
                .contains("write ranges cover 100")
        );
    }

    #[test]
    fn a_sync_record_is_skipped_and_may_not_touch_memory() {
        let sync = Record {
            kind: OpKind::Sync,
            ..Record::default()
        };
        assert_eq!(plan(&sync), Ok(Plan::Skip));
        // A forged sync record with an effect is not skipped silently.
        let mut forged = exp_reading(Extent::contiguous(0, 4096));
        forged.kind = OpKind::Sync;
        forged.params = Params::None;
        assert!(
            plan(&forged)
                .unwrap_err()
                .contains("sync op has data effects")
        );
    }
}
