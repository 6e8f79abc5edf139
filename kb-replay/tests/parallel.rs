//! The parallel engine against the sequential one: random traces full of
//! read/write hazards (and copies of half buffers, so lazy copies share
//! source bytes) give bit-identical bytes for every thread count,
//! window size, lookahead and with batching on or off; errors are the
//! first in effect order; streaming holds few records.

mod common;

use common::*;
use kb_format::Event;
use kb_format::{Dtype, Effect, MathInput, MathOp, OpKind, Space};
use kb_replay::Error;
use kb_replay::app::{self, Loaded};
use kb_replay::backend::{GemmBackend, GemmCrate, NaiveGemm};
use kb_replay::engine::{Exec, Fingerprints, ReplayOptions, Replayer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PES: u32 = 4;
const BUFS: u64 = 6;
const BUF: u64 = 1024;
const SLOTS: u64 = 16;

fn buf(pe: u32, i: u64) -> u64 {
    dev(Space::Tcm, pe, i * BUF)
}

/// A random op log over 4 PEs' TCM buffers and an HBM region: loads,
/// stores (some strided), GEMMs (f32, f16, with and without an in-place
/// accumulator) and adds, with writes delayed past other ops' effects;
/// with `halves`, copies of half buffers too.
fn random_trace(seed: u64, n: usize, halves: bool) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..(SLOTS * BUF / 4) as usize)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let tensors = vec![
        tensor("x", Dtype::F32, &[(SLOTS * BUF / 4) / 64, 64], true, None),
        tensor(
            "y",
            Dtype::F32,
            &[(SLOTS * BUF / 4) / 64, 64],
            false,
            Some(hbm(0)),
        ),
    ];
    // Ops with effect positions; seqs are assigned by position below.
    let mut ops: Vec<Op> = Vec::new();
    let mut pos: Vec<(u64, usize, bool)> = Vec::new();
    let deploy = mem(
        0,
        0,
        0,
        vec![span(host(0, 0), SLOTS * BUF)],
        0,
        vec![span(hbm(0), SLOTS * BUF)],
    );
    ops.push(deploy);
    pos.push((0, 0, false));
    pos.push((1, 0, true));
    for i in 1..n {
        let pe = rng.random_range(0..PES);
        let b = |rng: &mut StdRng| buf(pe, rng.random_range(0..BUFS));
        let slot = hbm(rng.random_range(0..SLOTS) * BUF);
        let t = i as u64 * 10;
        let id = i as u64;
        let kind = rng.random_range(0..if halves { 11 } else { 10 });
        let mut op = match kind {
            // Half of a buffer to half of another (or the other half of
            // the same one): copies whose source or target lies inside
            // another copy's, so several aliases share source bytes.
            10 => {
                let (from, to) = (b(&mut rng), b(&mut rng));
                let (h0, mut h1) = (rng.random_range(0..2u64), rng.random_range(0..2u64));
                if from == to && h0 == h1 {
                    h1 = 1 - h0;
                }
                mem(
                    id,
                    t,
                    0,
                    vec![span(from + h0 * BUF / 2, BUF / 2)],
                    0,
                    vec![span(to + h1 * BUF / 2, BUF / 2)],
                )
            }
            // Load, contiguous or as 4 strided rows.
            0..=2 => {
                let src = if rng.random_bool(0.5) {
                    vec![span(slot, BUF)]
                } else {
                    vec![strided(slot, BUF / 4, 4, BUF / 2)]
                };
                mem(id, t, 0, src, 0, vec![span(b(&mut rng), BUF)])
            }
            // Store.
            3..=4 => mem(
                id,
                t,
                0,
                vec![span(b(&mut rng), BUF)],
                0,
                vec![span(slot, BUF)],
            ),
            // GEMM 16x16x16 f32, maybe accumulating in place.
            5..=6 => {
                let mut p = gemm_params(16, 16, 16, Dtype::F32, Dtype::F32, Dtype::F32);
                let (a, bb, out) = (b(&mut rng), b(&mut rng), b(&mut rng));
                let mut reads = vec![span(a, BUF), span(bb, BUF)];
                if rng.random_bool(0.5) {
                    p.acc = Some(Default::default());
                    reads.push(span(out, BUF));
                }
                gemm(id, t, 0, p, reads, vec![span(out, BUF)])
            }
            // GEMM 16x16x16 f16 in, f32 out.
            7 => {
                let p = gemm_params(16, 16, 16, Dtype::F16, Dtype::F32, Dtype::F32);
                let (a, bb, out) = (b(&mut rng), b(&mut rng), b(&mut rng));
                gemm(
                    id,
                    t,
                    0,
                    p,
                    vec![span(a, BUF / 2), span(bb + BUF / 2, BUF / 2)],
                    vec![span(out, BUF)],
                )
            }
            // Add two tiles, scaled down so chains stay finite.
            _ => {
                let f = Dtype::F32;
                let (a, c, out) = (b(&mut rng), b(&mut rng), b(&mut rng));
                let mut op = math(
                    id,
                    t,
                    0,
                    MathOp::Add,
                    vec![tile(1, 256, f), tile(1, 256, f)],
                    (1, 256, f),
                    None,
                    vec![span(a, BUF), span(c, BUF)],
                    vec![span(out, BUF)],
                );
                if rng.random_bool(0.3) {
                    op.params = kb_format::Params::Math(kb_format::MathParams {
                        op: MathOp::Mul,
                        inputs: vec![tile(1, 256, f), MathInput::Scalar(0.25)],
                        out: Default::default(),
                        rows: 1,
                        cols: 256,
                        dtype: f,
                        axis: None,
                    });
                    op.read = Some(Effect {
                        time: t,
                        seq: 0,
                        ranges: vec![span(a, BUF)],
                    });
                }
                op
            }
        };
        if rng.random_bool(0.2) {
            op.deps = vec![rng.random_range(0..id)];
        }
        ops.push(op);
        let at = i as u64 * 10;
        pos.push((at, i, false));
        // Memory ops write a while later; compute ops right away.
        let delay = if kind <= 4 || kind == 10 {
            rng.random_range(0..4) * 10 + 5
        } else {
            1
        };
        pos.push((at + delay, i, true));
    }
    pos.sort();
    for (seq, &(_, i, write)) in pos.iter().enumerate() {
        let e = if write {
            &mut ops[i].write
        } else {
            &mut ops[i].read
        };
        e.as_mut().expect("effect").seq = seq as u64;
    }
    let xb = f32_bytes(&x);
    ops[0].fingerprint = Some(kb_format::fingerprint(&xb));
    build_chunked(tensors, &[(0, xb)], &ops, vec![], Some(2048))
}

