//! The `kb-sim` command line, as a library: [`main`] gives any set of
//! workloads every command and flag of `kb-sim` (`run`, `list`,
//! `topology`, `probe`). The `kb-sim` binary is `main` over the built-in
//! workloads; a user crate calls it with its own added.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use kb_format::AtomicFile;

use crate::engine::RacePolicy;
use crate::kernel::Executor;
use crate::machine::Machine;
use crate::run::{RunConfig, run_with_progress};
use crate::topology::{AddressModel, EMBEDDED, Topology};
use crate::workload::{Reference, Workload};

const EXIT_CODES: &str = "Exit codes: 0 success; 1 sweep: a point failed kb-replay --verify (and none had an error); 2 error (bad flags, topology, benchmark parameters, a failed simulation; sweep: a point that failed to run or to verify).";

/// Phase 1 of kb: simulate a kernel on the modelled accelerator and write a trace.
///
/// With no command, runs the default benchmark on the default topology and
/// writes the trace to stdout (refusing a terminal): `kb-sim | kb-replay --verify`.
#[derive(Debug, Parser)]
#[command(name = "kb-sim", version, args_conflicts_with_subcommands = true, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Simulate a workload and write its trace (the default command).
    Run(RunArgs),
    /// List the workloads with their parameters, defaults and references.
    List,
    /// Print and validate a topology: counts, nodes, links, a sample route.
    Topology {
        /// An embedded topology name (small, default, large) or a YAML file.
        topology: String,
        /// Override a field by its dotted path (as for `run`); repeatable.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::overrides::parse_set)]
        sets: Vec<(String, String)>,
        /// List every field path and value (what `--set` takes), nothing else.
        #[arg(long)]
        fields: bool,
    },
    /// Run the product of topology overrides and workload parameters, each
    /// point a `kb-sim run` (on all cores), and write one results table.
    #[command(after_help = SWEEP_HELP)]
    Sweep(SweepArgs),
    /// Time one uncontended transfer between two nodes.
    Probe {
        #[arg(short, long, default_value = "default")]
        topology: String,
        /// Source node id, e.g. sip0.cube0.pe0.pe_dma.
        #[arg(long)]
        from: String,
        /// Destination node id, e.g. sip0.cube0.hbm_ctrl.
        #[arg(long)]
        to: String,
        /// Message size in bytes.
        #[arg(long, default_value_t = 4096)]
        bytes: u64,
    },
}

const SWEEP_HELP: &str = "\
Example: kb-sim sweep -b gemm --set hbm.channel_bw_gbs=16,32,64 -p m=256,512 -o sweep
runs 6 points and writes sweep.csv and sweep.parquet, one row per point: point, each swept
value (a column named by its key), status, sim_ns (simulated time), kernel_start_ns and
kernel_ns (first launch start to last launch end), records, bytes and kernel_bytes (moved in
the kernel window), achieved_gbs (kernel_bytes / kernel_ns), flops (executed) and
useful_flops (padding of edge tiles left out), achieved_gflops (useful) and executed_gflops
(per kernel ns), per unit kind K (pe_dma, pe_gemm, pe_math, hbm_channel...) K_units, K_busy_ns
(union of each unit's active intervals, when it computes or transfers, in the kernel window,
summed), K_util (busy / (units x kernel_ns)), K_held_ns (union of its op spans, waiting
included) and K_held_util (held / (units x kernel_ns)), verdict (with --verify: PASS, FAIL or ERROR from kb-replay),
trace (with --traces), wall_s, and the sweep's provenance: sweep_id (a hash of its spec: the
workload, seed, base topology, axes and inputs) and sweep_points (the Parquet file's metadata
holds the spec too). A point that fails keeps its row (status error: ... or fail: ..., metrics
empty on an error) and the table is written; the sweep then exits 2 when a point had an error
(its run, or kb-replay ERROR), else 1 when a point failed verification (kb-replay FAIL), as
kb-replay --verify does.

