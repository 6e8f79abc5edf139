//! The built binary: inputs, exit codes, messages, report and dumps.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use kb_format::Dtype;
use npyz::WriterBuilder;

const BIN: &str = env!("CARGO_BIN_EXE_kb-replay");

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kb-replay");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        // The binary may exit before reading everything (an error): ignore EPIPE.
        let _ = pipe.write_all(data);
    }
    child.wait_with_output().expect("wait")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The verdict: PASS/FAIL lines and the summary are on stdout.
fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn assert_no_panic(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "panic: {e}");
    assert_ne!(o.status.code(), Some(101), "{e}");
}

fn write_trace(dir: &Path, bytes: &[u8]) -> PathBuf {
    let p = dir.join("chain.kbt");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn npy_f32(path: &Path, shape: &[u64], data: &[f32]) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut f)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

#[test]
fn a_file_trace_verifies_and_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = chain_trace();
    let p = write_trace(dir.path(), &bytes);
    let o = run(&[p.to_str().unwrap(), "--verify"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The verdict is on stdout (`| grep PASS`); stderr has nothing to say.
    let out = stdout(&o);
    assert!(out.contains("PASS y f32 [4, 8]"), "{out}");
    assert!(out.contains("verification PASSED (1 outputs)"), "{out}");
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    // The GFLOP/s figure is the host's replay speed, and says so.
    let summary = out.lines().last().unwrap();
    assert!(
        summary.contains(
            " GFLOP/s on this host (the host's replay speed, not the simulated machine's)"
        ),
        "{summary}"
    );
    // --quiet prints nothing on success.
    let o = run(&[p.to_str().unwrap(), "--verify", "--quiet"], None);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
}

#[test]
fn stdin_input_with_dash_and_without_an_argument() {
    let (bytes, _) = chain_trace();
    for args in [&["-", "--verify"][..], &["--verify"][..]] {
        let o = run(args, Some(&bytes));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("PASS y"), "{}", stdout(&o));
    }
    // A path that is a pipe, not a file, is streamed.
    let o = run(&["/dev/stdin", "--verify"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Without --verify the replay alone succeeds.
    let o = run(&["-"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("replay OK (not verified)"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_trace_cut_short_in_a_pipe_says_it_was_truncated() {
    let (bytes, _) = chain_trace();
    for cut in [10, 64, 200, bytes.len() / 2, bytes.len() - 1] {
        let o = run(&["-", "--verify"], Some(&bytes[..cut]));
        assert_no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "cut {cut}");
        let e = stderr(&o);
        assert!(e.starts_with("kb-replay: <stdin>: "), "{e}");
        assert!(e.contains("truncated"), "cut {cut}: {e}");
    }
}

#[test]
fn a_corrupted_file_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = chain_trace();
    for at in [
        0usize,
        70,
        300,
        bytes.len() / 2,
        bytes.len() - 100,
        bytes.len() - 8,
    ] {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        let p = write_trace(dir.path(), &b);
        let o = run(&[p.to_str().unwrap(), "--verify"], None);
        assert_no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "flip at {at}: {}", stderr(&o));
        assert!(
            stderr(&o).starts_with(&format!("kb-replay: {}: ", p.display())),
            "{}",
            stderr(&o)
        );
    }
    // A file cut short is reported as truncated too.
    let p = write_trace(dir.path(), &bytes[..bytes.len() - 64]);
    let o = run(&[p.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    // A missing file.
    let o = run(&[dir.path().join("nope.kbt").to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nope.kbt"));
}

#[test]
fn a_wrong_expected_array_exits_1_naming_the_first_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, x) = chain_trace();
    let p = write_trace(dir.path(), &bytes);
    let mut wrong = x.clone();
    wrong[10] = 99.0; // index [1, 2]
    let npy = dir.path().join("wrong.npy");
    npy_f32(&npy, &[4, 8], &wrong);
    let arg = format!("y={}", npy.display());
    let o = run(&[p.to_str().unwrap(), "--expect", &arg], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stdout(&o);
    assert!(
        e.contains("FAIL y f32 [4, 8]: 1 of 32 elements outside atol + rtol |ref|"),
        "{e}"
    );
    assert!(
        e.contains(&format!("first at [1, 2]: got {}, expected 99", x[10])),
        "{e}"
    );
    assert!(e.contains("at [1, 2]"), "the worst element is named: {e}");
    // --quiet keeps the FAIL line and nothing else.
    let o = run(&[p.to_str().unwrap(), "--expect", &arg, "-q"], None);
    assert_eq!(o.status.code(), Some(1));
    let e = stdout(&o);
    assert!(e.starts_with("FAIL y f32") && e.lines().count() == 1, "{e}");
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    // The right array passes.
    let good = dir.path().join("good.npy");
    npy_f32(&good, &[4, 8], &x);
    let arg = format!("y={}", good.display());
    let o = run(&[p.to_str().unwrap(), "--expect", &arg], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn bad_expect_files_and_flags_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, x) = chain_trace();
    let p = write_trace(dir.path(), &bytes);
    let p = p.to_str().unwrap();
    // Wrong shape.
    let npy = dir.path().join("flat.npy");
    npy_f32(&npy, &[32], &x);
    let o = run(&[p, "--expect", &format!("y={}", npy.display())], None);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("flat.npy") && e.contains("does not match"),
        "{e}"
    );
    // Unknown tensor.
    let o = run(&[p, "--expect", &format!("nope={}", npy.display())], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no tensor named \"nope\""),
        "{}",
        stderr(&o)
    );
    // Not a numpy file.
    let o = run(&[p, "--expect", &format!("y={p}")], None);
    assert_eq!(o.status.code(), Some(2));
    assert_no_panic(&o);
    // The same tensor twice.
    let good = dir.path().join("good.npy");
    npy_f32(&good, &[4, 8], &x);
    let g = format!("y={}", good.display());
    let o = run(&[p, "--expect", &g, "--expect", &g], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("names tensor \"y\" twice"),
        "{}",
        stderr(&o)
    );
    // Malformed flags.
    for args in [&[p, "--expect", "y"][..], &[p, "--bogus"][..]] {
        let o = run(args, None);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn fingerprint_mismatch_exits_2_naming_the_op() {
    let x = vec![1u8; 8];
    let tensors = vec![tensor("x", Dtype::U8, &[8], true, None)];
    let mut ops = vec![mem(
        42,
        1500,
        1,
        vec![span(host(0, 0), 8)],
        2,
        vec![span(hbm(0), 8)],
    )];
    ops[0].fingerprint = Some(12345);
    let bytes = build(tensors, &[(0, x)], &ops, vec![]);
    let o = run(&["-"], Some(&bytes));
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.starts_with("kb-replay: <stdin>: op 42 (dma on sip0.cube0.pe0.pe_dma at 1.500 ns): fingerprint mismatch"),
        "{e}"
    );
    assert!(e.contains("host:x+0x0 [8 B]"), "{e}");
}

#[test]
fn skipped_unknown_ops_fail_verify_unless_allowed() {
    // x (host) is copied to y; a second op of an unknown kind would have
    // written y too: y still verifies, but the unknown op went unchecked.
    let x = vec![3u8; 4];
    let tensors = vec![
        tensor("x", Dtype::U8, &[4], true, None),
        tensor("y", Dtype::U8, &[4], false, Some(hbm(0))),
    ];
    let copy = mem(1, 1, 0, vec![span(host(0, 0), 4)], 1, vec![span(hbm(0), 4)]);
    let mut unknown = mem(2, 5, 2, vec![span(host(0, 0), 4)], 3, vec![span(hbm(0), 4)]);
    unknown.kind = kb_format::OpKind::Unknown(42);
    unknown.params = kb_format::Params::Raw(vec![1, 2, 3]);
    let spec = vec![check("y", *t("x"))];
    let bytes = build(tensors, &[(0, x)], &[copy, unknown], spec);
    let o = run(&["-", "--verify", "-q"], Some(&bytes));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("FAIL: 1 ops of kinds this kb-replay does not know were skipped"),
        "{}",
        stdout(&o)
    );
    let o = run(&["-", "--verify", "--allow-unknown"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("1 unknown skipped"), "{}", stdout(&o));
    // Not verifying: a replay, no verdict on them.
    assert_eq!(run(&["-"], Some(&bytes)).status.code(), Some(0));
}

#[test]
fn report_to_stdout_is_json() {
    let (bytes, _) = chain_trace();
    let o = run(&["-", "--verify", "--report", "-", "--quiet"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert_eq!(j["pass"], true);
    assert_eq!(j["verified"], true);
    assert_eq!(j["trace"], "<stdin>");
    assert_eq!(j["ops"]["memory"], 5);
    assert_eq!(j["ops"]["gemm"], 0);
    assert_eq!(j["unknown_ops_skipped"], 0);
    assert_eq!(j["fingerprints_checked"], 1);
    let out = &j["outputs"][0];
    assert_eq!(out["name"], "y");
    assert_eq!(out["dtype"], "f32");
    assert_eq!(out["shape"], serde_json::json!([4, 8]));
    assert_eq!(out["mismatches"], 0);
    assert_eq!(out["max_abs_err"], 0.0);
    assert_eq!(out["first_mismatch"], serde_json::Value::Null);
    assert!(j["wall_seconds"].is_number());
    assert!(j["gflops"].is_number());
    assert_eq!(j["backend"], "gemm");
    assert!(j["threads"].as_u64().unwrap() >= 1);
    assert!(j["engine"]["windows"].as_u64().unwrap() >= 1);
    // Not quiet: stdout stays the JSON alone, the verdict lines go to
    // stderr.
    let o = run(&["-", "--verify", "--report", "-"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report alone");
    assert_eq!(j["pass"], true);
    assert!(stderr(&o).contains("PASS y f32 [4, 8]"), "{}", stderr(&o));
}

#[test]
fn threads_and_backend_flags() {
    let (bytes, _) = chain_trace();
    for t in ["1", "2", "3"] {
        let o = run(
            &[
                "-",
                "--verify",
                "--threads",
                t,
                "--backend",
                "gemm",
                "--report",
                "-",
                "-q",
            ],
            Some(&bytes),
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["threads"].to_string(), t);
    }
    let o = run(&["-", "--threads", "0"], Some(&bytes));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--threads must be at least 1"),
        "{}",
        stderr(&o)
    );
    let o = run(&["-", "--backend", "cuda"], Some(&bytes));
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown backend \"cuda\""),
        "{}",
        stderr(&o)
    );
    let help = run(&["--help"], None);
    let h = String::from_utf8_lossy(&help.stdout);
    assert!(h.contains("--threads") && h.contains("--backend") && h.contains("openblas"));
}

#[test]
fn no_progress_bar_when_stderr_is_not_a_terminal() {
    // A trace long enough for the bar to tick, were it drawn.
    let (bytes, _) = chain_trace();
    let o = run(&["-", "--verify"], Some(&bytes));
    assert_eq!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(!e.contains('\r') && !e.contains('\u{1b}'), "{e:?}");
    assert!(!e.contains("records ("), "{e:?}");
}

#[test]
fn report_to_a_file_records_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, x) = chain_trace();
    let p = write_trace(dir.path(), &bytes);
    let mut wrong = x.clone();
    wrong[31] += 0.5;
    let npy = dir.path().join("w.npy");
    npy_f32(&npy, &[4, 8], &wrong);
    let report = dir.path().join("r.json");
    let o = run(
        &[
            p.to_str().unwrap(),
            "--expect",
            &format!("y={}", npy.display()),
            "--report",
            report.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(j["pass"], false);
    let m = &j["outputs"][0]["first_mismatch"];
    assert_eq!(m["index"], serde_json::json!([3, 7]));
    assert_eq!(m["got"], x[31] as f64);
    assert_eq!(m["expected"], (x[31] + 0.5) as f64);
}

#[test]
fn dumped_outputs_are_numpy_files() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, x) = chain_trace();
    let out = dir.path().join("dump");
    let o = run(
        &[
            "-",
            "--verify",
            "--quiet",
            "--dump-outputs",
            out.to_str().unwrap(),
        ],
        Some(&bytes),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let f = npyz::NpyFile::new(std::fs::File::open(out.join("y.npy")).unwrap()).unwrap();
    assert_eq!(f.shape(), [4, 8]);
    assert_eq!(f.into_vec::<f32>().unwrap(), x);
    // Only the output (x has host data).
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
}

#[test]
fn help_documents_exit_codes() {
    let o = run(&["--help"], None);
    assert_eq!(o.status.code(), Some(0));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("Exit codes:") && s.contains("1  verification mismatch"),
        "{s}"
    );
}

#[test]
fn absurd_thread_counts_are_capped_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = chain_trace();
    let p = write_trace(dir.path(), &bytes);
    let o = run(&[p.to_str().unwrap(), "--verify", "-j", "4294967296"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--threads 4294967296 capped at"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn fingerprints_and_copies_can_be_chosen_and_the_report_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = chain_trace();
    let trace = write_trace(dir.path(), &bytes);
    let t = trace.to_str().unwrap();
    let report = dir.path().join("r.json");
    let r = report.to_str().unwrap();
    let mut dumps = Vec::new();
    for (i, flags) in [
        &["--fingerprints", "all"][..],
        &["--fingerprints", "sample"][..],
        &["--fingerprints", "off", "--no-elide"][..],
    ]
    .iter()
    .enumerate()
    {
        let d = dir.path().join(format!("d{i}"));
        let mut args = vec![
            t,
            "--verify",
            "--report",
            r,
            "--dump-outputs",
            d.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let o = run(&args, None);
        assert_eq!(o.status.code(), Some(0), "{flags:?}: {}", stderr(&o));
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(j["fingerprints"], flags[1]);
        let skipped = j["fingerprints_skipped"].as_u64().unwrap();
        let checked = j["fingerprints_checked"].as_u64().unwrap();
        assert_eq!(skipped + checked, 1, "{j}");
        // (The chain's one fingerprinted op is not among those sampled.)
        assert_eq!(skipped, (flags[1] != "all") as u64, "{j}");
        if flags[1] == "off" {
            assert!(
                stdout(&o).contains("not checked: --fingerprints off"),
                "{}",
                stdout(&o)
            );
            assert_eq!(j["engine"]["copies_elided"], 0);
        }
        for key in [
            "bytes_copied",
            "bytes_copied_per_gemm_flop",
            "fingerprint_bytes",
        ] {
            assert!(j[key].is_number(), "{key}: {j}");
        }
        dumps.push(std::fs::read(d.join("y.npy")).unwrap());
    }
    assert!(dumps.iter().all(|d| d == &dumps[0]));
    let bad = run(&[t, "--fingerprints", "some"], None);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("expected all, sample or off"),
        "{}",
        stderr(&bad)
    );
}

/// Host data that is not what Phase 1 fingerprinted (one byte changed,
/// the recorded fingerprint kept: corrupted trace data) is caught under
/// `--fingerprints all` (the default), naming the op that read it, even
/// when the copy is elided and an earlier op read the same bytes; under
/// `off` it replays (the user said to trust the trace) and says the
/// fingerprints were not checked.
#[test]
fn corrupted_trace_data_is_caught_under_fingerprints_all() {
    let good: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    let mut bad = good.clone();
    bad[40] ^= 0x10;
    let tensors = vec![
        tensor("x", Dtype::U8, &[64], true, None),
        tensor("y", Dtype::U8, &[32], false, Some(tcm(0))),
    ];
    // Op 1 copies host data to HBM, op 2 loads the upper half (with the
    // corrupted byte) into TCM; both fingerprints are of the good data.
    let mut ops = vec![
        mem(
            1,
            0,
            1,
            vec![span(host(0, 0), 64)],
            2,
            vec![span(hbm(0), 64)],
        ),
        mem(2, 10, 3, vec![span(hbm(32), 32)], 4, vec![span(tcm(0), 32)]),
    ];
    ops[0].fingerprint = Some(kb_format::fingerprint(&good));
    ops[1].fingerprint = Some(kb_format::fingerprint(&good[32..]));
    for (data, flags, want_ok) in [
        (&good, &["--fingerprints", "all"][..], true),
        (&bad, &[][..], false),
        (&bad, &["--fingerprints", "all"][..], false),
        (
            &bad,
            &["--fingerprints", "all", "--no-elide", "-j", "2"][..],
            false,
        ),
        (&bad, &["--fingerprints", "off"][..], true),
    ] {
        let bytes = build(tensors.clone(), &[(0, data.clone())], &ops, vec![]);
        let mut args = vec!["-"];
        args.extend_from_slice(flags);
        let o = run(&args, Some(&bytes));
        assert_no_panic(&o);
        let e = stderr(&o);
        if want_ok {
            assert_eq!(o.status.code(), Some(0), "{flags:?}: {e}");
            let off = flags.contains(&"off");
            // The summary (stdout) says which fingerprints went unchecked.
            let out = stdout(&o);
            assert_eq!(
                out.contains("not checked: --fingerprints off"),
                off,
                "{out}"
            );
        } else {
            assert_eq!(o.status.code(), Some(2), "{flags:?}: {e}");
            assert!(
                e.contains("op 1 (") && e.contains("fingerprint mismatch"),
                "{flags:?}: {e}"
            );
        }
    }
}

/// A bf16 GEMM whose results round: `c = a . b` with a [2, 3], b [3, 2]
/// on the host and c [2, 2] in HBM, checked at the default tolerance.
fn bf16_gemm_trace() -> Vec<u8> {
    use half::bf16;
    let bf = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect()
    };
    let a = bf(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]);
    let b = bf(&[0.7, 0.8, 0.9, 1.1, 1.3, 1.7]);
    let tensors = vec![
        tensor("a", Dtype::Bf16, &[2, 3], true, None),
        tensor("b", Dtype::Bf16, &[3, 2], true, None),
        tensor("c", Dtype::Bf16, &[2, 2], false, Some(hbm(0x100))),
    ];
    let ops = [gemm(
        1,
        0,
        1,
        gemm_params(2, 3, 2, Dtype::Bf16, Dtype::F32, Dtype::Bf16),
        vec![span(host(0, 0), 12), span(host(1, 0), 12)],
        vec![span(hbm(0x100), 8)],
    )];
    build(
        tensors,
        &[(0, a), (1, b)],
        &ops,
        vec![check("c", kb_format::Expr::Matmul(t("a"), t("b")))],
    )
}

#[test]
fn tolerance_flags_override_the_default_and_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_trace(dir.path(), &bf16_gemm_trace());
    let p = p.to_str().unwrap();
    // bf16's default 1e-2 covers the rounding of the output.
    let o = run(&[p, "--verify"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("PASS c bf16 [2, 2]"), "{}", stdout(&o));
    // No tolerance at all: the rounded results fail.
    let o = run(&[p, "--verify", "--atol", "0", "--rtol", "0"], None);
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stdout(&o);
    assert!(e.contains("FAIL c bf16 [2, 2]"), "{e}");
    assert!(
        e.contains("rtol 0e0 from --rtol, atol 0e0 from --atol"),
        "{e}"
    );
    // For the tensor or its dtype only: a tensor's beats its dtype's,
    // which beats the plain value.
    for args in [
        &["--atol", "c=0", "--rtol", "c=0"][..],
        &["--atol", "bf16=0", "--rtol", "bf16=0", "--atol", "0.5"][..],
        &[
            "--atol", "0.5", "--atol", "c=0", "--rtol", "0", "--rtol", "f32=0.5",
        ][..],
    ] {
        let mut a = vec![p, "--verify"];
        a.extend_from_slice(args);
        let o = run(&a, None);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
    }
    let o = run(&[p, "--verify", "--atol", "f32=0", "--rtol", "i8=0"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A name that is neither a verified output nor a dtype: exit 2.
    let o = run(&[p, "--verify", "--atol", "cc=0"], None);
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cc is neither an output this run verifies (c) nor a dtype"),
        "{}",
        stderr(&o)
    );
    // Each flag on its own: the other keeps its default (in the report).
    let o = run(
        &[p, "--verify", "--atol", "0.5", "--report", "-", "-q"],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let out = &j["outputs"][0];
    assert_eq!(
        (out["atol"].as_f64(), out["rtol"].as_f64()),
        (Some(0.5), Some(1e-2))
    );
    assert_eq!(out["atol_from"], "flag");
    assert_eq!(out["rtol_from"], "default");
    let o = run(&[p, "--verify", "--rtol=0", "--report", "-", "-q"], None);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let out = &j["outputs"][0];
    assert_eq!(
        (out["atol"].as_f64(), out["rtol"].as_f64()),
        (Some(1e-2), Some(0.0))
    );
    let help = run(&["--help"], None);
    let h = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--atol <[NAME=]X>",
        "--rtol <[NAME=]X>",
        "--strict-tolerance",
    ] {
        assert!(h.contains(flag), "{flag}: {h}");
    }
}

#[test]
fn bad_tolerance_values_exit_2_naming_the_flag_and_the_value() {
    let (bytes, _) = chain_trace();
    for (flag, value) in [
        ("--atol", "-1"),
        ("--atol", "nan"),
        ("--atol", "inf"),
        ("--atol", "1e400"),
        ("--rtol", "abc"),
        ("--rtol", "-0.5"),
        ("--rtol", ""),
    ] {
        let o = run(&["-", "--verify", flag, value], Some(&bytes));
        assert_no_panic(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains(&format!("'{value}' for '{flag} <[NAME=]X>'"))
                && e.contains("expected a finite number >= 0"),
            "{flag} {value}: {e}"
        );
    }
    // `--flag=value` too.
    let o = run(&["-", "--verify", "--atol=-1e-3"], Some(&bytes));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("'-1e-3' for '--atol <[NAME=]X>'"),
        "{}",
        stderr(&o)
    );
}

/// A trace that loosens its own check: y is a copy of x, but the spec
/// says y = x + 1e-4 at rtol = atol = 1e-3, a hundred times f32's default
/// 1e-5. It passes, and the PASS line says the tolerance is the trace's
/// and looser than the default; `--strict-tolerance` uses the default and
/// fails; --atol/--rtol win over both.
#[test]
fn a_trace_tolerance_looser_than_the_default_is_named_and_strict_ignores_it() {
    use kb_format::Expr;
    let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 2.0).collect();
    let tensors = vec![
        tensor("x", Dtype::F32, &[8], true, None),
        tensor("y", Dtype::F32, &[8], false, Some(hbm(0))),
    ];
    let ops = [mem(
        1,
        0,
        1,
        vec![span(host(0, 0), 32)],
        2,
        vec![span(hbm(0), 32)],
    )];
    let near_x = Expr::Add(t("x"), Box::new(Expr::Scalar(1e-4)));
    let loose = build(
        tensors.clone(),
        &[(0, f32_bytes(&x))],
        &ops,
        vec![check_tol("y", near_x.clone(), 1e-3)],
    );
    let note = "tolerance from the trace, looser than the f32 default 1e-5";
    let o = run(&["-", "--verify"], Some(&loose));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stdout(&o);
    assert!(e.contains("PASS y f32 [8]") && e.contains(note), "{e}");
    // The JSON report says it too.
    let o = run(&["-", "--verify", "--report", "-", "-q"], Some(&loose));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["outputs"][0]["rtol_from"], "trace");
    assert!(
        j["outputs"][0]["tolerance_note"]
            .as_str()
            .is_some_and(|n| n.starts_with(note)),
        "{j}"
    );
    // --strict-tolerance: f32's 1e-5, which the 1e-4 difference fails.
    let o = run(&["-", "--verify", "--strict-tolerance"], Some(&loose));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stdout(&o);
    assert!(
        e.contains("FAIL y f32 [8]")
            && e.contains("rtol 1e-5 from the f32 default, atol 1e-5 from the f32 default"),
        "{e}"
    );
    assert!(!e.contains("looser"), "{e}");
    // Flags win over --strict-tolerance.
    let o = run(
        &["-", "--verify", "--strict-tolerance", "--atol", "2e-4"],
        Some(&loose),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Only rtol left to the trace: the note names it.
    let o = run(&["-", "--verify", "--atol", "1e-3"], Some(&loose));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stdout(&o);
    assert!(
        e.contains("rtol from the trace, looser than the f32 default 1e-5"),
        "{e}"
    );
    // A trace at the default tolerance, or none, gets no note.
    for spec in [
        check_tol("y", near_x.clone(), 1e-5),
        check("y", Expr::Tensor("x".into())),
    ] {
        let b = build(tensors.clone(), &[(0, f32_bytes(&x))], &ops, vec![spec]);
        let o = run(&["-", "--verify"], Some(&b));
        assert!(!stdout(&o).contains("looser"), "{}", stdout(&o));
    }
    // Without verification the flags do nothing, and say so.
    let o = run(&["-", "--strict-tolerance"], Some(&loose));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("apply to verification"),
        "{}",
        stderr(&o)
    );
}
