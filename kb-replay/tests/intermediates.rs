//! `--check-intermediates`: compute inputs are compared with the snapshots
//! Phase 1 captured; the first op whose input differs is named (exit 1).

mod common;

use common::*;
use kb_format::{Dtype, Expr};
use kb_replay::Error;
use kb_replay::app;
use kb_replay::backend::NaiveGemm;
use kb_replay::engine::{Exec, ReplayOptions};

/// host a, b -> tcm; gemm (op 3) in tcm; c -> hbm. Snapshots of op 3's
/// inputs: `a` as given, `b` as given.
fn trace(a_snap: Vec<u8>, b_snap: Vec<u8>) -> Vec<u8> {
    let (m, k, n) = (2usize, 3usize, 2usize);
    let a = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32_bytes(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let (sa, sb, so) = (a.len() as u64, b.len() as u64, (m * n * 4) as u64);
    let out = hbm(0x4_0000);
    let tensors = vec![
        tensor("a", Dtype::F32, &[m as u64, k as u64], true, None),
        tensor("b", Dtype::F32, &[k as u64, n as u64], true, None),
        tensor("c", Dtype::F32, &[m as u64, n as u64], false, Some(out)),
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
            gemm_params(
                m as u32,
                k as u32,
                n as u32,
                Dtype::F32,
                Dtype::F32,
                Dtype::F32,
            ),
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
    let snaps = [(3, 0, a_snap), (3, 1, b_snap)];
    build_with_snapshots(
        tensors,
        &[(0, a), (1, b)],
        &snaps,
        &ops,
        vec![check("c", Expr::Matmul(t("a"), t("b")))],
    )
}

fn replay(bytes: &[u8], check: bool) -> Result<(), Error> {
    let opts = ReplayOptions {
        check_intermediates: check,
        ..ReplayOptions::default()
    };
    app::load_stream(bytes, &opts, &Exec::sequential(&NaiveGemm)).map(|_| ())
}

fn b_bytes() -> Vec<u8> {
    f32_bytes(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
}

#[test]
fn matching_snapshots_pass() {
    let t = trace(f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), b_bytes());
    replay(&t, true).unwrap();
}

#[test]
fn the_first_differing_input_is_named() {
    let mut wrong = b_bytes();
    wrong[9] ^= 0x40; // inside element 2 of b
    let t = trace(f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), wrong);
    match replay(&t, true) {
        Err(Error::Intermediate { op_id, detail, .. }) => {
            assert_eq!(op_id, 3);
            assert!(
                detail.contains("input 1") && detail.contains("byte 9"),
                "{detail}"
            );
        }
        other => panic!("expected an intermediate mismatch, got {other:?}"),
    }
    // Without the flag the snapshots are ignored.
    replay(&t, false).unwrap();
}
