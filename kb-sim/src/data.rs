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

use crate::program::{Unknown, Writer};

mod ranges;
use ranges::{RangeMap, Span};

const PAGE_BITS: u32 = 16;
/// Bytes per data-plane page.
pub const PAGE: usize = 1 << PAGE_BITS;

/// A page: shared by every PA range holding the same bytes (copy on write).
type Page = Arc<Box<[u8]>>;

fn zero_page() -> Page {
    Arc::new(vec![0u8; PAGE].into_boxed_slice())
}

/// Bytes laid out in whole pages as they would sit at a PA whose in-page
/// offset is `offset`, ready to be shared by [`DataPlane::write_image`].
#[derive(Debug)]
pub struct PageImage {
    offset: usize,
    len: u64,
    pages: Vec<Page>,
}

impl PageImage {
    /// The concatenation of `rows`, `len` bytes in all, at in-page offset
    /// `offset` (the bytes around it in the first and last page are zero
    /// and never written to a plane).
    pub fn new<'a>(offset: usize, len: u64, rows: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let offset = offset % PAGE;
        let n = (offset as u64 + len).div_ceil(PAGE as u64) as usize;
        let mut pages: Vec<Box<[u8]>> =
            (0..n).map(|_| vec![0u8; PAGE].into_boxed_slice()).collect();
        let mut at = offset;
        for row in rows {
            let mut done = 0;
            while done < row.len() {
                let (p, o) = (at / PAGE, at % PAGE);
                let k = (PAGE - o).min(row.len() - done);
                pages[p][o..o + k].copy_from_slice(&row[done..done + k]);
                done += k;
                at += k;
            }
        }
        assert_eq!((at - offset) as u64, len, "rows add up to len");
        PageImage {
            offset,
            len,
            pages: pages.into_iter().map(Arc::new).collect(),
        }
    }

    /// In-page offset of the first byte.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The bytes, page piece by page piece, in order.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        let end = self.offset as u64 + self.len;
        self.pages.iter().enumerate().map(move |(i, p)| {
            let lo = if i == 0 { self.offset } else { 0 };
            let hi = (end - (i * PAGE) as u64).min(PAGE as u64) as usize;
            &p[lo..hi]
        })
    }
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

/// Bytes as they were when taken, by reference to the pages that held
/// them (copy on write keeps them: a later write to such a page copies
/// it first): a load's bytes, from its source read to the kernel, with no
/// copy on the way. Absent pages read as zero.
///
/// Cloning one is a reference count: a load's snapshot is shared by the
/// kernel's tile and the TCM range it landed in.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(Option<Arc<SnapshotParts>>);

/// What a [`Snapshot`] holds.
#[derive(Debug, Default)]
pub struct SnapshotParts {
    /// The pages the parts read, each once per run of parts in it (a
    /// tile's rows mostly share a page: one reference count per page,
    /// not per row).
    pages: Vec<Page>,
    /// (index into `pages`, or [`SnapshotParts::ZERO`] for zeros; offset
    /// in it; length), in order.
    parts: Vec<(u32, u32, u32)>,
    len: usize,
}

static ZEROS: [u8; PAGE] = [0; PAGE];

static NO_PARTS: SnapshotParts = SnapshotParts {
    pages: Vec::new(),
    parts: Vec::new(),
    len: 0,
};

impl std::ops::Deref for Snapshot {
    type Target = SnapshotParts;

    fn deref(&self) -> &SnapshotParts {
        self.0.as_deref().unwrap_or(&NO_PARTS)
    }
}

impl From<SnapshotParts> for Snapshot {
    fn from(parts: SnapshotParts) -> Snapshot {
        Snapshot((parts.len > 0).then(|| Arc::new(parts)))
    }
}

thread_local! {
    /// Snapshots' allocations (the `Arc` and its two vectors, emptied)
    /// that their last holder dropped on this thread, for the next
    /// snapshot: a load takes one and its tile gives it back, so a run in
    /// steady state allocates none. Per thread, so no lock: with the
    /// coroutine executor kernels drop their tiles on the simulation
    /// thread; with the thread executor a kernel thread keeps at most
    /// [`SPARE_SNAPSHOTS`] and the simulation allocates.
    static SPARE: std::cell::RefCell<Vec<Arc<SnapshotParts>>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// Whether this thread makes snapshots (and so keeps spares).
    static TAKES_SNAPSHOTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// Buffers of bytes a kernel made itself (`OwnBytes`) whose snapshot
    /// went, by size: a masked load's padded tile takes one of its size
    /// instead of allocating.
    static SPARE_BUFFERS: std::cell::RefCell<SpareBuffers> =
        const { std::cell::RefCell::new(SpareBuffers { by_len: Vec::new(), bytes: 0, takes: false }) };
}

/// Unshared pages by length (few lengths: a kernel's tile shapes), and
/// the bytes they hold.
#[derive(Debug)]
struct SpareBuffers {
    by_len: Vec<(usize, Vec<Page>)>,
    bytes: usize,
    /// This thread makes own bytes: only then are buffers kept (a kernel
    /// thread of the thread executor that only drops tiles keeps none).
    takes: bool,
}

/// The most bytes of spare buffers kept per thread: enough for the masked
/// tiles in flight on every PE of `large` (gemm_tiled's edge tiles).
const SPARE_BUFFER_BYTES: usize = 16 << 20;

impl SpareBuffers {
    fn take(&mut self, len: usize) -> Option<Page> {
        self.takes = true;
        let (_, pages) = self.by_len.iter_mut().find(|(l, _)| *l == len)?;
        let page = pages.pop()?;
        self.bytes -= len;
        Some(page)
    }

