//! Helpers for the end-to-end tests in `tests/tests/`: locating the built
//! binaries and running them. `cargo test --workspace` builds every binary
//! of the workspace before running tests, so they sit next to `deps/`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Path of a workspace binary (`kb-sim`, `kb-replay`, `kb-inspect`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile directory");
    let p = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        p.exists(),
        "{} is not built; run `cargo test --workspace`",
        p.display()
    );
    p
}

/// Run a binary with `args`, feeding `stdin` bytes.
pub fn run(name: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(bin(name))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        // The child may exit before reading everything (an error): ignore EPIPE.
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("waiting for child");
    feeder.join().expect("stdin feeder");
    out
}

/// Pipe `a`'s stdout into `b`, as a shell pipeline would.
pub fn pipe(a: (&str, &[&str]), b: (&str, &[&str])) -> (Output, Output) {
    let mut first = Command::new(bin(a.0))
        .args(a.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning producer");
    let second = Command::new(bin(b.0))
        .args(b.1)
        .stdin(first.stdout.take().expect("piped stdout"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning consumer");
    let out_b = second.wait_with_output().expect("consumer");
    let out_a = first.wait_with_output().expect("producer");
    (out_a, out_b)
}

/// Run shell command `cmd` on a pseudo-terminal (util-linux `script`) and
/// return what the terminal showed; `None` where `script` is missing.
pub fn on_a_terminal(cmd: &str) -> Option<String> {
    Command::new("script").arg("--version").output().ok()?;
    let o = Command::new("script")
        .args(["-qec", cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("running script");
    Some(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert a run failed cleanly: exit code 2, a message, no panic.
pub fn assert_clean_error(o: &Output, context: &str) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{context}: expected exit 2, got {:?}; stderr: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{context}: panicked: {err}");
    assert!(!err.trim().is_empty(), "{context}: no error message");
}
