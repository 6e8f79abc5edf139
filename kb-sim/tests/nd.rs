//! Tensors of more than 2 dims (issue 34) through the executors: blocks
//! in N-d coordinates load the elements they name and store where they
//! load from; a block of the wrong rank or past a dim is a kernel failure
//! naming the tensor and the kernel's line; bad shapes are refused at
//! declaration, naming the tensor.

use std::sync::Arc;

use kb_format::{Dtype, Meta, TraceWriter, VerifySpec};
use kb_sim::engine::{Engine, SimError};
use kb_sim::kernel::{self, Block, Executor, KernelArgs, KernelFn, Tl};
use kb_sim::machine::Machine;
use kb_sim::program::PeProgram;
use kb_sim::runtime::{Runtime, Sharding};
use kb_sim::topology::Topology;

const DIMS: [u64; 4] = [2, 3, 5, 4];

/// Element (i, j, k, l) of `x`: its row-major index.
fn at(i: u64, j: u64, k: u64, l: u64) -> f64 {
    (((i * 3 + j) * 5 + k) * 4 + l) as f64
}

/// Run `kernel` on every PE of `small` with `x` (2 x 3 x 5 x 4 f32,
/// holding each element's index) and `y` (zeros, the same dims), both
/// row-sharded over the 2-D view 30 x 4.
fn run_kernel(kernel: KernelFn, executor: Executor) -> Result<(), SimError> {
    let m = Machine::build(&Topology::load("small").unwrap());
    let mut rt = Runtime::new(&m);
    let data: Vec<u8> = (0..120).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let x = rt
        .tensor("x", Dtype::F32, DIMS, Some(data), Sharding::ROWS)
        .unwrap();
    let y = rt
        .tensor("y", Dtype::F32, &DIMS[..], None, Sharding::ROWS)
        .unwrap();
    assert_eq!(rt.tensors[x as usize].meta.shape, DIMS.to_vec());
    let args = Arc::new(rt.kernel_args(&[x, y]));
    assert_eq!(args.tensors[0].shape, [30, 4]);
    assert_eq!(args.tensors[0].dims, DIMS.to_vec());
    let pes: Vec<_> = m.pes().collect();
    let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
    for (i, pe) in pes.into_iter().enumerate() {
        let body = kernel::body(kernel, args.clone(), pe, i as u32, 4, rt.take_tcm(pe));
        programs.push(executor.spawn(format!("nd_kernel[{i}]"), body).unwrap());
    }
    let writer = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let (w, _) = Engine::new(&m, writer, &rt.tensors, programs).run()?;
    w.finish(&VerifySpec::default()).unwrap();
    Ok(())
}

/// Program 0 loads blocks in N-d coordinates (spanning shards), checks
/// every element against its index, stores them to `y` and loads them
/// back from there.
fn blocks_round_trip(tl: &mut Tl<'_>, args: &KernelArgs) {
    if tl.program_id(0) != 0 {
        return;
    }
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let pe = tl.pe();
    for (start, sizes) in [
        ([1u64, 1, 2, 1], [1u32, 2, 3, 2]),
        ([0, 0, 0, 0], [2, 3, 5, 4]),
        ([0, 2, 4, 3], [2, 1, 1, 1]),
        ([1, 0, 1, 0], [1, 3, 4, 4]),
    ] {
        let t = tl.load(Block::nd(x, pe, &start, &sizes));
        let rows = sizes[..3].iter().product::<u32>() as usize;
        assert_eq!(t.shape(), (rows, sizes[3] as usize));
        let mut r = 0;
        for i in 0..sizes[0] as u64 {
            for j in 0..sizes[1] as u64 {
                for k in 0..sizes[2] as u64 {
                    for l in 0..sizes[3] as u64 {
                        let want = at(start[0] + i, start[1] + j, start[2] + k, start[3] + l);
                        assert_eq!(t.get(r, l as usize), want, "{start:?} {sizes:?} row {r}");
                    }
                    r += 1;
                }
            }
        }
        tl.store(Block::nd(y, pe, &start, &sizes), &t);
        let back = tl.load(Block::nd(y, pe, &start, &sizes));
        assert_eq!(back.bytes(), t.bytes(), "{start:?} {sizes:?}");
    }
}

#[test]
fn blocks_in_nd_coordinates_load_and_store_the_elements_they_name() {
    for ex in [Executor::Coroutine, Executor::Thread] {
        run_kernel(blocks_round_trip, ex).unwrap();
    }
}

const RANK_LINE: u32 = line!() + 2;
fn wrong_rank(tl: &mut Tl<'_>, args: &KernelArgs) {
    let _ = Block::nd(args.tensor("x"), tl.pe(), &[0, 0, 0], &[1, 1, 4]);
}

const PAST_LINE: u32 = line!() + 3;
fn past_a_dim(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let _ = tl.load(Block::nd(x, tl.pe(), &[1, 2, 3, 0], &[1, 1, 3, 4]));
}

#[test]
fn a_block_of_the_wrong_rank_or_past_a_dim_names_the_tensor_and_line() {
    let e = run_kernel(wrong_rank, Executor::Coroutine)
        .unwrap_err()
        .to_string();
    for want in [
        format!("{}:{RANK_LINE}", file!()),
        "block at [0, 0, 0] of sizes [1, 1, 4] (3 and 3 dims) does not match x (2x3x5x4), which has 4 dims".into(),
        "nd_kernel[".into(),
    ] {
        assert!(e.contains(&want), "missing {want:?} in {e}");
    }
    let e = run_kernel(past_a_dim, Executor::Thread)
        .unwrap_err()
        .to_string();
    for want in [
        format!("{}:{PAST_LINE}", file!()),
        "runs past x (2x3x5x4) in dim 2 (3..+3 of 5)".into(),
    ] {
        assert!(e.contains(&want), "missing {want:?} in {e}");
    }
}

#[test]
fn bad_shapes_are_refused_naming_the_tensor() {
    let m = Machine::build(&Topology::load("small").unwrap());
    let mut rt = Runtime::new(&m);
    let cases: [(Vec<u64>, &str); 5] = [
        (vec![], "at least one dimension"),
        (vec![2, 0, 3], "zero dimension (dim 1)"),
        (vec![1; 7], "7 dimensions, more than the 6"),
        (vec![1 << 40, 1 << 30], "more elements than a u64 counts"),
        (vec![1 << 31, 1 << 31, 2], "more bytes than a u64 counts"),
    ];
    for (shape, want) in cases {
        let e = rt
            .tensor("bad", Dtype::F32, shape.clone(), None, Sharding::ROWS)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("tensor \"bad\": ") && e.contains(want),
            "{shape:?}: {e}"
        );
    }
    // The 2-D view of a 1-D tensor is one row.
    let v = rt
        .tensor("v", Dtype::F32, [9], None, Sharding::ROWS)
        .unwrap();
    assert_eq!(rt.kernel_arg(v).shape, [1, 9]);
    assert_eq!(rt.tensors[v as usize].meta.shape, vec![9]);
}
