//! docs/writing-kernels.md's `sh` blocks, run line by line with the
//! workspace's binaries on PATH, in an empty directory. A line ending in
//! `# exit 2` must exit 2; every other line must succeed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn guide() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/writing-kernels.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `sh` blocks' lines.
fn commands(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in doc.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh && !l.is_empty() => out.push(l.to_string()),
            _ => {}
        }
    }
    out
}

/// The directory of the built binaries, checked to hold all three.
fn bin_dir() -> PathBuf {
    let sim = PathBuf::from(env!("CARGO_BIN_EXE_kb-sim-example-kernels"));
    let dir = sim.parent().expect("target dir").to_path_buf();
    for name in ["kb-replay", "kb-inspect"] {
        let p = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        assert!(
            p.exists(),
            "{} is not built; run `cargo test --workspace`",
            p.display()
        );
    }
    dir
}

#[test]
fn every_command_of_the_guide_does_what_it_says() {
    let doc = guide();
    let cmds = commands(&doc);
    assert!(cmds.len() >= 8, "found only {} commands", cmds.len());
    let dir = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for cmd in &cmds {
        let want = if cmd.ends_with("# exit 2") { 2 } else { 0 };
        let out = Command::new("bash")
            .args(["-o", "pipefail", "-c", cmd])
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .expect("running bash");
        assert_eq!(
            out.status.code(),
            Some(want),
            "{cmd}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
