//! Ordering in time of one PE's DMAs that touch the same bytes.
//!
//! Data effects follow issue order (stores and copies apply theirs at
//! issue, loads when served), but a transfer's timing could let a later
//! DMA read bytes before an earlier one's write of them had landed. So a
//! DMA whose bytes overlap those of an earlier-issued, unfinished DMA of
//! the same PE is held on the engine it got (in issue order, so the DMA
//! it waits for has one), before it begins: until that DMA has finished (its record
//! ended) when it reads what that one writes (RAW), until that DMA's
//! write has landed when it writes what that one writes (WAW), and until
//! that DMA has read its source when it writes what that one reads
//! (WAR). It then begins (its record starts). Later DMAs that touch
//! other bytes pass it; one held keeps its engine, as a descriptor in a
//! DMA engine's queue would, so a kernel cannot run ahead of its DMAs
//! without bound. Across PEs, ordering is the kernel's
//! job (signals, barriers) and the race detector's.
//!
//! The check compares the physical pieces of the two DMAs' sides (a
//! PE has a handful of DMAs in flight): bounding ranges first, then the
//! exact overlap of strided rows (`race::overlap`).

use std::io::Write;

use kb_format::{Dep, DepKind, Extent};

use super::Engine;
use super::dma::{Dma, DmaAct};

/// `[first byte, past the last byte)` of an extent.
pub(super) fn bounds(x: &Extent) -> (u64, u64) {
    let rows = u64::from(x.rows.max(1));
    (x.pa, x.pa + (rows - 1) * x.stride + x.len)
}

/// The bounding range of a side's pieces.
fn hull(xs: &[Extent]) -> Option<(u64, u64)> {
    xs.iter()
        .map(bounds)
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
}

/// An issued, unfinished DMA of a PE with the bounding ranges of its two
/// sides, kept in its PE's list (`DmaEngines::unfinished`): a check
/// against it that the ranges rule out reads neither its `Dma` nor its
/// pieces. With thousands of PEs between two events of one PE, those
/// are cache misses, and most pairs of a PE's DMAs touch other bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unfinished {
    pub(super) dma: u32,
    /// `[first byte, past the last byte)` of its source and destination
    /// pieces; `(u64::MAX, 0)` (meets nothing) for a side without pieces.
    src: (u64, u64),
    dst: (u64, u64),
}

impl Unfinished {
    /// DMA `dma` with its sides' pieces.
    pub(super) fn new(dma: u32, src: &[Extent], dst: &[Extent]) -> Self {
        const NONE: (u64, u64) = (u64::MAX, 0);
        Unfinished {
            dma,
            src: hull(src).unwrap_or(NONE),
            dst: hull(dst).unwrap_or(NONE),
        }
    }

    /// Whether the bounding ranges allow `self` (later) to conflict with
    /// `earlier`: `false` proves `conflicts` false (each of its overlaps
    /// starts with these ranges).
    fn may_conflict(&self, earlier: &Unfinished) -> bool {
        let meet = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
        meet(self.src, earlier.dst) || meet(self.dst, earlier.dst) || meet(self.dst, earlier.src)
    }
}

/// Whether any byte of `a`'s pieces is a byte of `b`'s.
fn sides_overlap(a: &[Extent], b: &[Extent]) -> bool {
    let (Some(ha), Some(hb)) = (hull(a), hull(b)) else {
        return false;
    };
    if ha.1 <= hb.0 || hb.1 <= ha.0 {
        return false;
    }
    let exact = |x: &Extent, y: &Extent| {
        let (bx, by) = (bounds(x), bounds(y));
        bx.0 < by.1 && by.0 < bx.1 && crate::race::overlap(x, y).is_some()
    };
    if a.len().saturating_mul(b.len()) <= 4096 {
        return a.iter().any(|x| b.iter().any(|y| exact(x, y)));
    }
    // Many pieces (LA stripes): sweep both sides in address order.
    let sorted = |xs: &[Extent]| {
        let mut v: Vec<(u64, u64, usize)> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let (lo, hi) = bounds(x);
                (lo, hi, i)
            })
            .collect();
        v.sort_unstable();
        v
    };
    let (sa, sb) = (sorted(a), sorted(b));
    let mut j0 = 0;
    for &(lo, hi, i) in &sa {
        // A piece of `b` that ends before this one starts ends before
        // every later one starts too (they start in order).
        while j0 < sb.len() && sb[j0].1 <= lo {
            j0 += 1;
        }
        for &(ylo, yhi, j) in &sb[j0..] {
            if ylo >= hi {
                break;
            }
            if lo < yhi && exact(&a[i], &b[j]) {
                return true;
            }
        }
    }
    false
}

/// Whether `later` must still wait for `earlier` (both of one PE): a
/// read of what it writes until it finished (RAW), a write of what it
/// writes until its write landed (WAW), a write of what it reads until
/// its source was read (WAR).
fn conflicts(later: &Dma, earlier: &Dma) -> bool {
    sides_overlap(&later.src.pieces, &earlier.dst.pieces)
        || !earlier.landed && sides_overlap(&later.dst.pieces, &earlier.dst.pieces)
        || !earlier.read_done && sides_overlap(&later.dst.pieces, &earlier.src.pieces)
}

