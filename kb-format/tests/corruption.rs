//! Damaged and hostile inputs: truncation at every offset, a bit flip at
//! every offset, and one test per typed error. Readers must return an
//! error (never Ok, never panic) and name the offset.

mod common;

use common::*;
use kb_format::chunk::{BLOCK, ChunkHeader, ChunkKind};
use kb_format::*;

fn u64_le(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Both readers' errors for `bytes` (the mmap reader through a temp file).
fn both_errors(bytes: &[u8]) -> (FormatError, FormatError) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    let s = read_stream(bytes).expect_err("stream reader accepted a damaged trace");
    let m = read_mmap_bytes(&path, bytes).expect_err("mmap reader accepted a damaged trace");
    (s, m)
}

fn assert_names_offset(e: &FormatError, offset: u64) {
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("offset {offset}:")),
        "expected an error at offset {offset}, got: {msg}"
    );
}

#[test]
fn sample_trace_is_representative_and_reads_back() {
    let b = sample_trace();
    assert!(
        b.len() > 1000 && b.len() < 6000,
        "sample is {} bytes",
        b.len()
    );
    let kinds: Vec<ChunkKind> = chunk_offsets(&b).iter().map(|(_, h)| h.kind).collect();
    let count = |k| kinds.iter().filter(|&&x| x == k).count();
    assert_eq!(kinds[0], ChunkKind::Meta);
    assert!(count(ChunkKind::Strings) >= 2, "{kinds:?}");
    assert!(count(ChunkKind::Tensor) >= 1, "{kinds:?}");
    assert!(count(ChunkKind::Records) >= 3, "{kinds:?}");
    assert_eq!(
        &kinds[kinds.len() - 2..],
        [ChunkKind::Verify, ChunkKind::Footer]
    );

    let dir = tempfile::tempdir().unwrap();
    let s = read_stream(&b).unwrap();
    let m = read_mmap_bytes(&dir.path().join("t.kbt"), &b).unwrap();
    assert_eq!(s, m);
    assert_eq!(s.records.len() as u64, SAMPLE_RECORDS);
    assert_eq!(s.meta, sample_meta());
    assert_eq!(s.verify, sample_verify());
    assert_eq!(s.strings, ["sip0.cube0.pe0.pe_dma", "dma_read", "gemm_f16"]);
    let mut data = Vec::new();
    for (t, off, bytes) in &s.tensors {
        assert_eq!((*t, *off), (0, data.len() as u64));
        data.extend_from_slice(bytes);
    }
    assert_eq!(data, (0..64).collect::<Vec<u8>>());
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let b = sample_trace();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    for len in 0..b.len() {
        let cut = &b[..len];
        let e = read_stream(cut).expect_err("stream reader accepted a truncated trace");
        assert!(
            e.is_truncation(),
            "stream reader, cut at {len}: not a truncation error: {e}"
        );
        // Truncation errors name the offset where the input ends.
        assert!(e.to_string().contains("offset "), "{e}");
        let e = read_mmap_bytes(&path, cut).expect_err("mmap reader accepted a truncated trace");
        assert!(e.to_string().contains("offset "), "cut at {len}: {e}");
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut b = sample_trace();
    b.extend_from_slice(&[0u8; 64]);
    let (s, m) = both_errors(&b);
    assert!(s.to_string().contains("after the trailer"), "{s}");
    // The file no longer ends in a trailer.
    assert!(matches!(m, FormatError::BadMagic { .. }), "{m}");
}

#[test]
fn a_bit_flip_at_every_offset_is_an_error() {
    // Every bit of every byte, with both readers: every byte of a trace is
    // covered by a checksum, the stream digest or the zero-padding rule.
    let b = sample_trace();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    for at in 0..b.len() {
        for bit in 0..8 {
            let mut d = b.clone();
            d[at] ^= 1 << bit;
            if let Ok(dump) = read_stream(&d) {
                panic!(
                    "stream reader missed a flip of bit {bit} at offset {at}: {} records",
                    dump.records.len()
                );
            }
            if read_mmap_bytes(&path, &d).is_ok() {
                panic!("mmap reader missed a flip of bit {bit} at offset {at}");
            }
        }
    }
}

#[test]
fn footer_padding_damage_is_detected() {
    // The footer's padding is covered by no checksum and not by the digest
    // (which ends before the footer): readers check that it is zero.
    let b = sample_trace();
    let (fat, fh) = *chunk_offsets(&b).last().unwrap();
    assert_eq!(fh.kind, ChunkKind::Footer);
    let pad_at = fat + BLOCK + fh.len as usize;
    let trailer_at = b.len() - BLOCK;
    assert!(pad_at < trailer_at, "the sample footer has padding");
    let mut d = b.clone();
    d[trailer_at - 1] = 0x5a;
    let (s, m) = both_errors(&d);
    for e in [s, m] {
        assert!(e.to_string().contains("padding"), "{e}");
        assert_names_offset(&e, trailer_at as u64 - 1);
    }
}

#[test]
fn bad_magic() {
    let mut b = sample_trace();
    b[1] = b'X';
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(matches!(e, FormatError::BadMagic { offset: 0, .. }), "{e}");
        assert_names_offset(&e, 0);
    }
    // A damaged chunk magic names the chunk's offset.
    let mut b = sample_trace();
    let (at, _) = chunk_offsets(&b)[1];
    b[at] = b'X';
    let e = read_stream(&b).unwrap_err();
    assert!(matches!(e, FormatError::BadMagic { .. }), "{e}");
    assert_names_offset(&e, at as u64);
}

