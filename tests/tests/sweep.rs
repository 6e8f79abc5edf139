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

/// A stand-in for Slurm's `sbatch`: runs every task of `--array=A-B` of
/// the script, one after another, with the `--export`ed variable set, as
/// the nodes would (from wherever it is called).
const FAKE_SBATCH: &str = r#"#!/usr/bin/env bash
set -u
for a in "$@"; do
    case $a in
        --array=*) r=${a#--array=} ;;
        --export=ALL,*) e=${a#--export=ALL,} ;;
        *) s=$a ;;
    esac
done
rc=0
for (( i = ${r%-*}; i <= ${r#*-}; i++ )); do
    env "$e" SLURM_ARRAY_TASK_ID=$i bash "$s" || rc=$?
done
exit $rc
"#;

#[test]
fn emitted_jobs_run_as_a_slurm_array_and_merge_into_the_sweep_table() {
    let d = tempfile::tempdir().unwrap();
    // A topology file named relative to where the sweep is emitted.
    let here = d.path().join("here");
    std::fs::create_dir_all(&here).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::copy(
        repo.join("topologies/small.yaml"),
        here.join("my topo.yaml"),
    )
    .unwrap();
    let jobs = d.path().join("jobs dir");
    let args = [
        "sweep",
        "-t",
        "my topo.yaml",
        "-b",
        "gemm",
        "--set",
        "pe_gemm.tflops.f16=16,64",
        "-p",
        "n=64,128",
    ];
    let in_here = |args: &[&str]| {
        std::process::Command::new(bin("kb-sim"))
            .args(args)
            .current_dir(&here)
            .output()
            .unwrap()
    };
    let mut a: Vec<&str> = args.to_vec();
    // 4 points, 3 per task: 2 tasks, at most 1 per array: 2 arrays.
    a.extend([
        "--emit-jobs",
        jobs.to_str().unwrap(),
        "--points-per-task",
        "3",
        "--max-array-size",
        "1",
        "--time",
        "00:10:00",
        "--mem",
        "2G",
        "--sbatch=--partition=debug",
    ]);
    let o = in_here(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("submit.sh (2 arrays of at most 1 tasks)"),
        "{}",
        stderr(&o)
    );
    let jobs_abs = std::fs::canonicalize(&jobs).unwrap();
    let topo_abs = std::fs::canonicalize(here.join("my topo.yaml")).unwrap();
    // The job list: the sweep's command once (no line per point), the
    // topology by its absolute path, quoted.
    let list = std::fs::read_to_string(jobs.join("jobs.txt")).unwrap();
    let lines: Vec<&str> = list.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "{list}");
    let l = lines[0];
    assert!(l.starts_with("\"${KB_SIM:-"), "{l}");
    assert!(
        l.contains(&format!(
            " sweep -t '{}' --seed 0 -b gemm ",
            topo_abs.display()
        )),
        "{l}"
    );
    assert!(
        l.contains("--set pe_gemm.tflops.f16=16,64 -p n=64,128"),
        "{l}"
    );
    assert!(!l.contains("--point"), "{l}");
    // The Slurm script: a job array of tasks of 3 points, the directives
    // passed through.
    let script = std::fs::read_to_string(jobs.join("sweep.sbatch")).unwrap();
    assert!(script.starts_with("#!/usr/bin/env bash\n"), "{script}");
    for want in [
        "#SBATCH --array=0-0\n",
        "#SBATCH --job-name=kb-sweep\n",
        "#SBATCH --cpus-per-task=1\n",
        "#SBATCH --time=00:10:00\n",
        "#SBATCH --mem=2G\n",
        "#SBATCH --partition=debug\n",
        &format!(
            "#SBATCH --output={}/logs/task-%A_%a.out\n",
            jobs_abs.display()
        ),
        "per_task=3\n",
        "points=4\n",
        "kb-inspect merge ",
    ] {
        assert!(script.contains(want), "{want:?} in {script}");
    }
    let submit = std::fs::read_to_string(jobs.join("submit.sh")).unwrap();
    let sb = format!("'{}'", jobs_abs.join("sweep.sbatch").display());
    assert!(
        submit.ends_with(&format!(
            "sbatch --array=0-0 --export=ALL,KB_TASK_OFFSET=0 {sb}\nsbatch --array=0-0 --export=ALL,KB_TASK_OFFSET=1 {sb}\n"
        )),
        "{submit}"
    );
    assert!(jobs.join("results").is_dir() && jobs.join("logs").is_dir());
    // Submit as Slurm would run it, from another directory.
    let bin_dir = d.path().join("fake-slurm");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::write(bin_dir.join("sbatch"), FAKE_SBATCH).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let exec = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(bin_dir.join("sbatch"), exec).unwrap();
    }
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = std::process::Command::new("bash")
        .arg(jobs.join("submit.sh"))
        .current_dir(&elsewhere)
        .env("PATH", &path)
        .env("KB_SIM", bin("kb-sim"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A task past the points fails, saying so.
    let o = std::process::Command::new("bash")
        .arg(jobs.join("sweep.sbatch"))
        .env("SLURM_ARRAY_TASK_ID", "2")
        .env("KB_SIM", bin("kb-sim"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("past the sweep's 4 points"));
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
    let o = in_here(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    let merged = Table::load(&merged).unwrap();
    let whole = Table::load(Path::new(&format!("{}.parquet", whole.display()))).unwrap();
    assert_eq!(merged.rows(), 4);
    assert_eq!(rows(&merged), rows(&whole));
    assert_eq!(
        merged.column("topology").unwrap().values.text(0),
        topo_abs.display().to_string()
    );
    // One task's table missing: merge refuses (exit 2, nothing written),
    // naming the point, unless --allow-missing.
    let three = d.path().join("three.parquet");
    let mut m3: Vec<&str> = mr[..mr.len() - 2].to_vec();
    m3.remove(3); // point-0002
    m3.extend(["-o", three.to_str().unwrap()]);
    let o = run("kb-inspect", &m3, b"");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 of the sweep's 4 points are missing") && stderr(&o).contains(": 2;"),
        "{}",
        stderr(&o)
    );
    assert!(!three.exists());
    m3.push("--allow-missing");
    let o = run("kb-inspect", &m3, b"");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 of the sweep's points have no table"),
        "{}",
        stderr(&o)
    );
    assert_eq!(Table::load(&three).unwrap().rows(), 3);
    // A table of another sweep (another seed) is refused beside them.
    let other = d.path().join("other");
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--seed", "1", "--point", "2", "-o", other.to_str().unwrap()]);
    let o = in_here(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    let other_pq = format!("{}.parquet", other.display());
    let mut m4: Vec<&str> = mr[..mr.len() - 2].to_vec();
    m4[3] = &other_pq;
    m4.extend(["-o", three.to_str().unwrap(), "--allow-missing"]);
    let o = run("kb-inspect", &m4, b"");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("are not from the same sweep"),
        "{}",
        stderr(&o)
    );
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

/// A sweep's exit status says whether every point ran and verified, as
/// kb-replay's does: 1 when a point fails verification (`tp_mlp -p sync=0`
/// races and its output is wrong), 2 when a point cannot be verified (no
/// kb-replay); the table is written either way and its status column says
/// which points failed.
#[test]
fn a_failing_point_makes_the_sweep_exit_non_zero_after_writing_its_table() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("x");
    let args = [
        "sweep",
        "-t",
        "small",
        "-b",
        "tp_mlp",
        "-p",
        "algorithm=ring",
        "-p",
        "sync=0,1",
        "--verify",
        "-j",
        "2",
    ];
    let mut a = args.to_vec();
    a.extend(["-o", out.to_str().unwrap()]);
    let o = run("kb-sim", &a, b"");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 of 2 points failed"),
        "{}",
        stderr(&o)
    );
    for ext in ["csv", "parquet"] {
        let t = Table::load(&d.path().join(format!("x.{ext}"))).unwrap();
        let text = |c: &str, i| t.column(c).unwrap().values.text(i);
        assert_eq!(
            (text("verdict", 0), text("verdict", 1)),
            ("FAIL".into(), "PASS".into())
        );
        assert!(
            text("status", 0).starts_with("fail: kb-replay --verify: FAIL "),
            "{}",
            text("status", 0)
        );
        assert_eq!(text("status", 1), "ok");
    }
    // kb-replay cannot run: every point is an error, exit 2, the table
    // still written.
    let mut a = args.to_vec();
    a.extend([
        "--replay",
        "/nonexistent/kb-replay",
        "-o",
        out.to_str().unwrap(),
    ]);
    let o = run("kb-sim", &a, b"");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let t = Table::load(&d.path().join("x.parquet")).unwrap();
    for i in 0..2 {
        let status = t.column("status").unwrap().values.text(i);
        assert!(
            status.starts_with("error: kb-replay --verify: running /nonexistent/kb-replay"),
            "{status}"
        );
        assert!(
            t.column("verdict")
                .unwrap()
                .values
                .text(i)
                .starts_with("ERROR: ")
        );
    }
}

/// A sweep of 1,200 points emits two job arrays within Slurm's default
/// MaxArraySize, and a job list that does not grow with the points; past
/// 100,000 points it needs --force, and 1,000 x 1,000 values then emit a
/// job list of a few kilobytes.
#[test]
fn a_large_emit_is_chunked_and_compact() {
    let d = tempfile::tempdir().unwrap();
    let values = |n: usize| (1..=n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let m1200 = format!("m={}", values(1200));
    let jobs = d.path().join("j");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "copy",
            "-p",
            &m1200,
            "--emit-jobs",
            jobs.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let submit = std::fs::read_to_string(jobs.join("submit.sh")).unwrap();
    let arrays: Vec<&str> = submit
        .lines()
        .filter(|l| l.starts_with("sbatch "))
        .collect();
    assert_eq!(arrays.len(), 2, "{submit}");
    assert!(arrays[0].starts_with("sbatch --array=0-999 --export=ALL,KB_TASK_OFFSET=0 "));
    assert!(arrays[1].starts_with("sbatch --array=0-199 --export=ALL,KB_TASK_OFFSET=1000 "));
    let script = std::fs::read_to_string(jobs.join("sweep.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-999\n"), "{script}");
    let list = std::fs::metadata(jobs.join("jobs.txt")).unwrap().len();
    assert!(list < 16 << 10, "jobs.txt is {list} bytes");
    // 1,000 x 1,000: refused (exit 2, nothing written) without --force.
    let (m, n) = (format!("m={}", values(1000)), format!("n={}", values(1000)));
    let big = d.path().join("big");
    let mut a = vec!["sweep", "-t", "small", "-b", "gemm", "-p", &m, "-p", &n];
    a.extend(["--emit-jobs", big.to_str().unwrap()]);
    let o = run("kb-sim", &a, b"");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1000000 points") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert!(!big.exists());
    // A local run is refused the same way, before it allocates anything.
    let o = run(
        "kb-sim",
        &["sweep", "-t", "small", "-b", "gemm", "-p", &m, "-p", &n],
        b"",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    a.push("--force");
    let o = run("kb-sim", &a, b"");
    assert!(o.status.success(), "{}", stderr(&o));
    let list = std::fs::metadata(big.join("jobs.txt")).unwrap().len();
    assert!(list < 16 << 10, "jobs.txt is {list} bytes");
    let submit = std::fs::read_to_string(big.join("submit.sh")).unwrap();
    assert_eq!(
        submit.lines().filter(|l| l.starts_with("sbatch ")).count(),
        1000
    );
}

/// SIGINT, SIGTERM or SIGHUP to a sweep's parent stops the points it is
/// running (their processes gone once it exits), removes their temporary
/// traces and exits 128 + the signal, writing no table.
#[cfg(unix)]
#[test]
fn a_signal_stops_the_sweeps_children_and_removes_their_traces() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    // The processes whose parent is `pid` (from /proc).
    let children = |pid: u32| -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                    // pid (comm) state ppid ...: comm may hold spaces.
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                        == Some(pid)
                })
            })
            .collect()
    };
    for (sig, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let out = d.path().join("sw");
        // Points long enough (seconds in a debug build) to be caught.
        let mut child = Command::new(bin("kb-sim"))
            .args(["sweep", "-t", "large", "-b", "gemm_tiled", "-j", "2"])
            .args([
                "-p",
                "m=1024,1025,1026,1027",
                "-p",
                "n=1024",
                "-p",
                "k=1024",
            ])
            .arg("-o")
            .arg(&out)
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // Both points running and writing their traces.
        while children(child.id()).len() < 2 || std::fs::read_dir(&tmp).unwrap().count() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "no points started"
            );
            assert!(child.try_wait().unwrap().is_none(), "the sweep ended early");
            std::thread::sleep(Duration::from_millis(20));
        }
        let kids = children(child.id());
        // The children's handlers are in place once their files exist.
        std::thread::sleep(Duration::from_millis(200));
        let killed = Command::new("kill")
            .args([&format!("-{sig}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        assert_eq!(child.wait().unwrap().code(), Some(code), "SIG{sig}");
        for k in kids {
            assert!(
                !Path::new(&format!("/proc/{k}")).exists(),
                "SIG{sig}: point process {k} still there"
            );
        }
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "SIG{sig} left {left:?} in TMPDIR");
        let tables: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "tmp")
            .collect();
        assert!(tables.is_empty(), "SIG{sig} wrote {tables:?}");
    }
}

