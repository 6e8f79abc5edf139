//! `gemm` (the default workload): C = A @ B as a composite pipeline.

use kb_format::Expr;
use kb_sim::kernel::{Block, KernelArgs, ShardArg, TensorArg, Tl, composite};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{gemm_output_dtype, gemm_tolerance, t};

/// `gemm`: C = A @ B as a composite op. A and C are row-sharded over the
/// PEs, B replicated; each PE runs one tiled, double-buffered DMA_READ ->
/// GEMM -> DMA_WRITE pipeline over its rows.
#[derive(Debug)]
pub struct Gemm;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "512",
        help: "rows of A and C",
    },
    ParamSpec {
        name: "n",
        default: "256",
        help: "columns of B and C",
    },
    ParamSpec {
        name: "k",
        default: "256",
        help: "columns of A, rows of B",
    },
    ParamSpec {
        name: "block_m",
        default: "32",
        help: "output tile rows per token",
    },
    ParamSpec {
        name: "block_n",
        default: "64",
        help: "output tile columns per token",
    },
    ParamSpec {
        name: "dtype",
        default: "f16",
        help: "input element type (the output is i32 for integer inputs)",
    },
];

fn gemm_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    let whole = |t: &TensorArg, s: &ShardArg| {
        Block::in_shard(
            t,
            s,
            0,
            0,
            s.rows as u32,
            (s.row_bytes / t.elem_bytes()) as u32,
        )
    };
    let (ba, bb, bc) = (whole(a, sa), whole(b, sb), whole(c, sc));
    let (bm, bn) = (args.get("block_m") as u32, args.get("block_n") as u32);
    composite::gemm(tl, ba, bb, bc, bm, bn);
}

impl Workload for Gemm {
    fn name(&self) -> &str {
        "gemm"
    }

    fn about(&self) -> &str {
        "C = A @ B as a composite pipeline (TileToken stages), A and C row-sharded over PEs"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, n, k) = (p.u64("m", 1)?, p.u64("n", 1)?, p.u64("k", 1)?);
        let dtype = p.dtype("dtype")?;
        let a = prog.random("a", dtype, [m, k], Sharding::ROWS)?;
        let b = prog.random("b", dtype, [k, n], Sharding::REPLICATE)?;
        // Integer products are exact only in the i32 accumulator.
        let c = prog.zeros("c", gemm_output_dtype(dtype), [m, n], Sharding::ROWS)?;
        let mut args = prog.args(&[a, b, c]);
        for name in ["block_m", "block_n"] {
            args = args.scalar(name, p.u64(name, 1)?);
        }
        prog.launch("gemm", gemm_kernel, args);
        prog.verify(c, Expr::Matmul(t("a"), t("b")), gemm_tolerance(dtype, k));
        Ok(())
    }
}
