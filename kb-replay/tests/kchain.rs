//! K-chain fusion (engine::plan's `Chain`): GEMMs accumulating into one
//! output planned as one node. The fused replay must compute what the
//! GEMMs one by one compute, in effect order: hand-built chains whose
//! results are exact small integers (so a link run in the wrong order, or
//! before a write it must follow, gives a different number), chains a read
//! of the accumulator, a write of an operand or a dependency must cut, and
//! random chain-heavy traces replayed fused and unfused, on 1 to 3
//! threads, with identical bits.

mod common;

use common::*;
use kb_format::{Dtype, MathOp, Space};
use kb_replay::app::{self, Loaded};
use kb_replay::backend::{GemmBackend, GemmCrate, NaiveGemm};
use kb_replay::engine::{Exec, ReplayOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 4x4 f32 tiles.
const N: u32 = 4;
const TILE: u64 = (N * N * 4) as u64;

fn run(bytes: &[u8], threads: usize, fuse: bool, be: &dyn GemmBackend) -> Loaded {
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let exec = Exec {
        backend: be,
        pool: Some(&p),
    };
    let opts = ReplayOptions {
        fuse,
        ..ReplayOptions::default()
    };
    app::load_stream(bytes, &opts, &exec).expect("replay")
}

fn read(l: &Loaded, addr: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    l.replayer.plane().read(addr, &mut b).unwrap();
    b
}

/// `a . b` of row-major 4x4 matrices, in f64.
fn matmul(a: &[f64], b: &[f64]) -> Vec<f64> {
    let n = N as usize;
    let mut c = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            for p in 0..n {
                c[i * n + j] += a[i * n + p] * b[p * n + j];
            }
        }
    }
    c
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Small integers (products and sums of them are exact in f32).
fn tile_values(seed: u64) -> Vec<f64> {
    (0..(N * N) as u64)
        .map(|i| ((i * 7 + seed * 5) % 9) as f64 - 4.0)
        .collect()
}

/// What can come between the links of a hand-built chain.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Cut {
    /// Nothing: four GEMMs, one chain.
    None,
    /// After the second GEMM, a store of the accumulator to `z`.
    ReadAcc,
    /// The same store, its write after the third GEMM: its read gathers
    /// the bytes (a capture) when its write is planned.
    ReadAccLate,
    /// After the first GEMM, an add doubling the tile the second GEMM
    /// reads as `a` (a physical write of an operand).
    WriteOperand,
    /// The third GEMM depends on the store of `z` (op 20, between the
    /// second and third GEMM, reading another tile).
    Dep,
}

