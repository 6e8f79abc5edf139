//! Collectives as library kernels: all-reduce (ring, tree, direct and
//! hierarchical), reduce-scatter, all-gather and broadcast over any
//! [`Group`] of PEs (a cube's PEs, one PE per cube or per SIP, every PE),
//! written only with the public kernel API: loads and PE-to-PE copies
//! ([`Tl::put`], [`Tl::copy`]), signals that count what arrived and what
//! was consumed, and recorded math ops for the reductions (so kb-replay
//! recomputes and verifies them).
//!
//! Data: each member's buffer is its shard of a tensor (`R` x `C`, in HBM,
//! SRAM or TCM). Chunk `c` of `P` is rows `[c*R/P, (c+1)*R/P)` (the split
//! of [`Placement::over`] with `RowWise`).
//!
//! Algorithms ([`Algorithm`]; [`Algorithm::Auto`] picks by the group's
//! shape, see [`Algorithm::resolve`]):
//!
//! - **Direct** (`direct.rs`), for PEs that share a memory system (a
//!   cube): reduce-scatter by pulling, member `k` loads chunk `k` of every
//!   member's buffer and sums it; all-gather by pushing, member `k` copies
//!   its reduced chunk into every member's output. Two steps, each
//!   member's link carrying its buffer once each way, no HBM round trip
//!   between steps.
//! - **Hierarchical** (`hier.rs`), for groups that span cubes: direct
//!   reduce-scatter inside each cube, a ring all-reduce of each chunk
//!   across the cubes (one ring per cube rank, alternate rings running in
//!   opposite directions so both directions of every link carry data),
//!   direct all-gather inside each cube.
//! - **Ring** (`ring.rs`): reduce-scatter then all-gather around the
//!   group, each member sending and receiving `2 (P-1)/P` of the buffer.
//! - **Tree** (`tree.rs`): reduce up a binary tree, broadcast down it,
//!   both streaming at once; the tree halves the members' order (the
//!   machine's, for the groups kernels make), so its subtrees stay inside
//!   SIPs and cubes.
//!
//! Flow control (ring and tree): every (sender, receiver) pair of a
//! pattern (ring: to the right neighbour; tree: to the parent, to each
//! child) is a channel with `depth` slots in the receiver's TCM. A copy
//! into slot `m mod depth` raises the receiver's "filled" signal on
//! arrival; the receiver waits for it, uses the slot, then raises the
//! sender's "credit" signal (in batches of `depth / 2`, flushed before any
//! wait for a credit); the sender waits for credit `m - depth + 1` before
//! reusing a slot. So every slot is reused only after it was read, which
//! the race detector checks. The direct steps need no slots: a "ready"
//! signal from every member says its buffer may be read (and its output
//! written), and each copy into an output raises its owner's "gathered"
//! signal on arrival.
//!
//! Host side: [`slots`] declares the receive slots; each kernel makes a
//! [`Comm`] over the group and calls the collectives in the same order on
//! every member (a `Comm` keeps its channels' message counts, so several
//! collectives may follow each other in one launch).

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

mod direct;
mod hier;
mod ring;
mod tree;

use kb_format::{Addr, Dtype};

use direct::Steps;

use crate::kernel::{Block, Group, Notify, Operand, SignalOp, TensorArg, Tl};
use crate::machine::{Machine, NodeKind, PeCoord};
use crate::runtime::{Placement, Policy};
use crate::workload::{Program, TensorId, WorkloadError};

/// How an all-reduce moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around a ring: each member sends
    /// and receives 2 (P-1)/P of the buffer, bandwidth-optimal on a ring
    /// of links.
    Ring,
    /// Reduce up a binary tree to rank 0, then broadcast down it:
    /// 2 log2(P) steps of latency, each tree edge carrying the whole
    /// buffer each way; subtrees are ranges of the members' order.
    Tree,
    /// Pull-reduce-scatter then push-all-gather: every member reads its
    /// chunk of every buffer and writes its reduced chunk into every
    /// output. Two steps; for members that share a memory system (a cube).
    Direct,
    /// Direct reduce-scatter inside each cube, ring all-reduce of each
    /// chunk across the cubes, direct all-gather inside each cube: for
    /// groups that span cubes with the same number of members in each.
    Hierarchical,
    /// Chosen from the group's shape by [`Algorithm::resolve`].
    Auto,
}

