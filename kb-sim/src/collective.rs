//! Collectives as library kernels: all-reduce (ring and tree),
//! reduce-scatter, all-gather and broadcast over any [`Group`] of PEs (a
//! cube's PEs, one PE per cube or per SIP, every PE), written only with
//! the public kernel API: PE-to-PE copies ([`Tl::put`]) into receive slots
//! in each member's TCM, signals that count what arrived and what was
//! consumed, and recorded math ops for the reductions (so kb-replay
//! recomputes and verifies them).
//!
//! Data: each member's buffer is its shard of an HBM tensor (`R` x `C`).
//! A ring splits it into one chunk per member (chunk `c` = rows
//! `[c*R/P, (c+1)*R/P)`, the split of [`Placement::over`] with
//! `RowWise`), a tree moves it whole; both move tiles of `slot_bytes`.
//!
//! Flow control: every (sender, receiver) pair of a pattern (ring: to the
//! right neighbour; tree: to the parent, to each child) is a channel with
//! `depth` slots in the receiver's TCM. A copy into slot `m mod depth`
//! raises the receiver's "filled" signal on arrival; the receiver waits
//! for it, uses the slot, then raises the sender's "credit" signal (in
//! batches of `depth / 2`, flushed before any wait for a credit); the
//! sender waits for credit `m - depth + 1` before reusing a slot. So every
//! slot is reused only after it was read, which the race detector checks.
//! The ring sends at most `depth / 2` messages ahead of what it has
//! received and does whatever is ready (send where a slot is free, take
//! what has arrived), waiting only when nothing is: a credit travels
//! behind the receiver's own queued messages on its link (links carry
//! messages in order), and the other half of the slots covers that delay,
//! so an uncontended ring runs at its links' bandwidth.
//!
//! Host side: [`slots`] declares the receive slots; each kernel makes a
//! [`Comm`] over the group and calls the collectives in the same order on
//! every member (a `Comm` keeps its channels' message counts, so several
//! collectives may follow each other in one launch).

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use kb_format::{Addr, Dtype};

use crate::kernel::{Block, Group, LoadHandle, Notify, Operand, Pending, SignalOp, TensorArg, Tl};
use crate::machine::PeCoord;
use crate::runtime::{Placement, Policy};
use crate::workload::{Program, TensorId, WorkloadError};

/// A tree reduction's running value: the own tile, then a sum (no box per
/// tile).
enum Acc {
    Own(crate::kernel::Tile),
    Sum(Pending),
}

impl Acc {
    fn operand(&self) -> &dyn Operand {
        match self {
            Acc::Own(t) => t,
            Acc::Sum(s) => s,
        }
    }
}

/// How an all-reduce moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around a ring: each member sends
    /// and receives 2 (P-1)/P of the buffer, bandwidth-optimal.
    Ring,
    /// Reduce up a binary tree to rank 0, then broadcast down it:
    /// 2 log2(P) steps of latency, each link carrying the whole buffer.
    Tree,
}

impl Algorithm {
    /// The algorithm named `ring` or `tree`.
    pub fn parse(s: &str) -> Option<Algorithm> {
        match s {
            "ring" => Some(Algorithm::Ring),
            "tree" => Some(Algorithm::Tree),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
        }
    }
}

/// Receive regions a member has for `algorithms`: the ring's one (from
/// the left neighbour) and/or the tree's three (from each child, from the
/// parent). Broadcast runs down the tree.
fn regions(algorithms: &[Algorithm]) -> u64 {
    algorithms.contains(&Algorithm::Ring) as u64 + 3 * algorithms.contains(&Algorithm::Tree) as u64
}

/// Signals a [`Comm`] uses from its first: 4 "filled" (one per region)
/// and 4 "credit" (one per outgoing channel).
pub const SIGNALS: u32 = 8;

