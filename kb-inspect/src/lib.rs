//! `kb-inspect`: read-only queries over kb traces.
//!
//! Owns: summaries ([`summary`]), op queries ([`ops`]), per-group statistics
//! ([`stats`]), launches' critical paths ([`critical`]), Chrome/Perfetto timelines ([`timeline`]), tensor listing and
//! `.npy` export ([`tensor`]) and trace diffs ([`diff`]). Every command reads
//! a trace through one abstraction, [`source`]: a memory-mapped file
//! (`kb_format::MmapTrace`) or a single pass over standard input
//! (`kb_format::StreamReader`), so each command is written once for both.
//!
//! Does not own: the trace bytes or their validation (`kb-format`), producing
//! traces (`kb-sim`) or computing op results (`kb-replay`). Output tensors
//! that only replay computes cannot be exported from a trace alone.
//!
//! Conventions: record times are integer picoseconds; user-facing windows
//! (`--from/--to`) are nanoseconds; timelines use microseconds. Exit codes:
//! [`EXIT_OK`], [`EXIT_DIFFERENT`], [`EXIT_ERROR`].

pub mod columns;
pub mod critical;
pub mod diff;
pub mod export;
pub mod merge;
pub mod ops;
pub mod perfetto;
pub mod plot;
pub mod progress;
pub mod render;
pub mod source;
pub mod stats;
pub mod summary;
pub mod tensor;
pub mod timeline;

#[cfg(test)]
pub(crate) mod testutil;

use std::io;
use std::path::Path;

pub use source::{Flow, Input, Visitor};

/// Success.
pub const EXIT_OK: i32 = 0;
/// `diff` found differences.
pub const EXIT_DIFFERENT: i32 = 1;
/// Any error: bad flags, unreadable or corrupt trace, bad output path.
pub const EXIT_ERROR: i32 = 2;

/// An error of a kb-inspect command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The trace could not be read: the message is kb-format's.
    #[error("{input}: {source}")]
    Trace {
        input: String,
        #[source]
        source: kb_format::FormatError,
    },
    /// Writing an output failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The request cannot be satisfied (unknown tensor, bad flag value...).
    #[error("{0}")]
    Usage(String),
}

impl Error {
    pub fn usage(msg: impl Into<String>) -> Error {
        Error::Usage(msg.into())
    }

    pub fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// True when the error is a closed pipe on an output (`| head`).
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Map an output write error.
pub(crate) fn out_err(e: io::Error) -> Error {
    Error::io("writing output", e)
}

/// Whether `path` (`-`: standard output) is a terminal, whatever its
/// name (see [`kb_format::is_terminal_path`]).
pub(crate) fn is_terminal_path(path: &Path) -> bool {
    use std::io::IsTerminal;
    if path == Path::new("-") {
        return io::stdout().is_terminal();
    }
    kb_format::is_terminal_path(path)
}

/// Write an output file atomically through kb-format's `AtomicFile`: into
/// a temporary file beside it, renamed into place only when `write`
/// succeeded, removed otherwise (`/dev/null` or a FIFO is written in
/// place). `-` writes to standard output.
pub(crate) fn write_output<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn io::Write) -> Result<T>,
) -> Result<T> {
    let what = format!("writing {}", path.display());
    if path == Path::new("-") {
        let mut so = io::BufWriter::new(io::stdout().lock());
        let v = write(&mut so)?;
        io::Write::flush(&mut so).map_err(|e| Error::io(&what, e))?;
        return Ok(v);
    }
    let mut f = kb_format::AtomicFile::create(path)
        .map_err(|e| Error::io(&what, e))?
        .remove_on_signal();
    let v = write(&mut f)?;
    f.commit().map_err(|e| Error::io(&what, e))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_written_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.json");
        write_output(&p, |w| w.write_all(b"ok").map_err(out_err)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"ok");
        // A failing writer leaves the old file and no temporary behind.
        let e = write_output(&p, |w| {
            w.write_all(b"partial").map_err(out_err)?;
            Err::<(), _>(Error::usage("boom"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "boom");
        assert_eq!(std::fs::read(&p).unwrap(), b"ok");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// Every command returns kb-format's error (never panics) on every
    /// damaged variant of a trace.
    #[test]
    fn damaged_traces_are_errors_for_every_command() {
        let good = testutil::sample_trace();
        let (_g, good_path) = testutil::write_temp(&good);
        let good_input = Input::Path(good_path);
        for (what, bytes) in testutil::damaged(&good) {
            let (d, p) = testutil::write_temp(&bytes);
            let input = Input::Path(p);
            let out = d.path().join("out");
            let mut sink = Vec::new();
            let results: Vec<(&str, Result<()>)> = vec![
                ("summary", summary::summarize(&input).map(drop)),
                (
                    "ops",
                    ops::run(
                        &input,
                        &Default::default(),
                        None,
                        ops::Format::Json,
                        &mut sink,
                    )
                    .map(drop),
                ),
                (
                    "stats",
                    stats::compute(&input, stats::GroupBy::Component).map(drop),
                ),
                (
                    "timeline",
                    timeline::run(&input, &Default::default(), timeline::Format::Json, &out)
                        .map(drop),
                ),
                (
                    "timeline perfetto",
                    timeline::run(
                        &input,
                        &Default::default(),
                        timeline::Format::Perfetto,
                        &out,
                    )
                    .map(drop),
                ),
                (
                    "export",
                    export::run(&input, &Default::default(), export::Format::Parquet, &out)
                        .map(drop),
                ),
                ("critical-path", critical::compute(&input, None).map(drop)),
                ("tensors", tensor::list(&input, true, &mut sink)),
                (
                    "tensor",
                    tensor::export(&input, "a", &out, tensor::Bf16As::F32).map(drop),
                ),
                ("diff a", diff::compare(&input, &good_input).map(drop)),
                ("diff b", diff::compare(&good_input, &input).map(drop)),
            ];
            for (cmd, r) in results {
                match r {
                    Err(Error::Trace {
                        input: name,
                        source,
                    }) => {
                        assert!(name.ends_with("t.kbt"), "{what}: {cmd}: {name}");
                        assert!(!source.to_string().is_empty());
                    }
                    other => panic!("{what}: {cmd}: expected a trace error, got {other:?}"),
                }
            }
        }
    }
}
