//! `kb-format`: the trace container shared by kb-sim, kb-replay and kb-inspect.
//!
//! Owns the bytes of a trace and nothing else: the data model ([`types`]),
//! the chunked container ([`chunk`], [`footer`]), the record encoding
//! ([`record_codec`]), the writer ([`TraceWriter`], [`AtomicFile`]) and the
//! readers ([`StreamReader`] over any `io::Read`, [`MmapTrace`] over a file),
//! and the one definition of utilisation over records ([`usage`]).
//! It knows nothing of simulation or replay semantics.
//!
//! A trace is a 64-byte header, then 64-byte-aligned chunks (meta first;
//! strings, tensor data and records interleaved; channels; launches;
//! verify; footer), then a
//! 64-byte trailer. Every chunk is length-prefixed and checksummed (xxh3-64);
//! the footer holds counts, a digest of the stream and an index of every
//! chunk. docs/trace-format.md gives the exact bytes.

pub mod atomic;
pub mod channels;
pub mod chunk;
mod cursor;
pub mod error;
mod expr;
pub mod footer;
pub mod launch;
pub mod pa;
pub mod philox;
pub mod reader;
pub mod record_codec;
#[cfg(unix)]
pub mod signals;
pub mod types;
pub mod usage;
pub mod writer;

pub use atomic::{AtomicOp, AtomicParams, AtomicValues};
pub use channels::{BusyHead, BusyLog, ChannelLog, ChannelUsage, ClosedPairs};
pub use error::{FormatError, Result};
pub use expr::TensorShape;
pub use footer::{Footer, IndexEntry};
pub use launch::Launch;
pub use reader::{DigestCheck, Event, MmapTrace, PayloadCheck, RecordChunk, StreamReader, Strings};
pub use types::*;
pub use writer::{AtomicFile, TraceWriter, is_terminal_path};

/// xxh3-64 (seed 0): chunk checksums, the stream digest and fingerprints.
/// twox-hash picks its AVX2 or SSE2 kernel at run time (1.6-1.9x the
/// compile-time SSE2 of xxhash-rust here; BENCHMARKS.md).
pub(crate) fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// 64-bit fingerprint of moved bytes (xxh3-64), as stored in memory records.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// Streaming fingerprint for bytes gathered piece by piece (strided
/// blocks): gives the same value as [`fingerprint`] over the concatenation.
#[derive(Clone)]
pub struct Fingerprinter(twox_hash::XxHash3_64);

impl Fingerprinter {
    pub fn new() -> Fingerprinter {
        Fingerprinter(twox_hash::XxHash3_64::new())
    }

    /// Add the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        std::hash::Hasher::write(&mut self.0, bytes);
    }

    /// The fingerprint of every byte added so far.
    pub fn digest(&self) -> u64 {
        std::hash::Hasher::finish(&self.0)
    }
}

impl Default for Fingerprinter {
    fn default() -> Fingerprinter {
        Fingerprinter::new()
    }
}

impl std::fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fingerprinter").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Traces written before the switch to twox-hash must still check, so
    /// the values are xxh3-64's: compared with an independent
    /// implementation (xxhash-rust), one-shot and in pieces of any size,
    /// on both sides of the 240-byte and 1 KiB stripe boundaries.
    #[test]
    fn fingerprints_are_xxh3_64() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
        for len in [
            0, 1, 16, 17, 128, 129, 240, 241, 1024, 1025, 65_536, 300_000,
        ] {
            let bytes = &data[..len];
            let want = xxhash_rust::xxh3::xxh3_64(bytes);
            assert_eq!(fingerprint(bytes), want, "len {len}");
            for piece in [1, 7, 64, 1000, 4096] {
                let mut h = Fingerprinter::new();
                bytes.chunks(piece).for_each(|c| h.update(c));
                assert_eq!(h.digest(), want, "len {len} in pieces of {piece}");
            }
        }
    }
}
