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
use std::time::Instant;

use kb_format::{Meta, OpKind, Record, RecordChunk, Strings, TensorMeta};
use serde::Serialize;

use crate::error::{Error, Result, fmt_ns};
use crate::ops::{self, GemmBackend, Plan};
use crate::plane::DataPlane;

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

/// A record whose effects are not all applied yet.
#[derive(Debug)]
pub(crate) struct PendingOp {
    pub rec: Record,
    pub plan: Plan,
    /// Effects still to apply.
    pub left: u8,
    /// What the read produced for the write (moved bytes or the output).
    pub held: Option<Held>,
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
#[derive(Debug)]
pub struct Replayer {
    tensors: Vec<TensorMeta>,
    /// Where ranges may lie (the trace's memories).
    bounds: crate::bounds::Bounds,
    plane: DataPlane,
    opts: ReplayOptions,
    ops: Vec<Option<PendingOp>>,
    free: Vec<u32>,
    pending: u64,
    queue: BinaryHeap<Reverse<EffKey>>,
    /// Sorted effects below `staged_below`, not applied yet.
    staged: Vec<EffKey>,
    /// No effect with a seq below this may arrive any more.
    staged_below: u64,
    frontier: Frontier,
    watermark: u64,
    stats: Stats,
    planner: plan::Planner,
    /// Phase 1's input snapshots by (op id, operand), when checking.
    snapshots: std::collections::HashMap<(u64, u32), Vec<u8>>,
}

impl Replayer {
    pub fn new(meta: &Meta, opts: &ReplayOptions) -> Replayer {
        Replayer {
            tensors: meta.tensors.clone(),
            bounds: crate::bounds::Bounds::new(meta),
            plane: DataPlane::new(&meta.tensors, opts.max_bytes),
            opts: opts.clone(),
            ops: Vec::new(),
            free: Vec::new(),
            pending: 0,
            queue: BinaryHeap::new(),
            staged: Vec::new(),
            staged_below: 0,
            frontier: Frontier::default(),
            watermark: 0,
            stats: Stats::default(),
            planner: plan::Planner::default(),
            snapshots: Default::default(),
        }
    }

    /// Host-provided bytes of a tensor (a tensor chunk).
    pub fn load_host(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.plane
            .load_host(tensor, offset, data)
            .map_err(|e| Error::Trace(format!("tensor data chunk: {e}")))
    }

    pub fn plane(&self) -> &DataPlane {
        &self.plane
    }

