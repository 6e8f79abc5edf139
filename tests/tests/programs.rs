//! Host programs: several launches with data flowing between them, the
//! launches in the trace, inputs from numpy, and the error for reading a
//! value only Phase 2 knows.

use kb_e2e::*;

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("summary JSON")
}

#[test]
fn a_later_launch_loads_what_an_earlier_one_computed_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("mlp.kbt");
    let t = t.to_str().unwrap();
    let sim = run("kb-sim", &["-q", "-t", "small", "-b", "mlp", "-o", t], b"");
    assert!(sim.status.success(), "{}", stderr(&sim));
    let replay = run("kb-replay", &[t, "--verify"], b"");
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    let summary = run("kb-inspect", &["summary", t, "--format", "json"], b"");
    assert!(summary.status.success(), "{}", stderr(&summary));
    let j = json(&summary);
    let launches = j["launches"].as_array().expect("launches");
    let kernels: Vec<&str> = launches
        .iter()
        .map(|l| l["kernel"].as_str().unwrap())
        .collect();
    assert_eq!(kernels, ["gemm_x_w1", "gelu", "gemm_g_w2"]);
    let ps = |l: &serde_json::Value, k: &str| l[k].as_u64().unwrap();
    for l in launches {
        assert_eq!(l["pes"].as_array().unwrap().len(), 4, "{l}");
        assert_eq!(l["grid"], serde_json::json!([4, 1]));
        assert!(ps(l, "t_end_ps") > ps(l, "t_start_ps"), "{l}");
    }
    // The host waits for each launch before the next: no overlap.
    for w in launches.windows(2) {
        assert!(ps(&w[1], "t_start_ps") > ps(&w[0], "t_end_ps"), "{w:?}");
    }
}

#[test]
fn reading_a_value_only_phase_2_knows_is_an_error_naming_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("peek.kbt");
    let out = run(
        "kb-sim-example-kernels",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "axpy_rowmax",
            "-p",
            "peek=1",
            "-o",
            t.to_str().unwrap(),
        ],
        b"",
    );
    assert_clean_error(&out, "peek=1");
    let err = stderr(&out);
    for want in [
        "kernel rowmax[0] failed",
        "element (0, 0)",
        "not known in Phase 1",
        "last written by op",
        "(add on sip0.cube0.pe",
        "issued at",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    assert!(!t.exists(), "a failed run left {}", t.display());
    // Without the peek the same program verifies.
    let (sim, replay) = pipe(
        (
            "kb-sim-example-kernels",
            &["-q", "-t", "small", "-b", "axpy_rowmax"],
        ),
        ("kb-replay", &["--verify"]),
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
}

#[test]
fn inputs_from_numpy_round_trip_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (a, x, b, x2) = (p("a.kbt"), p("x.npy"), p("b.kbt"), p("x2.npy"));
    let sim = run(
        "kb-sim",
        &[
            "-q", "-t", "small", "-b", "softmax", "-p", "rows=24", "-p", "cols=40", "-o", &a,
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let exp = run("kb-inspect", &["tensor", &a, "x", "-o", &x], b"");
    assert!(exp.status.success(), "{}", stderr(&exp));
    // Another seed would draw other data; --input wins.
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "softmax",
            "-p",
            "rows=24",
            "-p",
            "cols=40",
            "--seed",
            "9",
            "--input",
            &format!("x={x}"),
            "-o",
            &b,
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let exp = run("kb-inspect", &["tensor", &b, "x", "-o", &x2], b"");
    assert!(exp.status.success(), "{}", stderr(&exp));
    assert_eq!(
        std::fs::read(&x).unwrap(),
        std::fs::read(&x2).unwrap(),
        "the exported tensor is the input file"
    );
    let replay = run("kb-replay", &[&b, "--verify"], b"");
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));

    // Wrong shape, wrong dtype, unknown tensor, missing file: exit 2.
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["-p", "rows=25", "-p", "cols=40"],
            &["shape", "[24, 40]", "[25, 40]"],
        ),
        (
            &["-p", "rows=24", "-p", "cols=40", "-p", "dtype=f16"],
            &["<f4", "declares f16"],
        ),
        (
            &["-p", "rows=24", "-p", "cols=40", "--input", "nope=x.npy"],
            &["nope", "has no tensor"],
        ),
        (
            &[
                "-p",
                "rows=24",
                "-p",
                "cols=40",
                "--input",
                "x=/nonexistent.npy",
            ],
            &["/nonexistent.npy"],
        ),
    ];
    for (extra, wants) in cases {
        let mut args = vec!["-q", "-t", "small", "-b", "softmax", "-o", &b];
        args.extend_from_slice(extra);
        let xin = format!("x={x}");
        if !extra.contains(&"--input") {
            args.extend(["--input", &xin]);
        }
        let out = run("kb-sim", &args, b"");
        assert_clean_error(&out, &format!("{extra:?}"));
        let err = stderr(&out);
        for w in wants {
            assert!(err.contains(w), "{extra:?}: missing {w:?} in {err}");
        }
    }
    // The output softmax computes, though of the right shape and dtype.
    let yin = format!("y={x}");
    let out = run(
        "kb-sim",
        &[
            "-q", "-t", "small", "-b", "softmax", "-p", "rows=24", "-p", "cols=40", "--input",
            &yin, "-o", &b,
        ],
        b"",
    );
    assert_clean_error(&out, "--input on the output");
    let err = stderr(&out);
    assert!(
        err.contains("\"y\" is an output workload softmax computes and verifies, not an input (its inputs: x)"),
        "{err}"
    );
}
