//! The data plane: byte-addressable memory keyed by the 51-bit PA of
//! [`kb_format::pa`], stored as a sparse map of 64 KiB pages, except TCM
//! (one contiguous region per PE, below).
//!
//! Device memory that nothing wrote reads as zero. Host space
//! (`pa::host(tensor, offset)`) holds the trace's tensor data: it is kept in
//! its own sparse page map ([`DataPlane::load_host`]) that replay never
//! changes, so the reference evaluation can read the inputs as the trace
//! gave them even if an op writes to host space (a device-to-host copy);
//! such writes go to the ordinary page map, which shadows the input pages.
//!
//! Host data is paged rather than held as one `Vec` of `TensorMeta::nbytes`
//! per tensor so that memory grows with the bytes the trace actually holds,
//! never with sizes it merely claims.
//!
//! The plane knows nothing of ops: it reads and writes byte ranges
//! ([`DataPlane::gather`] / [`DataPlane::scatter`] over [`Extent`]s).
//!
//! TCM is not paged: each PE's TCM is one contiguous buffer (a
//! `region`), grown before a window runs ([`DataPlane::reserve`]) to
//! cover every TCM byte the window touches (up to [`REGION_MAX`] bytes;
//! offsets beyond stay paged). Its bytes are written in place, so a GEMM
//! reads its operands and accumulates its output where they lie
//! ([`Shared::f32s`]), and a tile loaded into TCM is one piece to hash.
//!
//! Sharing: `&self` only reads. The engine writes from several threads at
//! once through a [`Shared`] view, which [`DataPlane::shared`] makes
//! (`unsafe`) under one contract: no two accesses to overlapping bytes,
//! one of them a write, run at the same time. The engine's dependency
//! graph orders every such pair (engine::graph). Device pages live in
//! [`SHARDS`] hash maps, each behind its own `RwLock` (a page's shard is
//! its page number modulo `SHARDS`), so the maps themselves are safe to
//! change from several threads; region bytes rely on the contract alone.
//! Host input pages change only through `&mut self` ([`DataPlane::load_host`]).

use std::sync::{Arc, PoisonError, RwLock};

use rustc_hash::FxHashMap;

use kb_format::pa::{self, MAX_HOST_TENSORS, OFFSET_BITS, PA_BITS, Pa};
use kb_format::{Extent, Space, TensorMeta};

mod region;
use region::Region;

/// log2 of the page size.
pub const PAGE_BITS: u32 = 16;
/// Bytes per page.
pub const PAGE: usize = 1 << PAGE_BITS;
const PAGE_MASK: u64 = PAGE as u64 - 1;
/// Number of independently locked page maps.
pub const SHARDS: usize = 64;
/// Most bytes of one TCM kept as a contiguous region; TCM offsets beyond
/// are paged (a corrupt extent must not drive a huge allocation).
pub const REGION_MAX: u64 = 64 << 20;
/// Smallest region (regions grow by doubling).
const REGION_MIN: u64 = PAGE as u64;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// A page's bytes, shared copy-on-write: a memory op that moves whole,
/// page-aligned pages shares them instead of copying
/// ([`DataPlane::scatter_snapshot`]), a [`Snapshot`] holds the pages it
/// read, and a later write to a shared page clones it first
/// (`Arc::make_mut`).
pub type PageBuf = Arc<Box<[u8]>>;

type Pages = FxHashMap<u64, PageBuf>;

fn zero_page() -> PageBuf {
    Arc::new(vec![0u8; PAGE].into_boxed_slice())
}

/// Bytes one op (or one gathered tensor) may hold unless configured
/// otherwise: a corrupt extent must not drive a huge allocation.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;

/// Why a data-plane access failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaneError {
    #[error("address {addr:#x} is not a valid 51-bit address")]
    BadAddress { addr: u64 },
    #[error("{len} bytes at {addr:#x} run past the end of their memory space")]
    CrossesSpace { addr: u64, len: u64 },
    #[error("host address {addr:#x} names tensor {tensor}, but the trace has {count} tensors")]
    UnknownTensor {
        addr: u64,
        tensor: u32,
        count: usize,
    },
    #[error("host bytes {offset}..{end} of tensor {name:?} are outside its {nbytes} bytes")]
    HostOutOfRange {
        name: String,
        offset: u64,
        end: u64,
        nbytes: u64,
    },
    #[error("tensor {name:?} has a shape whose byte size overflows 64 bits")]
    BadTensorSize { name: String },
    #[error(
        "extent at {pa:#x} ({rows} rows of {len} bytes, stride {stride}) overflows the address space"
    )]
    ExtentOverflow {
        pa: u64,
        len: u64,
        rows: u32,
        stride: u64,
    },
    #[error("{data} bytes of data for ranges of {ranges} bytes")]
    LengthMismatch { data: u64, ranges: u64 },
    #[error("{what} of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        bytes: u64,
        limit: u64,
    },
}

#[derive(Debug, Clone)]
struct HostTensor {
    name: String,
    /// `None` when the shape's byte size overflows.
    nbytes: Option<u64>,
    /// Bytes loaded from tensor chunks (overlaps counted twice).
    loaded: u64,
}

/// Sparse byte-addressable memory over every space of the 51-bit PA.
#[derive(Debug)]
pub struct DataPlane {
    /// Written pages, by page number, in `SHARDS` locked maps.
    pages: Box<[RwLock<Pages>]>,
    /// Contiguous memories (each PE's TCM), by `addr >> OFFSET_BITS`.
    regions: FxHashMap<u64, Region>,
    /// The trace's host tensor data, by page number; never written by ops.
    host_input: Pages,
    host: Vec<HostTensor>,
    max_bytes: u64,
}

/// Byte size of a tensor, `None` on overflow.
pub fn tensor_nbytes(t: &TensorMeta) -> Option<u64> {
    t.shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))?
        .checked_mul(t.dtype.size() as u64)
}

