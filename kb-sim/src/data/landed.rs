//! Moves landed in TCM by reference: the disjoint ranges whose bytes are
//! a [`Snapshot`]'s, read before the pages and trimmed by every write.

use kb_format::Extent;

use super::ranges::Span;
use super::{DataPlane, PAGE, PAGE_BITS, Page, Snapshot, SnapshotParts, overlaps, rows_of};

/// Bytes a move landed in TCM without copying them: `[start, end)` (the
/// map's key is `start`) holds the bytes of `snap` from `skip` on. The
/// pages under it hold stale bytes that nothing reads.
#[derive(Debug, Clone)]
pub(super) struct Landed {
    pub(super) end: u64,
    pub(super) snap: Snapshot,
    pub(super) skip: usize,
}

impl Span for Landed {
    fn end(&self) -> u64 {
        self.end
    }
}

impl DataPlane {
    /// Whether any landed range overlaps `[pa, pa+len)`.
    pub(super) fn landed_in(&self, pa: u64, len: u64) -> bool {
        overlaps(&self.landed, pa, len)
    }

    /// Push the bytes `[pa, pa+len)` onto `snap`: landed ranges by their
    /// snapshots' parts, the rest by page.
    pub(super) fn push_row<'a>(
        &'a self,
        pa: u64,
        len: u64,
        snap: &mut SnapshotParts,
        last: &mut Option<(u64, Option<&'a Page>)>,
    ) {
        let end = pa + len;
        let mut at = pa;
        // The landed range holding `pa`, if any, then those starting inside.
        let first = self.landed.last_upto_ending_after(pa, pa);
        for (s, l) in first
            .into_iter()
            .chain(self.landed.starting_in(pa + 1, end))
        {
            if s > at {
                self.push_pages(at, s - at, snap, last);
                at = s;
            }
            let n = l.end.min(end) - at;
            l.snap
                .push_range_onto(l.skip + (at - s) as usize, n as usize, snap);
            at += n;
        }
        if at < end {
            self.push_pages(at, end - at, snap, last);
        }
    }

    /// Push the page bytes `[pa, pa+len)` onto `snap` (landed ranges not
    /// consulted).
    pub(super) fn push_pages<'a>(
        &'a self,
        pa: u64,
        len: u64,
        snap: &mut SnapshotParts,
        last: &mut Option<(u64, Option<&'a Page>)>,
    ) {
        let mut done = 0u64;
        while done < len {
            let at = pa + done;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min((len - done) as usize);
            let key = at >> PAGE_BITS;
            let page = match *last {
                Some((k, p)) if k == key => p,
                _ => {
                    let p = self.pages.get(&key);
                    *last = Some((key, p));
                    p
                }
            };
            snap.push(page, off, n);
            done += n as u64;
        }
    }

    /// Forget the landed bytes of `[pa, pa+len)` (about to be written):
    /// a range it covers goes, one it cuts keeps what lies outside.
    pub(super) fn trim_landed(&mut self, pa: u64, len: u64) {
        if !self.landed_in(pa, len) {
            return;
        }
        let end = pa + len;
        // The last range starting before `end`, while it reaches past
        // `pa`: ranges are disjoint, so this walks the overlaps from the
        // last, and the parts kept (outside `[pa, end)`) are never met
        // again.
        while let Some((s, _)) = self.landed.last_before_ending_after(end, pa) {
            let l = self.landed.remove(s).expect("found");
            if s < pa {
                self.landed.insert(
                    s,
                    Landed {
                        end: pa,
                        ..l.clone()
                    },
                );
            }
            if l.end > end {
                let skip = l.skip + (end - s) as usize;
                self.landed.insert(end, Landed { skip, ..l });
            }
        }
    }

    /// `dst` as one TCM range, when it is one (a load's tile): such a move
    /// lands by reference.
    pub(super) fn tcm_range(dst: &[Extent]) -> Option<(u64, u64)> {
        let [x] = dst else {
            return None;
        };
        let (rows, len, _) = rows_of(x);
        let tcm = kb_format::pa::Pa::decode(x.pa).is_some_and(|p| p.space == kb_format::Space::Tcm);
        (rows == 1 && len > 0 && tcm).then_some((x.pa, len))
    }

    /// Land a move's bytes (`snap`) in the rows of `dst`; when every byte
    /// is `known`, return their fingerprint. A move into one TCM range
    /// lands by reference (the range reads as `snap` until written); any
    /// other is copied, and its fingerprint hashed where the bytes then
    /// lie in one piece rather than gathered from the source's rows.
    pub fn land(&mut self, dst: &[Extent], snap: &Snapshot, known: bool) -> Option<u64> {
        if let Some((pa, len)) = Self::tcm_range(dst) {
            assert_eq!(len, snap.len() as u64, "the snapshot covers the pieces");
            self.clear_pending(pa, len);
            self.trim_landed(pa, len);
            self.landed.insert(
                pa,
                Landed {
                    end: pa + len,
                    snap: snap.clone(),
                    skip: 0,
                },
            );
            return known.then(|| self.prints.get(snap, || snap.fingerprint()));
        }
        self.write_snapshot(dst, snap);
        if !known {
            return None;
        }
        let pages = &self.pages;
        Some(self.prints.get(snap, || {
            Self::as_one_slice(pages, dst)
                .map_or_else(|| snap.fingerprint(), kb_format::fingerprint)
        }))
    }
}
