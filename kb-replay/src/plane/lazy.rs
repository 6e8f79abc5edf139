//! Lazy copies: where the logical bytes of a range are not its own.
//!
//! An *alias* says that the logical bytes of a contiguous range (its
//! target) are the physical bytes of a list of extents (its source): a
//! memory op whose copy replay has not done (`engine::plan` makes them:
//! a DMA into TCM, a host write into HBM). Resolving a logical range gives
//! the physical extents that hold its bytes ([`Lazy::resolve_into`]), so
//! an op reads its operands where they are, and a chain of copies resolves
//! to the first source.
//!
//! Invariants, kept by the callers ([`super::DataPlane`] and the engine's
//! planner):
//!
//! - targets are disjoint, and a source never overlaps its own target;
//! - a source's physical bytes stay as they were when the alias was made:
//!   before anything writes physical bytes that a source covers, the alias
//!   is materialized (its source copied to its target,
//!   [`Lazy::take_sourced`]); a logical write to a target trims or drops
//!   the alias ([`Lazy::clear_target`]);
//! - when an alias is made its source overlaps no live target, so the
//!   aliases that must be materialized before another can be form no
//!   cycle (each depends only on older ones), and aliases removed
//!   together are handed out oldest first, the order that keeps each
//!   source's bytes until its alias is copied.

use kb_format::Extent;
use rustc_hash::FxHashMap;

use super::{mem_key, span};

/// One lazy copy: `len` bytes at `start` are, logically, the bytes of
/// `src` (in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub start: u64,
    pub len: u64,
    pub src: Vec<Extent>,
}

impl Alias {
    /// The target as an extent.
    pub fn target(&self) -> Extent {
        Extent::contiguous(self.start, self.len)
    }
}

/// Spans of extents by memory, to find those overlapping a range: per
/// memory an unsorted list, entries removed lazily (an entry whose id's
/// generation moved on is stale and skipped, and dropped when the list
/// has more stale entries than live ones). Adding and removing cost
/// nothing much; a query scans the memory's list, and queries come with
/// physical writes, which most memories that hold sources rarely see.
#[derive(Debug, Default)]
pub(crate) struct SpanIndex {
    maps: FxHashMap<u64, SpanList>,
    /// Generation of each id: entries of older generations are stale.
    gens: Vec<u32>,
}

#[derive(Debug, Default)]
struct SpanList {
    /// (start, end, id, part, generation)
    entries: Vec<(u64, u64, u32, u32, u32)>,
    live: usize,
}

impl SpanIndex {
    fn gen_of(&mut self, id: u32) -> u32 {
        if self.gens.len() <= id as usize {
            self.gens.resize(id as usize + 1, 0);
        }
        self.gens[id as usize]
    }

    /// Index part `part` of id `id`.
    pub(crate) fn insert(&mut self, e: &Extent, id: u32, part: u32) {
        let Some((s, end)) = span(e) else { return };
        let g = self.gen_of(id);
        let list = self.maps.entry(mem_key(s)).or_default();
        list.entries.push((s, end, id, part, g));
        list.live += 1;
    }

    /// Forget every part of `id` (its entries become stale); `parts`
    /// says in which memories they lie.
    pub(crate) fn remove_id(&mut self, id: u32, parts: &[Extent]) {
        self.gen_of(id);
        self.gens[id as usize] = self.gens[id as usize].wrapping_add(1);
        for e in parts {
            let Some((s, _)) = span(e) else { continue };
            let gens = &self.gens;
            if let Some(list) = self.maps.get_mut(&mem_key(s)) {
                list.live = list.live.saturating_sub(1);
                if list.entries.len() > 2 * list.live + 64 {
                    list.entries
                        .retain(|&(_, _, id, _, g)| gens.get(id as usize) == Some(&g));
                    list.live = list.entries.len();
                }
            }
        }
    }

