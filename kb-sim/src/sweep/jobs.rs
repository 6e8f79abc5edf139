//! `--emit-jobs`: the sweep as a Slurm job array (`jobs.txt`,
//! `sweep.sbatch`, `submit.sh`) for clusters.

use super::*;

/// Quote a word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// How `--emit-jobs` lays a sweep out on Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jobs {
    /// Points each array task runs, one after another (`--points-per-task`).
    pub points_per_task: usize,
    /// The most tasks in one job array (`--max-array-size`; Slurm's
    /// `MaxArraySize` is 1001 by default, so indices 0..999): more tasks
    /// are submitted as several arrays.
    pub max_array_size: usize,
    /// `#SBATCH --time` (`--time`).
    pub time: Option<String>,
    /// `#SBATCH --mem` (`--mem`).
    pub mem: Option<String>,
    /// More `#SBATCH` lines, as given (`--sbatch=--partition=gpu`).
    pub sbatch: Vec<String>,
}

impl Default for Jobs {
    fn default() -> Jobs {
        Jobs {
            points_per_task: 1,
            max_array_size: 1000,
            time: None,
            mem: None,
            sbatch: Vec::new(),
        }
    }
}

/// A value that goes on an `#SBATCH` line: one line, no shell or Slurm
/// surprises (no newline or NUL).
fn sbatch_value(flag: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.contains(['\n', '\r', '\0']) {
        return Err(format!("{flag}: {v:?} is not one #SBATCH value"));
    }
    Ok(())
}

