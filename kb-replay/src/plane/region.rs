//! A memory kept as one contiguous, zero-initialised buffer (a PE's TCM or
//! HBM partition, a cube's SRAM, a host tensor's input), written in place:
//! a GEMM reads its operands and accumulates its output where they lie.
//! A host tensor's input may instead be borrowed, read-only, from bytes
//! someone else owns (the mapped trace file): it is never written.
//!
//! Writing takes `&self`, so the buffer lives behind a raw pointer; the
//! plane hands out slices of it only under its sharing contract (see
//! [`super::Shared`]): no two live slices that overlap, one of them
//! mutable, ever exist at once.
#![allow(unsafe_code)]

use std::ptr::NonNull;

/// Alignment of a region's buffer: f32 views need 4; at most 16 keeps
/// `alloc_zeroed` a `calloc`, whose fresh pages are zeroed only when touched.
/// (Mappings are page-aligned.)
const ALIGN: usize = 16;

/// Owned buffers. On Linux an anonymous mapping: its pages are zeroed
/// when first touched, and it grows by `mremap`, which moves the pages
/// rather than copying them into fresh ones (measured: a region grown
/// three times by copying faulted in its written bytes each time, 43 % of
/// the attention trace's page faults once its first windows were small).
/// Elsewhere the allocator's zeroed memory, grown by copying.
#[cfg(target_os = "linux")]
mod sys {
    use std::ptr::NonNull;

    /// `len` (> 0) zero bytes, page-aligned.
    pub fn map(len: usize) -> Option<NonNull<u8>> {
        // SAFETY: a new private anonymous mapping: no file, no address
        // hint; the kernel checks the length. Failure is MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        debug_assert_eq!(p as usize % super::ALIGN, 0, "mappings are page-aligned");
        NonNull::new(p.cast())
    }

    /// Grow the mapping at `ptr` from `old` to `new` bytes, keeping its
    /// bytes (the new ones zero); where it now lies, or `None` (the old
    /// mapping unchanged).
    ///
    /// # Safety
    /// `ptr` and `old` are a live mapping from [`map`] (or an earlier
    /// `remap`), and no reference into it is live: it may move.
    pub unsafe fn remap(ptr: NonNull<u8>, old: usize, new: usize) -> Option<NonNull<u8>> {
        // SAFETY: per the contract, a whole live mapping that nothing
        // borrows; MREMAP_MAYMOVE lets the kernel move it.
        let p = unsafe { libc::mremap(ptr.as_ptr().cast(), old, new, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(p.cast())
    }

    /// # Safety
    /// `ptr` and `len` are a live mapping, unmapped once, not used after.
    pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
        // SAFETY: per the contract.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use super::ALIGN;
    use std::alloc::{self, Layout};
    use std::ptr::NonNull;

    pub fn map(len: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
    }

    /// Not in place here: the caller copies.
    pub unsafe fn remap(_: NonNull<u8>, _: usize, _: usize) -> Option<NonNull<u8>> {
        None
    }

    /// # Safety
    /// `ptr` came from [`map`] with `len`, freed once.
    pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
        let layout = Layout::from_size_align(len, ALIGN).expect("as allocated");
        // SAFETY: per the contract.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
    }
}

/// Bytes a borrowed region reads: kept alive by the region. Its `as_ref`
/// must give the same bytes, unchanged, for as long as it is shared (a
/// read-only file mapping, a vector).
pub type Owner = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A contiguous, zero-initialised buffer of `len` bytes, or `len` bytes
/// borrowed read-only from an [`Owner`].
pub(super) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes from the start that may have been written (what growing
    /// copies); the rest is still zero.
    written: usize,
    /// Whose bytes these are, when borrowed (never written, not freed).
    owner: Option<Owner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len)
            .field("written", &self.written)
            .field("borrowed", &self.owner.is_some())
            .finish()
    }
}

