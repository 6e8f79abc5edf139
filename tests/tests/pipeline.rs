//! The pipeline through a pipe and through a file, determinism, and clean
//! failures of kb-sim.

use kb_e2e::*;

#[test]
fn bare_pipeline_verifies() {
    let (sim, replay) = pipe(("kb-sim", &["--quiet"]), ("kb-replay", &["--verify"]));
    assert!(sim.status.success(), "kb-sim: {}", stderr(&sim));
    assert_eq!(
        replay.status.code(),
        Some(0),
        "kb-replay: {}",
        stderr(&replay)
    );
}

#[test]
fn file_pipeline_verifies_and_inspects() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.kbt");
    let t = t.to_str().unwrap();
    let sim = run("kb-sim", &["-q", "-o", t], b"");
    assert!(sim.status.success(), "{}", stderr(&sim));
    let replay = run("kb-replay", &[t, "--verify"], b"");
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    let summary = run("kb-inspect", &["summary", t], b"");
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let text = String::from_utf8_lossy(&summary.stdout);
    assert!(text.contains("gemm") && text.contains("default"), "{text}");
}

#[test]
fn copy_verifies_on_every_shipped_topology() {
    for topo in ["small", "default", "large"] {
        for params in [
            &["-p", "rows=300", "-p", "cols=37", "-p", "tile_rows=7"][..],
            &[][..],
        ] {
            let mut args = vec!["-q", "-t", topo, "-b", "copy"];
            args.extend_from_slice(params);
            let (sim, replay) = pipe(("kb-sim", &args), ("kb-replay", &["--verify"]));
            assert!(sim.status.success(), "{topo} {params:?}: {}", stderr(&sim));
            assert_eq!(
                replay.status.code(),
                Some(0),
                "{topo} {params:?}: {}",
                stderr(&replay)
            );
        }
    }
}

#[test]
fn same_inputs_give_byte_identical_traces() {
    for topo in ["small", "default"] {
        let args = ["-q", "-t", topo, "-o", "-", "--seed", "7"];
        let a = run("kb-sim", &args, b"");
        let b = run("kb-sim", &args, b"");
        assert!(a.status.success(), "{}", stderr(&a));
        assert!(a.stdout.len() > 1000);
        assert!(a.stdout == b.stdout, "{topo}: traces differ");
        let c = run("kb-sim", &["-q", "-t", topo, "-o", "-", "--seed", "8"], b"");
        assert!(
            a.stdout != c.stdout,
            "a different seed must change the trace"
        );
    }
}

