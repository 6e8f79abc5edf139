//! Replay and verification through the library, on traces built in memory.

mod common;

use common::*;
use half::{bf16, f16};
use kb_format::{Dtype, Expr, MathInput, MathOp, OpKind, Params};
use kb_replay::app::{self, Loaded};
use kb_replay::backend::{GemmCrate, NaiveGemm};
use kb_replay::engine::{Exec, Fingerprints, ReplayOptions, Stats};
use kb_replay::verify::{self, OutputReport};
use kb_replay::{Error, npy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn load(bytes: &[u8]) -> Result<Loaded, Error> {
    app::load_stream(
        bytes,
        &ReplayOptions::default(),
        &Exec::sequential(&NaiveGemm),
    )
}

fn replay(bytes: &[u8]) -> Result<(Loaded, Stats), Error> {
    let l = load(bytes)?;
    let stats = l.stats.clone();
    Ok((l, stats))
}

fn verify_spec(l: &Loaded) -> Vec<OutputReport> {
    let checks = verify::plan_checks(l.spec.as_ref(), vec![]);
    verify::verify(l.replayer.plane(), &l.meta, &checks, |_, _| {}).expect("verification runs")
}

/// Bytes of a tensor after replay, through its shards.
fn output(l: &Loaded, name: &str) -> Vec<u8> {
    let (idx, t) = l.meta.tensor(name).expect("tensor");
    verify::gather_tensor(l.replayer.plane(), idx, t).expect("gather")
}

#[test]
fn memory_chain_reproduces_the_input_and_passes() {
    let (bytes, x) = chain_trace();
    let (l, stats) = replay(&bytes).unwrap();
    assert_eq!(f32_of(&output(&l, "y")), x);
    assert_eq!(stats.memory, 5);
    assert_eq!(stats.fingerprints_checked, 1);
    assert_eq!(stats.bytes_read, 128 + 4 * 64);
    assert_eq!(stats.bytes_written, 128 + 4 * 64);
    let r = verify_spec(&l);
    assert_eq!(r.len(), 1);
    assert!(r[0].pass, "{:?}", r[0]);
    assert_eq!(r[0].max_abs_err, 0.0);
    // The mmap path gives the same result.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let m = app::load_mmap(&p, &ReplayOptions::default(), &Exec::sequential(&NaiveGemm)).unwrap();
    assert_eq!(output(&m, "y"), output(&l, "y"));
}

/// `app::run` makes its calling thread the first of its pool: a second
/// run on that thread, and a run from inside another pool, fall back to
/// a pool of its own threads, with the same result.
#[test]
fn runs_on_a_thread_already_in_a_pool_fall_back_to_a_pool_of_their_own() {
    let (bytes, _) = chain_trace();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let cfg = app::Config {
        input: app::Input::Path(p),
        verify: true,
        report: None,
        expect: Vec::new(),
        dump_outputs: None,
        quiet: true,
        allow_unknown: false,
        tolerance: Default::default(),
        threads: Some(2),
        progress: false,
        options: ReplayOptions::default(),
    };
    let run = || {
        let r = app::run(&cfg, &GemmCrate).expect("the run works");
        assert!(r.pass());
        (r.stats.records, r.stats.bytes_written, r.threads)
    };
    let (first, again) = std::thread::scope(|s| s.spawn(|| (run(), run())).join().unwrap());
    assert_eq!(first, again);
    assert_eq!(first.2, 2);
    let other = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(other.install(run), first);
}

#[test]
fn a_wrong_expected_array_fails_at_the_first_differing_element() {
    let (bytes, x) = chain_trace();
    let (l, _) = replay(&bytes).unwrap();
    let mut wrong: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    wrong[13] += 1.0; // [1, 5]
    wrong[30] = f64::NAN; // [3, 6]
    let arr = npy::NpyArray {
        shape: vec![4, 8],
        data: wrong,
    };
    let checks = verify::plan_checks(l.spec.as_ref(), vec![("y".into(), "w.npy".into(), arr)]);
    let r = verify::verify(l.replayer.plane(), &l.meta, &checks, |_, _| {}).unwrap();
    assert!(!r[0].pass);
    assert_eq!(r[0].mismatches, 2);
    let m = r[0].first_mismatch.as_ref().unwrap();
    assert_eq!(m.index, [1, 5]);
    assert_eq!(m.got, x[13] as f64);
    assert_eq!(m.expected, x[13] as f64 + 1.0);
    assert_eq!(r[0].max_abs_err, 1.0);
}

#[test]
fn effects_apply_in_seq_order_not_start_time_order() {
    // x = 1..4, z = 100..103 (u8). op 1 starts first but writes L last (seq 5);
    // op 2 starts later but writes L first (seq 3). op 3 reads L at seq 4,
    // between the two writes; op 4 reads L at seq 6, after both.
    let x = vec![1u8, 2, 3, 4];
    let z = vec![100u8, 101, 102, 103];
    let l_addr = hbm(0x400);
    let tensors = vec![
        tensor("x", Dtype::U8, &[4], true, None),
        tensor("z", Dtype::U8, &[4], true, None),
        tensor("mid", Dtype::U8, &[4], false, Some(hbm(0x800))),
        tensor("last", Dtype::U8, &[4], false, Some(hbm(0xc00))),
    ];
    let ops = [
        mem(1, 0, 1, vec![span(host(0, 0), 4)], 5, vec![span(l_addr, 4)]),
        mem(
            2,
            50,
            2,
            vec![span(host(1, 0), 4)],
            3,
            vec![span(l_addr, 4)],
        ),
        mem(
            3,
            60,
            4,
            vec![span(l_addr, 4)],
            4,
            vec![span(hbm(0x800), 4)],
        ),
        mem(
            4,
            70,
            6,
            vec![span(l_addr, 4)],
            7,
            vec![span(hbm(0xc00), 4)],
        ),
    ];
    let bytes = build(
        tensors,
        &[(0, x.clone()), (1, z.clone())],
        &ops,
        vec![
            check("mid", Expr::Tensor("z".into())),
            check("last", Expr::Tensor("x".into())),
        ],
    );
    let (l, _) = replay(&bytes).unwrap();
    // seq order: op2 writes z (3), op3 reads z (4), op1 writes x (5), op4 reads x (6).
    assert_eq!(output(&l, "mid"), z);
    assert_eq!(output(&l, "last"), x);
    assert!(verify_spec(&l).iter().all(|r| r.pass));
}

#[test]
fn a_memory_op_writes_what_it_read_at_its_read_seq() {
    // op 1 reads A at seq 1 and writes B at seq 4; op 2 overwrites A at seq 2.
    // B must get A's old bytes (read at seq 1), not the new ones.
    let tensors = vec![
        tensor("old", Dtype::U8, &[2], true, None),
        tensor("new", Dtype::U8, &[2], true, None),
        tensor("b", Dtype::U8, &[2], false, Some(hbm(0x100))),
    ];
    let a = hbm(0);
    let ops = [
        mem(1, 0, 0, vec![span(host(0, 0), 2)], 0, vec![span(a, 2)]),
        mem(2, 10, 1, vec![span(a, 2)], 4, vec![span(hbm(0x100), 2)]),
        mem(3, 20, 2, vec![span(host(1, 0), 2)], 2, vec![span(a, 2)]),
    ];
    let bytes = build(tensors, &[(0, vec![7, 8]), (1, vec![9, 9])], &ops, vec![]);
    let (l, _) = replay(&bytes).unwrap();
    assert_eq!(output(&l, "b"), [7, 8]);
}

#[test]
fn fingerprint_mismatch_names_the_op() {
    let (_, _) = chain_trace();
    let x = vec![5u8; 16];
    let tensors = vec![
        tensor("x", Dtype::U8, &[16], true, None),
        tensor("y", Dtype::U8, &[16], false, Some(tcm(0))),
    ];
    let mut ops = vec![
        mem(
            6,
            0,
            1,
            vec![span(host(0, 0), 16)],
            2,
            vec![span(hbm(0), 16)],
        ),
        mem(7, 10, 3, vec![span(hbm(0), 16)], 4, vec![span(tcm(0), 16)]),
    ];
    ops[0].fingerprint = Some(kb_format::fingerprint(&x));
    ops[1].fingerprint = Some(kb_format::fingerprint(&x) ^ 1);
    ops[1].component = "sip0.cube0.pe3.pe_dma".into();
    ops[1].name = "dma_read".into();
    let bytes = build(tensors, &[(0, x)], &ops, vec![]);
    let err = replay(&bytes).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Op { op_id: 7, .. }), "{msg}");
    assert!(
        msg.contains("op 7 (dma_read on sip0.cube0.pe3.pe_dma at 0.010 ns)"),
        "{msg}"
    );
    assert!(msg.contains("fingerprint mismatch"), "{msg}");
    assert!(msg.contains("sip0.cube0.pe0.hbm+0x0 [16 B]"), "{msg}");
    assert!(msg.contains("sip0.cube0.pe0.tcm+0x0 [16 B]"), "{msg}");
}

