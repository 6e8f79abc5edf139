//! The `tl` atomics: values, old values and later loads; the time of one
//! atomic computed by hand from `pa.yaml`; the race rules (two atomics
//! never race, an atomic and a plain access do); errors naming the op,
//! the tensor and the kernel's line.

mod common;

use kb_format::{Dtype, Params, Record};
use kb_sim::engine::{RacePolicy, SimError};
use kb_sim::kernel::{Block, Executor, KernelArgs, Tl};
use kb_sim::machine::PeCoord;
use kb_sim::run::{RunConfig, RunError, RunReport, run};
use kb_sim::topology::Topology;
use kb_sim::workload::{
    ParamSpec, Params as WParams, Placement, Policy, Program, Workload, WorkloadError,
};

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
    fn build(&self, _: &WParams, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
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

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// x: 1 x 16 i32 (0..16) in PE0's HBM; v: 1 x 16 i32 (10, 20, ...) on
/// every PE; `kernel` on `pes`.
fn x_on_pe0(
    prog: &mut Program<'_>,
    kernel: kb_sim::kernel::KernelFn,
    pes: &[PeCoord],
) -> Result<(), WorkloadError> {
    let at0 = Placement::over(&[PE0], Policy::RowWise);
    let x = prog
        .data(
            "x",
            Dtype::I32,
            [1, 16],
            i32s(&(0..16).collect::<Vec<_>>()),
            at0,
        )
        .unwrap();
    let all = prog.pes();
    let v = prog
        .data(
            "v",
            Dtype::I32,
            [1, 16],
            i32s(&(1..=16).map(|i| 10 * i).collect::<Vec<_>>()),
            Placement::over(&all, Policy::Replicate),
        )
        .unwrap();
    let m = prog
        .data(
            "m",
            Dtype::U8,
            [1, 16],
            [1u8, 0].repeat(8),
            Placement::over(&all, Policy::Replicate),
        )
        .unwrap();
    let args = prog.args(&[x, v, m]);
    prog.launch_grid("atom", kernel, args, [pes.len() as u32, 1], pes)?;
    Ok(())
}

fn one_add(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    tl.atomic_add(Block::of(x, tl.pe(), 0, 0, 1, 16), 1.0, None);
}

/// One 64-byte atomic_add from PE0 to its own HBM on `pa.yaml`, stage by
/// stage (the figures of `fidelity.rs`'s lone read): the request travels
/// as a DMA write's data, the memory reads then writes, the old values
/// come back as a read's data.
fn lone_atomic_on_pa() -> u64 {
    let bytes = 64u64;
    // pe_dma setup (10 ns); the values leave TCM (1024 GB/s, 2 ns).
    let read_tcm = 10_000 + ser(bytes, 1024.0) + 2_000;
    // TCM -> pe_dma over the tcm_port link (1 ns, 1024 GB/s): the head
    // starts the next stage, the tail follows.
    let mut head = read_tcm + 1_000;
    let mut tail = read_tcm + ser(bytes, 1024.0) + 1_000;
    // pe_dma -> noc (256 GB/s) -> hbm_router -> hbm_ctrl (4096 GB/s), 5 ns
    // each, 2 ns first flit at the intermediate nodes; the memory starts
    // on the last byte.
    for (i, bw) in [256.0, 4096.0, 4096.0].into_iter().enumerate() {
        tail = (head + ser(bytes, bw)).max(tail) + 5_000;
        head += 5_000 + if i < 2 { 2_000 } else { 0 };
    }
    // HBM, one 32 GB/s pseudo channel (64 B < one 256 B block), 100 ns
    // latency: a read, then from its end a write of the same bytes.
    let read = tail + ser(bytes, 32.0) + 100_000;
    let write = read + ser(bytes, 32.0) + 100_000;
    // The old values back: hbm_ctrl -> hbm_router -> noc (4096 GB/s) ->
    // pe_dma (256 GB/s), cut through from the head.
    let (mut head, mut tail) = (write, write);
    for (i, bw) in [4096.0, 4096.0, 256.0].into_iter().enumerate() {
        tail = (head + ser(bytes, bw)).max(tail) + 5_000;
        head += 5_000 + if i < 2 { 2_000 } else { 0 };
    }
    // pe_dma -> TCM (1 ns), then the TCM writes them (2 ns latency).
    tail = (head + ser(bytes, 1024.0)).max(tail) + 1_000;
    tail + ser(bytes, 1024.0) + 2_000
}

#[test]
fn a_lone_atomic_takes_the_hand_computed_time_of_its_stages() {
    let topo = Topology::load("pa").unwrap();
    assert_eq!(topo.pe_dma.burst_bytes, 4096);
    let (recs, _) = simulate("pa", RacePolicy::Error, |p| x_on_pe0(p, one_add, &[PE0])).unwrap();
    let (r, comp, _) = recs
        .iter()
        .find(|(_, _, n)| n == "atomic_add")
        .expect("an atomic_add record");
    assert_eq!(comp, "sip0.cube0.pe0.pe_dma");
    assert_eq!(r.kind, kb_format::OpKind::Atomic);
    assert_eq!(r.t_end - r.t_start, lone_atomic_on_pa());
    // 258.392 ns: a lone 64 B read's 153.329 ns (fidelity.rs) with the
    // values' trip out instead of a request, and a second memory access
    // (2 + 100 ns) for the write.
    assert_eq!(lone_atomic_on_pa(), 258_392);
    let Params::Atomic(a) = &r.params else {
        panic!("atomic params")
    };
    assert_eq!((a.rows, a.cols, a.dtype), (1, 16, Dtype::I32));
    // Read: the target (a scalar value has no tile); write: the target,
    // then the old values.
    let (read, write) = (r.read.as_ref().unwrap(), r.write.as_ref().unwrap());
    assert_eq!(read.ranges.len(), 1);
    assert_eq!(write.ranges.len(), 2);
    assert_eq!(read.ranges[0], write.ranges[0]);
    assert!(read.seq < write.seq);
}

fn each_op(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, v) = (args.tensor("x"), args.tensor("v"));
    let pe = tl.pe();
    let bx = || Block::of(x, pe, 0, 0, 1, 4);
    let tv = tl.load(Block::of(v, pe, 0, 0, 1, 4));
    let got = |t: &kb_sim::kernel::Tile| -> Vec<i64> {
        (0..4).map(|c| t.get(0, c) as i64).collect::<Vec<_>>()
    };
    // x starts 0, 1, 2, 3; v is 10, 20, 30, 40.
    let old = tl.atomic_add(bx(), &tv, None);
    assert_eq!(got(&old), [0, 1, 2, 3]);
    let old = tl.atomic_max(bx(), 25.0, None);
    assert_eq!(got(&old), [10, 21, 32, 43]);
    let old = tl.atomic_min(bx(), 30.0, None);
    assert_eq!(got(&old), [25, 25, 32, 43]);
    let old = tl.atomic_cas(bx(), 25, 7.0, None);
    assert_eq!(got(&old), [25, 25, 30, 30]);
    let old = tl.atomic_xor(bx(), 1.0, None);
    assert_eq!(got(&old), [7, 7, 30, 30]);
    let old = tl.atomic_and(bx(), 6.0, None);
    assert_eq!(got(&old), [6, 6, 31, 31]);
    let old = tl.atomic_or(bx(), 8.0, None);
    assert_eq!(got(&old), [6, 6, 6, 6]);
    let old = tl.atomic_xchg(bx(), &tv, None);
    assert_eq!(got(&old), [14, 14, 14, 14]);
    // Masked: only where the mask (1, 0, 1, 0) is set; every old value
    // comes back.
    let mask = tl.load(Block::of(args.tensor("m"), pe, 0, 0, 1, 4));
    let old = tl.atomic_add(bx(), &tv, Some(&mask));
    assert_eq!(got(&old), [10, 20, 30, 40]);
    let now = tl.load(bx());
    assert_eq!(got(&now), [20, 20, 60, 40], "a later load sees the atomics");
}