#[test]
fn unknown_major_version_is_reported_before_the_checksum() {
    let mut b = sample_trace();
    b[8..10].copy_from_slice(&4u16.to_le_bytes());
    // The header checksum no longer matches either; the version wins.
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            matches!(
                e,
                FormatError::UnsupportedVersion {
                    major: 4,
                    supported: 3,
                    ..
                }
            ),
            "{e}"
        );
        assert_names_offset(&e, 8);
    }
    // A newer minor version with a valid checksum is read.
    let mut b = sample_trace();
    b[10..12].copy_from_slice(&7u16.to_le_bytes());
    reseal_block(&mut b, 0);
    refooter(&mut b);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        read_stream(&b).unwrap(),
        read_mmap_bytes(&dir.path().join("t.kbt"), &b).unwrap()
    );
    // ... but a changed minor version without the checksum is not.
    let mut b = sample_trace();
    b[10] ^= 1;
    let e = read_stream(&b).unwrap_err();
    assert!(matches!(e, FormatError::Checksum { offset: 0, .. }), "{e}");
}

#[test]
fn checksum_mismatch_names_the_payload() {
    let mut b = sample_trace();
    let (at, h) = *chunk_offsets(&b)
        .iter()
        .find(|(_, h)| h.kind == ChunkKind::Records)
        .unwrap();
    b[at + BLOCK + 3] ^= 0x10;
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        match &e {
            FormatError::Checksum { offset, what, .. } => {
                assert_eq!(*offset, (at + BLOCK) as u64);
                assert!(what.contains("records chunk"), "{what}");
                assert!(what.contains(&format!("#{}", h.ordinal)), "{what}");
            }
            _ => panic!("expected a checksum error, got {e}"),
        }
        assert_names_offset(&e, (at + BLOCK) as u64);
    }
    // Damage in a chunk header is caught by the header checksum.
    let mut b = sample_trace();
    b[at + 20] ^= 1;
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(matches!(e, FormatError::Checksum { .. }), "{e}");
        assert_names_offset(&e, at as u64);
    }
}

