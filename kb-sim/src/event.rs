//! The discrete-event core: integer picosecond time, events ordered by
//! (time, sequence). Ties break by insertion order, so the same inputs
//! always replay the same way.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

pub use kb_format::Ps;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: u64 = 1000;

/// Convert nanoseconds (from the topology) to integer picoseconds.
pub fn ns_to_ps(ns: f64) -> Ps {
    (ns * PS_PER_NS as f64).round() as Ps
}

struct Entry<E> {
    time: Ps,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse for earliest-first.
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A priority queue of events.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: Ps,
}

impl<E> std::fmt::Debug for EventQueue<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue")
            .field("now", &self.now)
            .field("pending", &self.heap.len())
            .finish()
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
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
        let time = time.max(self.now);
        self.heap.push(Entry {
            time,
            seq: self.seq,
            event,
        });
        self.seq += 1;
    }

    /// The next event, advancing `now` to its time.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ps, E)> {
        let e = self.heap.pop()?;
        self.now = e.time;
        Some((e.time, e.event))
    }

    pub fn now(&self) -> Ps {
        self.now
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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

    #[test]
    fn ns_convert_to_integer_ps() {
        assert_eq!(ns_to_ps(1.5), 1500);
        assert_eq!(ns_to_ps(0.0), 0);
    }
}
