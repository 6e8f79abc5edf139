//! Kernels: plain Rust functions that drive a PE through the `tl` API
//! ([`Tl`]), run by an [`Executor`] beside the event loop (docs/design.md P2).
//!
//! Phase 1 semantics: `load` returns a [`Tile`] holding the real bytes, so
//! kernels can branch on loaded values; `store` is visible at issue
//! (docs/design.md P3, store visibility); tiles live in the PE's TCM and free
//! it when dropped; running out of TCM is a kernel failure naming the PE
//! and the sizes.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

mod atomic;
mod block;
mod comm;
pub mod composite;
mod compute;
mod compute_more;
pub mod exec;
mod grid;
mod memory;
mod nd;

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use kb_format::pa::Pa;
use kb_format::{
    Addr, Dtype, GemmParams, Layout, MathInput, MathOp, MathParams, MemoryParams, Space,
};
use ndarray::Array2;

pub use block::{Block, Part, RowBlock, TensorBlock};
pub use comm::Group;
pub use exec::{Executor, KernelBody, Port};
pub use grid::{Grid, body, grid_body};

pub use crate::program::{Notify, SignalOp};

use crate::alloc::FreeList;
use crate::data::Snapshot;
use crate::machine::PeCoord;
use crate::program::{Command, DmaCmd, Labeled, Loaded, Reply, Unknown};

pub use crate::runtime::ShardArg;

/// A tensor as a kernel sees it: shape, dtype and where each PE's shard is.
#[derive(Debug, Clone)]
pub struct TensorArg {
    /// The name it was declared with.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Rows and columns of the whole tensor: for a tensor of more than 2
    /// dims, its 2-D view `[product of the leading dims, last dim]` (`[1,
    /// n]` for a 1-D one), which [`Block::of`] addresses and shards split.
    pub shape: [u64; 2],
    /// The dims it was declared with, outermost first (1 to 6 of them;
    /// equal to `shape` for a 2-D tensor), which [`Block::nd`] addresses.
    pub dims: Vec<u64>,
    /// The memory its shards are in: `Hbm` (addresses in the model's
    /// space: PA, VA or LA), `Tcm` or `Sram` (PAs).
    pub space: Space,
    /// Each PE's part, as kernels address it (in SRAM, each cube's part,
    /// held by its PE 0).
    pub shards: Vec<ShardArg>,
    /// Whether `shards` are in the machine's order of their holders, each
    /// holder once (as the runtime makes them): [`TensorArg::shard`] then
    /// finds one by a search rather than a scan (a scan per PE was P x P
    /// comparisons per launch at P PEs). False is always correct.
    pub shards_in_order: bool,
    /// Whether other PEs can address a PE's shard at its `addr`: false in
    /// HBM under the LA model, whose addresses are each PE's own logical
    /// ones (another PE resolves them through its own segments).
    pub peers_reach: bool,
}

/// What names a shard's holder in `space`: its PE, or in SRAM its cube.
fn holder_key(space: Space) -> fn(&PeCoord) -> (u32, u32, u32) {
    match space {
        Space::Sram => |p| (p.sip, p.cube, 0),
        _ => |p| (p.sip, p.cube, p.pe),
    }
}

impl TensorArg {
    /// The shard held by `pe` (in SRAM: by `pe`'s cube).
    pub fn shard(&self, pe: PeCoord) -> Option<&ShardArg> {
        let key = holder_key(self.space);
        let want = key(&pe);
        if self.shards_in_order {
            let i = self.shards.partition_point(|s| key(&s.pe) < want);
            self.shards.get(i).filter(|s| key(&s.pe) == want)
        } else {
            self.shards.iter().find(|s| key(&s.pe) == want)
        }
    }

