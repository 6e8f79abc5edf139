//! A 3-D launch grid end to end (issue 34): a batched matmul whose
//! `tl.program_id(2)` picks the batch runs in kb-sim (in process, as a
//! user's crate would), verifies through the `kb-replay` binary against a
//! reference evaluated in f64 by kb-replay's own evaluator, and the
//! trace's launch record holds the 3-D grid that kb-inspect prints.

use kb_e2e::*;
use kb_format::{Dtype, Expr, MmapTrace};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::run::RunConfig;
use kb_sim::topology::Topology;
use kb_sim::workload::{ParamSpec, Params, Program, Sharding, Workload, WorkloadError};

/// Batches, each an M x K matrix times a K x N one, stacked as rows: A is
/// (BATCH*M) x K, W is (BATCH*K) x N, C is (BATCH*M) x N.
const BATCH: u64 = 3;
const M: u64 = 32;
const K: u64 = 16;
const N: u64 = 24;
const BM: u64 = 16;
const BN: u64 = 8;

/// Program (j, i, b) of a `[N/BN, M/BM, BATCH]` grid: tile (i, j) of
/// batch b's `A_b @ W_b`, wherever the rows live (`W_0` for every batch
/// unless `BATCHED`: a kernel that forgets axis 2's W).
fn bmm<const BATCHED: bool>(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (a, w, c) = (args.tensor("a"), args.tensor("w"), args.tensor("c"));
    let (j, i, b) = (
        tl.program_id(0) as u64,
        tl.program_id(1) as u64,
        tl.program_id(2) as u64,
    );
    let pe = tl.pe();
    let at = tl.load(Block::of(a, pe, b * M + i * BM, 0, BM as u32, K as u32));
    let wb = if BATCHED { b } else { 0 };
    let wt = tl.load(Block::of(w, pe, wb * K, j * BN, K as u32, BN as u32));
    let ct = tl.dot(&at, &wt, None);
    tl.store(
        Block::of(c, pe, b * M + i * BM, j * BN, BM as u32, BN as u32),
        &ct,
    );
}

fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}

/// Which block of `size` an index along `axis` of an `rows x cols` iota
/// is in: the number of block starts `s*size` (s = 1 .. BATCH-1) at or
/// below it.
fn block_of(rows: u64, cols: u64, axis: u8, size: u64) -> Expr {
    let iota = || Box::new(Expr::Iota { rows, cols, axis });
    (1..BATCH)
        .map(|s| Expr::Ge(iota(), Box::new(Expr::Scalar((s * size) as f64))))
        .reduce(|x, y| Expr::Add(Box::new(x), Box::new(y)))
        .unwrap()
}

/// C = blockdiag(A_0, .., A_{B-1}) @ W: A repeated BATCH times across the
/// columns (`Tile` of its transpose), kept where the row's batch is the
/// column's, times W stacked.
fn reference() -> Expr {
    let wide = Expr::Transpose(Box::new(Expr::Tile {
        input: Box::new(Expr::Transpose(t("a"))),
        reps: BATCH,
    }));
    let same_batch = Expr::Eq(
        Box::new(block_of(BATCH * M, 1, 0, M)),
        Box::new(block_of(1, BATCH * K, 1, K)),
    );
    let diag = Expr::Where {
        cond: Box::new(same_batch),
        a: Box::new(wide),
        b: Box::new(Expr::Scalar(0.0)),
    };
    Expr::Matmul(Box::new(diag), t("w"))
}

#[derive(Debug)]
struct BatchedMatmul {
    kernel: kb_sim::kernel::KernelFn,
}

impl Workload for BatchedMatmul {
    fn name(&self) -> &str {
        "bmm"
    }
    fn about(&self) -> &str {
        "batched matmul over a 3-D grid, the batch on axis 2"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let a = prog.random("a", Dtype::F32, [BATCH * M, K], Sharding::ROWS)?;
        let w = prog.random("w", Dtype::F32, [BATCH * K, N], Sharding::ROWS)?;
        let c = prog.zeros("c", Dtype::F32, [BATCH * M, N], Sharding::ROWS)?;
        let args = prog.args(&[a, w, c]);
        let grid = [(N / BN) as u32, (M / BM) as u32, BATCH as u32];
        let pes = prog.pes();
        prog.launch_grid("bmm", self.kernel, args, grid, &pes)?;
        prog.verify(c, reference(), None);
        Ok(())
    }
}

fn simulate(dir: &std::path::Path, w: BatchedMatmul) -> std::path::PathBuf {
    let cfg = RunConfig {
        topology: Topology::load("small").unwrap(),
        params: Vec::new(),
        seed: 7,
        inputs: Default::default(),
        executor: Default::default(),
        capture_inputs: false,
        races: Default::default(),
        command_line: Vec::new(),
        max_memory: None,
    };
    let (bytes, _) = kb_sim::run::run(&cfg, &w, Vec::new()).unwrap();
    let path = dir.join("bmm.kbt");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_batched_matmul_over_a_3d_grid_verifies_and_inspect_shows_the_grid() {
    let dir = tempfile::tempdir().unwrap();
    let trace = simulate(
        dir.path(),
        BatchedMatmul {
            kernel: bmm::<true>,
        },
    );
    let p = trace.to_str().unwrap();
    let out = run("kb-replay", &[p, "--verify"], b"");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    // The launch record: 3 x 2 x 3 programs, each a 16x16 @ 16x8 dot
    // (2*16*8*16 FLOPs), all of them on data.
    let tr = MmapTrace::open(&trace).unwrap();
    let l = &tr.launches()[0];
    assert_eq!(l.grid, [3, 2, 3]);
    let want = 18 * 2 * BM * BN * K;
    assert_eq!((l.flops, l.useful_flops), (want, want), "{l:?}");

    let text = run("kb-inspect", &["summary", p], b"");
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("  #0 bmm  grid 3 x 2 x 3 on "), "{text}");
    let json = run("kb-inspect", &["summary", p, "--format", "json"], b"");
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).expect("summary JSON");
    assert_eq!(j["launches"][0]["grid"], serde_json::json!([3, 2, 3]));
}

/// A kernel that reads batch 0's W for every batch fails verification:
/// the reference tells the batches apart, so the test above would catch a
/// `program_id(2)` that picked the wrong batch.
#[test]
fn a_kernel_that_ignores_axis_2_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let trace = simulate(
        dir.path(),
        BatchedMatmul {
            kernel: bmm::<false>,
        },
    );
    let out = run("kb-replay", &[trace.to_str().unwrap(), "--verify"], b"");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verification FAILED (1 of 1 outputs)"),
        "{text}"
    );
}
