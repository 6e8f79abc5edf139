//! `gemm_bias_gelu`: C = gelu(A @ B + bias) with the epilogue fused.

use kb_format::Expr;
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{float_dtype, gelu, gelu_expr, matmul_tile, t};

/// `gemm_bias_gelu`: a GEMM whose epilogue (bias add, GELU, cast) runs on
/// the accumulator tile in TCM before the one store, as a fused kernel
/// does. A and C are row-sharded, B and the bias (1 x n) replicated.
#[derive(Debug)]
pub struct GemmBiasGelu;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "256",
        help: "rows of A and C",
    },
    ParamSpec {
        name: "n",
        default: "256",
        help: "columns of B, bias and C",
    },
    ParamSpec {
        name: "k",
        default: "256",
        help: "columns of A, rows of B",
    },
    ParamSpec {
        name: "block_m",
        default: "32",
        help: "tile rows (at most a PE's rows)",
    },
    ParamSpec {
        name: "block_n",
        default: "64",
        help: "tile columns",
    },
    ParamSpec {
        name: "block_k",
        default: "64",
        help: "tile depth",
    },
    ParamSpec {
        name: "dtype",
        default: "f16",
        help: "input and output element type (f32, f16, bf16)",
    },
];

fn gemm_bias_gelu_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let bias = args.tensor("bias");
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    let (m, n) = (sa.rows, sb.row_bytes / b.elem_bytes());
    let bm = args.get("block_m").min(m);
    let (bn, bk) = (args.get("block_n"), args.get("block_k"));
    for j in (0..n).step_by(bn as usize) {
        let tn = bn.min(n - j) as u32;
        // The bias slice, widened once to the accumulator's dtype.
        let bias_tile = tl.load_masked(Block::of(bias, tl.pe(), 0, j, 1, tn), 1, bn as u32, 0.0);
        let bias_acc = tl.cast(&bias_tile, kb_sim::kernel::accumulation_dtype(bias.dtype));
        for i in (0..m).step_by(bm as usize) {
            let tm = bm.min(m - i) as u32;
            let acc = matmul_tile(
                tl,
                (a, sa),
                (b, sb),
                (i, tm),
                (j, tn),
                (bm as u32, bn as u32, bk as u32),
            );
            let biased = tl.add(&acc, &bias_acc);
            let act = gelu(tl, &biased);
            let out = tl.cast(&act, c.dtype);
            tl.store_masked(Block::in_shard(c, sc, i, j, tm, tn), &out);
        }
    }
}

impl Workload for GemmBiasGelu {
    fn name(&self) -> &str {
        "gemm_bias_gelu"
    }

    fn about(&self) -> &str {
        "C = gelu(A @ B + bias): K-looped dot, then bias, GELU and cast fused on the accumulator"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, n, k) = (p.u64("m", 1)?, p.u64("n", 1)?, p.u64("k", 1)?);
        let dtype = float_dtype(p, "dtype")?;
        let a = prog.random("a", dtype, [m, k], Sharding::ROWS)?;
        let b = prog.random("b", dtype, [k, n], Sharding::REPLICATE)?;
        let bias = prog.random("bias", dtype, [1, n], Sharding::REPLICATE)?;
        let c = prog.zeros("c", dtype, [m, n], Sharding::ROWS)?;
        let mut args = prog.args(&[a, b, bias, c]);
        for name in ["block_m", "block_n", "block_k"] {
            args = args.scalar(name, p.u64(name, 1)?);
        }
        prog.launch("gemm_bias_gelu", gemm_bias_gelu_kernel, args);
        let pre = Expr::Add(Box::new(Expr::Matmul(t("a"), t("b"))), t("bias"));
        prog.verify(c, gelu_expr(pre), crate::gemm_tolerance(dtype, k));
        Ok(())
    }
}
