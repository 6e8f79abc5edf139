//! Bytes by reference to shared pages: [`PageImage`] (bytes laid out in
//! whole pages once, shared by every copy), [`Snapshot`] (bytes as they
//! were when taken, the pages held by reference), the spare buffers that
//! recycle their allocations, and the [`FingerprintCache`] of recently
//! moved bytes.

use std::sync::Arc;

use super::{PAGE, Page};

/// Bytes laid out in whole pages as they would sit at a PA whose in-page
/// offset is `offset`, ready to be shared by [`DataPlane::write_image`](super::DataPlane::write_image).
#[derive(Debug)]
pub struct PageImage {
    pub(super) offset: usize,
    pub(super) len: u64,
    pub(super) pages: Vec<Page>,
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

/// Bytes as they were when taken, by reference to the pages that held
/// them (copy on write keeps them: a later write to such a page copies
/// it first): a load's bytes, from its source read to the kernel, with no
/// copy on the way. Absent pages read as zero.
///
/// Cloning one is a reference count: a load's snapshot is shared by the
/// kernel's tile and the TCM range it landed in.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(pub(super) Option<Arc<SnapshotParts>>);

/// What a [`Snapshot`] holds.
#[derive(Debug, Default)]
pub struct SnapshotParts {
    /// The pages the parts read, each once per run of parts in it (a
    /// tile's rows mostly share a page: one reference count per page,
    /// not per row).
    pub(super) pages: Vec<Page>,
    /// (index into `pages`, or [`SnapshotParts::ZERO`] for zeros; offset
    /// in it; length), in order.
    pub(super) parts: Vec<(u32, u32, u32)>,
    pub(super) len: usize,
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
    pub(super) static SPARE: std::cell::RefCell<Vec<Arc<SnapshotParts>>> =
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
pub struct OwnBytes(pub(super) Page);

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
pub(super) fn spare_parts() -> Arc<SnapshotParts> {
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
    pub(super) fn of_page(page: Page) -> Snapshot {
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
    pub(super) fn push_range_onto(&self, mut at: usize, mut len: usize, out: &mut SnapshotParts) {
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

    pub(super) fn push(&mut self, page: Option<&Page>, off: usize, n: usize) {
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

/// Fingerprints of bytes moved recently, by the pages that held them: a
/// tile loaded again from the same pages, at the same offsets, holds the
/// same bytes if no page changed since. Pages are compared by identity
/// through `Weak` references: those keep no bytes alive, and while one
/// exists `Arc::make_mut` (the only way a page changes) moves the page to
/// a new allocation instead of writing it in place, so an allocation seen
/// again still holds what was hashed.
#[derive(Debug)]
pub(super) struct FingerprintCache {
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

    pub(super) fn slot(snap: &Snapshot) -> usize {
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
    pub(super) fn get(&mut self, snap: &Snapshot, hash: impl FnOnce() -> u64) -> u64 {
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
