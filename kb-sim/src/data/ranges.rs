//! Disjoint byte ranges keyed by their start, kept apart by the PA's
//! region (space, SIP, cube and PE: everything above the 35-bit offset).
//!
//! The data plane's pending and landed ranges were one B-tree each, and
//! every DMA searched them several times: with one range per PE in each,
//! a search walked a tree of all the machine's PEs. Here each region has
//! its own small tree, found by indexing, and a search that must look past
//! its region (a range can still run across a region's end) does so only
//! when one does. Every answer is the one a single `BTreeMap` gives.

use std::collections::BTreeMap;

/// A range's end (exclusive); its start is its key.
pub(super) trait Span {
    fn end(&self) -> u64;
}

const REGION_BITS: u32 = kb_format::pa::OFFSET_BITS;
/// Regions of a 51-bit PA; keys above go to the last one (regions stay in
/// key order).
const REGIONS: usize = 1 << (kb_format::pa::PA_BITS - REGION_BITS);

fn region(key: u64) -> usize {
    ((key >> REGION_BITS) as usize).min(REGIONS - 1)
}

/// Whether the range `[start, end)` runs past the end of its start's
/// region.
fn crosses(start: u64, end: u64) -> bool {
    region(start) < REGIONS - 1 && end > ((region(start) as u64 + 1) << REGION_BITS)
}

#[derive(Debug)]
pub(super) struct RangeMap<V> {
    /// Per region: 1 + the index of its tree in `trees`, or 0 (none yet).
    /// Empty until the first insert.
    slot: Vec<u32>,
    trees: Vec<BTreeMap<u64, V>>,
    /// One bit per region holding a range.
    occupied: Vec<u64>,
    len: usize,
    /// Ranges that run past their region's end.
    crossing: usize,
}

impl<V> Default for RangeMap<V> {
    fn default() -> Self {
        RangeMap {
            slot: Vec::new(),
            trees: Vec::new(),
            occupied: Vec::new(),
            len: 0,
            crossing: 0,
        }
    }
}

