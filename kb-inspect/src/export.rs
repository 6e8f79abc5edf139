//! `export TRACE -o ops.parquet|ops.csv`: the op log as typed, flattened
//! columns ([`crate::columns`]) in Apache Parquet (Arrow's `parquet`
//! crate, snappy) or CSV, filtered like `ops`.
//!
//! One pass; records are turned into Arrow arrays a batch at a time
//! ([`BATCH`] rows) and written in row groups of [`ROW_GROUP`] rows, so
//! memory is bounded by one row group's encoded columns, not by the
//! trace. The file is written under a temporary name and renamed into
//! place only when complete; binary output to a terminal is refused.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use arrow_array::builder::{
    Float64Builder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use kb_format::{Launch, Meta, OpKind, Record, Strings};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::columns::{Flat, Launches, Places};
use crate::ops::{Filter, Matcher};
use crate::render::{Endpoint, kind_name};
use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Error, Result};

/// Rows per Arrow batch.
pub const BATCH: usize = 64 * 1024;
/// Rows per Parquet row group.
pub const ROW_GROUP: usize = 256 * 1024;

/// Columns written without dictionary encoding: ids, times, addresses
/// and fingerprints, distinct (or nearly) from row to row. Parquet paths
/// (`deps` is a list: its values are `deps.list.item`).
const UNIQUE_COLUMNS: &[&str] = &[
    "op_id",
    "start_ns",
    "end_ns",
    "start_ps",
    "end_ps",
    "fingerprint",
    "src_addr",
    "dst_addr",
    "read_pa",
    "write_pa",
    "deps.list.item",
];

/// The text columns.
const TEXT_COLUMNS: &[&str] = &[
    "component",
    "unit",
    "kind",
    "name",
    "fingerprint",
    "dtype",
    "dtype_acc",
    "dtype_out",
    "math_op",
    "src_space",
    "dst_space",
    "route_src",
    "route_dst",
    "kernel",
];

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
            fingerprint: StringBuilder::with_capacity(BATCH, BATCH * 18),
            dtype: StringBuilder::with_capacity(BATCH, BATCH * 4),
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
            in_shapes: ListBuilder::with_capacity(
                ListBuilder::with_capacity(UInt64Builder::with_capacity(BATCH * 4), BATCH),
                BATCH,
            ),
            out_shape: ListBuilder::with_capacity(UInt64Builder::with_capacity(BATCH * 2), BATCH),
            src_space: sb(),
            src_addr: u64b(),
            dst_space: sb(),
            dst_addr: u64b(),
            read_pa: u64b(),
            write_pa: u64b(),
            route_src: StringBuilder::with_capacity(BATCH, BATCH * 20),
            route_dst: StringBuilder::with_capacity(BATCH, BATCH * 20),
            deps: ListBuilder::with_capacity(UInt64Builder::with_capacity(BATCH), BATCH),
            launch: u32b(),
            kernel: StringBuilder::with_capacity(BATCH, BATCH * 16),
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
        route: Option<(&str, &str)>,
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
            Some(x) => self.fingerprint.append_value(hex18(x, &mut [0; 18])),
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
        match route {
            Some((src, dst)) => {
                self.route_src.append_value(src);
                self.route_dst.append_value(dst);
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
        // Fresh builders at full capacity: a finished builder restarts
        // empty and would regrow (copying) through the next batch.
        *self = Builders::new();
        RecordBatch::try_new(schema.clone(), cols)
            .map_err(|e| Error::usage(format!("building the export batch: {e}")))
    }
}

fn perr(e: parquet::errors::ParquetError) -> Error {
    Error::io("writing the Parquet export", std::io::Error::other(e))
}

fn stopped() -> Error {
    Error::io(
        "writing the Parquet export",
        std::io::Error::other("a column encoder thread stopped"),
    )
}

/// Column messages queued per encoder thread at most.
const QUEUE: usize = 24;

/// Work for a column encoder thread.
enum Msg {
    /// The thread's column writers for a new row group, by leaf index.
    Writers(Vec<(usize, ArrowColumnWriter)>),
    /// One batch's values of column `.0` (one leaf each: no structs).
    Column(usize, FieldRef, ArrayRef),
    /// Close the row group: send back the encoded chunks.
    Close,
}