    fn keep(&mut self, page: Page) {
        let len = page.len();
        if !self.takes || self.bytes + len > SPARE_BUFFER_BYTES {
            return;
        }
        self.bytes += len;
        match self.by_len.iter_mut().find(|(l, _)| *l == len) {
            Some((_, pages)) => pages.push(page),
            None => self.by_len.push((len, vec![page])),
        }
    }
}

/// Bytes a kernel makes itself (a masked load's padded tile), written
/// through [`OwnBytes::bytes_mut`] and then held by a snapshot
/// ([`Snapshot::from_own`]).
#[derive(Debug)]
pub struct OwnBytes(Page);

impl OwnBytes {
    /// `len` bytes (at least 1): a spare buffer of that size where one is
    /// at hand (its bytes are stale: write them all), else zeros.
    pub fn new(len: usize) -> OwnBytes {
        let spare = SPARE_BUFFERS
            .try_with(|s| s.borrow_mut().take(len))
            .ok()
            .flatten();
        OwnBytes(spare.unwrap_or_else(|| Arc::new(vec![0u8; len].into_boxed_slice())))
    }

    /// The bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        Arc::get_mut(&mut self.0).expect("own bytes are not shared yet")
    }
}

/// Spare snapshots kept per thread (enough for the tiles in flight on a
/// large machine), and the most parts one may hold to be kept (about
/// 50 KiB).
const SPARE_SNAPSHOTS: usize = 1024;
const SPARE_PARTS: usize = 4096;

impl Drop for Snapshot {
    fn drop(&mut self) {
        if let Some(mut a) = self.0.take()
            && let Some(p) = Arc::get_mut(&mut a)
            && p.parts.capacity() <= SPARE_PARTS
        {
            // A kernel's own bytes that only this snapshot holds can be a
            // later kernel's buffer (a page of the plane's size is taken
            // for a plane page since replaced, and left to go).
            for page in p.pages.drain(..) {
                if page.len() < PAGE && Arc::strong_count(&page) == 1 && Arc::weak_count(&page) == 0
                {
                    let _ = SPARE_BUFFERS.try_with(|s| s.borrow_mut().keep(page));
                }
            }
            p.parts.clear();
            p.len = 0;
            // `try_with`: a thread's pool may already be gone as it exits.
            // Kept only on a thread that makes snapshots (a kernel thread
            // of the thread executor that only drops tiles keeps none).
            let _ = SPARE.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_SNAPSHOTS && TAKES_SNAPSHOTS.get() {
                    s.push(a);
                }
            });
        }
    }
}

/// An empty, unshared snapshot allocation: a spare one where there is one.
fn spare_parts() -> Arc<SnapshotParts> {
    TAKES_SNAPSHOTS.set(true);
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Equal bytes (however they are held).
impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.len == other.len && self.to_vec() == other.to_vec()
    }
}

impl Eq for Snapshot {}

impl Snapshot {
    /// A snapshot of a kernel's own bytes, held where they were written.
    pub fn from_own(bytes: OwnBytes) -> Snapshot {
        Snapshot::of_page(bytes.0)
    }

    /// A snapshot of bytes that lie in no plane (a kernel's own).
    pub fn from_vec(bytes: Vec<u8>) -> Snapshot {
        Snapshot::of_page(Arc::new(bytes.into_boxed_slice()))
    }

    /// A snapshot of all of `page` (none when it is empty), in a spare
    /// snapshot allocation where there is one.
    fn of_page(page: Page) -> Snapshot {
        let n = u32::try_from(page.len()).expect("a tile is under 4 GiB");
        if n == 0 {
            return Snapshot(None);
        }
        let mut arc = spare_parts();
        let snap = Arc::get_mut(&mut arc).expect("a spare snapshot is not shared");
        snap.pages.push(page);
        snap.parts.push((0, 0, n));
        snap.len = n as usize;
        Snapshot(Some(arc))
    }
}

