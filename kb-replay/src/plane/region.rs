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

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of a region's buffer: f32 views need 4; at most 16 keeps
/// `alloc_zeroed` a `calloc`, whose fresh pages are zeroed only when touched.
const ALIGN: usize = 16;

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
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        Some(Region {
            ptr: NonNull::new(ptr)?,
            len,
            written: 0,
            owner: None,
        })
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
        let layout = Layout::from_size_align(self.len.max(1), ALIGN).expect("as allocated");
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
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
