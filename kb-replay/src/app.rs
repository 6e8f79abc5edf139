//! What the binary does, as a library function: load a trace (file or
//! stream), replay it, verify, dump outputs, write the report.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kb_format::{Event, FormatError, Meta, MmapTrace, StreamReader, Strings, VerifySpec};

use crate::engine::{Exec, Feed, ReplayOptions, Replayer, Stats};
use crate::error::{Error, Result};
use crate::npy;
use crate::ops::GemmBackend;
use crate::plane::Owner;
use crate::progress::Progress;
use crate::report::Report;
use crate::verify::{self, TolerancePolicy, plan_checks};

/// Where the trace comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Path(PathBuf),
    Stdin,
}

impl Input {
    /// How errors name it.
    pub fn name(&self) -> String {
        match self {
            Input::Path(p) => p.display().to_string(),
            Input::Stdin => "<stdin>".into(),
        }
    }
}

/// A run's settings (the binary's flags).
#[derive(Debug, Clone)]
pub struct Config {
    pub input: Input,
    pub verify: bool,
    /// `-` for stdout.
    pub report: Option<PathBuf>,
    /// `--expect NAME=FILE.npy`, in order; implies `verify`.
    pub expect: Vec<(String, PathBuf)>,
    pub dump_outputs: Option<PathBuf>,
    pub quiet: bool,
    /// `--allow-unknown` ([`Report::allow_unknown`]).
    pub allow_unknown: bool,
    /// `--atol`, `--rtol`, `--strict-tolerance`: how verified outputs'
    /// tolerances are chosen.
    pub tolerance: TolerancePolicy,
    /// Threads in all (one reads and plans, and helps with the ops);
    /// `None` for every available core.
    pub threads: Option<usize>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    pub options: ReplayOptions,
}

/// A replayed trace.
#[derive(Debug)]
pub struct Loaded {
    pub meta: Meta,
    pub strings: Strings,
    /// `None` when a stream had no verify chunk.
    pub spec: Option<VerifySpec>,
    pub replayer: Replayer,
    pub stats: Stats,
}

/// `mapped`: the mapped trace's bytes, shared, and where they start (tensor
/// data is read there, not copied).
fn on_event(
    feed: &mut Feed,
    ev: Event<'_>,
    bar: &Progress,
    mapped: Option<(&Owner, usize)>,
) -> Result<()> {
    match ev {
        Event::Tensor {
            tensor,
            offset,
            data,
        } => {
            let owner = mapped.map(|(o, base)| (o, (data.as_ptr() as usize).wrapping_sub(base)));
            feed.load_host(tensor, offset, data, owner)?
        }
        Event::Snapshot {
            op_id,
            operand,
            data,
        } => feed.add_snapshot(op_id, operand, data)?,
        Event::Records(c) => {
            feed.push_chunk(c)?;
            bar.update(feed.stats().records, feed.pending_records());
        }
    }
    Ok(())
}

/// Replay a trace file through the memory map (checking the stream digest).
pub fn load_mmap(path: &Path, opts: &ReplayOptions, exec: &Exec) -> Result<Loaded> {
    load_mmap_with(path, opts, exec, &Progress::hidden())
}

