//! `export TRACE -o ops.parquet|ops.csv`: the op log as typed, flattened
//! columns ([`crate::columns`]) in Apache Parquet (Arrow's `parquet`
//! crate, snappy) or CSV, filtered like `ops`.
//!
//! One pass; records are turned into Arrow arrays a batch at a time
//! ([`BATCH`] rows) and written in row groups of [`ROW_GROUP`] rows, so
//! memory is bounded by one row group's encoded columns, not by the
//! trace. The file is written under a temporary name and renamed into
//! place only when complete; binary output to a terminal is refused.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use kb_format::{Launch, Meta, Record, Strings};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::columns::{Flat, Launches, Places};
use crate::ops::{Filter, Matcher};
use crate::render::kind_name;
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Error, Result};

/// Rows per Arrow batch.
pub const BATCH: usize = 64 * 1024;
/// Rows per Parquet row group.
pub const ROW_GROUP: usize = 256 * 1024;

/// Output format of `export`, from the file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    Csv,
}

impl Format {
    /// `.parquet` -> Parquet, `.csv` -> CSV, else an error naming the file.
    pub fn of(path: &Path) -> Result<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("parquet") => Ok(Format::Parquet),
            Some(e) if e.eq_ignore_ascii_case("csv") => Ok(Format::Csv),
            _ => Err(Error::usage(format!(
                "export -o {}: name a .parquet or .csv file (or give --format)",
                path.display()
            ))),
        }
    }
}

fn u32_f() -> DataType {
    DataType::UInt32
}

/// The Arrow schema of the export (see [`crate::columns`]).
pub fn schema() -> SchemaRef {
    let shape = DataType::List(Arc::new(Field::new("item", DataType::UInt64, true)));
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    Arc::new(Schema::new(vec![
        f("op_id", DataType::UInt64, false),
        f("start_ns", DataType::Float64, false),
        f("end_ns", DataType::Float64, false),
        f("dur_ns", DataType::Float64, false),
        f("start_ps", DataType::UInt64, false),
        f("end_ps", DataType::UInt64, false),
        f("dur_ps", DataType::UInt64, false),
        f("component", DataType::Utf8, false),
        f("sip", u32_f(), true),
        f("cube", u32_f(), true),
        f("pe", u32_f(), true),
        f("unit", DataType::Utf8, false),
        f("kind", DataType::Utf8, false),
        f("name", DataType::Utf8, false),
        f("bytes", DataType::UInt64, false),
        f("flops", DataType::UInt64, false),
        f("fingerprint", DataType::Utf8, true),
        f("dtype", DataType::Utf8, true),
        f("dtype_acc", DataType::Utf8, true),
        f("dtype_out", DataType::Utf8, true),
        f("m", u32_f(), true),
        f("n", u32_f(), true),
        f("k", u32_f(), true),
        f("math_op", DataType::Utf8, true),
        f("axis", u32_f(), true),
        f("rows", u32_f(), true),
        f("cols", DataType::UInt64, true),
        f("row_bytes", DataType::UInt64, true),
        f(
            "in_shapes",
            DataType::List(Arc::new(Field::new("item", shape.clone(), true))),
            true,
        ),
        f("out_shape", shape, true),
        f("src_space", DataType::Utf8, true),
        f("src_addr", DataType::UInt64, true),
        f("dst_space", DataType::Utf8, true),
        f("dst_addr", DataType::UInt64, true),
        f("read_pa", DataType::UInt64, true),
        f("write_pa", DataType::UInt64, true),
        f("route_src", DataType::Utf8, true),
        f("route_dst", DataType::Utf8, true),
        f(
            "deps",
            DataType::List(Arc::new(Field::new("item", DataType::UInt64, true))),
            true,
        ),
        f("launch", u32_f(), true),
        f("kernel", DataType::Utf8, true),
    ]))
}