/// Every buffer and the HBM region after replay.
fn state(l: &Loaded) -> Vec<u8> {
    let mut out = vec![0u8; (SLOTS * BUF) as usize];
    l.replayer.plane().read(hbm(0), &mut out).unwrap();
    for pe in 0..PES {
        for i in 0..BUFS {
            let mut b = vec![0u8; BUF as usize];
            l.replayer.plane().read(buf(pe, i), &mut b).unwrap();
            out.extend(b);
        }
    }
    out
}

fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
}

fn run(bytes: &[u8], threads: usize, opts: &ReplayOptions, be: &dyn GemmBackend) -> Loaded {
    let p = pool(threads);
    let exec = Exec {
        backend: be,
        pool: Some(&p),
    };
    app::load_stream(bytes, opts, &exec).expect("replay")
}

#[test]
fn thread_counts_windows_and_batching_give_identical_bits() {
    for seed in 0..4 {
        let bytes = random_trace(seed, 400, true);
        let base = run(&bytes, 1, &ReplayOptions::default(), &GemmCrate);
        let want = state(&base);
        let d = ReplayOptions::default();
        let variants = [
            ("2 threads", 2, d.clone()),
            ("3 threads", 3, d.clone()),
            ("8 threads", 8, d.clone()),
            (
                "small windows and lookahead",
                2,
                ReplayOptions {
                    window: 7,
                    lookahead: 3,
                    hold_budget: 0,
                    ..d.clone()
                },
            ),
            (
                // Nearly every memory op's write in a later window than
                // its read: deferred reads, captured when overwritten.
                "windows of one effect",
                2,
                ReplayOptions {
                    window: 1,
                    ..d.clone()
                },
            ),
            (
                "no batching",
                2,
                ReplayOptions {
                    batch_gemms: false,
                    ..d.clone()
                },
            ),
            (
                "not streaming",
                2,
                ReplayOptions {
                    streaming: false,
                    ..d.clone()
                },
            ),
            (
                "no copy elision",
                2,
                ReplayOptions {
                    elide: false,
                    ..d.clone()
                },
            ),
            (
                "no copy elision, 1 thread",
                1,
                ReplayOptions {
                    elide: false,
                    ..d.clone()
                },
            ),
            (
                "fingerprints sampled",
                2,
                ReplayOptions {
                    fingerprints: Fingerprints::Sample,
                    ..d.clone()
                },
            ),
            (
                "fingerprints off",
                3,
                ReplayOptions {
                    fingerprints: Fingerprints::Off,
                    ..d.clone()
                },
            ),
        ];
        // Lazy copies, their materialization and GEMMs in place were
        // exercised (and changed nothing).
        let s = &base.stats;
        assert!(
            s.copies_elided > 0 && s.materialized > 0 && s.captured > 0 && s.gemm_in_place > 0,
            "{s:?}"
        );
        for (what, threads, opts) in variants {
            let l = run(&bytes, threads, &opts, &GemmCrate);
            assert!(state(&l) == want, "seed {seed}: {what} differs");
            let (a, b) = (&l.stats, &base.stats);
            assert_eq!(
                (a.bytes_read, a.bytes_written),
                (b.bytes_read, b.bytes_written),
                "{what}"
            );
            if opts.fingerprints == Fingerprints::All {
                assert_eq!(a.fingerprints_checked, b.fingerprints_checked, "{what}");
            }
            if !opts.elide {
                assert_eq!(a.copies_elided, 0, "{what}");
                assert!(a.bytes_copied > b.bytes_copied, "{what}");
            }
            assert!(threads == 1 || a.tasks > 0, "{what} ran in parallel");
        }
        // The sequential run without a pool is the same too.
        let seq = app::load_stream(
            &bytes[..],
            &ReplayOptions::default(),
            &Exec::sequential(&GemmCrate),
        )
        .unwrap();
        assert!(state(&seq) == want);
        // The naive reference agrees to rounding, on a short trace (long
        // chains of GEMMs grow the values and amplify rounding differences,
        // as copies of half buffers do by moving big values about).
        let short = random_trace(seed, 40, false);
        let naive = run(&short, 2, &ReplayOptions::default(), &NaiveGemm);
        let gemm = run(&short, 2, &ReplayOptions::default(), &GemmCrate);
        let (g, n) = (f32_of(&state(&gemm)), f32_of(&state(&naive)));
        let finite = |v: &f32| v.is_finite();
        assert_eq!(
            g.iter().filter(|v| finite(v)).count(),
            n.iter().filter(|v| finite(v)).count()
        );
        let (mut diff, mut norm) = (0f64, 0f64);
        for (x, y) in g.iter().zip(&n).filter(|(x, y)| finite(x) && finite(y)) {
            diff += ((x - y) as f64).powi(2);
            norm += (*y as f64).powi(2);
        }
        assert!(
            diff.sqrt() <= 1e-4 * norm.sqrt(),
            "seed {seed}: {diff} vs {norm}"
        );
    }
}

