//! PEs that talk: PE-to-PE copies (`ipcq_copy`), SRAM, signals, barriers
//! and the race detector, with timings computed by hand from `pa.yaml`.

mod common;

use kb_format::{Dtype, Record, Space};
use kb_sim::engine::{RacePolicy, SimError};
use kb_sim::kernel::{Block, Executor, Group, KernelArgs, Notify, SignalOp, Tl};
use kb_sim::machine::{Machine, NodeKind, PeCoord};
use kb_sim::run::{RunConfig, RunError, RunReport, run};
use kb_sim::topology::Topology;
use kb_sim::workload::{ParamSpec, Params, Placement, Policy, Program, Workload, WorkloadError};

type Build = fn(&mut Program<'_>) -> Result<(), WorkloadError>;

#[derive(Debug)]
struct Test(Build);

impl Workload for Test {
    fn name(&self) -> &str {
        "test"
    }
    fn about(&self) -> &str {
        "a test program"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        (self.0)(prog)
    }
}

type Records = Vec<(Record, String, String)>;

fn simulate(topo: &str, races: RacePolicy, build: Build) -> Result<(Records, RunReport), RunError> {
    let cfg = RunConfig {
        topology: Topology::load(topo).unwrap(),
        params: Vec::new(),
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races,
        command_line: Vec::new(),
        max_memory: None,
    };
    let (bytes, report) = run(&cfg, &Test(build), Vec::new())?;
    Ok((common::named_records(&bytes), report))
}

const PE0: PeCoord = PeCoord {
    sip: 0,
    cube: 0,
    pe: 0,
};
const PE1: PeCoord = PeCoord {
    sip: 0,
    cube: 0,
    pe: 1,
};

/// ps to serialize `bytes` at `gbs` GB/s, rounded up as the model does.
fn ser(bytes: u64, gbs: f64) -> u64 {
    (bytes as f64 * 1000.0 / gbs).ceil() as u64
}

fn find<'a>(recs: &'a Records, name: &str, comp: &str) -> &'a Record {
    &recs
        .iter()
        .find(|(_, c, n)| n == name && c.starts_with(comp))
        .unwrap_or_else(|| panic!("no {name} on {comp}"))
        .0
}

/// x: 16 x 64 f32 on PE0's HBM; slots: one 16 x 64 f32 slot in the TCM of
/// PE0 and PE1; a launch on both.
fn x_and_slots(
    prog: &mut Program<'_>,
    kernel: kb_sim::kernel::KernelFn,
) -> Result<(), WorkloadError> {
    let x = prog.random(
        "x",
        Dtype::F32,
        [16, 64],
        Placement::over(&[PE0], Policy::Replicate),
    )?;
    let slots = prog.zeros(
        "slots",
        Dtype::F32,
        [16, 64],
        Placement::over(&[PE0, PE1], Policy::Replicate).in_tcm(),
    )?;
    let args = prog.args(&[x, slots]);
    prog.launch_grid("talk", kernel, args, [2, 1], &[PE0, PE1])?;
    Ok(())
}

/// PE0 loads x and sends it to PE1's slot, raising PE1's signal 0; PE1
/// waits for it (with `WAIT`) and doubles the slot in place of a copy.
fn put_then_use<const WAIT: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, slots) = (args.tensor("x"), args.tensor("slots"));
    if tl.pe() == PE0 {
        let t = tl.load(Block::in_shard(x, x.shard(PE0).unwrap(), 0, 0, 16, 64));
        let dst = Block::in_shard(slots, slots.shard(PE1).unwrap(), 0, 0, 16, 64);
        tl.put(&t, dst, Some(Notify::one(PE1, 0)));
    } else {
        if WAIT {
            tl.wait_signal(0, 1);
        }
        let slot = Block::in_shard(slots, slots.shard(PE1).unwrap(), 0, 0, 16, 64);
        tl.mul(&slot, 2.0);
    }
}