/// Builders for one batch, in schema order.
struct Builders {
    op_id: UInt64Builder,
    start_ns: Float64Builder,
    end_ns: Float64Builder,
    dur_ns: Float64Builder,
    start_ps: UInt64Builder,
    end_ps: UInt64Builder,
    dur_ps: UInt64Builder,
    component: StringBuilder,
    sip: UInt32Builder,
    cube: UInt32Builder,
    pe: UInt32Builder,
    unit: StringBuilder,
    kind: StringBuilder,
    name: StringBuilder,
    bytes: UInt64Builder,
    flops: UInt64Builder,
    fingerprint: StringBuilder,
    dtype: StringBuilder,
    dtype_acc: StringBuilder,
    dtype_out: StringBuilder,
    m: UInt32Builder,
    n: UInt32Builder,
    k: UInt32Builder,
    math_op: StringBuilder,
    axis: UInt32Builder,
    rows: UInt32Builder,
    cols: UInt64Builder,
    row_bytes: UInt64Builder,
    in_shapes: ListBuilder<ListBuilder<UInt64Builder>>,
    out_shape: ListBuilder<UInt64Builder>,
    src_space: StringBuilder,
    src_addr: UInt64Builder,
    dst_space: StringBuilder,
    dst_addr: UInt64Builder,
    read_pa: UInt64Builder,
    write_pa: UInt64Builder,
    route_src: StringBuilder,
    route_dst: StringBuilder,
    deps: ListBuilder<UInt64Builder>,
    launch: UInt32Builder,
    kernel: StringBuilder,
    len: usize,
}

impl Builders {
    fn new() -> Builders {
        let u64b = || UInt64Builder::with_capacity(BATCH);
        let u32b = || UInt32Builder::with_capacity(BATCH);
        let f64b = || Float64Builder::with_capacity(BATCH);
        let sb = || StringBuilder::with_capacity(BATCH, BATCH * 8);
        Builders {
            op_id: u64b(),
            start_ns: f64b(),
            end_ns: f64b(),
            dur_ns: f64b(),
            start_ps: u64b(),
            end_ps: u64b(),
            dur_ps: u64b(),
            component: StringBuilder::with_capacity(BATCH, BATCH * 24),
            sip: u32b(),
            cube: u32b(),
            pe: u32b(),
            unit: sb(),
            kind: sb(),
            name: sb(),
            bytes: u64b(),
            flops: u64b(),
            fingerprint: sb(),
            dtype: sb(),
            dtype_acc: sb(),
            dtype_out: sb(),
            m: u32b(),
            n: u32b(),
            k: u32b(),
            math_op: sb(),
            axis: u32b(),
            rows: u32b(),
            cols: u64b(),
            row_bytes: u64b(),
            in_shapes: ListBuilder::new(ListBuilder::new(UInt64Builder::new())),
            out_shape: ListBuilder::new(UInt64Builder::new()),
            src_space: sb(),
            src_addr: u64b(),
            dst_space: sb(),
            dst_addr: u64b(),
            read_pa: u64b(),
            write_pa: u64b(),
            route_src: sb(),
            route_dst: sb(),
            deps: ListBuilder::new(UInt64Builder::with_capacity(BATCH)),
            launch: u32b(),
            kernel: sb(),
            len: 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        r: &Record,
        f: &Flat,
        comp: &str,
        place: &crate::columns::Place,
        kind: &str,
        name: &str,
        kernel: Option<&str>,
    ) {
        let dur = r.t_end.saturating_sub(r.t_start);
        self.op_id.append_value(r.op_id);
        self.start_ns.append_value(r.t_start as f64 / 1e3);
        self.end_ns.append_value(r.t_end as f64 / 1e3);
        self.dur_ns.append_value(dur as f64 / 1e3);
        self.start_ps.append_value(r.t_start);
        self.end_ps.append_value(r.t_end);
        self.dur_ps.append_value(dur);
        self.component.append_value(comp);
        self.sip.append_option(place.sip);
        self.cube.append_option(place.cube);
        self.pe.append_option(place.pe);
        self.unit.append_value(&place.unit);
        self.kind.append_value(kind);
        self.name.append_value(name);
        self.bytes.append_value(f.bytes);
        self.flops.append_value(f.flops);
        match f.fingerprint {
            Some(x) => self.fingerprint.append_value(format!("{x:#018x}")),
            None => self.fingerprint.append_null(),
        }
        self.dtype.append_option(f.dtype);
        self.dtype_acc.append_option(f.dtype_acc);
        self.dtype_out.append_option(f.dtype_out);
        self.m.append_option(f.m);
        self.n.append_option(f.n);
        self.k.append_option(f.k);
        self.math_op.append_option(f.math_op);
        self.axis.append_option(f.axis);
        self.rows.append_option(f.rows);
        self.cols.append_option(f.cols);
        self.row_bytes.append_option(f.row_bytes);
        for s in &f.in_shapes {
            self.in_shapes.values().values().append_slice(s);
            self.in_shapes.values().append(true);
        }
        self.in_shapes.append(true);
        match f.out_shape {
            Some(s) => {
                self.out_shape.values().append_slice(&s);
                self.out_shape.append(true);
            }
            None => self.out_shape.append(false),
        }
        self.src_space.append_option(f.src_space);
        self.src_addr.append_option(f.src_addr);
        self.dst_space.append_option(f.dst_space);
        self.dst_addr.append_option(f.dst_addr);
        self.read_pa.append_option(f.read_pa);
        self.write_pa.append_option(f.write_pa);
        match f.route {
            Some(rt) => {
                self.route_src.append_value(rt.src.to_string());
                self.route_dst.append_value(rt.dst.to_string());
            }
            None => {
                self.route_src.append_null();
                self.route_dst.append_null();
            }
        }
        self.deps.values().append_slice(&r.deps);
        self.deps.append(true);
        self.launch.append_option(f.launch);
        self.kernel.append_option(kernel);
        self.len += 1;
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch> {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.op_id.finish()),
            Arc::new(self.start_ns.finish()),
            Arc::new(self.end_ns.finish()),
            Arc::new(self.dur_ns.finish()),
            Arc::new(self.start_ps.finish()),
            Arc::new(self.end_ps.finish()),
            Arc::new(self.dur_ps.finish()),
            Arc::new(self.component.finish()),
            Arc::new(self.sip.finish()),
            Arc::new(self.cube.finish()),
            Arc::new(self.pe.finish()),
            Arc::new(self.unit.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.flops.finish()),
            Arc::new(self.fingerprint.finish()),
            Arc::new(self.dtype.finish()),
            Arc::new(self.dtype_acc.finish()),
            Arc::new(self.dtype_out.finish()),
            Arc::new(self.m.finish()),
            Arc::new(self.n.finish()),
            Arc::new(self.k.finish()),
            Arc::new(self.math_op.finish()),
            Arc::new(self.axis.finish()),
            Arc::new(self.rows.finish()),
            Arc::new(self.cols.finish()),
            Arc::new(self.row_bytes.finish()),
            Arc::new(self.in_shapes.finish()),
            Arc::new(self.out_shape.finish()),
            Arc::new(self.src_space.finish()),
            Arc::new(self.src_addr.finish()),
            Arc::new(self.dst_space.finish()),
            Arc::new(self.dst_addr.finish()),
            Arc::new(self.read_pa.finish()),
            Arc::new(self.write_pa.finish()),
            Arc::new(self.route_src.finish()),
            Arc::new(self.route_dst.finish()),
            Arc::new(self.deps.finish()),
            Arc::new(self.launch.finish()),
            Arc::new(self.kernel.finish()),
        ];
        self.len = 0;
        RecordBatch::try_new(schema.clone(), cols)
            .map_err(|e| Error::usage(format!("building the export batch: {e}")))
    }
}