#[test]
fn damaged_padding_fails_the_stream_digest_or_padding_check() {
    let b = sample_trace();
    // Padding of the meta chunk.
    let (at, h) = chunk_offsets(&b)[0];
    let pad = at + BLOCK + h.len as usize;
    assert_ne!(pad % 64, 0, "meta chunk has padding");
    let mut d = b.clone();
    d[pad] = 1;
    let s = read_stream(&d).unwrap_err();
    assert!(s.to_string().contains("padding"), "{s}");
    // The mmap reader checks every chunk's padding at open.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    std::fs::write(&path, &d).unwrap();
    let e = MmapTrace::open(&path).unwrap_err();
    assert!(e.to_string().contains("padding"), "{e}");
    assert_names_offset(&e, pad as u64);
    // The digest covers the padding too: a footer whose digest no longer
    // matches (its checksums fixed up) is reported by verify_digest and by
    // the stream reader.
    let mut d = b.clone();
    let (fat, _) = *chunk_offsets(&b).last().unwrap();
    d[fat + BLOCK + 40] ^= 1;
    let p = fat + BLOCK;
    let fl = u64_le(&d, fat + 8) as usize;
    let sum = xxhash_rust::xxh3::xxh3_64(&d[p..p + fl]);
    set_u64(&mut d, fat + 40, sum);
    reseal_block(&mut d, fat);
    std::fs::write(&path, &d).unwrap();
    let m = MmapTrace::open(&path).unwrap();
    let e = m.verify_digest().unwrap_err();
    assert!(
        matches!(&e, FormatError::Checksum { what, .. } if what == "stream digest"),
        "{e}"
    );
    let e = read_stream(&d).unwrap_err();
    assert!(
        matches!(&e, FormatError::Checksum { what, .. } if what == "stream digest"),
        "{e}"
    );
}

#[test]
fn absurd_chunk_length_is_bad_length_without_allocating() {
    let mut b = sample_trace();
    // The meta chunk header at 64 claims 2^60 bytes.
    set_u64(&mut b, BLOCK + 8, 1 << 60);
    reseal_block(&mut b, BLOCK);
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        match &e {
            FormatError::BadLength { len, limit, .. } => {
                assert_eq!(*len, 1 << 60);
                assert!(*limit <= chunk::MAX_SMALL_PAYLOAD);
            }
            _ => panic!("expected BadLength, got {e}"),
        }
        assert_names_offset(&e, BLOCK as u64 + 8);
    }

    // A tensor chunk may be up to 1 TiB: the stream reader accepts the
    // length, then finds the input short, having grown its buffer only by
    // what it read.
    let mut b = sample_trace();
    let (at, _) = *chunk_offsets(&b)
        .iter()
        .find(|(_, h)| h.kind == ChunkKind::Tensor)
        .unwrap();
    set_u64(&mut b, at + 8, 1 << 39);
    reseal_block(&mut b, at);
    let e = read_stream(&b).unwrap_err();
    // The tensor is 64 bytes: the claimed length is refused first, or the
    // input ends; either way no 512 GiB buffer.
    assert!(
        e.is_truncation() || matches!(e, FormatError::BadLength { .. }),
        "{e}"
    );
}

#[test]
fn absurd_record_count_is_bad_length() {
    let recs: Vec<Record> = (0..3).map(|i| sample_record(i, 0, 1)).collect();
    let mut raw = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&recs)
        .records(&[sample_record(3, 0, 1)])
        .verify(&sample_verify());
    // Two chunks whose counts would overflow a u64 sum.
    raw.chunks[2].1[0] = 1 << 63;
    raw.chunks[3].1[0] = 1 << 63;
    let (s, m) = both_errors(&raw.build());
    for e in [s, m] {
        assert!(
            matches!(e, FormatError::BadLength { len, .. } if len == 1 << 63),
            "{e}"
        );
    }
}

