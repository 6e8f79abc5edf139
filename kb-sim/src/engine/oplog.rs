//! The op log: op ids, effect sequence numbers, and the hook that makes
//! every record. `hook_start` / `hook_end` (and the sync records'
//! `sync_open` / `sync_close`) wrap the service of an op at the component
//! that serves it; each data effect is numbered (`seq`) in the order it is
//! applied; a record goes to the trace writer when its op ends, and the
//! writer may release records once no earlier one can appear (the least
//! open op's start time, the least held effect's seq). What the engine
//! does between those calls is the rest of `engine`.

use std::collections::VecDeque;
use std::io::Write;

use kb_format::{Dep, Effect, Extent, OpKind, Params, Ps, Record, TraceWriter};

use super::{Engine, SimError};
use crate::machine::NodeId;
use crate::program::DataOp;

/// A data op between hook_start and hook_end.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenOp {
    pub(super) op_id: u64,
    /// Its number in the op log's open ops.
    ticket: u64,
    pub(super) t_start: Ps,
    component: u32,
    op_name: u32,
    kind: OpKind,
    /// When the serving unit computed or transferred (within the op's
    /// span); `None`: all of it.
    pub(super) active: Option<(Ps, Ps)>,
}

/// The op log: assigns op ids and effect sequence numbers, feeds the
/// trace writer, and releases records once no earlier one can appear.
pub(super) struct OpLog<W: Write> {
    pub(super) writer: TraceWriter<W>,
    pub(super) next_op: u64,
    next_seq: u64,
    /// Seqs of effects applied by ops whose records are not yet pushed:
    /// the least is the floor below which no later record can have an
    /// effect.
    held: Live<()>,
    /// Start times of the ops between hook_start and hook_end: the least
    /// is the watermark before which every record has been pushed.
    open: Live<Ps>,
    names: Vec<Option<u32>>,
    /// Op names' string ids by the name's address and length (names are
    /// `'static`; a handful in a run): no string hash per op.
    op_names: Vec<((usize, usize), u32)>,
}

impl<W: Write> OpLog<W> {
    /// An empty log writing to `writer`, for a machine of `nodes` nodes.
    pub(super) fn new(writer: TraceWriter<W>, nodes: usize) -> Self {
        OpLog {
            writer,
            next_op: 0,
            next_seq: 0,
            held: Live::default(),
            open: Live::default(),
            names: vec![None; nodes],
            op_names: Vec::new(),
        }
    }

    fn op_name_id(&mut self, name: &'static str) -> u32 {
        let key = (name.as_ptr() as usize, name.len());
        if let Some(&(_, id)) = self.op_names.iter().find(|(k, _)| *k == key) {
            return id;
        }
        let id = self.writer.intern(name);
        self.op_names.push((key, id));
        id
    }
}

/// Items numbered in the order they are added, each live until removed,
/// with the first live one at hand: a queue with holes (no allocation once
/// its ring has grown, unlike a `BTreeSet`'s nodes). The op log's seqs are
/// numbered this way, and its open ops start in time order, so the first
/// live item is the least.
#[derive(Debug, Default)]
struct Live<T> {
    /// Items from number `base` on; `None` once removed.
    items: VecDeque<Option<T>>,
    base: u64,
}

impl<T: Copy> Live<T> {
    /// Add `t`; returns its number.
    fn push(&mut self, t: T) -> u64 {
        self.items.push_back(Some(t));
        self.base + self.items.len() as u64 - 1
    }

    /// Remove item `n` (if live).
    fn remove(&mut self, n: u64) {
        if let Some(slot) = n
            .checked_sub(self.base)
            .and_then(|i| self.items.get_mut(i as usize))
        {
            *slot = None;
        }
        while let Some(None) = self.items.front() {
            self.items.pop_front();
            self.base += 1;
        }
    }

    /// The first live item and its number.
    fn first(&self) -> Option<(u64, T)> {
        // Removal pops the dead items in front.
        self.items.front().map(|t| (self.base, t.expect("live")))
    }
}

