//! What runs on a PE: a program that issues one command at a time and is
//! resumed when it completes. (The kernels issue replaces hand-written
//! programs with `tl` kernels driven by a KernelRunner through this seam.)

use kb_format::{
    AtomicParams, Dtype, GemmParams, MathInput, MathParams, MemoryParams, OpKind, Params, Ps, Space,
};

use crate::machine::PeCoord;

/// A compute op as named when its result is read too early: Phase 1 does
/// not know the value of bytes it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writer {
    pub op_id: u64,
    pub op_name: &'static str,
    pub pe: PeCoord,
    /// When it was issued.
    pub time: Ps,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op {} ({} on {}, issued at {:.3} ns)",
            self.op_id,
            self.op_name,
            self.pe,
            self.time as f64 / 1000.0
        )
    }
}

/// Bytes of a load whose value only Phase 2 knows: `len` bytes at
/// `offset` into [`Loaded::bytes`], last written by `writer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unknown {
    pub offset: usize,
    pub len: usize,
    pub writer: Writer,
}

/// What a load delivered: the bytes in tile order, and which of them are
/// unknown in Phase 1 (results of compute ops, moved without their value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    /// By reference to the pages they were read from (no copy).
    pub bytes: crate::data::Snapshot,
    pub unknown: Vec<Unknown>,
}

/// A 2-D DMA: the trace's memory params (`rows` x `row_bytes` from `src`
/// to `dst`, rows `*_stride` bytes apart on each side) and an op name.
/// Addresses are the ones the kernel used (PA, VA or LA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaCmd {
    pub mem: MemoryParams,
    /// Op name override (pipeline stages: `TileToken/DMA_READ`).
    pub label: Option<&'static str>,
}

/// A message that is a data op declares itself (docs/design.md P5); the
/// framework's op-log hook records its service from this declaration, so
/// no component or protocol names op kinds itself.
pub trait DataOp {
    fn op_name(&self) -> &'static str;
    fn op_kind(&self) -> OpKind;
    fn params(&self) -> Params;
}

impl DataOp for DmaCmd {
    fn op_name(&self) -> &'static str {
        if let Some(l) = self.label {
            return l;
        }
        match (self.mem.src.space, self.mem.dst.space) {
            (Space::Tcm, Space::Tcm) => "dma_copy",
            (_, Space::Tcm) => "dma_read",
            (Space::Tcm, _) => "dma_write",
            _ => "dma_copy",
        }
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Memory
    }

    fn params(&self) -> Params {
        Params::Memory(self.mem)
    }
}

/// An atomic read-modify-write (`tl.atomic_add` and the others): the
/// trace's atomic params. The target is a block in HBM or SRAM (the
/// address the kernel used); values, mask and old-values tiles are in
/// this PE's TCM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AtomicCmd {
    pub params: AtomicParams,
}

impl DataOp for AtomicCmd {
    fn op_name(&self) -> &'static str {
        self.params.op.name()
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Atomic
    }

    fn params(&self) -> Params {
        Params::Atomic(self.params)
    }
}

impl DataOp for GemmParams {
    fn op_name(&self) -> &'static str {
        match self.dtype_in {
            Dtype::F32 => "gemm_f32",
            Dtype::F16 => "gemm_f16",
            Dtype::Bf16 => "gemm_bf16",
            Dtype::I8 => "gemm_i8",
            Dtype::I32 => "gemm_i32",
            Dtype::U8 => "gemm_u8",
        }
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Gemm
    }

    fn params(&self) -> Params {
        Params::Gemm(*self)
    }
}

thread_local! {
    /// Math ops' input vectors, emptied, for the kernels' next math ops on
    /// this thread: the engine copies a finished op's inputs into a vector
    /// the trace writer handed back and returns the kernel's here, so a
    /// run on the coroutine executor allocates none per math op (with the
    /// thread executor a kernel thread finds none and allocates).
    static MATH_INPUTS: Spare<MathInput> = const { std::cell::RefCell::new(Vec::new()) };
    /// Signal lists of finished waits (`Command::WaitSignal`), likewise.
    static SIGNAL_LISTS: Spare<(u32, u64)> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Emptied vectors kept for reuse on one thread.
type Spare<T> = std::cell::RefCell<Vec<Vec<T>>>;

/// Spare vectors kept per thread, of each kind.
const SPARE_VECS: usize = 256;

/// An empty vector: a spare one from `pool` where there is one.
fn take_spare<T: 'static>(pool: &'static std::thread::LocalKey<Spare<T>>) -> Vec<T> {
    pool.try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keep `v`, emptied, in `pool` (if it has room).
fn keep_spare<T: 'static>(pool: &'static std::thread::LocalKey<Spare<T>>, mut v: Vec<T>) {
    v.clear();
    let _ = pool.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_VECS && v.capacity() > 0 {
            s.push(v);
        }
    });
}

/// An empty vector for a math op's inputs: a spare one where there is one.
pub fn math_inputs() -> Vec<MathInput> {
    take_spare(&MATH_INPUTS)
}

/// Keep `v`, emptied, for a later math op on this thread.
pub fn spare_math_inputs(v: Vec<MathInput>) {
    keep_spare(&MATH_INPUTS, v)
}

/// An empty vector for a wait's signal list: a spare one where there is one.
pub fn signal_list() -> Vec<(u32, u64)> {
    take_spare(&SIGNAL_LISTS)
}