/// A load gathering strided rows into one contiguous tile: its fingerprint
/// is checked on the written tile (fewer pieces), and a wrong one is still
/// an error naming the op; the right one passes.
#[test]
fn a_strided_load_checks_its_fingerprint_on_the_written_tile() {
    let x: Vec<u8> = (0..32).collect();
    let rows: Vec<u8> = (0..4).flat_map(|r| 8 * r..8 * r + 4).collect();
    for wrong in [false, true] {
        let tensors = vec![
            tensor("x", Dtype::U8, &[32], true, None),
            tensor("y", Dtype::U8, &[16], false, Some(tcm(0))),
        ];
        let mut ops = vec![
            mem(
                6,
                0,
                1,
                vec![span(host(0, 0), 32)],
                2,
                vec![span(hbm(0), 32)],
            ),
            mem(
                7,
                10,
                3,
                vec![strided(hbm(0), 4, 4, 8)],
                4,
                vec![span(tcm(0), 16)],
            ),
        ];
        ops[0].fingerprint = Some(kb_format::fingerprint(&x));
        ops[1].fingerprint = Some(kb_format::fingerprint(&rows) ^ wrong as u64);
        let bytes = build(tensors, &[(0, x.clone())], &ops, vec![]);
        match replay(&bytes) {
            Ok((l, stats)) => {
                assert!(!wrong);
                assert_eq!(output(&l, "y"), rows);
                assert_eq!(stats.fingerprints_checked, 2);
            }
            Err(err) => {
                let msg = err.to_string();
                assert!(wrong, "{msg}");
                assert!(matches!(err, Error::Op { op_id: 7, .. }), "{msg}");
                assert!(msg.contains("fingerprint mismatch"), "{msg}");
                assert!(msg.contains("[4 x 4 B, stride 8]"), "{msg}");
            }
        }
    }
}

