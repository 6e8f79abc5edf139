//! PEs that talk, through the built binaries: collectives and the
//! tensor-parallel MLP verify end to end, the copies are listed and costed
//! per route, and a dropped synchronization is a race naming both ops.

use kb_e2e::*;

#[test]
fn allreduce_every_algorithm_and_tp_mlp_verify_on_default_large_and_la_nto1() {
    for topo in ["default", "large", "la-nto1"] {
        for (bench, params) in [
            ("allreduce", &["algorithm=ring"][..]),
            ("allreduce", &["algorithm=tree"][..]),
            ("allreduce", &["algorithm=auto", "group=all"][..]),
            (
                "allreduce",
                &["algorithm=auto", "dtype=bf16", "memory=tcm"][..],
            ),
            ("tp_mlp", &[][..]),
            ("tp_mlp", &["group=all"][..]),
            ("tp_mlp", &["algorithm=tree", "group=cubes"][..]),
        ] {
            let mut args = vec!["-t", topo, "-b", bench];
            for p in params {
                args.extend(["-p", p]);
            }
            let (sim, replay) = pipe(("kb-sim", &args), ("kb-replay", &["--verify"]));
            assert!(sim.status.success(), "{args:?}: {}", stderr(&sim));
            assert!(
                stderr(&sim).contains("races: none"),
                "{args:?}: {}",
                stderr(&sim)
            );
            assert_eq!(
                replay.status.code(),
                Some(0),
                "{args:?}: {}",
                stderr(&replay)
            );
        }
    }
}

/// A deep ring stores tiles lazily and reuses their TCM soon after, so a
/// replay write materializes two aliases of the same bytes at once: the
/// older must go first (see kb-replay's plane::lazy). With slot ids
/// ordering them instead, 1,536 of 8,192 rows here came out wrong.
#[test]
fn a_hierarchical_allreduce_with_a_deep_ring_verifies_with_and_without_elided_copies() {
    let args = [
        "-q",
        "-t",
        "default",
        "--set",
        "counts.cubes_per_sip=4",
        "-b",
        "allreduce",
        "-p",
        "group=all",
        "-p",
        "algorithm=hierarchical",
        "-p",
        "depth=20",
    ];
    for replay_args in [
        &["--verify", "-j", "1"][..],
        &["--verify", "-j", "2"][..],
        &["--verify", "--no-elide"][..],
    ] {
        let (sim, replay) = pipe(("kb-sim", &args), ("kb-replay", replay_args));
        assert!(sim.status.success(), "{args:?}: {}", stderr(&sim));
        assert_eq!(
            replay.status.code(),
            Some(0),
            "{replay_args:?}: {}",
            stderr(&replay)
        );
    }
}

#[test]
fn every_collective_verifies_across_cubes_and_sips() {
    for (topo, group) in [
        ("large", "sips"),
        ("large", "cubes"),
        ("default", "sip"),
        ("default", "cube"),
    ] {
        for op in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
            let g = format!("group={group}");
            let o = format!("op={op}");
            let args = [
                "-q",
                "-t",
                topo,
                "-b",
                "allreduce",
                "-p",
                &g,
                "-p",
                &o,
                "-p",
                "size=4096",
            ];
            let (sim, replay) = pipe(("kb-sim", &args), ("kb-replay", &["--verify"]));
            assert!(sim.status.success(), "{args:?}: {}", stderr(&sim));
            assert_eq!(
                replay.status.code(),
                Some(0),
                "{args:?}: {}",
                stderr(&replay)
            );
        }
    }
}