More than 100,000 points are refused without --force (exit 2). SIGINT, SIGTERM and SIGHUP
stop the points running (their partial and temporary traces removed), write no table and exit
128 + the signal. The CSV and Parquet tables are written as a set: both or neither.

Clusters: --emit-jobs DIR writes DIR/jobs.txt (the sweep's command, once), DIR/sweep.sbatch (a
Slurm job array: task T runs --points-per-task points, each `--point I -o
DIR/results/point-NNNN`), DIR/submit.sh (one sbatch per array of at most --max-array-size
tasks), DIR/results/ and DIR/logs/, with absolute, quoted paths, and runs nothing; --time,
--mem and --sbatch add #SBATCH lines. Then kb-inspect merge DIR/results/point-*.parquet -o
sweep.parquet joins the rows (refusing missing points and other sweeps' tables).";

#[derive(Debug, Args)]
struct SweepArgs {
    /// Base topology: an embedded name or a YAML file.
    #[arg(short, long, default_value = "default")]
    topology: String,
    /// Workload to run (see `kb-sim list`; default: the first listed).
    #[arg(short, long)]
    bench: Option<String>,
    /// A topology field to sweep: KEY=V1,V2,... by its dotted path
    /// (`kb-sim topology NAME --fields` lists them); repeatable.
    #[arg(long = "set", value_name = "KEY=V1,V2")]
    sets: Vec<String>,
    /// A workload parameter to sweep: KEY=V1,V2,...; repeatable.
    #[arg(short, long = "param", value_name = "KEY=V1,V2")]
    params: Vec<String>,
    /// Input tensor data from numpy, for every point: NAME=FILE.npy.
    #[arg(long = "input", value_parser = parse_kv)]
    inputs: Vec<(String, String)>,
    /// Seed for the workload's random inputs (every point).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Data races: warn, error or off (every point).
    #[arg(long, default_value = "warn", value_parser = parse_races_name)]
    races: String,
    /// Points run at once (default: the number of cores; at most 4 per core,
    /// larger counts are capped with a note).
    #[arg(short, long)]
    jobs: Option<usize>,
    /// Run (or emit) a sweep of more than 100,000 points (refused without it).
    #[arg(long)]
    force: bool,
    /// Keep each point's trace in DIR (point-NNNN.kbt).
    #[arg(long, value_name = "DIR")]
    traces: Option<PathBuf>,
    /// Replay each point's trace with `kb-replay --verify` and record the verdict.
    #[arg(long)]
    verify: bool,
    /// The kb-replay executable for --verify (default: beside kb-sim, else PATH).
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// The results table: PREFIX.csv and PREFIX.parquet are written.
    #[arg(short, long, default_value = "sweep", value_name = "PREFIX")]
    output: PathBuf,
    /// Run only point I of the product (what each job of --emit-jobs runs).
    #[arg(long, value_name = "I")]
    point: Option<usize>,
    /// Write the points as a job list and a Slurm job-array script in DIR; run nothing.
    #[arg(long, value_name = "DIR")]
    emit_jobs: Option<PathBuf>,
    /// --emit-jobs: points each array task runs, one after another.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "emit_jobs")]
    points_per_task: usize,
    /// --emit-jobs: the most tasks in one job array (Slurm's MaxArraySize is 1001 by
    /// default); more tasks are submitted as several arrays by DIR/submit.sh.
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "emit_jobs")]
    max_array_size: usize,
    /// --emit-jobs: each task's time limit (#SBATCH --time=TIME, e.g. 00:30:00).
    #[arg(long, value_name = "TIME", requires = "emit_jobs")]
    time: Option<String>,
    /// --emit-jobs: each task's memory (#SBATCH --mem=MEM, e.g. 4G).
    #[arg(long, value_name = "MEM", requires = "emit_jobs")]
    mem: Option<String>,
    /// --emit-jobs: another #SBATCH line, as given (--sbatch=--partition=batch); repeatable.
    #[arg(
        long,
        value_name = "OPTION",
        allow_hyphen_values = true,
        requires = "emit_jobs"
    )]
    sbatch: Vec<String>,
}

