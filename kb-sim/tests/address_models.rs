//! The address models' test requirements (docs/design.md A1-A4) for the address models, one named test
//! each (VA: mappings, fabric traversal, TLB, page-fault fallback).

use std::sync::Arc;

mod common;

use kb_format::{Addr, Dtype, MemoryParams, Meta, Record, Space, TraceWriter, VerifySpec};
use kb_sim::engine::{Engine, RunStats};
use kb_sim::kernel::{self, Block, Executor, KernelArgs, KernelFn, Tl};
use kb_sim::machine::{Machine, NodeKind, PeCoord};
use kb_sim::program::{Command, DmaCmd, PeProgram, Script};
use kb_sim::runtime::{Runtime, Sharding};
use kb_sim::topology::Topology;

/// x: 64 x 16 f32 (value = element index), row-sharded over every PE.
fn x_data() -> Vec<u8> {
    (0..64 * 16)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect()
}

/// Run `kernel` on every PE with the tensor x; returns the records (with
/// op names) and the run totals.
fn run_kernel(topo: &str, kernel: KernelFn, with_data: bool) -> (Vec<(Record, String)>, RunStats) {
    let m = Machine::build(&Topology::load(topo).unwrap());
    let mut rt = Runtime::new(&m);
    let data = with_data.then(x_data);
    let x = rt
        .tensor("x", Dtype::F32, [64, 16], data, Sharding::ROWS)
        .unwrap();
    let args = Arc::new(rt.kernel_args(&[x]));
    let n = m.topo.total_pes();
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for (i, pe) in m.pes().collect::<Vec<_>>().into_iter().enumerate() {
        let body = kernel::body(kernel, args.clone(), pe, i as u32, n, rt.take_tcm(pe));
        programs.push(Executor::Coroutine.spawn(format!("k[{i}]"), body).unwrap());
    }
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (w, stats) = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap();
    (records(&w.finish(&VerifySpec::default()).unwrap()), stats)
}

fn records(bytes: &[u8]) -> Vec<(Record, String)> {
    common::named_records(bytes)
        .into_iter()
        .map(|(r, _, name)| (r, name))
        .collect()
}

/// PE 0 loads row 0 of the shard on the last PE (another cube in `va`)
/// through its VA and checks the values.
fn read_far_shard(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let x = args.tensor("x");
    let far = *x.shards.last().unwrap();
    assert_ne!(
        far.pe.cube,
        tl.pe().cube,
        "the test needs a shard in another cube"
    );
    let t = tl.load(Block::in_shard(x, &far, 0, 0, 1, 16));
    let first_row = (64 - far.rows) * 16;
    for c in 0..16 {
        assert_eq!(
            t.get(0, c),
            (first_row + c as u64) as f64,
            "element {c} of the far shard"
        );
    }
}

#[test]
fn va_cross_pe_and_cross_cube_dma_over_installed_mappings() {
    let (recs, stats) = run_kernel("va", read_far_shard, true);
    assert_eq!(stats.mmu.page_faults, 0, "every access was translated");
    let (load, _) = recs.iter().find(|(_, n)| n == "dma_read").unwrap();
    let used = match &load.params {
        kb_format::Params::Memory(m) => m.src.addr,
        p => panic!("{p:?}"),
    };
    assert!(
        used >= kb_sim::runtime::VA_BASE,
        "the record keeps the VA the kernel used: {used:#x}"
    );
    let touched = load.read.as_ref().unwrap().ranges[0].pa;
    let p = kb_format::pa::Pa::decode(touched).unwrap();
    assert_eq!(
        (p.cube, p.pe, p.space),
        (1, 3, Space::Hbm),
        "and the PA it touched, in cube 1"
    );
}