/// Independent GEMMs of one shape that one deploy makes ready: the deploy
/// runs alone, so when it finishes every thread is free and the GEMMs
/// start as batched calls (which GEMMs batch otherwise depends on timing);
/// the bits are those of the sequential run.
#[test]
fn gemms_ready_together_run_batched() {
    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..(SLOTS * BUF / 4) as usize)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let xb = f32_bytes(&x);
    let tensors = vec![tensor(
        "x",
        Dtype::F32,
        &[(SLOTS * BUF / 4) / 64, 64],
        true,
        None,
    )];
    let mut deploy = mem(
        0,
        0,
        0,
        vec![span(host(0, 0), SLOTS * BUF)],
        1,
        vec![span(hbm(0), SLOTS * BUF)],
    );
    deploy.fingerprint = Some(kb_format::fingerprint(&xb));
    let mut ops = vec![deploy];
    for i in 0..8u64 {
        let p = gemm_params(16, 16, 16, Dtype::F32, Dtype::F32, Dtype::F32);
        let out = buf((i % PES as u64) as u32, i / PES as u64);
        ops.push(gemm(
            i + 1,
            20 + i,
            2 + i,
            p,
            vec![span(hbm(i * BUF), BUF), span(hbm((i + 8) * BUF), BUF)],
            vec![span(out, BUF)],
        ));
    }
    let bytes = build_chunked(tensors, &[(0, xb)], &ops, vec![], Some(2048));
    let base = run(&bytes, 1, &ReplayOptions::default(), &GemmCrate);
    // The deploy copied (it gates every GEMM), or left as a lazy copy with
    // its fingerprint unchecked (every GEMM is ready at the start, reading
    // the host data where it lies).
    let gated = ReplayOptions {
        elide: false,
        ..ReplayOptions::default()
    };
    let lazy = ReplayOptions {
        fingerprints: Fingerprints::Off,
        ..ReplayOptions::default()
    };
    for opts in [gated, lazy] {
        for threads in [2, 4] {
            let l = run(&bytes, threads, &opts, &GemmCrate);
            assert!(state(&l) == state(&base), "{threads} threads");
            assert!(
                l.stats.gemm_batches > 0 && l.stats.gemm_batched_ops >= 2,
                "{threads} threads: {} batched calls of {} GEMMs",
                l.stats.gemm_batches,
                l.stats.gemm_batched_ops
            );
        }
    }
    // The products are real: the outputs are not all zero.
    assert!(state(&base).iter().any(|&b| b != 0));
}

