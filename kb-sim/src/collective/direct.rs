//! The direct steps, for members that share a memory system (a cube's
//! PEs and its HBM): reduce-scatter by pulling (member `k` loads chunk `k`
//! of every member's buffer and sums it) and all-gather by pushing (member
//! `k` copies its chunk into every member's output). Each member's NoC
//! link carries its buffer once inbound (the pulls) and once outbound (the
//! pushes), and nothing makes a round trip through HBM between the steps.

use super::{Buf, Comm, Partial, chunk};
use crate::kernel::{Group, LoadHandle, Notify, Operand, SignalOp, Tl};

/// Which direct steps to run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Steps {
    /// Pull and sum this member's chunk of every member's buffer.
    pub reduce: bool,
    /// Push this member's chunk into every member's output.
    pub gather: bool,
    /// Exchange "ready" first: every member's buffer may be read, and its
    /// output written, only once it says so (its kernel may have just
    /// written the buffer, or still be reading an earlier output).
    pub handshake: bool,
}

impl Steps {
    pub(super) const ALL_REDUCE: Steps = Steps {
        reduce: true,
        gather: true,
        handshake: true,
    };
    pub(super) const REDUCE_SCATTER: Steps = Steps {
        reduce: true,
        gather: false,
        handshake: true,
    };
    pub(super) const ALL_GATHER: Steps = Steps {
        reduce: false,
        gather: true,
        handshake: true,
    };
}

impl Comm<'_> {
    /// Direct reduce-scatter and/or all-gather over `g` (this PE its
    /// member `k`). Reducing, `din` is the whole buffer (`R` rows, on every
    /// member) and member k sums chunk k of it: into the same rows of
    /// every member's `dout` (gathering too: an all-reduce) or into its
    /// own `dout` (the chunk's rows). Only gathering, `din` is this
    /// member's chunk and goes into chunk k's rows of every member's
    /// `dout`.
    pub(super) fn direct(
        &mut self,
        tl: &mut Tl<'_>,
        g: &Group,
        k: usize,
        din: Buf<'_>,
        dout: Buf<'_>,
        steps: Steps,
    ) {
        let p = g.len();
        let member = |i: usize| g.pes()[(k + i) % p];
        let (rows, cols) = if steps.reduce {
            din.shape()
        } else {
            dout.shape()
        };
        let (a, b) = chunk(rows, k, p);
        let dtype = din.t.dtype;
        // Without arrival waits (broken on purpose), pulls do not wait for
        // the members' buffers either.
        if steps.handshake && p > 1 && !self.unsynchronized && !self.launch_ready {
            for i in 1..p {
                tl.signal(member(i), self.ready(), SignalOp::Add(1));
            }
            self.ready_seen += p as u64 - 1;
            tl.wait_signal(self.ready(), self.ready_seen);
        }
        // Messages of a slot's size, as many tiles as fit a share of the
        // free TCM: this tile's parts and the next's, and the sum.
        let row_bytes = cols * dtype.size() as u64;
        let live = if steps.reduce { 2 * p as u64 + 2 } else { 3 };
        let slot = self.slots.shape[1] * self.slots.elem_bytes();
        let fit = slot.min(tl.tcm_available() / live) / row_bytes;
        assert!(
            fit > 0 || tl.tcm_available() / live >= row_bytes,
            "collective: a {cols}-element row does not fit this PE's free TCM {live} times over"
        );
        // As few tiles as fit, of equal size (no short last one to wait
        // for alone). More, smaller tiles measured slower: each costs its
        // pulls', adds' and pushes' fixed overheads (on chip, 256 KiB: 3
        // tiles 189.8, 2 tiles 206.3 GB/s).
        let ntiles = (b - a).div_ceil(fit.max(1)).max(1);
        let tile = (b - a).div_ceil(ntiles).max(1);
        let tiles: Vec<(u64, u64)> = (a..b)
            .step_by(tile as usize)
            .map(|r| (r, tile.min(b - r)))
            .collect();
        // Where this member's chunk comes from: its own rows of `din`.
        let own = |r0: u64| if steps.reduce { r0 } else { r0 - a };
        let in_tcm = din.t.space == kb_format::Space::Tcm;
        // Reducing, the parts of a tile: every other member's loaded, and
        // this member's own, loaded too unless it lies in this PE's TCM
        // (an operand where it is).
        let load = |tl: &mut Tl<'_>, (r0, n): (u64, u64)| -> Vec<LoadHandle> {
            if steps.reduce {
                let first = if in_tcm { 1 } else { 0 };
                (first..p)
                    .map(|i| tl.load_async(din.on(member(i)).block(r0, n)))
                    .collect()
            } else if in_tcm {
                Vec::new()
            } else {
                vec![tl.load_async(din.block(own(r0), n))]
            }
        };
        let mut next = tiles.first().map(|&t| load(tl, t));
        for (t, &(r0, n)) in tiles.iter().enumerate() {
            let parts = next.take().expect("loaded ahead");
            // The next tile's parts are on their way while this one sums.
            next = tiles.get(t + 1).map(|&t| load(tl, t));
            let block = din.block(own(r0), n);
            let mut parts = parts.into_iter();
            let sum = if !steps.reduce {
                parts.next().map(|h| Partial::Tile(tl.wait(h)))
            } else {
                let mut sum = match (in_tcm, parts.next()) {
                    (false, Some(h)) => Partial::Tile(tl.wait(h)),
                    (true, Some(h)) => {
                        let x = tl.wait(h);
                        Partial::Sum(tl.add(&block, &x))
                    }
                    (_, None) => Partial::Block(block),
                };
                for h in parts {
                    let x = tl.wait(h);
                    sum = Partial::Sum(tl.add(sum.operand(), &x));
                }
                Some(sum)
            };
            let value: &dyn Operand = match &sum {
                Some(s) => s.operand(),
                None => &block,
            };
            if steps.gather {
                for i in 1..p {
                    let to = member(i);
                    let notify = (!self.read_after).then_some(Notify {
                        pe: to,
                        signal: self.gathered(),
                        add: n,
                    });
                    tl.put(value, dout.on(to).block(r0, n), notify);
                }
                // Gathering a chunk that already is in place needs no store.
                if steps.reduce || !din.same(&dout.sub(a, b - a)) {
                    tl.store(dout.block(r0, n), value);
                }
            } else {
                tl.store(dout.block(r0 - a, n), value);
            }
        }
        if steps.gather && p > 1 && !self.read_after {
            // Every other member's chunk, counted in rows.
            self.gathered_seen += rows - (b - a);
            tl.wait_signal(self.gathered(), self.gathered_seen);
        }
    }
}
