//! `gather`: out = table[idx], a data-dependent kernel.

use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};
use rand::Rng;

use crate::t;

/// `gather` (data-dependent): `out[i, :] = table[idx[i], :]`. Each PE loads
/// its slice of the indices, then, for each index value it read, loads that
/// row of its local copy of the table and stores it: which rows are moved
/// depends on the data, so different inputs give different op logs.
#[derive(Debug)]
pub struct Gather;

const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "256",
        help: "indices (rows of the output)",
    },
    ParamSpec {
        name: "vocab",
        default: "1024",
        help: "rows of the table",
    },
    ParamSpec {
        name: "dim",
        default: "64",
        help: "columns of the table and output",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "table element type",
    },
];

fn gather_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (table, idx, out) = (args.tensor("table"), args.tensor("idx"), args.tensor("out"));
    let (Some(st), Some(si), Some(so)) =
        (table.shard(tl.pe()), idx.shard(tl.pe()), out.shard(tl.pe()))
    else {
        return;
    };
    let dim = (st.row_bytes / table.elem_bytes()) as u32;
    let indices = tl.load(Block::in_shard(idx, si, 0, 0, si.rows as u32, 1));
    for i in 0..si.rows {
        // A data-dependent choice: the next load depends on a loaded value.
        let row = indices.get(i as usize, 0);
        assert!(
            row >= 0.0 && (row as u64) < st.rows,
            "index {row} outside the {}-row table",
            st.rows
        );
        let t = tl.load(Block::in_shard(table, st, row as u64, 0, 1, dim));
        tl.store(Block::in_shard(out, so, i, 0, 1, dim), &t);
    }
}

impl Workload for Gather {
    fn name(&self) -> &str {
        "gather"
    }

    fn about(&self) -> &str {
        "out = table[idx]: loads indices, then loads the table rows they name (data-dependent)"
    }

    fn params(&self) -> &[ParamSpec] {
        PARAMS
    }

    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let (rows, vocab, dim, dtype) = (
            p.u64("rows", 1)?,
            p.u64("vocab", 1)?,
            p.u64("dim", 1)?,
            p.dtype("dtype")?,
        );
        if vocab > 1 << 24 {
            return Err(p.err("vocab", format!("at most 2^24 rows, got {vocab}")));
        }
        if rows > 1 << 31 {
            return Err(p.err("rows", format!("at most 2^31 indices, got {rows}")));
        }
        let table = prog.random("table", dtype, [vocab, dim], Sharding::REPLICATE)?;
        let idx_data: Vec<u8> = (0..rows)
            .flat_map(|_| (prog.rng().random_range(0..vocab) as i32).to_le_bytes())
            .collect();
        let idx = prog.data("idx", Dtype::I32, [rows, 1], idx_data, Sharding::ROWS)?;
        let out = prog.zeros("out", dtype, [rows, dim], Sharding::ROWS)?;
        let args = prog.args(&[table, idx, out]);
        prog.launch("gather", gather_kernel, args);
        prog.verify(
            out,
            Expr::Gather {
                table: t("table"),
                indices: t("idx"),
            },
            None,
        );
        Ok(())
    }
}
