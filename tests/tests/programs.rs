//! Host programs: several launches with data flowing between them, the
//! launches in the trace, inputs from numpy, and the error for reading a
//! value only Phase 2 knows.

use kb_e2e::*;

fn json(o: &std::process::Output) -> serde_json_lite::Value {
    serde_json_lite::parse(&String::from_utf8_lossy(&o.stdout))
}

/// Just enough JSON to read `kb-inspect summary --format json` (the e2e
/// crate has no dependencies).
mod serde_json_lite {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, k: &str) -> &Value {
            match self {
                Value::Obj(kv) => kv
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v)
                    .unwrap_or(&Value::Null),
                _ => &Value::Null,
            }
        }
        pub fn arr(&self) -> &[Value] {
            match self {
                Value::Arr(a) => a,
                _ => &[],
            }
        }
        pub fn num(&self) -> f64 {
            match self {
                Value::Num(n) => *n,
                v => panic!("not a number: {v:?}"),
            }
        }
        pub fn str(&self) -> &str {
            match self {
                Value::Str(s) => s,
                v => panic!("not a string: {v:?}"),
            }
        }
    }

    pub fn parse(s: &str) -> Value {
        let b = s.as_bytes();
        let mut i = 0;
        let v = value(b, &mut i);
        skip(b, &mut i);
        assert_eq!(i, b.len(), "trailing bytes in JSON");
        v
    }

    fn skip(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }

    fn value(b: &[u8], i: &mut usize) -> Value {
        skip(b, i);
        match b[*i] {
            b'{' => {
                *i += 1;
                let mut kv = Vec::new();
                loop {
                    skip(b, i);
                    if b[*i] == b'}' {
                        *i += 1;
                        return Value::Obj(kv);
                    }
                    let Value::Str(k) = value(b, i) else {
                        panic!("object key")
                    };
                    skip(b, i);
                    assert_eq!(b[*i], b':');
                    *i += 1;
                    kv.push((k, value(b, i)));
                    skip(b, i);
                    if b[*i] == b',' {
                        *i += 1;
                    }
                }
            }
            b'[' => {
                *i += 1;
                let mut a = Vec::new();
                loop {
                    skip(b, i);
                    if b[*i] == b']' {
                        *i += 1;
                        return Value::Arr(a);
                    }
                    a.push(value(b, i));
                    skip(b, i);
                    if b[*i] == b',' {
                        *i += 1;
                    }
                }
            }
            b'"' => {
                *i += 1;
                let mut s = String::new();
                while b[*i] != b'"' {
                    if b[*i] == b'\\' {
                        *i += 1;
                        s.push(match b[*i] {
                            b'n' => '\n',
                            b't' => '\t',
                            c => c as char,
                        });
                    } else {
                        s.push(b[*i] as char);
                    }
                    *i += 1;
                }
                *i += 1;
                Value::Str(s)
            }
            b't' => {
                *i += 4;
                Value::Bool(true)
            }
            b'f' => {
                *i += 5;
                Value::Bool(false)
            }
            b'n' => {
                *i += 4;
                Value::Null
            }
            _ => {
                let start = *i;
                while *i < b.len() && (b[*i].is_ascii_digit() || b"+-.eE".contains(&b[*i])) {
                    *i += 1;
                }
                Value::Num(std::str::from_utf8(&b[start..*i]).unwrap().parse().unwrap())
            }
        }
    }
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
    let launches = j.get("launches").arr();
    let kernels: Vec<&str> = launches.iter().map(|l| l.get("kernel").str()).collect();
    assert_eq!(kernels, ["gemm_x_w1", "gelu", "gemm_g_w2"]);
    for l in launches {
        assert_eq!(l.get("pes").arr().len(), 4, "{l:?}");
        assert_eq!(l.get("grid").arr()[0].num(), 4.0);
        assert!(l.get("t_end_ps").num() > l.get("t_start_ps").num());
    }
    // The host waits for each launch before the next: no overlap.
    for w in launches.windows(2) {
        assert!(
            w[1].get("t_start_ps").num() > w[0].get("t_end_ps").num(),
            "{w:?}"
        );
    }
}

#[test]
fn reading_a_value_only_phase_2_knows_is_an_error_naming_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("peek.kbt");
    let out = run(
        "my-kb-sim",
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
        ("my-kb-sim", &["-q", "-t", "small", "-b", "axpy_rowmax"]),
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
}