fn parse_races_name(s: &str) -> Result<String, String> {
    parse_races(s).map(|_| s.to_string())
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Topology: an embedded name (small, default, large) or a YAML file.
    #[arg(short, long, default_value = "default")]
    topology: String,
    /// Override a topology field: KEY=VALUE by its dotted path
    /// (`--set pe_gemm.tflops.f16=128`, `--set counts.pes_per_cube=16`;
    /// `kb-sim topology NAME --fields` lists them); validated like a
    /// topology file; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::overrides::parse_set)]
    sets: Vec<(String, String)>,
    /// Workload to run (see `kb-sim list`; default: the first listed).
    #[arg(short, long)]
    bench: Option<String>,
    /// Workload parameter, KEY=VALUE (integers, floats like 1e-5, dtypes);
    /// repeatable.
    #[arg(short, long = "param", value_parser = parse_kv)]
    params: Vec<(String, String)>,
    /// Input tensor data from numpy: NAME=FILE.npy (dtype and shape must
    /// match the workload's tensor); repeatable.
    #[arg(long = "input", value_parser = parse_kv)]
    inputs: Vec<(String, String)>,
    /// Seed for the workload's random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How kernels run: `coroutine` (stackful coroutines on the simulation
    /// thread, the fastest) or `thread` (one OS thread per kernel). Both
    /// write identical traces.
    #[arg(long, default_value = "coroutine", value_parser = parse_executor)]
    executor: Executor,
    /// Debug mode: record a snapshot of every compute op's inputs that
    /// Phase 1 knows, for `kb-replay --check-intermediates`.
    #[arg(long)]
    capture_inputs: bool,
    /// Data races (two PEs' accesses to the same bytes, one a write, with
    /// no barrier, signal, copy notification or launch wait ordering
    /// them): `warn` reports each on stderr and counts them in the
    /// summary, `error` fails the run at the first (exit 2, naming both
    /// ops, no trace written), `off` does not look (a little faster).
    #[arg(long, default_value = "warn", value_parser = parse_races)]
    races: RacePolicy,
    /// Refuse the run (exit 2, with the estimate) when the host memory it
    /// needs, estimated at setup (tensors' host data, their data-plane
    /// pages with replicas shared, the TCM of the PEs launches use),
    /// passes SIZE (512M, 4G, 1.5GiB...). Default: the smallest of the
    /// memory available now, the address-space and data limits (ulimit -v,
    /// ulimit -d) less what kb-sim maps, and the cgroup's memory limit
    /// less its usage.
    #[arg(long, value_name = "SIZE", value_parser = crate::memory::parse_size)]
    max_memory: Option<u64>,
    /// Write the trace here ("-" for stdout). Default: stdout, unless it is a terminal.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Do not print the run summary on stderr.
    #[arg(short, long)]
    quiet: bool,
}

fn parse_executor(s: &str) -> Result<Executor, String> {
    Executor::parse(s).ok_or_else(|| format!("unknown executor {s:?} (coroutine, thread)"))
}

