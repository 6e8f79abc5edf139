//! End-to-end tests of the built `kb-inspect` binary: every command on a
//! file and on standard input, exit codes, and damaged traces.

#[path = "../src/testutil.rs"]
mod testutil;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kb_format::{Meta, Record};
use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kb-inspect"))
}

/// Run with `args`, feeding `stdin` when given.
fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut c = bin();
    c.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(data) = stdin {
        let mut si = child.stdin.take().unwrap();
        let data = data.to_vec();
        // Write from a thread: the child may stop reading early on errors.
        std::thread::spawn(move || {
            let _ = si.write_all(&data);
        });
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn ok(o: &Output) {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(o));
}

struct Fixture {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    trace: PathBuf,
    bytes: Vec<u8>,
}

fn fixture() -> Fixture {
    let bytes = testutil::sample_trace();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let trace = dir.join("sample.kbt");
    std::fs::write(&trace, &bytes).unwrap();
    Fixture {
        _dir: d,
        dir,
        trace,
        bytes,
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn summary_on_a_file_and_on_stdin() {
    let f = fixture();
    let a = run(&["summary", s(&f.trace)], None);
    ok(&a);
    let b = run(&["summary", "-"], Some(&f.bytes));
    ok(&b);
    let text = stdout(&a);
    assert!(
        text.contains("records:        7 (memory 5, gemm 1, math 1)"),
        "{text}"
    );
    assert!(text.contains("simulated time: 10.000 ns"), "{text}");
    let strip = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with("trace:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&text), strip(&stdout(&b)));
    assert!(stdout(&b).contains("trace:          <stdin>"));
    let j = run(&["summary", "-", "--format", "json"], Some(&f.bytes));
    ok(&j);
    let v: Value = serde_json::from_str(&stdout(&j)).unwrap();
    assert_eq!(v["records"], 7);
    assert_eq!(v["benchmark"], "sample");
}

#[test]
fn ops_filters_and_formats_on_both_sources() {
    let f = fixture();
    for src in [s(&f.trace), "-"] {
        let o = run(
            &[
                "ops",
                src,
                "--component",
                "*pe_dma",
                "--from",
                "2.5",
                "--format",
                "csv",
            ],
            Some(&f.bytes),
        );
        ok(&o);
        let ids: Vec<String> = stdout(&o)
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["1", "2", "4"]);
        let o = run(
            &["ops", src, "--kind", "gemm,math", "--format", "jsonl"],
            Some(&f.bytes),
        );
        ok(&o);
        assert_eq!(stdout(&o).lines().count(), 2);
        let o = run(
            &[
                "ops", src, "--name", "dma_*", "--limit", "1", "--format", "json",
            ],
            Some(&f.bytes),
        );
        ok(&o);
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 1);
        assert_eq!(v[0]["op_id"], 1);
        let o = run(&["ops", src, "--to", "1"], Some(&f.bytes));
        ok(&o);
        assert_eq!(stdout(&o).lines().count(), 2, "{}", stdout(&o));
    }
}

#[test]
fn launch_selects_the_ops_of_one_launch_from_a_file() {
    let f = fixture();
    let ids = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["ops", s(&f.trace), "--format", "csv"];
        a.extend_from_slice(args);
        let o = run(&a, None);
        ok(&o);
        stdout(&o)
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect()
    };
    // Launch 0 is [0, 5000) ps: pe_dma's ops 1 and 2 (op 4 starts at its
    // end); launch 1, [6000, 7000), has only the exp.
    assert_eq!(
        ids(&["--launch", "0", "--component", "*pe_dma"]),
        ["1", "2"]
    );
    assert_eq!(ids(&["--launch", "1"]), ids(&["--name", "exp"]));
    // With --from: within both.
    assert_eq!(
        ids(&["--launch", "0", "--from", "3.5", "--component", "*pe_dma"]),
        ["2"]
    );
    // A stream's launches come too late; a launch the trace lacks.
    let o = run(&["ops", "-", "--launch", "0"], Some(&f.bytes));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--launch needs a trace file"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &[
            "timeline",
            s(&f.trace),
            "--launch",
            "5",
            "-o",
            s(&f.dir.join("t.json")),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--launch 5: the trace has 2 launches"),
        "{}",
        stderr(&o)
    );
    assert!(!f.dir.join("t.json").exists());
}

