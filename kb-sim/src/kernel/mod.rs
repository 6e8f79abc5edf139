//! Kernels: plain Rust functions that drive a PE through the `tl` API
//! ([`Tl`]), run by an [`Executor`] beside the event loop (ADR-0020 D3).
//!
//! Phase 1 semantics: `load` returns a [`Tile`] holding the real bytes, so
//! kernels can branch on loaded values; `store` is visible at issue
//! (ADR-0020 "Store Visibility Rule"); tiles live in the PE's TCM and free
//! it when dropped; running out of TCM is a kernel failure naming the PE
//! and the sizes.

pub mod composite;
pub mod exec;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use kb_format::pa::Pa;
use kb_format::{
    Addr, Dtype, GemmParams, Layout, MathInput, MathOp, MathParams, MemoryParams, Space,
};
use ndarray::Array2;

pub use exec::{Executor, KernelBody, Port};

use crate::alloc::FreeList;
use crate::machine::PeCoord;
use crate::program::{Command, DmaCmd, Labeled, Reply};

pub use crate::runtime::ShardArg;

/// A tensor as a kernel sees it: shape, dtype and where each PE's shard is.
#[derive(Debug, Clone)]
pub struct TensorArg {
    pub name: String,
    pub dtype: Dtype,
    pub shape: [u64; 2],
    pub shards: Vec<ShardArg>,
}

impl TensorArg {
    /// The shard held by `pe`.
    pub fn shard(&self, pe: PeCoord) -> Option<&ShardArg> {
        self.shards.iter().find(|s| s.pe == pe)
    }

    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size() as u64
    }
}

/// Arguments shared by every kernel instance of a launch.
#[derive(Debug, Default)]
pub struct KernelArgs {
    pub tensors: Vec<TensorArg>,
    /// Named integer parameters (tile sizes and the like).
    pub scalars: Vec<(String, u64)>,
}

impl KernelArgs {
    /// The tensor named `name`; panics (a kernel failure) if absent.
    pub fn tensor(&self, name: &str) -> &TensorArg {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor named {name:?} was passed to the kernel"))
    }

    /// The scalar named `name`; panics (a kernel failure) if absent.
    pub fn scalar(&self, name: &str) -> u64 {
        self.scalars
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("no scalar named {name:?} was passed to the kernel"))
    }
}

/// A kernel: a plain function of the `tl` context and the launch arguments.
pub type KernelFn = fn(&mut Tl<'_>, &KernelArgs);

/// A 2-D block of memory: `rows` x `cols` elements of `dtype` starting at
/// `addr`, rows `row_stride` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub addr: Addr,
    pub rows: u32,
    pub cols: u32,
    pub row_stride: u64,
    pub dtype: Dtype,
}

impl Block {
    /// The block of rows [r0, r0+rows) x cols [c0, c0+cols) of a shard.
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
                space: Space::Hbm,
                addr: s.addr + r0 * s.row_bytes + c0 * es,
            },
            rows,
            cols,
            row_stride: s.row_bytes,
            dtype: t.dtype,
        }
    }

    fn row_bytes(&self) -> u64 {
        self.cols as u64 * self.dtype.size() as u64
    }
}

/// A tile in TCM holding the real bytes Phase 1 loaded. Frees its TCM when
/// dropped.
#[derive(Debug)]
pub struct Tile {
    pa: u64,
    rows: u32,
    cols: u32,
    dtype: Dtype,
    data: Vec<u8>,
    tcm: Rc<RefCell<FreeList>>,
}