// SAFETY: a `Region` owns its buffer (like a `Box<[u8]>`), or keeps the
// `Send + Sync` owner of the bytes it reads (and never writes them); the
// plane only creates slices of it under the contract in the module docs,
// which rules out data races across threads.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// `len` zero bytes (`len` > 0), or `None` when the system refuses
    /// them. Large buffers come from the system zeroed and are touched
    /// only where written.
    pub(super) fn zeroed(len: usize) -> Option<Region> {
        Some(Region {
            ptr: sys::map(len.max(1))?,
            len,
            written: 0,
            owner: None,
        })
    }

    /// Grow an owned region to `len` bytes in place (its bytes kept, the
    /// new ones zero), without copying; false when it cannot (borrowed,
    /// not larger, the system refuses, or not on Linux): then nothing
    /// changed. `&mut self`: no slice of it is live.
    pub(super) fn grow(&mut self, len: usize) -> bool {
        if self.owner.is_some() || len <= self.len {
            return false;
        }
        // SAFETY: owned, so `ptr` and `len.max(1)` are the live mapping
        // `zeroed` (or an earlier `grow`) made; `&mut self` rules out any
        // live slice of it.
        match unsafe { sys::remap(self.ptr, self.len.max(1), len) } {
            Some(p) => {
                self.ptr = p;
                self.len = len;
                true
            }
            None => false,
        }
    }

    /// Bytes `at..at + len` of `owner` (`len` > 0), read in place: the
    /// region may be read, never written. `None` when out of range.
    pub(super) fn borrowed(owner: Owner, at: usize, len: usize) -> Option<Region> {
        let bytes = (*owner).as_ref().get(at..at.checked_add(len)?)?;
        if bytes.is_empty() {
            return None;
        }
        // The pointer stays valid while the region lives: the region
        // keeps `owner` (whose bytes do not move: an `Arc`'d mapping or
        // buffer), and nothing writes through it (`bytes_mut` refuses a
        // borrowed region), so `bytes` only ever reads initialised bytes
        // that no one changes.
        let ptr = NonNull::from(bytes).cast::<u8>();
        Some(Region {
            ptr,
            len,
            written: len,
            owner: Some(owner),
        })
    }

    /// Whether the bytes are borrowed (read-only).
    #[cfg(test)]
    pub(super) fn is_borrowed(&self) -> bool {
        self.owner.is_some()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes from the start that may have been written.
    pub(super) fn written(&self) -> usize {
        self.written
    }

    /// Bytes up to `end` may be written.
    pub(super) fn note_written(&mut self, end: usize) {
        self.written = self.written.max(end.min(self.len));
    }

    /// The address of byte `off`.
    #[cfg(test)]
    fn addr_of(&self, off: usize) -> usize {
        self.ptr.as_ptr() as usize + off
    }

    /// Bytes `off..off + n`.
    ///
    /// # Safety
    /// No mutable slice overlapping these bytes may be live while the
    /// returned one is (see the module docs).
    pub(super) unsafe fn bytes(&self, off: usize, n: usize) -> &[u8] {
        assert!(
            off <= self.len && n <= self.len - off,
            "region slice out of bounds"
        );
        // SAFETY: in bounds (checked above) of a live allocation of `len`
        // initialised bytes; the caller rules out overlapping writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), n) }
    }

    /// Bytes `off..off + n`, to write.
    ///
    /// # Safety
    /// No other slice overlapping these bytes may be live while the
    /// returned one is (see the module docs).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn bytes_mut(&self, off: usize, n: usize) -> &mut [u8] {
        assert!(
            off <= self.len && n <= self.len - off,
            "region slice out of bounds"
        );
        assert!(self.owner.is_none(), "a borrowed region is read-only");
        // SAFETY: in bounds (checked above); the caller guarantees the
        // slice is the only one over these bytes while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), n) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // Borrowed: the owner frees its bytes.
            return;
        }
        // SAFETY: owned: made by `zeroed` (or grown) with this length,
        // freed once, here.
        unsafe { sys::unmap(self.ptr, self.len.max(1)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_start_zeroed_and_keep_what_is_written() {
        let r = Region::zeroed(3 << 20).unwrap();
        assert_eq!(r.len(), 3 << 20);
        assert_eq!(r.addr_of(0) % ALIGN, 0);
        // SAFETY: one slice at a time, in this thread.
        unsafe {
            assert!(r.bytes(0, r.len()).iter().all(|&b| b == 0));
            r.bytes_mut(100, 3).copy_from_slice(&[1, 2, 3]);
            assert_eq!(r.bytes(99, 5), &[0, 1, 2, 3, 0]);
        }
    }

    #[test]
    fn regions_grow_keeping_their_bytes_with_zeros_after() {
        let mut r = Region::zeroed(64 << 10).unwrap();
        // SAFETY: one slice at a time, in this thread.
        unsafe { r.bytes_mut(0, 64 << 10).fill(7) };
        r.note_written(64 << 10);
        for len in [256 << 10, 4 << 20, 32 << 20] {
            let grown = r.grow(len);
            assert_eq!(grown, cfg!(target_os = "linux"));
            if !grown {
                return;
            }
            assert_eq!((r.len(), r.written()), (len, 64 << 10));
            // SAFETY: as above.
            unsafe {
                assert!(r.bytes(0, 64 << 10).iter().all(|&b| b == 7));
                assert!(r.bytes(64 << 10, len - (64 << 10)).iter().all(|&b| b == 0));
                r.bytes_mut(len - 1, 1)[0] = 9;
                assert_eq!(r.bytes(len - 2, 2), &[0, 9]);
                r.bytes_mut(len - 1, 1)[0] = 0;
            }
        }
        assert!(!r.grow(1 << 20), "not larger: unchanged");
        assert_eq!(r.len(), 32 << 20);
        let owner: Owner = std::sync::Arc::new(vec![1u8; 100]);
        let mut b = Region::borrowed(owner, 0, 100).unwrap();
        assert!(!b.grow(200), "borrowed regions do not grow");
    }

    #[test]
    fn borrowed_regions_read_their_owners_bytes_and_refuse_writes() {
        let owner: Owner = std::sync::Arc::new((0u8..100).collect::<Vec<u8>>());
        let r = Region::borrowed(owner.clone(), 10, 20).unwrap();
        assert!(r.is_borrowed());
        assert_eq!((r.len(), r.written()), (20, 20));
        // SAFETY: nothing writes the owner's bytes.
        assert_eq!(unsafe { r.bytes(0, 3) }, &[10, 11, 12]);
        assert!(Region::borrowed(owner.clone(), 90, 20).is_none());
        assert!(Region::borrowed(owner.clone(), 5, 0).is_none());
        let write = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: no other slice is live (and it panics first).
            let _ = unsafe { r.bytes_mut(0, 1) };
        }));
        assert!(write.is_err(), "writes to a borrowed region panic");
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn slices_past_the_end_panic() {
        let r = Region::zeroed(64).unwrap();
        // SAFETY: no other slice is live.
        let _ = unsafe { r.bytes(60, 8) };
    }
}
