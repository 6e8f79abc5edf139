//! `tp_mlp`: a Megatron-style tensor-parallel MLP over a group of PEs:
//! column-parallel GEMM -> GELU -> row-parallel GEMM -> all-reduce.

use kb_format::{Dtype, Expr};
use kb_sim::collective::{self, Algorithm, Comm};

use crate::allreduce::ALGORITHMS;
use kb_sim::kernel::{Block, Dot, KernelArgs, Pending, Tl};
use kb_sim::workload::{ParamSpec, Params, Placement, Policy, Program, Workload, WorkloadError};

use crate::mlp::mlp_tolerance;
use crate::{collective_tolerance, float_dtype, gelu, gelu_expr, group_of, matmul_shard, t};

/// `tp_mlp`: `Y = gelu(X @ W1^T) @ W2` split over the P members of a
/// group as Megatron does: member k holds rows `F_k` (a P-th) of W1
/// (`F` x `D`, the output-by-input layout of a linear layer) and of W2
/// (`F` x `D`), computes `H_k = gelu(X @ W1_k^T)` (column-parallel: its
/// columns of H) and the partial `Y_k = H_k @ W2_k` (row-parallel), then
/// an all-reduce sums the partials so every member holds Y. X is
/// replicated on the members; H and the partials stay in each member's
/// HBM.
#[derive(Debug)]
pub struct TpMlp;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "64",
        help: "rows (tokens) of X and Y",
    },
    ParamSpec {
        name: "d",
        default: "256",
        help: "model width: columns of X, W1, W2 and Y",
    },
    ParamSpec {
        name: "f",
        default: "1024",
        help: "hidden width: rows of W1 and W2 (a multiple of the group's size)",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type (f32, f16, bf16)",
    },
    ParamSpec {
        name: "group",
        default: "cube",
        help: "the tensor-parallel group: cube, sip, all, cubes or sips (see allreduce)",
    },
    ParamSpec {
        name: "algorithm",
        default: "auto",
        help: "the all-reduce's algorithm: ring, tree, direct, hierarchical or auto (as allreduce's)",
    },
    ParamSpec {
        name: "block_m",
        default: "32",
        help: "tile rows",
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
        name: "slot_kib",
        default: "32",
        help: "KiB of each all-reduce receive slot",
    },
    ParamSpec {
        name: "depth",
        default: "auto",
        help: "all-reduce slots per channel, or auto: from the route's bandwidth-delay product",
    },
    ParamSpec {
        name: "sync",
        default: "1",
        help: "0 drops the all-reduce's wait for each message's arrival: a data race (kb-sim --races reports it; the output is wrong)",
    },
];

/// `h = gelu(x @ w1^T)` over this member's rows of w1, tile by tile.
fn column_parallel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, w1, h) = (args.tensor("x"), args.tensor("w1"), args.tensor("h"));
    let me = tl.pe();
    let (sx, sw, sh) = (
        x.shard(me).expect("x"),
        w1.shard(me).expect("w1"),
        h.shard(me).expect("h"),
    );
    let (bm, bn, bk) = (
        args.get("block_m"),
        args.get("block_n"),
        args.get("block_k"),
    );
    let (m, fk, d) = (sx.rows, sw.rows, sx.row_bytes / x.elem_bytes());
    for i in (0..m).step_by(bm as usize) {
        let tm = bm.min(m - i) as u32;
        for j in (0..fk).step_by(bn as usize) {
            let tn = bn.min(fk - j) as u32;
            let mut acc: Option<Pending> = None;
            for kk in (0..d).step_by(bk as usize) {
                let tk = bk.min(d - kk) as u32;
                let a = tl.load_masked(
                    Block::in_shard(x, sx, i, kk, tm, tk),
                    bm as u32,
                    bk as u32,
                    0.0,
                );
                // W1's rows j.. are H's columns: used transposed.
                let b = tl.load_masked(
                    Block::in_shard(w1, sw, j, kk, tn, tk),
                    bn as u32,
                    bk as u32,
                    0.0,
                );
                let opts = Dot {
                    transpose_b: true,
                    ..Dot::default()
                };
                acc = Some(tl.dot_with(&a, &b, acc, opts));
            }
            let g = gelu(tl, &acc.expect("d >= 1"));
            let out = Block::in_shard(h, sh, i, j, tm, tn);
            if g.dtype() == h.dtype {
                tl.store_masked(out, &g);
            } else {
                let narrow = tl.cast(&g, h.dtype);
                tl.store_masked(out, &narrow);
            }
        }
    }
}