fn load_mmap_with(
    path: &Path,
    opts: &ReplayOptions,
    exec: &Exec,
    bar: &Progress,
) -> Result<Loaded> {
    let trace = MmapTrace::open(path)?;
    bar.set_total(trace.footer().counts.records);
    let mut rep = Replayer::new(trace.meta(), opts);
    let owner = trace.shared_bytes();
    let base = trace.bytes().as_ptr() as usize;
    // With threads to spare, the pool checks the host tensors' checksums
    // and the stream digest while this thread reads on: they would
    // otherwise hash tens of MB here while the pool waits for its first
    // window. The digest's verdict is still taken at the end (and a tensor
    // chunk whose check has not run or failed is checked when read, so
    // every error comes in its place).
    let digest = match exec.pool {
        Some(pool) if exec.threads() > 1 => {
            for check in trace.payload_checks(kb_format::chunk::ChunkKind::Tensor) {
                pool.spawn(move || check.run());
            }
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let check = trace.digest_check();
            pool.spawn(move || {
                let _ = tx.send(check.run());
            });
            Some(rx)
        }
        _ => None,
    };
    let stats = rep.replay(exec, |feed| {
        let mut mine = None;
        let res = trace.for_each_event(|ev| {
            on_event(feed, ev, bar, Some((&owner, base))).map_err(|e| match e {
                Error::Format(f) => f,
                e => {
                    mine = Some(e);
                    FormatError::Usage("stopped".into())
                }
            })
        });
        if let Some(e) = mine {
            return Err(e);
        }
        res?;
        // After the chunks, so that damage inside one is reported by its
        // own checksum; this catches the rest (padding). Beside the last
        // window, with its error first.
        feed.finish_beside(trace.strings(), || match digest {
            Some(rx) => Ok(crate::engine::wait(&rx).expect("the digest check ran")?),
            None => Ok(trace.verify_digest()?),
        })
    })?;
    Ok(Loaded {
        meta: trace.meta().clone(),
        strings: trace.strings().clone(),
        spec: Some(trace.verify_spec().clone()),
        replayer: rep,
        stats,
    })
}

/// Replay a trace from a stream, chunk by chunk as it arrives.
pub fn load_stream<R: Read>(r: R, opts: &ReplayOptions, exec: &Exec) -> Result<Loaded> {
    load_stream_with(r, opts, exec, &Progress::hidden())
}

fn load_stream_with<R: Read>(
    r: R,
    opts: &ReplayOptions,
    exec: &Exec,
    bar: &Progress,
) -> Result<Loaded> {
    let mut reader = StreamReader::open(r)?;
    let mut rep = Replayer::new(reader.meta(), opts);
    let stats = rep.replay(exec, |feed| {
        while let Some(ev) = reader.next_event()? {
            on_event(feed, ev, bar, None)?;
        }
        feed.finish(reader.strings())
    })?;
    Ok(Loaded {
        meta: reader.meta().clone(),
        strings: reader.strings().clone(),
        spec: reader.verify_spec().cloned(),
        replayer: rep,
        stats,
    })
}

/// Replay the configured input. Paths to regular files are mapped; pipes
/// and devices (`<(cmd)`, `/dev/stdin`) are streamed.
pub fn load(input: &Input, opts: &ReplayOptions, exec: &Exec) -> Result<Loaded> {
    load_with(input, opts, exec, &Progress::hidden())
}

fn load_with(input: &Input, opts: &ReplayOptions, exec: &Exec, bar: &Progress) -> Result<Loaded> {
    match input {
        Input::Stdin => load_stream_with(std::io::stdin().lock(), opts, exec, bar),
        Input::Path(p) => {
            let md = std::fs::metadata(p).map_err(FormatError::from)?;
            if md.is_file() {
                load_mmap_with(p, opts, exec, bar)
            } else {
                let f = File::open(p).map_err(FormatError::from)?;
                load_stream_with(std::io::BufReader::new(f), opts, exec, bar)
            }
        }
    }
}

/// Threads per available core that `--threads` may ask for: more only
/// adds switching (results are the same for every count).
pub const THREADS_PER_CORE: usize = 4;

/// The most worker threads a run starts: [`THREADS_PER_CORE`] per
/// available core.
pub fn max_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) * THREADS_PER_CORE
}

/// A rayon pool of `threads` workers (every available core for `None`),
/// at most [`max_threads`].
pub fn thread_pool(threads: Option<usize>) -> Result<rayon::ThreadPool> {
    let n = pool_size(threads)?;
    pool_builder(n)
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {n} threads: {e}")))
}

