//! The parallel run of a window: a dataflow on the rayon pool. A finished
//! task starts the nodes it made ready, earliest first, one task per
//! thread, within the lookahead and the held-bytes budget (see the module
//! docs of [`super`]). What a node does is [`super::exec`]'s.

use kb_format::Params;
use rustc_hash::FxHashMap;

use super::exec::{Cx, Done, run_gemm_batch, run_node};
use super::graph;
use super::plan::{Action, PNode, is_gemm};
use super::{Delta, Held, PendingOp, Stats};
use crate::error::{Error, Result};
use crate::ops::gemm;

/// A unit of work: one node, or GEMMs sharing a batched call.
enum Task {
    /// A node, what its op's read held for it, and whether a GEMM in it
    /// may split across the pool.
    One(u32, Option<Held>, bool),
    Gemms(Vec<u32>),
}

impl Task {
    /// Threads' worth of work in it.
    fn width(&self) -> usize {
        match self {
            Task::One(..) => 1,
            Task::Gemms(items) => items.len(),
        }
    }
}

/// What the parallel run shares, behind one lock: which nodes are ready,
/// what reads hold for their ops' writes, and the totals.
struct Sched {
    preds: Vec<u32>,
    /// Ready nodes not started, in effect order.
    ready: std::collections::BTreeSet<u32>,
    done: Vec<bool>,
    /// The first node not done.
    low: usize,
    /// Threads' worth of tasks running.
    running: usize,
    /// Bytes that reads hold for writes not run yet (see `hold_cost`).
    held_bytes: u64,
    /// What each op's read produced for its write, by slot.
    held: FxHashMap<u32, Held>,
    /// Nodes at or after `limit` no longer start: an earlier one failed.
    limit: u32,
    failed: Option<Error>,
    delta: Delta,
    tasks: u64,
    gemm_batches: u64,
    gemm_batched_ops: u64,
    /// Byte spans of the nodes running now (node, start, end, written),
    /// to check in debug builds the contract of `DataPlane::shared`:
    /// running nodes never touch the same bytes, one of them writing.
    #[cfg(debug_assertions)]
    running_spans: Vec<(u32, u64, u64, bool)>,
}

/// Run a window's nodes on the pool as their predecessors finish: a
/// finished task starts every node it made ready, up to one task per
/// thread, earliest first (see the module docs of [`super`] for the
/// bounds). A GEMM started while threads are left over splits across the
/// pool; otherwise each task keeps to its thread.
pub(super) fn run_parallel(
    cx: &Cx,
    nodes: &[PNode],
    mut g: graph::Graph,
    held_by_slot: &mut FxHashMap<u32, Held>,
    pool: &rayon::ThreadPool,
    stats: &mut Stats,
) -> Result<()> {
    let mut held = FxHashMap::default();
    for n in nodes {
        if matches!(n.action, Action::Release { .. })
            && let Some(h) = held_by_slot.remove(&n.slot)
        {
            held.insert(n.slot, h);
        }
    }
    let sched = std::sync::Mutex::new(Sched {
        ready: (0..nodes.len() as u32)
            .filter(|&i| g.preds[i as usize] == 0)
            .collect(),
        preds: std::mem::take(&mut g.preds),
        done: vec![false; nodes.len()],
        low: 0,
        running: 0,
        held_bytes: 0,
        held,
        limit: nodes.len() as u32,
        failed: None,
        delta: Delta::default(),
        tasks: 0,
        gemm_batches: 0,
        gemm_batched_ops: 0,
        #[cfg(debug_assertions)]
        running_spans: Vec::new(),
    });
    let run = Run {
        cx,
        nodes,
        graph: &g,
        sched: &sched,
        threads: pool.current_num_threads(),
    };
    pool.scope(|s| {
        let mut first = Vec::new();
        run.dispatch(&mut run.lock(), &mut first);
        for t in first {
            s.spawn(move |s| run.task(s, t));
        }
    });
    let st = sched
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stats.add(st.delta);
    stats.tasks += st.tasks;
    stats.gemm_batches += st.gemm_batches;
    stats.gemm_batched_ops += st.gemm_batched_ops;
    held_by_slot.extend(st.held);
    match st.failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What every task of a parallel run sees.
#[derive(Clone, Copy)]
struct Run<'a> {
    cx: &'a Cx<'a>,
    nodes: &'a [PNode],
    graph: &'a graph::Graph,
    sched: &'a std::sync::Mutex<Sched>,
    threads: usize,
}