#[test]
fn stats_on_both_sources() {
    let f = fixture();
    let a = run(&["stats", s(&f.trace), "--format", "json"], None);
    ok(&a);
    let b = run(&["stats", "-", "--format", "json"], Some(&f.bytes));
    ok(&b);
    assert_eq!(stdout(&a), stdout(&b));
    let v: Value = serde_json::from_str(&stdout(&a)).unwrap();
    let dma = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == testutil::PE_DMA)
        .unwrap();
    // testutil::sample_ops: spans held 4000 ps, active 1900 ps, in the
    // kernel window [0, 7000) of its two launches.
    assert_eq!(
        (dma["busy_ps"].as_u64(), dma["held_ps"].as_u64()),
        (Some(1900), Some(4000))
    );
    assert_eq!(dma["utilisation"], 1900.0 / 7000.0);
    assert_eq!(dma["held_utilisation"], 4000.0 / 7000.0);
    for by in ["op_name", "op_kind"] {
        let o = run(&["stats", "-", "--by", by], Some(&f.bytes));
        ok(&o);
        assert!(stdout(&o).contains(&format!("by {by}")));
    }
}

#[test]
fn stats_by_route_and_name_on_both_sources() {
    let f = fixture();
    let bytes = testutil::route_trace();
    let trace = f.dir.join("routes.kbt");
    std::fs::write(&trace, &bytes).unwrap();
    let args = |src| {
        vec![
            "stats",
            src,
            "--by",
            "route",
            "--name",
            "ipcq_copy",
            "--format",
            "csv",
        ]
    };
    let a = run(&args(s(&trace)), None);
    ok(&a);
    let b = run(&args("-"), Some(&bytes));
    ok(&b);
    assert_eq!(stdout(&a), stdout(&b));
    // Hand-computed in testutil::route_ops: ops 2 and 3 overlap, so the
    // first route is busy [2000, 5000) ps for 4000 ps of op time. Its ops
    // carry no active interval (busy = held) and it has no launches (the
    // window is the whole run, 10 000 ps).
    assert_eq!(
        stdout(&a),
        "route,count,busy_ns,held_ns,op_time_ns,utilisation,held_utilisation,bytes,flops,bandwidth_gbps,gflops\n\
         sip0.cube0.pe0.tcm -> sip0.cube0.pe1.tcm,2,3.000,3.000,4.000,0.3,0.3,192,0,64,0\n\
         sip0.cube0.pe0.tcm -> sip0.cube1.sram,1,1.000,1.000,1.000,0.1,0.1,32,0,32,0\n\
         sip1.cube0.pe2.tcm -> sip1.cube0.pe10.tcm,1,1.000,1.000,1.000,0.1,0.1,16,0,16,0\n"
    );
    // Every route, as a table.
    let o = run(&["stats", s(&trace), "--by", "route"], None);
    ok(&o);
    let t = stdout(&o);
    assert!(
        t.starts_with(
            "run time 10.000 ns, no launches: utilisation over the whole run, 10 records, by route: 8 counted (memory ops)\n"
        ),
        "{t}"
    );
    for key in ["host -> sip0.cube0.hbm", "? -> sip0.cube0.hbm"] {
        assert!(t.lines().any(|l| l.starts_with(key)), "{key} in {t}");
    }
    // --name applies to the other modes too, and is repeatable.
    let o = run(
        &[
            "stats", "-", "--name", "dma_read", "--name", "h2d", "--format", "json",
        ],
        Some(&f.bytes),
    );
    ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["counted"], 3);
    assert_eq!(v["records"], 7);
    let keys: Vec<&str> = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["host", testutil::PE_DMA]);
    // A bad glob is an error.
    let o = run(&["stats", s(&trace), "--name", "["], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("glob"), "{}", stderr(&o));
    let o = run(&["stats", "--help"], None);
    ok(&o);
    assert!(stdout(&o).contains("route"), "{}", stdout(&o));
}