/// A GEMM whose matrices lie in TCM accumulates in place, with the bits
/// the generic path (operands decoded into buffers) gives; one whose
/// output overlaps an operand takes the generic path.
#[test]
fn gemms_in_tcm_compute_in_place_with_the_bits_of_the_generic_path() {
    let (m, k, n) = (48usize, 40usize, 56usize);
    let mut rng = StdRng::seed_from_u64(3);
    let mut vals = |len: usize| -> Vec<u8> {
        f32_bytes(
            &(0..len)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect::<Vec<_>>(),
        )
    };
    let (a, b, c) = (vals(m * k), vals(k * n), vals(m * n));
    let (at_b, at_c) = (a.len() as u64, (a.len() + b.len()) as u64);
    let x = [a.clone(), b.clone(), c.clone()].concat();
    let tensors = vec![tensor("x", Dtype::F32, &[x.len() as u64 / 4], true, None)];
    let deploy = mem(
        0,
        0,
        0,
        vec![span(host(0, 0), x.len() as u64)],
        1,
        vec![span(tcm(0), x.len() as u64)],
    );
    let mut acc = gemm_params(
        m as u32,
        k as u32,
        n as u32,
        Dtype::F32,
        Dtype::F32,
        Dtype::F32,
    );
    acc.acc = Some(kb_format::Addr::default());
    let in_place = gemm(
        1,
        20,
        2,
        acc,
        vec![
            span(tcm(0), a.len() as u64),
            span(tcm(at_b), b.len() as u64),
            span(tcm(at_c), c.len() as u64),
        ],
        vec![span(tcm(at_c), c.len() as u64)],
    );
    // Then a product written over its own `a` (and part of `b`).
    let plain = gemm_params(
        m as u32,
        k as u32,
        n as u32,
        Dtype::F32,
        Dtype::F32,
        Dtype::F32,
    );
    let over_a = gemm(
        2,
        40,
        3,
        plain,
        vec![
            span(tcm(0), a.len() as u64),
            span(tcm(at_b), b.len() as u64),
        ],
        vec![span(tcm(0), (m * n * 4) as u64)],
    );
    let bytes = build(tensors, &[(0, x)], &[deploy, in_place, over_a], vec![]);
    let execute = |p, input: &[u8]| kb_replay::ops::gemm::execute(p, input, &GemmCrate).unwrap();
    let want_c = execute(&acc, &[a.clone(), b.clone(), c].concat());
    let want_over = execute(&plain, &[a, b].concat());
    assert_ne!(want_c, want_over);
    for (elide, in_place) in [(false, 1), (true, 2)] {
        let opts = ReplayOptions {
            elide,
            ..ReplayOptions::default()
        };
        for threads in [1, 2] {
            let l = run(&bytes, threads, &opts, &GemmCrate);
            let read = |addr, len| {
                let mut v = vec![0u8; len];
                l.replayer.plane().read(addr, &mut v).unwrap();
                v
            };
            assert!(read(tcm(at_c), want_c.len()) == want_c, "{threads} threads");
            assert!(
                read(tcm(0), want_over.len()) == want_over,
                "{threads} threads"
            );
            // With the deploy left as a lazy copy, `a` is read where it
            // lies in host data, so the product written over its TCM bytes
            // overlaps no operand and is computed in place too.
            assert_eq!(l.stats.gemm_in_place, in_place, "{threads} threads");
        }
    }
}

