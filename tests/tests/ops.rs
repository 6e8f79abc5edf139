//! The second round of `tl` ops and reference expressions (issue 34),
//! end to end: kernels written against the `tl` API run in kb-sim (in
//! process, as a user's crate would through `kb_sim::cli`), and the
//! trace verifies through the `kb-replay` binary against references
//! evaluated in f64 by kb-replay's own evaluator. A causal softmax whose
//! reference needs no index tensor; a verify spec with a bad name or shape
//! is refused when the program is built.

use kb_e2e::*;
use kb_format::{Dtype, Expr, MmapTrace};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::run::{RunConfig, RunError, run};
use kb_sim::topology::Topology;
use kb_sim::workload::{ParamSpec, Params, Placement, Policy, Program, Workload, WorkloadError};

fn config() -> RunConfig {
    RunConfig {
        topology: Topology::load("small").unwrap(),
        params: Vec::new(),
        seed: 7,
        inputs: Default::default(),
        executor: Default::default(),
        capture_inputs: false,
        races: Default::default(),
        command_line: Vec::new(),
        max_memory: None,
    }
}

/// Simulate `w` into a trace file in `dir`; the run's error otherwise.
fn simulate(w: &dyn Workload, dir: &std::path::Path) -> Result<std::path::PathBuf, RunError> {
    let (bytes, _) = run(&config(), w, Vec::new())?;
    let path = dir.join(format!("{}.kbt", w.name()));
    std::fs::write(&path, bytes).unwrap();
    Ok(path)
}