/// A write whose rows overlap (stride below the row size) keeps only the
/// last bytes written, so its fingerprint is checked on what was read.
#[test]
fn a_load_with_overlapping_destination_rows_checks_the_bytes_it_read() {
    let x: Vec<u8> = (1..=32).collect();
    let src: Vec<u8> = (0..4).flat_map(|r| x[8 * r..8 * r + 4].to_vec()).collect();
    let tensors = vec![
        tensor("x", Dtype::U8, &[32], true, None),
        tensor("y", Dtype::U8, &[16], false, Some(tcm(0))),
    ];
    let mut ops = vec![
        mem(
            6,
            0,
            1,
            vec![span(host(0, 0), 32)],
            2,
            vec![span(hbm(0), 32)],
        ),
        // 16 bytes from four strided rows into two 8-byte rows 4 apart.
        mem(
            7,
            10,
            3,
            vec![strided(hbm(0), 4, 4, 8)],
            4,
            vec![strided(tcm(0), 8, 2, 4)],
        ),
    ];
    ops[0].fingerprint = Some(kb_format::fingerprint(&x));
    ops[1].fingerprint = Some(kb_format::fingerprint(&src));
    let bytes = build(tensors, &[(0, x.clone())], &ops, vec![]);
    let (l, stats) = replay(&bytes).expect("the fingerprint of the bytes read matches");
    assert_eq!(stats.fingerprints_checked, 2);
    // Row 1 overwrote bytes 4..8 of row 0.
    let want: Vec<u8> = [&src[..4], &src[8..16]].concat();
    assert_eq!(output(&l, "y")[..12], want[..]);
}

#[test]
fn unequal_read_and_write_sizes_are_an_error() {
    let tensors = vec![tensor("x", Dtype::U8, &[8], true, None)];
    let ops = [mem(
        3,
        0,
        1,
        vec![span(host(0, 0), 8)],
        2,
        vec![span(hbm(0), 6)],
    )];
    let bytes = build(tensors, &[(0, vec![1; 8])], &ops, vec![]);
    let msg = replay(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("op 3") && msg.contains("reads 8 bytes"),
        "{msg}"
    );
}

#[test]
fn reading_past_a_host_tensor_is_an_error() {
    let tensors = vec![tensor("x", Dtype::U8, &[8], true, None)];
    let ops = [mem(
        3,
        0,
        1,
        vec![span(host(0, 4), 8)],
        2,
        vec![span(hbm(0), 8)],
    )];
    let bytes = build(tensors, &[(0, vec![1; 8])], &ops, vec![]);
    let msg = replay(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("op 3") && msg.contains("past the end of tensor 0's 8 bytes of host data"),
        "{msg}"
    );
}

#[test]
fn unknown_ops_are_skipped_and_counted() {
    let (bytes, x) = {
        let x = vec![3u8; 4];
        let tensors = vec![
            tensor("x", Dtype::U8, &[4], true, None),
            tensor("y", Dtype::U8, &[4], false, Some(hbm(0))),
        ];
        let mut unknown = mem(2, 5, 3, vec![span(host(0, 0), 4)], 4, vec![span(hbm(0), 4)]);
        unknown.kind = OpKind::Unknown(42);
        unknown.params = Params::Raw(vec![1, 2, 3]);
        let ops = [unknown];
        (build(tensors, &[(0, x.clone())], &ops, vec![]), x)
    };
    let (l, stats) = replay(&bytes).unwrap();
    assert_eq!(stats.unknown_skipped, 1);
    assert_eq!(stats.memory, 0);
    // Its write was not applied.
    assert_ne!(output(&l, "y"), x);
}