#[test]
fn timeline_on_both_sources() {
    let f = fixture();
    let out_a = f.dir.join("a.json");
    let out_b = f.dir.join("b.json");
    ok(&run(&["timeline", s(&f.trace), "-o", s(&out_a)], None));
    let o = run(
        &[
            "timeline",
            "-",
            "-o",
            s(&out_b),
            "--from",
            "3.5",
            "--to",
            "5",
        ],
        Some(&f.bytes),
    );
    ok(&o);
    assert!(stderr(&o).contains("wrote 2 ops"), "{}", stderr(&o));
    let a: Value = serde_json::from_slice(&std::fs::read(&out_a).unwrap()).unwrap();
    let xs = a["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["op_id"].is_u64())
        .count();
    assert_eq!(xs, 7);
    let b: Value = serde_json::from_slice(&std::fs::read(&out_b).unwrap()).unwrap();
    assert!(b["traceEvents"].is_array());
    // To standard output.
    let o = run(&["timeline", s(&f.trace), "-o", "-"], None);
    ok(&o);
    let c: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(c, a);
    // Perfetto's protobuf, by file name or flag, from a file or a stream:
    // a Trace is a sequence of `packet` fields (tag 0x0a).
    let pf = f.dir.join("t.pftrace");
    ok(&run(&["timeline", s(&f.trace), "-o", s(&pf)], None));
    let bytes = std::fs::read(&pf).unwrap();
    assert_eq!(bytes[0], 0x0a);
    let o = run(
        &["timeline", "-", "--format", "perfetto", "-o", "-"],
        Some(&f.bytes),
    );
    ok(&o);
    assert_eq!(o.stdout[0], 0x0a);
    assert!(stderr(&o).contains("wrote 7 ops"), "{}", stderr(&o));
}

#[test]
fn tensor_export_on_both_sources_reads_back() {
    let f = fixture();
    let o = run(&["tensors", "-"], Some(&f.bytes));
    ok(&o);
    assert!(stdout(&o).contains("device output"));
    for src in [s(&f.trace), "-"] {
        let out = f.dir.join("a.npy");
        let _ = std::fs::remove_file(&out);
        let o = run(&["tensor", src, "a", "-o", s(&out)], Some(&f.bytes));
        ok(&o);
        let npy = npyz::NpyFile::new(std::io::Cursor::new(std::fs::read(&out).unwrap())).unwrap();
        assert_eq!(npy.shape(), &[2, 3]);
        let v: Vec<half::f16> = npy.into_vec().unwrap();
        let got: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, testutil::A_F16);
    }
    let out = f.dir.join("b.npy");
    let o = run(
        &["tensor", s(&f.trace), "b", "-o", s(&out), "--bf16", "bits"],
        None,
    );
    ok(&o);
    let npy = npyz::NpyFile::new(std::io::Cursor::new(std::fs::read(&out).unwrap())).unwrap();
    let bits: Vec<u16> = npy.into_vec().unwrap();
    assert_eq!(bits.len(), 4);
    // An output tensor has no data in the trace.
    let o = run(
        &["tensor", s(&f.trace), "c", "-o", s(&f.dir.join("c.npy"))],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no host data"), "{}", stderr(&o));
    assert!(!f.dir.join("c.npy").exists());
}

/// A run of the sample benchmark with a given seed: input data and every
/// data fingerprint depend on it, timing does not.
fn seeded(seed: u64, out: &str) -> Vec<u8> {
    let mut meta: Meta = testutil::sample_meta();
    meta.seed = seed;
    meta.params[1].1 = seed.to_string();
    meta.command_line.push(format!("--seed={seed}"));
    meta.command_line.push(format!("-o={out}"));
    let mut tensors = testutil::sample_tensors();
    for t in &mut tensors {
        t.2[0] ^= seed as u8;
    }
    let ops: Vec<testutil::Op> = testutil::sample_ops()
        .into_iter()
        .map(|mut op| {
            let r: &mut Record = &mut op.rec;
            if let Some(fp) = r.fingerprint.as_mut() {
                *fp = kb_format::fingerprint(&[*fp as u8, seed as u8]);
            }
            op
        })
        .collect();
    testutil::build(&meta, &tensors, &ops, &testutil::sample_verify())
}

#[test]
fn diff_exit_codes_and_first_divergent_op() {
    let f = fixture();
    let a = f.dir.join("a.kbt");
    let a2 = f.dir.join("a2.kbt");
    let b = f.dir.join("b.kbt");
    // Two runs of the same input (only the output path differs).
    let mut run_a = seeded(1, "a.kbt");
    std::fs::write(&a, &run_a).unwrap();
    std::fs::write(&a2, seeded(1, "a2.kbt")).unwrap();
    std::fs::write(&b, seeded(2, "b.kbt")).unwrap();
    let o = run(&["diff", s(&a), s(&a2)], None);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("result: identical"));
    // One side on standard input.
    let o = run(&["diff", "-", s(&a2)], Some(&run_a));
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // Different seeds.
    let o = run(&["diff", s(&a), s(&b)], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("  seed: 1 -> 2"), "{text}");
    assert!(
        text.contains("first divergent op by data fingerprint: op 0 (record #0"),
        "{text}"
    );
    assert!(
        text.contains("first divergent op by timing: none"),
        "{text}"
    );
    let o = run(
        &["diff", s(&a), "-", "--format", "json"],
        Some(&seeded(2, "x")),
    );
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["identical"], false);
    assert_eq!(v["first_data_divergence"]["op_id"], 0);
    assert!(v["first_data_divergence"]["a"]["fingerprint"].is_string());
    assert!(v["first_data_divergence"]["b"]["fingerprint"].is_string());
    // Both on standard input: an error.
    let o = run(&["diff", "-", "-"], Some(&run_a));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("standard input"));
    // A damaged side: an error, not a difference.
    let n = run_a.len();
    run_a[n / 2] ^= 0xff;
    std::fs::write(&a, &run_a).unwrap();
    let o = run(&["diff", s(&a), s(&b)], None);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
}

