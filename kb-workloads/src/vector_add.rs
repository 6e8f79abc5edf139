//! `vector_add`: c = a + b over row shards.

use kb_format::Expr;
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

use crate::t;

/// `vector_add`: c = a + b over row shards, tile by tile.
#[derive(Debug)]
pub struct VectorAdd;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "1024",
        help: "rows of a, b and c",
    },
    ParamSpec {
        name: "cols",
        default: "1024",
        help: "columns",
    },
    ParamSpec {
        name: "tile_rows",
        default: "16",
        help: "rows per tile",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type",
    },
];

fn vector_add_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, b, c) = (args.tensor("a"), args.tensor("b"), args.tensor("c"));
    let tile_rows = args.get("tile_rows");
    let (Some(sa), Some(sb), Some(sc)) = (a.shard(tl.pe()), b.shard(tl.pe()), c.shard(tl.pe()))
    else {
        return;
    };
    let cols = (sa.row_bytes / a.elem_bytes()) as u32;
    let mut r = 0;
    while r < sa.rows {
        let n = tile_rows.min(sa.rows - r) as u32;
        let ta = tl.load(Block::in_shard(a, sa, r, 0, n, cols));
        let tb = tl.load(Block::in_shard(b, sb, r, 0, n, cols));
        let sum = tl.add(&ta, &tb);
        tl.store(Block::in_shard(c, sc, r, 0, n, cols), &sum);
        r += n as u64;
    }
}

impl Workload for VectorAdd {
    fn name(&self) -> &str {
        "vector_add"
    }

    fn about(&self) -> &str {
        "c = a + b: row shards, load two tiles, add on pe_math, store"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, cols, tile_rows, dtype) = (
            p.u64("rows", 1)?,
            p.u64("cols", 1)?,
            p.u64("tile_rows", 1)?,
            p.dtype("dtype")?,
        );
        let a = prog.random("a", dtype, [rows, cols], Sharding::ROWS)?;
        let b = prog.random("b", dtype, [rows, cols], Sharding::ROWS)?;
        let c = prog.zeros("c", dtype, [rows, cols], Sharding::ROWS)?;
        let args = prog.args(&[a, b, c]).scalar("tile_rows", tile_rows);
        prog.launch("vector_add", vector_add_kernel, args);
        prog.verify(c, Expr::Add(t("a"), t("b")), None);
        Ok(())
    }
}
