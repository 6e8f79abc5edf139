//! Property test: whatever is written reads back the same through both
//! readers, with records in (t_start, op_id) order.

mod common;

use common::*;
use kb_format::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

fn dtype() -> impl Strategy<Value = Dtype> {
    select(Dtype::ALL.to_vec())
}

fn space() -> impl Strategy<Value = Space> {
    select(Space::ALL.to_vec())
}

fn addr() -> impl Strategy<Value = Addr> {
    (space(), any::<u64>()).prop_map(|(space, addr)| Addr { space, addr })
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::RowMajor), Just(Layout::ColMajor)]
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

fn shard() -> impl Strategy<Value = Shard> {
    (
        any::<u64>(),
        0..64u64,
        0..4096u64,
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(tensor_offset, rows, row_bytes, tensor_row_stride, pa)| Shard {
                tensor_offset,
                rows,
                row_bytes,
                tensor_row_stride,
                pa,
            },
        )
}

fn tensor_meta() -> impl Strategy<Value = TensorMeta> {
    (
        text(),
        dtype(),
        vec(1..6u64, 0..4),
        any::<u64>(),
        any::<bool>(),
        vec(shard(), 0..3),
    )
        .prop_map(
            |(name, dtype, shape, address, host_data, shards)| TensorMeta {
                name,
                dtype,
                shape,
                address,
                host_data,
                shards,
            },
        )
}

fn meta() -> impl Strategy<Value = Meta> {
    (
        (text(), text(), vec(text(), 0..3)),
        (text(), text(), text()),
        text(),
        vec((text(), text()), 0..3),
        any::<u64>(),
        vec(tensor_meta(), 0..4),
    )
        .prop_map(
            |((tool, tool_version, command_line), topo, benchmark, params, seed, tensors)| Meta {
                tool,
                tool_version,
                command_line,
                topology: TopologyMeta {
                    name: topo.0,
                    address_model: topo.1,
                    resolved: topo.2,
                },
                benchmark,
                params,
                seed,
                tensors,
            },
        )
}

/// Finite or infinite, never NaN (NaN != NaN).
fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("not NaN", |v| !v.is_nan()),
        Just(0.0),
        Just(-0.0),
        Just(f64::INFINITY)
    ]
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        text().prop_map(Expr::Tensor),
        number().prop_map(Expr::Scalar)
    ];
    leaf.prop_recursive(4, 24, 2, |inner| {
        let b = move || inner.clone().prop_map(Box::new);
        prop_oneof![
            (b(), b()).prop_map(|(x, y)| Expr::Matmul(x, y)),
            b().prop_map(Expr::Transpose),
            (b(), b()).prop_map(|(x, y)| Expr::Add(x, y)),
            (b(), b()).prop_map(|(x, y)| Expr::Sub(x, y)),
            (b(), b()).prop_map(|(x, y)| Expr::Mul(x, y)),
            (b(), b()).prop_map(|(x, y)| Expr::Div(x, y)),
            b().prop_map(Expr::Exp),
            (b(), any::<u8>()).prop_map(|(input, axis)| Expr::Softmax { input, axis }),
            (b(), any::<u8>()).prop_map(|(input, axis)| Expr::Sum { input, axis }),
            (b(), any::<u8>()).prop_map(|(input, axis)| Expr::Max { input, axis }),
            b().prop_map(Expr::Rsqrt),
            b().prop_map(Expr::Erf),
            (b(), b()).prop_map(|(x, y)| Expr::Maximum(x, y)),
            (b(), b()).prop_map(|(x, y)| Expr::Ge(x, y)),
            (b(), b(), b()).prop_map(|(cond, a, b)| Expr::Where { cond, a, b }),
            (b(), any::<u8>()).prop_map(|(input, axis)| Expr::Mean { input, axis }),
            (b(), any::<u8>()).prop_map(|(input, axis)| Expr::Min { input, axis }),
            (b(), any::<u64>()).prop_map(|(input, blocks)| Expr::SumBlocks { input, blocks }),
            (b(), any::<u64>()).prop_map(|(input, reps)| Expr::Tile { input, reps }),
            (b(), b(), any::<u64>()).prop_map(|(a, b, batch)| Expr::BatchedMatmul { a, b, batch }),
        ]
    })
}

