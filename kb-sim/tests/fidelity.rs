//! Fidelity of the machine model: exact timings where the model is
//! deterministic, computed by hand from the topology numbers, and
//! bandwidths under contention.

mod common;

use kb_format::{Addr, DepKind, MemoryParams, Meta, Record, Space, TraceWriter, VerifySpec};
use kb_sim::engine::Engine;
use kb_sim::machine::{Machine, PeCoord};
use kb_sim::program::{Command, DmaCmd, PeProgram, Script};
use kb_sim::runtime::Runtime;
use kb_sim::topology::Topology;

/// Run one script per PE (PEs without a script do nothing); returns the
/// records with their component and op names.
fn simulate(
    topo: &Topology,
    scripts: Vec<(PeCoord, Vec<Command>)>,
) -> Vec<(Record, String, String)> {
    common::named_records(&simulate_trace(topo, scripts))
}

/// [`simulate`], returning the trace.
fn simulate_trace(topo: &Topology, scripts: Vec<(PeCoord, Vec<Command>)>) -> Vec<u8> {
    let m = Machine::build(topo);
    let rt = Runtime::new(&m);
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for pe in m.pes() {
        let cmds = scripts
            .iter()
            .find(|(p, _)| *p == pe)
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        programs.push(Box::new(Script::new(cmds)));
    }
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (writer, _) = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap();
    writer.finish(&VerifySpec::default()).unwrap()
}

fn pa(space: Space, pe: PeCoord, offset: u64) -> u64 {
    kb_format::pa::Pa {
        space,
        sip: pe.sip,
        cube: pe.cube,
        pe: pe.pe,
        offset,
    }
    .encode()
    .unwrap()
}

fn read_cmd(from_hbm_of: PeCoord, at: u64, to: PeCoord, bytes: u64) -> DmaCmd {
    DmaCmd {
        mem: MemoryParams {
            src: Addr {
                space: Space::Hbm,
                addr: pa(Space::Hbm, from_hbm_of, at),
            },
            dst: Addr {
                space: Space::Tcm,
                addr: pa(Space::Tcm, to, 0),
            },
            rows: 1,
            row_bytes: bytes,
            src_stride: bytes,
            dst_stride: bytes,
            dtype: None,
        },
        label: None,
    }
}

const PE0: PeCoord = PeCoord {
    sip: 0,
    cube: 0,
    pe: 0,
};

/// ps to serialize `bytes` at `gbs` GB/s, rounded up as the model does.
fn ser(bytes: u64, gbs: f64) -> u64 {
    (bytes as f64 * 1000.0 / gbs).ceil() as u64
}

#[test]
fn uncontended_dma_read_latency_matches_hand_computation() {
    let topo = Topology::load("pa").unwrap();
    // The numbers below are pa.yaml's (the PA model: no translation time);
    // fail loudly if it changes.
    assert_eq!(topo.links.noc_pe.latency_ns.0, 5.0);
    assert_eq!(topo.links.noc_pe.bw_gbs.0, 256.0);
    assert_eq!(topo.links.noc_hbm.latency_ns.0, 5.0);
    assert_eq!(topo.links.noc_hbm.bw_gbs.0, 4096.0);
    assert_eq!(topo.links.pe_internal.latency_ns.0, 1.0);
    assert_eq!(topo.links.pe_internal.bw_gbs.0, 64.0);
    assert_eq!(topo.fabric.first_flit_ns.0, 2.0);
    assert_eq!(
        (
            topo.hbm.pseudo_channels,
            topo.hbm.channel_bw_gbs.0,
            topo.hbm.latency_ns.0
        ),
        (32, 32.0, 100.0)
    );
    assert_eq!(topo.hbm.interleave_bytes, 256);
    assert_eq!((topo.tcm.latency_ns.0, topo.tcm.bw_gbs.0), (2.0, 1024.0));
    assert_eq!(topo.pe_dma.setup_ns.0, 10.0);

    let bytes = 4096u64;
    let recs = simulate(
        &topo,
        vec![(PE0, vec![Command::Dma(read_cmd(PE0, 0, PE0, bytes))])],
    );
    let (dma, comp, name) = recs
        .iter()
        .find(|(_, _, n)| n == "dma_read")
        .expect("a dma_read record");
    assert_eq!(comp, "sip0.cube0.pe0.pe_dma");
    let _ = name;

    // Request (64 B) pe_dma -> noc -> hbm_router -> hbm_ctrl: three hops,
    // 5 ns each, a 2 ns first-flit overhead at the two intermediate nodes;
    // the last link's serialization (64 B at 4096 GB/s = 16 ps) ends it.
    let request = 3 * 5_000 + 2 * 2_000 + ser(64, 4096.0);
    // HBM: 4096 B over 32 channels interleaved by 256 B: 16 channels get
    // 256 B each at 32 GB/s = 8 ns in parallel, plus 100 ns latency.
    let hbm = ser(256, 32.0) + 100_000;
    // Response (4096 B) hbm_ctrl -> hbm_router -> noc -> pe_dma: the noc_pe
    // link is slowest (4096 B at 256 GB/s = 16 ns) and it is the last hop.
    let head_at_last = 2 * 5_000 + 2 * 2_000;
    let tail_before_last = ser(bytes, 4096.0) + 5_000 + 2_000 + 5_000; // cannot bind here
    let response = (head_at_last + ser(bytes, 256.0)).max(tail_before_last) + 5_000;
    // One burst (4096 B) over the DMA's tcm_port link into TCM: its 1 ns
    // latency (the 4 ns serialization at 1024 GB/s hides under noc_pe's
    // 16 ns), then the TCM write: 4096 B at 1024 GB/s = 4 ns, plus 2 ns.
    assert_eq!(topo.pe_dma.burst_bytes, 4096);
    assert_eq!(topo.links.tcm_port.latency_ns.0, 1.0);
    let port = 1_000;
    let tcm = ser(bytes, 1024.0) + 2_000;
    let expected = 10_000 + request + hbm + response + port + tcm;
    assert_eq!(dma.t_end - dma.t_start, expected, "dma_read service time");

    // The read observes HBM when the channels finish; the write lands in
    // TCM when the TCM port finishes, at the record's end.
    let read = dma.read.as_ref().unwrap();
    let write = dma.write.as_ref().unwrap();
    assert_eq!(read.time - dma.t_start, 10_000 + request + hbm);
    assert_eq!(write.time, dma.t_end);
    assert!(read.seq < write.seq);
}

