//! The footer chunk: counts, the stream digest and the chunk index.

use crate::chunk::{ChunkKind, u64_at};
use crate::error::{FormatError, Result};
use crate::types::Counts;

/// Fixed part of the footer payload, before the index entries.
pub const FOOTER_FIXED: usize = 64;
/// Size of one index entry.
pub const INDEX_ENTRY: usize = 32;

/// One chunk in the footer index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the chunk header from the start of the stream.
    pub offset: u64,
    pub kind: ChunkKind,
    pub ordinal: u32,
    /// The chunk header's aux0 and aux1 (records: count and first t_start;
    /// tensor: tensor id and byte offset).
    pub aux: [u64; 2],
}

impl IndexEntry {
    /// The 32 bytes of this entry in the footer.
    pub fn encode(&self) -> [u8; INDEX_ENTRY] {
        let mut b = [0u8; INDEX_ENTRY];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.kind.code().to_le_bytes());
        b[12..16].copy_from_slice(&self.ordinal.to_le_bytes());
        b[16..24].copy_from_slice(&self.aux[0].to_le_bytes());
        b[24..32].copy_from_slice(&self.aux[1].to_le_bytes());
        b
    }
}

/// The decoded footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub counts: Counts,
    /// xxh3-64 of every byte of the stream before the footer chunk.
    pub digest: u64,
    pub index: Vec<IndexEntry>,
}

impl Footer {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FOOTER_FIXED + self.index.len() * INDEX_ENTRY);
        for v in [
            self.counts.records,
            self.counts.chunks,
            self.counts.tensor_bytes,
            self.counts.strings,
            self.counts.max_t_end,
            self.digest,
            self.index.len() as u64,
            0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for e in &self.index {
            b.extend_from_slice(&e.encode());
        }
        b
    }

    /// Decode a footer payload that starts at stream offset `at`.
    pub fn decode(p: &[u8], at: u64) -> Result<Footer> {
        if p.len() < FOOTER_FIXED {
            return Err(FormatError::malformed(
                at,
                "footer",
                format!("{} bytes, expected at least {FOOTER_FIXED}", p.len()),
            ));
        }
        let n = u64_at(p, 48);
        let expected = (p.len() - FOOTER_FIXED) / INDEX_ENTRY;
        if n != expected as u64 || !(p.len() - FOOTER_FIXED).is_multiple_of(INDEX_ENTRY) {
            return Err(FormatError::BadLength {
                offset: at + 48,
                what: "footer index entry count".into(),
                len: n,
                limit: expected as u64,
            });
        }
        let mut index = Vec::with_capacity(expected);
        for i in 0..expected {
            let o = FOOTER_FIXED + i * INDEX_ENTRY;
            let code = u32::from_le_bytes(p[o + 8..o + 12].try_into().expect("4 bytes"));
            let kind = ChunkKind::from_code(code).ok_or_else(|| {
                FormatError::malformed(
                    at + o as u64 + 8,
                    "footer index",
                    format!("unknown chunk kind {code}"),
                )
            })?;
            index.push(IndexEntry {
                offset: u64_at(p, o),
                kind,
                ordinal: u32::from_le_bytes(p[o + 12..o + 16].try_into().expect("4 bytes")),
                aux: [u64_at(p, o + 16), u64_at(p, o + 24)],
            });
        }
        Ok(Footer {
            counts: Counts {
                records: u64_at(p, 0),
                chunks: u64_at(p, 8),
                tensor_bytes: u64_at(p, 16),
                strings: u64_at(p, 24),
                max_t_end: u64_at(p, 32),
            },
            digest: u64_at(p, 40),
            index,
        })
    }
}