fn parse_races(s: &str) -> Result<RacePolicy, String> {
    RacePolicy::parse(s).ok_or_else(|| format!("unknown race policy {s:?} (warn, error, off)"))
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// Run the `kb-sim` command line over `workloads` (`-b` picks one by
/// name; the first is the default) and return the process exit code:
/// 0 on success, 2 on any error, with the message on stderr.
pub fn main(workloads: Vec<Box<dyn Workload>>) -> ExitCode {
    // An allocation that fails anyway exits 2, its partial trace removed.
    #[cfg(unix)]
    kb_format::signals::exit_2_on_abort();
    // Kernel panics are reported as errors naming the kernel, PE and time;
    // any other panic is a bug in kb-sim and keeps the default report.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !crate::kernel::exec::in_kernel() {
            default_hook(info);
        }
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        None => cmd_run(cli.run, &workloads),
        Some(Cmd::Run(a)) => cmd_run(a, &workloads),
        Some(Cmd::List) => cmd_list(&workloads),
        Some(Cmd::Topology {
            topology,
            sets,
            fields,
        }) => cmd_topology(&topology, &sets, fields),
        Some(Cmd::Sweep(a)) => return exit(cmd_sweep(a, &workloads)),
        Some(Cmd::Probe {
            topology,
            from,
            to,
            bytes,
        }) => cmd_probe(&topology, &from, &to, bytes),
    };
    exit(result.map(|()| 0))
}

/// The exit code of a command's result: its own, or 2 with the error on
/// stderr.
fn exit(result: Result<u8, String>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("kb-sim: {e}");
            ExitCode::from(2)
        }
    }
}

