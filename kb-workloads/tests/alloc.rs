//! Issue 14: no allocation in kb-sim's steady-state hot path. A counting
//! global allocator measures the heap allocations of a run at two sizes
//! of the same workload; setup (topology, tensors, routes, pools) is
//! about the same in both, so the extra allocations over the extra
//! records are what each record costs in steady state. A per-record
//! `Vec` (an effect, a group, a snapshot) makes it 1 or more.
//!
//! Counters are per thread: tests run in parallel, and the coroutine
//! executor runs kernels on the simulation thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use kb_format::{Dtype, Meta, TraceWriter, VerifySpec};
use kb_sim::engine::{Engine, RacePolicy};
use kb_sim::kernel::{self, Block, Executor, KernelArgs, Tl};
use kb_sim::machine::Machine;
use kb_sim::program::PeProgram;
use kb_sim::run::{RunConfig, run};
use kb_sim::runtime::{Runtime, Sharding};
use kb_sim::topology::Topology;
use kb_workloads::GemmTiled;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down has no counter left.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is a
// const-initialised thread-local `Cell` (no allocation, no destructor).
// A global allocator cannot be written without `unsafe`; it exists only
// in this test binary.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, size) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread by `f`, with the records it reports.
fn counted(f: impl FnOnce() -> u64) -> (u64, u64) {
    let before = ALLOCS.with(Cell::get);
    let records = f();
    (ALLOCS.with(Cell::get) - before, records)
}

/// Allocations per extra record between a run of `small` and one of
/// `large`, printed with both runs' figures.
/// Asserts that the larger run allocated fewer than `bound` times per
/// record it made beyond the smaller one.
fn assert_per_extra_record(what: &str, small: (u64, u64), large: (u64, u64), bound: f64) {
    let (a0, r0) = small;
    let (a1, r1) = large;
    assert!(r1 > 2 * r0, "{what}: the larger run has many more records");
    let per = a1.saturating_sub(a0) as f64 / (r1 - r0) as f64;
    eprintln!(
        "{what}: {a0} allocations for {r0} records, {a1} for {r1}: {per:.3} per extra record"
    );
    assert!(
        per < bound,
        "{what}: {per:.3} allocations per record (bound {bound})"
    );
}

fn gemm_tiled(k: u64, races: RacePolicy) -> u64 {
    gemm_tiled_on("default", 512, k, races)
}

/// gemm_tiled m = n = `mn`, `k`, f32, on `topo`.
fn gemm_tiled_on(topo: &str, mn: u64, k: u64, races: RacePolicy) -> u64 {
    let cfg = RunConfig {
        topology: Topology::load(topo).unwrap(),
        params: [("m", mn), ("n", mn), ("k", k)]
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .chain([("dtype".to_string(), "f32".to_string())])
            .collect(),
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races,
        command_line: vec![],
        max_memory: None,
    };
    let (_, report) = run(&cfg, &GemmTiled, std::io::sink()).unwrap();
    report.stats.records
}

/// The most a record may allocate in steady state. Each DMA and compute
/// op used to allocate about 10 times (effects, groups, snapshots); one
/// `Vec` per compute op, the rarest kind here, would add a third.
const BOUND: f64 = 0.25;

/// With the race detector on, what its shadow keeps grows with the run:
/// one read per distinct tile a PE loaded, until the host waits (a longer
/// K loop loads more distinct tiles of A and B), so its buckets' vectors
/// grow. That is state, not a per-record cost; this bound keeps it under
/// one allocation per record.
const BOUND_WITH_RACES: f64 = 1.0;

#[test]
fn gemm_tiled_allocates_almost_nothing_per_record() {
    // A longer K loop: more loads and dots over the same output tiles.
    // What is left without the race detector is the fingerprint cache
    // filling its slots (at most 8192 in a run).
    for (races, bound) in [
        (RacePolicy::Off, BOUND),
        (RacePolicy::Warn, BOUND_WITH_RACES),
    ] {
        let small = counted(|| gemm_tiled(256, races));
        let large = counted(|| gemm_tiled(1024, races));
        let what = format!("gemm_tiled 512x512 f32, k 256 -> 1024, races {races:?}");
        assert_per_extra_record(&what, small, large, bound);
    }
}