/// Keep `v`, emptied, for a later wait on this thread.
pub fn spare_signal_list(v: Vec<(u32, u64)>) {
    keep_spare(&SIGNAL_LISTS, v)
}

impl DataOp for MathParams {
    fn op_name(&self) -> &'static str {
        self.op.name()
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Math
    }

    fn params(&self) -> Params {
        Params::Math(self.clone())
    }
}

/// A GEMM or math op with an optional op-name override and the part of
/// its FLOPs spent on data rather than padding (see
/// [`crate::kernel::Operand::valid`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Labeled<T> {
    pub op: T,
    pub label: Option<&'static str>,
    pub useful_flops: u64,
}

impl<T: DataOp> DataOp for Labeled<T> {
    fn op_name(&self) -> &'static str {
        self.label.unwrap_or_else(|| self.op.op_name())
    }

    fn op_kind(&self) -> OpKind {
        self.op.op_kind()
    }

    fn params(&self) -> Params {
        self.op.params()
    }
}

/// A signal update (`Tl::signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// Set the signal to this value.
    Set(u64),
    /// Add this to the signal (saturating).
    Add(u64),
}

/// A copy's notification: once the copied bytes have landed, add `add`
/// to signal `signal` of PE `pe` (a message from the destination memory
/// to that PE through the fabric), so a receiver can wait for the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notify {
    /// The PE whose signal is raised (usually the one that owns the
    /// destination).
    pub pe: PeCoord,
    /// Which of its signals.
    pub signal: u32,
    /// How much to add to it.
    pub add: u64,
}

impl Notify {
    /// Add 1 to `pe`'s signal `signal` when the copy lands.
    pub fn one(pe: PeCoord, signal: u32) -> Notify {
        Notify { pe, signal, add: 1 }
    }
}

/// A command a PE program issues.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Issue a DMA and resume when it completes.
    Dma(DmaCmd),
    /// Issue a DMA and resume at once; `WaitAll` waits for it.
    DmaAsync(DmaCmd),
    /// A store (`tl.store`): its data effects happen at issue, so a load
    /// right after it sees the new bytes (docs/design.md P3,
    /// store visibility); the transfer's timing runs on asynchronously.
    Store(DmaCmd),
    /// A copy (`Tl::put`, `Tl::copy`): like a store, its data effects
    /// happen at issue and its transfer is timed after; resumes at once.
    /// With a notification it is a release: the notification, sent from
    /// the destination once the bytes (and those of every earlier
    /// notifying copy of this PE to the same signal) have arrived, carries
    /// what this PE did before it, except loads still in flight.
    Send { cmd: DmaCmd, notify: Option<Notify> },
    /// Raise a PE's signal (a release: sent once this PE's compute ops in
    /// flight have completed; loads in flight are left out of it); resumes
    /// once it is sent.
    Signal {
        pe: PeCoord,
        signal: u32,
        op: SignalOp,
    },
    /// Resume when any of this PE's signals reaches its value: `(signal,
    /// at_least)` pairs. What the updates' senders did is then ordered
    /// before what the kernel does next.
    WaitSignal(Vec<(u32, u64)>),
    /// Read this PE's signal now (no time passes; an acquire, as a wait
    /// that is satisfied at once); answered with `Reply::Value`.
    ReadSignal(u32),
    /// Wait at a barrier over these PEs (this one among them; the first is
    /// the coordinator): resumes when every member has arrived.
    Barrier(Vec<PeCoord>),
    /// Resume when every command this PE issued has completed.
    WaitAll,
    /// A GEMM on pe_gemm, operands in TCM; resumes at once (the result
    /// is pending until Phase 2).
    Gemm(Labeled<GemmParams>),
    /// A vector/elementwise/reduction op on pe_math; resumes at once.
    Math(Labeled<MathParams>),
    /// Resume when the op with this id (from `Reply::Issued`) completes;
    /// a load answers with its data.
    WaitOp(u64),
    /// An atomic read-modify-write at the target's memory; resumes with
    /// the old values (`Reply::Data`) once they are back in TCM.
    Atomic(AtomicCmd),
}

/// What a PE program is resumed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The kernel starts.
    Go,
    /// An asynchronous command was issued as op `id` (a handle to wait on).
    Issued(u64),
    /// A blocking command completed.
    Done,
    /// A blocking DMA into TCM completed; these are the bytes it wrote.
    Data(Loaded),
    /// A signal's value.
    Value(u64),
}

/// A PE's program: resumed at kernel start, after a blocking command
/// completes and right after an asynchronous one is issued. `Ok(None)`
/// ends the kernel (outstanding DMAs still complete); `Err` is a kernel
/// failure (a panic), reported with its message.
pub trait PeProgram: std::fmt::Debug {
    fn resume(&mut self, reply: Reply) -> Result<Option<Command>, String>;

    /// What the program is, for error messages (e.g. the kernel's name).
    fn name(&self) -> &str {
        "script"
    }
}

/// A program that issues a fixed list of commands in order.
#[derive(Debug)]
pub struct Script {
    cmds: std::vec::IntoIter<Command>,
}

impl Script {
    pub fn new(cmds: Vec<Command>) -> Script {
        Script {
            cmds: cmds.into_iter(),
        }
    }
}

impl PeProgram for Script {
    fn resume(&mut self, _reply: Reply) -> Result<Option<Command>, String> {
        Ok(self.cmds.next())
    }
}
