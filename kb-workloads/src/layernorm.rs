//! `layernorm`: y = (x - mean) / sqrt(var + eps) * gamma + beta per row.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Operand, Tile, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{float_dtype, t};

/// `layernorm` over the last axis: each PE normalises its row shard, a
/// block of whole rows at a time; `gamma` and `beta` (1 x cols) are
/// replicated and broadcast down the rows.
#[derive(Debug)]
pub struct Layernorm;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "512",
        help: "rows of x (normalised independently)",
    },
    ParamSpec {
        name: "cols",
        default: "768",
        help: "columns of x (the normalised axis)",
    },
    ParamSpec {
        name: "block_rows",
        default: "8",
        help: "rows per block",
    },
    ParamSpec {
        name: "eps",
        default: "1e-5",
        help: "added to the variance",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type (f32, f16, bf16)",
    },
];

fn layernorm_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (gamma, beta) = (args.tensor("gamma"), args.tensor("beta"));
    let eps = args.get_f64("eps");
    let block = args.get("block_rows");
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (sx.row_bytes / x.elem_bytes()) as u32;
    // Statistics in f32 whatever the storage dtype, as real kernels do:
    // a half-precision mean or variance loses the digits that matter.
    let wide = |tl: &mut Tl<'_>, t: Tile| -> Box<dyn Operand> {
        if t.dtype() == Dtype::F32 {
            Box::new(t)
        } else {
            Box::new(tl.cast(&t, Dtype::F32))
        }
    };
    let g = tl.load(Block::of(gamma, tl.pe(), 0, 0, 1, cols));
    let g = wide(tl, g);
    let b = tl.load(Block::of(beta, tl.pe(), 0, 0, 1, cols));
    let b = wide(tl, b);
    let mut r = 0;
    while r < sx.rows {
        let n = block.min(sx.rows - r) as u32;
        let raw = tl.load(Block::in_shard(x, sx, r, 0, n, cols));
        let v = wide(tl, raw);
        let v = v.as_ref();
        let mean = tl.mean(v, 1);
        let centred = tl.sub(v, &mean);
        let squares = tl.mul(&centred, &centred);
        let var = tl.mean(&squares, 1);
        let shifted = tl.add(&var, eps);
        let inv = tl.rsqrt(&shifted);
        let normed = tl.mul(&centred, &inv);
        let scaled = tl.mul(&normed, g.as_ref());
        let out = tl.add(&scaled, b.as_ref());
        let out = if y.dtype == Dtype::F32 {
            out
        } else {
            tl.cast(&out, y.dtype)
        };
        tl.store(Block::in_shard(y, sy, r, 0, n, cols), &out);
        r += n as u64;
    }
}

impl Workload for Layernorm {
    fn name(&self) -> &str {
        "layernorm"
    }

    fn about(&self) -> &str {
        "y = (x - mean) / sqrt(var + eps) * gamma + beta per row: mean, sub, mul, rsqrt on pe_math"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, cols, block) = (
            p.u64("rows", 1)?,
            p.u64("cols", 1)?,
            p.u64("block_rows", 1)?,
        );
        let eps = p.f64("eps")?;
        if eps < 0.0 {
            return Err(p.err("eps", format!("must not be negative, got {eps}")));
        }
        let dtype = float_dtype(p, "dtype")?;
        let x = prog.random("x", dtype, [rows, cols], Sharding::ROWS)?;
        let gamma = prog.random("gamma", dtype, [1, cols], Sharding::REPLICATE)?;
        let beta = prog.random("beta", dtype, [1, cols], Sharding::REPLICATE)?;
        let y = prog.zeros("y", dtype, [rows, cols], Sharding::ROWS)?;
        let args = prog
            .args(&[x, gamma, beta, y])
            .scalar("block_rows", block)
            .float("eps", eps);
        prog.launch("layernorm", layernorm_kernel, args);
        let centred = || {
            Box::new(Expr::Sub(
                t("x"),
                Box::new(Expr::Mean {
                    input: t("x"),
                    axis: 1,
                }),
            ))
        };
        let var = Expr::Mean {
            input: Box::new(Expr::Mul(centred(), centred())),
            axis: 1,
        };
        let inv = Expr::Rsqrt(Box::new(Expr::Add(
            Box::new(var),
            Box::new(Expr::Scalar(eps)),
        )));
        let reference = Expr::Add(
            Box::new(Expr::Mul(
                Box::new(Expr::Mul(centred(), Box::new(inv))),
                t("gamma"),
            )),
            t("beta"),
        );
        prog.verify(y, reference, None);
        Ok(())
    }
}