#[test]
fn string_id_that_points_nowhere_is_dangling() {
    let mut r = sample_record(0, 0, 1);
    r.component = 5;
    let b = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&[r])
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    let rec_at = chunk_offsets(&b)[2].0 + BLOCK + kb_format::reader::SEQ_WATERMARK_BYTES;
    for e in [s, m] {
        assert!(
            matches!(
                e,
                FormatError::DanglingId {
                    what: "component",
                    id: 5,
                    ..
                }
            ),
            "{e}"
        );
        assert_names_offset(&e, rec_at as u64);
    }

    // A string used before the strings chunk that defines it.
    let b = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c"])
        .records(&[sample_record(0, 0, 1)])
        .strings(1, &["n"])
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            matches!(
                e,
                FormatError::DanglingId {
                    what: "op name",
                    id: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn tensor_id_that_points_nowhere_is_dangling() {
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Tensor, [7, 0, 0], vec![1, 2, 3, 4])
        .verify(&sample_verify())
        .build();
    let at = chunk_offsets(&b)[1].0 as u64;
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            matches!(
                e,
                FormatError::DanglingId {
                    what: "tensor",
                    id: 7,
                    ..
                }
            ),
            "{e}"
        );
        assert_names_offset(&e, at);
    }
    // Data past the end of a known tensor (64 bytes).
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Tensor, [0, 62, 0], vec![1, 2, 3, 4])
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(matches!(e, FormatError::BadLength { .. }), "{e}");
    }
}

#[test]
fn dependency_that_does_not_precede_is_dangling() {
    let mut r = sample_record(4, 0, 1);
    r.deps = vec![Dep::data(1), Dep::data(4)];
    let b = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&[r])
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            matches!(
                e,
                FormatError::DanglingId {
                    what: "dependency",
                    id: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().starts_with("offset "), "{e}");
    }
}

#[test]
fn an_active_interval_outside_the_span_is_malformed() {
    // The encoder writes what it is given (the writer would refuse it):
    // span [400, 450], active [420, 460) runs past the end; [390, 445)
    // starts before it (encoded from the start: +0, 55 long).
    for (active, detail) in [
        ((420, 460), "active interval (+20 ps, 40 ps long)"),
        ((390, 445), "active interval (+0 ps, 55 ps long)"),
    ] {
        let mut r = sample_record(4, 0, 1);
        r.deps.clear();
        r.active = Some(active);
        let b = RawTrace::default()
            .meta(&sample_meta())
            .strings(0, &["c", "n"])
            .records(&[r])
            .verify(&sample_verify())
            .build();
        let (s, m) = both_errors(&b);
        for e in [s, m] {
            assert!(matches!(e, FormatError::Malformed { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(detail) && msg.contains("not within its span [400, 450] ps"),
                "{msg}"
            );
        }
    }
}

#[test]
fn a_minor_version_2_trace_reads_as_before() {
    // The sample written today, with no active interval, relabelled 3.2:
    // the same records come back, each with `active: None`.
    let mut recs: Vec<Record> = (0..4).map(|i| sample_record(i, 0, 1)).collect();
    for r in &mut recs {
        r.active = None;
    }
    let mut b = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&recs)
        .verify(&sample_verify())
        .build();
    assert_eq!(u16::from_le_bytes([b[10], b[11]]), 4, "written as 3.4");
    b[10..12].copy_from_slice(&2u16.to_le_bytes());
    reseal_block(&mut b, 0);
    refooter(&mut b);
    let dir = tempfile::tempdir().unwrap();
    let s = read_stream(&b).unwrap();
    let m = read_mmap_bytes(&dir.path().join("t.kbt"), &b).unwrap();
    assert_eq!(s.records, recs);
    assert_eq!(m.records, recs);
}

#[test]
fn records_out_of_order_across_chunks_are_an_error() {
    let b = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&[sample_record(1, 0, 1)])
        .records(&[sample_record(0, 0, 1)])
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            e.to_string().contains("out of (t_start, op_id) order"),
            "{e}"
        );
    }
}