fn rand_values(rng: &mut StdRng, n: usize, dtype: Dtype) -> Vec<f64> {
    (0..n)
        .map(|_| match dtype {
            Dtype::I8 => rng.random_range(-128i32..=127) as f64,
            Dtype::I32 => rng.random_range(-5_000i32..=5_000) as f64,
            _ => rng.random_range(-1.0f64..1.0),
        })
        .collect()
}

/// Encode values as `dtype` and return the bytes with the values as stored.
fn encode(vals: &[f64], dtype: Dtype) -> (Vec<u8>, Vec<f64>) {
    let mut b = Vec::new();
    let mut stored = Vec::new();
    for &v in vals {
        match dtype {
            Dtype::F32 => {
                b.extend((v as f32).to_le_bytes());
                stored.push(v as f32 as f64);
            }
            Dtype::F16 => {
                let h = f16::from_f64(v);
                b.extend(h.to_le_bytes());
                stored.push(h.to_f64());
            }
            Dtype::Bf16 => {
                let h = bf16::from_f64(v);
                b.extend(h.to_le_bytes());
                stored.push(h.to_f64());
            }
            Dtype::I8 => {
                b.push(v as i8 as u8);
                stored.push(v as i8 as f64);
            }
            Dtype::I32 => {
                b.extend((v as i32).to_le_bytes());
                stored.push(v as i32 as f64);
            }
            _ => unreachable!(),
        }
    }
    (b, stored)
}

fn decode(b: &[u8], dtype: Dtype) -> Vec<f64> {
    match dtype {
        Dtype::F32 => f32_of(b).into_iter().map(f64::from).collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        Dtype::Bf16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        Dtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        _ => unreachable!(),
    }
}

fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// host a, b -> tcm; gemm in tcm -> tcm c; c -> hbm out.
fn gemm_case(din: Dtype, dacc: Dtype, dout: Dtype, tol: f64, seed: u64) {
    let (m, k, n) = (5usize, 24usize, 7usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let (ab, a) = encode(&rand_values(&mut rng, m * k, din), din);
    let (bb, b) = encode(&rand_values(&mut rng, k * n, din), din);
    let (sa, sb, so) = (
        ab.len() as u64,
        bb.len() as u64,
        (m * n * dout.size()) as u64,
    );
    let out = hbm(0x4_0000);
    let tensors = vec![
        tensor("a", din, &[m as u64, k as u64], true, None),
        tensor("b", din, &[k as u64, n as u64], true, None),
        tensor("c", dout, &[m as u64, n as u64], false, Some(out)),
    ];
    let ops = [
        mem(
            1,
            0,
            1,
            vec![span(host(0, 0), sa)],
            2,
            vec![span(tcm(0), sa)],
        ),
        mem(
            2,
            0,
            3,
            vec![span(host(1, 0), sb)],
            4,
            vec![span(tcm(0x1000), sb)],
        ),
        gemm(
            3,
            100,
            5,
            gemm_params(m as u32, k as u32, n as u32, din, dacc, dout),
            vec![span(tcm(0), sa), span(tcm(0x1000), sb)],
            vec![span(tcm(0x2000), so)],
        ),
        mem(
            4,
            200,
            6,
            vec![span(tcm(0x2000), so)],
            7,
            vec![span(out, so)],
        ),
    ];
    let bytes = build(
        tensors,
        &[(0, ab), (1, bb)],
        &ops,
        vec![check("c", Expr::Matmul(t("a"), t("b")))],
    );
    let (l, stats) = replay(&bytes).unwrap();
    assert_eq!(stats.gemm, 1);
    assert_eq!(stats.gemm_flops, (2 * m * n * k) as u64);
    let got = decode(&output(&l, "c"), dout);
    let want = matmul_f64(&a, &b, m, k, n);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol + tol * w.abs(),
            "{din}->{dout} element {i}: got {g}, want {w}"
        );
    }
    let r = verify_spec(&l);
    assert!(r[0].pass, "{:?}", r[0]);
    // The default backend on two threads: the same verdict, and the bits
    // of its own one-thread run.
    let pool2 = app::thread_pool(Some(2)).unwrap();
    let pool1 = app::thread_pool(Some(1)).unwrap();
    let mut outs = Vec::new();
    for p in [&pool1, &pool2] {
        let exec = Exec {
            backend: &GemmCrate,
            pool: Some(p),
        };
        let l = app::load_stream(&bytes[..], &ReplayOptions::default(), &exec).unwrap();
        assert!(verify_spec(&l)[0].pass, "{din} default backend");
        outs.push(output(&l, "c"));
    }
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn gemm_i32_inputs_accumulate_exactly() {
    gemm_case(Dtype::I32, Dtype::I32, Dtype::I32, 0.0, 6);
}

