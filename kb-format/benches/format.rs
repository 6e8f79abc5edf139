//! Throughput benchmarks of the trace container (not timed tests).
//!
//! Run with `cargo bench -p kb-format` (optionally `-- N RUNS` to change the
//! record count and the number of runs). Each figure is the median of RUNS
//! runs, timed with `std::time::Instant`. BENCHMARKS.md records the figures.
//!
//! Workload: DMA-like memory records, as kb-sim writes them: one read and one
//! write extent (a quarter of them strided), a fingerprint, `Memory` params,
//! start times that grow with the op id but jitter by up to 5 records, so the
//! writer's reorder buffer has real work; `advance` after every push with the
//! tightest watermark the workload allows.

use std::hint::black_box;
use std::io;
use std::time::{Duration, Instant};

use kb_format::chunk::{BLOCK, ChunkHeader};
use kb_format::record_codec::RecordEncoder;
use kb_format::*;

const STEP_PS: u64 = 1000;

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The i-th record of the workload (string ids assume 16 components and
/// 2 op names interned first).
fn dma_record(i: u64) -> Record {
    let h = splitmix(i);
    let t_start = i * STEP_PS + h % (5 * STEP_PS);
    let dur = 400 + (h >> 16) % 4000;
    let lane = (h >> 32) % 16;
    let strided = (h >> 40) & 3 == 0;
    let (rows, row_bytes) = if strided { (32u32, 128u64) } else { (1, 4096) };
    let src = 0x0001_0000_0000_0000 | (lane << 39) | ((i * 4096) & 0x3_ffff_ffff);
    let dst = 0x0002_0000_0000_0000 | (lane << 39) | ((i * 64) & 0xf_ffff);
    let extent = |pa: u64, stride: u64| {
        if rows > 1 {
            Extent {
                pa,
                len: row_bytes,
                rows,
                stride,
            }
        } else {
            Extent::contiguous(pa, row_bytes)
        }
    };
    Record {
        op_id: i,
        t_start,
        t_end: t_start + dur,
        component: lane as u32,
        op_name: 16 + (h >> 44) as u32 % 2,
        kind: OpKind::Memory,
        params: Params::Memory(MemoryParams {
            src: Addr {
                space: Space::Hbm,
                addr: src,
            },
            dst: Addr {
                space: Space::Tcm,
                addr: dst,
            },
            rows,
            row_bytes,
            src_stride: if rows > 1 { 1024 } else { row_bytes },
            dst_stride: row_bytes,
            dtype: Some(Dtype::F16),
        }),
        deps: Vec::new(),
        fingerprint: Some(splitmix(h)),
        read: Some(Effect {
            time: t_start + 100,
            seq: 2 * i,
            ranges: vec![extent(src, 1024)],
        }),
        write: Some(Effect {
            time: t_start + dur,
            seq: 2 * i + 1,
            ranges: vec![extent(dst, row_bytes)],
        }),
        active: None,
    }
}

fn meta() -> Meta {
    Meta {
        tool: "kb-format bench".into(),
        ..Default::default()
    }
}

/// Write `n` workload records into `out` and return it with the counts.
fn write_trace<W: io::Write>(out: W, n: u64) -> (W, u64) {
    let mut w = TraceWriter::new(out, &meta()).expect("writer");
    for c in 0..16 {
        w.intern(&format!("sip0.cube{c}.pe0.pe_dma"));
    }
    w.intern("dma_read");
    w.intern("dma_write");
    for i in 0..n {
        w.push(dma_record(i)).expect("push");
        // Records pushed later start at or after (i + 1) * STEP_PS.
        w.advance((i + 1) * STEP_PS).expect("advance");
    }
    let bytes = w.bytes_written();
    let out = w.finish(&VerifySpec::default()).expect("finish");
    (out, bytes)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// CPU time this thread has run, from /proc/thread-self/schedstat (Linux);
/// `None` elsewhere. On a shared machine it leaves out the time other
/// processes held the core, which wall time does not.
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Median wall time and median thread CPU time of `runs` runs of `f`.
struct Timing {
    wall: Duration,
    cpu: Option<Duration>,
}

fn time_runs(runs: usize, mut f: impl FnMut()) -> Timing {
    // One warm-up run, not counted.
    f();
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..runs {
        let c = thread_cpu();
        let t = Instant::now();
        f();
        wall.push(t.elapsed());
        if let (Some(c0), Some(c1)) = (c, thread_cpu()) {
            cpu.push(c1 - c0);
        }
    }
    Timing {
        wall: median(wall),
        cpu: (cpu.len() == runs).then(|| median(cpu)),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; take the first two numbers given.
    let nums: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    // Words select sections (a0, a, b, h); none selects all.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a.parse::<u64>().is_err())
        .collect();
    let on = |s: &str| words.is_empty() || words.iter().any(|w| w == s);
    let n = nums.first().copied().unwrap_or(5_000_000);
    let runs = nums.get(1).copied().unwrap_or(5) as usize;
    println!("kb-format benchmarks: {n} DMA-like memory records, median of {runs} runs\n");

    let mem_per_record = (std::mem::size_of::<Record>() + 2 * std::mem::size_of::<Extent>()) as f64;
    println!(
        "in-memory size: {mem_per_record} bytes/record (size_of::<Record>() = {} + 2 heap extents of {})\n",
        std::mem::size_of::<Record>(),
        std::mem::size_of::<Extent>()
    );

    // (c) the workload written to a file: encoded size.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bench.kbt");
    let mut f = AtomicFile::create(&path).expect("create");
    write_trace(&mut f, n);
    f.commit().expect("commit");
    let file_len = std::fs::metadata(&path).expect("stat").len();
    let m = MmapTrace::open(&path).expect("open");
    let mut payload = 0u64;
    for e in m.record_chunks() {
        let b: &[u8; BLOCK] = m.bytes()[e.offset as usize..e.offset as usize + BLOCK]
            .try_into()
            .expect("64 bytes");
        payload += ChunkHeader::decode(b, e.offset, None).expect("header").len;
    }
    let per_record = payload as f64 / n as f64;
    println!(
        "(c) encoded size: {per_record:.2} bytes/record ({payload} bytes of records payloads; \
         trace file {file_len} bytes, {:.2} bytes/record)\n",
        file_len as f64 / n as f64
    );
    // (a0) encoder alone: RecordEncoder::push of pre-built records.
    // The pool is in (t_start, op_id) order; the encoder starts a new chunk
    // when it wraps around, as a real chunk would when it fills up.
    let mut pool: Vec<Record> = (0..4096).map(dma_record).collect();
    pool.sort_by_key(|r| (r.t_start, r.op_id));
    if on("a0") {
        let d = time_runs(runs, || {
            let mut enc = RecordEncoder::default();
            for i in 0..n as usize {
                let j = i % pool.len();
                if j == 0 || enc.len() >= 64 << 10 {
                    black_box(enc.len());
                    enc.reset();
                }
                enc.push(black_box(&pool[j]));
            }
            black_box(enc.len());
        });
        report(
            "(a0) RecordEncoder::push only (pre-built records)",
            n,
            d,
            per_record,
            mem_per_record,
        );
    }

    // (a) writer end to end: build each record, push, advance, finish.
    if on("a") {
        let d = time_runs(runs, || {
            let (_, bytes) = write_trace(io::sink(), n);
            black_box(bytes);
        });
        report(
            "(a) TraceWriter to io::sink() (record construction included)",
            n,
            d,
            per_record,
            mem_per_record,
        );
    }

    // (b) mmap reader over that file.
    if on("b") {
        let d = time_runs(runs, || {
            let mut count = 0u64;
            let mut sum = 0u64;
            m.for_each_record(|r, _| {
                count += 1;
                sum = sum.wrapping_add(r.t_end);
                Ok(())
            })
            .expect("read");
            assert_eq!(count, n);
            black_box(sum);
        });
        report(
            "(b) MmapTrace::for_each_record (decode + checks)",
            n,
            d,
            per_record,
            mem_per_record,
        );
        let d = time_runs(runs, || {
            let m = MmapTrace::open(&path).expect("open");
            m.verify_digest().expect("digest");
        });
        println!(
            "(b2) MmapTrace::open + verify_digest: wall {:.3} s, {:.0} MB/s of file\n",
            d.wall.as_secs_f64(),
            file_len as f64 / d.wall.as_secs_f64() / 1e6
        );
    }

    // (h) fingerprints: kb-format's xxh3 (twox-hash, AVX2 picked at run
    // time) against xxhash-rust's (SSE2, chosen at compile time), one-shot
    // and fed in 1 KiB pieces (a strided tile's rows), on data in cache.
    if on("h") {
        println!("(h) fingerprint throughput (GB/s, best of {runs} runs of 256 MiB):");
        for size in [32 << 10, 256 << 10, 4 << 20] {
            let data: Vec<u8> = (0..size)
                .map(|i| (splitmix(i as u64) >> 56) as u8)
                .collect();
            let reps = (256 << 20) / size;
            let gbs = |f: &dyn Fn(&[u8]) -> u64| {
                assert_eq!(f(&data), xxhash_rust::xxh3::xxh3_64(&data));
                let mut best = f64::MAX;
                for _ in 0..runs.max(1) {
                    let t = Instant::now();
                    for _ in 0..reps {
                        black_box(f(black_box(&data)));
                    }
                    best = best.min(t.elapsed().as_secs_f64());
                }
                (reps * size) as f64 / best / 1e9
            };
            let ours = gbs(&|d| fingerprint(d));
            let theirs = gbs(&|d| xxhash_rust::xxh3::xxh3_64(d));
            let ours_pieces = gbs(&|d| {
                let mut h = Fingerprinter::new();
                d.chunks(1024).for_each(|c| h.update(c));
                h.digest()
            });
            let theirs_pieces = gbs(&|d| {
                let mut h = xxhash_rust::xxh3::Xxh3Default::new();
                d.chunks(1024).for_each(|c| h.update(c));
                h.digest()
            });
            println!(
                "    {:>5} KiB: one-shot {ours:.1} (xxhash-rust {theirs:.1}); \
                 1 KiB pieces {ours_pieces:.1} (xxhash-rust {theirs_pieces:.1})",
                size >> 10
            );
        }
    }
}

fn report(what: &str, n: u64, t: Timing, enc_per_record: f64, mem_per_record: f64) {
    println!("{what}:");
    let line = |label: &str, d: Duration| {
        let s = d.as_secs_f64();
        println!(
            "    {label}: {s:.3} s = {:.2} M records/s, {:.0} MB/s of encoded record bytes, \
             {:.0} MB/s of in-memory record data",
            n as f64 / s / 1e6,
            n as f64 * enc_per_record / s / 1e6,
            n as f64 * mem_per_record / s / 1e6
        );
    };
    line("wall", t.wall);
    if let Some(c) = t.cpu {
        line("cpu ", c);
    }
    println!();
}