impl<W: Write> Engine<'_, W> {
    /// Whether DMA `d` touches bytes of an earlier-issued, unfinished DMA
    /// of its PE (RAW, WAR or WAW).
    pub(super) fn dma_hazard(&self, d: u32) -> bool {
        let x = self.dmas.peek(d);
        let list = &self.engines[x.pe as usize].unfinished;
        // (`d` is in the list while it can be checked; were it not, every
        // DMA there would be earlier.)
        let (at, me) = match list.iter().position(|u| u.dma == d) {
            Some(i) => (i, list[i]),
            None => (list.len(), Unfinished::new(d, &x.src.pieces, &x.dst.pieces)),
        };
        list[..at]
            .iter()
            .any(|e| me.may_conflict(e) && conflicts(x, self.dmas.peek(e.dma)))
    }

    /// DMA `d` reached its engines: it takes an idle one or queues, in
    /// issue order.
    pub(super) fn dma_ready(&mut self, pe: usize, d: u32) {
        let now = self.q.now();
        let op_id = self.dmas.peek(d).op_id;
        if self.engines[pe].idle > 0 {
            self.engines[pe].idle -= 1;
            self.at(now, DmaAct::Begin(d));
            return;
        }
        let at = {
            let e = &self.engines[pe];
            e.waiting
                .iter()
                .rposition(|&w| self.dmas.peek(w).op_id < op_id)
                .map_or(0, |i| i + 1)
        };
        self.engines[pe].waiting.insert(at, d);
    }

    /// DMA `d` of PE `pe` finished: the DMAs it held may go, then its
    /// engine takes the next one queued.
    pub(super) fn dma_finished(&mut self, pe: usize, d: u32, op: u64) {
        let e = &mut self.engines[pe];
        if let Some(i) = e.unfinished.iter().position(|u| u.dma == d) {
            e.unfinished.remove(i);
        }
        self.release_held(pe, op);
        let now = self.q.now();
        let e = &mut self.engines[pe];
        match e.waiting.pop_front() {
            Some(next) => {
                // It waited for the engine this DMA held.
                self.dmas.get(next).deps.push(Dep {
                    op,
                    kind: DepKind::Resource,
                });
                self.at(now, DmaAct::Begin(next))
            }
            None => e.idle += 1,
        }
    }

    /// Whether DMA `d`, on an engine, must wait for an earlier one: then
    /// it is held there.
    pub(super) fn dma_hold(&mut self, d: u32) -> bool {
        if !self.dma_hazard(d) {
            return false;
        }
        let pe = self.dmas.peek(d).pe as usize;
        self.engines[pe].held.push(d);
        self.stats.dma_hazards += 1;
        true
    }

    /// The held DMAs of PE `pe` that no longer conflict begin, in issue
    /// order (in place: no allocation).
    pub(super) fn release_held(&mut self, pe: usize, by: u64) {
        let now = self.q.now();
        let mut i = 0;
        while i < self.engines[pe].held.len() {
            let h = self.engines[pe].held[i];
            if self.dma_hazard(h) {
                i += 1;
            } else {
                self.engines[pe].held.remove(i);
                // Held on the same bytes until DMA `by` got this far.
                self.dmas.get(h).deps.push(Dep::data(by));
                self.at(now, DmaAct::Begin(h));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(pa: u64, rows: u32, len: u64, stride: u64) -> Extent {
        Extent {
            pa,
            rows,
            len,
            stride,
        }
    }

    /// The bounding ranges rule a pair out only when no side pair the
    /// exact check compares shares a byte: over a grid of strided and
    /// contiguous pieces, `may_conflict` is false only where all three
    /// `sides_overlap` checks are false, and true where ranges meet.
    #[test]
    fn bounding_ranges_never_rule_out_an_overlap() {
        let shapes = [
            vec![],
            vec![rows(0, 1, 64, 0)],
            vec![rows(64, 1, 64, 0)],
            vec![rows(0, 4, 16, 64)],
            vec![rows(16, 4, 16, 64)],
            vec![rows(200, 2, 8, 100), rows(1000, 1, 8, 0)],
            vec![rows(256, 1, 1, 0)],
        ];
        let mut ruled_out = 0;
        for a_src in &shapes {
            for a_dst in &shapes {
                for b_src in &shapes {
                    for b_dst in &shapes {
                        let later = Unfinished::new(1, a_src, a_dst);
                        let earlier = Unfinished::new(0, b_src, b_dst);
                        let exact = sides_overlap(a_src, b_dst)
                            || sides_overlap(a_dst, b_dst)
                            || sides_overlap(a_dst, b_src);
                        if !later.may_conflict(&earlier) {
                            ruled_out += 1;
                            assert!(!exact, "{a_src:?} {a_dst:?} / {b_src:?} {b_dst:?}");
                        }
                    }
                }
            }
        }
        assert!(ruled_out > 0, "the grid has disjoint pairs");
        // Touching ranges (one ends where the other starts) do not meet;
        // an empty side meets nothing.
        let a = Unfinished::new(1, &[], &[rows(0, 1, 64, 0)]);
        let b = Unfinished::new(0, &[rows(64, 1, 64, 0)], &[rows(64, 1, 8, 0)]);
        assert!(!a.may_conflict(&b));
        let c = Unfinished::new(0, &[rows(63, 1, 2, 0)], &[]);
        assert!(a.may_conflict(&c), "WAR: a writes byte 63, which c reads");
    }
}
