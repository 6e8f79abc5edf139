//! Fidelity of the machine model: exact timings where the model is
//! deterministic, computed by hand from the topology numbers, and
//! bandwidths under contention.

mod common;

use kb_format::{Addr, MemoryParams, Meta, Record, Space, TraceWriter, VerifySpec};
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
    common::named_records(&writer.finish(&VerifySpec::default()).unwrap())
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
    // TCM write: 4096 B at 1024 GB/s = 4 ns, plus 2 ns latency.
    let tcm = ser(bytes, 1024.0) + 2_000;
    let expected = 10_000 + request + hbm + response + tcm;
    assert_eq!(dma.t_end - dma.t_start, expected, "dma_read service time");

    // The read observes HBM when the channels finish; the write lands in
    // TCM when the TCM port finishes, at the record's end.
    let read = dma.read.as_ref().unwrap();
    let write = dma.write.as_ref().unwrap();
    assert_eq!(read.time - dma.t_start, 10_000 + request + hbm);
    assert_eq!(write.time, dma.t_end);
    assert!(read.seq < write.seq);
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
        let got = throughput(&recs, |(_, c, _)| c.contains(&format!("cube0.{pe}.")));
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