/// A lone read of `bytes` (a multiple of 256, or less than 256) from
/// PE0's HBM into its TCM on `pa.yaml`, by hand, under the streaming
/// rule: every stage passes a transfer on as `pe_dma.burst_bytes` bursts,
/// so each stage starts on the first burst and ends no earlier than the
/// stage before it.
fn lone_read_on_pa(bytes: u64) -> u64 {
    let burst = 4096u64;
    // Setup, then the 64 B request over three 5 ns hops (2 ns first flit
    // at the two intermediate nodes; the last link's 4096 GB/s ends it).
    let at_hbm = 10_000 + 3 * 5_000 + 2 * 2_000 + ser(64, 4096.0);
    // HBM: 256 B blocks over 32 channels at 32 GB/s, 100 ns latency. Each
    // channel serves its share; the first burst's part of that share is
    // out first.
    let channels = (bytes / 256).clamp(1, 32);
    let share = bytes / channels;
    let first = (share * burst.min(bytes)).div_ceil(bytes);
    let mut head = at_hbm + ser(first, 32.0) + 100_000;
    let mut tail = at_hbm + ser(share, 32.0) + 100_000;
    // Response: hbm_ctrl -> hbm_router -> noc (4096 GB/s) -> pe_dma
    // (256 GB/s), 5 ns each, cut through from the head; a link's tail ends
    // no earlier than its serialization or the tail before it.
    for (i, bw) in [4096.0, 4096.0, 256.0].into_iter().enumerate() {
        tail = (head + ser(bytes, bw)).max(tail) + 5_000;
        head += 5_000 + if i < 2 { 2_000 } else { 0 };
    }
    // pe_dma -> tcm over the tcm_port link (1 ns, 1024 GB/s) from the
    // head at the engine.
    tail = (head + ser(bytes, 1024.0)).max(tail) + 1_000;
    head += 1_000;
    // TCM writes as the bytes come (1024 GB/s), finishing one burst's time
    // after the last arrives (no earlier than its whole write from the
    // first), plus 2 ns latency.
    let busy = ser(bytes, 1024.0);
    let start = head.max(tail + ser(burst.min(bytes), 1024.0) - busy);
    start + busy + 2_000
}

#[test]
fn a_lone_dma_streams_at_its_narrowest_stage_and_a_small_one_keeps_its_latency() {
    let topo = Topology::load("pa").unwrap();
    assert_eq!(topo.pe_dma.burst_bytes, 4096);
    assert!(topo.hbm.hash_channels);
    for bytes in [64u64, 4096, 64 << 10, 1 << 20] {
        let recs = simulate(
            &topo,
            vec![(PE0, vec![Command::Dma(read_cmd(PE0, 0, PE0, bytes))])],
        );
        let (dma, _, _) = recs.iter().find(|(_, _, n)| n == "dma_read").unwrap();
        assert_eq!(dma.t_end - dma.t_start, lone_read_on_pa(bytes), "{bytes} B");
    }
    // 64 B: one burst, so nothing overlaps: the stages' latencies in turn
    // (153.329 ns; 1 ns of it is the TCM port hop).
    assert_eq!(lone_read_on_pa(64), 153_329);
    // 1 MiB: the 256 GB/s noc_pe link is the narrowest stage (HBM serves
    // 32 x 32 = 1024 GB/s, TCM 1024 GB/s); the read reaches 96 % of it.
    let ps = lone_read_on_pa(1 << 20);
    let gbs = (1u64 << 20) as f64 * 1000.0 / ps as f64;
    assert!(gbs >= 0.95 * 256.0, "{gbs:.1} GB/s in {ps} ps");
}

