//! The host-memory guard: `kb-sim --max-memory` refuses, at setup, a run
//! whose estimate passes the limit (exit 2, the estimate and its parts
//! named, no trace left), before it allocates what it cannot hold; by
//! default the limit is the tightest the process runs under (available
//! memory, ulimit -v / -d, cgroup); an allocation that fails anyway exits
//! 2 with no partial trace.

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

/// Runs `kb-sim ARGS` under `ulimit LIMIT` (a shell sets it, then execs
/// kb-sim), in `dir`.
#[cfg(target_os = "linux")]
fn under_ulimit(limit: &str, args: &[&str], dir: &std::path::Path) -> std::process::Output {
    let script = format!("ulimit {limit} && exec \"$0\" \"$@\"");
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(kb_e2e::bin("kb-sim"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// The directory's entries (hidden partial files included).
#[cfg(target_os = "linux")]
fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn the_default_limit_is_the_address_space_or_data_limit_when_tighter() {
    // vector_add's a of 65536 x 16384 f32 (4 GiB of host data) against
    // a 4 GB address space (the case at half this size died by
    // SIGABRT, leaving a partial trace).
    let d = tempfile::tempdir().unwrap();
    let args = [
        "-t",
        "small",
        "-b",
        "vector_add",
        "-p",
        "rows=65536",
        "-p",
        "cols=16384",
        "-o",
        "big.kbt",
    ];
    let r = under_ulimit("-v 4000000", &args, d.path());
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let msg = stderr(&r);
    // On a machine with less memory available than that, MemAvailable
    // binds instead.
    let available = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    if available > 4_096_000_000.0 {
        assert!(msg.contains("address-space limit (ulimit -v)"), "{msg}");
        // 4,000,000 KiB less what kb-sim maps: below 3.82 GiB.
        let limit = size_after(&msg, "more than the");
        assert!(limit < 4_096_000_000.0 && limit > 3_000_000_000.0, "{msg}");
    }
    assert_eq!(entries(d.path()), Vec::<String>::new());
    // The data-segment limit, likewise (128 MiB tensors against 100 MB).
    let args = [
        "-t",
        "small",
        "-b",
        "vector_add",
        "-p",
        "rows=2048",
        "-p",
        "cols=16384",
        "-o",
        "big.kbt",
    ];
    let r = under_ulimit("-d 100000", &args, d.path());
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("data-segment limit (ulimit -d)"),
        "{}",
        stderr(&r)
    );
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[cfg(target_os = "linux")]
#[test]
fn an_allocation_that_fails_anyway_exits_2_and_leaves_no_partial_trace() {
    // --max-memory set past the real limit: the guard lets the run start,
    // and making a 64 MiB input fails under a 40 MB address space.
    let d = tempfile::tempdir().unwrap();
    let args = [
        "-t",
        "small",
        "-b",
        "vector_add",
        "-p",
        "rows=16384",
        "-p",
        "cols=1024",
        "--max-memory",
        "100G",
        "-o",
        "oom.kbt",
    ];
    let r = under_ulimit("-v 40000", &args, d.path());
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("an allocation failed"),
        "{}",
        stderr(&r)
    );
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

/// A child of this process's memory cgroup with `limit` bytes, where the
/// machine lets a test make one (cgroup v1 `memory` or v2 `memory.max`):
/// its directory and the file the limit went into.
#[cfg(target_os = "linux")]
fn child_cgroup(limit: u64) -> Option<std::path::PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (dir, file) = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_start_matches('/');
        if ctrl.split(',').any(|c| c == "memory") {
            Some((
                format!("/sys/fs/cgroup/memory/{path}"),
                "memory.limit_in_bytes",
            ))
        } else if ctrl.is_empty()
            && std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        {
            Some((format!("/sys/fs/cgroup/{path}"), "memory.max"))
        } else {
            None
        }
    })?;
    let child = std::path::Path::new(&dir).join(format!("kb-test-{}", std::process::id()));
    std::fs::create_dir(&child).ok()?;
    if std::fs::write(child.join(file), limit.to_string()).is_err() {
        let _ = std::fs::remove_dir(&child);
        return None;
    }
    Some(child)
}

#[cfg(target_os = "linux")]
#[test]
fn the_default_limit_is_the_cgroups_where_a_test_can_make_one() {
    let Some(cg) = child_cgroup(300 << 20) else {
        eprintln!("no child memory cgroup can be made here: skipped");
        return;
    };
    let d = tempfile::tempdir().unwrap();
    // 128 MiB of host data, 192 MiB of device data, against 300 MiB.
    let r = std::process::Command::new("sh")
        .arg("-c")
        .arg("echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(&cg)
        .arg(kb_e2e::bin("kb-sim"))
        .args([
            "-t",
            "small",
            "-b",
            "vector_add",
            "-p",
            "rows=4096",
            "-p",
            "cols=4096",
        ])
        .args(["-o", "cg.kbt"])
        .current_dir(d.path())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("the cgroup memory limit"),
        "{}",
        stderr(&r)
    );
    assert_eq!(entries(d.path()), Vec::<String>::new());
}
