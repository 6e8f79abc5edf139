//! Kernels through the executors: failures named with the kernel, PE and
//! simulated time, TCM limits, store visibility, masked tiles.

use std::sync::Arc;

use kb_format::{Dtype, Meta, TraceWriter, VerifySpec};
use kb_sim::engine::{Engine, SimError};
use kb_sim::kernel::{self, Block, Executor, KernelArgs, KernelFn, Tl};
use kb_sim::machine::Machine;
use kb_sim::program::PeProgram;
use kb_sim::runtime::{Runtime, Sharding};
use kb_sim::topology::Topology;

/// Run `kernel` on every PE of `small` with one row-sharded input tensor.
fn run_kernel(kernel: KernelFn, executor: Executor) -> Result<(), SimError> {
    let m = Machine::build(&Topology::load("small").unwrap());
    let mut rt = Runtime::new(&m);
    let data: Vec<u8> = (0..64 * 16 * 4).map(|i| i as u8).collect();
    let x = rt
        .tensor("x", Dtype::F32, [64, 16], Some(data), Sharding::ROWS)
        .unwrap();
    let args = Arc::new(rt.kernel_args(&[x]));
    let pes: Vec<_> = m.pes().collect();
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for (i, pe) in pes.into_iter().enumerate() {
        let body = kernel::body(kernel, args.clone(), pe, i as u32, 4, rt.take_tcm(pe));
        programs.push(executor.spawn(format!("test_kernel[{i}]"), body).unwrap());
    }
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (w, _) = Engine::new(&m, writer, &rt.tensors, programs).run()?;
    w.finish(&VerifySpec::default()).unwrap();
    Ok(())
}

fn first_rows(tl: &mut Tl<'_>, args: &KernelArgs, rows: u32) -> kernel::Tile {
    let x = args.tensor("x");
    let s = x.shard(tl.pe()).unwrap();
    tl.load(Block::in_shard(x, s, 0, 0, rows, 16))
}

fn panics_on_pe1(tl: &mut Tl<'_>, args: &KernelArgs) {
    let t = first_rows(tl, args, 2);
    if tl.program_id(0) == 1 {
        panic!("bad value {}", t.to_f64()[[0, 0]]);
    }
}

#[test]
fn a_panicking_kernel_is_named_with_its_pe_and_time() {
    for ex in [Executor::Coroutine, Executor::Thread] {
        let e = run_kernel(panics_on_pe1, ex).unwrap_err().to_string();
        assert!(e.contains("sip0.cube0.pe1"), "{ex:?}: {e}");
        assert!(
            e.contains("test_kernel[1]") && e.contains("bad value"),
            "{ex:?}: {e}"
        );
        assert!(e.contains(" ns"), "{ex:?}: {e}");
    }
}

fn loads_too_much(tl: &mut Tl<'_>, args: &KernelArgs) {
    let _a = first_rows(tl, args, 16);
    let _b = first_rows(tl, args, 16);
    // 16 x 16 f32 = 1 KiB per tile; 2048 tiles exceed small's 1 MiB TCM.
    let keep: Vec<_> = (0..2048).map(|_| first_rows(tl, args, 16)).collect();
    drop(keep);
}

#[test]
fn running_out_of_tcm_names_the_pe_and_sizes() {
    let e = run_kernel(loads_too_much, Executor::Coroutine)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("out of TCM") && e.contains("1024-byte tile") && e.contains("1048576"),
        "{e}"
    );
    assert!(e.contains("sip0.cube0.pe"), "{e}");
}

fn tiles_free_tcm_on_drop(tl: &mut Tl<'_>, args: &KernelArgs) {
    for _ in 0..4096 {
        let t = first_rows(tl, args, 16);
        assert_eq!(t.shape(), (16, 16));
    }
}

#[test]
fn dropped_tiles_return_their_tcm() {
    run_kernel(tiles_free_tcm_on_drop, Executor::Coroutine).unwrap();
}

