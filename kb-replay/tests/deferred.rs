//! Reads whose writes come in a later window: the write copies (or
//! aliases) the bytes where they still lie, and a physical write to them
//! before it, in a later window, captures them first. Each case's result
//! is worked out by hand from the trace, for windows of one effect (every
//! read and write in a window of its own) up to one window for all, on
//! one to three threads, with copy elision on and off.

mod common;

use common::*;
use kb_format::Dtype;
use kb_replay::app::{self, Loaded};
use kb_replay::backend::GemmCrate;
use kb_replay::engine::{Exec, ReplayOptions};

const N: u64 = 64;

/// The host input: 4 x 64 distinct bytes.
fn input() -> Vec<u8> {
    (0..4 * N).map(|i| (i * 7 + 3) as u8).collect()
}

/// The deploy (host -> HBM, seqs 0 and 1) and loads of the input's
/// quarters `q` to TCM offsets (each a read and, right after, its write).
fn trace(rest: Vec<Op>) -> Vec<u8> {
    let tensors = vec![tensor("x", Dtype::U8, &[4 * N], true, None)];
    let mut ops = vec![mem(
        0,
        0,
        0,
        vec![span(host(0, 0), 4 * N)],
        1,
        vec![span(hbm(0), 4 * N)],
    )];
    ops.extend(rest);
    // One record per chunk, so a window may close between any two.
    build_chunked(tensors, &[(0, input())], &ops, vec![], Some(1))
}

