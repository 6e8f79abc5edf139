//! The shadow: accesses by physical range, checked against each other.

use rustc_hash::FxHashMap;

use kb_format::Extent;

use super::{Access, OpInfo, Race, Side};

impl Race {
    /// Earlier access `e` (of op `op`) against `acc`, first overlapping at
    /// `pa`.
    fn between(e: &Meta, op: OpInfo, acc: &Access, pa: u64, len: u64) -> Race {
        Race {
            first: Side {
                thread: e.thread,
                write: e.write,
                atomic: e.atomic,
                op,
            },
            second: Side {
                thread: acc.thread,
                write: acc.write,
                atomic: acc.atomic,
                op: acc.op,
            },
            pa,
            len,
        }
    }
}

/// What a walk reads of a recorded access: its thread, label and kind,
/// and the stamp of the last query that met it, in 16 bytes (four to a
/// cache line). Its extent travels with its id in the bucket lists
/// (`Item`), and its op is read only for a report.
#[derive(Debug, Clone, Copy, Default)]
struct Meta {
    thread: u32,
    label: u32,
    /// The query that last visited it.
    stamp: u32,
    write: bool,
    atomic: bool,
}

/// A recorded access in a bucket's list: its id and extent (which never
/// changes while it lives), so the walk skips those beside the access
/// without loading anything else.
type Item = (u32, Extent);

/// Bucket size: 64 KiB. A DMA tile's strided rows touch every bucket of
/// their span, each visited per access, so smaller buckets cost more
/// bucket visits than the entries they separate save: gemm_tiled 2048^3
/// on default ran 14 % faster with 64 KiB than with 16 KiB buckets, with
/// softmax and all-reduce unchanged.
const BUCKET_BITS: u32 = 16;

/// The accesses that touch one bucket: writes, and reads grouped by
/// thread. A read never races with a read, so a read access only needs
/// the writes (for races) and the reads it is ordered after and covers
/// (to replace them). A covered read starts inside the access, so it is
/// found in the bucket of its first byte (`heads`) alone; and a group
/// whose every label is past what the reader's clock has seen of its
/// thread is skipped whole. Without that, PEs reading many tiles of the
/// same rows would visit every one of them in every bucket.
#[derive(Debug, Default)]
struct Bucket {
    writes: Vec<Item>,
    /// Per read group: (thread, at most its least label; not raised on
    /// removal), apart from the ids so that skipping groups reads little.
    read_keys: Vec<(u32, u32)>,
    /// The groups, `read_keys`' in order; those past them are empty and
    /// kept with their vectors for the next threads (a group goes and
    /// comes back as a thread's reads do).
    reads: Vec<ReadGroup>,
}

#[derive(Debug, Default)]
struct ReadGroup {
    /// Reads whose first byte is in this bucket, with their extents (an
    /// entry's extent never changes while it lives): a read access checks
    /// its own thread's earlier reads for the ones it covers from here,
    /// without loading their entries (at 32 K-entry scale, a cache miss
    /// each; most of a read's walk in gemm_tiled, whose PEs read many
    /// tiles of the same rows).
    heads: Vec<Item>,
    /// Reads that start in an earlier bucket.
    rest: Vec<Item>,
}