    /// Whether `shards` are in the machine's order of their holders, each
    /// once (what [`TensorArg::shards_in_order`] says of them).
    pub fn holders_in_order(space: Space, shards: &[ShardArg]) -> bool {
        let key = holder_key(space);
        shards.windows(2).all(|w| key(&w[0].pe) < key(&w[1].pe))
    }

    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size() as u64
    }

    /// The rows of the shard `pe` holds, in blocks of `block_rows` (the
    /// last one shorter), in tensor coordinates: for kernels that want
    /// locality, `Block::of(t, pe, b.row, b.col, b.rows, b.cols)` of each
    /// is one DMA from `pe`'s own memory. Empty when `pe` holds no rows
    /// (or `block_rows` is 0).
    pub fn row_blocks(&self, pe: PeCoord, block_rows: u32) -> impl Iterator<Item = RowBlock> {
        let (row0, rows, col, cols) = match self.shard(pe) {
            Some(s) if block_rows > 0 => (
                s.row0,
                s.rows,
                s.col0,
                (s.row_bytes / self.elem_bytes()) as u32,
            ),
            _ => (0, 0, 0, 0),
        };
        (0..rows.div_ceil(block_rows.max(1) as u64)).map(move |i| {
            let r = i * block_rows as u64;
            RowBlock {
                row: row0 + r,
                rows: (rows - r).min(block_rows as u64) as u32,
                col,
                cols,
            }
        })
    }
}

/// Arguments shared by every program of a launch: tensors, integer and
/// float parameters, by name.
#[derive(Debug, Default, Clone)]
pub struct KernelArgs {
    /// The launch's tensors, looked up by name with [`KernelArgs::tensor`].
    pub tensors: Vec<TensorArg>,
    /// Named integer parameters (tile sizes and the like).
    pub scalars: Vec<(String, u64)>,
    /// Named float parameters (epsilons, scales).
    pub floats: Vec<(String, f64)>,
}

impl KernelArgs {
    /// Add an integer parameter.
    pub fn scalar(mut self, name: &str, v: u64) -> Self {
        self.scalars.push((name.into(), v));
        self
    }

    /// Add a float parameter.
    pub fn float(mut self, name: &str, v: f64) -> Self {
        self.floats.push((name.into(), v));
        self
    }

    /// The tensor named `name`; panics (a kernel failure naming the
    /// tensors passed) if absent.
    #[track_caller]
    pub fn tensor(&self, name: &str) -> &TensorArg {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "{}",
                    missing("tensor", name, self.tensors.iter().map(|t| t.name.as_str()))
                )
            })
    }

    /// The integer parameter `name`; panics (a kernel failure naming the
    /// scalars passed) if absent.
    #[track_caller]
    pub fn get(&self, name: &str) -> u64 {
        self.scalars
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| {
                panic!(
                    "{}",
                    missing("scalar", name, self.scalars.iter().map(|(n, _)| n.as_str()))
                )
            })
    }

    /// The float parameter `name`; panics (a kernel failure naming the
    /// floats passed) if absent.
    #[track_caller]
    pub fn get_f64(&self, name: &str) -> f64 {
        self.floats
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| {
                panic!(
                    "{}",
                    missing("float", name, self.floats.iter().map(|(n, _)| n.as_str()))
                )
            })
    }
}

/// The message of a failed `KernelArgs` lookup: what was asked for and
/// the names of that kind the launch passed (or how to pass one).
fn missing<'a>(kind: &str, name: &str, passed: impl Iterator<Item = &'a str>) -> String {
    let passed: Vec<String> = passed.map(|n| format!("{n:?}")).collect();
    let how = match kind {
        "tensor" => "`Program::bind` or `Program::args`",
        "scalar" => "`KernelArgs::scalar`",
        _ => "`KernelArgs::float`",
    };
    if passed.is_empty() {
        format!(
            "no {kind} named {name:?} was passed to the kernel; it was passed no {kind}s (pass them with {how})"
        )
    } else {
        format!(
            "no {kind} named {name:?} was passed to the kernel; the {kind}s passed are {}",
            passed.join(", ")
        )
    }
}