#[test]
fn gemm_f32_matches_an_f64_reference() {
    gemm_case(Dtype::F32, Dtype::F32, Dtype::F32, 1e-5, 1);
}

#[test]
fn gemm_f16_accumulates_in_f32() {
    gemm_case(Dtype::F16, Dtype::F32, Dtype::F16, 1e-3, 2);
    gemm_case(Dtype::F16, Dtype::F32, Dtype::F32, 1e-5, 3);
}

#[test]
fn gemm_bf16_accumulates_in_f32() {
    gemm_case(Dtype::Bf16, Dtype::F32, Dtype::Bf16, 1e-2, 4);
}

#[test]
fn gemm_i8_accumulates_in_i32_exactly() {
    gemm_case(Dtype::I8, Dtype::I32, Dtype::I32, 0.0, 5);
}

#[test]
fn a_wrong_gemm_is_caught_by_verification() {
    // The same trace, but the spec claims c = a . b + 1.
    let (m, k, n) = (2u32, 3u32, 2u32);
    let a = f32_bytes(&[1., 2., 3., 4., 5., 6.]);
    let b = f32_bytes(&[7., 8., 9., 10., 11., 12.]);
    let tensors = vec![
        tensor("a", Dtype::F32, &[2, 3], true, None),
        tensor("b", Dtype::F32, &[3, 2], true, None),
        tensor("c", Dtype::F32, &[2, 2], false, Some(hbm(0x100))),
    ];
    let ops = [gemm(
        1,
        0,
        1,
        gemm_params(m, k, n, Dtype::F32, Dtype::F32, Dtype::F32),
        vec![span(host(0, 0), 24), span(host(1, 0), 24)],
        vec![span(hbm(0x100), 16)],
    )];
    let wrong = Expr::Add(
        Box::new(Expr::Matmul(t("a"), t("b"))),
        Box::new(Expr::Scalar(1.0)),
    );
    let bytes = build(tensors, &[(0, a), (1, b)], &ops, vec![check("c", wrong)]);
    let (l, _) = replay(&bytes).unwrap();
    assert_eq!(f32_of(&output(&l, "c")), [58., 64., 139., 154.]);
    let r = verify_spec(&l);
    assert!(!r[0].pass);
    assert_eq!(r[0].mismatches, 4);
    assert_eq!(r[0].first_mismatch.as_ref().unwrap().index, [0, 0]);
}

