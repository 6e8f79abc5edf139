//! Race detection: the happens-before order Phase 1 knows, and the
//! accesses checked against it.
//!
//! Threads are the PEs (dense index) and the host (the last index). Each
//! has a vector clock ([`Clocks`]); its own component counts its releases.
//! A release (a signal, a barrier arrival, a copy that notifies, a
//! kernel's end, a launch by the host) publishes the thread's clock and
//! then advances its own component; an acquire (a satisfied signal wait, a
//! barrier release, a kernel's start, the host's wait for a launch) joins
//! a published clock into the thread's. An access is labelled with its
//! thread and the thread's own component when it was issued, and carries
//! the thread's clock at issue: access `e` (thread u, label c) is ordered
//! before access `a` of another thread iff `a`'s clock has `[u] >= c`.
//!
//! The engine makes every release fence what it covers (it waits for the
//! effects issued before it), so an access issued before a release has
//! happened when the release is published.
//!
//! [`Shadow`] keeps the accesses that a later one may race with, by
//! physical range: two accesses of different threads to overlapping bytes,
//! one a write, neither ordered before the other, are a race. An access
//! that is ordered after an earlier one and covers all of its bytes
//! replaces it (a write replaces anything; a read replaces reads): any
//! later access that would race with the earlier one races with it too.

use std::rc::Rc;

use rustc_hash::FxHashMap;

use kb_format::{Extent, Ps};

/// Per-thread vector clocks.
#[derive(Debug)]
pub struct Clocks {
    vc: Vec<Vec<u32>>,
    /// Per thread: its clock as last snapshotted, until it acquires again
    /// (a release changes only the own component, which checks never read).
    snap: Vec<Option<Rc<[u32]>>>,
}

impl Clocks {
    /// Clocks of `threads` threads: each at 1 in its own component (its
    /// first label) and 0 elsewhere (nothing acquired), so no access is
    /// ordered before another thread until a release reaches it.
    pub fn new(threads: usize) -> Clocks {
        let vc = (0..threads)
            .map(|t| {
                let mut v = vec![0; threads];
                v[t] = 1;
                v
            })
            .collect();
        Clocks {
            vc,
            snap: vec![None; threads],
        }
    }

    /// The label of an access `t` issues now.
    pub fn label(&self, t: u32) -> u32 {
        self.vc[t as usize][t as usize]
    }

    /// `t`'s clock, shared until it next acquires.
    pub fn snapshot(&mut self, t: u32) -> Rc<[u32]> {
        let t = t as usize;
        self.snap[t]
            .get_or_insert_with(|| self.vc[t].as_slice().into())
            .clone()
    }

    /// Publish `t`'s clock and advance its own component.
    pub fn release(&mut self, t: u32) -> Vec<u32> {
        let t = t as usize;
        let published = self.vc[t].clone();
        self.vc[t][t] = self.vc[t][t].saturating_add(1);
        published
    }

    /// Join a published clock into `t`'s.
    pub fn acquire(&mut self, t: u32, published: &[u32]) {
        let t = t as usize;
        let mut changed = false;
        for (mine, &theirs) in self.vc[t].iter_mut().zip(published) {
            if theirs > *mine {
                *mine = theirs;
                changed = true;
            }
        }
        if changed {
            self.snap[t] = None;
        }
    }
}

/// Join `b` into `a` (component-wise maximum).
pub fn join(a: &mut Vec<u32>, b: &[u32]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, &y) in a.iter_mut().zip(b) {
        *x = (*x).max(y);
    }
}

/// What an access belongs to, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    pub op_id: u64,
    pub op_name: &'static str,
    /// The launch whose kernel issued it.
    pub launch: u32,
    /// When its effect happened.
    pub time: Ps,
}

/// An access about to be applied.
#[derive(Debug, Clone)]
pub struct Access {
    pub thread: u32,
    pub label: u32,
    /// The thread's clock when the op was issued.
    pub clock: Rc<[u32]>,
    pub write: bool,
    pub op: OpInfo,
}

/// One side of a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    pub thread: u32,
    pub write: bool,
    pub op: OpInfo,
}

/// Two unordered accesses to overlapping bytes, one a write: `first` was
/// applied before `second` in this run; `bytes` is where they first
/// overlap (PA and length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Race {
    pub first: Side,
    pub second: Side,
    pub pa: u64,
    pub len: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    x: Extent,
    thread: u32,
    label: u32,
    write: bool,
    op: OpInfo,
}

const BUCKET_BITS: u32 = 14;

/// Accesses by physical range, bucketed by 16 KiB.
#[derive(Debug, Default)]
pub struct Shadow {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    buckets: FxHashMap<u64, Vec<u32>>,
    /// Per entry: the query that last visited it.
    stamp: Vec<u32>,
    query: u32,
    /// Scratch: entries an access replaces.
    replaced: Vec<u32>,
    bucket_list: Vec<u64>,
}