impl Tile {
    pub fn shape(&self) -> (usize, usize) {
        (self.rows as usize, self.cols as usize)
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The raw little-endian bytes, row-major.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Element (r, c) as f64.
    pub fn get(&self, r: usize, c: usize) -> f64 {
        assert!(
            r < self.rows as usize && c < self.cols as usize,
            "tile index ({r}, {c}) outside {}x{}",
            self.rows,
            self.cols
        );
        let es = self.dtype.size();
        let at = (r * self.cols as usize + c) * es;
        decode(self.dtype, &self.data[at..at + es])
    }

    /// The values as f64, row-major, as an ndarray.
    pub fn to_f64(&self) -> Array2<f64> {
        let es = self.dtype.size();
        let v: Vec<f64> = self
            .data
            .chunks_exact(es)
            .map(|b| decode(self.dtype, b))
            .collect();
        Array2::from_shape_vec(self.shape(), v).expect("tile data matches its shape")
    }
}

impl Drop for Tile {
    fn drop(&mut self) {
        let offset = Pa::decode(self.pa).expect("TCM PA").offset;
        self.tcm.borrow_mut().free(offset);
    }
}

/// An asynchronous load in flight; `Tl::wait` turns it into a [`Tile`].
#[derive(Debug)]
pub struct LoadHandle {
    op: u64,
    tile: Tile,
}

/// The result of a compute op (dot, math): a tile in TCM whose value exists
/// only in Phase 2. It deliberately has no value accessor, so reading it in
/// Phase 1 does not compile (ADR-0020 D3 "Result Handle Semantics"); it can
/// be an operand of further ops and can be stored. Frees its TCM on drop.
#[derive(Debug)]
pub struct Pending {
    pa: u64,
    rows: u32,
    cols: u32,
    dtype: Dtype,
    tcm: Rc<RefCell<FreeList>>,
}

impl Pending {
    pub fn shape(&self) -> (usize, usize) {
        (self.rows as usize, self.cols as usize)
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let offset = Pa::decode(self.pa).expect("TCM PA").offset;
        self.tcm.borrow_mut().free(offset);
    }
}

/// A TCM tile usable as an operand: a loaded [`Tile`] or a [`Pending`].
pub trait Operand {
    /// (TCM address, rows, cols, dtype).
    fn operand(&self) -> (u64, u32, u32, Dtype);
}

impl Operand for Tile {
    fn operand(&self) -> (u64, u32, u32, Dtype) {
        (self.pa, self.rows, self.cols, self.dtype)
    }
}

impl Operand for Pending {
    fn operand(&self) -> (u64, u32, u32, Dtype) {
        (self.pa, self.rows, self.cols, self.dtype)
    }
}

fn tile_input(x: &dyn Operand) -> MathInput {
    let (pa, rows, cols, dtype) = x.operand();
    MathInput::Tile {
        addr: Addr {
            space: Space::Tcm,
            addr: pa,
        },
        rows,
        cols,
        dtype,
    }
}

/// Accumulation dtype of a dot over `dtype` inputs (ADR-0020 D5).
pub fn accumulation_dtype(dtype: Dtype) -> Dtype {
    match dtype {
        Dtype::I8 | Dtype::U8 | Dtype::I32 => Dtype::I32,
        _ => Dtype::F32,
    }
}

/// Encode one element from f64 (rounding to the dtype; integers saturate).
pub fn encode(dtype: Dtype, v: f64) -> Vec<u8> {
    match dtype {
        Dtype::F32 => (v as f32).to_le_bytes().to_vec(),
        Dtype::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
        Dtype::Bf16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
        Dtype::I8 => vec![(v as i8) as u8],
        Dtype::U8 => vec![v as u8],
        Dtype::I32 => (v as i32).to_le_bytes().to_vec(),
    }
}

/// Decode one element to f64.
pub fn decode(dtype: Dtype, b: &[u8]) -> f64 {
    match dtype {
        Dtype::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        Dtype::F16 => half::f16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
        Dtype::Bf16 => half::bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f64(),
        Dtype::I8 => b[0] as i8 as f64,
        Dtype::U8 => b[0] as f64,
        Dtype::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
    }
}

/// The `tl` context a kernel runs with.
pub struct Tl<'p> {
    port: &'p mut dyn Port,
    pe: PeCoord,
    program_id: u32,
    num_programs: u32,
    tcm: Rc<RefCell<FreeList>>,
    /// Op-name override for commands issued now (pipeline stages).
    stage: Option<&'static str>,
}

impl std::fmt::Debug for Tl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tl")
            .field("pe", &self.pe)
            .field("program_id", &self.program_id)
            .finish()
    }
}

impl<'p> Tl<'p> {
    pub fn new(
        port: &'p mut dyn Port,
        pe: PeCoord,
        program_id: u32,
        num_programs: u32,
        tcm: FreeList,
    ) -> Self {
        Tl {
            port,
            pe,
            program_id,
            num_programs,
            tcm: Rc::new(RefCell::new(tcm)),
            stage: None,
        }
    }

    /// Name the ops issued until the next call `stage` (e.g.
    /// `TileToken/GEMM`); `None` returns to the default names.
    pub fn set_stage(&mut self, stage: Option<&'static str>) {
        self.stage = stage;
    }

    pub fn pe(&self) -> PeCoord {
        self.pe
    }

    pub fn program_id(&self) -> u32 {
        self.program_id
    }

    pub fn num_programs(&self) -> u32 {
        self.num_programs
    }