#[test]
fn softmax_built_from_math_ops_matches_the_reference() {
    // y = softmax(x, axis 1) as max-reduce, sub (column broadcast), exp,
    // sum-reduce, div (column broadcast); then z = y * 2 + bias (row
    // broadcast, scalar).
    let (r, c) = (4u32, 8u32);
    let mut rng = StdRng::seed_from_u64(9);
    let x: Vec<f32> = (0..r * c).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    let bias: Vec<f32> = (0..c).map(|j| j as f32 * 0.25).collect();
    let f = Dtype::F32;
    let n = (r * c * 4) as u64;
    let (xa, ma, da, ea, sa, ya, za) = (
        tcm(0),
        tcm(0x400),
        tcm(0x800),
        tcm(0xc00),
        tcm(0x1000),
        tcm(0x1400),
        hbm(0x8000),
    );
    let tensors = vec![
        tensor("x", f, &[r as u64, c as u64], true, None),
        tensor("bias", f, &[c as u64], true, None),
        tensor("y", f, &[r as u64, c as u64], false, Some(ya)),
        tensor("z", f, &[r as u64, c as u64], false, Some(za)),
    ];
    let col = (r * 4) as u64;
    let ops = [
        mem(1, 0, 1, vec![span(host(0, 0), n)], 2, vec![span(xa, n)]),
        math(
            2,
            10,
            3,
            MathOp::ReduceMax,
            vec![tile(r, c, f)],
            (r, 1, f),
            Some(1),
            vec![span(xa, n)],
            vec![span(ma, col)],
        ),
        math(
            3,
            20,
            4,
            MathOp::Sub,
            vec![tile(r, c, f), tile(r, 1, f)],
            (r, c, f),
            None,
            vec![span(xa, n), span(ma, col)],
            vec![span(da, n)],
        ),
        math(
            4,
            30,
            5,
            MathOp::Exp,
            vec![tile(r, c, f)],
            (r, c, f),
            None,
            vec![span(da, n)],
            vec![span(ea, n)],
        ),
        math(
            5,
            40,
            6,
            MathOp::Sum,
            vec![tile(r, c, f)],
            (r, 1, f),
            Some(1),
            vec![span(ea, n)],
            vec![span(sa, col)],
        ),
        math(
            6,
            50,
            7,
            MathOp::Div,
            vec![tile(r, c, f), tile(r, 1, f)],
            (r, c, f),
            None,
            vec![span(ea, n), span(sa, col)],
            vec![span(ya, n)],
        ),
        math(
            7,
            60,
            8,
            MathOp::Mul,
            vec![tile(r, c, f), MathInput::Scalar(2.0)],
            (r, c, f),
            None,
            vec![span(ya, n)],
            vec![span(da, n)],
        ),
        math(
            8,
            70,
            9,
            MathOp::Add,
            vec![tile(r, c, f), tile(1, c, f)],
            (r, c, f),
            None,
            vec![span(da, n), span(host(1, 0), (c * 4) as u64)],
            vec![span(za, n)],
        ),
    ];
    let softmax = Expr::Softmax {
        input: t("x"),
        axis: 1,
    };
    let z_ref = Expr::Add(
        Box::new(Expr::Mul(
            Box::new(softmax.clone()),
            Box::new(Expr::Scalar(2.0)),
        )),
        t("bias"),
    );
    let bytes = build(
        tensors,
        &[(0, f32_bytes(&x)), (1, f32_bytes(&bias))],
        &ops,
        vec![check("y", softmax), check("z", z_ref)],
    );
    let (l, stats) = replay(&bytes).unwrap();
    assert_eq!(stats.math, 7);
    let y = f32_of(&output(&l, "y"));
    // Independent check: each row sums to 1 and matches a hand-rolled softmax.
    for i in 0..r as usize {
        let row = &x[i * c as usize..(i + 1) * c as usize];
        let mx = row.iter().fold(f64::MIN, |a, &v| a.max(v as f64));
        let den: f64 = row.iter().map(|&v| (v as f64 - mx).exp()).sum();
        for j in 0..c as usize {
            let want = (row[j] as f64 - mx).exp() / den;
            assert!((y[i * c as usize + j] as f64 - want).abs() < 1e-6);
        }
        let s: f32 = y[i * c as usize..(i + 1) * c as usize].iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
    }
    let reports = verify_spec(&l);
    assert!(reports.iter().all(|r| r.pass), "{reports:?}");
}

#[test]
fn where_cast_and_axis0_reductions_in_a_trace() {
    let f = Dtype::F32;
    // x 2x3 f32, mask 2x3 u8.
    let x = f32_bytes(&[1., -2., 3., -4., 5., -6.]);
    let mask = vec![1u8, 0, 1, 0, 1, 0];
    let tensors = vec![
        tensor("x", f, &[2, 3], true, None),
        tensor("mask", Dtype::U8, &[2, 3], true, None),
        tensor("w", f, &[2, 3], false, Some(hbm(0))),
        tensor("colsum", f, &[3], false, Some(hbm(0x100))),
        tensor("h", Dtype::F16, &[2, 3], false, Some(hbm(0x200))),
        tensor("rowsum", f, &[2], false, Some(hbm(0x300))),
    ];
    let ops = [
        math(
            1,
            0,
            1,
            MathOp::Where,
            vec![tile(2, 3, Dtype::U8), tile(2, 3, f), MathInput::Scalar(0.0)],
            (2, 3, f),
            None,
            vec![span(host(1, 0), 6), span(host(0, 0), 24)],
            vec![span(hbm(0), 24)],
        ),
        math(
            2,
            10,
            2,
            MathOp::Sum,
            vec![tile(2, 3, f)],
            (1, 3, f),
            Some(0),
            vec![span(hbm(0), 24)],
            vec![span(hbm(0x100), 12)],
        ),
        math(
            3,
            20,
            3,
            MathOp::Cast,
            vec![tile(2, 3, f)],
            (2, 3, Dtype::F16),
            None,
            vec![span(host(0, 0), 24)],
            vec![span(hbm(0x200), 12)],
        ),
        math(
            4,
            30,
            4,
            MathOp::Sum,
            vec![tile(2, 3, f)],
            (2, 1, f),
            Some(1),
            vec![span(host(0, 0), 24)],
            vec![span(hbm(0x300), 8)],
        ),
    ];
    let bytes = build(
        tensors,
        &[(0, x), (1, mask)],
        &ops,
        vec![
            check("h", Expr::Tensor("x".into())),
            // A 2 x 1 reference for a [2] output: both are vectors.
            check(
                "rowsum",
                Expr::Sum {
                    input: t("x"),
                    axis: 1,
                },
            ),
        ],
    );
    let (l, _) = replay(&bytes).unwrap();
    assert_eq!(f32_of(&output(&l, "w")), [1., 0., 3., 0., 5., 0.]);
    assert_eq!(f32_of(&output(&l, "colsum")), [1., 5., 3.]);
    assert_eq!(
        decode(&output(&l, "h"), Dtype::F16),
        [1., -2., 3., -4., 5., -6.]
    );
    assert_eq!(f32_of(&output(&l, "rowsum")), [2., -5.]);
    let r = verify_spec(&l);
    assert!(r.iter().all(|r| r.pass), "{r:?}");
    assert_eq!(r.len(), 2);
}

