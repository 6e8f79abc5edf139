//! Blocks: where a tile's elements lie. A [`Block`] is a 2-D block of one
//! memory (rows apart by a stride); a [`TensorBlock`] is a tile's worth of
//! a tensor in tensor coordinates, as the [`Part`]s each shard cell it
//! touches holds ([`Block::of`], [`Block::in_shard`]; N-d blocks in
//! `nd.rs`); a [`RowBlock`] is a block of one shard's rows
//! ([`TensorArg::row_blocks`](super::TensorArg::row_blocks)).

use kb_format::{Addr, Dtype};

use super::{ShardArg, TensorArg};
use crate::machine::PeCoord;

/// A 2-D block of memory: `rows` x `cols` elements of `dtype` starting at
/// `addr`, rows `row_stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Address of the first element (space and address as kernels use it).
    pub addr: Addr,
    /// Rows of the block.
    pub rows: u32,
    /// Elements per row.
    pub cols: u32,
    /// Bytes from one row's start to the next.
    pub row_stride: u64,
    /// Element type.
    pub dtype: Dtype,
}

impl Block {
    /// The block of tensor rows `[r0, r0+rows)` x columns `[c0, c0+cols)`,
    /// in tensor coordinates (Triton style: a program picks its block by
    /// `program_id`), as PE `pe` reads or writes it. Anywhere in the
    /// tensor: a block that `pe`'s own shard holds is one part there (a
    /// replicated tensor is read locally); one that spans shards, or lies
    /// in another PE's shard or another cube's HBM, is one part per shard
    /// it touches (each cell taken from the nearest holder: `pe`'s own
    /// shard, then its cube's, its SIP's, any). A load or store of it is
    /// one DMA per part, from or to where the part lives, issued by `pe`;
    /// a load assembles the parts in one TCM tile.
    ///
    /// Panics (a kernel failure naming the tensor) if the block runs past
    /// the tensor, or if a part lies in another PE's HBM shard under the
    /// LA address model, where `pe` cannot address it
    /// ([`TensorArg::peers_reach`]): there, a PE reaches only its own
    /// shard (walk it with [`TensorArg::row_blocks`]; other PEs' data
    /// comes by `put` or a collective).
    #[track_caller]
    pub fn of(t: &TensorArg, pe: PeCoord, r0: u64, c0: u64, rows: u32, cols: u32) -> TensorBlock {
        let (r1, c1) = (r0 + rows as u64, c0 + cols as u64);
        if r1 > t.shape[0] || c1 > t.shape[1] {
            panic!(
                "block rows {r0}..+{rows} cols {c0}..+{cols} runs past {} ({}x{})",
                t.name, t.shape[0], t.shape[1]
            );
        }
        let es = t.elem_bytes();
        let holds = |s: &ShardArg, (a, b, c, d): (u64, u64, u64, u64)| {
            let scols = s.row_bytes / es;
            a >= s.row0 && c >= s.col0 && b <= s.row0 + s.rows && d <= s.col0 + scols
        };
        let whole = (r0, r1, c0, c1);
        let one = |s: &ShardArg| TensorBlock {
            rows,
            cols,
            dtype: t.dtype,
            parts: Parts::One(Part {
                block: Block::in_shard(t, s, r0 - s.row0, c0 - s.col0, rows, cols),
                row: 0,
                col: 0,
            }),
        };
        if let Some(s) = t.shard(pe).filter(|s| holds(s, whole)) {
            return one(s);
        }
        // Nearest holder first: this PE, its cube, its SIP, then any.
        let rank = |s: &ShardArg| {
            if s.pe == pe {
                0
            } else if (s.pe.sip, s.pe.cube) == (pe.sip, pe.cube) {
                1
            } else if s.pe.sip == pe.sip {
                2
            } else {
                3
            }
        };
        let mut order: Vec<&ShardArg> = t.shards.iter().filter(|s| s.rows > 0).collect();
        order.sort_by_key(|s| rank(s));
        if t.peers_reach
            && let Some(s) = order.iter().find(|s| holds(s, whole))
        {
            return one(s);
        }
        // The cells between every shard edge inside the block, each from
        // its nearest holder; runs of cells with one holder merge.
        let mut rs = vec![r0, r1];
        let mut cs = vec![c0, c1];
        for s in &order {
            let scols = s.row_bytes / es;
            for r in [s.row0, s.row0 + s.rows] {
                if r > r0 && r < r1 {
                    rs.push(r);
                }
            }
            for c in [s.col0, s.col0 + scols] {
                if c > c0 && c < c1 {
                    cs.push(c);
                }
            }
        }
        rs.sort_unstable();
        rs.dedup();
        cs.sort_unstable();
        cs.dedup();
        // Per row band [r, r_end): its runs of (holder index, c, c_end).
        type Runs = Vec<(usize, u64, u64)>;
        let mut bands: Vec<(u64, u64, Runs)> = Vec::new();
        for rw in rs.windows(2) {
            let mut runs: Vec<(usize, u64, u64)> = Vec::new();
            for cw in cs.windows(2) {
                let cell = (rw[0], rw[1], cw[0], cw[1]);
                let Some(k) = order.iter().position(|s| holds(s, cell)) else {
                    panic!(
                        "rows {}..{} cols {}..{} of {} ({}x{}) are in no shard",
                        rw[0], rw[1], cw[0], cw[1], t.name, t.shape[0], t.shape[1]
                    );
                };
                let s = order[k];
                if !t.peers_reach && s.pe != pe {
                    panic!(
                        "block rows {r0}..+{rows} cols {c0}..+{cols} of {} ({}x{}): rows {}..{} lie in {}'s HBM shard, which {pe} cannot address under the LA model (each PE reaches only its own shard: walk it with TensorArg::row_blocks, or move other PEs' data with put or a collective)",
                        t.name, t.shape[0], t.shape[1], rw[0], rw[1], s.pe
                    );
                }
                match runs.last_mut() {
                    Some(last) if last.0 == k => last.2 = cw[1],
                    _ => runs.push((k, cw[0], cw[1])),
                }
            }
            match bands.last_mut() {
                Some(last) if last.2 == runs => last.1 = rw[1],
                _ => bands.push((rw[0], rw[1], runs)),
            }
        }
        let mut parts = Vec::new();
        for (a, b, runs) in bands {
            for (k, c, d) in runs {
                let s = order[k];
                parts.push(Part {
                    block: Block::in_shard(
                        t,
                        s,
                        a - s.row0,
                        c - s.col0,
                        (b - a) as u32,
                        (d - c) as u32,
                    ),
                    row: (a - r0) as u32,
                    col: (c - c0) as u32,
                });
            }
        }
        TensorBlock::from_parts(rows, cols, t.dtype, parts)
    }

