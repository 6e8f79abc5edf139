//! The worked example of docs/trace-format.md is what the writer produces:
//! every hex line of the dump matches, and the elided lines are zeros.

use kb_format::*;

fn tiny_trace() -> Vec<u8> {
    let meta = Meta {
        tool: "kb-sim".into(),
        seed: 1,
        tensors: vec![TensorMeta {
            name: "x".into(),
            dtype: Dtype::F32,
            shape: vec![2, 2],
            address: 0x40,
            host_data: true,
            shards: vec![Shard {
                tensor_offset: 0,
                rows: 2,
                row_bytes: 8,
                tensor_row_stride: 8,
                pa: 0x1_0000_0000_0040,
            }],
        }],
        ..Default::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &meta).unwrap();
    let c = w.intern("dma0");
    let n = w.intern("copy");
    w.tensor_data(0, 0, &[0x11; 16]).unwrap();
    let src = pa::host(0, 0);
    let dst = 0x1_0000_0000_0040u64;
    w.push(Record {
        op_id: 7,
        t_start: 1000,
        t_end: 1500,
        component: c,
        op_name: n,
        kind: OpKind::Memory,
        params: Params::Memory(MemoryParams {
            src: Addr {
                space: Space::Host,
                addr: src,
            },
            dst: Addr {
                space: Space::Hbm,
                addr: dst,
            },
            rows: 1,
            row_bytes: 16,
            src_stride: 16,
            dst_stride: 16,
            dtype: Some(Dtype::F32),
        }),
        deps: vec![Dep {
            op: 3,
            kind: DepKind::Program,
        }],
        fingerprint: Some(fingerprint(&[0x11; 16])),
        read: Some(Effect {
            time: 1000,
            seq: 0,
            ranges: vec![Extent::contiguous(src, 16)],
        }),
        write: Some(Effect {
            time: 1500,
            seq: 1,
            ranges: vec![Extent::contiguous(dst, 16)],
        }),
        active: None,
    })
    .unwrap();
    let spec = VerifySpec {
        outputs: vec![VerifyOutput {
            tensor: "x".into(),
            reference: Expr::Exp(Box::new(Expr::Tensor("x".into()))),
            tolerance: None,
        }],
    };
    w.finish(&spec).unwrap()
}

#[test]
fn worked_example_matches_the_writer() {
    let b = tiny_trace();
    // KB_DUMP_EXAMPLE=FILE writes the bytes, to regenerate the dump.
    if let Ok(path) = std::env::var("KB_DUMP_EXAMPLE") {
        std::fs::write(path, &b).unwrap();
    }
    assert_eq!(b.len(), 1088);
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/trace-format.md"),
    )
    .expect("docs/trace-format.md");
    let dump = doc
        .split("## Worked example")
        .nth(1)
        .expect("a worked example section");
    // Offsets of the lines shown; everything else must be zero.
    let mut shown = vec![false; b.len() / 16];
    let mut lines = 0;
    for line in dump.lines() {
        let Some((off, rest)) = line.split_once(": ") else {
            continue;
        };
        let Ok(off) = usize::from_str_radix(off, 16) else {
            continue;
        };
        if off.is_multiple_of(16) {
            let bytes: Vec<u8> = rest
                .split_whitespace()
                .take(16)
                .map(|h| u8::from_str_radix(h, 16).expect("hex byte"))
                .collect();
            assert_eq!(&b[off..off + 16], &bytes[..], "line at {off:#x}");
            shown[off / 16] = true;
            lines += 1;
        }
    }
    assert!(lines > 40, "{lines} lines");
    for (i, s) in shown.iter().enumerate() {
        if !s {
            assert_eq!(&b[i * 16..i * 16 + 16], &[0u8; 16], "line at {:#x}", i * 16);
        }
    }
    // And it reads back.
    let mut s = StreamReader::open(&b[..]).unwrap();
    assert_eq!(s.skip_to_end().unwrap(), 1);
}
