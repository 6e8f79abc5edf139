//! `atomics`: the `tl` atomics on tensors that every PE updates, in PE
//! 0's HBM or (`memory=sram`, and under the LA model, where a PE cannot
//! address another PE's HBM shard) in cube 0's SRAM.
//!
//! - `op=splitk` (default): split-K GEMM, C = A @ B with K split over
//!   the PEs; each PE's partial product (a `dot` result) is
//!   `atomic_add`ed into the one C in PE 0's HBM.
//! - `op=maxmin`: column max and min of a row-sharded X, each PE's
//!   column reduction `atomic_max`ed / `atomic_min`ed into one row.
//! - `op=ticket`: integer atomics whose results a kernel reads in
//!   Phase 1: a ticket counter (`atomic_add` of 1), `atomic_xchg` of 1
//!   into the slot the ticket names, a claim by `atomic_cas` (exactly one
//!   PE sees the old 0 and counts itself in `winners`), and `atomic_or`
//!   of each PE's bit. The results do not depend on the PEs' order.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::runtime::Policy;
use kb_sim::topology::AddressModel;
use kb_sim::workload::{ParamSpec, Params, Placement, Program, Sharding, Workload, WorkloadError};

use crate::{gemm_tolerance, t};

/// `atomics`: see the module doc.
#[derive(Debug)]
pub struct Atomics;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "op",
        default: "splitk",
        help: "splitk (atomic_add of partial GEMMs), maxmin (atomic_max/min), ticket (i32 add, xchg, cas, or)",
    },
    ParamSpec {
        name: "m",
        default: "32",
        help: "rows of A and C (splitk); rows of X per PE (maxmin)",
    },
    ParamSpec {
        name: "n",
        default: "32",
        help: "columns of B and C (splitk), of X (maxmin)",
    },
    ParamSpec {
        name: "k",
        default: "16",
        help: "K depth per PE (splitk: K is k times the PEs)",
    },
    ParamSpec {
        name: "memory",
        default: "auto",
        help: "where the shared outputs live: hbm (PE 0's), sram (cube 0's), or auto (hbm where PEs address each other's HBM, sram under LA)",
    },
];

fn splitk_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let (m, n, k) = (
        args.get("m") as u32,
        args.get("n") as u32,
        args.get("k") as u32,
    );
    let pe = tl.pe();
    let k0 = tl.program_id(0) as u64 * k as u64;
    let ta = tl.load(Block::of(a, pe, 0, k0, m, k));
    let tb = tl.load(Block::of(b, pe, k0, 0, k, n));
    let part = tl.dot(&ta, &tb, None);
    tl.atomic_add(Block::of(c, pe, 0, 0, m, n), &part, None);
}

fn maxmin_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, hi, lo) = (
        args.tensor("x"),
        args.tensor("colmax"),
        args.tensor("colmin"),
    );
    let (m, n) = (args.get("m") as u32, args.get("n") as u32);
    let pe = tl.pe();
    let r0 = tl.program_id(0) as u64 * m as u64;
    let tx = tl.load(Block::of(x, pe, r0, 0, m, n));
    let mx = tl.reduce_max(&tx, 0);
    let mn = tl.reduce_min(&tx, 0);
    tl.atomic_max(Block::of(hi, pe, 0, 0, 1, n), &mx, None);
    tl.atomic_min(Block::of(lo, pe, 0, 0, 1, n), &mn, None);
}

fn ticket_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let pe = tl.pe();
    let id = tl.program_id(0);
    let (counter, taken, claimed) = (
        args.tensor("counter"),
        args.tensor("taken"),
        args.tensor("claimed"),
    );
    let (winners, bits) = (args.tensor("winners"), args.tensor("bits"));
    let ticket = tl.atomic_add(Block::of(counter, pe, 0, 0, 1, 1), 1.0, None);
    let t = ticket.get(0, 0) as u64;
    let was = tl.atomic_xchg(Block::of(taken, pe, t, 0, 1, 1), 1.0, None);
    assert_eq!(was.get(0, 0), 0.0, "ticket {t} was handed out twice");
    let cols = claimed.shape[1] as u32;
    let old = tl.atomic_cas(Block::of(claimed, pe, 0, 0, 1, cols), 0, 1.0, None);
    if old.get(0, 0) == 0.0 {
        tl.atomic_add(Block::of(winners, pe, 0, 0, 1, 1), 1.0, None);
    }
    tl.atomic_or(
        Block::of(bits, pe, 0, 0, 1, 1),
        (1u32 << (id % 31)) as f64,
        None,
    );
}

