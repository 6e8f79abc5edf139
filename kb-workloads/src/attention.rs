//! `attention`: O = softmax(Q K^T / sqrt(d)) V, flash-attention style.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, Dot, KernelArgs, Tl, accumulation_dtype};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::{float_dtype, t};

/// `attention`, one kernel in the flash-attention style: each PE takes
/// its rows of Q a block at a time and streams K and V in blocks,
/// keeping a running row maximum, a running denominator and an f32
/// accumulator (the online softmax), so the s x s_kv score matrix never
/// exists. Q and O are row-sharded, K and V replicated. A last K/V block
/// shorter than `block_n` is masked with `arange < valid` and `where`.
#[derive(Debug)]
pub struct Attention;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "seq",
        default: "256",
        help: "query rows (Q, O)",
    },
    ParamSpec {
        name: "seq_kv",
        default: "256",
        help: "key/value rows (K, V)",
    },
    ParamSpec {
        name: "d",
        default: "64",
        help: "head dimension (columns of Q, K, V, O)",
    },
    ParamSpec {
        name: "block_m",
        default: "64",
        help: "query rows per block (at most a PE's rows)",
    },
    ParamSpec {
        name: "block_n",
        default: "64",
        help: "key/value rows per block",
    },
    ParamSpec {
        name: "dtype",
        default: "f16",
        help: "element type of Q, K, V and O (f32, f16, bf16)",
    },
];

fn attention_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (q, k, v, o) = (
        args.tensor("q"),
        args.tensor("k"),
        args.tensor("v"),
        args.tensor("o"),
    );
    let scale = args.get_f64("scale");
    let (Some(sq), Some(so)) = (q.shard(tl.pe()), o.shard(tl.pe())) else {
        return;
    };
    let d = (sq.row_bytes / q.elem_bytes()) as u32;
    let s_kv = k.shape[0];
    let bm = args.get("block_m").min(sq.rows) as u32;
    let bn = args.get("block_n").min(s_kv) as u32;
    let acc_dtype = accumulation_dtype(q.dtype);
    let mut r = 0;
    while r < sq.rows {
        let tm = (bm as u64).min(sq.rows - r) as u32;
        let qt = tl.load_masked(Block::in_shard(q, sq, r, 0, tm, d), bm, d, 0.0);
        let mut row_max = tl.full(bm, 1, acc_dtype, f64::NEG_INFINITY);
        let mut denom = tl.zeros(bm, 1, acc_dtype);
        let mut acc = tl.zeros(bm, d, acc_dtype);
        for j in (0..s_kv).step_by(bn as usize) {
            let tn = (bn as u64).min(s_kv - j) as u32;
            let kt = tl.load_masked(Block::of(k, tl.pe(), j, 0, tn, d), bn, d, 0.0);
            let raw = tl.dot_with(
                &qt,
                &kt,
                None,
                Dot {
                    transpose_b: true,
                    ..Dot::default()
                },
            );
            let mut scores = tl.mul(&raw, scale);
            if tn < bn {
                // Padded keys must not take part in the softmax.
                let cols = tl.arange(1, bn, 1, Dtype::I32);
                let valid = tl.lt(&cols, tn as f64);
                scores = tl.where_(&valid, &scores, f64::NEG_INFINITY);
            }
            let block_max = tl.reduce_max(&scores, 1);
            let new_max = tl.max(&row_max, &block_max);
            let shifted = tl.sub(&scores, &new_max);
            let probs = tl.exp(&shifted);
            let drop = tl.sub(&row_max, &new_max);
            let rescale = tl.exp(&drop);
            let kept = tl.mul(&denom, &rescale);
            let block_sum = tl.sum(&probs, 1);
            denom = tl.add(&kept, &block_sum);
            let vt = tl.load_masked(Block::of(v, tl.pe(), j, 0, tn, d), bn, d, 0.0);
            let pv = if q.dtype == acc_dtype {
                tl.dot(&probs, &vt, None)
            } else {
                // The probabilities go into the second GEMM in the
                // input dtype, as flash attention does.
                let narrow = tl.cast(&probs, q.dtype);
                tl.dot(&narrow, &vt, None)
            };
            let carried = tl.mul(&acc, &rescale);
            acc = tl.add(&carried, &pv);
            row_max = new_max;
        }
        let out = tl.div(&acc, &denom);
        let out = tl.cast(&out, o.dtype);
        tl.store_masked(Block::in_shard(o, so, r, 0, tm, d), &out);
        r += tm as u64;
    }
}

impl Workload for Attention {
    fn name(&self) -> &str {
        "attention"
    }

    fn about(&self) -> &str {
        "O = softmax(Q K^T / sqrt(d)) V in one kernel: Q blocks against K/V blocks with an online softmax"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (s, s_kv, d) = (p.u64("seq", 1)?, p.u64("seq_kv", 1)?, p.u64("d", 1)?);
        let dtype = float_dtype(p, "dtype")?;
        let q = prog.random("q", dtype, [s, d], Sharding::ROWS)?;
        let k = prog.random("k", dtype, [s_kv, d], Sharding::REPLICATE)?;
        let v = prog.random("v", dtype, [s_kv, d], Sharding::REPLICATE)?;
        let o = prog.zeros("o", dtype, [s, d], Sharding::ROWS)?;
        let scale = 1.0 / (d as f64).sqrt();
        let args = prog
            .args(&[q, k, v, o])
            .scalar("block_m", p.u64("block_m", 1)?)
            .scalar("block_n", p.u64("block_n", 1)?)
            .float("scale", scale);
        prog.launch("attention", attention_kernel, args);
        let scores = Expr::Mul(
            Box::new(Expr::Matmul(t("q"), Box::new(Expr::Transpose(t("k"))))),
            Box::new(Expr::Scalar(scale)),
        );
        let reference = Expr::Matmul(
            Box::new(Expr::Softmax {
                input: Box::new(scores),
                axis: 1,
            }),
            t("v"),
        );
        prog.verify(o, reference, None);
        Ok(())
    }
}