impl DataPlane {
    /// An empty plane for a trace with these tensors.
    pub fn new(tensors: &[TensorMeta], max_bytes: u64) -> DataPlane {
        DataPlane {
            pages: (0..SHARDS).map(|_| RwLock::new(Pages::default())).collect(),
            regions: FxHashMap::default(),
            host_input: Pages::default(),
            host: tensors
                .iter()
                .map(|t| HostTensor {
                    name: t.name.clone(),
                    nbytes: tensor_nbytes(t),
                    loaded: 0,
                })
                .collect(),
            max_bytes,
        }
    }

    /// The per-op byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Device pages written so far (for statistics).
    pub fn page_count(&self) -> usize {
        self.pages
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Store host-provided bytes of `tensor` at byte `offset` (a tensor chunk).
    pub fn load_host(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, data.len() as u64)?;
        self.host[tensor as usize].loaded += data.len() as u64;
        let mut pos = 0;
        for (page, off, n) in page_spans(addr, data.len()) {
            let p = Arc::make_mut(self.host_input.entry(page).or_insert_with(zero_page));
            p[off..off + n].copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }

    /// Bytes of host data the trace provided for `tensor`, and its size.
    pub fn host_coverage(&self, tensor: u32) -> Option<(u64, Option<u64>)> {
        self.host.get(tensor as usize).map(|h| (h.loaded, h.nbytes))
    }

    /// Read `out.len()` bytes of `tensor`'s host data as the trace gave it
    /// (ignoring writes replay made to host space).
    pub fn read_host_input(
        &self,
        tensor: u32,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, out.len() as u64)?;
        let mut pos = 0;
        for (page, off, n) in page_spans(addr, out.len()) {
            match self.host_input.get(&page) {
                Some(p) => out[pos..pos + n].copy_from_slice(&p[off..off + n]),
                None => out[pos..pos + n].fill(0),
            }
            pos += n;
        }
        Ok(())
    }

