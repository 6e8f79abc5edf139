//! `export TRACE -o ops.parquet|ops.csv`: the op log as typed, flattened
//! columns ([`crate::columns`]) in Apache Parquet (Arrow's `parquet`
//! crate, snappy) or CSV, filtered like `ops`.
//!
//! One pass; records are collected into plain column vectors a batch at
//! a time ([`BATCH`] rows; text columns as keys into the batch's own
//! dictionary), which the column encoder threads turn into Arrow arrays
//! and encode, in row groups of [`ROW_GROUP`] rows, so memory is bounded
//! by one row group's encoded columns, not by the trace. The file is written under a temporary name and renamed into
//! place only when complete; binary output to a terminal is refused.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, DictionaryArray, Float64Array, ListArray, PrimitiveArray,
    StringArray, UInt32Array, UInt64Array,
};
use arrow_buffer::{
    ArrowNativeType, BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer,
};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};
use kb_format::{DepKind, Launch, Meta, OpKind, Record, Strings};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::basic::{Compression, Encoding};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::columns::{Flat, Launches, Places};
use crate::ops::{Filter, Matcher};
use crate::progress::Progress;
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
        f(
            "dep_kinds",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
        f("launch", u32_f(), true),
        f("kernel", DataType::Utf8, true),
    ]))
}

/// A column's values as the decoding thread collected them, made into
/// its Arrow array by the encoder thread that owns the column: packing
/// null bits, the text dictionaries, fingerprint hex, the nanosecond and
/// duration columns are off the decoding thread, which only stores a
/// value (or a key) per row.
type Col = Box<dyn FnOnce() -> std::result::Result<ArrayRef, ArrowError> + Send>;

/// A column already made.
fn ready(a: ArrayRef) -> Col {
    Box::new(move || Ok(a))
}

/// Validity as Arrow wants it: none when every row is valid, else the
/// flags packed 64 to a word (Arrow's `From<Vec<bool>>` sets a bit at a
/// time: it showed in the encoders' profile).
fn null_buffer(valid: Vec<bool>, nulls: usize) -> Option<NullBuffer> {
    (nulls > 0).then(|| {
        let words: Vec<u64> = valid
            .chunks(64)
            .map(|c| {
                c.iter()
                    .rev()
                    .fold(0u64, |w, &b| w << 1 | u64::from(b))
                    .to_le()
            })
            .collect();
        NullBuffer::new(BooleanBuffer::new(Buffer::from_vec(words), 0, valid.len()))
    })
}

/// A nullable primitive column: a value (0 for null) and a validity
/// flag per row.
struct Opt<T> {
    values: Vec<T>,
    valid: Vec<bool>,
    nulls: usize,
}

impl<T: ArrowNativeType + Default> Opt<T> {
    fn new() -> Self {
        Opt {
            values: Vec::with_capacity(BATCH),
            valid: Vec::with_capacity(BATCH),
            nulls: 0,
        }
    }

    #[inline]
    fn push(&mut self, v: Option<T>) {
        self.values.push(v.unwrap_or_default());
        self.valid.push(v.is_some());
        self.nulls += usize::from(v.is_none());
    }

    fn col<P>(self) -> Col
    where
        P: ArrowPrimitiveType<Native = T>,
    {
        Box::new(move || {
            let a = PrimitiveArray::<P>::try_new(
                ScalarBuffer::from(self.values),
                null_buffer(self.valid, self.nulls),
            )?;
            Ok(Arc::new(a) as ArrayRef)
        })
    }
}

/// A text column as keys into the batch's own dictionary of the strings
/// it used, the caller naming each string by a small id (a string id, an
/// enum's code): a row costs a key, not a copy of its text. The encoder
/// thread hands the Parquet writer a `DictionaryArray`; the file's column
/// stays `Utf8` (the Arrow schema stored in it is [`schema`]'s) and its
/// bytes are those of the same values as a `StringArray`: the writer
/// interns each row's value either way.
struct Text {
    keys: Vec<u32>,
    valid: Vec<bool>,
    nulls: usize,
    /// Per id: the batch it was last used in and its key there.
    slot: Vec<(u32, u32)>,
    /// This batch's number (from 1; slots of 0 are unused).
    batch: u32,
    /// The dictionary: string i is `bytes[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<i32>,
    bytes: Vec<u8>,
}

impl Text {
    fn new() -> Text {
        Text {
            keys: Vec::with_capacity(BATCH),
            valid: Vec::with_capacity(BATCH),
            nulls: 0,
            slot: Vec::new(),
            batch: 1,
            offsets: vec![0],
            bytes: Vec::new(),
        }
    }