    /// Call `f(id, part)` for every live entry whose span overlaps `[s, e)`.
    pub(crate) fn query(&self, s: u64, e: u64, mut f: impl FnMut(u32, u32)) {
        let Some(list) = self.maps.get(&mem_key(s)) else {
            return;
        };
        for &(start, end, id, part, g) in &list.entries {
            if end > s && start < e && self.gens.get(id as usize) == Some(&g) {
                f(id, part);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.maps.values().all(|l| {
            l.entries
                .iter()
                .all(|&(_, _, id, _, g)| self.gens.get(id as usize) != Some(&g))
        })
    }
}

/// The rows of `e` (first, last; inclusive) that meet `[lo, hi)`; a
/// contiguous extent is one row.
fn rows_meeting(e: &Extent, lo: u64, hi: u64) -> Option<(u64, u64)> {
    if e.len == 0 || e.rows == 0 || lo >= hi {
        return None;
    }
    if e.rows <= 1 || e.stride == 0 {
        return (e.pa < hi && lo < e.pa + e.len).then_some((0, 0));
    }
    // Rows j with pa + j*stride < hi and pa + j*stride + len > lo.
    let (pa, st, len) = (e.pa as i128, e.stride as i128, e.len as i128);
    let (lo, hi) = (lo as i128, hi as i128);
    let first = if lo - len - pa < 0 {
        0
    } else {
        (lo - len - pa) / st + 1
    };
    if hi - 1 - pa < 0 {
        return None;
    }
    let last = ((hi - 1 - pa) / st).min(e.rows as i128 - 1);
    (first <= last).then_some((first as u64, last as u64))
}

/// Whether two extents share a byte (exactly, row by row).
pub fn overlaps(a: &Extent, b: &Extent) -> bool {
    let (Some((as_, ae)), Some((bs, be))) = (span(a), span(b)) else {
        return false;
    };
    if as_ >= be || bs >= ae {
        return false;
    }
    // Walk the rows of the one with fewer, asking the other.
    let (x, y) = if a.rows <= b.rows { (a, b) } else { (b, a) };
    let rows = if x.rows <= 1 { 1 } else { x.rows as u64 };
    let stride = if x.rows <= 1 { 0 } else { x.stride };
    (0..rows).any(|r| {
        let lo = x.pa + r * stride;
        rows_meeting(y, lo, lo + x.len).is_some()
    })
}

/// Append the run `[addr, addr + len)` to `out`, joining it to the last
/// extent when it continues it in the same memory (back to back, or the
/// next row at the same stride).
pub fn push_run(out: &mut Vec<Extent>, addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    if let Some(last) = out.last_mut()
        && mem_key(last.pa) == mem_key(addr)
    {
        if last.rows <= 1 && last.pa + last.len == addr {
            last.len += len;
            return;
        }
        if last.len == len {
            let next = if last.rows <= 1 {
                // A second row of the same length starts a stride.
                (addr > last.pa + last.len).then(|| addr - last.pa)
            } else {
                (last.pa + last.rows as u64 * last.stride == addr).then_some(last.stride)
            };
            if let Some(stride) = next
                && last.rows < u32::MAX
            {
                if last.rows <= 1 {
                    last.rows = 2;
                    last.stride = stride;
                } else {
                    last.rows += 1;
                }
                return;
            }
        }
    }
    out.push(Extent::contiguous(addr, len));
}

/// [`push_run`] of `n` rows of `len` bytes, `stride` apart, in order; the
/// same extents, but rows that extend a strided extent join it at once
/// rather than one call each.
fn push_rows(out: &mut Vec<Extent>, pa: u64, len: u64, n: u64, stride: u64) {
    let mut r = 0;
    while r < n {
        push_run(out, pa + r * stride, len);
        r += 1;
        // What push_run would do with each of the rows left: the next row
        // is where the last extent's next row would be.
        if let Some(last) = out.last_mut()
            && r < n
            && last.rows > 1
            && last.len == len
            && last.stride == stride
            && last.pa + last.rows as u64 * stride == pa + r * stride
            && mem_key(last.pa) == mem_key(pa + r * stride)
        {
            let k = (n - r).min((u32::MAX - last.rows) as u64);
            last.rows += k as u32;
            r += k;
        }
    }
}

/// What resolving `q` row by row through an alias gives, without walking
/// the rows, when `q` lies wholly in the alias (its first byte `off` into
/// it) and the alias's one source `src` is strided: if each row of `q`
/// falls in one source row at the same column (a DMA reading a tile of a
/// panel a host write brought), the rows are the source's at a fixed step.
/// False, with nothing appended, otherwise.
fn rows_of_strided_source(q: &Extent, off: u64, src: &Extent, out: &mut Vec<Extent>) -> bool {
    let (rows, stride) = if q.rows <= 1 {
        (1, 0)
    } else {
        (q.rows as u64, q.stride)
    };
    if src.len == 0 || off % src.len + q.len > src.len || !stride.is_multiple_of(src.len) {
        return false;
    }
    let Some(step) = (stride / src.len).checked_mul(src.stride) else {
        return false;
    };
    let pa = src.pa + (off / src.len) * src.stride + off % src.len;
    push_rows(out, pa, q.len, rows, step);
    true
}

/// Append bytes `off..off + len` of the data of `src` (in order) to `out`.
pub fn slice_into(src: &[Extent], off: u64, len: u64, out: &mut Vec<Extent>) {
    let (mut at, end) = (0u64, off + len);
    for e in src {
        let n = e.bytes();
        if at + n <= off {
            at += n;
            continue;
        }
        if at >= end {
            break;
        }
        let (lo, hi) = (off.max(at) - at, end.min(at + n) - at);
        let dense = e.rows <= 1 || e.stride == e.len;
        if dense {
            push_run(out, e.pa + lo, hi - lo);
        } else {
            let (r0, c0) = (lo / e.len, lo % e.len);
            let (r1, c1) = (hi / e.len, hi % e.len);
            let row = |r: u64| e.pa + r * e.stride;
            if r0 == r1 {
                push_run(out, row(r0) + c0, c1 - c0);
            } else {
                let mut first = r0;
                if c0 > 0 {
                    push_run(out, row(r0) + c0, e.len - c0);
                    first += 1;
                }
                let full = r1 - first;
                if full == 1 {
                    push_run(out, row(first), e.len);
                } else if full > 1 {
                    // Whole rows in one strided extent, unless the
                    // previous piece continues into them.
                    match out.last() {
                        Some(l) if l.pa + l.len == row(first) || l.len == e.len => {
                            push_rows(out, row(first), e.len, full, e.stride);
                        }
                        _ => out.push(Extent {
                            pa: row(first),
                            len: e.len,
                            rows: full as u32,
                            stride: e.stride,
                        }),
                    }
                }
                if c1 > 0 {
                    push_run(out, row(r1), c1);
                }
            }
        }
        at += n;
    }
}

/// The aliases of a plane.
#[derive(Debug, Default)]
pub struct Lazy {
    slab: Vec<Option<Alias>>,
    /// When each live alias's bytes were aliased, by slab id: a count of
    /// aliases made, kept by the pieces a trim leaves. Aliases taken
    /// together are handed out oldest first (see [`Lazy::take_sourced`]).
    born: Vec<u64>,
    next_born: u64,
    free: Vec<u32>,
    /// Targets per memory as (start, end, id), sorted (they are disjoint).
    targets: FxHashMap<u64, Vec<(u64, u64, u32)>>,
    /// Source extents (id, index in `src`).
    sources: SpanIndex,
    live: usize,
}

impl Lazy {
    /// Aliases now.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn insert(&mut self, a: Alias) {
        let born = self.next_born;
        self.next_born += 1;
        self.insert_born(a, born);
    }

    /// Insert `a` as made at `born` (a trimmed alias's pieces keep its).
    fn insert_born(&mut self, a: Alias, born: u64) {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slab.push(None);
                self.born.push(0);
                (self.slab.len() - 1) as u32
            }
        };
        self.born[id as usize] = born;
        for (i, e) in a.src.iter().enumerate() {
            self.sources.insert(e, id, i as u32);
        }
        let t = self.targets.entry(mem_key(a.start)).or_default();
        let at = t.partition_point(|x| x.0 < a.start);
        t.insert(at, (a.start, a.start + a.len, id));
        self.slab[id as usize] = Some(a);
        self.live += 1;
    }

    fn remove(&mut self, id: u32) -> Alias {
        let a = self.slab[id as usize].take().expect("live alias");
        self.sources.remove_id(id, &a.src);
        if let Some(t) = self.targets.get_mut(&mem_key(a.start)) {
            let at = t.partition_point(|x| x.0 < a.start);
            debug_assert_eq!(t.get(at).map(|x| x.2), Some(id));
            t.remove(at);
        }
        self.free.push(id);
        self.live -= 1;
        a
    }

    /// The targets that overlap `[s, e)`, in address order: an index range
    /// of the memory's sorted list.
    fn targets_in(&self, s: u64, e: u64) -> &[(u64, u64, u32)] {
        let Some(t) = self.targets.get(&mem_key(s)) else {
            return &[];
        };
        // The first whose end is past `s` (ends are sorted too).
        let from = t.partition_point(|x| x.1 <= s);
        let to = from + t[from..].partition_point(|x| x.0 < e);
        &t[from..to]
    }

    /// The alias whose target is exactly `[start, start + len)`.
    fn exact_target(&self, start: u64, len: u64) -> Option<u32> {
        let t = self.targets.get(&mem_key(start))?;
        let at = t.partition_point(|x| x.0 < start);
        match t.get(at) {
            Some(&(s, e, id)) if s == start && e == start + len => Some(id),
            _ => None,
        }
    }

    /// Ids of the targets that overlap `[s, e)`, in address order.
    fn target_ids(&self, s: u64, e: u64) -> Vec<u32> {
        self.targets_in(s, e).iter().map(|x| x.2).collect()
    }

    /// Whether a target overlaps any byte of `extents`.
    pub fn any_target(&self, extents: &[Extent]) -> bool {
        if self.live == 0 {
            return false;
        }
        extents.iter().any(|e| match span(e) {
            Some((s, end)) => self
                .targets_in(s, end)
                .iter()
                .any(|&(ts, te, _)| overlaps(&Extent::contiguous(ts, te - ts), e)),
            None => false,
        })
    }

    /// Append the physical extents that hold the logical bytes of `q`, in
    /// order, to `out`.
    pub fn resolve_into(&self, q: &Extent, out: &mut Vec<Extent>) {
        let Some((s, e)) = span(q) else {
            if q.bytes() > 0 {
                out.push(*q);
            }
            return;
        };
        let ids = if self.live == 0 {
            &[][..]
        } else {
            self.targets_in(s, e)
        };
        if ids.is_empty() {
            out.push(*q);
            return;
        }
        // One target holds the whole span, and its source is one extent.
        if let [(_, _, id)] = ids[..] {
            let a = self.slab[id as usize].as_ref().expect("live alias");
            if a.start <= s
                && e <= a.start + a.len
                && let [src] = a.src[..]
            {
                // A contiguous run: the same extent, moved.
                if src.rows <= 1 || src.stride == src.len {
                    let shifted = Extent {
                        pa: src.pa + (s - a.start),
                        ..*q
                    };
                    out.push(shifted);
                    return;
                }
                if rows_of_strided_source(q, q.pa - a.start, &src, out) {
                    return;
                }
            }
        }
        self.resolve_runs(q, ids, out);
    }

    /// Resolve `q` run by run (its rows), piece by piece (the targets
    /// `ids`, in address order, that overlap its span).
    fn resolve_runs(&self, q: &Extent, ids: &[(u64, u64, u32)], out: &mut Vec<Extent>) {
        let rows = if q.rows <= 1 { 1 } else { q.rows as u64 };
        let (stride, len) = if q.rows <= 1 {
            (0, q.len)
        } else {
            (q.stride, q.len)
        };
        for r in 0..rows {
            let (rs, re) = (q.pa + r * stride, q.pa + r * stride + len);
            let mut cursor = rs;
            for &(_, _, id) in ids {
                let a = self.slab[id as usize].as_ref().expect("live alias");
                let (ts, te) = (a.start.max(rs), (a.start + a.len).min(re));
                if ts >= te {
                    continue;
                }
                if ts > cursor {
                    push_run(out, cursor, ts - cursor);
                }
                slice_into(&a.src, ts - a.start, te - ts, out);
                cursor = te;
            }
            if cursor < re {
                push_run(out, cursor, re - cursor);
            }
        }
    }

    /// Make `[start, start + len)` logically the bytes of `src`, trimming
    /// the aliases it overlaps. `src` must be physical (it overlaps no
    /// target) and must not overlap the target; the caller checks both.
    pub fn set(&mut self, start: u64, len: u64, src: Vec<Extent>) {
        let t = Extent::contiguous(start, len);
        // The target exactly an alias's (a buffer loaded again): replaced
        // in place, which is what trimming it away and inserting the new
        // one do (the freed id is the one reused, at the same place in
        // the memory's sorted targets), without moving that list twice.
        if len > 0
            && let Some(id) = self.exact_target(start, len)
        {
            debug_assert!(
                !src.iter().any(|x| overlaps(x, &t)),
                "a source overlaps its target"
            );
            let old = self.slab[id as usize].take().expect("live alias");
            self.sources.remove_id(id, &old.src);
            self.born[id as usize] = self.next_born;
            self.next_born += 1;
            for (i, e) in src.iter().enumerate() {
                self.sources.insert(e, id, i as u32);
            }
            self.slab[id as usize] = Some(Alias { start, len, src });
            return;
        }
        let dropped = self.clear_target(&t);
        debug_assert!(dropped.is_empty(), "a contiguous write only trims");
        debug_assert!(
            !src.iter().any(|x| overlaps(x, &t)),
            "a source overlaps its target"
        );
        if len > 0 {
            self.insert(Alias { start, len, src });
        }
    }

    /// The bytes of `e` are about to be written: trim the aliases whose
    /// targets they overlap. A target that `e` cuts into strided pieces
    /// is returned whole for the caller to materialize first.
    pub fn clear_target(&mut self, e: &Extent) -> Vec<Alias> {
        let mut out = Vec::new();
        if self.live == 0 {
            return Vec::new();
        }
        let Some((s, end)) = span(e) else {
            return Vec::new();
        };
        let dense = e.rows <= 1 || e.stride <= e.len;
        for id in self.target_ids(s, end) {
            let a = self.slab[id as usize].as_ref().expect("live alias");
            if !overlaps(&a.target(), e) {
                continue;
            }
            let (as_, ae) = (a.start, a.start + a.len);
            // One run of `e` over the target, or `e` dense: a trim.
            let run = if dense {
                Some((s, end))
            } else {
                match rows_meeting(e, as_, ae) {
                    Some((r0, r1)) if r0 == r1 => {
                        let lo = e.pa + r0 * e.stride;
                        Some((lo, lo + e.len))
                    }
                    _ => None,
                }
            };
            let born = self.born[id as usize];
            let a = self.remove(id);
            match run {
                Some((lo, hi)) => {
                    if as_ < lo {
                        let mut src = Vec::new();
                        slice_into(&a.src, 0, lo - as_, &mut src);
                        let piece = Alias {
                            start: as_,
                            len: lo - as_,
                            src,
                        };
                        self.insert_born(piece, born);
                    }
                    if hi < ae {
                        let mut src = Vec::new();
                        slice_into(&a.src, hi - as_, ae - hi, &mut src);
                        let piece = Alias {
                            start: hi,
                            len: ae - hi,
                            src,
                        };
                        self.insert_born(piece, born);
                    }
                }
                None => out.push((born, a)),
            }
        }
        oldest_first(out)
    }

    /// The physical bytes of `e` are about to change: remove and return
    /// every alias whose source covers any of them, oldest first, the
    /// order to materialize them in: a younger one's target may overlap an
    /// older one's source (its bytes were aliased after the older one
    /// was made), never the reverse (see the module docs), and once
    /// removed here neither can find the other when it is materialized.
    pub fn take_sourced(&mut self, e: &Extent) -> Vec<Alias> {
        if self.live == 0 {
            return Vec::new();
        }
        let Some((s, end)) = span(e) else {
            return Vec::new();
        };
        let mut ids = Vec::new();
        self.sources.query(s, end, |id, part| {
            let a = self.slab[id as usize].as_ref().expect("live alias");
            if overlaps(&a.src[part as usize], e) {
                ids.push(id);
            }
        });
        ids.sort_unstable();
        ids.dedup();
        let taken = ids
            .into_iter()
            .map(|id| (self.born[id as usize], self.remove(id)))
            .collect();
        oldest_first(taken)
    }

    /// Every alias, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Alias> {
        self.slab.iter().flatten()
    }

    /// Remove every alias, returning them oldest first (the order to
    /// materialize them in, as [`Lazy::take_sourced`]'s).
    pub fn drain(&mut self) -> Vec<Alias> {
        let ids: Vec<u32> = (0..self.slab.len() as u32)
            .filter(|&i| self.slab[i as usize].is_some())
            .collect();
        let all = ids
            .into_iter()
            .map(|id| (self.born[id as usize], self.remove(id)))
            .collect();
        oldest_first(all)
    }

    /// Debug check of the invariants: disjoint targets, no source over its
    /// own target, indexes in step with the slab.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut all: Vec<&Alias> = self.iter().collect();
        all.sort_by_key(|a| a.start);
        for w in all.windows(2) {
            assert!(
                w[0].start + w[0].len <= w[1].start,
                "targets overlap: {w:?}"
            );
        }
        for a in &all {
            assert!(!a.src.iter().any(|x| overlaps(x, &a.target())));
            let n: u64 = a.src.iter().map(Extent::bytes).sum();
            assert_eq!(n, a.len, "source and target sizes: {a:?}");
        }
        assert_eq!(all.len(), self.live);
        let indexed: usize = self.targets.values().map(Vec::len).sum();
        assert_eq!(indexed, self.live);
        if self.live == 0 {
            assert!(self.sources.is_empty());
        }
    }
}

