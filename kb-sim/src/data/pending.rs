//! Pending ranges: bytes a compute op will write but whose value only
//! Phase 2 knows, each interval naming its writer; strict reads of them
//! are refused, moves carry them as unknown bytes.

use kb_format::Extent;

use crate::program::{Unknown, Writer};

use super::{DataPlane, PendingRead, last_overlapping, overlaps, rows_of};

impl DataPlane {
    /// Remember who compute op `w.op_id` is, before marking its output.
    pub fn register_writer(&mut self, w: Writer) {
        self.writers.entry(w.op_id).or_insert((w, 0));
    }

    pub(super) fn insert_pending(&mut self, start: u64, end: u64, writer: u64) {
        if let Some((_, n)) = self.writers.get_mut(&writer) {
            *n += 1;
        }
        if let Some((_, w)) = self.pending.insert(start, (end, writer)) {
            self.unref(w);
        }
    }

    pub(super) fn remove_pending(&mut self, start: u64) -> Option<(u64, u64)> {
        let v = self.pending.remove(start)?;
        self.unref(v.1);
        Some(v)
    }

    pub(super) fn unref(&mut self, writer: u64) {
        if let Some((_, n)) = self.writers.get_mut(&writer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.writers.remove(&writer);
            }
        }
    }

    /// Mark `[pa, pa+len)` as written by compute op `writer` (value unknown
    /// until Phase 2; register the writer first). Adjacent ranges of one
    /// writer merge.
    pub fn mark_pending(&mut self, pa: u64, len: u64, writer: u64) {
        if len == 0 {
            return;
        }
        // Held while the writer's own older marks under these bytes go:
        // its count must not pass through zero, which would forget it. A
        // writer with no marks yet (a result's first) has no neighbour to
        // merge with.
        let first = match self.writers.get_mut(&writer) {
            Some((_, n)) => {
                *n += 1;
                *n == 1
            }
            None => false,
        };
        self.clear_pending(pa, len);
        // The bytes are unknown now: nothing reads them as values.
        self.trim_landed(pa, len);
        let mut start = pa;
        let mut end = pa + len;
        if !first {
            if let Some((s, &(e, w))) = self
                .pending
                .last_before_ending_after(pa, pa.saturating_sub(1))
                && e == pa
                && w == writer
            {
                start = s;
            }
            if let Some(&(e, w)) = self.pending.get(end)
                && w == writer
            {
                end = e;
            }
        }
        // Inserting at a merged left neighbour replaces it; the right one
        // goes after, so the writer's count never passes through zero.
        self.insert_pending(start, end, writer);
        if end != pa + len {
            self.remove_pending(pa + len);
        }
        self.unref(writer);
    }

    /// Mark every row of `x` pending (one range when the rows touch).
    #[cfg(test)]
    pub(super) fn mark_pending_extent(&mut self, x: &Extent, writer: u64) {
        if x.rows <= 1 || x.stride == x.len {
            self.mark_pending(x.pa, x.bytes(), writer);
        } else {
            for r in 0..x.rows as u64 {
                self.mark_pending(x.pa + r * x.stride, x.len, writer);
            }
        }
    }

    /// List the pending bytes of `pieces` (in order) in `unknown`, by
    /// offset into those bytes, each with its writer as registered now (the
    /// source may be overwritten before the bytes land).
    pub fn unknown_in(&self, pieces: &[Extent], unknown: &mut Vec<Unknown>) {
        let mut at = 0u64;
        for x in pieces {
            let (rows, len, stride) = rows_of(x);
            // One search for the whole extent's span first: most moves
            // touch no pending byte at all (a single row's own search
            // says as much).
            if rows == 0 || rows > 1 && !self.any_pending(x.pa, (rows - 1) * stride + len) {
                at += rows * len;
                continue;
            }
            for r in 0..rows {
                let pa = x.pa + r * stride;
                self.pending_in(pa, len, |s, e, w| {
                    let (offset, n) = ((at + (s - pa)) as usize, (e - s) as usize);
                    match unknown.last_mut() {
                        Some(u) if u.writer.op_id == w && u.offset + u.len == offset => u.len += n,
                        _ => unknown.push(Unknown {
                            offset,
                            len: n,
                            writer: self.writers[&w].0,
                        }),
                    }
                });
                at += len;
            }
        }
    }

    /// Call `f(start, end, writer)` for each pending interval's overlap
    /// with `[pa, pa+len)`, in address order.
    pub(super) fn pending_in(&self, pa: u64, len: u64, mut f: impl FnMut(u64, u64, u64)) {
        let end = pa + len;
        // One search settles the common cases: none overlaps, or one
        // covers `pa` (and so is the only one).
        match last_overlapping(&self.pending, pa, len) {
            None => return,
            Some((s, &(e, w))) if s <= pa => {
                f(pa, e.min(end), w);
                return;
            }
            Some(_) => {}
        }
        if let Some((_, &(e, w))) = self.pending.last_before_ending_after(pa, pa) {
            f(pa, e.min(end), w);
        }
        for (s, &(e, w)) in self.pending.starting_in(pa, end) {
            f(s, e.min(end), w);
        }
    }

    /// Mark the bytes of `pieces` that the unknown ranges cover (offsets
    /// into the pieces' bytes in order) pending, each with its writer.
    pub fn mark_unknown(&mut self, pieces: &[Extent], unknown: &[Unknown]) {
        if unknown.is_empty() {
            return;
        }
        for u in unknown {
            self.register_writer(u.writer);
        }
        // Both the rows and the ranges are in offset order: one pass.
        let (mut at, mut next) = (0u64, 0usize);
        for x in pieces {
            for r in 0..x.rows as u64 {
                let (lo, hi) = (at, at + x.len);
                let mut k = next;
                while let Some(u) = unknown.get(k)
                    && (u.offset as u64) < hi
                {
                    let end = (u.offset + u.len) as u64;
                    let (s, e) = ((u.offset as u64).max(lo), end.min(hi));
                    if s < e {
                        self.mark_pending(x.pa + r * x.stride + (s - lo), e - s, u.writer.op_id);
                    }
                    if end <= hi {
                        next = k + 1;
                    }
                    k += 1;
                }
                at = hi;
            }
        }
    }

    pub(super) fn check_pending(&self, pa: u64, len: u64) -> Result<(), PendingRead> {
        if self.pending.is_empty() || len == 0 {
            return Ok(());
        }
        self.first_pending(pa, len).map_or(Ok(()), Err)
    }

    /// Whether any pending interval overlaps `[pa, pa+len)`.
    pub(super) fn any_pending(&self, pa: u64, len: u64) -> bool {
        overlaps(&self.pending, pa, len)
    }

    /// The first pending interval overlapping `[pa, pa+len)`.
    pub(super) fn first_pending(&self, pa: u64, len: u64) -> Option<PendingRead> {
        let end = pa + len;
        // The interval starting at or before pa, then any starting inside.
        if let Some((s, &(e, w))) = self.pending.last_upto_ending_after(pa, pa) {
            return Some(PendingRead {
                pa: s.max(pa),
                end: e.min(end),
                writer: w,
            });
        }
        if let Some((s, &(e, w))) = self.pending.starting_in(pa, end).next() {
            return Some(PendingRead {
                pa: s,
                end: e.min(end),
                writer: w,
            });
        }
        None
    }

    pub(super) fn clear_pending(&mut self, pa: u64, len: u64) {
        if self.pending.is_empty() || len == 0 {
            return;
        }
        let end = pa + len;
        // One search says when nothing is pending here, and when exactly
        // these bytes are (a result rewritten in place: no other interval
        // overlaps them).
        match last_overlapping(&self.pending, pa, len) {
            None => return,
            Some((s, &(e, _))) if s == pa && e == end => {
                self.remove_pending(pa);
                return;
            }
            Some(_) => {}
        }
        // Trim or remove each overlapping interval; at most the first and
        // last one survive in part.
        while let Some(hit) = self.first_pending(pa, len) {
            let start = self
                .pending
                .last_upto_ending_after(hit.pa, hit.pa)
                .map(|(s, _)| s)
                .expect("an overlapping interval starts at or before the hit");
            let (e, w) = *self.pending.get(start).expect("listed");
            // Re-insert the surviving parts before dropping the original,
            // so the writer's count never passes through zero.
            if e > end {
                self.insert_pending(end, e, w);
            }
            if start < pa {
                self.insert_pending(start, pa, w);
            } else {
                self.remove_pending(start);
            }
            if e > end {
                break;
            }
        }
    }
}