fn perr(e: parquet::errors::ParquetError) -> Error {
    Error::io("writing the Parquet export", std::io::Error::other(e))
}

enum Sink<'w, W: Write + Send> {
    Parquet(Box<ArrowWriter<W>>, Box<Builders>, SchemaRef),
    Csv(&'w mut dyn Write, String),
}

struct Exporter<'w, W: Write + Send> {
    m: Matcher,
    sink: Option<Sink<'w, W>>,
    places: Places,
    launches: Option<Launches>,
    rows: u64,
}

impl<W: Write + Send> Exporter<'_, W> {
    fn flush(&mut self) -> Result<()> {
        if let Some(Sink::Parquet(w, b, schema)) = &mut self.sink
            && b.len > 0
        {
            let batch = b.finish(schema)?;
            w.write(&batch).map_err(perr)?;
        }
        Ok(())
    }
}

impl<W: Write + Send> Visitor for Exporter<'_, W> {
    fn launches(&mut self, launches: &[Launch]) -> Result<()> {
        self.launches = Some(Launches::new(launches));
        Ok(())
    }

    fn meta(&mut self, _: &Meta) -> Result<Flow> {
        if let Some(Sink::Csv(w, _)) = &mut self.sink {
            writeln!(w, "{}", crate::columns::CSV_HEADER).map_err(crate::out_err)?;
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        if self.m.past_window(r) {
            return Ok(Flow::Stop);
        }
        if !self.m.matches(r, s) {
            return Ok(Flow::Continue);
        }
        self.rows += 1;
        let place = self.places.get(r.component, s).clone();
        let f = Flat::of(r, &place, self.launches.as_ref());
        let kernel = f
            .launch
            .and_then(|i| self.launches.as_ref().and_then(|l| l.kernel(i)));
        match self.sink.as_mut().expect("open until the end") {
            Sink::Csv(w, line) => {
                line.clear();
                crate::columns::push_csv(line, r, s, &place, self.launches.as_ref());
                w.write_all(line.as_bytes()).map_err(crate::out_err)?;
            }
            Sink::Parquet(_, b, _) => {
                let kind = kind_name(r.kind);
                let comp = s.name(r.component);
                let name = s.name(r.op_name);
                b.push(r, &f, &comp, &place, &kind, &name, kernel);
                if b.len >= BATCH {
                    self.flush()?;
                }
            }
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, _: &End<'_>) -> Result<()> {
        self.flush()
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    pub rows: u64,
    /// Whether the launch columns could be filled (a file; not a stream).
    pub launches: bool,
}

/// Export the ops of `input` matching `filter` to `w` as `format`.
pub fn write<W: Write + Send>(
    input: &Input,
    filter: &Filter,
    format: Format,
    mut w: W,
) -> Result<(W, Info)> {
    let m = Matcher::new(filter)?;
    let info;
    match format {
        Format::Csv => {
            let mut bw = std::io::BufWriter::with_capacity(1 << 20, &mut w);
            let mut e: Exporter<'_, W> = Exporter {
                m,
                sink: Some(Sink::Csv(&mut bw, String::new())),
                places: Places::default(),
                launches: None,
                rows: 0,
            };
            source::visit(input, &mut e)?;
            info = Info {
                rows: e.rows,
                launches: e.launches.is_some(),
            };
            drop(e);
            bw.flush().map_err(crate::out_err)?;
            drop(bw);
            Ok((w, info))
        }
        Format::Parquet => {
            let schema = schema();
            let props = WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_max_row_group_row_count(Some(ROW_GROUP))
                .set_statistics_enabled(EnabledStatistics::Chunk)
                .build();
            let writer = ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(perr)?;
            let mut e: Exporter<'_, W> = Exporter {
                m,
                sink: Some(Sink::Parquet(
                    Box::new(writer),
                    Box::new(Builders::new()),
                    schema,
                )),
                places: Places::default(),
                launches: None,
                rows: 0,
            };
            source::visit(input, &mut e)?;
            let info = Info {
                rows: e.rows,
                launches: e.launches.is_some(),
            };
            let Some(Sink::Parquet(writer, _, _)) = e.sink.take() else {
                unreachable!("a Parquet sink")
            };
            let w = writer.into_inner().map_err(perr)?;
            Ok((w, info))
        }
    }
}

