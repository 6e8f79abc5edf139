//! `rmsnorm`: y = x * rsqrt(mean(x^2) + eps) * w per row, written the
//! Triton way: a 1-D grid of row blocks in tensor coordinates.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Operand, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::t;

/// `rmsnorm` over the last axis. `grid` (the default, but under LA):
/// program `i` of a
/// 1-D grid of `ceil(rows / block_rows)` programs over every PE
/// normalises tensor rows `[i * block_rows, ...)` wherever they live,
/// with `Block::of` in tensor coordinates (a block that spans shards or
/// lies in another PE's HBM is one DMA per part). `local`: each PE walks
/// its own shard's row blocks (`TensorArg::row_blocks`), every DMA local
/// (the default under LA, where a PE cannot address another's shard).
/// `w` (1 x cols) is replicated.
#[derive(Debug)]
pub struct Rmsnorm;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "300",
        help: "rows of x (normalised independently)",
    },
    ParamSpec {
        name: "cols",
        default: "700",
        help: "columns of x (the normalised axis)",
    },
    ParamSpec {
        name: "block_rows",
        default: "64",
        help: "rows per program (grid) or per block (local)",
    },
    ParamSpec {
        name: "eps",
        default: "1e-6",
        help: "added to the mean square",
    },
    ParamSpec {
        name: "mode",
        default: "auto",
        help: "grid (row blocks in tensor coordinates over a 1-D grid), local (each PE its own shard's row blocks), or auto (grid where a PE can address other PEs' shards, local under LA)",
    },
];

/// One block of rows: load x's rows `r0..r0+n`, normalise, store y's.
fn rms_block(tl: &mut Tl<'_>, args: &KernelArgs, r0: u64, n: u32, w: &dyn Operand) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let eps = args.get_f64("eps");
    let (pe, cols) = (tl.pe(), x.shape[1] as u32);
    let xt = tl.load(Block::of(x, pe, r0, 0, n, cols));
    let squares = tl.mul(&xt, &xt);
    let ms = tl.mean(&squares, 1);
    let shifted = tl.add(&ms, eps);
    let inv = tl.rsqrt(&shifted);
    let normed = tl.mul(&xt, &inv);
    let out = tl.mul(&normed, w);
    tl.store(Block::of(y, pe, r0, 0, n, cols), &out);
}

fn rmsnorm_grid(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, w) = (args.tensor("x"), args.tensor("w"));
    let block = args.get("block_rows");
    let r0 = tl.program_id(0) as u64 * block;
    let n = block.min(x.shape[0] - r0) as u32;
    let wt = tl.load(Block::of(w, tl.pe(), 0, 0, 1, x.shape[1] as u32));
    rms_block(tl, args, r0, n, &wt);
}

fn rmsnorm_local(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, w) = (args.tensor("x"), args.tensor("w"));
    let block = args.get("block_rows") as u32;
    let wt = tl.load(Block::of(w, tl.pe(), 0, 0, 1, x.shape[1] as u32));
    for b in x.row_blocks(tl.pe(), block) {
        rms_block(tl, args, b.row, b.rows, &wt);
    }
}

impl Workload for Rmsnorm {
    fn name(&self) -> &str {
        "rmsnorm"
    }

    fn about(&self) -> &str {
        "y = x * rsqrt(mean(x^2) + eps) * w per row, Triton style: a 1-D grid of row blocks in tensor coordinates (blocks that span shards are split into DMAs)"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, cols) = (p.u64("rows", 1)?, p.u64("cols", 1)?);
        let block = p.u64("block_rows", 1)?;
        if block > u32::MAX as u64 || cols > u32::MAX as u64 {
            return Err(p.err("block_rows", "block_rows and cols must fit in 32 bits"));
        }
        let eps = p.f64("eps")?;
        if eps < 0.0 {
            return Err(p.err("eps", format!("must not be negative, got {eps}")));
        }
        let x = prog.random("x", Dtype::F32, [rows, cols], Sharding::ROWS)?;
        let w = prog.random("w", Dtype::F32, [1, cols], Sharding::REPLICATE)?;
        let y = prog.zeros("y", Dtype::F32, [rows, cols], Sharding::ROWS)?;
        let args = prog
            .args(&[x, w, y])
            .scalar("block_rows", block)
            .float("eps", eps);
        let mode = match p.str("mode") {
            "auto" if prog.arg(x).peers_reach => "grid",
            "auto" => "local",
            m => m,
        };
        match mode {
            "grid" => {
                let programs = rows.div_ceil(block);
                if programs > u32::MAX as u64 {
                    return Err(p.err("block_rows", format!("{programs} programs is too many")));
                }
                let pes = prog.pes();
                prog.launch_grid("rmsnorm", rmsnorm_grid, args, [programs as u32, 1], &pes)?;
            }
            "local" => {
                prog.launch("rmsnorm", rmsnorm_local, args);
            }
            other => {
                return Err(p.err(
                    "mode",
                    format!("{other:?} is not a mode (grid, local, auto)"),
                ));
            }
        }
        let inv = Expr::Rsqrt(Box::new(Expr::Add(
            Box::new(Expr::Mean {
                input: Box::new(Expr::Mul(t("x"), t("x"))),
                axis: 1,
            }),
            Box::new(Expr::Scalar(eps)),
        )));
        let reference = Expr::Mul(Box::new(Expr::Mul(t("x"), Box::new(inv))), t("w"));
        prog.verify(y, reference, None);
        Ok(())
    }
}
