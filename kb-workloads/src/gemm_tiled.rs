//! `gemm_tiled`: C = A @ B with fixed-size, masked tiles and a K loop,
//! output blocks spread over the PEs by rows, columns or a 2-D grid.

use kb_format::Expr;
use kb_sim::kernel::{KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Policy, Program, Sharding, Workload, WorkloadError};

use crate::{gemm_output_dtype, gemm_tolerance, matmul_shard, t};

/// `gemm_tiled`: each PE computes one block of C from the rows of A and
/// the columns of B that block needs, output tile by output tile with a K
/// loop inside, accumulating with `dot` in place. How C is split over the
/// PEs is the `grid` parameter.
#[derive(Debug)]
pub struct GemmTiled;

/// How C's blocks, and with them A and B, are spread over the PEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grid {
    /// C and A by rows over every PE, B replicated.
    Rows,
    /// C and B by columns over every PE, A replicated.
    Cols,
    /// A 2-D grid: C's rows over the cubes and its columns over each
    /// cube's PEs; a cube's PEs share its rows of A and each holds its
    /// columns of B.
    TwoD,
}

impl Grid {
    const ALL: [(&'static str, Grid); 3] = [
        ("rows", Grid::Rows),
        ("2d", Grid::TwoD),
        ("cols", Grid::Cols),
    ];

    /// Sharding of (A, B, C).
    fn shardings(self) -> [Sharding; 3] {
        match self {
            Grid::Rows => [Sharding::ROWS, Sharding::REPLICATE, Sharding::ROWS],
            Grid::Cols => [Sharding::REPLICATE, Sharding::COLUMNS, Sharding::COLUMNS],
            Grid::TwoD => [
                Sharding {
                    cube: Policy::RowWise,
                    pe: Policy::Replicate,
                },
                Sharding {
                    cube: Policy::Replicate,
                    pe: Policy::ColumnWise,
                },
                Sharding {
                    cube: Policy::RowWise,
                    pe: Policy::ColumnWise,
                },
            ],
        }
    }

    /// (largest, total) output elements the PEs compute, each block
    /// padded up to whole `bm` x `bn` tiles: the padded work that `auto`
    /// minimises, the largest first since the slowest PE ends the run.
    fn padded_work(self, prog: &Program<'_>, [m, n]: [u64; 2], bm: u64, bn: u64) -> (u64, u64) {
        prog.parts([m, n], self.shardings()[2])
            .iter()
            .map(|(_, [r0, r1, c0, c1])| (r1 - r0).div_ceil(bm) * bm * (c1 - c0).div_ceil(bn) * bn)
            .fold((0, 0), |(max, sum), w| (max.max(w), sum + w))
    }

    /// Whether the address model can hold A, B and C this way.
    fn fits(self, prog: &Program<'_>, [m, n, k]: [u64; 3]) -> bool {
        let [sa, sb, sc] = self.shardings();
        prog.can_shard([m, k], sa) && prog.can_shard([k, n], sb) && prog.can_shard([m, n], sc)
    }

    /// The `grid` parameter: a named layout, or `auto`, the one with the
    /// least padded work that the address model can hold (ties: rows,
    /// then 2d, then cols).
    fn choose(
        p: &Params,
        prog: &Program<'_>,
        [m, n, k]: [u64; 3],
        bm: u64,
        bn: u64,
    ) -> Result<Grid, WorkloadError> {
        let s = p.str("grid");
        if s == "auto" {
            // Rows always fits: every part is a run of whole rows.
            return Ok(Grid::ALL
                .iter()
                .map(|&(_, g)| g)
                .filter(|g| g.fits(prog, [m, n, k]))
                .min_by_key(|g| g.padded_work(prog, [m, n], bm, bn))
                .unwrap_or(Grid::Rows));
        }
        let g = Grid::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|&(_, g)| g)
            .ok_or_else(|| p.err("grid", format!("unknown grid {s:?} (auto, rows, cols, 2d)")))?;
        if g.fits(prog, [m, n, k]) {
            Ok(g)
        } else {
            Err(p.err(
                "grid",
                format!("{s} splits columns, and this topology's address model (LA 1:1) needs each PE's part of a tensor contiguous; use rows or auto"),
            ))
        }
    }
}

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "m",
        default: "256",
        help: "rows of A and C",
    },
    ParamSpec {
        name: "n",
        default: "256",
        help: "columns of B and C",
    },
    ParamSpec {
        name: "k",
        default: "256",
        help: "columns of A, rows of B",
    },
    ParamSpec {
        name: "block_m",
        default: "64",
        help: "tile rows of A and C",
    },
    ParamSpec {
        name: "block_n",
        default: "64",
        help: "tile columns of B and C",
    },
    ParamSpec {
        name: "block_k",
        default: "64",
        help: "tile depth",
    },
    ParamSpec {
        name: "dtype",
        default: "f16",
        help: "input and output element type",
    },
    ParamSpec {
        name: "grid",
        default: "auto",
        help: "how C is split over the PEs: rows, cols, 2d (rows over cubes, columns over each cube's PEs), or auto (least padded work)",
    },
];

fn gemm_tiled_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let (bm, bn, bk) = (
        args.get("block_m"),
        args.get("block_n"),
        args.get("block_k"),
    );
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    matmul_shard(tl, (a, b, c), (sa, sb, sc), (bm, bn, bk));
}

impl Workload for GemmTiled {
    fn name(&self) -> &str {
        "gemm_tiled"
    }

    fn about(&self) -> &str {
        "C = A @ B over a grid of PEs: fixed-size tiles with masked edge loads, dot in a K loop, masked stores"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (m, n, k) = (p.u64("m", 1)?, p.u64("n", 1)?, p.u64("k", 1)?);
        let dtype = p.dtype("dtype")?;
        let (bm, bn, bk) = (
            p.u64("block_m", 1)?,
            p.u64("block_n", 1)?,
            p.u64("block_k", 1)?,
        );
        let [sa, sb, sc] = Grid::choose(p, prog, [m, n, k], bm, bn)?.shardings();
        let a = prog.random("a", dtype, [m, k], sa)?;
        let b = prog.random("b", dtype, [k, n], sb)?;
        // Integer products are exact only in the i32 accumulator.
        let c = prog.zeros("c", gemm_output_dtype(dtype), [m, n], sc)?;
        let args = prog
            .args(&[a, b, c])
            .scalar("block_m", bm)
            .scalar("block_n", bn)
            .scalar("block_k", bk);
        prog.launch("gemm_tiled", gemm_tiled_kernel, args);
        prog.verify(c, Expr::Matmul(t("a"), t("b")), gemm_tolerance(dtype, k));
        Ok(())
    }
}
