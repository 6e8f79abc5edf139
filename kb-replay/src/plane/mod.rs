//! The data plane: byte-addressable memory keyed by the 51-bit PA of
//! [`kb_format::pa`].
//!
//! # Memories
//!
//! Each *memory* (one PE's TCM or HBM partition, one cube's SRAM, one host
//! tensor's input data) is kept as one contiguous, zero-initialised
//! buffer (a `region`) from its offset 0, grown by doubling to cover what
//! is written (up to [`TCM_REGION_MAX`] bytes of TCM and [`REGION_MAX`] of
//! any other memory; offsets beyond are kept in sparse 64 KiB pages, as
//! is anything a region could not be allocated for). A tile of a matrix
//! in HBM is then a strided view of one buffer ([`Shared::f32_view`]):
//! a GEMM reads it where it lies.
//!
//! Device memory that nothing wrote reads as zero. Host space
//! (`pa::host(tensor, offset)`) holds the trace's tensor data
//! ([`DataPlane::load_host`]), which replay never changes, so the
//! reference evaluation reads the inputs as the trace gave them even if an
//! op writes to host space (a device-to-host copy); such writes go to the
//! page map, whose pages shadow the input from then on.
//!
//! # Physical and logical bytes
//!
//! A memory op that the engine's planner does not apply leaves an alias
//! ([`lazy`]): the logical bytes of its destination are the physical
//! bytes of its source. Everything outside the engine sees logical bytes:
//! [`DataPlane::read`], [`DataPlane::gather`] and
//! [`DataPlane::fingerprint`] resolve aliases, and [`DataPlane::write`] and
//! [`DataPlane::scatter`] materialize what they would otherwise disturb.
//! The engine plans with the aliases ([`DataPlane::lazy_mut`]; it keeps
//! them apart from the plane while it replays, so that it can plan beside
//! running ops) and moves physical bytes through [`Shared`], which never
//! reads them.
//!
//! # Sharing
//!
//! `&self` only reads. The engine writes from several threads at once
//! through a [`Shared`] view, which [`DataPlane::shared`] makes (`unsafe`)
//! under one contract: no two accesses to overlapping bytes, one of them a
//! write, run at the same time. The engine's dependency graph orders every
//! such pair (engine::graph). Pages live in [`SHARDS`] hash maps, each
//! behind its own `RwLock`, so the maps themselves are safe to change from
//! several threads; region bytes rely on the contract alone. Regions grow,
//! and host input is loaded, only through `&mut self`.

use std::sync::{Arc, PoisonError, RwLock};

use rustc_hash::FxHashMap;

use kb_format::pa::{self, MAX_HOST_TENSORS, OFFSET_BITS, PA_BITS, Pa};
use kb_format::{Extent, Space, TensorMeta};

use crate::backend::{MatMut, MatRef};

pub mod lazy;
mod region;
use lazy::{Alias, Lazy};
pub use region::Owner;
use region::Region;

/// log2 of the page size.
pub const PAGE_BITS: u32 = 16;
/// Bytes per page.
pub const PAGE: usize = 1 << PAGE_BITS;
const PAGE_MASK: u64 = PAGE as u64 - 1;
/// Number of independently locked page maps.
pub const SHARDS: usize = 64;
/// Most bytes of one TCM kept as a region; offsets beyond are paged.
pub const TCM_REGION_MAX: u64 = 64 << 20;
/// Most bytes of any other memory kept as a region (a corrupt extent must
/// not drive a huge allocation); offsets beyond are paged.
pub const REGION_MAX: u64 = 1 << 30;
/// Smallest region (regions grow by doubling).
const REGION_MIN: u64 = PAGE as u64;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// Bits of a host address's byte offset (`kb_format::pa::host`).
const HOST_BITS: u32 = 36;
const HOST_MASK: u64 = (1 << HOST_BITS) - 1;

/// A page's bytes.
pub type PageBuf = Arc<Box<[u8]>>;

type Pages = FxHashMap<u64, PageBuf>;

fn zero_page() -> PageBuf {
    Arc::new(vec![0u8; PAGE].into_boxed_slice())
}

/// Bytes one op (or one gathered tensor) may hold unless configured
/// otherwise: a corrupt extent must not drive a huge allocation.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;

/// The memory an address lies in: one key per PE's TCM or HBM partition,
/// per cube's SRAM and per host tensor.
pub fn mem_key(addr: u64) -> u64 {
    match pa::space_of(addr) {
        Some(Space::Host) => 1 << 63 | addr >> HOST_BITS,
        _ => addr >> OFFSET_BITS,
    }
}

