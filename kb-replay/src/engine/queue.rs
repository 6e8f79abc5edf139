//! The records waiting for their effects' turn: decoding records chunks
//! into them, queueing their effects in seq order, staging the effects the
//! stream allows (the seq frontier, see [`super`]'s module docs) and
//! planning the staged ones as a window.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use kb_format::{Extent, Meta, OpKind, Record, RecordChunk, Strings};

use super::{EffKey, PendingOp, ReplayOptions, Stats, exec, graph, op_error, plan};
use crate::error::{Result, fmt_ns};
use crate::ops::{self, Plan};
use crate::plane::lazy::Lazy;

/// The smallest seq no effect has carried yet.
///
/// Seqs seen above it are kept as bits of a ring of words from `base`
/// (seqs arrive close to the frontier: a window's reads and writes lie a
/// few thousand apart), one bit per seq, so seeing one is a bit set and
/// the frontier passes each seq with a bit test; a heap sifted a seq in
/// and out (measured: 4 % of gemm_tiled's reading thread). Seqs further
/// than `NEAR_BITS` ahead (a trace with wide gaps) go to a heap.
#[derive(Debug, Default)]
pub(super) struct Frontier {
    pub(super) next: u64,
    /// Bit `i` of word `w`: seq `base + 64 w + i` was seen.
    near: std::collections::VecDeque<u64>,
    /// A multiple of 64, at most `next`, more than 64 below it only
    /// after a far jump (the ring then empties as it passes).
    base: u64,
    /// Seqs seen at least `NEAR_BITS` above `base` when seen.
    pub(super) ahead: BinaryHeap<Reverse<u64>>,
}

/// How far above the ring's base a seq is kept as a bit (the ring's
/// words: at most 16 K of them, 128 KiB).
const NEAR_BITS: u64 = 1 << 20;

impl Frontier {
    pub(super) fn see(&mut self, seq: u64) {
        if seq < self.next {
            return;
        }
        if seq > self.next {
            let off = seq - self.base;
            if off < NEAR_BITS {
                let w = (off / 64) as usize;
                if self.near.len() <= w {
                    self.near.resize(w + 1, 0);
                }
                self.near[w] |= 1 << (off % 64);
            } else {
                self.ahead.push(Reverse(seq));
            }
            return;
        }
        self.next = self.next.saturating_add(1);
        self.advance();
    }

    /// Move `next` past every seq seen.
    fn advance(&mut self) {
        loop {
            let before = self.next;
            // The ring: whole words of seen seqs at a time.
            while let Some(&word) = self.near.front() {
                let off = self.next.wrapping_sub(self.base);
                if off >= 64 {
                    self.near.pop_front();
                    self.base += 64;
                    continue;
                }
                let run = (word >> off).trailing_ones() as u64;
                self.next = self.next.saturating_add(run.min(64 - off));
                if off + run < 64 {
                    break;
                }
            }
            if self.near.is_empty() && self.next - self.base >= 64 {
                // Nothing kept: the ring starts again at the frontier.
                self.base = self.next & !63;
            }
            // The far ones the frontier has reached.
            while let Some(&Reverse(s)) = self.ahead.peek() {
                if s > self.next {
                    break;
                }
                self.ahead.pop();
                if s == self.next {
                    self.next = self.next.saturating_add(1);
                }
            }
            if self.next == before {
                return;
            }
        }
    }
}

/// The records waiting for their effects' turn, and the planning of
/// windows.
#[derive(Debug)]
pub(super) struct Queue {
    /// Where ranges may lie (the trace's memories).
    pub(super) bounds: crate::bounds::Bounds,
    pub(super) ops: Vec<Option<Arc<PendingOp>>>,
    /// Effects each op has still to plan, by slot.
    pub(super) left: Vec<u8>,
    pub(super) free: Vec<u32>,
    pub(super) pending: u64,
    /// Effects not staged yet: the first `sorted` in order (those left by
    /// the last `stage`), then those that arrived since.
    pub(super) queue: Vec<EffKey>,
    pub(super) sorted: usize,
    /// Sorted effects below `staged_below`, not applied yet.
    pub(super) staged: Vec<EffKey>,
    /// The last window's effect vector, emptied, for the next one.
    pub(super) spare_keys: Vec<EffKey>,
    /// No effect with a seq below this may arrive any more.
    pub(super) staged_below: u64,
    pub(super) frontier: Frontier,
    pub(super) watermark: u64,
    pub(super) stats: Stats,
    pub(super) planner: plan::Planner,
    /// Records to decode the next ones into (their vectors reused), and
    /// where the threads that run windows hand them back.
    pub(super) spare: Vec<Arc<PendingOp>>,
    pub(super) recycled: Arc<Recycled>,
}

/// Finished records handed back by the threads that free windows, for
/// [`Queue::decode`] to decode new ones into: decoding allocated a
/// record and its ranges, and the pool threads freed them into the
/// decoding thread's heap, under its lock (measured: allocations per
/// record 7.9 -> 3.9 on gemm_tiled 1024^3). Records that finished stay
/// allocated only until decoding takes them, so they add no memory as a
/// trace grows.
#[derive(Debug, Default)]
pub(super) struct Recycled {
    pub(super) records: std::sync::Mutex<Vec<Arc<PendingOp>>>,
    /// The largest node vector handed back, emptied.
    pub(super) nodes: std::sync::Mutex<Vec<plan::PNode>>,
}

