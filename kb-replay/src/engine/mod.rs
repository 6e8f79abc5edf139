//! The replay engine: applies every data effect in `seq` order (the
//! contract's rule 2), as chunks of records arrive, running independent
//! ops in parallel.
//!
//! # Windows
//!
//! Records arrive in (t_start, op_id) order, but Phase 1 applied their
//! effects in `seq` order, which can differ (a long DMA that started early
//! may write after a later op read). The engine queues each record's
//! effects and applies them in *windows*: once no effect with a seq below
//! some bound can still arrive, every queued effect below the bound is
//! staged, and when [`ReplayOptions::window`] effects are staged they are
//! applied together and their records dropped. Memory is the live data
//! plane plus the records of one window and of the ops still in flight
//! (their effects straddle the bound), never the whole op log.
//!
//! The bound is the larger of:
//!
//! - the *seq frontier*: the smallest seq no record has carried yet. Seqs
//!   are a global order of effects (one per effect, a record's read and
//!   write may share one), so an effect below the frontier can only be a
//!   duplicate; one arriving after its seq was applied is an error naming
//!   the op. kb-sim numbers effects 0, 1, 2, ... so the frontier follows
//!   the stream closely; a trace with gaps in its seqs only holds more
//!   records (at worst all of them, the old behaviour).
//! - the records chunk's seq watermark ([`Replayer::set_watermark`]: every
//!   effect with a seq below it is in this chunk or an earlier one).
//!
//! With [`ReplayOptions::streaming`] off every effect waits for the end of
//! the trace, as the first, sequential engine did.
//!
//! # Planning: physical bytes, lazy copies
//!
//! Before it runs, a window is *planned* (`plan`): its effects, in order
//! (seq, read before write, op id), become nodes that touch physical
//! bytes only. A memory op whose destination is one contiguous range
//! copies nothing: the destination becomes an alias of the bytes it read
//! ([`crate::plane::lazy`]), and later ops resolve it to where those
//! bytes lie (a DMA's TCM tile to the HBM rows it came from, and those to
//! the host data a host write brought: a GEMM reads its operands there,
//! strided). Before a physical write, the aliases whose sources it would
//! change are materialized (copied, in nodes of their own before it), so
//! every byte a later op or the verification reads is right. A memory op
//! whose bytes something overwrote between its read and its write (or
//! whose write comes in a later window) gathers them at its read and
//! writes them at its write. With [`ReplayOptions::elide`] off every memory
//! op copies.
//!
//! Fingerprints are checked on the bytes where they lie, in nodes of
//! their own (in parallel), by [`Fingerprints`]; an op that reads the same
//! unchanged bytes as an earlier checked one, with the same recorded
//! fingerprint, is checked by that hash. GEMM operands that must be
//! decoded (f16, bf16, transposed) or whose rows lie apart are decoded once
//! into a dense matrix shared by every GEMM planned to read the same
//! unchanged bytes the same way.
//!
//! # Parallel execution
//!
//! `graph` links each node to the earlier nodes it conflicts with (RAW,
//! WAW, WAR over the physical byte ranges, through an interval index), to
//! its op's earlier node, and to the ops in the record's explicit
//! dependency ids. With one thread the nodes run in order. With more,
//! `dataflow` runs the window on the rayon pool: whenever a node
//! finishes, the nodes it made ready start, earliest first, one task per
//! thread, as long as each is at most [`ReplayOptions::lookahead`] nodes
//! after the first one not done and what reads run ahead hold for their
//! writes stays within [`ReplayOptions::hold_budget`] (the bounds keep
//! parallel runs from holding much more than sequential ones). Threads
//! without a task help the running ones (a large GEMM splits across the
//! pool). Ready GEMMs that share shape, dtypes, layouts and transpose
//! flags start as one batched backend call when threads are free for all
//! of them.
//!
//! # Pipelining
//!
//! With more than one thread, windows run in the background
//! ([`Replayer::replay`]): a planned window is a task on the pool that owns
//! the plane while it runs; meanwhile this thread decodes the next records
//! and plans the next window, then takes the plane back (waiting if need
//! be), grows the regions the new window writes, and starts it. Planning
//! needs no plane: it changes the aliases, which the replayer keeps while
//! replaying (running nodes move physical bytes and never read them), and
//! logs the extents each window writes physically. Windows still run one
//! at a time, in order, and are planned exactly as without the pipeline.
//!
//! Every node computes the same bits whatever runs beside it (ops are pure
//! functions of their input bytes; backends give the same bits for any
//! thread count, batch and stride), and planning is sequential and never
//! depends on timing, so results are bit-identical for every `--threads`,
//! with and without copy elision, for every `--fingerprints`. Errors are
//! reported in effect order: after a node fails, only earlier nodes still
//! run, and the earliest failure is returned (a planning error stops the
//! plan at its node).

mod dataflow;
mod exec;
mod graph;
mod plan;

