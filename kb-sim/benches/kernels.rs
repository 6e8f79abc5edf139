//! Kernel benchmarks (not timed tests): `cargo bench -p kb-sim --bench kernels`.
//! scripts/bench-kernels.sh runs this beside the SimPy + greenlet peer
//! (shared/peer/simpy_greenlet_ref.py) and greenlet's own switch time.
//!
//! - handshake: one kernel -> simulation -> kernel round trip per executor;
//! - kernel ops/s on the peer's workload shape: 64 PEs each looping 200
//!   times load 128x128 f16 -> (branch on a loaded value) -> dot -> store.

use std::sync::Arc;
use std::time::Instant;

use kb_format::{Dtype, Meta, TraceWriter, VerifySpec};
use kb_sim::engine::Engine;
use kb_sim::kernel::{self, Block, Executor, KernelArgs, KernelBody, Port, Tl};
use kb_sim::machine::Machine;
use kb_sim::program::{Command, PeProgram, Reply};
use kb_sim::runtime::{Runtime, Sharding};
use kb_sim::topology::Topology;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn handshake(ex: Executor) -> f64 {
    const N: u32 = 200_000;
    let samples: Vec<f64> = (0..7)
        .map(|_| {
            let body: KernelBody = Box::new(|port: &mut dyn Port| {
                for _ in 0..N {
                    port.call(Command::WaitAll);
                }
            });
            let mut p = ex.spawn("bench".into(), body).unwrap();
            p.resume(Reply::Go).unwrap();
            let t = Instant::now();
            for _ in 1..N {
                p.resume(Reply::Done).unwrap();
            }
            let ns = t.elapsed().as_nanos() as f64 / (N - 1) as f64;
            p.resume(Reply::Done).unwrap();
            ns
        })
        .collect();
    median(samples)
}

fn peer_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    for _ in 0..args.get("iters") {
        let a = tl.load(Block::in_shard(x, sx, 0, 0, 128, 128));
        if a.get(0, 0) > -1.0 {
            let h = tl.dot(&a, &a, None);
            tl.store(Block::in_shard(y, sy, 0, 0, 128, 128), &h);
        }
    }
}

/// CPU seconds the calling thread has run, from Linux's
/// /proc/thread-self/schedstat (nanoseconds); None elsewhere. The peers
/// print their CPU time too: on a loaded machine wall time measures the
/// load as much as the simulator.
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

/// Returns (kernel ops, simulated events, wall seconds, CPU seconds of
/// this thread, where known).
fn peer_workload(ex: Executor, iters: u64) -> (u64, u64, f64, Option<f64>) {
    let mut topo = Topology::load("default").unwrap();
    topo.counts.cubes_per_sip = 8; // 1 x 8 x 8 = 64 PEs
    let m = Machine::build(&topo);
    let mut rt = Runtime::new(&m);
    let n = 64 * 128;
    let data: Vec<u8> = (0..n * 128)
        .flat_map(|i| half::f16::from_f32((i % 7) as f32).to_le_bytes())
        .collect();
    let x = rt
        .tensor("x", Dtype::F16, [n as u64, 128], Some(data), Sharding::ROWS)
        .unwrap();
    let y = rt
        .tensor("y", Dtype::F32, [n as u64, 128], None, Sharding::ROWS)
        .unwrap();
    let args = rt.kernel_args(&[x, y]).scalar("iters", iters);
    let args = Arc::new(args);
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for (i, pe) in m.pes().collect::<Vec<_>>().into_iter().enumerate() {
        let body = kernel::body(peer_kernel, args.clone(), pe, i as u32, 64, rt.take_tcm(pe));
        programs.push(ex.spawn(format!("peer[{i}]"), body).unwrap());
    }
    // KB_BENCH_TRACE=FILE writes the trace there (to compare two builds'
    // traces byte for byte); otherwise it is encoded and dropped. One
    // writer type either way: a second instantiation of the engine changes
    // what the compiler inlines into the event loop (the queue's `pop` was
    // left out of line, +5 % instructions).
    let out: Box<dyn std::io::Write> = match std::env::var_os("KB_BENCH_TRACE") {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).unwrap(),
        )),
        None => Box::new(std::io::sink()),
    };
    let (stats, wall, cpu) = run_engine(&m, out, &rt, programs);
    // Kernel ops: the peer counts load, gemm and store records; ours also
    // include the host's deploy writes, which we leave out.
    let kernel_ops = 3 * 64 * iters;
    assert!(stats.records >= kernel_ops);
    (kernel_ops, stats.events, wall, cpu)
}

/// Run the engine over `programs`, writing the trace to `out`; returns
/// its stats, wall seconds and CPU seconds of this thread (where known).
fn run_engine(
    m: &Machine,
    out: Box<dyn std::io::Write>,
    rt: &Runtime,
    programs: Vec<Box<dyn PeProgram>>,
) -> (kb_sim::engine::RunStats, f64, Option<f64>) {
    let writer = TraceWriter::new(out, &Meta::default()).unwrap();
    let t = Instant::now();
    let cpu0 = thread_cpu_s();
    let (w, stats) = Engine::new(m, writer, &rt.tensors, programs).run().unwrap();
    w.finish(&VerifySpec::default()).unwrap();
    let wall = t.elapsed().as_secs_f64();
    let cpu = cpu0.zip(thread_cpu_s()).map(|(a, b)| b - a);
    (stats, wall, cpu)
}

fn executors() -> Vec<Executor> {
    // KB_EXECUTOR=coroutine|thread limits the run to one (for profiling).
    match std::env::var("KB_EXECUTOR")
        .ok()
        .and_then(|s| Executor::parse(&s))
    {
        Some(e) => vec![e],
        None => vec![Executor::Coroutine, Executor::Thread],
    }
}

fn main() {
    for ex in executors() {
        println!(
            "handshake round trip, {ex:?} executor: {:.1} ns (median of 7 x 200000)",
            handshake(ex)
        );
    }
    // KB_BENCH_RUNS=n repeats the workload n times (default 3; more for
    // profiling).
    let repeats = std::env::var("KB_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    for ex in executors() {
        let runs: Vec<(u64, u64, f64, Option<f64>)> =
            (0..repeats).map(|_| peer_workload(ex, 200)).collect();
        let wall = median(runs.iter().map(|r| r.2).collect());
        let (ops, events, _, _) = runs[0];
        println!(
            "peer workload (64 PEs x 200 x load 128x128 f16 -> dot -> store), {ex:?}: {ops} kernel ops, {events} events in {wall:.3} s: kernel_ops_per_s={:.0}",
            ops as f64 / wall
        );
        // The coroutine executor runs everything on this thread; the
        // thread executor's kernels run on others, so its CPU figure
        // would leave them out.
        if ex == Executor::Coroutine
            && let Some(cpu) = runs.iter().map(|r| r.3).collect::<Option<Vec<f64>>>()
        {
            let cpu = median(cpu);
            println!(
                "peer workload CPU, {ex:?}: {cpu:.3} s on the simulation thread: kernel_ops_per_cpu_s={:.0}",
                ops as f64 / cpu
            );
        }
    }
}
