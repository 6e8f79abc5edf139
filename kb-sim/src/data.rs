//! The Phase 1 data plane: real bytes keyed by 51-bit PA (sparse pages,
//! unwritten bytes read as zero), partial and overlapping access, and
//! pending ranges: bytes a compute op will write but whose value only
//! Phase 2 knows. A strict read of a pending byte is refused, naming its
//! writer; a partial read (a DMA moving the bytes) reports which bytes are
//! unknown and who wrote them, and the destination inherits that writer.
//!
//! Pages are shared, copy-on-write: [`PageImage`] lays bytes out in whole
//! pages once, and [`DataPlane::write_image`] puts the same pages at every
//! PA with the image's in-page offset (a replicated tensor's copies are
//! one set of pages until a PE writes its copy). A write to a shared page
//! copies that page first, so sharing never shows in the bytes. A move
//! into one TCM range lands by reference to its [`Snapshot`] (no copy);
//! reads see such ranges first and writes trim them.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use kb_format::Extent;

#[cfg(test)]
use crate::program::Unknown;
use crate::program::Writer;

mod landed;
mod pending;
mod ranges;
mod snapshot;

use landed::Landed;
use ranges::{RangeMap, Span};
use snapshot::{FingerprintCache, spare_parts};
pub use snapshot::{OwnBytes, PageImage, Snapshot, SnapshotParts};

const PAGE_BITS: u32 = 16;
/// Bytes per data-plane page.
pub const PAGE: usize = 1 << PAGE_BITS;

/// A page: shared by every PA range holding the same bytes (copy on write).
type Page = Arc<Box<[u8]>>;

fn zero_page() -> Page {
    Arc::new(vec![0u8; PAGE].into_boxed_slice())
}

/// A read that touched bytes whose last writer is still pending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bytes {pa:#x}..{end:#x} were last written by op {writer}, a compute op whose result exists only in Phase 2"
)]
pub struct PendingRead {
    pub pa: u64,
    pub end: u64,
    pub writer: u64,
}

/// Whether any of `map`'s disjoint ranges overlaps `[pa, pa+len)`.
fn overlaps<V: Span>(map: &RangeMap<V>, pa: u64, len: u64) -> bool {
    len > 0 && last_overlapping(map, pa, len).is_some()
}

/// The last of `map`'s disjoint ranges that starts before `pa + len` and
/// ends after `pa`: only the last one starting before the end can reach
/// past `pa`, so one search says whether any overlaps, and when this one
/// starts at or before `pa` it is the only one.
fn last_overlapping<V: Span>(map: &RangeMap<V>, pa: u64, len: u64) -> Option<(u64, &V)> {
    map.last_before_ending_after(pa.saturating_add(len), pa)
}

/// `(rows, len, stride)` of `x`, touching rows merged into one.
fn rows_of(x: &Extent) -> (u64, u64, u64) {
    if x.rows > 1 && x.stride == x.len {
        (1, x.bytes(), x.bytes())
    } else {
        (x.rows as u64, x.len, x.stride)
    }
}

/// A pending range's value: its end and its writer's op id.
impl Span for (u64, u64) {
    fn end(&self) -> u64 {
        self.0
    }
}

#[derive(Debug, Default)]
pub struct DataPlane {
    /// See [`FingerprintCache`].
    prints: FingerprintCache,
    pages: FxHashMap<u64, Page>,
    /// TCM ranges landed by reference (disjoint): most loaded tiles are
    /// only overwritten by the next load, so copying them into pages was
    /// the largest single cost of a run. Every read looks here first;
    /// every write trims what it covers.
    landed: RangeMap<Landed>,
    /// start -> (end, writer op id); disjoint intervals.
    pending: RangeMap<(u64, u64)>,
    /// Who each writer named in `pending` is, with the number of pending
    /// intervals naming it (dropped at zero, so this stays as small as the
    /// pending set).
    writers: FxHashMap<u64, (Writer, u32)>,
}

impl DataPlane {
    pub fn new() -> Self {
        Self::default()
    }

