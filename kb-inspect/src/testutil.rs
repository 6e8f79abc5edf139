//! Synthetic traces for tests, built in memory with `kb_format::TraceWriter`
//! (no simulator needed). Shared by the unit tests and, through `#[path]`,
//! by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use kb_format::*;

/// One op to write: its component and op name as strings, and the record
/// (whose `component`/`op_name` ids are filled in by [`build`]).
#[derive(Debug, Clone)]
pub struct Op {
    pub comp: &'static str,
    pub name: &'static str,
    pub rec: Record,
}

/// Write a trace: header and meta, host tensor chunks, then the ops.
pub fn build(
    meta: &Meta,
    tensors: &[(u32, u64, Vec<u8>)],
    ops: &[Op],
    verify: &VerifySpec,
) -> Vec<u8> {
    build_with_launches(meta, tensors, ops, &[], verify)
}

/// [`build`] with a launches chunk.
pub fn build_with_launches(
    meta: &Meta,
    tensors: &[(u32, u64, Vec<u8>)],
    ops: &[Op],
    launches: &[kb_format::Launch],
    verify: &VerifySpec,
) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), meta).unwrap();
    for (t, off, data) in tensors {
        w.tensor_data(*t, *off, data).unwrap();
    }
    for op in ops {
        let mut r = op.rec.clone();
        r.component = w.intern(op.comp);
        r.op_name = w.intern(op.name);
        w.push(r).unwrap();
    }
    w.finish_with_launches(launches, verify).unwrap()
}

/// A memory op moving `bytes` bytes (one write extent of `bytes`).
pub fn mem(id: u64, t0: Ps, t1: Ps, comp: &'static str, name: &'static str, bytes: u64) -> Op {
    let mut deps = vec![];
    if id > 0 {
        deps.push(Dep::data(id - 1));
    }
    Op {
        comp,
        name,
        rec: Record {
            op_id: id,
            t_start: t0,
            t_end: t1,
            kind: OpKind::Memory,
            fingerprint: Some(0x1000 + id),
            deps,
            read: Some(Effect {
                time: t0,
                seq: 2 * id,
                ranges: vec![Extent::contiguous(pa::host(0, 0), bytes)],
            }),
            write: Some(Effect {
                time: t1,
                seq: 2 * id + 1,
                ranges: vec![Extent {
                    pa: 0x1_0000_0000_0000 + id * 0x1000,
                    len: bytes / 2,
                    rows: 2,
                    stride: 0x100,
                }],
            }),
            params: Params::Memory(MemoryParams {
                src: Addr {
                    space: Space::Host,
                    addr: 0,
                },
                dst: Addr {
                    space: Space::Hbm,
                    addr: 0x40,
                },
                rows: 2,
                row_bytes: bytes / 2,
                src_stride: bytes / 2,
                dst_stride: 0x100,
                dtype: Some(Dtype::F16),
            }),
            ..Default::default()
        },
    }
}

pub fn gemm(id: u64, t0: Ps, t1: Ps, comp: &'static str, m: u32, n: u32, k: u32) -> Op {
    Op {
        comp,
        name: "gemm",
        rec: Record {
            op_id: id,
            t_start: t0,
            t_end: t1,
            kind: OpKind::Gemm,
            params: Params::Gemm(GemmParams {
                a: Addr::default(),
                b: Addr::default(),
                out: Addr::default(),
                acc: None,
                m,
                k,
                n,
                dtype_in: Dtype::F16,
                dtype_acc: Dtype::F32,
                dtype_out: Dtype::F16,
                transpose_a: false,
                transpose_b: true,
                layout_a: Layout::RowMajor,
                layout_b: Layout::RowMajor,
                layout_out: Layout::RowMajor,
            }),
            ..Default::default()
        },
    }
}

pub fn math(id: u64, t0: Ps, t1: Ps, comp: &'static str, rows: u32, cols: u32) -> Op {
    Op {
        comp,
        name: "exp",
        rec: Record {
            op_id: id,
            t_start: t0,
            t_end: t1,
            kind: OpKind::Math,
            params: Params::Math(MathParams {
                op: MathOp::Exp,
                inputs: vec![
                    MathInput::Tile {
                        addr: Addr::default(),
                        rows,
                        cols,
                        dtype: Dtype::F32,
                    },
                    MathInput::Scalar(0.5),
                ],
                out: Addr::default(),
                rows,
                cols,
                dtype: Dtype::F32,
                axis: None,
            }),
            ..Default::default()
        },
    }
}

pub const A_F16: [f32; 6] = [1.0, -2.5, 0.125, 65504.0, 0.0, -0.0];
pub const B_BF16: [f32; 4] = [1.0, 3.0e38, -7.5, 0.015625];