#[test]
fn an_uncontended_ipcq_copy_takes_the_routes_latency_plus_serialization() {
    let (recs, report) = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, put_then_use::<true>)
    })
    .unwrap();
    assert_eq!(report.stats.races, 0);
    let copy = find(&recs, "ipcq_copy", "sip0.cube0.pe0.pe_dma");
    let bytes = 16 * 64 * 4;
    // Both endpoints: PE0's TCM to PE1's TCM buffer.
    let kb_format::Params::Memory(m) = &copy.params else {
        panic!("memory params")
    };
    assert_eq!(
        (m.src.space, m.dst.space, m.nbytes()),
        (Space::Tcm, Space::Tcm, bytes)
    );
    assert!(
        copy.fingerprint.is_some(),
        "Phase 1 knows the bytes it moved"
    );

    // The data message pe_dma0 -> noc -> pe_dma1 -> tcm1 (pa.yaml: noc_pe
    // 5 ns at 256 GB/s, tcm_port 1 ns at 1024 GB/s, first flit 2 ns): the
    // head reaches each next node after the link's latency plus the first
    // flit; a link's tail ends no earlier than the previous one's.
    let topo = Topology::load("pa").unwrap();
    assert_eq!(
        (topo.links.noc_pe.latency_ns.0, topo.links.noc_pe.bw_gbs.0),
        (5.0, 256.0)
    );
    assert_eq!(
        (
            topo.links.tcm_port.latency_ns.0,
            topo.links.tcm_port.bw_gbs.0
        ),
        (1.0, 1024.0)
    );
    let link0_tail = ser(bytes, 256.0) + 5_000; // 21 ns
    let link1_tail = (5_000 + 2_000 + ser(bytes, 256.0)).max(link0_tail) + 5_000; // 28 ns
    let route = (5_000 + 2_000 + 5_000 + 2_000 + ser(bytes, 1024.0)).max(link1_tail) + 1_000; // 29 ns
    assert_eq!(route, 29_000);
    // ... which is what `kb-sim probe` computes for that route.
    let machine = Machine::build(&topo);
    let from = machine.pe_node(PE0, NodeKind::PeDma);
    let to = machine.pe_node(PE1, NodeKind::Tcm);
    assert_eq!(
        machine.uncontended_ps(&machine.route(from, to), bytes),
        route
    );

    // Its data effects happened at issue (as a store's), before the
    // service started.
    assert!(copy.write.as_ref().unwrap().time <= copy.t_start);
    // Service: DMA setup (10 ns), PE0's TCM read (2 ns + 4 ns, one burst),
    // its head over PE0's tcm_port link to pe_dma0 (1 ns; the link's 4 ns
    // serialization hides under the slower noc_pe link after it), the
    // route, PE1's TCM write (2 ns + 4 ns): the bytes have landed then.
    assert_eq!(topo.pe_dma.burst_bytes as u64, bytes);
    let tcm = 2_000 + ser(bytes, 1024.0);
    let landed = copy.t_start + 10_000 + tcm + 1_000 + route + tcm;
    // The notification leaves tcm1 then (tcm1 -> pe_dma1 -> pe_cpu1: 1 ns +
    // 2 ns first flit + 64 B at 64 GB/s + 1 ns = 5 ns), PE1's pe_cpu
    // handles it (50 ns) and PE1 resumes: its mul reaches pe_math 2 ns later.
    let mul = find(&recs, "mul", "sip0.cube0.pe1.pe_math");
    assert_eq!(mul.t_start, landed + 5_000 + 50_000 + 2_000);
    // The acknowledgement (64 B tcm1 -> pe_dma1 -> noc -> pe_dma0) follows
    // the notification out of tcm1 (64 B at 1024 GB/s = 63 ps) and ends the
    // record.
    let wait = ser(64, 1024.0); // it starts once the notification has left
    let ack0 = wait + ser(64, 1024.0) + 1_000;
    let ack1 = (wait + 1_000 + 2_000 + ser(64, 256.0)).max(ack0) + 5_000;
    let ack = (wait + 1_000 + 2_000 + 5_000 + 2_000 + ser(64, 256.0)).max(ack1) + 5_000;
    assert_eq!(copy.t_end, landed + ack);
}

/// The two-PE program of the test above, read back along its causes: the
/// consumer's mul waited for its wait on the signal, which the copy's
/// notification ended, which PE0's program issued once its load was in;
/// each edge at the time the hand computation above gives.
#[test]
fn the_consumer_waited_for_the_producers_copy_and_the_trace_says_so() {
    use kb_format::{DepKind, OpKind};
    let (recs, report) = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, put_then_use::<true>)
    })
    .unwrap();
    let by_id = |id: u64| {
        &recs
            .iter()
            .find(|(r, _, _)| r.op_id == id)
            .unwrap_or_else(|| panic!("no op {id}"))
            .0
    };
    let edge = |r: &Record, kind: DepKind| {
        let d: Vec<_> = r.deps.iter().filter(|d| d.kind == kind).collect();
        assert_eq!(d.len(), 1, "one {kind:?} edge in {:?}", r.deps);
        by_id(d[0].op)
    };
    let mul = find(&recs, "mul", "sip0.cube0.pe1.pe_math");
    let wait = edge(mul, DepKind::Program);
    let signal = edge(wait, DepKind::Sync);
    let copy = edge(signal, DepKind::Sync);
    let load = edge(copy, DepKind::Program);
    let start0 = edge(load, DepKind::Program);
    let launch = edge(start0, DepKind::Host);
    let name = |r: &Record| {
        let (_, c, n) = recs.iter().find(|(x, _, _)| x.op_id == r.op_id).unwrap();
        format!("{n} on {c}")
    };
    assert_eq!(
        [wait, signal, copy, load, start0, launch].map(name),
        [
            "wait_signal on sip0.cube0.pe1.pe_cpu",
            "signal on sip0.cube0.pe1.tcm",
            "ipcq_copy on sip0.cube0.pe0.pe_dma",
            "dma_read on sip0.cube0.pe0.pe_dma",
            "kernel_start on sip0.cube0.pe0.pe_cpu",
            "launch on host",
        ]
        .map(String::from)
    );
    for r in [wait, signal, start0, launch] {
        assert_eq!(r.kind, OpKind::Sync);
    }
    // When: the launch record ends as the first kernel starts; PE1 waits
    // from its start; the notification leaves tcm1 when the bytes have landed
    // (the copy's service as above: setup, TCM read, tcm_port, the 29 ns
    // route, TCM write) and is applied once PE1's pe_cpu has handled it
    // (5 ns there, 50 ns handling), which ends the wait; the mul reaches
    // pe_math 2 ns later.
    let l = &report.launches[0];
    assert_eq!((launch.t_end, start0.t_start), (l.t_start, l.t_start));
    // PE1's kernel starts 0.5 ns after PE0's (m_cpu sends the two launch
    // messages one after the other) and waits at once.
    let start1 = recs
        .iter()
        .find(|(_, c, n)| n == "kernel_start" && c == "sip0.cube0.pe1.pe_cpu")
        .map(|(r, _, _)| r)
        .unwrap();
    assert_eq!(wait.t_start, start1.t_start);
    let tcm = 2_000 + ser(16 * 64 * 4, 1024.0);
    let landed = copy.t_start + 10_000 + tcm + 1_000 + 29_000 + tcm;
    assert_eq!(
        (signal.t_start, signal.t_end, wait.t_end),
        (landed, landed + 55_000, landed + 55_000)
    );
    assert_eq!(mul.t_start, wait.t_end + 2_000);
    // The copy left once PE0's load was in (its program waited for it).
    assert!(load.t_end <= copy.t_start);
    // PE1's kernel ends after its mul; the launch ends with the later of
    // the two kernels.
    let end1 = recs
        .iter()
        .find(|(_, c, n)| n == "kernel_end" && c == "sip0.cube0.pe1.pe_cpu")
        .map(|(r, _, _)| r)
        .unwrap();
    assert_eq!(edge(end1, DepKind::Program).op_id, mul.op_id);
    assert!(end1.t_start >= mul.t_end && end1.t_start <= l.t_end);
}

