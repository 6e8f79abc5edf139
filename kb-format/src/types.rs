//! The data model carried by a trace: metadata, tensors, op records and the
//! verification spec. Encoding lives elsewhere (`record_codec`, `writer`).

use serde::{Deserialize, Serialize};

/// Simulated time in integer picoseconds.
pub type Ps = u64;

/// Element type of a tensor or operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Dtype {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    I8 = 3,
    I32 = 4,
    U8 = 5,
}

/// A `.npy` descr (`<f8`, `|u1`, `>i4`) with its numpy name, for
/// messages: `<f8 (float64)`. The descr alone when it is not a plain
/// numeric type numpy names by kind and width.
pub fn npy_descr_named(descr: &str) -> String {
    let body = descr.trim_start_matches(['<', '>', '|', '=']);
    let (kind, digits) = body.split_at(body.len().min(1));
    let name = match (kind, digits.parse::<u32>().ok()) {
        ("f", Some(n @ (2 | 4 | 8 | 16))) => format!("float{}", n * 8),
        ("i", Some(n @ (1 | 2 | 4 | 8))) => format!("int{}", n * 8),
        ("u", Some(n @ (1 | 2 | 4 | 8))) => format!("uint{}", n * 8),
        ("c", Some(n @ (8 | 16 | 32))) => format!("complex{}", n * 8),
        ("b", Some(1)) => "bool".to_string(),
        _ => return descr.to_string(),
    };
    format!("{descr} ({name})")
}

impl Dtype {
    pub const ALL: [Dtype; 6] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::I8,
        Dtype::I32,
        Dtype::U8,
    ];

    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I8 | Dtype::U8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::I8 => "i8",
            Dtype::I32 => "i32",
            Dtype::U8 => "u8",
        }
    }

    /// The numpy dtype of the `.npy` file a tensor of this dtype is read
    /// from and written as (`kb-sim --input`, `kb-inspect tensor`,
    /// `kb-replay --dump-outputs`): its descr and numpy name. bf16, which
    /// numpy lacks, travels as float32.
    pub fn npy(self) -> (&'static str, &'static str) {
        match self {
            Dtype::F32 | Dtype::Bf16 => ("<f4", "float32"),
            Dtype::F16 => ("<f2", "float16"),
            Dtype::I8 => ("|i1", "int8"),
            Dtype::I32 => ("<i4", "int32"),
            Dtype::U8 => ("|u1", "uint8"),
        }
    }

    pub fn from_name(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn from_code(code: u8) -> Option<Dtype> {
        Dtype::ALL.get(code as usize).copied()
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Memory space an address lives in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[repr(u8)]
pub enum Space {
    /// Host memory (tensor data chunks of the trace).
    Host = 0,
    #[default]
    Hbm = 1,
    Tcm = 2,
    Sram = 3,
}

impl Space {
    pub const ALL: [Space; 4] = [Space::Host, Space::Hbm, Space::Tcm, Space::Sram];

    pub fn name(self) -> &'static str {
        match self {
            Space::Host => "host",
            Space::Hbm => "hbm",
            Space::Tcm => "tcm",
            Space::Sram => "sram",
        }
    }

    pub fn from_code(code: u8) -> Option<Space> {
        Space::ALL.get(code as usize).copied()
    }
}

/// Phase 2 dispatch class of an op (docs/design.md P6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum OpKind {
    #[default]
    Memory,
    Gemm,
    Math,
    /// Synchronization and control (format 3.4): a kernel's run on a PE,
    /// the time a kernel waited (for a signal, a barrier, its ops), a
    /// signal's flight, a launch, a VA map message. No params and no data
    /// effects: replay has nothing to do for them; they are on record so
    /// that every wait in a run has a cause a reader can follow.
    Sync,
    /// An atomic read-modify-write on device memory (kind 4; its records
    /// carry flag bit 6, which readers built before atomics refuse):
    /// params [`crate::AtomicParams`].
    Atomic,
    /// A kind this reader does not know (written by a newer tool). Its
    /// params are kept as raw bytes; replay skips it and counts it.
    Unknown(u8),
}

