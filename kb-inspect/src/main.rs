//! kb-inspect: the command line over the `kb_inspect` library.

/// `eprintln!` that never panics: a run's notes on stderr are not worth
/// failing it for when the reader has gone (`2>&1 | head -1`), after its
/// outputs are written.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kb_inspect::progress::Progress;
use kb_inspect::render::{KindSel, parse_kind, parse_ns};
use kb_inspect::{
    EXIT_DIFFERENT, EXIT_ERROR, EXIT_OK, Error, Input, critical, diff, ops, stats, tensor,
};

const EXIT_CODES: &str = "\
TRACE is a trace file (memory-mapped) or - for standard input (read in one pass).
Times are nanoseconds wherever people read them (tables, summaries, CSV, --from/--to,
which take fractions); exact integer picoseconds are in fields named *_ps.

Exit codes:
  0  success (diff: the traces are identical)
  1  diff: the traces differ
  2  error: bad arguments, unreadable, corrupt or truncated trace (the message
     names the file and the byte offset), or an output that cannot be written";

#[derive(Parser, Debug)]
#[command(
    name = "kb-inspect",
    version,
    about = "Query, summarise, chart, export and compare kb traces",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Debug)]
struct FilterArgs {
    /// Component glob (`*` matches dots too, e.g. 'sip0.*.pe_dma'); repeatable
    #[arg(long = "component", value_name = "GLOB")]
    components: Vec<String>,
    /// Op kind: memory, gemm, math, sync, atomic, unknown or a kind code; repeatable or comma-separated
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind, value_delimiter = ',')]
    kinds: Vec<KindSel>,
    /// Op name glob; repeatable
    #[arg(long = "name", value_name = "GLOB")]
    names: Vec<String>,
    /// Keep ops that end after this time (ns)
    #[arg(long, value_name = "NS", value_parser = parse_ns)]
    from: Option<u64>,
    /// Keep ops that start before this time (ns)
    #[arg(long, value_name = "NS", value_parser = parse_ns)]
    to: Option<u64>,
    /// Keep ops that overlap launch N's window (its index in `summary`'s list; with
    /// --from/--to, within both); needs a trace file
    #[arg(long, value_name = "N")]
    launch: Option<usize>,
}