    /// Copy `out.len()` bytes starting at `pa` into `out`.
    pub fn read(&self, pa: u64, out: &mut [u8]) -> Result<(), PendingRead> {
        self.check_pending(pa, out.len() as u64)?;
        if self.landed_in(pa, out.len() as u64) {
            let mut v = Vec::with_capacity(out.len());
            self.append_unchecked(pa, out.len() as u64, &mut v);
            out.copy_from_slice(&v);
            return Ok(());
        }
        let mut done = 0usize;
        while done < out.len() {
            let at = pa + done as u64;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min(out.len() - done);
            match self.pages.get(&(at >> PAGE_BITS)) {
                Some(p) => out[done..done + n].copy_from_slice(&p[off..off + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Append `len` bytes at `pa` to `out` (no zero-fill pass).
    fn append(&self, pa: u64, len: u64, out: &mut Vec<u8>) -> Result<(), PendingRead> {
        self.check_pending(pa, len)?;
        self.append_unchecked(pa, len, out);
        Ok(())
    }

    fn append_unchecked(&self, pa: u64, len: u64, out: &mut Vec<u8>) {
        if self.landed_in(pa, len) {
            let mut snap = SnapshotParts::default();
            self.push_row(pa, len, &mut snap, &mut None);
            snap.append_range(0, snap.len(), out);
            return;
        }
        self.append_pages(pa, len, out);
    }

    fn append_pages(&self, pa: u64, len: u64, out: &mut Vec<u8>) {
        let mut done = 0u64;
        while done < len {
            let at = pa + done;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min((len - done) as usize);
            match self.pages.get(&(at >> PAGE_BITS)) {
                Some(p) => out.extend_from_slice(&p[off..off + n]),
                None => out.resize(out.len() + n, 0),
            }
            done += n as u64;
        }
    }

    /// Write `data` at `pa`; clears any pending mark on those bytes.
    pub fn write(&mut self, pa: u64, data: &[u8]) {
        self.clear_pending(pa, data.len() as u64);
        self.write_bytes(pa, data);
    }

    fn write_bytes(&mut self, pa: u64, data: &[u8]) {
        self.trim_landed(pa, data.len() as u64);
        let mut done = 0usize;
        while done < data.len() {
            let at = pa + done as u64;
            let off = (at as usize) & (PAGE - 1);
            let n = (PAGE - off).min(data.len() - done);
            let page = self.pages.entry(at >> PAGE_BITS).or_insert_with(zero_page);
            Arc::make_mut(page)[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Write `img` at `pa` (whose in-page offset must be the image's):
    /// whole pages are shared with the image, partial ones copied. Clears
    /// any pending mark on those bytes.
    pub fn write_image(&mut self, pa: u64, img: &PageImage) {
        assert_eq!(
            pa as usize % PAGE,
            img.offset,
            "image laid out for this offset"
        );
        self.clear_pending(pa, img.len);
        self.trim_landed(pa, img.len);
        let first = pa >> PAGE_BITS;
        let mut at = pa;
        for (i, (page, bytes)) in img.pages.iter().zip(img.chunks()).enumerate() {
            if bytes.len() == PAGE {
                self.pages.insert(first + i as u64, Arc::clone(page));
            } else {
                self.write_bytes(at, bytes);
            }
            at += bytes.len() as u64;
        }
    }

    /// Pages held, and how many of them are shared with another holder.
    #[cfg(test)]
    fn page_counts(&self) -> (usize, usize) {
        let shared = self
            .pages
            .values()
            .filter(|p| Arc::strong_count(p) > 1)
            .count();
        (self.pages.len(), shared)
    }

    /// Append the bytes of `x` (all its rows) to `out`.
    pub fn read_extent(&self, x: &Extent, out: &mut Vec<u8>) -> Result<(), PendingRead> {
        if x.rows > 1 && x.stride == x.len {
            return self.read_extent(&Extent::contiguous(x.pa, x.bytes()), out);
        }
        out.reserve(x.bytes() as usize);
        for r in 0..x.rows as u64 {
            self.append(x.pa + r * x.stride, x.len, out)?;
        }
        Ok(())
    }

    /// Write `data` into the rows of `x`; returns the bytes consumed (the
    /// copying move that tests hold [`DataPlane::land`] to).
    #[cfg(test)]
    fn write_extent(&mut self, x: &Extent, data: &[u8]) -> usize {
        if x.rows > 1 && x.stride == x.len {
            return self.write_extent(&Extent::contiguous(x.pa, x.bytes()), data);
        }
        let mut used = 0;
        for r in 0..x.rows as u64 {
            let n = x.len as usize;
            self.write(x.pa + r * x.stride, &data[used..used + n]);
            used += n;
        }
        used
    }

    /// Append the bytes of `pieces` (in order) to `out`, reading pending
    /// bytes as whatever the page holds and listing them in `unknown`
    /// (offsets into what this call appended), each with its writer as
    /// registered now: the source may be overwritten before the bytes land.
    #[cfg(test)]
    fn read_partial(&self, pieces: &[Extent], out: &mut Vec<u8>, unknown: &mut Vec<Unknown>) {
        self.unknown_in(pieces, unknown);
        for x in pieces {
            let (rows, len, stride) = rows_of(x);
            for r in 0..rows {
                self.append_unchecked(x.pa + r * stride, len, out);
            }
        }
    }

    /// The bytes of `pieces` (in order) as a [`Snapshot`], pending ones
    /// as whatever the page holds ([`DataPlane::unknown_in`] lists them).
    pub fn snapshot(&self, pieces: &[Extent]) -> Snapshot {
        // Sized up front (a part per row and per page crossed, a page per
        // page the span crosses): growing them row by row was most of the
        // allocation on a run's hot path.
        let (mut parts, mut pages) = (0u64, 0u64);
        for x in pieces {
            let (rows, len, stride) = rows_of(x);
            let span = rows.saturating_sub(1) * stride + len;
            parts += rows + ((rows * len) >> PAGE_BITS) + 1;
            pages += (span >> PAGE_BITS) + 2;
        }
        let mut arc = spare_parts();
        let snap = Arc::get_mut(&mut arc).expect("a spare snapshot is not shared");
        snap.pages.reserve(pages.min(parts) as usize);
        snap.parts.reserve(parts as usize);
        // Rows of a tile share pages: look each page up once in a row.
        let mut last: Option<(u64, Option<&Page>)> = None;
        for x in pieces {
            let (rows, len, stride) = rows_of(x);
            let span = rows.saturating_sub(1) * stride + len;
            let landed = self.landed_in(x.pa, span);
            for r in 0..rows {
                let pa = x.pa + r * stride;
                if landed {
                    self.push_row(pa, len, snap, &mut last);
                } else {
                    self.push_pages(pa, len, snap, &mut last);
                }
            }
        }
        let empty = snap.len == 0;
        let snap = Snapshot(Some(arc));
        // An empty snapshot holds nothing (its allocation goes back).
        if empty { Snapshot(None) } else { snap }
    }

    /// The bytes of `pieces` as one slice of a page, when they are one
    /// contiguous range inside a page that is there.
    fn as_one_slice<'a>(pages: &'a FxHashMap<u64, Page>, pieces: &[Extent]) -> Option<&'a [u8]> {
        let [x] = pieces else {
            return None;
        };
        let (rows, len, _) = rows_of(x);
        let off = (x.pa as usize) & (PAGE - 1);
        if rows != 1 || off + len as usize > PAGE {
            return None;
        }
        let page = pages.get(&(x.pa >> PAGE_BITS))?;
        Some(&page[off..off + len as usize])
    }

    /// Write the bytes of `snap` into the rows of `pieces` (in order);
    /// clears any pending mark on them.
    fn write_snapshot(&mut self, pieces: &[Extent], snap: &Snapshot) {
        self.clear_extents(pieces);
        if !self.landed.is_empty() {
            for x in pieces {
                let (rows, len, stride) = rows_of(x);
                if self.landed_in(x.pa, rows.saturating_sub(1) * stride + len) {
                    for r in 0..rows {
                        self.trim_landed(x.pa + r * stride, len);
                    }
                }
            }
        }
        let mut chunks = snap.chunks();
        let mut cur: &[u8] = &[];
        let mut rows = pieces.iter().flat_map(|x| {
            let (rows, len, stride) = rows_of(x);
            (0..rows).map(move |r| (x.pa + r * stride, len as usize))
        });
        let (mut pa, mut left) = (0u64, 0usize);
        'pages: loop {
            while left == 0 {
                match rows.next() {
                    Some(row) => (pa, left) = row,
                    None => break 'pages,
                }
            }
            // The destination page, looked up once while the writes stay
            // in it (a tile's rows mostly do).
            let key = pa >> PAGE_BITS;
            let dst = &mut Arc::make_mut(self.pages.entry(key).or_insert_with(zero_page))[..];
            while left > 0 && pa >> PAGE_BITS == key {
                if cur.is_empty() {
                    cur = chunks.next().expect("the snapshot covers the pieces");
                    continue;
                }
                let off = (pa as usize) & (PAGE - 1);
                let n = cur.len().min(left).min(PAGE - off);
                dst[off..off + n].copy_from_slice(&cur[..n]);
                cur = &cur[n..];
                pa += n as u64;
                left -= n;
                if left == 0 {
                    match rows.next() {
                        Some(row) => (pa, left) = row,
                        None => break 'pages,
                    }
                }
            }
        }
    }

    /// Clear the pending marks on every byte of `pieces`, leaving the bytes
    /// as they are: for a move whose every byte is unknown, which marks
    /// them all again ([`DataPlane::mark_unknown`]) and so never shows
    /// what the pages hold under the marks.
    pub fn clear_extents(&mut self, pieces: &[Extent]) {
        if self.pending.is_empty() {
            return;
        }
        for x in pieces {
            let (rows, len, stride) = rows_of(x);
            // One search over the extent's span first: most writes land
            // on no pending byte (as in `unknown_in`; a single row's own
            // search says as much).
            if rows == 0 || rows > 1 && !self.any_pending(x.pa, (rows - 1) * stride + len) {
                continue;
            }
            for r in 0..rows {
                self.clear_pending(x.pa + r * stride, len);
            }
        }
    }
}

#[cfg(test)]
mod tests;