/// Remove `id` from `ids` if it is there; whether it was.
fn take_id(ids: &mut Vec<Item>, id: u32) -> bool {
    match ids.iter().position(|i| i.0 == id) {
        Some(k) => {
            ids.swap_remove(k);
            true
        }
        None => false,
    }
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.read_keys.is_empty()
    }

    /// Add entry `id` (`e`, on `x`), which starts in this bucket when
    /// `head`.
    fn push(&mut self, id: u32, e: &Meta, x: &Extent, head: bool) {
        if e.write {
            self.writes.push((id, *x));
            return;
        }
        let gi = match self.read_keys.iter().position(|k| k.0 == e.thread) {
            Some(gi) => gi,
            None => {
                self.read_keys.push((e.thread, e.label));
                if self.reads.len() < self.read_keys.len() {
                    self.reads.push(ReadGroup::default());
                }
                self.read_keys.len() - 1
            }
        };
        let key = &mut self.read_keys[gi];
        key.1 = key.1.min(e.label);
        let g = &mut self.reads[gi];
        if head {
            g.heads.push((id, *x));
        } else {
            g.rest.push((id, *x));
        }
    }

    fn remove(&mut self, id: u32, e: &Meta) {
        if e.write {
            take_id(&mut self.writes, id);
            return;
        }
        if let Some(gi) = self.read_keys.iter().position(|k| k.0 == e.thread) {
            let g = &mut self.reads[gi];
            if !take_id(&mut g.heads, id) {
                take_id(&mut g.rest, id);
            }
            if g.heads.is_empty() && g.rest.is_empty() {
                // The last group takes its place; it goes to the spares.
                let last = self.read_keys.len() - 1;
                self.reads.swap(gi, last);
                self.read_keys.swap_remove(gi);
            }
        }
    }
}

const BLOCK_BITS: u32 = 6;

/// Buckets by number, in blocks of 64 neighbours: the rows of a tile fall
/// in a few blocks, so an access costs a hash lookup per block, not per
/// bucket.
#[derive(Debug, Default)]
struct Buckets {
    blocks: FxHashMap<u64, Block>,
    /// Blocks that went empty, kept for reuse with their buckets' vectors
    /// (accesses come and go over the same ranges; making and dropping
    /// blocks was most of the detector's allocation).
    spare: Vec<Block>,
}

#[derive(Debug)]
struct Block {
    /// Buckets in use; the block goes when none is.
    used: u32,
    buckets: Box<[Bucket]>,
}

impl Block {
    /// Bucket `b` of this block, if in use.
    fn bucket(&self, b: u64) -> Option<&Bucket> {
        let bucket = &self.buckets[(b & ((1 << BLOCK_BITS) - 1)) as usize];
        (!bucket.is_empty()).then_some(bucket)
    }
}

impl Buckets {
    /// Empty blocks kept at most (each about 64 buckets' vectors).
    const SPARE: usize = 256;

    fn get_or_insert(&mut self, b: u64) -> &mut Bucket {
        let spare = &mut self.spare;
        let block = self.blocks.entry(b >> BLOCK_BITS).or_insert_with(|| {
            spare.pop().unwrap_or_else(|| Block {
                used: 0,
                buckets: (0..1 << BLOCK_BITS).map(|_| Bucket::default()).collect(),
            })
        });
        let bucket = &mut block.buckets[(b & ((1 << BLOCK_BITS) - 1)) as usize];
        if bucket.is_empty() {
            block.used += 1;
        }
        bucket
    }

    /// Remove entry `id` (`e`) from bucket `b`.
    fn remove(&mut self, b: u64, id: u32, e: &Meta) {
        let Some(block) = self.blocks.get_mut(&(b >> BLOCK_BITS)) else {
            return;
        };
        let bucket = &mut block.buckets[(b & ((1 << BLOCK_BITS) - 1)) as usize];
        if bucket.is_empty() {
            return;
        }
        bucket.remove(id, e);
        if bucket.is_empty() {
            block.used -= 1;
            if block.used == 0
                && let Some(empty) = self.blocks.remove(&(b >> BLOCK_BITS))
                && self.spare.len() < Self::SPARE
            {
                self.spare.push(empty);
            }
        }
    }

    fn clear(&mut self) {
        self.blocks.clear();
    }
}

/// Accesses by physical range, bucketed by 64 KiB (`BUCKET_BITS`).
#[derive(Debug, Default)]
pub struct Shadow {
    /// Per entry id: what the walk reads (a free id's is stale).
    meta: Vec<Meta>,
    /// Per entry id: its extent and op, `None` while the id is free.
    entries: Vec<Option<(Extent, OpInfo)>>,
    free: Vec<u32>,
    buckets: Buckets,
    query: u32,
    /// Scratch: entries an access replaces.
    replaced: Vec<u32>,
    bucket_list: Vec<u64>,
    /// Scratch: the buckets of an entry being removed.
    removed_buckets: Vec<u64>,
}