fn verify_spec() -> impl Strategy<Value = VerifySpec> {
    vec(
        (text(), expr(), proptest::option::of((number(), number()))).prop_map(
            |(tensor, reference, tol)| VerifyOutput {
                tensor,
                reference,
                tolerance: tol.map(|(rtol, atol)| Tolerance { rtol, atol }),
            },
        ),
        0..3,
    )
    .prop_map(|outputs| VerifySpec { outputs })
}

/// An extent in canonical form: the stride of a range with rows <= 1 is 0.
fn extent() -> impl Strategy<Value = Extent> {
    (any::<u64>(), any::<u64>(), 0..5u32, any::<u64>()).prop_map(|(pa, len, rows, stride)| Extent {
        pa,
        len,
        rows,
        stride: if rows > 1 { stride } else { 0 },
    })
}

fn effect() -> impl Strategy<Value = Effect> {
    (any::<u64>(), any::<u64>(), vec(extent(), 0..4)).prop_map(|(time, seq, ranges)| Effect {
        time,
        seq,
        ranges,
    })
}

/// Memory params in canonical form: with rows <= 1 the strides are
/// `row_bytes` (they are not stored).
fn memory_params() -> impl Strategy<Value = MemoryParams> {
    (
        addr(),
        addr(),
        prop_oneof![Just(1u32), 2..1000u32, Just(0u32), Just(u32::MAX)],
        any::<u64>(),
        (any::<u64>(), any::<u64>()),
        proptest::option::of(dtype()),
    )
        .prop_map(|(src, dst, rows, row_bytes, strides, dtype)| {
            let (src_stride, dst_stride) = if rows > 1 {
                strides
            } else {
                (row_bytes, row_bytes)
            };
            MemoryParams {
                src,
                dst,
                rows,
                row_bytes,
                src_stride,
                dst_stride,
                dtype,
            }
        })
}

fn gemm_params() -> impl Strategy<Value = GemmParams> {
    (
        (addr(), addr(), addr(), proptest::option::of(addr())),
        (any::<u32>(), any::<u32>(), any::<u32>()),
        (dtype(), dtype(), dtype()),
        (any::<bool>(), any::<bool>(), layout(), layout(), layout()),
    )
        .prop_map(
            |((a, b, out, acc), (m, k, n), (dtype_in, dtype_acc, dtype_out), bits)| GemmParams {
                a,
                b,
                out,
                acc,
                m,
                k,
                n,
                dtype_in,
                dtype_acc,
                dtype_out,
                transpose_a: bits.0,
                transpose_b: bits.1,
                layout_a: bits.2,
                layout_b: bits.3,
                layout_out: bits.4,
            },
        )
}

fn math_input() -> impl Strategy<Value = MathInput> {
    prop_oneof![
        (addr(), any::<u32>(), any::<u32>(), dtype()).prop_map(|(addr, rows, cols, dtype)| {
            MathInput::Tile {
                addr,
                rows,
                cols,
                dtype,
            }
        }),
        number().prop_map(MathInput::Scalar),
    ]
}

fn math_params() -> impl Strategy<Value = MathParams> {
    (
        select(MathOp::ALL.to_vec()),
        vec(math_input(), 0..4),
        addr(),
        (any::<u32>(), any::<u32>(), dtype()),
        proptest::option::of(0..255u8),
    )
        .prop_map(|(op, inputs, out, (rows, cols, dtype), axis)| MathParams {
            op,
            inputs,
            out,
            rows,
            cols,
            dtype,
            axis,
        })
}

/// A kind and params that go together.
fn kind_params() -> impl Strategy<Value = (OpKind, Params)> {
    let known = select(vec![
        OpKind::Memory,
        OpKind::Gemm,
        OpKind::Math,
        OpKind::Sync,
        OpKind::Atomic,
    ]);
    prop_oneof![
        (prop_oneof![known, (5..=255u8).prop_map(OpKind::Unknown)]).prop_map(|k| (k, Params::None)),
        memory_params().prop_map(|p| (OpKind::Memory, Params::Memory(p))),
        gemm_params().prop_map(|p| (OpKind::Gemm, Params::Gemm(p))),
        math_params().prop_map(|p| (OpKind::Math, Params::Math(p))),
        (5..=255u8, vec(any::<u8>(), 1..40))
            .prop_map(|(c, raw)| (OpKind::Unknown(c), Params::Raw(raw))),
    ]
}