impl Workload for Atomics {
    fn name(&self) -> &str {
        "atomics"
    }

    fn about(&self) -> &str {
        "tl atomics on one HBM tensor every PE updates: split-K GEMM (atomic_add), column max/min, i32 ticket/xchg/cas/or"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, n, k) = (p.u64("m", 1)?, p.u64("n", 1)?, p.u64("k", 1)?);
        let pes = prog.pes();
        let np = pes.len() as u64;
        // The shared outputs live in PE 0's HBM (one row-wise shard:
        // under VA every PE maps it) or in cube 0's SRAM, which every PE
        // addresses under every model.
        let la = prog.machine().topo.address_model == AddressModel::La;
        let at0 = Placement::over(&pes[..1], Policy::RowWise);
        let at0 = match p.str("memory") {
            "hbm" => at0,
            "auto" if !la => at0,
            "sram" | "auto" => at0.in_sram(),
            other => {
                return Err(p.err("memory", format!("{other:?} is not hbm, sram or auto")));
            }
        };
        let f32 = Dtype::F32;
        match p.str("op") {
            "splitk" => {
                let a = prog.random("a", f32, [m, k * np], Sharding::REPLICATE)?;
                let b = prog.random("b", f32, [k * np, n], Sharding::REPLICATE)?;
                let c = prog.zeros("c", f32, [m, n], at0)?;
                let args = prog
                    .args(&[a, b, c])
                    .scalar("m", m)
                    .scalar("n", n)
                    .scalar("k", k);
                prog.launch("splitk", splitk_kernel, args);
                // Each element sums np partial products in some order,
                // each rounded to f32: the GEMM's tolerance over all of K.
                prog.verify(c, Expr::Matmul(t("a"), t("b")), gemm_tolerance(f32, k * np));
            }
            "maxmin" => {
                let x = prog.random("x", f32, [m * np, n], Sharding::ROWS)?;
                let hi = prog.full("colmax", f32, [1, n], f64::NEG_INFINITY, at0.clone())?;
                let lo = prog.full("colmin", f32, [1, n], f64::INFINITY, at0)?;
                let args = prog.args(&[x, hi, lo]).scalar("m", m).scalar("n", n);
                prog.launch("maxmin", maxmin_kernel, args);
                prog.verify(
                    hi,
                    Expr::Max {
                        input: t("x"),
                        axis: 0,
                    },
                    None,
                );
                prog.verify(
                    lo,
                    Expr::Min {
                        input: t("x"),
                        axis: 0,
                    },
                    None,
                );
            }
            "ticket" => {
                let i32 = Dtype::I32;
                let counter = prog.zeros("counter", i32, [1, 1], at0.clone())?;
                let taken = prog.zeros("taken", i32, [np, 1], at0.clone())?;
                let claimed = prog.zeros("claimed", i32, [1, n], at0.clone())?;
                let winners = prog.zeros("winners", i32, [1, 1], at0.clone())?;
                let bits = prog.zeros("bits", i32, [1, 1], at0)?;
                // The expected values, computed here on the host.
                let all_bits = (0..np).fold(0u32, |acc, i| acc | 1 << (i % 31)) as i32;
                let host = |v: i32, rows: u64, cols: u64| -> Vec<u8> {
                    v.to_le_bytes().repeat((rows * cols) as usize)
                };
                let want = [
                    ("counter_ref", np as i32, 1, 1),
                    ("taken_ref", 1, np, 1),
                    ("claimed_ref", 1, 1, n),
                    ("winners_ref", 1, 1, 1),
                    ("bits_ref", all_bits, 1, 1),
                ];
                for (name, v, rows, cols) in want {
                    prog.data(
                        name,
                        i32,
                        [rows, cols],
                        host(v, rows, cols),
                        Placement::host_only(),
                    )?;
                }
                let args = prog.args(&[counter, taken, claimed, winners, bits]);
                prog.launch("ticket", ticket_kernel, args);
                for (out, name) in [
                    (counter, "counter_ref"),
                    (taken, "taken_ref"),
                    (claimed, "claimed_ref"),
                    (winners, "winners_ref"),
                    (bits, "bits_ref"),
                ] {
                    prog.verify(out, Expr::Tensor(name.into()), None);
                }
            }
            other => {
                return Err(p.err("op", format!("{other:?} is not splitk, maxmin or ticket")));
            }
        }
        Ok(())
    }
}
