//! Building small traces in memory with kb_format::TraceWriter.
#![allow(dead_code)]

use kb_format::pa::{self, Pa};
use kb_format::{
    Addr, Dtype, Effect, Expr, Extent, GemmParams, Layout, MathInput, MathOp, MathParams, Meta,
    OpKind, Params, Record, Shard, Space, TensorMeta, Tolerance, TraceWriter, VerifyOutput,
    VerifySpec,
};

pub fn dev(space: Space, pe: u32, offset: u64) -> u64 {
    Pa {
        space,
        sip: 0,
        cube: 0,
        pe,
        offset,
    }
    .encode()
    .expect("valid PA")
}

pub fn hbm(offset: u64) -> u64 {
    dev(Space::Hbm, 0, offset)
}

pub fn tcm(offset: u64) -> u64 {
    dev(Space::Tcm, 0, offset)
}

pub fn host(tensor: u32, offset: u64) -> u64 {
    pa::host(tensor, offset)
}

pub fn span(pa: u64, len: u64) -> Extent {
    Extent::contiguous(pa, len)
}

pub fn strided(pa: u64, len: u64, rows: u32, stride: u64) -> Extent {
    Extent {
        pa,
        len,
        rows,
        stride,
    }
}

/// A tensor stored contiguously at `pa` (one shard), or with no shards.
pub fn tensor(
    name: &str,
    dtype: Dtype,
    shape: &[u64],
    host_data: bool,
    pa: Option<u64>,
) -> TensorMeta {
    let nbytes: u64 = shape.iter().product::<u64>() * dtype.size() as u64;
    TensorMeta {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        address: pa.unwrap_or(0),
        host_data,
        shards: pa
            .map(|pa| {
                vec![Shard {
                    tensor_offset: 0,
                    rows: 1,
                    row_bytes: nbytes,
                    tensor_row_stride: nbytes,
                    pa,
                }]
            })
            .unwrap_or_default(),
    }
}

/// An op described with names; ids are interned when the trace is built.
#[derive(Debug, Clone)]
pub struct Op {
    pub id: u64,
    pub t_start: u64,
    pub component: String,
    pub name: String,
    pub kind: OpKind,
    pub params: Params,
    pub fingerprint: Option<u64>,
    pub read: Option<Effect>,
    pub write: Option<Effect>,
    pub deps: Vec<u64>,
}

fn effect(time: u64, seq: u64, ranges: Vec<Extent>) -> Option<Effect> {
    Some(Effect { time, seq, ranges })
}

/// A memory op: reads `reads` at `rseq`, writes `writes` at `wseq`.
pub fn mem(id: u64, t: u64, rseq: u64, reads: Vec<Extent>, wseq: u64, writes: Vec<Extent>) -> Op {
    Op {
        id,
        t_start: t,
        component: "sip0.cube0.pe0.pe_dma".into(),
        name: "dma".into(),
        kind: OpKind::Memory,
        params: Params::None,
        fingerprint: None,
        read: effect(t, rseq, reads),
        write: effect(t + 10, wseq, writes),
        deps: vec![],
    }
}

pub fn gemm_params(m: u32, k: u32, n: u32, din: Dtype, dacc: Dtype, dout: Dtype) -> GemmParams {
    GemmParams {
        a: Addr::default(),
        b: Addr::default(),
        out: Addr::default(),
        acc: None,
        m,
        k,
        n,
        dtype_in: din,
        dtype_acc: dacc,
        dtype_out: dout,
        transpose_a: false,
        transpose_b: false,
        layout_a: Layout::RowMajor,
        layout_b: Layout::RowMajor,
        layout_out: Layout::RowMajor,
    }
}

pub fn gemm(
    id: u64,
    t: u64,
    seq: u64,
    p: GemmParams,
    reads: Vec<Extent>,
    writes: Vec<Extent>,
) -> Op {
    Op {
        id,
        t_start: t,
        component: "sip0.cube0.pe0.pe_gemm".into(),
        name: format!("gemm_{}", p.dtype_in),
        kind: OpKind::Gemm,
        params: Params::Gemm(p),
        fingerprint: None,
        read: effect(t, seq, reads),
        write: effect(t + 10, seq, writes),
        deps: vec![],
    }
}

