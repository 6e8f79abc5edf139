//! `copy`: y = x, tile by tile through TCM.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

/// `copy`: y = x. The host deploys x row-wise over the PEs; each PE's
/// kernel loads its rows tile by tile into TCM and stores them to y, with
/// up to four loads in flight ahead of the stores (as TCM allows): a
/// bandwidth benchmark of the HBM, the links and the DMA engines.
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
    let tile_bytes = tile_rows.min(xs.rows) * xs.row_bytes;
    // Loads in flight: as many tiles as half the free TCM holds, up to 4,
    // so each PE keeps its link and the HBM busy instead of waiting for
    // one load at a time.
    let ahead = (tl.tcm_available() / (2 * tile_bytes.max(1))).clamp(1, 4) as usize;
    let mut loads = std::collections::VecDeque::with_capacity(ahead);
    let mut next = 0;
    let mut r = 0;
    while r < xs.rows {
        while loads.len() < ahead && next < xs.rows {
            let n = tile_rows.min(xs.rows - next) as u32;
            loads.push_back((
                next,
                n,
                tl.load_async(Block::in_shard(x, xs, next, 0, n, cols)),
            ));
            next += n as u64;
        }
        let (at, n, h) = loads.pop_front().expect("a load in flight");
        let tile = tl.wait(h);
        tl.store(Block::in_shard(y, ys, at, 0, n, cols), &tile);
        r = at + n as u64;
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