#[test]
fn chunk_header_must_name_its_first_record() {
    let mut raw = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&[sample_record(0, 0, 1), sample_record(1, 0, 1)])
        .verify(&sample_verify());
    raw.chunks[2].1[1] = 5; // first t_start
    let (s, m) = both_errors(&raw.build());
    for e in [s, m] {
        assert!(e.to_string().contains("chunk header says"), "{e}");
    }
}

#[test]
fn verify_chunk_must_come_once_and_last() {
    let no_verify = RawTrace::default()
        .meta(&sample_meta())
        .strings(0, &["c", "n"])
        .records(&[sample_record(0, 0, 1)])
        .build();
    let (s, m) = both_errors(&no_verify);
    for e in [s, m] {
        assert!(e.to_string().contains("no verify chunk"), "{e}");
    }
    let verify_early = RawTrace::default()
        .meta(&sample_meta())
        .verify(&sample_verify())
        .strings(0, &["c", "n"])
        .build();
    let (s, m) = both_errors(&verify_early);
    for e in [s, m] {
        assert!(e.to_string().contains("after the verify chunk"), "{e}");
    }
}

#[test]
fn deeply_nested_expression_is_malformed_not_a_stack_overflow() {
    // postcard: outputs: [ { tensor: "o", reference: Exp(Exp(...Tensor("")...)),
    // tolerance: None } ]
    let depth = 200_000;
    let mut p = vec![1u8, 1, b'o'];
    p.extend(std::iter::repeat_n(7u8, depth)); // Expr::Exp
    p.extend_from_slice(&[0, 0]); // Expr::Tensor("")
    p.push(0); // tolerance: None
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Verify, [0; 3], p)
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        // postcard reports the depth limit as a generic serde error.
        assert!(
            matches!(&e, FormatError::Malformed { what, .. } if what == "verify chunk"),
            "{e}"
        );
    }
    // Nesting within the limit reads back.
    let mut e = Expr::Tensor("a".into());
    for _ in 0..MAX_EXPR_DEPTH {
        e = Expr::Exp(Box::new(e));
    }
    let spec = VerifySpec {
        outputs: vec![VerifyOutput {
            tensor: "out".into(),
            reference: e,
            tolerance: None,
        }],
    };
    let b = RawTrace::default()
        .meta(&sample_meta())
        .verify(&spec)
        .build();
    assert_eq!(read_stream(&b).unwrap().verify, spec);
}

#[test]
fn tensor_shape_that_overflows_is_not_a_panic() {
    let mut meta = sample_meta();
    meta.tensors[0].shape = vec![u64::MAX, 4];
    assert_eq!(meta.tensors[0].nbytes(), u64::MAX);
    assert_eq!(meta.tensors[0].checked_nbytes(), None);
    let b = RawTrace::default()
        .meta(&meta)
        .chunk(ChunkKind::Tensor, [0, 0, 0], vec![1, 2])
        .verify(&sample_verify())
        .build();
    let dir = tempfile::tempdir().unwrap();
    let s = read_stream(&b).unwrap();
    let m = read_mmap_bytes(&dir.path().join("t.kbt"), &b).unwrap();
    assert_eq!(s, m);
    // The writer does not panic on it either.
    let mut w = TraceWriter::new(Vec::new(), &meta).unwrap();
    w.tensor_data(0, 0, &[1, 2]).unwrap();
    w.finish(&VerifySpec::default()).unwrap();
}

#[test]
fn trailer_pointing_into_itself_is_an_error_not_a_panic() {
    let b = sample_trace();
    let tat = b.len() - BLOCK;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    let fat = u64_le(&b, tat + 8);
    for bad in [
        0,
        1,
        63,
        64,
        65,
        fat - 64,
        fat + 1,
        tat as u64 - 1,
        tat as u64,
        u64::MAX,
    ] {
        let mut d = b.clone();
        set_u64(&mut d, tat + 8, bad);
        reseal_block(&mut d, tat);
        let e = read_mmap_bytes(&path, &d).expect_err("bad footer offset accepted");
        assert!(e.to_string().starts_with("offset "), "{bad}: {e}");
        let e = read_stream(&d).expect_err("bad footer offset accepted");
        assert!(e.to_string().contains("trailer"), "{e}");
    }
}