#[test]
fn compute_op_size_disagreements_name_the_op() {
    let tensors = vec![tensor("a", Dtype::F32, &[2, 2], true, None)];
    // A 2x2x2 gemm needs 32 operand bytes; give it 16.
    let ops = [gemm(
        9,
        0,
        1,
        gemm_params(2, 2, 2, Dtype::F32, Dtype::F32, Dtype::F32),
        vec![span(host(0, 0), 16)],
        vec![span(hbm(0), 16)],
    )];
    let bytes = build(tensors, &[(0, vec![0; 16])], &ops, vec![]);
    let msg = replay(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("op 9") && msg.contains("read ranges cover 16 bytes, but its params say 32"),
        "{msg}"
    );
}

#[test]
fn every_truncation_of_a_stream_is_an_error_not_a_panic() {
    let (bytes, _) = chain_trace();
    for cut in 0..bytes.len() {
        let err = load(&bytes[..cut]).map(|_| ()).unwrap_err();
        assert!(err.is_truncation(), "cut at {cut}: {err}");
    }
    assert!(load(&bytes).is_ok());
}

#[test]
fn corrupted_bytes_are_errors_not_panics() {
    let (bytes, _) = chain_trace();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    let mut rng = StdRng::seed_from_u64(77);
    for _ in 0..300 {
        let mut b = bytes.clone();
        let i = rng.random_range(0..b.len());
        b[i] ^= 1 << rng.random_range(0..8);
        // Either path may succeed (a flip in padding the stream reader does
        // not hash), fail cleanly, or replay; none may panic.
        let _ = load(&b);
        std::fs::write(&p, &b).unwrap();
        let _ = app::load_mmap(&p, &ReplayOptions::default(), &Exec::sequential(&NaiveGemm));
    }
}

/// Host data copied to HBM, then loads of the same HBM bytes into TCM
/// (ops 1..=4, alternating two TCM buffers), with the fingerprints given
/// (`None`: the right one).
fn loads(fps: [Option<u64>; 4]) -> (Vec<u8>, u64) {
    let x: Vec<u8> = (0..64).map(|i| (i * 7) as u8).collect();
    let right = kb_format::fingerprint(&x[16..48]);
    let tensors = vec![
        tensor("x", Dtype::U8, &[64], true, None),
        tensor("y", Dtype::U8, &[32], false, Some(tcm(0))),
    ];
    let mut deploy = mem(
        0,
        0,
        0,
        vec![span(host(0, 0), 64)],
        1,
        vec![span(hbm(0), 64)],
    );
    deploy.fingerprint = Some(kb_format::fingerprint(&x));
    let mut ops = vec![deploy];
    for (i, fp) in fps.iter().enumerate() {
        let id = i as u64 + 1;
        let mut op = mem(
            id,
            10 * id,
            2 * id,
            vec![span(hbm(16), 32)],
            2 * id + 1,
            vec![span(tcm((i as u64 % 2) * 64), 32)],
        );
        op.fingerprint = Some(fp.unwrap_or(right));
        ops.push(op);
    }
    (build(tensors, &[(0, x)], &ops, vec![]), right)
}

fn replay_with(bytes: &[u8], fingerprints: Fingerprints) -> Result<Loaded, Error> {
    let opts = ReplayOptions {
        fingerprints,
        ..ReplayOptions::default()
    };
    app::load_stream(bytes, &opts, &Exec::sequential(&NaiveGemm))
}