/// Host tensor `x` holds 8 tiles (a1 b1 a2 b2 a3 b3 a4 b4), copied to HBM
/// then each to its own TCM tile; four GEMMs accumulate `a_i . b_i` into
/// a TCM tile (the first without accumulator), which is stored to output
/// `y`. Returns the trace and the expected `y` and `z` (f64).
fn hand_chain(cut: Cut) -> (Vec<u8>, Vec<f64>, Option<Vec<f64>>) {
    let tiles: Vec<Vec<f64>> = (0..8).map(tile_values).collect();
    let x: Vec<f32> = tiles.iter().flatten().map(|&v| v as f32).collect();
    let y_at = hbm(0x10000);
    let z_at = hbm(0x20000);
    let out = dev(Space::Tcm, 0, 0x8000);
    let op_tile = |i: u64| dev(Space::Tcm, 0, i * TILE);
    let tensors = vec![
        tensor("x", Dtype::F32, &[8 * N as u64, N as u64], true, None),
        tensor("y", Dtype::F32, &[N as u64, N as u64], false, Some(y_at)),
        tensor("z", Dtype::F32, &[N as u64, N as u64], false, Some(z_at)),
    ];
    let mut ops: Vec<Op> = Vec::new();
    let mut seq = 0u64;
    let mut t = 0u64;
    let mut next = |n: u64| {
        let s = seq;
        seq += n;
        t += 10;
        (s, t)
    };
    let (s, tt) = next(2);
    ops.push(mem(
        1,
        tt,
        s,
        vec![span(host(0, 0), 8 * TILE)],
        s + 1,
        vec![span(hbm(0), 8 * TILE)],
    ));
    for i in 0..8u64 {
        let (s, tt) = next(2);
        ops.push(mem(
            2 + i,
            tt,
            s,
            vec![span(hbm(i * TILE), TILE)],
            s + 1,
            vec![span(op_tile(i), TILE)],
        ));
    }
    let mut want = vec![0.0; (N * N) as usize];
    let mut z = None;
    let mut doubled = false;
    let mut late_store: Option<usize> = None;
    for g in 0..4u64 {
        let mut p = gemm_params(N, N, N, Dtype::F32, Dtype::F32, Dtype::F32);
        let mut reads = vec![span(op_tile(2 * g), TILE), span(op_tile(2 * g + 1), TILE)];
        if g > 0 {
            p.acc = Some(Default::default());
            reads.push(span(out, TILE));
        }
        let (s, tt) = next(1);
        let mut op = gemm(100 + g, tt, s, p, reads, vec![span(out, TILE)]);
        if g > 0 {
            op.deps = vec![100 + g - 1];
        }
        if cut == Cut::Dep && g == 2 {
            op.deps.push(20);
        }
        ops.push(op);
        if let (Some(i), 2) = (late_store, g) {
            let (s, _) = next(1);
            ops[i].write.as_mut().unwrap().seq = s;
        }
        let a = if doubled && g == 1 {
            add(&tiles[2], &tiles[2])
        } else {
            tiles[2 * g as usize].clone()
        };
        want = add(&want, &matmul(&a, &tiles[2 * g as usize + 1]));
        match (cut, g) {
            (Cut::ReadAcc, 1) => {
                let (s, tt) = next(2);
                ops.push(mem(
                    20,
                    tt,
                    s,
                    vec![span(out, TILE)],
                    s + 1,
                    vec![span(z_at, TILE)],
                ));
                z = Some(want.clone());
            }
            (Cut::ReadAccLate, 1) => {
                let (s, tt) = next(1);
                let store = mem(20, tt, s, vec![span(out, TILE)], 0, vec![span(z_at, TILE)]);
                late_store = Some(ops.len());
                ops.push(store);
                z = Some(want.clone());
            }
            (Cut::Dep, 1) => {
                // A store of an operand tile (not the accumulator).
                let (s, tt) = next(2);
                ops.push(mem(
                    20,
                    tt,
                    s,
                    vec![span(op_tile(0), TILE)],
                    s + 1,
                    vec![span(z_at, TILE)],
                ));
                z = Some(tiles[0].clone());
            }
            (Cut::WriteOperand, 0) => {
                // a2 := a2 + a2, in place.
                let f = Dtype::F32;
                let (s, tt) = next(1);
                let m = math(
                    20,
                    tt,
                    s,
                    MathOp::Add,
                    vec![tile(1, N * N, f), tile(1, N * N, f)],
                    (1, N * N, f),
                    None,
                    vec![span(op_tile(2), TILE), span(op_tile(2), TILE)],
                    vec![span(op_tile(2), TILE)],
                );
                ops.push(m);
                doubled = true;
            }
            _ => {}
        }
    }
    let (s, tt) = next(2);
    ops.push(mem(
        30,
        tt,
        s,
        vec![span(out, TILE)],
        s + 1,
        vec![span(y_at, TILE)],
    ));
    let bytes = build(tensors, &[(0, f32_bytes(&x))], &ops, vec![]);
    (bytes, want, z)
}

fn f64s(b: &[u8]) -> Vec<f64> {
    f32_of(b).into_iter().map(f64::from).collect()
}

#[test]
fn a_fused_chain_computes_each_link_in_effect_order() {
    // GEMMs fused after the first: a chain of 4; two chains of 2 (the
    // store reads the accumulator between); two chains (the second GEMM
    // reads a tile written after the first: 1 + 2 links fused); the
    // dependency on the store keeps the third GEMM out of the first chain.
    for (cut, fused) in [
        (Cut::None, 3),
        (Cut::ReadAcc, 2),
        (Cut::ReadAccLate, 2),
        (Cut::WriteOperand, 2),
        (Cut::Dep, 2),
    ] {
        let (bytes, want, z) = hand_chain(cut);
        for threads in [1, 2, 3] {
            for be in [&GemmCrate as &dyn GemmBackend, &NaiveGemm] {
                let l = run(&bytes, threads, true, be);
                let what = format!("{cut:?}, {threads} threads, {}", be.name());
                assert_eq!(f64s(&read(&l, hbm(0x10000), TILE)), want, "y: {what}");
                if let Some(z) = &z {
                    assert_eq!(&f64s(&read(&l, hbm(0x20000), TILE)), z, "z: {what}");
                }
                assert_eq!(l.replayer.stats().gemms_fused, fused, "{what}");
                let unfused = run(&bytes, threads, false, be);
                assert_eq!(unfused.replayer.stats().gemms_fused, 0);
                assert_eq!(
                    read(&unfused, hbm(0x10000), TILE),
                    read(&l, hbm(0x10000), TILE),
                    "{what}"
                );
            }
        }
    }
}

