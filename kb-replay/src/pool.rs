//! Reusable buffers for op data. Replay moves the same sizes of tiles over
//! and over; allocating each buffer afresh made the allocator hand memory
//! back to the kernel and fault it in again (a fifth of a GEMM trace's
//! time went to page faults and zeroing). A pool keeps a few freed buffers
//! for the next op; it never holds more than [`MAX_BUFFERS`] buffers or
//! [`MAX_BYTES`] bytes per type.

use std::sync::{Mutex, PoisonError};

/// Buffers a pool keeps at most.
pub const MAX_BUFFERS: usize = 64;
/// Bytes of buffers a pool keeps at most.
pub const MAX_BYTES: usize = 16 << 20;
/// Buffers smaller than this (in elements) are not worth keeping.
const MIN_KEEP: usize = 1024;

/// A pool of `Vec<T>` buffers.
#[derive(Debug)]
pub struct Pool<T> {
    free: Mutex<Vec<Vec<T>>>,
}

impl<T> Pool<T> {
    pub const fn new() -> Pool<T> {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer with room for at least `capacity` elements.
    pub fn take(&self, capacity: usize) -> Vec<T> {
        if capacity >= MIN_KEEP {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            // The smallest buffer that fits.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= capacity)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return free.swap_remove(i);
            }
        }
        Vec::with_capacity(capacity)
    }

    /// Return a buffer for reuse.
    pub fn give(&self, mut v: Vec<T>) {
        let size = std::mem::size_of::<T>().max(1);
        if v.capacity() < MIN_KEEP || v.capacity() * size > MAX_BYTES / 4 {
            return;
        }
        v.clear();
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let held: usize = free.iter().map(|b| b.capacity() * size).sum();
        if free.len() < MAX_BUFFERS && held + v.capacity() * size <= MAX_BYTES {
            free.push(v);
        } else if let Some((i, _)) = free
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| b.capacity())
            .filter(|(_, b)| b.capacity() < v.capacity())
            .filter(|(_, b)| held - b.capacity() * size + v.capacity() * size <= MAX_BYTES)
        {
            free[i] = v;
        }
    }
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool::new()
    }
}

/// Byte buffers (gathered ranges, held data).
pub static BYTES: Pool<u8> = Pool::new();
/// f32 matrices (GEMM operands).
pub static F32: Pool<f32> = Pool::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_smallest_fit_first() {
        let p: Pool<u8> = Pool::new();
        let a = p.take(5000);
        let b = p.take(100_000);
        let (ca, cb) = (a.capacity(), b.capacity());
        p.give(b);
        p.give(a);
        let x = p.take(4000);
        assert_eq!(x.capacity(), ca);
        assert!(x.is_empty());
        let y = p.take(50_000);
        assert_eq!(y.capacity(), cb);
        // Nothing left that fits: a new buffer.
        assert!(p.take(10).capacity() >= 10);
        // Tiny buffers are not kept.
        p.give(Vec::with_capacity(8));
        assert!(p.free.lock().unwrap().is_empty());
    }
}