/// GEMMs in TCM that one deploy makes ready batch too, computed in place
/// with the bits of the sequential run and of the generic path.
#[test]
fn gemms_in_tcm_batch_in_place() {
    let mut rng = StdRng::seed_from_u64(11);
    let x: Vec<f32> = (0..(PES as u64 * 2 * BUF / 4) as usize)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let xb = f32_bytes(&x);
    let tensors = vec![tensor("x", Dtype::F32, &[xb.len() as u64 / 4], true, None)];
    // Buffers 0 and 1 of every PE, in one op.
    let deploy = mem(
        0,
        0,
        0,
        vec![span(host(0, 0), xb.len() as u64)],
        1,
        (0..PES).map(|pe| span(buf(pe, 0), 2 * BUF)).collect(),
    );
    let p = gemm_params(16, 16, 16, Dtype::F32, Dtype::F32, Dtype::F32);
    let mut ops = vec![deploy];
    for i in 0..2 * PES as u64 {
        let pe = (i % PES as u64) as u32;
        ops.push(gemm(
            i + 1,
            20 + i,
            2 + i,
            p,
            vec![span(buf(pe, 0), BUF), span(buf(pe, 1), BUF)],
            vec![span(buf(pe, 2 + i / PES as u64), BUF)],
        ));
    }
    let bytes = build_chunked(tensors, &[(0, xb.clone())], &ops, vec![], Some(2048));
    let base = run(&bytes, 1, &ReplayOptions::default(), &GemmCrate);
    assert_eq!(base.stats.gemm_in_place, 8);
    for pe in 0..PES {
        let off = (pe as u64 * 2 * BUF) as usize;
        let want = kb_replay::ops::gemm::execute(&p, &xb[off..off + 2 * BUF as usize], &GemmCrate)
            .unwrap();
        for out in [2, 3] {
            let mut got = vec![0u8; BUF as usize];
            base.replayer.plane().read(buf(pe, out), &mut got).unwrap();
            assert!(got == want, "pe {pe} buffer {out}");
        }
    }
    for threads in [2, 4] {
        let l = run(&bytes, threads, &ReplayOptions::default(), &GemmCrate);
        assert!(state(&l) == state(&base), "{threads} threads");
        assert_eq!(l.stats.gemm_in_place, 8);
        assert!(
            l.stats.gemm_batches > 0 && l.stats.gemm_batched_ops >= 2,
            "{threads} threads: {} batched calls of {} GEMMs",
            l.stats.gemm_batches,
            l.stats.gemm_batched_ops
        );
    }
}

#[test]
fn streaming_holds_a_window_not_the_trace() {
    let bytes = random_trace(9, 3000, true);
    let opts = ReplayOptions {
        window: 64,
        ..ReplayOptions::default()
    };
    for threads in [1, 2] {
        let l = run(&bytes, threads, &opts, &GemmCrate);
        assert!(l.stats.windows > 20, "{}", l.stats.windows);
        assert!(
            l.stats.max_pending_records < 300,
            "held {} of 3000 records",
            l.stats.max_pending_records
        );
    }
    let all = run(
        &bytes,
        2,
        &ReplayOptions {
            streaming: false,
            ..ReplayOptions::default()
        },
        &GemmCrate,
    );
    assert_eq!(all.stats.windows, 1);
    assert_eq!(all.stats.max_pending_records, 3000);
}

/// Independent host -> hbm copies; `bad` ones carry a wrong fingerprint.
fn copies(bad: &[u64]) -> Vec<u8> {
    copies_chunked(bad, None)
}