pub use plan::sampled;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use kb_format::{Extent, Meta, OpKind, Record, RecordChunk, Strings, TensorMeta};
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::error::{Error, Result, fmt_ns};
use crate::ops::{self, GemmBackend, Plan};
use crate::plane::DataPlane;
use crate::plane::lazy::Lazy;

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Most bytes one op may read or write, and one output tensor may hold.
    pub max_bytes: u64,
    /// Apply effects as soon as the stream allows it (see the module
    /// docs); false holds every record until the trace ends.
    pub streaming: bool,
    /// Effects staged before a window is applied: larger windows give
    /// more parallelism and hold more records.
    pub window: usize,
    /// Run ready GEMMs of one shape as one batched backend call.
    pub batch_gemms: bool,
    /// Copy elision: a memory op whose destination is one contiguous
    /// range copies nothing; its destination becomes an alias of the bytes
    /// it read (engine::plan), and ops read them where they lie. Never
    /// changes a result.
    pub elide: bool,
    /// Which memory ops' fingerprints are checked.
    pub fingerprints: Fingerprints,
    /// How far ahead of the first unfinished node (in effect order) ready
    /// nodes may start: more finds more parallel work, and lets more
    /// reads hold data for writes still to come.
    pub lookahead: usize,
    /// Most bytes that reads run ahead in parallel may hold for their
    /// writes (the first op not done always runs).
    pub hold_budget: u64,
    /// Compare each compute op's inputs with the snapshots Phase 1
    /// captured (`kb-sim --capture-inputs`); the first difference stops
    /// the replay with [`Error::Intermediate`].
    pub check_intermediates: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            max_bytes: crate::plane::DEFAULT_MAX_BYTES,
            streaming: true,
            window: 4096,
            batch_gemms: true,
            elide: true,
            fingerprints: Fingerprints::All,
            lookahead: 256,
            hold_budget: 16 << 20,
            check_intermediates: false,
        }
    }
}

/// Which recorded fingerprints replay checks (`--fingerprints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fingerprints {
    /// Every one.
    #[default]
    All,
    /// About one memory op in 16, chosen by op id ([`sampled`]): for runs
    /// where the trace is trusted but a systematic error should still show.
    Sample,
    /// None: the trace is trusted.
    Off,
}

impl Fingerprints {
    pub fn name(self) -> &'static str {
        match self {
            Fingerprints::All => "all",
            Fingerprints::Sample => "sample",
            Fingerprints::Off => "off",
        }
    }

    /// The mode called `name` (`all`, `sample`, `off`).
    pub fn from_name(name: &str) -> Option<Fingerprints> {
        match name {
            "all" => Some(Fingerprints::All),
            "sample" => Some(Fingerprints::Sample),
            "off" => Some(Fingerprints::Off),
            _ => None,
        }
    }
}

/// How to run ops: the GEMM backend and the thread pool.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    pub backend: &'a dyn GemmBackend,
    /// `None`, or a pool of one thread, runs nodes one by one in order.
    pub pool: Option<&'a rayon::ThreadPool>,
}

