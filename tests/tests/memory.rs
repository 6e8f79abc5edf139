//! The host-memory guard: `kb-sim --max-memory` refuses, at setup, a run
//! whose estimate passes the limit (exit 2, the estimate and its parts
//! named, no trace left), before it allocates what it cannot hold.

use kb_e2e::{run, stderr};

const MIB: f64 = 1024.0 * 1024.0;

/// The size after `label` in the message (`label 32 MiB` -> 32 MiB in
/// bytes).
fn size_after(msg: &str, label: &str) -> f64 {
    let rest = &msg[msg
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} in {msg}"))
        + label.len()..];
    let mut it = rest.split_whitespace();
    let v: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap().trim_end_matches([',', ')']);
    v * match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB,
        "GiB" => 1024.0 * MIB,
        u => panic!("unit {u}"),
    }
}

#[test]
fn a_run_over_max_memory_exits_2_naming_the_estimate_and_leaves_no_trace() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("run.kbt");
    let r = run(
        "kb-sim",
        &[
            "-t",
            "large",
            "-b",
            "gemm_tiled",
            "-p",
            "m=2048",
            "-p",
            "n=2048",
            "-p",
            "k=2048",
            "-p",
            "dtype=f32",
            "--max-memory",
            "100M",
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let msg = stderr(&r);
    assert!(msg.contains("more than --max-memory 100 MiB"), "{msg}");
    assert!(!out.exists(), "no trace after a refused run");
    // Hand-computed parts: A and B are 2048 x 2048 f32 host data (16 MiB
    // each); `large` has 4 x 8 x 8 = 256 PEs with 1 MiB of TCM each, all
    // in the launch. The device data is A's and C's 16 MiB each split
    // over the PEs, and B replicated on every PE but stored once: 48 MiB
    // plus at most two partial 64 KiB pages per shard (3 x 256 shards),
    // where 256 unshared copies of B would be 4 GiB.
    assert_eq!(size_after(&msg, "host data"), 32.0 * MIB, "{msg}");
    assert_eq!(
        size_after(&msg, "TCM of the launches' PEs"),
        256.0 * MIB,
        "{msg}"
    );
    let device = size_after(&msg, "device data");
    assert!(
        (48.0 * MIB..=(48.0 + 3.0 * 256.0 * 2.0 / 16.0) * MIB).contains(&device),
        "device data {device} in {msg}"
    );
    let total = size_after(&msg, "needs about");
    let parts = 32.0 * MIB + device + 256.0 * MIB + 64.0 * MIB;
    assert!(
        (total - parts).abs() <= 0.05 * parts,
        "{total} vs {parts}: {msg}"
    );
}

#[test]
fn host_data_past_the_limit_is_refused_before_it_is_made() {
    // 16384 x 16384 f32 is 1 GiB for A alone: refused when A is declared.
    let r = run(
        "kb-sim",
        &[
            "-t",
            "small",
            "-b",
            "gemm",
            "-p",
            "m=16384",
            "-p",
            "n=16384",
            "-p",
            "k=16384",
            "-p",
            "dtype=f32",
            "--max-memory",
            "100M",
            "-o",
            "-",
        ],
        b"",
    );
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let msg = stderr(&r);
    assert!(
        msg.contains(
            "tensor a would bring the run's host data to 1 GiB, more than --max-memory 100 MiB"
        ),
        "{msg}"
    );
    assert!(r.stdout.is_empty(), "no trace bytes");
}

#[test]
fn a_run_within_the_limit_runs_and_bad_sizes_are_errors() {
    let r = run(
        "kb-sim",
        &[
            "-t",
            "small",
            "-b",
            "gemm",
            "--max-memory",
            "1G",
            "-q",
            "-o",
            "-",
        ],
        b"",
    );
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(!r.stdout.is_empty());
    for bad in ["12X", "-5M", ""] {
        let flag = format!("--max-memory={bad}");
        let r = run("kb-sim", &["-b", "gemm", &flag, "-o", "-"], b"");
        assert_eq!(r.status.code(), Some(2), "{bad:?}: {}", stderr(&r));
        assert!(stderr(&r).contains("--max-memory"), "{}", stderr(&r));
    }
}