#[test]
fn reading_a_slot_before_the_copy_lands_is_a_race_naming_both_ops() {
    // Warn: the run completes, and the race is reported and counted.
    let (recs, report) = simulate("pa", RacePolicy::Warn, |p| {
        x_and_slots(p, put_then_use::<false>)
    })
    .unwrap();
    assert_eq!(report.stats.races, 1, "{:?}", report.stats.race_reports);
    let copy = find(&recs, "ipcq_copy", "sip0.cube0.pe0");
    let mul = find(&recs, "mul", "sip0.cube0.pe1");
    let text = &report.stats.race_reports[0];
    for want in [
        format!("op {} (mul on sip0.cube0.pe1, kernel talk) read", mul.op_id),
        format!(
            "op {} (ipcq_copy on sip0.cube0.pe0, kernel talk) wrote",
            copy.op_id
        ),
        "tensor slots".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} not in {text}");
    }
    // Error: the run fails with the same text.
    let e = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, put_then_use::<false>)
    })
    .unwrap_err();
    assert!(
        matches!(e, RunError::Sim(SimError::Race(ref t)) if t == text),
        "{e}"
    );
    // Off: nothing is looked for.
    let (_, report) = simulate("pa", RacePolicy::Off, |p| {
        x_and_slots(p, put_then_use::<false>)
    })
    .unwrap();
    assert_eq!(report.stats.races, 0);
}

/// PE0 loads x asynchronously and signals PE1 before it waits for the
/// load; PE1 waits for the signal and then (with `STORE`) overwrites the
/// bytes PE0's load reads.
fn load_in_flight_then_signal<const STORE: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let block = Block::in_shard(x, x.shard(PE0).unwrap(), 0, 0, 16, 64);
    if tl.pe() == PE0 {
        let h = tl.load_async(block);
        tl.signal(PE1, 0, SignalOp::Add(1));
        let _ = tl.wait(h);
    } else {
        tl.wait_signal(0, 1);
        if STORE {
            let t = tl.zeros(16, 64, Dtype::F32);
            tl.store(block, &t);
        }
    }
}

#[test]
fn a_signal_goes_out_without_waiting_for_a_load_in_flight() {
    let (recs, _) = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, load_in_flight_then_signal::<false>)
    })
    .unwrap();
    let load = find(&recs, "dma_read", "sip0.cube0.pe0.pe_dma");
    let signal = find(&recs, "signal", "sip0.cube0.pe0.pe_cpu");
    // The signal leaves while the load is still on its way (a release
    // waits for compute ops only; the load is left out of it).
    assert!(
        signal.t_start < load.t_end,
        "signal at {} ps, load ends at {} ps",
        signal.t_start,
        load.t_end
    );
}

#[test]
fn a_load_in_flight_is_not_ordered_before_the_signal_that_overtook_it() {
    // PE1 acquires PE0's signal and writes what PE0's load, issued before
    // the signal but served after it went out, reads: a race.
    let e = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, load_in_flight_then_signal::<true>)
    })
    .unwrap_err();
    let RunError::Sim(SimError::Race(text)) = &e else {
        panic!("not a race: {e}")
    };
    assert!(text.contains("dma_read on sip0.cube0.pe0"), "{text}");
    assert!(text.contains("on sip0.cube0.pe1"), "{text}");
    assert!(text.contains("tensor x"), "{text}");
}

/// PE0 copies x's first 8 rows from its HBM into PE1's slot, then puts a
/// TCM tile into the slot's last 8 rows: both notify PE1's signal 0. PE1
/// waits for one arrival and reads the first 8 rows.
fn two_copies_one_counter(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, slots) = (args.tensor("x"), args.tensor("slots"));
    let slot = |r0: u64| Block::in_shard(slots, slots.shard(PE1).unwrap(), r0, 0, 8, 64);
    if tl.pe() == PE0 {
        let from_hbm = Block::in_shard(x, x.shard(PE0).unwrap(), 0, 0, 8, 64);
        tl.copy(slot(0), from_hbm, Some(Notify::one(PE1, 0)));
        let t = tl.zeros(8, 64, Dtype::F32);
        tl.put(&t, slot(8), Some(Notify::one(PE1, 0)));
    } else {
        tl.wait_signal(0, 1);
        tl.mul(&slot(0), 2.0);
    }
}