/// Loads of the same unchanged bytes with the same recorded fingerprint
/// are checked by one hash; a load whose recorded fingerprint differs is
/// hashed itself, and fails, whatever came before.
#[test]
fn repeated_loads_of_unchanged_bytes_share_one_hash() {
    let (bytes, right) = loads([None; 4]);
    let l = replay_with(&bytes, Fingerprints::All).unwrap();
    let s = &l.stats;
    assert_eq!(s.fingerprints_checked, 5);
    assert_eq!(s.fingerprints_reused, 3);
    // The deploy's 64 bytes and the first load's 32.
    assert_eq!(s.fingerprint_bytes, 64 + 32);
    assert_eq!(s.copies_elided, 5);
    for bad in 0..4 {
        let mut fps = [None; 4];
        fps[bad] = Some(right ^ 1);
        let (bytes, _) = loads(fps);
        let err = replay_with(&bytes, Fingerprints::All).unwrap_err();
        assert!(
            matches!(err, Error::Op { op_id, .. } if op_id == bad as u64 + 1),
            "{err}"
        );
        assert!(err.to_string().contains("fingerprint mismatch"), "{err}");
        // Off: trusted, nothing checked.
        let l = replay_with(&bytes, Fingerprints::Off).unwrap();
        assert_eq!(
            (l.stats.fingerprints_checked, l.stats.fingerprints_skipped),
            (0, 5)
        );
        assert_eq!(
            output(&l, "y"),
            output(
                &replay_with(&loads([None; 4]).0, Fingerprints::All).unwrap(),
                "y"
            )
        );
        // Sample: checked exactly when the op is sampled.
        let sampled = kb_replay::engine::sampled(bad as u64 + 1);
        match replay_with(&bytes, Fingerprints::Sample) {
            Ok(l) => {
                assert!(!sampled, "op {} is sampled", bad + 1);
                assert_eq!(
                    l.stats.fingerprints_checked + l.stats.fingerprints_skipped,
                    5
                );
            }
            Err(e) => {
                assert!(sampled && matches!(e, Error::Op { op_id, .. } if op_id == bad as u64 + 1))
            }
        }
    }
    // The same wrong fingerprint twice: the first fails.
    let (bytes, _) = loads([None, Some(right ^ 1), Some(right ^ 1), None]);
    let err = replay_with(&bytes, Fingerprints::All).unwrap_err();
    assert!(matches!(err, Error::Op { op_id: 2, .. }), "{err}");
}

/// Sampling picks about one op in 16.
#[test]
fn sampling_checks_about_one_op_in_16() {
    let n = (0..16_000u64)
        .filter(|&i| kb_replay::engine::sampled(i))
        .count();
    assert!((800..1200).contains(&n), "{n}");
}

/// A lazy copy whose source changes before its destination is read keeps
/// the bytes it had: the copy is done (materialized) first.
#[test]
fn a_lazy_copy_keeps_its_bytes_when_its_source_changes() {
    let x: Vec<u8> = (1..=32).collect();
    let tensors = vec![
        tensor("x", Dtype::U8, &[32], true, None),
        tensor("y", Dtype::U8, &[16], false, Some(tcm(0))),
        tensor("z", Dtype::U8, &[16], false, Some(hbm(0))),
    ];
    let ops = vec![
        // hbm[0..16] := host[0..16]; tcm := hbm (lazily, through to host).
        mem(
            1,
            0,
            0,
            vec![span(host(0, 0), 16)],
            1,
            vec![span(hbm(0), 16)],
        ),
        mem(2, 10, 2, vec![span(hbm(0), 16)], 3, vec![span(tcm(0), 16)]),
        // hbm[0..16] := host[16..32], then tcm[0..4] := hbm[8..12].
        mem(
            3,
            20,
            4,
            vec![span(host(0, 16), 16)],
            5,
            vec![span(hbm(0), 16)],
        ),
        mem(4, 30, 6, vec![span(hbm(8), 4)], 7, vec![span(tcm(0), 4)]),
        // A strided store over hbm (rows 0 and 2 of 4) cuts through its
        // lazy bytes.
        mem(
            5,
            40,
            8,
            vec![span(tcm(4), 4)],
            9,
            vec![strided(hbm(0), 2, 2, 8)],
        ),
    ];
    let bytes = build(tensors, &[(0, x.clone())], &ops, vec![]);
    for elide in [true, false] {
        let opts = ReplayOptions {
            elide,
            ..ReplayOptions::default()
        };
        let l = app::load_stream(&bytes[..], &opts, &Exec::sequential(&NaiveGemm)).unwrap();
        let y: Vec<u8> = x[24..28].iter().chain(&x[4..16]).copied().collect();
        assert_eq!(output(&l, "y"), y, "elide {elide}");
        let mut z = x[16..32].to_vec();
        z[0..2].copy_from_slice(&y[4..6]);
        z[8..10].copy_from_slice(&y[6..8]);
        assert_eq!(output(&l, "z"), z, "elide {elide}");
        assert_eq!(l.stats.copies_elided > 0, elide);
        // The strided store cut through HBM's lazy bytes: copied first.
        assert_eq!(l.stats.materialized > 0, elide);
    }
}