pub fn sample_meta() -> Meta {
    Meta {
        tool: "kb-sim".into(),
        tool_version: "0.1.0".into(),
        command_line: vec!["kb-sim".into(), "run".into(), "sample".into()],
        topology: TopologyMeta {
            name: "tiny".into(),
            address_model: "pa".into(),
            resolved: "sips: 1\ncubes: 2\n".into(),
        },
        benchmark: "sample".into(),
        params: vec![("m".into(), "2".into()), ("seed".into(), "7".into())],
        seed: 7,
        tensors: vec![
            TensorMeta {
                name: "a".into(),
                dtype: Dtype::F16,
                shape: vec![2, 3],
                address: 0x40,
                host_data: true,
                shards: vec![],
            },
            TensorMeta {
                name: "b".into(),
                dtype: Dtype::Bf16,
                shape: vec![2, 2],
                address: 0x80,
                host_data: true,
                shards: vec![],
            },
            TensorMeta {
                name: "c".into(),
                dtype: Dtype::F32,
                shape: vec![2, 2],
                address: 0xc0,
                host_data: false,
                shards: vec![Shard {
                    tensor_offset: 0,
                    rows: 2,
                    row_bytes: 8,
                    tensor_row_stride: 8,
                    pa: 0x1_0000_0000_0100,
                }],
            },
        ],
    }
}

pub fn sample_tensors() -> Vec<(u32, u64, Vec<u8>)> {
    let a: Vec<u8> = A_F16
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let b: Vec<u8> = B_BF16
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    // Tensor a arrives in two chunks, b in one.
    vec![(0, 6, a[6..].to_vec()), (0, 0, a[..6].to_vec()), (1, 0, b)]
}

pub fn sample_verify() -> VerifySpec {
    VerifySpec {
        outputs: vec![VerifyOutput {
            tensor: "c".into(),
            reference: Expr::Softmax {
                input: Box::new(Expr::Matmul(
                    Box::new(Expr::Tensor("a".into())),
                    Box::new(Expr::Transpose(Box::new(Expr::Tensor("b".into())))),
                )),
                axis: 1,
            },
            tolerance: Some(Tolerance {
                rtol: 1e-3,
                atol: 1e-5,
            }),
        }],
    }
}

pub const PE_DMA: &str = "sip0.cube0.pe0.pe_dma";

/// The sample ops (times in ps; the run ends at 10 000 ps = 10 ns):
///
/// | id | component | name | kind | start | end | bytes | flops |
/// |---|---|---|---|---|---|---|---|
/// | 0 | host | h2d | memory | 0 | 1000 | 64 | |
/// | 1 | pe_dma | dma_read | memory | 1000 | 3000 | 64 | |
/// | 2 | pe_dma | dma_read | memory | 2000 | 4000 | 128 | |
/// | 3 | pe0.gemm | gemm | gemm | 4000 | 6000 | | 2*2*3*4 = 48 |
/// | 4 | pe_dma | dma_write | memory | 5000 | 6000 | 32 | |
/// | 5 | cube1.pe0.vec | exp | math | 6000 | 7000 | | 2*8 = 16 |
/// | 6 | sip0.pcie_ep | d2h | memory | 7000 | 10000 | 256 | |
///
/// Active intervals (the rest of each span is waiting): op 1 [2500,
/// 3000), op 2 [2000, 2400) (the later-issued transfer moves first), op 3
/// [5500, 6000); the others have none (all of their span is active).
pub fn sample_ops() -> Vec<Op> {
    let active = |mut op: Op, a0: Ps, a1: Ps| {
        op.rec.active = Some((a0, a1));
        op
    };
    vec![
        mem(0, 0, 1000, "host", "h2d", 64),
        active(mem(1, 1000, 3000, PE_DMA, "dma_read", 64), 2500, 3000),
        active(mem(2, 2000, 4000, PE_DMA, "dma_read", 128), 2000, 2400),
        active(
            gemm(3, 4000, 6000, "sip0.cube0.pe0.gemm", 2, 3, 4),
            5500,
            6000,
        ),
        mem(4, 5000, 6000, PE_DMA, "dma_write", 32),
        math(5, 6000, 7000, "sip0.cube1.pe0.vec", 2, 8),
        mem(6, 7000, 10000, "sip0.pcie_ep", "d2h", 256),
    ]
}

