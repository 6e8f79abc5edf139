//! A kernel crate outside kb's workspace, built from the `Cargo.toml` that
//! docs/writing-kernels.md gives ("A crate of your own"): the guide is what
//! is tested. The crate is written to a temporary directory outside the
//! workspace, its dependency paths pointed at this checkout, kb's
//! `Cargo.lock` copied beside it, and built with `cargo --offline` (nothing
//! is downloaded). Its kernel then runs through its own kb-sim command line
//! and `kb-replay --verify`, which must print PASS on stdout. A second
//! target of the same crate reads a compute result (`Pending::get`) and
//! must fail to compile with kb's own message at its line.
//!
//! Cost: the crate's build shares this workspace's target directory, so
//! the registry dependencies (compiled for the workspace with the same
//! profile) are reused; kb-format, kb-sim and kb-workloads compile again
//! (as path dependencies of another root they are other units), at
//! opt-level 0 here to keep that short. The test prints the times.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kb_e2e::{bin, run};

/// The workspace root (this crate is `tests/` in it).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The guide's out-of-tree `Cargo.toml`: its one `toml` block.
fn guide_manifest() -> String {
    let p = workspace().join("docs/writing-kernels.md");
    let doc = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut blocks = Vec::new();
    let mut cur: Option<String> = None;
    for line in doc.lines() {
        match (line.trim(), cur.as_mut()) {
            ("```toml", None) => cur = Some(String::new()),
            ("```", Some(_)) => blocks.extend(cur.take()),
            (_, Some(b)) => {
                b.push_str(line);
                b.push('\n');
            }
            _ => {}
        }
    }
    assert_eq!(blocks.len(), 1, "the guide should have one toml block");
    blocks.remove(0)
}

const LIB: &str = r#"//! The out-of-tree test's workloads: y = a * x; a Triton-style rmsnorm
//! over a 1-D grid of row blocks in tensor coordinates; a causal softmax
//! whose reference says "causal" with positions, not index tensors.
use kb_format::{Dtype, Expr};
use kb_sim::kernel::{Block, KernelArgs, Tl};
use kb_sim::workload::{
    ParamSpec, Params, Placement, Policy, Program, Sharding, Workload, WorkloadError,
};

fn t(name: &str) -> Box<Expr> {
    Box::new(Expr::Tensor(name.into()))
}

#[derive(Debug)]
pub struct Scale;

fn scale(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let a = args.get_f64("a");
    let (Some(sx), Some(sy)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (sx.row_bytes / x.elem_bytes()) as u32;
    let mut r = 0;
    while r < sx.rows {
        let n = 4.min(sx.rows - r) as u32;
        let xt = tl.load(Block::in_shard(x, sx, r, 0, n, cols));
        let ax = tl.mul(&xt, a);
        tl.store(Block::in_shard(y, sy, r, 0, n, cols), &ax);
        r += n as u64;
    }
}

impl Workload for Scale {
    fn name(&self) -> &str {
        "oot_scale"
    }
    fn about(&self) -> &str {
        "y = a * x, from a crate outside kb's workspace"
    }
    fn params(&self) -> &[ParamSpec] {
        &[ParamSpec { name: "a", default: "1.5", help: "the scale" }]
    }
    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let a = p.f64("a")?;
        let x = prog.random("x", Dtype::F32, [64, 16], Sharding::ROWS)?;
        let y = prog.zeros("y", Dtype::F32, [64, 16], Sharding::ROWS)?;
        let args = prog.bind(&[("x", x), ("y", y)]).float("a", a);
        prog.launch("scale", scale, args);
        let reference = Expr::Mul(Box::new(Expr::Scalar(a)), Box::new(Expr::Tensor("x".into())));
        prog.verify(y, reference, None);
        Ok(())
    }
}

/// Program i normalises rows [64 i, 64 i + 64) of x wherever they live.
fn rmsnorm(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, w, y) = (args.tensor("x"), args.tensor("w"), args.tensor("y"));
    let (rows, cols) = (x.shape[0], x.shape[1] as u32);
    let r0 = tl.program_id(0) as u64 * 64;
    let n = 64.min(rows - r0) as u32;
    let pe = tl.pe();
    let wt = tl.load(Block::of(w, pe, 0, 0, 1, cols));
    let xt = tl.load(Block::of(x, pe, r0, 0, n, cols));
    let sq = tl.mul(&xt, &xt);
    let ms = tl.mean(&sq, 1);
    let ms = tl.add(&ms, 1e-6);
    let inv = tl.rsqrt(&ms);
    let normed = tl.mul(&xt, &inv);
    let out = tl.mul(&normed, &wt);
    tl.store(Block::of(y, pe, r0, 0, n, cols), &out);
}