fn replay(bytes: &[u8], threads: usize, window: usize, elide: bool) -> Loaded {
    let opts = ReplayOptions {
        window,
        elide,
        ..ReplayOptions::default()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let exec = Exec {
        backend: &GemmCrate,
        pool: Some(&pool),
    };
    app::load_stream(bytes, &opts, &exec).expect("replay")
}

fn read(l: &Loaded, pa: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    l.replayer.plane().read(pa, &mut b).unwrap();
    b
}

/// Every window size, thread count and elision setting: `check` sees
/// each replay (and whether copies were elided); returns how many of them planned more than 3 windows.
fn each_replay(bytes: &[u8], check: impl Fn(&Loaded, bool, &str)) -> usize {
    let mut split = 0;
    for window in [1, 2, 3, 5, 4096] {
        for threads in [1, 2, 3] {
            for elide in [true, false] {
                let l = replay(bytes, threads, window, elide);
                let what = format!("window {window}, {threads} threads, elide {elide}");
                check(&l, elide, &what);
                split += (l.stats.windows > 3) as usize;
            }
        }
    }
    split
}

#[test]
fn a_later_write_to_the_bytes_read_captures_them_first() {
    let x = input();
    // 1: HBM quarter 0 -> TCM 0. 2 reads TCM 0 (seq 4), writes TCM 1 KiB
    // at seq 9; in between 3 loads quarter 1 over TCM 0 (seqs 5, 6) and 4
    // copies TCM 0 to TCM 2 KiB (seqs 7, 8).
    let bytes = trace(vec![
        mem(1, 1, 2, vec![span(hbm(0), N)], 3, vec![span(tcm(0), N)]),
        mem(2, 2, 4, vec![span(tcm(0), N)], 9, vec![span(tcm(1024), N)]),
        mem(3, 3, 5, vec![span(hbm(N), N)], 6, vec![span(tcm(0), N)]),
        mem(4, 4, 7, vec![span(tcm(0), N)], 8, vec![span(tcm(2048), N)]),
    ]);
    let split = each_replay(&bytes, |l, elide, what| {
        assert_eq!(
            read(l, tcm(1024), N),
            x[..N as usize],
            "{what}: op 2's copy"
        );
        assert_eq!(read(l, tcm(0), N), x[N as usize..2 * N as usize], "{what}");
        assert_eq!(
            read(l, tcm(2048), N),
            x[N as usize..2 * N as usize],
            "{what}"
        );
        // Copied physically, TCM 0 is what 2 read and 3 overwrites: 2's
        // bytes are captured once. Elided, 2 reads HBM (TCM 0 is an alias
        // of it) and 3 only changes the alias: nothing to capture.
        let captured = if elide { 0 } else { 1 };
        assert_eq!(l.stats.captured, captured, "{what}");
    });
    assert!(split > 0, "some replays put the read and write apart");
}

#[test]
fn a_deferred_read_whose_own_write_overlaps_it_captures_first() {
    let x = input();
    // 2 reads TCM 0..64 at seq 4 and writes TCM 32..96 at seq 6 (a
    // shift within the buffer); 3 reads TCM 64..96 in between (seq 5).
    let bytes = trace(vec![
        mem(
            1,
            1,
            2,
            vec![span(hbm(0), 2 * N)],
            3,
            vec![span(tcm(0), 2 * N)],
        ),
        mem(2, 2, 4, vec![span(tcm(0), N)], 6, vec![span(tcm(N / 2), N)]),
        mem(
            3,
            3,
            5,
            vec![span(tcm(N), N / 2)],
            7,
            vec![span(hbm(3 * N), N / 2)],
        ),
    ]);
    let split = each_replay(&bytes, |l, _, what| {
        let mut want = x[..2 * N as usize].to_vec();
        want.copy_within(..N as usize, N as usize / 2);
        assert_eq!(read(l, tcm(0), 2 * N), want, "{what}");
        // 3 read the bytes before 2's write moved them.
        assert_eq!(
            read(l, hbm(3 * N), N / 2),
            x[N as usize..3 * N as usize / 2],
            "{what}"
        );
    });
    assert!(split > 0);
}

#[test]
fn a_deferred_read_spans_windows_and_its_alias_outlives_them() {
    let x = input();
    // 2 reads TCM 0 at seq 4 and writes TCM 1 KiB at seq 11 (strided:
    // two rows of 32 bytes 128 apart, so it is copied, not aliased) and 5
    // reads TCM 0 at seq 5 and writes TCM 3 KiB at seq 12 (contiguous:
    // an alias); between them 3 and 4 move other bytes (seqs 6-9) and 6
    // loads quarter 2 over TCM 0 (seqs 10, 13).
    let bytes = trace(vec![
        mem(1, 1, 2, vec![span(hbm(0), N)], 3, vec![span(tcm(0), N)]),
        mem(
            2,
            2,
            4,
            vec![span(tcm(0), N)],
            11,
            vec![strided(tcm(1024), N / 2, 2, 128)],
        ),
        mem(
            3,
            3,
            6,
            vec![span(hbm(3 * N), N)],
            7,
            vec![span(tcm(512), N)],
        ),
        mem(
            4,
            4,
            8,
            vec![span(tcm(512), N)],
            9,
            vec![span(hbm(3 * N), N)],
        ),
        mem(5, 5, 5, vec![span(tcm(0), N)], 12, vec![span(tcm(3072), N)]),
        mem(
            6,
            6,
            10,
            vec![span(hbm(2 * N), N)],
            13,
            vec![span(tcm(0), N)],
        ),
    ]);
    let split = each_replay(&bytes, |l, _, what| {
        let q0 = &x[..N as usize];
        assert_eq!(read(l, tcm(1024), N / 2), q0[..N as usize / 2], "{what}");
        assert_eq!(
            read(l, tcm(1024 + 128), N / 2),
            q0[N as usize / 2..],
            "{what}"
        );
        assert_eq!(read(l, tcm(3072), N), q0, "{what}: 5's bytes");
        assert_eq!(
            read(l, tcm(0), N),
            x[2 * N as usize..3 * N as usize],
            "{what}"
        );
        assert_eq!(read(l, tcm(512), N), x[3 * N as usize..], "{what}");
    });
    assert!(split > 0);
}

#[test]
fn reads_beyond_the_deferral_limit_are_captured_at_the_window_end() {
    // 1,100 copies of 64-byte pieces of the input to TCM, every read
    // (seqs 0..1100) before every write (seqs 1100..2200); windows of
    // one effect, one record a chunk: each read is a window of its own
    // but the last, whose window takes every write (the record carrying
    // seq 1099 lets all the rest be staged). Of the 1,099 reads whose
    // writes come in a later window, 1,024 are deferred, 75 captured.
    let n = 1100u64;
    let x: Vec<u8> = (0..n * N).map(|i| (i % 251) as u8).collect();
    let tensors = vec![tensor("x", Dtype::U8, &[n * N], true, None)];
    let ops: Vec<Op> = (0..n)
        .map(|i| {
            mem(
                i,
                i,
                i,
                vec![span(host(0, i * N), N)],
                n + i,
                vec![span(tcm(i * N), N)],
            )
        })
        .collect();
    let bytes = build_chunked(tensors, &[(0, x.clone())], &ops, vec![], Some(1));
    for threads in [1, 2] {
        for elide in [true, false] {
            let l = replay(&bytes, threads, 1, elide);
            let what = format!("{threads} threads, elide {elide}");
            assert_eq!(l.stats.windows, n, "{what}");
            assert_eq!(l.stats.captured, n - 1 - 1024, "{what}");
            assert_eq!(read(&l, tcm(0), n * N), x, "{what}");
        }
    }
}