    /// Validate a host range and return its start address.
    fn host_range(&self, tensor: u32, offset: u64, len: u64) -> Result<u64, PlaneError> {
        let h = self
            .host
            .get(tensor as usize)
            .filter(|_| tensor < MAX_HOST_TENSORS)
            .ok_or(PlaneError::UnknownTensor {
                addr: offset,
                tensor,
                count: self.host.len(),
            })?;
        let nbytes = h.nbytes.ok_or_else(|| PlaneError::BadTensorSize {
            name: h.name.clone(),
        })?;
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= nbytes && end < 1 << 36 => Ok(pa::host(tensor, offset)),
            _ => Err(PlaneError::HostOutOfRange {
                name: h.name.clone(),
                offset,
                end: end.unwrap_or(u64::MAX),
                nbytes,
            }),
        }
    }

    /// Check that `len` bytes at `addr` lie in one space (and, for host
    /// space, in one tensor's bytes).
    fn check(&self, addr: u64, len: u64) -> Result<Space, PlaneError> {
        let space = pa::space_of(addr).ok_or(PlaneError::BadAddress { addr })?;
        if len == 0 {
            return Ok(space);
        }
        addr.checked_add(len - 1)
            .filter(|&last| last >> PA_BITS == 0 && last >> 48 == addr >> 48)
            .ok_or(PlaneError::CrossesSpace { addr, len })?;
        if space == Space::Host {
            let (tensor, offset) = pa::split_host(addr).ok_or(PlaneError::BadAddress { addr })?;
            self.host_range(tensor, offset, len).map_err(|e| match e {
                PlaneError::UnknownTensor { tensor, count, .. } => PlaneError::UnknownTensor {
                    addr,
                    tensor,
                    count,
                },
                e => e,
            })?;
        }
        Ok(space)
    }

    /// Read `out.len()` bytes at `addr`. Unwritten device bytes read as zero;
    /// host bytes read as the trace's tensor data unless an op overwrote them.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), PlaneError> {
        let mut pos = 0;
        self.for_each_piece(&[Extent::contiguous(addr, out.len() as u64)], |src| {
            let n = src.len();
            out[pos..pos + n].copy_from_slice(src.bytes());
            pos += n;
        })
    }

    /// Write `data` at `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PlaneError> {
        self.scatter(&[Extent::contiguous(addr, data.len() as u64)], data)
    }

    /// Write `data` to `extents` in order; `data` must hold exactly their bytes.
    pub fn scatter(&mut self, extents: &[Extent], data: &[u8]) -> Result<(), PlaneError> {
        self.reserve(extents);
        self.scatter_shared(extents, data)
    }

    /// Write the bytes of `snap` to `extents` in order (see
    /// [`Shared::scatter_snapshot`]).
    pub fn scatter_snapshot(
        &mut self,
        extents: &[Extent],
        snap: &Snapshot,
    ) -> Result<(), PlaneError> {
        self.reserve(extents);
        self.scatter_snapshot_shared(extents, snap)
    }

    /// A view that writes through `&self`, for running ops on several
    /// threads at once.
    ///
    /// # Safety
    /// While the view (or a copy of it) is in use, no two accesses through
    /// it to overlapping bytes may run at the same time unless both only
    /// read, and at most one slice from [`Shared::f32s_mut`] may cover a
    /// byte while any other slice of that byte is live. Region bytes are
    /// not locked: breaking this is a data race.
    #[allow(unsafe_code)]
    pub unsafe fn shared(&mut self) -> Shared<'_> {
        Shared { plane: self }
    }

    /// Grow the TCM regions to cover every TCM byte `extents` touch (up to
    /// [`REGION_MAX`] bytes each). Every write reserves its bytes first,
    /// so TCM bytes are paged only beyond `REGION_MAX`: a region never
    /// grows over pages.
    pub fn reserve<'e>(&mut self, extents: impl IntoIterator<Item = &'e Extent>) {
        let mut need: Vec<(u64, u64)> = Vec::new();
        for e in extents {
            let Some((start, end)) = span(e) else {
                continue;
            };
            if pa::space_of(start) != Some(Space::Tcm)
                || (end - 1) >> OFFSET_BITS != start >> OFFSET_BITS
            {
                continue;
            }
            let key = start >> OFFSET_BITS;
            let end = ((end - 1) & OFFSET_MASK) + 1;
            let have = self.regions.get(&key).map_or(0, |r| r.len() as u64);
            if end > have && have < REGION_MAX {
                match need.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n = (*n).max(end),
                    None => need.push((key, end)),
                }
            }
        }
        for (key, end) in need {
            self.grow_region(key, end);
        }
    }

    #[allow(unsafe_code)]
    fn grow_region(&mut self, key: u64, end: u64) {
        let old = self.regions.get(&key).map_or(0, |r| r.len());
        let len = end.next_power_of_two().clamp(REGION_MIN, REGION_MAX) as usize;
        if len <= old {
            return;
        }
        let region = Region::zeroed(len);
        // SAFETY: `&mut self`: no other slice of either region is live.
        unsafe {
            if let Some(prev) = self.regions.get(&key) {
                region.bytes_mut(0, old).copy_from_slice(prev.bytes(0, old));
            }
        }
        self.regions.insert(key, region);
    }

    /// A run of `len` bytes at `addr` as its part in a region (the region,
    /// the offset there, the bytes), then the paged rest (address, length).
    /// A region starts at offset 0, so only a run's tail can lie past it.
    fn split_run(&self, addr: u64, len: usize) -> (Option<(&Region, usize, usize)>, u64, usize) {
        match self.region_at(addr) {
            Some((r, off)) if len > 0 => {
                let n = len.min(r.len() - off);
                (Some((r, off, n)), addr + n as u64, len - n)
            }
            _ => (None, addr, len),
        }
    }

    /// The region holding the byte at `addr`, and its offset there.
    fn region_at(&self, addr: u64) -> Option<(&Region, usize)> {
        if pa::space_of(addr) != Some(Space::Tcm) {
            return None;
        }
        let r = self.regions.get(&(addr >> OFFSET_BITS))?;
        let off = (addr & OFFSET_MASK) as usize;
        (off < r.len()).then_some((r, off))
    }

    /// A page to write: created from the host input (host space) or zeros,
    /// and unshared.
    fn page_mut<'a>(&self, shard: &'a mut Pages, page: u64, host: bool) -> &'a mut [u8] {
        let p = shard.entry(page).or_insert_with(|| {
            match self.host_input.get(&page).filter(|_| host) {
                Some(orig) => orig.clone(),
                None => zero_page(),
            }
        });
        let b: &mut Box<[u8]> = Arc::make_mut(p);
        &mut b[..]
    }

    /// A page's current bytes: written, or (in host space) the input.
    fn page_or_input<'a>(&'a self, shard: &'a Pages, page: u64, host: bool) -> Option<&'a PageBuf> {
        shard
            .get(&page)
            .or_else(|| self.host_input.get(&page).filter(|_| host))
    }

    /// Into how many contiguous pieces of memory (page parts, region
    /// parts) the bytes of `extents` fall, at most; invalid extents count
    /// as none.
    pub fn piece_count(&self, extents: &[Extent]) -> usize {
        extents
            .iter()
            .flat_map(|e| runs(e).into_iter().flatten())
            .map(|(addr, len)| match self.region_at(addr) {
                Some((r, off)) if len <= (r.len() - off) as u64 => 1,
                _ => ((addr & PAGE_MASK) + len).div_ceil(PAGE as u64) as usize,
            })
            .sum()
    }

    /// Total bytes of `extents`, checked against the limit.
    pub fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        let mut total = 0u64;
        for e in extents {
            total = total.saturating_add(e.bytes());
        }
        if total > self.max_bytes {
            return Err(PlaneError::TooLarge {
                what: "the ranges of one op",
                bytes: total,
                limit: self.max_bytes,
            });
        }
        Ok(total)
    }

    /// Append the bytes of `extents`, in order, to `out`.
    pub fn gather(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        let total = self.extent_bytes(extents)?;
        out.reserve(total as usize);
        self.gather_each(extents, |piece| out.extend_from_slice(piece))?;
        Ok(())
    }

    /// Call `f` with the bytes of `extents`, in order, a piece at a time
    /// (at most a page; unwritten device memory as zeros); returns their
    /// total. `f` runs under a page lock: it must not use the plane.
    pub fn gather_each(
        &self,
        extents: &[Extent],
        mut f: impl FnMut(&[u8]),
    ) -> Result<u64, PlaneError> {
        let total = self.extent_bytes(extents)?;
        self.for_each_piece(extents, |src| f(src.bytes()))?;
        Ok(total)
    }

    /// [`kb_format::fingerprint`] of the bytes of `extents`, in order,
    /// without gathering them (one pass when they are one piece, as a tile
    /// in TCM is).
    pub fn fingerprint(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        let mut h = PieceHasher::new(self.extent_bytes(extents)?);
        self.for_each_piece(extents, |src| h.feed(src.bytes()))?;
        Ok(h.digest())
    }

    /// The bytes of `extents`, in order, without copying them: references
    /// to the pages that hold them (see [`Snapshot`]); bytes in a region
    /// are copied.
    pub fn snapshot(&self, extents: &[Extent]) -> Result<Snapshot, PlaneError> {
        let len = self.extent_bytes(extents)?;
        let mut snap = Snapshot {
            len,
            ..Snapshot::default()
        };
        // The page of the previous piece: (page number, index in `pages`).
        let mut last: Option<(u64, u32)> = None;
        self.for_each_piece(extents, |src| {
            let (page, buf, off, n) = match src {
                Src::Page { page, buf, off, n } => (page, buf, off, n),
                Src::Region(bytes) => {
                    // Copied: region bytes change in place once the read
                    // is over.
                    for chunk in bytes.chunks(PAGE) {
                        snap.pages.push(Arc::new(chunk.into()));
                        snap.pieces.push(PieceRef {
                            page: (snap.pages.len() - 1) as u32,
                            off: 0,
                            len: chunk.len(),
                        });
                    }
                    last = None;
                    return;
                }
            };
            let index = match last {
                Some((p, i)) if p == page => i,
                _ => {
                    let i = match buf {
                        Some(buf) => {
                            snap.pages.push(buf.clone());
                            (snap.pages.len() - 1) as u32
                        }
                        None => ZERO_PIECE,
                    };
                    last = Some((page, i));
                    i
                }
            };
            // Back-to-back pieces of one page (rows that touch) are one.
            match snap.pieces.last_mut() {
                Some(prev) if prev.page == index && prev.off + prev.len == off => prev.len += n,
                _ => snap.pieces.push(PieceRef {
                    page: index,
                    off,
                    len: n,
                }),
            }
        })?;
        Ok(snap)
    }

    /// Call `f` with each piece of `extents`, in order: a part of a page
    /// (under that page's shard read lock, kept from one piece to the next
    /// in the same shard: a strided tile's rows would otherwise take the
    /// lock once a row) or of a region.
    #[allow(unsafe_code)]
    fn for_each_piece(
        &self,
        extents: &[Extent],
        mut f: impl FnMut(Src<'_>),
    ) -> Result<(), PlaneError> {
        let mut held: Option<(usize, std::sync::RwLockReadGuard<'_, Pages>)> = None;
        for e in extents {
            for (addr, len) in runs(e)? {
                let space = self.check(addr, len)?;
                let host = space == Space::Host;
                let (region, addr, len) = self.split_run(addr, len as usize);
                if let Some((r, off, n)) = region {
                    // SAFETY: a read; the plane's contract (`shared`) rules
                    // out a write to these bytes while it runs.
                    f(Src::Region(unsafe { r.bytes(off, n) }));
                }
                for (page, off, n) in page_spans(addr, len) {
                    let s = shard_of(page);
                    if held.as_ref().is_none_or(|(h, _)| *h != s) {
                        // One lock at a time: never wait holding another.
                        drop(held.take());
                        let guard = self.pages[s].read().unwrap_or_else(PoisonError::into_inner);
                        held = Some((s, guard));
                    }
                    let (_, shard) = held.as_ref().expect("just taken");
                    f(Src::Page {
                        page,
                        buf: self.page_or_input(shard, page, host),
                        off,
                        n,
                    });
                }
            }
        }
        Ok(())
    }

    fn scatter_shared(&self, extents: &[Extent], data: &[u8]) -> Result<(), PlaneError> {
        let mut pos = 0usize;
        self.scatter_each_shared(extents, data.len() as u64, |dst| {
            dst.copy_from_slice(&data[pos..pos + dst.len()]);
            pos += dst.len();
        })
    }

    fn scatter_each_shared(
        &self,
        extents: &[Extent],
        total: u64,
        mut f: impl FnMut(&mut [u8]),
    ) -> Result<(), PlaneError> {
        self.scatter_pages(extents, total, |_, _| None, |_, dst| f(dst))
    }

    fn scatter_snapshot_shared(
        &self,
        extents: &[Extent],
        snap: &Snapshot,
    ) -> Result<(), PlaneError> {
        // The snapshot piece holding byte `at` of the data, and its start
        // (`at` only grows).
        let cursor = std::cell::Cell::new((0usize, 0usize));
        let seek = |at: usize| {
            let (mut i, mut start) = cursor.get();
            while start + snap.pieces[i].len <= at {
                start += snap.pieces[i].len;
                i += 1;
            }
            cursor.set((i, start));
            (i, start)
        };
        self.scatter_pages(
            extents,
            snap.len,
            |at, n| {
                let (i, start) = seek(at);
                let p = &snap.pieces[i];
                (start == at && n == PAGE && p.len == PAGE)
                    .then(|| snap.page(p).cloned())
                    .flatten()
            },
            |at, dst| {
                let mut done = 0;
                while done < dst.len() {
                    let (i, start) = seek(at + done);
                    let piece = snap.bytes(&snap.pieces[i]);
                    let from = &piece[at + done - start..];
                    let k = from.len().min(dst.len() - done);
                    dst[done..done + k].copy_from_slice(&from[..k]);
                    done += k;
                }
            },
        )
    }

    /// The writing loop: for each destination piece at byte `at` of the
    /// data, `share(at, len)` may give a whole page to put there; else
    /// `fill(at, piece)` writes the piece (a page part or a region part).
    #[allow(unsafe_code)]
    fn scatter_pages(
        &self,
        extents: &[Extent],
        total: u64,
        mut share: impl FnMut(usize, usize) -> Option<PageBuf>,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), PlaneError> {
        let ranges = self.extent_bytes(extents)?;
        if total != ranges {
            return Err(PlaneError::LengthMismatch {
                data: total,
                ranges,
            });
        }
        let mut at = 0usize;
        let mut held: Option<(usize, std::sync::RwLockWriteGuard<'_, Pages>)> = None;
        for e in extents {
            for (addr, len) in runs(e)? {
                let space = self.check(addr, len)?;
                let host = space == Space::Host;
                let (region, addr, len) = self.split_run(addr, len as usize);
                if let Some((r, off, n)) = region {
                    // SAFETY: the plane's contract (`shared`) rules out any
                    // other access to these bytes while this write runs, and
                    // the slice lives only for this call.
                    fill(at, unsafe { r.bytes_mut(off, n) });
                    at += n;
                }
                for (page, off, n) in page_spans(addr, len) {
                    // The lock is kept across pieces in one shard.
                    let s = shard_of(page);
                    if held.as_ref().is_none_or(|(h, _)| *h != s) {
                        // One lock at a time: never wait holding another.
                        drop(held.take());
                        let guard = self.pages[s]
                            .write()
                            .unwrap_or_else(PoisonError::into_inner);
                        held = Some((s, guard));
                    }
                    let (_, shard) = held.as_mut().expect("just taken");
                    match share(at, n) {
                        Some(p) if off == 0 => {
                            shard.insert(page, p);
                        }
                        _ => fill(at, &mut self.page_mut(shard, page, host)[off..off + n]),
                    }
                    at += n;
                }
            }
        }
        Ok(())
    }
}

/// The shard of a page number.
fn shard_of(page: u64) -> usize {
    page as usize % SHARDS
}

/// Where one piece of an access lies.
enum Src<'a> {
    /// Part of a page; `buf` is `None` for unwritten memory (zeros).
    Page {
        page: u64,
        buf: Option<&'a PageBuf>,
        off: usize,
        n: usize,
    },
    /// Bytes of a region.
    Region(&'a [u8]),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Page { n, .. } => *n,
            Src::Region(b) => b.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Src::Page {
                buf: Some(p),
                off,
                n,
                ..
            } => &p[*off..*off + *n],
            Src::Page { buf: None, n, .. } => &ZEROS[..*n],
            Src::Region(b) => b,
        }
    }
}