/// Two launches: a GEMM on two PEs of cube 0, then a softmax on one PE.
pub fn sample_launches() -> Vec<kb_format::Launch> {
    vec![
        kb_format::Launch {
            kernel: "gemm".into(),
            grid: [2, 1, 1],
            pes: vec![[0, 0, 0], [0, 0, 1]],
            t_start: 0,
            t_end: 5_000,
            flops: 48,
            useful_flops: 30,
        },
        kb_format::Launch {
            kernel: "softmax".into(),
            grid: [4, 2, 1],
            pes: vec![[0, 1, 0]],
            t_start: 6_000,
            t_end: 7_000,
            flops: 16,
            useful_flops: 16,
        },
    ]
}

pub fn sample_trace() -> Vec<u8> {
    build_with_launches(
        &sample_meta(),
        &sample_tensors(),
        &sample_ops(),
        &sample_launches(),
        &sample_verify(),
    )
}

/// Two HBM channels' service: cube 1's channel 10 (read 6 KiB, written 2
/// KiB, busy [1000, 2000) and [4000, 4500) ps) and cube 0's channel 2
/// (64 B written, busy [9000, 9002)).
pub fn sample_channels() -> Vec<kb_format::ChannelUsage> {
    vec![
        kb_format::ChannelUsage {
            sip: 0,
            cube: 0,
            channel: 2,
            bytes_read: 0,
            bytes_written: 64,
            busy: vec![(9000, 9002)],
        },
        kb_format::ChannelUsage {
            sip: 0,
            cube: 1,
            channel: 10,
            bytes_read: 6144,
            bytes_written: 2048,
            busy: vec![(1000, 2000), (4000, 4500)],
        },
    ]
}

/// The sample trace with [`sample_channels`].
pub fn channel_trace() -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    for op in sample_ops() {
        let mut r = op.rec.clone();
        r.component = w.intern(op.comp);
        r.op_name = w.intern(op.name);
        w.push(r).unwrap();
    }
    w.channels(sample_channels()).unwrap();
    w.finish(&sample_verify()).unwrap()
}

/// Write bytes to a file in a fresh temporary directory.
pub fn write_temp(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.kbt");
    std::fs::write(&p, bytes).unwrap();
    (d, p)
}

/// Damaged variants of a trace: truncated at several points, and with a
/// flipped byte in the meta, in a records chunk and in the footer.
pub fn damaged(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![];
    for cut in [
        0,
        10,
        64,
        200,
        bytes.len() / 2,
        bytes.len() - 64,
        bytes.len() - 1,
    ] {
        out.push((format!("truncated at {cut}"), bytes[..cut].to_vec()));
    }
    for at in [
        8,
        64 + 70,
        bytes.len() / 2,
        bytes.len() - 100,
        bytes.len() - 20,
    ] {
        let mut b = bytes.to_vec();
        b[at] ^= 0x5a;
        out.push((format!("byte {at} flipped"), b));
    }
    out
}

/// A device PA.
pub fn dev(space: Space, sip: u32, cube: u32, pe: u32, offset: u64) -> u64 {
    pa::Pa {
        space,
        sip,
        cube,
        pe,
        offset,
    }
    .encode()
    .unwrap()
}

/// A memory op copying `rows` rows of `len` bytes from the ranges
/// `src` to `dst` (row stride 256 on both sides; several `src` or `dst`
/// PAs make several ranges, the bytes split evenly). An empty `src` means
/// no read effect.
#[allow(clippy::too_many_arguments)]
pub fn copy(
    id: u64,
    t0: Ps,
    t1: Ps,
    comp: &'static str,
    name: &'static str,
    src: &[u64],
    dst: &[u64],
    len: u64,
    rows: u32,
) -> Op {
    let ranges = |pas: &[u64]| -> Vec<Extent> {
        pas.iter()
            .map(|&pa| Extent {
                pa,
                len: len / pas.len() as u64,
                rows,
                stride: 256,
            })
            .collect()
    };
    let effect = |pas: &[u64], time, seq| {
        (!pas.is_empty()).then(|| Effect {
            time,
            seq,
            ranges: ranges(pas),
        })
    };
    Op {
        comp,
        name,
        rec: Record {
            op_id: id,
            t_start: t0,
            t_end: t1,
            kind: OpKind::Memory,
            fingerprint: Some(0x2000 + id),
            read: effect(src, t0, 2 * id),
            write: effect(dst, t1, 2 * id + 1),
            params: Params::Memory(MemoryParams {
                src: Addr {
                    space: Space::Tcm,
                    addr: 0,
                },
                dst: Addr {
                    space: Space::Tcm,
                    addr: 0,
                },
                rows,
                row_bytes: len,
                src_stride: 256,
                dst_stride: 256,
                dtype: None,
            }),
            ..Default::default()
        },
    }
}