/// A record without its op id, deps and string ids (which depend on its
/// place in the run).
#[derive(Debug, Clone)]
struct Draft {
    t_start: u64,
    dur: u64,
    component: usize,
    op_name: usize,
    kind: OpKind,
    params: Params,
    deps: Vec<(u64, DepKind)>,
    fingerprint: Option<u64>,
    read: Option<Effect>,
    write: Option<Effect>,
    /// The active interval as two points per mille of the span (in either
    /// order): 0 and 1000 are the span's ends, equal points an empty one.
    active: Option<(u16, u16)>,
}

impl Draft {
    fn active(&self) -> Option<(u64, u64)> {
        self.active.map(|(a, b)| {
            let at = |m: u16| self.t_start + (self.dur as u128 * m as u128 / 1000) as u64;
            (at(a.min(b)), at(a.max(b)))
        })
    }
}

fn draft() -> impl Strategy<Value = Draft> {
    (
        prop_oneof![0..50u64, 0..2000u64, Just(u64::MAX / 2)],
        prop_oneof![Just(0u64), 0..1000u64, Just(u64::MAX / 2)],
        (0..8usize, 0..8usize),
        kind_params(),
        vec((any::<u64>(), select(DepKind::ALL.to_vec())), 0..4),
        proptest::option::of(any::<u64>()),
        proptest::option::of(effect()),
        proptest::option::of(effect()),
        proptest::option::of((
            prop_oneof![Just(0u16), 0..=1000u16, Just(1000u16)],
            prop_oneof![Just(0u16), 0..=1000u16, Just(1000u16)],
        )),
    )
        .prop_map(
            |(
                t_start,
                dur,
                (component, op_name),
                (kind, params),
                deps,
                fingerprint,
                read,
                write,
                active,
            )| {
                Draft {
                    t_start,
                    dur,
                    component,
                    op_name,
                    kind,
                    params,
                    deps,
                    fingerprint,
                    read,
                    write,
                    active,
                }
            },
        )
}

/// One writer call, besides the pushes.
#[derive(Debug, Clone)]
enum Step {
    /// Push the next record (in the shuffled order).
    Push,
    /// Advance to a fraction (per mille) of the way from the current
    /// watermark to the smallest start time not yet pushed.
    Advance(u16),
    /// Write the next tensor data piece.
    Tensor,
}

#[derive(Debug, Clone)]
struct Case {
    meta: Meta,
    strings: Vec<String>,
    drafts: Vec<Draft>,
    /// Push order: a permutation of the drafts.
    order: Vec<usize>,
    steps: Vec<Step>,
    /// Tensor data pieces: (tensor, offset, bytes).
    pieces: Vec<(u32, u64, Vec<u8>)>,
    verify: VerifySpec,
    chunk_target: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        meta(),
        vec(text(), 8),
        vec(draft(), 0..64),
        verify_spec(),
        prop_oneof![Just(1usize), 16..512usize, Just(64 << 10)],
        vec(
            prop_oneof![4 => Just(Step::Push), 2 => (0..=1000u16).prop_map(Step::Advance), 1 => Just(Step::Tensor)],
            0..160,
        ),
        any::<u64>(),
    )
        .prop_flat_map(|(meta, strings, drafts, verify, chunk_target, steps, seed)| {
            let n = drafts.len();
            // Host data split into pieces at random cut points.
            let sizes: Vec<(u32, u64)> = meta
                .tensors
                .iter()
                .enumerate()
                .filter(|(_, t)| t.host_data)
                .map(|(i, t)| (i as u32, t.nbytes()))
                .collect();
            let data = sizes
                .iter()
                .map(|&(_, len)| vec(any::<u8>(), len as usize))
                .collect::<Vec<_>>();
            (
                Just((meta, strings, drafts, verify, chunk_target, steps, seed)),
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
                Just(sizes),
                data,
            )
        })
        .prop_map(
            |((meta, strings, drafts, verify, chunk_target, steps, seed), order, sizes, data)| {
                let mut pieces = Vec::new();
                for ((t, len), bytes) in sizes.into_iter().zip(data) {
                    let mut at = 0u64;
                    let mut k = seed;
                    while at < len {
                        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let n = 1 + (k >> 33) % len;
                        let end = (at + n).min(len);
                        pieces.push((t, at, bytes[at as usize..end as usize].to_vec()));
                        at = end;
                    }
                }
                Case {
                    meta,
                    strings,
                    drafts,
                    order,
                    steps,
                    pieces,
                    verify,
                    chunk_target,
                }
            },
        )
}