/// The plane as several threads write it at once (made by the `unsafe`
/// [`DataPlane::shared`], whose contract every use relies on).
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    plane: &'a DataPlane,
}

impl<'a> Shared<'a> {
    /// See [`DataPlane::extent_bytes`].
    pub fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        self.plane.extent_bytes(extents)
    }

    /// See [`DataPlane::piece_count`].
    pub fn piece_count(&self, extents: &[Extent]) -> usize {
        self.plane.piece_count(extents)
    }

    /// See [`DataPlane::gather`].
    pub fn gather(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        self.plane.gather(extents, out)
    }

    /// See [`DataPlane::fingerprint`].
    pub fn fingerprint(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        self.plane.fingerprint(extents)
    }

    /// See [`DataPlane::snapshot`].
    pub fn snapshot(&self, extents: &[Extent]) -> Result<Snapshot, PlaneError> {
        self.plane.snapshot(extents)
    }

    /// Write `data` to `extents` in order; `data` must hold exactly their
    /// bytes.
    pub fn scatter(&self, extents: &[Extent], data: &[u8]) -> Result<(), PlaneError> {
        self.plane.scatter_shared(extents, data)
    }

    /// Fill the bytes of `extents`, in order, a piece at a time through `f`
    /// (which must fill all of each piece); `total` must be their size, or
    /// nothing is written. `f` may run under a page lock: it must not use
    /// the plane.
    pub fn scatter_each(
        &self,
        extents: &[Extent],
        total: u64,
        f: impl FnMut(&mut [u8]),
    ) -> Result<(), PlaneError> {
        self.plane.scatter_each_shared(extents, total, f)
    }

    /// Write the bytes of `snap` to `extents` in order, copying each byte
    /// once, and sharing instead of copying every whole, page-aligned
    /// destination page that a whole page of the snapshot fills.
    pub fn scatter_snapshot(&self, extents: &[Extent], snap: &Snapshot) -> Result<(), PlaneError> {
        self.plane.scatter_snapshot_shared(extents, snap)
    }

    /// The address of bytes `start..start + len` of the data of `extents`
    /// when they lie back to back in one region (a tile in TCM).
    pub fn region_addr(&self, extents: &[Extent], start: u64, len: u64) -> Option<u64> {
        let mut at = 0u64;
        for e in extents {
            for (addr, n) in runs(e).ok()? {
                if start < at + n {
                    let addr = addr + (start - at);
                    let (r, off) = self.plane.region_at(addr)?;
                    return (start + len <= at + n && len <= (r.len() - off) as u64)
                        .then_some(addr);
                }
                at += n;
            }
        }
        None
    }

    /// `n` f32 values at `addr`, read in place from a region (`None`
    /// unless [`Shared::region_addr`] would give `addr` for these bytes
    /// and they are 4-byte aligned).
    ///
    /// # Safety
    /// No slice from [`Shared::f32s_mut`] that overlaps these bytes may be
    /// live at the same time, and no write to them may run meanwhile.
    #[allow(unsafe_code)]
    pub unsafe fn f32s(&self, addr: u64, n: usize) -> Option<&'a [f32]> {
        let (r, off) = self.plane.region_at(addr)?;
        let len = n.checked_mul(4).filter(|&l| l <= r.len() - off)?;
        // SAFETY: the caller rules out writers of these bytes.
        bytemuck::try_cast_slice(unsafe { r.bytes(off, len) }).ok()
    }

    /// As [`Shared::f32s`], to write in place.
    ///
    /// # Safety
    /// No other slice of these bytes may be live at the same time (from
    /// this call or any other), and no other access to them may run
    /// meanwhile.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub unsafe fn f32s_mut(&self, addr: u64, n: usize) -> Option<&'a mut [f32]> {
        let (r, off) = self.plane.region_at(addr)?;
        let len = n.checked_mul(4).filter(|&l| l <= r.len() - off)?;
        // SAFETY: the caller guarantees this is the only slice of these
        // bytes while it lives.
        bytemuck::try_cast_slice_mut(unsafe { r.bytes_mut(off, len) }).ok()
    }
}

