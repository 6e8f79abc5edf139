//! Blocks of N-d tensors in N-d coordinates ([`Block::nd`]): a block of a
//! tensor of more than 2 dims is moved as a 2-D tile whose rows are the
//! block's leading dims flattened, each run of rows contiguous in the
//! tensor's 2-D view a [`Block::of`] of it (so its parts, DMAs and timing
//! are `Block::of`'s).

use super::*;

impl Block {
    /// The block of N-d tensor `t` starting at index `start` with `sizes`
    /// elements along each dim (both one entry per dim of
    /// [`TensorArg::dims`], outermost first), as PE `pe` reads or writes
    /// it: a 2-D tile of `product(sizes[..n-1])` rows x `sizes[n-1]`
    /// columns, the leading dims flattened row-major (`Block::nd(t, pe,
    /// &[b, r, c], &[nb, nr, nc])` is an `(nb*nr) x nc` tile whose row
    /// `i*nr + j` is tensor row `(b+i, r+j)`).
    ///
    /// Each slab of the block that is contiguous in the tensor's 2-D view
    /// `[product of the leading dims, last dim]` ([`TensorArg::shape`]) is
    /// one [`Block::of`] of that view: where the block spans its inner
    /// leading dims whole (`nr == dims[1]` above), the slabs merge into
    /// one. A load or store moves each part of each slab by its own DMA,
    /// exactly as `Block::of` does; a 2-D tensor's `Block::nd(t, pe, &[r,
    /// c], &[nr, nc])` is `Block::of(t, pe, r, c, nr, nc)`, and a 1-D
    /// tensor's is a one-row tile.
    ///
    /// Panics (a kernel failure naming the tensor and the kernel's line)
    /// if `start` or `sizes` has not one entry per dim, a size is 0, the
    /// block runs past a dim, the tile's rows pass `u32`, or (as
    /// `Block::of`) a part lies where `pe` cannot address it.
    #[track_caller]
    pub fn nd(t: &TensorArg, pe: PeCoord, start: &[u64], sizes: &[u32]) -> TensorBlock {
        let dims = &t.dims;
        let n = dims.len();
        let shown = || {
            let d: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("{} ({})", t.name, d.join("x"))
        };
        if n == 0 || start.len() != n || sizes.len() != n {
            panic!(
                "block at {start:?} of sizes {sizes:?} ({} and {} dims) does not match {}, which has {n} dims: give one start and one size per dim",
                start.len(),
                sizes.len(),
                shown()
            );
        }
        for (k, ((&s, &size), &d)) in start.iter().zip(sizes).zip(dims).enumerate() {
            let end = s.checked_add(size as u64);
            if size == 0 || end.is_none_or(|e| e > d) {
                panic!(
                    "block at {start:?} of sizes {sizes:?} runs past {} in dim {k} ({s}..+{size} of {d})",
                    shown()
                );
            }
        }
        let (c0, cols) = (start[n - 1], sizes[n - 1]);
        if n == 1 {
            return Block::of(t, pe, 0, c0, 1, cols);
        }
        let lead = n - 1;
        let tile_rows = sizes[..lead]
            .iter()
            .try_fold(1u32, |acc, &s| acc.checked_mul(s))
            .unwrap_or_else(|| {
                panic!(
                    "block of sizes {sizes:?} of {} has more than 2^32 rows (its leading sizes' product)",
                    shown()
                )
            });
        // Rows of the 2-D view one step along leading dim k spans.
        let mut stride = vec![1u64; lead];
        let mut acc = 1u64;
        for (s, &d) in stride.iter_mut().zip(&dims[..lead]).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        // Dim j: the outermost leading dim such that the block covers
        // every leading dim inside it whole, so each index of dims
        // 0..j is one contiguous band of rows.
        let mut j = lead - 1;
        while j > 0 && start[j] == 0 && sizes[j] as u64 == dims[j] {
            j -= 1;
        }
        let band_rows = sizes[j] * (stride[j] as u32);
        let mut parts: Vec<Part> = Vec::new();
        let mut idx: Vec<u64> = start[..j].to_vec();
        let mut tile_row = 0u32;
        loop {
            let row0 =
                idx.iter().zip(&stride).map(|(&i, &s)| i * s).sum::<u64>() + start[j] * stride[j];
            let band = Block::of(t, pe, row0, c0, band_rows, cols);
            if j == 0 {
                return band;
            }
            parts.extend(band.parts().iter().map(|p| Part {
                row: p.row + tile_row,
                ..*p
            }));
            tile_row += band_rows;
            // The next index of dims 0..j, row-major.
            let mut k = j;
            loop {
                if k == 0 {
                    return TensorBlock::from_parts(tile_rows, cols, t.dtype, parts);
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < start[k] + sizes[k] as u64 {
                    break;
                }
                idx[k] = start[k];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PE: PeCoord = PeCoord {
        sip: 0,
        cube: 0,
        pe: 0,
    };

    /// An f32 tensor of `dims` wholly in `PE`'s HBM at address 0x1000.
    fn tensor(dims: &[u64]) -> TensorArg {
        let view = crate::shape::Shape::from(dims).matrix();
        TensorArg {
            name: "x".into(),
            dtype: Dtype::F32,
            shape: view,
            dims: dims.to_vec(),
            space: Space::Hbm,
            shards: vec![ShardArg {
                pe: PE,
                addr: 0x1000,
                rows: view[0],
                row_bytes: view[1] * 4,
                row0: 0,
                col0: 0,
            }],
            shards_in_order: true,
            peers_reach: true,
        }
    }

    /// (address, rows, cols, tile row, tile col) of each part.
    fn parts(b: &TensorBlock) -> Vec<(u64, u32, u32, u32, u32)> {
        b.parts()
            .iter()
            .map(|p| (p.block.addr.addr, p.block.rows, p.block.cols, p.row, p.col))
            .collect()
    }

    #[test]
    fn a_block_is_one_slab_per_leading_index_that_is_not_contiguous() {
        // 2 x 3 x 5 x 4: view rows 30 of 16 bytes; row (i, j, k) is
        // 15 i + 5 j + k. Block at (1, 1, 2, 1) of 1 x 2 x 3 x 2: rows
        // 22..25 and 27..30, columns 1..3.
        let t = tensor(&[2, 3, 5, 4]);
        let b = Block::nd(&t, PE, &[1, 1, 2, 1], &[1, 2, 3, 2]);
        assert_eq!(b.shape(), (6, 2));
        assert_eq!(
            parts(&b),
            vec![
                (0x1000 + 22 * 16 + 4, 3, 2, 0, 0),
                (0x1000 + 27 * 16 + 4, 3, 2, 3, 0),
            ]
        );
        // Two outer indices by two: four slabs, row-major.
        let b = Block::nd(&t, PE, &[0, 1, 4, 0], &[2, 2, 1, 4]);
        assert_eq!(b.shape(), (4, 4));
        let rows: Vec<u64> = parts(&b).iter().map(|p| (p.0 - 0x1000) / 16).collect();
        assert_eq!(rows, vec![9, 14, 24, 29]);
        let at: Vec<u32> = parts(&b).iter().map(|p| p.3).collect();
        assert_eq!(at, vec![0, 1, 2, 3]);
    }

    #[test]
    fn whole_inner_dims_merge_into_one_band() {
        let t = tensor(&[2, 3, 5, 4]);
        // Dims 1 and 2 whole: index 1 of dim 0 is rows 15..30, one part.
        let b = Block::nd(&t, PE, &[1, 0, 0, 0], &[1, 3, 5, 4]);
        assert_eq!(b.shape(), (15, 4));
        assert_eq!(parts(&b), vec![(0x1000 + 15 * 16, 15, 4, 0, 0)]);
        // Dim 2 whole, dim 1 partial: one band of rows 5..15.
        let b = Block::nd(&t, PE, &[0, 1, 0, 2], &[1, 2, 5, 2]);
        assert_eq!(parts(&b), vec![(0x1000 + 5 * 16 + 8, 10, 2, 0, 0)]);
        // A 2-D tensor's block is Block::of's; a 1-D one's is one row.
        let t2 = tensor(&[7, 4]);
        assert_eq!(
            Block::nd(&t2, PE, &[2, 1], &[3, 2]),
            Block::of(&t2, PE, 2, 1, 3, 2)
        );
        let t1 = tensor(&[9]);
        let b = Block::nd(&t1, PE, &[3], &[4]);
        assert_eq!(parts(&b), vec![(0x1000 + 12, 1, 4, 0, 0)]);
    }

    #[test]
    fn slabs_that_span_shards_keep_their_parts() {
        // 2 x 4 x 3 over two PEs: view rows 0..5 on PE 0, 5..8 on PE 1.
        let mut t = tensor(&[2, 4, 3]);
        let pe1 = PeCoord { pe: 1, ..PE };
        t.shards = vec![
            ShardArg {
                pe: PE,
                addr: 0x1000,
                rows: 5,
                row_bytes: 12,
                row0: 0,
                col0: 0,
            },
            ShardArg {
                pe: pe1,
                addr: 0x9000,
                rows: 3,
                row_bytes: 12,
                row0: 5,
                col0: 0,
            },
        ];
        // Rows (0, 2..4) = 2..4 on PE 0 and (1, 2..4) = 6..8 on PE 1.
        let b = Block::nd(&t, PE, &[0, 2, 0], &[2, 2, 3]);
        assert_eq!(
            parts(&b),
            vec![(0x1000 + 2 * 12, 2, 3, 0, 0), (0x9000 + 12, 2, 3, 2, 0)]
        );
        // Slabs rows 0..2 (PE 0) and 4..6 (row 4 on PE 0, 5 on PE 1):
        // three parts, each at its place in the 4-row tile.
        let b = Block::nd(&t, PE, &[0, 0, 0], &[2, 2, 3]);
        assert_eq!(b.shape(), (4, 3));
        assert_eq!(
            parts(&b),
            vec![
                (0x1000, 2, 3, 0, 0),
                (0x1000 + 4 * 12, 1, 3, 2, 0),
                (0x9000, 1, 3, 3, 0)
            ]
        );
        // Index 1 of dim 0 whole: one band, rows 4..8, in two parts.
        let b = Block::nd(&t, pe1, &[1, 0, 0], &[1, 4, 3]);
        assert_eq!(
            parts(&b),
            vec![(0x1000 + 4 * 12, 1, 3, 0, 0), (0x9000, 3, 3, 1, 0)]
        );
    }

    fn message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let e = std::panic::catch_unwind(f).unwrap_err();
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn rank_mismatches_and_blocks_past_a_dim_name_the_tensor() {
        let t = tensor(&[4, 300, 64]);
        let e = message(|| {
            Block::nd(&t, PE, &[0, 0], &[1, 64]);
        });
        assert!(
            e.contains("block at [0, 0] of sizes [1, 64] (2 and 2 dims) does not match x (4x300x64), which has 3 dims"),
            "{e}"
        );
        let e = message(|| {
            Block::nd(&t, PE, &[3, 290, 0], &[1, 16, 64]);
        });
        assert!(
            e.contains("runs past x (4x300x64) in dim 1 (290..+16 of 300)"),
            "{e}"
        );
        let e = message(|| {
            Block::nd(&t, PE, &[0, 0, 0], &[1, 0, 64]);
        });
        assert!(e.contains("in dim 1 (0..+0 of 300)"), "{e}");
    }
}
