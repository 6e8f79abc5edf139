//! Design-space sweeps: `kb-sim --set`, `kb-sim sweep` (rows against
//! separate runs), `--emit-jobs` (the Slurm script run by hand, then
//! `kb-inspect merge`).

use std::path::Path;

use kb_e2e::{bin, run, stderr};
use kb_table::Table;

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// The rows of a table, as text, without the wall time and trace path
/// (which differ between runs).
fn rows(t: &Table) -> Vec<Vec<String>> {
    (0..t.rows())
        .map(|i| {
            t.columns
                .iter()
                .filter(|c| c.name != "wall_s" && c.name != "trace")
                .map(|c| format!("{}={}", c.name, c.values.text(i)))
                .collect()
        })
        .collect()
}

#[test]
fn a_2x2_sweep_writes_rows_that_match_four_separate_runs() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("sw");
    let traces = d.path().join("traces");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "gemm",
            "--set",
            "hbm.channel_bw_gbs=8,64",
            "-p",
            "m=64,128",
            "--verify",
            "-j",
            "2",
            "--traces",
            traces.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let pq = Table::load(&d.path().join("sw.parquet")).unwrap();
    let csv = Table::load(&d.path().join("sw.csv")).unwrap();
    assert_eq!(pq.rows(), 4);
    assert_eq!(rows(&pq), rows(&csv), "CSV and Parquet hold the same rows");
    let col = |n: &str| {
        &pq.column(n)
            .unwrap_or_else(|| panic!("no column {n}: {}", pq.describe()))
            .values
    };
    let mut sims = Vec::new();
    for (i, (bw, m)) in [("8", "64"), ("8", "128"), ("64", "64"), ("64", "128")]
        .into_iter()
        .enumerate()
    {
        assert_eq!(col("point").text(i), i.to_string());
        assert_eq!(col("hbm.channel_bw_gbs").text(i), bw);
        assert_eq!(col("m").text(i), m);
        assert_eq!(col("status").text(i), "ok");
        assert_eq!(col("verdict").text(i), "PASS");
        // The same point run by hand.
        let t = d.path().join(format!("run{i}.kbt"));
        let r = run(
            "kb-sim",
            &[
                "-q",
                "-t",
                "small",
                "--set",
                &format!("hbm.channel_bw_gbs={bw}"),
                "-b",
                "gemm",
                "-p",
                &format!("m={m}"),
                "-o",
                t.to_str().unwrap(),
            ],
            b"",
        );
        assert!(r.status.success(), "{}", stderr(&r));
        // The sweep's trace of the point is that run's, byte for byte.
        let kept = traces.join(format!("point-{i:04}.kbt"));
        assert_eq!(
            std::fs::read(&kept).unwrap(),
            std::fs::read(&t).unwrap(),
            "point {i}"
        );
        let s = run(
            "kb-inspect",
            &["summary", t.to_str().unwrap(), "--format", "json"],
            b"",
        );
        assert!(s.status.success(), "{}", stderr(&s));
        let s = json(&s);
        let sim_ps = s["sim_time_ps"].as_u64().unwrap();
        assert_eq!(
            col("sim_ns").f64(i),
            Some(sim_ps as f64 / 1000.0),
            "point {i}"
        );
        assert_eq!(col("records").text(i), s["records"].to_string());
        assert_eq!(col("bytes").text(i), s["bytes_moved"].to_string());
        let launches = s["launches"].as_array().unwrap();
        let sum = |k: &str| launches.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(col("flops").text(i), sum("flops").to_string());
        assert_eq!(col("useful_flops").text(i), sum("useful_flops").to_string());
        let k0 = launches
            .iter()
            .map(|l| l["t_start_ps"].as_u64().unwrap())
            .min()
            .unwrap();
        let k1 = launches
            .iter()
            .map(|l| l["t_end_ps"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(col("kernel_ns").f64(i), Some((k1 - k0) as f64 / 1000.0));
        let gflops = sum("useful_flops") as f64 / ((k1 - k0) as f64 / 1000.0);
        assert!((col("achieved_gflops").f64(i).unwrap() - gflops).abs() < 1e-9 * gflops);
        // Utilisation is a fraction; 4 PEs on small.
        assert_eq!(col("pe_gemm_units").text(i), "4");
        let u = col("pe_gemm_util").f64(i).unwrap();
        assert!(u > 0.0 && u <= 1.0, "{u}");
        // HBM channels: 1 cube x 32 pseudo channels on small, busy as the
        // timeline's channel slices say, clipped to the kernel window.
        assert_eq!(col("hbm_channel_units").text(i), "32");
        let tl = d.path().join(format!("timeline-{i}.json"));
        let r = run(
            "kb-inspect",
            &["timeline", t.to_str().unwrap(), "-o", tl.to_str().unwrap()],
            b"",
        );
        assert!(r.status.success(), "{}", stderr(&r));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&tl).unwrap()).unwrap();
        let busy: u64 = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "hbm_channel")
            .map(|e| {
                let (a, b) = (
                    e["args"]["start_ps"].as_u64().unwrap(),
                    e["args"]["end_ps"].as_u64().unwrap(),
                );
                b.min(k1).saturating_sub(a.max(k0))
            })
            .sum();
        assert!(busy > 0);
        assert_eq!(
            col("hbm_channel_busy_ns").f64(i),
            Some(busy as f64 / 1000.0)
        );
        sims.push(sim_ps);
    }
    // More HBM bandwidth is never slower here, and a bigger M takes longer.
    assert!(sims[2] <= sims[0] && sims[3] <= sims[1], "{sims:?}");
    assert!(sims[1] > sims[0], "{sims:?}");
}