    /// A row with string `id`; `text` gives the string the first time
    /// the batch sees the id.
    #[inline]
    fn push<S: AsRef<str>>(&mut self, id: usize, text: impl FnOnce() -> S) {
        let key = match self.slot.get(id) {
            Some(&(b, k)) if b == self.batch => k,
            _ => self.insert(id, text().as_ref()),
        };
        self.keys.push(key);
        self.valid.push(true);
    }

    /// A row with string `id` named `text`, or a null.
    #[inline]
    fn push_opt(&mut self, v: Option<(usize, &str)>) {
        match v {
            Some((id, text)) => self.push(id, || text),
            None => self.push_null(),
        }
    }

    #[cold]
    fn insert(&mut self, id: usize, s: &str) -> u32 {
        if id >= self.slot.len() {
            self.slot.resize(id + 1, (0, 0));
        }
        let key = (self.offsets.len() - 1) as u32;
        self.bytes.extend_from_slice(s.as_bytes());
        self.offsets.push(self.bytes.len() as i32);
        self.slot[id] = (self.batch, key);
        key
    }

    #[inline]
    fn push_null(&mut self) {
        self.keys.push(0);
        self.valid.push(false);
        self.nulls += 1;
    }

    /// The batch's column; the next batch starts an empty dictionary
    /// (ids are kept: their slots are for this batch's number only).
    fn take(&mut self) -> Col {
        let keys = std::mem::replace(&mut self.keys, Vec::with_capacity(BATCH));
        let valid = std::mem::replace(&mut self.valid, Vec::with_capacity(BATCH));
        let nulls = std::mem::take(&mut self.nulls);
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let bytes = std::mem::take(&mut self.bytes);
        self.batch += 1;
        if self.batch == u32::MAX {
            self.slot.clear();
            self.batch = 1;
        }
        Box::new(move || {
            let values = StringArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                Buffer::from_vec(bytes),
                None,
            )?;
            let keys = UInt32Array::try_new(ScalarBuffer::from(keys), null_buffer(valid, nulls))?;
            let a = DictionaryArray::<UInt32Type>::try_new(keys, Arc::new(values))?;
            Ok(Arc::new(a) as ArrayRef)
        })
    }
}

/// A list column: offsets (one per row, after the first 0), validity
/// and the flattened values.
struct List<T> {
    offsets: Vec<i32>,
    valid: Vec<bool>,
    nulls: usize,
    values: Vec<T>,
}

impl<T> List<T> {
    fn new(values: usize) -> Self {
        let mut offsets = Vec::with_capacity(BATCH + 1);
        offsets.push(0);
        List {
            offsets,
            valid: Vec::with_capacity(BATCH),
            nulls: 0,
            values: Vec::with_capacity(values),
        }
    }

    /// End the row (its values pushed), valid or null.
    #[inline]
    fn end_row(&mut self, valid: bool) {
        self.offsets.push(self.values.len() as i32);
        self.valid.push(valid);
        self.nulls += usize::from(!valid);
    }
}

/// The `item` field of a list field.
fn item(f: &FieldRef) -> FieldRef {
    match f.data_type() {
        DataType::List(i) => i.clone(),
        _ => unreachable!("a list column"),
    }
}

fn u64_list(l: List<u64>, field: FieldRef) -> std::result::Result<ArrayRef, ArrowError> {
    let values = Arc::new(UInt64Array::from(l.values));
    let a = ListArray::try_new(
        field,
        OffsetBuffer::new(ScalarBuffer::from(l.offsets)),
        values,
        null_buffer(l.valid, l.nulls),
    )?;
    Ok(Arc::new(a))
}

/// A list of dependency kinds (codes) as a list of their names.
fn dep_kind_list(l: List<u8>, field: FieldRef) -> std::result::Result<ArrayRef, ArrowError> {
    let names = l
        .values
        .iter()
        .map(|&c| DepKind::from_code(c).map_or("?", DepKind::name));
    let a = ListArray::try_new(
        field,
        OffsetBuffer::new(ScalarBuffer::from(l.offsets)),
        Arc::new(StringArray::from_iter_values(names)),
        null_buffer(l.valid, l.nulls),
    )?;
    Ok(Arc::new(a))
}