/// Edge tiles: m = n = 1000 is no multiple of the 64-row tiles on
/// `large`'s PEs, so loads are masked (a padded tile of the kernel's own
/// bytes, a fill op).
#[test]
fn masked_tiles_allocate_almost_nothing_per_record() {
    let small = counted(|| gemm_tiled_on("large", 1000, 256, RacePolicy::Off));
    let large = counted(|| gemm_tiled_on("large", 1000, 1024, RacePolicy::Off));
    let what = "gemm_tiled 1000x1000 f32 on large, k 256 -> 1024, races Off";
    assert_per_extra_record(what, small, large, BOUND);
}

/// The kernel benchmark's shape (kb-sim/benches/kernels.rs): every PE
/// loops load 128x128 f16 -> dot -> store.
fn peer_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    for _ in 0..args.get("iters") {
        let a = tl.load(Block::in_shard(x, sx, 0, 0, 128, 128));
        let h = tl.dot(&a, &a, None);
        tl.store(Block::in_shard(y, sy, 0, 0, 128, 128), &h);
    }
}

/// Math ops in a loop: unary, binary, a reduction and a broadcast.
fn math_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    for _ in 0..args.get("iters") {
        let a = tl.load(Block::in_shard(x, sx, 0, 0, 128, 128));
        let e = tl.exp(&a);
        let s = tl.add(&e, &a);
        let r = tl.sum(&s, 1);
        let t = tl.add(&s, &r);
        tl.store(Block::in_shard(y, sy, 0, 0, 128, 128), &t);
    }
}

/// `kernel` on every PE of `default`, `iters` times round its loop, with
/// x (f16) and y (`y_dtype`) 128 rows per PE.
fn kernel_loop(kernel: fn(&mut Tl<'_>, &KernelArgs), y_dtype: Dtype, iters: u64) -> u64 {
    let topo = Topology::load("default").unwrap();
    let m = Machine::build(&topo);
    let pes: Vec<_> = m.pes().collect();
    let n = pes.len() * 128;
    let mut rt = Runtime::new(&m);
    let x = rt
        .tensor(
            "x",
            Dtype::F16,
            [n as u64, 128],
            Some(vec![0; n * 128 * 2]),
            Sharding::ROWS,
        )
        .unwrap();
    let y = rt
        .tensor("y", y_dtype, [n as u64, 128], None, Sharding::ROWS)
        .unwrap();
    let args = Arc::new(rt.kernel_args(&[x, y]).scalar("iters", iters));
    let programs: Vec<Box<dyn PeProgram>> = pes
        .iter()
        .enumerate()
        .map(|(i, &pe)| {
            let p = pes.len() as u32;
            let body = kernel::body(kernel, args.clone(), pe, i as u32, p, rt.take_tcm(pe));
            Executor::Coroutine.spawn(format!("k{i}"), body).unwrap()
        })
        .collect();
    let writer = TraceWriter::new(std::io::sink(), &Meta::default()).unwrap();
    let (w, stats) = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap();
    w.finish(&VerifySpec::default()).unwrap();
    stats.records
}

#[test]
fn the_kernel_benchmark_loop_allocates_almost_nothing_per_record() {
    let small = counted(|| kernel_loop(peer_kernel, Dtype::F32, 20));
    let large = counted(|| kernel_loop(peer_kernel, Dtype::F32, 80));
    assert_per_extra_record(
        "load -> dot -> store loop, 20 -> 80 iterations",
        small,
        large,
        BOUND,
    );
}

#[test]
fn a_loop_of_math_ops_allocates_almost_nothing_per_record() {
    let small = counted(|| kernel_loop(math_kernel, Dtype::F16, 10));
    let large = counted(|| kernel_loop(math_kernel, Dtype::F16, 40));
    assert_per_extra_record(
        "load -> exp, add, sum, add -> store loop, 10 -> 40 iterations",
        small,
        large,
        BOUND,
    );
}