impl OpKind {
    pub fn code(self) -> u8 {
        match self {
            OpKind::Memory => 0,
            OpKind::Gemm => 1,
            OpKind::Math => 2,
            OpKind::Sync => 3,
            OpKind::Atomic => 4,
            OpKind::Unknown(c) => c,
        }
    }

    pub fn from_code(code: u8) -> OpKind {
        match code {
            0 => OpKind::Memory,
            1 => OpKind::Gemm,
            2 => OpKind::Math,
            3 => OpKind::Sync,
            4 => OpKind::Atomic,
            c => OpKind::Unknown(c),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Memory => "memory",
            OpKind::Gemm => "gemm",
            OpKind::Math => "math",
            OpKind::Sync => "sync",
            OpKind::Atomic => "atomic",
            OpKind::Unknown(_) => "unknown",
        }
    }
}

/// An address as a kernel or component used it: a space and a byte address
/// in that space's address model (PA, VA or LA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Addr {
    pub space: Space,
    pub addr: u64,
}

/// A physical byte range touched by an op: `rows` runs of `len` bytes, the
/// first at `pa`, each next one `stride` bytes after the previous.
/// A contiguous range has `rows == 1` (stride is then ignored and encoded as 0).
/// With `rows <= 1` the stride is not stored and reads back as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub pa: u64,
    pub len: u64,
    pub rows: u32,
    pub stride: u64,
}

impl Extent {
    pub fn contiguous(pa: u64, len: u64) -> Extent {
        Extent {
            pa,
            len,
            rows: 1,
            stride: 0,
        }
    }

    /// Total bytes touched.
    pub fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.rows as u64)
    }
}

/// When and where an op's reads observe memory, or its writes become visible.
/// `seq` is the global order in which Phase 1 applied data effects: replay
/// applies effects in `seq` order and so reproduces what Phase 1 observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Effect {
    pub time: Ps,
    pub seq: u64,
    pub ranges: Vec<Extent>,
}

/// DMA params (docs/design.md L2: dma_read/dma_write): a 2-D
/// block of `rows` x `row_bytes` from `src` to `dst`, each side with its own
/// row stride (equal to `row_bytes` when contiguous).
///
/// With `rows <= 1` the strides are not stored: they read back as
/// `row_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryParams {
    pub src: Addr,
    pub dst: Addr,
    pub rows: u32,
    pub row_bytes: u64,
    pub src_stride: u64,
    pub dst_stride: u64,
    pub dtype: Option<Dtype>,
}

impl MemoryParams {
    pub fn nbytes(&self) -> u64 {
        self.row_bytes.saturating_mul(self.rows as u64)
    }
}

/// Matrix layout of a GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    #[default]
    RowMajor,
    ColMajor,
}

/// GEMM params (docs/design.md L2: `gemm_<dtype>`): out = a x b (+ acc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmParams {
    pub a: Addr,
    pub b: Addr,
    pub out: Addr,
    /// Accumulator input, when the dot accumulates into an existing tile.
    pub acc: Option<Addr>,
    pub m: u32,
    pub k: u32,
    pub n: u32,
    pub dtype_in: Dtype,
    pub dtype_acc: Dtype,
    pub dtype_out: Dtype,
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub layout_a: Layout,
    pub layout_b: Layout,
    pub layout_out: Layout,
}

impl GemmParams {
    /// `2*m*n*k` (see [`Params::flops`]).
    pub fn flops(&self) -> u64 {
        2u64.saturating_mul(self.m as u64)
            .saturating_mul(self.n as u64)
            .saturating_mul(self.k as u64)
    }
}

