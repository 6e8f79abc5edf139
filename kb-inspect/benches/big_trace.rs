//! Benchmark: `summary` and `stats` over a 10-million-record trace.
//!
//! `cargo bench -p kb-inspect` generates the trace with `TraceWriter` (once;
//! kept in target/kb-inspect-bench/ and reused while its size matches), then
//! runs each command in a fresh child process of this binary so the
//! child's peak memory is the command's own: it prints wall time, the peak
//! of RssAnon (resident anonymous memory, i.e. beyond the file map; sampled
//! from /proc/self/status every 2 ms by a thread) and VmHWM (peak resident,
//! file-backed map pages included). Targets: <= 2 s and <= 100 MB beyond
//! the map.
//!
//! Also `export` to Parquet and `timeline --format perfetto` (issue 18:
//! <= 10 s and <= 200 MB for the export; a Perfetto trace under 500 MB),
//! printing the size written; `timeline-json` on request.
//!
//! Environment: KB_BENCH_RECORDS (default 10 000 000), KB_BENCH_TRACE
//! (trace path to use instead of the generated one), KB_BENCH_CMDS
//! (comma-separated commands to run, e.g. `export-parquet,timeline-json`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kb_format::*;
use kb_inspect::{Input, export, stats, summary, timeline};

const CHILD: &str = "KB_INSPECT_BENCH_CHILD";

fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A trace shaped like a simulator run: 2 SIPs x 4 cubes x 8 PEs, each PE
/// with a DMA engine (pipelined, overlapping ops), a GEMM unit and a
/// vector unit; ~70% memory ops with read and write effects, 20% gemm,
/// 10% math.
fn generate(path: &Path, n: u64) {
    let t = Instant::now();
    let meta = Meta {
        tool: "kb-inspect-bench".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        benchmark: "synthetic".into(),
        ..Default::default()
    };
    let f = AtomicFile::create(path).unwrap();
    let mut w = TraceWriter::new(f, &meta).unwrap();
    let mut comps = Vec::new();
    for sip in 0..2 {
        for cube in 0..4 {
            for pe in 0..8 {
                let p = format!("sip{sip}.cube{cube}.pe{pe}");
                comps.push([
                    w.intern(&format!("{p}.pe_dma")),
                    w.intern(&format!("{p}.gemm")),
                    w.intern(&format!("{p}.vec")),
                ]);
            }
        }
    }
    let names = [
        w.intern("dma_read"),
        w.intern("dma_write"),
        w.intern("gemm_f16"),
        w.intern("exp"),
    ];
    let units = comps.len() as u64;
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for id in 0..n {
        // Ops start 1 ns apart per unit group; DMAs last 3-5 ns (overlap).
        let t0 = id * 100;
        let unit = (id % units) as usize;
        let x = next() % 10;
        let (kind, comp, name, dur) = match x {
            0..=6 => (
                OpKind::Memory,
                comps[unit][0],
                names[(x & 1) as usize],
                3000 + next() % 2000,
            ),
            7 | 8 => (OpKind::Gemm, comps[unit][1], names[2], 2000),
            _ => (OpKind::Math, comps[unit][2], names[3], 500),
        };
        let pa = 0x1_0000_0000_0000 + (next() % (1 << 30)) * 64;
        let params = match kind {
            OpKind::Memory => Params::Memory(MemoryParams {
                src: Addr {
                    space: Space::Hbm,
                    addr: pa,
                },
                dst: Addr {
                    space: Space::Tcm,
                    addr: 0x4000,
                },
                rows: 1,
                row_bytes: 4096,
                src_stride: 4096,
                dst_stride: 4096,
                dtype: Some(Dtype::F16),
            }),
            OpKind::Gemm => Params::Gemm(GemmParams {
                a: Addr::default(),
                b: Addr::default(),
                out: Addr::default(),
                acc: None,
                m: 64,
                k: 64,
                n: 64,
                dtype_in: Dtype::F16,
                dtype_acc: Dtype::F32,
                dtype_out: Dtype::F16,
                transpose_a: false,
                transpose_b: false,
                layout_a: Layout::RowMajor,
                layout_b: Layout::RowMajor,
                layout_out: Layout::RowMajor,
            }),
            _ => Params::Math(MathParams {
                op: MathOp::Exp,
                inputs: vec![MathInput::Tile {
                    addr: Addr::default(),
                    rows: 64,
                    cols: 64,
                    dtype: Dtype::F32,
                }],
                out: Addr::default(),
                rows: 64,
                cols: 64,
                dtype: Dtype::F32,
                axis: None,
            }),
        };
        w.push(Record {
            op_id: id,
            t_start: t0,
            t_end: t0 + dur,
            component: comp,
            op_name: name,
            kind,
            params,
            deps: if id >= units {
                vec![kb_format::Dep::data(id - units)]
            } else {
                vec![]
            },
            fingerprint: (kind == OpKind::Memory).then(&mut next),
            read: Some(Effect {
                time: t0,
                seq: 2 * id,
                ranges: vec![Extent::contiguous(pa, 4096)],
            }),
            write: Some(Effect {
                time: t0 + dur,
                seq: 2 * id + 1,
                ranges: vec![Extent::contiguous(
                    0x2_0000_0000_0000 + unit as u64 * 65536,
                    4096,
                )],
            }),
            active: None,
        })
        .unwrap();
        if id % 4096 == 0 {
            w.advance(t0).unwrap();
        }
    }
    let f = w.finish(&VerifySpec::default()).unwrap();
    f.commit().unwrap();
    eprintln!(
        "generated {} ({n} records, {:.1} MB) in {:.1} s",
        path.display(),
        std::fs::metadata(path).unwrap().len() as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
}

/// Samples RssAnon every 2 ms; returns the peak in KiB when stopped.
struct AnonPeak {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl AnonPeak {
    fn start() -> AnonPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            while !s.load(Ordering::Relaxed) {
                peak = peak.max(status_kib("RssAnon:").unwrap_or(0));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak.max(status_kib("RssAnon:").unwrap_or(0))
        });
        AnonPeak { stop, handle }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

fn child(cmd: &str, path: &Path) {
    let input = Input::Path(path.to_path_buf());
    let sampler = AnonPeak::start();
    let t = Instant::now();
    let what = match cmd {
        "summary" => {
            let s = summary::summarize(&input).unwrap();
            format!("{} records", s.records)
        }
        "stats" => {
            let s = stats::compute(&input, stats::GroupBy::Component).unwrap();
            format!("{} groups", s.rows.len())
        }
        "stats-op_kind" => {
            let s = stats::compute(&input, stats::GroupBy::OpKind).unwrap();
            format!("{} groups", s.rows.len())
        }
        "summary-stdin" => {
            // One pass over a stream (the trace file as a reader).
            let f = std::fs::File::open(path).unwrap();
            let mut acc = kb_inspect::source::Records(|_: &Record, _: &Strings| {
                Ok(kb_inspect::Flow::Continue)
            });
            kb_inspect::source::visit_reader("stream", f, &mut acc).unwrap();
            "stream pass".to_string()
        }
        "export-parquet" | "timeline-perfetto" | "timeline-json" => {
            let out = path.with_extension(match cmd {
                "export-parquet" => "parquet",
                "timeline-perfetto" => "pftrace",
                _ => "json",
            });
            let f = kb_inspect::ops::Filter::default();
            match cmd {
                "export-parquet" => {
                    export::run(&input, &f, export::Format::Parquet, &out).unwrap();
                }
                "timeline-perfetto" => {
                    timeline::run(&input, &f, timeline::Format::Perfetto, &out).unwrap();
                }
                _ => {
                    timeline::run(&input, &f, timeline::Format::Json, &out).unwrap();
                }
            }
            let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            let _ = std::fs::remove_file(&out);
            format!("{:.1} MB written", size as f64 / 1e6)
        }
        _ => panic!("unknown bench command {cmd}"),
    };
    let secs = t.elapsed().as_secs_f64();
    let anon = sampler.finish();
    println!(
        "{cmd:14} {secs:6.3} s  peak RssAnon {:6.1} MiB (beyond the map)  VmHWM {:7.1} MiB (map pages included)  ({what})",
        anon as f64 / 1024.0,
        status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0,
    );
}

fn main() {
    if let Ok(cmd) = std::env::var(CHILD) {
        let path = std::env::var("KB_BENCH_TRACE").unwrap();
        child(&cmd, Path::new(&path));
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench targets without --bench:
        // generating a 10M-record trace is for `cargo bench` only.
        println!("big_trace: skipped (run with cargo bench -p kb-inspect)");
        return;
    }
    let n: u64 = std::env::var("KB_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let path = match std::env::var("KB_BENCH_TRACE") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kb-inspect-bench");
            std::fs::create_dir_all(&dir).unwrap();
            let p = dir.join(format!("bench-{n}.kbt"));
            if !p.exists() {
                generate(&p, n);
            }
            p
        }
    };
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "trace {} ({:.1} MB); each line is a fresh process",
        path.display(),
        size as f64 / 1e6
    );
    let exe = std::env::current_exe().unwrap();
    let cmds: Vec<String> = match std::env::var("KB_BENCH_CMDS") {
        Ok(v) => v.split(',').map(str::to_string).collect(),
        Err(_) => [
            "summary",
            "stats",
            "stats-op_kind",
            "summary-stdin",
            "export-parquet",
            "timeline-perfetto",
        ]
        .map(String::from)
        .to_vec(),
    };
    for cmd in &cmds {
        // Twice: the first run may read the file from disk, the second
        // finds it in the page cache.
        for _ in 0..2 {
            let st = Command::new(&exe)
                .env(CHILD, cmd)
                .env("KB_BENCH_TRACE", &path)
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
}
