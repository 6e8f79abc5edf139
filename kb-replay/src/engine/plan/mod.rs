//! Planning a window: what each effect does to physical bytes.
//!
//! The planner walks a window's effects in order, with the plane's aliases
//! ([`crate::plane::lazy`]) as they stand before it, and turns each into
//! nodes that touch physical bytes only:
//!
//! - a memory op's read resolves its ranges to where their bytes lie and,
//!   when its fingerprint is checked, hashes them there ([`Action::Hash`]);
//! - its write, when the destination is one contiguous range and the bytes
//!   read are still where they were, copies nothing: the destination
//!   becomes an alias of them (a *lazy copy*). Otherwise it copies
//!   ([`Action::Copy`]), or writes what its read captured
//!   ([`Action::Capture`], [`Action::Release`]) when something changed the
//!   bytes in between;
//! - a compute op reads its operands where they lie (resolved ranges,
//!   strided views of HBM or host data) and writes its output;
//! - before any physical write, the aliases whose sources it would change
//!   are materialized (their sources copied to their targets, nodes of
//!   their own before the write), and the aliases onto the written bytes
//!   are trimmed.
//!
//! So the plane ends with the bytes Phase 1 described: a logical byte is
//! its physical byte unless an alias says where it is, and every alias's
//! source holds the bytes it had when the alias was made.
//!
//! Fingerprints: a memory op whose resolved bytes and recorded fingerprint
//! are those of an earlier op whose fingerprint is (or will be, earlier
//! in effect order) checked, with no physical write to those bytes since,
//! has its fingerprint checked by that one hash: the bytes are the same
//! bytes, so the hash is too. [`Fingerprints`] chooses which are checked.

use std::sync::Arc;

use kb_format::{Extent, OpKind, Params, TensorMeta};
use rustc_hash::FxHashMap;

mod kchain;

pub(crate) use kchain::Chain;
use kchain::{OpenChain, close_chains_read};

use super::memo::Memo;
use super::{EffKey, Fingerprints, PendingOp, Stats};
use crate::error::fmt_ns;
use crate::ops::Plan;
use crate::plane::lazy::{Lazy, overlaps};
use crate::plane::{PlaneError, extent_bytes_within, fmt_extents, mem_key, resolve_with, span};

/// What a node does, on physical bytes.
#[derive(Debug)]
pub(crate) enum Action {
    /// Nothing left to do (a lazy copy, a read whose check is implied).
    None,
    /// Stop with this error about the node's op (found while planning).
    Fail(String),
    /// Check a memory op's fingerprint on the bytes it reads.
    Hash { src: Vec<Extent>, fp: u64 },
    /// Gather a memory op's bytes for its later write (and check them).
    Capture { src: Vec<Extent>, fp: Option<u64> },
    /// Copy bytes (a memory op done physically, or a materialized alias),
    /// checking the fingerprint when given.
    Copy {
        src: Vec<Extent>,
        dst: Vec<Extent>,
        fp: Option<u64>,
    },
    /// Write what the op's read held (captured bytes, a computed output).
    Release { dst: Vec<Extent> },
    /// A compute op on its operands' physical bytes (in operand order),
    /// writing `dst`, or holding the output for its write when `None`.
    /// A GEMM's `a` and `b` may come decoded once for several GEMMs.
    Compute {
        reads: Vec<Extent>,
        dst: Option<Vec<Extent>>,
        dense: [Option<Dense>; 2],
    },
    /// A K-chain: GEMMs writing the same output, each (but the first)
    /// reading it as its accumulator, run one after another in effect
    /// order as one node (see [`Chain`]).
    Chain(Box<Chain>),
}

/// A GEMM operand decoded once into its logical row-major f32 matrix (by
/// the first GEMM that runs with it), shared by every GEMM planned to read
/// the same unchanged bytes the same way: an f16 or bf16 tile, a
/// transposed one, or an f32 tile whose rows lie apart. Filled once, read
/// by many.
pub(crate) type Dense = std::sync::Arc<DenseSlot>;

#[derive(Debug)]
pub(crate) struct DenseSlot {
    /// The matrix, once decoded.
    pub cell: std::sync::OnceLock<Vec<f32>>,
    /// Room for it, allocated when planned, by the planning thread. Pool
    /// threads allocating these (tens of MB that stay) grew their heaps a
    /// tile at a time, each growth an `mprotect`, which stalls the page
    /// faults of every thread (measured: 1 900 calls on a 2048^3 trace).
    room: std::sync::Mutex<Vec<f32>>,
}

