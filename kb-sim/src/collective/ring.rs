//! The ring: reduce-scatter then all-gather around the members, streamed
//! tile by tile through the receive slots, each message forwarded from
//! the slot it arrived in.

use std::collections::VecDeque;

use super::{Buf, Channel, Comm, chunk};
use crate::kernel::{Group, LoadHandle, Operand, Tl};

/// One message of a member's sequence: step `step` (reduce-scatter steps
/// first, then all-gather steps) of tile `tile` of segment `seg`.
#[derive(Debug, Clone, Copy)]
struct Msg {
    seg: u64,
    step: usize,
    tile: u64,
}

/// Segments an all-reduce needs before it runs two streams (the second
/// stream's lag of P-1 steps is paid once).
const MIN_OVERLAP_SEGMENTS: u64 = 4;

impl Comm<'_> {
    /// Ring reduce-scatter (`reduce`) and/or all-gather (`gather`).
    ///
    /// Every chunk is cut into segments of `burst` tiles. A member's
    /// messages go in (segment, step, tile) order, and the message of step
    /// `s + 1` of a tile is the one of step `s` it received, passed on as
    /// soon as it arrives: reduce-scatter adds its own part and sends the
    /// sum (step 0 sends its input); the last reduce-scatter step leaves
    /// chunk `k` complete here, stored and sent as all-gather step 0;
    /// all-gather stores each chunk it receives and copies it from the
    /// slot to the next member's slot. So no step waits for a whole chunk,
    /// nothing goes through HBM between steps, and `burst` tiles travel
    /// each hop at once. Only step 0's messages (no data to wait for) may
    /// run ahead, into the next segment. An all-reduce of buffers in HBM
    /// interleaves two such streams of segments, bursts alternating, the
    /// second a phase behind (see below).
    ///
    /// The distance between a message received and the one it becomes
    /// (`hop`: the streams times `burst`) is below the channel's `depth`,
    /// so a member holding a slot while it waits for a free slot
    /// downstream never closes a cycle: the slot it waits for holds an
    /// earlier message, whose receiver needs nothing later to pass it on.
    ///
    /// The ring runs over `g` (this PE its member `k`): the group, or a
    /// ring across cubes of the hierarchical all-reduce. `din` and `dout`
    /// may be the same rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ring(
        &mut self,
        tl: &mut Tl<'_>,
        g: &Group,
        k: usize,
        din: Buf<'_>,
        dout: Buf<'_>,
        reduce: bool,
        gather: bool,
    ) {
        let p = g.len();
        match &self.ring_members {
            Some(m) => assert!(
                m == g.pes(),
                "collective: one Comm runs its ring over one set of members (make another Comm, with its own slots and signals, for a second ring)"
            ),
            None => self.ring_members = Some(g.pes().to_vec()),
        }
        let member = |i: usize| g.pes()[i % p];
        let dtype = din.t.dtype;
        // The whole buffer's rows: the input's, or (all-gather) the output's.
        let (rows, cols) = if reduce { din.shape() } else { dout.shape() };
        let tile = self.tile_rows(cols, dtype);
        let (left, right) = (member(k + p - 1), member(k + 1));
        // Where chunk c's rows are in the input and the output: the
        // reduce-scatter output and the all-gather input hold one chunk.
        let own = chunk(rows, k, p).0;
        let src = |r0: u64, n: u64| din.block(if reduce { r0 } else { r0 - own }, n);
        let dst = |r0: u64, n: u64| dout.block(if gather { r0 } else { r0 - own }, n);
        if p == 1 {
            if din.same(&dout) {
                return;
            }
            for r in (0..rows).step_by(tile as usize) {
                let n = tile.min(rows - r);
                tl.copy(dst(r, n), src(r, n), None);
            }
            return;
        }
        if gather && !reduce {
            // The own chunk is part of the result.
            let (a, b) = chunk(rows, k, p);
            for r in (a..b).step_by(tile as usize) {
                let n = tile.min(b - r);
                tl.copy(dst(r, n), src(r, n), None);
            }
        }
        // An input in this PE's TCM is an operand where it lies.
        let in_tcm = din.t.space == kb_format::Space::Tcm;
        let rs_steps = if reduce { p - 1 } else { 0 };
        let steps = rs_steps + if gather { p - 1 } else { 0 };
        // An all-reduce of buffers in HBM runs two streams of segments, the
        // second one phase (P-1 steps) behind: while one reduce-scatters
        // (its link carries receives and own-input loads in, sends out),
        // the other all-gathers (receives in, stores and forwards out), so
        // both directions of every member's link stay busy. In TCM both
        // phases load the link alike, and with few segments the lag costs
        // more than the overlap gains: one stream.
        let longest = (0..p)
            .map(|c| chunk(rows, c, p))
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or(0);
        let on_chip = din.t.space == kb_format::Space::Tcm && dout.t.space == kb_format::Space::Tcm;
        let overlap = reduce
            && gather
            && !on_chip
            && self.depth > 2
            && longest.div_ceil(self.burst(2) * tile) >= MIN_OVERLAP_SEGMENTS;
        let streams: u64 = if overlap { 2 } else { 1 };
        let burst = self.burst(streams);
        // Messages between one a member receives and the one it becomes.
        let hop = streams * burst;
        let seg_rows = burst * tile;
        let segs = longest.div_ceil(seg_rows);
        // Stream s runs segments s, s + streams, ..., after s * (P-1)
        // empty steps; both streams are padded to the same length.
        let lag = |st: u64| st * (p as u64 - 1);
        let stream_steps = (0..streams)
            .map(|st| lag(st) + segs.saturating_sub(st).div_ceil(streams) * steps as u64)
            .max()
            .unwrap_or(0);
        let total = stream_steps * hop;
        // Message m: tile m % burst of a step of stream (m / burst) %
        // streams; None for padding.
        let msg = |m: u64| -> Option<Msg> {
            let (b, tile) = (m / burst, m % burst);
            let (st, v) = (b % streams, b / streams);
            let v = v.checked_sub(lag(st))?;
            let seg = (v / steps as u64) * streams + st;
            (seg < segs).then_some(Msg {
                seg,
                step: (v % steps as u64) as usize,
                tile,
            })
        };
        // The chunk member j's message carries: reduce-scatter step s
        // sends chunk j-s-1, all-gather step s chunk j-s. What this member
        // receives is its left neighbour's (j = k-1), and the message it
        // becomes carries the same chunk.
        let chunk_of = |x: Msg, j: usize| {
            if x.step < rs_steps {
                (j + 2 * p - x.step - 1) % p
            } else {
                (j + 2 * p - (x.step - rs_steps)) % p
            }
        };
        // Rows of member j's message `m`: its tile of its segment of its
        // chunk (none past the chunk's end, none for padding).
        let piece_of = |m: u64, j: usize| -> (u64, u64) {
            let Some(x) = msg(m) else { return (0, 0) };
            let (a, b) = chunk(rows, chunk_of(x, j), p);
            let start = (a + x.seg * seg_rows + x.tile * tile).min(b);
            (start, (start + tile).min(b) - start)
        };
        let sent = |m: u64| piece_of(m, k);
        let received = |m: u64| piece_of(m, k + p - 1);
        // Step 0's messages carry this member's own data: nothing to wait
        // for. Every other message passes on the one received `hop` before.
        let free = |m: u64| msg(m).is_some_and(|x| x.step == 0);
        // The own parts received reduce-scatter messages are added to,
        // loaded ahead in receive order: `hop` of them (what arrives before
        // the first of them is passed on), as many as fit half the free TCM.
        let tile_bytes = tile * cols * dtype.size() as u64;
        let ahead = hop.min(tl.tcm_available() / 2 / tile_bytes).max(1);
        let mut inputs: VecDeque<Option<LoadHandle>> = VecDeque::new();
        let mut next_load = 0u64;
        let (mut next_send, mut next_recv) = (0u64, 0u64);
        while next_send < total || next_recv < total {
            let mut progressed = false;
            // Load ahead the own parts of the next receives.
            while next_load < total.min(next_recv + ahead) {
                let (r0, n) = received(next_load);
                let reducing = msg(next_load).is_some_and(|x| x.step < rs_steps);
                let load = reducing && !in_tcm && n > 0;
                inputs.push_back(load.then(|| tl.load_async(src(r0, n))));
                next_load += 1;
            }
            // Send what needs no receive, while slots are free; pass over
            // empty messages whose receive is done.
            while next_send < total {
                let (r0, n) = sent(next_send);
                if free(next_send) {
                    if n > 0 && !self.slot_free(tl, Channel::Ring) {
                        break;
                    }
                    if n > 0 {
                        self.send_block(tl, src(r0, n), Channel::Ring, right);
                    }
                } else if n > 0 || msg(next_send).is_some() && next_send >= next_recv + hop {
                    // Waits for its receive; padding never does.
                    break;
                }
                next_send += 1;
                progressed = true;
            }
            if next_recv < total {
                let m = next_recv;
                let (r0, n) = received(m);
                if n == 0 {
                    inputs.pop_front();
                    next_recv += 1;
                    continue;
                }
                if self.arrived(tl, Channel::Ring) {
                    let x = msg(m).expect("a message with rows");
                    let input = inputs.pop_front().expect("loaded ahead");
                    let slot = self.recv(tl, Channel::Ring, n, cols, dtype);
                    // The message this one becomes, if any: every earlier
                    // message goes first.
                    let onward = (x.step + 1 < steps).then_some(m + hop);
                    while next_send < onward.unwrap_or(0) {
                        let (r, n) = sent(next_send);
                        if n > 0 {
                            assert!(free(next_send), "collective: ring message out of order");
                            // Waits for its slot.
                            self.send_block(tl, src(r, n), Channel::Ring, right);
                        }
                        next_send += 1;
                    }
                    if x.step < rs_steps {
                        let (waited, block);
                        let mine: &dyn Operand = match input {
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
                        if x.step + 1 == rs_steps {
                            // Chunk k is complete here.
                            tl.store(dst(r0, n), &sum);
                        }
                        if onward.is_some() {
                            self.send(tl, &sum, Channel::Ring, right);
                        }
                    } else {
                        tl.store(dst(r0, n), &slot);
                        if onward.is_some() {
                            self.send_block(tl, slot, Channel::Ring, right);
                        }
                    }
                    if onward.is_some() {
                        next_send += 1;
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
                let (mut any, mut n) = ([(0, 0); 2], 0);
                if next_recv < total {
                    let r = self.region(Channel::Ring);
                    any[n] = (self.filled(r), self.received[r] + 1);
                    n += 1;
                }
                if next_send < total && free(next_send) {
                    // Not sent for want of a slot: m >= depth.
                    let m = self.sent[Channel::Ring.link()];
                    any[n] = (
                        self.credit(Channel::Ring.link()),
                        (m + 1).saturating_sub(self.depth),
                    );
                    n += 1;
                }
                tl.wait_any(&any[..n]);
            }
        }
    }

    /// Tiles a ring segment sends per step (`burst` above), with
    /// `streams` streams: `streams * burst` is below the channel's depth,
    /// so a member waiting for a free slot downstream while it holds one
    /// never closes a cycle.
    fn burst(&self, streams: u64) -> u64 {
        assert!(
            self.depth > streams,
            "collective: the ring passes each message on from its slot, so it needs more than {streams} slots per channel (depth {})",
            self.depth
        );
        (self.depth / (2 * streams)).max(1)
    }
}
