//! `allreduce`: a collective over a group of PEs, verified against its
//! reference: all-reduce (ring or tree), reduce-scatter, all-gather or
//! broadcast, from `kb_sim::collective`.

use kb_format::{Dtype, Expr};
use kb_sim::collective::{self, Algorithm, Comm};
use kb_sim::kernel::{KernelArgs, Tl};
use kb_sim::topology::AddressModel;
use kb_sim::workload::{
    ParamSpec, Params, Payload, Placement, Policy, Program, Workload, WorkloadError,
};

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
        default: "auto",
        help: "ring (reduce-scatter + all-gather around the group), tree (all_reduce: reduce + broadcast), direct (pull-reduce-scatter + push-all-gather, for a cube), hierarchical (all_reduce: direct in each cube, ring across cubes) or auto (direct inside a cube, hierarchical across cubes with equal members, else ring); broadcast always runs down the tree",
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
        name: "memory",
        default: "hbm",
        help: "where the buffers are: hbm, or tcm (on chip: each member's TCM)",
    },
    ParamSpec {
        name: "slot_kib",
        default: "32",
        help: "KiB of each receive slot (a message)",
    },
    ParamSpec {
        name: "depth",
        default: "auto",
        help: "slots per channel (messages in flight per link), or auto: from the route's bandwidth-delay product (collective::depth_for)",
    },
    ParamSpec {
        name: "sync",
        default: "1",
        help: "0 drops the wait for each message's arrival (a race, reported by kb-sim --races)",
    },
];

/// The collectives, as kernels know them.
const OPS: [&str; 4] = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"];

/// The algorithms, as kernels know them (by index).
pub(crate) const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Ring,
    Algorithm::Tree,
    Algorithm::Direct,
    Algorithm::Hierarchical,
    Algorithm::Auto,
];

fn collective_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y, slots) = (args.tensor("x"), args.tensor("y"), args.tensor("slots"));
    let group = tl.launch_group();
    // x and y come from the host, before the launch, nothing here touches
    // them before the collective, and only the host reads y, after the
    // launch: no handshake, and no notification of each push.
    let mut comm = Comm::new(tl, group, slots, args.get("depth") as u32, 0)
        .ready_at_launch()
        .read_after_launch();
    if args.get("sync") == 0 {
        comm = comm.without_arrival_waits();
    }
    let algorithm = ALGORITHMS[args.get("algorithm") as usize];
    match OPS[args.get("op") as usize] {
        "all_reduce" => comm.all_reduce(tl, x, y, algorithm),
        "reduce_scatter" => comm.reduce_scatter(tl, x, y, algorithm),
        "all_gather" => comm.all_gather(tl, x, y, algorithm),
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
        let algorithm = Algorithm::parse(p.str("algorithm")).ok_or_else(|| {
            p.err(
                "algorithm",
                "must be ring, tree, direct, hierarchical or auto",
            )
        })?;
        match (op, algorithm) {
            ("broadcast", Algorithm::Tree | Algorithm::Auto) | ("all_reduce", _) => {}
            ("broadcast", _) => {
                return Err(p.err("algorithm", "broadcast runs down the tree (tree or auto)"));
            }
            (_, Algorithm::Tree | Algorithm::Hierarchical) => {
                return Err(p.err(
                    "algorithm",
                    format!("{op} runs by ring or direct (or auto); tree and hierarchical are all_reduce's"),
                ));
            }
            _ => {}
        }
        let on_chip = match p.str("memory") {
            "hbm" => false,
            "tcm" => true,
            other => return Err(p.err("memory", format!("{other:?} is not hbm or tcm"))),
        };
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
        let stacked = if on_chip { stacked.in_tcm() } else { stacked };
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
                    if on_chip {
                        Placement::over(&group[..1], Policy::Replicate).in_tcm()
                    } else {
                        Placement::over(&group[..1], Policy::Replicate)
                    },
                )?,
                prog.zeros("y", dtype, [n * rows, cols], stacked)?,
                Expr::Tile {
                    input: t("x"),
                    reps: n,
                },
            ),
        };
        let slot_bytes = p.u64("slot_kib", 1)? * 1024;
        // Broadcast runs down the tree; the others as chosen (`auto`
        // resolved as the kernels will: slots only for what runs).
        let peers_reach = on_chip || prog.machine().topo.address_model != AddressModel::La;
        let uses = match op {
            "broadcast" => Algorithm::Tree,
            _ => algorithm.resolve(&group, peers_reach),
        };
        let depth = crate::collective_depth(p, prog, &group, slot_bytes, &[uses])?;
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
            .scalar(
                "algorithm",
                ALGORITHMS.iter().position(|&a| a == algorithm).unwrap_or(0) as u64,
            )
            .scalar("sync", p.u64("sync", 0)?.min(1));
        let launch = prog.launch_grid(op, collective_kernel, args, [n as u32, 1], &group)?;
        let buffer = rows * cols * dtype.size() as u64;
        prog.payload(
            launch,
            match op {
                "all_reduce" => Payload::all_reduce(buffer, group.len()),
                "broadcast" => Payload::broadcast(buffer),
                // A member's whole input (reduce-scatter) or output
                // (all-gather): `rows` x `cols` either way.
                _ => Payload::scatter_or_gather(buffer, group.len()),
            },
        );
        let summed = op == "all_reduce" || op == "reduce_scatter";
        prog.verify(
            y,
            reference,
            summed.then(|| collective_tolerance(dtype, n)).flatten(),
        );
        Ok(())
    }
}
