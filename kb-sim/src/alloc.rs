//! A free-list allocator with coalescing over one address range (per-PE
//! HBM partitions and TCMs). First fit, lowest address first, so the same
//! sequence of requests always gets the same addresses.

/// start -> length, sorted by start: a map as a sorted vector. A kernel's
/// TCM holds tens of blocks, so a binary search and a short move beat a
/// B-tree, whose nodes came and went with the tiles (an allocation per
/// few tiles).
#[derive(Debug, Clone, Default)]
struct Blocks(Vec<(u64, u64)>);

impl Blocks {
    fn find(&self, start: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&start, |&(s, _)| s)
    }

    fn insert(&mut self, start: u64, len: u64) {
        match self.find(start) {
            Ok(i) => self.0[i].1 = len,
            Err(i) => self.0.insert(i, (start, len)),
        }
    }

    fn remove(&mut self, start: u64) -> Option<u64> {
        self.find(start).ok().map(|i| self.0.remove(i).1)
    }

    fn get(&self, start: u64) -> Option<u64> {
        self.find(start).ok().map(|i| self.0[i].1)
    }

    /// The last block starting at or before `at` (`inclusive`), or before it.
    fn last_before(&self, at: u64, inclusive: bool) -> Option<(u64, u64)> {
        let n = match self.find(at) {
            Ok(i) if inclusive => i + 1,
            Ok(i) | Err(i) => i,
        };
        n.checked_sub(1).map(|i| self.0[i])
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().copied()
    }
}

#[derive(Debug, Clone)]
pub struct FreeList {
    /// start -> length of each free block; blocks never touch (coalesced).
    free: Blocks,
    /// start -> length of each live allocation.
    live: Blocks,
    limit: u64,
}

impl FreeList {
    pub fn new(limit: u64) -> FreeList {
        let mut free = Blocks::default();
        if limit > 0 {
            free.insert(0, limit);
        }
        FreeList {
            free,
            live: Blocks::default(),
            limit,
        }
    }

    /// Allocate `bytes` (at least 1) aligned to `align` (a power of two).
    pub fn alloc(&mut self, bytes: u64, align: u64) -> Option<u64> {
        let bytes = bytes.max(1);
        let (start, len, at) = self.free.iter().find_map(|(s, l)| {
            let at = s.div_ceil(align) * align;
            (at.checked_add(bytes)? <= s + l).then_some((s, l, at))
        })?;
        self.free.remove(start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + bytes;
        if end < start + len {
            self.free.insert(end, start + len - end);
        }
        self.live.insert(at, bytes);
        Some(at)
    }

    /// Allocate exactly `[at, at+bytes)` (at least 1 byte); false if any
    /// of it is not free. (A kernel's TCM allocator starts with the
    /// program's TCM buffers reserved this way.)
    pub fn reserve(&mut self, at: u64, bytes: u64) -> bool {
        let bytes = bytes.max(1);
        let Some(end) = at.checked_add(bytes) else {
            return false;
        };
        let Some((start, len)) = self.free.last_before(at, true) else {
            return false;
        };
        if end > start + len {
            return false;
        }
        self.free.remove(start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if end < start + len {
            self.free.insert(end, start + len - end);
        }
        self.live.insert(at, bytes);
        true
    }

    /// Free the allocation starting at `at`; false if there is none.
    pub fn free(&mut self, at: u64) -> bool {
        let Some(len) = self.live.remove(at) else {
            return false;
        };
        let (mut start, mut end) = (at, at + len);
        if let Some((ps, pl)) = self.free.last_before(at, false)
            && ps + pl == at
        {
            self.free.remove(ps);
            start = ps;
        }
        if let Some(nl) = self.free.get(end) {
            self.free.remove(end);
            end += nl;
        }
        self.free.insert(start, end - start);
        true
    }

    /// Bytes allocated.
    pub fn used(&self) -> u64 {
        self.live.iter().map(|(_, l)| l).sum()
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Largest free block.
    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|(_, l)| l).max().unwrap_or(0)
    }

    #[cfg(test)]
    fn free_blocks(&self) -> Vec<(u64, u64)> {
        self.free.iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn freeing_coalesces_neighbours() {
        let mut f = FreeList::new(1000);
        let a = f.alloc(100, 1).unwrap();
        let b = f.alloc(100, 1).unwrap();
        let c = f.alloc(100, 1).unwrap();
        assert_eq!((a, b, c), (0, 100, 200));
        assert!(f.free(a));
        assert!(f.free(c));
        assert_eq!(f.free_blocks(), vec![(0, 100), (200, 800)]);
        assert!(f.free(b));
        assert_eq!(f.free_blocks(), vec![(0, 1000)]);
        assert!(!f.free(b), "double free is refused");
    }

    #[test]
    fn alignment_and_exhaustion() {
        let mut f = FreeList::new(256);
        assert_eq!(f.alloc(10, 1), Some(0));
        assert_eq!(f.alloc(64, 64), Some(64));
        assert_eq!(f.alloc(200, 1), None);
        assert_eq!(f.alloc(118, 1), Some(128));
        assert_eq!(f.largest_free(), 54);
    }

    #[test]
    fn reserve_takes_exactly_the_range_asked_for() {
        let mut f = FreeList::new(1000);
        assert!(f.reserve(100, 50));
        assert_eq!(f.free_blocks(), vec![(0, 100), (150, 850)]);
        assert!(!f.reserve(120, 10), "inside a live allocation");
        assert!(!f.reserve(140, 20), "overlapping a live allocation");
        assert!(!f.reserve(990, 20), "past the end");
        assert!(f.reserve(0, 100));
        assert_eq!(f.alloc(10, 1), Some(150));
        assert!(f.free(100));
        assert_eq!(f.free_blocks(), vec![(100, 50), (160, 840)]);
    }

    proptest! {
        /// Live allocations never overlap and stay in range, and each is
        /// the lowest aligned address whose bytes are all free (first fit:
        /// addresses depend only on the requests); after freeing
        /// everything, the free list is one block again.
        #[test]
        fn alloc_free_keeps_invariants(ops in prop::collection::vec((1u64..300, 0u32..4, any::<bool>()), 1..200)) {
            let mut f = FreeList::new(8192);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (size, align_pow, do_free) in ops {
                let align = 1u64 << (align_pow * 2);
                let first_fit = (0..8192u64).step_by(align as usize).find(|&a| {
                    a + size <= 8192 && live.iter().all(|&(o, l)| a + size <= o || o + l <= a)
                });
                if do_free && !live.is_empty() {
                    let (at, _) = live.remove((size as usize) % live.len());
                    prop_assert!(f.free(at));
                } else if let Some(at) = f.alloc(size, align) {
                    prop_assert_eq!(Some(at), first_fit);
                    prop_assert_eq!(at % (1 << (align_pow * 2)), 0);
                    prop_assert!(at + size <= 8192);
                    for &(o, l) in &live {
                        prop_assert!(at + size <= o || o + l <= at, "overlap");
                    }
                    live.push((at, size));
                } else {
                    prop_assert_eq!(first_fit, None);
                }
                prop_assert_eq!(f.used(), live.iter().map(|x| x.1).sum::<u64>());
                let blocks = f.free_blocks();
                for w in blocks.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0, "adjacent free blocks must be merged");
                }
            }
            for (at, _) in live {
                prop_assert!(f.free(at));
            }
            prop_assert_eq!(f.free_blocks(), vec![(0, 8192)]);
        }
    }
}