/// A table says what was run: every row holds the workload, topology,
/// seed, kb version and sweep id (the Parquet file's metadata holds the
/// spec too); the CSV and Parquet type every column alike (a float column
/// of whole values came back from CSV as integers); a swept field the run
/// never reads is named on stderr; `-j` past 4 per core is capped, not a
/// panic.
#[test]
fn tables_carry_their_provenance_and_unchanged_axes_are_named() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("p");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "gemm",
            "--seed",
            "7",
            "--set",
            "pe_gemm.tflops.f32=16,32",
            "-p",
            "m=64",
            "-j",
            "1000000",
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("-j 1000000 capped at"), "{err}");
    assert!(
        err.contains("warning: --set pe_gemm.tflops.f32=16,32: changed nothing"),
        "{err}"
    );
    let pq = Table::load(&d.path().join("p.parquet")).unwrap();
    let csv = Table::load(&d.path().join("p.csv")).unwrap();
    assert_eq!(
        pq.describe(),
        csv.describe(),
        "CSV and Parquet column types"
    );
    assert!(
        pq.describe().contains("hbm_channel_busy_ns:f64"),
        "{}",
        pq.describe()
    );
    let id = pq.column("sweep_id").unwrap().values.text(0);
    for (col, want) in [
        ("workload", "gemm"),
        ("topology", "small"),
        ("seed", "7"),
        ("kb_version", env!("CARGO_PKG_VERSION")),
        ("sweep_points", "2"),
        ("sweep_id", id.as_str()),
    ] {
        for t in [&pq, &csv] {
            for i in 0..2 {
                assert_eq!(t.column(col).unwrap().values.text(i), want, "{col}");
            }
        }
    }
    assert_eq!(pq.meta("kb.sweep.id"), Some(id.as_str()));
    let spec = pq.meta("kb.sweep.spec").unwrap();
    assert!(
        spec.contains("workload=gemm\nseed=7\n")
            && spec.contains("--set pe_gemm.tflops.f32=16,32\n"),
        "{spec}"
    );
    for c in [
        "peak_gemm_gflops_f16",
        "peak_hbm_gbs",
        "arithmetic_intensity",
    ] {
        assert!(pq.column(c).unwrap().values.f64(0).unwrap() > 0.0, "{c}");
    }
    // A peak follows the swept field: 32 TFLOP/s per PE is twice 16.
    let peak = |i| {
        pq.column("peak_gemm_gflops_f32")
            .unwrap()
            .values
            .f64(i)
            .unwrap()
    };
    assert_eq!(peak(1), 2.0 * peak(0));
}