#[derive(Debug)]
pub struct Rmsnorm;

impl Workload for Rmsnorm {
    fn name(&self) -> &str {
        "oot_rmsnorm"
    }
    fn about(&self) -> &str {
        "rmsnorm over a 1-D grid of 64-row blocks in tensor coordinates"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let x = prog.random("x", Dtype::F32, [300, 700], Sharding::ROWS)?;
        let w = prog.random("w", Dtype::F32, [1, 700], Sharding::REPLICATE)?;
        let y = prog.zeros("y", Dtype::F32, [300, 700], Sharding::ROWS)?;
        let args = prog.bind(&[("x", x), ("w", w), ("y", y)]);
        let pes = prog.pes();
        prog.launch_grid("rmsnorm", rmsnorm, args, [300u32.div_ceil(64), 1], &pes)?;
        let mean_sq = Expr::Mean { input: Box::new(Expr::Mul(t("x"), t("x"))), axis: 1 };
        let inv = Expr::Rsqrt(Box::new(Expr::Add(Box::new(mean_sq), Box::new(Expr::Scalar(1e-6)))));
        prog.verify(y, Expr::Mul(Box::new(Expr::Mul(t("x"), Box::new(inv))), t("w")), None);
        Ok(())
    }
}

/// Rows [16 i, 16 i + 16): softmax of columns up to the row, the rest 0.
fn causal_softmax(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, out) = (args.tensor("x"), args.tensor("out"));
    let (sx, so) = (&x.shards[0], &out.shards[0]);
    let r0 = tl.program_id(0) * 16;
    let n = 16.min(sx.rows as u32 - r0);
    let width = r0 + n;
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
pub struct CausalSoftmax;

impl Workload for CausalSoftmax {
    fn name(&self) -> &str {
        "oot_causal_softmax"
    }
    fn about(&self) -> &str {
        "softmax of x under a causal mask, 72 x 72, the reference by positions"
    }
    fn params(&self) -> &[ParamSpec] {
        &[]
    }
    fn build(&self, _: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError> {
        let pes = prog.pes();
        let on = Placement::over(&pes[..1], Policy::Replicate);
        let x = prog.random("x", Dtype::F32, [72, 72], on.clone())?;
        let out = prog.zeros("out", Dtype::F32, [72, 72], on)?;
        let args = prog.bind(&[("x", x), ("out", out)]);
        prog.launch_grid("causal_softmax", causal_softmax, args, [72u32.div_ceil(16), 1], &pes[..1])?;
        let col = Expr::Iota { rows: 1, cols: 72, axis: 1 };
        let row = Expr::Iota { rows: 72, cols: 1, axis: 0 };
        let keep = Expr::Le(Box::new(col), Box::new(row));
        let masked = Expr::Where {
            cond: Box::new(keep),
            a: t("x"),
            b: Box::new(Expr::Scalar(f64::NEG_INFINITY)),
        };
        prog.verify(out, Expr::Softmax { input: Box::new(masked), axis: 1 }, None);
        Ok(())
    }
}
"#;

const MAIN: &str = r#"fn main() -> std::process::ExitCode {
    kb_sim::cli::main(vec![
        Box::new(oot_kernels::Scale),
        Box::new(oot_kernels::Rmsnorm),
        Box::new(oot_kernels::CausalSoftmax),
    ])
}
"#;

/// Reads a compute result in a kernel: must not compile. The `get` call
/// is on line 8.
const READS_PENDING: &str = r#"use kb_sim::kernel::{Block, KernelArgs, Tl};

fn peek(tl: &mut Tl<'_>, args: &KernelArgs) {
    let x = args.tensor("x");
    let sx = x.shard(tl.pe()).unwrap();
    let xt = tl.load(Block::in_shard(x, sx, 0, 0, 1, 1));
    let y = tl.exp(&xt);
    if y.get(0, 0) > 0.0 {
        return;
    }
}

fn main() {
    let _ = peek as fn(&mut Tl<'_>, &KernelArgs);
}
"#;

/// `cargo` run in `dir` offline, sharing the workspace's target directory.
fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let target = bin("kb-sim")
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args)
        .args(["--offline", "--quiet"])
        // kb's crates are compiled anew for this root: unoptimised, as in
        // the workspace, to keep the test short (the guide's
        // `[profile.dev.package."*"]` would optimise them).
        .args([
            "--config",
            "profile.dev.package.kb-sim.opt-level=0",
            "--config",
            "profile.dev.package.kb-format.opt-level=0",
            "--config",
            "profile.dev.package.kb-workloads.opt-level=0",
        ])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("CARGO_MANIFEST_DIR");
    cmd.output().expect("running cargo")
}

