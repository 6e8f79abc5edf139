//! The ring: reduce-scatter then all-gather around the members, streamed
//! tile by tile through the receive slots.

use super::{Buf, Channel, Comm, chunk};
use crate::kernel::{Group, LoadHandle, Operand, Pending, Tl};

impl Comm<'_> {
    /// Ring reduce-scatter (`reduce`) and/or all-gather (`gather`),
    /// streamed tile by tile in segments. Messages on the ring go in
    /// (step, tile) order; a member sends up to `depth` ahead of what it
    /// has received. Reduce-scatter step s sends chunk k-s-1 (step 0 by a
    /// copy from the input; later, the sum it just made) and receives
    /// chunk k-s-2, adding its own part: after P-1 steps chunk k is
    /// complete and stored. All-gather step s stores the chunk k-s-1 it
    /// receives and forwards it at the next step by a copy from the
    /// output. A segment bounds the sums held in TCM between steps.
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
        let row_bytes = cols * dtype.size() as u64;
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
        // An input in this PE's TCM is an operand where it lies.
        let in_tcm = din.t.space == kb_format::Space::Tcm;
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
}
