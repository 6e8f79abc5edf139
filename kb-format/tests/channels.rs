//! The channels chunk: written by `TraceWriter::channels`, read back by
//! both readers, and distrusted like every other chunk.

mod common;

use common::*;
use kb_format::chunk::ChunkKind;
use kb_format::*;

fn usage() -> Vec<ChannelUsage> {
    vec![
        ChannelUsage {
            sip: 0,
            cube: 0,
            channel: 3,
            bytes_read: 4096,
            bytes_written: 256,
            busy: vec![(1_000, 9_000), (12_000, 12_500)],
        },
        ChannelUsage {
            sip: 0,
            cube: 1,
            channel: 0,
            bytes_read: 0,
            bytes_written: 64,
            busy: vec![(u64::MAX - 10, u64::MAX)],
        },
    ]
}

fn trace_with(u: Vec<ChannelUsage>) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let c = w.intern("c");
    let n = w.intern("n");
    w.push(sample_record(0, c, n)).unwrap();
    w.channels(u).unwrap();
    w.finish(&sample_verify()).unwrap()
}

#[test]
fn channels_round_trip_through_both_readers() {
    let b = trace_with(usage());
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    assert_eq!(s.channels().unwrap(), &usage()[..]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &b).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    assert_eq!(m.channels().unwrap(), &usage()[..]);
    assert_eq!(m.channels().unwrap()[0].busy_ps(), 8_500);
    // None: no chunk, read as empty.
    let b = trace_with(Vec::new());
    assert!(
        chunk_offsets(&b)
            .iter()
            .all(|(_, h)| h.kind != ChunkKind::Channels)
    );
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    assert!(s.channels().unwrap().is_empty());
}

#[test]
fn the_writer_refuses_channels_out_of_order_or_overlapping() {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let mut u = usage();
    u.reverse();
    let e = w.channels(u).unwrap_err().to_string();
    assert!(e.contains("out of order"), "{e}");
    let mut u = usage();
    u[0].busy = vec![(5, 10), (9, 12)];
    let e = w.channels(u).unwrap_err().to_string();
    assert!(e.contains("overlaps"), "{e}");
}

/// An entry as the wire has it: (sip, cube, channel, read, written,
/// [(gap, length)]).
type Wire = (u32, u32, u32, u64, u64, Vec<(u64, u64)>);

fn raw_with(chunks: &[Vec<Wire>]) -> Vec<u8> {
    let mut t = RawTrace::default().meta(&sample_meta());
    for c in chunks {
        t = t.chunk(ChunkKind::Channels, [0; 3], postcard::to_stdvec(c).unwrap());
    }
    t.verify(&sample_verify()).build()
}

#[test]
fn the_wire_is_gaps_and_lengths() {
    let ok: Vec<Wire> = vec![(0, 0, 3, 4096, 256, vec![(1_000, 8_000), (3_000, 500)])];
    let b = raw_with(&[ok]);
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    assert_eq!(s.channels().unwrap(), &usage()[..1]);
}

/// What each reader says of a trace whose channels are asked for: an error
/// when it is opened and read to its end, or else from `channels()`.
fn channel_errors(b: &[u8]) -> Vec<String> {
    let s = StreamReader::open(b).and_then(|mut s| {
        s.skip_to_end()?;
        s.channels().map(|_| ())
    });
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, b).unwrap();
    let m = MmapTrace::open(&p).and_then(|m| m.channels().map(|_| ()));
    [s, m]
        .into_iter()
        .map(|r| r.expect_err("the reader accepted it").to_string())
        .collect()
}

#[test]
fn a_malformed_payload_is_an_error_when_read_not_at_open() {
    let b = raw_with(&[vec![(0, 0, 0, 0, 0, vec![(1, 2), (3, 0)])]]);
    let mut s = StreamReader::open(&b[..]).unwrap();
    s.skip_to_end().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &b).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    let (chunk, _) = *chunk_offsets(&b)
        .iter()
        .find(|(_, h)| h.kind == ChunkKind::Channels)
        .unwrap();
    let at = chunk + 64;
    for e in [s.channels().unwrap_err(), m.channels().unwrap_err()] {
        // The interval's offset: the payload's, plus the entry's 7 bytes
        // and the first interval's 2.
        let want = format!("{}", at + 9);
        let e = e.to_string();
        assert!(e.contains("channels chunk") && e.contains(&want), "{e}");
        assert!(e.contains("entry 0: busy interval 1 is empty"), "{e}");
    }
}

#[test]
fn bad_channels_chunks_are_malformed() {
    let one: Vec<Wire> = vec![(0, 0, 1, 1, 0, vec![(0, 1)])];
    for (chunks, want) in [
        (vec![one.clone(), one.clone()], "a second channels chunk"),
        (
            vec![vec![(0, 0, 1, 0, 0, vec![]), (0, 0, 1, 0, 0, vec![])]],
            "entry 1 (sip 0 cube 0 channel 1) is not after the one before it",
        ),
        (
            vec![vec![(0, 1, 0, 0, 0, vec![]), (0, 0, 5, 0, 0, vec![])]],
            "entry 1 (sip 0 cube 0 channel 5) is not after",
        ),
        (
            vec![vec![(0, 0, 0, 0, 0, vec![(1, 2), (3, 0)])]],
            "entry 0: busy interval 1 is empty",
        ),
        (
            vec![vec![(0, 0, 0, 0, 0, vec![(u64::MAX, 1)])]],
            "entry 0: busy interval 0 ends past 2^64 ps",
        ),
    ] {
        for e in channel_errors(&raw_with(&chunks)) {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
    }
    // A truncated payload.
    let mut p = postcard::to_stdvec(&one).unwrap();
    p.truncate(p.len() - 1);
    let b = RawTrace::default()
        .meta(&sample_meta())
        .chunk(ChunkKind::Channels, [0; 3], p)
        .verify(&sample_verify())
        .build();
    for e in channel_errors(&b) {
        assert!(e.contains("channels chunk"), "{e}");
    }
}