    /// The block of rows [r0, r0+rows) x cols [c0, c0+cols) of a shard
    /// (shard coordinates), in the tensor's memory.
    #[track_caller]
    pub fn in_shard(t: &TensorArg, s: &ShardArg, r0: u64, c0: u64, rows: u32, cols: u32) -> Block {
        let es = t.elem_bytes();
        assert!(
            r0 + rows as u64 <= s.rows && (c0 + cols as u64) * es <= s.row_bytes,
            "block rows {r0}..+{rows} cols {c0}..+{cols} is outside the shard of {} ({} rows x {} cols)",
            t.name,
            s.rows,
            s.row_bytes / es
        );
        Block {
            addr: Addr {
                space: t.space,
                addr: s.addr + r0 * s.row_bytes + c0 * es,
            },
            rows,
            cols,
            row_stride: s.row_bytes,
            dtype: t.dtype,
        }
    }

    pub(super) fn row_bytes(&self) -> u64 {
        self.cols as u64 * self.dtype.size() as u64
    }
}

/// A block in tensor coordinates ([`Block::of`]): a `rows` x `cols` tile's
/// worth of a tensor, in one or more [`Part`]s, each a [`Block`] in the
/// memory that holds it. `tl.load`, `store` and their masked variants take
/// one (or a plain [`Block`], one part at the tile's corner) and move each
/// part by its own DMA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorBlock {
    pub(super) rows: u32,
    pub(super) cols: u32,
    pub(super) dtype: Dtype,
    parts: Parts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Parts {
    One(Part),
    Many(Vec<Part>),
}

/// One part of a [`TensorBlock`]: `block` (where it lives) is the part's
/// rows and columns starting at (`row`, `col`) of the tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The memory it is in.
    pub block: Block,
    /// Its first row in the tile.
    pub row: u32,
    /// Its first column in the tile.
    pub col: u32,
}

impl TensorBlock {
    /// A `rows` x `cols` block of `dtype` made of `parts` (at least one).
    pub(super) fn from_parts(rows: u32, cols: u32, dtype: Dtype, parts: Vec<Part>) -> TensorBlock {
        TensorBlock {
            rows,
            cols,
            dtype,
            parts: if parts.len() == 1 {
                Parts::One(parts[0])
            } else {
                Parts::Many(parts)
            },
        }
    }

    /// (rows, cols) of the whole block.
    pub fn shape(&self) -> (u32, u32) {
        (self.rows, self.cols)
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Its parts, in row-major order of their corners (one per shard cell
    /// it touches; one when a single shard holds it).
    pub fn parts(&self) -> &[Part] {
        match &self.parts {
            Parts::One(p) => std::slice::from_ref(p),
            Parts::Many(v) => v,
        }
    }

    /// The block as one [`Block`] when a single shard holds it (what `put`,
    /// `copy` and operands need), else `None`.
    pub fn single(&self) -> Option<Block> {
        match &self.parts {
            Parts::One(p) => Some(p.block),
            Parts::Many(_) => None,
        }
    }
}

impl From<Block> for TensorBlock {
    fn from(b: Block) -> Self {
        TensorBlock {
            rows: b.rows,
            cols: b.cols,
            dtype: b.dtype,
            parts: Parts::One(Part {
                block: b,
                row: 0,
                col: 0,
            }),
        }
    }
}

/// A block of rows of one shard, in tensor coordinates: rows
/// `[row, row+rows)` x columns `[col, col+cols)` (see
/// [`TensorArg::row_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowBlock {
    /// First tensor row.
    pub row: u64,
    /// Rows (at most the block size asked for; the last may be fewer).
    pub rows: u32,
    /// First tensor column of the shard.
    pub col: u64,
    /// Columns of the shard.
    pub cols: u32,
}