impl DenseSlot {
    pub(crate) fn new(len: usize) -> DenseSlot {
        DenseSlot {
            cell: std::sync::OnceLock::new(),
            room: std::sync::Mutex::new(Vec::with_capacity(len)),
        }
    }

    /// The room allocated for the matrix (empty once taken: a second
    /// decoder racing the first allocates its own).
    pub fn take_room(&self) -> Vec<f32> {
        std::mem::take(
            &mut *self
                .room
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// How a [`Dense`] operand is read from its bytes: dtype, logical rows and
/// columns, transposed, stored column-major.
pub(crate) type DenseHow = (u8, usize, usize, bool, bool);

/// One node of a planned window.
#[derive(Debug)]
pub(crate) struct PNode {
    /// The op it belongs to (a materialization: the op whose write needed
    /// it): its slot while its effects are queued, and its record (which
    /// the node keeps: the slot may be reused once every effect is planned).
    pub slot: u32,
    pub op: Arc<PendingOp>,
    pub action: Action,
    /// A node of its op (chained to the op's other nodes and dependencies),
    /// not a materialization.
    pub of_op: bool,
    /// Bytes it holds for a later node of its op, and bytes it releases.
    pub hold: u64,
    pub release: u64,
}

impl PNode {
    /// Physical extents it reads and writes.
    pub fn accesses(&self) -> (&[Extent], &[Extent]) {
        match &self.action {
            Action::None | Action::Fail(_) => (&[], &[]),
            Action::Hash { src, .. } | Action::Capture { src, .. } => (src, &[]),
            Action::Copy { src, dst, .. } => (src, dst),
            Action::Release { dst } => (&[], dst),
            Action::Compute { reads, dst, .. } => (reads, dst.as_deref().unwrap_or(&[])),
            Action::Chain(c) => (&c.reads, &c.dst),
        }
    }

    /// The ops whose effects it applies: its op, and for a chain every
    /// GEMM after the first, in order.
    pub fn ops(&self) -> impl Iterator<Item = &PendingOp> {
        let rest = match &self.action {
            Action::Chain(c) => &c.links[1..],
            _ => &[],
        };
        std::iter::once(&*self.op).chain(rest.iter().map(|l| &*l.op))
    }

    /// Physical extents an action reads.
    fn reads_of(action: &Action) -> &[Extent] {
        match action {
            Action::None | Action::Fail(_) | Action::Release { .. } => &[],
            Action::Hash { src, .. } | Action::Capture { src, .. } | Action::Copy { src, .. } => {
                src
            }
            Action::Compute { reads, .. } => reads,
            Action::Chain(c) => &c.reads,
        }
    }

    /// Whether it has anything to run.
    pub fn is_empty(&self) -> bool {
        matches!(self.action, Action::None)
    }
}

/// An op whose read is planned and whose write is not (a memory op's
/// bytes must still be where they were at its write, or its read
/// captures them; a compute op's read holds its output).
#[derive(Debug)]
struct Pending {
    /// Its read's node (in the window being planned; none when deferred).
    node: usize,
    src: Vec<Extent>,
    /// How many physical writes the window had planned at the read.
    writes_then: usize,
    captured: bool,
    /// A memory op's read from an earlier window whose bytes nothing has
    /// written since: its write copies them from where they still lie,
    /// and a physical write to them first captures them (a node of this
    /// window, [`Pass::capture_deferred`]).
    deferred: bool,
}

/// Reads a window leaves deferred at most (more are captured at its
/// end, as before deferral): each physical write checks the deferred
/// reads of its memory.
const MAX_DEFERRED: usize = 1024;

/// The planner: its memory of checked fingerprints outlives a window.
#[derive(Debug, Default)]
pub(crate) struct Planner {
    /// Checked fingerprints and decoded operands.
    memo: Memo,
    /// This window's reads waiting for their writes, by op slot.
    /// (Indexed by slot: slots are small and reused; a hash map of
    /// them cost a hash and a probe per memory op.)
    pending: Vec<Option<Pending>>,
    /// This window's physical writes so far, per memory: (the count of
    /// writes before it, the extent).
    writes: FxHashMap<u64, Vec<(usize, Extent)>>,
    write_count: usize,
    /// A GEMM operand's pieces, reused from one operand to the next.
    pieces: Vec<Extent>,
    /// A compute op's resolved reads, reused from one op to the next (a
    /// GEMM joining a chain copies them into the chain's).
    reads: Vec<Extent>,
    /// This window's open K-chains, by the memory key of their output.
    chains: FxHashMap<u64, Vec<OpenChain>>,
    /// The slots of deferred reads ([`Pending::deferred`]), by the memory
    /// key of each extent they read, and how many there are.
    deferred: FxHashMap<u64, Vec<u32>>,
    deferred_count: usize,
    /// Deferred reads this window captured (their pending entries hold
    /// this window's node; at its end they go, as other captured reads').
    captured_late: Vec<u32>,
}

/// What planning sees of the data plane: the aliases, which it changes;
/// the per-op byte limit; and a log of the extents written physically,
/// whose regions must grow before the window runs. Planning never reads or
/// changes the plane's bytes or regions, so it may run while an earlier
/// window's nodes do (the regions grow between windows, see
/// [`super::Replayer`]).
pub(crate) struct PlanPlane<'a> {
    pub lazy: &'a mut Lazy,
    pub max_bytes: u64,
    pub reserve: &'a mut Vec<Extent>,
}

impl PlanPlane<'_> {
    fn lazy(&self) -> &Lazy {
        self.lazy
    }

    fn lazy_mut(&mut self) -> &mut Lazy {
        self.lazy
    }

    fn resolve(&self, extents: &[Extent]) -> Vec<Extent> {
        resolve_with(self.lazy, extents)
    }

    /// [`PlanPlane::resolve`] appending to `out`.
    fn resolve_into(&self, extents: &[Extent], out: &mut Vec<Extent>) {
        if self.lazy.is_empty() {
            out.extend(extents.iter().filter(|e| e.bytes() > 0));
            return;
        }
        for e in extents {
            self.lazy.resolve_into(e, out);
        }
    }

    fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        extent_bytes_within(extents, self.max_bytes)
    }