/// Most records kept for reuse.
const RECYCLED_MAX: usize = 1 << 15;

/// The first window's effects (see [`Queue::window_target`]): planning
/// that many takes about a tenth of a millisecond, against several for a
/// window of 4,096 that the pool waited for (measured: the part of the
/// reading thread's work that no window ran beside was 4-38 % of the
/// four issue 38 traces' wall time).
pub(super) const FIRST_WINDOW: usize = 256;

/// Records decoded between two looks at whether a window is ready while
/// the windows ramp up.
pub(super) const RAMP_RECORDS: usize = 32;

impl Recycled {
    /// Keep the records no node shares any more.
    pub(super) fn give(&self, ops: Vec<Arc<PendingOp>>) {
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
    pub(super) fn take_all(&self, into: &mut Vec<Arc<PendingOp>>) {
        let mut bin = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        into.append(&mut bin);
    }

    /// Keep a window's node vector (emptied) for the next window: a
    /// fresh one each window, hundreds of kB, was fresh pages to fault in
    /// (measured: 1 400 of 15 700 page faults on gemm_tiled 2048^3).
    pub(super) fn give_nodes(&self, mut nodes: Vec<plan::PNode>) {
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
    pub(super) fn take_nodes(&self) -> Vec<plan::PNode> {
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
pub(super) struct Planned {
    pub(super) nodes: Vec<plan::PNode>,
    /// Their dependencies, when they run as a dataflow.
    pub(super) graph: Option<graph::Graph>,
    /// The extents its nodes write physically: their regions grow before
    /// it runs.
    pub(super) reserve: Vec<Extent>,
    /// Records whose effects are all planned: handed back for reuse
    /// (or freed) with the window, by the thread that runs it.
    pub(super) finished: Vec<Arc<PendingOp>>,
    pub(super) recycled: Arc<Recycled>,
}

impl Queue {
    pub(super) fn new(meta: &Meta) -> Queue {
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
    pub(super) fn push(&mut self, mut op: Arc<PendingOp>, strings: &Strings) -> Result<()> {
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
    /// Decode at most `max` more records of `c`; whether any are left.
    pub(super) fn decode(&mut self, c: &mut RecordChunk<'_>, max: usize) -> Result<bool> {
        for _ in 0..max {
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
                return Ok(false);
            }
            self.push(op, c.strings())?;
        }
        Ok(true)
    }

    /// The effects the next window waits for: [`ReplayOptions::window`],
    /// but the first windows ramp up to it from [`FIRST_WINDOW`],
    /// doubling (by the count of windows planned: the same windows for
    /// every thread count), so the first one starts running after a few
    /// records rather than a whole window's planning.
    pub(super) fn window_target(&self, opts: &ReplayOptions) -> usize {
        let ramp = FIRST_WINDOW
            .checked_shl(self.stats.windows.min(32) as u32)
            .unwrap_or(usize::MAX);
        opts.window.max(1).min(ramp)
    }

    /// Move every queued effect below `bound` to the staged list.
    pub(super) fn stage(&mut self, bound: u64) {
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
    pub(super) fn ready(&mut self, opts: &ReplayOptions) -> bool {
        if !opts.streaming {
            return false;
        }
        self.stage(self.frontier.next.max(self.watermark));
        self.staged.len() >= self.window_target(opts)
    }

    /// Plan the staged effects as a window (`None` when none are staged):
    /// its nodes, their graph when they run on more than one thread, the
    /// extents whose regions must grow. Records whose effects are all
    /// planned leave the queue (their nodes keep them).
    pub(super) fn plan(
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
    fn the_frontier_follows_a_set_of_seen_seqs_near_and_far() {
        // Against a set: seqs close ahead (the ring), across word
        // boundaries, repeated, and far ahead (the heap), some of which
        // the frontier later reaches.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for case in 0..100 {
            let mut f = Frontier::default();
            let mut seen = std::collections::BTreeSet::new();
            let mut want = 0u64;
            let far = NEAR_BITS + rand(NEAR_BITS / 8);
            for _ in 0..2000 {
                let s = match rand(10) {
                    0 => want + far + rand(200),
                    1 => want.saturating_sub(rand(100)),
                    2 => want,
                    _ => want + rand(if case % 2 == 0 { 300 } else { 70 }),
                };
                f.see(s);
                seen.insert(s);
                while seen.contains(&want) {
                    want += 1;
                }
                assert_eq!(f.next, want, "case {case}, after seeing {s}");
            }
            if case % 25 != 0 {
                continue;
            }
            // Fill every gap: the frontier passes the far seqs too.
            let top = *seen.iter().next_back().unwrap();
            for s in want..=top {
                f.see(s);
            }
            want = top + 1;
            assert_eq!(f.next, want, "case {case}, gaps filled");
        }
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
}