/// The copies trace (times in ps; the run ends at 10 000 ps). Routes name
/// the first read and write range; HBM is per cube whatever its PE field.
///
/// | id | component | name | start | end | route | bytes |
/// |---|---|---|---|---|---|---|
/// | 0 | sip0.cube0.hbm_ctrl | host_write | 0 | 1000 | host -> sip0.cube0.hbm (pe field 1) | 256 |
/// | 1 | pe_dma | dma_read | 1000 | 2000 | sip0.cube0.hbm -> sip0.cube0.pe0.tcm | 64 |
/// | 2 | pe_dma | ipcq_copy | 2000 | 4000 | sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm | 2 x 64 = 128 |
/// | 3 | pe_dma | ipcq_copy | 3000 | 5000 | sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm | 64 |
/// | 4 | sip0.cube0.pe0.gemm | gemm | 4000 | 6000 | (none: not a memory op) | 0 |
/// | 5 | pe_dma | ipcq_copy | 5000 | 6000 | sip0.cube0.pe0.tcm -> sip0.cube1.sram | 32 |
/// | 6 | pe_dma | dma_read | 6000 | 7000 | sip0.cube0.hbm (pe field 3; 2nd range cube 1) -> sip0.cube0.pe0.tcm | 64 |
/// | 7 | sip0.cube1.pe0.vec | exp | 6500 | 7500 | (none: math) | 0 |
/// | 8 | sip1.cube0.pe2.pe_dma | ipcq_copy | 8000 | 9000 | sip1.cube0.pe2.tcm -> sip1.cube0.pe10.tcm | 16 |
/// | 9 | pe_dma | dma_write | 9000 | 10000 | ? (no read effect) -> sip0.cube0.hbm | 32 |
pub fn route_ops() -> Vec<Op> {
    let tcm = |sip, cube, pe, off| dev(Space::Tcm, sip, cube, pe, off);
    let hbm = |cube, pe, off| dev(Space::Hbm, 0, cube, pe, off);
    let sram1 = dev(Space::Sram, 0, 1, 0, 0x100);
    let pe0 = tcm(0, 0, 0, 0x40);
    let pe1 = tcm(0, 0, 1, 0x80);
    vec![
        copy(
            0,
            0,
            1000,
            "sip0.cube0.hbm_ctrl",
            "host_write",
            &[pa::host(0, 0)],
            &[hbm(0, 1, 0x1000)],
            256,
            1,
        ),
        copy(
            1,
            1000,
            2000,
            PE_DMA,
            "dma_read",
            &[hbm(0, 0, 0)],
            &[pe0],
            64,
            1,
        ),
        copy(2, 2000, 4000, PE_DMA, "ipcq_copy", &[pe0], &[pe1], 64, 2),
        copy(3, 3000, 5000, PE_DMA, "ipcq_copy", &[pe0], &[pe1], 64, 1),
        gemm(4, 4000, 6000, "sip0.cube0.pe0.gemm", 2, 3, 4),
        copy(5, 5000, 6000, PE_DMA, "ipcq_copy", &[pe0], &[sram1], 32, 1),
        copy(
            6,
            6000,
            7000,
            PE_DMA,
            "dma_read",
            &[hbm(0, 3, 0), hbm(1, 0, 0)],
            &[pe0],
            64,
            1,
        ),
        math(7, 6500, 7500, "sip0.cube1.pe0.vec", 2, 8),
        copy(
            8,
            8000,
            9000,
            "sip1.cube0.pe2.pe_dma",
            "ipcq_copy",
            &[tcm(1, 0, 2, 0)],
            &[tcm(1, 0, 10, 0)],
            16,
            1,
        ),
        copy(
            9,
            9000,
            10000,
            PE_DMA,
            "dma_write",
            &[],
            &[hbm(0, 0, 0x2000)],
            32,
            1,
        ),
    ]
}

pub fn route_trace() -> Vec<u8> {
    build(&sample_meta(), &[], &route_ops(), &VerifySpec::default())
}

/// `op` with its edges replaced by `deps` (op id, kind).
pub fn with_deps(mut op: Op, deps: &[(u64, DepKind)]) -> Op {
    op.rec.deps = deps.iter().map(|&(op, kind)| Dep { op, kind }).collect();
    op
}

/// A sync record: no params, no effects.
pub fn sync(id: u64, t0: Ps, t1: Ps, comp: &'static str, name: &'static str) -> Op {
    Op {
        comp,
        name,
        rec: Record {
            op_id: id,
            t_start: t0,
            t_end: t1,
            kind: OpKind::Sync,
            ..Default::default()
        },
    }
}