#[test]
fn diff_names_topology_fields_and_attributes_time_per_launch() {
    let f = fixture();
    let mut meta = testutil::sample_meta();
    meta.topology.resolved = "links:\n  cube_link:\n    bw_gbs: 256.0\n".into();
    let mut ops = testutil::sample_ops();
    let a = testutil::build_with_launches(
        &meta,
        &[],
        &ops,
        &testutil::sample_launches(),
        &testutil::sample_verify(),
    );
    meta.topology.resolved = "links:\n  cube_link:\n    bw_gbs: 32.0\n".into();
    // Op 2 (pe_dma dma_read, active [2000, 2400)) moves its bytes until 2900.
    ops[2].rec.active = Some((2000, 2900));
    let b = testutil::build_with_launches(
        &meta,
        &[],
        &ops,
        &testutil::sample_launches(),
        &testutil::sample_verify(),
    );
    let pa = f.dir.join("a.kbt");
    std::fs::write(&pa, &a).unwrap();
    // B on standard input: its launches come after its records.
    let o = run(&["diff", s(&pa), "-"], Some(&b));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "topology (resolved, by field path):\n  links.cube_link.bw_gbs: 256.0 -> 32.0\n",
        "simulated time: 10.000 ns -> 10.000 ns (+0.000 ns, +0.00 %)\n",
        "launch #0 gemm: span 5.000 ns -> 5.000 ns (+0.000 ns, +0.00 %)\n",
        // pe_dma busy [2000, 2400) + [2500, 3000) = 900 -> [2000, 3000) = 1000.
        "    pe_dma             0.900           1.000          +0.100  (+11.11 %)\n",
        "launch #1 softmax: span 1.000 ns -> 1.000 ns (+0.000 ns, +0.00 %)\n  busy by unit kind: no change\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let o = run(&["diff", s(&pa), "-", "--format", "json"], Some(&b));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["topology"][0]["path"], "links.cube_link.bw_gbs");
    assert_eq!(
        v["attribution"][0]["busy_ps"]["op_name"][0]["key"],
        "dma_read"
    );
    // dma_read's union on pe_dma, as pe_dma's above: +100 ps.
    assert_eq!(v["attribution"][0]["busy_ps"]["op_name"][0]["delta"], 100);
    // The summary's bound-by line, on the same trace.
    let o = run(&["summary", "-"], Some(&b));
    ok(&o);
    assert!(
        stdout(&o)
            .contains("     bound by: pe_dma (sip0.cube0.pe0.pe_dma busy 20.0 % of the span)\n"),
        "{}",
        stdout(&o)
    );
}

/// Every command, on a file and on stdin, exits 2 with kb-format's message
/// on a truncated or corrupted trace, and never panics.
#[test]
fn damaged_traces_exit_2_for_every_command() {
    let f = fixture();
    let good = f.dir.join("good.kbt");
    std::fs::write(&good, &f.bytes).unwrap();
    let out = f.dir.join("out");
    let outs = s(&out);
    let cmds: Vec<Vec<&str>> = vec![
        vec!["summary"],
        vec!["ops"],
        vec!["ops", "--limit", "1"],
        vec!["stats"],
        vec!["critical-path"],
        vec!["timeline", "-o", outs],
        vec!["tensors"],
        vec!["tensor", "a", "-o", outs],
    ];
    for (what, bytes) in testutil::damaged(&f.bytes) {
        let bad = f.dir.join("bad.kbt");
        std::fs::write(&bad, &bytes).unwrap();
        for cmd in &cmds {
            for src in [s(&bad), "-"] {
                let mut args = vec![cmd[0], src];
                args.extend_from_slice(&cmd[1..]);
                let o = run(&args, Some(&bytes));
                let err = stderr(&o);
                assert_eq!(
                    o.status.code(),
                    Some(2),
                    "{what}: {args:?} succeeded:\n{}",
                    stdout(&o)
                );
                assert!(!err.contains("panicked"), "{what}: {args:?}: {err}");
                let name = if src == "-" { "<stdin>" } else { s(&bad) };
                assert!(
                    err.starts_with(&format!("kb-inspect: {name}: ")),
                    "{what}: {args:?}: {err}"
                );
            }
        }
        for (x, y) in [(s(&bad), s(&good)), (s(&good), "-")] {
            let o = run(&["diff", x, y], Some(&bytes));
            assert_eq!(o.status.code(), Some(2), "{what}: diff {x} {y}");
            assert!(!stderr(&o).contains("panicked"));
        }
    }
}