#[test]
fn each_op_returns_the_old_values_and_a_later_load_sees_the_new() {
    let (_, report) =
        simulate("small", RacePolicy::Error, |p| x_on_pe0(p, each_op, &[PE0])).unwrap();
    assert_eq!(report.stats.races, 0);
}

fn add_from_both(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, v) = (args.tensor("x"), args.tensor("v"));
    let pe = tl.pe();
    let tv = tl.load(Block::of(v, pe, 0, 0, 1, 16));
    tl.atomic_add(Block::of(x, pe, 0, 0, 1, 16), &tv, None);
}

fn store_from_pe1(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, v) = (args.tensor("x"), args.tensor("v"));
    let pe = tl.pe();
    let tv = tl.load(Block::of(v, pe, 0, 0, 1, 16));
    if tl.program_id(0) == 1 {
        tl.store(Block::of(x, pe, 0, 0, 1, 16), &tv);
    } else {
        tl.atomic_add(Block::of(x, pe, 0, 0, 1, 16), &tv, None);
    }
}

#[test]
fn two_atomics_never_race_but_an_atomic_and_a_plain_store_do() {
    let (recs, report) = simulate("pa", RacePolicy::Error, |p| {
        x_on_pe0(p, add_from_both, &[PE0, PE1])
    })
    .unwrap();
    assert_eq!(report.stats.races, 0);
    assert_eq!(recs.iter().filter(|(_, _, n)| n == "atomic_add").count(), 2);
    let (_, report) = simulate("pa", RacePolicy::Warn, |p| {
        x_on_pe0(p, store_from_pe1, &[PE0, PE1])
    })
    .unwrap();
    assert_eq!(report.stats.races, 1, "{:?}", report.stats.race_reports);
    let text = &report.stats.race_reports[0];
    assert!(
        text.contains("atomic_add on sip0.cube0.pe0, kernel atom) updated")
            && text.contains("wrote")
            && text.contains("tensor x"),
        "{text}"
    );
}