/// The two-PE program of the critical-path tests (times in ps). Launch 0
/// `two_pe` runs [1000, 14000] on PE0 and PE1, launch 1 `tail` [14000,
/// 15000] on PE0. Loads copy HBM -> the PE's TCM, stores TCM -> HBM.
///
/// | id | component | name | start | end | deps |
/// |---|---|---|---|---|---|
/// | 0 | host | launch (sync) | 0 | 1000 | |
/// | 1 | pe0.pe_dma | dma_read | 1100 | 3000 | 0 host |
/// | 2 | pe0.pe_gemm | gemm | 3200 | 6000 | 1 program |
/// | 3 | pe0.pe_dma | dma_write | 6000 | 7000 | 2 data |
/// | 4 | pe0.pe_cpu | signal (sync) | 7000 | 7500 | 3 program |
/// | 5 | pe1.pe_cpu | wait_signal (sync) | 1000 | 7600 | 4 sync, 0 host |
/// | 6 | pe1.pe_dma | dma_read | 7700 | 9000 | 5 program |
/// | 7 | pe1.pe_math | exp | 9000 | 12000 | 6 data |
/// | 8 | pe1.pe_dma | dma_write | 12000 | 14000 | 7 data |
/// | 9 | pe0.pe_cpu | kernel (sync) | 1000 | 7500 | 4 program, 0 host |
/// | 10 | pe1.pe_cpu | kernel (sync) | 1000 | 14000 | 8 program, 0 host |
/// | 11 | pe0.pe_dma | dma_read | 14200 | 15000 | 10 host |
pub fn critical_ops() -> Vec<Op> {
    use DepKind::*;
    let hbm = dev(Space::Hbm, 0, 0, 0, 0x1000);
    let tcm = |pe| dev(Space::Tcm, 0, 0, pe, 0x40);
    let load = |id, t0, t1, pe: u32| {
        let comp = ["sip0.cube0.pe0.pe_dma", "sip0.cube0.pe1.pe_dma"][pe as usize];
        copy(id, t0, t1, comp, "dma_read", &[hbm], &[tcm(pe)], 64, 1)
    };
    let store = |id, t0, t1, pe: u32| {
        let comp = ["sip0.cube0.pe0.pe_dma", "sip0.cube0.pe1.pe_dma"][pe as usize];
        copy(id, t0, t1, comp, "dma_write", &[tcm(pe)], &[hbm], 64, 1)
    };
    let (cpu0, cpu1) = ("sip0.cube0.pe0.pe_cpu", "sip0.cube0.pe1.pe_cpu");
    vec![
        sync(0, 0, 1000, "host", "launch"),
        with_deps(load(1, 1100, 3000, 0), &[(0, Host)]),
        with_deps(
            gemm(2, 3200, 6000, "sip0.cube0.pe0.pe_gemm", 4, 4, 4),
            &[(1, Program)],
        ),
        with_deps(store(3, 6000, 7000, 0), &[(2, Data)]),
        with_deps(sync(4, 7000, 7500, cpu0, "signal"), &[(3, Program)]),
        with_deps(
            sync(5, 1000, 7600, cpu1, "wait_signal"),
            &[(4, Sync), (0, Host)],
        ),
        with_deps(load(6, 7700, 9000, 1), &[(5, Program)]),
        with_deps(
            math(7, 9000, 12000, "sip0.cube0.pe1.pe_math", 4, 4),
            &[(6, Data)],
        ),
        with_deps(store(8, 12000, 14000, 1), &[(7, Data)]),
        with_deps(
            sync(9, 1000, 7500, cpu0, "kernel"),
            &[(4, Program), (0, Host)],
        ),
        with_deps(
            sync(10, 1000, 14000, cpu1, "kernel"),
            &[(8, Program), (0, Host)],
        ),
        with_deps(load(11, 14200, 15000, 0), &[(10, Host)]),
    ]
}

pub fn critical_launches() -> Vec<kb_format::Launch> {
    let launch = |kernel: &str, pes: Vec<[u32; 3]>, t_start, t_end| kb_format::Launch {
        kernel: kernel.into(),
        grid: [pes.len() as u32, 1, 1],
        pes,
        t_start,
        t_end,
        flops: 0,
        useful_flops: 0,
    };
    vec![
        launch("two_pe", vec![[0, 0, 0], [0, 0, 1]], 1000, 14000),
        launch("tail", vec![[0, 0, 0]], 14000, 15000),
    ]
}

pub fn critical_trace() -> Vec<u8> {
    build_with_launches(
        &sample_meta(),
        &[],
        &critical_ops(),
        &critical_launches(),
        &VerifySpec::default(),
    )
}
