//! `kb-replay`: Phase 2 of kb. Replays a trace's op log on a
//! byte-addressable data plane with real data, checks memory-op
//! fingerprints, and verifies outputs against references computed
//! independently of the replay.
//!
//! Owns: the data plane ([`plane`]), op execution for memory, GEMM and math
//! ops ([`ops`]), the GEMM backends ([`backend`]), the effect-ordered
//! streaming, parallel replay engine ([`engine`]), the f64 reference
//! evaluator ([`mod@reference`]), output verification ([`verify`]), `.npy` I/O
//! ([`npy`]), the JSON report and human summary ([`report`]), the progress
//! bar ([`progress`]) and the binary's flow ([`app`]).
//!
//! Does not own: the trace bytes or their validation (kb-format), timing or
//! simulation (kb-sim), trace queries (kb-inspect). It relies only on the
//! data contract in docs/ARCHITECTURE.md: effects are applied in `seq`
//! order (a record's read before its write), memory ops copy their read
//! bytes to their write ranges, compute ops read operands in order and
//! write their output, outputs are gathered from tensor shards.
//!
//! Replay streams: effects are applied in windows as records arrive, in
//! (seq, read before write, op_id) order, with independent ops running in
//! parallel on a rayon pool and GEMMs of one shape batched ([`engine`]).
//! Op execution is pure (bytes in, bytes out) and separate from the plane;
//! GEMMs go through a [`backend::GemmBackend`] chosen at run time.
//!
//! ```no_run
//! use kb_replay::{app, backend, engine::{Exec, ReplayOptions}};
//! let pool = app::thread_pool(Some(2))?;
//! let gemm = backend::default_backend();
//! let exec = Exec { backend: gemm.as_ref(), pool: Some(&pool) };
//! let loaded = app::load_mmap("run.kbt".as_ref(), &ReplayOptions::default(), &exec)?;
//! let s = &loaded.stats;
//! println!("{} ops", s.memory + s.gemm + s.math);
//! # Ok::<(), kb_replay::Error>(())
//! ```

/// `eprintln!` that never panics: a message on stderr is not worth a
/// panic when its reader has gone (`2>&1 | head -1`).
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub mod app;
pub mod backend;
pub mod bounds;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod npy;
pub mod ops;
pub mod plane;
pub mod pool;
pub mod progress;
pub mod reference;
pub mod report;
pub mod verify;

pub use error::{Error, Result};
