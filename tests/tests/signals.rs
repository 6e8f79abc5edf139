//! kb-sim's output hygiene: an interrupted run leaves nothing behind
//! (SIGINT, SIGTERM and SIGHUP remove the partial trace and exit 128 + the
//! signal), and a trace never goes to a terminal.

#![cfg(unix)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kb_e2e::bin;

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
        // The handler is registered just after the file is created.
        std::thread::sleep(Duration::from_millis(200));
        let killed = Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "SIG{sig}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "SIG{sig} left {left:?}");
    }
}

/// `script` (util-linux) runs a command on a pseudo-terminal.
#[test]
fn a_binary_trace_is_not_written_to_a_terminal_whatever_its_name() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` to provide a terminal");
        return;
    }
    let sim = bin("kb-sim");
    for out in ["/dev/tty", "/dev/stdout", "-"] {
        let cmd = format!("{} -q -t small -o {out}; echo rc=$?", sim.display());
        let o = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("refusing to write a binary trace to a terminal")
                && text.contains("rc=2"),
            "{out}: {text}"
        );
        assert!(
            !text.contains("KBT"),
            "{out}: trace bytes reached the terminal"
        );
    }
}