/// As [`copies`], records chunks cut at `chunk_bytes`.
fn copies_chunked(bad: &[u64], chunk_bytes: Option<usize>) -> Vec<u8> {
    let n = 12u64;
    let x: Vec<u8> = (0..n * 64).map(|i| i as u8).collect();
    let tensors = vec![tensor("x", Dtype::U8, &[n * 64], true, None)];
    let ops: Vec<Op> = (0..n)
        .map(|i| {
            let mut op = mem(
                i,
                i,
                2 * i,
                vec![span(host(0, i * 64), 64)],
                2 * i + 1,
                vec![span(hbm(i * 64), 64)],
            );
            let right = kb_format::fingerprint(&x[(i * 64) as usize..((i + 1) * 64) as usize]);
            op.fingerprint = Some(if bad.contains(&i) { right ^ 1 } else { right });
            op
        })
        .collect();
    build_chunked(tensors, &[(0, x)], &ops, vec![], chunk_bytes)
}

/// The error of replaying `bytes` from a stream on `threads` threads with
/// windows of `window` records.
fn stream_error(bytes: &[u8], threads: usize, window: usize) -> Error {
    let opts = ReplayOptions {
        window,
        ..ReplayOptions::default()
    };
    let p = pool(threads);
    let exec = Exec {
        backend: &GemmCrate,
        pool: Some(&p),
    };
    app::load_stream(bytes, &opts, &exec).unwrap_err()
}

#[test]
fn the_first_error_in_effect_order_is_reported() {
    let bytes = copies(&[9, 4, 7]);
    for threads in [1, 2, 3] {
        for window in [1, 5, 4096] {
            let err = stream_error(&bytes, threads, window);
            assert!(
                matches!(err, Error::Op { op_id: 4, .. }),
                "{threads} threads, window {window}: {err}"
            );
            assert!(err.to_string().contains("fingerprint mismatch"), "{err}");
        }
    }
    assert!(
        app::load_stream(
            &copies(&[])[..],
            &ReplayOptions::default(),
            &Exec::sequential(&GemmCrate)
        )
        .is_ok()
    );
}

#[test]
fn an_effect_arriving_after_its_seq_was_applied_is_an_error() {
    // One record per chunk, so windows apply between records.
    let tensors = vec![tensor("x", Dtype::U8, &[64], true, None)];
    let ops = vec![
        mem(1, 0, 0, vec![span(host(0, 0), 8)], 1, vec![span(hbm(0), 8)]),
        mem(2, 1, 2, vec![span(hbm(0), 8)], 3, vec![span(hbm(8), 8)]),
        // Reuses seq 1, long applied.
        mem(3, 2, 1, vec![span(hbm(8), 8)], 4, vec![span(hbm(16), 8)]),
    ];
    let bytes = build_chunked(tensors, &[(0, vec![5; 64])], &ops, vec![], Some(1));
    let opts = ReplayOptions {
        window: 1,
        ..ReplayOptions::default()
    };
    let err = app::load_stream(&bytes[..], &opts, &Exec::sequential(&GemmCrate)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::Op { op_id: 3, .. }) && msg.contains("seqs must be unique"),
        "{msg}"
    );
    // Holding every record until the end accepts it (the old behaviour).
    let all = ReplayOptions {
        streaming: false,
        ..ReplayOptions::default()
    };
    assert!(app::load_stream(&bytes[..], &all, &Exec::sequential(&GemmCrate)).is_ok());
}

#[test]
fn a_window_that_fails_in_the_background_comes_before_a_later_records_error() {
    // With two or more threads a window runs while later records are
    // decoded: op 1's window fails (a wrong fingerprint) and op 3's record
    // is refused when it arrives; op 1's error is the one reported, as
    // with one thread, where op 3 is never read.
    let tensors = vec![tensor("x", Dtype::U8, &[64], true, None)];
    let mut first = mem(1, 0, 0, vec![span(host(0, 0), 8)], 1, vec![span(hbm(0), 8)]);
    first.fingerprint = Some(kb_format::fingerprint(&[5; 8]) ^ 1);
    let ops = vec![
        first,
        mem(2, 1, 2, vec![span(hbm(0), 8)], 3, vec![span(hbm(8), 8)]),
        // Reuses seq 1, long applied.
        mem(3, 2, 1, vec![span(hbm(8), 8)], 4, vec![span(hbm(16), 8)]),
    ];
    let bytes = build_chunked(tensors, &[(0, vec![5; 64])], &ops, vec![], Some(1));
    for threads in [1, 2, 3] {
        let err = stream_error(&bytes, threads, 1);
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Op { op_id: 1, .. }) && msg.contains("fingerprint mismatch"),
            "{threads} threads: {msg}"
        );
    }
}