/// `--emit-jobs DIR`: write `DIR/jobs.txt` (the sweep's command, once:
/// each point runs it with `--point I -o DIR/results/point-NNNN`),
/// `DIR/sweep.sbatch` (a Slurm job array whose task T runs points
/// `T * points_per_task` onwards, offset by `KB_TASK_OFFSET`),
/// `DIR/submit.sh` (one `sbatch` per array of at most `max_array_size`
/// tasks) and the `results/` and `logs/` directories; run nothing. Every
/// path in them is absolute and quoted. Returns the number of points and
/// of arrays.
pub fn emit_jobs(cfg: &SweepConfig, dir: &Path, jobs: &Jobs) -> Result<(usize, usize), String> {
    if jobs.points_per_task == 0 {
        return Err("--points-per-task: at least 1".into());
    }
    if jobs.max_array_size == 0 {
        return Err("--max-array-size: at least 1".into());
    }
    for (flag, v) in [("--time", &jobs.time), ("--mem", &jobs.mem)] {
        if let Some(v) = v {
            sbatch_value(flag, v)?;
        }
    }
    for v in &jobs.sbatch {
        sbatch_value("--sbatch", v)?;
    }
    let n = count(cfg)?;
    let (prov, _) = check(cfg, n)?;
    let io = |what: &Path, e: std::io::Error| format!("--emit-jobs: {}: {e}", what.display());
    std::fs::create_dir_all(dir.join("results")).map_err(|e| io(dir, e))?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|e| io(dir, e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| io(dir, e))?;
    let exe = absolute(&cfg.exe);
    // The command every point runs, less `--point I -o OUT`: the grid
    // once, whatever the number of points.
    let mut a: Vec<String> = vec![
        "sweep".into(),
        "-t".into(),
        topology_name(&cfg.topology),
        "--seed".into(),
        cfg.seed.to_string(),
        "-b".into(),
        cfg.bench.clone(),
    ];
    for ax in &cfg.axes {
        let flag = if ax.topology { "--set" } else { "-p" };
        a.extend([flag.into(), format!("{}={}", ax.key, ax.values.join(","))]);
    }
    for (k, v) in &cfg.inputs {
        a.extend([
            "--input".into(),
            format!("{k}={}", absolute(Path::new(v)).display()),
        ]);
    }
    a.extend(["--races".into(), cfg.races.clone(), "-j".into(), "1".into()]);
    if cfg.force {
        a.push("--force".into());
    }
    if cfg.verify {
        a.push("--verify".into());
        if let Some(r) = &cfg.replay {
            a.extend(["--replay".into(), absolute(r).display().to_string()]);
        }
    }
    if let Some(t) = &cfg.traces {
        std::fs::create_dir_all(t).map_err(|e| io(t, e))?;
        a.extend(["--traces".into(), absolute(t).display().to_string()]);
    }
    let words: Vec<String> = a.iter().map(|w| shell_quote(w)).collect();
    let ppt = jobs.points_per_task;
    let tasks = n.div_ceil(ppt);
    let arrays = tasks.div_ceil(jobs.max_array_size);
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let jobs_text = format!(
        "# kb-sim sweep --emit-jobs: {n} points (sweep id {id}), {ppt} per task, {tasks} tasks.
# Point I runs this command with `--point I -o {results}/point-NNNN`
# (NNNN: I, at least 4 digits); KB_SIM overrides the kb-sim executable.
\"${{KB_SIM:-{exe}}}\" {cmd}
",
        id = prov.id,
        results = dir.join("results").display(),
        exe = exe
            .display()
            .to_string()
            .replace(['"', '$', '`', '\\'], "_"),
        cmd = words.join(" "),
    );
    let mut directives = vec![
        "--job-name=kb-sweep".to_string(),
        format!("--array=0-{}", tasks.min(jobs.max_array_size) - 1),
        "--ntasks=1".into(),
        "--cpus-per-task=1".into(),
        format!("--output={}/logs/task-%A_%a.out", dir.display()),
    ];
    if let Some(t) = &jobs.time {
        directives.push(format!("--time={t}"));
    }
    if let Some(m) = &jobs.mem {
        directives.push(format!("--mem={m}"));
    }
    directives.extend(jobs.sbatch.iter().cloned());
    let sbatch = dir.join("sweep.sbatch");
    let submit = dir.join("submit.sh");
    let script = format!(
        "#!/usr/bin/env bash
# A kb-sim design-space sweep of {n} points as Slurm job arrays, written by
# `kb-sim sweep --emit-jobs` (sweep id {id}: every table it writes says so).
# Submit every array with
#     {submit_q}
# ({arrays} array{arrays_s} of at most {max} tasks; with one array, `sbatch {sbatch_q}`
# does the same). Task T (SLURM_ARRAY_TASK_ID + KB_TASK_OFFSET) runs points
# T * {ppt} onwards, {ppt} of them, each `kb-sim sweep --point I` (the command in
# jobs.txt) writing a one-row table to results/point-NNNN.{{csv,parquet}}; the task
# exits with the worst point's status (1: a point failed --verify, 2: an error).
# When every task has finished, join the rows:
#     kb-inspect merge {results_q}/point-*.parquet -o sweep.parquet
# KB_SIM overrides the kb-sim executable (the default is the one that wrote
# this file); the nodes need it (and kb-replay, with --verify) at that path.
{directives}
set -uo pipefail
points={n}
per_task={ppt}
jobs={jobs_q}
results={results_q}
task=$(( ${{KB_TASK_OFFSET:-0}} + SLURM_ARRAY_TASK_ID ))
first=$(( task * per_task ))
if (( first >= points )); then
    echo \"task $task: past the sweep's $points points\" >&2
    exit 2
fi
last=$(( first + per_task ))
(( last > points )) && last=$points
cmd=$(grep -v '^#' \"$jobs\" | head -n 1)
if [ -z \"$cmd\" ]; then
    echo \"no command in $jobs\" >&2
    exit 2
fi
rc=0
for (( p = first; p < last; p++ )); do
    out=$(printf '%s/point-%04d' \"$results\" \"$p\")
    eval \"$cmd --point $p -o \\\"\\$out\\\"\"
    s=$?
    (( s > rc )) && rc=$s
done
exit $rc
",
        id = prov.id,
        arrays_s = if arrays == 1 { "" } else { "s" },
        max = jobs.max_array_size,
        directives = directives
            .iter()
            .map(|d| format!("#SBATCH {d}"))
            .collect::<Vec<_>>()
            .join("\n"),
        submit_q = q(&submit),
        sbatch_q = q(&sbatch),
        results_q = q(&dir.join("results")),
        jobs_q = q(&dir.join("jobs.txt")),
    );
    let mut submit_text = format!(
        "#!/usr/bin/env bash
# Submit the kb-sim sweep's {tasks} tasks ({n} points, sweep id {id}) as {arrays} Slurm
# job array{arrays_s} of at most {max} tasks each (Slurm's MaxArraySize).
set -euo pipefail
",
        id = prov.id,
        arrays_s = if arrays == 1 { "" } else { "s" },
        max = jobs.max_array_size,
    );
    for i in 0..arrays {
        let offset = i * jobs.max_array_size;
        let size = (tasks - offset).min(jobs.max_array_size);
        submit_text += &format!(
            "sbatch --array=0-{} --export=ALL,KB_TASK_OFFSET={offset} {}\n",
            size - 1,
            q(&sbatch)
        );
    }
    let write = |p: &Path, text: &str| -> Result<(), String> {
        let mut f = kb_format::AtomicFile::create(p)
            .map_err(|e| io(p, e))?
            .remove_on_signal();
        f.write_all(text.as_bytes()).map_err(|e| io(p, e))?;
        f.commit().map_err(|e| io(p, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if text.starts_with("#!") {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
            }
        }
        Ok(())
    };
    write(&dir.join("jobs.txt"), &jobs_text)?;
    write(&sbatch, &script)?;
    write(&submit, &submit_text)?;
    Ok((n, arrays))
}
