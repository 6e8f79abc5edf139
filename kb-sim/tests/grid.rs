//! 3-D launch grids (issue 34): programs dealt to the launch's PEs axis 0
//! fastest, `program_id` / `num_programs` over three axes, the grid in
//! the trace's launch record, and the errors: axis 3, an empty axis, a
//! grid too large to count.

use std::sync::Mutex;

use kb_format::MmapTrace;
use kb_sim::kernel::{Executor, KernelArgs, Tl};
use kb_sim::machine::PeCoord;
use kb_sim::run::{RunConfig, RunError, run};
use kb_sim::topology::Topology;
use kb_sim::workload::{ParamSpec, Params, Program, Workload, WorkloadError};

type Build = fn(&mut Program<'_>) -> Result<(), WorkloadError>;

#[derive(Debug)]
struct Test(Build);

impl Workload for Test {
    fn name(&self) -> &str {
        "grid"
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

/// Run `build` on the small topology: the trace's bytes.
fn simulate(build: Build) -> Result<Vec<u8>, RunError> {
    let cfg = RunConfig {
        topology: Topology::load("small").unwrap(),
        params: Vec::new(),
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races: Default::default(),
        command_line: Vec::new(),
        max_memory: None,
    };
    Ok(run(&cfg, &Test(build), Vec::new())?.0)
}

const fn pe(pe: u32) -> PeCoord {
    PeCoord {
        sip: 0,
        cube: 0,
        pe,
    }
}

/// A program's PE, program id and grid.
type Seen = (PeCoord, [u32; 3], [u32; 3]);

/// What each program saw, in the order programs ran.
static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

fn where_am_i(tl: &mut Tl<'_>, _: &KernelArgs) {
    let id = [tl.program_id(0), tl.program_id(1), tl.program_id(2)];
    let n = [tl.num_programs(0), tl.num_programs(1), tl.num_programs(2)];
    SEEN.lock().unwrap().push((tl.pe(), id, n));
}

#[test]
fn a_3d_grid_deals_its_programs_axis_0_fastest_and_the_trace_records_it() {
    let bytes = simulate(|prog| {
        prog.launch_grid(
            "where",
            where_am_i,
            KernelArgs::default(),
            [4, 2, 3],
            &[pe(0), pe(1), pe(2)],
        )?;
        Ok(())
    })
    .unwrap();
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    assert_eq!(seen.len(), 24, "{seen:?}");
    assert!(seen.iter().all(|s| s.2 == [4, 2, 3]), "{seen:?}");
    // By hand: program k = i0 + 4*i1 + 8*i2 runs on PE k mod 3, each PE
    // its programs in increasing k. PE 1 runs k = 1, 4, 7, ..., 22.
    let on =
        |p: u32| -> Vec<[u32; 3]> { seen.iter().filter(|s| s.0 == pe(p)).map(|s| s.1).collect() };
    assert_eq!(
        on(1),
        [
            [1, 0, 0], // 1
            [0, 1, 0], // 4
            [3, 1, 0], // 7
            [2, 0, 1], // 10
            [1, 1, 1], // 13
            [0, 0, 2], // 16
            [3, 0, 2], // 19
            [2, 1, 2], // 22
        ]
    );
    let mut all: Vec<[u32; 3]> = seen.iter().map(|s| s.1).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 24);
    assert_eq!(on(0).len() + on(1).len() + on(2).len(), 24);

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("grid.kbt");
    std::fs::write(&p, &bytes).unwrap();
    let t = MmapTrace::open(&p).unwrap();
    assert_eq!(t.launches()[0].grid, [4, 2, 3]);
    assert_eq!(t.launches()[0].grid_label(), "4 x 2 x 3");
}

/// The kernel's source line of `tl.program_id(3)` below.
fn bad_axis(tl: &mut Tl<'_>, args: &KernelArgs) {
    if args.get("num") == 1 {
        tl.num_programs(3);
    } else {
        tl.program_id(3);
    }
}

#[test]
fn axis_3_is_a_kernel_error_naming_the_line() {
    let src = include_str!("grid.rs");
    let line = |needle: &str| {
        src.lines()
            .position(|l| l.trim() == needle)
            .map(|i| i + 1)
            .unwrap()
    };
    for (num, op, needle) in [
        (0, "program_id", "tl.program_id(3);"),
        (1, "num_programs", "tl.num_programs(3);"),
    ] {
        let build: Build = if num == 0 {
            |prog| {
                let args = KernelArgs::default().scalar("num", 0);
                prog.launch_grid("bad", bad_axis, args, [1, 1, 2], &[pe(0)])?;
                Ok(())
            }
        } else {
            |prog| {
                let args = KernelArgs::default().scalar("num", 1);
                prog.launch_grid("bad", bad_axis, args, [1, 1, 2], &[pe(0)])?;
                Ok(())
            }
        };
        let e = simulate(build).unwrap_err().to_string();
        assert!(
            e.contains(&format!("tl.{op}: axis 3 (a grid has axes 0, 1 and 2)"))
                && e.contains(&format!("grid.rs:{}", line(needle)))
                && e.contains("kernel bad"),
            "{e}"
        );
    }
}

fn nothing(_: &mut Tl<'_>, _: &KernelArgs) {}

#[test]
fn an_empty_axis_or_too_many_programs_is_refused_when_the_program_is_built() {
    let e = simulate(|prog| {
        prog.launch_grid("empty", nothing, KernelArgs::default(), [2, 3, 0], &[pe(0)])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("launch empty: empty grid 2 x 3 x 0 (axis 2 has no programs)"),
        "{e}"
    );
    let e = simulate(|prog| {
        prog.launch_grid("empty", nothing, KernelArgs::default(), [0, 3], &[pe(0)])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("launch empty: empty grid 0 x 3 (axis 0 has no programs)"),
        "{e}"
    );
    let e = simulate(|prog| {
        let g = [u32::MAX, u32::MAX, 2];
        prog.launch_grid("huge", nothing, KernelArgs::default(), g, &[pe(0)])?;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("launch huge: grid 4294967295 x 4294967295 x 2 has more than 2^64 programs"),
        "{e}"
    );
}
