//! Vector clocks: per-thread clocks, releases and acquires.

use std::collections::VecDeque;
use std::rc::Rc;

/// A vector clock, sparse: the components that are not 0, by thread in
/// increasing order. A PE's clock holds the threads it has synchronized
/// with (directly or not), so its size and the cost of copying it follow
/// them, not the machine's thread count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clock(Vec<(u32, u32)>);

impl Clock {
    /// Thread `t`'s component (0 if absent).
    pub fn get(&self, t: u32) -> u32 {
        // Threads are distinct and sorted, so entry `t` is thread `t`'s
        // when every thread below it is present (a clock that has joined
        // a whole group's, as after a barrier over every PE): no search.
        if let Some(&(u, v)) = self.0.get(t as usize)
            && u == t
        {
            return v;
        }
        match self.0.binary_search_by_key(&t, |c| c.0) {
            Ok(i) => self.0[i].1,
            Err(_) => 0,
        }
    }

    /// Set thread `t`'s component to `v`.
    fn set(&mut self, t: u32, v: u32) {
        match self.0.binary_search_by_key(&t, |c| c.0) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => {
                if v != 0 {
                    self.0.insert(i, (t, v));
                }
            }
        }
    }

    /// The clock whose component `t` is `dense[t]`.
    pub fn from_dense(dense: &[u32]) -> Clock {
        Clock(
            dense
                .iter()
                .enumerate()
                .filter(|&(_, &v)| v != 0)
                .map(|(t, &v)| (t as u32, v))
                .collect(),
        )
    }

    /// Components `0..n`, dense.
    pub fn to_dense(&self, n: usize) -> Vec<u32> {
        (0..n as u32).map(|t| self.get(t)).collect()
    }

    /// Components not 0.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether every component is 0.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Join `other` into this clock (component-wise maximum), with
    /// `scratch` for a merge; whether any component rose.
    fn join_with(&mut self, other: &Clock, scratch: &mut Vec<(u32, u32)>) -> bool {
        if other.0.len().saturating_mul(SEARCHED_JOIN) < self.0.len() {
            self.join_searched(other)
        } else {
            self.join_merged(other, scratch)
        }
    }

    /// [`Clock::join_with`] walking both clocks.
    fn join_merged(&mut self, other: &Clock, scratch: &mut Vec<(u32, u32)>) -> bool {
        let mut changed = false;
        let mut missing = false;
        let mut i = 0;
        for &(t, v) in &other.0 {
            while i < self.0.len() && self.0[i].0 < t {
                i += 1;
            }
            match self.0.get_mut(i) {
                Some(c) if c.0 == t => {
                    if v > c.1 {
                        c.1 = v;
                        changed = true;
                    }
                }
                _ => missing |= v != 0,
            }
        }
        if missing {
            // Present components already hold the maximum: add the rest.
            scratch.clear();
            let (a, b) = (&self.0, &other.0);
            let (mut i, mut j) = (0, 0);
            while i < a.len() || j < b.len() {
                if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
                    scratch.push(a[i]);
                    i += 1;
                } else if i == a.len() || b[j].0 < a[i].0 {
                    if b[j].1 != 0 {
                        scratch.push(b[j]);
                    }
                    j += 1;
                } else {
                    scratch.push(a[i]);
                    i += 1;
                    j += 1;
                }
            }
            std::mem::swap(&mut self.0, scratch);
            changed = true;
        }
        changed
    }

    /// [`Clock::join_with`] for an `other` with far fewer components: each
    /// found by a search from the last one's place, a missing one
    /// inserted there. A launch's end clock gathers every PE's as their
    /// kernels end, one or two components each: walking it whole per
    /// kernel end cost O(PEs^2) per launch (2 % of the instructions of
    /// gemm_tiled on 4,096 PEs).
    fn join_searched(&mut self, other: &Clock) -> bool {
        let mut changed = false;
        let mut from = 0;
        for &(t, v) in &other.0 {
            match self.0[from..].binary_search_by_key(&t, |c| c.0) {
                Ok(i) => {
                    let c = &mut self.0[from + i];
                    if v > c.1 {
                        c.1 = v;
                        changed = true;
                    }
                    from += i + 1;
                }
                Err(i) => {
                    from += i;
                    if v != 0 {
                        self.0.insert(from, (t, v));
                        from += 1;
                        changed = true;
                    }
                }
            }
        }
        changed
    }
}

/// [`Clock::join_with`] searches for each of the other clock's components
/// rather than merging the two when that one has fewer than this share of
/// the components (a search costs about a merge step per halving).
const SEARCHED_JOIN: usize = 16;

