//! The discrete-event core: integer picosecond time, events ordered by
//! (time, sequence). Ties break by insertion order, so the same inputs
//! always replay the same way.
//!
//! Events scheduled for the current time (a quarter of kb-sim's: protocol
//! steps that follow one another at once) skip the heap: they go to a
//! FIFO, which is exactly their place in (time, sequence) order. Every
//! event in the heap with the current time was scheduled before the
//! clock reached it, so it has a smaller sequence number than anything in
//! the FIFO and pops first; the FIFO then pops in insertion order.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

pub use kb_format::Ps;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: u64 = 1000;

/// Convert nanoseconds (from the topology) to integer picoseconds.
/// The latest simulated time a run may reach: 2^62 ps, about 53 days.
/// Every duration the model computes is far smaller, time sums saturate
/// instead of wrapping, and the engine stops a run with an error past
/// this, so simulated time never overflows.
pub const MAX_TIME: Ps = 1 << 62;

pub fn ns_to_ps(ns: f64) -> Ps {
    (ns * PS_PER_NS as f64).round() as Ps
}

/// An event and its place: `time << 64 | seq` (one comparison orders it).
struct Entry<E> {
    key: u128,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse for earliest-first.
        other.key.cmp(&self.key)
    }
}

/// A priority queue of events.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    /// Events scheduled at `now` while the clock was at `now`.
    now_fifo: VecDeque<E>,
    seq: u64,
    now: Ps,
}

impl<E> std::fmt::Debug for EventQueue<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue")
            .field("now", &self.now)
            .field("pending", &self.len())
            .finish()
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            now_fifo: VecDeque::new(),
            seq: 0,
            now: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedule `event` at `time`. Scheduling in the past is a logic error
    /// and is clamped to now, so time never runs backwards.
    #[inline]
    pub fn push(&mut self, time: Ps, event: E) {
        debug_assert!(time >= self.now, "event scheduled in the past");
        if time <= self.now {
            self.now_fifo.push_back(event);
        } else {
            self.heap.push(Entry {
                key: (time as u128) << 64 | self.seq as u128,
                event,
            });
        }
        self.seq += 1;
    }

    /// The next event, advancing `now` to its time.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ps, E)> {
        // Heap events at `now` were scheduled earlier than any in the FIFO.
        if self
            .heap
            .peek()
            .is_some_and(|e| (e.key >> 64) as Ps == self.now)
            || self.now_fifo.is_empty()
        {
            let e = self.heap.pop()?;
            self.now = (e.key >> 64) as Ps;
            return Some((self.now, e.event));
        }
        self.now_fifo.pop_front().map(|e| (self.now, e))
    }

    pub fn now(&self) -> Ps {
        self.now
    }

    pub fn len(&self) -> usize {
        self.heap.len() + self.now_fifo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty() && self.now_fifo.is_empty()
    }

    /// Events scheduled so far.
    pub fn scheduled(&self) -> u64 {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, 'a');
        q.push(1, 'b');
        q.push(5, 'c');
        q.push(1, 'd');
        q.push(3, 'e');
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![(1, 'b'), (1, 'd'), (3, 'e'), (5, 'a'), (5, 'c')]
        );
        assert_eq!(q.now(), 5);
    }

    /// A xorshift64 generator: the tests' pseudo-random times.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// Push `first` events at `initial()` times, then pop everything,
    /// each pop pushing zero to two reactions at `delay(now)` (until
    /// `limit` pushes in all); the pops must come in the order of a plain
    /// sort of every push by (time, sequence).
    fn pops_as_a_sort_of_pushes(
        next: &mut impl FnMut() -> u64,
        first: usize,
        limit: u64,
        initial: impl Fn(&mut dyn FnMut() -> u64) -> Ps,
        delay: impl Fn(&mut dyn FnMut() -> u64, Ps) -> Ps,
    ) {
        let mut q = EventQueue::default();
        let (mut want, mut got) = (Vec::new(), Vec::new());
        let mut seq = 0u64;
        for _ in 0..first {
            let t = initial(next);
            q.push(t, seq);
            want.push((t, seq));
            seq += 1;
        }
        while let Some((t, e)) = q.pop() {
            got.push((t, e));
            assert_eq!(q.now(), t);
            for _ in 0..next() % 3 {
                if seq >= limit {
                    break;
                }
                let at = delay(next, t);
                q.push(at, seq);
                want.push((at, seq));
                seq += 1;
            }
        }
        want.sort();
        assert_eq!(got, want);
        assert!(q.is_empty());
    }

    /// The FIFO for events at the current time keeps (time, sequence)
    /// order: events pushed while popping, some at the current time,
    /// some up to 3 later.
    #[test]
    fn same_time_events_keep_time_then_insertion_order() {
        pops_as_a_sort_of_pushes(
            &mut xorshift(0x2545_f491_4f6c_dd1d),
            20,
            400,
            |next| next() % 5,
            |next, t| t + next() % 2 * (next() % 4),
        );
    }

    /// The same with delays from 1 ps to 2^40 ps (keys that differ in
    /// every bit of the time), many events pending at once, and bursts at
    /// the current time.
    #[test]
    fn far_and_near_events_keep_time_then_insertion_order() {
        pops_as_a_sort_of_pushes(
            &mut xorshift(0x9e37_79b9_7f4a_7c15),
            300,
            20_000,
            |next| next() % (1 << 40),
            |next, t| match next() % 4 {
                0 => t,
                1 => t + 1 + next() % 8,
                2 => t + (next() % (1 << 20)),
                _ => t + (next() % (1 << 40)),
            },
        );
    }

    #[test]
    fn ns_convert_to_integer_ps() {
        assert_eq!(ns_to_ps(1.5), 1500);
        assert_eq!(ns_to_ps(0.0), 0);
    }
}