    fn tcm_alloc(&mut self, bytes: u64) -> u64 {
        let mut tcm = self.tcm.borrow_mut();
        let offset = tcm.alloc(bytes, 64).unwrap_or_else(|| {
            panic!(
                "{}: out of TCM allocating a {bytes}-byte tile ({} of {} bytes in use, largest free block {})",
                self.pe,
                tcm.used(),
                tcm.limit(),
                tcm.largest_free()
            )
        });
        Pa {
            space: Space::Tcm,
            sip: self.pe.sip,
            cube: self.pe.cube,
            pe: self.pe.pe,
            offset,
        }
        .encode()
        .expect("TCM PA in range")
    }

    fn pending(&mut self, rows: u32, cols: u32, dtype: Dtype) -> Pending {
        let pa = self.tcm_alloc(rows as u64 * cols as u64 * dtype.size() as u64);
        Pending {
            pa,
            rows,
            cols,
            dtype,
            tcm: self.tcm.clone(),
        }
    }

    /// `a @ b` (+ `acc`, which the result replaces in place), accumulated
    /// in f32 for float inputs and i32 for integer ones; the result has the
    /// accumulation dtype (cast it to store it narrower).
    pub fn dot(&mut self, a: &dyn Operand, b: &dyn Operand, acc: Option<Pending>) -> Pending {
        let (pa_a, m, k, da) = a.operand();
        let (pa_b, kb, n, db) = b.operand();
        assert_eq!(k, kb, "dot: inner dimensions differ ({m}x{k} @ {kb}x{n})");
        assert_eq!(da, db, "dot: operand dtypes differ ({da} and {db})");
        let dtype_acc = accumulation_dtype(da);
        let tcm = |pa| Addr {
            space: Space::Tcm,
            addr: pa,
        };
        // With an accumulator the result replaces it in place: the output
        // range is also the third input.
        let (out, acc_addr) = match acc {
            Some(acc) => {
                assert_eq!(
                    (acc.rows, acc.cols, acc.dtype),
                    (m, n, dtype_acc),
                    "dot: accumulator shape or dtype differs"
                );
                let at = tcm(acc.pa);
                (acc, Some(at))
            }
            None => (self.pending(m, n, dtype_acc), None),
        };
        let params = GemmParams {
            a: tcm(pa_a),
            b: tcm(pa_b),
            out: tcm(out.pa),
            acc: acc_addr,
            m,
            k,
            n,
            dtype_in: da,
            dtype_acc,
            dtype_out: dtype_acc,
            transpose_a: false,
            transpose_b: false,
            layout_a: Layout::RowMajor,
            layout_b: Layout::RowMajor,
            layout_out: Layout::RowMajor,
        };
        self.port.call(Command::Gemm(Labeled {
            op: params,
            label: self.stage,
        }));
        out
    }

    fn math(
        &mut self,
        op: MathOp,
        inputs: Vec<MathInput>,
        rows: u32,
        cols: u32,
        dtype: Dtype,
        axis: Option<u8>,
    ) -> Pending {
        let out = self.pending(rows, cols, dtype);
        let params = MathParams {
            op,
            inputs,
            out: Addr {
                space: Space::Tcm,
                addr: out.pa,
            },
            rows,
            cols,
            dtype,
            axis,
        };
        self.port.call(Command::Math(Labeled {
            op: params,
            label: self.stage,
        }));
        out
    }

    fn unary(&mut self, op: MathOp, x: &dyn Operand) -> Pending {
        let (_, r, c, d) = x.operand();
        self.math(op, vec![tile_input(x)], r, c, d, None)
    }

    /// Elementwise `a op b`; `b` may be a full tile, one row (1 x cols,
    /// broadcast down the rows) or one column (rows x 1).
    fn binary(&mut self, op: MathOp, a: &dyn Operand, b: &dyn Operand) -> Pending {
        let (_, r, c, d) = a.operand();
        let (_, br, bc, bd) = b.operand();
        assert!(
            (br == r || br == 1) && (bc == c || bc == 1),
            "{op:?}: shapes {r}x{c} and {br}x{bc} do not broadcast"
        );
        assert_eq!(d, bd, "{op:?}: operand dtypes differ ({d} and {bd})");
        self.math(op, vec![tile_input(a), tile_input(b)], r, c, d, None)
    }

    fn scalar(&mut self, op: MathOp, a: &dyn Operand, v: f64) -> Pending {
        let (_, r, c, d) = a.operand();
        self.math(op, vec![tile_input(a), MathInput::Scalar(v)], r, c, d, None)
    }

