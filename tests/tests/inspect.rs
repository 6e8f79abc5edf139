//! kb-inspect on real traces from every built-in benchmark, from a file
//! and from stdin; diff across runs and seeds; kernel failures via the CLI.

use kb_e2e::*;

fn benches() -> Vec<String> {
    let list = run("kb-sim", &["list"], b"");
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

fn trace(bench: &str, seed: &str) -> Vec<u8> {
    let o = run(
        "kb-sim",
        &["-q", "-t", "small", "-b", bench, "--seed", seed, "-o", "-"],
        b"",
    );
    assert!(o.status.success(), "{bench}: {}", stderr(&o));
    o.stdout
}

#[test]
fn every_command_works_on_every_benchmark_from_file_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    for bench in benches() {
        let bytes = trace(&bench, "1");
        let path = dir.path().join(format!("{bench}.kbt"));
        std::fs::write(&path, &bytes).unwrap();
        let p = path.to_str().unwrap();
        let json = dir.path().join("t.json");
        let j = json.to_str().unwrap();
        let pq = dir.path().join("ops.parquet");
        let pq = pq.to_str().unwrap();
        let pf = dir.path().join("t.pftrace");
        let pf = pf.to_str().unwrap();
        let svg = dir.path().join("t.svg");
        let svg = svg.to_str().unwrap();
        for src in [p, "-"] {
            let stdin: &[u8] = if src == "-" { &bytes } else { b"" };
            let cmds: Vec<Vec<&str>> = vec![
                vec!["summary", src],
                vec!["ops", src, "--limit", "5", "--format", "json"],
                vec!["ops", src, "--component", "*pe_dma", "--format", "csv"],
                vec!["stats", src, "--by", "op_name"],
                vec!["timeline", src, "-o", j],
                vec!["timeline", src, "-o", pf],
                vec!["export", src, "-o", pq],
                vec!["plot", src, "-o", svg],
                vec!["tensors", src],
            ];
            for args in cmds {
                let o = run("kb-inspect", &args, stdin);
                assert_eq!(o.status.code(), Some(0), "{bench} {args:?}: {}", stderr(&o));
                assert!(
                    !o.stdout.is_empty() || ["timeline", "export", "plot"].contains(&args[0]),
                    "{bench} {args:?}: no output"
                );
            }
            let timeline = std::fs::read_to_string(&json).unwrap();
            assert!(
                timeline.contains("\"traceEvents\"") || timeline.starts_with('['),
                "{bench}: {}",
                &timeline[..80.min(timeline.len())]
            );
        }
        let summary =
            String::from_utf8_lossy(&run("kb-inspect", &["summary", p], b"").stdout).into_owned();
        assert!(
            summary.contains(&bench) && summary.contains("small"),
            "{summary}"
        );
    }
}

#[test]
fn diff_of_same_input_is_0_and_of_another_seed_is_1_naming_the_op() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<String> = ["1", "1", "2"]
        .iter()
        .enumerate()
        .map(|(i, seed)| {
            let p = dir.path().join(format!("{i}.kbt"));
            std::fs::write(&p, trace("gemm", seed)).unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();
    let same = run("kb-inspect", &["diff", &paths[0], &paths[1]], b"");
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    let other = run("kb-inspect", &["diff", &paths[0], &paths[2]], b"");
    assert_eq!(other.status.code(), Some(1), "{}", stderr(&other));
    let text = String::from_utf8_lossy(&other.stdout);
    // The first upload of the other seed's data (after the map records).
    assert!(
        text.contains("first divergent op by data fingerprint: op ") && text.contains("host_write"),
        "the first divergent op is named: {text}"
    );
    let json = run(
        "kb-inspect",
        &["diff", &paths[0], &paths[2], "--format", "json"],
        b"",
    );
    assert_eq!(json.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&json.stdout)
            .trim_start()
            .starts_with('{')
    );
}

