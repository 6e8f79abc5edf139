//! `merge TABLE... -o OUT`: join the rows of results tables (`kb-sim
//! sweep` tables, CSV or Parquet, e.g. the one-row tables of a Slurm job
//! array's tasks) into one table.
//!
//! Columns are matched by name (a column some tables lack is empty in
//! their rows; a column whose types differ widens: integers -> floats ->
//! text). Rows are ordered by the `point` column when every table has
//! one, and a point that appears twice is an error naming both files;
//! without it, rows keep the order of the inputs.
//!
//! Sweep tables say which sweep they belong to (`sweep_id`) and how many
//! points it has (`sweep_points`): rows of two sweeps are refused (naming
//! a file of each), and so is a merge that lacks some of the sweep's
//! points, unless `allow_missing` (the missing points are then listed in
//! [`Info::missing`]).

use std::path::{Path, PathBuf};

use kb_table::{Table, Values};

use crate::{Error, Result};

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub tables: usize,
    pub rows: usize,
    pub columns: usize,
    /// How many points of the sweep no table has (only with
    /// `allow_missing`), and the first few of them.
    pub missing: u64,
    pub missing_first: Vec<u64>,
}

/// At most this many missing points are named in a message.
const NAMED: usize = 20;

/// The first points of `count` as a short list: `3, 7, 9 ... (120 in all)`.
pub fn list(points: &[u64], count: u64) -> String {
    let shown: Vec<String> = points.iter().take(NAMED).map(u64::to_string).collect();
    if count > shown.len() as u64 {
        format!("{} ... ({count} in all)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Merge `inputs` into one table; see the module docs. Returns the table,
/// how many of the sweep's points no input has (an error unless
/// `allow_missing`) and the first few of them.
pub fn merge(inputs: &[PathBuf], allow_missing: bool) -> Result<(Table, u64, Vec<u64>)> {
    if inputs.is_empty() {
        return Err(Error::usage("merge: no tables given"));
    }
    let mut tables = Vec::new();
    // (point, file) of every row, to order and check them.
    let mut points: Vec<(Option<f64>, usize)> = Vec::new();
    // The first file's sweep id and point count (`None`: not a sweep table).
    let mut sweep: Option<(usize, Option<String>, Option<u64>)> = None;
    for (i, p) in inputs.iter().enumerate() {
        let t = Table::load(p).map_err(|e| Error::usage(e.to_string()))?;
        let col = t.column("point");
        for r in 0..t.rows() {
            points.push((col.and_then(|c| c.values.f64(r)), i));
        }
        let cell = |name: &str, r: usize| t.column(name).map(|c| c.values.text(r));
        for r in 0..t.rows() {
            let id = cell("sweep_id", r).filter(|s| !s.is_empty());
            let n = cell("sweep_points", r).and_then(|s| s.parse::<u64>().ok());
            match &sweep {
                None => sweep = Some((i, id, n)),
                Some((j, id0, n0)) if (id0, n0) != (&id, &n) => {
                    let say = |id: &Option<String>| match id {
                        Some(id) => format!("sweep {id}"),
                        None => "no sweep id".to_string(),
                    };
                    return Err(Error::usage(format!(
                        "merge: {} ({}) and {} ({}) are not from the same sweep; \
                         merge the tables of one sweep at a time",
                        inputs[*j].display(),
                        say(id0),
                        p.display(),
                        say(&id),
                    )));
                }
                Some(_) => {}
            }
        }
        tables.push(t);
    }
    let mut out = Table::concat(tables);
    let (mut missing, mut missing_count) = (Vec::new(), 0);
    if points.iter().all(|(p, _)| p.is_some()) {
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by(|&a, &b| {
            points[a]
                .0
                .partial_cmp(&points[b].0)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for w in order.windows(2) {
            let (a, b) = (&points[w[0]], &points[w[1]]);
            if a.0 == b.0 {
                return Err(Error::usage(format!(
                    "merge: point {} is in {} and in {}",
                    a.0.unwrap_or_default(),
                    inputs[a.1].display(),
                    inputs[b.1].display()
                )));
            }
        }
        out.reorder(&order);
        // Points are whole numbers: keep the column an integer one.
        if let Some(c) = out.columns.iter_mut().find(|c| c.name == "point")
            && let Values::F64(v) = &c.values
            && v.iter().flatten().all(|x| x.fract() == 0.0 && *x >= 0.0)
        {
            c.values = Values::U64(v.iter().map(|x| x.map(|x| x as u64)).collect());
        }
        // A sweep's points are 0..sweep_points: every one once.
        if let Some((j, _, Some(n))) = &sweep {
            if let Some((p, i)) = points
                .iter()
                .find(|(p, _)| p.is_some_and(|p| p.fract() != 0.0 || p < 0.0 || p >= *n as f64))
            {
                return Err(Error::usage(format!(
                    "merge: {} has point {}, outside the sweep's {n} points (0..{})",
                    inputs[*i].display(),
                    p.unwrap_or_default(),
                    n.saturating_sub(1)
                )));
            }
            // The present points are distinct and below n: the missing
            // ones are counted, and the first few named, without a
            // buffer of n (a forged count cannot make this allocate).
            let mut present: Vec<u64> = points
                .iter()
                .filter_map(|(p, _)| *p)
                .map(|p| p as u64)
                .collect();
            present.sort_unstable();
            let count = *n - present.len() as u64;
            let mut next = 0u64;
            for &p in present.iter().chain(std::iter::once(n)) {
                while next < p && missing.len() < NAMED {
                    missing.push(next);
                    next += 1;
                }
                next = p.saturating_add(1);
            }
            missing_count = count;
            if count > 0 && !allow_missing {
                return Err(Error::usage(format!(
                    "merge: {count} of the sweep's {n} points are missing (the sweep of {}): {}; \
                     --allow-missing merges the rest",
                    inputs[*j].display(),
                    list(&missing, count)
                )));
            }
        }
    }
    Ok((out, missing_count, missing))
}

/// `merge INPUTS -o OUT`: write the merged table (Parquet for `.parquet`,
/// else CSV) atomically; nothing is written when the merge is refused.
pub fn run(inputs: &[PathBuf], out: &Path, allow_missing: bool) -> Result<Info> {
    if out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        && crate::is_terminal_path(out)
    {
        return Err(Error::usage(format!(
            "refusing to write binary Parquet to a terminal ({})",
            out.display()
        )));
    }
    let (t, missing, missing_first) = merge(inputs, allow_missing)?;
    t.save(out).map_err(|e| Error::usage(e.to_string()))?;
    Ok(Info {
        tables: inputs.len(),
        rows: t.rows(),
        columns: t.columns.len(),
        missing,
        missing_first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(point: u64, bw: f64, sim: f64, extra: Option<&str>) -> Table {
        let mut t = Table::default();
        t.push("point", Values::U64(vec![Some(point)]));
        t.push("hbm.channel_bw_gbs", Values::F64(vec![Some(bw)]));
        t.push("sim_ns", Values::F64(vec![Some(sim)]));
        if let Some(e) = extra {
            t.push("verdict", Values::Str(vec![Some(e.into())]));
        }
        t
    }

    #[test]
    fn rows_join_by_column_name_in_point_order() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        // Tasks finish in any order, as CSV or Parquet.
        row(2, 64.0, 100.5, Some("PASS"))
            .save(&p("point-0002.parquet"))
            .unwrap();
        row(0, 16.0, 300.0, None)
            .save(&p("point-0000.csv"))
            .unwrap();
        row(1, 32.0, 180.25, Some("FAIL"))
            .save(&p("point-0001.parquet"))
            .unwrap();
        let inputs = vec![
            p("point-0002.parquet"),
            p("point-0000.csv"),
            p("point-0001.parquet"),
        ];
        let info = run(&inputs, &p("all.parquet"), false).unwrap();
        assert_eq!((info.tables, info.rows, info.columns), (3, 3, 4));
        let t = Table::load(&p("all.parquet")).unwrap();
        assert_eq!(
            t.describe(),
            "point:u64, hbm.channel_bw_gbs:f64, sim_ns:f64, verdict:str"
        );
        let col = |n: &str| &t.column(n).unwrap().values;
        let texts = |n: &str| (0..3).map(|i| col(n).text(i)).collect::<Vec<_>>();
        assert_eq!(texts("point"), ["0", "1", "2"]);
        assert_eq!(texts("hbm.channel_bw_gbs"), ["16", "32", "64"]);
        assert_eq!(texts("sim_ns"), ["300", "180.25", "100.5"]);
        assert_eq!(texts("verdict"), ["", "FAIL", "PASS"]);
        // CSV out too.
        run(&inputs, &p("all.csv"), false).unwrap();
        let csv = std::fs::read_to_string(p("all.csv")).unwrap();
        assert_eq!(
            csv,
            "point,hbm.channel_bw_gbs,sim_ns,verdict\n0,16.0,300.0,\n1,32.0,180.25,FAIL\n2,64.0,100.5,PASS\n"
        );
    }

    #[test]
    fn duplicate_points_and_bad_files_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        row(1, 16.0, 1.0, None).save(&p("a.csv")).unwrap();
        row(1, 32.0, 2.0, None).save(&p("b.csv")).unwrap();
        let e = run(&[p("a.csv"), p("b.csv")], &p("out.csv"), true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("point 1 is in") && e.contains("a.csv") && e.contains("b.csv"),
            "{e}"
        );
        assert!(!p("out.csv").exists());
        let e = run(&[p("missing.parquet")], &p("out.csv"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.parquet"), "{e}");
        assert!(run(&[], &p("out.csv"), false).is_err());
    }

    /// A one-row table of sweep `id` (of `n` points), as `--point` writes.
    fn sweep_row(point: u64, id: &str, n: u64) -> Table {
        let mut t = row(point, 16.0 * (point + 1) as f64, 1.0, None);
        t.push("sweep_id", Values::Str(vec![Some(id.into())]));
        t.push("sweep_points", Values::U64(vec![Some(n)]));
        t
    }

    #[test]
    fn missing_points_and_other_sweeps_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        for i in [0, 1, 3] {
            sweep_row(i, "aaaa", 5)
                .save(&p(&format!("point-{i}.parquet")))
                .unwrap();
        }
        let three: Vec<PathBuf> = [0, 1, 3]
            .iter()
            .map(|i| p(&format!("point-{i}.parquet")))
            .collect();
        // Points 2 and 4 are missing: refused, nothing written.
        let e = run(&three, &p("out.csv"), false).unwrap_err().to_string();
        assert!(
            e.contains("2 of the sweep's 5 points are missing") && e.contains(": 2, 4;"),
            "{e}"
        );
        assert!(e.contains("--allow-missing"), "{e}");
        assert!(!p("out.csv").exists());
        // Allowed: the rows there are, the missing ones counted.
        let info = run(&three, &p("out.csv"), true).unwrap();
        assert_eq!(
            (info.rows, info.missing, info.missing_first.clone()),
            (3, 2, vec![2, 4])
        );
        // A row of another sweep (an earlier one in the same directory),
        // even with every point present: refused, naming both files.
        sweep_row(2, "bbbb", 5).save(&p("old-2.csv")).unwrap();
        let mut mixed = three.clone();
        mixed.push(p("old-2.csv"));
        let e = run(&mixed, &p("mixed.csv"), true).unwrap_err().to_string();
        assert!(
            e.contains("sweep aaaa") && e.contains("sweep bbbb") && e.contains("old-2.csv"),
            "{e}"
        );
        assert!(!p("mixed.csv").exists());
        // A table without a sweep id among sweep tables: refused too.
        row(2, 1.0, 1.0, None).save(&p("plain.csv")).unwrap();
        let mut plain = three.clone();
        plain.push(p("plain.csv"));
        let e = run(&plain, &p("x.csv"), true).unwrap_err().to_string();
        assert!(e.contains("no sweep id"), "{e}");
        // A point outside the sweep.
        sweep_row(7, "aaaa", 5).save(&p("point-7.csv")).unwrap();
        let e = run(&[p("point-7.csv")], &p("x.csv"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the sweep's 5 points"), "{e}");
        // A forged count does not make the merge allocate for it.
        sweep_row(0, "cccc", u64::MAX).save(&p("huge.csv")).unwrap();
        let e = run(&[p("huge.csv")], &p("x.csv"), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{} of the sweep's", u64::MAX - 1)),
            "{e}"
        );
    }
}