/// Declare the receive slots collectives over `group` need: `depth` slots
/// of `slot_bytes` per channel in each member's TCM, for the channels of
/// `algorithms` (the ring has one, the tree three: broadcast runs down
/// the tree), as a `dtype` tensor of `slot_bytes`-long rows. Pass it to
/// the kernels, which give it and the same `depth` to [`Comm::new`].
pub fn slots(
    prog: &mut Program<'_>,
    name: &str,
    dtype: Dtype,
    group: &[PeCoord],
    (slot_bytes, depth): (u64, u32),
    algorithms: &[Algorithm],
) -> Result<TensorId, WorkloadError> {
    let elems = (slot_bytes / dtype.size() as u64).max(1);
    prog.zeros(
        name,
        dtype,
        [regions(algorithms).max(1) * depth.max(1) as u64, elems],
        Placement::over(group, Policy::Replicate).in_tcm(),
    )
}

/// A channel: which region of the receiver it fills and which credit
/// signal of the sender it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// To the ring's right neighbour.
    Ring,
    /// To the tree parent (from child `c`: the parent's region 1 + c).
    Up(usize),
    /// To tree child `c`.
    Down(usize),
}

impl Channel {
    /// The receiver's region, the tree's three starting at `tree_base`
    /// (after the ring's one, when the slots hold both).
    fn region(self, tree_base: usize) -> usize {
        match self {
            Channel::Ring => 0,
            Channel::Up(c) => tree_base + c,
            Channel::Down(_) => tree_base + 2,
        }
    }

    /// The sender's index for its credit signal and message count.
    fn link(self) -> usize {
        match self {
            Channel::Ring => 0,
            Channel::Up(_) => 1,
            Channel::Down(c) => 2 + c,
        }
    }
}

/// A member's view of a group for collectives: its rank, the receive
/// slots, the signals counting messages, and how many messages each of
/// its channels has carried so far.
#[derive(Debug)]
pub struct Comm<'a> {
    group: Group,
    rank: usize,
    slots: &'a TensorArg,
    depth: u64,
    /// Regions of the slots: 1 (ring), 3 (tree) or 4 (both).
    regions: u64,
    first_signal: u32,
    /// Messages sent, per outgoing channel (link index).
    sent: [u64; 4],
    /// Messages received, per region.
    received: [u64; 4],
    /// Per region: messages used but not yet credited to their sender
    /// (credits go back `depth / 2` at a time), and that sender.
    uncredited: [(u64, Option<(PeCoord, usize)>); 4],
    /// Use slots without waiting for the copies to arrive (broken on
    /// purpose: see [`Comm::without_arrival_waits`]).
    unsynchronized: bool,
}

/// A member's buffer: its shard of a tensor.
#[derive(Clone, Copy)]
struct Buf<'t> {
    t: &'t TensorArg,
    pe: PeCoord,
}

impl Buf<'_> {
    fn shape(&self) -> (u64, u64) {
        let s = self
            .t
            .shard(self.pe)
            .unwrap_or_else(|| panic!("collective: {} has no shard on {}", self.t.name, self.pe));
        (s.rows, s.row_bytes / self.t.elem_bytes())
    }

    fn block(&self, row: u64, rows: u64) -> Block {
        let s = self.t.shard(self.pe).expect("checked by shape");
        let cols = s.row_bytes / self.t.elem_bytes();
        Block::in_shard(self.t, s, row, 0, rows as u32, cols as u32)
    }
}

/// Rows `[a, b)` of chunk `c` of `p` over `rows` rows (the RowWise split).
fn chunk(rows: u64, c: usize, p: usize) -> (u64, u64) {
    let (c, p) = (c as u64, p as u64);
    (c * rows / p, (c + 1) * rows / p)
}

