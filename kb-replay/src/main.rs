//! `kb-replay`: replay a kb trace with real data and verify its outputs.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kb_replay::app::{self, Config, Input};
use kb_replay::backend;
use kb_replay::engine::{Fingerprints, ReplayOptions};
use kb_replay::verify::{TolFlag, TolerancePolicy};

const AFTER_HELP: &str = "\
Output: the verdict (each output's PASS/FAIL line and the summary) goes to
stdout, so `kb-sim ... | kb-replay --verify | grep PASS` works; errors,
warnings and the progress bar go to stderr. With --report - stdout is the
JSON report and the verdict lines go to stderr. The summary's GFLOP/s is
how fast this host replayed the trace's GEMMs, not simulated performance.

Exit codes:
  0  replay succeeded (and, with --verify or --expect, every output passed)
  1  verification mismatch: an output differs from its reference
  2  error: bad flags, an unreadable, corrupt or truncated trace, an op that
     cannot be replayed (e.g. a fingerprint mismatch), a bad .npy file

Tolerances (docs/design.md P7, unless the trace's spec gives one):
  f32 rtol=atol=1e-5, f16 1e-3, bf16 1e-2, integers exact;
  an element passes when |out - ref| <= atol + rtol * |ref|.
  Each output's PASS/FAIL line says which rtol and atol it used and
  where each came from; a trace's tolerance looser than its dtype's
  default is named there. --strict-tolerance ignores the trace's
  tolerances; --atol and --rtol set atol and rtol (each on its own,
  winning over the trace and the defaults) for every verified output
  (X), one output tensor (NAME=X) or a dtype's outputs (f16=X).

--dump-outputs writes bf16 tensors as float32 (numpy has no bf16).

GEMM backends (--backend): gemm (pure Rust, the default); openblas (system
OpenBLAS, only in builds with the `openblas` cargo feature).
Results are bit-identical for every --threads value. A progress bar is drawn
on stderr only when stderr is a terminal (and not with --quiet).";

/// Replay a kb trace (Phase 2) with real data and verify its outputs.
#[derive(Debug, Parser)]
#[command(name = "kb-replay", version, after_help = AFTER_HELP)]
struct Args {
    /// Trace file, or `-` for stdin [default: stdin when it is not a terminal]
    trace: Option<PathBuf>,

    /// Verify the outputs the trace's verification spec names
    #[arg(long)]
    verify: bool,

    /// Write a JSON report to FILE (`-` for stdout)
    #[arg(long, value_name = "FILE|-")]
    report: Option<PathBuf>,

    /// Use FILE.npy as the reference for tensor NAME (adds the output or
    /// replaces its spec reference; implies --verify). Repeatable.
    #[arg(long, value_name = "NAME=FILE.npy", value_parser = parse_expect)]
    expect: Vec<(String, PathBuf)>,

    /// Write each checked output and every tensor without host data to
    /// DIR/NAME.npy
    #[arg(long, value_name = "DIR")]
    dump_outputs: Option<PathBuf>,

    /// No PASS lines, summary or progress bar (errors on stderr and FAIL
    /// lines on stdout are still printed)
    #[arg(long, short)]
    quiet: bool,

    /// Let verification pass although ops of kinds this build does not
    /// know were skipped (by default they fail it: what they computed
    /// would go unchecked)
    #[arg(long)]
    allow_unknown: bool,

    /// Absolute tolerance instead of the trace's or the dtype default (a
    /// finite number >= 0): X for every verified output, NAME=X for one
    /// output tensor or for a dtype's outputs (f16=1e-2); repeatable, a
    /// tensor's beating its dtype's beating the plain one
    #[arg(long, value_name = "[NAME=]X", value_parser = TolFlag::parse, allow_negative_numbers = true)]
    atol: Vec<TolFlag>,

    /// Relative tolerance, as --atol
    #[arg(long, value_name = "[NAME=]X", value_parser = TolFlag::parse, allow_negative_numbers = true)]
    rtol: Vec<TolFlag>,

    /// Ignore the tolerances the trace gives and use the dtype defaults
    /// (see below), where --atol/--rtol do not set them
    #[arg(long)]
    strict_tolerance: bool,

    /// Threads in all, one of them also reading and planning the trace
    /// [default: the number of available cores; at most 4 per core]
    #[arg(long, short = 'j', value_name = "N")]
    threads: Option<usize>,

    /// GEMM backend, among those compiled in (see --help)
    #[arg(long, value_name = "NAME", default_value = "gemm", value_parser = parse_backend)]
    backend: String,

    /// Which recorded fingerprints to check: all, sample (about one memory
    /// op in 16, by op id), or off (the trace is trusted)
    #[arg(long, value_name = "MODE", default_value = "all", value_parser = parse_fingerprints)]
    fingerprints: Fingerprints,

    /// Copy every byte a memory op moves, instead of letting ops read the
    /// bytes where they already are (for comparison; same results)
    #[arg(long)]
    no_elide: bool,

    /// Plan every GEMM as a node of its own, instead of a chain of GEMMs
    /// accumulating into one output as one node (for comparison; same
    /// results)
    #[arg(long)]
    no_fuse: bool,

    /// Debug mode: compare each compute op's inputs with the snapshots
    /// `kb-sim --capture-inputs` recorded; the first op that differs exits 1
    #[arg(long)]
    check_intermediates: bool,
}

fn parse_backend(s: &str) -> Result<String, String> {
    let names = backend::names();
    if names.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown backend {s:?}; this build has: {}{}",
            names.join(", "),
            if cfg!(feature = "openblas") {
                ""
            } else {
                " (openblas needs the `openblas` cargo feature)"
            }
        ))
    }
}

