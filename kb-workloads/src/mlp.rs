//! `mlp`: Y = gelu(X @ W1) @ W2 as three launches through HBM.

use kb_format::Expr;
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{float_dtype, gelu, gelu_expr, matmul_shard, t};

/// `mlp`: a transformer MLP block, `Y = gelu(X @ W1) @ W2`, as three
/// launches with a wait between each: the first GEMM writes H to HBM, the
/// GELU launch reads it back (bytes only Phase 2 computes: Phase 1 moves
/// them without seeing them) and writes G, the second GEMM reads G. X, H,
/// G and Y are row-sharded over the PEs, the weights replicated.
#[derive(Debug)]
pub struct Mlp;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "256",
        help: "rows (tokens) of X, H, G and Y",
    },
    ParamSpec {
        name: "d",
        default: "128",
        help: "model width: columns of X and Y, rows of W1",
    },
    ParamSpec {
        name: "h",
        default: "256",
        help: "hidden width: columns of W1, H and G, rows of W2",
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
        default: "f32",
        help: "element type of every tensor (f32, f16, bf16)",
    },
];

/// `c = a @ b` over this PE's row shard, tile by tile; a tile has at most
/// the shard's rows.
fn matmul_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    let bm = args.get("block_m").min(sa.rows);
    let (bn, bk) = (args.get("block_n"), args.get("block_k"));
    matmul_shard(tl, (a, b, c), (sa, sb, sc), (bm, bn, bk));
}

/// `y = gelu(x)` over this PE's row shard, `block_m` rows at a time.
fn gelu_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (sx.row_bytes / x.elem_bytes()) as u32;
    let block = args.get("block_m");
    let mut r = 0;
    while r < sx.rows {
        let n = block.min(sx.rows - r) as u32;
        // Written by the first launch's GEMMs: moved, never read here.
        let h = tl.load(Block::in_shard(x, sx, r, 0, n, cols));
        let g = gelu(tl, &h);
        tl.store(Block::in_shard(y, sy, r, 0, n, cols), &g);
        r += n as u64;
    }
}

impl Workload for Mlp {
    fn name(&self) -> &str {
        "mlp"
    }

    fn about(&self) -> &str {
        "Y = gelu(X @ W1) @ W2: GEMM, GELU and GEMM as three launches through HBM"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, d, h) = (p.u64("m", 1)?, p.u64("d", 1)?, p.u64("h", 1)?);
        let dtype = float_dtype(p, "dtype")?;
        let x = prog.random("x", dtype, [m, d], Sharding::ROWS)?;
        let w1 = prog.random("w1", dtype, [d, h], Sharding::REPLICATE)?;
        let w2 = prog.random("w2", dtype, [h, d], Sharding::REPLICATE)?;
        let hid = prog.zeros("h", dtype, [m, h], Sharding::ROWS)?;
        let g = prog.zeros("g", dtype, [m, h], Sharding::ROWS)?;
        let y = prog.zeros("y", dtype, [m, d], Sharding::ROWS)?;
        let tiles = |args: KernelArgs| -> Result<KernelArgs, WorkloadError> {
            ["block_m", "block_n", "block_k"]
                .into_iter()
                .try_fold(args, |a, name| Ok(a.scalar(name, p.u64(name, 1)?)))
        };
        let first = tiles(prog.bind(&[("a", x), ("b", w1), ("c", hid)]))?;
        let l1 = prog.launch("gemm_x_w1", matmul_kernel, first);
        prog.wait(l1);
        let act = tiles(prog.bind(&[("x", hid), ("y", g)]))?;
        let l2 = prog.launch("gelu", gelu_kernel, act);
        prog.wait(l2);
        let second = tiles(prog.bind(&[("a", g), ("b", w2), ("c", y)]))?;
        prog.launch("gemm_g_w2", matmul_kernel, second);
        // Every intermediate is rounded to `dtype`; the reference is not.
        // The error grows with both depths (d, then h) and with the
        // dtype's precision.
        let reference = Expr::Matmul(Box::new(gelu_expr(Expr::Matmul(t("x"), t("w1")))), t("w2"));
        prog.verify(y, reference, Some(mlp_tolerance(dtype, d + h)));
        Ok(())
    }
}

/// Two accumulations over `depth` terms in all (d, then h) and the
/// roundings of H and G to `dtype`. In f32 the accumulation dominates:
/// depth x 2^-23, the GEMM rule. In f16 and bf16 the roundings of H and
/// G dominate; they add up like a random walk over the second GEMM's
/// terms: 4 x sqrt(depth) units in the last place (f16 2^-10, bf16 2^-7),
/// 1.2 to 2.5 times the largest error measured over seeds and odd shapes.
pub(crate) fn mlp_tolerance(dtype: kb_format::Dtype, depth: u64) -> kb_format::Tolerance {
    let t = match dtype {
        kb_format::Dtype::F16 => 4.0 * (depth as f64).sqrt() * f64::powi(2.0, -10),
        kb_format::Dtype::Bf16 => 4.0 * (depth as f64).sqrt() * f64::powi(2.0, -7),
        _ => (depth as f64 * f64::powi(2.0, -23)).max(1e-5),
    };
    kb_format::Tolerance { rtol: t, atol: t }
}