fn nothing(_: &mut Tl<'_>, _: &KernelArgs) {}

#[test]
fn va_map_and_unmap_messages_walk_the_fabric_with_measured_latency() {
    let (_, stats) = run_kernel("va", nothing, false);
    // Row-sharded: every shard's mapping goes to all 8 PEs, and each PE's
    // mappings are removed again when the kernels are done.
    assert_eq!((stats.mmu.maps, stats.mmu.unmaps), (8, 8));
    // The first message to arrive met no contention: host -> io_cpu, io_cpu
    // handling, io_cpu -> m_cpu, m_cpu handling, m_cpu -> pe_mmu.
    let topo = Topology::load("va").unwrap();
    let m = Machine::build(&topo);
    let bytes = 8 * 16; // 8 one-page shards, 16 bytes per entry
    let pe = PeCoord {
        sip: 0,
        cube: 0,
        pe: 0,
    };
    let (io, mcpu) = (
        m.sip_node(0, NodeKind::IoCpu),
        m.cube_node(0, 0, NodeKind::MCpu),
    );
    let mmu = m.mmu_node(pe).unwrap();
    let handle = 50_000; // cpu.handle_ns
    assert_eq!(topo.cpu.handle_ns.0, 50.0);
    let expected = m.uncontended_ps(&m.route(m.host(), io), bytes)
        + handle
        + m.uncontended_ps(&m.route(io, mcpu), bytes)
        + handle
        + m.uncontended_ps(&m.route(mcpu, mmu), bytes);
    assert_eq!(stats.mmu.min_map_latency_ps, expected);
    assert!(
        stats.mmu.max_map_latency_ps > expected,
        "later messages queue behind the first"
    );
}

fn load_first_row(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    tl.load(Block::in_shard(x, &s, 0, 0, 1, 16));
}

#[test]
fn va_tlb_overhead_is_added_per_access() {
    let dur = |topo| {
        let (recs, _) = run_kernel(topo, load_first_row, true);
        let (r, _) = recs.iter().find(|(_, n)| n == "dma_read").unwrap().clone();
        r.t_end - r.t_start
    };
    let tlb = Topology::load("va").unwrap().pe_mmu.tlb_overhead_ns.0;
    assert_eq!(tlb, 2.0);
    // A load translates one side (its HBM source): one TLB access.
    assert_eq!(dur("va") - dur("pa"), 2_000);
}

#[test]
fn va_page_fault_falls_back_to_pa() {
    let m = Machine::build(&Topology::load("va").unwrap());
    let rt = Runtime::new(&m);
    let pa = |space, pe| {
        kb_format::pa::Pa {
            space,
            sip: 0,
            cube: 0,
            pe,
            offset: 0,
        }
        .encode()
        .unwrap()
    };
    let load = DmaCmd {
        mem: MemoryParams {
            src: Addr {
                space: Space::Hbm,
                addr: pa(Space::Hbm, 2),
            },
            dst: Addr {
                space: Space::Tcm,
                addr: pa(Space::Tcm, 0),
            },
            rows: 1,
            row_bytes: 256,
            src_stride: 256,
            dst_stride: 256,
            dtype: None,
        },
        label: None,
    };
    let mut programs: Vec<Box<dyn PeProgram>> =
        vec![Box::new(Script::new(vec![Command::Dma(load)]))];
    programs.extend((1..8).map(|_| Box::new(Script::new(vec![])) as Box<dyn PeProgram>));
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (w, stats) = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap();
    assert_eq!(
        stats.mmu.page_faults, 1,
        "the unmapped address was used as a PA"
    );
    let recs = records(&w.finish(&VerifySpec::default()).unwrap());
    let (r, _) = recs.iter().find(|(_, n)| n == "dma_read").unwrap();
    assert_eq!(r.read.as_ref().unwrap().ranges[0].pa, pa(Space::Hbm, 2));
}

// ---- LA model (docs/design.md A3, A4) ----

/// Run `kernel` on every PE of an LA topology with x: (8 * rows) x 64 f32
/// (value = element index), row-sharded; returns records and totals.
fn run_la(
    topo: &str,
    rows_per_pe: u64,
    kernel: KernelFn,
) -> (Vec<(Record, String, String)>, RunStats) {
    run_la_with(topo, rows_per_pe, kernel, None)
}

/// `run_la` with `engines` DMA engines per PE, so that streams are limited
/// by bandwidth rather than by the latency of too few transfers in flight.
fn run_la_with(
    topo: &str,
    rows_per_pe: u64,
    kernel: KernelFn,
    engines: Option<u32>,
) -> (Vec<(Record, String, String)>, RunStats) {
    let mut topo = Topology::load(topo).unwrap();
    if let Some(e) = engines {
        topo.pe_dma.engines = e;
    }
    let m = Machine::build(&topo);
    let mut rt = Runtime::new(&m);
    let n = m.topo.total_pes() as u64 * rows_per_pe;
    let data: Vec<u8> = (0..n * 64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let x = rt
        .tensor("x", Dtype::F32, [n, 64], Some(data), Sharding::ROWS)
        .unwrap();
    let y_data: Vec<u8> = (0..n * 64)
        .flat_map(|i| (-(i as f32)).to_le_bytes())
        .collect();
    let y = rt
        .tensor("y", Dtype::F32, [n, 64], Some(y_data), Sharding::ROWS)
        .unwrap();
    let args = Arc::new(rt.kernel_args(&[x, y]));
    let pes: Vec<_> = m.pes().collect();
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for (i, pe) in pes.into_iter().enumerate() {
        let body = kernel::body(
            kernel,
            args.clone(),
            pe,
            i as u32,
            m.topo.total_pes(),
            rt.take_tcm(pe),
        );
        programs.push(Executor::Coroutine.spawn(format!("k[{i}]"), body).unwrap());
    }
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (w, stats) = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap();
    (
        common::named_records(&w.finish(&VerifySpec::default()).unwrap()),
        stats,
    )
}

/// Each PE loads its whole x shard once and checks the values.
fn load_whole_shard(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    let t = tl.load(Block::in_shard(x, &s, 0, 0, s.rows as u32, 64));
    let first = tl.program_id(0) as u64 * s.rows * 64;
    assert_eq!(t.get(0, 0), first as f64);
    assert_eq!(
        t.get(s.rows as usize - 1, 63),
        (first + s.rows * 64 - 1) as f64
    );
}

/// PE 0's first dma_read.
fn first_load(recs: &[(Record, String, String)]) -> Record {
    recs.iter()
        .find(|(_, c, n)| n == "dma_read" && c.contains("cube0.pe0."))
        .unwrap()
        .0
        .clone()
}

#[test]
fn la_one_to_one_gives_n_per_channel_requests() {
    let topo = Topology::load("la-1to1").unwrap();
    let mm = topo.memory_map.unwrap();
    let (recs, _) = run_la("la-1to1", 64, load_whole_shard);
    let load = first_load(&recs);
    let ranges = &load.read.as_ref().unwrap().ranges;
    // 64 rows x 256 B = 64 stripes of 256 B over 8 channels, in data order.
    assert_eq!(ranges.len(), 64);
    let region = topo.hbm_bytes_per_pe() / mm.hbm_channels_per_pe as u64;
    let mut channels: Vec<u64> = ranges
        .iter()
        .map(|x| kb_format::pa::Pa::decode(x.pa).unwrap().offset / region)
        .collect();
    assert_eq!(
        &channels[..9],
        &[0, 1, 2, 3, 4, 5, 6, 7, 0],
        "stripes rotate over the channels"
    );
    channels.sort();
    channels.dedup();
    assert_eq!(
        channels.len(),
        mm.hbm_channels_per_pe as usize,
        "one request per channel"
    );
}

#[test]
fn la_n_to_one_gives_one_aggregated_request() {
    let (recs, _) = run_la("la-nto1", 64, load_whole_shard);
    let load = first_load(&recs);
    let ranges = &load.read.as_ref().unwrap().ranges;
    assert_eq!(ranges.len(), 1, "one aggregated request");
    assert_eq!(ranges[0].bytes(), 64 * 256);
}

/// Each PE streams 128 loads of its 64 KiB shard (long enough that the
/// first request's latency is noise), at most 5 in flight.
fn stream_shard(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    let mut inflight = std::collections::VecDeque::new();
    for _ in 0..128 {
        inflight.push_back(tl.load_async(Block::in_shard(x, &s, 0, 0, s.rows as u32, 64)));
        if inflight.len() > 4 {
            let h = inflight.pop_front().unwrap();
            tl.wait(h);
        }
    }
    while let Some(h) = inflight.pop_front() {
        tl.wait(h);
    }
}

/// PE 0's achieved read bandwidth in GB/s.
fn pe0_bandwidth(recs: &[(Record, String, String)]) -> f64 {
    let loads: Vec<&Record> = recs
        .iter()
        .filter(|(_, c, n)| n == "dma_read" && c.contains("cube0.pe0."))
        .map(|(r, _, _)| r)
        .collect();
    let bytes: u64 = loads
        .iter()
        .map(|r| {
            r.write
                .as_ref()
                .unwrap()
                .ranges
                .iter()
                .map(|x| x.bytes())
                .sum::<u64>()
        })
        .sum();
    let start = loads.iter().map(|r| r.t_start).min().unwrap();
    let end = loads.iter().map(|r| r.t_end).max().unwrap();
    bytes as f64 * 1000.0 / (end - start) as f64
}

#[test]
fn la_modes_reach_the_same_effective_bandwidth() {
    let one = pe0_bandwidth(&run_la_with("la-1to1", 256, stream_shard, Some(8)).0);
    let agg = pe0_bandwidth(&run_la_with("la-nto1", 256, stream_shard, Some(8)).0);
    assert!(
        (one - agg).abs() / agg < 0.01,
        "1:1 {one:.1} GB/s vs n:1 {agg:.1} GB/s"
    );
}

#[test]
fn la_n_to_one_reflects_aggregated_bandwidth() {
    let mm = Topology::load("la-nto1").unwrap().memory_map.unwrap();
    let expected = mm.hbm_channels_per_pe as f64 * mm.hbm_channel_bw_gbs.0;
    let got = pe0_bandwidth(&run_la_with("la-nto1", 256, stream_shard, Some(8)).0);
    assert!(
        (got - expected).abs() / expected < 0.02,
        "{got:.1} GB/s, expected {expected} GB/s"
    );
}

/// PE 0 streams 1024 one-stripe loads: rows 0, 8, 16, ... (all on channel
/// 0) with `SAME`, or rows 0, 1, 2, ... (every channel) without.
fn stripes<const SAME: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..1024u64 {
        let row = if SAME { (i * 8) % s.rows } else { i % s.rows };
        inflight.push_back(tl.load_async(Block::in_shard(x, &s, row, 0, 1, 64)));
        if inflight.len() > 64 {
            let h = inflight.pop_front().unwrap();
            tl.wait(h);
        }
    }
    while let Some(h) = inflight.pop_front() {
        tl.wait(h);
    }
}

#[test]
fn la_one_to_one_models_per_channel_contention() {
    let mm = Topology::load("la-1to1").unwrap().memory_map.unwrap();
    let one_channel = pe0_bandwidth(&run_la_with("la-1to1", 256, stripes::<true>, Some(64)).0);
    let spread = pe0_bandwidth(&run_la_with("la-1to1", 256, stripes::<false>, Some(64)).0);
    let ch = mm.hbm_channel_bw_gbs.0;
    assert!(
        (one_channel - ch).abs() / ch < 0.05,
        "one channel: {one_channel:.1} GB/s, channel bw {ch}"
    );
    // Spread over the 8 channels, the same loads are no longer channel
    // bound (they are limited by the 64 transfers in flight instead).
    assert!(
        spread > 2.5 * one_channel,
        "spread over channels: {spread:.1} GB/s vs {one_channel:.1}"
    );
}

#[test]
fn la_segment_install_and_uninstall() {
    let (_, stats) = run_la("la-1to1", 8, load_whole_shard);
    // Two tensors x 8 PEs: one segment each, installed through the fabric
    // before the launch and removed after the kernels.
    assert_eq!((stats.mmu.maps, stats.mmu.unmaps), (16, 16));
    assert!(stats.mmu.min_map_latency_ps > 0);
}

/// Both tensors live in distinct segments of the same PE: loading each
/// gives its own values.
fn load_both(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let (sx, sy) = (*x.shard(tl.pe()).unwrap(), *y.shard(tl.pe()).unwrap());
    assert_ne!(sx.addr, sy.addr);
    let first = tl.program_id(0) as u64 * sx.rows * 64;
    let tx = tl.load(Block::in_shard(x, &sx, 1, 0, 1, 64));
    let ty = tl.load(Block::in_shard(y, &sy, 1, 0, 1, 64));
    assert_eq!(tx.get(0, 5), (first + 64 + 5) as f64);
    assert_eq!(ty.get(0, 5), -((first + 64 + 5) as f64));
}

#[test]
fn la_tensors_in_distinct_segments_do_not_collide() {
    for topo in ["la-1to1", "la-nto1"] {
        run_la(topo, 8, load_both);
    }
}