/// Vector/elementwise/reduction operator of a math op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MathOp {
    Exp = 0,
    Log = 1,
    Sqrt = 2,
    Rsqrt = 3,
    Add = 4,
    Sub = 5,
    Mul = 6,
    Div = 7,
    Max = 8,
    Min = 9,
    Where = 10,
    Cast = 11,
    Sum = 12,
    ReduceMax = 13,
    Copy = 14,
    Abs = 15,
    Neg = 16,
    Sigmoid = 17,
    Tanh = 18,
    Erf = 19,
    Exp2 = 20,
    /// Comparisons give a 0/1 mask (output dtype u8).
    Lt = 21,
    Le = 22,
    Gt = 23,
    Ge = 24,
    Eq = 25,
    Ne = 26,
    ReduceMin = 27,
    Mean = 28,
    /// Index (i32) of the first maximum along the axis.
    ArgMax = 29,
    /// Index (i32) of the first minimum along the axis.
    ArgMin = 30,
    /// No inputs: each element is its index along `axis` (0: the row, 1:
    /// the column), like Triton's `arange` broadcast to the tile.
    Arange = 31,
    // Codes 32 and up: the second round of kernel ops (issue 34).
    /// Logical and of two masks (non-zero is true): a u8 0/1 mask.
    And = 32,
    /// Logical or of two masks.
    Or = 33,
    /// Logical exclusive or of two masks.
    Xor = 34,
    /// Logical not of a mask (1 where the input is zero).
    Not = 35,
    /// The input's transpose: an R x C input gives a C x R output.
    Transpose = 36,
    /// The input's elements in row-major order, as a `rows x cols` tile
    /// with as many elements.
    Reshape = 37,
    /// The `rows x cols` block of the input whose top-left element is
    /// (scalar input 1, scalar input 2).
    Slice = 38,
    /// Two tiles joined along `axis` (0: stacked, 1: side by side).
    Concat = 39,
    /// Inclusive running sum along `axis`.
    Cumsum = 40,
    /// Inclusive running product along `axis`.
    Cumprod = 41,
    /// Inclusive running maximum along `axis` (NaN propagates).
    Cummax = 42,
    /// `a` to the power `b` (floats).
    Pow = 43,
    /// Base-2 logarithm (floats).
    Log2 = 44,
    /// Sine (floats, radians).
    Sin = 45,
    /// Cosine (floats, radians).
    Cos = 46,
    /// Round toward negative infinity.
    Floor = 47,
    /// Round toward positive infinity.
    Ceil = 48,
    /// Remainder of truncated division (C's `fmod`: the sign of `a`).
    Rem = 49,
    /// `min(max(x, lo), hi)` of (x, lo, hi).
    Clamp = 50,
    /// Uniform f32 in [0, 1) from Philox4x32-10 of each offset (an integer
    /// tile) under a 64-bit seed (scalar inputs: its low and high 32 bits),
    /// as Triton's `tl.rand`.
    Rand = 51,
}

impl MathOp {
    /// Every op, in code order (`ALL[code]` has that code).
    pub const ALL: [MathOp; 52] = [
        MathOp::Exp,
        MathOp::Log,
        MathOp::Sqrt,
        MathOp::Rsqrt,
        MathOp::Add,
        MathOp::Sub,
        MathOp::Mul,
        MathOp::Div,
        MathOp::Max,
        MathOp::Min,
        MathOp::Where,
        MathOp::Cast,
        MathOp::Sum,
        MathOp::ReduceMax,
        MathOp::Copy,
        MathOp::Abs,
        MathOp::Neg,
        MathOp::Sigmoid,
        MathOp::Tanh,
        MathOp::Erf,
        MathOp::Exp2,
        MathOp::Lt,
        MathOp::Le,
        MathOp::Gt,
        MathOp::Ge,
        MathOp::Eq,
        MathOp::Ne,
        MathOp::ReduceMin,
        MathOp::Mean,
        MathOp::ArgMax,
        MathOp::ArgMin,
        MathOp::Arange,
        MathOp::And,
        MathOp::Or,
        MathOp::Xor,
        MathOp::Not,
        MathOp::Transpose,
        MathOp::Reshape,
        MathOp::Slice,
        MathOp::Concat,
        MathOp::Cumsum,
        MathOp::Cumprod,
        MathOp::Cummax,
        MathOp::Pow,
        MathOp::Log2,
        MathOp::Sin,
        MathOp::Cos,
        MathOp::Floor,
        MathOp::Ceil,
        MathOp::Rem,
        MathOp::Clamp,
        MathOp::Rand,
    ];

    pub fn from_code(code: u8) -> Option<MathOp> {
        MathOp::ALL.get(code as usize).copied()
    }