/// The command line a trace records: what determines the run, in one
/// canonical order (the program's file name, topology, workload, seed,
/// parameters and inputs as given, `--capture-inputs`), and nothing of
/// where the trace went or how kernels ran (`-o`, `-q`, `--executor`,
/// which do not change its bytes). So `kb-sim > a.kbt` and
/// `kb-sim -o b.kbt` write the same file, and the line re-runs the trace.
fn recorded_command_line(a: &RunArgs, workload: &str) -> Vec<String> {
    let program = std::env::args_os()
        .next()
        .and_then(|p| {
            PathBuf::from(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "kb-sim".into());
    let mut line = vec![program, "-t".into(), a.topology.clone()];
    for (k, v) in &a.sets {
        line.extend(["--set".into(), format!("{k}={v}")]);
    }
    line.extend([
        "-b".into(),
        workload.into(),
        "--seed".into(),
        a.seed.to_string(),
    ]);
    for (k, v) in &a.params {
        line.extend(["-p".into(), format!("{k}={v}")]);
    }
    for (k, v) in &a.inputs {
        line.extend(["--input".into(), format!("{k}={v}")]);
    }
    if a.capture_inputs {
        line.push("--capture-inputs".into());
    }
    line
}

fn cmd_run(a: RunArgs, workloads: &[Box<dyn Workload>]) -> Result<(), String> {
    let workload = match &a.bench {
        None => workloads.first(),
        Some(name) => workloads.iter().find(|w| w.name() == name),
    }
    .ok_or_else(|| {
        let names: Vec<&str> = workloads.iter().map(|w| w.name()).collect();
        format!(
            "unknown workload {:?} (known: {})",
            a.bench.as_deref().unwrap_or(""),
            names.join(", ")
        )
    })?
    .as_ref();
    let topology = crate::overrides::apply(
        &Topology::load(&a.topology).map_err(|e| e.to_string())?,
        &a.sets,
    )?;
    let mut inputs = BTreeMap::new();
    for (name, file) in &a.inputs {
        if inputs.insert(name.clone(), PathBuf::from(file)).is_some() {
            return Err(format!("--input {name} is given twice"));
        }
    }
    let cfg = RunConfig {
        topology,
        params: a.params.clone(),
        inputs,
        seed: a.seed,
        executor: a.executor,
        capture_inputs: a.capture_inputs,
        races: a.races,
        command_line: recorded_command_line(&a, workload.name()),
        // The refusal names the limit: --max-memory, or the tightest the
        // process runs under.
        max_memory: a
            .max_memory
            .map(crate::memory::Budget::given)
            .or_else(crate::memory::budget),
    };
    let wall = Instant::now();
    let progress = crate::progress::Progress::on_stderr(a.quiet);
    let tell = |t, n| progress.update(t, n);
    let to_stdout = match &a.output {
        None => true,
        Some(p) => p.as_os_str() == "-",
    };
    let report = if to_stdout {
        let stdout = std::io::stdout();
        if stdout.is_terminal() {
            return Err("refusing to write a binary trace to a terminal: pipe it (kb-sim | kb-replay --verify) or use -o FILE".into());
        }
        let out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
        // A reader that has gone (`kb-sim | head -c 5`) took what it
        // wanted: the run stops there, quietly, with exit 0 (as the text
        // commands do).
        let (mut out, report) = match run_with_progress(&cfg, workload, out, tell) {
            Err(e) if broken_pipe(&e) => return Ok(()),
            r => r.map_err(|e| e.to_string())?,
        };
        match out.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r.map_err(|e| format!("writing the trace to stdout: {e}"))?,
        }
        report
    } else {
        let path = a.output.as_ref().expect("checked");
        if kb_format::is_terminal_path(path) {
            return Err(format!(
                "refusing to write a binary trace to a terminal ({}): give a file, or pipe it (kb-sim | kb-replay --verify)",
                path.display()
            ));
        }
        // SIGINT/SIGTERM/SIGHUP remove the partial trace (until committed).
        let file = AtomicFile::create(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .remove_on_signal();
        run_with_progress(&cfg, workload, file, tell)
            .map_err(|e| e.to_string())
            .and_then(|(file, report)| {
                file.commit()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(report)
            })?
    };
    progress.clear();
    let stats = &report.stats;
    for r in &stats.race_reports {
        say!("kb-sim: warning: {r}");
    }
    if stats.races > stats.race_reports.len() as u64 {
        say!(
            "kb-sim: warning: {} data races in all (the first {} are shown)",
            stats.races,
            stats.race_reports.len()
        );
    }
    if !a.quiet {
        say!(
            "kb-sim: {} on {}: {} records, {} events, {} launch{}, simulated {:.3} ns (kernels from {:.3} ns), wall {:.3} s",
            workload.name(),
            cfg.topology.name,
            stats.records,
            stats.events,
            report.launches.len(),
            if report.launches.len() == 1 { "" } else { "es" },
            stats.end_time as f64 / 1e3,
            stats.kernel_start as f64 / 1e3,
            wall.elapsed().as_secs_f64()
        );
        match (a.races, stats.races) {
            (RacePolicy::Off, _) => {}
            (_, 0) => say!("kb-sim: races: none (every shared access is ordered)"),
            (_, n) => say!(
                "kb-sim: races: {n} data race{} (see the warnings above; --races error makes them fail the run)",
                if n == 1 { "" } else { "s" }
            ),
        }
        let (flops, useful) = report.launches.iter().fold((0u64, 0u64), |(f, u), l| {
            (f.saturating_add(l.flops), u.saturating_add(l.useful_flops))
        });
        if flops > 0 {
            say!(
                "kb-sim: compute: {flops} FLOPs executed, {useful} useful ({:.1} %{})",
                useful as f64 * 100.0 / flops as f64,
                if useful < flops {
                    "; the rest computes the padding of edge tiles"
                } else {
                    ""
                }
            );
        }
        if let Some(w) = kb_format::usage::kernel_window(&report.launches) {
            // The one utilisation definition (kb_format::usage): time
            // computing over (units x kernel window).
            let pes = u64::from(cfg.topology.total_pes());
            let pct = |busy| kb_format::usage::utilisation(busy, pes, w).unwrap_or(0.0) * 100.0;
            say!(
                "kb-sim: over the kernels' {:.3} ns, {pes} PEs: pe_gemm computing {:.1} %, pe_math {:.1} %; {} accumulator writebacks; {} DMAs held behind an earlier one on the same bytes",
                (w.1 - w.0) as f64 / 1e3,
                pct(stats.gemm_busy),
                pct(stats.math_busy),
                stats.acc_writebacks,
                stats.dma_hazards,
            );
        }
        for line in fabric_lines(&report) {
            say!("{line}");
        }
        let m = stats.mmu;
        if m.maps > 0 {
            let what = match cfg.topology.address_model {
                AddressModel::La => "BAAW segment installs",
                _ => "pe_mmu map messages",
            };
            say!(
                "kb-sim: address model {}: {} {what} (latency {:.3}..{:.3} ns), {} removed at free, {} page faults (PA fallback)",
                cfg.topology.address_model.name(),
                m.maps,
                m.min_map_latency_ps as f64 / 1e3,
                m.max_map_latency_ps as f64 / 1e3,
                m.unmaps,
                m.page_faults
            );
        }
    }
    Ok(())
}

/// Whether `e` or an error it wraps is a write to a closed pipe.
fn broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// The summary's fabric lines: for each collective launch and for the
/// longest launch, its time against the least time its traffic needs on
/// the busiest link or HBM (`engine::FabricLoad`), and a collective's bus
/// bandwidth.
fn fabric_lines(report: &crate::run::RunReport) -> Vec<String> {
    let launches = &report.launches;
    let longest = (0..launches.len()).max_by_key(|&i| {
        (
            launches[i].t_end.saturating_sub(launches[i].t_start),
            std::cmp::Reverse(i),
        )
    });
    let mut out = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        let payload = report.payloads.get(i).copied().flatten();
        if payload.is_none() && Some(i) != longest {
            continue;
        }
        let Some(fabric) = report.stats.fabric.get(i) else {
            continue;
        };
        let time = l.t_end.saturating_sub(l.t_start);
        let Some(bound) = fabric.bound() else {
            continue;
        };
        let mb = |b: u64| b as f64 / 1e6;
        let ns = |ps: u64| ps as f64 / 1e3;
        let mut line = format!(
            "kb-sim: launch {i} ({}): {:.3} ns against a fabric bound of {:.3} ns ({:.1} %): {} moved {:.3} MB at {} GB/s",
            l.kernel,
            ns(time),
            ns(bound.busy_ps),
            if time > 0 {
                bound.busy_ps as f64 * 100.0 / time as f64
            } else {
                100.0
            },
            bound.name,
            mb(bound.bytes),
            bound.bw_gbs
        );
        if let (Some(link), Some(hbm)) = (&fabric.link, &fabric.hbm) {
            let other: &crate::engine::Load = if std::ptr::eq(bound, link) { hbm } else { link };
            line += &format!(
                "; {} {:.3} MB, {:.3} ns",
                other.name,
                mb(other.bytes),
                ns(other.busy_ps)
            );
        }
        out.push(line);
        if let Some(p) = payload
            && time > 0
        {
            let algbw = p.bytes as f64 * 1000.0 / time as f64;
            let most = p.bytes as f64 * 1000.0 / bound.busy_ps.max(1) as f64;
            out.push(format!(
                "kb-sim: launch {i} ({}): bus bandwidth {:.1} GB/s ({:.3} MB per member, algorithm bandwidth {:.1} GB/s); this traffic allows at most {:.1} GB/s",
                l.kernel,
                algbw * p.bus_factor,
                mb(p.bytes),
                algbw,
                most * p.bus_factor
            ));
        }
    }
    out
}

fn cmd_list(workloads: &[Box<dyn Workload>]) -> Result<(), String> {
    let mut out = String::new();
    for w in workloads {
        let reference = match w.reference() {
            Reference::BuiltIn => "reference built in",
            Reference::Expect => "no built-in reference: verify with kb-replay --expect",
        };
        out += &format!("{:<14} {} [{reference}]\n", w.name(), w.about());
        for p in w.params() {
            out += &format!("    {:<12} default {:<8} {}\n", p.name, p.default, p.help);
        }
    }
    out += &format!(
        "\nTopologies: {}\n",
        EMBEDDED
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    emit(&out)
}

/// `writeln!` into a `String` (which cannot fail).
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// Write a command's text to stdout at once. A reader that closed the
/// pipe early (`| head -1`) is not an error: it took what it wanted.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("writing to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

fn cmd_sweep(a: SweepArgs, workloads: &[Box<dyn Workload>]) -> Result<u8, String> {
    let bench = match &a.bench {
        None => workloads.first(),
        Some(name) => workloads.iter().find(|w| w.name() == name),
    }
    .ok_or_else(|| {
        let names: Vec<&str> = workloads.iter().map(|w| w.name()).collect();
        format!(
            "-b: unknown workload {:?} (known: {})",
            a.bench.as_deref().unwrap_or(""),
            names.join(", ")
        )
    })?
    .name()
    .to_string();
    let mut axes = Vec::new();
    for s in &a.sets {
        axes.push(crate::sweep::Axis::parse(s, true)?);
    }
    for p in &a.params {
        axes.push(crate::sweep::Axis::parse(p, false)?);
    }
    let exe = std::env::current_exe().map_err(|e| format!("sweep: this executable: {e}"))?;
    let cfg = crate::sweep::SweepConfig {
        topology: a.topology,
        bench,
        seed: a.seed,
        axes,
        inputs: a.inputs,
        races: a.races,
        jobs: a
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        force: a.force,
        traces: a.traces,
        verify: a.verify,
        replay: a.replay,
        out: a.output,
        point: a.point,
        exe,
    };
    if let Some(j) = a.jobs.filter(|&j| j > crate::sweep::max_jobs()) {
        say!(
            "kb-sim sweep: -j {j} capped at {} ({} per available core)",
            crate::sweep::max_jobs(),
            crate::sweep::JOBS_PER_CORE
        );
    }
    if let Some(dir) = &a.emit_jobs {
        let jobs = crate::sweep::Jobs {
            points_per_task: a.points_per_task,
            max_array_size: a.max_array_size,
            time: a.time,
            mem: a.mem,
            sbatch: a.sbatch,
        };
        let (n, arrays) = crate::sweep::emit_jobs(&cfg, dir, &jobs)?;
        say!(
            "kb-sim sweep: wrote the sweep of {n} points to {d}/jobs.txt, the Slurm job array \
             {d}/sweep.sbatch ({ppt} points per task) and {d}/submit.sh ({arrays} array{s} of at \
             most {max} tasks); submit with `{d}/submit.sh`, then join the rows with \
             `kb-inspect merge {d}/results/point-*.parquet -o sweep.parquet`",
            d = dir.display(),
            ppt = jobs.points_per_task,
            s = if arrays == 1 { "" } else { "s" },
            max = jobs.max_array_size,
        );
        return Ok(0);
    }
    let summary = crate::sweep::run(&cfg)?;
    let code = summary.exit_code();
    if code != 0 && summary.signal.is_none() {
        let n = summary.errors + summary.fails;
        say!(
            "kb-sim: {n} of {} point{} failed (their rows' status says why); exit {code}",
            summary.points,
            if summary.points == 1 { "" } else { "s" }
        );
    }
    Ok(code)
}

fn cmd_topology(name: &str, sets: &[(String, String)], fields: bool) -> Result<(), String> {
    let t = crate::overrides::apply(&Topology::load(name).map_err(|e| e.to_string())?, sets)?;
    let mut out = String::new();
    if fields {
        for (k, v) in crate::overrides::fields(&t) {
            w!(out, "{k} = {v}");
        }
        return emit(&out);
    }
    let built = Instant::now();
    let m = Machine::build(&t);
    let build_s = built.elapsed().as_secs_f64();
    let c = t.counts;
    w!(
        out,
        "topology {} (address model {})",
        t.name,
        t.address_model.name()
    );
    match (t.address_model, t.memory_map) {
        (AddressModel::Va, _) => w!(
            out,
            "pe_mmu: {}-byte pages, {} ns TLB overhead per translated DMA side",
            t.pe_mmu.page_bytes,
            t.pe_mmu.tlb_overhead_ns.0
        ),
        (AddressModel::La, Some(mm)) => w!(
            out,
            "memory_map: {:?}, {} of {} pseudo channels per PE x {} GB/s",
            mm.hbm_mapping_mode,
            mm.hbm_channels_per_pe,
            mm.hbm_pseudo_channels,
            mm.hbm_channel_bw_gbs.0
        ),
        _ => {}
    }
    w!(
        out,
        "counts: {} SIPs x {} cubes x {} PEs = {} PEs",
        c.sips,
        c.cubes_per_sip,
        c.pes_per_cube,
        t.total_pes()
    );
    w!(
        out,
        "nodes: {}, directed links: {} (built in {:.3} s)",
        m.nodes.len(),
        m.links.len(),
        build_s
    );
    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
    for n in &m.nodes {
        *kinds.entry(n.kind.name()).or_default() += 1;
    }
    w!(
        out,
        "node kinds: {}",
        kinds
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut classes: std::collections::BTreeMap<&str, (usize, f64, f64)> = Default::default();
    for l in &m.links {
        let e = classes
            .entry(l.class)
            .or_insert((0, l.latency_ps as f64 / 1000.0, l.bw_gbs));
        e.0 += 1;
    }
    w!(out, "link classes:");
    for (class, (n, lat, bw)) in classes {
        w!(out, "  {class:<12} x{n:<5} latency {lat} ns, {bw} GB/s");
    }
    w!(
        out,
        "hbm per cube: {} GiB, {} pseudo channels x {} GB/s = {} GB/s",
        t.hbm.size_gib.0,
        t.hbm.pseudo_channels,
        t.hbm.channel_bw_gbs.0,
        t.hbm.pseudo_channels as f64 * t.hbm.channel_bw_gbs.0
    );
    let last = m.pe_coord(t.total_pes() as usize - 1);
    let from = format!("{last}.pe_dma");
    print_route(&mut out, &m, &from, "sip0.cube0.hbm_ctrl", 4096)?;
    emit(&out)
}

fn print_route(
    out: &mut String,
    m: &Machine,
    from: &str,
    to: &str,
    bytes: u64,
) -> Result<(), String> {
    let node = |n: &str| {
        m.node_by_name(n)
            .ok_or_else(|| format!("topology {}: no node named {n:?}", m.topo.name))
    };
    let (a, b) = (node(from)?, node(to)?);
    let route = m.route(a, b);
    let mut path = vec![m.nodes[a as usize].name.clone()];
    path.extend(
        route
            .iter()
            .map(|&l| m.nodes[m.links[l as usize].to as usize].name.clone()),
    );
    let ps = m.uncontended_ps(&route, bytes);
    w!(
        out,
        "route {from} -> {to} ({} hops): {}",
        route.len(),
        path.join(" -> ")
    );
    w!(
        out,
        "  {bytes} bytes: latency {:.3} ns, effective bandwidth {:.2} GB/s",
        ps as f64 / 1000.0,
        if ps > 0 {
            bytes as f64 * 1000.0 / ps as f64
        } else {
            f64::INFINITY
        }
    );
    Ok(())
}

/// The largest message `probe` times: 1 TiB (at the slowest bandwidth a
/// topology may give, 1e-3 GB/s, about 13 days: exact in picoseconds).
const MAX_PROBE_BYTES: u64 = 1 << 40;

fn cmd_probe(topology: &str, from: &str, to: &str, bytes: u64) -> Result<(), String> {
    if bytes > MAX_PROBE_BYTES {
        return Err(format!(
            "probe --bytes {bytes}: at most {MAX_PROBE_BYTES} (1 TiB)"
        ));
    }
    let t = Topology::load(topology).map_err(|e| e.to_string())?;
    let m = Machine::build(&t);
    let mut out = String::new();
    print_route(&mut out, &m, from, to, bytes)?;
    emit(&out)
}