#[test]
fn failed_run_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("out.kbt");
    let o = run(
        "kb-sim",
        &["-q", "-o", t.to_str().unwrap(), "-p", "rows=0"],
        b"",
    );
    assert_clean_error(&o, "rows=0");
    assert!(stderr(&o).contains("rows"), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn bad_flags_topologies_and_params_exit_2() {
    assert_clean_error(&run("kb-sim", &["--no-such-flag"], b""), "unknown flag");
    assert_clean_error(
        &run("kb-sim", &["-o", "-", "-b", "nope"], b""),
        "unknown bench",
    );
    assert_clean_error(
        &run("kb-sim", &["-o", "-", "-p", "bogus=1"], b""),
        "unknown param",
    );
    // A parameter given twice is a mistake, not "the last one wins".
    let o = run(
        "kb-sim",
        &["-o", "-", "-b", "gemm", "-p", "m=64", "-p", "m=128"],
        b"",
    );
    assert_clean_error(&o, "param given twice");
    assert!(
        stderr(&o).contains("m: given twice (m=64, then m=128)"),
        "{}",
        stderr(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let small = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topologies/small.yaml"
    ))
    .unwrap();
    std::fs::write(
        &bad,
        small.replace("channel_bw_gbs: 32", "channel_bw_gbs: -1"),
    )
    .unwrap();
    let o = run("kb-sim", &["topology", bad.to_str().unwrap()], b"");
    assert_clean_error(&o, "negative bandwidth");
    let line = small
        .lines()
        .position(|l| l.contains("channel_bw_gbs"))
        .unwrap()
        + 1;
    assert!(
        stderr(&o).contains(&format!("bad.yaml: line {line}: hbm.channel_bw_gbs")),
        "{}",
        stderr(&o)
    );
    std::fs::write(&bad, "name: [unclosed").unwrap();
    let o = run("kb-sim", &["-o", "-", "-t", bad.to_str().unwrap()], b"");
    assert_clean_error(&o, "bad yaml");
    assert!(stderr(&o).contains("bad.yaml: line 1"), "{}", stderr(&o));
}

#[test]
fn topology_and_probe_work_for_every_shipped_topology() {
    let list = String::from_utf8_lossy(&run("kb-sim", &["list"], b"").stdout).into_owned();
    let shipped: Vec<&str> = list
        .lines()
        .find_map(|l| l.strip_prefix("Topologies: "))
        .expect("kb-sim list names the topologies")
        .split(", ")
        .collect();
    assert!(shipped.len() >= 7, "{shipped:?}");
    for topo in shipped {
        let o = run("kb-sim", &["topology", topo], b"");
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("counts:") && text.contains("route"), "{text}");
        let o = run(
            "kb-sim",
            &[
                "probe",
                "-t",
                topo,
                "--from",
                "sip0.cube0.pe0.pe_dma",
                "--to",
                "sip0.cube0.hbm_ctrl",
                "--bytes",
                "4096",
            ],
            b"",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("GB/s"));
    }
    assert_clean_error(
        &run(
            "kb-sim",
            &["probe", "--from", "nowhere", "--to", "host"],
            b"",
        ),
        "bad node",
    );
}

/// Odd (non-multiple) shapes and several dtypes per benchmark.
fn odd_params(bench: &str) -> Vec<Vec<&'static str>> {
    match bench {
        "copy" => vec![vec!["rows=37", "cols=19", "tile_rows=5", "dtype=bf16"]],
        "gemm" => vec![
            vec!["m=67", "n=45", "k=83", "block_m=16", "block_n=32"],
            vec!["m=40", "n=24", "k=50", "dtype=i8"],
            vec!["m=33", "n=20", "k=9", "dtype=f32"],
            vec!["m=16", "n=16", "k=300", "dtype=f32"],
            vec!["m=40", "n=50", "k=130", "block_k=48", "dtype=f32"],
        ],
        "vector_add" => vec![
            vec!["rows=37", "cols=19", "tile_rows=5", "dtype=f16"],
            vec!["rows=33", "cols=3", "dtype=i32"],
            vec!["rows=20", "cols=9", "dtype=i8"],
        ],
        "gemm_tiled" => vec![
            vec![
                "m=67",
                "n=45",
                "k=83",
                "block_m=16",
                "block_n=32",
                "block_k=20",
            ],
            vec!["m=40", "n=24", "k=50", "dtype=i8"],
            vec!["m=50", "n=30", "k=70", "dtype=f32"],
        ],
        "softmax" => vec![
            vec!["rows=13", "cols=77", "block_rows=3", "dtype=f16"],
            vec!["rows=70", "cols=33"],
        ],
        "gather" => vec![vec!["rows=37", "vocab=13", "dim=7", "dtype=f16"]],
        "layernorm" => vec![
            vec!["rows=37", "cols=99", "block_rows=5"],
            vec!["rows=20", "cols=64", "dtype=f16", "eps=1e-3"],
        ],
        "gemm_bias_gelu" => vec![
            vec!["m=45", "n=77", "k=33", "block_n=32", "block_k=16"],
            vec!["m=20", "n=24", "k=50", "dtype=f32"],
        ],
        "attention" => vec![
            vec!["seq=50", "seq_kv=77", "d=40", "block_n=32"],
            vec!["seq=9", "seq_kv=5", "d=8", "dtype=f32"],
        ],
        "mlp" => vec![
            vec!["m=37", "d=24", "h=70", "block_n=32", "block_k=16"],
            vec!["m=16", "d=16", "h=40", "dtype=f16"],
        ],
        "allreduce" => vec![
            vec!["size=1000", "cols=8", "group=all", "dtype=f16"],
            vec![
                "size=600",
                "cols=12",
                "algorithm=tree",
                "dtype=bf16",
                "depth=1",
            ],
            vec![
                "size=999",
                "cols=9",
                "op=reduce_scatter",
                "dtype=i32",
                "slot_kib=1",
            ],
            vec!["size=500", "cols=5", "op=all_gather", "group=all"],
            vec!["size=777", "cols=7", "op=broadcast", "depth=2"],
        ],
        "tp_mlp" => vec![
            vec!["m=37", "d=24", "f=40", "block_n=32", "block_k=16"],
            vec![
                "m=9",
                "d=16",
                "f=8",
                "dtype=f16",
                "algorithm=tree",
                "slot_kib=1",
            ],
        ],
        "rmsnorm" => vec![
            vec!["rows=37", "cols=9", "block_rows=5"],
            vec!["rows=37", "cols=9", "block_rows=5", "mode=local"],
        ],
        "softmax_nd" => vec![
            vec!["shape=3x5x7x9", "block=2x2x3x9"],
            vec!["shape=3x5x7x9", "block=2x2x3x5", "op=copy"],
            vec!["shape=37", "block=5", "op=copy"],
            vec!["shape=37"],
            vec!["shape=2x37x9", "mode=local"],
        ],
        "atomics" => vec![
            vec!["m=5", "n=7", "k=3"],
            vec!["m=5", "n=7", "k=3", "memory=sram"],
            vec!["op=maxmin", "m=3", "n=9"],
            vec!["op=ticket", "n=5", "memory=sram"],
        ],
        other => panic!("add odd shapes for the new benchmark {other:?} here"),
    }
}