    /// The op's name, as records name it (`exp`, `reduce_max`, ...).
    pub fn name(self) -> &'static str {
        match self {
            MathOp::Exp => "exp",
            MathOp::Log => "log",
            MathOp::Sqrt => "sqrt",
            MathOp::Rsqrt => "rsqrt",
            MathOp::Add => "add",
            MathOp::Sub => "sub",
            MathOp::Mul => "mul",
            MathOp::Div => "div",
            MathOp::Max => "max",
            MathOp::Min => "min",
            MathOp::Where => "where",
            MathOp::Cast => "cast",
            MathOp::Sum => "sum",
            MathOp::ReduceMax => "reduce_max",
            MathOp::Copy => "copy",
            MathOp::Abs => "abs",
            MathOp::Neg => "neg",
            MathOp::Sigmoid => "sigmoid",
            MathOp::Tanh => "tanh",
            MathOp::Erf => "erf",
            MathOp::Exp2 => "exp2",
            MathOp::Lt => "lt",
            MathOp::Le => "le",
            MathOp::Gt => "gt",
            MathOp::Ge => "ge",
            MathOp::Eq => "eq",
            MathOp::Ne => "ne",
            MathOp::ReduceMin => "reduce_min",
            MathOp::Mean => "mean",
            MathOp::ArgMax => "argmax",
            MathOp::ArgMin => "argmin",
            MathOp::Arange => "arange",
            MathOp::And => "and",
            MathOp::Or => "or",
            MathOp::Xor => "xor",
            MathOp::Not => "not",
            MathOp::Transpose => "transpose",
            MathOp::Reshape => "reshape",
            MathOp::Slice => "slice",
            MathOp::Concat => "concat",
            MathOp::Cumsum => "cumsum",
            MathOp::Cumprod => "cumprod",
            MathOp::Cummax => "cummax",
            MathOp::Pow => "pow",
            MathOp::Log2 => "log2",
            MathOp::Sin => "sin",
            MathOp::Cos => "cos",
            MathOp::Floor => "floor",
            MathOp::Ceil => "ceil",
            MathOp::Rem => "rem",
            MathOp::Clamp => "clamp",
            MathOp::Rand => "rand",
        }
    }
}

/// One operand of a math op: a tile in memory or an immediate scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MathInput {
    Tile {
        addr: Addr,
        rows: u32,
        cols: u32,
        dtype: Dtype,
    },
    Scalar(f64),
}

/// Math params (docs/design.md L2).
#[derive(Debug, Clone, PartialEq)]
pub struct MathParams {
    pub op: MathOp,
    pub inputs: Vec<MathInput>,
    pub out: Addr,
    pub rows: u32,
    pub cols: u32,
    pub dtype: Dtype,
    /// Reduction axis, for reductions.
    pub axis: Option<u8>,
}

impl MathParams {
    /// One per element of the `rows x cols` tile (see [`Params::flops`]).
    pub fn flops(&self) -> u64 {
        (self.rows as u64).saturating_mul(self.cols as u64)
    }
}

/// Typed params of a record, one variant per op kind.
///
/// The variant must match the record's [`OpKind`] (`Raw` goes with
/// `OpKind::Unknown`); `None` goes with any kind. Empty `Raw` bytes read
/// back as `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Params {
    #[default]
    None,
    Memory(MemoryParams),
    Gemm(GemmParams),
    Math(MathParams),
    Atomic(crate::atomic::AtomicParams),
    /// Params of an unknown op kind, kept verbatim.
    Raw(Vec<u8>),
}

impl Params {
    /// FLOPs the op executes: a gemm `2*m*n*k`; a math op one per element
    /// of its `rows x cols` tile, whatever the operator; anything else 0.
    /// Saturates rather than overflow on hostile shapes.
    pub fn flops(&self) -> u64 {
        match self {
            Params::Gemm(g) => g.flops(),
            Params::Math(m) => m.flops(),
            _ => 0,
        }
    }
}

/// Why an op could not start earlier: the kind of a causal edge
/// ([`Dep`]). Codes are the low three bits of an encoded edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum DepKind {
    /// Memory order on the same bytes: the op reads what the other wrote,
    /// or writes what the other reads or writes. The only kind replay
    /// orders by (traces before 3.4 have no other).
    #[default]
    Data = 0,
    /// The op's kernel issued it after the other op (or wait) completed:
    /// the kernel's program had stopped for it.
    Program = 1,
    /// A synchronization: a signal before the wait it ends, a barrier's
    /// arrivals before its release, a copy's notification before the wait
    /// on it.
    Sync = 2,
    /// The host's program: an upload or map before a launch, a launch
    /// before a kernel starts, kernels before their launch ends.
    Host = 3,
    /// The op waited for the unit (a DMA engine, a GEMM or math unit) the
    /// other op held.
    Resource = 4,
}

