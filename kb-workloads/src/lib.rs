//! The built-in workloads of `kb-sim`, one module each, written only
//! against kb-sim's public surface ([`kb_sim::kernel`] for kernels,
//! [`kb_sim::workload`] for host programs), as a user's own crate would be.
//!
//! Owns: the workloads' kernels, tensors, launch sequences and reference
//! expressions. Does not own: the simulator, the CLI (kb-sim) or the
//! replay (kb-replay).

mod allreduce;
mod atomics;
mod attention;
mod copy;
mod gather;
mod gemm;
mod gemm_bias_gelu;
mod gemm_tiled;
mod layernorm;
mod mlp;
mod rmsnorm;
mod softmax;
mod softmax_nd;
mod tp_mlp;
mod vector_add;

pub use allreduce::AllReduce;
pub use atomics::Atomics;
pub use attention::Attention;
pub use copy::Copy;
pub use gather::Gather;
pub use gemm::Gemm;
pub use gemm_bias_gelu::GemmBiasGelu;
pub use gemm_tiled::GemmTiled;
pub use layernorm::Layernorm;
pub use mlp::Mlp;
pub use rmsnorm::Rmsnorm;
pub use softmax::Softmax;
pub use softmax_nd::SoftmaxNd;
pub use tp_mlp::TpMlp;
pub use vector_add::VectorAdd;

use kb_format::{Dtype, Expr, Tolerance};
use kb_sim::kernel::{Block, LoadHandle, Pending, ShardArg, TensorArg, Tl};
use kb_sim::machine::PeCoord;
use kb_sim::workload::{Params, Program, Workload, WorkloadError};

/// Every built-in workload; the first is `kb-sim`'s default.
pub fn all() -> Vec<Box<dyn Workload>> {
    vec![
        Box::new(Gemm),
        Box::new(GemmTiled),
        Box::new(Copy),
        Box::new(VectorAdd),
        Box::new(Softmax),
        Box::new(Gather),
        Box::new(Layernorm),
        Box::new(GemmBiasGelu),
        Box::new(Attention),
        Box::new(Mlp),
        Box::new(AllReduce),
        Box::new(TpMlp),
        Box::new(Rmsnorm),
        Box::new(SoftmaxNd),
        Box::new(Atomics),
    ]
}

/// The PEs a `group` parameter names, in rank order: `cube` (cube 0 of
/// SIP 0), `sip` (SIP 0), `all`, `cubes` (PE 0 of each cube of SIP 0),
/// `sips` (PE 0 of cube 0 of each SIP).
fn group_of(p: &Params, prog: &Program<'_>, name: &str) -> Result<Vec<PeCoord>, WorkloadError> {
    let pes = prog.pes();
    let v: Vec<PeCoord> = match p.str(name) {
        "cube" => pes
            .into_iter()
            .filter(|q| q.sip == 0 && q.cube == 0)
            .collect(),
        "sip" => pes.into_iter().filter(|q| q.sip == 0).collect(),
        "all" => pes,
        "cubes" => pes
            .into_iter()
            .filter(|q| q.sip == 0 && q.pe == 0)
            .collect(),
        "sips" => pes
            .into_iter()
            .filter(|q| q.cube == 0 && q.pe == 0)
            .collect(),
        other => {
            return Err(p.err(
                name,
                format!("{other:?} is not a group (cube, sip, all, cubes, sips)"),
            ));
        }
    };
    Ok(v)
}