/// `{x:#018x}` (`0x` and 16 lower-case hex digits) appended to `out`,
/// without the formatting machinery: one per memory op.
fn hex18(x: u64, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 18];
    buf[0] = b'0';
    buf[1] = b'x';
    for (i, b) in buf[2..].iter_mut().enumerate() {
        *b = HEX[((x >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&buf);
}

/// An op kind's id in the `kind` text column.
fn kind_id(k: OpKind) -> usize {
    match k {
        OpKind::Memory => 0,
        OpKind::Gemm => 1,
        OpKind::Math => 2,
        OpKind::Sync => 3,
        // (Unknown kinds have codes of 5 and up.)
        OpKind::Atomic => 4,
        OpKind::Unknown(c) => 4 + c as usize,
    }
}

/// One batch's columns, in schema order, as plain vectors.
struct Batch {
    op_id: Vec<u64>,
    start_ps: Vec<u64>,
    end_ps: Vec<u64>,
    component: Text,
    sip: Opt<u32>,
    cube: Opt<u32>,
    pe: Opt<u32>,
    unit: Text,
    kind: Text,
    name: Text,
    bytes: Vec<u64>,
    flops: Vec<u64>,
    fingerprint: Opt<u64>,
    dtype: Text,
    dtype_acc: Text,
    dtype_out: Text,
    m: Opt<u32>,
    n: Opt<u32>,
    k: Opt<u32>,
    math_op: Text,
    axis: Opt<u32>,
    rows: Opt<u32>,
    cols: Opt<u64>,
    row_bytes: Opt<u64>,
    /// Per row a list of shapes: the rows' offsets into `in_shape`.
    in_shapes: Vec<i32>,
    /// Each shape, a list of 2 values.
    in_shape: List<u64>,
    out_shape: List<u64>,
    src_space: Text,
    src_addr: Opt<u64>,
    dst_space: Text,
    dst_addr: Opt<u64>,
    read_pa: Opt<u64>,
    write_pa: Opt<u64>,
    route_src: Text,
    route_dst: Text,
    deps: List<u64>,
    /// `deps`' kinds (`DepKind` codes), made into text by the encoder.
    dep_kinds: List<u8>,
    launch: Opt<u32>,
    kernel: Text,
    len: usize,
}

/// What a row needs besides its record and `Flat`.
struct Row<'a> {
    strings: &'a Strings,
    place: &'a crate::columns::Place,
    launches: Option<&'a Launches>,
    endpoints: &'a mut Endpoints,
}

/// Route endpoints numbered in first-seen order: the ids of the route
/// text columns. Looked up twice per memory op: an endpoint packs into a
/// `u32` (a tag and its `u8` fields), and a direct-mapped cache of packed
/// values answers almost every lookup without hashing; a map the rest.
#[derive(Debug, Default)]
struct Endpoints {
    /// (packed + 1, id); 0: empty.
    cache: Vec<(u32, u32)>,
    ids: HashMap<u32, u32, BuildHasherDefault<Fx>>,
}

impl Endpoints {
    /// Cache slots (the top 10 bits of a multiplicative hash).
    const CACHE: usize = 1 << 10;

    fn pack(e: Endpoint) -> u32 {
        let (tag, a, b, c) = match e {
            Endpoint::Unknown => (0, 0, 0, 0),
            Endpoint::Host => (1, 0, 0, 0),
            Endpoint::Hbm { sip, cube } => (2, sip, cube, 0),
            Endpoint::Sram { sip, cube } => (3, sip, cube, 0),
            Endpoint::Tcm { sip, cube, pe } => (4, sip, cube, pe),
        };
        tag << 24 | u32::from(a) << 16 | u32::from(b) << 8 | u32::from(c)
    }

    #[inline]
    fn id(&mut self, e: Endpoint) -> usize {
        if self.cache.is_empty() {
            self.cache = vec![(0, 0); Self::CACHE];
        }
        let p = Self::pack(e);
        let slot = (p.wrapping_mul(0x9e37_79b1) >> 22) as usize;
        match self.cache.get(slot) {
            Some(&(q, id)) if q == p + 1 => id as usize,
            _ => self.insert(p, slot),
        }
    }

    #[cold]
    fn insert(&mut self, p: u32, slot: usize) -> usize {
        let n = self.ids.len() as u32;
        let id = *self.ids.entry(p).or_insert(n);
        if let Some(c) = self.cache.get_mut(slot) {
            *c = (p + 1, id);
        }
        id as usize
    }
}

impl Batch {
    fn new() -> Batch {
        let u64v = || Vec::with_capacity(BATCH);
        let mut in_shapes = Vec::with_capacity(BATCH + 1);
        in_shapes.push(0);
        Batch {
            op_id: u64v(),
            start_ps: u64v(),
            end_ps: u64v(),
            component: Text::new(),
            sip: Opt::new(),
            cube: Opt::new(),
            pe: Opt::new(),
            unit: Text::new(),
            kind: Text::new(),
            name: Text::new(),
            bytes: u64v(),
            flops: u64v(),
            fingerprint: Opt::new(),
            dtype: Text::new(),
            dtype_acc: Text::new(),
            dtype_out: Text::new(),
            m: Opt::new(),
            n: Opt::new(),
            k: Opt::new(),
            math_op: Text::new(),
            axis: Opt::new(),
            rows: Opt::new(),
            cols: Opt::new(),
            row_bytes: Opt::new(),
            in_shapes,
            in_shape: List::new(BATCH * 4),
            out_shape: List::new(BATCH * 2),
            src_space: Text::new(),
            src_addr: Opt::new(),
            dst_space: Text::new(),
            dst_addr: Opt::new(),
            read_pa: Opt::new(),
            write_pa: Opt::new(),
            route_src: Text::new(),
            route_dst: Text::new(),
            deps: List::new(BATCH),
            dep_kinds: List::new(BATCH),
            launch: Opt::new(),
            kernel: Text::new(),
            len: 0,
        }
    }

    fn push(&mut self, r: &Record, f: &Flat, x: Row<'_>) {
        let s = x.strings;
        self.op_id.push(r.op_id);
        self.start_ps.push(r.t_start);
        self.end_ps.push(r.t_end);
        self.component
            .push(r.component as usize, || s.name(r.component));
        self.sip.push(x.place.sip);
        self.cube.push(x.place.cube);
        self.pe.push(x.place.pe);
        self.unit
            .push(r.component as usize, || x.place.unit.as_str());
        self.kind.push(kind_id(r.kind), || kind_name(r.kind));
        self.name.push(r.op_name as usize, || s.name(r.op_name));
        self.bytes.push(f.bytes);
        self.flops.push(f.flops);
        self.fingerprint.push(f.fingerprint);
        for (c, d) in [
            (&mut self.dtype, f.dtype),
            (&mut self.dtype_acc, f.dtype_acc),
            (&mut self.dtype_out, f.dtype_out),
        ] {
            c.push_opt(d.map(|d| (d as usize, d.name())));
        }
        self.m.push(f.m);
        self.n.push(f.n);
        self.k.push(f.k);
        self.math_op
            .push_opt(f.math_op.map(|op| (op as usize, op.name())));
        self.axis.push(f.axis);
        self.rows.push(f.rows);
        self.cols.push(f.cols);
        self.row_bytes.push(f.row_bytes);
        for sh in &f.in_shapes {
            self.in_shape.values.extend_from_slice(sh);
            self.in_shape.end_row(true);
        }
        self.in_shapes
            .push((self.in_shape.offsets.len() - 1) as i32);
        if let Some(sh) = &f.out_shape {
            self.out_shape.values.extend_from_slice(sh);
        }
        self.out_shape.end_row(f.out_shape.is_some());
        self.src_space
            .push_opt(f.src_space.map(|sp| (sp as usize, sp.name())));
        self.src_addr.push(f.src_addr);
        self.dst_space
            .push_opt(f.dst_space.map(|sp| (sp as usize, sp.name())));
        self.dst_addr.push(f.dst_addr);
        self.read_pa.push(f.read_pa);
        self.write_pa.push(f.write_pa);
        match f.route {
            Some(rt) => {
                let id = x.endpoints.id(rt.src);
                self.route_src.push(id, || rt.src.to_string());
                let id = x.endpoints.id(rt.dst);
                self.route_dst.push(id, || rt.dst.to_string());
            }
            None => {
                self.route_src.push_null();
                self.route_dst.push_null();
            }
        }
        self.deps.values.extend(r.deps.iter().map(|d| d.op));
        self.deps.end_row(true);
        self.dep_kinds
            .values
            .extend(r.deps.iter().map(|d| d.kind as u8));
        self.dep_kinds.end_row(true);
        self.launch.push(f.launch);
        let kernel = f
            .launch
            .and_then(|i| x.launches?.kernel(i).map(|k| (i as usize, k)));
        self.kernel.push_opt(kernel);
        self.len += 1;
    }

    fn texts(&mut self) -> [&mut Text; 13] {
        [
            &mut self.component,
            &mut self.unit,
            &mut self.kind,
            &mut self.name,
            &mut self.dtype,
            &mut self.dtype_acc,
            &mut self.dtype_out,
            &mut self.math_op,
            &mut self.src_space,
            &mut self.dst_space,
            &mut self.route_src,
            &mut self.route_dst,
            &mut self.kernel,
        ]
    }

    /// The batch's columns, in schema order; the batch starts over.
    fn take(&mut self, schema: &SchemaRef) -> Vec<Col> {
        // The text columns stay (their id slots number batches; `take`
        // empties them); the rest starts over.
        let mut b = std::mem::replace(self, Batch::new());
        for (kept, fresh) in self.texts().into_iter().zip(b.texts()) {
            std::mem::swap(kept, fresh);
        }
        let field = |name: &str| {
            schema
                .field_with_name(name)
                .map(|f| item(&Arc::new(f.clone())))
                .unwrap_or_else(|_| unreachable!("the export schema has {name}"))
        };
        let start: ScalarBuffer<u64> = b.start_ps.into();
        let end: ScalarBuffer<u64> = b.end_ps.into();
        let ns = |ps: ScalarBuffer<u64>| -> Col {
            Box::new(move || {
                let v: Vec<f64> = ps.iter().map(|&t| t as f64 / 1e3).collect();
                Ok(Arc::new(Float64Array::from(v)) as ArrayRef)
            })
        };
        let dur = |ns: bool| -> Col {
            let (start, end) = (start.clone(), end.clone());
            Box::new(move || {
                let d = start
                    .iter()
                    .zip(end.iter())
                    .map(|(&s, &e)| e.saturating_sub(s));
                Ok(if ns {
                    Arc::new(Float64Array::from_iter_values(d.map(|d| d as f64 / 1e3))) as ArrayRef
                } else {
                    Arc::new(UInt64Array::from_iter_values(d))
                })
            })
        };
        let u64s = |v: Vec<u64>| ready(Arc::new(UInt64Array::from(v)));
        let fp = b.fingerprint;
        let fingerprint: Col = Box::new(move || {
            let mut bytes = Vec::with_capacity(18 * (fp.values.len() - fp.nulls));
            let mut offsets = Vec::with_capacity(fp.values.len() + 1);
            offsets.push(0i32);
            for (&x, &ok) in fp.values.iter().zip(&fp.valid) {
                if ok {
                    hex18(x, &mut bytes);
                }
                offsets.push(bytes.len() as i32);
            }
            let a = StringArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                Buffer::from_vec(bytes),
                null_buffer(fp.valid, fp.nulls),
            )?;
            Ok(Arc::new(a) as ArrayRef)
        });
        let (shape_item, in_item, deps_item, kinds_item) = (
            field("out_shape"),
            field("in_shapes"),
            field("deps"),
            field("dep_kinds"),
        );
        let in_shape = b.in_shape;
        let in_shapes = b.in_shapes;
        let in_shapes: Col = Box::new(move || {
            let inner = u64_list(in_shape, item(&in_item))?;
            let a = ListArray::try_new(
                in_item,
                OffsetBuffer::new(ScalarBuffer::from(in_shapes)),
                inner,
                None,
            )?;
            Ok(Arc::new(a) as ArrayRef)
        });
        let out_shape = b.out_shape;
        let deps = b.deps;
        let dep_kinds = b.dep_kinds;
        vec![
            u64s(b.op_id),
            ns(start.clone()),
            ns(end.clone()),
            dur(true),
            ready(Arc::new(UInt64Array::new(start.clone(), None))),
            ready(Arc::new(UInt64Array::new(end.clone(), None))),
            dur(false),
            self.component.take(),
            b.sip.col::<UInt32Type>(),
            b.cube.col::<UInt32Type>(),
            b.pe.col::<UInt32Type>(),
            self.unit.take(),
            self.kind.take(),
            self.name.take(),
            u64s(b.bytes),
            u64s(b.flops),
            fingerprint,
            self.dtype.take(),
            self.dtype_acc.take(),
            self.dtype_out.take(),
            b.m.col::<UInt32Type>(),
            b.n.col::<UInt32Type>(),
            b.k.col::<UInt32Type>(),
            self.math_op.take(),
            b.axis.col::<UInt32Type>(),
            b.rows.col::<UInt32Type>(),
            b.cols.col::<UInt64Type>(),
            b.row_bytes.col::<UInt64Type>(),
            in_shapes,
            Box::new(move || u64_list(out_shape, shape_item)),
            self.src_space.take(),
            b.src_addr.col::<UInt64Type>(),
            self.dst_space.take(),
            b.dst_addr.col::<UInt64Type>(),
            b.read_pa.col::<UInt64Type>(),
            b.write_pa.col::<UInt64Type>(),
            self.route_src.take(),
            self.route_dst.take(),
            Box::new(move || u64_list(deps, deps_item)),
            Box::new(move || dep_kind_list(dep_kinds, kinds_item)),
            b.launch.col::<UInt32Type>(),
            self.kernel.take(),
        ]
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
    Column(usize, FieldRef, Col),
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
                    && let Err(e) = col()
                        .map_err(ParquetError::from)
                        .and_then(|col| compute_leaves(&field, &col))
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
/// them) while this thread decodes records and collects the next batch; the
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

    /// Write a batch of `rows` rows: its columns in schema order.
    fn write(&mut self, cols: Vec<Col>, rows: usize) -> Result<()> {
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
        if cols.len() != self.schema.fields().len() {
            return Err(Error::usage("export batch: a column per field expected"));
        }
        for (i, (field, col)) in self.schema.fields().iter().zip(cols).enumerate() {
            self.send(i, Msg::Column(i, field.clone(), col))?;
        }
        let rows = self.open.unwrap_or(0) + rows;
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
    Parquet(Box<Parallel<W>>, Box<Batch>, SchemaRef),
    Csv(&'w mut dyn Write, String),
}

struct Exporter<'w, W: Write + Send> {
    m: Matcher,
    sink: Option<Sink<'w, W>>,
    places: Places,
    launches: Option<Launches>,
    endpoints: Endpoints,
    /// The record being exported, flattened (reused: no allocation per
    /// record).
    flat: Flat,
    /// Rows per batch.
    batch: usize,
    rows: u64,
    /// The progress bar (records read), hidden unless asked for.
    progress: Progress,
}

/// A multiply-rotate hasher (rustc's FxHash) for the few small keys of
/// the endpoint ids (SipHash showed in the profile).
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
    fn write_u32(&mut self, i: u32) {
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

impl<W: Write + Send> Exporter<'_, W> {
    fn flush(&mut self) -> Result<()> {
        if let Some(Sink::Parquet(w, b, schema)) = &mut self.sink
            && b.len > 0
        {
            let rows = b.len;
            let cols = b.take(schema);
            w.write(cols, rows)?;
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
        self.progress.record();
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
            flat,
            batch,
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
                flat.fill(r, place, launches.as_ref());
                let row = Row {
                    strings: s,
                    place,
                    launches: launches.as_ref(),
                    endpoints,
                };
                b.push(r, flat, row);
                full = b.len >= *batch;
            }
        }
        if full {
            self.flush()?;
        }
        Ok(Flow::Continue)
    }

    fn end(&mut self, _: &End<'_>) -> Result<()> {
        self.progress.message("writing the last rows");
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
    w: W,
) -> Result<(W, Info)> {
    write_with(input, filter, format, &Progress::hidden(), w)
}

/// [`write()`], counting the records read on `progress`.
pub fn write_with<W: Write + Send>(
    input: &Input,
    filter: &Filter,
    format: Format,
    progress: &Progress,
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
                endpoints: Endpoints::default(),
                flat: Flat::default(),
                batch: BATCH,
                rows: 0,
                progress: progress.clone(),
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
        Format::Parquet => parquet(input, m, w, BATCH, ROW_GROUP, progress),
    }
}

/// A Parquet column path from its dotted name (`deps.list.item`: the
/// values of list `deps`).
fn column_path(dotted: &str) -> ColumnPath {
    ColumnPath::new(dotted.split('.').map(String::from).collect())
}

/// The export's writer properties, row groups of `row_group` rows.
fn properties(row_group: usize) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group))
        .set_statistics_enabled(EnabledStatistics::Chunk);
    // Columns with (nearly) a distinct value per row: dictionary
    // encoding only hashes every value until the dictionary page
    // overflows and the writer falls back to plain.
    for c in UNIQUE_COLUMNS {
        props = props.set_column_dictionary_enabled(column_path(c), false);
    }
    // Increasing integers: deltas, bit-packed (a few bits a row).
    for c in ["op_id", "start_ps", "end_ps", "deps.list.item"] {
        props = props.set_column_encoding(column_path(c), Encoding::DELTA_BINARY_PACKED);
    }
    // Min/max of the text columns cost a string comparison per
    // row and prune little: the numeric columns keep theirs.
    for c in TEXT_COLUMNS {
        props = props.set_column_statistics_enabled(column_path(c), EnabledStatistics::None);
    }
    // Random bits snappy cannot shrink: not worth its time.
    for c in ["fingerprint", "src_addr", "read_pa"] {
        props = props.set_column_compression(column_path(c), Compression::UNCOMPRESSED);
    }
    props.build()
}

