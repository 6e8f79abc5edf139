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
//! applied together and their records dropped. The first windows are
//! smaller: 256 effects, doubling up to the option (by the count of
//! windows so far, so the same on every thread count), and while they
//! ramp up the reading thread looks every 32 records instead of every
//! chunk, so the pool gets a first window to run after a few hundred
//! records rather than after a whole window's planning. Memory is the live data
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
//! whose bytes something overwrote between its read and its write
//! gathers them at its read and writes them at its write. One whose
//! write comes in a later window, its bytes unchanged when its window
//! ends, is *deferred*: its write copies (or aliases) them from where
//! they still lie, and a physical write to them before that, in a later
//! window, first gathers them in a node of its own. With
//! [`ReplayOptions::elide`] off every memory op copies.
//!
//! Fingerprints are checked on the bytes where they lie, in nodes of
//! their own (in parallel), by [`Fingerprints`]; an op that reads the same
//! unchanged bytes as an earlier checked one, with the same recorded
//! fingerprint, is checked by that hash. GEMM operands that must be
//! decoded (f16, bf16, transposed) or whose rows lie apart are decoded once
//! into a dense matrix shared by every GEMM planned to read the same
//! unchanged bytes the same way.
//!
//! # K-chains
//!
//! A GEMM whose read and write are planned together, writing the same one
//! extent as an earlier GEMM of the window (a K-chain: tile `C += A_k B_k`
//! for k = 0, 1, ...), joins that GEMM's node instead of getting one of
//! its own ([`ReplayOptions::fuse`]): the node runs its GEMMs one after
//! another, each by the backend call it gets alone, so the bits are the
//! unfused ones. It joins only when running it at the chain's node
//! changes nothing: since that node, no physical write touched what it
//! reads (the output aside, which only the chain wrote), no node read the
//! output (a read closes the chain), its write materialized no alias, and
//! its data dependencies are the chain's GEMMs. A chain is one node, one
//! task and one set of graph edges instead of one per GEMM.
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
mod memo;
mod plan;
mod queue;
mod stats;

use queue::{Planned, Queue, RAMP_RECORDS};
pub(crate) use stats::Delta;
pub use stats::Stats;

pub use plan::sampled;

use std::sync::Arc;
use std::time::Instant;

use kb_format::{Meta, Record, RecordChunk, Strings, TensorMeta};
use rustc_hash::FxHashMap;

use crate::error::{Error, Result, fmt_ns};
use crate::ops::{GemmBackend, Plan};
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
    /// K-chain fusion: a chain of GEMMs accumulating into one output is
    /// planned as one node that runs them in order, each by the backend
    /// call it gets alone (engine::plan's `Chain`). Never changes a
    /// result.
    pub fuse: bool,
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
            fuse: true,
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
        // When kb-format gives records chunks a seq watermark:
        // self.rep.set_watermark(c.watermark());
        loop {
            let start = Instant::now();
            // While the first windows ramp up (`Queue::window_target`), a
            // few records at a time, so that a small window can start
            // before the chunk is decoded.
            let max = if self.rep.q.window_target(&self.rep.opts) < self.rep.opts.window {
                RAMP_RECORDS
            } else {
                usize::MAX
            };
            let res = self.rep.q.decode(&mut c, max);
            let ready = res.is_ok() && self.rep.q.ready(&self.rep.opts);
            self.rep.work(start, false, |s| &mut s.queue_seconds);
            let more = match res {
                Ok(more) => more,
                Err(e) => {
                    // A window before these records comes first.
                    self.rep.settle()?;
                    return Err(e);
                }
            };
            if ready {
                self.apply_staged(c.strings())?;
            }
            if !more {
                return Ok(());
            }
        }
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
            fuse: rep.opts.fuse,
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