/// `x`'s span: its first byte and past its last (empty if it has no
/// bytes).
#[inline(always)]
fn span(x: &Extent) -> (u64, u64) {
    match x.bytes() {
        0 => (x.pa, x.pa),
        _ => (x.pa, x.pa + (x.rows as u64 - 1) * x.stride + x.len),
    }
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
        if stride < len + (1 << BUCKET_BITS) {
            // No gap between rows holds a whole bucket, so every bucket
            // from the first row's to the last row's is touched: one
            // range, not a walk over the rows (a DMA tile's 128 rows cost
            // ~20 instructions each; gemm_tiled's reads were most of the
            // detector's instructions there).
            let end = pa + (rows - 1) * stride + len;
            out.extend(pa >> BUCKET_BITS..=(end - 1) >> BUCKET_BITS);
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
    /// the races it makes (at most one per earlier op), in the order of
    /// the earlier ops' ids.
    pub fn access(&mut self, x: &Extent, acc: &Access, races: &mut Vec<Race>) {
        self.query = self.query.wrapping_add(1);
        let mut buckets = std::mem::take(&mut self.bucket_list);
        Self::buckets_of(x, &mut buckets);
        self.replaced.clear();
        let found = races.len();
        let (lo, hi) = span(x);
        let mut v = Visit {
            dedupe: buckets.len() > 1,
            entries: &self.entries,
            meta: &mut self.meta,
            query: self.query,
            replaced: &mut self.replaced,
            x,
            span: (lo, hi),
            acc,
            races,
            last: (u32::MAX, 0),
        };
        let mut block: Option<(u64, Option<&Block>)> = None;
        for &b in &buckets {
            let key = b >> BLOCK_BITS;
            if block.is_none_or(|(k, _)| k != key) {
                block = Some((key, self.buckets.blocks.get(&key)));
            }
            if let Some(bucket) = block.and_then(|(_, bl)| bl?.bucket(b)) {
                v.walk(bucket, lo, hi);
            }
        }
        if races.len() > found + 1 {
            races[found..].sort_by_key(|r| r.first.op.op_id);
        }
        // The common case, a thread's access replacing its own earlier one
        // of the same bytes and kind (a kernel loading or storing the
        // same tile again): the entry takes the new access in place. The
        // buckets and groups it is in stay the same, and a read group's
        // least label stays a lower bound while labels do not go down.
        if let [id] = self.replaced[..]
            && let Some((ex, op)) = &mut self.entries[id as usize]
            && let e = &mut self.meta[id as usize]
            && e.thread == acc.thread
            && e.write == acc.write
            && e.atomic == acc.atomic
            && *ex == *x
            && e.label <= acc.label
        {
            e.label = acc.label;
            *op = acc.op;
            self.bucket_list = buckets;
            return;
        }
        for i in 0..self.replaced.len() {
            let id = self.replaced[i];
            self.remove(id);
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.entries.push(None);
                self.meta.push(Meta::default());
                (self.entries.len() - 1) as u32
            }
        };
        let meta = &mut self.meta[id as usize];
        // The stamp stays: a query that already met this id (the entry
        // it replaces) sees the new entry as met, which is right, since
        // the new one is the access itself.
        *meta = Meta {
            thread: acc.thread,
            label: acc.label,
            write: acc.write,
            atomic: acc.atomic,
            stamp: meta.stamp,
        };
        let meta = *meta;
        for (i, &b) in buckets.iter().enumerate() {
            self.buckets.get_or_insert(b).push(id, &meta, x, i == 0);
        }
        self.entries[id as usize] = Some((*x, acc.op));
        self.bucket_list = buckets;
    }

    fn remove(&mut self, id: u32) {
        let Some((x, _)) = self.entries[id as usize].take() else {
            return;
        };
        let e = self.meta[id as usize];
        let mut buckets = std::mem::take(&mut self.removed_buckets);
        buckets.clear();
        Self::buckets_of(&x, &mut buckets);
        for &b in &buckets {
            self.buckets.remove(b, id, &e);
        }
        self.removed_buckets = buckets;
        self.free.push(id);
    }

    /// Forget every access: all threads' later accesses are ordered after
    /// all of them (the host has waited for every launch).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.meta.clear();
        self.free.clear();
        self.buckets.clear();
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

/// One access's walk over the entries it may meet.
struct Visit<'a> {
    entries: &'a [Option<(Extent, OpInfo)>],
    meta: &'a mut [Meta],
    query: u32,
    replaced: &'a mut Vec<u32>,
    x: &'a Extent,
    /// `x`'s span (`span`).
    span: (u64, u64),
    acc: &'a Access,
    races: &'a mut Vec<Race>,
    /// The last thread looked up in the access's clock, and its component
    /// (a bucket's entries are mostly a few threads').
    last: (u32, u32),
    /// Whether an entry may be met twice (the access spans several
    /// buckets); in one bucket each entry is listed once, and the stamps
    /// are left alone.
    dedupe: bool,
}