/// A pool of `threads` with the calling thread as its first one (see
/// [`run`]); a pool of its own threads if this thread is in a pool
/// already. Rayon keeps this thread's tie to the pool after the pool is
/// dropped (it is meant for a program's one pool).
fn thread_pool_here(threads: Option<usize>) -> Result<rayon::ThreadPool> {
    let n = pool_size(threads)?;
    pool_builder(n)
        .use_current_thread()
        .build()
        .or_else(|_| pool_builder(n).build())
        .map_err(|e| Error::Usage(format!("cannot start {n} threads: {e}")))
}

fn pool_size(threads: Option<usize>) -> Result<usize> {
    Ok(match threads {
        Some(0) => return Err(Error::Usage("--threads must be at least 1".into())),
        Some(n) => n.min(max_threads()),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

fn pool_builder(n: usize) -> rayon::ThreadPoolBuilder {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("kb-replay-{i}"))
}

/// A file name for a tensor: characters other than ASCII letters, digits,
/// `.`, `_` and `-` become `_`, and a leading `.` becomes `_`.
pub fn dump_name(tensor: &str) -> String {
    let mut s: String = tensor
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s + ".npy"
}

fn dump(dir: &Path, loaded: &Loaded, names: &[String]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    let mut done: Vec<&str> = Vec::new();
    let wanted = names.iter().map(String::as_str).chain(
        loaded
            .meta
            .tensors
            .iter()
            .filter(|t| !t.host_data)
            .map(|t| t.name.as_str()),
    );
    for name in wanted {
        if done.contains(&name) {
            continue;
        }
        done.push(name);
        let Some((idx, t)) = loaded.meta.tensor(name) else {
            continue;
        };
        let bytes = verify::gather_tensor(loaded.replayer.plane(), idx, t)?;
        npy::write(&dir.join(dump_name(name)), t.dtype, &t.shape, &bytes)?;
    }
    Ok(())
}

fn write_report(target: &Path, report: &Report) -> Result<()> {
    let mut text =
        serde_json::to_string_pretty(&report.to_json()).map_err(|e| Error::file(target, e))?;
    text.push('\n');
    if target == Path::new("-") {
        let mut out = std::io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            // A reader that has gone (`--report - | head -1`) took what it
            // wanted: not an error, and the verdict still decides the exit.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => r.map_err(|e| Error::file(Path::new("<stdout>"), e)),
        }
    } else {
        let mut f = kb_format::AtomicFile::create(target)
            .map_err(|e| Error::file(target, e))?
            .remove_on_signal();
        f.write_all(text.as_bytes())
            .and_then(|_| f.commit())
            .map_err(|e| Error::file(target, e))
    }
}

/// Run everything the config asks for. `Ok` carries the report (its
/// `pass()` says whether verification passed); `Err` is exit code 2.
pub fn run(cfg: &Config, backend: &dyn GemmBackend) -> Result<Report> {
    let start = Instant::now();
    // Reference files first: a typo should not cost a replay.
    let mut expect: Vec<(String, PathBuf, npy::NpyArray)> = Vec::with_capacity(cfg.expect.len());
    for (name, path) in &cfg.expect {
        if let Some((_, first, _)) = expect.iter().find(|(n, _, _)| n == name) {
            return Err(Error::Usage(format!(
                "--expect names tensor {name:?} twice ({} and {}); give one reference per tensor",
                first.display(),
                path.display()
            )));
        }
        expect.push((name.clone(), path.clone(), npy::read(path)?));
    }
    let pool = thread_pool_here(cfg.threads)?;
    if let Some(n) = cfg.threads.filter(|&n| n > max_threads())
        && !cfg.quiet
    {
        crate::say!(
            "kb-replay: --threads {n} capped at {} ({THREADS_PER_CORE} per available core)",
            max_threads()
        );
    }
    let exec = Exec {
        backend,
        pool: Some(&pool),
    };
    let bar = Progress::new(cfg.progress);
    // On one of the pool's threads (this one, normally): it decodes and
    // plans, and works on the running window whenever it waits for it
    // (`engine::wait`), so `--threads N` is N threads in all, never one
    // more than the cores. (This thread's heap, the process's main one,
    // grows in large steps: pool threads grow theirs a page at a time.)
    let loaded = pool.install(|| load_with(&cfg.input, &cfg.options, &exec, &bar));
    bar.clear();
    let loaded = loaded?;
    let stats = loaded.stats.clone();
    let verifying = cfg.verify || !expect.is_empty();
    if !verifying && cfg.tolerance != TolerancePolicy::default() && !cfg.quiet {
        crate::say!(
            "kb-replay: --atol, --rtol and --strict-tolerance apply to verification; without --verify or --expect they do nothing"
        );
    }
    let checks = plan_checks(loaded.spec.as_ref(), expect);
    let outputs = if verifying {
        if checks.is_empty() {
            return Err(Error::Trace(
                "nothing to verify: the trace's verify spec lists no outputs and no --expect was given"
                    .into(),
            ));
        }
        // A misspelt tensor or dtype would silently change nothing.
        let names: Vec<&str> = checks.iter().map(|c| c.tensor.as_str()).collect();
        let unknown = cfg.tolerance.unknown_targets(&names);
        if let Some(name) = unknown.first() {
            return Err(Error::Usage(format!(
                "--atol/--rtol {name}=...: {name} is neither an output this run verifies ({}) nor a dtype (f32, f16, bf16, i8, i32, u8)",
                names.join(", ")
            )));
        }
        // References evaluate on the replay's threads (results do not
        // depend on how many).
        let bar = Progress::verifying(cfg.progress);
        let tell = |i: usize, name: &str| {
            bar.message(format!(
                "output {} of {}, {name}: its f64 reference",
                i + 1,
                checks.len()
            ))
        };
        let outputs = pool.install(|| {
            verify::verify_with(
                loaded.replayer.plane(),
                &loaded.meta,
                &checks,
                &cfg.tolerance,
                tell,
            )
        });
        bar.clear();
        Some(outputs?)
    } else {
        None
    };
    if let Some(dir) = &cfg.dump_outputs {
        let names: Vec<String> = checks.iter().map(|c| c.tensor.clone()).collect();
        dump(dir, &loaded, &names)?;
    }
    let report = Report {
        trace: cfg.input.name(),
        stats,
        outputs,
        wall_seconds: start.elapsed().as_secs_f64(),
        backend: backend.name().to_string(),
        threads: exec.threads(),
        fingerprints: cfg.options.fingerprints.name().to_string(),
        allow_unknown: cfg.allow_unknown,
    };
    if let Some(target) = &cfg.report {
        write_report(target, &report)?;
    }
    // --quiet keeps the FAIL lines: a failure is never silent.
    let lines = if cfg.quiet {
        report.failures()
    } else {
        report.summary()
    };
    // The verdict is the command's result: stdout (`| grep PASS`), and
    // diagnostics stay on stderr. With `--report -` stdout is the JSON
    // report, so the lines go to stderr instead. A reader that has gone
    // (`| grep -q PASS`) is not an error: the exit code still says it.
    if cfg.report.as_deref() == Some(Path::new("-")) {
        let mut err = std::io::stderr().lock();
        for line in lines {
            let _ = writeln!(err, "{line}");
        }
    } else {
        let mut out = std::io::stdout().lock();
        for line in lines {
            if writeln!(out, "{line}").is_err() {
                break;
            }
        }
        let _ = out.flush();
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_names_are_safe_file_names() {
        assert_eq!(dump_name("out"), "out.npy");
        assert_eq!(dump_name("layer0/w q"), "layer0_w_q.npy");
        assert_eq!(dump_name("../etc"), "_.._etc.npy");
        assert_eq!(dump_name(""), "_.npy");
    }
}