#[test]
fn a_crate_from_the_guides_cargo_toml_builds_offline_and_verifies() {
    let root = workspace();
    let manifest = guide_manifest();
    // The guide says how to point at a clone: paths under `../kb`.
    for krate in ["kb-sim", "kb-format", "kb-workloads"] {
        let dep = format!("{krate} = {{ path = \"../kb/{krate}\" }}");
        assert!(manifest.contains(&dep), "{dep} missing from:\n{manifest}");
    }
    assert!(
        !manifest.contains(".workspace") && !manifest.contains("workspace ="),
        "an out-of-tree manifest cannot inherit from kb's workspace:\n{manifest}"
    );
    let kb = root.to_str().expect("a UTF-8 workspace path");
    let manifest = manifest
        .replace("\"../kb/", &format!("\"{kb}/"))
        .replace("name = \"my-kernels\"", "name = \"oot-kernels\"");
    assert!(manifest.contains("name = \"oot-kernels\""), "{manifest}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(
        !d.starts_with(&root),
        "{} is inside the workspace",
        d.display()
    );
    std::fs::create_dir_all(d.join("src")).unwrap();
    std::fs::create_dir_all(d.join("examples")).unwrap();
    std::fs::write(d.join("Cargo.toml"), &manifest).unwrap();
    std::fs::copy(root.join("Cargo.lock"), d.join("Cargo.lock")).unwrap();
    std::fs::write(d.join("src/lib.rs"), LIB).unwrap();
    std::fs::write(d.join("src/main.rs"), MAIN).unwrap();
    std::fs::write(d.join("examples/reads_pending.rs"), READS_PENDING).unwrap();

    let t0 = Instant::now();
    let o = cargo(d, &["build"]);
    eprintln!("out-of-tree build: {:.1} s", t0.elapsed().as_secs_f64());
    assert!(
        o.status.success(),
        "cargo build of the guide's crate failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let target = bin("kb-sim").parent().unwrap().to_path_buf();
    let exe = target.join(format!("oot-kernels{}", std::env::consts::EXE_SUFFIX));
    assert!(exe.exists(), "{} not built", exe.display());

    // Its own kb-sim command line, then kb-replay: PASS on stdout.
    let trace = d.join("t.kbt");
    let o = Command::new(&exe)
        .args(["-q", "-t", "small", "-b", "oot_scale", "-p", "a=-2.5", "-o"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = run("kb-replay", &[trace.to_str().unwrap(), "--verify"], b"");
    let out = String::from_utf8_lossy(&r.stdout);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(out.contains("PASS y f32 [64, 16]"), "{out}");
    assert!(out.contains("verification PASSED (1 outputs)"), "{out}");

    // Issue 34's two kernels, out of tree: a Triton-style rmsnorm over a
    // 1-D grid of row blocks in tensor coordinates at 300 x 700 (64-row
    // blocks cut across the default topology's shards of 300 / 32 rows),
    // and a causal softmax whose reference has no index tensor.
    for (bench, want) in [
        ("oot_rmsnorm", "PASS y f32 [300, 700]"),
        ("oot_causal_softmax", "PASS out f32 [72, 72]"),
    ] {
        let trace = d.join(format!("{bench}.kbt"));
        let o = Command::new(&exe)
            .args(["-q", "-t", "default", "-b", bench, "-o"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{bench}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = run("kb-replay", &[trace.to_str().unwrap(), "--verify"], b"");
        let out = String::from_utf8_lossy(&r.stdout);
        assert_eq!(
            r.status.code(),
            Some(0),
            "{bench}: {out}{}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(out.contains(want), "{bench}: {out}");
        // The tensors are the kernel's own: no index tensor for the mask.
        let t = run("kb-inspect", &["tensors", trace.to_str().unwrap()], b"");
        let listing = String::from_utf8_lossy(&t.stdout);
        let names: Vec<&str> = listing
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        let want_names: &[&str] = if bench == "oot_rmsnorm" {
            &["x", "w", "y"]
        } else {
            &["x", "out"]
        };
        assert_eq!(names, want_names, "{listing}");
    }

    // Reading a compute result: kb's compile error, at the user's line.
    let t0 = Instant::now();
    let o = cargo(d, &["build", "--example", "reads_pending"]);
    eprintln!("failing example: {:.1} s", t0.elapsed().as_secs_f64());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "reading a Pending compiled:\n{err}");
    for want in [
        "error[E0277]: a compute result (`Pending`) has no value in Phase 1",
        "examples/reads_pending.rs:8:10",
        "`tl.wait` only waits for the time a result takes",
        "use the result as an operand of further ops or `tl.store` it",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    assert!(!err.contains("E0599"), "{err}");
}
