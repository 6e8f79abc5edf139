//! ADR-0011's test requirements for the address models, one named test
//! each (VA: mappings, fabric traversal, TLB, page-fault fallback).

use std::sync::Arc;

use kb_format::{Addr, Dtype, Event, Meta, Record, Space, StreamReader, TraceWriter, VerifySpec};
use kb_sim::bench::kernel_args;
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
    let args = Arc::new(kernel_args(&rt, &[x]));
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
    let mut r = StreamReader::open(bytes).unwrap();
    let mut out = Vec::new();
    let mut rec = Record::default();
    while let Some(ev) = r.next_event().unwrap() {
        if let Event::Records(mut c) = ev {
            while c.next_into(&mut rec).unwrap() {
                out.push((rec.clone(), c.strings().name(rec.op_name).into_owned()));
            }
        }
    }
    out
}

/// PE 0 loads row 0 of the shard on the last PE (another cube in `va`)
/// through its VA and checks the values.
fn read_far_shard(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id() != 0 {
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
