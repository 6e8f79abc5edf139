//! Byte layout of the file header, chunk headers and the trailer.
//! docs/trace-format.md is the normative description; keep the two in step.

use crate::error::{FormatError, Result};
use crate::xxh3_64;

/// File magic: PNG-style, so text-mode mangling and truncation are detected.
pub const FILE_MAGIC: [u8; 8] = *b"\x89KBT\r\n\x1a\n";
pub const TRAILER_MAGIC: [u8; 8] = *b"KBTEND\r\n";
pub const CHUNK_MAGIC: [u8; 4] = *b"KBCH";
pub const VERSION_MAJOR: u16 = 3;
/// 3.1 added the `SumBlocks` and `Tile` reference expressions; 3.2 the
/// channels chunk; 3.3 a record's optional active interval.
pub const VERSION_MINOR: u16 = 4;

/// Size of the file header, every chunk header and the trailer.
pub const BLOCK: usize = 64;
/// Alignment of every chunk header and payload.
pub const ALIGN: u64 = 64;

/// Largest payload of a metadata, strings, verify or footer chunk.
pub const MAX_SMALL_PAYLOAD: u64 = 256 << 20;
/// Largest payload of a records chunk.
pub const MAX_RECORDS_PAYLOAD: u64 = 64 << 20;
/// Largest payload of a tensor data chunk.
pub const MAX_TENSOR_PAYLOAD: u64 = 1 << 40;

/// Chunk kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChunkKind {
    Meta,
    Strings,
    Tensor,
    Records,
    Verify,
    Footer,
    /// An op's input as Phase 1 observed it (`kb-sim --capture-inputs`).
    Snapshot,
    /// The run's kernel launches, once, just before the verify chunk.
    Launches,
    /// What each HBM pseudo channel served, at most once, before the
    /// launches.
    Channels,
}

impl ChunkKind {
    pub fn code(self) -> u32 {
        match self {
            ChunkKind::Meta => 1,
            ChunkKind::Strings => 2,
            ChunkKind::Tensor => 3,
            ChunkKind::Records => 4,
            ChunkKind::Verify => 5,
            ChunkKind::Footer => 6,
            ChunkKind::Snapshot => 7,
            ChunkKind::Launches => 8,
            ChunkKind::Channels => 9,
        }
    }