impl FilterArgs {
    /// The filter, with `--launch` resolved against the trace's launches.
    fn filter(&self, trace: &Input) -> Result<ops::Filter, Error> {
        let (mut from, mut to) = (self.from, self.to);
        if let Some(i) = self.launch {
            let (l0, l1) = kb_inspect::stats::launch_window(trace, i)?;
            from = Some(from.map_or(l0, |f| f.max(l0)));
            to = Some(to.map_or(l1, |t| t.min(l1)));
        }
        Ok(ops::Filter {
            components: self.components.clone(),
            names: self.names.clone(),
            kinds: self.kinds.clone(),
            from,
            to,
        })
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum TextJson {
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OpsFormat {
    Table,
    Json,
    Jsonl,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum StatsFormat {
    Table,
    Json,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum TimelineFormat {
    Json,
    Perfetto,
}

/// What `timeline --channels` draws of the HBM pseudo channels.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum ChannelsArg {
    /// Left out
    None,
    /// A utilisation counter per channel (util hbm_ctrl.chN, per time bin)
    Counters,
    /// A track per channel with a busy slice per interval it served
    Slices,
}

/// How `plot` maps an axis' values (`kb_inspect::plot::Scale`).
#[derive(ValueEnum, Clone, Copy, Debug)]
enum ScaleArg {
    /// Log where the values are at least three distinct powers of two, else linear
    Auto,
    /// Linear
    Lin,
    /// Logarithmic (base 2); values that are not positive are left out, with a warning
    Log,
}

impl From<ScaleArg> for kb_inspect::plot::Scale {
    fn from(s: ScaleArg) -> Self {
        match s {
            ScaleArg::Auto => Self::Auto,
            ScaleArg::Lin => Self::Lin,
            ScaleArg::Log => Self::Log,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ExportFormat {
    Parquet,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum TableJson {
    Table,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum By {
    /// The serving component (sip0.cube0.pe0.pe_dma)
    Component,
    /// The op name (dma_read, ipcq_copy, gemm)
    #[value(name = "op_name", alias = "op-name")]
    OpName,
    /// The op kind (memory, gemm, math, unknown(N))
    #[value(name = "op_kind", alias = "op-kind")]
    OpKind,
    /// Memory ops by route, SRC -> DST (other kinds are left out)
    Route,
    /// HBM pseudo channels (sipS.cubeC.chN): bytes and busy time, from the trace's channels chunk
    Channel,
    /// Unit kinds (pe_dma, pe_gemm, pe_math, hbm_ctrl...): utilisation over the kind's units
    /// in the trace's topology, idle ones included (sync records are no unit's work: left out)
    Unit,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Bf16 {
    /// widen to float32 (<f4), exactly
    F32,
    /// raw bit patterns as uint16 (<u2)
    Bits,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Tool, command line, topology, benchmark and params, simulated time,
    /// record counts by kind, launches and what bound each, tensors and verification spec
    #[command(
        after_help = "bound by (per launch): for each resource class, the busiest single unit's \
        time in the launch's window divided by the launch's span; the launch is bound by the class \
        with the highest value, the next two follow. Classes: pe_gemm, pe_math, pe_dma, tcm (busy \
        time, the union of active intervals, of the units on the launch's PEs), hbm channel (each \
        pseudo channel's service, from the channels chunk), sync wait (the union of a unit's \
        wait_signal and barrier records). Traces hold no per-link data: NoC links are not ranked."
    )]
    Summary {
        /// Trace file, or - for standard input
        trace: String,
        #[arg(long, value_enum, default_value = "text")]
        format: TextJson,
    },
    /// List ops, filtered
    #[command(
        after_help = "An op is in the --from/--to window when it overlaps it: it starts \
        before --to and ends after --from (an instantaneous op at --from counts). Records come \
        in (start, op id) order, so the listing stops at the first op starting at or after --to."
    )]
    Ops {
        /// Trace file, or - for standard input
        trace: String,
        #[command(flatten)]
        filter: FilterArgs,
        /// Stop after N ops
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        #[arg(long, value_enum, default_value = "table")]
        format: OpsFormat,
    },
    /// Per-group count, busy time, utilisation, bytes, FLOPs, bandwidth and FLOP rate
    #[command(
        after_help = "window: the kernel window, first launch start to last launch end \
        (--launch N: launch N's); a trace without launches: the whole run (the output says so). \
        Only ops overlapping the window count, clipped to it. busy time: the time the group \
        computes or transfers, the union of its ops' active intervals (the whole op where a \
        record has none; overlapping ops count once); held time: the union of its op spans \
        (waiting for operands and producers included); op time: sum of durations; \
        utilisation: busy / (units x window), held%: held / (units x window); one unit per \
        group except --by unit (the units of that kind in the trace's topology, idle ones \
        included) - the same definition as kb-sim sweep's K_util; bytes: memory ops' \
        write extent bytes; FLOPs: gemm 2*m*n*k, math rows*cols (one per element); GB/s = \
        bytes / busy ns; GFLOP/s = FLOPs / busy ns.\n\n\
        route: a memory op's SRC -> DST, the memory of the first range of its read effect and \
        of its write effect: sipS.cubeC.peP.tcm, sipS.cubeC.sram, sipS.cubeC.hbm (per cube, \
        whatever the PE partition), host (host space), or ? when the op has no such effect or \
        range or its PA is invalid. Only memory ops have routes: with --by route, gemm, math \
        and unknown-kind ops are not counted. Example: the cost of PE-to-PE copies per route: \
        kb-inspect stats run.kbt --by route --name ipcq_copy\n\n\
        channel: each HBM pseudo channel's service as kb-sim's HBM controllers timed it (the \
        trace's channels chunk, not the records): count = busy intervals, busy = time serving \
        (access latency excluded), bytes = read + written; --name does not apply. Example: \
        which channels a kernel kept busy: kb-inspect stats run.kbt --by channel"
    )]
    Stats {
        /// Trace file, or - for standard input
        trace: String,
        #[arg(long, value_enum, default_value = "component")]
        by: By,
        /// Count only ops whose name matches (glob, as for `ops`; a plain name matches
        /// exactly); repeatable
        #[arg(long = "name", value_name = "GLOB")]
        names: Vec<String>,
        /// Utilisation over launch N's window only (its index in `summary`'s list), counting
        /// the ops that overlap it, clipped to it; default: the kernel window of all launches
        #[arg(long, value_name = "N")]
        launch: Option<usize>,
        /// The window starts here instead (ns; within --launch's window when both are given)
        #[arg(long, value_name = "NS", value_parser = parse_ns)]
        from: Option<u64>,
        /// The window ends here instead (ns; within --launch's window when both are given)
        #[arg(long, value_name = "NS", value_parser = parse_ns)]
        to: Option<u64>,
        #[arg(long, value_enum, default_value = "table")]
        format: StatsFormat,
    },
    /// The chain of ops and waits that set a launch's end, with where its time went
    #[command(
        after_help = "Walks back from the launch's end op (the last record to end in its window; \
        on a tie a sync kernel or kernel_end record) along the trace's causal edges: at each op, the edge to \
        the dependency that ended last. The op's segment is the part of it after that \
        dependency ended; a gap between the dependency's end and the op's start is a wait of \
        the edge's kind (program: issue and notice latency; resource: the unit was held; sync; \
        host; data). Time no edge explains (before an op without edges, after the last op to \
        end) is unexplained. The segments cover the launch's window exactly: ops + waits + \
        unexplained = its span. Breakdowns: by unit kind (sync records as UNIT (sync)), op \
        name, route (memory ops) and wait kind, largest first, and a summary of the three \
        largest contributions.\n\n\
        Formats: table; json (one object with --launch, else an array: segments, breakdowns, \
        times in integer ps); csv (one row per segment). Example: why launch 2 ended when it \
        did: kb-inspect critical-path run.kbt --launch 2"
    )]
    CriticalPath {
        /// Trace file, or - for standard input
        trace: String,
        /// Launch N alone (its index in `summary`'s list); default: every launch, in order
        #[arg(long, value_name = "N")]
        launch: Option<usize>,
        #[arg(long, value_enum, default_value = "table")]
        format: StatsFormat,
    },
    /// Write a timeline for Perfetto UI: Chrome trace-event JSON or Perfetto's
    /// native protobuf (streamed, several times smaller)
    #[command(
        after_help = "Formats: json (Chrome trace events: ts and dur in microseconds, rounded to \
        the nanosecond) or perfetto (protobuf, timestamps in ns); the default follows the file \
        name (.pftrace, .perfetto-trace, .pb: perfetto; else json). Both hold: a slice per op on \
        its component's track (args: op id, start/end ns, bytes and route SRC -> DST for memory \
        ops, FLOPs, shape, dtype, launch and kernel); one process per PE (sipS.cubeC.peP: its \
        units' tracks, pe_dma, pe_cpu...), one per sipN.cubeM for the cube's other components, \
        one per SIP for SIP-level components and one for the host; ops that overlap on one \
        component go to extra tracks COMPONENT#1, #2, ...; a slice per launch on the host's \
        launches track and per kernel run on its PE's kernel track (kernel_start to kernel_end; \
        without those records, the PE's ops of the launch); sync records (waits, signals, \
        kernel_start/kernel_end instants) on pe_cpu; flow arrows along dependencies between \
        components (JSON: named by the edge's kind); counter tracks per cube (hbm GB/s, link -> \
        CUBE GB/s, util pe_dma|pe_gemm|pe_math) and per PE (noc GB/s, tcm high-water bytes) in \
        time bins; the HBM pseudo channels as --channels says.\n\n\
        --critical-path marks each launch's critical path (as critical-path walks it): its ops \
        get args critical=true and critical_launch=N and flow arrows (category critical) chain \
        them; it reads the trace twice and keeps every record for the walk, so it is off by \
        default and needs a file. A progress bar is drawn on stderr when it is a terminal."
    )]
    Timeline {
        /// Trace file, or - for standard input
        trace: String,
        /// Output file (- for standard output; perfetto only when it is not a terminal)
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Output format (default: from the file name)
        #[arg(long, value_enum)]
        format: Option<TimelineFormat>,
        /// HBM pseudo channels: none, a utilisation counter each, or a track each with its
        /// busy intervals (on a long run nearly all of the timeline's size)
        #[arg(long, value_enum, default_value = "slices")]
        channels: ChannelsArg,
        /// Mark each launch's critical path (args critical, critical_launch; flow arrows)
        #[arg(long)]
        critical_path: bool,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Export the op log as typed, flattened columns: Apache Parquet (pandas,
    /// polars, DuckDB, pyarrow read it directly) or CSV
    #[command(
        after_help = "Columns: op_id; start_ns/end_ns/dur_ns (float ns) and start_ps/end_ps/dur_ps \
        (exact integer ps); component and its sip, cube, pe (null where absent) and unit; kind, \
        name, bytes, flops (executed, padding of edge tiles included); fingerprint (hex text); \
        dtype, dtype_acc, dtype_out; m, n, k; math_op, axis; rows, cols, row_bytes; in_shapes \
        (list of [rows, cols]), out_shape; src_space/src_addr, dst_space/dst_addr (addresses as \
        the kernel used them), read_pa/write_pa (first physical address of each effect); \
        route_src/route_dst; deps (list of op ids: the ops that had to happen first) and dep_kinds \
        (each one's kind: data, program, sync, host, resource); launch and kernel (null off PEs, and when \
        reading standard input). CSV writes lists as JSON text and nulls as empty cells, so \
        every column keeps one type. The same filters as `ops` select rows."
    )]
    Export {
        /// Trace file, or - for standard input
        trace: String,
        /// Output file: .parquet or .csv (- for standard output, CSV only unless piped)
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Output format (default: from the file name)
        #[arg(long, value_enum)]
        format: Option<ExportFormat>,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Draw an SVG chart: a trace's utilisation over time per unit kind, or a
    /// sweep table's metric against a swept value
    #[command(
        after_help = "INPUT is a trace (file or -): one line per unit kind (pe_dma, pe_gemm, \
        pe_math, hbm_ctrl, ...), the busy fraction of its units over time. Or a sweep table \
        (.parquet or .csv from kb-sim sweep): --y (default sim_ns) against --x (default the first \
        swept column), one line per combination of the other swept values, the legend beside the \
        plot naming the swept columns that vary. An axis is logarithmic (base 2) when its values \
        are at least three distinct powers of two (--x-scale/--y-scale lin|log force it). \
        --roofline draws achieved_gflops (useful FLOPs per kernel ns) against \
        arithmetic_intensity (useful FLOPs per kernel byte), log-log, under the ceilings in the \
        table: peak_gemm_gflops_D and peak_math_gflops_D (D: the dtype column's values, else \
        every dtype) and the peak_hbm_gbs slope. Example: kb-inspect plot sweep.parquet --y \
        achieved_gflops -o gflops.svg"
    )]
    Plot {
        /// A trace, or a sweep table (.parquet, .csv)
        input: String,
        /// Output file (.svg)
        #[arg(short, long, value_name = "FILE.svg")]
        output: PathBuf,
        /// Sweep tables: the column along the x axis (default: the first swept one)
        #[arg(long)]
        x: Option<String>,
        /// Sweep tables: the column to plot (default: sim_ns)
        #[arg(long)]
        y: Option<String>,
        /// The x axis' scale
        #[arg(long, value_enum, default_value = "auto")]
        x_scale: ScaleArg,
        /// The y axis' scale
        #[arg(long, value_enum, default_value = "auto")]
        y_scale: ScaleArg,
        /// Sweep tables: a roofline (achieved GFLOP/s against arithmetic intensity, the
        /// table's peaks as ceilings), log-log unless a scale is given
        #[arg(long, conflicts_with_all = ["x", "y"])]
        roofline: bool,
    },
    /// Join the rows of results tables (kb-sim sweep tables, CSV or Parquet)
    #[command(
        after_help = "Columns are matched by name (missing ones are empty; types widen \
        integer -> float -> text where tables disagree). Rows are ordered by the `point` column \
        when every table has one; a point in two tables is an error. Sweep tables carry their \
        sweep's id and point count (sweep_id, sweep_points): tables of two sweeps are refused, \
        and so is a merge missing some of the sweep's points unless --allow-missing (exit 2, \
        nothing written). Example, after a Slurm job \
        array from kb-sim sweep --emit-jobs DIR: kb-inspect merge DIR/results/point-*.parquet \
        -o sweep.parquet"
    )]
    Merge {
        /// Tables to join (.parquet or .csv)
        #[arg(required = true)]
        tables: Vec<PathBuf>,
        /// Output table: .parquet or .csv
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Merge a sweep's tables even when some of its points have none (they are named
        /// on stderr); without it a missing point is an error
        #[arg(long)]
        allow_missing: bool,
    },
    /// List the named tensors
    Tensors {
        /// Trace file, or - for standard input
        trace: String,
        #[arg(long, value_enum, default_value = "table")]
        format: TableJson,
    },
    /// Export a host-provided tensor as .npy (C order, shape from the trace)
    #[command(
        after_help = "dtypes: f32 <f4, f16 <f2 (numpy float16), i8 |i1, i32 <i4, u8 |u1. \
        bf16 has no numpy dtype: by default it is widened to float32 (<f4, exact); with \
        --bf16 bits the raw bit patterns are written as uint16 (<u2); recover the values with \
        (x.astype(np.uint32) << 16).view(np.float32). Output tensors exist only on the device: \
        their values are computed by kb-replay, not stored in the trace, so exporting one is an \
        error."
    )]
    Tensor {
        /// Trace file, or - for standard input
        trace: String,
        /// Tensor name (see `tensors`)
        name: String,
        /// Output file (- for standard output)
        #[arg(short, long, value_name = "FILE.npy")]
        output: PathBuf,
        /// How to write bf16 tensors
        #[arg(long, value_enum, default_value = "f32")]
        bf16: Bf16,
    },
    /// Compare two traces: exit 0 when identical, 1 when different
    #[command(
        after_help = "Reports metadata differences (tool version, params, seed, tensors, \
        verification spec; the command line is a note only), resolved topology changes by field \
        path (links.cube_link.bw_gbs: 256.0 -> 32.0), simulated time (as summary's), then where \
        the time went per launch (paired by index): the span's change and the busy time by unit \
        kind, route (memory ops) and op name, largest change first, each A, B and B - A \
        (positive: more in B); a group's busy time is the sum over its units of each unit's \
        busy time in the launch's window (JSON also by component). Then the first op that \
        diverges by timing (records paired in trace order), by params/effects, and by data \
        fingerprint (records paired by op id), with both records. At most one of A and B may \
        be - (standard input)."
    )]
    Diff {
        /// First trace (- for standard input)
        a: String,
        /// Second trace (- for standard input)
        b: String,
        #[arg(long, value_enum, default_value = "text")]
        format: TextJson,
    },
}

