//! Output hygiene: an interrupted kb-sim or kb-inspect leaves nothing
//! behind (SIGINT, SIGTERM and SIGHUP remove the partial output and exit
//! 128 + the signal), and binary output (traces, .npy) never goes to a
//! terminal.

#![cfg(unix)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kb_e2e::{bin, on_a_terminal, run, stderr};

#[test]
fn a_signal_removes_the_partial_trace_and_exits_128_plus_its_number() {
    for (sig, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run.kbt");
        // Long enough (seconds in a debug build) to be caught mid-run.
        let mut child = Command::new(bin("kb-sim"))
            .args(["-q", "-t", "large", "-b", "gemm_tiled"])
            .args(["-p", "m=1024", "-p", "n=1024", "-p", "k=1024"])
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let partial = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains(".partial"))
        };
        let start = Instant::now();
        while !partial() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no partial file appeared"
            );
            assert!(child.try_wait().unwrap().is_none(), "kb-sim ended early");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(interrupt(&mut child, sig), Some(code), "SIG{sig}");
        let left = files_in(dir.path());
        assert!(left.is_empty(), "SIG{sig} left {left:?}");
    }
}

/// Send SIG`sig` to `child` once its handler is in place (it is
/// registered just after the output file is created); its exit code.
fn interrupt(child: &mut std::process::Child, sig: &str) -> Option<i32> {
    std::thread::sleep(Duration::from_millis(200));
    let killed = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait().unwrap().code()
}

/// The names of the files in `dir`.
fn files_in(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect()
}

/// Binary output never goes to a terminal, whatever the path names it:
/// kb-sim's trace and kb-inspect's .npy export.
#[test]
fn binary_output_is_not_written_to_a_terminal_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.kbt");
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "softmax",
            "-o",
            trace.to_str().unwrap(),
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let (sim, inspect) = (bin("kb-sim"), bin("kb-inspect"));
    for out in ["/dev/tty", "/dev/stdout", "-"] {
        for (cmd, refusal, magic) in [
            (
                format!("{} -q -t small -o {out}", sim.display()),
                "refusing to write a binary trace to a terminal",
                "KBT",
            ),
            (
                format!(
                    "{} tensor {} x -o {out}",
                    inspect.display(),
                    trace.display()
                ),
                "refusing to write .npy bytes to a terminal",
                "NUMPY",
            ),
        ] {
            let Some(text) = on_a_terminal(&format!("{cmd}; echo rc=$?")) else {
                eprintln!("skipped: no `script` to provide a terminal");
                return;
            };
            assert!(
                text.contains(refusal) && text.contains("rc=2"),
                "{cmd}: {text}"
            );
            assert!(
                !text.contains(magic),
                "{cmd}: binary bytes reached the terminal"
            );
        }
    }
    // A pipe still gets the .npy bytes.
    let o = run(
        "kb-inspect",
        &["tensor", trace.to_str().unwrap(), "x", "-o", "-"],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.starts_with(b"\x93NUMPY"));
}

/// kb-sim's text commands whose reader has gone (`| head -1` that already
/// exited): they exit 0, say nothing, and never panic.
#[test]
fn text_commands_survive_a_closed_stdout() {
    let cases: [&[&str]; 4] = [
        &["topology", "large", "--fields"],
        &["topology", "large"],
        &[
            "probe",
            "-t",
            "large",
            "--from",
            "sip0.cube0.pe0.pe_dma",
            "--to",
            "sip0.cube0.hbm_ctrl",
        ],
        &["list"],
    ];
    for args in cases {
        // A pipe whose reading end is closed before kb-sim starts: its
        // first write fails with EPIPE, every time.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(bin("kb-sim"))
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "kb-sim {args:?}: {err}");
        assert!(err.is_empty(), "kb-sim {args:?}: {err}");
    }
}