/// A kernel: a plain function of the `tl` context and the launch arguments.
pub type KernelFn = fn(&mut Tl<'_>, &KernelArgs);

/// A tile in TCM holding the bytes Phase 1 loaded. Bytes whose last
/// writer was a compute op (loaded from where a result was stored) are
/// unknown in Phase 1: the tile can still be an operand or be stored, but
/// reading those values panics, naming the writer (docs/design.md P4: no branching
/// on compute results). Frees its TCM when dropped.
#[derive(Debug)]
pub struct Tile {
    pa: u64,
    rows: u32,
    cols: u32,
    dtype: Dtype,
    /// The top-left rows x cols that hold data, not padding.
    valid: (u32, u32),
    /// The bytes, by reference to where the load read them.
    data: Snapshot,
    /// `data` in one piece, made on first need when it spans pages.
    flat: OnceCell<Vec<u8>>,
    /// Byte ranges of `data` whose value only Phase 2 knows.
    unknown: Vec<Unknown>,
    tcm: Rc<RefCell<FreeList>>,
}

impl Tile {
    /// (rows, cols).
    pub fn shape(&self) -> (usize, usize) {
        (self.rows as usize, self.cols as usize)
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Whether Phase 1 knows every value of the tile (false when some of
    /// its bytes are a compute result that exists only in Phase 2).
    pub fn is_known(&self) -> bool {
        self.unknown.is_empty()
    }

    /// Panics (a kernel failure) if bytes `[at, at+len)` are unknown.
    #[track_caller]
    fn check_known(&self, at: usize, len: usize, what: &dyn std::fmt::Display) {
        if let Some(u) = self
            .unknown
            .iter()
            .find(|u| u.offset < at + len && at < u.offset + u.len)
        {
            panic!(
                "{what} of a {}x{} {} tile is not known in Phase 1: its bytes were last written by {}, a compute op whose result exists only in Phase 2 (kernels may move such data but not read it)",
                self.rows, self.cols, self.dtype, u.writer
            );
        }
    }

    /// The raw little-endian bytes, row-major. Panics if any is unknown.
    #[track_caller]
    pub fn bytes(&self) -> &[u8] {
        self.check_known(0, self.data.len(), &"the bytes");
        self.flat_bytes()
    }

    fn flat_bytes(&self) -> &[u8] {
        match self.data.as_slice() {
            Some(b) => b,
            None => self.flat.get_or_init(|| self.data.to_vec()),
        }
    }

    /// Element (r, c) as f64. Panics if it is unknown in Phase 1.
    #[track_caller]
    pub fn get(&self, r: usize, c: usize) -> f64 {
        assert!(
            r < self.rows as usize && c < self.cols as usize,
            "tile index ({r}, {c}) outside {}x{}",
            self.rows,
            self.cols
        );
        let es = self.dtype.size();
        let at = (r * self.cols as usize + c) * es;
        // Named lazily: formatting the name on every read was ~1.7 % of
        // the kernel benchmark's instructions.
        self.check_known(at, es, &format_args!("element ({r}, {c})"));
        match self.data.as_slice() {
            Some(b) => decode(self.dtype, &b[at..at + es]),
            None => {
                let mut b = Vec::with_capacity(es);
                self.data.append_range(at, es, &mut b);
                decode(self.dtype, &b)
            }
        }
    }

    /// The values as f64, row-major, as an ndarray. Panics if any is
    /// unknown in Phase 1.
    #[track_caller]
    pub fn to_f64(&self) -> Array2<f64> {
        self.check_known(0, self.data.len(), &"the values");
        let es = self.dtype.size();
        let v: Vec<f64> = self
            .flat_bytes()
            .chunks_exact(es)
            .map(|b| decode(self.dtype, b))
            .collect();
        Array2::from_shape_vec(self.shape(), v).expect("tile data matches its shape")
    }
}

impl Tile {
    fn fill(&mut self, loaded: Loaded) {
        self.data = loaded.bytes;
        self.flat = OnceCell::new();
        self.unknown = loaded.unknown;
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
    /// A block in several parts: each part's DMA and place (else empty,
    /// and `op` is the one DMA).
    parts: Vec<(u64, Part)>,
    tile: Tile,
}

/// The result of a compute op (dot, math): a tile in TCM whose value exists
/// only in Phase 2. It deliberately has no value accessor, so reading it in
/// Phase 1 does not compile (docs/design.md P4): its `get`, `to_f64` and
/// `bytes` exist only to make the compiler say so. It can be an operand of
/// further ops and can be stored. Frees its TCM on drop.
#[derive(Debug)]
pub struct Pending {
    pa: u64,
    rows: u32,
    cols: u32,
    dtype: Dtype,
    /// The top-left rows x cols computed from data, not padding.
    valid: (u32, u32),
    tcm: Rc<RefCell<FreeList>>,
}

impl Pending {
    /// (rows, cols).
    pub fn shape(&self) -> (usize, usize) {
        (self.rows as usize, self.cols as usize)
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Does not compile: a compute result has no value in Phase 1 (see
    /// [`NoValueInPhase1`]). [`Tile::get`] reads a loaded tile.
    pub fn get(&self, _r: usize, _c: usize) -> f64
    where
        for<'a> &'a Pending: NoValueInPhase1,
    {
        unreachable!("Pending::get cannot be called: its bound has no implementation")
    }

    /// Does not compile: a compute result has no value in Phase 1 (see
    /// [`NoValueInPhase1`]). [`Tile::to_f64`] reads a loaded tile.
    pub fn to_f64(&self) -> Array2<f64>
    where
        for<'a> &'a Pending: NoValueInPhase1,
    {
        unreachable!("Pending::to_f64 cannot be called: its bound has no implementation")
    }

    /// Does not compile: a compute result has no value in Phase 1 (see
    /// [`NoValueInPhase1`]). [`Tile::bytes`] reads a loaded tile.
    pub fn bytes(&self) -> &[u8]
    where
        for<'a> &'a Pending: NoValueInPhase1,
    {
        unreachable!("Pending::bytes cannot be called: its bound has no implementation")
    }
}

/// Never implemented: the bound of [`Pending`]'s `get`, `to_f64` and
/// `bytes`, so that reading a compute result in a kernel fails to compile
/// with a message saying why (docs/design.md P4) instead of "no method
/// named `get`".
#[diagnostic::on_unimplemented(
    message = "a compute result (`Pending`) has no value in Phase 1: kb-replay computes it in Phase 2",
    label = "`get`, `to_f64` and `bytes` of a `Pending` do not compile",
    note = "`tl.wait` only waits for the time a result takes; it never gives its value",
    note = "use the result as an operand of further ops or `tl.store` it; kernels read values (`Tile::get`) only of tiles they loaded from data no compute op wrote, e.g. to branch on host data"
)]
pub trait NoValueInPhase1 {}

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

    /// The top-left rows x cols that hold data rather than padding (a
    /// masked edge tile's loaded part, and what is computed from such
    /// parts): the extent useful FLOPs are counted over. The whole tile
    /// unless it came from a masked load.
    fn valid(&self) -> (u32, u32) {
        let (_, rows, cols, _) = self.operand();
        (rows, cols)
    }
}

impl Operand for Tile {
    fn operand(&self) -> (u64, u32, u32, Dtype) {
        (self.pa, self.rows, self.cols, self.dtype)
    }

    fn valid(&self) -> (u32, u32) {
        self.valid
    }
}

impl Operand for Pending {
    fn operand(&self) -> (u64, u32, u32, Dtype) {
        (self.pa, self.rows, self.cols, self.dtype)
    }

    fn valid(&self) -> (u32, u32) {
        self.valid
    }
}

/// A block of this PE's TCM (a [`Memory::Tcm`](crate::runtime::Memory)
/// buffer: a receive slot, data kept on chip) is an operand where it lies,
/// without a copy. It must be contiguous (rows `cols` elements apart);
/// using a block elsewhere (HBM, SRAM, another PE's TCM) as an operand is
/// a kernel error naming it.
impl Operand for Block {
    fn operand(&self) -> (u64, u32, u32, Dtype) {
        assert!(
            self.rows <= 1 || self.row_stride == self.row_bytes(),
            "a {}x{} {} block used as an operand must be contiguous (its rows are {} bytes apart, not {})",
            self.rows,
            self.cols,
            self.dtype,
            self.row_stride,
            self.row_bytes()
        );
        (self.addr.addr, self.rows, self.cols, self.dtype)
    }
}

/// A tile's (rows, cols) shape and its valid (rows, cols) corner.
type ShapeValid = ((u32, u32), (u32, u32));

/// The valid extent of an elementwise result of shape `out` from operands
/// of (shape, valid): along each dim, the least valid extent of the
/// operands that span it (a broadcast operand, 1 along a longer dim, is
/// valid along all of it).
fn broadcast_valid(out: (u32, u32), operands: &[ShapeValid]) -> (u32, u32) {
    operands.iter().fold(out, |(vr, vc), &((r, c), (ur, uc))| {
        (
            if r == out.0 { vr.min(ur) } else { vr },
            if c == out.1 { vc.min(uc) } else { vc },
        )
    })
}

/// A math op's inputs: `x` alone.
fn one_input(x: MathInput) -> Vec<MathInput> {
    let mut v = crate::program::math_inputs();
    v.push(x);
    v
}

/// Up to three operands' (shape, valid extent), without allocating: an
/// elementwise op has at most three tiles (`where_`).
#[derive(Clone, Copy, Default)]
struct Tiles {
    items: [ShapeValid; 3],
    n: usize,
}

impl Tiles {
    fn push(&mut self, t: ShapeValid) {
        self.items[self.n] = t;
        self.n += 1;
    }

    fn as_slice(&self) -> &[ShapeValid] {
        &self.items[..self.n]
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

/// The second operand of an elementwise op: a tile or a scalar
/// (`tl.add(&x, &y)`, `tl.add(&x, 1.0)`).
#[derive(Clone, Copy)]
pub enum Rhs<'a> {
    /// A TCM tile, broadcast numpy-style against the first operand.
    Tile(&'a dyn Operand),
    /// A scalar, rounded to the operands' dtype.
    Scalar(f64),
}

impl std::fmt::Debug for Rhs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rhs::Tile(x) => {
                let (_, r, c, d) = x.operand();
                write!(f, "Tile({r}x{c} {d})")
            }
            Rhs::Scalar(v) => write!(f, "Scalar({v})"),
        }
    }
}

impl<'a> From<&'a Tile> for Rhs<'a> {
    fn from(t: &'a Tile) -> Self {
        Rhs::Tile(t)
    }
}

impl<'a> From<&'a Pending> for Rhs<'a> {
    fn from(t: &'a Pending) -> Self {
        Rhs::Tile(t)
    }
}