type Chunks = parquet::errors::Result<Vec<(usize, ArrowColumnChunk)>>;

/// A column encoder thread: encodes (dictionary, levels, snappy) the
/// columns it owns, a row group at a time.
fn encoder(rx: Receiver<Msg>, done: Sender<Chunks>) {
    let mut ws: Vec<(usize, ArrowColumnWriter)> = Vec::new();
    let mut err = None;
    for msg in rx {
        match msg {
            Msg::Writers(w) => ws = w,
            Msg::Column(i, field, col) => {
                if err.is_none()
                    && let Some((_, w)) = ws.iter_mut().find(|(j, _)| *j == i)
                    && let Err(e) = compute_leaves(&field, &col)
                        .and_then(|ls| ls.iter().try_for_each(|l| w.write(l)))
                {
                    err = Some(e);
                }
            }
            Msg::Close => {
                let r = match err.take() {
                    Some(e) => Err(e),
                    None => ws
                        .drain(..)
                        .map(|(i, w)| w.close().map(|c| (i, c)))
                        .collect(),
                };
                ws.clear();
                if done.send(r).is_err() {
                    break;
                }
            }
        }
    }
}

/// The Parquet file written with its columns encoded on worker threads
/// (Arrow's `ArrowColumnWriter`s, one per leaf column, shared out among
/// them) while this thread decodes records and builds the next batch; the
/// row groups, their order and their bytes are those `ArrowWriter` would
/// write (same properties, same Arrow schema metadata).
///
/// Closing a row group does not wait for its encoders: its chunks are
/// collected and written when the next one closes (by then the encoders
/// have long finished it), so neither this thread nor the encoders idle
/// at row-group boundaries. At most one closed row group is in flight.
struct Parallel<W: Write + Send> {
    file: SerializedFileWriter<W>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// Per encoder thread: its work queue, its results and its handle.
    workers: Vec<(SyncSender<Msg>, Receiver<Chunks>, JoinHandle<()>)>,
    /// Row groups opened; rows in the open one (None: none open).
    groups: usize,
    open: Option<usize>,
    /// Row groups closed whose chunks are not yet written (0 or 1).
    in_flight: usize,
    /// Rows per row group (at least; whole batches go in).
    row_group: usize,
}