/// Throughput in GB/s of the records matching `pred`: bytes / span.
fn throughput(
    recs: &[(Record, String, String)],
    pred: impl Fn(&(Record, String, String)) -> bool,
) -> f64 {
    let sel: Vec<_> = recs.iter().filter(|r| pred(r)).collect();
    let bytes: u64 = sel
        .iter()
        .map(|(r, _, _)| {
            r.write
                .as_ref()
                .unwrap()
                .ranges
                .iter()
                .map(|x| x.bytes())
                .sum::<u64>()
        })
        .sum();
    let start = sel.iter().map(|(r, _, _)| r.t_start).min().unwrap();
    let end = sel.iter().map(|(r, _, _)| r.t_end).max().unwrap();
    bytes as f64 * 1000.0 / (end - start) as f64
}

/// `n` async reads of `tile` bytes from `src`'s HBM into `pe`'s TCM.
fn stream(pe: PeCoord, src: PeCoord, n: u64, tile: u64) -> Vec<Command> {
    let mut v: Vec<Command> = (0..n)
        .map(|i| Command::DmaAsync(read_cmd(src, i * tile, pe, tile)))
        .collect();
    v.push(Command::WaitAll);
    v
}

#[test]
fn pes_streaming_from_one_cube_reach_the_aggregate_hbm_bandwidth() {
    let topo = Topology::load("pa").unwrap();
    let aggregate = topo.hbm.pseudo_channels as f64 * topo.hbm.channel_bw_gbs.0;
    // Make the per-PE link wide enough that HBM is the bottleneck.
    let mut topo = topo;
    topo.links.noc_pe.bw_gbs.0 = 1024.0;
    let m = Machine::build(&topo);
    let scripts: Vec<_> = m
        .pes()
        .filter(|p| p.cube == 0)
        .map(|pe| (pe, stream(pe, pe, 256, 64 << 10)))
        .collect();
    let recs = simulate(&topo, scripts);
    let got = throughput(&recs, |(_, _, n)| n == "dma_read");
    assert!(
        (got - aggregate).abs() / aggregate < 0.02,
        "aggregate {got:.1} GB/s, configured {aggregate} GB/s"
    );
}

#[test]
fn two_flows_sharing_one_link_each_get_half_of_it() {
    // Two PEs of cube 0 read from cube 1's HBM: both flows cross the one
    // cube_link from cube 1 to cube 0.
    let topo = Topology::load("default").unwrap();
    let link = topo.links.cube_link.bw_gbs.0;
    assert!(
        topo.links.noc_pe.bw_gbs.0 >= link,
        "the shared link must be the bottleneck"
    );
    let remote = PeCoord {
        sip: 0,
        cube: 1,
        pe: 0,
    };
    let a = PeCoord {
        sip: 0,
        cube: 0,
        pe: 0,
    };
    let b = PeCoord {
        sip: 0,
        cube: 0,
        pe: 1,
    };
    let recs = simulate(
        &topo,
        vec![
            (a, stream(a, remote, 128, 64 << 10)),
            (b, stream(b, remote, 128, 64 << 10)),
        ],
    );
    for pe in ["pe0", "pe1"] {
        let got = throughput(&recs, |(_, c, _)| c.contains(&format!("cube0.{pe}.pe_dma")));
        assert!(
            (got - link / 2.0).abs() / (link / 2.0) < 0.02,
            "{pe}: {got:.1} GB/s, expected {}",
            link / 2.0
        );
    }
}