impl<'a> Exec<'a> {
    /// One thread, no pool.
    pub fn sequential(backend: &'a dyn GemmBackend) -> Exec<'a> {
        Exec {
            backend,
            pool: None,
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.map_or(1, |p| p.current_num_threads())
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub records: u64,
    /// Ops executed, by kind.
    pub memory: u64,
    pub gemm: u64,
    pub math: u64,
    /// Atomic read-modify-writes.
    pub atomic: u64,
    /// Sync records (kernels, waits, signals, launches, map messages):
    /// timing only, nothing to replay.
    pub sync: u64,
    /// Records of kinds this build does not know, skipped.
    pub unknown_skipped: u64,
    /// Fingerprints checked and matched (each by a hash of the bytes it
    /// names, or by an earlier check of the same unchanged bytes: see
    /// `fingerprints_reused`).
    pub fingerprints_checked: u64,
    /// Of those, checked by the hash of an earlier op that read the same
    /// bytes, unchanged since, with the same recorded fingerprint.
    pub fingerprints_reused: u64,
    /// Recorded fingerprints not checked (`--fingerprints sample|off`).
    pub fingerprints_skipped: u64,
    /// Bytes hashed to check fingerprints.
    pub fingerprint_bytes: u64,
    /// Bytes the trace's effects read and wrote (what Phase 1 moved).
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes replay copied to apply them: memory ops done physically,
    /// materialized aliases, operands decoded or gathered into buffers,
    /// outputs written from buffers (an operand read where it lies and an
    /// output computed in place count nothing).
    pub bytes_copied: u64,
    /// Memory ops applied as lazy copies (nothing copied).
    pub copies_elided: u64,
    /// Lazy copies done after all, because their source was about to be
    /// overwritten or their destination cut by a strided write.
    pub materialized: u64,
    /// Memory ops whose read gathered their bytes for a later write:
    /// something overwrote them first, or the write comes in a later
    /// window.
    pub captured: u64,
    /// 2mnk summed over gemm ops.
    pub gemm_flops: u64,
    /// Seconds spent applying effects.
    pub replay_seconds: f64,
    /// Of those, seconds spent planning windows and building their
    /// dependency graphs (serial work).
    pub plan_seconds: f64,
    /// Seconds spent decoding records and queueing their effects in seq
    /// order (serial work, besides `replay_seconds`).
    pub queue_seconds: f64,
    /// Of `plan_seconds` and `queue_seconds`, the seconds during which no
    /// window ran: the part the threads wait for. With more than one
    /// thread a window runs while the next records are decoded and the
    /// next window is planned, so this is less than their sum.
    pub serial_seconds: f64,
    /// Windows applied, and the most effects one held.
    pub windows: u64,
    pub max_window_effects: u64,
    /// Most records held at once (waiting for their effects' turn).
    pub max_pending_records: u64,
    /// Tasks started in parallel windows (0 with one thread): a node, or
    /// a batched call of GEMMs. With more than one thread this and the
    /// batch counts depend on timing (what is ready when); the results
    /// never do.
    pub tasks: u64,
    /// Batched GEMM calls of two or more GEMMs, and the GEMMs in them.
    pub gemm_batches: u64,
    pub gemm_batched_ops: u64,
    /// GEMMs computed where their matrices lie: both operands read in
    /// place (TCM, HBM or host data, strided) and the output accumulated
    /// in its own bytes; no byte copied.
    pub gemm_in_place: u64,
}

impl Stats {
    /// Bytes copied per GEMM flop (0 without GEMMs).
    pub fn bytes_copied_per_gemm_flop(&self) -> f64 {
        if self.gemm_flops == 0 {
            0.0
        } else {
            self.bytes_copied as f64 / self.gemm_flops as f64
        }
    }
}

/// Counters a node adds to [`Stats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Delta {
    pub bytes_copied: u64,
    pub gemm_in_place: u64,
}

impl Stats {
    fn add(&mut self, d: Delta) {
        self.bytes_copied += d.bytes_copied;
        self.gemm_in_place += d.gemm_in_place;
    }
}

impl Delta {
    fn add(&mut self, d: Delta) {
        self.bytes_copied += d.bytes_copied;
        self.gemm_in_place += d.gemm_in_place;
    }
}

/// An effect waiting to be applied, in application order: seq, then read
/// before write, then op id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EffKey {
    pub seq: u64,
    pub write: bool,
    pub op_id: u64,
    pub slot: u32,
}

/// A record whose effects are not all applied yet. It does not change
/// once queued: the nodes planned for it share it ([`plan::PNode::op`]).
#[derive(Debug)]
pub(crate) struct PendingOp {
    pub rec: Record,
    pub plan: Plan,
}

/// What an op's read holds for its write: a compute op's output bytes, or
/// a memory op's bytes captured because something overwrote them before
/// its write.
#[derive(Debug)]
pub(crate) enum Held {
    Bytes(Vec<u8>),
    /// A computed GEMM, its output encoded straight into place by the
    /// write.
    Gemm(crate::ops::gemm::Prepared<'static>),
}

/// The smallest seq no effect has carried yet.
#[derive(Debug, Default)]
struct Frontier {
    next: u64,
    ahead: BinaryHeap<Reverse<u64>>,
}

impl Frontier {
    fn see(&mut self, seq: u64) {
        if seq > self.next {
            self.ahead.push(Reverse(seq));
            return;
        }
        if seq < self.next {
            return;
        }
        self.next = self.next.saturating_add(1);
        while let Some(&Reverse(s)) = self.ahead.peek() {
            if s > self.next {
                break;
            }
            self.ahead.pop();
            if s == self.next {
                self.next = self.next.saturating_add(1);
            }
        }
    }
}

pub(crate) fn op_error(r: &Record, strings: &Strings, detail: String) -> Error {
    Error::Op {
        op_id: r.op_id,
        component: strings.name(r.component).into_owned(),
        op_name: strings.name(r.op_name).into_owned(),
        time: fmt_ns(r.t_start),
        detail,
    }
}

/// Replays a trace onto a [`DataPlane`] as its records arrive.
///
/// [`Replayer::replay`] feeds it a trace's events. With more than one
/// thread, windows are pipelined: a planned window runs as a task on the
/// pool, owning the plane, while this thread goes on decoding records and
/// planning the next window; the plane comes back when the next window is
/// planned (or a tensor chunk or the end of the trace needs it). Planning
/// reads records and changes the aliases and its own memory, never the
/// plane's bytes or regions (`plan::PlanPlane`), so it needs no plane;
/// the regions a window writes grow before it starts, when nothing runs.
/// Which effects form a window, and every node planned, are the same as
/// without the pipeline: it changes when windows run, not what they do.
#[derive(Debug)]
pub struct Replayer {
    tensors: Arc<[TensorMeta]>,
    opts: ReplayOptions,
    /// The plane and what ops' reads hold for their writes; `None` while
    /// a window runs in the background (it owns them then).
    back: Option<Back>,
    /// The running window's result, when one runs in the background.
    running: Option<std::sync::Mutex<std::sync::mpsc::Receiver<Ran>>>,
    /// The aliases (lazy copies), kept here while replaying (planning
    /// changes them beside a running window) and in the plane after
    /// [`Feed::finish`].
    lazy: Lazy,
    /// Records, their effects in seq order, and the planner.
    q: Queue,
    /// Phase 1's input snapshots by (op id, operand), when checking.
    snapshots: Arc<std::collections::HashMap<(u64, u32), Vec<u8>>>,
    /// This thread's work (start, end, planning?) since the running
    /// window started: what overlapped it is not serial.
    work: Vec<(Instant, Instant, bool)>,
    /// Seconds of queueing and planning done while a window ran.
    overlapped: f64,
}

/// What windows run on: the plane, and what ops' reads hold for their
/// writes, by slot (moved bytes, a computed output).
#[derive(Debug)]
struct Back {
    plane: DataPlane,
    held: FxHashMap<u32, Held>,
}

/// A window run in the background: the plane back, its counters, its
/// result, when it ran.
struct Ran {
    back: Back,
    stats: Stats,
    res: Result<()>,
    start: Instant,
    end: Instant,
}

/// The records waiting for their effects' turn, and the planning of
/// windows.
#[derive(Debug)]
struct Queue {
    /// Where ranges may lie (the trace's memories).
    bounds: crate::bounds::Bounds,
    ops: Vec<Option<Arc<PendingOp>>>,
    /// Effects each op has still to plan, by slot.
    left: Vec<u8>,
    free: Vec<u32>,
    pending: u64,
    /// Effects not staged yet: the first `sorted` in order (those left by
    /// the last `stage`), then those that arrived since.
    queue: Vec<EffKey>,
    sorted: usize,
    /// Sorted effects below `staged_below`, not applied yet.
    staged: Vec<EffKey>,
    /// The last window's effect vector, emptied, for the next one.
    spare_keys: Vec<EffKey>,
    /// No effect with a seq below this may arrive any more.
    staged_below: u64,
    frontier: Frontier,
    watermark: u64,
    stats: Stats,
    planner: plan::Planner,
    /// Records to decode the next ones into (their vectors reused), and
    /// where the threads that run windows hand them back.
    spare: Vec<Arc<PendingOp>>,
    recycled: Arc<Recycled>,
}

/// Finished records handed back by the threads that free windows, for
/// [`Queue::decode`] to decode new ones into: decoding allocated a
/// record and its ranges, and the pool threads freed them into the
/// decoding thread's heap, under its lock (measured: allocations per
/// record 7.9 -> 3.9 on gemm_tiled 1024^3). Records that finished stay
/// allocated only until decoding takes them, so they add no memory as a
/// trace grows.
#[derive(Debug, Default)]
struct Recycled {
    records: std::sync::Mutex<Vec<Arc<PendingOp>>>,
    /// The largest node vector handed back, emptied.
    nodes: std::sync::Mutex<Vec<plan::PNode>>,
}

/// Most records kept for reuse.
const RECYCLED_MAX: usize = 1 << 15;

impl Recycled {
    /// Keep the records no node shares any more.
    fn give(&self, ops: Vec<Arc<PendingOp>>) {
        let mut bin = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = RECYCLED_MAX.saturating_sub(bin.len());
        bin.extend(
            ops.into_iter()
                .filter(|op| Arc::strong_count(op) == 1)
                .take(room),
        );
    }

