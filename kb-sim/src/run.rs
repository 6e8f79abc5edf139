//! One simulation run: topology -> machine -> workload (tensors, host
//! program) -> engine -> trace.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use kb_format::{Meta, TopologyMeta, TraceWriter};

use crate::engine::{Engine, RacePolicy, RunStats, SimError};
use crate::kernel::Executor;
use crate::machine::Machine;
use crate::memory::MemoryEstimate;
use crate::topology::Topology;
use crate::workload::{Params, Program, Workload, WorkloadError};

/// Everything that determines a run's trace (with the workload itself).
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The machine to simulate.
    pub topology: Topology,
    /// Workload parameters as given (`-p KEY=VALUE`), resolved against
    /// the workload's declared ones.
    pub params: Vec<(String, String)>,
    /// Seed of the workload's random inputs.
    pub seed: u64,
    /// `.npy` files replacing declared tensors' data, by tensor name.
    pub inputs: BTreeMap<String, PathBuf>,
    /// How kernels run; every executor writes the same trace.
    pub executor: Executor,
    /// Snapshot compute inputs into the trace (debug mode).
    pub capture_inputs: bool,
    /// What to do about data races between PEs.
    pub races: RacePolicy,
    /// Recorded in the trace metadata.
    pub command_line: Vec<String>,
    /// Refuse the run when its estimated host memory
    /// ([`crate::memory::MemoryEstimate`]) passes this.
    pub max_memory: Option<crate::memory::Budget>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The workload could not be built (parameters, inputs, tensors).
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The simulation failed (a kernel error, a deadlock, an address).
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The run would need more host memory than `--max-memory`.
    #[error("this run needs about {estimate} of host memory, more than {limit}: {advice}")]
    Memory {
        /// The estimate and its parts.
        estimate: String,
        /// The limit and where it comes from ([`crate::memory::Budget::describe`]).
        limit: String,
        /// What to do about it.
        advice: &'static str,
    },
    /// The trace could not be written.
    #[error("writing the trace: {0}")]
    Trace(#[from] kb_format::FormatError),
}

/// What a run did, beyond the trace.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Records, events and simulated times.
    pub stats: RunStats,
    /// The launches, as the trace records them (FLOPs included).
    pub launches: Vec<kb_format::Launch>,
    /// Per launch: what it moves, if the workload declared it a
    /// collective ([`crate::workload::Program::payload`]).
    pub payloads: Vec<Option<crate::workload::Payload>>,
}

/// Simulate `workload` and write the trace to `out`; returns `out` and
/// what the run did.
pub fn run<W: Write>(
    cfg: &RunConfig,
    workload: &dyn Workload,
    out: W,
) -> Result<(W, RunReport), RunError> {
    run_with_progress(cfg, workload, out, |_, _| {})
}

/// [`run`], telling `progress` the simulated time and the records so far
/// now and then.
pub fn run_with_progress<W: Write>(
    cfg: &RunConfig,
    workload: &dyn Workload,
    out: W,
    progress: impl FnMut(kb_format::Ps, u64),
) -> Result<(W, RunReport), RunError> {
    let machine = Machine::build(&cfg.topology);
    let params = Params::resolve(workload, &cfg.params)?;
    let mut prog = Program::new(
        workload.name(),
        &machine,
        cfg.seed,
        cfg.executor,
        cfg.inputs.clone(),
    );
    prog.limit_memory(cfg.max_memory.clone());
    workload.build(&params, &mut prog)?;
    let built = prog.finish()?;
    let need = MemoryEstimate::of(&built.rt.tensors, &built.steps, cfg.topology.tcm_bytes());
    if let Some(limit) = &cfg.max_memory
        && need.total() > limit.bytes
    {
        return Err(RunError::Memory {
            estimate: need.describe(),
            limit: limit.describe(),
            advice: limit.advice(),
        });
    }
    let meta = Meta {
        tool: "kb-sim".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        command_line: cfg.command_line.clone(),
        topology: TopologyMeta {
            name: cfg.topology.name.clone(),
            address_model: cfg.topology.address_model.name().into(),
            resolved: cfg.topology.to_yaml(),
        },
        benchmark: workload.name().into(),
        params: params.pairs(),
        seed: cfg.seed,
        tensors: built.rt.tensors.iter().map(|t| t.meta.clone()).collect(),
    };
    let mut writer = TraceWriter::new(out, &meta)?;
    for t in &built.rt.tensors {
        if let Some(d) = &t.data {
            writer.tensor_data(t.id, 0, d)?;
        }
    }
    let payloads = built.payloads;
    let engine = Engine::with_program(&machine, writer, &built.rt.tensors, built.steps)
        .capture_inputs(cfg.capture_inputs)
        .races(cfg.races)
        .progress(progress);
    let (mut writer, stats, launches) = engine.run_with_launches()?;
    // The run goes on after its last record (frees, unmaps, the host
    // hearing of the last launch): the trace says when it ended.
    writer.end_at(stats.end_time);
    let out = writer.finish_with_launches(&launches, &built.verify)?;
    Ok((
        out,
        RunReport {
            stats,
            launches,
            payloads,
        },
    ))
}