impl<V: Span> RangeMap<V> {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Every range, in order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        (0..REGIONS)
            .filter_map(|r| self.tree(r))
            .flat_map(|t| t.iter().map(|(&s, v)| (s, v)))
    }

    fn tree(&self, r: usize) -> Option<&BTreeMap<u64, V>> {
        match self.slot.get(r) {
            Some(&s) if s > 0 => Some(&self.trees[s as usize - 1]),
            _ => None,
        }
    }

    fn tree_mut(&mut self, r: usize) -> &mut BTreeMap<u64, V> {
        if self.slot.is_empty() {
            self.slot = vec![0; REGIONS];
            self.occupied = vec![0; REGIONS / 64];
        }
        if self.slot[r] == 0 {
            self.trees.push(BTreeMap::new());
            self.slot[r] = self.trees.len() as u32;
        }
        &mut self.trees[self.slot[r] as usize - 1]
    }

    fn mark(&mut self, r: usize, occupied: bool) {
        let bit = 1u64 << (r % 64);
        if occupied {
            self.occupied[r / 64] |= bit;
        } else {
            self.occupied[r / 64] &= !bit;
        }
    }

    /// The highest occupied region in `lo..=hi`.
    fn occupied_at_or_below(&self, hi: usize, lo: usize) -> Option<usize> {
        if self.occupied.is_empty() || lo > hi {
            return None;
        }
        let mut w = hi / 64;
        // Bits at or below `hi` in its word, then whole words down to `lo`.
        let mut bits = self.occupied[w] & (u64::MAX >> (63 - hi % 64));
        loop {
            if bits != 0 {
                let r = w * 64 + 63 - bits.leading_zeros() as usize;
                return (r >= lo).then_some(r);
            }
            if w == 0 || w * 64 <= lo {
                return None;
            }
            w -= 1;
            bits = self.occupied[w];
        }
    }

    pub(super) fn get(&self, start: u64) -> Option<&V> {
        self.tree(region(start))?.get(&start)
    }

    pub(super) fn insert(&mut self, start: u64, v: V) -> Option<V> {
        let r = region(start);
        self.crossing += crosses(start, v.end()) as usize;
        let old = self.tree_mut(r).insert(start, v);
        match &old {
            Some(o) => self.crossing -= crosses(start, o.end()) as usize,
            None => self.len += 1,
        }
        self.mark(r, true);
        old
    }

    pub(super) fn remove(&mut self, start: u64) -> Option<V> {
        let r = region(start);
        let s = *self.slot.get(r)?;
        if s == 0 {
            return None;
        }
        let tree = &mut self.trees[s as usize - 1];
        let old = tree.remove(&start)?;
        let now_empty = tree.is_empty();
        self.len -= 1;
        self.crossing -= crosses(start, old.end()) as usize;
        if now_empty {
            self.mark(r, false);
        }
        Some(old)
    }

    /// The range with the greatest start at or below `hi`, if it ends past
    /// `at` (`BTreeMap::range(..=hi).next_back()` filtered by its end).
    /// The search stays in the regions from `hi`'s down to `at`'s unless
    /// a range crosses a region's end: one starting below `at`'s region
    /// reaches past `at` only then.
    pub(super) fn last_upto_ending_after(&self, hi: u64, at: u64) -> Option<(u64, &V)> {
        let top = region(hi);
        let floor = if self.crossing > 0 { 0 } else { region(at) };
        let mut r = top;
        while let Some(found) = self.occupied_at_or_below(r, floor) {
            let tree = self.tree(found).expect("an occupied region has a tree");
            if let Some((&s, v)) = tree.range(..=hi).next_back() {
                return (v.end() > at).then_some((s, v));
            }
            if found == 0 {
                break;
            }
            r = found - 1;
        }
        None
    }

    /// The range with the greatest start below `bound`, if it ends past
    /// `at` (`BTreeMap::range(..bound).next_back()` filtered by its end).
    pub(super) fn last_before_ending_after(&self, bound: u64, at: u64) -> Option<(u64, &V)> {
        let hi = bound.checked_sub(1)?;
        self.last_upto_ending_after(hi, at)
    }

    /// The ranges starting in `[lo, hi)`, in order.
    pub(super) fn starting_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, &V)> {
        let regions = if lo < hi {
            region(lo)..region(hi - 1) + 1
        } else {
            0..0
        };
        regions
            .filter(move |&r| {
                self.occupied
                    .get(r / 64)
                    .is_some_and(|w| w >> (r % 64) & 1 == 1)
            })
            .flat_map(move |r| {
                self.tree(r)
                    .expect("an occupied region has a tree")
                    .range(lo..hi)
                    .map(|(&s, v)| (s, v))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl Span for u64 {
        fn end(&self) -> u64 {
            *self
        }
    }

    /// Keys near region edges: a region (0-3, or the last two) and an
    /// offset near its start or its end.
    fn key() -> impl Strategy<Value = u64> {
        let last = REGIONS as u64 - 1;
        (
            prop_oneof![0u64..4, last - 1..=last],
            prop_oneof![0u64..64, (1u64 << REGION_BITS) - 64..1 << REGION_BITS],
        )
            .prop_map(|(r, off)| (r << REGION_BITS) + off)
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Insert `[start, start + len)` after removing what it overlaps
        /// (the ranges stay disjoint, as the data plane keeps them).
        Insert(u64, u64),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (key(), prop_oneof![1u64..32, 32u64..200]).prop_map(|(s, l)| Op::Insert(s, l)),
            1 => key().prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Every query answers as one `BTreeMap` does, ranges running
        /// across region ends included.
        #[test]
        fn answers_as_one_btree(ops in proptest::collection::vec(op(), 0..40), queries in proptest::collection::vec((key(), key()), 1..20)) {
            let mut map = RangeMap::<u64>::default();
            let mut model = BTreeMap::<u64, u64>::new();
            for op in ops {
                match op {
                    Op::Insert(s, len) => {
                        let e = s + len;
                        let hit: Vec<u64> = model.iter().filter(|&(&a, &b)| a < e && s < b).map(|(&a, _)| a).collect();
                        for a in hit {
                            prop_assert_eq!(map.remove(a), model.remove(&a));
                        }
                        prop_assert_eq!(map.insert(s, e), model.insert(s, e));
                    }
                    Op::Remove(s) => prop_assert_eq!(map.remove(s), model.remove(&s)),
                }
                prop_assert_eq!(map.len(), model.len());
                prop_assert_eq!(map.is_empty(), model.is_empty());
            }
            for (a, b) in queries {
                let (lo, hi) = (a.min(b), a.max(b));
                for (q, at) in [(lo, lo), (hi, lo), (lo, hi), (hi, hi), (lo + 1, lo), (hi, lo.saturating_sub(1))] {
                    let want = model.range(..=q).next_back().filter(|&(_, &e)| e > at).map(|(&s, e)| (s, *e));
                    prop_assert_eq!(map.last_upto_ending_after(q, at).map(|(s, e)| (s, *e)), want);
                    let want = model.range(..q).next_back().filter(|&(_, &e)| e > at).map(|(&s, e)| (s, *e));
                    prop_assert_eq!(map.last_before_ending_after(q, at).map(|(s, e)| (s, *e)), want);
                }
                let got: Vec<(u64, u64)> = map.starting_in(lo, hi).map(|(s, e)| (s, *e)).collect();
                let want: Vec<(u64, u64)> = model.range(lo..hi).map(|(&s, &e)| (s, e)).collect();
                prop_assert_eq!(got, want);
                prop_assert_eq!(map.get(lo).copied(), model.get(&lo).copied());
            }
        }
    }

    #[test]
    fn a_range_across_a_region_end_is_found_from_the_next_region() {
        let edge = 1u64 << REGION_BITS;
        let mut map = RangeMap::<u64>::default();
        map.insert(edge - 8, edge + 8);
        assert_eq!(map.crossing, 1);
        // Covering the next region's first byte, from a start in the one
        // before.
        assert_eq!(
            map.last_upto_ending_after(edge, edge).map(|(s, _)| s),
            Some(edge - 8)
        );
        assert_eq!(map.last_upto_ending_after(edge + 8, edge + 8), None);
        map.remove(edge - 8);
        assert_eq!(map.crossing, 0);
        assert!(map.is_empty());
        assert_eq!(map.last_upto_ending_after(edge, edge), None);
    }
}