impl<W: Write + Send> Parallel<W> {
    fn new(w: ArrowWriter<W>, schema: SchemaRef) -> Result<Self> {
        let (file, factory) = w.into_serialized_writer().map_err(perr)?;
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 4);
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            // About one batch's columns queued per encoder: the decoding
            // thread waits when the encoders are behind rather than
            // holding more batches in memory.
            let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
            let (done_tx, done) = std::sync::mpsc::channel();
            let h = std::thread::Builder::new()
                .name(format!("parquet-{i}"))
                .spawn(move || encoder(rx, done_tx))
                .map_err(|e| Error::io("starting a Parquet encoder thread", e))?;
            workers.push((tx, done, h));
        }
        Ok(Parallel {
            file,
            factory,
            schema,
            workers,
            groups: 0,
            open: None,
            in_flight: 0,
            row_group: ROW_GROUP,
        })
    }

    fn send(&self, leaf: usize, msg: Msg) -> Result<()> {
        let (tx, _, _) = &self.workers[leaf % self.workers.len()];
        tx.send(msg).map_err(|_| stopped())
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.open.is_none() {
            let writers = self
                .factory
                .create_column_writers(self.groups)
                .map_err(perr)?;
            // Column i is leaf i: the schema has no structs.
            if writers.len() != self.schema.fields().len() {
                return Err(Error::usage("export schema: a column per leaf expected"));
            }
            let mut per: Vec<Vec<(usize, ArrowColumnWriter)>> =
                (0..self.workers.len()).map(|_| Vec::new()).collect();
            let k = per.len();
            for (i, w) in writers.into_iter().enumerate() {
                per[i % k].push((i, w));
            }
            for (j, ws) in per.into_iter().enumerate() {
                self.send(j, Msg::Writers(ws))?;
            }
            self.groups += 1;
            self.open = Some(0);
        }
        for (i, (field, col)) in self.schema.fields().iter().zip(batch.columns()).enumerate() {
            self.send(i, Msg::Column(i, field.clone(), col.clone()))?;
        }
        let rows = self.open.unwrap_or(0) + batch.num_rows();
        self.open = Some(rows);
        if rows >= self.row_group {
            self.close_group()?;
        }
        Ok(())
    }

    /// Close the open row group: write the one closed before it, and
    /// have the encoders finish this one.
    fn close_group(&mut self) -> Result<()> {
        if self.open.take().is_none() {
            return Ok(());
        }
        self.write_closed()?;
        for j in 0..self.workers.len() {
            self.send(j, Msg::Close)?;
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Write the closed row group in flight, if any (waiting for its
    /// encoders).
    fn write_closed(&mut self) -> Result<()> {
        while self.in_flight > 0 {
            let mut chunks = Vec::new();
            for (_, done, _) in &self.workers {
                chunks.extend(done.recv().map_err(|_| stopped())?.map_err(perr)?);
            }
            chunks.sort_by_key(|c| c.0);
            let mut rg = self.file.next_row_group().map_err(perr)?;
            for (_, c) in chunks {
                c.append_to_row_group(&mut rg).map_err(perr)?;
            }
            rg.close().map_err(perr)?;
            self.in_flight -= 1;
        }
        Ok(())
    }

    /// Close the last row group, stop the threads, write the footer.
    fn finish(mut self) -> Result<W> {
        self.close_group()?;
        self.write_closed()?;
        for (tx, _, h) in std::mem::take(&mut self.workers) {
            drop(tx);
            h.join().map_err(|_| stopped())?;
        }
        self.file.into_inner().map_err(perr)
    }
}

enum Sink<'w, W: Write + Send> {
    Parquet(Box<Parallel<W>>, Box<Builders>, SchemaRef),
    Csv(&'w mut dyn Write, String),
}

struct Exporter<'w, W: Write + Send> {
    m: Matcher,
    sink: Option<Sink<'w, W>>,
    places: Places,
    launches: Option<Launches>,
    /// Route endpoint names, made once per endpoint (not per row).
    endpoints: HashMap<Endpoint, String, BuildHasherDefault<Fx>>,
    rows: u64,
}

/// A multiply-rotate hasher (rustc's FxHash) for the few small keys of
/// the endpoint cache, looked up twice per memory op: SipHash showed in
/// the profile.
#[derive(Debug, Default)]
struct Fx(u64);

impl std::hash::Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_isize(&mut self, i: isize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `{x:#018x}` (`0x` and 16 lower-case hex digits) into `buf`, without
/// the formatting machinery: one per memory op.
fn hex18(x: u64, buf: &mut [u8; 18]) -> &str {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[0] = b'0';
    buf[1] = b'x';
    for (i, b) in buf[2..].iter_mut().enumerate() {
        *b = HEX[((x >> (60 - 4 * i)) & 0xf) as usize];
    }
    // ASCII by construction.
    std::str::from_utf8(buf).unwrap_or_default()
}

impl<W: Write + Send> Exporter<'_, W> {
    fn flush(&mut self) -> Result<()> {
        if let Some(Sink::Parquet(w, b, schema)) = &mut self.sink
            && b.len > 0
        {
            let batch = b.finish(schema)?;
            w.write(&batch)?;
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
        let Exporter {
            sink,
            places,
            launches,
            endpoints,
            ..
        } = self;
        let place = places.get(r.component, s);
        let mut full = false;
        match sink.as_mut().expect("open until the end") {
            Sink::Csv(w, line) => {
                line.clear();
                crate::columns::push_csv(line, r, s, place, launches.as_ref());
                w.write_all(line.as_bytes()).map_err(crate::out_err)?;
            }
            Sink::Parquet(_, b, _) => {
                let f = Flat::of(r, place, launches.as_ref());
                let kernel = f
                    .launch
                    .and_then(|i| launches.as_ref().and_then(|l| l.kernel(i)));
                let kind = match r.kind {
                    OpKind::Unknown(_) => Cow::Owned(kind_name(r.kind)),
                    k => Cow::Borrowed(k.name()),
                };
                let comp = s.name(r.component);
                let name = s.name(r.op_name);
                if let Some(rt) = f.route {
                    for e in [rt.src, rt.dst] {
                        endpoints.entry(e).or_insert_with(|| e.to_string());
                    }
                }
                let route = f
                    .route
                    .map(|rt| (endpoints[&rt.src].as_str(), endpoints[&rt.dst].as_str()));
                b.push(r, &f, &comp, place, &kind, &name, kernel, route);
                full = b.len >= BATCH;
            }
        }
        if full {
            self.flush()?;
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
                endpoints: HashMap::default(),
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
            let mut props = WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_max_row_group_row_count(Some(ROW_GROUP))
                .set_statistics_enabled(EnabledStatistics::Chunk);
            // Columns with (nearly) a distinct value per row: dictionary
            // encoding only hashes every value until the dictionary page
            // overflows and the writer falls back to plain.
            for c in UNIQUE_COLUMNS {
                props = props.set_column_dictionary_enabled(ColumnPath::from(*c), false);
            }
            // Increasing integers: deltas, bit-packed (a few bits a row).
            for c in ["op_id", "start_ps", "end_ps", "deps.list.item"] {
                props =
                    props.set_column_encoding(ColumnPath::from(c), Encoding::DELTA_BINARY_PACKED);
            }
            // Min/max of the text columns cost a string comparison per
            // row and prune little: the numeric columns keep theirs.
            for c in TEXT_COLUMNS {
                props = props
                    .set_column_statistics_enabled(ColumnPath::from(*c), EnabledStatistics::None);
            }
            // Random bits snappy cannot shrink: not worth its time.
            for c in ["fingerprint", "src_addr", "read_pa"] {
                props =
                    props.set_column_compression(ColumnPath::from(c), Compression::UNCOMPRESSED);
            }
            let props = props.build();
            let writer = ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(perr)?;
            let writer = Parallel::new(writer, schema.clone())?;
            let mut e: Exporter<'_, W> = Exporter {
                m,
                sink: Some(Sink::Parquet(
                    Box::new(writer),
                    Box::new(Builders::new()),
                    schema,
                )),
                places: Places::default(),
                launches: None,
                endpoints: HashMap::default(),
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
            let w = writer.finish()?;
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
    fn parallel_encoding_writes_what_arrow_writer_writes_over_many_row_groups() {
        // The sample's rows, re-written in batches of 2 and row groups of
        // 4 through the threaded writer and through ArrowWriter.
        let (batches, _, _) = export_parquet(&testutil::sample_trace(), &Filter::default());
        let all = arrow_select::concat::concat_batches(&schema(), &batches).unwrap();
        let n = all.num_rows();
        assert!(n >= 7);
        let props = || {
            WriterProperties::builder()
                .set_max_row_group_row_count(Some(4))
                .build()
        };
        let mut p = Parallel::new(
            ArrowWriter::try_new(Vec::new(), schema(), Some(props())).unwrap(),
            schema(),
        )
        .unwrap();
        p.row_group = 4;
        let mut a = ArrowWriter::try_new(Vec::new(), schema(), Some(props())).unwrap();
        for i in (0..n).step_by(2) {
            let b = all.slice(i, 2.min(n - i));
            p.write(&b).unwrap();
            a.write(&b).unwrap();
        }
        let threaded = p.finish().unwrap();
        let plain = a.into_inner().unwrap();
        assert!(threaded == plain, "the same bytes as ArrowWriter's");
        let d = tempfile::tempdir().unwrap();
        let read = |bytes: Vec<u8>| {
            let path = d.path().join("x.parquet");
            std::fs::write(&path, bytes).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            let r = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
            assert_eq!(r.metadata().num_row_groups(), n.div_ceil(4));
            let got: Vec<RecordBatch> = r.build().unwrap().map(|b| b.unwrap()).collect();
            arrow_select::concat::concat_batches(&schema(), &got).unwrap()
        };
        assert_eq!(read(threaded), all);
        assert_eq!(read(plain), all);
    }

    #[test]
    fn stdin_exports_have_no_launch_columns_but_the_same_rest() {
        let bytes = testutil::sample_trace();
        let mut e: Exporter<'_, Vec<u8>> = Exporter {
            m: Matcher::new(&Filter::default()).unwrap(),
            sink: None,
            places: Places::default(),
            launches: None,
            endpoints: HashMap::default(),
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