#[test]
fn a_last_check_comes_before_the_last_windows_error_at_every_thread_count() {
    // The trace's digest is checked after the chunks (Feed::finish_beside);
    // with more than one thread it runs beside the last window. A failed
    // check still comes before that window's error, as with one thread,
    // where it runs before the window is planned; an earlier window's
    // error comes before it.
    let replay = |bytes: &[u8], threads: usize, window: usize, check: bool| {
        let p = pool(threads);
        let exec = Exec {
            backend: &GemmCrate,
            pool: Some(&p),
        };
        let opts = ReplayOptions {
            window,
            ..ReplayOptions::default()
        };
        let mut reader = kb_format::StreamReader::open(bytes).unwrap();
        let mut rep = Replayer::new(reader.meta(), &opts);
        rep.replay(&exec, |feed| {
            while let Some(ev) = reader.next_event()? {
                match ev {
                    Event::Tensor {
                        tensor,
                        offset,
                        data,
                    } => feed.load_host(tensor, offset, data, None)?,
                    Event::Records(c) => feed.push_chunk(c)?,
                    Event::Snapshot { .. } => {}
                }
            }
            feed.finish_beside(reader.strings(), || match check {
                true => Err(Error::Trace("the last check failed".into())),
                false => Ok(()),
            })
        })
        .map(|_| ())
    };
    // One record per chunk: with a window of a few effects, windows are
    // planned as records arrive (op 0 fails in the first), and with 4096
    // there is one window, the last, planned when the trace ends (op 11,
    // the last op, fails in it). Whatever fails, every thread count
    // reports what one thread does.
    let last = copies_chunked(&[11], Some(1));
    let first = copies_chunked(&[0], Some(1));
    let ok = copies_chunked(&[], Some(1));
    for window in [3, 4096] {
        for (trace, name) in [(&last, "op 11"), (&first, "op 0"), (&ok, "none")] {
            for check in [true, false] {
                let one = replay(trace, 1, window, check).map_err(|e| e.to_string());
                for threads in [2, 3] {
                    let got = replay(trace, threads, window, check).map_err(|e| e.to_string());
                    assert_eq!(
                        got, one,
                        "{threads} threads, window {window}, {name}, check {check}"
                    );
                }
            }
        }
        let err = replay(&last, 2, window, true).unwrap_err();
        if window == 4096 {
            // The check ran beside the failing last window.
            assert!(err.to_string().contains("the last check failed"), "{err}");
        }
        let err = replay(&first, 2, 3, true).unwrap_err();
        assert!(matches!(err, Error::Op { op_id: 0, .. }), "{err}");
    }
    let err = replay(&last, 2, 4096, false).unwrap_err();
    assert!(matches!(err, Error::Op { op_id: 11, .. }), "{err}");
    assert!(replay(&ok, 2, 3, false).is_ok());
}

