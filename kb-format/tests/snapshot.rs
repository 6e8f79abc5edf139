//! Snapshot chunks (debug mode): written between records, read back by
//! both readers, counted in the footer.

use kb_format::*;

#[test]
fn snapshots_round_trip_through_both_readers() {
    let mut w = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let c = w.intern("pe_math");
    let n = w.intern("exp");
    w.snapshot(3, 0, &[1, 2, 3, 4]).unwrap();
    w.snapshot(3, 1, &[9; 100]).unwrap();
    w.push(Record {
        op_id: 3,
        t_start: 10,
        t_end: 20,
        component: c,
        op_name: n,
        ..Default::default()
    })
    .unwrap();
    let bytes = w.finish(&VerifySpec::default()).unwrap();

    let mut s = StreamReader::open(&bytes[..]).unwrap();
    assert_eq!(s.skip_to_end().unwrap(), 1);
    let got = s.take_snapshots();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].op_id, got[0].operand, &got[0].data[..]),
        (3, 0, &[1u8, 2, 3, 4][..])
    );
    assert_eq!(
        (got[1].op_id, got[1].operand, got[1].data.len()),
        (3, 1, 100)
    );
    assert!(s.take_snapshots().is_empty(), "taken once");

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    m.verify_digest().unwrap();
    let snaps = m.snapshots().unwrap();
    assert_eq!(snaps.len(), 2);
    assert_eq!(snaps[1], (3, 1, &[9u8; 100][..]));

    // A damaged snapshot payload is a checksum error, not wrong data.
    let mut bad = bytes.clone();
    let snap_payload = bytes.windows(4).position(|w| w == [1, 2, 3, 4]).unwrap();
    bad[snap_payload] ^= 1;
    let mut s = StreamReader::open(&bad[..]).unwrap();
    assert!(matches!(s.skip_to_end(), Err(FormatError::Checksum { .. })));
}