    pub fn tensors(&self) -> &[TensorMeta] {
        &self.tensors
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Records held now, waiting for their effects' turn.
    pub fn pending_records(&self) -> u64 {
        self.pending
    }

    /// Queue a decoded record. `strings` names components and ops in errors.
    pub fn push(&mut self, r: Record, strings: &Strings) -> Result<()> {
        self.stats.records += 1;
        let plan = ops::plan(&r).map_err(|d| op_error(&r, strings, d))?;
        self.bounds
            .check(&r.read, &r.write)
            .map_err(|d| op_error(&r, strings, d))?;
        match r.kind {
            OpKind::Memory => self.stats.memory += 1,
            OpKind::Gemm => self.stats.gemm += 1,
            OpKind::Math => self.stats.math += 1,
            OpKind::Unknown(_) => self.stats.unknown_skipped += 1,
        }
        if let (Some(rd), Some(wr)) = (&r.read, &r.write)
            && wr.seq < rd.seq
        {
            return Err(op_error(
                &r,
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
                    &r,
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
            return Ok(());
        }
        self.stats.gemm_flops = self.stats.gemm_flops.saturating_add(ops::flops(&r));
        let left = r.read.is_some() as u8 + r.write.is_some() as u8;
        if left == 0 {
            return Ok(());
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.ops.push(None);
                (self.ops.len() - 1) as u32
            }
        };
        for (e, write) in [(&r.read, false), (&r.write, true)] {
            if let Some(e) = e {
                self.queue.push(Reverse(EffKey {
                    seq: e.seq,
                    write,
                    op_id: r.op_id,
                    slot,
                }));
            }
        }
        self.ops[slot as usize] = Some(PendingOp {
            rec: r,
            plan,
            left,
            held: None,
        });
        self.pending += 1;
        self.stats.max_pending_records = self.stats.max_pending_records.max(self.pending);
        Ok(())
    }

    /// The format's promise that no effect with a seq below `w` is still to
    /// come (a records chunk's watermark).
    pub fn set_watermark(&mut self, w: u64) {
        self.watermark = self.watermark.max(w);
    }

    /// Decode a records chunk, queue its records and apply what it allows.
    /// Keep one of Phase 1's input snapshots for `check_intermediates`
    /// (snapshots come before their ops' records); ignored otherwise.
    pub fn add_snapshot(&mut self, op_id: u64, operand: u32, data: &[u8]) {
        if self.opts.check_intermediates {
            self.snapshots.insert((op_id, operand), data.to_vec());
        }
    }

    pub fn push_chunk(&mut self, mut c: RecordChunk<'_>, exec: &Exec) -> Result<()> {
        let start = Instant::now();
        let mut r = Record::default();
        while c.next_into(&mut r)? {
            self.push(std::mem::take(&mut r), c.strings())?;
        }
        self.stats.queue_seconds += start.elapsed().as_secs_f64();
        // When kb-format gives records chunks a seq watermark:
        // self.set_watermark(c.watermark());
        self.step(c.strings(), exec)
    }

    /// Apply a window if one is ready (streaming only).
    pub fn step(&mut self, strings: &Strings, exec: &Exec) -> Result<()> {
        if !self.opts.streaming {
            return Ok(());
        }
        self.stage(self.frontier.next.max(self.watermark));
        if self.staged.len() >= self.opts.window.max(1) {
            self.apply_staged(strings, exec)?;
        }
        Ok(())
    }

    /// Apply every effect left: the trace has ended. `strings` names
    /// components and ops in errors. On error the plane holds the effects
    /// applied before it (and possibly some after it, in parallel runs).
    pub fn finish(&mut self, strings: &Strings, exec: &Exec) -> Result<Stats> {
        self.stage(u64::MAX);
        self.apply_staged(strings, exec)?;
        Ok(self.stats.clone())
    }

    /// Move every queued effect below `bound` to the staged list.
    fn stage(&mut self, bound: u64) {
        let start = Instant::now();
        while let Some(&Reverse(k)) = self.queue.peek() {
            if k.seq >= bound {
                break;
            }
            self.queue.pop();
            self.staged.push(k);
        }
        self.staged_below = self.staged_below.max(bound);
        self.stats.queue_seconds += start.elapsed().as_secs_f64();
    }

    fn apply_staged(&mut self, strings: &Strings, exec: &Exec) -> Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let keys = std::mem::take(&mut self.staged);
        self.stats.windows += 1;
        self.stats.max_window_effects = self.stats.max_window_effects.max(keys.len() as u64);
        // Plan with `&mut` (aliases, regions grown), then run on a view.
        let pcx = plan::PlanCx {
            tensors: &self.tensors,
            elide: self.opts.elide,
            fingerprints: self.opts.fingerprints,
        };
        let mut nodes =
            self.planner
                .plan(&mut self.plane, &keys, &mut self.ops, &pcx, &mut self.stats);
        nodes.retain(|n| !n.is_empty());
        self.stats.plan_seconds += start.elapsed().as_secs_f64();
        // SAFETY: `run_window` never runs two nodes whose byte ranges
        // overlap, one of them writing, at the same time: with one thread
        // it runs them in order; with more, a node starts only after every
        // earlier node it conflicts with (RAW, WAW, WAR over spans that
        // contain each extent's bytes) has finished (engine::graph), and
        // the scheduler's lock orders a node's end before its successors'
        // start. A node touches only the physical ranges its action names.
        #[allow(unsafe_code)]
        let plane = unsafe { self.plane.shared() };
        let cx = exec::Cx {
            plane,
            tensors: &self.tensors,
            strings,
            backend: exec.backend,
            batch: self.opts.batch_gemms,
            lookahead: self.opts.lookahead,
            hold_budget: self.opts.hold_budget,
            snapshots: self.opts.check_intermediates.then_some(&self.snapshots),
        };
        let res = exec::run_window(&cx, &nodes, &mut self.ops, exec.pool, &mut self.stats);
        // Drop the records whose effects are all applied.
        for k in &keys {
            let slot = k.slot as usize;
            if self.ops[slot].as_ref().is_some_and(|o| o.left == 0) {
                self.ops[slot] = None;
                self.free.push(k.slot);
                self.pending -= 1;
            }
        }
        self.stats.replay_seconds += start.elapsed().as_secs_f64();
        res
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
