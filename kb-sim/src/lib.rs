//! `kb-sim`, Phase 1: a deterministic discrete-event timing simulation of a
//! hierarchical accelerator (host -> SIP -> cube -> PE) whose memory ops move
//! real bytes; it writes one self-contained trace.
//!
//! Owns: topologies ([`topology`]), the machine graph and routes
//! ([`machine`]), the event core ([`event`]), component timing models
//! ([`component`]), the framework with the op-log hook, protocols and the
//! host program's launches ([`engine`]), the data plane ([`data`]), the
//! host runtime's setup ([`runtime`]), PE programs ([`program`]), the
//! happens-before clocks and race checks ([`race`]), and the
//! public surface users build on: the kernel API ([`kernel`]: `Tl`, tiles),
//! the program API ([`workload`]: `Workload`, `Program`), tensor shapes of
//! 1 to 6 dims and their 2-D view ([`shape`]), collectives
//! written with the kernel API ([`collective`]), `.npy` inputs
//! ([`input`]) and the command line ([`cli::main`]). Does not own: any
//! particular workload (the built-ins are the `kb-workloads` crate), the
//! trace bytes (kb-format) or computing GEMM/math results (kb-replay).
//!
//! Flow: topology -> machine -> workload (tensors, launch/wait/free steps)
//! -> engine (deploy, launches, frees) -> records -> trace.

/// `eprintln!` that never panics: a run's notes on stderr are not worth
/// failing it for when the reader has gone (`2>&1 | head -1`), after its
/// outputs are written.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub mod alloc;
pub mod cli;
pub mod collective;
pub mod component;
pub mod data;
pub mod engine;
pub mod event;
pub mod input;
pub mod kernel;
pub mod machine;
pub mod memory;
pub mod overrides;
pub mod program;
pub mod progress;
pub mod race;
pub mod run;
pub mod runtime;
pub mod shape;
pub mod sweep;
pub mod topology;
pub mod workload;