pub fn tile(rows: u32, cols: u32, dtype: Dtype) -> MathInput {
    MathInput::Tile {
        addr: Addr::default(),
        rows,
        cols,
        dtype,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn math(
    id: u64,
    t: u64,
    seq: u64,
    op: MathOp,
    inputs: Vec<MathInput>,
    out: (u32, u32, Dtype),
    axis: Option<u8>,
    reads: Vec<Extent>,
    writes: Vec<Extent>,
) -> Op {
    Op {
        id,
        t_start: t,
        component: "sip0.cube0.pe0.pe_math".into(),
        name: format!("{op:?}").to_lowercase(),
        kind: OpKind::Math,
        params: Params::Math(MathParams {
            op,
            inputs,
            out: Addr::default(),
            rows: out.0,
            cols: out.1,
            dtype: out.2,
            axis,
        }),
        fingerprint: None,
        read: if reads.is_empty() {
            None
        } else {
            effect(t, seq, reads)
        },
        write: effect(t + 10, seq, writes),
        deps: vec![],
    }
}

pub fn check(tensor: &str, reference: Expr) -> VerifyOutput {
    VerifyOutput {
        tensor: tensor.into(),
        reference,
        tolerance: None,
    }
}

pub fn check_tol(tensor: &str, reference: Expr, tol: f64) -> VerifyOutput {
    VerifyOutput {
        tensor: tensor.into(),
        reference,
        tolerance: Some(Tolerance {
            rtol: tol,
            atol: tol,
        }),
    }
}

pub fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}

/// Write a whole trace to bytes. `host` gives (tensor index, bytes).
pub fn build(
    tensors: Vec<TensorMeta>,
    host: &[(u32, Vec<u8>)],
    ops: &[Op],
    outputs: Vec<VerifyOutput>,
) -> Vec<u8> {
    build_chunked(tensors, host, ops, outputs, None)
}

/// As [`build`], cutting records chunks at `chunk_bytes` of records.
pub fn build_chunked(
    tensors: Vec<TensorMeta>,
    host: &[(u32, Vec<u8>)],
    ops: &[Op],
    outputs: Vec<VerifyOutput>,
    chunk_bytes: Option<usize>,
) -> Vec<u8> {
    build_full(tensors, host, &[], ops, outputs, chunk_bytes)
}

/// As [`build`], with input snapshots (op id, operand, bytes) written
/// before the records, as `kb-sim --capture-inputs` does.
pub fn build_with_snapshots(
    tensors: Vec<TensorMeta>,
    host: &[(u32, Vec<u8>)],
    snapshots: &[(u64, u32, Vec<u8>)],
    ops: &[Op],
    outputs: Vec<VerifyOutput>,
) -> Vec<u8> {
    build_full(tensors, host, snapshots, ops, outputs, None)
}

fn build_full(
    tensors: Vec<TensorMeta>,
    host: &[(u32, Vec<u8>)],
    snapshots: &[(u64, u32, Vec<u8>)],
    ops: &[Op],
    outputs: Vec<VerifyOutput>,
    chunk_bytes: Option<usize>,
) -> Vec<u8> {
    let meta = Meta {
        tool: "test".into(),
        tensors,
        ..Meta::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &meta).expect("writer");
    if let Some(b) = chunk_bytes {
        w.set_records_chunk_target(b);
    }
    for (i, data) in host {
        w.tensor_data(*i, 0, data).expect("tensor data");
    }
    for (op, operand, data) in snapshots {
        w.snapshot(*op, *operand, data).expect("snapshot");
    }
    for op in ops {
        let component = w.intern(&op.component);
        let op_name = w.intern(&op.name);
        w.push(Record {
            op_id: op.id,
            t_start: op.t_start,
            t_end: op.t_start + 20,
            component,
            op_name,
            kind: op.kind,
            params: op.params.clone(),
            deps: op.deps.iter().map(|&d| kb_format::Dep::data(d)).collect(),
            fingerprint: op.fingerprint,
            read: op.read.clone(),
            write: op.write.clone(),
            active: None,
        })
        .expect("push");
    }
    w.finish(&VerifySpec { outputs }).expect("finish")
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32_of(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The memory-op chain host -> hbm -> tcm -> hbm of an f32 [4, 8] tensor
/// `x` into output `y`, verified as `y == x`. The hbm -> tcm leg moves the
/// rows as two strided halves (even rows, then odd rows) and the tcm -> hbm
/// leg puts them back in place.
pub fn chain_trace() -> (Vec<u8>, Vec<f32>) {
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let xb = f32_bytes(&x);
    let row = 32u64; // 8 f32
    let out = hbm(0x10000);
    let tensors = vec![
        tensor("x", Dtype::F32, &[4, 8], true, None),
        tensor("y", Dtype::F32, &[4, 8], false, Some(out)),
    ];
    let mut ops = vec![
        // host -> hbm, with the fingerprint of the bytes.
        mem(
            1,
            0,
            1,
            vec![span(host(0, 0), 128)],
            2,
            vec![span(hbm(0), 128)],
        ),
        // hbm even rows -> tcm[0..64], odd rows -> tcm[64..128].
        mem(
            2,
            100,
            3,
            vec![strided(hbm(0), row, 2, 2 * row)],
            4,
            vec![span(tcm(0), 64)],
        ),
        mem(
            3,
            100,
            5,
            vec![strided(hbm(row), row, 2, 2 * row)],
            6,
            vec![span(tcm(64), 64)],
        ),
        // tcm -> hbm out, interleaving the halves back.
        mem(
            4,
            200,
            7,
            vec![span(tcm(0), 64)],
            8,
            vec![strided(out, row, 2, 2 * row)],
        ),
        mem(
            5,
            200,
            9,
            vec![span(tcm(64), 64)],
            10,
            vec![strided(out + row, row, 2, 2 * row)],
        ),
    ];
    ops[0].fingerprint = Some(kb_format::fingerprint(&xb));
    let bytes = build(
        tensors,
        &[(0, xb)],
        &ops,
        vec![check("y", Expr::Tensor("x".into()))],
    );
    (bytes, x)
}
