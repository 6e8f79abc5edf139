//! `kb-format`: the trace container shared by kb-sim, kb-replay and kb-inspect.
//!
//! Owns the bytes of a trace and nothing else: the data model ([`types`]),
//! the chunked container ([`chunk`], [`footer`]), the record encoding
//! ([`record_codec`]), the writer ([`TraceWriter`], [`AtomicFile`]) and the
//! readers ([`StreamReader`] over any `io::Read`, [`MmapTrace`] over a file).
//! It knows nothing of simulation or replay semantics.
//!
//! A trace is a 64-byte header, then 64-byte-aligned chunks (meta first;
//! strings, tensor data and records interleaved; verify; footer), then a
//! 64-byte trailer. Every chunk is length-prefixed and checksummed (xxh3-64);
//! the footer holds counts, a digest of the stream and an index of every
//! chunk. docs/trace-format.md gives the exact bytes.

pub mod chunk;
pub mod error;
pub mod footer;
pub mod pa;
pub mod reader;
pub mod record_codec;
pub mod types;
pub mod writer;

pub use error::{FormatError, Result};
pub use footer::{Footer, IndexEntry};
pub use reader::{Event, MmapTrace, RecordChunk, StreamReader, Strings};
pub use types::*;
pub use writer::{AtomicFile, TraceWriter};

/// 64-bit fingerprint of moved bytes (xxh3-64), as stored in memory records.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Streaming fingerprint for bytes gathered piece by piece (strided
/// blocks): gives the same value as [`fingerprint`] over the concatenation.
pub type Fingerprinter = xxhash_rust::xxh3::Xxh3Default;