impl<'a> From<&'a Block> for Rhs<'a> {
    fn from(t: &'a Block) -> Self {
        Rhs::Tile(t)
    }
}

impl<'a> From<&'a dyn Operand> for Rhs<'a> {
    fn from(t: &'a dyn Operand) -> Self {
        Rhs::Tile(t)
    }
}

impl From<f64> for Rhs<'_> {
    fn from(v: f64) -> Self {
        Rhs::Scalar(v)
    }
}

/// Options of [`Tl::dot_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Dot {
    /// Use `a` transposed (it is stored k x m).
    pub transpose_a: bool,
    /// Use `b` transposed (it is stored n x k).
    pub transpose_b: bool,
    /// The result's dtype (default: the accumulation dtype).
    pub out: Option<Dtype>,
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16)
}

/// The value range of an integer dtype, as f64.
fn int_range(d: Dtype) -> (f64, f64) {
    match d {
        Dtype::I8 => (-128.0, 127.0),
        Dtype::U8 => (0.0, 255.0),
        _ => (i32::MIN as f64, i32::MAX as f64),
    }
}

/// Accumulation dtype of a dot over `dtype` inputs (docs/design.md P6).
pub fn accumulation_dtype(dtype: Dtype) -> Dtype {
    match dtype {
        Dtype::I8 | Dtype::U8 | Dtype::I32 => Dtype::I32,
        _ => Dtype::F32,
    }
}

