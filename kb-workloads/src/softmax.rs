//! `softmax`: y = softmax(x) along each row.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::t;

/// `softmax`: y = softmax(x) along each row; each PE handles its row
/// shard, a block of rows at a time (the whole row in TCM).
#[derive(Debug)]
pub struct Softmax;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "512",
        help: "rows of x",
    },
    ParamSpec {
        name: "cols",
        default: "1024",
        help: "columns of x (the softmax axis)",
    },
    ParamSpec {
        name: "block_rows",
        default: "8",
        help: "rows per block",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type",
    },
];

fn softmax_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let block = args.get("block_rows");
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (sx.row_bytes / x.elem_bytes()) as u32;
    let mut r = 0;
    while r < sx.rows {
        let n = block.min(sx.rows - r) as u32;
        let t = tl.load(Block::in_shard(x, sx, r, 0, n, cols));
        let row_max = tl.reduce_max(&t, 1);
        let shifted = tl.sub(&t, &row_max);
        let e = tl.exp(&shifted);
        let total = tl.sum(&e, 1);
        let out = tl.div(&e, &total);
        tl.store(Block::in_shard(y, sy, r, 0, n, cols), &out);
        r += n as u64;
    }
}

impl Workload for Softmax {
    fn name(&self) -> &str {
        "softmax"
    }

    fn about(&self) -> &str {
        "y = softmax(x) per row: reduce_max, sub, exp, sum, div on pe_math"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, cols, block, dtype) = (
            p.u64("rows", 1)?,
            p.u64("cols", 1)?,
            p.u64("block_rows", 1)?,
            p.dtype("dtype")?,
        );
        if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::Bf16) {
            return Err(p.err(
                "dtype",
                format!("softmax needs a float dtype (f32, f16, bf16), got {dtype}"),
            ));
        }
        let x = prog.random("x", dtype, [rows, cols], Sharding::ROWS)?;
        let y = prog.zeros("y", dtype, [rows, cols], Sharding::ROWS)?;
        let args = prog.args(&[x, y]).scalar("block_rows", block);
        prog.launch("softmax", softmax_kernel, args);
        prog.verify(
            y,
            Expr::Softmax {
                input: t("x"),
                axis: 1,
            },
            None,
        );
        Ok(())
    }
}
