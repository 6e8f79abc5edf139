//! The launches chunk: written by `finish_with_launches`, read back by both
//! readers, and distrusted like every other chunk.

mod common;

use common::*;
use kb_format::chunk::ChunkKind;
use kb_format::*;

fn launches() -> Vec<Launch> {
    vec![
        Launch {
            kernel: "gemm".into(),
            grid: [4, 2],
            pes: vec![[0, 0, 0], [0, 0, 1], [0, 1, 0]],
            t_start: 1_000,
            t_end: 9_000,
            flops: 4_096,
            useful_flops: 3_000,
        },
        Launch {
            kernel: "softmax".into(),
            grid: [3, 1],
            pes: vec![[0, 1, 1]],
            t_start: 9_500,
            t_end: 9_500,
            flops: 0,
            useful_flops: 0,
        },
    ]
}

fn trace_with(l: &[Launch]) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let c = w.intern("c");
    let n = w.intern("n");
    w.push(sample_record(0, c, n)).unwrap();
    w.finish_with_launches(l, &sample_verify()).unwrap()
}

#[test]
fn launches_round_trip_through_both_readers() {
    let b = trace_with(&launches());
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    assert_eq!(s.launches(), &launches()[..]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &b).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    assert_eq!(m.launches(), &launches()[..]);
    // The chunk sits just before the verify chunk.
    let kinds: Vec<ChunkKind> = chunk_offsets(&b).iter().map(|(_, h)| h.kind).collect();
    let at = kinds
        .iter()
        .position(|k| *k == ChunkKind::Launches)
        .unwrap();
    assert_eq!(kinds[at + 1], ChunkKind::Verify);
}

#[test]
fn no_launches_writes_no_chunk_and_reads_as_empty() {
    let b = trace_with(&[]);
    assert!(
        chunk_offsets(&b)
            .iter()
            .all(|(_, h)| h.kind != ChunkKind::Launches)
    );
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    assert!(s.launches().is_empty());
}

fn raw_with(chunks: &[Vec<Launch>]) -> Vec<u8> {
    let mut t = RawTrace::default().meta(&sample_meta());
    for l in chunks {
        t = t.chunk(ChunkKind::Launches, [0; 3], postcard::to_stdvec(l).unwrap());
    }
    t.verify(&sample_verify()).build()
}

#[test]
fn a_second_launches_chunk_is_malformed() {
    let b = raw_with(&[launches(), launches()]);
    for e in errors(&b) {
        assert!(e.contains("a second launches chunk"), "{e}");
    }
}

#[test]
fn impossible_launches_are_malformed() {
    let mut zero_grid = launches();
    zero_grid[1].grid = [3, 0];
    let mut no_pes = launches();
    no_pes[0].pes.clear();
    let mut backwards = launches();
    backwards[0].t_end = 999;
    let mut overused = launches();
    overused[0].useful_flops = 4_097;
    for (l, want) in [
        (zero_grid, "launch 1 (softmax) has a grid of 3 x 0"),
        (no_pes, "launch 0 (gemm) has no PEs"),
        (
            backwards,
            "launch 0 (gemm) has t_end 999 before t_start 1000",
        ),
        (
            overused,
            "launch 0 (gemm) has useful_flops 4097 above flops 4096",
        ),
    ] {
        for e in errors(&raw_with(&[l])) {
            assert!(e.contains(want), "{e}");
        }
    }
}

#[test]
fn a_truncated_launches_payload_is_an_error() {
    let mut p = postcard::to_stdvec(&launches()).unwrap();
    p.truncate(p.len() - 3);
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Launches, [0; 3], p)
        .verify(&sample_verify())
        .build();
    for e in errors(&b) {
        assert!(e.contains("launches chunk"), "{e}");
    }
}