#[test]
fn a_run_past_the_time_limit_stops_with_an_error_instead_of_wrapping() {
    let topo = Topology::load("pa").unwrap();
    let m = Machine::build(&topo);
    let rt = Runtime::new(&m);
    let scripts: Vec<Box<dyn PeProgram>> = m
        .pes()
        .map(|pe| -> Box<dyn PeProgram> {
            Box::new(Script::new(if pe == PE0 {
                stream(PE0, PE0, 8, 64 << 10)
            } else {
                Vec::new()
            }))
        })
        .collect();
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    // Eight 64 KiB reads take microseconds; stop the model at 1 us.
    let e = Engine::new(&m, writer, &rt.tensors, scripts)
        .time_limit(1_000_000)
        .run()
        .unwrap_err();
    assert!(
        matches!(e, kb_sim::engine::SimError::TimeLimit { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("the model's limit"), "{e}");
}

#[test]
fn service_times_saturate_rather_than_wrap() {
    use kb_sim::component::{Component, Request, Scratchpad};
    // 2^40 bytes at 1e-3 GB/s is about 1.1e18 ps: served after a clock
    // already near the end of u64, the end saturates.
    let mut s = Scratchpad::new(1.0, 1e-3);
    let r = Request {
        pa: 0,
        row_bytes: 1 << 40,
        rows: 1,
        stride: 0,
        channels: None,
    };
    let first = s.serve(u64::MAX - 1_000, &r);
    assert_eq!(first.end, u64::MAX);
    assert_eq!(s.serve(0, &r).end, u64::MAX);
}

fn tcm(pe: PeCoord, offset: u64) -> Addr {
    Addr {
        space: Space::Tcm,
        addr: pa(Space::Tcm, pe, offset),
    }
}

/// `out = a x b` on `pe`: `m x k` by `k x n` f16 tiles at TCM offsets `a`
/// and `b`, an f32 result at `out`.
fn gemm(pe: PeCoord, (a, b, out): (u64, u64, u64), (m, k, n): (u32, u32, u32)) -> Command {
    Command::Gemm(kb_sim::program::Labeled {
        op: kb_format::GemmParams {
            a: tcm(pe, a),
            b: tcm(pe, b),
            out: tcm(pe, out),
            acc: None,
            m,
            k,
            n,
            dtype_in: kb_format::Dtype::F16,
            dtype_acc: kb_format::Dtype::F32,
            dtype_out: kb_format::Dtype::F32,
            transpose_a: false,
            transpose_b: false,
            layout_a: Default::default(),
            layout_b: Default::default(),
            layout_out: Default::default(),
        },
        label: None,
        useful_flops: 0,
    })
}

/// `out = x + y` on `pe`: `rows x cols` f32 tiles at TCM offsets.
fn add(pe: PeCoord, (x, y, out): (u64, u64, u64), (rows, cols): (u32, u32)) -> Command {
    let tile = |at| kb_format::MathInput::Tile {
        addr: tcm(pe, at),
        rows,
        cols,
        dtype: kb_format::Dtype::F32,
    };
    Command::Math(kb_sim::program::Labeled {
        op: kb_format::MathParams {
            op: kb_format::MathOp::Add,
            inputs: vec![tile(x), tile(y)],
            out: tcm(pe, out),
            rows,
            cols,
            dtype: kb_format::Dtype::F32,
            axis: None,
        },
        label: None,
        useful_flops: 0,
    })
}

#[test]
fn a_gemm_streams_its_operands_through_the_tcm_port_exactly() {
    let mut topo = Topology::load("pa").unwrap();
    assert_eq!((topo.tcm.latency_ns.0, topo.tcm.bw_gbs.0), (2.0, 1024.0));
    assert_eq!(
        (
            topo.links.tcm_port.latency_ns.0,
            topo.links.tcm_port.bw_gbs.0
        ),
        (1.0, 1024.0)
    );
    assert_eq!(topo.pe_dma.burst_bytes, 4096);
    assert_eq!(
        (topo.pe_gemm.tflops.f16.0, topo.pe_gemm.setup_ns.0),
        (64.0, 20.0)
    );
    // 64 x 64 x 64, f16 in (8 KiB per operand), f32 out (16 KiB).
    let run = |topo: &Topology| {
        let recs = simulate(
            topo,
            vec![(PE0, vec![gemm(PE0, (0, 8 << 10, 16 << 10), (64, 64, 64))])],
        );
        let (g, comp, _) = recs
            .iter()
            .find(|(_, _, n)| n.starts_with("gemm"))
            .expect("a gemm record")
            .clone();
        assert_eq!(comp, "sip0.cube0.pe0.pe_gemm");
        g
    };
    let g = run(&topo);
    // From the op's start: TCM reads A (8 ns) then B (8 ns) through its
    // one port; the first 4 KiB burst is out after 4 ns + 2 ns latency,
    // the last byte at 16 + 2 = 18 ns.
    let (head, tail) = (ser(4096, 1024.0) + 2_000, 2 * ser(8192, 1024.0) + 2_000);
    // The 16 KiB leave over tcm -> pe_gemm (1 ns, 1024 GB/s) from the
    // head: the link is done at max(6 + 16, 18) = 22 ns; the head arrives
    // at 7 ns, the tail at 23 ns.
    let at_unit = head + 1_000;
    let tail_at_unit = (head + ser(16 << 10, 1024.0)).max(tail) + 1_000;
    // Work: 2 x 64^3 flops at 64 TFLOP/s = 8.192 ns, plus 20 ns setup; it
    // runs from the first burst and ends no earlier than the last byte.
    let work = (2.0 * 64f64.powi(3) / 64.0).ceil() as u64 + 20_000;
    let done = (at_unit + work).max(tail_at_unit);
    assert_eq!(done, 35_192, "compute-bound: the stream hides under it");
    // With the accumulator buffer (the default) the result stays in the
    // unit: the op ends when it is computed. The unit computed its FLOPs
    // at peak for the last 8.192 ns of it.
    assert_eq!(g.t_end - g.t_start, done);
    assert_eq!(g.active, Some((g.t_start + done - 8_192, g.t_end)));
    // Without one (`acc_kib: 0`):
    topo.pe_gemm.acc_kib = 0;
    let g = run(&topo);
    // The 16 KiB result crosses pe_gemm -> tcm (16 ns + 1 ns); TCM writes
    // it as it comes, finishing one burst's time (4 ns) after the last
    // byte arrives, plus its 2 ns latency.
    let result_tail = done + ser(16 << 10, 1024.0) + 1_000;
    let end = result_tail + ser(4096, 1024.0) + 2_000;
    assert_eq!(g.t_end - g.t_start, end);
}

/// The span of `recs` on components containing `comp`, and the TCM bytes
/// their operands and results moved.
fn tcm_traffic(recs: &[(Record, String, String)], comp: &str) -> (u64, u64) {
    let sel: Vec<_> = recs.iter().filter(|(_, c, _)| c.contains(comp)).collect();
    let bytes = sel
        .iter()
        .flat_map(|(r, _, _)| [r.read.as_ref(), r.write.as_ref()])
        .flatten()
        .flat_map(|e| e.ranges.iter().map(|x| x.bytes()))
        .sum();
    let start = sel.iter().map(|(r, _, _)| r.t_start).min().unwrap();
    let end = sel.iter().map(|(r, _, _)| r.t_end).max().unwrap();
    (end - start, bytes)
}

#[test]
fn a_gemm_whose_operands_stream_slower_than_it_computes_is_port_bound() {
    let mut topo = Topology::load("pa").unwrap();
    // A narrow TCM: 128 x 128 x 128 f16 reads 64 KiB of operands, 512 ns
    // at 128 GB/s, against 65.536 + 20 ns of work. The result goes back
    // through the port (no accumulator buffer).
    topo.tcm.bw_gbs.0 = 128.0;
    topo.pe_gemm.acc_kib = 0;
    let recs = simulate(
        &topo,
        vec![(
            PE0,
            vec![gemm(PE0, (0, 32 << 10, 64 << 10), (128, 128, 128))],
        )],
    );
    let (g, _, _) = recs.iter().find(|(_, _, n)| n.starts_with("gemm")).unwrap();
    // Reads end at 512 ns + 2 ns latency; the link is long done, so the
    // last byte is at the unit 1 ns later: that is when it finishes
    // computing. The 64 KiB f32 result then crosses the link (64 ns +
    // 1 ns) and TCM writes it at 128 GB/s: 512 ns, started as early as
    // its last burst (32 ns at 128 GB/s) still ends after the arrival.
    let done = ser(64 << 10, 128.0) + 2_000 + 1_000;
    let arrived = done + ser(64 << 10, 1024.0) + 1_000;
    let write_start = (done + 1_000).max(arrived + ser(4096, 128.0) - ser(64 << 10, 128.0));
    let end = write_start + ser(64 << 10, 128.0) + 2_000;
    assert_eq!(g.t_end - g.t_start, end);
    // Port-bound, visibly: the op takes about its bytes over the port.
    let port = ser(128 << 10, 128.0);
    assert!(
        g.t_end - g.t_start >= port,
        "{} < {port}",
        g.t_end - g.t_start
    );
}

#[test]
fn a_gemm_stream_and_a_math_stream_share_one_tcm_port_evenly() {
    let mut topo = Topology::load("pa").unwrap();
    // Fast units, so both streams are bound by the PE's one TCM port.
    topo.pe_gemm.tflops.f16.0 = 1e6;
    topo.pe_math.gflops.f32.0 = 1e6;
    topo.pe_gemm.setup_ns.0 = 0.0;
    topo.pe_math.setup_ns.0 = 0.0;
    // Every result through the port too.
    topo.pe_gemm.acc_kib = 0;
    let port = topo.tcm.bw_gbs.0;
    let n = 64;
    // GEMMs of 64 x 64 x 64 (8 + 8 KiB in, 16 KiB out) and adds of two
    // 64 x 64 f32 tiles (16 + 16 KiB in, 16 KiB out), each unit's ops
    // independent of each other (their own output tiles).
    let mut cmds = Vec::new();
    for i in 0..n {
        cmds.push(gemm(
            PE0,
            (0, 8 << 10, (64 << 10) + (i % 4) * (16 << 10)),
            (64, 64, 64),
        ));
        cmds.push(add(
            PE0,
            (16 << 10, 32 << 10, (128 << 10) + (i % 4) * (16 << 10)),
            (64, 64),
        ));
    }
    cmds.push(Command::WaitAll);
    let recs = simulate(&topo, vec![(PE0, cmds)]);
    let (gemm_span, gemm_bytes) = tcm_traffic(&recs, "pe_gemm");
    let (math_span, math_bytes) = tcm_traffic(&recs, "pe_math");
    let (_, all) = (gemm_span.max(math_span), gemm_bytes + math_bytes);
    // The port is saturated: all bytes over the common span...
    let span = gemm_span.max(math_span);
    let total = all as f64 * 1000.0 / span as f64;
    assert!(
        (total - port).abs() / port < 0.02,
        "together {total:.1} GB/s, port {port} GB/s"
    );
    // ... and each stream gets its share of the time it runs: the GEMMs
    // move 32 KiB per op and the adds 48 KiB, in turns, so the port's
    // time splits 2:3.
    let per_gemm = 32.0 / 80.0;
    let got = gemm_bytes as f64 * 1000.0 / span as f64 / port;
    assert!(
        (got - per_gemm).abs() / per_gemm < 0.02,
        "GEMMs got {got:.3} of the port, expected {per_gemm}"
    );
}

#[test]
fn hashed_channels_keep_pes_small_tiles_off_each_others_channels() {
    // Every PE of cube 0 reads the first 256 B of its own HBM partition at
    // the same time.
    let run = |hashed: bool| {
        let mut topo = Topology::load("pa").unwrap();
        topo.hbm.hash_channels = hashed;
        let m = Machine::build(&topo);
        let pes: Vec<PeCoord> = m.pes().filter(|p| p.cube == 0).collect();
        let scripts = pes
            .iter()
            .map(|&pe| (pe, vec![Command::Dma(read_cmd(pe, 0, pe, 256))]))
            .collect();
        // (start, end) of each read, in start order (the launch reaches
        // the PEs 0.5 ns apart).
        let mut d: Vec<(u64, u64)> = simulate(&topo, scripts)
            .iter()
            .filter(|(_, _, n)| n == "dma_read")
            .map(|(r, _, _)| (r.t_start, r.t_end))
            .collect();
        d.sort_unstable();
        (pes.len(), d)
    };
    let lone = lone_read_on_pa(256);
    // Plain interleaving: every partition starts on channel 0, so the
    // reads queue there and end 256 B at 32 GB/s = 8 ns apart.
    let (n, plain) = run(false);
    assert!(n >= 4);
    let first = plain[0].0;
    for (i, &(_, end)) in plain.iter().enumerate() {
        assert_eq!(end, first + lone + i as u64 * 8_000, "read {i}");
    }
    // Hashed: the partitions start on different channels; no read waits.
    let (_, hashed) = run(true);
    for (i, &(start, end)) in hashed.iter().enumerate() {
        assert_eq!(end - start, lone, "read {i}");
    }
}

#[test]
fn the_trace_says_when_each_hbm_channel_served() {
    let topo = Topology::load("pa").unwrap();
    let bytes = 1u64 << 20;
    let trace = simulate_trace(
        &topo,
        vec![(PE0, vec![Command::Dma(read_cmd(PE0, 0, PE0, bytes))])],
    );
    let recs = common::named_records(&trace);
    let (dma, _, _) = recs.iter().find(|(_, _, n)| n == "dma_read").unwrap();
    let mut s = kb_format::StreamReader::open(&trace[..]).unwrap();
    s.skip_to_end().unwrap();
    let ch = s.channels().unwrap();
    // 1 MiB over cube 0's 32 channels: 32 KiB each, read at 32 GB/s from
    // the request's arrival (10 ns setup + 19.016 ns), all at once.
    assert_eq!(ch.len(), 32);
    let start = dma.t_start + 10_000 + 3 * 5_000 + 2 * 2_000 + ser(64, 4096.0);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!((c.sip, c.cube, c.channel), (0, 0, i as u32));
        assert_eq!((c.bytes_read, c.bytes_written), (32 << 10, 0));
        assert_eq!(c.busy, vec![(start, start + ser(32 << 10, 32.0))]);
    }
}

/// `out (+)= a x b`: [`gemm`] accumulating into `out` when `acc`.
fn dot(pe: PeCoord, tiles: (u64, u64, u64), dims: (u32, u32, u32), acc: bool) -> Command {
    let mut c = gemm(pe, tiles, dims);
    if let Command::Gemm(g) = &mut c
        && acc
    {
        g.op.acc = Some(g.op.out);
    }
    c
}

/// The gemm and math records of `recs`, in op id order.
fn compute_ops(recs: &[(Record, String, String)]) -> Vec<Record> {
    let mut v: Vec<Record> = recs
        .iter()
        .filter(|(_, c, _)| c.ends_with("pe_gemm") || c.ends_with("pe_math"))
        .map(|(r, _, _)| r.clone())
        .collect();
    v.sort_by_key(|r| r.op_id);
    v
}

// The accumulator buffer. On `pa`, a 64 x 64 x 64 f16 dot streams its two
// 8 KiB operands in 35.192 ns from its start to done (see
// a_gemm_streams_its_operands_through_the_tcm_port_exactly). A 16 KiB
// tile written back from the unit crosses pe_gemm -> tcm (16 ns + 1 ns)
// and TCM writes it as it comes: uncontended, the write starts one burst
// (4 ns) before the last byte's arrival less its 16 ns, i.e. 5 ns after
// the writeback starts, and ends 16 + 2 ns later: 23 ns in all.
const DOT_PS: u64 = 35_192;
const WRITEBACK_PS: u64 = 23_000;

#[test]
fn a_k_chain_that_fits_keeps_its_accumulator_in_the_unit() {
    let topo = Topology::load("pa").unwrap();
    assert_eq!(topo.pe_gemm.acc_kib, 256);
    let (a, b, x, y) = (0, 8 << 10, 16 << 10, 32 << 10);
    let d = (64, 64, 64);
    let recs = simulate(
        &topo,
        vec![(
            PE0,
            vec![
                dot(PE0, (a, b, x), d, false),
                dot(PE0, (a, b, x), d, true),
                dot(PE0, (a, b, x), d, true),
                // Reads the chain's result: it is written back first.
                add(PE0, (x, x, y), (64, 64)),
            ],
        )],
    );
    let ops = compute_ops(&recs);
    let [g1, g2, g3, sum] = &ops[..] else {
        panic!("4 compute ops, got {}", ops.len())
    };
    // Each dot streams only A and B (the accumulator stays in the unit)
    // and ends when computed; the next starts at once.
    for (i, g) in [g1, g2, g3].iter().enumerate() {
        assert_eq!(g.t_end - g.t_start, DOT_PS, "dot {i}");
    }
    assert_eq!((g2.t_start, g3.t_start), (g1.t_end, g2.t_end));
    // The add waits for the writeback of the accumulator.
    assert_eq!(sum.t_start, g3.t_end + WRITEBACK_PS);

    // The same chain with no buffer: dots 2 and 3 also read the 16 KiB
    // accumulator (32 KiB in all: first burst out at 6 ns, the last byte
    // at the unit at 6 + 32 + 1 = 39 ns, after 7 + 28.192 ns of work) and
    // write the result back (16 + 1 + 4 + 2 ns), and each dot starts when
    // the one before ended.
    let mut topo = topo;
    topo.pe_gemm.acc_kib = 0;
    let ops = compute_ops(&simulate(
        &topo,
        vec![(
            PE0,
            vec![
                dot(PE0, (a, b, x), d, false),
                dot(PE0, (a, b, x), d, true),
                dot(PE0, (a, b, x), d, true),
            ],
        )],
    ));
    assert_eq!(ops[0].t_end - ops[0].t_start, DOT_PS + WRITEBACK_PS);
    for g in &ops[1..] {
        assert_eq!(g.t_end - g.t_start, 39_000 + WRITEBACK_PS);
    }
    assert_eq!(ops[2].t_start, ops[1].t_end);
}

#[test]
fn accumulators_that_do_not_fit_together_are_evicted_and_read_again() {
    let mut topo = Topology::load("pa").unwrap();
    // Room for one 16 KiB f32 tile.
    topo.pe_gemm.acc_kib = 16;
    let (a, b, x, y) = (0, 8 << 10, 16 << 10, 32 << 10);
    let d = (64, 64, 64);
    let ops = compute_ops(&simulate(
        &topo,
        vec![(
            PE0,
            vec![
                dot(PE0, (a, b, x), d, false),
                dot(PE0, (a, b, y), d, false),
                dot(PE0, (a, b, x), d, true),
            ],
        )],
    ));
    let [x1, y1, x2] = &ops[..] else {
        panic!("3 dots, got {}", ops.len())
    };
    assert_eq!(x1.t_end - x1.t_start, DOT_PS);
    // Y needs X's room: X is written back (23 ns) before Y starts; on
    // record, Y waited for the unit's buffer that X's result held.
    assert_eq!(y1.t_start, x1.t_end + WRITEBACK_PS);
    assert!(
        y1.deps
            .iter()
            .any(|d| (d.op, d.kind) == (x1.op_id, DepKind::Resource)),
        "{:?}",
        y1.deps
    );
    assert_eq!(y1.t_end - y1.t_start, DOT_PS);
    // X again: Y is evicted first; X is no longer in the unit, so it is
    // read from TCM with the operands (39 ns to done, as without a
    // buffer), and its result stays.
    assert_eq!(x2.t_start, y1.t_end + WRITEBACK_PS);
    assert_eq!(x2.t_end - x2.t_start, 39_000);

    // A tile larger than the buffer never enters it: 64 x 128 f32 is
    // 32 KiB. The dot reads 8 + 16 KiB of f16 operands (24 ns; last byte
    // at the unit at 6 + 24 + 1 = 31 ns, before 7 + 16.384 + 20 = 43.384 ns
    // of work) and writes 32 KiB back (32 + 1 + 4 + 2 ns).
    let ops = compute_ops(&simulate(
        &topo,
        vec![(PE0, vec![dot(PE0, (a, b, x), (64, 64, 128), false)])],
    ));
    assert_eq!(ops[0].t_end - ops[0].t_start, 43_384 + 39_000);
}

#[test]
fn an_accumulator_read_mid_chain_is_written_back_and_the_chain_goes_on() {
    let topo = Topology::load("pa").unwrap();
    let (a, b, x, y) = (0, 8 << 10, 16 << 10, 32 << 10);
    let d = (64, 64, 64);
    let ops = compute_ops(&simulate(
        &topo,
        vec![(
            PE0,
            vec![
                dot(PE0, (a, b, x), d, false),
                add(PE0, (x, x, y), (64, 64)),
                dot(PE0, (a, b, x), d, true),
            ],
        )],
    ));
    let [g1, sum, g2] = &ops[..] else {
        panic!("3 compute ops, got {}", ops.len())
    };
    // The second dot keeps using the unit's copy while it is written back:
    // it starts when the first ends and streams only A and B.
    assert_eq!(g2.t_start, g1.t_end);
    assert_eq!(g2.t_end - g2.t_start, DOT_PS);
    // The writeback leaves at g1's end; its bytes reach TCM 17 ns later,
    // but the port is reading g2's operands until 16 ns after g1's end,
    // so TCM writes them from then (16 ns + 2 ns): the add starts 34 ns
    // after g1's end.
    assert_eq!(sum.t_start, g1.t_end + 16_000 + 16_000 + 2_000);
}

/// A store of `bytes` from PE0's TCM at `tcm_at` to its HBM at `hbm_at`.
fn store_cmd(tcm_at: u64, hbm_at: u64, bytes: u64) -> DmaCmd {
    let mut c = read_cmd(PE0, hbm_at, PE0, bytes);
    std::mem::swap(&mut c.mem.src, &mut c.mem.dst);
    c.mem.src.addr = pa(Space::Tcm, PE0, tcm_at);
    c
}

#[test]
fn a_pes_dmas_on_the_same_bytes_keep_issue_order_in_time() {
    let topo = Topology::load("pa").unwrap();
    let kib = 16 << 10;
    let dmas = |recs: &[(Record, String, String)]| -> Vec<Record> {
        let mut v: Vec<Record> = recs
            .iter()
            .filter(|(_, c, _)| c.ends_with("pe_dma"))
            .map(|(r, _, _)| r.clone())
            .collect();
        v.sort_by_key(|r| r.op_id);
        v
    };
    // RAW: a store of HBM bytes, then a load of them: the load is held
    // until the store has finished, then runs as a lone read.
    let recs = simulate(
        &topo,
        vec![(
            PE0,
            vec![
                Command::Store(store_cmd(0, 0, kib)),
                Command::Dma(read_cmd(PE0, 0, PE0, kib)),
            ],
        )],
    );
    let [st, ld] = &dmas(&recs)[..] else {
        panic!("two DMAs")
    };
    // (It also writes the TCM bytes the store read: a WAR, held alike.)
    assert_eq!(ld.t_start, st.t_end);
    // On record: held by the store (a data edge), issued by the program.
    let kinds =
        |r: &Record| -> Vec<(u64, DepKind)> { r.deps.iter().map(|d| (d.op, d.kind)).collect() };
    assert!(
        kinds(ld).contains(&(st.op_id, DepKind::Data)),
        "{:?}",
        ld.deps
    );
    assert_eq!(ld.t_end - ld.t_start, lone_read_on_pa(kib));

    // Other bytes, in HBM and TCM: no hold; the load starts as soon as its
    // command is at the engine, well before the store ends.
    let mut moved = read_cmd(PE0, 1 << 20, PE0, kib);
    moved.mem.dst.addr = pa(Space::Tcm, PE0, 64 << 10);
    let recs = simulate(
        &topo,
        vec![(
            PE0,
            vec![Command::Store(store_cmd(0, 0, kib)), Command::Dma(moved)],
        )],
    );
    let [st3, ld3] = &dmas(&recs)[..] else {
        panic!("two DMAs")
    };
    assert!(
        !kinds(ld3).contains(&(st3.op_id, DepKind::Data)),
        "{:?}",
        ld3.deps
    );
    assert!(ld3.t_start < st3.t_end);
    assert_eq!(ld3.t_end - ld3.t_start, lone_read_on_pa(kib));

    // WAR and WAW: an asynchronous load of HBM bytes, then a store over
    // them, then another store over them. The first store only writes
    // what the load reads: it starts once the load's source is read,
    // when the last of the 32 channels has served its 512 B share (29.016
    // ns to reach HBM, 16 ns at 32 GB/s, 100 ns latency). The second
    // writes what the first writes: it starts when the first's write has
    // landed (the end of its active interval, before its acknowledgement
    // is back).
    let recs = simulate(
        &topo,
        vec![(
            PE0,
            vec![
                Command::DmaAsync(read_cmd(PE0, 0, PE0, kib)),
                Command::Store(store_cmd(64 << 10, 0, kib)),
                Command::Store(store_cmd(128 << 10, 0, kib)),
                Command::WaitAll,
            ],
        )],
    );
    let [l, s1, s2] = &dmas(&recs)[..] else {
        panic!("three DMAs")
    };
    assert_eq!(s1.t_start, l.t_start + 29_016 + 16_000 + 100_000);
    assert!(s1.t_start < l.t_end);
    let landed = s1.active.expect("a DMA's active interval").1;
    assert!(landed < s1.t_end);
    assert_eq!(s2.t_start, landed);
    assert_eq!(s2.t_end - s2.t_start, s1.t_end - s1.t_start);
}