/// `(pa, len, rows, stride)` with touching rows merged into one.
fn norm(x: &Extent) -> (u64, u64, u64, u64) {
    if x.rows <= 1 || x.stride == x.len {
        (x.pa, x.bytes(), 1, 0)
    } else {
        (x.pa, x.len, x.rows as u64, x.stride)
    }
}

/// The first row of `x` that meets `[lo, hi)`, as the overlap's range.
fn meet(x: (u64, u64, u64, u64), lo: u64, hi: u64) -> Option<(u64, u64)> {
    let (pa, len, rows, stride) = x;
    if len == 0 || rows == 0 || hi <= pa {
        return None;
    }
    let last = if rows == 1 || stride == 0 {
        0
    } else {
        ((hi - 1 - pa) / stride).min(rows - 1)
    };
    let first = if lo < pa.saturating_add(len) {
        0
    } else {
        (lo - pa - len).checked_div(stride)? + 1
    };
    if first > last {
        return None;
    }
    let start = pa + first * stride;
    let s = start.max(lo);
    let e = (start + len).min(hi);
    (s < e).then_some((s, e - s))
}

/// Where `a` and `b` first overlap, exactly (row by row).
pub fn overlap(a: &Extent, b: &Extent) -> Option<(u64, u64)> {
    let (na, nb) = (norm(a), norm(b));
    let (few, many) = if na.2 <= nb.2 { (na, nb) } else { (nb, na) };
    (0..few.2).find_map(|r| {
        let s = few.0 + r * few.3;
        meet(many, s, s + few.1)
    })
}

/// Whether every byte of `small` is a byte of `big` (exact for contiguous
/// `big` and for rows of equal stride; otherwise a conservative `false`).
pub fn contains(big: &Extent, small: &Extent) -> bool {
    let (bp, bl, br, bs) = norm(big);
    let (sp, sl, sr, ss) = norm(small);
    if sp < bp {
        return false;
    }
    if br == 1 {
        let span = (sr - 1) * ss + sl;
        return sp + span <= bp + bl;
    }
    if sr > 1 && ss != bs {
        return false;
    }
    let off = sp - bp;
    let (r0, within) = (off / bs, off % bs);
    within + sl <= bl && r0 + sr <= br
}

impl Shadow {
    /// Buckets the rows of `x` touch, in order, once each.
    fn buckets_of(x: &Extent, out: &mut Vec<u64>) {
        out.clear();
        let (pa, len, rows, stride) = norm(x);
        if len == 0 {
            return;
        }
        for r in 0..rows {
            let s = pa + r * stride;
            let (b0, b1) = (s >> BUCKET_BITS, (s + len - 1) >> BUCKET_BITS);
            for b in b0..=b1 {
                if out.last().is_none_or(|&l| l < b) {
                    out.push(b);
                }
            }
        }
    }