    pub fn from_code(code: u32) -> Option<ChunkKind> {
        Some(match code {
            1 => ChunkKind::Meta,
            2 => ChunkKind::Strings,
            3 => ChunkKind::Tensor,
            4 => ChunkKind::Records,
            5 => ChunkKind::Verify,
            6 => ChunkKind::Footer,
            7 => ChunkKind::Snapshot,
            8 => ChunkKind::Launches,
            9 => ChunkKind::Channels,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ChunkKind::Meta => "meta",
            ChunkKind::Strings => "strings",
            ChunkKind::Tensor => "tensor",
            ChunkKind::Records => "records",
            ChunkKind::Verify => "verify",
            ChunkKind::Footer => "footer",
            ChunkKind::Snapshot => "snapshot",
            ChunkKind::Launches => "launches",
            ChunkKind::Channels => "channels",
        }
    }

    pub fn max_payload(self) -> u64 {
        match self {
            ChunkKind::Tensor => MAX_TENSOR_PAYLOAD,
            ChunkKind::Records | ChunkKind::Snapshot => MAX_RECORDS_PAYLOAD,
            _ => MAX_SMALL_PAYLOAD,
        }
    }
}

/// Round up to the next multiple of `ALIGN`.
pub fn pad_to_align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Check that the padding after a payload (found at stream offset `at`) is
/// all zero. No checksum covers the padding of the footer chunk, so a
/// reader must check it to notice damage there.
pub fn check_padding(pad: &[u8], at: u64) -> Result<()> {
    match pad.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(FormatError::malformed(
            at + i as u64,
            "chunk padding",
            format!("padding byte is {:#04x}, expected 0", pad[i]),
        )),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encode the 64-byte file header.
pub fn encode_file_header() -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b[0..8].copy_from_slice(&FILE_MAGIC);
    b[8..10].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
    b[10..12].copy_from_slice(&VERSION_MINOR.to_le_bytes());
    b[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    let sum = xxh3_64(&b[..56]);
    b[56..64].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Validate the file header; returns (major, minor).
pub fn decode_file_header(b: &[u8; BLOCK]) -> Result<(u16, u16)> {
    if b[0..8] != FILE_MAGIC {
        return Err(FormatError::BadMagic {
            offset: 0,
            expected: "kb trace file magic 89 4b 42 54 0d 0a 1a 0a",
            found: b[0..8].to_vec(),
        });
    }
    let major = u16_at(b, 8);
    let minor = u16_at(b, 10);
    // Version is checked before the checksum, so a newer file reports its
    // version rather than a confusing checksum error.
    if major != VERSION_MAJOR {
        return Err(FormatError::UnsupportedVersion {
            offset: 8,
            major,
            minor,
            supported: VERSION_MAJOR,
        });
    }
    check_sum(b, 0, "file header")?;
    let header_len = u32_at(b, 12);
    if header_len as usize != BLOCK {
        return Err(FormatError::malformed(
            12,
            "file header",
            format!("header length {header_len}, expected {BLOCK}"),
        ));
    }
    Ok((major, minor))
}

fn check_sum(b: &[u8; BLOCK], offset: u64, what: &str) -> Result<()> {
    let stored = u64_at(b, 56);
    let computed = xxh3_64(&b[..56]);
    if stored != computed {
        return Err(FormatError::Checksum {
            offset,
            what: what.to_string(),
            stored,
            computed,
        });
    }
    Ok(())
}

/// A decoded chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub kind: ChunkKind,
    /// Payload length without padding.
    pub len: u64,
    /// Kind-specific fields (see docs/trace-format.md).
    pub aux: [u64; 3],
    pub payload_checksum: u64,
    /// Ordinal of this chunk in the stream, starting at 0.
    pub ordinal: u32,
}

impl ChunkHeader {
    /// Bytes the chunk occupies, header and padded payload.
    pub fn total_len(&self) -> u64 {
        BLOCK as u64 + pad_to_align(self.len)
    }

    pub fn encode(&self) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[0..4].copy_from_slice(&CHUNK_MAGIC);
        b[4..8].copy_from_slice(&self.kind.code().to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.aux[0].to_le_bytes());
        b[24..32].copy_from_slice(&self.aux[1].to_le_bytes());
        b[32..40].copy_from_slice(&self.aux[2].to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_checksum.to_le_bytes());
        b[48..52].copy_from_slice(&self.ordinal.to_le_bytes());
        let sum = xxh3_64(&b[..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decode and validate a chunk header found at `offset`. `remaining`
    /// bounds the payload length when the input size is known.
    pub fn decode(b: &[u8; BLOCK], offset: u64, remaining: Option<u64>) -> Result<ChunkHeader> {
        if b[0..4] != CHUNK_MAGIC {
            return Err(FormatError::BadMagic {
                offset,
                expected: "chunk magic \"KBCH\"",
                found: b[0..4].to_vec(),
            });
        }
        check_sum(b, offset, "chunk header")?;
        let code = u32_at(b, 4);
        let kind = ChunkKind::from_code(code).ok_or_else(|| {
            FormatError::malformed(
                offset + 4,
                "chunk header",
                format!("unknown chunk kind {code}"),
            )
        })?;
        let len = u64_at(b, 8);
        let limit = match remaining {
            Some(r) => r.min(kind.max_payload()),
            None => kind.max_payload(),
        };
        if len > limit {
            return Err(FormatError::BadLength {
                offset: offset + 8,
                what: format!("{} chunk payload", kind.name()),
                len,
                limit,
            });
        }
        if b[52..56] != [0; 4] {
            return Err(FormatError::malformed(
                offset + 52,
                "chunk header",
                "reserved bytes are not zero",
            ));
        }
        Ok(ChunkHeader {
            kind,
            len,
            aux: [u64_at(b, 16), u64_at(b, 24), u64_at(b, 32)],
            payload_checksum: u64_at(b, 40),
            ordinal: u32_at(b, 48),
        })
    }

    /// Check a payload (unpadded, `len` bytes) against the stored checksum.
    pub fn check_payload(&self, payload: &[u8], payload_offset: u64) -> Result<()> {
        let computed = xxh3_64(payload);
        if computed != self.payload_checksum {
            return Err(FormatError::Checksum {
                offset: payload_offset,
                what: format!("{} chunk #{} payload", self.kind.name(), self.ordinal),
                stored: self.payload_checksum,
                computed,
            });
        }
        Ok(())
    }
}

/// The 64-byte trailer that ends every trace: it locates the footer chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub footer_offset: u64,
    pub total_len: u64,
}

impl Trailer {
    pub fn encode(&self) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[0..8].copy_from_slice(&TRAILER_MAGIC);
        b[8..16].copy_from_slice(&self.footer_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.total_len.to_le_bytes());
        let sum = xxh3_64(&b[..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; BLOCK], offset: u64) -> Result<Trailer> {
        if b[0..8] != TRAILER_MAGIC {
            return Err(FormatError::BadMagic {
                offset,
                expected: "trailer magic \"KBTEND\\r\\n\" (the trace may be truncated)",
                found: b[0..8].to_vec(),
            });
        }
        check_sum(b, offset, "trailer")?;
        Ok(Trailer {
            footer_offset: u64_at(b, 8),
            total_len: u64_at(b, 16),
        })
    }
}