fn parse_fingerprints(s: &str) -> Result<Fingerprints, String> {
    Fingerprints::from_name(s).ok_or_else(|| format!("expected all, sample or off, got {s:?}"))
}

fn parse_expect(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => {
            Ok((name.to_string(), PathBuf::from(file)))
        }
        _ => Err(format!("expected NAME=FILE.npy, got {s:?}")),
    }
}

fn main() -> ExitCode {
    // An allocation that fails anyway exits 2, its partial output removed.
    #[cfg(unix)]
    kb_format::signals::exit_2_on_abort();
    let args = Args::parse();
    let input = match args.trace {
        Some(p) if p.as_os_str() == "-" => Input::Stdin,
        Some(p) => Input::Path(p),
        None if std::io::stdin().is_terminal() => {
            kb_replay::say!(
                "kb-replay: no trace given and stdin is a terminal; pass a TRACE path or pipe a \
                 trace in (see --help)"
            );
            return ExitCode::from(2);
        }
        None => Input::Stdin,
    };
    let cfg = Config {
        input,
        verify: args.verify,
        report: args.report,
        expect: args.expect,
        dump_outputs: args.dump_outputs,
        quiet: args.quiet,
        allow_unknown: args.allow_unknown,
        tolerance: TolerancePolicy {
            atol: args.atol,
            rtol: args.rtol,
            strict: args.strict_tolerance,
        },
        threads: args.threads,
        progress: !args.quiet && std::io::stderr().is_terminal(),
        options: ReplayOptions {
            check_intermediates: args.check_intermediates,
            fingerprints: args.fingerprints,
            elide: !args.no_elide,
            fuse: !args.no_fuse,
            ..ReplayOptions::default()
        },
    };
    let Some(backend) = backend::by_name(&args.backend) else {
        kb_replay::say!("kb-replay: unknown backend {:?}", args.backend);
        return ExitCode::from(2);
    };
    match app::run(&cfg, backend.as_ref()) {
        Ok(report) if report.pass() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            kb_replay::say!("kb-replay: {}", e.message(&cfg.input.name()));
            match e {
                kb_replay::error::Error::Intermediate { .. } => ExitCode::from(1),
                _ => ExitCode::from(2),
            }
        }
    }
}
