//! kb-inspect: the command line over the `kb_inspect` library.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kb_inspect::render::{KindSel, parse_kind, parse_ns};
use kb_inspect::{EXIT_DIFFERENT, EXIT_ERROR, EXIT_OK, Error, Input, diff, ops, stats, tensor};

const EXIT_CODES: &str = "\
TRACE is a trace file (memory-mapped) or - for standard input (read in one pass).
Times in records are picoseconds; --from/--to take nanoseconds (fractions allowed).

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
    /// Op kind: memory, gemm, math, unknown or a kind code; repeatable or comma-separated
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
}

impl FilterArgs {
    fn filter(&self) -> ops::Filter {
        ops::Filter {
            components: self.components.clone(),
            names: self.names.clone(),
            kinds: self.kinds.clone(),
            from: self.from,
            to: self.to,
        }
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
    /// record counts by kind, tensors and verification spec
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
        after_help = "busy time: length of the union of the group's op intervals \
        (overlapping ops count once); op time: sum of durations; utilisation: busy time / \
        simulated time (the run's end as kb-sim reports it, at least the end of the last op, \
        counted or not); bytes: memory ops' \
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
        #[arg(long, value_enum, default_value = "table")]
        format: StatsFormat,
    },
    /// Write a Chrome trace-event JSON timeline (opens in Perfetto UI)
    #[command(
        after_help = "ts and dur are in microseconds, rounded to the nanosecond (args carry the \
        exact start_ps/end_ps; memory ops' args also carry their bytes and their route, \
        SRC -> DST, named as by stats --by route). One process per sipN.cubeM, one per \
        SIP for SIP-level components and one for the host; one track per component; ops that \
        overlap on one component go to extra tracks named COMPONENT#1, #2, ... so complete events \
        on a track never overlap."
    )]
    Timeline {
        /// Trace file, or - for standard input
        trace: String,
        /// Output file (- for standard output)
        #[arg(short, long, value_name = "FILE.json")]
        output: PathBuf,
        #[command(flatten)]
        filter: FilterArgs,
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
        after_help = "Reports metadata differences (tool version, topology, params, seed, \
        tensors, verification spec; the command line is a note only), simulated time, busy time \
        per component, the first op that diverges by timing (records paired in trace order), by \
        params/effects, and by data fingerprint (records paired by op id), with both records. \
        At most one of A and B may be - (standard input)."
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
            ops::run(&Input::parse(&trace), &filter.filter(), limit, f, out)?;
        }
        Cmd::Stats {
            trace,
            by,
            names,
            format,
        } => {
            let by = match by {
                By::Component => stats::GroupBy::Component,
                By::OpName => stats::GroupBy::OpName,
                By::OpKind => stats::GroupBy::OpKind,
                By::Route => stats::GroupBy::Route,
                By::Channel => stats::GroupBy::Channel,
            };
            let f = match format {
                StatsFormat::Table => stats::Format::Table,
                StatsFormat::Json => stats::Format::Json,
                StatsFormat::Csv => stats::Format::Csv,
            };
            stats::run(&Input::parse(&trace), by, &names, f, out)?;
        }
        Cmd::Timeline {
            trace,
            output,
            filter,
        } => {
            let info = kb_inspect::timeline::run(&Input::parse(&trace), &filter.filter(), &output)?;
            eprintln!(
                "kb-inspect: wrote {} events on {} tracks in {} processes to {}",
                info.events,
                info.tracks,
                info.processes,
                output.display()
            );
            if info.events > 2_000_000 {
                eprintln!(
                    "kb-inspect: note: Perfetto UI loads large JSON slowly; \
                     --from/--to select a window"
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
            eprintln!(
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
            eprintln!("kb-inspect: {e}");
            ExitCode::from(EXIT_ERROR as u8)
        }
    }
}