#[test]
fn a_counting_signal_counts_copies_in_the_order_they_were_sent() {
    // The put from TCM lands before the copy from HBM; its notification
    // waits for the copy's, so "one arrived" means the first one, and PE1
    // reads rows that have landed (no race).
    let (recs, _) = simulate("pa", RacePolicy::Error, |p| {
        x_and_slots(p, two_copies_one_counter)
    })
    .unwrap();
    let copies: Vec<&Record> = recs
        .iter()
        .filter(|(_, c, n)| n == "ipcq_copy" && c == "sip0.cube0.pe0.pe_dma")
        .map(|(r, _, _)| r)
        .collect();
    assert_eq!(copies.len(), 2);
    let (first, second) = (copies[0], copies[1]);
    assert!(first.op_id < second.op_id);
    // Its last byte written: the end of its transfer.
    let landed = |r: &Record| r.active.map_or(r.t_end, |a| a.1);
    assert!(
        landed(second) < landed(first),
        "the put ({} ps) should land before the copy from HBM ({} ps)",
        landed(second),
        landed(first)
    );
    let mut notes: Vec<&Record> = recs
        .iter()
        .filter(|(_, c, n)| n == "signal" && c == "sip0.cube0.pe1.tcm")
        .map(|(r, _, _)| r)
        .collect();
    notes.sort_by_key(|r| (r.t_start, r.op_id));
    assert_eq!(notes.len(), 2);
    // Both leave when the first copy has landed: the first is its own,
    // the second the put's, held until then.
    assert_eq!(notes[0].t_start, notes[1].t_start);
    assert!(notes[0].t_start >= landed(first));
    let cause = |r: &Record| {
        r.deps
            .iter()
            .find(|d| d.kind == kb_format::DepKind::Sync)
            .map(|d| d.op)
    };
    assert_eq!(cause(notes[0]), Some(first.op_id));
    assert_eq!(cause(notes[1]), Some(second.op_id));
}

/// Both PEs pass a barrier, then fill a tile (a math op whose start shows
/// when the kernel resumed).
fn barrier_then_fill(tl: &mut Tl<'_>, _: &KernelArgs) {
    tl.barrier(&Group::new(&[PE0, PE1]));
    tl.zeros(1, 16, Dtype::F32);
}

#[test]
fn a_barrier_costs_its_messages_and_their_handling() {
    let (recs, report) = simulate("pa", RacePolicy::Error, |prog| {
        prog.launch_grid(
            "bar",
            barrier_then_fill,
            KernelArgs::default(),
            [2, 1],
            &[PE0, PE1],
        )?;
        Ok(())
    })
    .unwrap();
    let t0 = report.launches[0].t_start;
    // pe_cpu1 -> pe_dma1 -> noc -> pe_dma0 -> pe_cpu0, 64 B (pa.yaml:
    // pe_internal 1 ns at 64 GB/s, noc_pe 5 ns at 256 GB/s, 2 ns first flit).
    let l0 = ser(64, 64.0) + 1_000; // tail after link 0: 2 ns
    let l1 = (1_000 + 2_000 + ser(64, 256.0)).max(l0) + 5_000; // 8.25 ns
    let l2 = (8_000 + 2_000 + ser(64, 256.0)).max(l1) + 5_000; // 15.25 ns
    let route = (15_000 + 2_000 + ser(64, 64.0)).max(l2) + 1_000; // 19 ns
    assert_eq!(route, 19_000);
    let handle = 50_000;
    // PE0 coordinates: its own arrival is handled at t0, PE1's (arriving at
    // t0 + 19 ns) after it; then a release to each member, handled by its
    // pe_cpu. The fill reaches pe_math 2 ns after the kernel resumes.
    let counted = t0 + 2 * handle;
    let fill0 = find(&recs, "copy", "sip0.cube0.pe0.pe_math");
    let fill1 = find(&recs, "copy", "sip0.cube0.pe1.pe_math");
    assert_eq!(fill0.t_start, counted + handle + 2_000);
    assert_eq!(fill1.t_start, counted + route + handle + 2_000);
    // On record: each PE's wait at the barrier, from its arrival to its
    // resuming; each fill was issued after it (a program edge).
    for (pe, fill) in [("pe0", fill0), ("pe1", fill1)] {
        let cpu = format!("sip0.cube0.{pe}.pe_cpu");
        let (wait, start) = (
            find(&recs, "barrier", &cpu),
            find(&recs, "kernel_start", &cpu),
        );
        assert_eq!(wait.kind, kb_format::OpKind::Sync);
        assert_eq!(
            (wait.t_start, wait.t_end),
            (start.t_start, fill.t_start - 2_000),
            "{pe}"
        );
        assert!(
            fill.deps
                .iter()
                .any(|d| (d.op, d.kind) == (wait.op_id, kb_format::DepKind::Program)),
            "{pe}: {:?}",
            fill.deps
        );
        // Its cause: what the last member to arrive had last finished
        // (here the start of its kernel), a sync edge.
        assert!(
            wait.deps.iter().all(|d| d.kind == kb_format::DepKind::Sync) && !wait.deps.is_empty()
        );
    }
}