impl Algorithm {
    /// The algorithm named `ring`, `tree`, `direct`, `hierarchical` or
    /// `auto`.
    pub fn parse(s: &str) -> Option<Algorithm> {
        match s {
            "ring" => Some(Algorithm::Ring),
            "tree" => Some(Algorithm::Tree),
            "direct" => Some(Algorithm::Direct),
            "hierarchical" => Some(Algorithm::Hierarchical),
            "auto" => Some(Algorithm::Auto),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Direct => "direct",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Auto => "auto",
        }
    }

    /// The algorithm `Auto` runs on `group`, for buffers other members
    /// can address (`peers_reach`, see [`TensorArg::peers_reach`]; not
    /// so: `Ring`): `Direct` when every member is in one cube (they share
    /// its HBM and NoC), `Hierarchical` when the group spans cubes with
    /// the same number (two or more) of members in each, `Ring` otherwise
    /// (one member per cube or SIP, or uneven cubes). Any other algorithm
    /// is itself.
    pub fn resolve(self, group: &[PeCoord], peers_reach: bool) -> Algorithm {
        if self != Algorithm::Auto {
            return self;
        }
        if !peers_reach {
            return Algorithm::Ring;
        }
        let Some(&first) = group.first() else {
            return Algorithm::Ring;
        };
        let same_cube = |a: &PeCoord, b: &PeCoord| (a.sip, a.cube) == (b.sip, b.cube);
        if group.iter().all(|p| same_cube(p, &first)) {
            return Algorithm::Direct;
        }
        match hier::cube_sizes(group) {
            Some(n) if n >= 2 => Algorithm::Hierarchical,
            _ => Algorithm::Ring,
        }
    }
}

/// Receive regions a member has for `algorithms`: the ring's one (from
/// the left neighbour; the hierarchical all-reduce's ring across cubes
/// uses it too, and `Auto` may pick either) and/or the tree's three (from
/// each child, from the parent). Broadcast runs down the tree; the direct
/// steps need none.
fn regions(algorithms: &[Algorithm]) -> u64 {
    let ring = algorithms.iter().any(|a| {
        matches!(
            a,
            Algorithm::Ring | Algorithm::Hierarchical | Algorithm::Auto
        )
    });
    ring as u64 + 3 * algorithms.contains(&Algorithm::Tree) as u64
}

/// Signals a [`Comm`] uses from its first: 4 "filled" (one per region),
/// 4 "credit" (one per outgoing channel), "ready" and "gathered" (the
/// direct steps).
pub const SIGNALS: u32 = 10;

/// Declare the receive slots collectives over `group` need: `depth` slots
/// of `slot_bytes` per channel in each member's TCM, for the channels of
/// `algorithms` (the ring, hierarchical and auto have one, the tree
/// three: broadcast runs down the tree; direct needs none, but a slot
/// still sets its messages' size), as a `dtype` tensor of `slot_bytes`-long rows. Pass it to
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
        [(regions(algorithms) * depth.max(1) as u64).max(1), elems],
        Placement::over(group, Policy::Replicate).in_tcm(),
    )
}

