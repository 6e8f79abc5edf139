//! Typed errors for everything that can go wrong reading or writing a trace.

use std::io;

/// An error while reading or writing a trace. Reading errors name the byte
/// offset in the stream and what was expected there.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),

    #[error("offset {offset}: bad magic: expected {expected}, found {found:02x?}")]
    BadMagic {
        offset: u64,
        expected: &'static str,
        found: Vec<u8>,
    },

    #[error(
        "offset {offset}: unsupported format version {major}.{minor} (this build reads major version {supported})"
    )]
    UnsupportedVersion {
        offset: u64,
        major: u16,
        minor: u16,
        supported: u16,
    },

    #[error(
        "offset {offset}: checksum mismatch in {what}: stored {stored:#018x}, computed {computed:#018x}"
    )]
    Checksum {
        offset: u64,
        what: String,
        stored: u64,
        computed: u64,
    },

    #[error("offset {offset}: truncated: expected {expected}, but the input ends here")]
    Truncated { offset: u64, expected: String },

    #[error("offset {offset}: length {len} for {what} is larger than {limit}")]
    BadLength {
        offset: u64,
        what: String,
        len: u64,
        limit: u64,
    },

    #[error("offset {offset}: malformed {what}: {detail}")]
    Malformed {
        offset: u64,
        what: String,
        detail: String,
    },

    #[error("offset {offset}: {what} id {id} points nowhere ({detail})")]
    DanglingId {
        offset: u64,
        what: &'static str,
        id: u64,
        detail: String,
    },

    /// A writer-side contract violation (the caller's bug, not bad input).
    #[error("writer: {0}")]
    Usage(String),
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

impl FormatError {
    pub(crate) fn malformed(
        offset: u64,
        what: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FormatError::Malformed {
            offset,
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn truncated(offset: u64, expected: impl Into<String>) -> Self {
        FormatError::Truncated {
            offset,
            expected: expected.into(),
        }
    }

    /// True for errors caused by the input ending early.
    pub fn is_truncation(&self) -> bool {
        matches!(self, FormatError::Truncated { .. })
    }
}