/// The bytes an extent covers, first to last: `[start, end)` (`None` when
/// empty or when it overflows).
pub fn span(e: &Extent) -> Option<(u64, u64)> {
    if e.len == 0 || e.rows == 0 {
        return None;
    }
    let last_row = if e.rows <= 1 {
        0
    } else {
        (e.rows as u64 - 1).checked_mul(e.stride)?
    };
    let end = e.pa.checked_add(last_row)?.checked_add(e.len)?;
    Some((e.pa, end))
}

/// What unwritten device memory reads as.
static ZEROS: [u8; PAGE] = [0; PAGE];

/// [`kb_format::fingerprint`] of bytes fed piece by piece, `total` in
/// all: one pass when a single piece holds them all; otherwise the
/// streaming hasher (slower on small pieces, and it allocates).
struct PieceHasher {
    total: u64,
    whole: Option<u64>,
    streaming: Option<kb_format::Fingerprinter>,
}

impl PieceHasher {
    fn new(total: u64) -> PieceHasher {
        PieceHasher {
            total,
            whole: None,
            streaming: None,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        if bytes.len() as u64 == self.total {
            self.whole = Some(kb_format::fingerprint(bytes));
        } else {
            self.streaming
                .get_or_insert_with(kb_format::Fingerprinter::new)
                .update(bytes);
        }
    }

    fn digest(self) -> u64 {
        self.whole
            .or_else(|| self.streaming.map(|h| h.digest()))
            .unwrap_or_else(|| kb_format::fingerprint(&[]))
    }
}

/// A piece's page index for unwritten memory (zeros).
const ZERO_PIECE: u32 = u32::MAX;

/// Part of one page of a [`Snapshot`]: an index into its pages, or
/// [`ZERO_PIECE`].
#[derive(Debug, Clone, Copy)]
struct PieceRef {
    page: u32,
    off: usize,
    len: usize,
}

/// Bytes read from the plane without copying them: references to the
/// pages that held them, piece by piece in data order. A page a snapshot
/// refers to is shared, so a later write to it copies it first
/// (`Arc::make_mut`): the snapshot keeps the bytes as they were read.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Each page once (a strided tile's rows share their page).
    pages: Vec<PageBuf>,
    pieces: Vec<PieceRef>,
    len: u64,
}