/// Encode one element from f64 (rounding to the dtype; integers saturate).
pub fn encode(dtype: Dtype, v: f64) -> Vec<u8> {
    let (bytes, n) = encode_element(dtype, v);
    bytes[..n].to_vec()
}

/// [`encode`] without allocating: the element's bytes in the first `n`
/// of four (no dtype is wider).
pub(crate) fn encode_element(dtype: Dtype, v: f64) -> ([u8; 4], usize) {
    let mut b = [0; 4];
    let n = match dtype {
        Dtype::F32 => {
            b = (v as f32).to_le_bytes();
            4
        }
        Dtype::F16 => {
            b[..2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes());
            2
        }
        Dtype::Bf16 => {
            b[..2].copy_from_slice(&half::bf16::from_f64(v).to_le_bytes());
            2
        }
        Dtype::I8 => {
            b[0] = (v as i8) as u8;
            1
        }
        Dtype::U8 => {
            b[0] = v as u8;
            1
        }
        Dtype::I32 => {
            b = (v as i32).to_le_bytes();
            4
        }
    };
    (b, n)
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
    /// The launch's PEs, in program-assignment order.
    pes: Arc<[PeCoord]>,
    program_id: [u32; 3],
    grid: Grid,
    tcm: Rc<RefCell<FreeList>>,
    /// Op-name override for commands issued now (pipeline stages).
    stage: Option<&'static str>,
    /// Scratch: a masked load's bytes gathered from their pages.
    gather: Vec<u8>,
    /// The launch's arguments, to name a tensor in an error.
    args: Option<Arc<KernelArgs>>,
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
    /// A context for program `program_id` of a `grid` on `pe`, allocating
    /// tiles from `tcm`.
    pub fn new(
        port: &'p mut dyn Port,
        pe: PeCoord,
        program_id: [u32; 3],
        grid: Grid,
        tcm: FreeList,
    ) -> Self {
        Tl {
            port,
            pe,
            pes: Arc::from([pe]),
            program_id,
            grid,
            tcm: Rc::new(RefCell::new(tcm)),
            stage: None,
            gather: Vec::new(),
            args: None,
        }
    }

    /// Fail the kernel: `tl.OP: message`. The caller's source line is
    /// added by the executor, from the panic's location (every `tl`
    /// method is `#[track_caller]`, so it is the kernel's line).
    #[track_caller]
    pub(crate) fn fail(&self, op: &str, message: String) -> ! {
        panic!("tl.{op}: {message}")
    }

    /// The tensor of the launch whose memory `addr` is in (this PE's
    /// shard first: under VA or LA another PE's may use the same
    /// addresses), as ` of NAME`, or "" if none is.
    pub(crate) fn name_at(&self, addr: Addr) -> String {
        self.name_in(Some(addr.space), addr.addr)
    }

    /// [`Tl::name_at`] in memory `space` (any when `None`).
    fn name_in(&self, space: Option<Space>, addr: u64) -> String {
        let Some(args) = &self.args else {
            return String::new();
        };
        let within = |t: &TensorArg, s: &ShardArg| {
            space.is_none_or(|sp| t.space == sp)
                && addr >= s.addr
                && addr < s.addr + s.rows * s.row_bytes
        };
        let mut found = None;
        for t in &args.tensors {
            for s in &t.shards {
                if within(t, s) && (found.is_none() || s.pe == self.pe) {
                    found = Some(t.name.as_str());
                }
            }
        }
        found.map(|n| format!(" of {n}")).unwrap_or_default()
    }

    /// Fail op `op` unless its operand `i` at `addr` is in this PE's TCM
    /// (the engine would refuse it, without the kernel's line).
    #[track_caller]
    pub(crate) fn check_operand(&self, op: &str, i: usize, addr: u64) {
        match Pa::decode(addr) {
            Some(p)
                if p.space == Space::Tcm
                    && (p.sip, p.cube, p.pe) == (self.pe.sip, self.pe.cube, self.pe.pe) => {}
            _ => self.fail(
                op,
                format!(
                    "operand {i} (a block{} at {addr:#x}) is not in {}'s TCM: load it into a tile first (only a block of this PE's own TCM is an operand where it lies)",
                    self.name_in(None, addr),
                    self.pe
                ),
            ),
        }
    }

    /// [`Tl::name_at`] of a block's first part.
    pub(crate) fn block_name(&self, b: &TensorBlock) -> String {
        b.parts()
            .first()
            .map(|p| self.name_at(p.block.addr))
            .unwrap_or_default()
    }

    /// Name the ops issued until the next call `stage` (e.g.
    /// `TileToken/GEMM`); `None` returns to the default names.
    pub fn set_stage(&mut self, stage: Option<&'static str>) {
        self.stage = stage;
    }

    /// The PE this program runs on.
    pub fn pe(&self) -> PeCoord {
        self.pe
    }

    /// The largest tile this PE's TCM can hold now, in bytes.
    pub fn tcm_available(&self) -> u64 {
        self.tcm.borrow().largest_free()
    }

    #[track_caller]
    fn tcm_alloc(&mut self, bytes: u64, op: &str) -> u64 {
        let got = self.tcm.borrow_mut().alloc(bytes, 64);
        let Some(offset) = got else {
            let tcm = self.tcm.borrow();
            self.fail(
                op,
                format!(
                    "{}: out of TCM allocating a {bytes}-byte tile ({} of {} bytes in use, largest free block {})",
                    self.pe,
                    tcm.used(),
                    tcm.limit(),
                    tcm.largest_free()
                ),
            );
        };
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

    #[track_caller]
    fn pending(
        &mut self,
        op: &str,
        rows: u32,
        cols: u32,
        dtype: Dtype,
        valid: (u32, u32),
    ) -> Pending {
        let pa = self.tcm_alloc(rows as u64 * cols as u64 * dtype.size() as u64, op);
        Pending {
            pa,
            rows,
            cols,
            dtype,
            valid,
            tcm: self.tcm.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panic message of `f` (a kernel failure).
    fn panic_message(f: impl FnOnce()) -> String {
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .expect_err("expected a panic");
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    /// A shard is found by search exactly as by a scan, in every memory
    /// (SRAM by cube), for holders present and absent; shards out of order
    /// or repeated are never said to be in order, and are scanned.
    #[test]
    fn shards_found_by_search_are_those_a_scan_finds() {
        let pe = |sip, cube, pe| PeCoord { sip, cube, pe };
        let shard = |p: PeCoord, addr| ShardArg {
            pe: p,
            addr,
            rows: 1,
            row_bytes: 4,
            row0: 0,
            col0: 0,
        };
        let in_order: Vec<ShardArg> = [(0, 0, 1), (0, 1, 0), (0, 1, 2), (1, 0, 0), (1, 3, 1)]
            .into_iter()
            .zip(1..)
            .map(|((s, c, p), a)| shard(pe(s, c, p), a))
            .collect();
        let mut shuffled = in_order.clone();
        shuffled.swap(0, 3);
        let mut repeated = in_order.clone();
        repeated.insert(2, shard(pe(0, 1, 0), 99));
        let cubes: Vec<ShardArg> = [(0, 0), (0, 2), (1, 1)]
            .into_iter()
            .zip(10..)
            .map(|((s, c), a)| shard(pe(s, c, 0), a))
            .collect();
        let cases = [
            (Space::Hbm, in_order, true),
            (Space::Tcm, shuffled, false),
            (Space::Hbm, repeated, false),
            (Space::Sram, cubes, true),
        ];
        for (space, shards, ordered) in cases {
            assert_eq!(TensorArg::holders_in_order(space, &shards), ordered);
            let arg = |shards_in_order| TensorArg {
                name: "t".into(),
                dtype: Dtype::F32,
                shape: [8, 1],
                dims: vec![8, 1],
                space,
                shards: shards.clone(),
                shards_in_order,
                peers_reach: true,
            };
            let (searched, scanned) = (arg(ordered), arg(false));
            for s in 0..3 {
                for c in 0..4 {
                    for p in 0..3 {
                        let at = pe(s, c, p);
                        let want = shards.iter().find(|x| match space {
                            Space::Sram => (x.pe.sip, x.pe.cube) == (s, c),
                            _ => x.pe == at,
                        });
                        assert_eq!(searched.shard(at), want, "{space:?} {at}");
                        assert_eq!(scanned.shard(at), want, "{space:?} {at}");
                    }
                }
            }
        }
    }

    /// A misspelled argument name says which names the launch passed.
    #[test]
    fn a_missing_argument_lists_the_names_passed() {
        let args = KernelArgs::default()
            .scalar("block_rows", 8)
            .scalar("cols", 4)
            .float("alpha", 0.5);
        let e = panic_message(|| {
            args.get("block_row");
        });
        assert_eq!(
            e,
            "no scalar named \"block_row\" was passed to the kernel; the scalars passed are \"block_rows\", \"cols\""
        );
        let e = panic_message(|| {
            args.get_f64("alpah");
        });
        assert!(
            e.contains("no float named \"alpah\"")
                && e.ends_with("the floats passed are \"alpha\""),
            "{e}"
        );
        // None of that kind at all: how to pass one.
        let e = panic_message(|| {
            args.tensor("x");
        });
        assert!(
            e.contains("no tensor named \"x\"")
                && e.contains("it was passed no tensors (pass them with `Program::bind`"),
            "{e}"
        );
        assert!(
            missing("tensor", "xs", ["x", "y0"].into_iter())
                .ends_with("the tensors passed are \"x\", \"y0\""),
        );
        assert_eq!(args.get("cols"), 4);
        assert_eq!(args.get_f64("alpha"), 0.5);
    }

    /// The non-allocating encoding gives each dtype's little-endian bytes,
    /// rounded and saturated as the conversions do.
    #[test]
    fn elements_encode_as_their_dtype_does() {
        for v in [0.0, 1.5, -2.25, 300.7, -1e9, 65504.0] {
            let want: Vec<(Dtype, Vec<u8>)> = vec![
                (Dtype::F32, (v as f32).to_le_bytes().to_vec()),
                (Dtype::F16, half::f16::from_f64(v).to_le_bytes().to_vec()),
                (Dtype::Bf16, half::bf16::from_f64(v).to_le_bytes().to_vec()),
                (Dtype::I8, vec![(v as i8) as u8]),
                (Dtype::U8, vec![v as u8]),
                (Dtype::I32, (v as i32).to_le_bytes().to_vec()),
            ];
            for (d, bytes) in want {
                let (b, n) = encode_element(d, v);
                assert_eq!((&b[..n], n), (&bytes[..], d.size()), "{d} {v}");
                assert_eq!(encode(d, v), bytes);
            }
        }
    }
}
