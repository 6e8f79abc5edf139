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

    // Stream order: both snapshots, then the records chunk with op 3.
    let mut s = StreamReader::open(&bytes[..]).unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = s.next_event().unwrap() {
        match ev {
            Event::Snapshot {
                op_id,
                operand,
                data,
            } => seen.push(format!("snap {op_id}/{operand} {}", data.len())),
            Event::Records(_) => seen.push("records".into()),
            Event::Tensor { .. } => seen.push("tensor".into()),
        }
    }
    assert_eq!(seen, ["snap 3/0 4", "snap 3/1 100", "records"]);

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    m.verify_digest().unwrap();
    let mut snaps = Vec::new();
    m.for_each_event(|ev| {
        if let Event::Snapshot {
            op_id,
            operand,
            data,
        } = ev
        {
            snaps.push((op_id, operand, data.to_vec()));
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(snaps.len(), 2);
    assert_eq!(snaps[0], (3, 0, vec![1, 2, 3, 4]));
    assert_eq!(snaps[1], (3, 1, vec![9; 100]));

    // A damaged snapshot payload is a checksum error, not wrong data.
    let mut bad = bytes.clone();
    let snap_payload = bytes.windows(4).position(|w| w == [1, 2, 3, 4]).unwrap();
    bad[snap_payload] ^= 1;
    let mut s = StreamReader::open(&bad[..]).unwrap();
    assert!(matches!(s.skip_to_end(), Err(FormatError::Checksum { .. })));
}