/// The `depth` parameter of a collective workload: slots per channel, or
/// `auto` for [`collective::depth_for`] on this machine and group. The
/// ring passes messages on from their slots and needs at least 3.
pub(crate) fn collective_depth(
    p: &kb_sim::workload::Params,
    prog: &kb_sim::workload::Program<'_>,
    group: &[kb_sim::machine::PeCoord],
    slot_bytes: u64,
    algorithms: &[kb_sim::collective::Algorithm],
) -> Result<u64, kb_sim::workload::WorkloadError> {
    use kb_sim::collective::{self, Algorithm};
    if p.str("depth") == "auto" {
        return Ok(collective::depth_for(prog.machine(), group, slot_bytes, algorithms) as u64);
    }
    let depth = p.u64("depth", 1)?;
    let ring = algorithms.iter().any(|a| {
        matches!(
            a,
            Algorithm::Ring | Algorithm::Hierarchical | Algorithm::Auto
        )
    });
    if ring && depth < 3 {
        return Err(p.err(
            "depth",
            format!("{depth}: the ring passes each message on from its slot and needs at least 3 slots per channel (or auto)"),
        ));
    }
    if depth > u32::MAX as u64 {
        return Err(p.err("depth", format!("{depth}: at most {}", u32::MAX)));
    }
    Ok(depth)
}

/// The tolerance of a sum over `n` members in `dtype`, each partial sum
/// rounded: about n^1.5 units of roundoff in the worst case for inputs in
/// [-1, 1) (integers are exact; below the dtype's default, the default).
fn collective_tolerance(dtype: Dtype, n: u64) -> Option<Tolerance> {
    let u = match dtype {
        Dtype::F32 => f64::powi(2.0, -24),
        Dtype::F16 => f64::powi(2.0, -11),
        Dtype::Bf16 => f64::powi(2.0, -8),
        _ => return None,
    };
    let default = match dtype {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 1e-3,
        _ => 1e-2,
    };
    let t = (u * (n as f64).powf(1.5)).max(default);
    Some(Tolerance { rtol: t, atol: t })
}

/// A float dtype parameter, or an error naming it.
fn float_dtype(p: &Params, name: &str) -> Result<Dtype, WorkloadError> {
    let d = p.dtype(name)?;
    if matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16) {
        Ok(d)
    } else {
        Err(p.err(
            name,
            format!("needs a float dtype (f32, f16, bf16), got {d}"),
        ))
    }
}

/// `gelu(x) = x / 2 * (1 + erf(x / sqrt 2))` as a reference expression.
fn gelu_expr(x: Expr) -> Expr {
    let x = Box::new(x);
    let inner = Expr::Erf(Box::new(Expr::Mul(
        x.clone(),
        Box::new(Expr::Scalar(std::f64::consts::FRAC_1_SQRT_2)),
    )));
    Expr::Mul(
        Box::new(Expr::Mul(x, Box::new(Expr::Scalar(0.5)))),
        Box::new(Expr::Add(Box::new(Expr::Scalar(1.0)), Box::new(inner))),
    )
}

/// `gelu(x)` on pe_math: four elementwise ops and an erf.
fn gelu(tl: &mut Tl<'_>, x: &dyn kb_sim::kernel::Operand) -> Pending {
    let scaled = tl.mul(x, std::f64::consts::FRAC_1_SQRT_2);
    let e = tl.erf(&scaled);
    let one_plus = tl.add(&e, 1.0);
    let half_x = tl.mul(x, 0.5);
    tl.mul(&half_x, &one_plus)
}

/// `c = a @ b` over this PE's shards of `a` and `c` (and its copy of
/// `b`), output tile by output tile, `bm` x `bn` with a K loop `bk` deep;
/// each accumulator is cast to `c`'s dtype if needed and stored masked.
fn matmul_shard(
    tl: &mut Tl<'_>,
    (a, b, c): (&TensorArg, &TensorArg, &TensorArg),
    (sa, sb, sc): (&ShardArg, &ShardArg, &ShardArg),
    (bm, bn, bk): (u64, u64, u64),
) {
    let (m, n) = (sa.rows, sb.row_bytes / b.elem_bytes());
    for i in (0..m).step_by(bm as usize) {
        let tm = bm.min(m - i) as u32;
        for j in (0..n).step_by(bn as usize) {
            let tn = bn.min(n - j) as u32;
            let acc = matmul_tile(
                tl,
                (a, sa),
                (b, sb),
                (i, tm),
                (j, tn),
                (bm as u32, bn as u32, bk as u32),
            );
            let out = Block::in_shard(c, sc, i, j, tm, tn);
            if acc.dtype() == c.dtype {
                tl.store_masked(out, &acc);
            } else {
                let narrow = tl.cast(&acc, c.dtype);
                tl.store_masked(out, &narrow);
            }
        }
    }
}