#[test]
fn shared_pages_are_copied_before_either_side_changes() {
    // A whole page moved host -> hbm is shared; then the hbm copy is
    // overwritten in part, and the host input must not change.
    let page = 1u64 << 16;
    let x: Vec<u8> = (0..2 * page).map(|i| (i % 251) as u8).collect();
    let tensors = vec![
        tensor("x", Dtype::U8, &[2 * page], true, None),
        tensor("y", Dtype::U8, &[2 * page], false, Some(hbm(0))),
    ];
    let ops = vec![
        mem(
            1,
            0,
            0,
            vec![span(host(0, 0), 2 * page)],
            1,
            vec![span(hbm(0), 2 * page)],
        ),
        mem(
            2,
            1,
            2,
            vec![span(host(0, 5), 3)],
            3,
            vec![span(hbm(page + 7), 3)],
        ),
        // Copy the (changed) hbm page to another page, then change the source.
        mem(
            3,
            2,
            4,
            vec![span(hbm(page), page)],
            5,
            vec![span(hbm(4 * page), page)],
        ),
        mem(
            4,
            3,
            6,
            vec![span(host(0, 0), 1)],
            7,
            vec![span(hbm(page), 1)],
        ),
    ];
    let bytes = build(tensors, &[(0, x.clone())], &ops, vec![]);
    for threads in [1, 2] {
        let l = run(&bytes, threads, &ReplayOptions::default(), &GemmCrate);
        let p = l.replayer.plane();
        let mut got = vec![0u8; (2 * page) as usize];
        p.read(hbm(0), &mut got).unwrap();
        let mut want = x.clone();
        want[(page + 7) as usize..(page + 10) as usize].copy_from_slice(&x[5..8]);
        want[page as usize] = x[0];
        assert!(got == want, "hbm copy");
        let mut copy = vec![0u8; page as usize];
        p.read(hbm(4 * page), &mut copy).unwrap();
        let mut want3 = x[page as usize..].to_vec();
        want3[7..10].copy_from_slice(&x[5..8]);
        assert!(copy == want3, "copy of the copy");
        let mut host_in = vec![0u8; (2 * page) as usize];
        p.read_host_input(0, 0, &mut host_in).unwrap();
        assert!(host_in == x, "host input unchanged");
        let mut host_now = vec![0u8; (2 * page) as usize];
        p.read(host(0, 0), &mut host_now).unwrap();
        assert!(host_now == x, "host space unchanged");
    }
}

#[test]
fn unknown_kinds_are_skipped_in_parallel_too() {
    let tensors = vec![tensor("x", Dtype::U8, &[64], true, None)];
    let mut ops: Vec<Op> = (0..6)
        .map(|i| {
            mem(
                i,
                i,
                2 * i,
                vec![span(host(0, i), 1)],
                2 * i + 1,
                vec![span(hbm(i), 1)],
            )
        })
        .collect();
    for i in [1, 4] {
        ops[i].kind = OpKind::Unknown(200);
        ops[i].params = kb_format::Params::Raw(vec![9]);
    }
    let bytes = build(tensors, &[(0, vec![7; 64])], &ops, vec![]);
    let l = run(&bytes, 2, &ReplayOptions::default(), &GemmCrate);
    assert_eq!(l.stats.unknown_skipped, 2);
    assert_eq!(l.stats.memory, 4);
    let mut got = vec![0u8; 6];
    l.replayer.plane().read(hbm(0), &mut got).unwrap();
    assert_eq!(got, [7, 0, 7, 7, 0, 7]);
}

#[test]
fn the_first_windows_ramp_up_within_a_chunk_the_same_on_every_thread_count() {
    // 3,000 host -> HBM copies in one records chunk, effects in record
    // order. The windows wait for 256, 512, 1,024, 2,048 effects, then
    // the default 4,096: records 0..128, 128..384, 384..896, 896..1,920,
    // and the last 1,080 (2,160 effects) at the end of the trace.
    let n = 3000u64;
    let x: Vec<u8> = (0..n * 8).map(|i| (i % 253) as u8).collect();
    let tensors = vec![tensor("x", Dtype::U8, &[n * 8], true, None)];
    let ops: Vec<_> = (0..n)
        .map(|i| {
            mem(
                i,
                i,
                2 * i,
                vec![span(host(0, i * 8), 8)],
                2 * i + 1,
                vec![span(hbm(i * 8), 8)],
            )
        })
        .collect();
    let bytes = build(tensors, &[(0, x.clone())], &ops, vec![]);
    for threads in [1, 2, 3] {
        let l = run(&bytes, threads, &ReplayOptions::default(), &GemmCrate);
        assert_eq!(l.stats.windows, 5, "{threads} threads");
        assert_eq!(l.stats.max_window_effects, 2160, "{threads} threads");
        let mut got = vec![0u8; x.len()];
        l.replayer.plane().read(hbm(0), &mut got).unwrap();
        assert!(got == x, "{threads} threads");
    }
}
