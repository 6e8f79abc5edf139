//! Composite ops: tiled HBM -> HBM pipelines built on the `tl` primitives
//! (the seeds' tile tokens, ADR-0052 D5). Each tile token moves through
//! DMA_READ -> GEMM or MATH -> DMA_WRITE; every op a stage issues is
//! recorded as `TileToken/<STAGE>`. Double-buffered: the reads of token
//! t+1 are in flight while token t computes and writes, so stages overlap.

use super::{Block, LoadHandle, Operand, Pending, Tl};

pub const DMA_READ: &str = "TileToken/DMA_READ";
pub const GEMM: &str = "TileToken/GEMM";
pub const MATH: &str = "TileToken/MATH";
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
/// output tiles; each token reads its full-depth A rows and B columns.
/// The result is cast to c's dtype when it differs from the accumulator's.
pub fn gemm(tl: &mut Tl<'_>, a: Block, b: Block, c: Block, block_m: u32, block_n: u32) {
    assert_eq!(a.cols, b.rows, "composite gemm: inner dimensions differ");
    assert_eq!(
        (c.rows, c.cols),
        (a.rows, b.cols),
        "composite gemm: output shape differs"
    );
    let mut tokens = Vec::new();
    for i in (0..c.rows).step_by(block_m as usize) {
        for j in (0..c.cols).step_by(block_n as usize) {
            tokens.push((i, j, block_m.min(c.rows - i), block_n.min(c.cols - j)));
        }
    }
    let read = |tl: &mut Tl<'_>, (i, j, m, n): (u32, u32, u32, u32)| -> (LoadHandle, LoadHandle) {
        tl.set_stage(Some(DMA_READ));
        let ha = tl.load_async(sub(a, i, 0, m, a.cols));
        let hb = tl.load_async(sub(b, 0, j, b.rows, n));
        (ha, hb)
    };
    let mut next = tokens.first().map(|&t| read(tl, t));
    for (t, &(i, j, m, n)) in tokens.iter().enumerate() {
        let (ha, hb) = next.take().expect("reads issued one token ahead");
        if let Some(&following) = tokens.get(t + 1) {
            next = Some(read(tl, following));
        }
        let (ta, tb) = (tl.wait(ha), tl.wait(hb));
        tl.set_stage(Some(GEMM));
        let acc = tl.dot(&ta, &tb, None);
        write(tl, acc, sub(c, i, j, m, n));
    }
    tl.set_stage(None);
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