#[test]
fn set_overrides_are_validated_and_recorded() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.kbt");
    let tp = t.to_str().unwrap();
    // An unknown key names itself and the fields there; nothing is written.
    let o = run(
        "kb-sim",
        &["-t", "small", "--set", "hbm.bw_gbs=512", "-o", tp],
        b"",
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("hbm.bw_gbs") && e.contains("channel_bw_gbs"),
        "{e}"
    );
    assert!(!t.exists());
    // A bad value is refused like a topology file's, naming the field.
    let o = run(
        "kb-sim",
        &["-t", "small", "--set", "counts.pes_per_cube=0", "-o", tp],
        b"",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("counts.pes_per_cube: must be 1..="),
        "{}",
        stderr(&o)
    );
    // A good one changes the machine and is in the recorded command line
    // and the resolved topology.
    let o = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "--set",
            "counts.pes_per_cube=2",
            "-b",
            "copy",
            "-o",
            tp,
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let s = json(&run(
        "kb-inspect",
        &["summary", tp, "--format", "json"],
        b"",
    ));
    let line = s["command_line"].to_string();
    assert!(
        line.contains("--set") && line.contains("counts.pes_per_cube=2"),
        "{line}"
    );
    let o = run(
        "kb-sim",
        &["topology", "small", "--set", "counts.pes_per_cube=2"],
        b"",
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 SIPs x 1 cubes x 2 PEs"));
    let o = run("kb-sim", &["topology", "small", "--fields"], b"");
    let f = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        f.contains("pe_gemm.tflops.f16 = ") && f.contains("counts.pes_per_cube = 4"),
        "{f}"
    );
    // A sweep with a bad key fails before running anything.
    let out = d.path().join("sw");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "--set",
            "hbm.bw_gbs=1,2",
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("hbm.bw_gbs"), "{}", stderr(&o));
    assert!(!d.path().join("sw.csv").exists() && !d.path().join("sw.parquet").exists());
}