    /// `extents` will be written physically: their regions must cover them
    /// when the window runs.
    fn reserve(&mut self, extents: &[Extent]) {
        self.reserve.extend_from_slice(extents);
    }
}

/// What planning needs besides the planner.
pub(crate) struct PlanCx<'a> {
    pub tensors: &'a [TensorMeta],
    pub elide: bool,
    pub fingerprints: Fingerprints,
    /// Plan K-chains of GEMMs as one node ([`Chain`]).
    pub fuse: bool,
}

/// Which recorded fingerprints `sample` checks: about one in 16, by op id.
pub fn sampled(op_id: u64) -> bool {
    op_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60 == 0
}

/// One planning pass over a window.
struct Pass<'p, 'c> {
    pl: &'p mut Planner,
    plane: PlanPlane<'p>,
    cx: &'p PlanCx<'c>,
    ops: &'p [Option<Arc<PendingOp>>],
    /// Effects each op (by slot) has still to plan.
    left: &'p mut [u8],
    stats: &'p mut Stats,
    nodes: Vec<PNode>,
    /// Planning stopped at an error (its node is the last).
    failed: bool,
}

impl Planner {
    /// Plan a window: `keys` sorted. Returns its nodes in effect order (in
    /// `nodes`, an empty vector to reuse). Bytes counts, fingerprints and
    /// lazy copies are counted here.
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &mut self,
        plane: PlanPlane<'_>,
        keys: &[EffKey],
        ops: &[Option<Arc<PendingOp>>],
        left: &mut [u8],
        cx: &PlanCx,
        stats: &mut Stats,
        mut nodes: Vec<PNode>,
    ) -> Vec<PNode> {
        nodes.clear();
        nodes.reserve(keys.len());
        let mut pass = Pass {
            pl: self,
            plane,
            cx,
            ops,
            left,
            stats,
            nodes,
            failed: false,
        };
        let mut i = 0;
        while i < keys.len() && !pass.failed {
            let k = keys[i];
            let both = !k.write && keys.get(i + 1).is_some_and(|n| n.slot == k.slot && n.write);
            pass.effect(k.slot, k.write, both);
            i += 1 + both as usize;
        }
        // Reads whose writes come in a later window: a memory op's whose
        // bytes nothing wrote since is deferred (its write copies them
        // from where they lie, unless a physical write comes first);
        // others hold their bytes. (A compute op's read holds its output
        // already.)
        for k in keys {
            let Some(p) = pass.pl.take_pending(k.slot) else {
                continue;
            };
            if p.captured || p.deferred {
                // (A deferred read of an earlier window stays so.)
                if p.deferred {
                    pass.pl.set_pending(k.slot, p);
                }
                continue;
            }
            if pass.pl.deferred_count < MAX_DEFERRED
                && !pass.pl.written_since(p.writes_then, &p.src)
            {
                pass.pl.defer(k.slot, p);
            } else {
                pass.capture(p.node, p.src);
            }
        }
        // (A write after the window finds no pending read: it releases.)
        for slot in std::mem::take(&mut pass.pl.captured_late) {
            pass.pl.take_pending(slot);
        }
        pass.pl.writes.clear();
        pass.pl.write_count = 0;
        pass.pl.chains.clear();
        pass.nodes
    }

    fn set_pending(&mut self, slot: u32, p: Pending) {
        let i = slot as usize;
        if self.pending.len() <= i {
            self.pending.resize_with(i + 1, || None);
        }
        self.pending[i] = Some(p);
    }

    fn take_pending(&mut self, slot: u32) -> Option<Pending> {
        self.pending.get_mut(slot as usize)?.take()
    }

    /// Carry `p`, a memory op's read with its write in a later window,
    /// over to the windows after this one, its bytes not captured.
    fn defer(&mut self, slot: u32, mut p: Pending) {
        p.deferred = true;
        for e in &p.src {
            let slots = self.deferred.entry(mem_key(e.pa)).or_default();
            if !slots.contains(&slot) {
                slots.push(slot);
            }
        }
        self.deferred_count += 1;
        self.set_pending(slot, p);
    }

    /// Forget the deferred read in `slot` (reading `src`).
    fn undefer(&mut self, slot: u32, src: &[Extent]) {
        for e in src {
            let key = mem_key(e.pa);
            if let Some(slots) = self.deferred.get_mut(&key) {
                slots.retain(|&s| s != slot);
                if slots.is_empty() {
                    self.deferred.remove(&key);
                }
            }
        }
        self.deferred_count -= 1;
    }

    /// Whether a physical write planned after the first `since` of the
    /// window touched any byte of `src`.
    fn written_since(&self, since: usize, src: &[Extent]) -> bool {
        if self.write_count == since {
            return false;
        }
        src.iter().any(|e| {
            self.writes.get(&mem_key(e.pa)).is_some_and(|log| {
                let from = log.partition_point(|w| w.0 < since);
                log[from..].iter().any(|(_, w)| overlaps(w, e))
            })
        })
    }
}