/// A random op log over 2 PEs: K-chains of f32 GEMMs (16x16x16, some
/// with strided operands) accumulating into a few output tiles, loads of
/// operand tiles between the links, and sometimes a store of an output
/// mid-chain, an add overwriting an operand tile or a chain restarted
/// without accumulator.
fn random_chains(seed: u64, n: usize) -> Vec<u8> {
    const T: u64 = 1024; // a 16x16 f32 tile
    const SLOTS: u64 = 24;
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..(SLOTS * T / 4) as usize)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let tensors = vec![
        tensor("x", Dtype::F32, &[SLOTS * T / 64, 16], true, None),
        tensor("y", Dtype::F32, &[SLOTS * T / 64, 16], false, Some(hbm(0))),
    ];
    let mut ops = vec![mem(
        0,
        0,
        0,
        vec![span(host(0, 0), SLOTS * T)],
        1,
        vec![span(hbm(0), SLOTS * T)],
    )];
    let mut seq = 2u64;
    let tcm_tile = |pe: u32, i: u64| dev(Space::Tcm, pe, i * T);
    for i in 1..n as u64 {
        let pe = rng.random_range(0..2u32);
        let t = i * 10;
        let s = seq;
        let kind = rng.random_range(0..20);
        let op = match kind {
            // A load of an operand tile (tiles 0..4), maybe strided.
            0..=5 => {
                let slot = rng.random_range(0..SLOTS - 1) * T;
                let src = if rng.random_bool(0.5) {
                    vec![span(hbm(slot), T)]
                } else {
                    vec![strided(hbm(slot), 64, 16, 128)]
                };
                seq += 2;
                mem(
                    i,
                    t,
                    s,
                    src,
                    s + 1,
                    vec![span(tcm_tile(pe, rng.random_range(0..4)), T)],
                )
            }
            // A store of an output tile (4..6) to HBM.
            6 => {
                seq += 2;
                let slot = rng.random_range(0..SLOTS) * T;
                mem(
                    i,
                    t,
                    s,
                    vec![span(tcm_tile(pe, rng.random_range(4..6)), T)],
                    s + 1,
                    vec![span(hbm(slot), T)],
                )
            }
            // An operand tile scaled in place.
            7 => {
                seq += 1;
                let f = Dtype::F32;
                let at = tcm_tile(pe, rng.random_range(0..4));
                math(
                    i,
                    t,
                    s,
                    MathOp::Mul,
                    vec![tile(1, 256, f), kb_format::MathInput::Scalar(0.5)],
                    (1, 256, f),
                    None,
                    vec![span(at, T)],
                    vec![span(at, T)],
                )
            }
            // A GEMM into an output tile, mostly accumulating.
            _ => {
                seq += 1;
                let mut p = gemm_params(16, 16, 16, Dtype::F32, Dtype::F32, Dtype::F32);
                let out = tcm_tile(pe, rng.random_range(4..6));
                let (a, b) = (rng.random_range(0..4), rng.random_range(0..4));
                let mut reads = vec![span(tcm_tile(pe, a), T), span(tcm_tile(pe, b), T)];
                if rng.random_bool(0.85) {
                    p.acc = Some(Default::default());
                    reads.push(span(out, T));
                }
                let mut g = gemm(i, t, s, p, reads, vec![span(out, T)]);
                if rng.random_bool(0.1) {
                    g.deps = vec![rng.random_range(0..i)];
                }
                g
            }
        };
        ops.push(op);
    }
    build_chunked(tensors, &[(0, f32_bytes(&x))], &ops, vec![], Some(4096))
}

fn state(l: &Loaded) -> Vec<u8> {
    let mut out = read(l, hbm(0), 24 * 1024);
    for pe in 0..2 {
        out.extend(read(l, dev(Space::Tcm, pe, 0), 6 * 1024));
    }
    out
}

#[test]
fn random_chains_replay_the_same_bits_fused_and_unfused_on_any_thread_count() {
    let mut fused_any = 0;
    for seed in 0..6 {
        let bytes = random_chains(seed, 600);
        let want = state(&run(&bytes, 1, false, &GemmCrate));
        for threads in [1, 2, 3] {
            for fuse in [true, false] {
                let l = run(&bytes, threads, fuse, &GemmCrate);
                // (Not assert_eq: the states are 32 kB.)
                assert!(
                    state(&l) == want,
                    "seed {seed}, {threads} threads, fuse {fuse}: other bytes"
                );
                let fused = l.replayer.stats().gemms_fused;
                if fuse {
                    fused_any += fused;
                } else {
                    assert_eq!(fused, 0);
                }
            }
        }
    }
    assert!(
        fused_any > 100,
        "the traces have chains to fuse ({fused_any})"
    );
}
