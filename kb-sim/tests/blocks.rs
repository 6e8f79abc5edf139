//! Blocks in tensor coordinates anywhere (issue 34): a block that spans
//! shards, or lies in another PE's or cube's HBM, is one DMA per part,
//! assembled in one TCM tile; the race detector sees each part; kernel
//! errors name the kernel's source line, the op and the tensor.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use kb_format::{Dtype, Params as OpParams};
use kb_sim::engine::RacePolicy;
use kb_sim::kernel::{Block, Executor, KernelArgs, KernelFn, Tl};
use kb_sim::run::{RunConfig, RunError, RunReport, run};
use kb_sim::topology::Topology;
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

/// One launch of `kernel` on every PE over `x` (`rows` x 16 f32, values
/// 0, 1, 2, ... row-major, row-sharded) and `y` (the same shape, zeros).
#[derive(Debug)]
struct OneLaunch {
    kernel: KernelFn,
    rows: u64,
}

impl Workload for OneLaunch {
    fn name(&self) -> &str {
        "one_launch"
    }
    fn about(&self) -> &str {
        "a test kernel"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let n = self.rows * 16;
        let data: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let x = prog.data("x", Dtype::F32, [self.rows, 16], data, Sharding::ROWS)?;
        let y = prog.zeros("y", Dtype::F32, [self.rows, 16], Sharding::ROWS)?;
        let args = prog.args(&[x, y]);
        prog.launch("k", self.kernel, args);
        Ok(())
    }
}

fn config(topo: &str, races: RacePolicy) -> RunConfig {
    RunConfig {
        topology: Topology::load(topo).unwrap(),
        params: vec![],
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races,
        command_line: vec![],
        max_memory: None,
    }
}

fn sim(topo: &str, kernel: KernelFn, rows: u64) -> Result<(Vec<u8>, RunReport), RunError> {
    run(
        &config(topo, RacePolicy::Warn),
        &OneLaunch { kernel, rows },
        Vec::new(),
    )
}

/// PE 0 loads rows 10..+12 of a 64-row tensor sharded 16 rows per PE
/// (small: 4 PEs): rows 10..16 from its own shard, 16..22 from PE 1's.
fn spanning_load(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let b = Block::of(x, tl.pe(), 10, 2, 12, 8);
    assert_eq!(b.parts().len(), 2);
    assert_eq!((b.parts()[1].row, b.parts()[1].col), (6, 0));
    let t = tl.load(b);
    for r in 0..12 {
        for c in 0..8 {
            let want = ((10 + r) * 16 + 2 + c) as f64;
            assert_eq!(t.get(r, c), want, "element ({r}, {c})");
        }
    }
    // The same block, masked into a wider tile, then stored spanning y's
    // shards; loading y's block back gives x's values.
    let m = tl.load_masked(Block::of(x, tl.pe(), 10, 2, 12, 8), 16, 8, -1.0);
    assert_eq!((m.get(11, 7), m.get(12, 0)), (((21 * 16) + 9) as f64, -1.0));
    tl.store_masked(Block::of(y, tl.pe(), 10, 2, 12, 8), &m);
    let back = tl.load(Block::of(y, tl.pe(), 10, 2, 12, 8));
    assert_eq!(back.to_f64(), t.to_f64());
    // Async: the parts are in flight together.
    let h = tl.load_async(Block::of(x, tl.pe(), 40, 0, 20, 16));
    let t = tl.wait(h);
    assert_eq!(
        (t.get(0, 0), t.get(19, 15)),
        ((40 * 16) as f64, (59 * 16 + 15) as f64)
    );
}

#[test]
fn a_block_spanning_shards_is_one_dma_per_part_assembled_in_one_tile() {
    let (bytes, report) = sim("small", spanning_load, 64).unwrap();
    assert_eq!(report.stats.races, 0);
    let recs = common::named_records(&bytes);
    let dmas: Vec<_> = recs
        .iter()
        .filter(|(r, _, n)| n.starts_with("dma_") && matches!(r.params, OpParams::Memory(_)))
        .map(|(r, _, n)| match &r.params {
            OpParams::Memory(m) => (n.clone(), m.rows, m.row_bytes, r.t_start, r.t_end),
            _ => unreachable!(),
        })
        .collect();
    let shapes: Vec<_> = dmas.iter().map(|d| (d.0.as_str(), d.1, d.2)).collect();
    assert_eq!(
        shapes,
        [
            // load: own shard rows 10..16, PE 1's rows 16..22, 8 cols
            ("dma_read", 6, 32),
            ("dma_read", 6, 32),
            // load_masked (the fill is a math op)
            ("dma_read", 6, 32),
            ("dma_read", 6, 32),
            // store_masked
            ("dma_write", 6, 32),
            ("dma_write", 6, 32),
            // load back
            ("dma_read", 6, 32),
            ("dma_read", 6, 32),
            // async: rows 40..48 (PE 2), 48..60 (PE 3)
            ("dma_read", 8, 64),
            ("dma_read", 12, 64),
        ]
    );
    // The parts of one load are in flight together: the second starts
    // before the first ends.
    assert!(dmas[1].3 < dmas[0].4, "{dmas:?}");
}