#[test]
fn sram_is_a_data_space_every_direction_and_loads_see_what_was_stored() {
    fn kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
        let (x, s, s2, y) = (
            args.tensor("x"),
            args.tensor("s"),
            args.tensor("s2"),
            args.tensor("y"),
        );
        let whole = |t: &kb_sim::kernel::TensorArg, pe| {
            Block::in_shard(t, t.shard(pe).unwrap(), 0, 0, 16, 64)
        };
        if tl.pe() == PE0 {
            // HBM -> TCM -> SRAM (a store), then HBM -> SRAM (a copy).
            let t = tl.load(whole(x, PE0));
            tl.store(whole(s, PE0), &t);
            tl.copy(whole(s2, PE0), whole(x, PE0), Some(Notify::one(PE1, 1)));
            tl.signal(PE1, 0, SignalOp::Set(7));
        } else {
            tl.wait_signal(0, 7);
            // SRAM -> TCM: the bytes PE0 stored.
            let t = tl.load(whole(s, PE1));
            assert_eq!(t.bytes().len(), 16 * 64 * 4);
            tl.wait_signal(1, 1);
            // SRAM -> HBM.
            tl.copy(whole(y, PE1), whole(s2, PE1), None);
        }
    }
    for topo in ["pa", "va", "la-1to1", "la-nto1"] {
        let (recs, report) = simulate(topo, RacePolicy::Error, |prog| {
            let x = prog.random(
                "x",
                Dtype::F32,
                [16, 64],
                Placement::over(&[PE0], Policy::Replicate),
            )?;
            let cube0 = Placement::over(&[PE0], Policy::Replicate).in_sram();
            let s = prog.zeros("s", Dtype::F32, [16, 64], cube0.clone())?;
            let s2 = prog.zeros("s2", Dtype::F32, [16, 64], cube0)?;
            let y = prog.zeros(
                "y",
                Dtype::F32,
                [16, 64],
                Placement::over(&[PE1], Policy::Replicate),
            )?;
            let args = prog.args(&[x, s, s2, y]);
            prog.launch_grid("sram", kernel, args, [2, 1], &[PE0, PE1])?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{topo}: {e}"));
        assert_eq!(report.stats.races, 0);
        let space = |r: &Record| match &r.params {
            kb_format::Params::Memory(m) => (m.src.space, m.dst.space),
            _ => panic!("memory"),
        };
        let store = find(&recs, "dma_write", "sip0.cube0.pe0");
        let load = find(&recs, "dma_read", "sip0.cube0.pe1");
        assert_eq!(space(store), (Space::Tcm, Space::Sram));
        assert_eq!(space(load), (Space::Sram, Space::Tcm));
        // The same bytes went in and came out.
        assert_eq!(store.fingerprint, load.fingerprint);
        let copies: Vec<_> = recs.iter().filter(|(_, _, n)| n == "dma_copy").collect();
        assert_eq!(copies.len(), 2);
        assert_eq!(space(&copies[0].0), (Space::Hbm, Space::Sram));
        assert_eq!(space(&copies[1].0), (Space::Sram, Space::Hbm));
        assert_eq!(copies[0].0.fingerprint, copies[1].0.fingerprint);
        assert_eq!(copies[0].0.fingerprint, store.fingerprint);
        // The SRAM side is served by the cube's sram node: its PA says so.
        let w = &copies[0].0.write.as_ref().unwrap().ranges[0];
        let p = kb_format::pa::Pa::decode(w.pa).unwrap();
        assert_eq!((p.space, p.sip, p.cube, p.pe), (Space::Sram, 0, 0, 0));
    }
}

#[test]
fn host_data_is_deployed_into_tcm_and_sram_tensors() {
    fn kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
        let (a, b, y) = (args.tensor("a"), args.tensor("b"), args.tensor("y"));
        let whole =
            |t: &kb_sim::kernel::TensorArg| Block::in_shard(t, t.shard(PE0).unwrap(), 0, 0, 8, 32);
        // TCM tensor of this PE -> a tile; SRAM -> a tile; both to HBM.
        let ta = tl.load(whole(a));
        let tb = tl.load(whole(b));
        assert_eq!(
            ta.to_f64()[[3, 5]],
            tb.to_f64()[[3, 5]],
            "the same host data"
        );
        tl.store(Block::in_shard(y, y.shard(PE0).unwrap(), 0, 0, 8, 32), &ta);
    }
    let (recs, _) = simulate("va", RacePolicy::Error, |prog| {
        let on0 = Placement::over(&[PE0], Policy::Replicate);
        let data: Vec<u8> = (0..8 * 32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let a = prog.data("a", Dtype::F32, [8, 32], data.clone(), on0.clone().in_tcm())?;
        let b = prog.data("b", Dtype::F32, [8, 32], data, on0.clone().in_sram())?;
        let y = prog.zeros("y", Dtype::F32, [8, 32], on0)?;
        let args = prog.args(&[a, b, y]);
        prog.launch_grid("k", kernel, args, [1, 1], &[PE0])?;
        Ok(())
    })
    .unwrap();
    let writes: Vec<_> = recs.iter().filter(|(_, _, n)| n == "host_write").collect();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].1, "sip0.cube0.pe0.tcm");
    assert_eq!(writes[1].1, "sip0.cube0.sram");
    let load = find(&recs, "dma_copy", "sip0.cube0.pe0.pe_dma");
    assert_eq!(load.fingerprint, writes[0].0.fingerprint);
}