/// Run the writer over a case; returns the bytes and what the readers
/// must give back.
fn write_case(c: &Case) -> (Vec<u8>, Dump) {
    let mut w = TraceWriter::new(Vec::new(), &c.meta).unwrap();
    w.set_records_chunk_target(c.chunk_target);
    // Op ids in creation order: draft i is op i.
    let records_in_order = |ids: &[u32]| -> Vec<Record> {
        c.drafts
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let op_id = i as u64;
                Record {
                    op_id,
                    t_start: d.t_start,
                    t_end: d.t_start + d.dur,
                    component: ids[d.component],
                    op_name: ids[d.op_name],
                    kind: d.kind,
                    params: d.params.clone(),
                    deps: if op_id == 0 {
                        vec![]
                    } else {
                        d.deps
                            .iter()
                            .map(|&(x, kind)| Dep {
                                op: x % op_id,
                                kind,
                            })
                            .collect()
                    },
                    fingerprint: d.fingerprint,
                    read: d.read.clone(),
                    write: d.write.clone(),
                    active: d.active(),
                }
            })
            .collect()
    };
    // String ids are assigned at first use, in push order.
    let mut ids = vec![u32::MAX; c.strings.len()];
    let mut table: Vec<String> = Vec::new();
    let mut pushed = 0usize;
    let mut pieces = c.pieces.iter();
    let mut tensors = Vec::new();
    let mut watermark = 0u64;
    let push_next = |w: &mut TraceWriter<Vec<u8>>,
                     pushed: &mut usize,
                     ids: &mut Vec<u32>,
                     table: &mut Vec<String>| {
        let i = c.order[*pushed];
        *pushed += 1;
        let d = &c.drafts[i];
        for s in [d.component, d.op_name] {
            let id = w.intern(&c.strings[s]);
            if id as usize == table.len() {
                table.push(c.strings[s].clone());
            }
            ids[s] = id;
        }
        let mut recs = records_in_order(ids);
        w.push(recs.swap_remove(i)).unwrap();
    };
    for step in &c.steps {
        match step {
            Step::Push if pushed < c.order.len() => {
                push_next(&mut w, &mut pushed, &mut ids, &mut table)
            }
            Step::Advance(frac) => {
                let floor = c.order[pushed..]
                    .iter()
                    .map(|&i| c.drafts[i].t_start)
                    .min()
                    .unwrap_or(u64::MAX);
                let floor = floor.max(watermark);
                let to = watermark + ((floor - watermark) as u128 * *frac as u128 / 1000) as u64;
                w.advance(to).unwrap();
                watermark = to;
                assert!(w.buffered() <= pushed);
            }
            Step::Tensor => {
                if let Some((t, off, bytes)) = pieces.next() {
                    w.tensor_data(*t, *off, bytes).unwrap();
                    tensors.push((*t, *off, bytes.clone()));
                }
            }
            Step::Push => {}
        }
    }
    while pushed < c.order.len() {
        push_next(&mut w, &mut pushed, &mut ids, &mut table);
    }
    for (t, off, bytes) in pieces {
        w.tensor_data(*t, *off, bytes).unwrap();
        tensors.push((*t, *off, bytes.clone()));
    }
    let counts = w.counts();
    let bytes = w.finish(&c.verify).unwrap();
    // The ids every string got, now that all are interned.
    let mut records = records_in_order(&ids);
    records.sort_by_key(|r| (r.t_start, r.op_id));
    let footer = Footer {
        counts: Counts {
            records: records.len() as u64,
            chunks: 0, // checked separately
            tensor_bytes: tensors.iter().map(|t| t.2.len() as u64).sum(),
            strings: table.len() as u64,
            max_t_end: records.iter().map(|r| r.t_end).max().unwrap_or(0),
        },
        digest: 0,
        index: vec![],
    };
    assert!(counts.records <= records.len() as u64);
    let expected = Dump {
        meta: c.meta.clone(),
        strings: table,
        tensors,
        records,
        verify: c.verify.clone(),
        footer,
    };
    (bytes, expected)
}