impl Snapshot {
    /// Bytes in all.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Contiguous pieces of memory the bytes are in.
    pub fn piece_count(&self) -> usize {
        self.pieces.len()
    }

    /// The bytes, piece by piece, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().map(|p| self.bytes(p))
    }

    fn page(&self, p: &PieceRef) -> Option<&PageBuf> {
        self.pages.get(p.page as usize)
    }

    fn bytes(&self, p: &PieceRef) -> &[u8] {
        match self.page(p) {
            Some(buf) => &buf[p.off..p.off + p.len],
            None => &ZEROS[..p.len],
        }
    }

    /// The fingerprint of the bytes ([`kb_format::fingerprint`] of their
    /// concatenation), without concatenating them.
    pub fn fingerprint(&self) -> u64 {
        let mut h = PieceHasher::new(self.len);
        self.pieces().for_each(|p| h.feed(p));
        h.digest()
    }

    /// Bytes `start..start + len`, when one piece holds them all.
    pub fn contiguous(&self, start: usize, len: usize) -> Option<SnapshotSlice> {
        let mut at = 0usize;
        for p in &self.pieces {
            if start < at + p.len {
                return (start + len <= at + p.len).then(|| SnapshotSlice {
                    page: self.page(p).cloned(),
                    off: p.off + (start - at),
                    len,
                });
            }
            at += p.len;
        }
        None
    }
}

/// Contiguous bytes of a [`Snapshot`], holding their page (`None`:
/// unwritten memory).
#[derive(Debug, Clone)]
pub struct SnapshotSlice {
    page: Option<PageBuf>,
    off: usize,
    len: usize,
}

impl SnapshotSlice {
    pub fn bytes(&self) -> &[u8] {
        match &self.page {
            Some(p) => &p[self.off..self.off + self.len],
            None => &ZEROS[..self.len],
        }
    }
}

/// The runs of an extent as (address, length), validated not to overflow;
/// back-to-back rows (stride equal to length) come as one run.
pub fn runs(e: &Extent) -> Result<impl Iterator<Item = (u64, u64)> + use<>, PlaneError> {
    let overflow = PlaneError::ExtentOverflow {
        pa: e.pa,
        len: e.len,
        rows: e.rows,
        stride: e.stride,
    };
    let (rows, stride) = if e.rows <= 1 {
        (e.rows as u64, 0)
    } else {
        (e.rows as u64, e.stride)
    };
    if rows > 0 {
        let last = (rows - 1)
            .checked_mul(stride)
            .and_then(|o| o.checked_add(e.pa))
            .and_then(|a| a.checked_add(e.len))
            .ok_or(overflow.clone())?;
        if last > 1 << PA_BITS {
            return Err(overflow);
        }
    }
    // Rows that follow each other with no gap are one run (so that whole
    // pages in them can be shared).
    let (rows, stride, len) = if rows > 1 && stride == e.len {
        (1, 0, e.len * rows)
    } else {
        (rows, stride, e.len)
    };
    let pa = e.pa;
    Ok((0..rows).map(move |r| (pa + r * stride, len)))
}

/// The pieces of `len` bytes at `addr` as (page number, offset in page, length).
fn page_spans(addr: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
    let mut addr = addr;
    let mut left = len;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let off = (addr & PAGE_MASK) as usize;
        let n = (PAGE - off).min(left);
        let item = (addr >> PAGE_BITS, off, n);
        addr += n as u64;
        left -= n;
        Some(item)
    })
}

/// A human-readable address: `sip0.cube1.pe2.tcm+0x40` for device PAs,
/// `host:NAME+0x10` for host data.
pub fn fmt_addr(addr: u64, tensors: &[TensorMeta]) -> String {
    if let Some(p) = Pa::decode(addr) {
        return p.to_string();
    }
    if let Some((t, off)) = pa::split_host(addr) {
        return match tensors.get(t as usize) {
            Some(m) => format!("host:{}+{off:#x}", m.name),
            None => format!("host:tensor{t}+{off:#x}"),
        };
    }
    format!("{addr:#x} (invalid)")
}

/// A human-readable extent: its address and size (and rows and stride when
/// strided).
pub fn fmt_extent(e: &Extent, tensors: &[TensorMeta]) -> String {
    let a = fmt_addr(e.pa, tensors);
    if e.rows == 1 {
        format!("{a} [{} B]", e.len)
    } else {
        format!("{a} [{} x {} B, stride {}]", e.rows, e.len, e.stride)
    }
}