/// One output tile of `a @ b` over a PE's shards: rows `[i, i+tm)` of
/// `a`'s shard against columns `[j, j+tn)` of `b`'s, K in steps of `bk`.
/// Tiles are fixed `bm` x `bk` and `bk` x `bn`; edge tiles are masked and
/// padded with zeros, which add nothing. Returns the `bm` x `bn`
/// accumulator (f32 for float inputs, i32 for integer ones).
///
/// Software-pipelined as a Triton kernel with `num_stages=3` is: the
/// full tiles of the next two K steps are loading (asynchronously) while
/// this step's dot runs, when the PE's TCM has room for the three stages;
/// edge tiles are loaded masked when they are needed.
#[allow(clippy::too_many_arguments)]
fn matmul_tile(
    tl: &mut Tl<'_>,
    (a, sa): (&TensorArg, &ShardArg),
    (b, sb): (&TensorArg, &ShardArg),
    (i, tm): (u64, u32),
    (j, tn): (u64, u32),
    (bm, bn, bk): (u32, u32, u32),
) -> Pending {
    let k = sa.row_bytes / a.elem_bytes();
    // The stages' operand tiles, the accumulator and a narrowed copy of it.
    let operands = (bm as u64 * bk as u64 + bk as u64 * bn as u64) * a.elem_bytes();
    let acc_bytes = bm as u64 * bn as u64 * 4;
    let pipelined = tl.tcm_available() >= STAGES as u64 * operands + 2 * acc_bytes;
    let step = |tl: &mut Tl<'_>, kk: u64| {
        let tk = (bk as u64).min(k - kk) as u32;
        let (ba, bb) = (
            Block::in_shard(a, sa, i, kk, tm, tk),
            Block::in_shard(b, sb, kk, j, tk, tn),
        );
        if pipelined && (tm, tn, tk) == (bm, bn, bk) {
            Stage::Loading(tl.load_async(ba), tl.load_async(bb))
        } else {
            Stage::Masked(ba, bb)
        }
    };
    let mut acc = None;
    let mut ahead = std::collections::VecDeque::with_capacity(STAGES);
    let mut kk = 0;
    while kk < k && ahead.len() < STAGES - 1 {
        ahead.push_back(step(tl, kk));
        kk += bk as u64;
    }
    while let Some(stage) = ahead.pop_front() {
        let (ta, tb) = match stage {
            Stage::Loading(ha, hb) => (tl.wait(ha), tl.wait(hb)),
            Stage::Masked(ba, bb) => (
                tl.load_masked(ba, bm, bk, 0.0),
                tl.load_masked(bb, bk, bn, 0.0),
            ),
        };
        if kk < k {
            ahead.push_back(step(tl, kk));
            kk += bk as u64;
        }
        acc = Some(tl.dot(&ta, &tb, acc));
    }
    acc.expect("k >= 1")
}

/// K steps in flight in [`matmul_tile`]: this one and two loading.
const STAGES: usize = 3;

/// One K step's operand tiles: loading, or to be loaded masked.
enum Stage {
    Loading(LoadHandle, LoadHandle),
    Masked(Block, Block),
}

/// A reference to tensor `name`.
fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}

/// The tolerance of a GEMM of depth `k`: an f32 result accumulates
/// rounding error that grows with k (about k x 2^-24 relative for random
/// inputs), so past k = 84 the f32 default tolerance (docs/design.md P7) of 1e-5 widens to
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