/// The CSV and Parquet are written as a set: when one cannot be written
/// (a full disk: the Parquet is a link to /dev/full), the other keeps its
/// old content, and no temporary file is left.
#[cfg(unix)]
#[test]
fn a_table_that_cannot_be_written_leaves_the_old_pair() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("s.csv"), "old\n").unwrap();
    std::os::unix::fs::symlink("/dev/full", d.path().join("s.parquet")).unwrap();
    let out = d.path().join("s");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "copy",
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("s.parquet"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(d.path().join("s.csv")).unwrap(),
        "old\n"
    );
    let names: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// A real sweep's roofline through the CLI: log-log, the table's own
/// peaks as ceilings, byte-identical twice; --roofline with --x, a bad
/// scale or a trace: exit 2 with a message, no panic.
#[test]
fn a_sweep_plots_as_a_roofline_from_its_own_peaks() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r");
    let o = run(
        "kb-sim",
        &[
            "sweep",
            "-t",
            "small",
            "-b",
            "gemm",
            "--set",
            "hbm.channel_bw_gbs=8,32",
            "-p",
            "block_n=16,64",
            "-p",
            "dtype=f16",
            "-o",
            out.to_str().unwrap(),
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let table = d.path().join("r.parquet");
    let t = table.to_str().unwrap();
    let svg = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    let (a, b) = (svg("a.svg"), svg("b.svg"));
    for s in [&a, &b] {
        let o = run("kb-inspect", &["plot", t, "--roofline", "-o", s], b"");
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("drew 4 lines (4 points)"),
            "{}",
            stderr(&o)
        );
    }
    let text = std::fs::read_to_string(&a).unwrap();
    assert_eq!(text, std::fs::read_to_string(&b).unwrap(), "deterministic");
    // small's f16 GEMM peak; its HBM at 8 and at 32 GB/s per channel.
    for ceiling in [
        "GEMM peak f16: 256000 GFLOP/s",
        "HBM peak: 256 GB/s",
        "HBM peak: 1024 GB/s",
    ] {
        assert!(text.contains(ceiling), "{ceiling} not in the legend");
    }
    // The dtype column picks f16's peaks only; the legend names what varies.
    assert!(!text.contains("i8"), "i8 ceiling drawn for an f16 sweep");
    assert!(text.contains("hbm.channel_bw_gbs=8 block_n=16"));
    assert!(!text.contains("dtype=f16"));
    for (args, what) in [
        (vec!["--roofline", "--x", "m"], "--roofline with --x"),
        (vec!["--x-scale", "bogus"], "a bad scale"),
        (vec!["--x", "dtype", "--x-scale", "log"], "a log text axis"),
    ] {
        let mut all = vec!["plot", t, "-o", &a];
        all.extend(args);
        kb_e2e::assert_clean_error(&run("kb-inspect", &all, b""), what);
    }
}
