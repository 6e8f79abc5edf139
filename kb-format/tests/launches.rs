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
            grid: [4, 2, 1],
            pes: vec![[0, 0, 0], [0, 0, 1], [0, 1, 0]],
            t_start: 1_000,
            t_end: 9_000,
            flops: 4_096,
            useful_flops: 3_000,
        },
        Launch {
            kernel: "softmax".into(),
            grid: [3, 1, 1],
            pes: vec![[0, 1, 1]],
            t_start: 9_500,
            t_end: 9_500,
            flops: 0,
            useful_flops: 0,
        },
        Launch {
            kernel: "bmm".into(),
            grid: [4, 2, 3],
            pes: vec![[0, 0, 1], [0, 1, 1]],
            t_start: 9_600,
            t_end: 12_000,
            flops: 64,
            useful_flops: 64,
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

#[test]
fn the_writer_refuses_an_empty_axis() {
    let mut l = launches();
    l[2].grid = [4, 2, 0];
    let w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let e = w.finish_with_launches(&l, &sample_verify()).unwrap_err();
    assert!(
        e.to_string()
            .contains("launch 2 (bmm) has a grid of 4 x 2 x 0: every axis needs a program"),
        "{e}"
    );
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
    zero_grid[1].grid = [3, 0, 1];
    let mut zero_3d = launches();
    zero_3d[2].grid = [0, 2, 3];
    let mut too_many = launches();
    too_many[2].grid = [u32::MAX, u32::MAX, 2];
    let mut no_pes = launches();
    no_pes[0].pes.clear();
    let mut backwards = launches();
    backwards[0].t_end = 999;
    let mut overused = launches();
    overused[0].useful_flops = 4_097;
    for (l, want) in [
        (zero_grid, "launch 1 (softmax) has a grid of 3 x 0"),
        (zero_3d, "launch 2 (bmm) has a grid of 0 x 2 x 3"),
        (
            too_many,
            "launch 2 (bmm) has a grid of 4294967295 x 4294967295 x 2 (more than 2^64 programs)",
        ),
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

/// The launches chunk of format 3.4 as written before axis 2 existed
/// (`grid: [u32; 2]`) is what a 1-D or 2-D grid writes now, byte for byte.
#[test]
fn a_2d_launch_list_has_the_bytes_of_the_2d_format() {
    #[derive(serde::Serialize)]
    struct Old {
        kernel: String,
        grid: [u32; 2],
        pes: Vec<[u32; 3]>,
        t_start: u64,
        t_end: u64,
        flops: u64,
        useful_flops: u64,
    }
    let two_d = &launches()[..2];
    let old: Vec<Old> = two_d
        .iter()
        .map(|l| Old {
            kernel: l.kernel.clone(),
            grid: [l.grid[0], l.grid[1]],
            pes: l.pes.clone(),
            t_start: l.t_start,
            t_end: l.t_end,
            flops: l.flops,
            useful_flops: l.useful_flops,
        })
        .collect();
    let new = postcard::to_stdvec(two_d).unwrap();
    assert_eq!(new, postcard::to_stdvec(&old).unwrap());
    // By hand: 2 launches; "gemm", x = 4, y = 2; 3 PEs ...
    assert_eq!(&new[..8], [2, 4, b'g', b'e', b'm', b'm', 4, 2]);
}

/// A LEB128 varint of `v`.
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Forged grids: any values for the two grid varints (over-long varints,
/// values past u32 and u64, zero axes, products past 2^64). Readers never
/// panic, agree with each other, and what they accept is a grid with no
/// zero axis whose programs fit in a u64.
#[test]
fn forged_grid_values_never_panic() {
    let one = Launch {
        kernel: "k".into(),
        grid: [1, 1, 1],
        pes: vec![[0, 0, 0]],
        t_start: 0,
        t_end: 0,
        flops: 0,
        useful_flops: 0,
    };
    let base = postcard::to_stdvec(&vec![one]).unwrap();
    // 1 launch, "k", then x = 1 and yz = 1 at bytes 3 and 4.
    assert_eq!(&base[..5], [1, 1, b'k', 1, 1]);
    let mut rng = Rng(0x6772_6964);
    let special = [
        0,
        1,
        2,
        u32::MAX as u64,
        1 << 32,
        (1 << 32) + 1,
        (2 << 32) | 7,
        u64::MAX,
        u64::MAX - 1,
        (u32::MAX as u64) << 32,
    ];
    let pick = |rng: &mut Rng| -> Vec<u8> {
        match rng.below(4) {
            0 => varint(special[rng.below(special.len())]),
            1 => varint(rng.next()),
            2 => varint(rng.next() >> rng.below(64)),
            // Over-long or unterminated.
            _ => vec![0xff; 1 + rng.below(11)],
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    let (mut accepted, mut rejected) = (0, 0);
    for i in 0..600 {
        let mut p = base[..3].to_vec();
        p.extend(pick(&mut rng));
        p.extend(pick(&mut rng));
        p.extend_from_slice(&base[5..]);
        let b = RawTrace::default()
            .meta(&sample_meta())
            .chunk(ChunkKind::Launches, [0; 3], p)
            .verify(&sample_verify())
            .build();
        let s = StreamReader::open(&b[..]).and_then(|mut s| {
            s.skip_to_end()?;
            Ok(s.launches().to_vec())
        });
        std::fs::write(&path, &b).unwrap();
        let m = MmapTrace::open(&path).map(|m| m.launches().to_vec());
        match (&s, &m) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "case {i}");
                let g = a[0].grid;
                assert!(
                    !g.contains(&0) && a[0].programs().is_some(),
                    "case {i}: {g:?}"
                );
                accepted += 1;
            }
            (Err(a), Err(b)) => {
                let (a, b) = (a.to_string(), b.to_string());
                assert!(a.contains("launches chunk"), "case {i}: {a}");
                assert!(b.contains("launches chunk"), "case {i}: {b}");
                rejected += 1;
            }
            _ => panic!("case {i}: readers disagree: {s:?} vs {m:?}"),
        }
    }
    assert!(
        accepted > 20 && rejected > 20,
        "{accepted} accepted, {rejected} rejected"
    );
}
