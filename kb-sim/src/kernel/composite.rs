//! Composite ops: tiled HBM -> HBM pipelines built on the `tl` primitives
//! (tile tokens, docs/design.md L5). Each tile token moves through
//! DMA_READ -> GEMM or MATH -> DMA_WRITE; every op a stage issues is
//! recorded as `TileToken/<STAGE>`. Double-buffered: the reads of token
//! t+1 are in flight while token t computes and writes, so stages overlap.

use super::{Block, Operand, Pending, Tl};

/// Op name of a pipeline's load stage (docs/design.md L5 tile tokens).
pub const DMA_READ: &str = "TileToken/DMA_READ";
/// Op name of a pipeline's GEMM stage.
pub const GEMM: &str = "TileToken/GEMM";
/// Op name of a pipeline's math stage (casts, elementwise ops).
pub const MATH: &str = "TileToken/MATH";
/// Op name of a pipeline's store stage.
pub const DMA_WRITE: &str = "TileToken/DMA_WRITE";

/// A sub-block of `b`: rows [r0, r0+rows) x cols [c0, c0+cols).
fn sub(b: Block, r0: u32, c0: u32, rows: u32, cols: u32) -> Block {
    assert!(
        r0 + rows <= b.rows && c0 + cols <= b.cols,
        "sub-block outside its block"
    );
    let es = b.dtype.size() as u64;
    Block {
        addr: kb_format::Addr {
            space: b.addr.space,
            addr: b.addr.addr + r0 as u64 * b.row_stride + c0 as u64 * es,
        },
        rows,
        cols,
        row_stride: b.row_stride,
        dtype: b.dtype,
    }
}

/// c = a @ b, all three blocks in HBM, tiled into `block_m` x `block_n`
/// output tiles; each token reads its A rows and B columns `block_k` deep
/// at a time and accumulates in TCM (`block_k` >= a's columns: one read
/// of the full depth per token). The result is cast to c's dtype when it
/// differs from the accumulator's.
pub fn gemm(
    tl: &mut Tl<'_>,
    a: Block,
    b: Block,
    c: Block,
    block_m: u32,
    block_n: u32,
    block_k: u32,
) {
    assert_eq!(a.cols, b.rows, "composite gemm: inner dimensions differ");
    assert_eq!(
        (c.rows, c.cols),
        (a.rows, b.cols),
        "composite gemm: output shape differs"
    );
    assert!(block_k > 0, "composite gemm: block_k is 0");
    // One step per (output tile, K chunk), in order; the last chunk of a
    // tile writes it.
    let mut steps = Vec::new();
    for i in (0..c.rows).step_by(block_m as usize) {
        for j in (0..c.cols).step_by(block_n as usize) {
            let (m, n) = (block_m.min(c.rows - i), block_n.min(c.cols - j));
            for kk in (0..a.cols).step_by(block_k as usize) {
                steps.push((i, j, m, n, kk, block_k.min(a.cols - kk)));
            }
        }
    }
    let read = |tl: &mut Tl<'_>, (i, j, m, n, kk, tk): (u32, u32, u32, u32, u32, u32)| {
        tl.set_stage(Some(DMA_READ));
        let ha = tl.load_async(sub(a, i, kk, m, tk));
        let hb = tl.load_async(sub(b, kk, j, tk, n));
        (ha, hb)
    };
    let mut next = steps.first().map(|&s| read(tl, s));
    let mut acc = None;
    for (t, &(i, j, m, n, kk, tk)) in steps.iter().enumerate() {
        let (ha, hb) = next.take().expect("reads issued one step ahead");
        if let Some(&following) = steps.get(t + 1) {
            next = Some(read(tl, following));
        }
        let (ta, tb) = (tl.wait(ha), tl.wait(hb));
        tl.set_stage(Some(GEMM));
        let sum = tl.dot(&ta, &tb, acc.take());
        if kk + tk == a.cols {
            write(tl, sum, sub(c, i, j, m, n));
        } else {
            acc = Some(sum);
        }
    }
    tl.set_stage(None);
}

