//! `kb-replay`: Phase 2 of kb. Replays a trace's op log on a
//! byte-addressable data plane with real data, checks memory-op
//! fingerprints, and verifies outputs against references computed
//! independently of the replay.
//!
//! Owns: the data plane ([`plane`]), op execution for memory, GEMM and math
//! ops ([`ops`], with GEMM behind the swappable [`ops::GemmBackend`]), the
//! effect-ordered replay engine ([`engine`]), the f64 reference evaluator
//! ([`reference`]), output verification ([`verify`]), `.npy` I/O ([`npy`]),
//! the JSON report and human summary ([`report`]) and the binary's flow
//! ([`app`]).
//!
//! Does not own: the trace bytes or their validation (kb-format), timing or
//! simulation (kb-sim), trace queries (kb-inspect). It relies only on the
//! data contract in docs/ARCHITECTURE.md: effects are applied in `seq`
//! order (a record's read before its write), memory ops copy their read
//! bytes to their write ranges, compute ops read operands in order and
//! write their output, outputs are gathered from tensor shards.
//!
//! Replay is sequential for now: records are collected, effects sorted by
//! (seq, read before write, op_id) and applied one by one. Op execution is
//! pure (bytes in, bytes out) and separate from the plane, so a parallel or
//! batched engine can replace [`engine`] without touching [`ops`].
//!
//! ```no_run
//! use kb_replay::{app, engine::ReplayOptions, ops::NaiveGemm};
//! let mut loaded = app::load_mmap("run.kbt".as_ref(), &ReplayOptions::default())?;
//! let stats = loaded.replayer.run(&loaded.strings, &NaiveGemm)?;
//! println!("{} ops", stats.memory + stats.gemm + stats.math);
//! # Ok::<(), kb_replay::Error>(())
//! ```

pub mod app;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod npy;
pub mod ops;
pub mod plane;
pub mod reference;
pub mod report;
pub mod verify;

pub use error::{Error, Result};