impl Pass<'_, '_> {
    fn op(&self, slot: u32) -> &PendingOp {
        self.ops[slot as usize].as_ref().expect("live op")
    }

    fn err(&self, _slot: u32, detail: String) -> String {
        detail
    }

    fn op_arc(&self, slot: u32) -> Arc<PendingOp> {
        self.ops[slot as usize].clone().expect("live op")
    }

    fn push(&mut self, slot: u32, action: Action) -> usize {
        close_chains_read(&mut self.pl.chains, PNode::reads_of(&action));
        let op = self.op_arc(slot);
        self.nodes.push(PNode {
            slot,
            op,
            action,
            of_op: true,
            hold: 0,
            release: 0,
        });
        self.nodes.len() - 1
    }

    fn fail(&mut self, slot: u32, detail: String) {
        self.push(slot, Action::Fail(detail));
        self.failed = true;
    }

    /// The effects an op applies here.
    fn applied(&mut self, slot: u32, n: u8) {
        self.left[slot as usize] -= n;
    }

    fn effect(&mut self, slot: u32, write: bool, both: bool) {
        let plan = self.op(slot).plan;
        self.applied(slot, 1 + both as u8);
        match plan {
            Plan::Skip => {
                if !write {
                    self.skip_read(slot);
                }
            }
            Plan::Move => {
                if !write {
                    self.mem_read(slot);
                }
                if (write || both) && !self.failed {
                    self.mem_write(slot);
                }
            }
            Plan::Compute { .. } => {
                if write {
                    self.compute_write(slot);
                } else {
                    self.compute_read(slot, both);
                }
            }
        }
    }

    fn reading_error(&self, slot: u32, x: PlaneError) -> String {
        let r = self.op(slot).rec.read.as_ref().expect("a read");
        self.err(
            slot,
            format!("reading {}: {x}", fmt_extents(&r.ranges, self.cx.tensors)),
        )
    }

    fn writing_error(&self, slot: u32, x: PlaneError) -> String {
        let w = self.op(slot).rec.write.as_ref().expect("a write");
        self.err(
            slot,
            format!("writing {}: {x}", fmt_extents(&w.ranges, self.cx.tensors)),
        )
    }

    /// A write's error as the scatter reports it (with its time).
    fn scatter_error(&self, slot: u32, x: PlaneError) -> String {
        let w = self.op(slot).rec.write.as_ref().expect("a write");
        let what = match x {
            PlaneError::LengthMismatch { data, ranges } => {
                format!("has {data} bytes to write, but its write ranges hold {ranges}")
            }
            x => x.to_string(),
        };
        self.err(
            slot,
            format!(
                "writing {} at {}: {what}",
                fmt_extents(&w.ranges, self.cx.tensors),
                fmt_ns(w.time)
            ),
        )
    }