fn store_then_load(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let s = x.shard(tl.pe()).unwrap();
    let row0 = tl.load(Block::in_shard(x, s, 0, 0, 1, 16));
    // Overwrite row 1 with row 0; the load right after must see it.
    tl.store(Block::in_shard(x, s, 1, 0, 1, 16), &row0);
    let row1 = tl.load(Block::in_shard(x, s, 1, 0, 1, 16));
    assert_eq!(row0.bytes(), row1.bytes(), "a store is visible at issue");
}

#[test]
fn a_store_is_visible_to_the_next_load() {
    for ex in [Executor::Coroutine, Executor::Thread] {
        run_kernel(store_then_load, ex).unwrap();
    }
}

#[test]
fn a_deadlock_names_each_blocked_kernel_and_what_it_waits_for() {
    use kb_format::{Addr, MemoryParams, Space};
    use kb_sim::machine::PeCoord;
    use kb_sim::program::{Command, DmaCmd, Script};
    let m = Machine::build(&Topology::load("small").unwrap());
    let rt = Runtime::new(&m);
    let pa = |space, pe: u32| {
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
                addr: pa(Space::Hbm, 0),
            },
            dst: Addr {
                space: Space::Tcm,
                addr: pa(Space::Tcm, 0),
            },
            rows: 1,
            row_bytes: 64,
            src_stride: 64,
            dst_stride: 64,
            dtype: None,
        },
        label: None,
    };
    // PE0 issues op 2 (after the launch record, 0, and its kernel_start
    // record, 1); PE1 waits on it, but completions wake only their own
    // PE, so PE1 waits forever.
    let mut programs: Vec<Box<dyn PeProgram>> = vec![
        Box::new(Script::new(vec![Command::Dma(load)])),
        Box::new(Script::new(vec![Command::WaitOp(2)])),
    ];
    programs.extend((2..4).map(|_| Box::new(Script::new(vec![])) as Box<dyn PeProgram>));
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let e = Engine::new(&m, writer, &rt.tensors, programs)
        .run()
        .unwrap_err()
        .to_string();
    let pe1 = PeCoord {
        sip: 0,
        cube: 0,
        pe: 1,
    };
    assert!(e.starts_with("deadlock at "), "{e}");
    assert!(
        e.contains(&format!("kernel script on {pe1} waits for op 2")),
        "{e}"
    );
    assert!(!e.contains("pe0"), "PE0 finished: {e}");
}

fn masked_edge_tile(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    // A 3 x 5 valid corner of a 4 x 8 tile; the rest is -1.
    let t = tl.load_masked(Block::in_shard(x, &s, 0, 0, 3, 5), 4, 8, -1.0);
    assert_eq!(t.shape(), (4, 8));
    let row0 = tl.load(Block::in_shard(x, &s, 0, 0, 1, 5));
    for c in 0..5 {
        assert_eq!(t.get(0, c), row0.get(0, c), "valid element (0, {c})");
    }
    assert_eq!(t.get(0, 5), -1.0);
    assert_eq!(t.get(3, 0), -1.0);
    assert_eq!(t.get(3, 7), -1.0);
    // Storing the valid corner back is a masked store.
    tl.store_masked(Block::in_shard(x, &s, 4, 0, 3, 5), &t);
}

#[test]
fn masked_loads_fill_edges_with_other_and_store_the_valid_corner() {
    run_kernel(masked_edge_tile, Executor::Coroutine).unwrap();
}

/// One program on `small` with masked 8 x 8 tiles whose data corners are
/// 3 x 5 (a) and 5 x 6 (b): useful FLOPs follow the data, executed FLOPs
/// the tiles.
fn padded_math(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let x = args.tensor("x");
    let s = *x.shard(tl.pe()).unwrap();
    let a = tl.load_masked(Block::in_shard(x, &s, 0, 0, 3, 5), 8, 8, 0.0); // fill: 64, 0 useful
    let b = tl.load_masked(Block::in_shard(x, &s, 0, 0, 5, 6), 8, 8, 0.0); // fill: 64, 0
    let d = tl.dot(&a, &b, None); // 2*8*8*8 = 1024, useful 2*3*6*5 = 180
    let e = tl.add(&d, &d); // 64, useful 3*6 = 18
    let f = tl.sum(&e, 1); // 8 x 1: 8, useful 3
    let _g = tl.mul(&e, &f); // broadcast: 64, useful 3*6 = 18
    let h = tl.zeros(8, 8, Dtype::F32); // 64, all useful
    let _h = tl.dot(&a, &b, Some(h)); // 1024, useful 180
}

