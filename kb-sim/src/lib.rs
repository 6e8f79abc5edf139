//! `kb-sim`, Phase 1: a deterministic discrete-event timing simulation of a
//! hierarchical accelerator (host -> SIP -> cube -> PE) whose memory ops move
//! real bytes; it writes one self-contained trace.
//!
//! Owns: topologies ([`topology`]), the machine graph and routes
//! ([`machine`]), the event core ([`event`]), component timing models
//! ([`component`]), the framework with the op-log hook and protocols
//! ([`engine`]), the data plane ([`data`]), the host runtime's setup
//! ([`runtime`]), PE programs ([`program`]) and built-in benchmarks
//! ([`mod@bench`]). Does not own: the trace bytes (kb-format) or computing
//! GEMM/math results (kb-replay).
//!
//! Flow: topology -> machine -> benchmark (tensors, programs) -> engine
//! (deploy, launch, run) -> records -> trace.

pub mod alloc;
pub mod bench;
pub mod component;
pub mod data;
pub mod engine;
pub mod event;
pub mod kernel;
pub mod machine;
pub mod program;
pub mod run;
pub mod runtime;
pub mod topology;
