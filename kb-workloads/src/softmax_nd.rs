//! `softmax_nd`: y = softmax(x) along the last dim of an N-d tensor (1 to
//! 6 dims), over a grid of blocks in N-d coordinates (`Block::nd`).

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{
    MAX_RANK, ParamSpec, Params, Program, Shape, Sharding, Workload, WorkloadError,
};

use crate::t;

/// `softmax_nd` over the last dim of `x` of dims `shape` (stored and
/// row-sharded as its 2-D view `[product of the leading dims, last
/// dim]`). `grid` (the default, but under LA): program `i` of a 1-D grid
/// over every PE takes the `i`-th block of sizes `block` (row-major over
/// the blocks, the last of each dim shorter) with `Block::nd`, which
/// moves it as a 2-D tile of its leading sizes' product x its last size;
/// blocks span shards and other PEs' HBM. `local` (the default under
/// LA): each PE walks its own shard's rows of the 2-D view. `op=copy`
/// stores each block unchanged (y = x), a round trip of N-d blocks whose
/// last size may be less than the last dim (softmax needs whole rows).
#[derive(Debug)]
pub struct SoftmaxNd;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "shape",
        default: "4x300x64",
        help: "dims of x and y, outermost first (1 to 6, `x`-separated)",
    },
    ParamSpec {
        name: "block",
        default: "auto",
        help: "block sizes per dim (`x`-separated, as many as shape's), or auto: 1 along the outer dims, 64 rows of the last but one, the whole last dim",
    },
    ParamSpec {
        name: "op",
        default: "softmax",
        help: "softmax (along the last dim) or copy (y = x)",
    },
    ParamSpec {
        name: "mode",
        default: "auto",
        help: "grid (N-d blocks over a 1-D grid), local (each PE its own shard's rows), or auto (grid where a PE can address other PEs' shards, local under LA)",
    },
];

/// Rows of the 2-D view per block in `local` mode.
const LOCAL_ROWS: u32 = 64;

/// `1x2x3` as dims, each at least 1 and at most 2^32 - 1.
fn dims(p: &Params, name: &str) -> Result<Vec<u64>, WorkloadError> {
    let v = p.str(name);
    let d: Vec<u64> = v
        .split('x')
        .map(|s| s.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| p.err(name, format!("{v:?} is not dims like 4x300x64")))?;
    if d.is_empty() || d.len() > MAX_RANK {
        return Err(p.err(name, format!("{v:?}: give 1 to {MAX_RANK} dims")));
    }
    if d.iter().any(|&x| x == 0 || x > u32::MAX as u64) {
        return Err(p.err(name, format!("{v:?}: each dim must be 1 to {}", u32::MAX)));
    }
    Ok(d)
}

/// The tile's rows, in place: softmax along axis 1 or nothing.
fn apply(
    tl: &mut Tl<'_>,
    args: &KernelArgs,
    x: kb_sim::kernel::TensorBlock,
    y: kb_sim::kernel::TensorBlock,
) {
    let t = tl.load(x);
    if args.get("softmax") == 1 {
        let row_max = tl.reduce_max(&t, 1);
        let shifted = tl.sub(&t, &row_max);
        let e = tl.exp(&shifted);
        let total = tl.sum(&e, 1);
        let out = tl.div(&e, &total);
        tl.store(y, &out);
    } else {
        tl.store(y, &t);
    }
}

fn grid_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let n = x.dims.len();
    let block: Vec<u64> = (0..n).map(|k| args.get(&format!("block{k}"))).collect();
    // Program i's block index, row-major over the blocks of each dim.
    let mut i = tl.program_id(0) as u64;
    let (mut start, mut sizes) = (vec![0u64; n], vec![0u32; n]);
    for (((s, size), &d), &b) in start
        .iter_mut()
        .zip(&mut sizes)
        .zip(&x.dims)
        .zip(&block)
        .rev()
    {
        let count = d.div_ceil(b);
        *s = (i % count) * b;
        *size = b.min(d - *s) as u32;
        i /= count;
    }
    let pe = tl.pe();
    apply(
        tl,
        args,
        Block::nd(x, pe, &start, &sizes),
        Block::nd(y, pe, &start, &sizes),
    );
}

fn local_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let pe = tl.pe();
    for b in x.row_blocks(pe, LOCAL_ROWS) {
        apply(
            tl,
            args,
            Block::of(x, pe, b.row, b.col, b.rows, b.cols),
            Block::of(y, pe, b.row, b.col, b.rows, b.cols),
        );
    }
}

impl Workload for SoftmaxNd {
    fn name(&self) -> &str {
        "softmax_nd"
    }

    fn about(&self) -> &str {
        "y = softmax(x) along the last dim of an N-d tensor (or op=copy), over a grid of blocks in N-d coordinates (Block::nd)"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let shape = dims(p, "shape")?;
        let n = shape.len();
        let block = match p.str("block") {
            "auto" => (0..n)
                .map(|k| match n - 1 - k {
                    0 => shape[k],
                    1 => shape[k].min(64),
                    _ => 1,
                })
                .collect(),
            _ => dims(p, "block")?,
        };
        if block.len() != n {
            return Err(p.err(
                "block",
                format!("{} sizes for a shape of {n} dims", block.len()),
            ));
        }
        let softmax = match p.str("op") {
            "softmax" => 1,
            "copy" => 0,
            other => return Err(p.err("op", format!("{other:?} is not an op (softmax, copy)"))),
        };
        if softmax == 1 && block[n - 1] != shape[n - 1] {
            return Err(p.err(
                "block",
                format!(
                    "softmax needs whole rows: the block's last size must be the last dim ({}), got {}",
                    shape[n - 1],
                    block[n - 1]
                ),
            ));
        }
        let x = prog.random("x", Dtype::F32, shape.as_slice(), Sharding::ROWS)?;
        let y = prog.zeros("y", Dtype::F32, Shape::from(&shape), Sharding::ROWS)?;
        let mut args = prog.args(&[x, y]).scalar("softmax", softmax);
        for (k, &b) in block.iter().enumerate() {
            args = args.scalar(&format!("block{k}"), b);
        }
        let mode = match p.str("mode") {
            "auto" if prog.arg(x).peers_reach => "grid",
            "auto" => "local",
            m => m,
        };
        match mode {
            "grid" => {
                let programs = shape
                    .iter()
                    .zip(&block)
                    .try_fold(1u64, |acc, (&d, &b)| acc.checked_mul(d.div_ceil(b)))
                    .filter(|&g| g <= u32::MAX as u64)
                    .ok_or_else(|| p.err("block", "more than 2^32 blocks"))?;
                let pes = prog.pes();
                prog.launch_grid("softmax_nd", grid_kernel, args, [programs as u32, 1], &pes)?;
            }
            "local" => {
                prog.launch("softmax_nd", local_kernel, args);
            }
            other => {
                return Err(p.err(
                    "mode",
                    format!("{other:?} is not a mode (grid, local, auto)"),
                ));
            }
        }
        let reference = if softmax == 1 {
            // Over the 2-D view, axis 1 is the last dim.
            Expr::Softmax {
                input: t("x"),
                axis: 1,
            }
        } else {
            Expr::Tensor("x".into())
        };
        prog.verify(y, reference, None);
        Ok(())
    }
}