fn check(c: &Case) -> Result<(), TestCaseError> {
    let (bytes, expected) = write_case(c);
    let dir = tempfile::tempdir().unwrap();
    let s = read_stream(&bytes).map_err(|e| TestCaseError::fail(format!("stream: {e}")))?;
    let m = read_mmap_bytes(&dir.path().join("t.kbt"), &bytes)
        .map_err(|e| TestCaseError::fail(format!("mmap: {e}")))?;
    for got in [&s, &m] {
        prop_assert_eq!(&got.meta, &expected.meta);
        prop_assert_eq!(&got.strings, &expected.strings);
        prop_assert_eq!(&got.tensors, &expected.tensors);
        prop_assert_eq!(got.records.len(), expected.records.len());
        for (g, e) in got.records.iter().zip(&expected.records) {
            prop_assert_eq!(g, e);
        }
        prop_assert!(
            got.records
                .windows(2)
                .all(|w| (w[0].t_start, w[0].op_id) < (w[1].t_start, w[1].op_id))
        );
        prop_assert_eq!(&got.verify, &expected.verify);
        let mut counts = got.footer.counts;
        counts.chunks = 0;
        prop_assert_eq!(counts, expected.footer.counts);
        prop_assert_eq!(got.footer.counts.chunks, got.footer.index.len() as u64);
    }
    prop_assert_eq!(&s.footer, &m.footer);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn everything_written_reads_back_in_order(c in case()) {
        check(&c)?;
    }
}

/// Every params variant, explicitly, so coverage does not rest on chance.
#[test]
fn every_params_variant_round_trips() {
    let tile = MathInput::Tile {
        addr: Addr {
            space: Space::Sram,
            addr: 0x40,
        },
        rows: 8,
        cols: 16,
        dtype: Dtype::Bf16,
    };
    let gemm = |acc, bits: u8| GemmParams {
        a: Addr::default(),
        b: Addr {
            space: Space::Tcm,
            addr: u64::MAX,
        },
        out: Addr {
            space: Space::Host,
            addr: 3,
        },
        acc,
        m: 1,
        k: u32::MAX,
        n: 7,
        dtype_in: Dtype::I8,
        dtype_acc: Dtype::I32,
        dtype_out: Dtype::U8,
        transpose_a: bits & 1 != 0,
        transpose_b: bits & 2 != 0,
        layout_a: if bits & 4 != 0 {
            Layout::ColMajor
        } else {
            Layout::RowMajor
        },
        layout_b: if bits & 8 != 0 {
            Layout::ColMajor
        } else {
            Layout::RowMajor
        },
        layout_out: if bits & 16 != 0 {
            Layout::ColMajor
        } else {
            Layout::RowMajor
        },
    };
    let mut variants = vec![
        (OpKind::Memory, Params::None),
        (OpKind::Unknown(200), Params::None),
        (
            OpKind::Memory,
            Params::Memory(MemoryParams {
                rows: 1,
                row_bytes: 64,
                src_stride: 64,
                dst_stride: 64,
                ..Default::default()
            }),
        ),
        (
            OpKind::Memory,
            Params::Memory(MemoryParams {
                src: Addr {
                    space: Space::Hbm,
                    addr: 1 << 50,
                },
                dst: Addr {
                    space: Space::Tcm,
                    addr: 5,
                },
                rows: 4,
                row_bytes: 64,
                src_stride: 256,
                dst_stride: 0,
                dtype: Some(Dtype::F32),
            }),
        ),
        (
            OpKind::Math,
            Params::Math(MathParams {
                op: MathOp::Where,
                inputs: vec![tile, MathInput::Scalar(-2.5), tile],
                out: Addr::default(),
                rows: 8,
                cols: 16,
                dtype: Dtype::F16,
                axis: None,
            }),
        ),
        (
            OpKind::Math,
            Params::Math(MathParams {
                op: MathOp::ReduceMax,
                inputs: vec![tile],
                out: Addr::default(),
                rows: 8,
                cols: 1,
                dtype: Dtype::F32,
                axis: Some(254),
            }),
        ),
        (OpKind::Unknown(5), Params::Raw(vec![0xff; 300])),
        (
            OpKind::Atomic,
            Params::Atomic(kb_format::AtomicParams {
                op: kb_format::AtomicOp::Cas,
                dtype: Dtype::I32,
                target: Addr {
                    space: Space::Sram,
                    addr: 1 << 40,
                },
                values: kb_format::AtomicValues::Scalar(-3.0),
                old: Addr {
                    space: Space::Tcm,
                    addr: 64,
                },
                mask: Some(Addr {
                    space: Space::Tcm,
                    addr: 128,
                }),
                rows: 4,
                cols: 8,
                stride: 1024,
                cmp: i32::MIN as i64,
            }),
        ),
        (OpKind::Sync, Params::None),
        (OpKind::Unknown(255), Params::Raw(vec![1])),
    ];
    for bits in 0..32u8 {
        variants.push((OpKind::Gemm, Params::Gemm(gemm(None, bits))));
        variants.push((
            OpKind::Gemm,
            Params::Gemm(gemm(
                Some(Addr {
                    space: Space::Sram,
                    addr: 9,
                }),
                bits,
            )),
        ));
    }
    let mut w = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    w.set_records_chunk_target(100);
    let c = w.intern("c");
    let mut expected = Vec::new();
    for (i, (kind, params)) in variants.into_iter().enumerate() {
        let r = Record {
            op_id: i as u64,
            t_start: i as u64 * 10,
            t_end: i as u64 * 10 + 5,
            component: c,
            op_name: c,
            kind,
            params,
            ..Default::default()
        };
        expected.push(r.clone());
        w.push(r).unwrap();
    }
    let bytes = w.finish(&VerifySpec::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_stream(&bytes).unwrap().records, expected);
    assert_eq!(
        read_mmap_bytes(&dir.path().join("t.kbt"), &bytes)
            .unwrap()
            .records,
        expected
    );
}