fn tp_mlp_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    column_parallel(tl, args);
    // Row-parallel: this member's partial of Y.
    let (h, w2, yp) = (args.tensor("h"), args.tensor("w2"), args.tensor("yp"));
    let me = tl.pe();
    let (sh, sw, sy) = (
        h.shard(me).expect("h"),
        w2.shard(me).expect("w2"),
        yp.shard(me).expect("yp"),
    );
    let tiles = (
        args.get("block_m").min(sh.rows),
        args.get("block_n"),
        args.get("block_k"),
    );
    matmul_shard(tl, (h, w2, yp), (sh, sw, sy), tiles);
    // Sum the partials on every member.
    let (y, slots) = (args.tensor("y"), args.tensor("slots"));
    let mut comm = Comm::new(tl, tl.launch_group(), slots, args.get("depth") as u32, 0);
    if args.get("sync") == 0 {
        comm = comm.without_arrival_waits();
    }
    comm.all_reduce(tl, yp, y, ALGORITHMS[args.get("algorithm") as usize]);
}

impl Workload for TpMlp {
    fn name(&self) -> &str {
        "tp_mlp"
    }

    fn about(&self) -> &str {
        "tensor-parallel MLP over a group: column-parallel GEMM -> GELU -> row-parallel GEMM -> all-reduce"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, d, f) = (p.u64("m", 1)?, p.u64("d", 1)?, p.u64("f", 1)?);
        let dtype: Dtype = float_dtype(p, "dtype")?;
        let algorithm = Algorithm::parse(p.str("algorithm")).ok_or_else(|| {
            p.err(
                "algorithm",
                "must be ring, tree, direct, hierarchical or auto",
            )
        })?;
        let group = group_of(p, prog, "group")?;
        let n = group.len() as u64;
        if f % n != 0 {
            return Err(p.err(
                "f",
                format!("{f} is not a multiple of the group's {n} members"),
            ));
        }
        let each = Placement::over(&group, Policy::Replicate);
        let split = Placement::over(&group, Policy::RowWise);
        let x = prog.random("x", dtype, [m, d], each)?;
        let w1 = prog.random("w1", dtype, [f, d], split.clone())?;
        let w2 = prog.random("w2", dtype, [f, d], split.clone())?;
        // Member k's H_k (m x f/n) and partial Y_k (m x d), stacked.
        let h = prog.zeros("h", dtype, [n * m, f / n], split.clone())?;
        let yp = prog.zeros("yp", dtype, [n * m, d], split.clone())?;
        let y = prog.zeros("y", dtype, [n * m, d], split)?;
        let slot_bytes = p.u64("slot_kib", 1)? * 1024;
        let depth = crate::collective_depth(p, prog, &group, slot_bytes, &[algorithm])?;
        let slots = collective::slots(
            prog,
            "slots",
            dtype,
            &group,
            (slot_bytes, depth as u32),
            &[algorithm],
        )?;
        let mut args = prog
            .args(&[x, w1, w2, h, yp, y, slots])
            .scalar("depth", depth)
            .scalar(
                "algorithm",
                ALGORITHMS.iter().position(|&a| a == algorithm).unwrap_or(0) as u64,
            )
            .scalar("sync", p.u64("sync", 0)?.min(1));
        for name in ["block_m", "block_n", "block_k"] {
            args = args.scalar(name, p.u64(name, 1)?);
        }
        prog.launch_grid("tp_mlp", tp_mlp_kernel, args, [n as u32, 1], &group)?;
        let mlp = Expr::Matmul(
            Box::new(gelu_expr(Expr::Matmul(
                t("x"),
                Box::new(Expr::Transpose(t("w1"))),
            ))),
            t("w2"),
        );
        // The GEMMs' error (as mlp's), then the all-reduce's roundings.
        let gemms = mlp_tolerance(dtype, d + f / n);
        let sum = collective_tolerance(dtype, n).map_or(0.0, |t| t.atol);
        let tol = gemms.atol + sum;
        prog.verify(
            y,
            Expr::Tile {
                input: Box::new(mlp),
                reps: n,
            },
            Some(kb_format::Tolerance {
                rtol: tol,
                atol: tol,
            }),
        );
        Ok(())
    }
}
