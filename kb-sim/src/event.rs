//! The discrete-event core: integer picosecond time, events ordered by
//! (time, sequence). Ties break by insertion order, so the same inputs
//! always replay the same way.
//!
//! The queue keeps one FIFO per pending time, and a heap of the distinct
//! times. Events pushed for one time arrive in sequence order, so each
//! FIFO is in (time, sequence) order as it is, and the heap orders times
//! alone: a machine of many identical PEs schedules many events at each
//! time (about 8 per distinct time on the kernel benchmark), and each
//! costs a hash probe and a FIFO push instead of a heap sift. When the
//! clock reaches a time, its FIFO becomes the current one, and events
//! scheduled for the current time (a quarter of kb-sim's: protocol steps
//! that follow one another at once) join its back: they were scheduled
//! after every event already there, which is exactly their place.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

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

/// `x.ceil() as Ps`, exactly (saturating, NaN to 0), without a call to
/// libm's `ceil`: x86-64's baseline has no rounding instruction, and
/// every hop and memory access computes a duration this way.
#[inline]
pub fn ceil_ps(x: f64) -> Ps {
    let t = x as Ps;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

/// A min-heap of times with 8 children per node: a pop sifts down a third
/// of the levels a binary heap has, comparing 8 neighbouring times (one or
/// two cache lines) per level. On a 4,096-PE machine tens of thousands of
/// distinct times are pending and a binary heap's lower levels missed the
/// cache at every step. Equal times are interchangeable, so the order of
/// pops is that of any min-heap.
#[derive(Debug, Default)]
struct TimeHeap {
    v: Vec<Ps>,
}

impl TimeHeap {
    const D: usize = 8;

    fn push(&mut self, t: Ps) {
        let mut i = self.v.len();
        self.v.push(t);
        while i > 0 {
            let p = (i - 1) / Self::D;
            if self.v[p] <= t {
                break;
            }
            self.v[i] = self.v[p];
            i = p;
        }
        self.v[i] = t;
    }

    fn pop(&mut self) -> Option<Ps> {
        let last = self.v.pop()?;
        let Some(&top) = self.v.first() else {
            return Some(last);
        };
        let n = self.v.len();
        let mut i = 0;
        loop {
            let c = Self::D * i + 1;
            if c >= n {
                break;
            }
            let kids = &self.v[c..(c + Self::D).min(n)];
            let (mut m, mut least) = (0, kids[0]);
            for (j, &k) in kids.iter().enumerate().skip(1) {
                if k < least {
                    (m, least) = (j, k);
                }
            }
            if least >= last {
                break;
            }
            self.v[i] = least;
            i = c + m;
        }
        self.v[i] = last;
        Some(top)
    }
}

/// A priority queue of events.
pub struct EventQueue<E> {
    /// Events at `now`, in sequence order.
    current: VecDeque<E>,
    /// The distinct later times that have events, earliest first.
    times: TimeHeap,
    /// Per later time: the index of its events' FIFO in `fifos`.
    at: FxHashMap<Ps, u32>,
    /// FIFOs of later times, and emptied ones kept for reuse (`spare`).
    fifos: Vec<VecDeque<E>>,
    spare: Vec<u32>,
    /// The later time pushed to last and its FIFO (time 0: none; no later
    /// time is 0): consecutive pushes often share a time.
    last: (Ps, u32),
    len: usize,
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
            current: VecDeque::new(),
            times: TimeHeap::default(),
            at: FxHashMap::default(),
            fifos: Vec::new(),
            spare: Vec::new(),
            last: (0, 0),
            len: 0,
            seq: 0,
            now: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedule `event` at `time`. Scheduling in the past is a logic error
    /// and is clamped to now, so time never runs backwards.
    ///
    /// Inlined, with the hash lookup out of line: the event then goes
    /// from the caller's registers into its FIFO (passed through memory,
    /// the 16-byte load of a value just stored in parts stalled on every
    /// push).
    #[inline(always)]
    pub fn push(&mut self, time: Ps, event: E) {
        debug_assert!(time >= self.now, "event scheduled in the past");
        let fifo = if time <= self.now {
            &mut self.current
        } else {
            let i = if self.last.0 == time {
                self.last.1
            } else {
                self.fifo_of(time)
            };
            &mut self.fifos[i as usize]
        };
        fifo.push_back(event);
        self.len += 1;
        self.seq += 1;
    }

    /// The FIFO of later time `time`, made if there is none; remembered
    /// as the last one pushed to.
    #[inline(never)]
    fn fifo_of(&mut self, time: Ps) -> u32 {
        let i = match self.at.get(&time) {
            Some(&i) => i,
            None => {
                let i = match self.spare.pop() {
                    Some(i) => i,
                    None => {
                        self.fifos.push(VecDeque::new());
                        (self.fifos.len() - 1) as u32
                    }
                };
                self.at.insert(time, i);
                self.times.push(time);
                i
            }
        };
        self.last = (time, i);
        i
    }

    /// The next event, advancing `now` to its time.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ps, E)> {
        if self.current.is_empty() {
            let t = self.times.pop()?;
            let i = self.at.remove(&t).expect("every pending time has a FIFO");
            // The emptied current FIFO is kept for a later time, from the
            // start of its buffer again (`clear` rewinds it): the FIFOs
            // then reuse the same few cache lines.
            self.current.clear();
            std::mem::swap(&mut self.current, &mut self.fifos[i as usize]);
            self.spare.push(i);
            if self.last.0 == t {
                self.last.0 = 0;
            }
            self.now = t;
        }
        let e = self.current.pop_front()?;
        self.len -= 1;
        Some((self.now, e))
    }

    pub fn now(&self) -> Ps {
        self.now
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Events scheduled so far.
    pub fn scheduled(&self) -> u64 {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-ary heap pops what a binary heap pops, through pushes and
    /// pops interleaved (duplicates included) and sizes spanning levels.
    #[test]
    fn time_heap_pops_as_a_binary_heap() {
        use std::cmp::Reverse;
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let (mut h, mut model) = (TimeHeap::default(), std::collections::BinaryHeap::new());
        for step in 0..200_000u32 {
            let r = next();
            // Grow to a few thousand, then drain, twice.
            let pushing = (step / 50_000).is_multiple_of(2);
            if r % 8 < if pushing { 5 } else { 2 } {
                let t = r >> 40 & 0xffff;
                h.push(t);
                model.push(Reverse(t));
            } else {
                assert_eq!(h.pop(), model.pop().map(|Reverse(t)| t), "step {step}");
            }
        }
        while let Some(Reverse(t)) = model.pop() {
            assert_eq!(h.pop(), Some(t));
        }
        assert_eq!(h.pop(), None);
    }

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

    #[test]
    fn ceil_ps_is_ceil_at_the_edges() {
        for x in [
            0.0,
            -0.0,
            -0.5,
            -3.0,
            0.25,
            1.0,
            1.0000001,
            4095.999,
            (1u64 << 53) as f64,
            (1u64 << 53) as f64 - 0.5,
            1.9e19,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            assert_eq!(ceil_ps(x), x.ceil() as Ps, "{x}");
        }
    }

    proptest::proptest! {
        #[test]
        fn ceil_ps_is_ceil(bits in proptest::num::u64::ANY, bytes in 0u64..1 << 40, gbs in 0.001f64..1e6) {
            let x = f64::from_bits(bits);
            proptest::prop_assert_eq!(ceil_ps(x), x.ceil() as Ps);
            // The durations the model computes.
            let d = bytes as f64 * 1000.0 / gbs;
            proptest::prop_assert_eq!(ceil_ps(d), d.ceil() as Ps);
        }
    }
}
