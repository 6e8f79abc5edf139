//! The `tl` memory ops: loads (plain, asynchronous, masked, by a mask
//! tile) into TCM tiles and stores from them, each a DMA the PE issues.

use super::*;

impl<'p> Tl<'p> {
    /// Load a block into a new TCM tile and wait for it; the tile holds
    /// the bytes Phase 1 read. `src` is a [`Block`] or a [`TensorBlock`]
    /// (from [`Block::of`]): a block in several parts is one DMA per part,
    /// all in flight together, into its place in the tile.
    #[track_caller]
    pub fn load(&mut self, src: impl Into<TensorBlock>) -> Tile {
        let src = src.into();
        if let Some(b) = src.single() {
            return self.load_block(b);
        }
        let h = self.load_async(src);
        self.wait(h)
    }

    #[track_caller]
    fn load_block(&mut self, src: Block) -> Tile {
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
    #[track_caller]
    fn load_into_new_tile(&mut self, src: Block) -> (Tile, DmaCmd) {
        let rb = src.row_bytes();
        let pa = self.tcm_alloc(rb * src.rows as u64, "load");
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
        let cmd = self.part_load(src, pa, rb);
        (tile, cmd)
    }

    /// The DMA of `src` into TCM at `pa`, rows `dst_stride` bytes apart.
    fn part_load(&self, src: Block, pa: u64, dst_stride: u64) -> DmaCmd {
        DmaCmd {
            mem: MemoryParams {
                src: src.addr,
                dst: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                rows: src.rows,
                row_bytes: src.row_bytes(),
                src_stride: src.row_stride,
                dst_stride,
                dtype: Some(src.dtype),
            },
            label: self.stage,
        }
    }

    /// Start loading a block into a new TCM tile; `wait` returns the tile.
    /// A block in several parts starts one DMA per part.
    #[track_caller]
    pub fn load_async(&mut self, src: impl Into<TensorBlock>) -> LoadHandle {
        let src = src.into();
        if let Some(b) = src.single() {
            let (tile, cmd) = self.load_into_new_tile(b);
            return match self.port.call(Command::DmaAsync(cmd)) {
                Reply::Issued(op) => LoadHandle {
                    op,
                    parts: Vec::new(),
                    tile,
                },
                other => {
                    panic!("load_async: the simulation answered {other:?} instead of an op id")
                }
            };
        }
        let (rows, cols) = src.shape();
        let es = src.dtype().size() as u64;
        let pa = self.tcm_alloc(rows as u64 * cols as u64 * es, "load");
        let tile = Tile {
            pa,
            rows,
            cols,
            dtype: src.dtype(),
            valid: (rows, cols),
            data: Snapshot::default(),
            flat: OnceCell::new(),
            unknown: Vec::new(),
            tcm: self.tcm.clone(),
        };
        let parts = self.issue_part_loads(&src, pa, cols);
        LoadHandle { op: 0, parts, tile }
    }

    /// One asynchronous DMA per part of `src` into a tile at `pa`, `cols`
    /// wide; returns each part's op and where it goes.
    fn issue_part_loads(&mut self, src: &TensorBlock, pa: u64, cols: u32) -> Vec<(u64, Part)> {
        let es = src.dtype().size() as u64;
        let tr = cols as u64 * es;
        let mut ops = Vec::with_capacity(src.parts().len());
        for p in src.parts() {
            let at = pa + p.row as u64 * tr + p.col as u64 * es;
            let cmd = self.part_load(p.block, at, tr);
            match self.port.call(Command::DmaAsync(cmd)) {
                Reply::Issued(op) => ops.push((op, *p)),
                other => panic!("load: the simulation answered {other:?} instead of an op id"),
            }
        }
        ops
    }

    /// Wait for each part's DMA and write its bytes (and which of them
    /// are unknown) into `out`, a tile `tr` bytes per row.
    fn gather_parts(&mut self, parts: Vec<(u64, Part)>, tr: usize, out: &mut [u8]) -> Vec<Unknown> {
        let mut unknown = Vec::new();
        for (op, p) in parts {
            let loaded = match self.port.call(Command::WaitOp(op)) {
                Reply::Data(l) => l,
                other => panic!("wait: the simulation answered {other:?} instead of data"),
            };
            let es = p.block.dtype.size();
            let vr = p.block.cols as usize * es;
            let at0 = p.row as usize * tr + p.col as usize * es;
            let mut bytes = Vec::new();
            let b = match loaded.bytes.as_slice() {
                Some(b) => b,
                None => {
                    loaded.bytes.append_range(0, loaded.bytes.len(), &mut bytes);
                    &bytes
                }
            };
            for r in 0..p.block.rows as usize {
                out[at0 + r * tr..at0 + r * tr + vr].copy_from_slice(&b[r * vr..(r + 1) * vr]);
            }
            for u in loaded.unknown {
                let (mut at, end) = (u.offset, u.offset + u.len);
                while at < end {
                    let (r, c) = (at / vr, at % vr);
                    let n = (vr - c).min(end - at);
                    unknown.push(Unknown {
                        offset: at0 + r * tr + c,
                        len: n,
                        writer: u.writer,
                    });
                    at += n;
                }
            }
        }
        unknown
    }

    /// Wait for an asynchronous load; returns its tile with the real data.
    pub fn wait(&mut self, h: LoadHandle) -> Tile {
        let LoadHandle {
            op,
            parts,
            mut tile,
        } = h;
        if parts.is_empty() {
            return match self.port.call(Command::WaitOp(op)) {
                Reply::Data(loaded) => {
                    tile.fill(loaded);
                    tile
                }
                other => panic!("wait: the simulation answered {other:?} instead of data"),
            };
        }
        let tr = tile.cols as usize * tile.dtype.size();
        let total = tile.rows as usize * tr;
        let mut own = crate::data::OwnBytes::new(total);
        let unknown = self.gather_parts(parts, tr, own.bytes_mut());
        tile.fill(Loaded {
            bytes: if total == 0 {
                Snapshot::default()
            } else {
                Snapshot::from_own(own)
            },
            unknown,
        });
        tile
    }

    /// Store a tile to a block ([`Block`] or [`TensorBlock`]: one DMA per
    /// part, from its place in the tile). Visible at issue; the
    /// transfer's timing continues in the background (see `wait_all`).
    #[track_caller]
    pub fn store(&mut self, dst: impl Into<TensorBlock>, tile: &dyn Operand) {
        let dst = dst.into();
        let (pa, rows, cols, dtype) = tile.operand();
        if (dst.rows, dst.cols, dst.dtype) != (rows, cols, dtype) {
            self.fail(
                "store",
                format!(
                    "the {}x{} {} block{} and the {rows}x{cols} {dtype} tile differ in shape or dtype (store_masked stores a tile's corner)",
                    dst.rows,
                    dst.cols,
                    dst.dtype,
                    self.block_name(&dst)
                ),
            );
        }
        self.store_parts(&dst, pa, cols);
    }

    /// One store per part of `dst` from a tile at `pa`, `cols` wide.
    fn store_parts(&mut self, dst: &TensorBlock, pa: u64, cols: u32) {
        let es = dst.dtype.size() as u64;
        let tr = cols as u64 * es;
        for p in dst.parts() {
            let b = p.block;
            let cmd = DmaCmd {
                mem: MemoryParams {
                    src: Addr {
                        space: Space::Tcm,
                        addr: pa + p.row as u64 * tr + p.col as u64 * es,
                    },
                    dst: b.addr,
                    rows: b.rows,
                    row_bytes: b.row_bytes(),
                    src_stride: tr,
                    dst_stride: b.row_stride,
                    dtype: Some(b.dtype),
                },
                label: self.stage,
            };
            self.port.post(Command::Store(cmd));
        }
    }

    /// A masked load for edge tiles (Triton's `load(ptr, mask, other)`): a
    /// `rows` x `cols` tile whose top-left `src.rows` x `src.cols` come from
    /// `src` and whose other elements are `other`. The fill is a math op on
    /// pe_math (so Phase 2 reproduces the tile's bytes); the filled part is
    /// a compute result, pending in Phase 1, but the returned tile holds
    /// every value, the fill included.
    #[track_caller]
    pub fn load_masked(
        &mut self,
        src: impl Into<TensorBlock>,
        rows: u32,
        cols: u32,
        other: f64,
    ) -> Tile {
        let src = src.into();
        if src.rows > rows || src.cols > cols {
            self.fail(
                "load_masked",
                format!(
                    "the valid {}x{} block{} exceeds the {rows}x{cols} tile",
                    src.rows,
                    src.cols,
                    self.block_name(&src)
                ),
            );
        }
        let dtype = src.dtype;
        let es = dtype.size() as u64;
        let pa = self.tcm_alloc(rows as u64 * cols as u64 * es, "load_masked");
        let mut tile = Tile {
            pa,
            rows,
            cols,
            dtype,
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
                dtype,
                axis: None,
            };
            // Padding: no useful FLOPs.
            self.port.post(Command::Math(Labeled {
                op: fill,
                label: Some("fill"),
                useful_flops: 0,
            }));
        }
        let Some(src) = src.single() else {
            // Several parts: one DMA each into its place; the rest is
            // the fill.
            let parts = self.issue_part_loads(&src, pa, cols);
            let tr = (cols as u64 * es) as usize;
            let total = rows as usize * tr;
            if total == 0 {
                let unknown = self.gather_parts(parts, tr, &mut []);
                tile.fill(Loaded {
                    bytes: Snapshot::default(),
                    unknown,
                });
                return tile;
            }
            let mut own = crate::data::OwnBytes::new(total);
            let (fill, n) = encode_element(dtype, other);
            for e in own.bytes_mut().chunks_exact_mut(n) {
                e.copy_from_slice(&fill[..n]);
            }
            let unknown = self.gather_parts(parts, tr, own.bytes_mut());
            tile.fill(Loaded {
                bytes: Snapshot::from_own(own),
                unknown,
            });
            return tile;
        };
        let cmd = self.part_load(src, pa, cols as u64 * es);
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
    #[track_caller]
    pub fn store_masked(&mut self, dst: impl Into<TensorBlock>, tile: &dyn Operand) {
        let dst = dst.into();
        let (pa, rows, cols, dtype) = tile.operand();
        if dst.rows > rows || dst.cols > cols || dst.dtype != dtype {
            self.fail(
                "store_masked",
                format!(
                    "the {}x{} {} block{} does not fit the {rows}x{cols} {dtype} tile",
                    dst.rows,
                    dst.cols,
                    dst.dtype,
                    self.block_name(&dst)
                ),
            );
        }
        self.store_parts(&dst, pa, cols);
    }

    /// An element-masked load (Triton's `load(ptr, mask=m, other=v)` with
    /// an elementwise mask): loads `src`, then keeps each element where
    /// `mask` (a u8 tile, or any tile: non-zero means keep; broadcast
    /// numpy-style) is set and puts `other` elsewhere, as a `where` on
    /// pe_math. The whole block is transferred (the DMA moves rows, not
    /// lanes); use [`Tl::load_masked`] for blocks that run past a tensor's
    /// edge. The result is a compute result.
    #[track_caller]
    pub fn load_where(
        &mut self,
        src: impl Into<TensorBlock>,
        mask: &dyn Operand,
        other: f64,
    ) -> Pending {
        let t = self.load(src);
        self.where_(mask, &t, other)
    }

    /// An element-masked store (Triton's `store(ptr, x, mask=m)`): only the
    /// elements of `tile` where `mask` is non-zero reach `dst`. Modelled as
    /// read-modify-write: load `dst`, `where(mask, tile, old)`, store the
    /// whole block.
    #[track_caller]
    pub fn store_where(
        &mut self,
        dst: impl Into<TensorBlock>,
        tile: &dyn Operand,
        mask: &dyn Operand,
    ) {
        let dst = dst.into();
        let old = self.load(dst.clone());
        let merged = self.where_(mask, tile, &old);
        self.store(dst, &merged);
    }

    /// Wait until every transfer this kernel issued has completed (timing
    /// only).
    pub fn wait_all(&mut self) {
        self.port.call(Command::WaitAll);
    }
}