/// Aliases in the order they were made (by their `born` counts).
fn oldest_first(mut v: Vec<(u64, Alias)>) -> Vec<Alias> {
    v.sort_unstable_by_key(|(born, _)| *born);
    v.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strided(pa: u64, len: u64, rows: u32, stride: u64) -> Extent {
        Extent {
            pa,
            len,
            rows,
            stride,
        }
    }

    /// The byte addresses of extents, in data order.
    fn bytes(es: &[Extent]) -> Vec<u64> {
        es.iter()
            .flat_map(|e| {
                let rows = e.rows.max(1) as u64;
                (0..rows).flat_map(move |r| {
                    let st = if e.rows <= 1 { 0 } else { e.stride };
                    (0..e.len).map(move |c| e.pa + r * st + c)
                })
            })
            .collect()
    }

    #[test]
    fn runs_join_into_strided_extents() {
        let mut v = Vec::new();
        for r in 0..4 {
            push_run(&mut v, 100 + r * 10, 4);
        }
        assert_eq!(v, [strided(100, 4, 4, 10)]);
        push_run(&mut v, 200, 4);
        push_run(&mut v, 204, 4);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1], Extent::contiguous(200, 8));
    }

    #[test]
    fn rows_join_as_one_run_each_would() {
        let starts: [&[Extent]; 6] = [
            &[],
            &[Extent::contiguous(900, 7)],
            &[Extent::contiguous(1000 - 6, 6)],
            &[Extent::contiguous(1000 - 40, 8)],
            &[strided(1000 - 3 * 40, 8, 3, 40)],
            &[strided(1000 - 3 * 30, 8, 3, 30)],
        ];
        for start in starts {
            for n in 0..6 {
                for (len, stride) in [(8, 40), (8, 30), (6, 40), (8, 8), (8, 4)] {
                    let mut one_by_one = start.to_vec();
                    for r in 0..n {
                        push_run(&mut one_by_one, 1000 + r * stride, len);
                    }
                    let mut at_once = start.to_vec();
                    push_rows(&mut at_once, 1000, len, n, stride);
                    assert_eq!(at_once, one_by_one, "{start:?} + {n} x {len} / {stride}");
                }
            }
        }
        // A strided extent two rows short of u32::MAX takes two and no more.
        let base = 4 * u32::MAX as u64;
        let full = [strided(
            base - 4 * (u32::MAX - 2) as u64,
            2,
            u32::MAX - 2,
            4,
        )];
        let mut one_by_one = full.to_vec();
        for r in 0..5 {
            push_run(&mut one_by_one, base + r * 4, 2);
        }
        let mut at_once = full.to_vec();
        push_rows(&mut at_once, base, 2, 5, 4);
        assert_eq!(at_once, one_by_one);
        assert_eq!((at_once.len(), at_once[0].rows), (2, u32::MAX));
    }

    #[test]
    fn slices_of_strided_sources_keep_their_bytes() {
        let src = [strided(1000, 8, 5, 20), Extent::contiguous(5000, 13)];
        let all = bytes(&src);
        for off in 0..all.len() as u64 {
            for len in 0..=(all.len() as u64 - off) {
                let mut out = Vec::new();
                slice_into(&src, off, len, &mut out);
                assert_eq!(
                    bytes(&out),
                    all[off as usize..(off + len) as usize],
                    "{off}+{len}: {out:?}"
                );
            }
        }
        let mut out = Vec::new();
        slice_into(&src, 8, 24, &mut out);
        assert_eq!(out, [strided(1020, 8, 3, 20)]);
    }

    #[test]
    fn exact_overlap_of_strided_extents() {
        let a = strided(0, 4, 10, 16);
        assert!(overlaps(&a, &Extent::contiguous(3, 1)));
        assert!(!overlaps(&a, &Extent::contiguous(4, 12)));
        assert!(overlaps(&a, &Extent::contiguous(4, 13)));
        assert!(!overlaps(&a, &strided(4, 4, 10, 16)));
        assert!(overlaps(&a, &strided(8, 4, 10, 8)));
        assert!(!overlaps(&a, &Extent::contiguous(200, 4)));
        // Brute force against byte sets.
        let cases = [
            strided(0, 3, 7, 5),
            strided(2, 2, 9, 6),
            strided(11, 4, 3, 4),
            Extent::contiguous(17, 6),
            strided(1, 1, 12, 3),
        ];
        for x in &cases {
            for y in &cases {
                let bx = bytes(std::slice::from_ref(x));
                let by = bytes(std::slice::from_ref(y));
                let want = bx.iter().any(|b| by.contains(b));
                assert_eq!(overlaps(x, y), want, "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn resolution_follows_aliases_and_trims() {
        let mut l = Lazy::default();
        // 64 bytes at 1000 are the strided rows of 8 at 5000 (stride 32).
        l.set(1000, 64, vec![strided(5000, 8, 8, 32)]);
        l.check();
        let mut out = Vec::new();
        l.resolve_into(&Extent::contiguous(1000, 64), &mut out);
        assert_eq!(out, [strided(5000, 8, 8, 32)]);
        // Bytes before, inside and after.
        out.clear();
        l.resolve_into(&Extent::contiguous(990, 30), &mut out);
        let want: Vec<u64> = (990..1000)
            .chain(5000..5008)
            .chain(5032..5040)
            .chain(5064..5068)
            .collect();
        assert_eq!(bytes(&out), want);
        // A write into the middle trims it into two.
        assert!(l.clear_target(&Extent::contiguous(1010, 20)).is_empty());
        l.check();
        assert_eq!(l.len(), 2);
        out.clear();
        l.resolve_into(&Extent::contiguous(1000, 64), &mut out);
        let want: Vec<u64> = (5000..5008)
            .chain(5032..5034)
            .chain(1010..1030)
            .chain(5102..5104)
            .chain((4..8).flat_map(|r| 5000 + r * 32..5008 + r * 32))
            .collect();
        assert_eq!(bytes(&out), want);
        // A strided write cutting through the second piece: materialize it.
        let cut = l.clear_target(&strided(1040, 2, 3, 8));
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].start, 1030);
        l.check();
        // A strided write whose one row covers the first piece: trimmed.
        assert!(l.clear_target(&strided(1004, 8, 2, 100)).is_empty());
        l.check();
        out.clear();
        l.resolve_into(&Extent::contiguous(1000, 4), &mut out);
        assert_eq!(out, [Extent::contiguous(5000, 4)]);
    }

    #[test]
    fn an_alias_onto_the_same_target_replaces_the_old_one() {
        let mut l = Lazy::default();
        l.set(1000, 16, vec![strided(5000, 4, 4, 16)]);
        l.set(1016, 8, vec![Extent::contiguous(7000, 8)]);
        // The same target again, from other bytes: the old alias is gone
        // (its source no longer holds it), the neighbour stays.
        l.set(1000, 16, vec![Extent::contiguous(6000, 16)]);
        l.check();
        assert_eq!(l.len(), 2);
        assert!(l.take_sourced(&Extent::contiguous(5000, 64)).is_empty());
        let mut out = Vec::new();
        l.resolve_into(&Extent::contiguous(1008, 16), &mut out);
        // (6008..6016 then 7000..7008: two equal runs, one strided extent.)
        assert_eq!(out, [strided(6008, 8, 2, 992)]);
        // It is the youngest: taken with an older one, it comes last.
        l.set(2000, 4, vec![Extent::contiguous(6000, 4)]);
        l.set(1000, 16, vec![Extent::contiguous(6000, 16)]);
        let got = l.take_sourced(&Extent::contiguous(6000, 1));
        assert_eq!(
            got.iter().map(|a| a.start).collect::<Vec<_>>(),
            [2000, 1000]
        );
        l.check();
    }

    #[test]
    fn writes_to_a_source_take_its_aliases() {
        let mut l = Lazy::default();
        l.set(1000, 16, vec![strided(5000, 4, 4, 16)]);
        l.set(2000, 16, vec![Extent::contiguous(6000, 16)]);
        // Bytes between the strided rows: nothing.
        assert!(l.take_sourced(&Extent::contiguous(5004, 12)).is_empty());
        let got = l.take_sourced(&Extent::contiguous(5035, 1));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].start, 1000);
        l.check();
        assert_eq!(l.len(), 1);
        assert!(l.any_target(&[Extent::contiguous(2015, 4)]));
        assert!(!l.any_target(&[Extent::contiguous(2016, 4)]));
        assert_eq!(l.drain().len(), 1);
        l.check();
    }

    /// Aliases come out of `take_sourced` and `drain` in the order they
    /// were made, whatever their slab ids, and the pieces a trim leaves
    /// keep their alias's age.
    #[test]
    fn aliases_taken_together_come_oldest_first() {
        let mut l = Lazy::default();
        l.set(9000, 4, vec![Extent::contiguous(5000, 4)]); // id 0
        l.set(1000, 32, vec![Extent::contiguous(5000, 32)]); // id 1, older
        assert!(l.clear_target(&Extent::contiguous(9000, 4)).is_empty()); // frees id 0
        l.set(5000, 8, vec![Extent::contiguous(5008, 8)]); // id 0, younger
        l.check();
        let got = l.take_sourced(&Extent::contiguous(5008, 1));
        let starts: Vec<u64> = got.iter().map(|a| a.start).collect();
        assert_eq!(starts, [1000, 5000]);
        // A trimmed alias's pieces are as old as it was.
        l.set(2000, 16, vec![Extent::contiguous(6000, 16)]); // older
        l.set(3000, 16, vec![Extent::contiguous(6000, 16)]); // younger
        assert!(l.clear_target(&Extent::contiguous(2004, 4)).is_empty());
        l.check();
        let starts: Vec<u64> = l.drain().iter().map(|a| a.start).collect();
        assert_eq!(starts, [2000, 2008, 3000]);
    }

    #[test]
    fn tiles_of_a_strided_source_resolve_as_row_by_row() {
        let mut l = Lazy::default();
        // A 12 x 48-byte panel of rows 100 apart, aliased at 1000.
        let src = strided(5000, 48, 12, 100);
        l.set(1000, 48 * 12, vec![src]);
        let before = [
            None,
            Some(strided(5000 - 24, 24, 1, 0)),
            Some(strided(4900 - 200, 24, 2, 200)),
        ];
        let mut fast_paths = 0;
        for off in 0..48 * 12u64 {
            for len in [1, 8, 16, 24, 48] {
                for (rows, stride) in [
                    (1, 0),
                    (2, 48),
                    (3, 96),
                    (4, 48),
                    (5, 144),
                    (3, 50),
                    (2, 24),
                ] {
                    let q = strided(1000 + off, len, rows, stride);
                    let Some((_, end)) = span(&q) else { continue };
                    if end > 1000 + 48 * 12 {
                        continue;
                    }
                    for b in &before {
                        let start: Vec<Extent> = b.iter().copied().collect();
                        let (mut fast, mut slow) = (start.clone(), start.clone());
                        l.resolve_into(&q, &mut fast);
                        let ids = l.targets_in(1000 + off, end);
                        l.resolve_runs(&q, ids, &mut slow);
                        assert_eq!(fast, slow, "{q:?} after {b:?}");
                        let mut probe = Vec::new();
                        fast_paths += rows_of_strided_source(&q, off, &src, &mut probe) as u32;
                    }
                }
            }
        }
        assert!(fast_paths > 1000, "the fast path ran {fast_paths} times");
    }
}
