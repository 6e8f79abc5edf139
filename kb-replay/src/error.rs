//! The error type of kb-replay. Every error is a clear message, never a
//! panic; the binary maps all of them to exit code 2.

use std::path::{Path, PathBuf};

use kb_format::FormatError;

/// Anything that stops a replay or a verification from completing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The trace could not be read: what kb-format reports (bad magic,
    /// checksum, truncation, ...).
    #[error("{0}")]
    Format(#[from] FormatError),

    /// An op could not be replayed (fingerprint mismatch, bad address, size
    /// disagreement, ...). Names the op, where and when it ran.
    #[error("op {op_id} ({op_name} on {component} at {time}): {detail}")]
    Op {
        op_id: u64,
        component: String,
        op_name: String,
        /// Simulated time, formatted in ns.
        time: String,
        detail: String,
    },

    /// The trace's metadata or verification spec cannot be used.
    #[error("{0}")]
    Trace(String),

    /// A file other than the trace: a reference `.npy`, the report, a dump.
    #[error("{}: {detail}", path.display())]
    File { path: PathBuf, detail: String },

    /// Bad usage that the argument parser cannot catch.
    #[error("{0}")]
    Usage(String),

    /// `--check-intermediates`: an op's replayed input differs from the
    /// snapshot Phase 1 captured (a mismatch: exit 1, not 2).
    #[error("op {op_id} ({op_name} on {component} at {time}): {detail}")]
    Intermediate {
        op_id: u64,
        component: String,
        op_name: String,
        time: String,
        detail: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn file(path: &Path, detail: impl std::fmt::Display) -> Error {
        Error::File {
            path: path.to_path_buf(),
            detail: detail.to_string(),
        }
    }

    /// The message the binary prints: `<source>: <error>` for errors about
    /// the trace (`source` names it: a path or `<stdin>`), `<file>: <error>`
    /// for errors about another file, and the bare message for usage errors.
    pub fn message(&self, source: &str) -> String {
        match self {
            Error::File { .. } | Error::Usage(_) => self.to_string(),
            _ => format!("{source}: {self}"),
        }
    }

    /// True when the error is the trace ending early.
    pub fn is_truncation(&self) -> bool {
        matches!(self, Error::Format(e) if e.is_truncation())
    }
}

/// Simulated picoseconds as nanoseconds with three decimals.
pub fn fmt_ns(ps: u64) -> String {
    format!("{}.{:03} ns", ps / 1000, ps % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_formatting_keeps_picoseconds() {
        assert_eq!(fmt_ns(0), "0.000 ns");
        assert_eq!(fmt_ns(12_345), "12.345 ns");
        assert_eq!(fmt_ns(7), "0.007 ns");
    }

    #[test]
    fn messages_name_the_source_or_the_file() {
        let e = Error::Trace("no such tensor".into());
        assert_eq!(e.message("t.kbt"), "t.kbt: no such tensor");
        let e = Error::file(Path::new("x.npy"), "bad shape");
        assert_eq!(e.message("t.kbt"), "x.npy: bad shape");
    }
}