impl DepKind {
    pub const ALL: [DepKind; 5] = [
        DepKind::Data,
        DepKind::Program,
        DepKind::Sync,
        DepKind::Host,
        DepKind::Resource,
    ];

    pub fn from_code(code: u8) -> Option<DepKind> {
        DepKind::ALL.get(code as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            DepKind::Data => "data",
            DepKind::Program => "program",
            DepKind::Sync => "sync",
            DepKind::Host => "host",
            DepKind::Resource => "resource",
        }
    }
}

/// A causal edge: op `op` (always an earlier id) had to happen before the
/// record's op could start, for reason `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dep {
    pub op: u64,
    pub kind: DepKind,
}

impl Dep {
    pub fn data(op: u64) -> Dep {
        Dep {
            op,
            kind: DepKind::Data,
        }
    }
}

/// One op record: what ran where and when, what it touched, and a
/// fingerprint of the bytes it moved (memory ops, where Phase 1 knew them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    /// Stable id, unique in the trace, assigned in creation order.
    pub op_id: u64,
    pub t_start: Ps,
    pub t_end: Ps,
    /// String id of the component node id (e.g. `sip0.cube0.pe0.pe_dma`).
    pub component: u32,
    /// String id of the op name (e.g. `dma_read`, `TileToken/DMA_READ`).
    pub op_name: u32,
    pub kind: OpKind,
    pub params: Params,
    /// Causal edges: the ops that had to happen before this one could
    /// start, each with why. Replay orders by the [`DepKind::Data`] ones.
    pub deps: Vec<Dep>,
    pub fingerprint: Option<u64>,
    pub read: Option<Effect>,
    pub write: Option<Effect>,
    /// The part `[start, end)` of `[t_start, t_end]` during which the
    /// serving unit computes or transfers (its busy time, as opposed to the
    /// whole span it holds the op: operand streaming, setup, waiting for a
    /// producer). `None` means the whole span is active: traces before
    /// format 3.3, host and CPU records. When present,
    /// `t_start <= start <= end <= t_end`; writers and readers refuse
    /// anything else. `kb_format::usage` turns it into utilisation.
    pub active: Option<(Ps, Ps)>,
}

/// How a tensor's bytes are laid out on the device: each shard is a block of
/// `rows` x `row_bytes` of the tensor (rows `tensor_row_stride` bytes apart
/// in the tensor), stored contiguously at physical address `pa`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub tensor_offset: u64,
    pub rows: u64,
    pub row_bytes: u64,
    pub tensor_row_stride: u64,
    pub pa: u64,
}

/// A named tensor of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMeta {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// The address kernels use for element 0 (PA, VA or LA by model).
    pub address: u64,
    /// True when the host provides the data (tensor chunks in the trace).
    pub host_data: bool,
    pub shards: Vec<Shard>,
}

impl TensorMeta {
    /// Size of the tensor in bytes; `u64::MAX` if that overflows (a corrupt
    /// or hostile shape), so no tensor data can fit it.
    pub fn nbytes(&self) -> u64 {
        self.checked_nbytes().unwrap_or(u64::MAX)
    }

    /// Size of the tensor in bytes, `None` if it does not fit in a `u64`.
    pub fn checked_nbytes(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
    }
}

/// The machine a trace was made on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopologyMeta {
    pub name: String,
    pub address_model: String,
    /// The resolved topology, as YAML.
    pub resolved: String,
}

/// Run metadata: the first chunk of every trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Meta {
    pub tool: String,
    pub tool_version: String,
    pub command_line: Vec<String>,
    pub topology: TopologyMeta,
    pub benchmark: String,
    pub params: Vec<(String, String)>,
    pub seed: u64,
    pub tensors: Vec<TensorMeta>,
}

impl Meta {
    pub fn tensor(&self, name: &str) -> Option<(u32, &TensorMeta)> {
        self.tensors
            .iter()
            .enumerate()
            .find(|(_, t)| t.name == name)
            .map(|(i, t)| (i as u32, t))
    }
}

