//! `gemm` (the default workload): C = A @ B as a composite pipeline.

use kb_format::Expr;
use kb_sim::kernel::{Block, KernelArgs, ShardArg, TensorArg, Tl, composite};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{gemm_output_dtype, gemm_tolerance, t};

/// `gemm`: C = A @ B as a composite op. A and C are row-sharded over the
/// PEs, B replicated; each PE runs one tiled, double-buffered DMA_READ ->
/// GEMM -> DMA_WRITE pipeline over its rows, reading K `block_k` deep at a
/// time and accumulating in TCM (by default all of K when the tiles fit
/// half the TCM, so any shape whose output tiles fit runs).
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
        name: "block_k",
        default: "auto",
        help: "K depth per read (auto: all of K when the tiles fit half the TCM)",
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
    let bk = args.get("block_k") as u32;
    composite::gemm(tl, ba, bb, bc, bm, bn, bk);
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
        let (bm, bn) = (p.u64("block_m", 1)?, p.u64("block_n", 1)?);
        let block_k = match p.str("block_k") {
            "auto" => {
                let (tbm, tbn) = (
                    bm.min(u32::MAX as u64) as u32,
                    bn.min(u32::MAX as u64) as u32,
                );
                let out = gemm_output_dtype(dtype).size() as u64;
                let tcm = prog.machine().topo.tcm_bytes();
                let kk = k.min(u32::MAX as u64) as u32;
                composite::gemm_block_k(kk, tbm, tbn, dtype.size() as u64, out, tcm) as u64
            }
            _ => p.u64("block_k", 1)?,
        };
        let args = prog
            .args(&[a, b, c])
            .scalar("block_m", bm)
            .scalar("block_n", bn)
            .scalar("block_k", block_k);
        prog.launch("gemm", gemm_kernel, args);
        prog.verify(c, Expr::Matmul(t("a"), t("b")), gemm_tolerance(dtype, k));
        Ok(())
    }
}