#[test]
fn footer_index_must_list_the_stream() {
    // A footer whose index disagrees with the chunks, though its checksum
    // and the digest are right.
    let b = sample_trace();
    let (fat, fh) = *chunk_offsets(&b).last().unwrap();
    let p = fat + BLOCK;
    let mut d = b.clone();
    // aux1 of the first index entry (the meta chunk): 0 -> 9.
    set_u64(&mut d, p + 64 + 24, 9);
    assert!(fh.len > 64 + 32);
    refooter(&mut d);
    let (s, m) = both_errors(&d);
    assert!(s.to_string().contains("footer index"), "{s}");
    assert!(m.to_string().contains("footer index"), "{m}");
}

#[test]
fn empty_and_tiny_inputs_are_truncation_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    for len in [0usize, 1, 63, 64, 65, 127, 128] {
        let mut b = sample_trace();
        b.truncate(len);
        let e = read_stream(&b).unwrap_err();
        assert!(e.is_truncation(), "{len}: {e}");
        let e = read_mmap_bytes(&path, &b).unwrap_err();
        assert!(
            e.is_truncation() || matches!(e, FormatError::BadMagic { .. }),
            "{len}: {e}"
        );
    }
}

#[test]
fn bytes_after_the_encoded_meta_or_verify_are_malformed() {
    let mut meta = postcard::to_stdvec(&sample_meta()).unwrap();
    meta.push(0);
    let b = RawTrace::default()
        .chunk(ChunkKind::Meta, [0; 3], meta)
        .verify(&sample_verify())
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            e.to_string().contains("1 bytes after the encoded value"),
            "{e}"
        );
    }
    let mut verify = postcard::to_stdvec(&sample_verify()).unwrap();
    verify.extend_from_slice(&[1, 2]);
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Verify, [0; 3], verify)
        .build();
    let (s, m) = both_errors(&b);
    for e in [s, m] {
        assert!(
            e.to_string().contains("2 bytes after the encoded value"),
            "{e}"
        );
    }
}

/// Damage behind the checksums: random changes to payloads and headers,
/// with every checksum recomputed, so the decoders themselves see bad
/// input. Readers may accept a change that happens to be valid; they must
/// never panic, and what they accept must read the same both ways.
#[test]
fn resealed_random_damage_never_panics() {
    let sample = sample_trace();
    let sim_like = {
        // A second seed with every params kind and unusual values.
        let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
        w.set_records_chunk_target(200);
        let c = w.intern("c");
        for i in 0..12u64 {
            let mut r = sample_record(i, c, c);
            match i % 4 {
                0 => {
                    r.kind = OpKind::Math;
                    r.params = Params::Math(MathParams {
                        op: MathOp::Where,
                        inputs: vec![
                            MathInput::Scalar(1.5),
                            MathInput::Tile {
                                addr: Addr::default(),
                                rows: 2,
                                cols: 3,
                                dtype: Dtype::Bf16,
                            },
                        ],
                        out: Addr::default(),
                        rows: 2,
                        cols: 3,
                        dtype: Dtype::F32,
                        axis: Some(1),
                    });
                }
                1 => {
                    r.kind = OpKind::Unknown(9);
                    r.params = Params::Raw(vec![0x80; 140]);
                }
                _ => {}
            }
            w.push(r).unwrap();
        }
        w.finish(&sample_verify()).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    let mut rng = Rng(0x6b62_7472);
    let (mut accepted, mut rejected) = (0, 0);
    // KB_MUTATION_CASES=N runs more cases (e.g. in release mode).
    let cases: usize = std::env::var("KB_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    for i in 0..cases {
        let mut d = if i % 2 == 0 {
            sample.clone()
        } else {
            sim_like.clone()
        };
        // Past the file header, before the trailer.
        let span = d.len() - 2 * BLOCK;
        for _ in 0..1 + rng.below(4) {
            let at = BLOCK + rng.below(span);
            d[at] = match rng.below(4) {
                0 => d[at] ^ (1 << rng.below(8)),
                1 => 0x80,
                2 => 0xff,
                _ => rng.next() as u8,
            };
        }
        reseal_all(&mut d);
        let s = read_stream(&d);
        // The mmap reader through a file for every 8th case (file I/O).
        if i % 8 == 0 {
            let m = read_mmap_bytes(&path, &d);
            match (&s, &m) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "case {i}"),
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "case {i}: readers disagree: {:?} vs {:?}",
                    s.as_ref().err().map(ToString::to_string),
                    m.as_ref().err().map(ToString::to_string)
                ),
            }
        }
        if s.is_ok() {
            accepted += 1;
        } else {
            rejected += 1;
        }
    }
    // Most damage is caught by a decoder even with valid checksums.
    assert!(
        rejected > accepted,
        "{rejected} rejected, {accepted} accepted"
    );
}