    fn skip_read(&mut self, slot: u32) {
        let r = self.op(slot).rec.read.as_ref().expect("a read");
        match self.plane.extent_bytes(&r.ranges) {
            Ok(n) => self.stats.bytes_read += n,
            Err(x) => {
                let e = self.reading_error(slot, x);
                self.fail(slot, e);
            }
        }
    }

    /// The fingerprint this op's read checks, if any (by the mode).
    fn checked_fp(&mut self, slot: u32) -> Option<u64> {
        let r = &self.op(slot).rec;
        let fp = r.fingerprint?;
        let on = match self.cx.fingerprints {
            Fingerprints::All => true,
            Fingerprints::Sample => sampled(r.op_id),
            Fingerprints::Off => false,
        };
        if !on {
            self.stats.fingerprints_skipped += 1;
        }
        on.then_some(fp)
    }

    fn mem_read(&mut self, slot: u32) {
        // (Ranges lie in their memories: `Bounds` checked every record.)
        let checked = {
            let r = &self.ops[slot as usize].as_ref().expect("live op").rec;
            let read = r.read.as_ref().expect("a read");
            match self.plane.extent_bytes(&read.ranges) {
                Err(x) => Err(format!(
                    "reading {}: {x}",
                    fmt_extents(&read.ranges, self.cx.tensors)
                )),
                Ok(n) => match r
                    .write
                    .as_ref()
                    .map(|w| (w, self.plane.extent_bytes(&w.ranges)))
                {
                    Some((w, Err(x))) => Err(format!(
                        "writing {}: {x}",
                        fmt_extents(&w.ranges, self.cx.tensors)
                    )),
                    Some((w, Ok(wl))) if wl != n => Err(format!(
                        "reads {n} bytes ({}) but writes {wl} bytes ({})",
                        fmt_extents(&read.ranges, self.cx.tensors),
                        fmt_extents(&w.ranges, self.cx.tensors)
                    )),
                    w => Ok((n, self.plane.resolve(&read.ranges), w.is_some())),
                },
            }
        };
        let (n, src, has_write) = match checked {
            Ok(x) => x,
            Err(e) => return self.fail(slot, e),
        };
        self.stats.bytes_read += n;
        // (Its node may do nothing now, but it reads these bytes here.)
        close_chains_read(&mut self.pl.chains, &src);
        let fp = self.checked_fp(slot);
        let mut action = Action::None;
        if let Some(fp) = fp {
            self.stats.fingerprints_checked += 1;
            if self.pl.memo.has_fp(&src, fp) {
                self.stats.fingerprints_reused += 1;
            } else {
                self.pl.memo.add_fp(&src, fp);
                self.stats.fingerprint_bytes += n;
                action = Action::Hash {
                    src: src.clone(),
                    fp,
                };
            }
        }
        let node = self.push(slot, action);
        if has_write {
            let writes_then = self.pl.write_count;
            self.pl.set_pending(
                slot,
                Pending {
                    node,
                    src,
                    writes_then,
                    captured: false,
                    deferred: false,
                },
            );
        }
    }

    /// Turn the read node `node` into a capture of `src`.
    fn capture(&mut self, node: usize, src: Vec<Extent>) {
        self.stats.captured += 1;
        let n = &mut self.nodes[node];
        let fp = match std::mem::replace(&mut n.action, Action::None) {
            Action::Hash { fp, .. } => Some(fp),
            Action::Capture { fp, .. } => fp,
            _ => None,
        };
        n.hold = src.iter().map(Extent::bytes).sum();
        n.action = Action::Capture { src, fp };
    }