impl<'a> Run<'a> {
    fn lock(&self) -> std::sync::MutexGuard<'a, Sched> {
        self.sched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn op(&self, i: u32) -> &'a PendingOp {
        &self.nodes[i as usize].op
    }

    /// The batch key of a GEMM that computes into its output.
    fn batchable(&self, i: u32) -> Option<gemm::BatchKey> {
        let op = self.op(i);
        match (&self.nodes[i as usize].action, &op.rec.params) {
            (
                Action::Compute {
                    dst: Some(_),
                    reads,
                    ..
                },
                Params::Gemm(p),
            ) if self.cx.batch && is_gemm(op) && !reads.is_empty() => Some(gemm::batch_key(p)),
            _ => None,
        }
    }

    /// Take the next tasks to start: ready nodes in effect order, at most
    /// `lookahead` after the first node not done, while the threads have
    /// room and what reads hold stays within the budget (the first node
    /// not done always runs).
    fn dispatch(&self, st: &mut Sched, out: &mut Vec<Task>) {
        let cx = self.cx;
        while st.low < self.nodes.len() && st.done[st.low] {
            st.low += 1;
        }
        let end = (st.low + cx.lookahead.max(1)).min(st.limit as usize) as u32;
        let admits = |st: &Sched, i: u32| {
            let cost = self.nodes[i as usize].hold;
            (cost == 0 || st.held_bytes + cost <= cx.hold_budget || i as usize == st.low)
                .then_some(cost)
        };
        out.clear();
        let mut from = 0u32;
        while st.running < self.threads {
            let Some((i, cost)) = st
                .ready
                .range(from..end)
                .find_map(|&i| admits(st, i).map(|c| (i, c)))
            else {
                break;
            };
            from = i + 1;
            st.ready.remove(&i);
            st.held_bytes += cost;
            // (A batch's items; none but `i` is the common case, so no
            // vector then.)
            let mut items = Vec::new();
            // Batch into free threads only: a batch's items wait for one
            // another, so a batch beside busy threads runs its items one
            // by one (measured: twice as slow).
            let room = (self.threads - st.running)
                .min(cx.backend.max_batch())
                .max(1);
            if room > 1
                && let Some(key) = self.batchable(i)
            {
                let more: Vec<u32> = st
                    .ready
                    .range(i + 1..end)
                    .copied()
                    .filter(|&j| self.batchable(j) == Some(key))
                    .take(room - 1)
                    .collect();
                for j in more {
                    let Some(c) = admits(st, j) else { break };
                    st.ready.remove(&j);
                    st.held_bytes += c;
                    if items.is_empty() {
                        items.push(i);
                    }
                    items.push(j);
                }
            }
            let task = if items.is_empty() {
                let n = &self.nodes[i as usize];
                let held = match n.action {
                    Action::Release { .. } => st.held.remove(&n.slot),
                    _ => None,
                };
                Task::One(i, held, false)
            } else {
                st.gemm_batches += 1;
                st.gemm_batched_ops += items.len() as u64;
                Task::Gemms(items)
            };
            #[cfg(debug_assertions)]
            match &task {
                Task::One(i, ..) => self.claim(st, *i),
                Task::Gemms(items) => items.iter().for_each(|&i| self.claim(st, i)),
            }
            st.running += task.width();
            st.tasks += 1;
            out.push(task);
        }
        // Threads left over: nothing else can start, so the tasks just
        // started may split their GEMMs across the pool.
        if st.running < self.threads {
            for t in out.iter_mut() {
                if let Task::One(.., share_pool) = t {
                    *share_pool = true;
                }
            }
        }
    }

    /// Debug builds: record the bytes node `i` touches, panicking if a
    /// running node touches any of them and one of the two writes (the
    /// dependency graph must have ordered them).
    #[cfg(debug_assertions)]
    fn claim(&self, st: &mut Sched, i: u32) {
        let (reads, writes) = self.nodes[i as usize].accesses();
        let mut spans = Vec::new();
        for (es, write) in [(reads, false), (writes, true)] {
            spans.extend(
                es.iter()
                    .filter_map(crate::plane::span)
                    .map(|(s, e)| (i, s, e, write)),
            );
        }
        for &(_, s, e, w) in &spans {
            for &(other, os, oe, ow) in &st.running_spans {
                assert!(
                    !(s < oe && os < e && (w || ow)),
                    "nodes {other} and {i} run at once over bytes {:#x}..{:#x}, one writing: {:?} / {:?}",
                    s.max(os),
                    e.min(oe),
                    self.nodes[other as usize],
                    self.nodes[i as usize],
                );
            }
        }
        st.running_spans.extend(spans);
    }

    /// Run a task, record what it did, and start what it made ready.
    /// The first task started goes on in this thread (no spawn), the
    /// others are spawned.
    fn task<'s>(self, s: &rayon::Scope<'s>, t: Task)
    where
        'a: 's,
    {
        let mut t = t;
        // The tasks each finish starts, reused from one to the next.
        let mut next = Vec::new();
        loop {
            let width = t.width();
            let mut st = match t {
                Task::One(i, held, share_pool) => {
                    let n = &self.nodes[i as usize];
                    let r = run_node(self.cx, i, n, self.op(i), held, share_pool);
                    let mut st = self.lock();
                    self.done_with(&mut st, i, r);
                    st
                }
                Task::Gemms(items) => {
                    let results = run_gemm_batch(self.cx, &items, self.nodes);
                    let mut st = self.lock();
                    for (node, r) in results {
                        self.done_with(&mut st, node, r);
                    }
                    st
                }
            };
            st.running -= width;
            self.dispatch(&mut st, &mut next);
            drop(st);
            let mut started = next.drain(..);
            let Some(first) = started.next() else {
                return;
            };
            for t in started {
                s.spawn(move |s| self.task(s, t));
            }
            t = first;
        }
    }

    /// Record what running `node` gave.
    fn done_with(&self, st: &mut Sched, node: u32, r: Result<Done>) {
        #[cfg(debug_assertions)]
        st.running_spans.retain(|s| s.0 != node);
        self.finish(st, node, r);
    }

    /// Mark `node` done and make ready the nodes that waited only for it.
    fn complete(&self, st: &mut Sched, node: u32) {
        st.done[node as usize] = true;
        for &s in self.graph.succs(node) {
            st.preds[s as usize] -= 1;
            if st.preds[s as usize] == 0 {
                st.ready.insert(s);
            }
        }
    }

    fn finish(&self, st: &mut Sched, node: u32, r: Result<Done>) {
        match r {
            Ok(d) => {
                let n = &self.nodes[d.node as usize];
                st.held_bytes = st.held_bytes.saturating_sub(n.release);
                if let Some(h) = d.held {
                    st.held.insert(n.slot, h);
                }
                st.delta.add(d.delta);
                self.complete(st, d.node);
            }
            Err(e) => {
                if node < st.limit {
                    st.limit = node;
                    st.failed = Some(e);
                }
            }
        }
    }
}