/// Per-thread vector clocks.
#[derive(Debug)]
pub struct Clocks {
    vc: Vec<Clock>,
    /// Per thread: its clock as last snapshotted, until it acquires again
    /// (a release changes only the own component, which checks never read).
    snap: Vec<Option<Rc<Clock>>>,
    /// Snapshots replaced by an acquire, oldest first: once no op holds
    /// one any more, a later snapshot reuses its allocation.
    retired: VecDeque<Rc<Clock>>,
    /// Published clocks handed back once joined, for later releases.
    spare: Vec<Clock>,
    /// Scratch for joins that add components.
    scratch: Vec<(u32, u32)>,
}

/// Retired snapshots and spare published clocks kept at most.
const SPARE_CLOCKS: usize = 64;

/// Retired snapshots a snapshot looks at for a free one, oldest first;
/// each one still held goes to the back. Looking at every one (each a
/// cache miss on its count) cost allreduce group=all on large ~40 looks
/// per snapshot, most of them at snapshots that ops in flight still hold.
const RETIRED_LOOKS: usize = 4;

impl Clocks {
    /// Clocks of `threads` threads: each at 1 in its own component (its
    /// first label) and 0 elsewhere (nothing acquired), so no access is
    /// ordered before another thread until a release reaches it.
    pub fn new(threads: usize) -> Clocks {
        let vc = (0..threads as u32).map(|t| Clock(vec![(t, 1)])).collect();
        Clocks {
            vc,
            snap: vec![None; threads],
            retired: VecDeque::new(),
            spare: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The label of an access `t` issues now.
    pub fn label(&self, t: u32) -> u32 {
        self.vc[t as usize].get(t)
    }

    /// `t`'s clock, shared until it next acquires.
    pub fn snapshot(&mut self, t: u32) -> Rc<Clock> {
        let t = t as usize;
        if self.snap[t].is_none() {
            // A retired snapshot that nothing holds any more, if one of
            // the oldest few is.
            let mut free = None;
            for _ in 0..self.retired.len().min(RETIRED_LOOKS) {
                let r = self.retired.pop_front().expect("counted");
                if Rc::strong_count(&r) == 1 {
                    free = Some(r);
                    break;
                }
                self.retired.push_back(r);
            }
            let snap = match free {
                Some(mut r) => {
                    Rc::get_mut(&mut r)
                        .expect("held only here")
                        .0
                        .clone_from(&self.vc[t].0);
                    r
                }
                None => Rc::new(self.vc[t].clone()),
            };
            self.snap[t] = Some(snap);
        }
        self.snap[t].clone().expect("set above")
    }

    /// Publish `t`'s clock and advance its own component.
    pub fn release(&mut self, t: u32) -> Clock {
        let mut published = self.spare.pop().unwrap_or_default();
        published.0.clear();
        published.0.extend_from_slice(&self.vc[t as usize].0);
        let own = &mut self.vc[t as usize];
        own.set(t, own.get(t).saturating_add(1));
        published
    }

    /// A published clock that was joined where it went, for a later
    /// release to reuse.
    pub fn give_back(&mut self, published: Clock) {
        if self.spare.len() < SPARE_CLOCKS {
            self.spare.push(published);
        }
    }

    /// Join a published clock into `t`'s; whether any component rose.
    pub fn acquire(&mut self, t: u32, published: &Clock) -> bool {
        let t = t as usize;
        let changed = self.vc[t].join_with(published, &mut self.scratch);
        if changed
            && let Some(old) = self.snap[t].take()
            && self.retired.len() < SPARE_CLOCKS
        {
            self.retired.push_back(old);
        }
        changed
    }

    /// Join `b` into `a` (a signal's or barrier's clock), merging in this
    /// set's scratch rather than a fresh vector; whether any component
    /// of `a` rose.
    pub fn join_into(&mut self, a: &mut Clock, b: &Clock) -> bool {
        a.join_with(b, &mut self.scratch)
    }
}

/// Join `b` into `a` (component-wise maximum).
pub fn join(a: &mut Clock, b: &Clock) {
    let mut scratch = Vec::new();
    a.join_with(b, &mut scratch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_publish_then_advance() {
        let d = Clock::from_dense;
        let mut c = Clocks::new(3);
        assert_eq!(c.label(0), 1);
        let p = c.release(0);
        assert_eq!(p.to_dense(3), vec![1, 0, 0]);
        assert_eq!(c.label(0), 2);
        c.acquire(2, &p);
        let before = c.snapshot(1);
        c.acquire(1, &d(&[5, 0, 0]));
        assert_eq!(before.to_dense(3), [0, 1, 0]);
        assert_eq!(c.snapshot(1).to_dense(3), [5, 1, 0]);
        assert_eq!(c.snapshot(1).len(), 2, "zeros are not stored");
        let mut j = d(&[1, 7]);
        join(&mut j, &d(&[3, 2, 4]));
        assert_eq!(j.to_dense(3), vec![3, 7, 4]);
        assert!(Clock::default().is_empty());
    }

    /// `acquire` and `join_into` say whether a component rose: the
    /// engine skips a signal's later acquires on that (a join that raised
    /// nothing leaves the signal's version, and re-joining an unchanged
    /// clock raises nothing).
    #[test]
    fn joins_say_whether_a_component_rose() {
        let d = Clock::from_dense;
        let mut c = Clocks::new(3);
        let mut signal = Clock::default();
        assert!(c.join_into(&mut signal, &d(&[0, 2, 0])));
        assert!(!c.join_into(&mut signal, &d(&[0, 1, 0])), "lower");
        assert!(c.join_into(&mut signal, &d(&[1, 2, 0])), "a new thread");
        assert_eq!(signal.to_dense(3), [1, 2, 0]);
        assert!(c.acquire(2, &signal));
        assert!(!c.acquire(2, &signal), "unchanged: nothing to raise");
        assert_eq!(c.snapshot(2).to_dense(3), [1, 2, 1]);
        assert!(c.join_into(&mut signal, &d(&[0, 3, 0])));
        assert!(c.acquire(2, &signal));
        assert_eq!(c.snapshot(2).to_dense(3), [1, 3, 1]);
    }

    /// Replaced snapshots are reused only once no one holds them, and a
    /// published clock given back is reused by the next release; neither
    /// shows in the values.
    #[test]
    fn clock_allocations_are_reused_only_when_free() {
        let d = Clock::from_dense;
        let mut c = Clocks::new(2);
        let held = c.snapshot(0);
        c.acquire(0, &d(&[0, 3]));
        let second = c.snapshot(0);
        assert!(!Rc::ptr_eq(&held, &second), "the first is still held");
        assert_eq!(
            (held.to_dense(2), second.to_dense(2)),
            (vec![1, 0], vec![1, 3])
        );
        let first = Rc::as_ptr(&held);
        drop(held);
        c.acquire(0, &d(&[0, 4]));
        let third = c.snapshot(0);
        assert_eq!(Rc::as_ptr(&third), first, "reused once free");
        assert_eq!(third.to_dense(2), [1, 4]);
        assert_eq!(
            second.to_dense(2),
            [1, 3],
            "a held snapshot keeps its value"
        );
        let p = c.release(1);
        let ptr = p.0.as_ptr();
        c.give_back(p);
        let q = c.release(1);
        assert_eq!((q.0.as_ptr(), q.to_dense(2)), (ptr, vec![0, 2]));
    }

    /// A snapshot looks at no more than `RETIRED_LOOKS` retired ones,
    /// oldest first, and sends those still held to the back, so a free
    /// one behind them is reused at a later snapshot.
    #[test]
    fn snapshots_look_at_a_few_retired_ones_in_turn() {
        // Threads 0..=RETIRED_LOOKS+1 each take a snapshot and then
        // acquire (retiring it), in that order; the last thread publishes.
        let n = RETIRED_LOOKS + 3;
        let last = (n - 1) as u32;
        let mut c = Clocks::new(n);
        let held: Vec<Rc<Clock>> = (0..last).map(|t| c.snapshot(t)).collect();
        let published = c.release(last);
        for t in 0..last {
            c.acquire(t, &published);
        }
        let mut held: Vec<Option<Rc<Clock>>> = held.into_iter().map(Some).collect();
        // The one after the first RETIRED_LOOKS is let go.
        let freed_ptr = Rc::as_ptr(held[RETIRED_LOOKS].as_ref().expect("held"));
        held[RETIRED_LOOKS] = None;
        let fresh = c.snapshot(0);
        assert_ne!(
            Rc::as_ptr(&fresh),
            freed_ptr,
            "the free one is past the first looks: a new allocation"
        );
        assert_eq!((fresh.get(0), fresh.get(last)), (1, 1));
        let again = c.release(last);
        c.acquire(0, &again);
        let next = c.snapshot(0);
        assert_eq!(Rc::as_ptr(&next), freed_ptr, "now first in line");
        assert_eq!((next.get(0), next.get(last)), (1, 2));
        for (t, h) in held.iter().enumerate() {
            if let Some(h) = h {
                assert_eq!(h.to_dense(n), Clock(vec![(t as u32, 1)]).to_dense(n));
            }
        }
    }

    /// The vector clocks as they were before they went sparse: a dense
    /// vector of every thread's component per thread.
    struct DenseClocks {
        vc: Vec<Vec<u32>>,
    }

    impl DenseClocks {
        fn new(threads: usize) -> DenseClocks {
            let vc = (0..threads)
                .map(|t| {
                    let mut v = vec![0; threads];
                    v[t] = 1;
                    v
                })
                .collect();
            DenseClocks { vc }
        }

        fn release(&mut self, t: usize) -> Vec<u32> {
            let published = self.vc[t].clone();
            self.vc[t][t] = self.vc[t][t].saturating_add(1);
            published
        }

        fn acquire(&mut self, t: usize, published: &[u32]) {
            for (mine, &theirs) in self.vc[t].iter_mut().zip(published) {
                *mine = (*mine).max(theirs);
            }
        }
    }

    proptest::proptest! {
        /// Both ways of joining give the component-wise maximum of the two
        /// clocks, in the same sorted components (zeros kept where the
        /// clock had them, none added) and the same answer to whether any
        /// rose, whichever is the larger; and so does `join_with`, whichever
        /// of the two it picks.
        #[test]
        fn searched_and_merged_joins_agree(
            a in proptest::collection::btree_map(0u32..400, 0u32..5, 0..300),
            b in proptest::collection::btree_map(0u32..400, 0u32..5, 0..24),
        ) {
            let a = Clock(a.into_iter().collect());
            let b = Clock(b.into_iter().collect());
            for (x, y) in [(&a, &b), (&b, &a)] {
                let mut merged = x.clone();
                let rose_merged = merged.join_merged(y, &mut Vec::new());
                let mut searched = x.clone();
                let rose_searched = searched.join_searched(y);
                proptest::prop_assert_eq!(&searched, &merged);
                proptest::prop_assert_eq!(rose_searched, rose_merged);
                let want: Vec<u32> = (0..400).map(|t| x.get(t).max(y.get(t))).collect();
                proptest::prop_assert_eq!(merged.to_dense(400), want);
                let rose = (0..400).any(|t| y.get(t) > x.get(t));
                proptest::prop_assert_eq!(rose_merged, rose);
                let mut joined = x.clone();
                proptest::prop_assert_eq!(joined.join_with(y, &mut Vec::new()), rose);
                proptest::prop_assert_eq!(&joined, &merged);
            }
        }

        /// Sparse clocks give every component the dense ones give, through
        /// releases, acquires of published clocks (each one's own or joins
        /// of several, as signals and barriers hold them), and snapshots
        /// taken and held across later acquires.
        #[test]
        fn sparse_clocks_match_dense_ones(
            ops in proptest::collection::vec((0u8..4, 0usize..7, 0usize..8, 0usize..8), 1..120)
        ) {
            const N: usize = 7;
            let mut sparse = Clocks::new(N);
            let mut dense = DenseClocks::new(N);
            // Published clocks, each kept both ways, and joins of them.
            let mut pubs: Vec<(Clock, Vec<u32>)> = Vec::new();
            let mut held: Vec<(Rc<Clock>, Vec<u32>)> = Vec::new();
            // Snapshots held: each keeps the value it had when taken.
            for (kind, t, a, b) in ops {
                match kind {
                    0 => {
                        let p = sparse.release(t as u32);
                        let q = dense.release(t);
                        proptest::prop_assert_eq!(p.to_dense(N), q.clone());
                        pubs.push((p, q));
                    }
                    1 if !pubs.is_empty() => {
                        let (p, q) = &pubs[a % pubs.len()];
                        sparse.acquire(t as u32, p);
                        dense.acquire(t, q);
                    }
                    2 if !pubs.is_empty() => {
                        let (mut p, mut q) = pubs[a % pubs.len()].clone();
                        let (p2, q2) = &pubs[b % pubs.len()];
                        join(&mut p, p2);
                        for (x, &y) in q.iter_mut().zip(q2) {
                            *x = (*x).max(y);
                        }
                        proptest::prop_assert_eq!(p.to_dense(N), q.clone());
                        pubs.push((p, q));
                    }
                    3 => {
                        // A snapshot is shared until the thread acquires:
                        // its own component (which checks never read)
                        // may be behind the releases since.
                        let s = sparse.snapshot(t as u32);
                        let mut want = dense.vc[t].clone();
                        want[t] = s.get(t as u32);
                        proptest::prop_assert!(s.get(t as u32) <= dense.vc[t][t]);
                        proptest::prop_assert_eq!(s.to_dense(N), want.clone());
                        held.push((s, want));
                        if held.len() > a {
                            held.remove(b % held.len());
                        }
                    }
                    _ => {}
                }
                for u in 0..N {
                    proptest::prop_assert_eq!(sparse.label(u as u32), dense.vc[u][u]);
                    proptest::prop_assert_eq!(sparse.vc[u].to_dense(N), dense.vc[u].clone());
                    proptest::prop_assert!(sparse.vc[u].0.windows(2).all(|w| w[0].0 < w[1].0));
                }
                for (s, v) in &held {
                    proptest::prop_assert_eq!(&s.to_dense(N), v);
                }
            }
        }
    }
}
