//! GEMM backends called directly, for comparison with numpy and with
//! kb-replay's own throughput (scripts/bench-replay.sh runs it).
//!
//!     cargo bench -p kb-replay --bench backend -- [--backend NAME] [--threads N] MODE...
//!
//! Modes (each prints one line per figure, `GFLOP/s` last):
//!
//! - `square N`: f32 `c += a . b` on N x N matrices, one backend call at a
//!   time on a pool of `--threads` workers (the backend parallelises a call
//!   itself); best of 5 after a warm-up.
//! - `f16 N`: the replay's f16 GEMM (f16 in, f32 accumulation, f16 out, the
//!   conversions included) on N x N, as `kb_replay::ops::gemm::execute`.
//! - `trace FILE`: the f32/f16/bf16 GEMMs of a trace with their shapes,
//!   on the backend directly: one call at a time (`direct`), and grouped
//!   by shape in batches of up to 32 (`direct-batched`, the engine's
//!   batching); best of 3.
//! - `kchain K`: a 64 x 64 f32 tile accumulating `A . B` over K (a 64 x K
//!   panel of A, a K x 64 panel of a K x 2048 B), on one thread: as K/64
//!   calls on dense 64^3 tiles (`links`, what the replay's K-chains run)
//!   and as one 64 x 64 x K call on the panels where they lie (`fused`,
//!   other bits) or with the B panel dense (`fused-dense-b`); best of 5
//!   of 64 tiles.
use std::time::Instant;

use kb_format::{Dtype, GemmParams, Layout, MmapTrace, OpKind, Params};
use kb_replay::backend::{self, Dims, GemmArgs, GemmBackend, MatMut, MatRef};
use kb_replay::ops::gemm;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn best(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn square(be: &dyn GemmBackend, pool: &rayon::ThreadPool, threads: usize, n: usize) {
    let d = Dims { m: n, k: n, n };
    let (a, b) = (values(n * n, 1), values(n * n, 2));
    let mut c = vec![0f32; n * n];
    let s = best(5, || pool.install(|| be.gemm_f32(d, &a, &b, &mut c)));
    println!(
        "square f32 n={n} backend={} threads={threads}: {:.1} GFLOP/s",
        be.name(),
        d.flops() / s / 1e9
    );
}

fn params(m: u32, k: u32, n: u32, din: Dtype, dout: Dtype) -> GemmParams {
    GemmParams {
        a: Default::default(),
        b: Default::default(),
        out: Default::default(),
        acc: None,
        m,
        k,
        n,
        dtype_in: din,
        dtype_acc: Dtype::F32,
        dtype_out: dout,
        transpose_a: false,
        transpose_b: false,
        layout_a: Layout::RowMajor,
        layout_b: Layout::RowMajor,
        layout_out: Layout::RowMajor,
    }
}

fn f16(be: &dyn GemmBackend, pool: &rayon::ThreadPool, threads: usize, n: usize) {
    let p = params(n as u32, n as u32, n as u32, Dtype::F16, Dtype::F16);
    let input: Vec<u8> = values(2 * n * n, 3)
        .into_iter()
        .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let s = best(5, || {
        pool.install(|| {
            gemm::execute(&p, &input, be).expect("gemm");
        })
    });
    println!(
        "f16 n={n} backend={} threads={threads}: {:.1} GFLOP/s",
        be.name(),
        2.0 * (n * n * n) as f64 / s / 1e9
    );
}

fn trace(be: &dyn GemmBackend, pool: &rayon::ThreadPool, threads: usize, path: &str) {
    let t = MmapTrace::open(path.as_ref()).expect("trace");
    let mut shapes: Vec<Dims> = Vec::new();
    t.for_each_record(|r, _| {
        if let (OpKind::Gemm, Params::Gemm(p)) = (r.kind, &r.params)
            && matches!(p.dtype_acc, Dtype::F32)
        {
            shapes.push(Dims {
                m: p.m as usize,
                k: p.k as usize,
                n: p.n as usize,
            });
        }
        Ok(())
    })
    .expect("records");
    let flops: f64 = shapes.iter().map(|d| d.flops()).sum();
    // Operands per distinct shape, reused by every call of that shape.
    let mut kinds: Vec<Dims> = shapes.clone();
    kinds.sort_by_key(|d| (d.m, d.k, d.n));
    kinds.dedup();
    let data: Vec<(Dims, Vec<f32>, Vec<f32>)> = kinds
        .iter()
        .map(|&d| (d, values(d.m * d.k, 4), values(d.k * d.n, 5)))
        .collect();
    let operands = |d: &Dims| {
        let (_, a, b) = data.iter().find(|(k, _, _)| k == d).expect("shape");
        (a, b)
    };
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|d| vec![0f32; d.m * d.n]).collect();
    let s = best(3, || {
        pool.install(|| {
            for (d, c) in shapes.iter().zip(outs.iter_mut()) {
                let (a, b) = operands(d);
                be.gemm_f32(*d, a, b, c);
            }
        })
    });
    println!(
        "trace {path} gemms={} direct backend={} threads={threads}: {:.1} GFLOP/s",
        shapes.len(),
        be.name(),
        flops / s / 1e9
    );
    let s = best(3, || {
        pool.install(|| {
            let mut rest: &mut [Vec<f32>] = &mut outs;
            let mut i = 0;
            while i < shapes.len() {
                let d = shapes[i];
                let same = shapes[i..].iter().take(32).take_while(|x| **x == d).count();
                let (now, later) = rest.split_at_mut(same);
                rest = later;
                let (a, b) = operands(&d);
                let mut batch: Vec<GemmArgs<f32>> =
                    now.iter_mut().map(|c| GemmArgs { a, b, c }).collect();
                be.gemm_f32_batch(d, &mut batch);
                i += same;
            }
        })
    });
    println!(
        "trace {path} gemms={} direct-batched backend={} threads={threads}: {:.1} GFLOP/s",
        shapes.len(),
        be.name(),
        flops / s / 1e9
    );
}

