//! `copy`: y = x, tile by tile through TCM.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

/// `copy`: y = x. The host deploys x row-wise over the PEs; each PE's
/// kernel loads its rows tile by tile into TCM and stores them to y (the
/// store of one tile overlaps the load of the next).
#[derive(Debug)]
pub struct Copy;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "2048",
        help: "rows of x",
    },
    ParamSpec {
        name: "cols",
        default: "512",
        help: "columns of x",
    },
    ParamSpec {
        name: "tile_rows",
        default: "8",
        help: "rows per tile",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type",
    },
];

fn copy_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let tile_rows = args.get("tile_rows");
    let (Some(xs), Some(ys)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (xs.row_bytes / x.elem_bytes()) as u32;
    let mut r = 0;
    while r < xs.rows {
        let n = tile_rows.min(xs.rows - r) as u32;
        let tile = tl.load(Block::in_shard(x, xs, r, 0, n, cols));
        tl.store(Block::in_shard(y, ys, r, 0, n, cols), &tile);
        r += n as u64;
    }
}

impl Workload for Copy {
    fn name(&self) -> &str {
        "copy"
    }

    fn about(&self) -> &str {
        "y = x: each PE copies its row shard HBM -> TCM -> HBM, tile by tile"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let rows = p.u64("rows", 1)?;
        let cols = p.u64("cols", 1)?;
        let tile_rows = p.u64("tile_rows", 1)?;
        let dtype: Dtype = p.dtype("dtype")?;
        let x = prog.random("x", dtype, [rows, cols], Sharding::ROWS)?;
        let y = prog.zeros("y", dtype, [rows, cols], Sharding::ROWS)?;
        let args = prog.args(&[x, y]).scalar("tile_rows", tile_rows);
        prog.launch("copy", copy_kernel, args);
        prog.verify(y, Expr::Tensor("x".into()), None);
        Ok(())
    }
}