/// Slots per channel (`depth`) that keep collectives of `algorithms` over
/// `group` streaming with `slot_bytes` messages on `machine`: what a
/// workload's `depth=auto` gives.
///
/// The ring (also run by `Hierarchical` and `Auto`) needs, per stream,
/// `burst` messages on each hop at once to cover the hop's
/// bandwidth-delay product: the uncontended time of one slot-sized
/// message from a member's DMA engine to its ring neighbour's TCM, plus
/// its credit's way back and both pe_cpus' handling, times the slowest
/// link's bandwidth on the way, in slots (at least 2). An all-reduce runs
/// two streams and keeps as many slots again for the credits in flight:
/// `4 * burst`, for the worst pair of neighbours in the group's order.
/// The tree streams one tile per edge at a time and keeps 4. The depth is
/// capped so the slots take at most a quarter of a PE's TCM, leaving the
/// kernels' tiles room (and is at least 3).
pub fn depth_for(
    machine: &Machine,
    group: &[PeCoord],
    slot_bytes: u64,
    algorithms: &[Algorithm],
) -> u32 {
    let regions = regions(algorithms);
    let ring = regions % 3 == 1;
    if !ring {
        return 4;
    }
    let slot = slot_bytes.max(1);
    let handle = crate::event::ns_to_ps(machine.topo.cpu.handle_ns.0);
    let mut burst = 2u64;
    for (i, &a) in group.iter().enumerate() {
        let b = group[(i + 1) % group.len()];
        if a == b {
            continue;
        }
        let there = machine.route(
            machine.pe_node(a, NodeKind::PeDma),
            machine.pe_node(b, NodeKind::Tcm),
        );
        let back = machine.route(
            machine.pe_node(b, NodeKind::PeCpu),
            machine.pe_node(a, NodeKind::PeCpu),
        );
        let rtt_ps = machine.uncontended_ps(&there, slot)
            + machine.uncontended_ps(&back, crate::engine::CONTROL_BYTES)
            + 2 * handle;
        let gbs = there
            .iter()
            .map(|&l| machine.links[l as usize].bw_gbs)
            .fold(f64::INFINITY, f64::min);
        // GB/s = bytes per ns.
        let bdp = gbs * rtt_ps as f64 / 1000.0;
        burst = burst.max((bdp / slot as f64).ceil() as u64);
    }
    let tcm = (machine.topo.tcm.size_kib.0 * 1024.0) as u64;
    let cap = tcm / 4 / (regions.max(1) * slot);
    (4 * burst).min(cap).max(3).min(u32::MAX as u64) as u32
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
    /// Regions of the slots: 0 (the direct steps need none), 1 (ring), 3
    /// (tree) or 4 (both).
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
    /// The buffers are ready at the launch: the first collective's direct
    /// steps skip their handshake ([`Comm::ready_at_launch`]).
    launch_ready: bool,
    /// The next collective's outputs are read only after the launch: its
    /// direct all-gather skips "gathered" ([`Comm::read_after_launch`]).
    read_after: bool,
    /// "ready" and "gathered" updates this PE has waited for so far.
    ready_seen: u64,
    gathered_seen: u64,
    /// The members the ring region's channel has run over (the group, or
    /// this PE's ring across cubes): one `Comm` keeps one ring.
    ring_members: Option<Vec<PeCoord>>,
}

/// Rows `row0 .. row0 + rows` of a member's shard of a tensor.
#[derive(Clone, Copy)]
struct Buf<'t> {
    t: &'t TensorArg,
    pe: PeCoord,
    row0: u64,
    rows: u64,
    cols: u64,
}

impl<'t> Buf<'t> {
    /// `pe`'s whole shard of `t`: no rows if it has none (a chunk of a
    /// split with more members than rows).
    fn whole(t: &'t TensorArg, pe: PeCoord) -> Buf<'t> {
        let (rows, cols) = t
            .shard(pe)
            .map_or((0, t.shape[1]), |s| (s.rows, s.row_bytes / t.elem_bytes()));
        Buf {
            t,
            pe,
            row0: 0,
            rows,
            cols,
        }
    }

    fn shape(&self) -> (u64, u64) {
        (self.rows, self.cols)
    }

    /// Rows `a .. a + n` of this buffer.
    fn sub(self, a: u64, n: u64) -> Buf<'t> {
        assert!(
            a + n <= self.rows,
            "collective: rows {a}..+{n} outside the buffer"
        );
        Buf {
            row0: self.row0 + a,
            rows: n,
            ..self
        }
    }