/// kb-replay and kb-inspect too: output to a reader that has gone (a pipe
/// closed before they start, and a real `| head -c 5` that closes it
/// after a few bytes) ends them quietly with their usual status, and a
/// closed stderr never panics them either (kb-replay's errors went through
/// `eprintln!`, which panics there).
#[test]
fn every_tool_survives_a_closed_stdout_or_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.kbt");
    let o = run(
        "kb-sim",
        &["-q", "-t", "small", "-b", "gemm", "-o", t.to_str().unwrap()],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let t = t.to_str().unwrap();
    let cases: [(&str, Vec<&str>, i32); 7] = [
        ("kb-sim", vec!["-q", "-t", "small", "-b", "gemm"], 0),
        ("kb-replay", vec![t, "--verify", "--report", "-"], 0),
        // The verdict lines (stdout) to a reader that has gone.
        ("kb-replay", vec![t, "--verify"], 0),
        ("kb-inspect", vec!["ops", t], 0),
        ("kb-inspect", vec!["summary", t], 0),
        ("kb-inspect", vec!["--help"], 0),
        ("kb-sim", vec!["topology", "large", "--fields"], 0),
    ];
    for (tool, args, code) in &cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(bin(tool))
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{tool} {args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{tool} {args:?}: {err}"
        );
        // A real pipe that its reader closes after 5 bytes.
        let cmd = format!(
            "{} {} | head -c 5 >/dev/null; echo \"rc=${{PIPESTATUS[0]}}\"",
            bin(tool).display(),
            args.join(" ")
        );
        let o = Command::new("bash").args(["-c", &cmd]).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(text.contains(&format!("rc={code}")), "{cmd}: {text} {err}");
        assert!(!err.contains("panicked"), "{cmd}: {err}");
    }
    // A closed stderr: kb-replay's error (a missing trace) exits 2 with
    // no panic, and a clean replay exits 0.
    for (args, code) in [
        (vec!["/nonexistent.kbt", "--verify"], 2),
        (vec![t, "--verify", "-j", "1000000"], 0),
    ] {
        let mut child = Command::new(bin("kb-replay"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stderr.take());
        assert_eq!(
            child.wait().unwrap().code(),
            Some(code),
            "kb-replay {args:?}"
        );
    }
}

/// Long commands say where they are on a terminal, and nothing in a pipe:
/// kb-sim's spinner (simulated time, records) and kb-replay's verification
/// spinner (which output's reference it computes).
#[test]
fn progress_shows_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.kbt");
    let (sim, replay, inspect) = (bin("kb-sim"), bin("kb-replay"), bin("kb-inspect"));
    let json = dir.path().join("t.json");
    let parquet = dir.path().join("t.parquet");
    let cmd = format!(
        "{} -t small -b softmax -o {t} && {} {t} --verify && {i} timeline {t} -o {} && {i} export {t} -o {}",
        sim.display(),
        replay.display(),
        json.display(),
        parquet.display(),
        t = t.display(),
        i = inspect.display(),
    );
    let Some(text) = on_a_terminal(&format!("{cmd}; echo rc=$?")) else {
        eprintln!("skipped: no `script` to provide a terminal");
        return;
    };
    assert!(text.contains("rc=0"), "{text}");
    assert!(text.contains("kb-sim: simulating, "), "{text}");
    // The verification spinner may not get a tick on a short run; its
    // summary follows it either way.
    assert!(text.contains("verification PASSED"), "{text}");
    // kb-inspect's bars over the records, the footer giving the total.
    for what in ["timeline", "export"] {
        assert!(
            text.contains(&format!("{what} ")) && text.contains(" records ("),
            "{text}"
        );
    }
    // In a pipe: the summary lines only.
    let o = run(
        "kb-sim",
        &["-t", "small", "-b", "softmax", "-o", t.to_str().unwrap()],
        b"",
    );
    assert!(o.status.success());
    assert!(!stderr(&o).contains("simulating"), "{}", stderr(&o));
    let o = run(
        "kb-inspect",
        &[
            "timeline",
            t.to_str().unwrap(),
            "-o",
            json.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success());
    assert!(!stderr(&o).contains(" records ("), "{}", stderr(&o));
}