/// `export -o FILE`: written atomically; binary Parquet never to a
/// terminal.
pub fn run(input: &Input, filter: &Filter, format: Format, out: &Path) -> Result<Info> {
    if format == Format::Parquet && crate::is_terminal_path(out) {
        return Err(Error::usage(format!(
            "refusing to write binary Parquet to a terminal ({}): give a file",
            out.display()
        )));
    }
    if out == Path::new("-") {
        let stdout = std::io::stdout();
        let (mut w, info) = write(input, filter, format, std::io::BufWriter::new(stdout))?;
        w.flush().map_err(crate::out_err)?;
        return Ok(info);
    }
    let what = format!("writing {}", out.display());
    let f = kb_format::AtomicFile::create(out).map_err(|e| Error::io(&what, e))?;
    let (f, info) = write(input, filter, format, f)?;
    f.commit().map_err(|e| Error::io(&what, e))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
    use arrow_array::{Array, ListArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use serde_json::Value;

    fn export_parquet(bytes: &[u8], filter: &Filter) -> (Vec<RecordBatch>, Info, Vec<Value>) {
        let (d, p) = testutil::write_temp(bytes);
        let out = d.path().join("ops.parquet");
        let info = run(&Input::Path(p.clone()), filter, Format::Parquet, &out).unwrap();
        // Read back with the parquet crate's Arrow reader.
        let f = std::fs::File::open(&out).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .with_batch_size(3)
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        // The reference: `ops --format json` over the same trace and filter.
        let mut json = Vec::new();
        crate::ops::run(
            &Input::Path(p),
            filter,
            None,
            crate::ops::Format::Json,
            &mut json,
        )
        .unwrap();
        let json: Value = serde_json::from_slice(&json).unwrap();
        (batches, info, json.as_array().unwrap().clone())
    }

    fn u64s(b: &RecordBatch, c: &str) -> Vec<Option<u64>> {
        let a = b.column_by_name(c).unwrap().as_primitive::<UInt64Type>();
        (0..a.len())
            .map(|i| a.is_valid(i).then(|| a.value(i)))
            .collect()
    }

    fn u32s(b: &RecordBatch, c: &str) -> Vec<Option<u64>> {
        let a = b.column_by_name(c).unwrap().as_primitive::<UInt32Type>();
        (0..a.len())
            .map(|i| a.is_valid(i).then(|| a.value(i) as u64))
            .collect()
    }

    fn strs(b: &RecordBatch, c: &str) -> Vec<Option<String>> {
        let a = b.column_by_name(c).unwrap().as_string::<i32>();
        (0..a.len())
            .map(|i| a.is_valid(i).then(|| a.value(i).to_string()))
            .collect()
    }

    fn lists(b: &RecordBatch, c: &str) -> Vec<Vec<u64>> {
        let a: &ListArray = b.column_by_name(c).unwrap().as_list::<i32>();
        (0..a.len())
            .map(|i| {
                let v = a.value(i);
                let v = v.as_primitive::<UInt64Type>();
                (0..v.len()).map(|j| v.value(j)).collect()
            })
            .collect()
    }

    /// Every row's values, checked against `ops --format json`.
    fn check_against_json(batches: &[RecordBatch], json: &[Value]) -> usize {
        let mut row = 0;
        for b in batches {
            assert_eq!(b.schema(), schema());
            let ids = u64s(b, "op_id");
            let start = u64s(b, "start_ps");
            let end = u64s(b, "end_ps");
            let dur = u64s(b, "dur_ps");
            let start_ns = b
                .column_by_name("start_ns")
                .unwrap()
                .as_primitive::<Float64Type>();
            let dur_ns = b
                .column_by_name("dur_ns")
                .unwrap()
                .as_primitive::<Float64Type>();
            let comp = strs(b, "component");
            let kind = strs(b, "kind");
            let name = strs(b, "name");
            let bytes = u64s(b, "bytes");
            let flops = u64s(b, "flops");
            let fp = strs(b, "fingerprint");
            let deps = lists(b, "deps");
            let (m, n, k) = (u32s(b, "m"), u32s(b, "n"), u32s(b, "k"));
            let dtype = strs(b, "dtype");
            let rows = u32s(b, "rows");
            for i in 0..b.num_rows() {
                let j = &json[row];
                assert_eq!(ids[i], j["op_id"].as_u64(), "row {row}");
                assert_eq!(start[i], j["t_start_ps"].as_u64());
                assert_eq!(end[i], j["t_end_ps"].as_u64());
                assert_eq!(dur[i], j["dur_ps"].as_u64());
                let ps = j["t_start_ps"].as_u64().unwrap();
                assert_eq!(start_ns.value(i), ps as f64 / 1000.0);
                assert_eq!(
                    dur_ns.value(i),
                    j["dur_ps"].as_u64().unwrap() as f64 / 1000.0
                );
                assert_eq!(comp[i].as_deref(), j["component"].as_str());
                assert_eq!(kind[i].as_deref(), j["kind"].as_str());
                assert_eq!(name[i].as_deref(), j["op_name"].as_str());
                assert_eq!(bytes[i], j["bytes"].as_u64());
                assert_eq!(flops[i], j["flops"].as_u64());
                assert_eq!(fp[i].as_deref(), j["fingerprint"].as_str());
                let jd: Vec<u64> = j["deps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                assert_eq!(deps[i], jd);
                let p = &j["params"];
                assert_eq!(m[i], p["m"].as_u64());
                assert_eq!(n[i], p["n"].as_u64());
                assert_eq!(k[i], p["k"].as_u64());
                let jd = match j["kind"].as_str().unwrap() {
                    "gemm" => p["dtype_in"].as_str(),
                    _ => p["dtype"].as_str(),
                };
                assert_eq!(dtype[i].as_deref(), jd);
                assert_eq!(rows[i], p["rows"].as_u64());
                row += 1;
            }
        }
        assert_eq!(row, json.len());
        row
    }

    #[test]
    fn parquet_reads_back_with_the_values_of_ops_json() {
        let (batches, info, json) = export_parquet(&testutil::sample_trace(), &Filter::default());
        assert_eq!(check_against_json(&batches, &json), 7);
        assert_eq!(info.rows, 7);
        assert!(info.launches);
        // Batches of 3 rows: read back in pieces.
        assert_eq!(batches.len(), 3);
        // Columns the JSON only has in text: coordinates, shapes, launches.
        let b = arrow_select_concat(&batches);
        assert_eq!(u32s(&b, "sip")[3], Some(0));
        assert_eq!(u32s(&b, "pe")[5], Some(0));
        assert_eq!(u32s(&b, "cube")[5], Some(1));
        assert_eq!(u32s(&b, "pe")[6], None);
        assert_eq!(strs(&b, "unit")[3].as_deref(), Some("gemm"));
        assert_eq!(
            u32s(&b, "launch"),
            [None, Some(0), Some(0), Some(0), Some(0), Some(1), None]
        );
        assert_eq!(strs(&b, "kernel")[5].as_deref(), Some("softmax"));
        assert_eq!(lists(&b, "out_shape")[3], [2, 3]);
        let ins = b.column_by_name("in_shapes").unwrap().as_list::<i32>();
        let gemm_in = ins.value(3);
        let gemm_in = gemm_in.as_list::<i32>();
        assert_eq!(gemm_in.len(), 2);
        let a = gemm_in.value(0);
        let a = a.as_primitive::<UInt64Type>();
        assert_eq!((a.value(0), a.value(1)), (2, 4));
        assert_eq!(strs(&b, "route_dst")[1].as_deref(), Some("sip0.cube0.hbm"));
        assert_eq!(strs(&b, "route_src")[3], None);
    }

    /// The batches as one (rows in order).
    fn arrow_select_concat(batches: &[RecordBatch]) -> RecordBatch {
        let schema = schema();
        let cols: Vec<ArrayRef> = (0..schema.fields().len())
            .map(|c| {
                let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
                arrow_select::concat::concat(&parts).unwrap()
            })
            .collect();
        RecordBatch::try_new(schema, cols).unwrap()
    }

    #[test]
    fn filters_and_many_batches_and_row_groups() {
        // More rows than a batch, so several batches and row groups.
        let mut ops = Vec::new();
        let n = (BATCH + 10) as u64;
        for i in 0..n {
            ops.push(testutil::mem(
                i,
                i * 10,
                i * 10 + 15,
                testutil::PE_DMA,
                "dma_read",
                64,
            ));
        }
        let bytes = testutil::build(&testutil::sample_meta(), &[], &ops, &Default::default());
        let (batches, info, json) = export_parquet(&bytes, &Filter::default());
        assert_eq!(info.rows, n);
        assert_eq!(check_against_json(&batches, &json), n as usize);
        let f = Filter {
            from: Some(100),
            to: Some(1000),
            ..Default::default()
        };
        let (batches, _, json) = export_parquet(&bytes, &f);
        assert_eq!(check_against_json(&batches, &json), json.len());
        // Ops i start at 10 i and end at 10 i + 15 ps: i = 9..=99 overlap.
        assert_eq!(json.len(), 91);
    }

    #[test]
    fn formats_and_refusals() {
        assert_eq!(Format::of(Path::new("a.PARQUET")).unwrap(), Format::Parquet);
        assert_eq!(Format::of(Path::new("a.csv")).unwrap(), Format::Csv);
        assert!(Format::of(Path::new("a.json")).is_err());
        // A failed export leaves nothing behind.
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("bad.kbt");
        std::fs::write(&bad, b"not a trace").unwrap();
        let out = d.path().join("ops.parquet");
        assert!(run(&Input::Path(bad), &Filter::default(), Format::Parquet, &out).is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn stdin_exports_have_no_launch_columns_but_the_same_rest() {
        let bytes = testutil::sample_trace();
        let mut e: Exporter<'_, Vec<u8>> = Exporter {
            m: Matcher::new(&Filter::default()).unwrap(),
            sink: None,
            places: Places::default(),
            launches: None,
            rows: 0,
        };
        let mut csv = Vec::new();
        e.sink = Some(Sink::Csv(&mut csv, String::new()));
        source::visit_reader("-", &bytes[..], &mut e).unwrap();
        drop(e);
        let t = kb_table::Table::read_csv(std::str::from_utf8(&csv).unwrap(), "-").unwrap();
        assert_eq!(t.rows(), 7);
        assert_eq!(t.column("launch").unwrap().values.text(3), "");
        assert_eq!(t.column("m").unwrap().values.text(3), "2");
    }
}