    /// The same rows of `pe`'s shard (every member's shard has the same
    /// shape).
    fn on(self, pe: PeCoord) -> Buf<'t> {
        let whole = Buf::whole(self.t, pe);
        assert!(
            whole.shape() == Buf::whole(self.t, self.pe).shape(),
            "collective: {}'s shards on {pe} and {} differ in shape",
            self.t.name,
            self.pe
        );
        Buf { pe, ..self }
    }

    fn block(&self, row: u64, rows: u64) -> Block {
        let s = self
            .t
            .shard(self.pe)
            .unwrap_or_else(|| panic!("collective: {} has no shard on {}", self.t.name, self.pe));
        Block::in_shard(self.t, s, self.row0 + row, 0, rows as u32, self.cols as u32)
    }

    /// Whether `other` is the same bytes.
    fn same(&self, other: &Buf<'_>) -> bool {
        std::ptr::eq(self.t, other.t)
            && (self.pe, self.row0, self.rows) == (other.pe, other.row0, other.rows)
    }
}

/// A reduction's running value (direct steps, tree): its first part, a
/// loaded tile or a block where it lies, then sums; no box per tile.
enum Partial {
    Tile(crate::kernel::Tile),
    Block(Block),
    Sum(crate::kernel::Pending),
}

impl Partial {
    fn operand(&self) -> &dyn Operand {
        match self {
            Partial::Tile(t) => t,
            Partial::Block(b) => b,
            Partial::Sum(s) => s,
        }
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
        // One row alone: slots for the direct steps, which need none.
        let regions = if slots.shape[0] == 1 && depth > 1 {
            0
        } else {
            slots.shape[0] / depth
        };
        assert!(
            slots.shape[0] == 1
                || slots.shape[0].is_multiple_of(depth) && matches!(regions, 1 | 3 | 4),
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
            launch_ready: false,
            read_after: false,
            ready_seen: 0,
            gathered_seen: 0,
            ring_members: None,
        }
    }

    /// Drop one synchronization on purpose: use each received slot without
    /// waiting for the copy that fills it to arrive, and (direct steps)
    /// read the members' buffers without waiting for them to be ready.
    /// The result is wrong whenever the slot is read first (or a buffer
    /// before its producer wrote it), and `kb-sim` reports each such read
    /// as a data race naming the two ops (what
    /// `tp_mlp -p sync=0` demonstrates). Never use it for results.
    pub fn without_arrival_waits(mut self) -> Self {
        self.unsynchronized = true;
        self
    }

    /// Every member's buffers were written before this launch (by the host,
    /// or an earlier launch) and no member touches them before its first
    /// collective: that collective's direct steps skip their "ready"
    /// handshake (the launch already orders those writes before every
    /// kernel; a collective after it still exchanges "ready"). A buffer a
    /// kernel writes first and then reduces needs the handshake: the race
    /// detector reports the pull that did not wait for it.
    pub fn ready_at_launch(mut self) -> Self {
        self.launch_ready = true;
        self
    }