/// A block in another PE's shard only: one DMA from there.
fn remote_only(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let x = args.tensor("x");
    let b = Block::of(x, tl.pe(), 48, 0, 4, 16);
    assert_eq!(b.parts().len(), 1);
    let t = tl.load(b);
    assert_eq!(t.get(3, 15), (51 * 16 + 15) as f64);
}

#[test]
fn a_block_in_another_pes_shard_is_one_dma_from_there() {
    let (bytes, _) = sim("small", remote_only, 64).unwrap();
    let n = common::named_records(&bytes)
        .iter()
        .filter(|(_, _, n)| n == "dma_read")
        .count();
    assert_eq!(n, 1);
}

/// PE 0 stores a block spanning its shard and PE 1's while PE 1 loads
/// its own first rows, unordered: the part in PE 1's shard races.
fn spanning_store_races(tl: &mut Tl<'_>, args: &KernelArgs) {
    let y = args.tensor("y");
    match tl.program_id(0) {
        0 => {
            let z = tl.zeros(8, 16, Dtype::F32);
            tl.store(Block::of(y, tl.pe(), 12, 0, 8, 16), &z);
        }
        1 => {
            let _ = tl.load(Block::of(y, tl.pe(), 16, 0, 2, 16));
        }
        _ => {}
    }
}

#[test]
fn the_race_detector_sees_each_part_of_a_split_store() {
    let e = run(
        &config("small", RacePolicy::Error),
        &OneLaunch {
            kernel: spanning_store_races,
            rows: 64,
        },
        Vec::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("race"), "{e}");
    assert!(e.contains("sip0.cube0.pe1"), "{e}");
}

/// Under LA another PE's HBM shard is not addressable at its addresses.
fn la_remote(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) == 0 {
        let x = args.tensor("x");
        let _ = tl.load(Block::of(x, tl.pe(), 0, 0, 40, 16));
    }
}

#[test]
fn under_la_a_block_in_another_pes_shard_is_a_clear_error() {
    let e = sim("la-1to1", la_remote, 64).unwrap_err().to_string();
    let line = line!() - 7;
    for want in [
        format!("{}:{line}", file!()),
        "cannot address under the LA model".into(),
        "of x".into(),
        "row_blocks".into(),
    ] {
        assert!(e.contains(&want), "missing {want:?} in {e}");
    }
}

/// The line of the failing call of the kernel that ran last.
static LINE: AtomicU32 = AtomicU32::new(0);

fn at_next_line(line: u32) {
    LINE.store(line + 1, Ordering::SeqCst);
}

/// Each failure names the kernel's file and line, the op and the tensor.
fn store_shape_mismatch(tl: &mut Tl<'_>, args: &KernelArgs) {
    let y = args.tensor("y");
    let z = tl.zeros(4, 8, Dtype::F32);
    at_next_line(line!());
    tl.store(Block::of(y, tl.pe(), 0, 0, 4, 16), &z);
}

fn dot_mismatch(tl: &mut Tl<'_>, _: &KernelArgs) {
    let a = tl.zeros(4, 8, Dtype::F32);
    let b = tl.zeros(4, 8, Dtype::F32);
    at_next_line(line!());
    let _ = tl.dot(&a, &b, None);
}

fn too_big(tl: &mut Tl<'_>, _: &KernelArgs) {
    at_next_line(line!());
    let _ = tl.zeros(8192, 8192, Dtype::F32);
}

fn hbm_operand(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let b = Block::of(x, tl.pe(), 0, 0, 4, 16).single().unwrap();
    let t = tl.zeros(4, 16, Dtype::F32);
    at_next_line(line!());
    let _ = tl.add(&t, &b);
}

#[test]
fn kernel_errors_name_the_kernel_line_the_op_and_the_tensor() {
    let cases: [(KernelFn, &[&str]); 4] = [
        (
            store_shape_mismatch,
            &["tl.store", "4x16 f32 block of y", "4x8 f32 tile"],
        ),
        (
            dot_mismatch,
            &["tl.dot", "inner dimensions differ: 4x8 @ 4x8"],
        ),
        (
            too_big,
            &["tl.full", "out of TCM allocating a 268435456-byte tile"],
        ),
        (
            hbm_operand,
            &[
                "tl.add",
                "operand 1 (a block of x at",
                "is not in sip0.cube0.pe",
            ],
        ),
    ];
    for (k, wants) in cases {
        let e = sim("small", k, 64).unwrap_err().to_string();
        let at = format!("{}:{}", file!(), LINE.load(Ordering::SeqCst));
        assert!(e.contains(&at), "missing {at:?} in {e}");
        assert!(e.contains("sip0.cube0.pe") && e.contains(" ns"), "{e}");
        for w in wants {
            assert!(e.contains(w), "missing {w:?} in {e}");
        }
    }
}