/// A reference expression over named input tensors, evaluated by kb-replay
/// in f64 independently of the op replay.
///
/// Values are 2-D. A tensor of more than 2 dims is read as its 2-D view
/// `[product of the leading dims, last dim]` (`[1, n]` for a 1-D one), so
/// axis 1 is its last dim and [`Expr::BatchedMatmul`] multiplies the
/// stacked matrices of 3-D tensors. Elementwise ops with several operands (arithmetic,
/// `Maximum`/`Minimum`/`Pow`, comparisons, `Where`) broadcast numpy-style:
/// each dim equal or 1 (a `Scalar` is 1 x 1). Reductions keep dims: axis 0
/// gives 1 x cols, axis 1 rows x 1.
///
/// Deserializing refuses expressions nested deeper than [`MAX_EXPR_DEPTH`],
/// so a hostile verify chunk cannot overflow the stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    Tensor(String),
    Matmul(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Transpose(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Add(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Sub(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Mul(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Div(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Exp(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Softmax {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    Sum {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    Max {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    Scalar(f64),
    /// Rows of `table` picked by `indices` (a column of row numbers):
    /// `out[i, :] = table[indices[i, 0], :]`.
    Gather {
        #[serde(deserialize_with = "de_sub")]
        table: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        indices: Box<Expr>,
    },
    // Appended variants: postcard encodes the variant index, so existing
    // ones keep theirs.
    Sqrt(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// `1 / sqrt(x)`.
    Rsqrt(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// Natural logarithm.
    Log(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Abs(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Neg(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Tanh(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Erf(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// `1 / (1 + exp(-x))`.
    Sigmoid(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// Elementwise maximum (NaN if either is NaN).
    Maximum(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    /// Elementwise minimum (NaN if either is NaN).
    Minimum(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    /// `a` to the power `b`.
    Pow(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    /// Comparisons: 1.0 where true, else 0.0 (false when either is NaN,
    /// except `Ne`).
    Lt(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Le(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Gt(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Ge(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Eq(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Ne(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    /// `a` where `cond` is non-zero (NaN counts as non-zero), else `b`.
    Where {
        #[serde(deserialize_with = "de_sub")]
        cond: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        a: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        b: Box<Expr>,
    },
    /// Mean along `axis` (dims kept, as `Sum`).
    Mean {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    /// Minimum along `axis` (dims kept, as `Max`).
    Min {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    /// The sum of `input`'s `blocks` equal row blocks: an R x C input gives
    /// R/blocks x C, `out[i, j] = sum_k input[k*R/blocks + i, j]`. New in 3.1.
    SumBlocks {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        blocks: u64,
    },
    /// `input` stacked `reps` times along the rows: R x C gives
    /// (reps*R) x C (numpy `tile(x, (reps, 1))`). New in 3.1.
    Tile {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        reps: u64,
    },
    // Indices 35 and up (issue 34): positions, masks and the second round
    // of kernel ops, so references need no index tensors on the device.
    /// A `rows x cols` matrix whose elements are their index along `axis`
    /// (0: the row, 1: the column); numpy's `arange` broadcast. A causal
    /// mask is `Le(Iota{1, n, 1}, Iota{n, 1, 0})`.
    Iota {
        rows: u64,
        cols: u64,
        axis: u8,
    },
    /// `input` with the elements above diagonal `diagonal` zeroed: kept
    /// where `j - i <= diagonal` (numpy's `tril(x, k)`).
    Tril {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        diagonal: i64,
    },
    /// `input` with the elements below diagonal `diagonal` zeroed: kept
    /// where `j - i >= diagonal` (numpy's `triu(x, k)`).
    Triu {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        diagonal: i64,
    },
    /// Logical ops on masks (non-zero, NaN included, is true): 1.0 or 0.0.
    And(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Or(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Xor(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    Not(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// Base-2 logarithm.
    Log2(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Sin(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Cos(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Floor(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    Ceil(#[serde(deserialize_with = "de_sub")] Box<Expr>),
    /// Remainder of truncated division, the sign of `a` (C's `fmod`).
    Rem(
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
        #[serde(deserialize_with = "de_sub")] Box<Expr>,
    ),
    /// `min(max(input, lo), hi)`, broadcast.
    Clamp {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        lo: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        hi: Box<Expr>,
    },
    /// Inclusive running sum along `axis` (same shape).
    Cumsum {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    /// Inclusive running product along `axis`.
    Cumprod {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    /// Inclusive running maximum along `axis` (NaN propagates).
    Cummax {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        axis: u8,
    },
    /// `input`'s elements in row-major order as `rows x cols`.
    Reshape {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        rows: u64,
        cols: u64,
    },
    /// The `rows x cols` block of `input` at (`row`, `col`).
    Slice {
        #[serde(deserialize_with = "de_sub")]
        input: Box<Expr>,
        row: u64,
        col: u64,
        rows: u64,
        cols: u64,
    },
    /// `a` and `b` joined along `axis` (0: `a` above `b`, 1: side by side).
    Concat {
        #[serde(deserialize_with = "de_sub")]
        a: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        b: Box<Expr>,
        axis: u8,
    },
    /// Triton's `tl.rand(seed, offsets)`: a uniform value in [0, 1) per
    /// element of `offsets` (integers, taken mod 2^32), from
    /// Philox4x32-10 keyed by `seed` (see [`MathOp::Rand`]).
    Rand {
        seed: u64,
        #[serde(deserialize_with = "de_sub")]
        offsets: Box<Expr>,
    },
    /// Batched matmul over 2-D views: `a` stacks `batch` matrices of `m
    /// x k` (`batch*m x k`, the view of a `[batch, m, k]` tensor), `b`
    /// stacks `batch` of `k x n` (`batch*k x n`); the value stacks the
    /// `batch` products (`batch*m x n`, the view of `[batch, m, n]`).
    BatchedMatmul {
        #[serde(deserialize_with = "de_sub")]
        a: Box<Expr>,
        #[serde(deserialize_with = "de_sub")]
        b: Box<Expr>,
        batch: u64,
    },
}

/// Deepest nesting of [`Expr`] that deserializing accepts.
pub const MAX_EXPR_DEPTH: u32 = 64;

thread_local! {
    static EXPR_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Deserialize a sub-expression, counting the nesting depth.
fn de_sub<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Box<Expr>, D::Error> {
    let depth = EXPR_DEPTH.with(|c| c.get());
    if depth >= MAX_EXPR_DEPTH {
        return Err(serde::de::Error::custom(format!(
            "expression nested deeper than {MAX_EXPR_DEPTH} levels"
        )));
    }
    EXPR_DEPTH.with(|c| c.set(depth + 1));
    let r = Expr::deserialize(d);
    EXPR_DEPTH.with(|c| c.set(depth));
    r.map(Box::new)
}

/// Tolerance for comparing an output with its reference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

/// One checked output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyOutput {
    pub tensor: String,
    pub reference: Expr,
    /// Overrides the per-dtype default (docs/design.md P7) when set.
    pub tolerance: Option<Tolerance>,
}

/// The verification spec: which outputs to check and against what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct VerifySpec {
    pub outputs: Vec<VerifyOutput>,
}

/// Counts written in the footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub records: u64,
    pub chunks: u64,
    pub tensor_bytes: u64,
    pub strings: u64,
    /// When the run ended: at least every record's `t_end` (a writer may
    /// set it later, [`crate::TraceWriter::end_at`]: kb-sim's last event,
    /// after the host's frees and unmaps).
    pub max_t_end: Ps,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_descrs_are_named_as_numpy_names_them() {
        assert_eq!(npy_descr_named("<f8"), "<f8 (float64)");
        assert_eq!(npy_descr_named(">i2"), ">i2 (int16)");
        assert_eq!(npy_descr_named("|u1"), "|u1 (uint8)");
        assert_eq!(npy_descr_named("|b1"), "|b1 (bool)");
        assert_eq!(npy_descr_named("<c16"), "<c16 (complex128)");
        // Not a plain numeric type: as given.
        assert_eq!(npy_descr_named("<U8"), "<U8");
        assert_eq!(npy_descr_named("|V16"), "|V16");
        assert_eq!(npy_descr_named(""), "");
        assert_eq!(Dtype::Bf16.npy(), ("<f4", "float32"));
    }
}