/// `kb-replay TRACE --verify` passes (exit 0).
fn assert_verifies(trace: &std::path::Path) {
    let out = run_bin("kb-replay", &[trace.to_str().unwrap(), "--verify"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

fn run_bin(name: &str, args: &[&str]) -> std::process::Output {
    kb_e2e::run(name, args, b"")
}

fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}
fn s(v: f64) -> Box<Expr> {
    Box::new(Expr::Scalar(v))
}
fn b(e: Expr) -> Box<Expr> {
    Box::new(e)
}

const R: u32 = 8;
const C: u32 = 16;
const SEED: u64 = 0x1234_5678_9abc_def0;

/// Every new op on one PE: x and y are 8 x 16 f32 in [-1, 1), `offs` i32
/// offsets, each output a tensor of its own.
fn zoo(tl: &mut Tl<'_>, args: &KernelArgs) {
    let pe = tl.pe();
    let whole = |name: &str, rows: u32, cols: u32| {
        let a = args.tensor(name);
        Block::in_shard(a, a.shard(pe).unwrap(), 0, 0, rows, cols)
    };
    let x = tl.load(whole("x", R, C));
    let y = tl.load(whole("y", R, C));
    // Masks.
    let mx = tl.gt(&x, 0.0);
    let my = tl.lt(&y, 0.25);
    let and = tl.and(&mx, &my);
    tl.store(whole("and", R, C), &and);
    let or = tl.or(&mx, &my);
    tl.store(whole("or", R, C), &or);
    let xor = tl.xor(&mx, &my);
    tl.store(whole("xor", R, C), &xor);
    let not = tl.not(&mx);
    tl.store(whole("not", R, C), &not);
    // Shapes.
    let tr = tl.transpose(&x);
    tl.store(whole("transpose", C, R), &tr);
    let rs = tl.reshape(&x, 4, 32);
    tl.store(whole("reshape", 4, 32), &rs);
    let sl = tl.slice(&x, 2, 3, 4, 5);
    tl.store(whole("slice", 4, 5), &sl);
    let c0 = tl.concat(&x, &y, 0);
    tl.store(whole("concat0", 2 * R, C), &c0);
    let c1 = tl.concat(&x, &y, 1);
    tl.store(whole("concat1", R, 2 * C), &c1);
    // Scans.
    let cs = tl.cumsum(&x, 1);
    tl.store(whole("cumsum", R, C), &cs);
    let cp = tl.cumprod(&x, 0);
    tl.store(whole("cumprod", R, C), &cp);
    let cm = tl.cummax(&x, 1);
    tl.store(whole("cummax", R, C), &cm);
    // Full reductions.
    let sa = tl.sum_all(&x);
    tl.store(whole("sum_all", 1, 1), &sa);
    let xa = tl.max_all(&x);
    tl.store(whole("max_all", 1, 1), &xa);
    let na = tl.min_all(&x);
    tl.store(whole("min_all", 1, 1), &na);
    let ma = tl.mean_all(&x);
    tl.store(whole("mean_all", 1, 1), &ma);
    // Math.
    let ax = tl.abs(&x);
    let pos = tl.add(&ax, 0.5);
    let pw = tl.pow(&pos, &y);
    tl.store(whole("pow", R, C), &pw);
    let l2 = tl.log2(&pos);
    tl.store(whole("log2", R, C), &l2);
    let sn = tl.sin(&x);
    tl.store(whole("sin", R, C), &sn);
    let cn = tl.cos(&x);
    tl.store(whole("cos", R, C), &cn);
    let x4 = tl.mul(&x, 4.0);
    let fl = tl.floor(&x4);
    tl.store(whole("floor", R, C), &fl);
    let ce = tl.ceil(&x4);
    tl.store(whole("ceil", R, C), &ce);
    let rm = tl.rem(&x, 0.375);
    tl.store(whole("rem", R, C), &rm);
    let cl = tl.clamp(&x, -0.5, &y);
    tl.store(whole("clamp", R, C), &cl);
    // rand: offsets Phase 1 knows (loaded), and offsets computed on the
    // device (row * C + col), known only in Phase 2.
    let offs = tl.load(whole("offs", R, C));
    let r1 = tl.rand(SEED, &offs);
    tl.store(whole("rand_loaded", R, C), &r1);
    // Phase 1 knows these values (a store is visible at issue): loading
    // them back and reading them works, and they are in [0, 1). Replay
    // checks the store's fingerprint against its own bits.
    let back = tl.load(whole("rand_loaded", R, C));
    let v = back.to_f64();
    assert!(v.iter().all(|u| (0.0..1.0).contains(u)), "{v:?}");
    let rows = tl.arange(R, C, 0, Dtype::I32);
    let cols = tl.arange(R, C, 1, Dtype::I32);
    let rc = tl.mul(&rows, C as f64);
    let lin = tl.add(&rc, &cols);
    let r2 = tl.rand(SEED, &lin);
    tl.store(whole("rand_computed", R, C), &r2);
    // A reference-only host tensor: the kernel scales by column + 1,
    // the reference multiplies by a row of those values that never
    // reaches the device.
    let fcols = tl.arange(R, C, 1, Dtype::F32);
    let w = tl.add(&fcols, 1.0);
    let scaled = tl.mul(&x, &w);
    tl.store(whole("scaled", R, C), &scaled);
}

/// `wrong`: verify the kernel's axis-1 cumsum against an axis-0 one.
#[derive(Debug)]
struct Zoo {
    wrong: bool,
}

impl Workload for Zoo {
    fn name(&self) -> &str {
        "ops_zoo"
    }
    fn about(&self) -> &str {
        "every op of issue 34 on one PE"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let pe0 = prog.pes()[0];
        let on = || Placement::over(&[pe0], Policy::Replicate);
        let f = Dtype::F32;
        let x = prog.random("x", f, [R as u64, C as u64], on())?;
        let y = prog.random("y", f, [R as u64, C as u64], on())?;
        // Offsets with a negative one and large ones (taken mod 2^32).
        let offs: Vec<u8> = (0..R * C)
            .map(|i| (i as i32).wrapping_mul(-7_919) ^ 0x4000_0000)
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let offs = prog.data("offs", Dtype::I32, [R as u64, C as u64], offs, on())?;
        let w: Vec<u8> = (1..=C).flat_map(|v| (v as f32).to_le_bytes()).collect();
        prog.data("w", f, [1, C as u64], w, Placement::host_only())?;
        let mut names = vec![("x", x), ("y", y), ("offs", offs)];
        let mut outs = Vec::new();
        let (r, c) = (R as u64, C as u64);
        let shaped: [(&'static str, Dtype, [u64; 2], Expr); 29] = {
            let gt = || b(Expr::Gt(t("x"), s(0.0)));
            let lt = || b(Expr::Lt(t("y"), s(0.25)));
            let pos = || b(Expr::Add(b(Expr::Abs(t("x"))), s(0.5)));
            let x4 = || b(Expr::Mul(t("x"), s(4.0)));
            let lin = b(Expr::Add(
                b(Expr::Mul(
                    b(Expr::Iota {
                        rows: r,
                        cols: 1,
                        axis: 0,
                    }),
                    s(c as f64),
                )),
                b(Expr::Iota {
                    rows: 1,
                    cols: c,
                    axis: 1,
                }),
            ));
            let u8 = Dtype::U8;
            [
                ("and", u8, [r, c], Expr::And(gt(), lt())),
                ("or", u8, [r, c], Expr::Or(gt(), lt())),
                ("xor", u8, [r, c], Expr::Xor(gt(), lt())),
                ("not", u8, [r, c], Expr::Not(gt())),
                ("transpose", f, [c, r], Expr::Transpose(t("x"))),
                (
                    "reshape",
                    f,
                    [4, 32],
                    Expr::Reshape {
                        input: t("x"),
                        rows: 4,
                        cols: 32,
                    },
                ),
                (
                    "slice",
                    f,
                    [4, 5],
                    Expr::Slice {
                        input: t("x"),
                        row: 2,
                        col: 3,
                        rows: 4,
                        cols: 5,
                    },
                ),
                (
                    "concat0",
                    f,
                    [2 * r, c],
                    Expr::Concat {
                        a: t("x"),
                        b: t("y"),
                        axis: 0,
                    },
                ),
                (
                    "concat1",
                    f,
                    [r, 2 * c],
                    Expr::Concat {
                        a: t("x"),
                        b: t("y"),
                        axis: 1,
                    },
                ),
                (
                    "cumsum",
                    f,
                    [r, c],
                    Expr::Cumsum {
                        input: t("x"),
                        axis: if self.wrong { 0 } else { 1 },
                    },
                ),
                (
                    "cumprod",
                    f,
                    [r, c],
                    Expr::Cumprod {
                        input: t("x"),
                        axis: 0,
                    },
                ),
                (
                    "cummax",
                    f,
                    [r, c],
                    Expr::Cummax {
                        input: t("x"),
                        axis: 1,
                    },
                ),
                (
                    "sum_all",
                    f,
                    [1, 1],
                    Expr::Sum {
                        input: b(Expr::Sum {
                            input: t("x"),
                            axis: 1,
                        }),
                        axis: 0,
                    },
                ),
                (
                    "max_all",
                    f,
                    [1, 1],
                    Expr::Max {
                        input: b(Expr::Max {
                            input: t("x"),
                            axis: 0,
                        }),
                        axis: 1,
                    },
                ),
                (
                    "min_all",
                    f,
                    [1, 1],
                    Expr::Min {
                        input: b(Expr::Min {
                            input: t("x"),
                            axis: 0,
                        }),
                        axis: 1,
                    },
                ),
                (
                    "mean_all",
                    f,
                    [1, 1],
                    Expr::Div(
                        b(Expr::Sum {
                            input: b(Expr::Sum {
                                input: t("x"),
                                axis: 0,
                            }),
                            axis: 1,
                        }),
                        s((r * c) as f64),
                    ),
                ),
                ("pow", f, [r, c], Expr::Pow(pos(), t("y"))),
                ("log2", f, [r, c], Expr::Log2(pos())),
                ("sin", f, [r, c], Expr::Sin(t("x"))),
                ("cos", f, [r, c], Expr::Cos(t("x"))),
                ("floor", f, [r, c], Expr::Floor(x4())),
                ("ceil", f, [r, c], Expr::Ceil(x4())),
                ("rem", f, [r, c], Expr::Rem(t("x"), s(0.375))),
                (
                    "clamp",
                    f,
                    [r, c],
                    Expr::Clamp {
                        input: t("x"),
                        lo: s(-0.5),
                        hi: t("y"),
                    },
                ),
                (
                    "rand_loaded",
                    f,
                    [r, c],
                    Expr::Rand {
                        seed: SEED,
                        offsets: t("offs"),
                    },
                ),
                (
                    "rand_computed",
                    f,
                    [r, c],
                    Expr::Rand {
                        seed: SEED,
                        offsets: lin,
                    },
                ),
                ("scaled", f, [r, c], Expr::Mul(t("x"), t("w"))),
                // Tril/triu of the same values the scan saw, as extra
                // checks of the positional expressions (outputs computed
                // by a where over device-made indices).
                (
                    "tril",
                    f,
                    [r, c],
                    Expr::Tril {
                        input: t("x"),
                        diagonal: 2,
                    },
                ),
                (
                    "triu",
                    f,
                    [r, c],
                    Expr::Triu {
                        input: t("x"),
                        diagonal: -1,
                    },
                ),
            ]
        };
        for (name, dtype, shape, reference) in shaped {
            let id = prog.zeros(name, dtype, shape, on())?;
            names.push((name, id));
            outs.push((id, reference));
        }
        let args = prog.bind(&names);
        prog.launch_grid("zoo", zoo, args.clone(), [1, 1], &[pe0])?;
        prog.launch_grid("bands", bands, args, [1, 1], &[pe0])?;
        for (id, reference) in outs {
            prog.verify(id, reference, None);
        }
        Ok(())
    }
}

/// tril(x, 2) and triu(x, -1) through device-made indices: a where over
/// `col - row <= 2` (`>= -1`), with no index tensor.
fn bands(tl: &mut Tl<'_>, args: &KernelArgs) {
    let pe = tl.pe();
    let whole = |name: &str| {
        let a = args.tensor(name);
        Block::in_shard(a, a.shard(pe).unwrap(), 0, 0, R, C)
    };
    let x = tl.load(whole("x"));
    let rows = tl.arange(R, C, 0, Dtype::F32);
    let cols = tl.arange(R, C, 1, Dtype::F32);
    let d = tl.sub(&cols, &rows);
    let lower = tl.le(&d, 2.0);
    let upper = tl.ge(&d, -1.0);
    let tril = tl.where_(&lower, &x, 0.0);
    tl.store(whole("tril"), &tril);
    let triu = tl.where_(&upper, &x, 0.0);
    tl.store(whole("triu"), &triu);
}

#[test]
fn every_new_op_verifies_through_kb_replay() {
    let dir = tempfile::tempdir().unwrap();
    let trace = simulate(&Zoo { wrong: false }, dir.path()).unwrap();
    assert_verifies(&trace);
    // The reference-only tensor is in the trace with its data and no
    // shards: it never reached the device.
    let tr = MmapTrace::open(&trace).unwrap();
    let (_, w) = tr.meta().tensor("w").expect("w in the trace");
    assert!(w.host_data && w.shards.is_empty(), "{w:?}");
    // Determinism: the same run gives the same bytes.
    let again = run(&config(), &Zoo { wrong: false }, Vec::new()).unwrap().0;
    assert_eq!(std::fs::read(&trace).unwrap(), again);
}

/// A reference that does not match what the kernel computed fails the
/// verification: the test above is not vacuous.
#[test]
fn a_wrong_reference_for_a_new_op_fails() {
    let dir = tempfile::tempdir().unwrap();
    let trace = simulate(&Zoo { wrong: true }, dir.path()).unwrap();
    let out = run_bin("kb-replay", &[trace.to_str().unwrap(), "--verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

/// Causal softmax over row blocks: each block of rows computes only the
/// columns up to its last row (the rest of its output stays zero, as
/// the output tensor starts), masking the diagonal tile with a where
/// over device-made indices. The reference is
/// `softmax(where(iota_col <= iota_row, x, -inf))`: no index tensor.
fn causal_softmax(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, out) = (args.tensor("x"), args.tensor("out"));
    let block = args.get("block_rows") as u32;
    let i = tl.program_id(0);
    let (sx, so) = (&x.shards[0], &out.shards[0]);
    let rows = sx.rows as u32;
    let r0 = i * block;
    if r0 >= rows {
        return;
    }
    let n = block.min(rows - r0);
    let width = r0 + n; // columns 0..=last row
    let xt = tl.load(Block::in_shard(x, sx, r0 as u64, 0, n, width));
    let col = tl.arange(n, width, 1, Dtype::I32);
    let row = tl.arange(n, width, 0, Dtype::I32);
    let row = tl.add(&row, r0 as f64);
    let keep = tl.le(&col, &row);
    let masked = tl.where_(&keep, &xt, f64::NEG_INFINITY);
    let m = tl.reduce_max(&masked, 1);
    let d = tl.sub(&masked, &m);
    let e = tl.exp(&d);
    let sum = tl.sum(&e, 1);
    let p = tl.div(&e, &sum);
    tl.store(Block::in_shard(out, so, r0 as u64, 0, n, width), &p);
}

#[derive(Debug)]
struct CausalSoftmax {
    rows: u64,
    bad_reference: Option<Expr>,
}

fn causal_reference(rows: u64) -> Expr {
    let keep = Expr::Le(
        b(Expr::Iota {
            rows: 1,
            cols: rows,
            axis: 1,
        }),
        b(Expr::Iota {
            rows,
            cols: 1,
            axis: 0,
        }),
    );
    Expr::Softmax {
        input: b(Expr::Where {
            cond: b(keep),
            a: t("x"),
            b: s(f64::NEG_INFINITY),
        }),
        axis: 1,
    }
}

impl Workload for CausalSoftmax {
    fn name(&self) -> &str {
        "causal_softmax"
    }
    fn about(&self) -> &str {
        "softmax(x + causal mask) over row blocks"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let n = self.rows;
        let pes = prog.pes();
        let on = Placement::over(&pes[..1], Policy::Replicate);
        let x = prog.random("x", Dtype::F32, [n, n], on.clone())?;
        let out = prog.zeros("out", Dtype::F32, [n, n], on)?;
        let block = 16u64;
        let args = prog
            .bind(&[("x", x), ("out", out)])
            .scalar("block_rows", block);
        let grid = n.div_ceil(block) as u32;
        prog.launch_grid("causal_softmax", causal_softmax, args, [grid, 1], &pes[..1])?;
        let reference = self
            .bad_reference
            .clone()
            .unwrap_or_else(|| causal_reference(n));
        prog.verify(out, reference, None);
        Ok(())
    }
}

#[test]
fn causal_softmax_verifies_with_a_positional_reference() {
    let dir = tempfile::tempdir().unwrap();
    let w = CausalSoftmax {
        rows: 72,
        bad_reference: None,
    };
    let trace = simulate(&w, dir.path()).unwrap();
    assert_verifies(&trace);
    // No index tensor: the trace's tensors are x and out.
    let tr = MmapTrace::open(&trace).unwrap();
    let names: Vec<&str> = tr.meta().tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["x", "out"]);
    // Blocks above the diagonal are never computed: per block of n rows
    // and width columns, 8 elementwise ops of n x width (two aranges,
    // add, le, where, sub, exp, div) and two reductions of n; blocks of
    // 16 rows, widths 16 to 64, then 8 rows of 72.
    let blocks = [(16u64, 16u64), (16, 32), (16, 48), (16, 64), (8, 72)];
    let want: u64 = blocks.iter().map(|&(n, w)| 8 * n * w + 2 * n).sum();
    let launch = &tr.launches()[0];
    assert_eq!(
        (launch.flops, launch.useful_flops),
        (want, want),
        "{launch:?}"
    );
}

#[test]
fn a_bad_reference_is_refused_when_the_program_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let err = |reference: Expr| {
        let w = CausalSoftmax {
            rows: 32,
            bad_reference: Some(reference),
        };
        match simulate(&w, dir.path()) {
            Err(RunError::Workload(e)) => e.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    };
    // A misspelled name: named, with the names there are.
    let e = err(Expr::Exp(t("xx")));
    assert!(e.contains("\"xx\"") && e.contains("x, out"), "{e}");
    assert!(e.contains("output \"out\""), "{e}");
    // A tensor with no host data.
    let e = err(Expr::Exp(t("out")));
    assert!(e.contains("\"out\" has no host data"), "{e}");
    // Shapes that do not broadcast, and a result of the wrong shape.
    let e = err(Expr::Add(
        t("x"),
        b(Expr::Iota {
            rows: 3,
            cols: 32,
            axis: 0,
        }),
    ));
    assert!(e.contains("32 x 32 and 3 x 32"), "{e}");
    let e = err(Expr::Sum {
        input: t("x"),
        axis: 0,
    });
    assert!(e.contains("it is 1 x 32, but the output is 32 x 32"), "{e}");
    // Nothing was written.
    assert!(!dir.path().join("causal_softmax.kbt").exists());
}

/// Bad shapes and axes in the new ops are kernel errors naming the op and
/// the shapes, not panics of the simulator.
#[test]
fn bad_shapes_in_the_new_ops_are_kernel_errors() {
    #[derive(Debug)]
    struct Bad(kb_sim::kernel::KernelFn);
    impl Workload for Bad {
        fn name(&self) -> &str {
            "bad"
        }
        fn about(&self) -> &str {
            ""
        }
        fn params(&self) -> &[ParamSpec] {
            &[]
        }
        fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
            let pe0 = prog.pes()[0];
            let on = Placement::over(&[pe0], Policy::Replicate);
            let x = prog.random("x", Dtype::F32, [R as u64, C as u64], on)?;
            let args = prog.bind(&[("x", x)]);
            prog.launch_grid("bad", self.0, args, [1, 1], &[pe0])?;
            Ok(())
        }
    }
    fn x(tl: &mut Tl<'_>, args: &KernelArgs) -> kb_sim::kernel::Tile {
        let a = args.tensor("x");
        tl.load(Block::in_shard(a, a.shard(tl.pe()).unwrap(), 0, 0, R, C))
    }
    let cases: [(kb_sim::kernel::KernelFn, &str); 5] = [
        (
            |tl, a| {
                let t = x(tl, a);
                tl.slice(&t, 6, 0, 4, 5);
            },
            "slice: a 4x5 block at (6, 0) is not within the 8x16 tile",
        ),
        (
            |tl, a| {
                let t = x(tl, a);
                tl.reshape(&t, 5, 5);
            },
            "reshape: a 8x16 tile has 128 elements, not 5x5",
        ),
        (
            |tl, a| {
                let t = x(tl, a);
                let u = tl.transpose(&t);
                tl.concat(&t, &u, 0);
            },
            "concat along axis 0: widths differ (8x16 and 16x8)",
        ),
        (
            |tl, a| {
                let t = x(tl, a);
                tl.cumsum(&t, 2);
            },
            "cumsum: axis 2 of a 2-D tile",
        ),
        (
            |tl, a| {
                let t = x(tl, a);
                tl.rand(1, &t);
            },
            "rand: offsets must be an integer tile, not f32",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (kernel, want) in cases {
        match simulate(&Bad(kernel), dir.path()) {
            Err(RunError::Sim(e)) => {
                let e = e.to_string();
                assert!(e.contains(want) && e.contains("kernel bad"), "{e}");
            }
            other => panic!("{want}: {other:?}"),
        }
    }
}