    /// No member reads the outputs of its next collective before this
    /// launch ends (the host, or a later launch, reads them): that
    /// collective's direct all-gather pushes without notifications and
    /// does not wait for the other members' pushes. Each kernel ends only
    /// once its copies have landed, and the launch's end orders every
    /// kernel's end before what follows it, so the outputs are complete
    /// there; a read inside the kernel would be a race, which `kb-sim`
    /// reports. Applies to one collective, like [`Comm::ready_at_launch`].
    pub fn read_after_launch(mut self) -> Self {
        self.read_after = true;
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

    fn filled(&self, region: usize) -> u32 {
        self.first_signal + region as u32
    }

    fn credit(&self, link: usize) -> u32 {
        self.first_signal + 4 + link as u32
    }

    /// Raised by each member when its buffer may be read (direct steps).
    fn ready(&self) -> u32 {
        self.first_signal + 8
    }

    /// Raised by each copy into this PE's output (direct steps).
    fn gathered(&self) -> u32 {
        self.first_signal + 9
    }

    /// The receiver's region for `ch`; panics if the slots have none.
    fn region(&self, ch: Channel) -> usize {
        let (ring, tree) = match self.regions {
            0 => (false, false),
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

    /// The end of a collective: every pending credit goes back (the next
    /// one starts with every slot free), and what [`Comm::ready_at_launch`]
    /// and [`Comm::read_after_launch`] said held for this one only.
    fn finish(&mut self, tl: &mut Tl<'_>) {
        self.flush_all(tl);
        self.launch_ready = false;
        self.read_after = false;
    }

    /// Return every pending credit (at the end of a collective, so the
    /// next one starts with every slot free).
    fn flush_all(&mut self, tl: &mut Tl<'_>) {
        for r in 0..4 {
            self.flush(tl, r);
        }
    }

    /// `out = sum over members of data`, on every member (each member's
    /// shards of `data` and `out`: the same `R` x `C`; they may be the
    /// same tensor).
    pub fn all_reduce(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        algorithm: Algorithm,
    ) {
        let me = tl.pe();
        let (din, dout) = (Buf::whole(data, me), Buf::whole(out, me));
        assert!(
            din.shape() == dout.shape(),
            "collective: all_reduce needs {} and {} of one shape on {me}",
            data.name,
            out.name
        );
        match self.resolve(algorithm, data, out) {
            Algorithm::Ring => {
                let group = self.group.clone();
                self.ring(tl, &group, self.rank, din, dout, true, true)
            }
            Algorithm::Tree => self.tree(tl, data, out, true),
            Algorithm::Direct => {
                let group = self.group.clone();
                self.direct(tl, &group, self.rank, din, dout, Steps::ALL_REDUCE)
            }
            _ => self.hierarchical(tl, din, dout),
        }
        self.finish(tl);
    }

    /// Member k's `out` = rows `[k*R/P, (k+1)*R/P)` of the sum over members
    /// of `data` (`data`: `R` x `C` on each member; `out`: that chunk), by
    /// `algorithm`: `Ring`, or `Direct` (`Auto` picks `Direct` inside a
    /// cube, else `Ring`).
    pub fn reduce_scatter(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        algorithm: Algorithm,
    ) {
        self.one_level(tl, (data, out), algorithm, Steps::REDUCE_SCATTER);
    }

    /// Every member's `out` (`R` x `C`) = the members' `data` stacked in
    /// rank order (member k's `data`: rows `[k*R/P, (k+1)*R/P)`), by
    /// `algorithm`: `Ring` or `Direct` (`Auto` as for
    /// [`Comm::reduce_scatter`]).
    pub fn all_gather(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        algorithm: Algorithm,
    ) {
        self.one_level(tl, (data, out), algorithm, Steps::ALL_GATHER);
    }

    /// The algorithm to run on `data` and `out`: `algorithm` resolved,
    /// refusing the direct steps (which read and write other members'
    /// buffers) where members cannot address each other's.
    fn resolve(&self, algorithm: Algorithm, data: &TensorArg, out: &TensorArg) -> Algorithm {
        let reach = data.peers_reach && out.peers_reach;
        let a = algorithm.resolve(self.group.pes(), reach);
        assert!(
            reach || !matches!(a, Algorithm::Direct | Algorithm::Hierarchical),
            "collective: {} reads and writes other members' buffers, which they cannot address ({} and {} are in HBM under the LA model); use ring or tree",
            a.name(),
            data.name,
            out.name
        );
        a
    }

    /// Reduce-scatter or all-gather (`steps`), by ring or direct.
    fn one_level(
        &mut self,
        tl: &mut Tl<'_>,
        (data, out): (&TensorArg, &TensorArg),
        algorithm: Algorithm,
        steps: Steps,
    ) {
        let me = tl.pe();
        let (din, dout) = (Buf::whole(data, me), Buf::whole(out, me));
        let group = self.group.clone();
        match self.resolve(algorithm, data, out) {
            Algorithm::Direct => self.direct(tl, &group, self.rank, din, dout, steps),
            Algorithm::Ring | Algorithm::Hierarchical => {
                self.ring(tl, &group, self.rank, din, dout, steps.reduce, steps.gather)
            }
            other => panic!(
                "collective: {} runs by ring or direct, not {}",
                if steps.reduce {
                    "reduce_scatter"
                } else {
                    "all_gather"
                },
                other.name()
            ),
        }
        self.finish(tl);
    }

    /// Every member's `out` = member `root`'s `data` (the same shape), down
    /// a binary tree rooted at `root`.
    pub fn broadcast(&mut self, tl: &mut Tl<'_>, data: &TensorArg, out: &TensorArg, root: usize) {
        self.tree_with_root(tl, data, out, false, root);
        self.finish(tl);
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
}

#[cfg(test)]
mod tests {
    use super::{Algorithm, depth_for};
    use crate::machine::{Machine, PeCoord};
    use crate::topology::Topology;

    fn cube0(m: &Machine) -> Vec<PeCoord> {
        m.pes().filter(|p| p.sip == 0 && p.cube == 0).collect()
    }

    /// On `default`, a neighbour's slot is pe_dma -> noc -> pe_dma -> tcm
    /// (noc_pe 5 ns at 256 GB/s twice, tcm_port 1 ns at 1024 GB/s, 2 ns
    /// first flit per intermediate node) and the credit pe_cpu -> pe_dma
    /// -> noc -> pe_dma -> pe_cpu (64 bytes; pe_internal 1 ns at 64
    /// GB/s), each pe_cpu handling it in 50 ns. For 16 KiB slots: the
    /// slot's tail leaves the second noc_pe link at 7 + 64 + 5 = 76 ns and
    /// lands at 77 ns; the credit takes 19 ns; the round trip is 77 + 19 +
    /// 100 = 196 ns, 196 x 256 = 50,176 bytes in flight: 3.06 slots, so a
    /// burst of 4 and a depth of 16 (the cap, a quarter of 1 MiB of TCM in
    /// 16 KiB slots, is 16 too). 32 KiB slots: 260 ns, 66,560 bytes, 2.03
    /// slots, burst 3, 12 capped to 8 (256 KiB / 32 KiB).
    #[test]
    fn the_ring_depth_covers_the_hops_bandwidth_delay_product() {
        let m = Machine::build(&Topology::load("default").unwrap());
        let cube = cube0(&m);
        assert_eq!(depth_for(&m, &cube, 16 << 10, &[Algorithm::Ring]), 16);
        assert_eq!(depth_for(&m, &cube, 32 << 10, &[Algorithm::Ring]), 8);
        assert_eq!(depth_for(&m, &cube, 32 << 10, &[Algorithm::Auto]), 8);
        // The tree keeps 4; direct needs no slots.
        assert_eq!(depth_for(&m, &cube, 16 << 10, &[Algorithm::Tree]), 4);
        assert_eq!(depth_for(&m, &cube, 16 << 10, &[Algorithm::Direct]), 4);
        // Across SIPs (a 200 ns, 100 GB/s link on the way) a 4 KiB slot
        // needs more in flight than inside a cube.
        let large = Machine::build(&Topology::load("large").unwrap());
        let sips: Vec<PeCoord> = large.pes().filter(|p| p.cube == 0 && p.pe == 0).collect();
        let within = depth_for(&large, &cube0(&large), 4 << 10, &[Algorithm::Ring]);
        let across = depth_for(&large, &sips, 4 << 10, &[Algorithm::Ring]);
        assert!(across > within, "{across} <= {within}");
    }
}