#[test]
fn another_pes_tcm_outside_its_buffers_is_refused_by_name() {
    fn kernel(tl: &mut Tl<'_>, _: &KernelArgs) {
        let t = tl.zeros(4, 4, Dtype::F32);
        let pa = kb_format::pa::Pa {
            space: Space::Tcm,
            sip: 0,
            cube: 0,
            pe: 1,
            offset: 0,
        }
        .encode()
        .unwrap();
        let dst = Block {
            addr: kb_format::Addr {
                space: Space::Tcm,
                addr: pa,
            },
            rows: 4,
            cols: 4,
            row_stride: 16,
            dtype: Dtype::F32,
        };
        tl.put(&t, dst, None);
    }
    let e = simulate("pa", RacePolicy::Warn, |prog| {
        prog.launch_grid("bad", kernel, KernelArgs::default(), [1, 1], &[PE0])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sip0.cube0.pe0") && e.contains("another PE's TCM outside its TCM buffers"),
        "{e}"
    );
}

#[test]
fn waits_that_never_end_and_barriers_with_absent_members_are_named() {
    fn waits(tl: &mut Tl<'_>, _: &KernelArgs) {
        tl.wait_signal(3, 2);
    }
    let e = simulate("pa", RacePolicy::Warn, |prog| {
        prog.launch_grid("waits", waits, KernelArgs::default(), [1, 1], &[PE1])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("deadlock")
            && e.contains("waits[0] on sip0.cube0.pe1 waits for its signal 3 to reach 2 (it is 0)"),
        "{e}"
    );
    fn lonely(tl: &mut Tl<'_>, _: &KernelArgs) {
        tl.barrier(&Group::new(&[PE0, PE1]));
    }
    let e = simulate("pa", RacePolicy::Warn, |prog| {
        prog.launch_grid("lonely", lonely, KernelArgs::default(), [1, 1], &[PE0])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("member sip0.cube0.pe1 does not run launch 0 (lonely)"),
        "{e}"
    );
}

#[test]
fn tensors_in_tcm_and_sram_are_addressed_by_pa_under_every_model() {
    for topo in ["pa", "va", "la-1to1", "la-nto1"] {
        let (_, report) = simulate(topo, RacePolicy::Error, |p| {
            x_and_slots(p, put_then_use::<true>)
        })
        .unwrap_or_else(|e| panic!("{topo}: {e}"));
        assert_eq!(report.stats.races, 0, "{topo}");
    }
}

/// The ring of the fidelity test: 2 MiB per PE over cube 0's 8 PEs, in
/// 64 KiB messages, 8 slots per channel.
const RING_BYTES: u64 = 2 << 20;
const RING_SLOT: u64 = 64 << 10;
const RING_DEPTH: u32 = 8;

/// The all-reduce of [`allreduce_in_tcm`]: direct, or ring.
fn allreduce_kernel<const DIRECT: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    use kb_sim::collective::{Algorithm, Comm};
    let (x, y, slots) = (args.tensor("x"), args.tensor("y"), args.tensor("slots"));
    let mut comm = Comm::new(tl, tl.launch_group(), slots, RING_DEPTH, 0);
    let algorithm = if DIRECT {
        Algorithm::Direct
    } else {
        Algorithm::Ring
    };
    comm.all_reduce(tl, x, y, algorithm);
}

/// `x` (random) and `y` stacked over cube 0's PEs in their TCM (no HBM
/// traffic on the links); an all-reduce of `x` into `y`, declared a
/// collective of `RING_BYTES` per member.
fn allreduce_in_tcm<const DIRECT: bool>(prog: &mut Program<'_>) -> Result<(), WorkloadError> {
    use kb_sim::collective::{self, Algorithm};
    use kb_sim::workload::Payload;
    let group: Vec<PeCoord> = prog
        .pes()
        .into_iter()
        .filter(|p| p.sip == 0 && p.cube == 0)
        .collect();
    let n = group.len() as u64;
    let rows = RING_BYTES / 4 / 256;
    let stacked = Placement::over(&group, Policy::RowWise).in_tcm();
    let x = prog.random("x", Dtype::F32, [n * rows, 256], stacked.clone())?;
    let y = prog.zeros("y", Dtype::F32, [n * rows, 256], stacked)?;
    let algorithm = if DIRECT {
        Algorithm::Direct
    } else {
        Algorithm::Ring
    };
    let slots = collective::slots(
        prog,
        "slots",
        Dtype::F32,
        &group,
        (RING_SLOT, RING_DEPTH),
        &[algorithm],
    )?;
    let args = prog.args(&[x, y, slots]);
    let launch = prog.launch_grid(
        "allreduce",
        allreduce_kernel::<DIRECT>,
        args,
        [n as u32, 1],
        &group,
    )?;
    prog.payload(launch, Payload::all_reduce(RING_BYTES, n as usize));
    Ok(())
}

/// `default` with DMA engines and TCM size and bandwidth to spare, so
/// only the links (pe_dma -> noc -> pe_dma, noc_pe: 256 GB/s) limit a
/// collective in TCM; races fail the run.
fn links_only() -> RunConfig {
    let mut topo = Topology::load("default").unwrap();
    topo.tcm.size_kib.0 = 65536.0;
    topo.tcm.bw_gbs.0 = 16384.0;
    topo.pe_dma.engines = 16;
    assert_eq!(topo.links.noc_pe.bw_gbs.0, 256.0);
    RunConfig {
        topology: topo,
        params: Vec::new(),
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races: RacePolicy::Error,
        command_line: Vec::new(),
        max_memory: None,
    }
}

#[test]
fn a_ring_allreduce_moves_2_p_minus_1_over_p_of_the_buffer_per_pe_at_link_speed() {
    // An uncontended ring: the data starts and ends in TCM, and the PEs
    // have DMA engines and TCM bandwidth to spare, so only the ring's links
    // limit it.
    let (bytes, report) = run(&links_only(), &Test(allreduce_in_tcm::<false>), Vec::new()).unwrap();
    assert_eq!(report.stats.races, 0);
    let recs = common::named_records(&bytes);
    let copies: Vec<&Record> = recs
        .iter()
        .filter(|(_, _, n)| n == "ipcq_copy")
        .map(|(r, _, _)| r)
        .collect();
    let p = 8u64;
    // Each PE sends 2 (P-1) chunks of N / P: 2 (P-1) / P N bytes.
    for pe in 0..p {
        let sent: u64 = recs
            .iter()
            .filter(|(_, c, n)| n == "ipcq_copy" && c == &format!("sip0.cube0.pe{pe}.pe_dma"))
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
        assert_eq!(sent, 2 * (p - 1) * RING_BYTES / p, "pe{pe}");
    }
    // Hand formula: those bytes through one 256 GB/s link per PE, all
    // links at once: 2 (P-1) / P x N / 256 GB/s = 14.336 us.
    let expected = (2 * (p - 1) * RING_BYTES / p) as f64 / 256.0; // ns
    let first = copies.iter().map(|r| r.t_start).min().unwrap();
    let last = copies.iter().map(|r| r.t_end).max().unwrap();
    let took = (last - first) as f64 / 1e3;
    assert!(
        (took - expected).abs() / expected < 0.02,
        "ring all-reduce took {took:.3} ns, hand formula {expected:.3} ns"
    );
}

/// Every PE writes its row of `x` (in its own HBM), passes a barrier over
/// the whole launch (with `BARRIER`), then reads the row its right
/// neighbour wrote.
fn write_barrier_read<const BARRIER: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let pes = tl.pes().to_vec();
    let k = pes.iter().position(|&p| p == tl.pe()).unwrap();
    let right = pes[(k + 1) % pes.len()];
    let row = |pe: PeCoord| Block::in_shard(x, x.shard(pe).unwrap(), 0, 0, 1, 16);
    let t = tl.full(1, 16, Dtype::F32, k as f64);
    tl.store(row(tl.pe()), &t);
    if BARRIER {
        tl.barrier(&tl.launch_group());
    }
    let back = tl.load(row(right));
    if BARRIER {
        // The neighbour's row as it wrote it (a constant Phase 1 knows).
        let want = ((k + 1) % pes.len()) as f64;
        assert_eq!(back.get(0, 7), want, "the barrier did not order the write");
    }
}

fn every_pe_writes_then_reads<const BARRIER: bool>(
    prog: &mut Program<'_>,
) -> Result<(), WorkloadError> {
    let pes = prog.pes();
    let n = pes.len() as u64;
    let x = prog.zeros(
        "x",
        Dtype::F32,
        [n, 16],
        Placement::over(&pes, Policy::RowWise),
    )?;
    let args = prog.args(&[x]);
    prog.launch_grid(
        "wbr",
        write_barrier_read::<BARRIER>,
        args,
        [n as u32, 1],
        &pes,
    )?;
    Ok(())
}

#[test]
fn a_barrier_over_every_pe_of_four_sips_orders_their_writes_before_the_reads() {
    // 256 PEs on 4 SIPs: without the barrier each read races the
    // neighbour's write; with it none does, and every read sees the write.
    let (recs, report) = simulate(
        "large",
        RacePolicy::Warn,
        every_pe_writes_then_reads::<false>,
    )
    .unwrap();
    assert_eq!(
        report.stats.races,
        256,
        "{:?}",
        report.stats.race_reports.first()
    );
    let text = &report.stats.race_reports[0];
    assert!(
        text.contains("(dma_write on sip") && text.contains("(dma_read on sip"),
        "{text}"
    );
    assert_eq!(recs.iter().filter(|(_, _, n)| n == "dma_read").count(), 256);
    let (recs, report) = simulate(
        "large",
        RacePolicy::Error,
        every_pe_writes_then_reads::<true>,
    )
    .unwrap();
    assert_eq!(report.stats.races, 0);
    // It costs its messages: the coordinator's pe_cpu handles the 256
    // arrivals one by one (50 ns each) before it releases anyone.
    let first_load = recs
        .iter()
        .filter(|(_, _, n)| n == "dma_read")
        .map(|(r, _, _)| r.t_start)
        .min()
        .unwrap();
    let t0 = report.launches[0].t_start;
    assert!(
        first_load >= t0 + 256 * 50_000,
        "a load began {:.3} ns after the launch",
        (first_load - t0) as f64 / 1e3
    );
}

#[test]
fn a_direct_allreduce_in_tcm_runs_near_its_fabric_bound_and_the_summary_says_which_link() {
    // As the ring above: data in TCM, DMA engines and TCM to spare. Member
    // k pulls chunk k of the 7 other buffers through its own link (7/8 N
    // inbound) and copies the sum into the 7 other outputs (7/8 N
    // outbound); the others' pulls of its buffer and pushes into its
    // output load the other direction alike: 2 (P-1)/P N each way, so the
    // fabric bound is the ring's, 14.336 us, on a PE's link.
    let (_, report) = run(&links_only(), &Test(allreduce_in_tcm::<true>), Vec::new()).unwrap();
    assert_eq!(report.stats.races, 0);
    let p = 8u64;
    let fabric = &report.stats.fabric[0];
    let link = fabric.link.as_ref().expect("links carried the data");
    assert!(
        link.name.starts_with("sip0.cube0.pe")
            || link.name.starts_with("sip0.cube0.noc -> sip0.cube0.pe"),
        "{}",
        link.name
    );
    // The data, plus control messages (signals, DMA requests and
    // acknowledgements: 64 bytes each, about one per 32 KiB moved).
    let data = 2 * (p - 1) * RING_BYTES / p;
    assert!(
        link.bytes >= data && link.bytes < data + data / 256,
        "{} carried {} bytes, the data alone {data}",
        link.name,
        link.bytes
    );
    let bound_ns = link.busy_ps as f64 / 1e3;
    assert!((bound_ns - data as f64 / 256.0).abs() < 20.0, "{bound_ns}");
    assert!(
        fabric.hbm.is_none(),
        "TCM data moved through HBM: {fabric:?}"
    );
    // And the run reaches most of it.
    let l = &report.launches[0];
    let took = (l.t_end - l.t_start) as f64 / 1e3;
    assert!(
        took < bound_ns * 1.25,
        "direct all-reduce took {took:.3} ns, fabric bound {bound_ns:.3} ns"
    );
    let payload = report.payloads[0].expect("declared");
    assert_eq!(payload.bytes, RING_BYTES);
    assert!((payload.bus_factor - 1.75).abs() < 1e-12);
}

/// A direct all-reduce in TCM whose `Comm` says the buffers are ready at
/// the launch and the output is read after it. With `WRITE_FIRST` the
/// kernel overwrites its x before the collective (so the skipped
/// handshake was needed); with `READ_AFTER` it reads its y after it (so
/// the skipped notifications were).
fn launch_bounded_kernel<const WRITE_FIRST: bool, const READ_AFTER: bool>(
    tl: &mut Tl<'_>,
    args: &KernelArgs,
) {
    use kb_sim::collective::{Algorithm, Comm};
    let (x, y, slots) = (args.tensor("x"), args.tensor("y"), args.tensor("slots"));
    let me = tl.pe();
    if WRITE_FIRST {
        let t = tl.zeros(8, 256, Dtype::F32);
        tl.store(Block::in_shard(x, x.shard(me).unwrap(), 0, 0, 8, 256), &t);
    }
    let mut comm = Comm::new(tl, tl.launch_group(), slots, RING_DEPTH, 0)
        .ready_at_launch()
        .read_after_launch();
    comm.all_reduce(tl, x, y, Algorithm::Direct);
    if READ_AFTER {
        tl.load(Block::in_shard(y, y.shard(me).unwrap(), 0, 0, 8, 256));
    }
}

fn launch_bounded<const WRITE_FIRST: bool, const READ_AFTER: bool>(
    prog: &mut Program<'_>,
) -> Result<(), WorkloadError> {
    let group: Vec<PeCoord> = prog
        .pes()
        .into_iter()
        .filter(|p| p.sip == 0 && p.cube == 0)
        .collect();
    let n = group.len() as u64;
    let stacked = Placement::over(&group, Policy::RowWise).in_tcm();
    let x = prog.random("x", Dtype::F32, [n * 64, 256], stacked.clone())?;
    let y = prog.zeros("y", Dtype::F32, [n * 64, 256], stacked)?;
    let slots = kb_sim::collective::slots(
        prog,
        "slots",
        Dtype::F32,
        &group,
        (RING_SLOT, RING_DEPTH),
        &[kb_sim::collective::Algorithm::Direct],
    )?;
    let args = prog.args(&[x, y, slots]);
    prog.launch_grid(
        "allreduce",
        launch_bounded_kernel::<WRITE_FIRST, READ_AFTER>,
        args,
        [n as u32, 1],
        &group,
    )?;
    Ok(())
}

#[test]
fn a_launch_bounded_direct_allreduce_skips_its_handshakes_and_misuse_is_a_race() {
    // Used as meant: no "ready" or "gathered" signal at all, no race.
    let (bytes, report) = run(
        &links_only(),
        &Test(launch_bounded::<false, false>),
        Vec::new(),
    )
    .unwrap();
    assert_eq!(report.stats.races, 0, "{:?}", report.stats.race_reports);
    let recs = common::named_records(&bytes);
    let signals = recs.iter().filter(|(_, _, n)| n == "signal").count();
    assert_eq!(signals, 0);
    let race = |build: Build| match run(&links_only(), &Test(build), Vec::new()) {
        Err(RunError::Sim(SimError::Race(text))) => text,
        other => panic!("not a race: {:?}", other.map(|(_, r)| r.stats.races)),
    };
    // A kernel that wrote its buffer first needed the handshake: a peer's
    // pull is not ordered after that store.
    let text = race(launch_bounded::<true, false>);
    assert!(text.contains("tensor x"), "{text}");
    // A kernel that reads its output needed the notifications: the read
    // is not ordered after the peers' pushes.
    let text = race(launch_bounded::<false, true>);
    assert!(text.contains("tensor y"), "{text}");
}
