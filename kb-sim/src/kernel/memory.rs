//! The `tl` memory ops: loads (plain, asynchronous, masked, by a mask
//! tile) into TCM tiles and stores from them, each a DMA the PE issues.

use super::*;

impl<'p> Tl<'p> {
    /// Load a block into a new TCM tile and wait for it; the tile holds
    /// the bytes Phase 1 read.
    pub fn load(&mut self, src: Block) -> Tile {
        // The tile exists before the call, so a kernel unwound mid-load
        // frees its TCM.
        let (mut tile, cmd) = self.load_into_new_tile(src);
        match self.port.call(Command::Dma(cmd)) {
            Reply::Data(loaded) => {
                tile.fill(loaded);
                tile
            }
            other => panic!("load: the simulation answered {other:?} instead of data"),
        }
    }

    /// A new TCM tile for `src` and the DMA that fills it.
    fn load_into_new_tile(&mut self, src: Block) -> (Tile, DmaCmd) {
        let rb = src.row_bytes();
        let pa = self.tcm_alloc(rb * src.rows as u64);
        let tile = Tile {
            pa,
            rows: src.rows,
            cols: src.cols,
            dtype: src.dtype,
            valid: (src.rows, src.cols),
            data: Snapshot::default(),
            flat: OnceCell::new(),
            unknown: Vec::new(),
            tcm: self.tcm.clone(),
        };
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: src.addr,
                dst: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                rows: src.rows,
                row_bytes: rb,
                src_stride: src.row_stride,
                dst_stride: rb,
                dtype: Some(src.dtype),
            },
            label: self.stage,
        };
        (tile, cmd)
    }

    /// Start loading a block into a new TCM tile; `wait` returns the tile.
    pub fn load_async(&mut self, src: Block) -> LoadHandle {
        let (tile, cmd) = self.load_into_new_tile(src);
        match self.port.call(Command::DmaAsync(cmd)) {
            Reply::Issued(op) => LoadHandle { op, tile },
            other => panic!("load_async: the simulation answered {other:?} instead of an op id"),
        }
    }

    /// Wait for an asynchronous load; returns its tile with the real data.
    pub fn wait(&mut self, h: LoadHandle) -> Tile {
        let LoadHandle { op, mut tile } = h;
        match self.port.call(Command::WaitOp(op)) {
            Reply::Data(loaded) => {
                tile.fill(loaded);
                tile
            }
            other => panic!("wait: the simulation answered {other:?} instead of data"),
        }
    }

    /// Store a tile to a block. Visible at issue; the transfer's timing
    /// continues in the background (see `wait_all`).
    pub fn store(&mut self, dst: Block, tile: &dyn Operand) {
        let (pa, rows, cols, dtype) = tile.operand();
        assert_eq!(
            (dst.rows, dst.cols, dst.dtype),
            (rows, cols, dtype),
            "store: block and tile differ in shape or dtype"
        );
        let rb = dst.row_bytes();
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                dst: dst.addr,
                rows: dst.rows,
                row_bytes: rb,
                src_stride: rb,
                dst_stride: dst.row_stride,
                dtype: Some(dst.dtype),
            },
            label: self.stage,
        };
        self.port.call(Command::Store(cmd));
    }

    /// A masked load for edge tiles (Triton's `load(ptr, mask, other)`): a
    /// `rows` x `cols` tile whose top-left `src.rows` x `src.cols` come from
    /// `src` and whose other elements are `other`. The fill is a math op on
    /// pe_math (so Phase 2 reproduces the tile's bytes); the filled part is
    /// a compute result, pending in Phase 1, but the returned tile holds
    /// every value, the fill included.
    pub fn load_masked(&mut self, src: Block, rows: u32, cols: u32, other: f64) -> Tile {
        assert!(
            src.rows <= rows && src.cols <= cols,
            "load_masked: the valid {}x{} block exceeds the {rows}x{cols} tile",
            src.rows,
            src.cols
        );
        let es = src.dtype.size() as u64;
        let pa = self.tcm_alloc(rows as u64 * cols as u64 * es);
        let mut tile = Tile {
            pa,
            rows,
            cols,
            dtype: src.dtype,
            valid: (src.rows, src.cols),
            data: Snapshot::default(),
            flat: OnceCell::new(),
            unknown: Vec::new(),
            tcm: self.tcm.clone(),
        };
        if (src.rows, src.cols) != (rows, cols) {
            let fill = MathParams {
                op: MathOp::Copy,
                inputs: one_input(MathInput::Scalar(other)),
                out: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                rows,
                cols,
                dtype: src.dtype,
                axis: None,
            };
            // Padding: no useful FLOPs.
            self.port.call(Command::Math(Labeled {
                op: fill,
                label: Some("fill"),
                useful_flops: 0,
            }));
        }
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: src.addr,
                dst: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                rows: src.rows,
                row_bytes: src.row_bytes(),
                src_stride: src.row_stride,
                dst_stride: cols as u64 * es,
                dtype: Some(src.dtype),
            },
            label: self.stage,
        };
        let valid = match self.port.call(Command::Dma(cmd)) {
            Reply::Data(loaded) => loaded,
            other => panic!("load_masked: the simulation answered {other:?} instead of data"),
        };
        let (vr, tr) = (src.row_bytes() as usize, (cols as u64 * es) as usize);
        let whole = vr == tr && src.rows == rows;
        let data = if whole {
            // Nothing masked: the loaded bytes are the tile's.
            valid.bytes
        } else {
            let (fill, n) = encode_element(src.dtype, other);
            let fill = &fill[..n];
            let total = rows as usize * tr;
            // The loaded bytes in one slice: where they lie, or gathered
            // into this kernel's scratch (no vector per load).
            let mut gathered = std::mem::take(&mut self.gather);
            let loaded = match valid.bytes.as_slice() {
                Some(b) => b,
                None => {
                    gathered.clear();
                    valid
                        .bytes
                        .append_range(0, valid.bytes.len(), &mut gathered);
                    &gathered
                }
            };
            // Each row: its loaded bytes, then the fill to the tile's width
            // (whole elements: both widths are multiples of one).
            let data = if total == 0 {
                Snapshot::default()
            } else {
                let mut own = crate::data::OwnBytes::new(total);
                let out = own.bytes_mut();
                for (r, row) in out.chunks_exact_mut(tr).enumerate() {
                    let at = if r < src.rows as usize {
                        row[..vr].copy_from_slice(&loaded[r * vr..(r + 1) * vr]);
                        vr
                    } else {
                        0
                    };
                    debug_assert_eq!((tr - at) % n, 0, "the fill is whole elements");
                    for e in row[at..].chunks_exact_mut(n) {
                        e.copy_from_slice(fill);
                    }
                }
                Snapshot::from_own(own)
            };
            self.gather = gathered;
            data
        };
        // Unknown bytes move with their rows into the wider tile.
        for u in valid.unknown {
            let (mut at, end) = (u.offset, u.offset + u.len);
            while at < end {
                let (r, c) = (at / vr, at % vr);
                let n = (vr - c).min(end - at);
                tile.unknown.push(Unknown {
                    offset: r * tr + c,
                    len: n,
                    writer: u.writer,
                });
                at += n;
            }
        }
        tile.data = data;
        tile
    }

    /// Store the top-left `dst.rows` x `dst.cols` of a larger tile (the
    /// masked store for edge tiles).
    pub fn store_masked(&mut self, dst: Block, tile: &dyn Operand) {
        let (pa, rows, cols, dtype) = tile.operand();
        assert!(
            dst.rows <= rows && dst.cols <= cols && dst.dtype == dtype,
            "store_masked: the {}x{} {} block does not fit the {rows}x{cols} {dtype} tile",
            dst.rows,
            dst.cols,
            dst.dtype
        );
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                dst: dst.addr,
                rows: dst.rows,
                row_bytes: dst.row_bytes(),
                src_stride: cols as u64 * dtype.size() as u64,
                dst_stride: dst.row_stride,
                dtype: Some(dst.dtype),
            },
            label: self.stage,
        };
        self.port.call(Command::Store(cmd));
    }

    /// An element-masked load (Triton's `load(ptr, mask=m, other=v)` with
    /// an elementwise mask): loads `src`, then keeps each element where
    /// `mask` (a u8 tile, or any tile: non-zero means keep; broadcast
    /// numpy-style) is set and puts `other` elsewhere, as a `where` on
    /// pe_math. The whole block is transferred (the DMA moves rows, not
    /// lanes); use [`Tl::load_masked`] for blocks that run past a tensor's
    /// edge. The result is a compute result.
    pub fn load_where(&mut self, src: Block, mask: &dyn Operand, other: f64) -> Pending {
        let t = self.load(src);
        self.where_(mask, &t, other)
    }

    /// An element-masked store (Triton's `store(ptr, x, mask=m)`): only the
    /// elements of `tile` where `mask` is non-zero reach `dst`. Modelled as
    /// read-modify-write: load `dst`, `where(mask, tile, old)`, store the
    /// whole block.
    pub fn store_where(&mut self, dst: Block, tile: &dyn Operand, mask: &dyn Operand) {
        let old = self.load(dst);
        let merged = self.where_(mask, tile, &old);
        self.store(dst, &merged);
    }

    /// Wait until every transfer this kernel issued has completed (timing
    /// only).
    pub fn wait_all(&mut self) {
        self.port.call(Command::WaitAll);
    }
}