impl<'a> Comm<'a> {
    /// This PE's view of `group` (it must be a member), with receive slots
    /// `slots` (from [`slots`], `depth` per channel) and signals
    /// `first_signal .. first_signal + SIGNALS` (keep other signals of the
    /// kernel out of that range).
    pub fn new(
        tl: &Tl<'_>,
        group: Group,
        slots: &'a TensorArg,
        depth: u32,
        first_signal: u32,
    ) -> Comm<'a> {
        let rank = group
            .rank(tl.pe())
            .unwrap_or_else(|| panic!("collective: {} is not a member of the group", tl.pe()));
        for &p in group.pes() {
            assert!(
                slots.shard(p).is_some(),
                "collective: slots {} have no part in {p}'s TCM",
                slots.name
            );
        }
        let depth = depth.max(1) as u64;
        let regions = slots.shape[0] / depth;
        assert!(
            slots.shape[0].is_multiple_of(depth) && matches!(regions, 1 | 3 | 4),
            "collective: slots {} ({} rows) do not hold 1, 3 or 4 regions of {depth} slots",
            slots.name,
            slots.shape[0]
        );
        Comm {
            rank,
            slots,
            depth,
            regions,
            first_signal,
            group,
            sent: [0; 4],
            received: [0; 4],
            uncredited: [(0, None); 4],
            unsynchronized: false,
        }
    }

    /// Drop one synchronization on purpose: use each received slot without
    /// waiting for the copy that fills it to arrive. The result is wrong
    /// whenever the slot is read first, and `kb-sim` reports each such
    /// read as a data race naming the copy and the read (what
    /// `tp_mlp -p sync=0` demonstrates). Never use it for results.
    pub fn without_arrival_waits(mut self) -> Self {
        self.unsynchronized = true;
        self
    }

    /// The group's size.
    pub fn size(&self) -> usize {
        self.group.len()
    }

    /// This PE's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn member(&self, rank: usize) -> PeCoord {
        self.group.pes()[rank % self.group.len()]
    }

    fn filled(&self, region: usize) -> u32 {
        self.first_signal + region as u32
    }

    fn credit(&self, link: usize) -> u32 {
        self.first_signal + 4 + link as u32
    }

    /// The receiver's region for `ch`; panics if the slots have none.
    fn region(&self, ch: Channel) -> usize {
        let (ring, tree) = match self.regions {
            1 => (true, false),
            3 => (false, true),
            _ => (true, true),
        };
        match ch {
            Channel::Ring => assert!(
                ring,
                "collective: the slots have no ring region (declare them for Algorithm::Ring)"
            ),
            _ => assert!(
                tree,
                "collective: the slots have no tree regions (declare them for Algorithm::Tree; broadcast runs down the tree)"
            ),
        }
        ch.region(if ring { 1 } else { 0 })
    }

    /// Rows of a tile of a `cols`-wide `dtype` buffer: as many as fit a
    /// slot.
    fn tile_rows(&self, cols: u64, dtype: Dtype) -> u64 {
        let slot = self.slots.shape[1] * self.slots.elem_bytes();
        let row = cols * dtype.size() as u64;
        assert!(
            row <= slot,
            "collective: a {cols}-element row does not fit a {slot}-byte slot (declare bigger slots)"
        );
        slot / row
    }

    /// Slot `index` of `region` in `pe`'s TCM, shaped `rows` x `cols`.
    fn slot(
        &self,
        pe: PeCoord,
        region: usize,
        index: u64,
        rows: u64,
        cols: u64,
        dtype: Dtype,
    ) -> Block {
        let s = self.slots.shard(pe).expect("checked in new");
        let es = dtype.size() as u64;
        Block {
            addr: Addr {
                space: self.slots.space,
                addr: s.addr + (region as u64 * self.depth + index) * s.row_bytes,
            },
            rows: rows as u32,
            cols: cols as u32,
            row_stride: cols * es,
            dtype,
        }
    }

    /// Wait until message `m` on `ch` has a free slot: its receiver used
    /// message `m - depth`. Pending credits go back first, so no two
    /// members wait for each other's batched credits.
    fn wait_for_slot(&mut self, tl: &mut Tl<'_>, ch: Channel, m: u64) {
        if m >= self.depth {
            self.flush_all(tl);
            tl.wait_signal(self.credit(ch.link()), m - self.depth + 1);
        }
    }

    /// Whether the next message on `ch` has a free slot now (no waiting).
    fn slot_free(&mut self, tl: &mut Tl<'_>, ch: Channel) -> bool {
        let m = self.sent[ch.link()];
        m < self.depth || tl.signal_value(self.credit(ch.link())) > m - self.depth
    }

    /// Whether the next message on `ch` into this PE has arrived (no
    /// waiting).
    fn arrived(&mut self, tl: &mut Tl<'_>, ch: Channel) -> bool {
        let r = self.region(ch);
        self.unsynchronized || tl.signal_value(self.filled(r)) > self.received[r]
    }

    /// Send `tile` on `ch` to `to`, once a slot there is free.
    fn send(&mut self, tl: &mut Tl<'_>, tile: &dyn Operand, ch: Channel, to: PeCoord) {
        let m = self.sent[ch.link()];
        self.wait_for_slot(tl, ch, m);
        let (_, rows, cols, dtype) = tile.operand();
        let dst = self.slot(
            to,
            self.region(ch),
            m % self.depth,
            rows as u64,
            cols as u64,
            dtype,
        );
        tl.put(
            tile,
            dst,
            Some(Notify::one(to, self.filled(self.region(ch)))),
        );
        self.sent[ch.link()] = m + 1;
    }

    /// Wait for the next message on `ch` into this PE: its slot.
    fn recv(&mut self, tl: &mut Tl<'_>, ch: Channel, rows: u64, cols: u64, dtype: Dtype) -> Block {
        let r = self.region(ch);
        let k = self.received[r];
        if !self.unsynchronized {
            tl.wait_signal(self.filled(r), k + 1);
        }
        self.slot(tl.pe(), r, k % self.depth, rows, cols, dtype)
    }

    /// The last message received on `ch` is used: its slot is free for
    /// `from` again. Credits go back in batches of `depth / 2` (fewer
    /// control messages; a sender waiting for a slot still gets one, as a
    /// batch is at most `depth`).
    fn consumed(&mut self, tl: &mut Tl<'_>, ch: Channel, from: PeCoord) {
        let r = self.region(ch);
        self.received[r] += 1;
        let (n, _) = self.uncredited[r];
        self.uncredited[r] = (n + 1, Some((from, ch.link())));
        if n + 1 >= (self.depth / 2).max(1) {
            self.flush(tl, r);
        }
    }

    /// Return region `r`'s pending credits to its sender.
    fn flush(&mut self, tl: &mut Tl<'_>, r: usize) {
        if let (n, Some((from, link))) = self.uncredited[r]
            && n > 0
        {
            tl.signal(from, self.credit(link), SignalOp::Add(n));
            self.uncredited[r] = (0, Some((from, link)));
        }
    }

    /// Return every pending credit (at the end of a collective, so the
    /// next one starts with every slot free).
    fn flush_all(&mut self, tl: &mut Tl<'_>) {
        for r in 0..4 {
            self.flush(tl, r);
        }
    }

    /// `out = sum over members of data`, on every member (each member's
    /// shards of `data` and `out`: the same `R` x `C`).
    pub fn all_reduce(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        algorithm: Algorithm,
    ) {
        match algorithm {
            Algorithm::Ring => self.ring(tl, data, out, true, true),
            Algorithm::Tree => self.tree(tl, data, out, true),
        }
        self.flush_all(tl);
    }

    /// Member k's `out` = rows `[k*R/P, (k+1)*R/P)` of the sum over members
    /// of `data` (`data`: `R` x `C` on each member; `out`: that chunk), by
    /// the ring.
    pub fn reduce_scatter(&mut self, tl: &mut Tl<'_>, data: &TensorArg, out: &TensorArg) {
        self.ring(tl, data, out, true, false);
        self.flush_all(tl);
    }

    /// Every member's `out` (`R` x `C`) = the members' `data` stacked in
    /// rank order (member k's `data`: rows `[k*R/P, (k+1)*R/P)`), by the
    /// ring.
    pub fn all_gather(&mut self, tl: &mut Tl<'_>, data: &TensorArg, out: &TensorArg) {
        self.ring(tl, data, out, false, true);
        self.flush_all(tl);
    }

    /// Every member's `out` = member `root`'s `data` (the same shape), down
    /// a binary tree rooted at `root`.
    pub fn broadcast(&mut self, tl: &mut Tl<'_>, data: &TensorArg, out: &TensorArg, root: usize) {
        self.tree_with_root(tl, data, out, false, root);
        self.flush_all(tl);
    }

    /// Send `src` (a block of any memory) on `ch` to `to` by a DMA copy,
    /// once a slot there is free: the bytes need not pass through this
    /// PE's TCM.
    fn send_block(&mut self, tl: &mut Tl<'_>, src: Block, ch: Channel, to: PeCoord) {
        let m = self.sent[ch.link()];
        self.wait_for_slot(tl, ch, m);
        let dst = self.slot(
            to,
            self.region(ch),
            m % self.depth,
            src.rows as u64,
            src.cols as u64,
            src.dtype,
        );
        tl.copy(
            dst,
            src,
            Some(Notify::one(to, self.filled(self.region(ch)))),
        );
        self.sent[ch.link()] = m + 1;
    }

    /// Ring reduce-scatter (`reduce`) and/or all-gather (`gather`),
    /// streamed tile by tile in segments. Messages on the ring go in
    /// (step, tile) order; a member sends up to `depth` ahead of what it
    /// has received. Reduce-scatter step s sends chunk k-s-1 (step 0 by a
    /// copy from the input; later, the sum it just made) and receives
    /// chunk k-s-2, adding its own part: after P-1 steps chunk k is
    /// complete and stored. All-gather step s stores the chunk k-s-1 it
    /// receives and forwards it at the next step by a copy from the
    /// output. A segment bounds the sums held in TCM between steps.
    fn ring(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        reduce: bool,
        gather: bool,
    ) {
        let (p, k, me) = (self.size(), self.rank, tl.pe());
        let dtype = data.dtype;
        let (din, dout) = (Buf { t: data, pe: me }, Buf { t: out, pe: me });
        // The whole buffer's rows: the input's, or (all-gather) the output's.
        let (rows, cols) = if reduce { din.shape() } else { dout.shape() };
        let tile = self.tile_rows(cols, dtype);
        let row_bytes = cols * dtype.size() as u64;
        let (left, right) = (self.member(k + p - 1), self.member(k + 1));
        // Where chunk c's rows are in the input and the output: the
        // reduce-scatter output and the all-gather input hold one chunk.
        let own = chunk(rows, k, p).0;
        let src = |r0: u64, n: u64| din.block(if reduce { r0 } else { r0 - own }, n);
        let dst = |r0: u64, n: u64| dout.block(if gather { r0 } else { r0 - own }, n);
        if p == 1 {
            for r in (0..rows).step_by(tile as usize) {
                let n = tile.min(rows - r);
                tl.copy(dst(r, n), src(r, n), None);
            }
            return;
        }
        // An input in this PE's TCM is an operand where it lies.
        let in_tcm = data.space == kb_format::Space::Tcm;
        // Rows per chunk per segment: the sums held between steps and the
        // input tiles loaded for a step fit half the free TCM.
        let budget = tl.tcm_available() / 2;
        let seg = ((budget / (2 * row_bytes)) / tile * tile).max(tile);
        let longest = (0..p)
            .map(|c| chunk(rows, c, p))
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or(0);
        if gather && !reduce {
            // The own chunk is part of the result.
            let (a, b) = chunk(rows, k, p);
            for r in (a..b).step_by(tile as usize) {
                let n = tile.min(b - r);
                tl.copy(dst(r, n), src(r, n), None);
            }
        }
        let mut s0 = 0;
        while s0 < longest {
            // Piece (c, t): rows of tile t of this segment of chunk c (none
            // past the chunk's end).
            let piece = |c: usize, t: u64| -> (u64, u64) {
                let (a, b) = chunk(rows, c, p);
                let start = (a + s0 + t * tile).min(b);
                let end = (start + tile).min(b).min(a + s0 + seg);
                (start, end - start)
            };
            let ntiles = seg.min(longest - s0).div_ceil(tile);
            // Steps: (reducing, chunk sent, chunk received).
            let steps: Vec<(bool, usize, usize)> = (0..p - 1)
                .filter(|_| reduce)
                .map(|s| (true, (k + 2 * p - s - 1) % p, (k + 2 * p - s - 2) % p))
                .chain(
                    (0..p - 1)
                        .filter(|_| gather)
                        .map(|s| (false, (k + 2 * p - s) % p, (k + 2 * p - s - 1) % p)),
                )
                .collect();
            // Sums made at one step, sent at the next.
            let mut sums: Vec<Option<Pending>> = (0..ntiles).map(|_| None).collect();
            // This step's input tiles, loaded ahead.
            let mut inputs: Vec<Option<LoadHandle>> = (0..ntiles).map(|_| None).collect();
            let total = steps.len() as u64 * ntiles;
            // Sends run at most half the slots ahead of the receives: a
            // credit comes back behind the receiver's own queued sends (a
            // link carries messages in order), so the other half covers
            // its delay.
            let window = (self.depth / 2).max(1).min(ntiles);
            let (mut next_send, mut next_recv) = (0u64, 0u64);
            // Do whatever is ready: send while slots are free (up to
            // `window` ahead of the receives, whose sums the sends carry),
            // receive what has arrived; wait for either only when neither is.
            while next_send < total || next_recv < total {
                let mut progressed = false;
                while next_send < total.min(next_recv + window) {
                    let step = (next_send / ntiles) as usize;
                    let (reducing, c, c_in) = steps[step];
                    let t = next_send % ntiles;
                    let (r0, n) = piece(c, t);
                    if n > 0 && !self.slot_free(tl, Channel::Ring) {
                        break;
                    }
                    // The own part this step's receive of tile t needs,
                    // loaded now: loads and copies share the DMA engines.
                    let (ri, ni) = piece(c_in, t);
                    if reducing && !in_tcm && ni > 0 {
                        inputs[t as usize] = Some(tl.load_async(src(ri, ni)));
                    }
                    if n > 0 {
                        if reducing && step > 0 {
                            let sum = sums[t as usize].take().expect("made at the step before");
                            self.send(tl, &sum, Channel::Ring, right);
                        } else if reducing || !reduce && step == 0 {
                            self.send_block(tl, src(r0, n), Channel::Ring, right);
                        } else {
                            // Stored when it arrived (or completed) here.
                            self.send_block(tl, dst(r0, n), Channel::Ring, right);
                        }
                    }
                    next_send += 1;
                    progressed = true;
                }
                if next_recv < total.min(next_send) {
                    let step = (next_recv / ntiles) as usize;
                    let (reducing, _, c) = steps[step];
                    let t = next_recv % ntiles;
                    let (r0, n) = piece(c, t);
                    if n == 0 {
                        next_recv += 1;
                        continue;
                    }
                    if self.arrived(tl, Channel::Ring) {
                        let slot = self.recv(tl, Channel::Ring, n, cols, dtype);
                        if reducing {
                            let (waited, block);
                            let mine: &dyn Operand = match inputs[t as usize].take() {
                                Some(h) => {
                                    waited = tl.wait(h);
                                    &waited
                                }
                                None => {
                                    block = src(r0, n);
                                    &block
                                }
                            };
                            let sum = tl.add(&slot, mine);
                            if c == k {
                                // Chunk k is complete here.
                                tl.store(dst(r0, n), &sum);
                            } else {
                                sums[t as usize] = Some(sum);
                            }
                        } else {
                            tl.store(dst(r0, n), &slot);
                        }
                        self.consumed(tl, Channel::Ring, left);
                        next_recv += 1;
                        continue;
                    }
                }
                if !progressed {
                    // Nothing is ready: hand back credits, then wait for a
                    // message or a credit.
                    self.flush_all(tl);
                    let (mut any, mut k) = ([(0, 0); 2], 0);
                    if next_recv < total.min(next_send) {
                        let r = self.region(Channel::Ring);
                        any[k] = (self.filled(r), self.received[r] + 1);
                        k += 1;
                    }
                    if next_send < total.min(next_recv + window) {
                        let m = self.sent[Channel::Ring.link()];
                        any[k] = (self.credit(Channel::Ring.link()), m + 1 - self.depth);
                        k += 1;
                    }
                    tl.wait_any(&any[..k]);
                }
            }
            s0 += seg;
        }
    }

    fn tree(&mut self, tl: &mut Tl<'_>, data: &TensorArg, out: &TensorArg, reduce: bool) {
        self.tree_with_root(tl, data, out, reduce, 0)
    }

    /// Tree reduce to `root` (if `reduce`) and broadcast from it, tile by
    /// tile: the broadcast of tile t - lag follows the reduction of tile t,
    /// so both directions stream.
    fn tree_with_root(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        reduce: bool,
        root: usize,
    ) {
        let (p, me) = (self.size(), tl.pe());
        // Ranks relative to the root: the root is 0.
        let v = (self.rank + p - root) % p;
        let abs = |rel: usize| self.member(rel + root);
        let parent = (v > 0).then(|| ((v - 1) / 2, (v - 1) % 2));
        let children: Vec<(usize, usize)> = (0..2)
            .map(|c| (c, 2 * v + 1 + c))
            .filter(|&(_, r)| r < p)
            .collect();
        let dtype = data.dtype;
        let (din, dout) = (Buf { t: data, pe: me }, Buf { t: out, pe: me });
        let (rows, cols) = dout.shape();
        let tile = self.tile_rows(cols, dtype);
        let ntiles = rows.div_ceil(tile);
        let span = |t: u64| (t * tile, tile.min(rows - t * tile));
        let lag = self.depth.saturating_sub(1);
        let down_to: Vec<(usize, PeCoord)> = children.iter().map(|&(c, r)| (c, abs(r))).collect();
        let up = parent.map(|(r, c)| (abs(r), c));
        // Own data, loaded one tile ahead.
        let needs_data = reduce || v == 0;
        let mut next: Option<LoadHandle> = (needs_data && ntiles > 0).then(|| {
            let (r0, n) = span(0);
            tl.load_async(din.block(r0, n))
        });
        let mut bcast = 0u64;
        for t in 0..ntiles {
            let (r0, n) = span(t);
            if needs_data {
                let own = tl.wait(next.take().expect("prefetched"));
                if t + 1 < ntiles {
                    let (r1, n1) = span(t + 1);
                    next = Some(tl.load_async(din.block(r1, n1)));
                }
                // The own tile, then its sums with the children's (each
                // dropped, its TCM freed, as soon as the next is made).
                let mut acc = Acc::Own(own);
                if reduce {
                    for &(c, child) in &down_to {
                        let slot = self.recv(tl, Channel::Up(c), n, cols, dtype);
                        acc = Acc::Sum(tl.add(&slot, acc.operand()));
                        self.consumed(tl, Channel::Up(c), child);
                    }
                }
                let acc = acc.operand();
                match up {
                    Some((to, c)) if reduce => self.send(tl, acc, Channel::Up(c), to),
                    _ => {
                        // The root: the result, stored and sent down.
                        tl.store(dout.block(r0, n), acc);
                        for &(c, child) in &down_to {
                            self.send(tl, acc, Channel::Down(c), child);
                        }
                    }
                }
            }
            if let Some(up) = up
                && (t >= lag || !reduce)
            {
                self.tree_down(tl, &dout, &down_to, up, span(bcast), cols, dtype);
                bcast += 1;
            }
        }
        while let Some(up) = up
            && bcast < ntiles
        {
            self.tree_down(tl, &dout, &down_to, up, span(bcast), cols, dtype);
            bcast += 1;
        }
    }

    /// Receive the next broadcast tile (rows `r0..r0+n` of `dout`) from the
    /// parent `up` (this node is its child `up.1`), store it, forward it to
    /// the children.
    #[allow(clippy::too_many_arguments)]
    fn tree_down(
        &mut self,
        tl: &mut Tl<'_>,
        dout: &Buf<'_>,
        down_to: &[(usize, PeCoord)],
        up: (PeCoord, usize),
        (r0, n): (u64, u64),
        cols: u64,
        dtype: Dtype,
    ) {
        let from_parent = Channel::Down(up.1);
        let slot = self.recv(tl, from_parent, n, cols, dtype);
        tl.store(dout.block(r0, n), &slot);
        for &(c, child) in down_to {
            self.send(tl, &slot, Channel::Down(c), child);
        }
        self.consumed(tl, from_parent, up.0);
    }
}