    /// Move every kept record to `into`.
    fn take_all(&self, into: &mut Vec<Arc<PendingOp>>) {
        let mut bin = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        into.append(&mut bin);
    }

    /// Keep a window's node vector (emptied) for the next window: a
    /// fresh one each window, hundreds of kB, was fresh pages to fault in
    /// (measured: 1 400 of 15 700 page faults on gemm_tiled 2048^3).
    fn give_nodes(&self, mut nodes: Vec<plan::PNode>) {
        nodes.clear();
        let mut kept = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if nodes.capacity() > kept.capacity() {
            *kept = nodes;
        }
    }

    /// The node vector kept, if any (empty).
    fn take_nodes(&self) -> Vec<plan::PNode> {
        std::mem::take(
            &mut *self
                .nodes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// A planned window, not run yet.
#[derive(Debug)]
struct Planned {
    nodes: Vec<plan::PNode>,
    /// Their dependencies, when they run as a dataflow.
    graph: Option<graph::Graph>,
    /// The extents its nodes write physically: their regions grow before
    /// it runs.
    reserve: Vec<Extent>,
    /// Records whose effects are all planned: handed back for reuse
    /// (or freed) with the window, by the thread that runs it.
    finished: Vec<Arc<PendingOp>>,
    recycled: Arc<Recycled>,
}

impl Queue {
    fn new(meta: &Meta) -> Queue {
        Queue {
            bounds: crate::bounds::Bounds::new(meta),
            ops: Vec::new(),
            left: Vec::new(),
            free: Vec::new(),
            pending: 0,
            queue: Vec::new(),
            sorted: 0,
            staged: Vec::new(),
            spare_keys: Vec::new(),
            staged_below: 0,
            frontier: Frontier::default(),
            watermark: 0,
            stats: Stats::default(),
            planner: plan::Planner::default(),
            spare: Vec::new(),
            recycled: Arc::default(),
        }
    }

    /// Queue a decoded record (`op`, whose plan is set here).
    fn push(&mut self, mut op: Arc<PendingOp>, strings: &Strings) -> Result<()> {
        self.stats.records += 1;
        let plan = ops::plan(&op.rec).map_err(|d| op_error(&op.rec, strings, d))?;
        Arc::get_mut(&mut op)
            .expect("a record being queued is not shared")
            .plan = plan;
        let r = &op.rec;
        self.bounds
            .check(&r.read, &r.write)
            .map_err(|d| op_error(r, strings, d))?;
        match r.kind {
            OpKind::Memory => self.stats.memory += 1,
            OpKind::Gemm => self.stats.gemm += 1,
            OpKind::Math => self.stats.math += 1,
            OpKind::Sync => self.stats.sync += 1,
            OpKind::Atomic => self.stats.atomic += 1,
            OpKind::Unknown(_) => self.stats.unknown_skipped += 1,
        }
        if let (Some(rd), Some(wr)) = (&r.read, &r.write)
            && wr.seq < rd.seq
        {
            return Err(op_error(
                r,
                strings,
                format!(
                    "its write (seq {}) comes before its read (seq {})",
                    wr.seq, rd.seq
                ),
            ));
        }
        for e in [&r.read, &r.write].into_iter().flatten() {
            if e.seq < self.staged_below {
                return Err(op_error(
                    r,
                    strings,
                    format!(
                        "its effect at seq {} ({}) arrives after replay applied every effect \
                         below seq {}: effect seqs must be unique",
                        e.seq,
                        fmt_ns(e.time),
                        self.staged_below
                    ),
                ));
            }
            self.frontier.see(e.seq);
        }
        if plan == Plan::Skip {
            self.spare.push(op);
            return Ok(());
        }
        self.stats.gemm_flops = self.stats.gemm_flops.saturating_add(ops::flops(r));
        let left = r.read.is_some() as u8 + r.write.is_some() as u8;
        if left == 0 {
            self.spare.push(op);
            return Ok(());
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.ops.push(None);
                self.left.push(0);
                (self.ops.len() - 1) as u32
            }
        };
        for (e, write) in [(&r.read, false), (&r.write, true)] {
            if let Some(e) = e {
                self.queue.push(EffKey {
                    seq: e.seq,
                    write,
                    op_id: r.op_id,
                    slot,
                });
            }
        }
        self.ops[slot as usize] = Some(op);
        self.left[slot as usize] = left;
        self.pending += 1;
        self.stats.max_pending_records = self.stats.max_pending_records.max(self.pending);
        Ok(())
    }

    /// Decode a records chunk and queue its records (decoded into records
    /// that finished, when there are some).
    fn decode(&mut self, c: &mut RecordChunk<'_>) -> Result<()> {
        loop {
            if self.spare.is_empty() {
                self.recycled.take_all(&mut self.spare);
            }
            let mut op = self.spare.pop().unwrap_or_else(|| {
                Arc::new(PendingOp {
                    rec: Record::default(),
                    plan: Plan::Skip,
                })
            });
            let rec = &mut Arc::get_mut(&mut op)
                .expect("a spare record is not shared")
                .rec;
            if !c.next_into(rec)? {
                self.spare.push(op);
                return Ok(());
            }
            self.push(op, c.strings())?;
        }
    }

    /// Move every queued effect below `bound` to the staged list.
    fn stage(&mut self, bound: u64) {
        // The effects that arrived since the last call are sorted, then
        // merged with the sorted ones left from it (two runs: the stable
        // sort merges them in linear time); a heap sifted every effect.
        self.queue[self.sorted..].sort_unstable();
        if self.sorted > 0
            && self.sorted < self.queue.len()
            && self.queue[self.sorted - 1] > self.queue[self.sorted]
        {
            self.queue.sort();
        }
        let below = self.queue.partition_point(|k| k.seq < bound);
        self.staged.extend(self.queue.drain(..below));
        self.sorted = self.queue.len();
        self.staged_below = self.staged_below.max(bound);
    }

    /// Stage what the stream allows; whether a window is ready to plan
    /// (streaming only).
    fn ready(&mut self, opts: &ReplayOptions) -> bool {
        if !opts.streaming {
            return false;
        }
        self.stage(self.frontier.next.max(self.watermark));
        self.staged.len() >= opts.window.max(1)
    }

    /// Plan the staged effects as a window (`None` when none are staged):
    /// its nodes, their graph when they run on more than one thread, the
    /// extents whose regions must grow. Records whose effects are all
    /// planned leave the queue (their nodes keep them).
    fn plan(
        &mut self,
        lazy: &mut Lazy,
        cx: &plan::PlanCx,
        max_bytes: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> Option<Planned> {
        if self.staged.is_empty() {
            return None;
        }
        let mut keys = std::mem::replace(&mut self.staged, std::mem::take(&mut self.spare_keys));
        self.stats.windows += 1;
        self.stats.max_window_effects = self.stats.max_window_effects.max(keys.len() as u64);
        let mut reserve = Vec::new();
        let pp = plan::PlanPlane {
            lazy,
            max_bytes,
            reserve: &mut reserve,
        };
        let mut nodes = self.planner.plan(
            pp,
            &keys,
            &self.ops,
            &mut self.left,
            cx,
            &mut self.stats,
            self.recycled.take_nodes(),
        );
        nodes.retain(|n| !n.is_empty());
        let graph = exec::parallel(nodes.len(), pool).then(|| {
            let written = plan::written_memories(&nodes);
            graph::build(&nodes, &written)
        });
        // The records whose effects are all planned leave the queue.
        let mut finished = Vec::new();
        for k in &keys {
            let slot = k.slot as usize;
            if self.left[slot] == 0
                && let Some(op) = self.ops[slot].take()
            {
                finished.push(op);
                self.free.push(k.slot);
                self.pending -= 1;
            }
        }
        keys.clear();
        self.spare_keys = keys;
        Some(Planned {
            nodes,
            graph,
            reserve,
            finished,
            recycled: self.recycled.clone(),
        })
    }
}

/// Run a planned window on `back`, on this thread (and the pool).
#[allow(clippy::too_many_arguments)]
fn run_planned(
    back: &mut Back,
    p: Planned,
    tensors: &[TensorMeta],
    strings: &Strings,
    opts: &ReplayOptions,
    snapshots: &std::collections::HashMap<(u64, u32), Vec<u8>>,
    exec: &Exec,
    stats: &mut Stats,
) -> Result<()> {
    back.plane.reserve(&p.reserve);
    // SAFETY: `run_window` never runs two nodes whose byte ranges
    // overlap, one of them writing, at the same time: with one thread it
    // runs them in order; with more, a node starts only after every
    // earlier node it conflicts with (RAW, WAW, WAR over spans that
    // contain each extent's bytes) has finished (engine::graph), and the
    // scheduler's lock orders a node's end before its successors' start.
    // A node touches only the physical ranges its action names. Nothing
    // else uses the plane while the view lives: the window owns it (its
    // aliases are the replayer's meanwhile, and the view never reads them).
    #[allow(unsafe_code)]
    let plane = unsafe { back.plane.shared() };
    let cx = exec::Cx {
        plane,
        tensors,
        strings,
        backend: exec.backend,
        batch: opts.batch_gemms,
        lookahead: opts.lookahead,
        hold_budget: opts.hold_budget,
        snapshots: opts.check_intermediates.then_some(snapshots),
    };
    let res = exec::run_window(&cx, &p.nodes, p.graph, &mut back.held, exec.pool, stats);
    // The window's nodes are freed here, on the thread that ran it (a
    // pool thread, when pipelined), and its finished records handed back.
    p.recycled.give_nodes(p.nodes);
    p.recycled.give(p.finished);
    res
}

/// Receive from `rx`; on a pool thread, running the pool's pending work
/// (the awaited window's nodes, mostly) meanwhile instead of sleeping.
/// `Err` when the sender is gone.
pub fn wait<T>(
    rx: &std::sync::mpsc::Receiver<T>,
) -> std::result::Result<T, std::sync::mpsc::RecvError> {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    loop {
        match rx.try_recv() {
            Ok(x) => return Ok(x),
            Err(TryRecvError::Disconnected) => return Err(std::sync::mpsc::RecvError),
            Err(TryRecvError::Empty) => {}
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {}
            // Nothing to run now: wait a little, then look again (work
            // that other threads start meanwhile does not wake this one).
            Some(rayon::Yield::Idle) => {
                match rx.recv_timeout(std::time::Duration::from_micros(50)) {
                    Ok(x) => return Ok(x),
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(std::sync::mpsc::RecvError);
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            None => return rx.recv(),
        }
    }
}

/// Seconds from `a` to `b` (0 when `b` is earlier).
fn secs(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64()
}

/// What [`Replayer::replay`] hands the trace's events to.
pub struct Feed<'r, 's> {
    rep: &'r mut Replayer,
    exec: &'r Exec<'s>,
    /// Where windows run in the background (pipelined runs).
    scope: Option<&'r rayon::Scope<'s>>,
}

impl std::fmt::Debug for Feed<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("pipelined", &self.scope.is_some())
            .finish_non_exhaustive()
    }
}

impl Feed<'_, '_> {
    /// Host-provided bytes of a tensor (a tensor chunk), after the
    /// windows planned before it. With `owner`, `data` lies at that byte
    /// of it, and a whole tensor is read there, not copied
    /// ([`DataPlane::load_host_in`]).
    pub fn load_host(
        &mut self,
        tensor: u32,
        offset: u64,
        data: &[u8],
        owner: Option<(&crate::plane::Owner, usize)>,
    ) -> Result<()> {
        self.rep.settle()?;
        let rep = &mut *self.rep;
        let plane = &mut rep.back.as_mut().expect("settled").plane;
        // The plane's own writes materialize the aliases they disturb.
        std::mem::swap(plane.lazy_mut(), &mut rep.lazy);
        let res = match owner {
            Some((o, at)) => plane.load_host_in(tensor, offset, data, o, at),
            None => plane.load_host(tensor, offset, data),
        };
        std::mem::swap(plane.lazy_mut(), &mut rep.lazy);
        res.map_err(|e| Error::Trace(format!("tensor data chunk: {e}")))
    }

    /// Keep one of Phase 1's input snapshots for `check_intermediates`
    /// (snapshots come before their ops' records); ignored otherwise.
    pub fn add_snapshot(&mut self, op_id: u64, operand: u32, data: &[u8]) -> Result<()> {
        if self.rep.opts.check_intermediates {
            self.rep.settle()?;
            Arc::make_mut(&mut self.rep.snapshots).insert((op_id, operand), data.to_vec());
        }
        Ok(())
    }

    /// Decode a records chunk, queue its records and apply what it allows:
    /// a window it completes is planned, then run (pipelined: started in
    /// the background, once the one before has finished).
    pub fn push_chunk(&mut self, mut c: RecordChunk<'_>) -> Result<()> {
        let start = Instant::now();
        // When kb-format gives records chunks a seq watermark:
        // self.rep.set_watermark(c.watermark());
        let res = self.rep.q.decode(&mut c);
        let ready = res.is_ok() && self.rep.q.ready(&self.rep.opts);
        self.rep.work(start, false, |s| &mut s.queue_seconds);
        if let Err(e) = res {
            // A window before these records comes first.
            self.rep.settle()?;
            return Err(e);
        }
        if ready {
            self.apply_staged(c.strings())?;
        }
        Ok(())
    }

    /// Plan the staged effects as a window and run it; whether it was
    /// started in the background.
    fn apply_staged(&mut self, strings: &Strings) -> Result<bool> {
        let start = Instant::now();
        let rep = &mut *self.rep;
        // (The plane's per-op limit: it was made with this one.)
        let max_bytes = rep.opts.max_bytes;
        let pcx = plan::PlanCx {
            tensors: &rep.tensors,
            elide: rep.opts.elide,
            fingerprints: rep.opts.fingerprints,
        };
        let planned = rep.q.plan(&mut rep.lazy, &pcx, max_bytes, self.exec.pool);
        rep.work(start, true, |s| &mut s.plan_seconds);
        let Some(p) = planned else {
            return Ok(false);
        };
        // The window before goes first (its error too).
        rep.settle()?;
        match self.scope {
            Some(scope) => {
                rep.launch(p, strings, self.exec, scope);
                Ok(true)
            }
            None => {
                let start = Instant::now();
                let mut back = rep.back.take().expect("settled");
                let res = run_planned(
                    &mut back,
                    p,
                    &rep.tensors,
                    strings,
                    &rep.opts,
                    &rep.snapshots,
                    self.exec,
                    &mut rep.q.stats,
                );
                rep.back = Some(back);
                rep.q.stats.replay_seconds += secs(start, Instant::now());
                res.map(|()| false)
            }
        }
    }

    /// Apply every effect left: the trace has ended. `strings` names
    /// components and ops in errors. On error the plane holds the effects
    /// applied before it (and possibly some after it, in parallel runs).
    pub fn finish(&mut self, strings: &Strings) -> Result<Stats> {
        self.finish_beside(strings, || Ok(()))
    }

    /// [`Feed::finish`] with a last check of the trace (its digest) first:
    /// its error comes after those of every window but the last, and
    /// before the last window's, as if it ran before the last window was
    /// planned (which it does with one thread). Pipelined, it runs beside
    /// the last window.
    pub fn finish_beside(
        &mut self,
        strings: &Strings,
        check: impl FnOnce() -> Result<()>,
    ) -> Result<Stats> {
        let start = Instant::now();
        self.rep.q.stage(u64::MAX);
        self.rep.work(start, false, |s| &mut s.queue_seconds);
        if self.scope.is_some() {
            if !self.apply_staged(strings)? {
                // No last window: the one running is an earlier one.
                self.rep.settle()?;
            }
            let checked = check();
            let ran = self.rep.settle();
            checked?;
            ran?;
        } else {
            check()?;
            self.apply_staged(strings)?;
        }
        let rep = &mut *self.rep;
        let plane = &mut rep.back.as_mut().expect("settled").plane;
        *plane.lazy_mut() = std::mem::take(&mut rep.lazy);
        let s = &mut rep.q.stats;
        s.serial_seconds = (s.plan_seconds + s.queue_seconds - rep.overlapped).max(0.0);
        Ok(s.clone())
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.rep.q.stats
    }

    /// Records held now, waiting for their effects' turn.
    pub fn pending_records(&self) -> u64 {
        self.rep.q.pending
    }
}

impl Replayer {
    pub fn new(meta: &Meta, opts: &ReplayOptions) -> Replayer {
        Replayer {
            tensors: meta.tensors.clone().into(),
            opts: opts.clone(),
            back: Some(Back {
                plane: DataPlane::new(&meta.tensors, opts.max_bytes),
                held: FxHashMap::default(),
            }),
            running: None,
            lazy: Lazy::default(),
            q: Queue::new(meta),
            snapshots: Default::default(),
            work: Vec::new(),
            overlapped: 0.0,
        }
    }

    /// Replay a trace: `events` hands its events to the [`Feed`] and ends
    /// with [`Feed::finish`]. With more than one thread (and streaming),
    /// windows run in the background on the pool while `events` goes on;
    /// an error of a window comes before any error after it (`events`'
    /// own included), as it would without the pipeline.
    pub fn replay<T>(
        &mut self,
        exec: &Exec,
        events: impl FnOnce(&mut Feed<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        let pipelined = self.opts.streaming && exec.threads() > 1;
        match exec.pool {
            Some(pool) if pipelined => pool.in_place_scope(|s| {
                let mut feed = Feed {
                    rep: self,
                    exec,
                    scope: Some(s),
                };
                let out = events(&mut feed);
                feed.rep.settle()?;
                out
            }),
            _ => events(&mut Feed {
                rep: self,
                exec,
                scope: None,
            }),
        }
    }

    /// The plane (after [`Feed::finish`]).
    pub fn plane(&self) -> &DataPlane {
        &self.back.as_ref().expect("no window runs").plane
    }

    pub fn tensors(&self) -> &[TensorMeta] {
        &self.tensors
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.q.stats
    }

    /// The format's promise that no effect with a seq below `w` is still to
    /// come (a records chunk's watermark).
    pub fn set_watermark(&mut self, w: u64) {
        self.q.watermark = self.q.watermark.max(w);
    }

    /// Note this thread's work from `start` to now, in the counter `what`
    /// picks.
    fn work(&mut self, start: Instant, planning: bool, what: fn(&mut Stats) -> &mut f64) {
        let end = Instant::now();
        *what(&mut self.q.stats) += secs(start, end);
        if self.running.is_some() {
            self.work.push((start, end, planning));
        } else if planning {
            self.q.stats.replay_seconds += secs(start, end);
        }
    }

    /// Start a planned window in the background; it owns the plane until
    /// [`Replayer::settle`] takes it back.
    fn launch<'s>(
        &mut self,
        p: Planned,
        strings: &Strings,
        exec: &Exec<'s>,
        scope: &rayon::Scope<'s>,
    ) {
        let mut back = self.back.take().expect("settled");
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (tensors, strings, opts) = (self.tensors.clone(), strings.clone(), self.opts.clone());
        let snapshots = self.snapshots.clone();
        let exec = *exec;
        scope.spawn(move |_| {
            let start = Instant::now();
            let mut stats = Stats::default();
            let res = run_planned(
                &mut back, p, &tensors, &strings, &opts, &snapshots, &exec, &mut stats,
            );
            // Before the plane goes back: the snapshots' owner may add
            // to them then.
            drop(snapshots);
            let end = Instant::now();
            let _ = tx.send(Ran {
                back,
                stats,
                res,
                start,
                end,
            });
        });
        self.running = Some(std::sync::Mutex::new(rx));
    }

    /// Wait for the window running in the background, if any: take back
    /// the plane, add its counters; its error, if it failed.
    fn settle(&mut self) -> Result<()> {
        let Some(rx) = self.running.take() else {
            return Ok(());
        };
        let rx = rx
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ran = wait(&rx).expect("the window's task panicked");
        self.back = Some(ran.back);
        let s = &mut self.q.stats;
        s.bytes_copied += ran.stats.bytes_copied;
        s.gemm_in_place += ran.stats.gemm_in_place;
        s.tasks += ran.stats.tasks;
        s.gemm_batches += ran.stats.gemm_batches;
        s.gemm_batched_ops += ran.stats.gemm_batched_ops;
        s.replay_seconds += secs(ran.start, ran.end);
        // This thread's work beside it is not serial; its planning beyond
        // it is replay time of its own.
        for (a, b, planning) in self.work.drain(..) {
            let beside = secs(a.max(ran.start), b.min(ran.end));
            self.overlapped += beside;
            if planning {
                s.replay_seconds += secs(a, b) - beside;
            }
        }
        ran.res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontier_is_the_first_seq_not_seen() {
        let mut f = Frontier::default();
        for s in [1, 3, 0] {
            f.see(s);
        }
        assert_eq!(f.next, 2);
        f.see(2);
        assert_eq!(f.next, 4);
        // Duplicates and old seqs change nothing.
        f.see(3);
        f.see(0);
        assert_eq!(f.next, 4);
        f.see(5);
        f.see(5);
        f.see(4);
        assert_eq!(f.next, 6);
        assert!(f.ahead.is_empty());
    }

    #[test]
    fn staging_hands_out_every_effect_below_the_bound_in_key_order() {
        let mut q = Queue::new(&Meta::default());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut all = Vec::new();
        let mut bound = 0;
        for round in 0..40u64 {
            // Arrivals nearly in order (reads late), some below the last
            // bound's successors, with ties on seq.
            for _ in 0..rand(80) {
                let k = EffKey {
                    seq: bound + rand(300),
                    write: rand(2) == 1,
                    op_id: rand(50),
                    slot: round as u32,
                };
                q.queue.push(k);
                all.push(k);
            }
            bound += rand(120);
            q.stage(bound);
            let mut want: Vec<EffKey> = all.iter().copied().filter(|k| k.seq < bound).collect();
            want.sort();
            assert_eq!(q.staged, want, "round {round}");
            if round % 3 == 2 {
                // A window takes what was staged.
                all.retain(|k| k.seq >= bound);
                q.staged.clear();
            }
        }
        assert_eq!(q.staged_below, bound);
    }

    #[test]
    fn only_records_no_node_shares_come_back_for_reuse() {
        let op = |id| {
            Arc::new(PendingOp {
                rec: Record {
                    op_id: id,
                    ..Record::default()
                },
                plan: Plan::Skip,
            })
        };
        let bin = Recycled::default();
        let (a, b) = (op(1), op(2));
        let held = b.clone();
        bin.give(vec![a, b]);
        let mut got = Vec::new();
        bin.take_all(&mut got);
        // `b` is still held (a node of a later window): it stays with it.
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].rec.op_id, 1);
        assert!(Arc::get_mut(&mut got[0]).is_some());
        assert_eq!(Arc::strong_count(&held), 1);
        bin.take_all(&mut got);
        assert_eq!(got.len(), 1, "taken once");
    }

    #[test]
    fn waiting_on_a_pool_thread_runs_the_pool_work_it_waits_for() {
        // One thread: the job that sends can only run if `wait` runs it
        // (a plain `recv` would wait for ever).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let got = pool.install(|| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                rayon::spawn(move || tx.send(42).unwrap());
                wait(&rx)
            });
            done_tx.send(got).unwrap();
        });
        let got = done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("wait ran the job it waits for");
        assert_eq!(got, Ok(42));
        // A sender gone without sending: an error, not a hang.
        let (tx, rx) = std::sync::mpsc::sync_channel::<u8>(1);
        drop(tx);
        assert!(wait(&rx).is_err());
    }

    #[test]
    fn effects_order_by_seq_then_read_first_then_op_id() {
        let k = |seq, write, op_id| EffKey {
            seq,
            write,
            op_id,
            slot: 0,
        };
        let mut v = vec![
            k(2, false, 1),
            k(1, true, 0),
            k(1, false, 5),
            k(1, false, 3),
        ];
        v.sort();
        assert_eq!(
            v,
            [
                k(1, false, 3),
                k(1, false, 5),
                k(1, true, 0),
                k(2, false, 1)
            ]
        );
    }
}