/// The K depth per step of [`gemm`] that fits: the full `k` when a
/// step's double-buffered A and B tiles with the accumulator and its
/// cast take at most half of `tcm_bytes`, else the largest multiple of
/// 64 (at least 16) that does.
pub fn gemm_block_k(
    k: u32,
    block_m: u32,
    block_n: u32,
    in_bytes: u64,
    out_bytes: u64,
    tcm_bytes: u64,
) -> u32 {
    let (bm, bn) = (block_m as u64, block_n as u64);
    let fixed = bm * bn * (4 + out_bytes);
    let per_k = 2 * (bm + bn) * in_bytes;
    let room = (tcm_bytes / 2).saturating_sub(fixed) / per_k.max(1);
    if room >= k as u64 {
        k
    } else {
        ((room / 64 * 64).max(16)).min(k as u64) as u32
    }
}

/// Cast to the destination dtype if needed, then store (DMA_WRITE).
fn write(tl: &mut Tl<'_>, result: Pending, dst: Block) {
    if result.dtype() != dst.dtype {
        tl.set_stage(Some(MATH));
        let narrow = tl.cast(&result, dst.dtype);
        tl.set_stage(Some(DMA_WRITE));
        tl.store(dst, &narrow);
    } else {
        tl.set_stage(Some(DMA_WRITE));
        tl.store(dst, &result);
    }
}

/// An elementwise op a MATH stage applies to one tile.
pub type TileOp = fn(&mut Tl<'_>, &dyn Operand) -> Pending;

/// dst = op(src) over `block_rows`-row tiles, HBM -> HBM.
pub fn map(tl: &mut Tl<'_>, src: Block, dst: Block, block_rows: u32, op: TileOp) {
    assert_eq!(
        (src.rows, src.cols),
        (dst.rows, dst.cols),
        "composite map: shapes differ"
    );
    let rows: Vec<u32> = (0..src.rows).step_by(block_rows as usize).collect();
    let read = |tl: &mut Tl<'_>, r: u32| {
        tl.set_stage(Some(DMA_READ));
        tl.load_async(sub(src, r, 0, block_rows.min(src.rows - r), src.cols))
    };
    let mut next = rows.first().map(|&r| read(tl, r));
    for (t, &r) in rows.iter().enumerate() {
        let h = next.take().expect("reads issued one token ahead");
        if let Some(&following) = rows.get(t + 1) {
            next = Some(read(tl, following));
        }
        let tile = tl.wait(h);
        tl.set_stage(Some(MATH));
        let out = op(tl, &tile);
        write(tl, out, sub(dst, r, 0, tile.shape().0 as u32, src.cols));
    }
    tl.set_stage(None);
}

#[cfg(test)]
mod tests {
    use super::gemm_block_k;

    #[test]
    fn block_k_is_all_of_k_when_it_fits_else_a_multiple_of_64() {
        // f16 in, f16 out, 32 x 64 tiles, 1 MiB TCM: half is 524288; the
        // accumulator and its cast take 32 * 64 * 6 = 12288; each unit of
        // K costs 2 * (32 + 64) * 2 = 384 bytes: room for 1333.
        assert_eq!(gemm_block_k(256, 32, 64, 2, 2, 1 << 20), 256);
        assert_eq!(gemm_block_k(1333, 32, 64, 2, 2, 1 << 20), 1333);
        assert_eq!(gemm_block_k(1334, 32, 64, 2, 2, 1 << 20), 1280);
        // f32: 32 * 64 * 8 = 16384 fixed, 768 per unit: room for 661.
        assert_eq!(gemm_block_k(2048, 32, 64, 4, 4, 1 << 20), 640);
        // Tiles too large for any depth: the floor of 16.
        assert_eq!(gemm_block_k(2048, 4096, 4096, 4, 4, 1 << 20), 16);
        // Never deeper than K.
        assert_eq!(gemm_block_k(8, 4096, 4096, 4, 4, 1 << 20), 8);
    }
}