#[test]
fn critical_path_on_both_sources() {
    // testutil::critical_trace: two launches (their paths computed by hand
    // in kb-inspect's critical module tests).
    let bytes = testutil::critical_trace();
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("crit.kbt");
    std::fs::write(&trace, &bytes).unwrap();
    let t = s(&trace);
    let table = run(&["critical-path", t], None);
    ok(&table);
    let text = stdout(&table);
    assert!(
        text.starts_with(
            "launch 0 (two_pe): 1.000..14.000 ns, span 13.000 ns; end op: op 10 kernel"
        ),
        "{text}"
    );
    assert!(text.contains("\nsummary: 24.6 % dma_read on pe_dma, 23.1 % dma_write on pe_dma, 23.1 % exp on pe_math\n"), "{text}");
    assert!(
        text.contains("\nlaunch 1 (tail): 14.000..15.000 ns"),
        "{text}"
    );
    let piped = run(&["critical-path", "-"], Some(&bytes));
    ok(&piped);
    assert_eq!(stdout(&piped), text);
    // JSON: every launch as an array; one launch as an object.
    let all = run(&["critical-path", t, "--format", "json"], None);
    ok(&all);
    let v: Value = serde_json::from_str(&stdout(&all)).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    for p in v.as_array().unwrap() {
        let sum = |k: &str| p[k].as_u64().unwrap();
        assert_eq!(
            sum("op_ps") + sum("wait_ps") + sum("unexplained_ps"),
            sum("span_ps")
        );
        let segs: u64 = p["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["dur_ps"].as_u64().unwrap())
            .sum();
        assert_eq!(segs, sum("span_ps"));
    }
    assert_eq!(v[0]["span_ps"], 13_000);
    assert_eq!(v[0]["wait_ps"], 400);
    let one = run(
        &["critical-path", "-", "--launch", "1", "--format", "json"],
        Some(&bytes),
    );
    ok(&one);
    let one: Value = serde_json::from_str(&stdout(&one)).unwrap();
    assert_eq!(one, v[1]);
    assert_eq!(
        one["summary"],
        "80.0 % dma_read on pe_dma, 20.0 % host wait"
    );
    let csv = run(&["critical-path", t, "--format", "csv"], None);
    ok(&csv);
    assert_eq!(stdout(&csv).lines().count(), 1 + 11 + 2);
    // A launch the trace lacks, a trace without launches: exit 2, the file named.
    let o = run(&["critical-path", t, "--launch", "2"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with(&format!(
            "kb-inspect: {t}: --launch 2: the trace has 2 launches"
        )),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
    let plain = d.path().join("plain.kbt");
    std::fs::write(&plain, testutil::route_trace()).unwrap();
    let o = run(&["critical-path", s(&plain)], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("the trace has no launches"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_arguments_and_missing_files_exit_2() {
    let f = fixture();
    for args in [
        vec!["ops", s(&f.trace), "--kind", "dma"],
        vec!["ops", s(&f.trace), "--from", "-3"],
        vec!["ops", s(&f.trace), "--component", "["],
        vec!["ops", s(&f.trace), "--from", "5", "--to", "1"],
        vec!["stats", s(&f.trace), "--by", "colour"],
        vec!["summary"],
        vec!["summary", "/nonexistent/trace.kbt"],
        vec!["tensor", s(&f.trace), "zz", "-o", "/tmp/x.npy"],
        vec!["timeline", s(&f.trace), "-o", "/nonexistent/dir/t.json"],
        vec!["frobnicate"],
    ] {
        let o = run(&args, None);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
        assert!(!stderr(&o).is_empty());
    }
    let o = run(&["--help"], None);
    ok(&o);
    assert!(stdout(&o).contains("Exit codes:"));
}

#[cfg(unix)]
#[test]
fn a_named_pipe_is_read_as_a_stream() {
    let f = fixture();
    let fifo = f.dir.join("pipe.kbt");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (path, bytes) = (fifo.clone(), f.bytes.clone());
    // Opening a FIFO for writing blocks until the reader opens it.
    let writer = std::thread::spawn(move || {
        let _ = std::fs::write(&path, &bytes);
    });
    let o = run(&["summary", s(&fifo)], None);
    writer.join().unwrap();
    ok(&o);
    assert!(stdout(&o).contains("records:        7"), "{}", stdout(&o));
}