fn kchain(be: &dyn GemmBackend, k: usize) {
    const T: usize = 64;
    const W: usize = 2048;
    let tiles = 64;
    let a = values(T * k, 1);
    let b = values(k * W, 2);
    // The links' operands, decoded into dense tiles (once, as the
    // replay's shared decoded operands are).
    let steps = k / T;
    let a_tiles: Vec<Vec<f32>> = (0..steps)
        .map(|s| {
            (0..T)
                .flat_map(|i| a[i * k + s * T..i * k + s * T + T].to_vec())
                .collect()
        })
        .collect();
    let b_tiles: Vec<Vec<f32>> = (0..steps)
        .map(|s| {
            (0..T)
                .flat_map(|p| b[(s * T + p) * W..(s * T + p) * W + T].to_vec())
                .collect()
        })
        .collect();
    let mut c = vec![0f32; T * T];
    let d = Dims { m: T, k: T, n: T };
    let links = best(5, || {
        for _ in 0..tiles {
            c.fill(0.0);
            for s in 0..steps {
                let va = MatRef::dense(&a_tiles[s], T, T).expect("a");
                let vb = MatRef::dense(&b_tiles[s], T, T).expect("b");
                let vc = MatMut::dense(&mut c, T, T).expect("c");
                be.gemm_f32_view(d, va, vb, vc, false);
            }
        }
    });
    let fd = Dims { m: T, k, n: T };
    let fused = best(5, || {
        for _ in 0..tiles {
            c.fill(0.0);
            let va = MatRef::new(&a, T, k, k).expect("a");
            let vb = MatRef::new(&b[..(k - 1) * W + T], k, T, W).expect("b");
            let vc = MatMut::dense(&mut c, T, T).expect("c");
            be.gemm_f32_view(fd, va, vb, vc, false);
        }
    });
    // The B panel decoded once into a dense k x 64 matrix (as the
    // replay's shared decoded operands would be).
    let b_panel: Vec<f32> = b_tiles.concat();
    let fused_dense = best(5, || {
        for _ in 0..tiles {
            c.fill(0.0);
            let va = MatRef::new(&a, T, k, k).expect("a");
            let vb = MatRef::dense(&b_panel, k, T).expect("b");
            let vc = MatMut::dense(&mut c, T, T).expect("c");
            be.gemm_f32_view(fd, va, vb, vc, false);
        }
    });
    let flops = tiles as f64 * fd.flops();
    println!(
        "kchain k={k} links backend={} threads=1: {:.1} GFLOP/s",
        be.name(),
        flops / links / 1e9
    );
    println!(
        "kchain k={k} fused backend={} threads=1: {:.1} GFLOP/s",
        be.name(),
        flops / fused / 1e9
    );
    println!(
        "kchain k={k} fused-dense-b backend={} threads=1: {:.1} GFLOP/s",
        be.name(),
        flops / fused_dense / 1e9
    );
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut backend_name = "gemm".to_string();
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut modes = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--backend" => backend_name = args.next().expect("--backend NAME"),
            "--threads" => threads = args.next().expect("--threads N").parse().expect("N"),
            "square" | "f16" | "trace" | "kchain" => {
                modes.push((a.clone(), args.next().expect("argument")))
            }
            other => panic!("unknown argument {other:?}"),
        }
    }
    let be = backend::by_name(&backend_name).expect("backend compiled in");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    for (mode, arg) in modes {
        match mode.as_str() {
            "square" => square(be.as_ref(), &pool, threads, arg.parse().expect("N")),
            "f16" => f16(be.as_ref(), &pool, threads, arg.parse().expect("N")),
            "kchain" => kchain(be.as_ref(), arg.parse().expect("K")),
            _ => trace(be.as_ref(), &pool, threads, &arg),
        }
    }
}