#[test]
fn a_kernel_out_of_tcm_exits_2_naming_pe_and_sizes() {
    // One 8 x 65536 f32 block (2 MiB) cannot fit small's 1 MiB TCM.
    let o = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "softmax",
            "-p",
            "rows=32",
            "-p",
            "cols=65536",
            "-o",
            "-",
        ],
        b"",
    );
    assert_clean_error(&o, "out of TCM");
    let e = stderr(&o);
    assert!(
        e.contains("out of TCM") && e.contains("sip0.cube0.pe") && e.contains("2097152-byte tile"),
        "{e}"
    );
    assert!(e.contains("kernel softmax[") && e.contains(" ns"), "{e}");
}

#[test]
fn both_executors_give_identical_trace_bytes_from_the_cli() {
    let a = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "gemm_tiled",
            "--executor",
            "coroutine",
            "-o",
            "-",
        ],
        b"",
    );
    let b = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "gemm_tiled",
            "--executor",
            "thread",
            "-o",
            "-",
        ],
        b"",
    );
    assert!(a.status.success() && b.status.success());
    // The executor is not part of the recorded command line: same bytes.
    assert!(a.stdout == b.stdout, "the executors wrote different traces");
    let (ra, rb) = (
        run("kb-inspect", &["ops", "-", "--format", "jsonl"], &a.stdout),
        run("kb-inspect", &["ops", "-", "--format", "jsonl"], &b.stdout),
    );
    assert!(ra.status.success() && !ra.stdout.is_empty());
    assert!(ra.stdout == rb.stdout, "the executors logged different ops");
}

#[test]
fn a_trace_through_a_pipe_and_one_written_to_a_file_are_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.kbt");
    let piped = run("kb-sim", &["-q", "-t", "small", "-b", "softmax"], b"");
    let written = run(
        "kb-sim",
        &["-t", "small", "-b", "softmax", "-o", file.to_str().unwrap()],
        b"",
    );
    assert!(piped.status.success() && written.status.success());
    let written = std::fs::read(&file).unwrap();
    assert!(!piped.stdout.is_empty());
    assert!(
        piped.stdout == written,
        "kb-sim > a.kbt and kb-sim -o b.kbt differ"
    );
    let s = run("kb-inspect", &["summary", "-"], &written);
    let text = String::from_utf8_lossy(&s.stdout);
    assert!(
        text.contains("command line:   kb-sim -t small -b softmax --seed 0"),
        "{text}"
    );
}

/// The check: a slower cube link, diffed. The change is named by
/// its field path, and the copies over cube links are where the time went.
#[test]
fn diff_of_a_slower_cube_link_names_the_field_and_the_copies_that_slowed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.kbt"), dir.path().join("b.kbt"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let base = ["-q", "-t", "default", "-b", "tp_mlp", "-p", "group=sip"];
    let sim = |out: &str, extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", out]);
        let o = run("kb-sim", &args, b"");
        assert!(o.status.success(), "{}", stderr(&o));
    };
    sim(a, &[]);
    sim(b, &["--set", "links.cube_link.bw_gbs=32"]);
    let text = run("kb-inspect", &["diff", a, b], b"");
    assert_eq!(text.status.code(), Some(1), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("links.cube_link.bw_gbs: 256.0 -> 32.0"),
        "{text}"
    );
    let o = run("kb-inspect", &["diff", a, b, "--format", "json"], b"");
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d["topology"][0]["path"], "links.cube_link.bw_gbs");
    let busy = &d["attribution"][0]["busy_ps"];
    // The largest change by op name: the all-reduce's copies, slower.
    let first = &busy["op_name"][0];
    assert_eq!(first["key"], "ipcq_copy", "{busy}");
    assert!(first["delta"].as_i64().unwrap() > 0);
    // By route: the largest changes all cross a cube link (from one
    // cube's memory into the next cube's TCM).
    for r in busy["route"].as_array().unwrap().iter().take(8) {
        let key = r["key"].as_str().unwrap();
        let cube = |side: &str| side.split('.').nth(1).map(str::to_string);
        let (src, dst) = key.split_once(" -> ").unwrap();
        assert_ne!(cube(src), cube(dst), "{key} does not cross a cube link");
        assert!(r["delta"].as_i64().unwrap() > 0, "{r}");
    }
    // One simulated time, summary's.
    let s = run("kb-inspect", &["summary", b, "--format", "json"], b"");
    let s: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(
        d["sim_time_ps"]["b"], s["sim_time_ps"],
        "{}",
        d["sim_time_ps"]
    );
}
