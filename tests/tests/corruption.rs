//! Every truncation and many corruptions of a real trace make kb-replay and
//! kb-inspect exit 2 with a message, never panic.

use kb_e2e::*;

fn small_trace() -> Vec<u8> {
    let o = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "copy",
            "-o",
            "-",
            "-p",
            "rows=8",
            "-p",
            "cols=8",
            "-p",
            "tile_rows=2",
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    o.stdout
}

/// Both tools reject `bytes` read from a file and, when `stdin_too`, from stdin.
fn check_rejected(bytes: &[u8], dir: &std::path::Path, what: &str, stdin_too: bool) {
    let p = dir.join("t.kbt");
    std::fs::write(&p, bytes).unwrap();
    let p = p.to_str().unwrap();
    assert_clean_error(
        &run("kb-replay", &[p, "--verify"], b""),
        &format!("kb-replay file, {what}"),
    );
    assert_clean_error(
        &run("kb-inspect", &["summary", p], b""),
        &format!("kb-inspect file, {what}"),
    );
    if stdin_too {
        assert_clean_error(
            &run("kb-replay", &["-", "--verify"], bytes),
            &format!("kb-replay stdin, {what}"),
        );
        assert_clean_error(
            &run("kb-inspect", &["summary", "-"], bytes),
            &format!("kb-inspect stdin, {what}"),
        );
    }
}

#[test]
fn every_truncation_is_a_clean_error() {
    let t = small_trace();
    assert!(
        t.len() < 8192,
        "sample trace should stay small, is {} bytes",
        t.len()
    );
    let dir = tempfile::tempdir().unwrap();
    // Every offset through a file; stdin at every 5th offset, since the
    // stream reader is also covered byte by byte by kb-format's own tests.
    for cut in 0..t.len() {
        check_rejected(
            &t[..cut],
            dir.path(),
            &format!("cut at {cut}"),
            cut % 5 == 0,
        );
    }
    // A cut in a pipe says it was truncated.
    let o = run("kb-replay", &["--verify"], &t[..t.len() / 2]);
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
}

#[test]
fn corrupted_bytes_are_clean_errors() {
    let t = small_trace();
    let dir = tempfile::tempdir().unwrap();
    let step = (t.len() / 400).max(1);
    for at in (0..t.len()).step_by(step) {
        let mut bad = t.clone();
        bad[at] ^= 0x20;
        check_rejected(&bad, dir.path(), &format!("flip at {at}"), true);
    }
}
