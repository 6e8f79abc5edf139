//! One simulation run: topology -> machine -> benchmark -> engine -> trace.

use std::io::Write;

use kb_format::{Meta, TopologyMeta, TraceWriter};

use crate::bench::{self, BenchError, BenchParams, Programs};
use crate::engine::{Engine, RunStats, SimError};
use crate::kernel::{self, Executor};
use crate::machine::Machine;
use crate::program::PeProgram;
use crate::runtime::Runtime;
use crate::topology::Topology;

/// Everything that determines a run's trace.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub topology: Topology,
    pub bench: String,
    pub params: Vec<(String, String)>,
    pub seed: u64,
    /// How kernels run; every executor writes the same trace.
    pub executor: Executor,
    /// Snapshot compute inputs into the trace (debug mode).
    pub capture_inputs: bool,
    /// Recorded in the trace metadata.
    pub command_line: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("writing the trace: {0}")]
    Trace(#[from] kb_format::FormatError),
    #[error("starting kernels: {0}")]
    Executor(String),
}

/// Simulate and write the trace to `out`; returns `out` and run totals.
pub fn run<W: Write>(cfg: &RunConfig, out: W) -> Result<(W, RunStats), RunError> {
    let machine = Machine::build(&cfg.topology);
    let bench = bench::find(&cfg.bench)?;
    let params = BenchParams::resolve(bench.as_ref(), &cfg.params)?;
    let mut rng = bench::rng(cfg.seed);
    let mut rt = Runtime::new(&machine);
    let built = bench.build(&params, &mut rng, &mut rt)?;
    let meta = Meta {
        tool: "kb-sim".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        command_line: cfg.command_line.clone(),
        topology: TopologyMeta {
            name: cfg.topology.name.clone(),
            address_model: cfg.topology.address_model.name().into(),
            resolved: cfg.topology.to_yaml(),
        },
        benchmark: cfg.bench.clone(),
        params: params.pairs(),
        seed: cfg.seed,
        tensors: rt.tensors.iter().map(|t| t.meta.clone()).collect(),
    };
    let mut writer = TraceWriter::new(out, &meta)?;
    for t in &rt.tensors {
        if let Some(d) = &t.data {
            writer.tensor_data(t.id, 0, d)?;
        }
    }
    let programs: Vec<Box<dyn PeProgram>> = match built.programs {
        Programs::Scripts(p) => p,
        Programs::Kernel { name, kernel, args } => {
            let args = std::sync::Arc::new(args);
            let n = machine.topo.total_pes();
            let mut programs = Vec::with_capacity(n as usize);
            for (i, pe) in machine.pes().enumerate() {
                let tcm = rt.take_tcm(pe);
                let body = kernel::body(kernel, args.clone(), pe, i as u32, n, tcm);
                programs.push(
                    cfg.executor
                        .spawn(format!("{name}[{i}]"), body)
                        .map_err(RunError::Executor)?,
                );
            }
            programs
        }
    };
    let engine =
        Engine::new(&machine, writer, &rt.tensors, programs).capture_inputs(cfg.capture_inputs);
    let (writer, stats) = engine.run()?;
    let out = writer.finish(&built.verify)?;
    Ok((out, stats))
}