/// The offset of an address within its memory.
fn mem_offset(addr: u64) -> u64 {
    match pa::space_of(addr) {
        Some(Space::Host) => addr & HOST_MASK,
        _ => addr & OFFSET_MASK,
    }
}

/// Most bytes a region of this memory may hold.
fn region_cap(addr: u64) -> u64 {
    match pa::space_of(addr) {
        Some(Space::Tcm) => TCM_REGION_MAX,
        _ => REGION_MAX,
    }
}

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
    /// Pages beyond the regions (and host-space writes), by page number,
    /// in `SHARDS` locked maps.
    pages: Box<[RwLock<Pages>]>,
    /// Contiguous memories, by [`mem_key`]: device memories as written,
    /// host tensors' input data.
    regions: FxHashMap<u64, Region>,
    /// Host input data beyond its region, by page number.
    host_input: Pages,
    host: Vec<HostTensor>,
    /// Some op writes host space: its pages shadow the input, so host
    /// bytes are looked up page by page and never viewed in place.
    host_written: bool,
    lazy: Lazy,
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
            host_written: false,
            lazy: Lazy::default(),
            max_bytes,
        }
    }

    /// The per-op byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Pages written so far (for statistics and tests).
    pub fn page_count(&self) -> usize {
        self.pages
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// The aliases (lazy copies) now.
    pub fn lazy(&self) -> &Lazy {
        &self.lazy
    }

    /// The aliases, to change: the engine's planner keeps them (see the
    /// invariants in [`lazy`]).
    pub fn lazy_mut(&mut self) -> &mut Lazy {
        &mut self.lazy
    }

    /// Store host-provided bytes of `tensor` at byte `offset` (a tensor chunk).
    pub fn load_host(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, data.len() as u64)?;
        self.host[tensor as usize].loaded += data.len() as u64;
        // Aliases of these bytes keep the bytes they had.
        self.materialize_sourced(&[Extent::contiguous(addr, data.len() as u64)]);
        self.grow_region(addr, offset + data.len() as u64);
        let (region, rest, left) = self.split_run(addr, data.len());
        let mut pos = 0;
        if let Some((r, off, n)) = region {
            // SAFETY: `&mut self`: no other slice of the region is live.
            #[allow(unsafe_code)]
            unsafe { r.bytes_mut(off, n) }.copy_from_slice(&data[..n]);
            pos = n;
        }
        for (page, off, n) in page_spans(rest, left) {
            let p = Arc::make_mut(self.host_input.entry(page).or_insert_with(zero_page));
            p[off..off + n].copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }

    /// As [`DataPlane::load_host`], but when `data` is all of the tensor's
    /// bytes and nothing was loaded for it yet, they are read where they
    /// lie, at byte `at` of `owner` (the mapped trace), not copied: the
    /// plane keeps `owner` alive and never writes those bytes (host input
    /// never changes; writes to host space go to pages).
    pub fn load_host_in(
        &mut self,
        tensor: u32,
        offset: u64,
        data: &[u8],
        owner: &region::Owner,
        at: usize,
    ) -> Result<(), PlaneError> {
        let addr = self.host_range(tensor, offset, data.len() as u64)?;
        let whole = offset == 0
            && self.host[tensor as usize].nbytes == Some(data.len() as u64)
            && !data.is_empty()
            && data.len() as u64 <= region_cap(addr)
            && self.host[tensor as usize].loaded == 0
            && !self.regions.contains_key(&mem_key(addr))
            && (**owner)
                .as_ref()
                .get(at..at.saturating_add(data.len()))
                .is_some_and(|b| std::ptr::eq(b, data));
        let region = whole
            .then(|| region::Region::borrowed(owner.clone(), at, data.len()))
            .flatten();
        let Some(region) = region else {
            return self.load_host(tensor, offset, data);
        };
        self.host[tensor as usize].loaded += data.len() as u64;
        // Aliases of these bytes keep the bytes they had.
        self.materialize_sourced(&[Extent::contiguous(addr, data.len() as u64)]);
        self.regions.insert(mem_key(addr), region);
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
        self.input_pieces(addr, out.len(), &mut |b| {
            out[pos..pos + b.len()].copy_from_slice(b);
            pos += b.len();
        });
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
            Some(end) if end <= nbytes && end < 1 << HOST_BITS => Ok(pa::host(tensor, offset)),
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

    /// Check every run of `extents` (addresses, spaces, host bounds) and
    /// their total against the limit; returns the total.
    pub fn validate(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        let total = self.extent_bytes(extents)?;
        for e in extents {
            for (addr, len) in runs(e)? {
                self.check(addr, len)?;
            }
        }
        Ok(total)
    }

    /// Read `out.len()` bytes at `addr` (logical bytes). Unwritten device
    /// bytes read as zero; host bytes read as the trace's tensor data
    /// unless an op overwrote them.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), PlaneError> {
        let mut pos = 0;
        self.gather_each(&[Extent::contiguous(addr, out.len() as u64)], |src| {
            out[pos..pos + src.len()].copy_from_slice(src);
            pos += src.len();
        })?;
        Ok(())
    }

    /// The physical extents that hold the logical bytes of `extents`, in
    /// order (the extents themselves where no alias covers them).
    pub fn resolve(&self, extents: &[Extent]) -> Vec<Extent> {
        resolve_with(&self.lazy, extents)
    }

    /// Write `data` at `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PlaneError> {
        self.scatter(&[Extent::contiguous(addr, data.len() as u64)], data)
    }

    /// Write `data` to `extents` in order (logical bytes); `data` must hold
    /// exactly their bytes.
    pub fn scatter(&mut self, extents: &[Extent], data: &[u8]) -> Result<(), PlaneError> {
        self.validate(extents)?;
        self.prepare_write(extents);
        self.scatter_shared(extents, data)
    }

    /// Make `extents` ready to be written physically now: aliases of their
    /// bytes materialized, aliases onto them trimmed, regions grown.
    pub fn prepare_write(&mut self, extents: &[Extent]) {
        self.materialize_sourced(extents);
        for e in extents {
            for a in self.lazy.clear_target(e) {
                self.materialize(a);
            }
        }
        self.reserve(extents);
    }

    /// Materialize every alias whose source covers bytes of `extents`.
    fn materialize_sourced(&mut self, extents: &[Extent]) {
        for e in extents {
            for a in self.lazy.take_sourced(e) {
                self.materialize(a);
            }
        }
    }

    /// Copy an alias's source to its target (after the aliases that need
    /// the target's old bytes).
    fn materialize(&mut self, a: Alias) {
        let t = [a.target()];
        self.prepare_write(&t);
        let mut buf = Vec::new();
        if self.gather_phys(&a.src, &mut buf).is_ok() {
            let _ = self.scatter_shared(&t, &buf);
        }
    }

    /// Write every alias's bytes to its target.
    pub fn materialize_all(&mut self) {
        for a in self.lazy.drain() {
            let t = [a.target()];
            let mut buf = Vec::new();
            if self.gather_phys(&a.src, &mut buf).is_ok() {
                self.reserve(&t);
                let _ = self.scatter_shared(&t, &buf);
            }
        }
    }

    /// A view that writes through `&self`, for running ops on several
    /// threads at once.
    ///
    /// # Safety
    /// While the view (or a copy of it) is in use, no two accesses through
    /// it to overlapping bytes may run at the same time unless both only
    /// read, and no slice from [`Shared::f32_view_mut`] may be live while
    /// any other access to its bytes runs. Region bytes are not locked:
    /// breaking this is a data race.
    #[allow(unsafe_code)]
    pub unsafe fn shared(&mut self) -> Shared<'_> {
        Shared { plane: self }
    }

    /// Note that host space is written (its pages shadow the input from
    /// now on): before any host-space write.
    pub fn note_host_write(&mut self) {
        self.host_written = true;
    }

    /// Grow the regions to cover every device byte `extents` touch (up to
    /// their caps). Every write reserves its bytes first, so bytes are
    /// paged only beyond a region's cap: a region never grows over pages.
    /// Each region grows at most once per call, straight to the size the
    /// furthest of its extents needs. On Linux a region is an anonymous
    /// mapping that grows by `mremap` (its pages move, nothing is
    /// copied); elsewhere growing copies what the region holds into fresh
    /// memory (page faults on every page copied: a window whose extents
    /// came in ascending order made each TCM double three or four times,
    /// 13 MB copied into fresh pages in the attention trace).
    pub fn reserve<'e, I>(&mut self, extents: I)
    where
        I: IntoIterator<Item = &'e Extent> + Clone,
    {
        // The extent reaching furthest in each memory (among those a
        // region may hold), grown to first.
        let mut furthest: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
        for e in extents.clone() {
            let Some((start, end)) = span(e) else {
                continue;
            };
            if matches!(pa::space_of(start), Some(Space::Host) | None)
                || mem_key(end - 1) != mem_key(start)
                || mem_offset(start) >= region_cap(start)
            {
                continue;
            }
            let need = mem_offset(end - 1) + 1;
            let f = furthest.entry(mem_key(start)).or_insert((start, need));
            if need > f.1 {
                *f = (start, need);
            }
        }
        for &(start, need) in furthest.values() {
            self.grow_region(start, need);
        }
        // Then every extent, as one at a time (each notes what it may write).
        for e in extents {
            let Some((start, end)) = span(e) else {
                continue;
            };
            match pa::space_of(start) {
                Some(Space::Host) => self.host_written = true,
                Some(_) if mem_key(end - 1) == mem_key(start) => {
                    self.grow_region(start, mem_offset(end - 1) + 1)
                }
                _ => {}
            }
        }
    }

    /// Grow the region of the memory at `addr` to hold `end` bytes (its
    /// cap at most), copying what it held. A region that cannot be
    /// allocated stays as it is (its bytes beyond are paged).
    #[allow(unsafe_code)]
    fn grow_region(&mut self, addr: u64, end: u64) {
        let key = mem_key(addr);
        let cap = region_cap(addr);
        let old = self.regions.get(&key).map_or(0, |r| r.len());
        if end <= old as u64 || old as u64 >= cap || mem_offset(addr) >= cap {
            if let Some(r) = self.regions.get_mut(&key) {
                r.note_written(end.min(r.len() as u64) as usize);
            }
            return;
        }
        let len = end.next_power_of_two().clamp(REGION_MIN, cap) as usize;
        if let Some(r) = self.regions.get_mut(&key)
            && r.grow(len)
        {
            r.note_written(end.min(len as u64) as usize);
            return;
        }
        let Some(mut region) = Region::zeroed(len) else {
            return;
        };
        if let Some(prev) = self.regions.get(&key) {
            let used = prev.written();
            // SAFETY: `&mut self`: no other slice of either region is live.
            unsafe {
                region
                    .bytes_mut(0, used)
                    .copy_from_slice(prev.bytes(0, used));
            }
            region.note_written(used);
        }
        region.note_written(end.min(len as u64) as usize);
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

    /// The region holding every byte of `e` (device memory, or host input
    /// while no host byte is written: nothing shadows a region's bytes
    /// there), and `e`'s offset in it; `None` when none does, or `e` is
    /// empty or overflows.
    fn region_holding(&self, e: &Extent) -> Option<(&Region, usize)> {
        let (start, end) = span(e)?;
        if pa::space_of(start)? == Space::Host && self.host_written {
            return None;
        }
        let (r, off) = self.region_at(start)?;
        (end - start <= (r.len() - off) as u64).then_some((r, off))
    }

    /// The region of device memory (not host space, whose written bytes
    /// are pages) holding every byte of `e`, and `e`'s offset in it.
    fn device_region_holding(&self, e: &Extent) -> Option<(&Region, usize)> {
        if pa::space_of(e.pa)? == Space::Host {
            return None;
        }
        self.region_holding(e)
    }

    /// The region holding the byte at `addr`, and its offset there.
    fn region_at(&self, addr: u64) -> Option<(&Region, usize)> {
        let r = self.regions.get(&mem_key(addr))?;
        let off = mem_offset(addr) as usize;
        (off < r.len()).then_some((r, off))
    }

    /// Host input bytes `[addr, addr + len)` piece by piece: the region,
    /// then input pages (or zeros).
    fn input_pieces(&self, addr: u64, len: usize, f: &mut dyn FnMut(&[u8])) {
        let (region, rest, left) = self.split_run(addr, len);
        if let Some((r, off, n)) = region {
            // SAFETY: host input changes only through `&mut self`.
            #[allow(unsafe_code)]
            f(unsafe { r.bytes(off, n) });
        }
        for (page, off, n) in page_spans(rest, left) {
            match self.host_input.get(&page) {
                Some(p) => f(&p[off..off + n]),
                None => f(&ZEROS[..n]),
            }
        }
    }

    /// A page to write: created from the host input (host space) or zeros.
    fn page_mut<'a>(&self, shard: &'a mut Pages, page: u64, host: bool) -> &'a mut [u8] {
        let p = shard.entry(page).or_insert_with(|| {
            if !host {
                return zero_page();
            }
            let mut v = vec![0u8; PAGE];
            let mut pos = 0;
            self.input_pieces(page << PAGE_BITS, PAGE, &mut |b| {
                v[pos..pos + b.len()].copy_from_slice(b);
                pos += b.len();
            });
            Arc::new(v.into_boxed_slice())
        });
        let b: &mut Box<[u8]> = Arc::make_mut(p);
        &mut b[..]
    }

    /// Total bytes of `extents`, checked against the limit.
    pub fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        extent_bytes_within(extents, self.max_bytes)
    }

    /// Append the (logical) bytes of `extents`, in order, to `out`.
    pub fn gather(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        self.validate(extents)?;
        self.gather_phys(&self.resolve(extents), out)
    }

    fn gather_phys(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        let total = self.extent_bytes(extents)?;
        out.reserve(total as usize);
        self.for_each_piece(extents, |piece| out.extend_from_slice(piece))
    }

    /// Call `f` with the (logical) bytes of `extents`, in order, a piece at
    /// a time (unwritten device memory as zeros); returns their total. `f`
    /// may run under a page lock: it must not use the plane.
    pub fn gather_each(&self, extents: &[Extent], f: impl FnMut(&[u8])) -> Result<u64, PlaneError> {
        let total = self.validate(extents)?;
        self.for_each_piece(&self.resolve(extents), f)?;
        Ok(total)
    }

    /// [`kb_format::fingerprint`] of the (logical) bytes of `extents`, in
    /// order, without gathering them.
    pub fn fingerprint(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        self.validate(extents)?;
        self.fingerprint_phys(&self.resolve(extents))
    }

    fn fingerprint_phys(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        let mut h = PieceHasher::new(self.extent_bytes(extents)?);
        self.for_each_piece(extents, |b| h.feed(b))?;
        Ok(h.digest())
    }

    /// Call `f` with each piece of the physical bytes of `extents`, in
    /// order: a part of a region or of a page (under that page's shard
    /// read lock, kept from one piece to the next in the same shard).
    #[allow(unsafe_code)]
    fn for_each_piece(
        &self,
        extents: &[Extent],
        mut f: impl FnMut(&[u8]),
    ) -> Result<(), PlaneError> {
        let mut held: Option<(usize, std::sync::RwLockReadGuard<'_, Pages>)> = None;
        for e in extents {
            if let Some((r, off)) = self.region_holding(e) {
                // Every row in one region: no lookup per row.
                for (addr, len) in runs(e)? {
                    // SAFETY: a read of a run inside the region (checked
                    // by `region_holding`); the plane's contract (`shared`)
                    // rules out a write to these bytes while it runs.
                    f(unsafe { r.bytes(off + (addr - e.pa) as usize, len as usize) });
                }
                continue;
            }
            for (addr, len) in runs(e)? {
                // Callers validated the extents (`validate`, or the engine's
                // bounds check of every record).
                let space = pa::space_of(addr).ok_or(PlaneError::BadAddress { addr })?;
                let len = len as usize;
                if space == Space::Host && !self.host_written {
                    self.input_pieces(addr, len, &mut f);
                    continue;
                }
                if space == Space::Host {
                    // Page by page: a written page shadows the input.
                    for (page, off, n) in page_spans(addr, len) {
                        let s = shard_of(page);
                        if held.as_ref().is_none_or(|(h, _)| *h != s) {
                            drop(held.take());
                            let guard =
                                self.pages[s].read().unwrap_or_else(PoisonError::into_inner);
                            held = Some((s, guard));
                        }
                        let (_, shard) = held.as_ref().expect("just taken");
                        match shard.get(&page) {
                            Some(p) => f(&p[off..off + n]),
                            None => self.input_pieces((page << PAGE_BITS) + off as u64, n, &mut f),
                        }
                    }
                    continue;
                }
                let (region, addr, len) = self.split_run(addr, len);
                if let Some((r, off, n)) = region {
                    // SAFETY: a read; the plane's contract (`shared`) rules
                    // out a write to these bytes while it runs.
                    f(unsafe { r.bytes(off, n) });
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
                    match shard.get(&page) {
                        Some(p) => f(&p[off..off + n]),
                        None => f(&ZEROS[..n]),
                    }
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

    /// The writing loop: `fill` writes each destination piece (a region
    /// part or a page part) in order; `total` must be the extents' size.
    #[allow(unsafe_code)]
    fn scatter_each_shared(
        &self,
        extents: &[Extent],
        total: u64,
        mut fill: impl FnMut(&mut [u8]),
    ) -> Result<(), PlaneError> {
        let ranges = self.extent_bytes(extents)?;
        if total != ranges {
            return Err(PlaneError::LengthMismatch {
                data: total,
                ranges,
            });
        }
        let mut held: Option<(usize, std::sync::RwLockWriteGuard<'_, Pages>)> = None;
        for e in extents {
            for (addr, len) in runs(e)? {
                let space = pa::space_of(addr).ok_or(PlaneError::BadAddress { addr })?;
                let host = space == Space::Host;
                debug_assert!(!host || self.host_written, "host writes are noted first");
                let (region, addr, len) = if host {
                    (None, addr, len as usize)
                } else {
                    self.split_run(addr, len as usize)
                };
                if let Some((r, off, n)) = region {
                    // SAFETY: the plane's contract (`shared`) rules out any
                    // other access to these bytes while this write runs, and
                    // the slice lives only for this call.
                    fill(unsafe { r.bytes_mut(off, n) });
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
                    fill(&mut self.page_mut(shard, page, host)[off..off + n]);
                }
            }
        }
        Ok(())
    }

    /// Copy the physical bytes of `src` to `dst` (the same size, not
    /// overlapping): straight into regions when `dst` lies in them, else
    /// through a buffer. Returns the bytes copied.
    #[allow(unsafe_code)]
    fn copy_phys(&self, src: &[Extent], dst: &[Extent]) -> Result<u64, PlaneError> {
        let n = self.extent_bytes(src)?;
        let m = self.extent_bytes(dst)?;
        if n != m {
            return Err(PlaneError::LengthMismatch { data: n, ranges: m });
        }
        // One destination extent inside one region of device memory (a
        // tile stored to HBM or TCM): its runs are written there, with no
        // lookup of each run's region.
        let one_region = match dst {
            [d] => self.device_region_holding(d).map(|(r, off)| (r, off, d.pa)),
            _ => None,
        };
        let mut dst_runs: Vec<(u64, u64)> = Vec::with_capacity(dst.len());
        if one_region.is_some() {
            dst_runs.extend(runs(&dst[0])?);
        } else {
            let mut direct = true;
            for e in dst {
                for (addr, len) in runs(e)? {
                    let space = pa::space_of(addr).ok_or(PlaneError::BadAddress { addr })?;
                    direct &= space != Space::Host
                        && self
                            .region_at(addr)
                            .is_some_and(|(r, off)| len <= (r.len() - off) as u64);
                    dst_runs.push((addr, len));
                }
            }
            if !direct {
                let mut buf = crate::pool::BYTES.take(n as usize);
                self.gather_phys(src, &mut buf)?;
                let res = self.scatter_shared(dst, &buf);
                crate::pool::BYTES.give(buf);
                return res.map(|_| n);
            }
        }
        let mut next = dst_runs.into_iter();
        let mut cur: Option<(u64, u64)> = None;
        self.for_each_piece(src, |mut piece| {
            while !piece.is_empty() {
                let (addr, left) = match cur.take() {
                    Some(c) if c.1 > 0 => c,
                    _ => next.next().expect("sizes checked"),
                };
                let k = (left as usize).min(piece.len());
                let (r, off) = match one_region {
                    Some((r, off, base)) => (r, off + (addr - base) as usize),
                    None => self.region_at(addr).expect("checked: in a region"),
                };
                // SAFETY: the destination lies in a region (checked above)
                // and, by the plane's contract, nothing else touches it
                // while this copy runs; the source does not overlap it (the
                // caller's promise). The slice lives for this statement.
                unsafe { r.bytes_mut(off, k) }.copy_from_slice(&piece[..k]);
                piece = &piece[k..];
                cur = Some((addr + k as u64, left - k as u64));
            }
        })?;
        Ok(n)
    }

    /// Where a matrix of `rows` rows of `row_bytes` lies when `pieces`
    /// (physical extents, in order) hold it as rows at one stride inside
    /// one region: the region, the offset of its first byte, the stride
    /// in bytes and the bytes from the first to the last.
    fn matrix_at(
        &self,
        pieces: &[Extent],
        rows: usize,
        row_bytes: usize,
    ) -> Option<(&Region, usize, usize, usize)> {
        let (rows64, rb) = (rows as u64, row_bytes as u64);
        let (base, stride) = match pieces {
            [e] if e.bytes() == rows64 * rb && (e.rows <= 1 || e.stride == e.len) => (e.pa, rb),
            [e] if e.len == rb && e.rows as u64 == rows64 && e.stride >= rb => (e.pa, e.stride),
            _ => return None,
        };
        let stride = if rows <= 1 { rb } else { stride };
        let span = (rows64.max(1) - 1).checked_mul(stride)?.checked_add(rb)?;
        if pa::space_of(base)? == Space::Host && self.host_written {
            return None;
        }
        if mem_key(base) != mem_key(base + span.max(1) - 1) {
            return None;
        }
        let (r, off) = self.region_at(base)?;
        (span <= (r.len() - off) as u64).then_some((r, off, stride as usize, span as usize))
    }
}

/// The physical extents that hold the logical bytes of `extents` under
/// the aliases `lazy`, in order (the extents themselves where no alias
/// covers them).
pub fn resolve_with(lazy: &Lazy, extents: &[Extent]) -> Vec<Extent> {
    if lazy.is_empty() {
        return extents.iter().filter(|e| e.bytes() > 0).copied().collect();
    }
    let mut out = Vec::with_capacity(extents.len());
    for e in extents {
        lazy.resolve_into(e, &mut out);
    }
    out
}

/// Total bytes of `extents`, checked against the per-op limit `max_bytes`.
pub fn extent_bytes_within(extents: &[Extent], max_bytes: u64) -> Result<u64, PlaneError> {
    let mut total = 0u64;
    for e in extents {
        total = total.saturating_add(e.bytes());
    }
    if total > max_bytes {
        return Err(PlaneError::TooLarge {
            what: "the ranges of one op",
            bytes: total,
            limit: max_bytes,
        });
    }
    Ok(total)
}

/// The shard of a page number.
fn shard_of(page: u64) -> usize {
    page as usize % SHARDS
}

/// The plane as several threads write it at once (made by the `unsafe`
/// [`DataPlane::shared`], whose contract every use relies on). It moves
/// physical bytes: the engine has resolved aliases when it planned.
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    plane: &'a DataPlane,
}

impl<'a> Shared<'a> {
    /// See [`DataPlane::extent_bytes`].
    pub fn extent_bytes(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        self.plane.extent_bytes(extents)
    }

    /// Append the physical bytes of `extents`, in order, to `out`.
    pub fn gather(&self, extents: &[Extent], out: &mut Vec<u8>) -> Result<(), PlaneError> {
        self.plane.gather_phys(extents, out)
    }

    /// Call `f` with the physical bytes of `extents`, a piece at a time.
    pub fn gather_each(&self, extents: &[Extent], f: impl FnMut(&[u8])) -> Result<(), PlaneError> {
        self.plane.for_each_piece(extents, f)
    }

    /// [`kb_format::fingerprint`] of the physical bytes of `extents`.
    pub fn fingerprint(&self, extents: &[Extent]) -> Result<u64, PlaneError> {
        self.plane.fingerprint_phys(extents)
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

    /// Copy the bytes of `src` to `dst` (equal sizes; they must not
    /// overlap); returns the bytes copied.
    pub fn copy(&self, src: &[Extent], dst: &[Extent]) -> Result<u64, PlaneError> {
        self.plane.copy_phys(src, dst)
    }

    /// The f32 matrix of `rows` rows of `row_bytes` that `pieces` hold,
    /// read where it lies, when they are its rows at one stride (a
    /// multiple of 4) inside one region, 4-byte aligned (`None` otherwise).
    ///
    /// # Safety
    /// No write to these bytes may run, and no slice from
    /// [`Shared::f32_view_mut`] over them may be live, while the view is.
    #[allow(unsafe_code)]
    pub unsafe fn f32_view(
        &self,
        pieces: &[Extent],
        rows: usize,
        row_bytes: usize,
    ) -> Option<MatRef<'a, f32>> {
        if !cfg!(target_endian = "little") || !row_bytes.is_multiple_of(4) {
            return None;
        }
        let (r, off, stride, span) = self.plane.matrix_at(pieces, rows, row_bytes)?;
        if !stride.is_multiple_of(4) {
            return None;
        }
        // SAFETY: in bounds (`matrix_at` checked); the caller rules out
        // writers of these bytes.
        let bytes = unsafe { r.bytes(off, span) };
        let data = bytemuck::try_cast_slice(bytes).ok()?;
        MatRef::new(data, rows, row_bytes / 4, stride / 4)
    }

    /// The bytes of `e` where they lie, when `e` is one contiguous run
    /// inside one region (`None` otherwise: rows apart, paged, empty, host
    /// space once written).
    ///
    /// # Safety
    /// No write to these bytes may run, and no slice from
    /// [`Shared::slice_mut`] or [`Shared::f32_view_mut`] over them may be
    /// live, while the slice is.
    #[allow(unsafe_code)]
    pub unsafe fn slice(&self, e: &Extent) -> Option<&'a [u8]> {
        let n = usize::try_from(e.bytes()).ok().filter(|&n| n > 0)?;
        let (r, off, _, span) = self.plane.matrix_at(std::slice::from_ref(e), 1, n)?;
        // SAFETY: in bounds (`matrix_at` checked); the caller rules out
        // writers of these bytes.
        Some(unsafe { r.bytes(off, span) })
    }

    /// As [`Shared::slice`], to write in place (never host space).
    ///
    /// # Safety
    /// No other access to these bytes may run, and no other slice of them
    /// may be live, while the slice is.
    #[allow(unsafe_code)]
    pub unsafe fn slice_mut(&self, e: &Extent) -> Option<&'a mut [u8]> {
        if pa::space_of(e.pa) == Some(Space::Host) {
            return None;
        }
        let n = usize::try_from(e.bytes()).ok().filter(|&n| n > 0)?;
        let (r, off, _, span) = self.plane.matrix_at(std::slice::from_ref(e), 1, n)?;
        // SAFETY: in bounds (`matrix_at` checked); the caller guarantees
        // this is the only access to these bytes while the slice lives.
        Some(unsafe { r.bytes_mut(off, span) })
    }

    /// Run `f` on an op's operands and output where they lie: `reads` one
    /// extent per operand, of the byte lengths `lens` (at most three), and
    /// `dst` one extent, each a contiguous run inside one region, `dst`
    /// overlapping none of `reads`; `None` (`f` not called) otherwise.
    ///
    /// # Safety
    /// No other access to the bytes of `dst`, and no write to those of
    /// `reads`, may run while this does.
    #[allow(unsafe_code)]
    pub unsafe fn with_in_place<R>(
        &self,
        reads: &[Extent],
        lens: &[usize],
        dst: &[Extent],
        f: impl FnOnce(&[&[u8]], &mut [u8]) -> R,
    ) -> Option<R> {
        let [d] = dst else {
            return None;
        };
        if reads.len() != lens.len()
            || reads.len() > 3
            || reads.iter().zip(lens).any(|(e, &n)| e.bytes() != n as u64)
            || reads.iter().any(|e| lazy::overlaps(e, d))
        {
            return None;
        }
        let mut tiles: [&[u8]; 3] = [&[]; 3];
        for (t, e) in tiles.iter_mut().zip(reads) {
            // SAFETY: the caller rules out writers of the read bytes, and
            // the output slice below overlaps none of them (checked).
            *t = unsafe { self.slice(e) }?;
        }
        // SAFETY: the caller rules out any other access to these bytes,
        // and they overlap no operand slice (checked above).
        let out = unsafe { self.slice_mut(d) }?;
        Some(f(&tiles[..reads.len()], out))
    }

    /// As [`Shared::f32_view`], to write in place.
    ///
    /// # Safety
    /// No other access to these bytes may run, and no other slice of them
    /// may be live, while the view is.
    #[allow(unsafe_code)]
    pub unsafe fn f32_view_mut(
        &self,
        pieces: &[Extent],
        rows: usize,
        row_bytes: usize,
    ) -> Option<MatMut<'a, f32>> {
        if !cfg!(target_endian = "little") || !row_bytes.is_multiple_of(4) {
            return None;
        }
        if pieces
            .iter()
            .any(|e| pa::space_of(e.pa) == Some(Space::Host))
        {
            return None;
        }
        let (r, off, stride, span) = self.plane.matrix_at(pieces, rows, row_bytes)?;
        if !stride.is_multiple_of(4) {
            return None;
        }
        // SAFETY: in bounds (`matrix_at` checked); the caller guarantees
        // this is the only access to these bytes while the view lives.
        let bytes = unsafe { r.bytes_mut(off, span) };
        let data = bytemuck::try_cast_slice_mut(bytes).ok()?;
        MatMut::new(data, rows, row_bytes / 4, stride / 4)
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

/// Bytes [`PieceHasher`] gathers before they go to the streaming hasher.
const HASH_GATHER: usize = 64 << 10;

/// [`kb_format::fingerprint`] of bytes fed piece by piece, `total` in
/// all: one pass when a single piece holds them all; otherwise the pieces
/// are gathered, up to [`HASH_GATHER`] bytes at a time, and hashed in one
/// pass (or streamed in gathered parts when there are more). A tile's
/// rows come as pieces of a few hundred bytes, and each write to the
/// streaming hasher cost ~400 instructions, more than copying the row.
struct PieceHasher {
    total: u64,
    whole: Option<u64>,
    gathered: Vec<u8>,
    streaming: Option<kb_format::Fingerprinter>,
}

impl PieceHasher {
    fn new(total: u64) -> PieceHasher {
        PieceHasher {
            total,
            whole: None,
            gathered: Vec::new(),
            streaming: None,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        if bytes.len() as u64 == self.total {
            self.whole = Some(kb_format::fingerprint(bytes));
            return;
        }
        if self.gathered.len() + bytes.len() > HASH_GATHER {
            self.stream_gathered();
        }
        if bytes.len() >= HASH_GATHER {
            self.streaming
                .get_or_insert_with(kb_format::Fingerprinter::new)
                .update(bytes);
        } else {
            if self.gathered.capacity() == 0 {
                self.gathered
                    .reserve_exact(self.total.min(HASH_GATHER as u64) as usize);
            }
            self.gathered.extend_from_slice(bytes);
        }
    }

    /// Hand the gathered bytes to the streaming hasher.
    fn stream_gathered(&mut self) {
        if !self.gathered.is_empty() {
            self.streaming
                .get_or_insert_with(kb_format::Fingerprinter::new)
                .update(&self.gathered);
            self.gathered.clear();
        }
    }

    fn digest(mut self) -> u64 {
        if let Some(fp) = self.whole {
            return fp;
        }
        if self.streaming.is_none() {
            return kb_format::fingerprint(&self.gathered);
        }
        self.stream_gathered();
        self.streaming.expect("streamed").digest()
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
mod tests;