fn xor_on_f32(tl: &mut Tl<'_>, args: &KernelArgs) {
    let y = args.tensor("y");
    tl.atomic_xor(Block::of(y, tl.pe(), 0, 0, 1, 4), 1.0, None);
}

fn y_f32(prog: &mut Program<'_>) -> Result<(), WorkloadError> {
    let y = prog.zeros(
        "y",
        Dtype::F32,
        [1, 4],
        Placement::over(&[PE0], Policy::Replicate),
    )?;
    let args = prog.args(&[y]);
    prog.launch_grid("bad", xor_on_f32, args, [1, 1], &[PE0])?;
    Ok(())
}

#[test]
fn an_atomic_the_dtype_lacks_fails_naming_op_tensor_and_line() {
    let e = simulate("small", RacePolicy::Error, y_f32).unwrap_err();
    let RunError::Sim(SimError::Kernel { message, .. }) = &e else {
        panic!("not a kernel error: {e}");
    };
    assert!(
        message.contains("tl.atomic_xor: the 1x4 f32 block of y is f32: atomic_xor acts on i32"),
        "{message}"
    );
    assert!(message.contains("atomics.rs:"), "{message}");
}

fn add_then_check(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (s, v) = (args.tensor("s"), args.tensor("v"));
    let pe = tl.pe();
    let tv = tl.load(Block::of(v, pe, 0, 0, 1, 16));
    let old = tl.atomic_add(Block::of(s, pe, 0, 0, 1, 16), &tv, None);
    // Either PE may go first: the old values are the start (0..16) or
    // the start plus one v.
    let first = (0..16).all(|c| old.get(0, c) == c as f64);
    let second = (0..16).all(|c| old.get(0, c) == (c + 10 * (c + 1)) as f64);
    assert!(first || second, "{:?}", old.to_f64());
}

#[test]
fn atomics_on_sram_from_two_pes_add_up() {
    let (recs, report) = simulate("pa", RacePolicy::Error, |p| {
        let pes = [PE0, PE1];
        let s = p.data(
            "s",
            Dtype::I32,
            [1, 16],
            i32s(&(0..16).collect::<Vec<_>>()),
            Placement::over(&[PE0], Policy::RowWise).in_sram(),
        )?;
        let v = p.data(
            "v",
            Dtype::I32,
            [1, 16],
            i32s(&(1..=16).map(|i| 10 * i).collect::<Vec<_>>()),
            Placement::over(&pes, Policy::Replicate),
        )?;
        let args = p.args(&[s, v]);
        p.launch_grid("sram", add_then_check, args, [2, 1], &pes)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(report.stats.races, 0);
    let adds: Vec<&Record> = recs
        .iter()
        .filter(|(_, _, n)| n == "atomic_add")
        .map(|(r, _, _)| r)
        .collect();
    assert_eq!(adds.len(), 2);
    // Their target is SRAM, and the second applied after the first.
    for r in &adds {
        let Params::Atomic(a) = &r.params else {
            panic!("atomic params")
        };
        assert_eq!(a.target.space, kb_format::Space::Sram);
    }
    let seqs: Vec<u64> = adds.iter().map(|r| r.write.as_ref().unwrap().seq).collect();
    assert_ne!(seqs[0], seqs[1]);
}
