//! `allreduce`: a collective over a group of PEs, verified against its
//! reference: all-reduce (ring or tree), reduce-scatter, all-gather or
//! broadcast, from `kb_sim::collective`.

use kb_format::{Dtype, Expr};
use kb_sim::collective::{self, Algorithm, Comm};
use kb_sim::kernel::{KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Placement, Policy, Program, Workload, WorkloadError};

use crate::{collective_tolerance, group_of, t};

/// `allreduce`: each member of a group of PEs holds a `size`-element
/// buffer (`size / cols` x `cols`) in its HBM; the collective combines
/// them through PE-to-PE copies into receive slots in the members' TCM,
/// and every member's output is checked.
#[derive(Debug)]
pub struct AllReduce;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "op",
        default: "all_reduce",
        help: "all_reduce, reduce_scatter, all_gather or broadcast (from rank 0)",
    },
    ParamSpec {
        name: "algorithm",
        default: "ring",
        help: "all_reduce's algorithm: ring (reduce-scatter + all-gather) or tree (reduce + broadcast)",
    },
    ParamSpec {
        name: "size",
        default: "65536",
        help: "elements of each member's buffer (a multiple of cols)",
    },
    ParamSpec {
        name: "cols",
        default: "256",
        help: "columns of the buffer",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type (f32, f16, bf16, i32)",
    },
    ParamSpec {
        name: "group",
        default: "cube",
        help: "members: cube (cube 0's PEs), sip (SIP 0's PEs), all (every PE), cubes (PE 0 of each cube of SIP 0), sips (PE 0 of cube 0 of each SIP)",
    },
    ParamSpec {
        name: "slot_kib",
        default: "32",
        help: "KiB of each receive slot (a message)",
    },
    ParamSpec {
        name: "depth",
        default: "4",
        help: "slots per channel (messages in flight per link)",
    },
    ParamSpec {
        name: "sync",
        default: "1",
        help: "0 drops the wait for each message's arrival (a race, reported by kb-sim --races)",
    },
];

/// The collectives, as kernels know them.
const OPS: [&str; 4] = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"];

fn collective_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y, slots) = (args.tensor("x"), args.tensor("y"), args.tensor("slots"));
    let group = tl.launch_group();
    let mut comm = Comm::new(tl, group, slots, args.get("depth") as u32, 0);
    if args.get("sync") == 0 {
        comm = comm.without_arrival_waits();
    }
    let algorithm = if args.get("tree") == 1 {
        Algorithm::Tree
    } else {
        Algorithm::Ring
    };
    match OPS[args.get("op") as usize] {
        "all_reduce" => comm.all_reduce(tl, x, y, algorithm),
        "reduce_scatter" => comm.reduce_scatter(tl, x, y),
        "all_gather" => comm.all_gather(tl, x, y),
        _ => comm.broadcast(tl, x, y, 0),
    }
}

impl Workload for AllReduce {
    fn name(&self) -> &str {
        "allreduce"
    }

    fn about(&self) -> &str {
        "a collective (all-reduce ring/tree, reduce-scatter, all-gather, broadcast) over a group of PEs, through PE-to-PE copies"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let op = p.str("op");
        let op_code = OPS
            .iter()
            .position(|&o| o == op)
            .ok_or_else(|| p.err("op", format!("{op:?} is not one of {}", OPS.join(", "))))?;
        let algorithm = Algorithm::parse(p.str("algorithm"))
            .ok_or_else(|| p.err("algorithm", "must be ring or tree"))?;
        if algorithm == Algorithm::Tree && op != "all_reduce" {
            return Err(p.err(
                "algorithm",
                format!("{op} runs by ring (broadcast: by tree); only all_reduce chooses"),
            ));
        }
        let (size, cols) = (p.u64("size", 1)?, p.u64("cols", 1)?);
        if size % cols != 0 {
            return Err(p.err("size", format!("{size} is not a multiple of cols ({cols})")));
        }
        let dtype = p.dtype("dtype")?;
        if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::I32) {
            return Err(p.err("dtype", format!("needs f32, f16, bf16 or i32, got {dtype}")));
        }
        let group = group_of(p, prog, "group")?;
        let n = group.len() as u64;
        let rows = size / cols;
        let stacked = Placement::over(&group, Policy::RowWise);
        // Inputs and outputs, stacked in rank order: member k's rows of a
        // stacked tensor are its buffer.
        let (x, y, reference) = match op {
            "all_reduce" => (
                prog.random("x", dtype, [n * rows, cols], stacked.clone())?,
                prog.zeros("y", dtype, [n * rows, cols], stacked)?,
                Expr::Tile {
                    input: Box::new(Expr::SumBlocks {
                        input: t("x"),
                        blocks: n,
                    }),
                    reps: n,
                },
            ),
            "reduce_scatter" => (
                prog.random("x", dtype, [n * rows, cols], stacked.clone())?,
                prog.zeros("y", dtype, [rows, cols], stacked)?,
                Expr::SumBlocks {
                    input: t("x"),
                    blocks: n,
                },
            ),
            "all_gather" => (
                prog.random("x", dtype, [rows, cols], stacked.clone())?,
                prog.zeros("y", dtype, [n * rows, cols], stacked)?,
                Expr::Tile {
                    input: t("x"),
                    reps: n,
                },
            ),
            _ => (
                prog.random(
                    "x",
                    dtype,
                    [rows, cols],
                    Placement::over(&group[..1], Policy::Replicate),
                )?,
                prog.zeros("y", dtype, [n * rows, cols], stacked)?,
                Expr::Tile {
                    input: t("x"),
                    reps: n,
                },
            ),
        };
        let slot_bytes = p.u64("slot_kib", 1)? * 1024;
        let depth = p.u64("depth", 1)?;
        // Broadcast runs down the tree; the other collectives around the ring.
        let uses = match op {
            "broadcast" => Algorithm::Tree,
            "all_reduce" => algorithm,
            _ => Algorithm::Ring,
        };
        let slots = collective::slots(
            prog,
            "slots",
            dtype,
            &group,
            (slot_bytes, depth as u32),
            &[uses],
        )?;
        let args = prog
            .args(&[x, y, slots])
            .scalar("depth", depth)
            .scalar("op", op_code as u64)
            .scalar("tree", (algorithm == Algorithm::Tree) as u64)
            .scalar("sync", p.u64("sync", 0)?.min(1));
        prog.launch_grid(op, collective_kernel, args, [n as u32, 1], &group)?;
        let summed = op == "all_reduce" || op == "reduce_scatter";
        prog.verify(
            y,
            reference,
            summed.then(|| collective_tolerance(dtype, n)).flatten(),
        );
        Ok(())
    }
}
