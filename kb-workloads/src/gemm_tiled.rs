//! `gemm_tiled`: C = A @ B with fixed-size, masked tiles and a K loop.

use kb_format::Expr;
use kb_sim::kernel::{KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{gemm_output_dtype, gemm_tolerance, matmul_shard, t};

/// `gemm_tiled`: C = A @ B with A and C row-sharded over the PEs and B
/// replicated; each PE loops over its output tiles and, inside, over K,
/// accumulating with `dot` in place.
#[derive(Debug)]
pub struct GemmTiled;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "256",
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
        default: "64",
        help: "tile rows of A and C",
    },
    ParamSpec {
        name: "block_n",
        default: "64",
        help: "tile columns of B and C",
    },
    ParamSpec {
        name: "block_k",
        default: "64",
        help: "tile depth",
    },
    ParamSpec {
        name: "dtype",
        default: "f16",
        help: "input and output element type",
    },
];

fn gemm_tiled_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let (bm, bn, bk) = (
        args.get("block_m"),
        args.get("block_n"),
        args.get("block_k"),
    );
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    matmul_shard(tl, (a, b, c), (sa, sb, sc), (bm, bn, bk));
}

impl Workload for GemmTiled {
    fn name(&self) -> &str {
        "gemm_tiled"
    }

    fn about(&self) -> &str {
        "C = A @ B: fixed-size tiles with masked edge loads, dot in a K loop, masked stores"
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
        for name in ["block_m", "block_n", "block_k"] {
            args = args.scalar(name, p.u64(name, 1)?);
        }
        prog.launch("gemm_tiled", gemm_tiled_kernel, args);
        prog.verify(c, Expr::Matmul(t("a"), t("b")), gemm_tolerance(dtype, k));
        Ok(())
    }
}