impl Visit<'_> {
    /// The access's clock's component of thread `t`.
    fn seen(&mut self, t: u32) -> u32 {
        if self.last.0 != t {
            self.last = (t, self.acc.clock.get(t));
        }
        self.last.1
    }

    /// Walk `bucket` for the access (`lo..hi` its span): its writes, and
    /// the read groups it may race with or replace.
    fn walk(&mut self, bucket: &Bucket, lo: u64, hi: u64) {
        for item in &bucket.writes {
            self.visit(item);
        }
        let (acc_thread, acc_write) = (self.acc.thread, self.acc.write);
        for (gi, &(thread, min_label)) in bucket.read_keys.iter().enumerate() {
            // A read races only with a write, and replaces only reads
            // it is ordered after (its own thread's always are).
            if !acc_write && thread != acc_thread && self.seen(thread) < min_label {
                continue;
            }
            let g = &bucket.reads[gi];
            if !acc_write {
                // Reads: no race, only replacements, and a covered read
                // starts at a byte of `x`: those starting outside its
                // span are skipped here.
                if thread == acc_thread {
                    // Its own earlier reads: ordered before it. A read
                    // is a head in one bucket only and this walk visits
                    // no `rest`, so each is met once (no stamp needed).
                    for &(id, ex) in &g.heads {
                        if (lo..hi).contains(&ex.pa) && ex.bytes() > 0 && contains(self.x, &ex) {
                            self.replaced.push(id);
                        }
                    }
                } else {
                    for item in &g.heads {
                        if (lo..hi).contains(&item.1.pa) {
                            self.visit(item);
                        }
                    }
                }
                continue;
            }
            for item in &g.heads {
                self.visit(item);
            }
            for item in &g.rest {
                self.visit(item);
            }
        }
    }

    /// Check the access against entry `id` on `ex` (once per access): a
    /// race, a replacement, or nothing.
    #[inline(always)]
    fn visit(&mut self, item: &Item) {
        // Disjoint spans share no byte: neither a race (no overlap) nor a
        // replacement (no containment). Most entries met in a 64 KiB
        // bucket lie beside the access; this skips them on the list's
        // extent alone, before loading anything of theirs.
        let (elo, ehi) = span(&item.1);
        if ehi <= self.span.0 || self.span.1 <= elo {
            return;
        }
        self.visit_meeting(item);
    }

    /// Entry `id` (`e`) races with the access, first at `pa` for `len`
    /// bytes: record it unless its op already does.
    #[cold]
    #[inline(never)]
    fn race(&mut self, id: u32, e: &Meta, pa: u64, len: u64) {
        let op = self.entries[id as usize].as_ref().expect("live entry").1;
        let acc = self.acc;
        if !self
            .races
            .iter()
            .any(|r| r.first.op.op_id == op.op_id && r.second.op.op_id == acc.op.op_id)
        {
            self.races.push(Race::between(e, op, acc, pa, len));
        }
    }

    /// [`Visit::visit`] of an entry whose span meets the access's.
    #[inline(never)]
    fn visit_meeting(&mut self, &(id, ref ex): &Item) {
        let e = &mut self.meta[id as usize];
        if self.dedupe {
            if e.stamp == self.query {
                return;
            }
            e.stamp = self.query;
        }
        let e = *e;
        let (x, acc) = (self.x, self.acc);
        let ordered = e.thread == acc.thread || self.seen(e.thread) >= e.label;
        if !ordered {
            // Unordered reads never race, nor do two atomics: skip the
            // (row by row) overlap.
            if !(e.write || acc.write) || (e.atomic && acc.atomic) {
                return;
            }
            if let Some((pa, len)) = overlap(ex, x) {
                self.race(id, &e, pa, len);
            }
        } else if (acc.write || !e.write)
            && (!acc.atomic || e.atomic)
            && ex.bytes() > 0
            && contains(x, ex)
        {
            // Contained and not empty: they overlap. An atomic replaces
            // only atomics: a plain access it covered may still race with
            // a later atomic of another thread.
            self.replaced.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::race::Clock;

    const BUCKET: u64 = 1 << BUCKET_BITS;

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
        acc_kind(thread, label, clock, write as u8, op_id)
    }

    /// An access of kind `kind`: 0 a read, 1 a write, 2 an atomic.
    fn acc_kind(thread: u32, label: u32, clock: &[u32], kind: u8, op_id: u64) -> Access {
        Access {
            thread,
            label,
            clock: Rc::new(Clock::from_dense(clock)),
            write: kind > 0,
            atomic: kind == 2,
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
    fn two_atomics_never_race_but_an_atomic_and_a_plain_access_do() {
        let mut s = Shadow::default();
        let mut races = Vec::new();
        let r = x(1 << 20, 256, 1, 0);
        // Threads 0 and 1 update the same bytes atomically, unordered.
        s.access(&r, &acc_kind(0, 1, &[1, 0, 0], 2, 1), &mut races);
        s.access(&r, &acc_kind(1, 1, &[0, 1, 0], 2, 2), &mut races);
        assert!(races.is_empty(), "{races:?}");
        // Thread 2 reads them plainly: it races with both atomics.
        s.access(&r, &acc_kind(2, 1, &[0, 0, 1], 0, 3), &mut races);
        assert_eq!(races.len(), 2, "{races:?}");
        assert!(races.iter().all(|r| r.first.atomic && !r.second.atomic));
        // A plain write of thread 0 covered by its own later atomic still
        // races with thread 1's atomic (the atomic did not replace it).
        let mut s = Shadow::default();
        races.clear();
        s.access(&r, &acc_kind(0, 1, &[1, 0], 1, 1), &mut races);
        s.access(&r, &acc_kind(0, 1, &[1, 0], 2, 2), &mut races);
        assert_eq!(s.len(), 2);
        s.access(&r, &acc_kind(1, 1, &[0, 1], 2, 3), &mut races);
        assert_eq!(races.len(), 1, "{races:?}");
        assert_eq!((races[0].first.op.op_id, races[0].second.op.op_id), (1, 3));
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

    /// A read replaces its own thread's earlier reads that start inside
    /// its span and that it covers (found among its buckets' heads), and
    /// no others: not one starting at its end, nor one it only partly
    /// covers. A strided read, one bucket and several.
    #[test]
    fn a_read_replaces_its_own_covered_reads_and_no_others() {
        for (base, stride) in [(1 << 20, 256), (1 << 20, BUCKET)] {
            let mut s = Shadow::default();
            let mut races = Vec::new();
            let read = |s: &mut Shadow, races: &mut Vec<Race>, x: Extent, id| {
                s.access(&x, &acc(0, 1, &[1], false, id), races)
            };
            // Four 64-byte columns of 4 rows, one past the end, one
            // straddling the end.
            for k in 0..4 {
                read(&mut s, &mut races, x(base + k * 64, 64, 4, stride), k);
            }
            read(&mut s, &mut races, x(base + 256, 64, 4, stride), 4);
            read(&mut s, &mut races, x(base + 224, 64, 4, stride), 5);
            assert_eq!(s.len(), 6);
            // Columns 0..256 of the same rows cover the first four.
            read(&mut s, &mut races, x(base, 256, 4, stride), 6);
            assert_eq!(s.len(), 3, "stride {stride}");
            assert!(races.is_empty());
        }
    }

    /// A recorded access, whole, as the naive walk keeps it.
    #[derive(Debug, Clone)]
    struct Entry {
        x: Extent,
        thread: u32,
        label: u32,
        write: bool,
        atomic: bool,
        op: OpInfo,
    }

    /// The same decisions as [`Shadow`], by walking every access ever
    /// recorded: no buckets, no groups, no skipping.
    #[derive(Default)]
    struct Naive {
        entries: Vec<Entry>,
    }

    impl Naive {
        fn access(&mut self, x: &Extent, acc: &Access, races: &mut Vec<Race>) {
            let mut keep = Vec::new();
            for e in self.entries.drain(..) {
                let ordered = e.thread == acc.thread || acc.clock.get(e.thread) >= e.label;
                let meet = overlap(&e.x, x);
                if let Some((pa, len)) = meet
                    && !ordered
                    && (e.write || acc.write)
                    && !(e.atomic && acc.atomic)
                {
                    if !races.iter().any(|r| {
                        r.first.op.op_id == e.op.op_id && r.second.op.op_id == acc.op.op_id
                    }) {
                        races.push(Race {
                            first: Side {
                                thread: e.thread,
                                write: e.write,
                                atomic: e.atomic,
                                op: e.op,
                            },
                            second: Side {
                                thread: acc.thread,
                                write: acc.write,
                                atomic: acc.atomic,
                                op: acc.op,
                            },
                            pa,
                            len,
                        });
                    }
                } else if meet.is_some()
                    && ordered
                    && (acc.write || !e.write)
                    && (!acc.atomic || e.atomic)
                    && contains(x, &e.x)
                {
                    continue;
                }
                keep.push(e);
            }
            keep.push(Entry {
                x: *x,
                thread: acc.thread,
                label: acc.label,
                write: acc.write,
                atomic: acc.atomic,
                op: acc.op,
            });
            self.entries = keep;
        }
    }

    /// Access `ext` with `a` (the `i`th access) in both: the same races,
    /// and as many accesses kept after.
    fn same_access(
        shadow: &mut Shadow,
        naive: &mut Naive,
        ext: &Extent,
        a: &Access,
        i: usize,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        shadow.access(ext, a, &mut got);
        naive.access(ext, a, &mut want);
        want.sort_by_key(|r| r.first.op.op_id);
        proptest::prop_assert_eq!(&got, &want, "access {}", i);
        proptest::prop_assert_eq!(shadow.len(), naive.entries.len(), "after access {}", i);
        Ok(())
    }

    /// The buckets every row of `x` touches, row by row: what
    /// `Shadow::buckets_of` lists without walking the rows when no gap
    /// between rows holds a whole bucket.
    fn buckets_row_by_row(x: &Extent) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        let rows = x.rows.max(1) as u64;
        if x.len == 0 || x.rows == 0 {
            return out;
        }
        for r in 0..rows {
            let s = x.pa + r * if x.rows > 1 { x.stride } else { 0 };
            for b in s >> BUCKET_BITS..=(s + x.len - 1) >> BUCKET_BITS {
                if !out.contains(&b) {
                    out.push(b);
                }
            }
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn buckets_of_strided_rows() {
        let mut got = Vec::new();
        // 4 rows of 64 bytes, 16 KiB apart, from just below bucket 1: the
        // gaps are smaller than a bucket, so buckets 0 and 1 both.
        Shadow::buckets_of(&x(BUCKET - 32, 64, 4, 16 << 10), &mut got);
        assert_eq!(got, [0, 1]);
        // Rows a bucket and a half apart skip the buckets in the gaps.
        Shadow::buckets_of(&x(0, 64, 4, BUCKET * 3 / 2), &mut got);
        assert_eq!(got, [0, 1, 3, 4]);
        // Overlapping rows (stride below the length), and stride 0.
        Shadow::buckets_of(&x(BUCKET - 8, 100, 3, 10), &mut got);
        assert_eq!(got, [0, 1]);
        Shadow::buckets_of(&x(BUCKET * 5, 8, 3, 0), &mut got);
        assert_eq!(got, [5]);
        Shadow::buckets_of(&x(BUCKET * 5, 0, 3, 64), &mut got);
        assert!(got.is_empty());
    }

    proptest::proptest! {
        /// `buckets_of` lists the buckets the rows touch, in order, once
        /// each, for any row length, count and stride (gaps around a
        /// bucket's size).
        #[test]
        fn buckets_of_lists_what_the_rows_touch(
            pa in 0u64..4 * BUCKET,
            len in 0u64..BUCKET * 3 / 2,
            rows in 0u32..6,
            stride in 0u64..BUCKET * 3,
        ) {
            let ext = x(pa, len, rows, stride);
            let mut got = Vec::new();
            Shadow::buckets_of(&ext, &mut got);
            proptest::prop_assert_eq!(got, buckets_row_by_row(&ext));
        }

        /// Buckets, blocks, read groups and the skips give the races and
        /// the replacements of a walk over every recorded access (extents
        /// across bucket and block boundaries, any clocks).
        #[test]
        fn shadow_decides_as_a_walk_over_every_access(
            ops in proptest::collection::vec(
                (0u64..6 * BUCKET, 1u64..BUCKET * 5 / 4, 1u32..5, 0u64..BUCKET * 5 / 2, 0u32..3, 0u32..4,
                 proptest::collection::vec(0u32..4, 3), 0u8..3),
                1..60,
            )
        ) {
            let mut shadow = Shadow::default();
            let mut naive = Naive::default();
            for (i, (off, len, rows, gap, thread, label, clock, write)) in ops.into_iter().enumerate() {
                // Around a block boundary, over a few buckets each way.
                let pa = (1 << (BUCKET_BITS + BLOCK_BITS)) - 3 * BUCKET + off;
                let ext = x(pa, len, rows, if rows > 1 { len + gap } else { 0 });
                let a = acc_kind(thread, label, &clock, write, i as u64);
                same_access(&mut shadow, &mut naive, &ext, &a, i)?;
            }
        }

        /// The same with accesses drawn from three extents, so that threads
        /// access the same bytes again and again (the in-place replacement
        /// of a thread's own access), with labels that may go down.
        #[test]
        fn shadow_decides_as_a_walk_over_repeated_accesses(
            pool in proptest::collection::vec((0u64..4 * BUCKET, 1u64..BUCKET * 3 / 2, 1u32..4, 0u64..BUCKET), 3),
            ops in proptest::collection::vec(
                (0usize..3, 0u32..3, 0u32..4, proptest::collection::vec(0u32..4, 3), 0u8..3),
                1..80,
            )
        ) {
            let mut shadow = Shadow::default();
            let mut naive = Naive::default();
            let base = (1 << (BUCKET_BITS + BLOCK_BITS)) - 2 * BUCKET;
            for (i, (k, thread, label, clock, write)) in ops.into_iter().enumerate() {
                let (off, len, rows, gap) = pool[k];
                let ext = x(base + off, len, rows, if rows > 1 { len + gap } else { 0 });
                let a = acc_kind(thread, label, &clock, write, i as u64);
                same_access(&mut shadow, &mut naive, &ext, &a, i)?;
            }
        }
    }
}