    fn mem_write(&mut self, slot: u32) {
        let Some(mut p) = self.pl.take_pending(slot) else {
            // The read was in an earlier window (it captured), or there is
            // no read (nothing to write: an error unless the ranges are
            // empty).
            let w = self.op(slot).rec.write.clone().expect("a write");
            match self.plane.extent_bytes(&w.ranges) {
                Ok(n) => self.stats.bytes_written += n,
                Err(x) => {
                    let e = self.scatter_error(slot, x);
                    return self.fail(slot, e);
                }
            }
            self.phys_write(&w.ranges, slot);
            self.push(slot, Action::Release { dst: w.ranges });
            return;
        };
        let n: u64 = p.src.iter().map(Extent::bytes).sum();
        self.stats.bytes_written += n;
        if p.deferred {
            return self.deferred_write(slot, p);
        }
        if !p.captured && self.pl.written_since(p.writes_then, &p.src) {
            p.captured = true;
            self.capture(p.node, p.src.clone());
        }
        let target = (!p.captured)
            .then(|| self.lazy_target(slot, &p.src))
            .flatten();
        if let Some(t) = target {
            self.plane.lazy_mut().set(t.pa, t.len, p.src);
            self.stats.copies_elided += 1;
            return;
        }
        let w = self.op(slot).rec.write.clone().expect("a write");
        // Done physically: what the write disturbs goes first (which may
        // change the bytes read, making the read capture them).
        let before = self.pl.write_count;
        self.phys_write(&w.ranges, slot);
        if !p.captured && self.pl.written_since(before, &p.src) {
            p.captured = true;
            self.capture(p.node, p.src.clone());
        }
        let overlap = p
            .src
            .iter()
            .any(|s| w.ranges.iter().any(|d| overlaps(s, d)));
        if p.captured || overlap {
            if !p.captured {
                self.capture(p.node, p.src);
            }
            let hold = self.nodes[p.node].hold;
            let i = self.push(slot, Action::Release { dst: w.ranges });
            self.nodes[i].release = hold;
            return;
        }
        // The read node is the last: one node copies (and checks).
        if p.node == self.nodes.len() - 1 {
            let fp = match std::mem::replace(&mut self.nodes[p.node].action, Action::None) {
                Action::Hash { fp, .. } => Some(fp),
                _ => None,
            };
            self.nodes[p.node].action = Action::Copy {
                src: p.src,
                dst: w.ranges,
                fp,
            };
        } else {
            self.push(
                slot,
                Action::Copy {
                    src: p.src,
                    dst: w.ranges,
                    fp: None,
                },
            );
        }
    }

    /// `extents` are about to be written physically: materialize the
    /// aliases that need their bytes, trim those onto them, drop the
    /// fingerprint checks of their bytes, make pending reads of them
    /// capture, grow regions.
    fn phys_write(&mut self, extents: &[Extent], slot: u32) {
        for e in extents {
            if !self.pl.deferred.is_empty() {
                self.capture_deferred(e);
            }
            let taken = self.plane.lazy_mut().take_sourced(e);
            for a in taken {
                self.materialize(a, slot);
            }
            let cut = self.plane.lazy_mut().clear_target(e);
            for a in cut {
                self.materialize(a, slot);
            }
            self.pl.memo.written(e);
            let count = self.pl.write_count;
            self.pl
                .writes
                .entry(mem_key(e.pa))
                .or_default()
                .push((count, *e));
            self.pl.write_count += 1;
        }
        self.plane.reserve(extents);
    }

    /// Where the memory op in `slot`, having read the physical bytes `src`,
    /// may write as a lazy copy (an alias of them): its one contiguous
    /// destination range, when elision is on, the range can be a target,
    /// and neither overlaps `src` nor is `src` an alias's target.
    fn lazy_target(&self, slot: u32, src: &[Extent]) -> Option<Extent> {
        let t = match self.op(slot).rec.write.as_ref().map(|w| &w.ranges[..]) {
            Some([e]) if e.rows <= 1 || e.stride == e.len => Extent::contiguous(e.pa, e.bytes()),
            _ => return None,
        };
        (self.cx.elide
            && span(&t).is_some()
            && aliasable(&t)
            && !src.iter().any(|s| overlaps(s, &t))
            && !self.plane.lazy().any_target(src))
        .then_some(t)
    }