#[test]
fn the_copies_are_listed_and_costed_per_route() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("ar.kbt");
    let t = t.to_str().unwrap();
    // 8 members of 256 x 256 f32: chunks of 32 rows, one 32 KiB message
    // each; a ring sends 2 x 7 per member.
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "default",
            "-b",
            "allreduce",
            "-p",
            "algorithm=ring",
            "-o",
            t,
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    // `depth=auto` (the default) is resolved on the machine: the run's
    // params say auto, and the slots tensor holds the depth chosen (8 on
    // a cube of `default` with 32 KiB slots: collective::depth_for).
    let summary = run("kb-inspect", &["summary", t], b"");
    let text = String::from_utf8_lossy(&summary.stdout).into_owned();
    assert!(text.contains("depth=auto"), "{text}");
    assert!(text.contains("slots  f32   [8, 8192]"), "{text}");
    let ops = run(
        "kb-inspect",
        &["ops", t, "--name", "ipcq_copy", "--format", "csv"],
        b"",
    );
    assert!(ops.status.success(), "{}", stderr(&ops));
    let text = String::from_utf8_lossy(&ops.stdout).into_owned();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 8 * 14, "{text}");
    assert!(rows.iter().all(|r| r.contains("sip0.cube0.pe")), "{text}");
    let stats = run(
        "kb-inspect",
        &[
            "stats",
            t,
            "--by",
            "route",
            "--name",
            "ipcq_copy",
            "--format",
            "csv",
        ],
        b"",
    );
    assert!(stats.status.success(), "{}", stderr(&stats));
    let text = String::from_utf8_lossy(&stats.stdout).into_owned();
    // Into each member's slots, 32 KiB each: 13 from its left neighbour's
    // TCM (the 6 reduce-scatter sums it made, the chunk it completed, and
    // 6 all-gather chunks passed on from the slot they arrived in) and
    // one copied straight from HBM (step 0's own chunk).
    let row = |route: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(route))
            .unwrap_or_else(|| panic!("no route {route} in {text}"));
        line.split(',').map(str::to_string).collect()
    };
    for k in 0..8 {
        let to = format!("sip0.cube0.pe{}.tcm", (k + 1) % 8);
        let sums = row(&format!("sip0.cube0.pe{k}.tcm -> {to}"));
        let chunks = row(&format!("sip0.cube0.hbm -> {to}"));
        // route,count,busy_ns,held_ns,op_time_ns,utilisation,
        // held_utilisation,bytes,...
        assert_eq!(
            (sums[1].as_str(), sums[7].as_str()),
            ("13", "425984"),
            "{sums:?}"
        );
        assert_eq!(
            (chunks[1].as_str(), chunks[7].as_str()),
            ("1", "32768"),
            "{chunks:?}"
        );
    }
}

#[test]
fn a_dropped_synchronization_is_a_race_naming_both_ops() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("race.kbt");
    let args = |races: &'static str| {
        vec![
            "-q",
            "-t",
            "default",
            "-b",
            "tp_mlp",
            "-p",
            "sync=0",
            "-p",
            "algorithm=ring",
            "--races",
            races,
            "-o",
        ]
    };
    // --races error: exit 2, both ops named, no trace left behind.
    let mut a = args("error");
    a.push(t.to_str().unwrap());
    let out = run("kb-sim", &a, b"");
    assert_clean_error(&out, "sync=0 --races error");
    let err = stderr(&out);
    for want in [
        "data race on",
        "(tensor slots)",
        "(ipcq_copy on sip0.cube0.pe",
        "(add on sip0.cube0.pe",
        "kernel tp_mlp",
        " ns",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    assert!(!t.exists(), "a failed run left {}", t.display());
    // The default, warn: the run completes, reports the races, and the
    // output is wrong, as Phase 1 read slots before their data arrived.
    let mut a = args("warn");
    a.push(t.to_str().unwrap());
    let out = run("kb-sim", &a, b"");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("kb-sim: warning: data race on"),
        "{}",
        stderr(&out)
    );
    let replay = run("kb-replay", &[t.to_str().unwrap(), "--verify", "-q"], b"");
    assert_eq!(replay.status.code(), Some(1), "{}", stderr(&replay));
    // Synchronized, the same workload has no race and verifies.
    let (sim, replay) = pipe(
        (
            "kb-sim",
            &["-t", "default", "-b", "tp_mlp", "--races", "error"],
        ),
        ("kb-replay", &["--verify"]),
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    assert!(stderr(&sim).contains("races: none"), "{}", stderr(&sim));
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
}