/// Extents joined with `, `.
pub fn fmt_extents(es: &[Extent], tensors: &[TensorMeta]) -> String {
    if es.is_empty() {
        return "(none)".into();
    }
    es.iter()
        .map(|e| fmt_extent(e, tensors))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::Dtype;

    fn dev(space: Space, offset: u64) -> u64 {
        Pa {
            space,
            sip: 1,
            cube: 2,
            pe: 3,
            offset,
        }
        .encode()
        .expect("valid PA")
    }

    fn tensor(name: &str, n: u64) -> TensorMeta {
        TensorMeta {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![n],
            address: 0,
            host_data: true,
            shards: vec![],
        }
    }

    fn plane() -> DataPlane {
        DataPlane::new(&[tensor("x", 100_000), tensor("y", 8)], DEFAULT_MAX_BYTES)
    }

    fn read(p: &DataPlane, addr: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0xaa; n];
        p.read(addr, &mut v).unwrap();
        v
    }

    #[test]
    fn unwritten_device_memory_reads_zero() {
        let p = plane();
        assert_eq!(read(&p, dev(Space::Hbm, 12345), 5), vec![0; 5]);
    }

    #[test]
    fn partial_and_overlapping_writes_keep_the_latest_bytes() {
        let mut p = plane();
        let base = dev(Space::Tcm, 100);
        p.write(base, &[1, 2, 3, 4, 5, 6]).unwrap();
        p.write(base + 2, &[9, 9]).unwrap();
        p.write(base + 5, &[7, 8]).unwrap();
        assert_eq!(read(&p, base - 1, 9), vec![0, 1, 2, 9, 9, 5, 7, 8, 0]);
        // A read inside a written range.
        assert_eq!(read(&p, base + 3, 2), vec![9, 5]);
    }

    #[test]
    fn writes_and_reads_cross_page_boundaries() {
        let mut p = plane();
        let base = dev(Space::Hbm, PAGE as u64 * 3 - 3);
        let data: Vec<u8> = (0..PAGE as u32 + 10).map(|i| (i % 251) as u8).collect();
        p.write(base, &data).unwrap();
        assert_eq!(read(&p, base, data.len()), data);
        assert_eq!(p.page_count(), 3);
        // Different spaces with the same offset do not alias.
        assert_eq!(
            read(&p, dev(Space::Tcm, PAGE as u64 * 3 - 3), 4),
            vec![0; 4]
        );
    }

    #[test]
    fn strided_gather_and_scatter() {
        let mut p = plane();
        let src = dev(Space::Hbm, 0);
        p.write(src, &(0u8..32).collect::<Vec<_>>()).unwrap();
        // 3 rows of 2 bytes, 8 apart, then one contiguous run of 3.
        let ex = [
            Extent {
                pa: src + 1,
                len: 2,
                rows: 3,
                stride: 8,
            },
            Extent::contiguous(src + 30, 2),
        ];
        let mut got = Vec::new();
        p.gather(&ex, &mut got).unwrap();
        assert_eq!(got, vec![1, 2, 9, 10, 17, 18, 30, 31]);

        let dst = dev(Space::Tcm, 0);
        let out = [Extent {
            pa: dst,
            len: 4,
            rows: 2,
            stride: 6,
        }];
        p.scatter(&out, &got).unwrap();
        assert_eq!(read(&p, dst, 10), vec![1, 2, 9, 10, 0, 0, 17, 18, 30, 31]);
        // Wrong byte count is an error, not a partial write.
        assert!(p.scatter(&out, &got[..7]).is_err());
    }

    #[test]
    fn snapshots_copy_once_and_keep_the_bytes_they_read() {
        let mut p = plane();
        let src = dev(Space::Hbm, PAGE as u64 - 8);
        let data: Vec<u8> = (0..3 * PAGE as u32).map(|i| (i % 253) as u8).collect();
        p.write(src, &data).unwrap();
        // Strided rows across page boundaries, then a whole aligned page.
        let ex = [
            Extent {
                pa: src,
                len: 16,
                rows: 3,
                stride: 40,
            },
            Extent::contiguous(dev(Space::Hbm, PAGE as u64), PAGE as u64),
        ];
        let mut gathered = Vec::new();
        p.gather(&ex, &mut gathered).unwrap();
        let snap = p.snapshot(&ex).unwrap();
        assert_eq!(snap.len(), gathered.len() as u64);
        assert_eq!(snap.pieces().collect::<Vec<_>>().concat(), gathered);
        assert_eq!(snap.fingerprint(), kb_format::fingerprint(&gathered));
        // Row 0 crosses into the second page; rows 1 and 2 lie apart in
        // it; then the whole page: five pieces.
        assert_eq!(snap.piece_count(), 5);
        assert_eq!(snap.contiguous(16, 16).unwrap().bytes(), &gathered[16..32]);
        assert_eq!(snap.contiguous(36, 8).unwrap().bytes(), &gathered[36..44]);
        assert!(snap.contiguous(8, 16).is_none(), "spans two pieces");
        assert!(snap.contiguous(40, 16).is_none(), "spans two pieces");
        // Writing the source after the snapshot does not change it.
        p.write(src, &[0xff; 64]).unwrap();
        p.write(dev(Space::Hbm, PAGE as u64 + 100), &[0xee; 8])
            .unwrap();
        assert_eq!(snap.pieces().collect::<Vec<_>>().concat(), gathered);
        // Scatter: strided destination, then a page-aligned whole page,
        // which is shared rather than copied.
        let dst = dev(Space::Tcm, PAGE as u64 - 20);
        let out = [
            Extent {
                pa: dst,
                len: 24,
                rows: 2,
                stride: 30,
            },
            Extent::contiguous(dev(Space::Tcm, 2 * PAGE as u64), PAGE as u64),
        ];
        p.scatter_snapshot(&out, &snap).unwrap();
        let mut back = Vec::new();
        p.gather(&out, &mut back).unwrap();
        assert_eq!(back, gathered);
        // A write to the shared page leaves the other side as it was.
        p.write(dev(Space::Tcm, 2 * PAGE as u64), &[1, 2, 3])
            .unwrap();
        assert_eq!(snap.pieces().collect::<Vec<_>>().concat(), gathered);
        assert_eq!(
            read(&p, dev(Space::Tcm, 2 * PAGE as u64), 4),
            vec![1, 2, 3, gathered[51]]
        );
        // A destination of the wrong size is refused.
        assert!(matches!(
            p.scatter_snapshot(&out[..1], &snap),
            Err(PlaneError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn tcm_regions_grow_keeping_their_bytes_and_page_what_lies_beyond() {
        let mut p = plane();
        let at = |o| dev(Space::Tcm, o);
        p.write(at(10), &[1, 2, 3]).unwrap();
        assert_eq!(
            p.regions[&(at(0) >> OFFSET_BITS)].len(),
            REGION_MIN as usize
        );
        // Growing copies what the region held.
        p.write(at(3 << 20), &[4, 5]).unwrap();
        assert_eq!(p.regions[&(at(0) >> OFFSET_BITS)].len(), 4 << 20);
        assert_eq!(read(&p, at(9), 5), [0, 1, 2, 3, 0]);
        // Past REGION_MAX bytes are paged; a run across the end is split.
        let end = REGION_MAX;
        p.write(at(end - 2), &[6, 7, 8, 9]).unwrap();
        assert_eq!(
            p.regions[&(at(0) >> OFFSET_BITS)].len(),
            REGION_MAX as usize
        );
        assert_eq!(p.page_count(), 1);
        assert_eq!(read(&p, at(end - 3), 6), [0, 6, 7, 8, 9, 0]);
        assert_eq!(read(&p, at(3 << 20), 2), [4, 5]);
        // Another PE's TCM is a region of its own.
        let other = Pa {
            pe: 4,
            ..Pa::decode(at(0)).unwrap()
        }
        .encode()
        .unwrap();
        assert_eq!(read(&p, other + 10, 3), [0, 0, 0]);
        p.write(other + 10, &[7]).unwrap();
        assert_eq!(read(&p, at(10), 1), [1]);
        assert_eq!(p.regions.len(), 2);
    }

    #[test]
    fn fingerprints_match_the_gathered_bytes_in_one_piece_or_many() {
        let mut p = plane();
        let data: Vec<u8> = (0..3 * PAGE as u32).map(|i| (i % 241) as u8).collect();
        for space in [Space::Hbm, Space::Tcm] {
            p.write(dev(space, 100), &data).unwrap();
            let cases = [
                vec![Extent::contiguous(dev(space, 100), 3 * PAGE as u64)],
                vec![Extent {
                    pa: dev(space, 100),
                    len: 700,
                    rows: 90,
                    stride: 2000,
                }],
                vec![
                    Extent::contiguous(dev(space, 5), 50),
                    Extent::contiguous(dev(space, PAGE as u64 - 7), 20),
                ],
                vec![],
            ];
            for ex in cases {
                let mut want = Vec::new();
                p.gather(&ex, &mut want).unwrap();
                assert_eq!(
                    p.fingerprint(&ex).unwrap(),
                    kb_format::fingerprint(&want),
                    "{space:?} {ex:?}"
                );
            }
        }
    }

    #[test]
    fn piece_counts_follow_pages_regions_and_runs() {
        let mut p = plane();
        let page = PAGE as u64;
        for space in [Space::Hbm, Space::Tcm] {
            let at = |o| dev(space, o);
            let one_page = [Extent::contiguous(at(0), page)];
            let straddling = [Extent::contiguous(at(8), page)];
            // Touching rows are one run.
            let rows = Extent {
                pa: at(0),
                len: 64,
                rows: 16,
                stride: 64,
            };
            let strided = Extent {
                stride: 128,
                ..rows
            };
            p.reserve(&straddling);
            assert_eq!(p.piece_count(&one_page), 1);
            // In a region, a run is one piece even across a page boundary.
            let across = if space == Space::Tcm { 1 } else { 2 };
            assert_eq!(p.piece_count(&straddling), across, "{space:?}");
            assert_eq!(p.piece_count(&[rows]), 1);
            assert_eq!(p.piece_count(&[strided]), 16);
        }
    }

    #[test]
    fn host_space_reads_tensor_data_and_keeps_the_input_pristine() {
        let mut p = plane();
        p.load_host(1, 0, &[1, 2, 3, 4]).unwrap();
        p.load_host(1, 4, &[5, 6, 7, 8]).unwrap();
        let h = pa::host(1, 2);
        assert_eq!(read(&p, h, 4), vec![3, 4, 5, 6]);
        p.write(h, &[0xee]).unwrap();
        assert_eq!(read(&p, pa::host(1, 0), 8), vec![1, 2, 0xee, 4, 5, 6, 7, 8]);
        let mut orig = [0u8; 8];
        p.read_host_input(1, 0, &mut orig).unwrap();
        assert_eq!(orig, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.host_coverage(1), Some((8, Some(8))));
    }

    #[test]
    fn bad_addresses_are_errors() {
        let mut p = plane();
        // Past the tensor's bytes.
        assert!(matches!(
            p.read(pa::host(1, 6), &mut [0; 4]),
            Err(PlaneError::HostOutOfRange { .. })
        ));
        // A tensor the trace does not have.
        assert!(matches!(
            p.read(pa::host(7, 0), &mut [0; 1]),
            Err(PlaneError::UnknownTensor { tensor: 7, .. })
        ));
        // Beyond 51 bits.
        assert!(p.write(1 << 51, &[1]).is_err());
        // Running from one space into the next.
        let end_of_hbm = (2u64 << 48) - 2;
        assert!(matches!(
            p.write(end_of_hbm, &[1, 2, 3]),
            Err(PlaneError::CrossesSpace { .. })
        ));
        assert!(p.load_host(1, 7, &[1, 2]).is_err());
    }

    #[test]
    fn absurd_extents_are_refused_before_allocating() {
        let p = DataPlane::new(&[], 1 << 20);
        let huge = [Extent {
            pa: dev(Space::Hbm, 0),
            len: 1 << 30,
            rows: 1 << 20,
            stride: 1 << 30,
        }];
        let mut v = Vec::new();
        assert!(matches!(
            p.gather(&huge, &mut v),
            Err(PlaneError::TooLarge { .. })
        ));
        let overflow = Extent {
            pa: dev(Space::Hbm, 0),
            len: 1,
            rows: 3,
            stride: u64::MAX / 2,
        };
        assert!(matches!(
            runs(&overflow).map(|_| ()),
            Err(PlaneError::ExtentOverflow { .. })
        ));
    }

    #[test]
    fn addresses_format_readably() {
        let ts = [tensor("x", 4)];
        assert_eq!(
            fmt_addr(dev(Space::Tcm, 0x40), &ts),
            "sip1.cube2.pe3.tcm+0x40"
        );
        assert_eq!(fmt_addr(pa::host(0, 16), &ts), "host:x+0x10");
        let e = Extent {
            pa: pa::host(0, 0),
            len: 2,
            rows: 2,
            stride: 4,
        };
        assert_eq!(fmt_extent(&e, &ts), "host:x+0x0 [2 x 2 B, stride 4]");
    }
}
