//! `kb-table`: small results tables with one type per column, written and
//! read as CSV and Apache Parquet (Arrow's `parquet` crate, snappy
//! compression), so pandas, polars, DuckDB and pyarrow load them with the
//! same column types every time.
//!
//! Used by `kb-sim sweep` (one row per design point) and `kb-inspect merge`
//! (rows of many tables joined by column name). A column is unsigned
//! integers, floats or strings; any cell may be empty (null). CSV has no
//! types: reading it infers each column's (all cells unsigned integers ->
//! `U64`, all numbers -> `F64`, else `Str`), so a table survives a CSV
//! round trip as long as its columns' cells look like their type.

use std::fs::File;
use std::io::Read;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// An error reading or writing a table; the message names the file and,
/// where there is one, the column and row.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(String, #[source] io::Error),
    #[error("{0}")]
    Format(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cells of one column.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    U64(Vec<Option<u64>>),
    F64(Vec<Option<f64>>),
    Str(Vec<Option<String>>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::U64(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::Str(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cell `i` as text (empty for null): the CSV form.
    pub fn text(&self, i: usize) -> String {
        match self {
            Values::U64(v) => v[i].map_or(String::new(), |x| x.to_string()),
            Values::F64(v) => v[i].map_or(String::new(), fmt_f64),
            Values::Str(v) => v[i].clone().unwrap_or_default(),
        }
    }

    /// Cell `i` as a number, when it is one.
    pub fn f64(&self, i: usize) -> Option<f64> {
        match self {
            Values::U64(v) => v[i].map(|x| x as f64),
            Values::F64(v) => v[i],
            Values::Str(v) => v[i].as_deref().and_then(|s| s.parse().ok()),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Values::U64(_) => "u64",
            Values::F64(_) => "f64",
            Values::Str(_) => "str",
        }
    }

    fn nulls(n: usize, like: &Values) -> Values {
        match like {
            Values::U64(_) => Values::U64(vec![None; n]),
            Values::F64(_) => Values::F64(vec![None; n]),
            Values::Str(_) => Values::Str(vec![None; n]),
        }
    }

    /// Convert to `to`'s type: integers widen to floats, anything to text.
    fn promote(self, to: &Values) -> Values {
        match (self, to) {
            (Values::U64(v), Values::F64(_)) => {
                Values::F64(v.into_iter().map(|x| x.map(|x| x as f64)).collect())
            }
            (v @ (Values::U64(_) | Values::F64(_)), Values::Str(_)) => {
                Values::Str((0..v.len()).map(|i| cell(&v, i)).collect())
            }
            (v, _) => v,
        }
    }

    fn append(&mut self, other: Values) {
        match (self, other) {
            (Values::U64(a), Values::U64(b)) => a.extend(b),
            (Values::F64(a), Values::F64(b)) => a.extend(b),
            (Values::Str(a), Values::Str(b)) => a.extend(b),
            _ => unreachable!("promoted to one type first"),
        }
    }
}

fn cell(v: &Values, i: usize) -> Option<String> {
    let t = v.text(i);
    (!t.is_empty()).then_some(t)
}

/// The wider of two column types (u64 < f64 < str).
fn wider(a: &Values, b: &Values) -> Values {
    let rank = |v: &Values| match v {
        Values::U64(_) => 0,
        Values::F64(_) => 1,
        Values::Str(_) => 2,
    };
    if rank(a) >= rank(b) {
        Values::nulls(0, a)
    } else {
        Values::nulls(0, b)
    }
}

/// A float as shortest round-trip text (`1`, `0.5`, `1e-7`).
pub fn fmt_f64(x: f64) -> String {
    format!("{x}")
}

/// A float as CSV text: [`fmt_f64`], with `.0` added to a finite whole
/// number written without a point or exponent (`3` -> `3.0`).
pub fn csv_f64(x: f64) -> String {
    let s = fmt_f64(x);
    if x.is_finite() && !s.contains(['.', 'e', 'E']) {
        s + ".0"
    } else {
        s
    }
}

/// One named column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub values: Values,
}

/// Columns of equal length, and key-value metadata (what produced the
/// table: `kb-sim sweep` stores its sweep id and spec there).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    pub columns: Vec<Column>,
    /// Key-value metadata, in order: Parquet keeps it in the file's
    /// key-value metadata; CSV has nowhere to keep it (a table that needs
    /// it in CSV too puts it in columns).
    pub meta: Vec<(String, String)>,
}

impl Table {
    /// Rows (every column has this many cells).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.values.len())
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Add a column; its length must match the table's.
    pub fn push(&mut self, name: impl Into<String>, values: Values) {
        let name = name.into();
        assert!(
            self.columns.is_empty() || values.len() == self.rows(),
            "column {name}: {} cells in a table of {} rows",
            values.len(),
            self.rows()
        );
        self.columns.push(Column { name, values });
    }

    /// Write RFC 4180 CSV: a header, then one line per row.
    pub fn write_csv(&self, w: &mut dyn Write) -> io::Result<()> {
        let head: Vec<String> = self.columns.iter().map(|c| csv_field(&c.name)).collect();
        writeln!(w, "{}", head.join(","))?;
        for i in 0..self.rows() {
            let row: Vec<String> = self
                .columns
                .iter()
                .map(|c| match &c.values {
                    // A float column's whole values keep a point (`3.0`),
                    // so readers (kb-table, pandas) type the CSV column as
                    // the Parquet one: a float, whatever its values.
                    Values::F64(v) => v[i].map_or(String::new(), csv_f64),
                    v => csv_field(&v.text(i)),
                })
                .collect();
            writeln!(w, "{}", row.join(","))?;
        }
        Ok(())
    }

    fn schema_and_arrays(&self) -> (Arc<Schema>, Vec<ArrayRef>) {
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for c in &self.columns {
            let (dt, a): (DataType, ArrayRef) = match &c.values {
                Values::U64(v) => (DataType::UInt64, Arc::new(UInt64Array::from(v.clone()))),
                Values::F64(v) => (DataType::Float64, Arc::new(Float64Array::from(v.clone()))),
                Values::Str(v) => (
                    DataType::Utf8,
                    Arc::new(StringArray::from(
                        v.iter().map(|s| s.as_deref()).collect::<Vec<_>>(),
                    )),
                ),
            };
            fields.push(Field::new(&c.name, dt, true));
            arrays.push(a);
        }
        (Arc::new(Schema::new(fields)), arrays)
    }

    /// Write Apache Parquet (one row group, snappy).
    pub fn write_parquet<W: Write + Send>(&self, w: W) -> Result<W> {
        let (schema, arrays) = self.schema_and_arrays();
        let fmt = |e: parquet::errors::ParquetError| Error::Format(format!("parquet: {e}"));
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .map_err(|e| Error::Format(format!("parquet: {e}")))?;
        let kv: Vec<KeyValue> = self
            .meta
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_key_value_metadata((!kv.is_empty()).then_some(kv))
            .build();
        let mut writer = ArrowWriter::try_new(w, schema, Some(props)).map_err(fmt)?;
        writer.write(&batch).map_err(fmt)?;
        writer.into_inner().map_err(fmt)
    }

    /// Write to `path` atomically (a temporary file renamed into place):
    /// Parquet when it ends in `.parquet`, else CSV.
    pub fn save(&self, path: &Path) -> Result<()> {
        let what = |e: io::Error| Error::Io(format!("writing {}: {e}", path.display()), e);
        self.write_file(path)?.commit().map_err(what)
    }

    /// Write tables as a set (a sweep's CSV and Parquet): each in full to
    /// a temporary file (removed on SIGINT, SIGTERM or SIGHUP) before any
    /// is renamed into place, so a failure while writing (a full disk)
    /// leaves every older file as it was, never a new one beside a stale
    /// one.
    pub fn save_set(tables: &[(&Table, &Path)]) -> Result<()> {
        let mut files = Vec::with_capacity(tables.len());
        for (t, path) in tables {
            files.push(t.write_file(path)?);
        }
        let names: Vec<String> = tables
            .iter()
            .map(|(_, p)| p.display().to_string())
            .collect();
        kb_format::AtomicFile::commit_all(files)
            .map_err(|e| Error::Io(format!("writing {}: {e}", names.join(" and ")), e))
    }

    /// The table written to a temporary file for `path`, not yet
    /// committed.
    fn write_file(&self, path: &Path) -> Result<kb_format::AtomicFile> {
        let what = |e: io::Error| Error::Io(format!("writing {}: {e}", path.display()), e);
        let mut f = kb_format::AtomicFile::create(path)
            .map_err(what)?
            .remove_on_signal();
        if is_parquet(path) {
            f = self.write_parquet(f).map_err(|e| match e {
                Error::Format(m) => Error::Format(format!("writing {}: {m}", path.display())),
                e => e,
            })?;
        } else {
            let mut b = io::BufWriter::new(&mut f);
            self.write_csv(&mut b).map_err(what)?;
            b.flush().map_err(what)?;
            drop(b);
        }
        Ok(f)
    }

    /// Read a table written by [`Table::save`] (or any Parquet file whose
    /// columns are unsigned or signed integers, floats or strings).
    pub fn load(path: &Path) -> Result<Table> {
        let name = path.display().to_string();
        if is_parquet(path) {
            let f = File::open(path).map_err(|e| Error::Io(format!("{name}: {e}"), e))?;
            Table::read_parquet(f, &name)
        } else {
            let f = File::open(path).map_err(|e| Error::Io(format!("{name}: {e}"), e))?;
            let text = read_text(f, &name)?;
            Table::read_csv(&text, &name)
        }
    }

    /// Read Parquet from a file. The parquet crate asserts on some
    /// malformed metadata (a negative column chunk start, found by
    /// fuzzing); such a panic is caught and reported as the file not being
    /// readable, its message kept, never shown as a crash.
    pub fn read_parquet(f: File, name: &str) -> Result<Table> {
        // A silent hook while the reader runs, so a caught panic prints
        // nothing (another thread panicking meanwhile would be silent too;
        // the tools read tables on one thread). One read swaps the hook at
        // a time, so concurrent reads cannot leave the silent one behind.
        static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::read_parquet_unguarded(f, name)
        }));
        std::panic::set_hook(hook);
        read.unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the reader failed".into());
            Err(Error::Format(format!(
                "{name}: not a readable Parquet file ({why})"
            )))
        })
    }

    fn read_parquet_unguarded(f: File, name: &str) -> Result<Table> {
        let fmt = |e: &dyn std::fmt::Display| Error::Format(format!("{name}: {e}"));
        // The column types come from the Parquet schema alone: decoding the
        // Arrow schema a writer may embed panics on a forged one
        // ("Type <UNKNOWN 49> not supported", found by fuzzing), and every
        // table column type (integers, floats, strings) is a plain Parquet
        // type anyway.
        let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
        let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(f, options)
            .map_err(|e| fmt(&e))?;
        // The writer's key-value metadata, less the Arrow schema it embeds.
        let meta: Vec<(String, String)> = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .into_iter()
            .flatten()
            .filter(|kv| kv.key != "ARROW:schema")
            .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
            .collect();
        let reader = builder.build().map_err(|e| fmt(&e))?;
        let mut t: Option<Table> = None;
        for batch in reader {
            let batch = batch.map_err(|e| fmt(&e))?;
            let schema = batch.schema();
            let mut part = Table::default();
            for (field, a) in schema.fields().iter().zip(batch.columns()) {
                let values = values_of(a.as_ref()).ok_or_else(|| {
                    Error::Format(format!(
                        "{name}: column {}: type {} is not a table column type (integers, floats, strings)",
                        field.name(),
                        field.data_type()
                    ))
                })?;
                part.push(field.name().clone(), values);
            }
            t = Some(match t {
                None => part,
                Some(mut t) => {
                    for (c, p) in t.columns.iter_mut().zip(part.columns) {
                        c.values.append(p.values);
                    }
                    t
                }
            });
        }
        let mut t = t.unwrap_or_default();
        t.meta = meta;
        Ok(t)
    }

    /// The value of metadata key `key`.
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Read CSV text (the first line names the columns).
    pub fn read_csv(text: &str, name: &str) -> Result<Table> {
        let mut lines = split_records(text).into_iter();
        let Some(head) = lines.next() else {
            return Ok(Table::default());
        };
        let head =
            parse_csv_line(&head).map_err(|e| Error::Format(format!("{name}: line 1: {e}")))?;
        let mut cells: Vec<Vec<Option<String>>> = vec![Vec::new(); head.len()];
        for (i, line) in lines.enumerate() {
            if line.is_empty() {
                continue;
            }
            let row = parse_csv_line(&line)
                .map_err(|e| Error::Format(format!("{name}: row {}: {e}", i + 1)))?;
            if row.len() != head.len() {
                return Err(Error::Format(format!(
                    "{name}: row {}: {} fields, the header has {}",
                    i + 1,
                    row.len(),
                    head.len()
                )));
            }
            for (c, v) in cells.iter_mut().zip(row) {
                c.push((!v.is_empty()).then_some(v));
            }
        }
        let mut t = Table::default();
        for (h, c) in head.into_iter().zip(cells) {
            t.push(h, infer(c));
        }
        Ok(t)
    }

    /// Rows of `tables` one after another, columns joined by name (in
    /// first-seen order; a column a table lacks is null there; types widen
    /// u64 -> f64 -> str where tables disagree).
    /// The metadata is the tables' when they all have the same, else none.
    pub fn concat(tables: Vec<Table>) -> Table {
        let meta = match tables.split_first() {
            Some((first, rest)) if rest.iter().all(|t| t.meta == first.meta) => first.meta.clone(),
            _ => Vec::new(),
        };
        let mut names: Vec<String> = Vec::new();
        let mut kinds: Vec<Values> = Vec::new();
        for t in &tables {
            for c in &t.columns {
                match names.iter().position(|n| *n == c.name) {
                    Some(i) => kinds[i] = wider(&kinds[i], &c.values),
                    None => {
                        names.push(c.name.clone());
                        kinds.push(Values::nulls(0, &c.values));
                    }
                }
            }
        }
        let mut out: Vec<Values> = kinds.iter().map(|k| Values::nulls(0, k)).collect();
        for mut t in tables {
            let n = t.rows();
            for (i, name) in names.iter().enumerate() {
                let v = match t.columns.iter().position(|c| c.name == *name) {
                    Some(j) => std::mem::replace(&mut t.columns[j].values, Values::U64(vec![]))
                        .promote(&kinds[i]),
                    None => Values::nulls(n, &kinds[i]),
                };
                out[i].append(v);
            }
        }
        Table {
            columns: names
                .into_iter()
                .zip(out)
                .map(|(name, values)| Column { name, values })
                .collect(),
            meta,
        }
    }

    /// Reorder rows: `order[i]` is the old index of new row `i`.
    pub fn reorder(&mut self, order: &[usize]) {
        for c in &mut self.columns {
            c.values = match &c.values {
                Values::U64(v) => Values::U64(order.iter().map(|&i| v[i]).collect()),
                Values::F64(v) => Values::F64(order.iter().map(|&i| v[i]).collect()),
                Values::Str(v) => Values::Str(order.iter().map(|&i| v[i].clone()).collect()),
            };
        }
    }

    /// Column types, for messages (`name:u64`).
    pub fn describe(&self) -> String {
        self.columns
            .iter()
            .map(|c| format!("{}:{}", c.name, c.values.type_name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

fn values_of(a: &dyn Array) -> Option<Values> {
    let any = a.as_any();
    let n = a.len();
    if let Some(x) = any.downcast_ref::<UInt64Array>() {
        return Some(Values::U64(
            (0..n).map(|i| x.is_valid(i).then(|| x.value(i))).collect(),
        ));
    }
    if let Some(x) = any.downcast_ref::<Int64Array>() {
        // Negative integers do not fit u64: keep them as floats.
        let v: Vec<Option<i64>> = (0..n).map(|i| x.is_valid(i).then(|| x.value(i))).collect();
        return Some(if v.iter().flatten().all(|&x| x >= 0) {
            Values::U64(v.into_iter().map(|x| x.map(|x| x as u64)).collect())
        } else {
            Values::F64(v.into_iter().map(|x| x.map(|x| x as f64)).collect())
        });
    }
    if let Some(x) = any.downcast_ref::<Float64Array>() {
        return Some(Values::F64(
            (0..n).map(|i| x.is_valid(i).then(|| x.value(i))).collect(),
        ));
    }
    if let Some(x) = any.downcast_ref::<StringArray>() {
        return Some(Values::Str(
            (0..n)
                .map(|i| x.is_valid(i).then(|| x.value(i).to_string()))
                .collect(),
        ));
    }
    None
}

fn infer(c: Vec<Option<String>>) -> Values {
    let all = |f: &dyn Fn(&str) -> bool| c.iter().flatten().all(|s| f(s));
    if all(&|s| s.parse::<u64>().is_ok()) {
        Values::U64(
            c.iter()
                .map(|s| s.as_deref().map(|s| s.parse().expect("checked")))
                .collect(),
        )
    } else if all(&|s| s.parse::<f64>().is_ok()) {
        Values::F64(
            c.iter()
                .map(|s| s.as_deref().map(|s| s.parse().expect("checked")))
                .collect(),
        )
    } else {
        Values::Str(c)
    }
}

/// The most bytes a CSV table may have (a sweep of a million points is
/// about 0.5 GiB).
pub const MAX_CSV_BYTES: u64 = 1 << 30;

/// A CSV table's text, read in pieces so that what no CSV table holds
/// stops the read at once: a NUL byte (`/dev/zero` as a table read 2 GB
/// before failing, or forever), more than [`MAX_CSV_BYTES`], or bytes that
/// are not UTF-8.
fn read_text(f: File, name: &str) -> Result<String> {
    let mut r = f.take(MAX_CSV_BYTES + 1);
    let (mut text, mut buf) = (Vec::new(), vec![0u8; 1 << 16]);
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| Error::Io(format!("{name}: {e}"), e))?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|&b| b == 0) {
            return Err(Error::Format(format!(
                "{name}: not a CSV table (a NUL byte at offset {})",
                text.len() + i
            )));
        }
        text.extend_from_slice(&buf[..n]);
    }
    if text.len() as u64 > MAX_CSV_BYTES {
        return Err(Error::Format(format!(
            "{name}: larger than {MAX_CSV_BYTES} bytes: not a results table"
        )));
    }
    String::from_utf8(text).map_err(|e| {
        Error::Format(format!(
            "{name}: not a CSV table (not UTF-8 at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Quote a CSV field when it needs it (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Split CSV text into records (newlines inside quotes kept).
fn split_records(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in text.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                cur.push(ch);
            }
            '\n' if !quoted => out.push(std::mem::take(&mut cur)),
            '\r' if !quoted => {}
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn parse_csv_line(line: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cur.push(c),
            (false, '"') if cur.is_empty() && !was_quoted => {
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                out.push(std::mem::take(&mut cur));
                was_quoted = false;
            }
            (false, '"') => return Err("a quote inside an unquoted field".into()),
            (false, c) => cur.push(c),
        }
    }
    if quoted {
        return Err("an unterminated quoted field".into());
    }
    out.push(cur);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::default();
        t.push("point", Values::U64(vec![Some(0), Some(1), Some(2)]));
        t.push(
            "hbm.channel_bw_gbs",
            Values::F64(vec![Some(16.0), Some(32.5), None]),
        );
        t.push(
            "verdict",
            Values::Str(vec![Some("PASS".into()), None, Some("a,\"b\"".into())]),
        );
        t
    }

    #[test]
    fn csv_and_parquet_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let t = sample();
        for f in ["t.csv", "t.parquet"] {
            let p = d.path().join(f);
            t.save(&p).unwrap();
            assert_eq!(Table::load(&p).unwrap(), t, "{f}");
        }
        // Parquet keeps key-value metadata (in order); CSV drops it.
        let mut m = t.clone();
        m.meta = vec![("kb.b".into(), "2".into()), ("kb.a".into(), "x y".into())];
        let p = d.path().join("m.parquet");
        m.save(&p).unwrap();
        let back = Table::load(&p).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.meta("kb.a"), Some("x y"));
        assert_eq!(back.meta("kb.c"), None);
        std::fs::remove_file(&p).unwrap();
        let mut csv = Vec::new();
        t.write_csv(&mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "point,hbm.channel_bw_gbs,verdict\n0,16.0,PASS\n1,32.5,\n2,,\"a,\"\"b\"\"\"\n"
        );
        // Nothing but the two files: no temporary left behind.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    /// A float column whose values are all whole (busy times in whole ns)
    /// reads back from CSV as floats, the type Parquet keeps.
    #[test]
    fn whole_floats_stay_floats_through_csv() {
        let mut t = Table::default();
        t.push(
            "hbm_channel_busy_ns",
            Values::F64(vec![Some(1234.0), Some(0.0), None]),
        );
        t.push(
            "big",
            Values::F64(vec![Some(1e20), Some(-3.0), Some(f64::INFINITY)]),
        );
        let mut csv = Vec::new();
        t.write_csv(&mut csv).unwrap();
        let text = String::from_utf8(csv).unwrap();
        assert_eq!(
            text,
            "hbm_channel_busy_ns,big\n1234.0,100000000000000000000.0\n0.0,-3.0\n,inf\n"
        );
        let back = Table::read_csv(&text, "t.csv").unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn concat_joins_columns_by_name_and_widens_types() {
        let a = sample();
        let mut b = Table::default();
        b.push("verdict", Values::Str(vec![Some("FAIL".into())]));
        b.push("point", Values::F64(vec![Some(3.5)]));
        b.push("extra", Values::U64(vec![Some(7)]));
        let c = Table::concat(vec![a, b]);
        assert_eq!(c.rows(), 4);
        assert_eq!(
            c.describe(),
            "point:f64, hbm.channel_bw_gbs:f64, verdict:str, extra:u64"
        );
        assert_eq!(c.column("point").unwrap().values.f64(3), Some(3.5));
        assert_eq!(c.column("extra").unwrap().values.text(0), "");
        assert_eq!(c.column("extra").unwrap().values.text(3), "7");
        assert_eq!(c.column("hbm.channel_bw_gbs").unwrap().values.text(3), "");
    }

    #[test]
    fn bad_csv_is_an_error_naming_the_row() {
        let e = Table::read_csv("a,b\n1,2\n3\n", "x.csv").unwrap_err();
        assert_eq!(e.to_string(), "x.csv: row 2: 1 fields, the header has 2");
        let e = Table::read_csv("a\n\"x\n", "x.csv").unwrap_err();
        assert!(e.to_string().contains("unterminated"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.parquet");
        std::fs::write(&p, b"not parquet").unwrap();
        let e = Table::load(&p).unwrap_err().to_string();
        assert!(e.starts_with(&p.display().to_string()), "{e}");
    }
}