#[test]
fn every_benchmark_verifies_with_default_and_odd_shapes() {
    let list = run("kb-sim", &["list"], b"");
    let text = String::from_utf8_lossy(&list.stdout).into_owned();
    let benches: Vec<&str> = text
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(benches.len() >= 4, "{text}");
    for bench in benches {
        for topo in ["small", "default", "pa", "va", "la-1to1", "la-nto1"] {
            let mut variants = vec![vec![]];
            variants.extend(odd_params(bench));
            for params in variants {
                let mut args = vec!["-q", "-t", topo, "-b", bench];
                for p in &params {
                    args.extend(["-p", p]);
                }
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
}

#[test]
fn a_data_dependent_kernel_logs_different_ops_for_different_data_and_both_verify() {
    let dir = tempfile::tempdir().unwrap();
    let mut loads = Vec::new();
    for seed in ["1", "2"] {
        let t = dir.path().join(format!("g{seed}.kbt"));
        let t = t.to_str().unwrap();
        let sim = run(
            "kb-sim",
            &["-q", "-t", "small", "-b", "gather", "--seed", seed, "-o", t],
            b"",
        );
        assert!(sim.status.success(), "{}", stderr(&sim));
        let replay = run("kb-replay", &[t, "--verify"], b"");
        assert_eq!(
            replay.status.code(),
            Some(0),
            "seed {seed}: {}",
            stderr(&replay)
        );
        // The table-row loads: which rows moved depends on the indices.
        let ops = run(
            "kb-inspect",
            &["ops", t, "--name", "dma_read", "--format", "csv"],
            b"",
        );
        assert!(ops.status.success(), "{}", stderr(&ops));
        loads.push(String::from_utf8_lossy(&ops.stdout).into_owned());
    }
    assert!(loads[0].lines().count() > 100, "{}", loads[0]);
    assert_eq!(
        loads[0].lines().count(),
        loads[1].lines().count(),
        "same number of loads"
    );
    assert_ne!(
        loads[0], loads[1],
        "different indices must move different rows"
    );
}

#[test]
fn captured_inputs_match_phase_2_for_every_benchmark() {
    for bench in [
        "gemm",
        "gemm_tiled",
        "softmax",
        "vector_add",
        "gather",
        "copy",
        "layernorm",
        "gemm_bias_gelu",
        "attention",
        "mlp",
        "allreduce",
        "tp_mlp",
    ] {
        let (sim, replay) = pipe(
            (
                "kb-sim",
                &["-q", "-t", "small", "-b", bench, "--capture-inputs"],
            ),
            ("kb-replay", &["--verify", "--check-intermediates"]),
        );
        assert!(sim.status.success(), "{bench}: {}", stderr(&sim));
        assert_eq!(
            replay.status.code(),
            Some(0),
            "{bench}: {}",
            stderr(&replay)
        );
    }
}

#[test]
fn unbounded_files_huge_probes_and_misplaced_sections_are_refused() {
    // /dev/zero and /dev/urandom never end: read at most 1 MiB, then refuse.
    for dev in ["/dev/zero", "/dev/urandom"] {
        let started = std::time::Instant::now();
        for args in [vec!["topology", dev], vec!["-t", dev, "-o", "/dev/null"]] {
            let out = run("kb-sim", &args, b"");
            assert_clean_error(&out, dev);
            assert!(stderr(&out).contains(dev), "{}", stderr(&out));
        }
        assert!(
            started.elapsed().as_secs() < 20,
            "{dev} took {:?}",
            started.elapsed()
        );
    }
    let out = run("kb-sim", &["topology", "/dev/zero"], b"");
    assert!(
        stderr(&out).contains("more than 1048576 bytes"),
        "{}",
        stderr(&out)
    );
    // A message whose time would not fit in picoseconds.
    let out = run(
        "kb-sim",
        &[
            "probe",
            "--from",
            "host",
            "--to",
            "sip0.io_cpu",
            "--bytes",
            "18446744073709551615",
        ],
        b"",
    );
    assert_clean_error(&out, "probe --bytes u64::MAX");
    assert!(
        stderr(&out).contains("at most 1099511627776"),
        "{}",
        stderr(&out)
    );
    // memory_map belongs to the la model; under va it would be ignored.
    let dir = tempfile::tempdir().unwrap();
    let la = run("kb-sim", &["topology", "la-nto1"], b"");
    assert!(la.status.success());
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies/la-nto1.yaml"),
    )
    .unwrap()
    .replace("address_model: la", "address_model: va");
    let p = dir.path().join("va-with-map.yaml");
    std::fs::write(&p, yaml).unwrap();
    let out = run("kb-sim", &["topology", p.to_str().unwrap()], b"");
    assert_clean_error(&out, "memory_map under va");
    let err = stderr(&out);
    assert!(
        err.contains("memory_map")
            && err.contains("the va address model does not use a memory_map"),
        "{err}"
    );
}

/// The files of a directory, by name, with their bytes.
fn dir_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Every built-in workload at its defaults (on `default` and `small`)
/// verifies with one and two threads, with copies elided or done, and
/// with fingerprints all, sampled or off; every run dumps the same
/// outputs, byte for byte.
#[test]
fn every_workload_dumps_identical_outputs_for_every_thread_count_and_choice() {
    let list = run("kb-sim", &["list"], b"");
    let text = String::from_utf8_lossy(&list.stdout).into_owned();
    let benches: Vec<&str> = text
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(benches.len() >= 10, "{text}");
    let dir = tempfile::tempdir().unwrap();
    for bench in benches {
        for topo in ["default", "small"] {
            let trace = dir.path().join(format!("{bench}-{topo}.kbt"));
            let trace = trace.to_str().unwrap();
            let sim = run("kb-sim", &["-q", "-t", topo, "-b", bench, "-o", trace], b"");
            assert!(sim.status.success(), "{bench} {topo}: {}", stderr(&sim));
            let variants: [&[&str]; 5] = [
                &["-j", "1"],
                &["-j", "2"],
                &["-j", "2", "--no-elide"],
                &["-j", "1", "--no-elide", "--fingerprints", "off"],
                &["-j", "2", "--fingerprints", "sample"],
            ];
            let mut first: Option<Vec<(String, Vec<u8>)>> = None;
            for (i, flags) in variants.iter().enumerate() {
                let out = dir.path().join(format!("{bench}-{topo}-{i}"));
                let mut args = vec![trace, "--verify", "-q", "--dump-outputs"];
                args.push(out.to_str().unwrap());
                args.extend_from_slice(flags);
                let replay = run("kb-replay", &args, b"");
                assert_eq!(
                    replay.status.code(),
                    Some(0),
                    "{bench} {topo} {flags:?}: {}",
                    stderr(&replay)
                );
                let files = dir_files(&out);
                assert!(!files.is_empty(), "{bench} {topo}: nothing dumped");
                match &first {
                    None => first = Some(files),
                    Some(want) => assert!(
                        files == *want,
                        "{bench} {topo} {flags:?}: outputs differ from {:?}'s",
                        variants[0]
                    ),
                }
            }
        }
    }
}

/// `--report`'s bytes copied per GEMM flop on a gemm trace at default
/// tiles: copying every byte (`--no-elide`, what replay did before copy
/// elision) costs at least what moving the inputs host -> HBM -> TCM and
/// the output TCM -> HBM costs, computed by hand; with elision replay
/// copies less than that bound and at least 4x less than copying every
/// byte (issue 15), and the outputs are the same bytes.
#[test]
fn copy_elision_cuts_bytes_copied_per_gemm_flop() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("g.kbt");
    let trace = trace.to_str().unwrap();
    let (m, n, k) = (256u64, 256u64, 256u64);
    let dims = [format!("m={m}"), format!("n={n}"), format!("k={k}")];
    let mut args = vec!["-q", "-t", "default", "-b", "gemm", "-p", "dtype=f32"];
    for d in &dims {
        args.extend_from_slice(&["-p", d]);
    }
    args.extend_from_slice(&["-o", trace]);
    let sim = run("kb-sim", &args, b"");
    assert!(sim.status.success(), "{}", stderr(&sim));
    let flops = 2 * m * n * k;
    // f32: A and B twice (host -> HBM -> TCM), C once (TCM -> HBM).
    let every_byte_bound = ((2 * (m * k + k * n) + m * n) * 4) as f64 / flops as f64;
    let mut per_flop = Vec::new();
    let mut dumps = Vec::new();
    for flags in [&[][..], &["--no-elide"][..]] {
        let report = dir.path().join("r.json");
        let out = dir.path().join(format!("d{}", flags.len()));
        let mut args = vec![trace, "--verify", "-q", "--report"];
        args.push(report.to_str().unwrap());
        args.extend_from_slice(&["--dump-outputs", out.to_str().unwrap()]);
        args.extend_from_slice(flags);
        let r = run("kb-replay", &args, b"");
        assert_eq!(r.status.code(), Some(0), "{flags:?}: {}", stderr(&r));
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(j["gemm_flops"].as_u64(), Some(flops), "{j}");
        let copied = j["bytes_copied"].as_u64().unwrap();
        let got = j["bytes_copied_per_gemm_flop"].as_f64().unwrap();
        assert!((got - copied as f64 / flops as f64).abs() < 1e-12, "{j}");
        per_flop.push(got);
        dumps.push(std::fs::read(out.join("c.npy")).unwrap());
    }
    let (elided, every) = (per_flop[0], per_flop[1]);
    assert!(every >= every_byte_bound, "{every} < {every_byte_bound}");
    assert!(elided < every_byte_bound, "{elided} >= {every_byte_bound}");
    assert!(4.0 * elided <= every, "{elided} vs {every}");
    assert_eq!(dumps[0], dumps[1]);
}
