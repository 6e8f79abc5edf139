//! `merge TABLE... -o OUT`: join the rows of results tables (`kb-sim
//! sweep` tables, CSV or Parquet, e.g. the one-row tables of a Slurm job
//! array's tasks) into one table.
//!
//! Columns are matched by name (a column some tables lack is empty in
//! their rows; a column whose types differ widens: integers -> floats ->
//! text). Rows are ordered by the `point` column when every table has
//! one, and a point that appears twice is an error naming both files;
//! without it, rows keep the order of the inputs.

use std::path::{Path, PathBuf};

use kb_table::{Table, Values};

use crate::{Error, Result};

/// What a merge wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub tables: usize,
    pub rows: usize,
    pub columns: usize,
}

/// Merge `inputs` into one table.
pub fn merge(inputs: &[PathBuf]) -> Result<Table> {
    if inputs.is_empty() {
        return Err(Error::usage("merge: no tables given"));
    }
    let mut tables = Vec::new();
    // (point, file) of every row, to order and check them.
    let mut points: Vec<(Option<f64>, usize)> = Vec::new();
    for (i, p) in inputs.iter().enumerate() {
        let t = Table::load(p).map_err(|e| Error::usage(e.to_string()))?;
        let col = t.column("point");
        for r in 0..t.rows() {
            points.push((col.and_then(|c| c.values.f64(r)), i));
        }
        tables.push(t);
    }
    let mut out = Table::concat(tables);
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
    }
    Ok(out)
}

/// `merge INPUTS -o OUT`: write the merged table (Parquet for `.parquet`,
/// else CSV) atomically.
pub fn run(inputs: &[PathBuf], out: &Path) -> Result<Info> {
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
    let t = merge(inputs)?;
    t.save(out).map_err(|e| Error::usage(e.to_string()))?;
    Ok(Info {
        tables: inputs.len(),
        rows: t.rows(),
        columns: t.columns.len(),
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
        let info = run(&inputs, &p("all.parquet")).unwrap();
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
        run(&inputs, &p("all.csv")).unwrap();
        let csv = std::fs::read_to_string(p("all.csv")).unwrap();
        assert_eq!(
            csv,
            "point,hbm.channel_bw_gbs,sim_ns,verdict\n0,16,300,\n1,32,180.25,FAIL\n2,64,100.5,PASS\n"
        );
    }

    #[test]
    fn duplicate_points_and_bad_files_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        row(1, 16.0, 1.0, None).save(&p("a.csv")).unwrap();
        row(1, 32.0, 2.0, None).save(&p("b.csv")).unwrap();
        let e = run(&[p("a.csv"), p("b.csv")], &p("out.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("point 1 is in") && e.contains("a.csv") && e.contains("b.csv"),
            "{e}"
        );
        assert!(!p("out.csv").exists());
        let e = run(&[p("missing.parquet")], &p("out.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.parquet"), "{e}");
        assert!(run(&[], &p("out.csv")).is_err());
    }
}