#[test]
fn the_direct_steps_pull_and_push_each_chunk_once_per_member() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("direct.kbt");
    let t = t.to_str().unwrap();
    // 8 members of 256 x 256 f32 (256 KiB each): member k sums chunk k
    // (32 rows, one 32 KiB tile) of all 8 buffers and copies it into the
    // 7 other outputs.
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "default",
            "-b",
            "allreduce",
            "-p",
            "algorithm=direct",
            "-o",
            t,
        ],
        b"",
    );
    assert!(sim.status.success(), "{}", stderr(&sim));
    let count = |name: &str| -> Vec<serde_json::Value> {
        let ops = run(
            "kb-inspect",
            &["ops", t, "--name", name, "--format", "jsonl"],
            b"",
        );
        assert!(ops.status.success(), "{}", stderr(&ops));
        String::from_utf8_lossy(&ops.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (reads, copies, adds) = (count("dma_read"), count("ipcq_copy"), count("add"));
    assert_eq!(reads.len(), 8 * 8, "{reads:?}");
    assert_eq!(copies.len(), 8 * 7, "{copies:?}");
    assert_eq!(adds.len(), 8 * 7, "{adds:?}");
    // Each member's pulls come from every member's HBM partition once.
    for k in 0..8 {
        let pe = format!("sip0.cube0.pe{k}.pe_dma");
        let mine: std::collections::BTreeSet<String> = reads
            .iter()
            .filter(|r| r["component"] == pe.as_str())
            .map(|r| {
                let at = r["read"]["ranges"][0]["at"].as_str().unwrap();
                at.split('+').next().unwrap().to_string()
            })
            .collect();
        assert_eq!(mine.len(), 8, "{pe}: {mine:?}");
    }
    // Dropping the readiness handshake is a race on the partial sums
    // tp_mlp wrote, naming the store and the pull.
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "default",
            "-b",
            "tp_mlp",
            "-p",
            "sync=0",
            "-p",
            "algorithm=direct",
            "--races",
            "error",
            "-o",
            t,
        ],
        b"",
    );
    assert_clean_error(&out, "direct sync=0 --races error");
    let err = stderr(&out);
    for want in [
        "data race on",
        "(tensor yp)",
        "(dma_write on",
        "(dma_read on",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
}

#[test]
fn the_summary_gives_a_collectives_bus_bandwidth_and_fabric_bound() {
    // 8 members of 256 KiB (65,536 f32), by the default algorithm
    // (direct on a cube).
    let out = run(
        "kb-sim",
        &["-t", "default", "-b", "allreduce", "-o", "-"],
        b"",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let number_after = |key: &str| -> f64 {
        let at = err
            .find(key)
            .unwrap_or_else(|| panic!("no {key:?} in {err}"))
            + key.len();
        err[at..]
            .trim_start()
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("{key}: {e} in {err}"))
    };
    let window_ns = number_after("over the kernels'");
    let launch_ns = number_after("launch 0 (all_reduce):");
    assert!((window_ns - launch_ns).abs() < 1e-3, "{err}");
    // NCCL's bus bandwidth: bytes / time x 2 (P-1)/P.
    let busbw = number_after("bus bandwidth");
    let want = 262_144.0 / window_ns * 1.75;
    assert!(
        (busbw - want).abs() < 0.1,
        "{busbw} GB/s, by hand {want:.2}: {err}"
    );
    // The bound is below the time, and the most the traffic allows is
    // above what it got.
    let bound_ns = number_after("against a fabric bound of");
    assert!(bound_ns > 0.0 && bound_ns < window_ns, "{err}");
    assert!(number_after("this traffic allows at most") > busbw, "{err}");
    // A workload that declares no payload still gets its fabric line.
    let out = run("kb-sim", &["-t", "default", "-b", "gemm", "-o", "-"], b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("launch 0 (gemm):") && err.contains("fabric bound"),
        "{err}"
    );
    assert!(!err.contains("bus bandwidth"), "{err}");
}

#[test]
fn a_ring_with_too_few_slots_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("ring.kbt");
    let t = t.to_str().unwrap();
    // The ring passes messages on from their slots: 2 are too few.
    let sim = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "default",
            "-b",
            "allreduce",
            "-p",
            "algorithm=ring",
            "-p",
            "depth=2",
            "-o",
            t,
        ],
        b"",
    );
    assert_eq!(sim.status.code(), Some(2), "{}", stderr(&sim));
    assert!(stderr(&sim).contains("parameter depth"), "{}", stderr(&sim));
    assert!(stderr(&sim).contains("at least 3"), "{}", stderr(&sim));
}