/// The Parquet export, in batches of `batch` rows and row groups of
/// `row_group` (a multiple of `batch`).
fn parquet<W: Write + Send>(
    input: &Input,
    m: Matcher,
    w: W,
    batch: usize,
    row_group: usize,
    progress: &Progress,
) -> Result<(W, Info)> {
    let schema = schema();
    let writer =
        ArrowWriter::try_new(w, schema.clone(), Some(properties(row_group))).map_err(perr)?;
    let mut writer = Parallel::new(writer, schema.clone())?;
    writer.row_group = row_group;
    let mut e: Exporter<'_, W> = Exporter {
        m,
        sink: Some(Sink::Parquet(
            Box::new(writer),
            Box::new(Batch::new()),
            schema,
        )),
        places: Places::default(),
        launches: None,
        endpoints: Endpoints::default(),
        flat: Flat::default(),
        batch,
        rows: 0,
        progress: progress.clone(),
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

/// `export -o FILE`: written atomically; binary Parquet never to a
/// terminal.
pub fn run(input: &Input, filter: &Filter, format: Format, out: &Path) -> Result<Info> {
    run_with(input, filter, format, &Progress::hidden(), out)
}

/// [`run`], counting the records read on `progress` (the binary's bar).
pub fn run_with(
    input: &Input,
    filter: &Filter,
    format: Format,
    progress: &Progress,
    out: &Path,
) -> Result<Info> {
    if format == Format::Parquet && crate::is_terminal_path(out) {
        return Err(Error::usage(format!(
            "refusing to write binary Parquet to a terminal ({}): give a file",
            out.display()
        )));
    }
    if out == Path::new("-") {
        let stdout = std::io::stdout();
        let (mut w, info) = write_with(
            input,
            filter,
            format,
            progress,
            std::io::BufWriter::new(stdout),
        )?;
        w.flush().map_err(crate::out_err)?;
        return Ok(info);
    }
    let what = format!("writing {}", out.display());
    let f = kb_format::AtomicFile::create(out)
        .map_err(|e| Error::io(&what, e))?
        .remove_on_signal();
    let (f, info) = write_with(input, filter, format, progress, f)?;
    f.commit().map_err(|e| Error::io(&what, e))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
    use arrow_array::{Array, ListArray, RecordBatch};
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

    fn str_lists(b: &RecordBatch, c: &str) -> Vec<Vec<Option<String>>> {
        let a: &ListArray = b.column_by_name(c).unwrap().as_list::<i32>();
        (0..a.len())
            .map(|i| {
                let v = a.value(i);
                let v = v.as_string::<i32>();
                (0..v.len()).map(|j| Some(v.value(j).to_string())).collect()
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
            let dep_kinds = str_lists(b, "dep_kinds");
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
                let jd = j["deps"].as_array().unwrap();
                let ops: Vec<u64> = jd.iter().map(|d| d["op"].as_u64().unwrap()).collect();
                assert_eq!(deps[i], ops);
                let kinds: Vec<Option<String>> = jd
                    .iter()
                    .map(|d| d["kind"].as_str().map(String::from))
                    .collect();
                assert_eq!(dep_kinds[i], kinds);
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
            p.write(
                b.columns().iter().cloned().map(ready).collect(),
                b.num_rows(),
            )
            .unwrap();
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

    /// Every op shape (the sample's and the copies', launches on some),
    /// five times over (ids and times moved on), so that small batches
    /// and row groups cut it everywhere.
    fn mixed_trace() -> Vec<u8> {
        let base: Vec<testutil::Op> = testutil::sample_ops()
            .into_iter()
            .chain(testutil::route_ops())
            .collect();
        let mut ops = Vec::new();
        for rep in 0..5u64 {
            for (j, op) in base.iter().enumerate() {
                let mut op = op.clone();
                let id = ops.len() as u64;
                let shift = rep * 40_000 + if j < 7 { 0 } else { 20_000 };
                let r = &mut op.rec;
                r.op_id = id;
                r.t_start += shift;
                r.t_end += shift;
                r.active = r.active.map(|(a0, a1)| (a0 + shift, a1 + shift));
                // Edges of every kind: a data edge on every third op, an
                // edge of a kind that cycles through them on the next.
                r.deps = match id % 3 {
                    1 => vec![kb_format::Dep::data(id - 1)],
                    2 => vec![kb_format::Dep {
                        op: id - 2,
                        kind: DepKind::ALL[(id / 3 % 5) as usize],
                    }],
                    _ => vec![],
                };
                if let kb_format::Params::Math(p) = &mut r.params
                    && rep % 2 == 1
                {
                    p.axis = Some(1);
                }
                for (e, seq) in [(&mut r.read, 2 * id), (&mut r.write, 2 * id + 1)] {
                    if let Some(e) = e {
                        e.time += shift;
                        e.seq = seq;
                    }
                }
                ops.push(op);
            }
        }
        testutil::build_with_launches(
            &testutil::sample_meta(),
            &[],
            &ops,
            &testutil::sample_launches(),
            &Default::default(),
        )
    }

    /// The cells of a CSV line (quoted cells unquoted).
    fn csv_cells(line: &str) -> Vec<String> {
        let mut cells = vec![String::new()];
        let mut quoted = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    chars.next();
                    cells.last_mut().unwrap().push('"');
                }
                '"' => quoted = !quoted,
                ',' if !quoted => cells.push(String::new()),
                c => cells.last_mut().unwrap().push(c),
            }
        }
        cells
    }

    /// A Parquet cell as the CSV export writes it (lists as JSON, null
    /// empty); floats are compared as numbers by the caller.
    fn cell(a: &dyn Array, i: usize) -> String {
        if a.is_null(i) {
            return String::new();
        }
        match a.data_type() {
            DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i).to_string(),
            DataType::UInt32 => a.as_primitive::<UInt32Type>().value(i).to_string(),
            DataType::Float64 => a.as_primitive::<Float64Type>().value(i).to_string(),
            DataType::Utf8 => a.as_string::<i32>().value(i).to_string(),
            DataType::List(f) => {
                let v = a.as_list::<i32>().value(i);
                // Text items are JSON strings in CSV's list text.
                let items: Vec<String> = (0..v.len())
                    .map(|j| match f.data_type() {
                        DataType::Utf8 => Value::from(v.as_string::<i32>().value(j)).to_string(),
                        _ => cell(v.as_ref(), j),
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
            d => panic!("no column of type {d}"),
        }
    }

    #[test]
    fn every_column_of_every_row_is_the_csv_exports_across_batches_and_row_groups() {
        let (d, p) = testutil::write_temp(&mixed_trace());
        let input = Input::Path(p);
        let m = || Matcher::new(&Filter::default()).unwrap();
        // Batches of 4 rows (text dictionaries start over in each), row
        // groups of 12.
        let (bytes, info) = parquet(&input, m(), Vec::new(), 4, 12, &Progress::hidden()).unwrap();
        assert_eq!(info.rows, 85);
        let out = d.path().join("x.parquet");
        std::fs::write(&out, &bytes).unwrap();
        let r =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&out).unwrap()).unwrap();
        assert_eq!(r.metadata().num_row_groups(), 8);
        let got: Vec<RecordBatch> = r.build().unwrap().map(|b| b.unwrap()).collect();
        let all = arrow_select::concat::concat_batches(&schema(), &got).unwrap();
        assert_eq!(all.schema(), schema());
        let mut csv = Vec::new();
        write(&input, &Filter::default(), Format::Csv, &mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let mut lines = csv.lines();
        let header = csv_cells(lines.next().unwrap());
        let sc = schema();
        let names: Vec<&str> = sc.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(header, names);
        let mut seen = std::collections::BTreeSet::new();
        for (i, line) in lines.enumerate() {
            let cells = csv_cells(line);
            assert_eq!(cells.len(), names.len(), "row {i}");
            for (c, want) in cells.iter().enumerate() {
                let a = all.column(c);
                let got = cell(a.as_ref(), i);
                if a.data_type() == &DataType::Float64 {
                    assert_eq!(
                        got.parse::<f64>(),
                        want.parse::<f64>(),
                        "row {i} {}",
                        names[c]
                    );
                } else {
                    assert_eq!(&got, want, "row {i} {}", names[c]);
                }
                if !want.is_empty() {
                    seen.insert(names[c]);
                }
            }
        }
        assert_eq!(all.num_rows(), 85);
        // Every column holds a value somewhere (none is checked as only nulls).
        assert_eq!(seen.len(), names.len(), "{seen:?}");
        // The values as plain Arrow arrays through ArrowWriter, in the same
        // batches and row groups: the same file, byte for byte (text
        // columns went in as dictionaries, the rest as built here).
        let mut a = ArrowWriter::try_new(Vec::new(), schema(), Some(properties(12))).unwrap();
        for i in (0..all.num_rows()).step_by(4) {
            a.write(&all.slice(i, 4.min(all.num_rows() - i))).unwrap();
        }
        assert!(
            a.into_inner().unwrap() == bytes,
            "the bytes ArrowWriter writes"
        );
    }

    #[test]
    fn dotted_column_paths_reach_list_values() {
        // `deps.list.item` is deps' values: delta-encoded, no dictionary.
        let props = properties(ROW_GROUP);
        let deps = ColumnPath::new(vec!["deps".into(), "list".into(), "item".into()]);
        assert!(!props.dictionary_enabled(&deps));
        assert_eq!(props.encoding(&deps), Some(Encoding::DELTA_BINARY_PACKED));
        assert!(props.dictionary_enabled(&column_path("component")));
    }

    #[test]
    fn stdin_exports_have_no_launch_columns_but_the_same_rest() {
        let bytes = testutil::sample_trace();
        let mut e: Exporter<'_, Vec<u8>> = Exporter {
            m: Matcher::new(&Filter::default()).unwrap(),
            sink: None,
            places: Places::default(),
            launches: None,
            endpoints: Endpoints::default(),
            flat: Flat::default(),
            batch: BATCH,
            rows: 0,
            progress: Progress::hidden(),
        };
        let mut csv = Vec::new();
        e.sink = Some(Sink::Csv(&mut csv, String::new()));
        source::visit_reader("-", &bytes[..], &mut e).unwrap();
        // The (hidden) bar counted every record read.
        assert_eq!(e.progress.records(), 7);
        drop(e);
        let t = kb_table::Table::read_csv(std::str::from_utf8(&csv).unwrap(), "-").unwrap();
        assert_eq!(t.rows(), 7);
        assert_eq!(t.column("launch").unwrap().values.text(3), "");
        assert_eq!(t.column("m").unwrap().values.text(3), "2");
    }
}