/// A reader of stderr that has gone (`2>&1 | head -1`) does not fail a
/// run whose outputs are written: kb-sim run, sweep, and kb-inspect export
/// and timeline exit 0 with their files in place.
#[test]
fn a_closed_stderr_fails_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (t, sweep, parquet, json) = (p("t.kbt"), p("s.csv"), p("o.parquet"), p("t.json"));
    let cases: [(&str, Vec<&str>, &str); 4] = [
        ("kb-sim", vec!["-t", "small", "-b", "gemm", "-o", &t], &t),
        (
            "kb-sim",
            vec![
                "sweep", "-t", "small", "-b", "gemm", "-p", "m=64,128", "-o", &sweep,
            ],
            &sweep,
        ),
        ("kb-inspect", vec!["export", &t, "-o", &parquet], &parquet),
        ("kb-inspect", vec!["timeline", &t, "-o", &json], &json),
    ];
    for (tool, args, out) in cases {
        let mut child = Command::new(bin(tool))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes before anything is written.
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{tool} {args:?}");
        assert!(
            std::path::Path::new(out).exists(),
            "{tool} {args:?}: no {out}"
        );
    }
}

/// kb-inspect's outputs too: a timeline or an export interrupted while it
/// reads its trace (a stream that stops mid-way, so the signal comes while
/// the output is open) leaves no partial file and exits 128 + the signal.
#[test]
fn an_interrupted_timeline_or_export_leaves_nothing() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.kbt");
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "softmax",
            "-o",
            trace.to_str().unwrap(),
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let bytes = std::fs::read(&trace).unwrap();
    for (cmd, name, sig, code) in [
        ("timeline", "t.json", "INT", 130),
        ("export", "o.parquet", "TERM", 143),
    ] {
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let mut child = Command::new(bin("kb-inspect"))
            .args([cmd, "-", "-o"])
            .arg(out.join(name))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Half the trace; the pipe stays open, so it waits for the rest.
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&bytes[..bytes.len() / 2]).unwrap();
        let start = Instant::now();
        while files_in(&out).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{cmd}: no partial file"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(interrupt(&mut child, sig), Some(code), "{cmd} SIG{sig}");
        drop(stdin);
        let left = files_in(&out);
        assert!(left.is_empty(), "{cmd}: SIG{sig} left {left:?}");
    }
}

#[test]
fn outputs_through_a_symlink_update_its_target_and_keep_the_link() {
    // `-o latest.kbt` where latest.kbt -> runs/run1.kbt: the run writes
    // runs/run1.kbt and latest.kbt stays the link (it was replaced by a
    // plain file, leaving run1.kbt stale).
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::fs::write(runs.join("run1.kbt"), b"stale").unwrap();
    let link = d.path().join("latest.kbt");
    std::os::unix::fs::symlink("runs/run1.kbt", &link).unwrap();
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "copy",
            "-o",
            link.to_str().unwrap(),
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let trace = std::fs::read(runs.join("run1.kbt")).unwrap();
    assert!(trace.len() > 1000 && trace != b"stale");
    // And a kb-inspect export through the same kind of link.
    let csv_link = d.path().join("ops.csv");
    std::os::unix::fs::symlink("runs/ops-real.csv", &csv_link).unwrap();
    let out = run(
        "kb-inspect",
        &[
            "export",
            link.to_str().unwrap(),
            "--format",
            "csv",
            "-o",
            csv_link.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(&csv_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let csv = std::fs::read_to_string(runs.join("ops-real.csv")).unwrap();
    assert!(csv.starts_with("op_id,"), "{}", &csv[..csv.len().min(200)]);
    // Nothing else was left beside either file.
    let mut left: Vec<_> = files_in(&runs);
    left.sort();
    assert_eq!(left, ["ops-real.csv", "run1.kbt"]);
}

#[test]
fn an_interrupted_replay_dump_leaves_nothing() {
    // kb-replay --dump-outputs writes each output through a partial file;
    // SIGINT removed it (it left .y.npy.partial*). A bf16 output of 4096 x
    // 4096 (64 MiB as f32 .npy) keeps the partial file there for a while.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.kbt");
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "copy",
            "-p",
            "rows=4096",
            "-p",
            "cols=4096",
            "-p",
            "dtype=bf16",
            "-o",
            trace.to_str().unwrap(),
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let out = dir.path().join("dump");
    std::fs::create_dir(&out).unwrap();
    let mut child = Command::new(bin("kb-replay"))
        .arg(&trace)
        .arg("--dump-outputs")
        .arg(&out)
        .arg("-q")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while files_in(&out).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no partial dump file"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(interrupt(&mut child, "INT"), Some(130));
    let left = files_in(&out);
    assert!(left.is_empty(), "SIGINT left {left:?}");
}