    pub fn exp(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Exp, x)
    }
    pub fn log(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Log, x)
    }
    pub fn sqrt(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Sqrt, x)
    }
    pub fn rsqrt(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Rsqrt, x)
    }
    pub fn add(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Add, a, b)
    }
    pub fn sub(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Mul, a, b)
    }
    pub fn div(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Div, a, b)
    }
    pub fn max(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Max, a, b)
    }
    pub fn min(&mut self, a: &dyn Operand, b: &dyn Operand) -> Pending {
        self.binary(MathOp::Min, a, b)
    }
    pub fn add_scalar(&mut self, a: &dyn Operand, v: f64) -> Pending {
        self.scalar(MathOp::Add, a, v)
    }
    pub fn mul_scalar(&mut self, a: &dyn Operand, v: f64) -> Pending {
        self.scalar(MathOp::Mul, a, v)
    }

    /// `cond ? a : b` elementwise (cond nonzero means a).
    pub fn where_(&mut self, cond: &dyn Operand, a: &dyn Operand, b: &dyn Operand) -> Pending {
        let (_, r, c, d) = a.operand();
        self.math(
            MathOp::Where,
            vec![tile_input(cond), tile_input(a), tile_input(b)],
            r,
            c,
            d,
            None,
        )
    }

    /// Convert to `dtype`.
    pub fn cast(&mut self, x: &dyn Operand, dtype: Dtype) -> Pending {
        let (_, r, c, _) = x.operand();
        self.math(MathOp::Cast, vec![tile_input(x)], r, c, dtype, None)
    }

    fn reduce(&mut self, op: MathOp, x: &dyn Operand, axis: u8) -> Pending {
        let (_, r, c, d) = x.operand();
        let (rows, cols) = match axis {
            0 => (1, c),
            1 => (r, 1),
            _ => panic!("{op:?}: axis {axis} of a 2-D tile (0 or 1)"),
        };
        self.math(op, vec![tile_input(x)], rows, cols, d, Some(axis))
    }

    /// Sum along `axis`: 1 x cols for axis 0, rows x 1 for axis 1.
    pub fn sum(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce(MathOp::Sum, x, axis)
    }

    /// Maximum along `axis`: 1 x cols for axis 0, rows x 1 for axis 1.
    pub fn reduce_max(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce(MathOp::ReduceMax, x, axis)
    }

    /// Load a block into a new TCM tile and wait for it; the tile holds
    /// the bytes Phase 1 read.
    pub fn load(&mut self, src: Block) -> Tile {
        // The tile exists before the call, so a kernel unwound mid-load
        // frees its TCM.
        let (mut tile, cmd) = self.load_into_new_tile(src);
        match self.port.call(Command::Dma(cmd)) {
            Reply::Data(data) => {
                tile.data = data;
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
            data: Vec::new(),
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
            Reply::Data(data) => {
                tile.data = data;
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
            data: Vec::new(),
            tcm: self.tcm.clone(),
        };
        if (src.rows, src.cols) != (rows, cols) {
            let fill = MathParams {
                op: MathOp::Copy,
                inputs: vec![MathInput::Scalar(other)],
                out: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                rows,
                cols,
                dtype: src.dtype,
                axis: None,
            };
            self.port.call(Command::Math(Labeled {
                op: fill,
                label: Some("fill"),
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
            Reply::Data(data) => data,
            other => panic!("load_masked: the simulation answered {other:?} instead of data"),
        };
        let fill = encode(src.dtype, other);
        let mut data = Vec::with_capacity((rows as u64 * cols as u64 * es) as usize);
        let vr = src.row_bytes() as usize;
        for r in 0..rows as usize {
            let row_start = data.len();
            if r < src.rows as usize {
                data.extend_from_slice(&valid[r * vr..(r + 1) * vr]);
            }
            while data.len() < row_start + (cols as u64 * es) as usize {
                data.extend_from_slice(&fill);
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

    /// Wait until every transfer this kernel issued has completed (timing
    /// only).
    pub fn wait_all(&mut self) {
        self.port.call(Command::WaitAll);
    }
}

/// Build the body that runs `kernel` on `pe` with a TCM allocator.
pub fn body(
    kernel: KernelFn,
    args: Arc<KernelArgs>,
    pe: PeCoord,
    program_id: u32,
    num_programs: u32,
    tcm: FreeList,
) -> KernelBody {
    Box::new(move |port: &mut dyn Port| {
        let mut tl = Tl::new(port, pe, program_id, num_programs, tcm);
        kernel(&mut tl, &args);
        tl.wait_all();
    })
}