/// Every event of a mapped trace, read through `for_each_event`, as
/// (kind, bytes of tensor data) or the first error.
fn mapped_events(m: &MmapTrace) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let mut out = Vec::new();
    m.for_each_event(|ev| {
        out.push(match ev {
            Event::Tensor { data, .. } => ("tensor", data.to_vec()),
            Event::Records(_) => ("records", Vec::new()),
            Event::Snapshot { .. } => ("snapshot", Vec::new()),
        });
        Ok(())
    })?;
    Ok(out)
}

#[test]
fn payload_checks_run_ahead_and_a_damaged_payload_is_still_reported_when_read() {
    let b = sample_trace();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kbt");
    let tensors: Vec<(usize, ChunkHeader)> = chunk_offsets(&b)
        .into_iter()
        .filter(|(_, h)| h.kind == ChunkKind::Tensor)
        .collect();
    assert!(tensors.len() >= 2, "{} tensor chunks", tensors.len());

    // A good trace: the checks run on another thread, then the reader
    // gives every event as it does without them.
    std::fs::write(&path, &b).unwrap();
    let m = MmapTrace::open(&path).unwrap();
    let want = mapped_events(&m).unwrap();
    let m = MmapTrace::open(&path).unwrap();
    let checks = m.payload_checks(ChunkKind::Tensor);
    assert_eq!(checks.len(), tensors.len());
    std::thread::spawn(move || checks.into_iter().for_each(PayloadCheck::run))
        .join()
        .unwrap();
    assert_eq!(mapped_events(&m).unwrap(), want);

    // The second tensor chunk's payload damaged (its checksum left as it
    // was): its check, run ahead, must not let it through; the reader
    // reports it in its place, as it does without checks.
    let (at, _) = tensors[1];
    let mut d = b.clone();
    d[at + BLOCK] ^= 0x40;
    std::fs::write(&path, &d).unwrap();
    let plain = mapped_events(&MmapTrace::open(&path).unwrap()).unwrap_err();
    let m = MmapTrace::open(&path).unwrap();
    for check in m.payload_checks(ChunkKind::Tensor) {
        check.run();
    }
    let e = mapped_events(&m).unwrap_err();
    assert!(
        matches!(&e, FormatError::Checksum { what, .. } if what.contains("tensor")),
        "{e}"
    );
    assert_eq!(e.to_string(), plain.to_string());
    assert_names_offset(&e, (at + BLOCK) as u64);

    // The digest's check, taken to another thread, says what
    // verify_digest says.
    let m = MmapTrace::open(&path).unwrap();
    let check = m.digest_check();
    let ahead = std::thread::spawn(move || check.run()).join().unwrap();
    assert_eq!(
        ahead.map_err(|e| e.to_string()),
        m.verify_digest().map_err(|e| e.to_string())
    );
}