impl SnapshotParts {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, piece by piece, in order.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|&(p, off, n)| {
            let (off, n) = (off as usize, n as usize);
            match p {
                SnapshotParts::ZERO => &ZEROS[..n],
                p => &self.pages[p as usize][off..off + n],
            }
        })
    }

    /// All the bytes in one slice when they lie in one page (no copy).
    pub fn as_slice(&self) -> Option<&[u8]> {
        match self.parts.as_slice() {
            [] => Some(&[]),
            [_] => self.chunks().next(),
            _ => None,
        }
    }

    /// Append bytes `[at, at+len)` to `out`.
    pub fn append_range(&self, mut at: usize, mut len: usize, out: &mut Vec<u8>) {
        assert!(at + len <= self.len, "range within the snapshot");
        for c in self.chunks() {
            if len == 0 {
                break;
            }
            if at >= c.len() {
                at -= c.len();
                continue;
            }
            let n = (c.len() - at).min(len);
            out.extend_from_slice(&c[at..at + n]);
            at = 0;
            len -= n;
        }
    }

    /// Push the parts of bytes `[at, at+len)` onto `out` (pages by
    /// reference).
    fn push_range_onto(&self, mut at: usize, mut len: usize, out: &mut SnapshotParts) {
        for &(p, off, n) in &self.parts {
            if len == 0 {
                break;
            }
            let n = n as usize;
            if at >= n {
                at -= n;
                continue;
            }
            let k = (n - at).min(len);
            let page = (p != SnapshotParts::ZERO).then(|| &self.pages[p as usize]);
            out.push(page, off as usize + at, k);
            at = 0;
            len -= k;
        }
    }

    /// The bytes as one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        self.append_range(0, self.len, &mut v);
        v
    }

    /// The fingerprint of the bytes (as `kb_format::fingerprint` of
    /// their concatenation).
    pub fn fingerprint(&self) -> u64 {
        if let Some(b) = self.as_slice() {
            return kb_format::fingerprint(b);
        }
        // The streaming hasher buffers small pieces (a tile's rows) byte
        // by byte; gathering them first and hashing once is faster.
        thread_local! {
            static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        GATHER.with(|g| {
            let mut g = g.borrow_mut();
            g.clear();
            self.append_range(0, self.len, &mut g);
            kb_format::fingerprint(&g)
        })
    }

    /// The page index of zeros (absent pages).
    const ZERO: u32 = u32::MAX;

    fn push(&mut self, page: Option<&Page>, off: usize, n: usize) {
        if n == 0 {
            return;
        }
        self.len += n;
        let index = match page {
            None => SnapshotParts::ZERO,
            Some(p) => match self.pages.last() {
                Some(last) if Arc::ptr_eq(last, p) => (self.pages.len() - 1) as u32,
                _ => {
                    self.pages.push(p.clone());
                    (self.pages.len() - 1) as u32
                }
            },
        };
        if let Some((last, lo, ln)) = self.parts.last_mut()
            && *last == index
            && (*lo + *ln) as usize == off
        {
            *ln += n as u32;
            return;
        }
        self.parts.push((index, off as u32, n as u32));
    }
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

/// Bytes a move landed in TCM without copying them: `[start, end)` (the
/// map's key is `start`) holds the bytes of `snap` from `skip` on. The
/// pages under it hold stale bytes that nothing reads.
#[derive(Debug, Clone)]
struct Landed {
    end: u64,
    snap: Snapshot,
    skip: usize,
}

impl Span for Landed {
    fn end(&self) -> u64 {
        self.end
    }
}

/// A pending range's value: its end and its writer's op id.
impl Span for (u64, u64) {
    fn end(&self) -> u64 {
        self.0
    }
}

/// Fingerprints of bytes moved recently, by the pages that held them: a
/// tile loaded again from the same pages, at the same offsets, holds the
/// same bytes if no page changed since. Pages are compared by identity
/// through `Weak` references: those keep no bytes alive, and while one
/// exists `Arc::make_mut` (the only way a page changes) moves the page to
/// a new allocation instead of writing it in place, so an allocation seen
/// again still holds what was hashed.
#[derive(Debug)]
struct FingerprintCache {
    slots: Vec<Option<CachedPrint>>,
}

#[derive(Debug)]
struct CachedPrint {
    pages: Vec<std::sync::Weak<Box<[u8]>>>,
    parts: Vec<(u32, u32, u32)>,
    fingerprint: u64,
}

impl Default for FingerprintCache {
    fn default() -> Self {
        FingerprintCache {
            slots: (0..Self::SLOTS).map(|_| None).collect(),
        }
    }
}

impl FingerprintCache {
    /// Enough for the tiles in flight on every PE of a large machine
    /// (gemm_tiled 2048^3 on default: 92 % of loads hit; 1024 slots: 67 %).
    /// A filled slot is about 1 KiB.
    const SLOTS: usize = 8192;

    fn slot(snap: &Snapshot) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        // The pages, the part count and the ends pick the slot; `get`
        // compares every part.
        for p in &snap.pages {
            (Arc::as_ptr(p) as usize).hash(&mut h);
        }
        (snap.parts.len(), snap.parts.first(), snap.parts.last()).hash(&mut h);
        (h.finish() as usize) % Self::SLOTS
    }

    /// The fingerprint of `snap`'s bytes: remembered, or `hash()`.
    fn get(&mut self, snap: &Snapshot, hash: impl FnOnce() -> u64) -> u64 {
        if snap.pages.is_empty() {
            return hash();
        }
        let slot = &mut self.slots[Self::slot(snap)];
        if let Some(c) = slot
            && c.parts == snap.parts
            && c.pages.len() == snap.pages.len()
            && c.pages
                .iter()
                .zip(&snap.pages)
                .all(|(w, p)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(p)))
        {
            return c.fingerprint;
        }
        let fingerprint = hash();
        // A filled slot's vectors are reused (no allocation per miss).
        let c = slot.get_or_insert_with(|| CachedPrint {
            pages: Vec::new(),
            parts: Vec::new(),
            fingerprint,
        });
        c.pages.clear();
        c.pages.extend(snap.pages.iter().map(Arc::downgrade));
        c.parts.clear();
        c.parts.extend_from_slice(&snap.parts);
        c.fingerprint = fingerprint;
        fingerprint
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

    /// Remember who compute op `w.op_id` is, before marking its output.
    pub fn register_writer(&mut self, w: Writer) {
        self.writers.entry(w.op_id).or_insert((w, 0));
    }

    fn insert_pending(&mut self, start: u64, end: u64, writer: u64) {
        if let Some((_, n)) = self.writers.get_mut(&writer) {
            *n += 1;
        }
        if let Some((_, w)) = self.pending.insert(start, (end, writer)) {
            self.unref(w);
        }
    }

    fn remove_pending(&mut self, start: u64) -> Option<(u64, u64)> {
        let v = self.pending.remove(start)?;
        self.unref(v.1);
        Some(v)
    }

    fn unref(&mut self, writer: u64) {
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
    fn mark_pending_extent(&mut self, x: &Extent, writer: u64) {
        if x.rows <= 1 || x.stride == x.len {
            self.mark_pending(x.pa, x.bytes(), writer);
        } else {
            for r in 0..x.rows as u64 {
                self.mark_pending(x.pa + r * x.stride, x.len, writer);
            }
        }
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

    /// Whether any landed range overlaps `[pa, pa+len)`.
    fn landed_in(&self, pa: u64, len: u64) -> bool {
        overlaps(&self.landed, pa, len)
    }

    /// Push the bytes `[pa, pa+len)` onto `snap`: landed ranges by their
    /// snapshots' parts, the rest by page.
    fn push_row<'a>(
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
    fn push_pages<'a>(
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
    fn trim_landed(&mut self, pa: u64, len: u64) {
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
    fn tcm_range(dst: &[Extent]) -> Option<(u64, u64)> {
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

    /// Call `f(start, end, writer)` for each pending interval's overlap
    /// with `[pa, pa+len)`, in address order.
    fn pending_in(&self, pa: u64, len: u64, mut f: impl FnMut(u64, u64, u64)) {
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

    fn check_pending(&self, pa: u64, len: u64) -> Result<(), PendingRead> {
        if self.pending.is_empty() || len == 0 {
            return Ok(());
        }
        self.first_pending(pa, len).map_or(Ok(()), Err)
    }

    /// Whether any pending interval overlaps `[pa, pa+len)`.
    fn any_pending(&self, pa: u64, len: u64) -> bool {
        overlaps(&self.pending, pa, len)
    }

    /// The first pending interval overlapping `[pa, pa+len)`.
    fn first_pending(&self, pa: u64, len: u64) -> Option<PendingRead> {
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

    fn clear_pending(&mut self, pa: u64, len: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_share_whole_pages_and_a_write_copies_only_its_page() {
        // Bytes i % 251 over two rows, at in-page offset 100: the image
        // spans 4 pages, the middle two whole.
        let len = 3 * PAGE;
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (r0, r1) = src.split_at(PAGE + 7);
        let img = PageImage::new(100, len as u64, [r0, r1]);
        assert_eq!(img.chunks().map(<[u8]>::len).sum::<usize>(), len);
        assert_eq!(img.chunks().flatten().copied().collect::<Vec<_>>(), src);
        let mut d = DataPlane::new();
        // A neighbour's bytes in the first and last page must survive.
        let (a, b) = (100u64, 100 + 8 * PAGE as u64);
        d.write(a - 2, &[7, 7]);
        d.write(b + len as u64, &[8, 8]);
        d.mark_pending(b + 10, 20, 3);
        d.write_image(a, &img);
        d.write_image(b, &img);
        assert_eq!(d.page_counts(), (8, 4), "2 x 2 whole pages shared");
        let read = |d: &DataPlane, pa: u64, n: usize| {
            let mut out = vec![0u8; n];
            d.read(pa, &mut out).unwrap();
            out
        };
        assert_eq!(read(&d, a, len), src);
        assert_eq!(read(&d, b, len), src, "the pending mark is cleared");
        assert_eq!(read(&d, a - 2, 2), [7, 7]);
        assert_eq!(read(&d, b + len as u64, 2), [8, 8]);
        // A PE writes its copy: only that page is copied, the other copy
        // keeps the image's bytes.
        let at = a + PAGE as u64;
        d.write(at, &[0xee; 4]);
        assert_eq!(read(&d, at, 4), [0xee; 4]);
        let off = (at - a) as usize;
        assert_eq!(read(&d, b + off as u64, 4), src[off..off + 4]);
        // a's page is its own now; b's still shares with the image.
        assert_eq!(d.page_counts(), (8, 3));
        // Without the image, b's copy of that page is b's alone; the
        // other whole page stays shared between the two copies.
        drop(img);
        assert_eq!(d.page_counts(), (8, 2));
        assert_eq!(
            read(&d, a + 2 * PAGE as u64, 100),
            src[2 * PAGE..2 * PAGE + 100]
        );
    }

    #[test]
    fn partial_overlapping_and_cross_page_access() {
        let mut d = DataPlane::new();
        let base = (PAGE as u64) - 3;
        d.write(base, &[1, 2, 3, 4, 5, 6]);
        d.write(base + 2, &[9, 9]);
        let mut out = [0u8; 8];
        d.read(base - 1, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 9, 9, 5, 6, 0]);
    }

    #[test]
    fn strided_extents_round_trip() {
        let mut d = DataPlane::new();
        let x = Extent {
            pa: 1000,
            len: 3,
            rows: 2,
            stride: 10,
        };
        assert_eq!(d.write_extent(&x, &[1, 2, 3, 4, 5, 6]), 6);
        let mut out = Vec::new();
        d.read_extent(&x, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
        let mut gap = [7u8; 1];
        d.read(1003, &mut gap).unwrap();
        assert_eq!(gap, [0]);
    }

    fn writer(op_id: u64) -> Writer {
        Writer {
            op_id,
            op_name: "add",
            pe: crate::machine::PeCoord {
                sip: 0,
                cube: 1,
                pe: 2,
            },
            time: 5000,
        }
    }

    #[test]
    fn moved_pending_bytes_keep_their_writer_after_the_source_is_overwritten() {
        let mut d = DataPlane::new();
        d.write(0, &[9; 32]);
        d.register_writer(writer(3));
        d.mark_pending(8, 8, 3);
        // Two rows of 12 bytes, 16 apart: row 0 holds pending 8..12 (its
        // last 4 bytes); row 1 (16..28) none.
        let src = [Extent {
            pa: 0,
            len: 12,
            rows: 2,
            stride: 16,
        }];
        let (mut out, mut unknown) = (Vec::new(), Vec::new());
        d.read_partial(&src, &mut out, &mut unknown);
        assert_eq!(out.len(), 24);
        assert_eq!(unknown.len(), 1);
        assert_eq!((unknown[0].offset, unknown[0].len), (8, 4));
        assert_eq!(unknown[0].writer, writer(3));
        // The source is overwritten (its writer's last interval goes)
        // before the bytes land: the destination still names op 3.
        d.write(0, &[1; 32]);
        assert!(d.read(8, &mut [0u8; 8]).is_ok());
        let dst = [Extent::contiguous(1000, 24)];
        d.mark_unknown(&dst, &unknown);
        let e = d.read(1000, &mut [0u8; 24]).unwrap_err();
        assert_eq!((e.pa, e.writer), (1008, 3));
        let mut again = Vec::new();
        let mut u2 = Vec::new();
        d.read_partial(&dst, &mut again, &mut u2);
        assert_eq!(u2, unknown, "same range, same writer");
    }

    fn plane_with(writes: &[(u64, u16, u8)]) -> DataPlane {
        let mut d = DataPlane::new();
        for &(pa, len, v) in writes {
            d.write(pa, &vec![v; len as usize]);
        }
        d
    }

    proptest::proptest! {
        /// A snapshot holds what a copying read returns (bytes,
        /// fingerprint), keeps it when the source is overwritten after,
        /// and writes the same bytes as writing the copy would.
        #[test]
        fn snapshots_read_and_write_as_copies_do(
            writes in proptest::collection::vec((0u64..200_000, 1u16..5000, 1u8..255), 0..12),
            src in proptest::collection::vec((0u64..200_000, 1u64..3000, 1u32..6, 0u64..70_000), 1..4),
            dst_at in 0u64..300_000,
        ) {
            let src: Vec<Extent> = src
                .into_iter()
                .map(|(pa, len, rows, gap)| Extent { pa, len, rows, stride: if rows > 1 { len + gap } else { 0 } })
                .collect();
            let d = plane_with(&writes);
            let (mut copy, mut u1, mut u2) = (Vec::new(), Vec::new(), Vec::new());
            d.read_partial(&src, &mut copy, &mut u1);
            d.unknown_in(&src, &mut u2);
            let snap = d.snapshot(&src);
            proptest::prop_assert_eq!(snap.len(), copy.len());
            proptest::prop_assert!(snap.to_vec() == copy);
            proptest::prop_assert_eq!(snap.fingerprint(), kb_format::fingerprint(&copy));
            proptest::prop_assert_eq!(u1, u2);
            // Two destination pieces: a strided one and the rest.
            let total = copy.len() as u64;
            let head = total / 2;
            let dst = vec![
                Extent { pa: dst_at, len: head.max(1).min(total), rows: 1, stride: 0 },
                Extent::contiguous(dst_at + 2 * PAGE as u64, total - head.max(1).min(total)),
            ];
            let (mut a, mut b) = (plane_with(&writes), plane_with(&writes));
            a.write_snapshot(&dst, &snap);
            let mut at = 0;
            for x in &dst {
                at += b.write_extent(x, &copy[at..]);
            }
            let (mut ra, mut rb) = (vec![0u8; 600_000], vec![0u8; 600_000]);
            a.read(0, &mut ra).unwrap();
            b.read(0, &mut rb).unwrap();
            proptest::prop_assert!(ra == rb);
            // Overwriting the source leaves the snapshot as it was.
            let mut d = d;
            for x in &src {
                d.write_extent(&Extent { rows: 1, stride: 0, len: x.bytes(), ..*x }, &vec![0xEE; x.bytes() as usize]);
            }
            proptest::prop_assert!(snap.to_vec() == copy);
        }
    }

    /// What a sequence of TCM operations does to a plain byte array.
    #[derive(Debug, Clone)]
    enum TcmOp {
        /// A move from `rows` rows of `len` bytes `stride` apart at `src`
        /// into the one range at `dst` (lands by reference).
        Move {
            src: u64,
            len: u64,
            rows: u32,
            gap: u64,
            dst: u64,
        },
        /// The same bytes into two rows `gap` apart at `dst` (copied).
        MoveStrided {
            src: u64,
            len: u64,
            dst: u64,
            gap: u64,
        },
        Write {
            at: u64,
            len: u64,
            v: u8,
        },
        Pending {
            at: u64,
            len: u64,
        },
    }

    proptest::proptest! {
        /// Pending marks (by new writers and by one writer again) and
        /// writes, often over exactly the bytes marked before (a result
        /// rewritten in place), keep every byte's writer as a byte-level
        /// model does, the intervals disjoint, touching ranges of one
        /// writer merged, and each writer counted once per interval.
        #[test]
        fn pending_marks_follow_a_byte_model(
            ops in proptest::collection::vec(
                (0u8..3, 0u64..6, proptest::option::of((0u64..600, 1u64..200))),
                1..40,
            )
        ) {
            const SLOT: u64 = 100;
            let mut d = DataPlane::new();
            let mut model = vec![None::<u64>; 800];
            let mut next = 0;
            for (op, slot, free) in ops {
                let (at, len) = free.unwrap_or((slot * SLOT, SLOT));
                let bytes = at as usize..(at + len) as usize;
                // 0: a new writer's mark; 1: the same writer marks again
                // (its ranges merge where they touch); 2: a write.
                if op < 2 {
                    if op == 0 || next == 0 {
                        next += 1;
                    }
                    // As the engine does: registered before each mark.
                    d.register_writer(writer(next));
                    d.mark_pending(at, len, next);
                    model[bytes].iter_mut().for_each(|b| *b = Some(next));
                } else {
                    d.write(at, &vec![1; len as usize]);
                    model[bytes].iter_mut().for_each(|b| *b = None);
                }
                let mut got = vec![None; 800];
                let mut counts = std::collections::BTreeMap::new();
                let (mut prev_end, mut prev_writer) = (0, None);
                for (s, &(e, w)) in d.pending.iter() {
                    proptest::prop_assert!(s >= prev_end && e > s, "[{}, {}) after {}", s, e, prev_end);
                    proptest::prop_assert!(
                        s > prev_end || prev_writer != Some(w),
                        "touching ranges of writer {} not merged at {}", w, s
                    );
                    (prev_end, prev_writer) = (e, Some(w));
                    got[s as usize..e as usize].iter_mut().for_each(|b| *b = Some(w));
                    *counts.entry(w).or_insert(0u32) += 1;
                }
                proptest::prop_assert_eq!(&got, &model);
                let held: std::collections::BTreeMap<u64, u32> =
                    d.writers.iter().map(|(&w, &(_, n))| (w, n)).collect();
                proptest::prop_assert_eq!(held, counts);
                // A move's view of them: each slot, a span across slots,
                // and rows with gaps, listed as runs of one writer.
                let queries = (0..7)
                    .map(|k| Extent::contiguous(k * SLOT, SLOT))
                    .chain([
                        Extent::contiguous(50, 700),
                        Extent { pa: 20, len: 60, rows: 5, stride: 150 },
                    ]);
                for x in queries {
                    let mut want: Vec<(usize, usize, u64)> = Vec::new();
                    let mut at = 0;
                    for r in 0..x.rows as u64 {
                        let row = x.pa + r * x.stride;
                        for b in row..row + x.len {
                            if let Some(w) = model[b as usize] {
                                match want.last_mut() {
                                    Some(u) if u.2 == w && u.0 + u.1 == at => u.1 += 1,
                                    _ => want.push((at, 1, w)),
                                }
                            }
                            at += 1;
                        }
                    }
                    let mut unknown = Vec::new();
                    d.unknown_in(&[x], &mut unknown);
                    let got: Vec<(usize, usize, u64)> =
                        unknown.iter().map(|u| (u.offset, u.len, u.writer.op_id)).collect();
                    proptest::prop_assert_eq!(got, want, "{:?}", x);
                }
            }
        }
    }

    fn tcm_op() -> impl proptest::strategy::Strategy<Value = TcmOp> {
        use proptest::prelude::*;
        const R: u64 = 3 * PAGE as u64;
        prop_oneof![
            3 => (0..R / 2, 1u64..9000, 1u32..4, 0u64..5000, 0..R / 2)
                .prop_map(|(src, len, rows, gap, dst)| TcmOp::Move { src, len, rows, gap, dst }),
            1 => (0..R / 2, 2u64..9000, 0..R / 2, 1u64..3000)
                .prop_map(|(src, len, dst, gap)| TcmOp::MoveStrided { src, len, dst, gap }),
            2 => (0..R - 9000, 1u64..9000, 1u8..255).prop_map(|(at, len, v)| TcmOp::Write { at, len, v }),
            1 => (0..R - 9000, 1u64..9000).prop_map(|(at, len)| TcmOp::Pending { at, len }),
        ]
    }

    proptest::proptest! {
        /// Moves into TCM land by reference; every read after any mix of
        /// moves, writes and pending marks sees what copying every byte
        /// gives (known bytes; fingerprints of known moves too).
        #[test]
        fn tcm_moves_landed_by_reference_read_as_copies(
            ops in proptest::collection::vec(tcm_op(), 1..24)
        ) {
            const R: usize = 3 * PAGE;
            let base = kb_format::pa::Pa {
                space: kb_format::Space::Tcm, sip: 0, cube: 0, pe: 1, offset: 0,
            }.encode().unwrap();
            let mut d = DataPlane::new();
            let mut bytes = vec![0u8; R];
            let mut known = vec![true; R];
            let mut writer = 0u64;
            for op in ops {
                match op {
                    TcmOp::Move { src, len, rows, gap, dst } => {
                        let stride = if rows > 1 { len + gap } else { 0 };
                        let x = Extent { pa: base + src, len, rows, stride };
                        let (mut moved, mut moved_known) = (Vec::new(), Vec::new());
                        for r in 0..rows as u64 {
                            let at = (src + r * stride) as usize;
                            moved.extend_from_slice(&bytes[at..at + len as usize]);
                            moved_known.extend_from_slice(&known[at..at + len as usize]);
                        }
                        let k = moved_known.iter().all(|&b| b);
                        let mut unknown = Vec::new();
                        d.unknown_in(&[x], &mut unknown);
                        proptest::prop_assert_eq!(unknown.is_empty(), k);
                        let snap = d.snapshot(&[x]);
                        let n = moved.len();
                        let to = [Extent::contiguous(base + dst, n as u64)];
                        let fp = d.land(&to, &snap, k);
                        // As the engine does: unknown bytes stay unknown.
                        d.mark_unknown(&to, &unknown);
                        proptest::prop_assert_eq!(fp, k.then(|| kb_format::fingerprint(&moved)));
                        let dst = dst as usize;
                        bytes[dst..dst + n].copy_from_slice(&moved);
                        known[dst..dst + n].copy_from_slice(&moved_known);
                    }
                    TcmOp::MoveStrided { src, len, dst, gap } => {
                        let from = [Extent::contiguous(base + src, len)];
                        let mut unknown = Vec::new();
                        d.unknown_in(&from, &mut unknown);
                        let snap = d.snapshot(&from);
                        let half = len / 2;
                        let rows = [(dst, half), (dst + half + gap, len - half)];
                        let pieces: Vec<Extent> = rows.iter().map(|&(a, n)| Extent::contiguous(base + a, n)).collect();
                        d.land(&pieces, &snap, false);
                        d.mark_unknown(&pieces, &unknown);
                        let moved = bytes[src as usize..(src + len) as usize].to_vec();
                        let moved_known = known[src as usize..(src + len) as usize].to_vec();
                        let mut at = 0;
                        for (a, n) in rows {
                            let (a, n) = (a as usize, n as usize);
                            bytes[a..a + n].copy_from_slice(&moved[at..at + n]);
                            known[a..a + n].copy_from_slice(&moved_known[at..at + n]);
                            at += n;
                        }
                    }
                    TcmOp::Write { at, len, v } => {
                        d.write(base + at, &vec![v; len as usize]);
                        let (a, n) = (at as usize, len as usize);
                        bytes[a..a + n].fill(v);
                        known[a..a + n].iter_mut().for_each(|b| *b = true);
                    }
                    TcmOp::Pending { at, len } => {
                        writer += 1;
                        d.register_writer(self::writer(writer));
                        d.mark_pending(base + at, len, writer);
                        known[at as usize..(at + len) as usize].iter_mut().for_each(|b| *b = false);
                    }
                }
                let got = d.snapshot(&[Extent::contiguous(base, R as u64)]).to_vec();
                for i in 0..R {
                    if known[i] {
                        proptest::prop_assert_eq!(got[i], bytes[i], "byte {}", i);
                    }
                }
                // The copying reads agree with the snapshot.
                let mut v = Vec::new();
                d.append_unchecked(base, R as u64, &mut v);
                proptest::prop_assert!(v == got);
                let mut whole = vec![0u8; 4096];
                if known[..4096].iter().all(|&b| b) {
                    d.read(base, &mut whole).unwrap();
                    proptest::prop_assert!(whole[..] == bytes[..4096]);
                }
            }
        }
    }

    #[test]
    fn a_remembered_fingerprint_is_never_one_of_bytes_since_overwritten() {
        let mut d = DataPlane::new();
        let src = [Extent {
            pa: 1000,
            len: 300,
            rows: 4,
            stride: 20_000,
        }];
        // Copied (not landed by reference), so no snapshot outlives the
        // move and the source pages are written in place where they can.
        let dst = [Extent {
            pa: 900_000,
            len: 600,
            rows: 2,
            stride: 1000,
        }];
        let expect = |d: &DataPlane| {
            let mut b = Vec::new();
            d.read_extent(&src[0], &mut b).unwrap();
            kb_format::fingerprint(&b)
        };
        for round in 0..4u8 {
            d.write(1000, &vec![round; 70_000]);
            let first = d.snapshot(&src);
            let fp = d.land(&dst, &first, true);
            drop(first);
            assert_eq!(fp, Some(expect(&d)), "round {round}");
            // The same bytes again: the same fingerprint (remembered).
            let again = d.snapshot(&src);
            assert_eq!(d.land(&dst, &again, true), Some(expect(&d)));
        }
        // A write inside one row only.
        d.write(21_050, &[77; 4]);
        let snap = d.snapshot(&src);
        assert_eq!(d.land(&dst, &snap, true), Some(expect(&d)));
    }

    /// A snapshot's allocation goes back to the pool only when its last
    /// holder drops it: one still shared keeps its bytes.
    #[test]
    fn a_dropped_snapshot_is_reused_and_a_shared_one_is_not() {
        let ptr = |s: &Snapshot| Arc::as_ptr(s.0.as_ref().expect("not empty"));
        let mut d = DataPlane::new();
        d.write(0, &[7u8; 300]);
        let a = d.snapshot(&[Extent::contiguous(0, 300)]);
        let kept = a.clone();
        let p = ptr(&a);
        drop(a);
        let b = d.snapshot(&[Extent::contiguous(0, 300)]);
        assert_ne!(ptr(&b), p, "still held: not reused");
        assert_eq!(kept.to_vec(), vec![7u8; 300]);
        drop(kept);
        let c = d.snapshot(&[Extent::contiguous(100, 50)]);
        assert_eq!(ptr(&c), p, "the last holder gave it back");
        assert_eq!(c.to_vec(), vec![7u8; 50]);
        assert_eq!(b.to_vec(), vec![7u8; 300]);
    }

    /// With the thread executor a kernel thread drops tiles it did not
    /// make: it keeps no spares (each such thread would hold up to the
    /// pool's bound); the thread that makes snapshots does.
    #[test]
    fn only_a_thread_that_makes_snapshots_keeps_spares() {
        let mut d = DataPlane::new();
        d.write(0, &[1u8; 64]);
        let x = [Extent::contiguous(0, 64)];
        let snaps: Vec<Snapshot> = (0..4).map(|_| d.snapshot(&x)).collect();
        let kept = std::thread::spawn(move || {
            drop(snaps);
            SPARE.with(|s| s.borrow().len())
        })
        .join()
        .unwrap();
        assert_eq!(kept, 0);
        drop(d.snapshot(&x));
        assert_eq!(SPARE.with(|s| s.borrow().len()), 1);
    }

    /// A kernel's own bytes go back for a later buffer of their size once
    /// their snapshot is dropped, never while it is held.
    #[test]
    fn own_bytes_are_reused_once_their_snapshot_is_gone() {
        let own = |len: usize, v: u8| {
            let mut b = OwnBytes::new(len);
            b.bytes_mut().fill(v);
            let p = Arc::as_ptr(&b.0);
            (Snapshot::from_own(b), p)
        };
        let (a, pa) = own(100, 1);
        let (b, pb) = own(100, 2);
        assert_ne!(pa, pb, "a held buffer is not handed out again");
        drop(a);
        let (c, pc) = own(64, 3);
        assert_ne!(pc, pa, "only a buffer of the same size");
        let (d, pd) = own(100, 4);
        assert_eq!(pd, pa, "the dropped one, rewritten");
        assert_eq!(
            (b.to_vec(), c.to_vec(), d.to_vec()),
            (vec![2; 100], vec![3; 64], vec![4; 100])
        );
    }

    #[test]
    fn a_snapshot_inside_one_page_is_one_slice_and_absent_pages_read_zero() {
        let mut d = DataPlane::new();
        d.write(100, &[5; 64]);
        let mut u = Vec::new();
        let snap = d.snapshot(&[Extent::contiguous(90, 80)]);
        let b = snap.as_slice().expect("one page, one piece");
        assert_eq!(&b[..10], &[0; 10]);
        assert_eq!(&b[10..74], &[5; 64]);
        // Across a written page and an absent one: two pieces, zeros after.
        let snap = d.snapshot(&[Extent::contiguous(PAGE as u64 - 8, 16)]);
        d.unknown_in(&[Extent::contiguous(PAGE as u64 - 8, 16)], &mut u);
        assert!(snap.as_slice().is_none());
        assert_eq!(snap.to_vec(), vec![0; 16]);
        assert!(u.is_empty());
    }

    #[test]
    fn an_all_unknown_move_marks_as_the_copying_move_does() {
        // Source: two strided rows all pending (writers 3 and 4); the
        // destination holds older marks (writer 5) and known bytes.
        let setup = || {
            let mut d = DataPlane::new();
            d.write(0, &[7; 256]);
            for w in [3, 4, 5] {
                d.register_writer(writer(w));
            }
            d.mark_pending(0, 16, 3);
            d.mark_pending(32, 16, 4);
            d.mark_pending(130, 40, 5);
            d
        };
        let src = [Extent {
            pa: 0,
            len: 16,
            rows: 2,
            stride: 32,
        }];
        let dst = [Extent::contiguous(120, 8), Extent::contiguous(140, 24)];
        let mut unknown = Vec::new();
        let d0 = setup();
        d0.unknown_in(&src, &mut unknown);
        let (mut bytes, mut u_read) = (Vec::new(), Vec::new());
        d0.read_partial(&src, &mut bytes, &mut u_read);
        assert_eq!(unknown, u_read, "unknown_in lists what read_partial does");
        assert_eq!(unknown.iter().map(|u| u.len).sum::<usize>(), 32);
        // The copying move, and the move that copies nothing.
        let mut copied = setup();
        let mut at = 0;
        for x in &dst {
            at += copied.write_extent(x, &bytes[at..]);
        }
        copied.mark_unknown(&dst, &unknown);
        let mut marked = setup();
        marked.clear_extents(&dst);
        marked.mark_unknown(&dst, &unknown);
        assert_eq!(
            copied.pending.iter().collect::<Vec<_>>(),
            marked.pending.iter().collect::<Vec<_>>()
        );
        assert_eq!(*marked.pending.get(120).unwrap(), (128, 3));
        // The second piece's 24 bytes: 8 more of 3's, then 16 of 4's.
        assert_eq!(*marked.pending.get(140).unwrap(), (148, 3));
        assert_eq!(*marked.pending.get(148).unwrap(), (164, 4));
        // Writer 5's mark survives where neither move wrote (128..130 is
        // not pending: 130..140 and 164..170 are 5's).
        assert_eq!(*marked.pending.get(130).unwrap(), (140, 5));
        assert_eq!(*marked.pending.get(164).unwrap(), (170, 5));
        assert!(marked.read(128, &mut [0u8; 2]).is_ok());
    }

    #[test]
    fn adjacent_pending_ranges_of_one_writer_merge() {
        let mut d = DataPlane::new();
        d.mark_pending_extent(
            &Extent {
                pa: 0,
                len: 10,
                rows: 4,
                stride: 10,
            },
            7,
        );
        assert_eq!(d.pending.len(), 1);
        d.mark_pending(40, 10, 7);
        d.mark_pending(60, 10, 8);
        assert_eq!(d.pending.len(), 2);
        assert_eq!(*d.pending.get(0).unwrap(), (50, 7));
        d.mark_pending_extent(
            &Extent {
                pa: 100,
                len: 4,
                rows: 3,
                stride: 8,
            },
            9,
        );
        assert_eq!(d.pending.len(), 5, "rows with gaps stay separate");
        assert_eq!(
            d.read(104, &mut [0u8; 4]),
            Ok(()),
            "the gaps are not pending"
        );
    }

    #[test]
    fn pending_bytes_refuse_reads_until_overwritten() {
        let mut d = DataPlane::new();
        d.mark_pending(100, 50, 42);
        let mut b = [0u8; 10];
        assert!(d.read(0, &mut b[..]).is_ok());
        let e = d.read(95, &mut b).unwrap_err();
        assert_eq!((e.pa, e.writer), (100, 42));
        assert_eq!(d.read(145, &mut b).unwrap_err().writer, 42);
        d.write(100, &[0; 20]);
        assert!(d.read(100, &mut b).is_ok());
        assert!(
            d.read(118, &mut b).is_err(),
            "bytes 120.. are still pending"
        );
        assert!(d.read(150, &mut b).is_ok());
    }
}