#[test]
fn emitted_jobs_run_as_a_slurm_array_and_merge_into_the_sweep_table() {
    let d = tempfile::tempdir().unwrap();
    let jobs = d.path().join("jobs");
    let args = [
        "sweep",
        "-t",
        "small",
        "-b",
        "gemm",
        "--set",
        "pe_gemm.tflops.f16=16,64",
        "-p",
        "n=64,128",
    ];
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--emit-jobs", jobs.to_str().unwrap()]);
    let o = run("kb-sim", &a, b"");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("sbatch"), "{}", stderr(&o));
    // The job list: one command per point, each writing its own table.
    let list = std::fs::read_to_string(jobs.join("jobs.txt")).unwrap();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 4, "{list}");
    let jobs_abs = std::fs::canonicalize(&jobs).unwrap();
    for (i, l) in lines.iter().enumerate() {
        assert!(l.starts_with("\"${KB_SIM:-"), "{l}");
        assert!(l.contains(" sweep -t small --seed 0 -b gemm "), "{l}");
        assert!(
            l.contains("--set pe_gemm.tflops.f16=16,64 -p n=64,128"),
            "{l}"
        );
        assert!(l.contains(&format!("--point {i} -o ")), "{l}");
        let out = jobs_abs.join("results").join(format!("point-{i:04}"));
        assert!(l.ends_with(&out.display().to_string()), "{l}");
    }
    // The Slurm script: a job array over those lines.
    let script = std::fs::read_to_string(jobs.join("sweep.sbatch")).unwrap();
    assert!(script.starts_with("#!/usr/bin/env bash\n"), "{script}");
    for want in [
        "#SBATCH --array=0-3\n",
        "#SBATCH --job-name=kb-sweep\n",
        "#SBATCH --cpus-per-task=1\n",
        &format!(
            "#SBATCH --output={}/logs/point-%a.out\n",
            jobs_abs.display()
        ),
        "line=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" ",
        "eval \"$line\"\n",
        "kb-inspect merge ",
    ] {
        assert!(script.contains(want), "{want:?} in {script}");
    }
    assert!(jobs.join("results").is_dir() && jobs.join("logs").is_dir());
    // Run the array as Slurm would, task by task, in reverse.
    for task in (0..4).rev() {
        let o = std::process::Command::new("bash")
            .arg(jobs.join("sweep.sbatch"))
            .env("SLURM_ARRAY_TASK_ID", task.to_string())
            .env("KB_SIM", bin("kb-sim"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "task {task}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // A task past the list fails, naming the line.
    let o = std::process::Command::new("bash")
        .arg(jobs.join("sweep.sbatch"))
        .env("SLURM_ARRAY_TASK_ID", "4")
        .env("KB_SIM", bin("kb-sim"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // Merge their one-row tables; they equal the sweep run in one go.
    let merged = d.path().join("merged.parquet");
    let mut m = vec!["merge".to_string()];
    for i in 0..4 {
        m.push(
            jobs.join("results")
                .join(format!("point-{i:04}.parquet"))
                .display()
                .to_string(),
        );
    }
    m.extend(["-o".into(), merged.display().to_string()]);
    let mr: Vec<&str> = m.iter().map(String::as_str).collect();
    let o = run("kb-inspect", &mr, b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = d.path().join("whole");
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["-o", whole.to_str().unwrap()]);
    let o = run("kb-sim", &a, b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let merged = Table::load(&merged).unwrap();
    let whole = Table::load(Path::new(&format!("{}.parquet", whole.display()))).unwrap();
    assert_eq!(merged.rows(), 4);
    assert_eq!(rows(&merged), rows(&whole));
}

/// The one definition of utilisation (kb_format::usage): on a
/// three-launch trace, `kb-inspect stats` per component, summed per unit
/// kind and divided by the kind's units, and `--by unit` both give the
/// sweep's `K_util` and `K_held_util` (same kernel window).
#[test]
fn stats_utilisation_per_kind_is_the_sweeps() {
    let d = tempfile::tempdir().unwrap();
    let traces = d.path().join("traces");
    let out = d.path().join("sw");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "mlp",
            "-j",
            "1",
            "--traces",
            traces.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let t = Table::load(&d.path().join("sw.parquet")).unwrap();
    let trace = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "kbt"))
        .expect("a kept trace");
    let summary = json(&run(
        "kb-inspect",
        &["summary", trace.to_str().unwrap(), "--format", "json"],
        b"",
    ));
    assert_eq!(
        summary["launches"].as_array().unwrap().len(),
        3,
        "mlp launches three kernels"
    );
    let stats = |by: &str| {
        let o = run(
            "kb-inspect",
            &[
                "stats",
                trace.to_str().unwrap(),
                "--by",
                by,
                "--format",
                "json",
            ],
            b"",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)
    };
    let comp = stats("component");
    let unit = stats("unit");
    for k in ["pe_dma", "pe_gemm", "pe_math"] {
        let units = t
            .column(&format!("{k}_units"))
            .unwrap()
            .values
            .f64(0)
            .unwrap();
        let sum = |field: &str| -> f64 {
            comp["groups"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|g| g["key"].as_str().unwrap().ends_with(&format!(".{k}")))
                .map(|g| g[field].as_f64().unwrap())
                .sum()
        };
        for (col, field) in [("util", "utilisation"), ("held_util", "held_utilisation")] {
            let want = t
                .column(&format!("{k}_{col}"))
                .unwrap()
                .values
                .f64(0)
                .unwrap();
            let got = sum(field) / units;
            assert!(
                (got - want).abs() < 1e-12,
                "{k}_{col}: stats {got}, sweep {want}"
            );
            let row = unit["groups"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["key"] == k);
            let by_unit = row.map_or(0.0, |g| g[field].as_f64().unwrap());
            assert!(
                (by_unit - want).abs() < 1e-12,
                "{k}_{col}: by unit {by_unit}, sweep {want}"
            );
        }
        let busy_ns = t
            .column(&format!("{k}_busy_ns"))
            .unwrap()
            .values
            .f64(0)
            .unwrap();
        assert!((sum("busy_ps") / 1e3 - busy_ns).abs() < 1e-6, "{k} busy");
        let held_ns = t
            .column(&format!("{k}_held_ns"))
            .unwrap()
            .values
            .f64(0)
            .unwrap();
        assert!(held_ns >= busy_ns, "{k}: held {held_ns} < busy {busy_ns}");
    }
    assert_eq!(
        (
            comp["window_start_ps"].as_u64(),
            comp["window_end_ps"].as_u64()
        ),
        (
            Some(
                (t.column("kernel_start_ns").unwrap().values.f64(0).unwrap() * 1e3).round() as u64
            ),
            Some(
                ((t.column("kernel_start_ns").unwrap().values.f64(0).unwrap()
                    + t.column("kernel_ns").unwrap().values.f64(0).unwrap())
                    * 1e3)
                    .round() as u64
            )
        )
    );
}