fn run(cmd: Cmd, out: &mut dyn Write) -> Result<i32, Error> {
    match cmd {
        Cmd::Summary { trace, format } => {
            kb_inspect::summary::run(&Input::parse(&trace), matches!(format, TextJson::Json), out)?;
        }
        Cmd::Ops {
            trace,
            filter,
            limit,
            format,
        } => {
            let f = match format {
                OpsFormat::Table => ops::Format::Table,
                OpsFormat::Json => ops::Format::Json,
                OpsFormat::Jsonl => ops::Format::Jsonl,
                OpsFormat::Csv => ops::Format::Csv,
            };
            let input = Input::parse(&trace);
            ops::run(&input, &filter.filter(&input)?, limit, f, out)?;
        }
        Cmd::Stats {
            trace,
            by,
            names,
            launch,
            from,
            to,
            format,
        } => {
            let by = match by {
                By::Component => stats::GroupBy::Component,
                By::OpName => stats::GroupBy::OpName,
                By::OpKind => stats::GroupBy::OpKind,
                By::Route => stats::GroupBy::Route,
                By::Channel => stats::GroupBy::Channel,
                By::Unit => stats::GroupBy::Unit,
            };
            let f = match format {
                StatsFormat::Table => stats::Format::Table,
                StatsFormat::Json => stats::Format::Json,
                StatsFormat::Csv => stats::Format::Csv,
            };
            let window = stats::WindowArgs { launch, from, to };
            stats::run(&Input::parse(&trace), by, &names, window, f, out)?;
        }
        Cmd::CriticalPath {
            trace,
            launch,
            format,
        } => {
            let f = match format {
                StatsFormat::Table => critical::Format::Table,
                StatsFormat::Json => critical::Format::Json,
                StatsFormat::Csv => critical::Format::Csv,
            };
            critical::run(&Input::parse(&trace), launch, f, out)?;
        }
        Cmd::Timeline {
            trace,
            output,
            format,
            channels,
            critical_path,
            filter,
        } => {
            use kb_inspect::timeline::{Channels, Options};
            let format = match format {
                Some(TimelineFormat::Json) => kb_inspect::timeline::Format::Json,
                Some(TimelineFormat::Perfetto) => kb_inspect::timeline::Format::Perfetto,
                None => kb_inspect::timeline::Format::of(&output),
            };
            let opts = Options {
                channels: match channels {
                    ChannelsArg::None => Channels::None,
                    ChannelsArg::Counters => Channels::Counters,
                    ChannelsArg::Slices => Channels::Slices,
                },
                critical_path,
            };
            let input = Input::parse(&trace);
            let filter = filter.filter(&input)?;
            let bar = Progress::new(io::stderr().is_terminal(), "timeline", &input);
            let info =
                kb_inspect::timeline::run_with(&input, &filter, format, &opts, &bar, &output);
            bar.clear();
            let info = info?;
            say!(
                "kb-inspect: wrote {} ops, {} launches, {} kernels, {} flows and {} counter values \
                 on {} tracks in {} processes to {}{}",
                info.events,
                info.launches,
                info.kernels,
                info.flows,
                info.counter_values,
                info.tracks + info.counter_tracks,
                info.processes,
                output.display(),
                if critical_path {
                    format!(
                        " ({} ops on critical paths, {} arrows chaining them)",
                        info.critical_ops, info.critical_flows
                    )
                } else {
                    String::new()
                }
            );
            if info.events > 2_000_000 && format == kb_inspect::timeline::Format::Json {
                say!(
                    "kb-inspect: note: Perfetto UI loads large JSON slowly; \
                     --format perfetto is smaller and faster, --from/--to select a window"
                );
            }
        }
        Cmd::Export {
            trace,
            output,
            format,
            filter,
        } => {
            let format = match format {
                Some(ExportFormat::Parquet) => kb_inspect::export::Format::Parquet,
                Some(ExportFormat::Csv) => kb_inspect::export::Format::Csv,
                None => kb_inspect::export::Format::of(&output)?,
            };
            let input = Input::parse(&trace);
            let filter = filter.filter(&input)?;
            let bar = Progress::new(io::stderr().is_terminal(), "export", &input);
            let info = kb_inspect::export::run_with(&input, &filter, format, &bar, &output);
            bar.clear();
            let info = info?;
            say!(
                "kb-inspect: wrote {} ops to {}{}",
                info.rows,
                output.display(),
                if info.launches {
                    ""
                } else {
                    " (launch columns empty: a stream's launches come after its records)"
                }
            );
        }
        Cmd::Plot {
            input,
            output,
            x,
            y,
            x_scale,
            y_scale,
            roofline,
        } => {
            let opts = kb_inspect::plot::Options {
                x,
                y,
                x_scale: x_scale.into(),
                y_scale: y_scale.into(),
                roofline,
            };
            let info = kb_inspect::plot::run(&input, &opts, &output)?;
            if info.not_positive > 0 {
                say!(
                    "kb-inspect: warning: {} point{} left out: not positive on a log axis",
                    info.not_positive,
                    if info.not_positive == 1 { "" } else { "s" }
                );
            }
            if info.skipped > 0 {
                say!(
                    "kb-inspect: warning: {} row{} left out: x or y is not finite (inf or NaN)",
                    info.skipped,
                    if info.skipped == 1 { "" } else { "s" }
                );
            }
            say!(
                "kb-inspect: drew {} lines ({} points) to {}",
                info.lines,
                info.points,
                output.display()
            );
        }
        Cmd::Merge {
            tables,
            output,
            allow_missing,
        } => {
            let info = kb_inspect::merge::run(&tables, &output, allow_missing)?;
            say!(
                "kb-inspect: merged {} rows of {} tables ({} columns) into {}",
                info.rows,
                info.tables,
                info.columns,
                output.display()
            );
            if info.missing > 0 {
                say!(
                    "kb-inspect: warning: {} of the sweep's points have no table (--allow-missing): {}",
                    info.missing,
                    kb_inspect::merge::list(&info.missing_first, info.missing)
                );
            }
        }
        Cmd::Tensors { trace, format } => {
            tensor::list(
                &Input::parse(&trace),
                matches!(format, TableJson::Json),
                out,
            )?;
        }
        Cmd::Tensor {
            trace,
            name,
            output,
            bf16,
        } => {
            let how = match bf16 {
                Bf16::F32 => tensor::Bf16As::F32,
                Bf16::Bits => tensor::Bf16As::Bits,
            };
            let t = tensor::export(&Input::parse(&trace), &name, &output, how)?;
            say!(
                "kb-inspect: wrote tensor {} ({} {:?}) as {} to {}",
                t.name,
                t.dtype,
                t.shape,
                tensor::npy_dtype(t.dtype, how),
                output.display()
            );
        }
        Cmd::Diff { a, b, format } => {
            let f = match format {
                TextJson::Text => diff::Format::Text,
                TextJson::Json => diff::Format::Json,
            };
            let same = diff::run(&Input::parse(&a), &Input::parse(&b), f, out)?;
            return Ok(if same { EXIT_OK } else { EXIT_DIFFERENT });
        }
    }
    Ok(EXIT_OK)
}

fn main() -> ExitCode {
    // An allocation that fails anyway exits 2, its partial output removed.
    #[cfg(unix)]
    kb_format::signals::exit_2_on_abort();
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(256 << 10, stdout.lock());
    let res = run(cli.cmd, &mut out).and_then(|code| {
        out.flush()
            .map_err(|e| Error::io("writing output", e))
            .map(|_| code)
    });
    match res {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) if e.is_broken_pipe() => ExitCode::from(EXIT_OK as u8),
        Err(e) => {
            drop(out);
            say!("kb-inspect: {e}");
            ExitCode::from(EXIT_ERROR as u8)
        }
    }
}
