use kb_format::*;

fn meta() -> Meta {
    Meta {
        tool: "test".into(),
        tensors: vec![TensorMeta {
            name: "x".into(),
            dtype: Dtype::F32,
            shape: vec![4, 4],
            address: 0,
            host_data: true,
            shards: vec![],
        }],
        ..Default::default()
    }
}

#[test]
fn write_then_read_both_ways() {
    let mut w = TraceWriter::new(Vec::new(), &meta()).unwrap();
    let c = w.intern("sip0.cube0.pe0.pe_dma");
    let n = w.intern("dma_read");
    w.tensor_data(0, 0, &[7u8; 64]).unwrap();
    for i in (0..10u64).rev() {
        w.push(Record {
            op_id: i,
            t_start: i * 1000,
            t_end: i * 1000 + 500,
            component: c,
            op_name: n,
            fingerprint: Some(i),
            read: Some(Effect {
                time: i * 1000,
                seq: 2 * i,
                ranges: vec![Extent::contiguous(0x1000 + i, 64)],
            }),
            params: Params::Memory(MemoryParams {
                rows: 1,
                row_bytes: 64,
                src_stride: 64,
                dst_stride: 64,
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
    }
    let bytes = w.finish(&VerifySpec::default()).unwrap();
    let mut s = StreamReader::open(&bytes[..]).unwrap();
    let mut ids = vec![];
    let mut r = Record::default();
    while let Some(ev) = s.next_event().unwrap() {
        if let Event::Records(mut c) = ev {
            while c.next_into(&mut r).unwrap() {
                ids.push(r.op_id);
            }
        }
    }
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let m = MmapTrace::open(&p).unwrap();
    m.verify_digest().unwrap();
    let mut n = 0;
    m.for_each_record(|_, _| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 10);
    assert_eq!(m.tensor_chunks(0).unwrap()[0].1, &[7u8; 64][..]);
}