#[derive(Debug)]
struct PaddedMath;

impl kb_sim::workload::Workload for PaddedMath {
    fn name(&self) -> &str {
        "padded_math"
    }
    fn about(&self) -> &str {
        "useful FLOPs test"
    }
    fn params(&self) -> &[kb_sim::workload::ParamSpec] {
        &[]
    }
    fn build(
        &self,
        _: &kb_sim::workload::Params,
        prog: &mut kb_sim::workload::Program<'_>,
    ) -> Result<(), kb_sim::workload::WorkloadError> {
        let x = prog.random("x", Dtype::F32, [64, 16], Sharding::ROWS)?;
        let args = prog.args(&[x]);
        prog.launch("padded_math", padded_math, args);
        Ok(())
    }
}

#[test]
fn useful_flops_count_the_data_and_not_the_padding() {
    let cfg = kb_sim::run::RunConfig {
        topology: Topology::load("small").unwrap(),
        params: vec![],
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races: Default::default(),
        command_line: vec![],
        max_memory: None,
    };
    let (bytes, report) = kb_sim::run::run(&cfg, &PaddedMath, Vec::new()).unwrap();
    let l = &report.launches[0];
    assert_eq!(
        (l.flops, l.useful_flops),
        (
            64 + 64 + 1024 + 64 + 8 + 64 + 64 + 1024,
            180 + 18 + 3 + 18 + 64 + 180
        )
    );
    // The trace carries the same launch.
    let mut r = kb_format::StreamReader::open(&bytes[..]).unwrap();
    r.skip_to_end().unwrap();
    assert_eq!(r.launches(), &report.launches[..]);
}

fn misspells_its_tensor(tl: &mut Tl<'_>, args: &KernelArgs) {
    let _ = tl.program_id(0);
    let _ = args.tensor("X");
}

/// A misspelled argument name fails the kernel, listing the names the
/// launch passed.
#[test]
fn a_misspelled_tensor_name_lists_the_tensors_passed() {
    let e = run_kernel(misspells_its_tensor, Executor::Coroutine)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no tensor named \"X\" was passed to the kernel; the tensors passed are \"x\""),
        "{e}"
    );
    assert!(
        e.contains("test_kernel[") && e.contains("sip0.cube0.pe"),
        "{e}"
    );
}

/// A workload's `build` asking for a parameter it does not declare is its
/// author's bug: the panic lists the parameters it does declare.
#[test]
fn an_undeclared_workload_parameter_lists_the_declared_ones() {
    #[derive(Debug)]
    struct Two;
    impl kb_sim::workload::Workload for Two {
        fn name(&self) -> &str {
            "two"
        }
        fn about(&self) -> &str {
            "two parameters"
        }
        fn params(&self) -> &[kb_sim::workload::ParamSpec] {
            &[
                kb_sim::workload::ParamSpec {
                    name: "rows",
                    default: "8",
                    help: "",
                },
                kb_sim::workload::ParamSpec {
                    name: "cols",
                    default: "4",
                    help: "",
                },
            ]
        }
        fn build(
            &self,
            _: &kb_sim::workload::Params,
            _: &mut kb_sim::workload::Program<'_>,
        ) -> Result<(), kb_sim::workload::WorkloadError> {
            Ok(())
        }
    }
    let p = kb_sim::workload::Params::resolve(&Two, &[]).unwrap();
    assert_eq!(p.u64("rows", 1).unwrap(), 8);
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.u64("row", 1))).unwrap_err();
    let e = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        e,
        "parameter \"row\" is not declared by workload two; it declares: cols, rows (Workload::params)"
    );
}