/// The 3.1 expressions (`SumBlocks`, `Tile`) in a verify spec: the bytes
/// the format page documents (variant indices 33 and 34, appended after
/// 3.0's), read back by both readers, and under the nesting limit.
#[test]
fn sum_blocks_and_tile_verify_specs_round_trip() {
    let x = || Box::new(Expr::Tensor("x".into()));
    // An all-reduce over 8 PEs: every PE's block is the sum of all blocks.
    let all_reduce = Expr::Tile {
        input: Box::new(Expr::SumBlocks {
            input: x(),
            blocks: 8,
        }),
        reps: 8,
    };
    let spec = VerifySpec {
        outputs: vec![
            VerifyOutput {
                tensor: "y".into(),
                reference: all_reduce.clone(),
                tolerance: Some(Tolerance {
                    rtol: 1e-6,
                    atol: 0.0,
                }),
            },
            // The format carries any u64; evaluation is what refuses 0.
            VerifyOutput {
                tensor: "z".into(),
                reference: Expr::SumBlocks {
                    input: Box::new(Expr::Tile {
                        input: x(),
                        reps: u64::MAX,
                    }),
                    blocks: 0,
                },
                tolerance: None,
            },
        ],
    };
    // Tile = 34, SumBlocks = 33, Tensor = 0, "x", blocks 8, reps 8.
    assert_eq!(
        postcard::to_allocvec(&all_reduce).unwrap(),
        [34, 33, 0, 1, b'x', 8, 8]
    );
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let c = w.intern("c");
    w.push(Record {
        component: c,
        op_name: c,
        ..Default::default()
    })
    .unwrap();
    let bytes = w.finish(&spec).unwrap();
    // Written as version 3.1 or later (3.4).
    assert_eq!(&bytes[8..12], &[3, 0, 4, 0]);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_stream(&bytes).unwrap().verify, spec);
    assert_eq!(
        read_mmap_bytes(&dir.path().join("t.kbt"), &bytes)
            .unwrap()
            .verify,
        spec
    );
    // The nesting limit counts the new variants' operands too.
    let nest = |levels: u32| {
        let mut e = Expr::Tensor("x".into());
        for i in 0..levels {
            e = if i % 2 == 0 {
                Expr::Tile {
                    input: Box::new(e),
                    reps: 2,
                }
            } else {
                Expr::SumBlocks {
                    input: Box::new(e),
                    blocks: 2,
                }
            };
        }
        postcard::to_allocvec(&e).unwrap()
    };
    assert!(postcard::from_bytes::<Expr>(&nest(MAX_EXPR_DEPTH)).is_ok());
    assert!(postcard::from_bytes::<Expr>(&nest(MAX_EXPR_DEPTH + 1)).is_err());
}