    /// Check `acc` on `x` against earlier accesses and record it. Returns
    /// the races it makes (at most one per earlier op).
    pub fn access(&mut self, x: &Extent, acc: &Access, races: &mut Vec<Race>) {
        self.query = self.query.wrapping_add(1);
        let mut buckets = std::mem::take(&mut self.bucket_list);
        Self::buckets_of(x, &mut buckets);
        self.replaced.clear();
        for b in &buckets {
            let Some(ids) = self.buckets.get(b) else {
                continue;
            };
            for &id in ids {
                if self.stamp[id as usize] == self.query {
                    continue;
                }
                self.stamp[id as usize] = self.query;
                let e = self.entries[id as usize].as_ref().expect("live entry");
                let Some((pa, len)) = overlap(&e.x, x) else {
                    continue;
                };
                let ordered = e.thread == acc.thread
                    || acc
                        .clock
                        .get(e.thread as usize)
                        .is_some_and(|&c| c >= e.label);
                if !ordered && (e.write || acc.write) {
                    if !races.iter().any(|r| {
                        r.first.op.op_id == e.op.op_id && r.second.op.op_id == acc.op.op_id
                    }) {
                        races.push(Race {
                            first: Side {
                                thread: e.thread,
                                write: e.write,
                                op: e.op,
                            },
                            second: Side {
                                thread: acc.thread,
                                write: acc.write,
                                op: acc.op,
                            },
                            pa,
                            len,
                        });
                    }
                } else if ordered && (acc.write || !e.write) && contains(x, &e.x) {
                    self.replaced.push(id);
                }
            }
        }
        for i in 0..self.replaced.len() {
            let id = self.replaced[i];
            self.remove(id);
        }
        let entry = Entry {
            x: *x,
            thread: acc.thread,
            label: acc.label,
            write: acc.write,
            op: acc.op,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = Some(entry);
                id
            }
            None => {
                self.entries.push(Some(entry));
                self.stamp.push(0);
                (self.entries.len() - 1) as u32
            }
        };
        for &b in &buckets {
            self.buckets.entry(b).or_default().push(id);
        }
        self.bucket_list = buckets;
    }

    fn remove(&mut self, id: u32) {
        let Some(e) = self.entries[id as usize].take() else {
            return;
        };
        let mut buckets = Vec::new();
        Self::buckets_of(&e.x, &mut buckets);
        for b in buckets {
            if let Some(ids) = self.buckets.get_mut(&b) {
                if let Some(k) = ids.iter().position(|&i| i == id) {
                    ids.swap_remove(k);
                }
                if ids.is_empty() {
                    self.buckets.remove(&b);
                }
            }
        }
        self.free.push(id);
    }

    /// Forget every access: all threads' later accesses are ordered after
    /// all of them (the host has waited for every launch).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.free.clear();
        self.buckets.clear();
        self.stamp.clear();
    }

    /// Accesses recorded.
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Whether no access is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(pa: u64, len: u64, rows: u32, stride: u64) -> Extent {
        Extent {
            pa,
            len,
            rows,
            stride,
        }
    }

    #[test]
    fn overlap_is_exact_for_strided_rows() {
        // Columns [0, 64) and [64, 128) of 4 rows 256 bytes apart: disjoint.
        let left = x(0, 64, 4, 256);
        let right = x(64, 64, 4, 256);
        assert_eq!(overlap(&left, &right), None);
        // A contiguous range over row 2's left part meets it at 512.
        assert_eq!(overlap(&left, &x(500, 20, 1, 0)), Some((512, 8)));
        // Two strided extents offset by half a row overlap in row 1.
        assert_eq!(
            overlap(&x(0, 100, 3, 200), &x(150, 100, 2, 1000)),
            Some((200, 50))
        );
        assert_eq!(overlap(&x(0, 10, 1, 0), &x(10, 10, 1, 0)), None);
    }

    #[test]
    fn containment_of_rows_and_ranges() {
        assert!(contains(&x(0, 1024, 1, 0), &x(0, 64, 4, 256)));
        assert!(!contains(&x(0, 800, 1, 0), &x(0, 64, 4, 256)));
        assert!(contains(&x(0, 128, 4, 256), &x(256 + 64, 64, 2, 256)));
        assert!(!contains(&x(0, 128, 4, 256), &x(256 + 100, 64, 2, 256)));
        assert!(!contains(&x(0, 128, 2, 256), &x(256, 64, 2, 256)));
    }

    fn acc(thread: u32, label: u32, clock: &[u32], write: bool, op_id: u64) -> Access {
        Access {
            thread,
            label,
            clock: clock.into(),
            write,
            op: OpInfo {
                op_id,
                op_name: "op",
                launch: 0,
                time: op_id * 10,
            },
        }
    }

    #[test]
    fn unordered_write_and_read_race_and_ordered_ones_do_not() {
        let mut s = Shadow::default();
        let mut races = Vec::new();
        let r = x(1 << 20, 4096, 1, 0);
        // Thread 0 writes at label 1; thread 1 reads having seen nothing.
        s.access(&r, &acc(0, 1, &[1, 0], true, 1), &mut races);
        s.access(&r, &acc(1, 1, &[0, 1], false, 2), &mut races);
        assert_eq!(races.len(), 1);
        assert_eq!((races[0].first.op.op_id, races[0].second.op.op_id), (1, 2));
        assert_eq!((races[0].pa, races[0].len), (1 << 20, 4096));
        // Thread 1 reads again after acquiring thread 0's release of label 1.
        races.clear();
        s.access(&r, &acc(1, 2, &[1, 2], false, 3), &mut races);
        assert!(races.is_empty(), "{races:?}");
        // Two reads never race.
        s.access(&r, &acc(0, 2, &[2, 0], false, 4), &mut races);
        assert!(races.is_empty());
    }

    #[test]
    fn a_covering_ordered_write_replaces_what_it_covers() {
        let mut s = Shadow::default();
        let mut races = Vec::new();
        for k in 0..4 {
            s.access(
                &x(k * 64, 64, 1, 0),
                &acc(0, 0, &[0, 0], false, k),
                &mut races,
            );
        }
        assert_eq!(s.len(), 4);
        // Thread 0's own write over all of them replaces them.
        s.access(&x(0, 256, 1, 0), &acc(0, 0, &[0, 0], true, 9), &mut races);
        assert_eq!(s.len(), 1);
        // A read of thread 1 ordered after it does not replace a write.
        s.access(&x(0, 256, 1, 0), &acc(1, 0, &[1, 0], false, 10), &mut races);
        assert_eq!(s.len(), 2);
        assert!(races.is_empty());
        s.clear();
        assert!(s.is_empty());
    }

    #[test]
    fn clocks_publish_then_advance() {
        let mut c = Clocks::new(3);
        assert_eq!(c.label(0), 1);
        let p = c.release(0);
        assert_eq!(p, vec![1, 0, 0]);
        assert_eq!(c.label(0), 2);
        c.acquire(2, &p);
        let before = c.snapshot(1);
        c.acquire(1, &[5, 0, 0]);
        assert_eq!(&*before, &[0, 1, 0]);
        assert_eq!(&*c.snapshot(1), &[5, 1, 0]);
        let mut j = vec![1, 7];
        join(&mut j, &[3, 2, 4]);
        assert_eq!(j, vec![3, 7, 4]);
    }
}