impl<W: Write> Engine<'_, W> {
    /// A new op id. Ids are assigned when an op is created (issued), so
    /// they are stable, and a pending result can name its writer before
    /// the writer's service starts.
    pub(super) fn new_op_id(&mut self) -> u64 {
        let id = self.log.next_op;
        self.log.next_op += 1;
        id
    }

    pub(super) fn hook_start(&mut self, node: NodeId, op: &dyn DataOp, op_id: u64) -> OpenOp {
        self.hook_start_named(node, op.op_name(), op.op_kind(), op_id)
    }

    /// `hook_start` of an op by its name and kind.
    pub(super) fn hook_start_named(
        &mut self,
        node: NodeId,
        op_name: &'static str,
        kind: OpKind,
        op_id: u64,
    ) -> OpenOp {
        let t_start = self.q.now();
        let log = &mut self.log;
        let component = match log.names[node as usize] {
            Some(id) => id,
            None => {
                let id = log.writer.intern(&self.m.nodes[node as usize].name);
                log.names[node as usize] = Some(id);
                id
            }
        };
        let op_name = log.op_name_id(op_name);
        let ticket = log.open.push(t_start);
        OpenOp {
            op_id,
            ticket,
            t_start,
            component,
            op_name,
            kind,
            active: None,
        }
    }

    pub(super) fn hook_end(
        &mut self,
        op: OpenOp,
        decl: &dyn DataOp,
        fingerprint: Option<u64>,
        read: Option<Effect>,
        write: Option<Effect>,
        deps: Vec<Dep>,
    ) -> Result<(), SimError> {
        self.hook_end_with_deps(op, decl.params(), fingerprint, read, write, deps)
    }

    /// Open a sync record (a wait, a signal's flight, a launch) at node
    /// `node` now. Its op id is assigned when it closes, so that what
    /// ended it (a later op) can be one of its dependencies.
    pub(super) fn sync_open(&mut self, node: NodeId, name: &'static str) -> OpenOp {
        self.hook_start_named(node, name, OpKind::Sync, 0)
    }

    /// Close sync record `op` now, caused by `deps`; returns its op id.
    pub(super) fn sync_close(&mut self, mut op: OpenOp, deps: &[Dep]) -> Result<u64, SimError> {
        op.op_id = self.new_op_id();
        let mut v = self.log.writer.take_deps();
        v.extend_from_slice(deps);
        self.hook_end_with_deps(op, Params::None, None, None, None, v)?;
        Ok(op.op_id)
    }

    /// An instant sync record at `node` now (a kernel's start or end).
    pub(super) fn sync_instant(
        &mut self,
        node: NodeId,
        name: &'static str,
        deps: &[Dep],
    ) -> Result<u64, SimError> {
        let op = self.sync_open(node, name);
        self.sync_close(op, deps)
    }

    /// The record of `op`, with its params (moved in: a math op's inputs
    /// are not copied) and dependencies.
    pub(super) fn hook_end_with_deps(
        &mut self,
        op: OpenOp,
        params: Params,
        fingerprint: Option<u64>,
        read: Option<Effect>,
        write: Option<Effect>,
        mut deps: Vec<Dep>,
    ) -> Result<(), SimError> {
        let now = self.q.now();
        // A cause is always an earlier op (a later one, such as a newer
        // producer of the same tile, cannot be), and is named once.
        deps.retain(|d| d.op < op.op_id);
        deps.sort_unstable_by_key(|d| (d.op, d.kind));
        deps.dedup_by_key(|d| d.op);
        let log = &mut self.log;
        log.open.remove(op.ticket);
        for e in [&read, &write].into_iter().flatten() {
            log.held.remove(e.seq);
        }
        let floor = log.held.first().map_or(log.next_seq, |(seq, ())| seq);
        log.writer.set_seq_floor(floor);
        log.writer.push(Record {
            op_id: op.op_id,
            t_start: op.t_start,
            t_end: now,
            component: op.component,
            op_name: op.op_name,
            kind: op.kind,
            params,
            deps,
            fingerprint,
            read,
            write,
            active: op.active,
        })?;
        let watermark = log.open.first().map_or(now, |(_, t)| t.min(now));
        log.writer.advance(watermark)?;
        Ok(())
    }

    /// Number a data effect applied now.
    pub(super) fn effect(&mut self, ranges: Vec<Extent>) -> Effect {
        let seq = self.log.next_seq;
        self.log.next_seq += 1;
        let n = self.log.held.push(());
        debug_assert_eq!(n, seq, "every seq is held once, in order");
        Effect {
            time: self.q.now(),
            seq,
            ranges,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Live;

    #[test]
    fn live_items_give_the_first_one_not_removed() {
        let mut l = Live::default();
        assert_eq!(l.first(), None);
        for t in [10u64, 20, 30, 40] {
            l.push(t);
        }
        l.remove(1);
        assert_eq!(l.first(), Some((0, 10)));
        l.remove(0);
        assert_eq!(l.first(), Some((2, 30)), "1 was removed before");
        l.remove(7); // never added: nothing happens
        l.remove(0); // already gone
        assert_eq!(l.first(), Some((2, 30)));
        assert_eq!(l.push(50), 4, "numbers go on");
        l.remove(2);
        l.remove(3);
        assert_eq!(l.first(), Some((4, 50)));
        l.remove(4);
        assert_eq!(l.first(), None);
        assert_eq!(l.push(60), 5);
    }
}