    /// `e` is about to be written physically: the deferred reads of its
    /// bytes capture them first, in a node of their op placed here.
    fn capture_deferred(&mut self, e: &Extent) {
        let Some(slots) = self.pl.deferred.get(&mem_key(e.pa)) else {
            return;
        };
        let pending = &self.pl.pending;
        let hit: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|&s| {
                pending[s as usize]
                    .as_ref()
                    .is_some_and(|p| p.src.iter().any(|x| overlaps(x, e)))
            })
            .collect();
        for s in hit {
            let mut p = self.pl.take_pending(s).expect("a deferred read");
            self.pl.undefer(s, &p.src);
            let i = self.push(
                s,
                Action::Capture {
                    src: p.src.clone(),
                    fp: None,
                },
            );
            self.stats.captured += 1;
            self.nodes[i].hold = p.src.iter().map(Extent::bytes).sum();
            p.node = i;
            p.deferred = false;
            p.captured = true;
            self.pl.set_pending(s, p);
            self.pl.captured_late.push(s);
        }
    }

    /// The write of a deferred read `p` (see [`Pending::deferred`]): the
    /// bytes still lie where it read them, so it aliases or copies them,
    /// unless its own write (or what that materializes) changes them,
    /// which captures them first.
    fn deferred_write(&mut self, slot: u32, p: Pending) {
        let w = self.op(slot).rec.write.clone().expect("a write");
        if let Some(t) = self.lazy_target(slot, &p.src) {
            self.pl.undefer(slot, &p.src);
            self.plane.lazy_mut().set(t.pa, t.len, p.src);
            self.stats.copies_elided += 1;
            return;
        }
        // Still deferred while the write is planned, so that what it
        // disturbs captures the bytes first.
        self.pl.set_pending(slot, p);
        self.phys_write(&w.ranges, slot);
        let p = self.pl.take_pending(slot).expect("a pending read");
        if p.captured {
            let hold = self.nodes[p.node].hold;
            let i = self.push(slot, Action::Release { dst: w.ranges });
            self.nodes[i].release = hold;
            return;
        }
        self.pl.undefer(slot, &p.src);
        self.push(
            slot,
            Action::Copy {
                src: p.src,
                dst: w.ranges,
                fp: None,
            },
        );
    }

    /// Copy an alias's source to its target, after what that disturbs.
    fn materialize(&mut self, a: crate::plane::lazy::Alias, slot: u32) {
        let t = [a.target()];
        self.phys_write(&t, slot);
        self.stats.materialized += 1;
        close_chains_read(&mut self.pl.chains, &a.src);
        let op = self.op_arc(slot);
        self.nodes.push(PNode {
            slot,
            op,
            action: Action::Copy {
                src: a.src,
                dst: t.to_vec(),
                fp: None,
            },
            of_op: false,
            hold: 0,
            release: 0,
        });
    }

    fn compute_read(&mut self, slot: u32, both: bool) {
        // (The record outlives the pass: no clone of it or its ranges.)
        let ops = self.ops;
        let op: &PendingOp = ops[slot as usize].as_ref().expect("live op");
        let Plan::Compute { input, output } = op.plan else {
            unreachable!("a compute op");
        };
        let r = &op.rec;
        let read = r.read.as_ref().expect("a read");
        let checked = {
            let wl = r
                .write
                .as_ref()
                .map(|w| (w, self.plane.extent_bytes(&w.ranges)));
            match (wl, self.plane.extent_bytes(&read.ranges)) {
                (Some((w, Err(x))), _) => Err(format!(
                    "writing {}: {x}",
                    fmt_extents(&w.ranges, self.cx.tensors)
                )),
                (_, Err(x)) => Err(format!(
                    "reading {}: {x}",
                    fmt_extents(&read.ranges, self.cx.tensors)
                )),
                (_, Ok(total)) if total != input => Err(format!(
                    "its operands take {input} bytes, but its read ranges ({}) hold {total}",
                    fmt_extents(&read.ranges, self.cx.tensors)
                )),
                (Some((_, Ok(wl))), _) if wl != output => Err(format!(
                    "its output takes {output} bytes, but its write ranges hold {wl}"
                )),
                (w, Ok(total)) => Ok((total, w.is_some())),
            }
        };
        let (total, has_write) = match checked {
            Ok(x) => x,
            Err(e) => return self.fail(slot, e),
        };
        self.stats.bytes_read += total;
        if !has_write {
            // No write: nothing computed, nobody sees the output.
            return;
        }
        let mut reads = std::mem::take(&mut self.pl.reads);
        reads.clear();
        self.plane.resolve_into(&read.ranges, &mut reads);
        let dense = self.dense_operands(slot, &reads);
        if both {
            let w = &r.write.as_ref().expect("a write").ranges;
            self.stats.bytes_written += output;
            let fusable = self.cx.fuse && is_gemm(op);
            let join = fusable
                .then(|| self.chain_to_join(slot, &reads, w))
                .flatten();
            let before = self.pl.write_count;
            self.phys_write(w, slot);
            if let Some(at) = join
                && self.still_joins(at, before, w)
            {
                self.join_chain(slot, at, &reads, dense);
                self.pl.reads = reads;
                return;
            }
            let i = self.push(
                slot,
                Action::Compute {
                    reads: reads.clone(),
                    dst: Some(w.clone()),
                    dense,
                },
            );
            self.pl.reads = reads;
            if fusable {
                self.open_chain(slot, i);
            }
        } else {
            let i = self.push(
                slot,
                Action::Compute {
                    reads: reads.clone(),
                    dst: None,
                    dense,
                },
            );
            self.pl.reads = reads;
            self.nodes[i].hold = output;
            self.pl.set_pending(
                slot,
                Pending {
                    node: i,
                    src: Vec::new(),
                    writes_then: 0,
                    captured: true,
                    deferred: false,
                },
            );
        }
    }

    /// Which of a GEMM's `a` and `b` to decode once for every GEMM that
    /// reads the same bytes the same way (see [`Dense`]): those not f32,
    /// not stored as the logical matrix, or whose rows lie apart (a tile
    /// of a larger matrix: the kernels read dense tiles a third faster,
    /// measured, and tiled GEMMs read each tile many times).
    fn dense_operands(&mut self, slot: u32, reads: &[Extent]) -> [Option<Dense>; 2] {
        use kb_format::Dtype;
        let op = self.ops[slot as usize].as_ref().expect("live op");
        let Params::Gemm(p) = &op.rec.params else {
            return [None, None];
        };
        let floats = |d: Dtype| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16);
        if !is_gemm(op) || !floats(p.dtype_in) || !floats(p.dtype_acc) {
            return [None, None];
        }
        let p = *p;
        let (m, k, n) = (p.m as usize, p.k as usize, p.n as usize);
        let si = p.dtype_in.size() as u64;
        let (la, lb) = ((m * k) as u64 * si, (k * n) as u64 * si);
        let mut out = [None, None];
        for (i, (off, len, rows, cols, transpose, layout)) in [
            (0, la, m, k, p.transpose_a, p.layout_a),
            (la, lb, k, n, p.transpose_b, p.layout_b),
        ]
        .into_iter()
        .enumerate()
        {
            let mut pieces = std::mem::take(&mut self.pl.pieces);
            pieces.clear();
            crate::plane::lazy::slice_into(reads, off, len, &mut pieces);
            let as_is =
                p.dtype_in == Dtype::F32 && crate::ops::gemm::stored_as_is(transpose, layout);
            let apart = matches!(pieces.as_slice(), [e] if e.rows > 1 && e.stride > e.len);
            if !as_is || apart {
                let how = (
                    p.dtype_in as u8,
                    rows,
                    cols,
                    transpose,
                    layout == kb_format::Layout::ColMajor,
                );
                out[i] = Some(self.pl.memo.dense(&pieces, how));
            }
            self.pl.pieces = pieces;
        }
        out
    }

    fn compute_write(&mut self, slot: u32) {
        let r = &self.op(slot).rec;
        let Plan::Compute { input, output } = self.op(slot).plan else {
            unreachable!("a compute op");
        };
        let w = r.write.clone().expect("a write");
        let had_read = r.read.is_some();
        let held_here = self.pl.take_pending(slot);
        if let Err(x) = self.plane.extent_bytes(&w.ranges) {
            let e = self.writing_error(slot, x);
            return self.fail(slot, e);
        }
        if !had_read {
            if input != 0 {
                let e = self.err(
                    slot,
                    format!("its operands take {input} bytes, but it has no read effect"),
                );
                return self.fail(slot, e);
            }
            let wl = self.plane.extent_bytes(&w.ranges).unwrap_or(0);
            if wl != output {
                let e = self.err(
                    slot,
                    format!("its output takes {output} bytes, but its write ranges hold {wl}"),
                );
                return self.fail(slot, e);
            }
            self.stats.bytes_written += output;
            self.phys_write(&w.ranges, slot);
            self.push(
                slot,
                Action::Compute {
                    reads: Vec::new(),
                    dst: Some(w.ranges),
                    dense: [None, None],
                },
            );
            return;
        }
        self.stats.bytes_written += output;
        self.phys_write(&w.ranges, slot);
        let i = self.push(slot, Action::Release { dst: w.ranges });
        self.nodes[i].release = held_here.map_or(0, |p| self.nodes[p.node].hold);
    }
}

/// Spaces a lazy copy may target: device memories (host space writes
/// shadow the input page by page).
fn aliasable(t: &Extent) -> bool {
    !matches!(
        kb_format::pa::space_of(t.pa),
        Some(kb_format::Space::Host) | None
    )
}

/// Memory keys a window's nodes write physically.
pub(crate) fn written_memories(nodes: &[PNode]) -> rustc_hash::FxHashSet<u64> {
    let mut set = rustc_hash::FxHashSet::default();
    for n in nodes {
        for e in n.accesses().1 {
            set.insert(crate::plane::mem_key(e.pa));
        }
    }
    set
}

/// Whether an op is a GEMM with GEMM params.
pub(crate) fn is_gemm(op: &PendingOp) -> bool {
    op.rec.kind == OpKind::Gemm && matches!(op.rec.params, Params::Gemm(_))
}
