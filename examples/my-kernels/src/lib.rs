//! An example of a workload crate outside kb-sim, the one
//! docs/writing-kernels.md walks through: two kernels, a host program
//! with two launches and a reference the trace carries.
//!
//! `axpy_rowmax`: `y = alpha * x + y`, then `z = rowmax(y)`.
//! - Launch 1 (`axpy`) runs on every PE over its own row shard.
//! - Launch 2 (`rowmax`) runs on the PEs of cube 0 only, over a 1-D grid
//!   of one program per shard of `y`: program `i` reduces shard `i`,
//!   wherever it lives. It reads what launch 1 computed: bytes Phase 1
//!   moves without knowing them.
//! - `-p peek=1` makes `rowmax` branch on such a value, which kb-sim
//!   refuses, naming the op that wrote it.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

/// The `axpy_rowmax` workload.
#[derive(Debug)]
pub struct AxpyRowMax;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "256",
        help: "rows of x, y and z",
    },
    ParamSpec {
        name: "cols",
        default: "512",
        help: "columns of x and y",
    },
    ParamSpec {
        name: "alpha",
        default: "0.5",
        help: "the scale of x (a float)",
    },
    ParamSpec {
        name: "block_rows",
        default: "8",
        help: "rows per tile",
    },
    ParamSpec {
        name: "peek",
        default: "0",
        help: "1: rowmax reads a value Phase 1 cannot know (shows the error)",
    },
];

/// `y = alpha * x + y` over this PE's row shard.
fn axpy(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let alpha = args.get_f64("alpha");
    let block = args.get("block_rows");
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return; // this PE holds no rows
    };
    let cols = (sx.row_bytes / x.elem_bytes()) as u32;
    let mut r = 0;
    while r < sx.rows {
        let n = block.min(sx.rows - r) as u32;
        let xt = tl.load(Block::in_shard(x, sx, r, 0, n, cols));
        let yt = tl.load(Block::in_shard(y, sy, r, 0, n, cols));
        let ax = tl.mul(&xt, alpha);
        let sum = tl.add(&ax, &yt);
        tl.store(Block::in_shard(y, sy, r, 0, n, cols), &sum);
        r += n as u64;
    }
}

/// Program `i` of the grid: `z = rowmax(y)` over shard `i` of `y`.
fn rowmax(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (y, z) = (args.tensor("y"), args.tensor("z"));
    let block = args.get("block_rows");
    let i = tl.program_id(0) as usize;
    let (sy, sz) = (&y.shards[i], &z.shards[i]);
    let cols = (sy.row_bytes / y.elem_bytes()) as u32;
    let mut r = 0;
    while r < sy.rows {
        let n = block.min(sy.rows - r) as u32;
        let yt = tl.load(Block::in_shard(y, sy, r, 0, n, cols));
        if args.get("peek") == 1 && yt.get(0, 0) > 0.0 {
            // Never reached: get() fails first, naming the writer.
            r += 1;
        }
        let m = tl.reduce_max(&yt, 1);
        tl.store(Block::in_shard(z, sz, r, 0, n, 1), &m);
        r += n as u64;
    }
}

impl Workload for AxpyRowMax {
    fn name(&self) -> &str {
        "axpy_rowmax"
    }

    fn about(&self) -> &str {
        "y = alpha * x + y on every PE, then z = rowmax(y) on cube 0 (the writing-kernels example)"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, cols) = (p.u64("rows", 1)?, p.u64("cols", 1)?);
        let alpha = p.f64("alpha")?;
        let block = p.u64("block_rows", 1)?;
        let peek = p.u64("peek", 0)?;
        if peek > 1 {
            return Err(p.err("peek", format!("0 or 1, got {peek}")));
        }
        let dtype = Dtype::F32;
        let x = prog.random("x", dtype, [rows, cols], Sharding::ROWS)?;
        let y = prog.random("y0", dtype, [rows, cols], Sharding::ROWS)?;
        let z = prog.zeros("z", dtype, [rows, 1], Sharding::ROWS)?;

        let args = prog
            .bind(&[("x", x), ("y", y)])
            .float("alpha", alpha)
            .scalar("block_rows", block);
        let first = prog.launch("axpy", axpy, args);
        // rowmax reads what axpy wrote: wait for it.
        prog.wait(first);

        let shards = prog.arg(y).shards.len() as u32;
        let cube0: Vec<_> = prog
            .pes()
            .into_iter()
            .filter(|pe| pe.sip == 0 && pe.cube == 0)
            .collect();
        let args = prog
            .bind(&[("y", y), ("z", z)])
            .scalar("block_rows", block)
            .scalar("peek", peek);
        prog.launch_grid("rowmax", rowmax, args, [shards, 1], &cube0)?;

        // y0 is overwritten in place; the reference reads its host data.
        let y1 = Expr::Add(
            Box::new(Expr::Mul(
                Box::new(Expr::Scalar(alpha)),
                Box::new(Expr::Tensor("x".into())),
            )),
            Box::new(Expr::Tensor("y0".into())),
        );
        let reference = Expr::Max {
            input: Box::new(y1),
            axis: 1,
        };
        prog.verify(z, reference, None);
        Ok(())
    }
}
