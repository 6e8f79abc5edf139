//! Writing a trace to any `io::Write`: records go through a reorder buffer
//! and come out in (t_start, op_id) order; a path target is written to a
//! temporary file and renamed into place only on success.

use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::{Dep, Fingerprinter, xxh3_64};

use crate::channels::{ChannelLog, ChannelUsage};
use crate::chunk::{self, ALIGN, BLOCK, ChunkHeader, ChunkKind, Trailer};
use crate::error::{FormatError, Result};
use crate::footer::{Footer, IndexEntry};
use crate::launch::Launch;
use crate::record_codec::{MAX_DEPS, MAX_MATH_INPUTS, MAX_RANGES, RecordEncoder};
use crate::types::{Counts, Extent, MathInput, Meta, OpKind, Params, Ps, Record, VerifySpec};

/// Records chunks are cut when their payload reaches this size.
pub const RECORDS_CHUNK_TARGET: usize = 64 << 10;
/// Tensor data is split into chunks of at most this many bytes.
pub const TENSOR_CHUNK_MAX: usize = 64 << 20;

/// Writes bytes while tracking the offset and the stream digest.
struct Sink<W: Write> {
    out: W,
    offset: u64,
    digest: Fingerprinter,
}

impl<W: Write> Sink<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.digest.update(b);
        self.offset += b.len() as u64;
        Ok(())
    }
}

/// The reorder buffer: records wait in a slab, and a min-heap of their
/// (t_start, op_id) keys and slab slots orders them. Heap operations then
/// move small keys, not records. An emitted record is dropped at once; its
/// slot is reused by the next push, and its effect, dependency and math
/// input vectors, cleared, are kept for the producer's next records
/// ([`TraceWriter::take_ranges`], [`TraceWriter::take_deps`],
/// [`TraceWriter::take_math_inputs`]), so a simulator in steady state
/// allocates none.
#[derive(Default)]
struct Reorder {
    heap: BinaryHeap<Key>,
    slab: Vec<Record>,
    /// Per slab slot: the least effect seq of its record while the record
    /// is in `heap`, else `u64::MAX`. Each records chunk's seq watermark
    /// is the least of these: one pass over a dense array, not a walk of
    /// the buffered records (a record per op in flight, thousands on a
    /// large machine, each a cache miss).
    min_seq: Vec<u64>,
    free: Vec<usize>,
    spare_ranges: Vec<Vec<Extent>>,
    spare_deps: Vec<Vec<Dep>>,
    spare_math_inputs: Vec<Vec<MathInput>>,
}

/// Spare vectors kept at most (of each kind), and the largest capacity
/// kept: a bound on the memory they hold (about 2 MiB of ranges) that
/// covers the records in flight in a large run.
const SPARE_VECS: usize = 4096;
const SPARE_CAPACITY: usize = 16;

/// Keep `v`, cleared, in `pool` if it has a small capacity and the pool
/// has room.
fn keep<T>(pool: &mut Vec<Vec<T>>, mut v: Vec<T>) {
    if (1..=SPARE_CAPACITY).contains(&v.capacity()) && pool.len() < SPARE_VECS {
        v.clear();
        pool.push(v);
    }
}

/// A heap entry: (t_start, op_id, slab slot) packed in one `u128` (16
/// bytes: four to a cache line, half the lines a sift walks at 4,096 PEs
/// with a (key, slot) pair; cheap, branch-free comparisons). op ids are
/// unique, so the slot in the low bits never decides an order. Ordered in
/// reverse, so that the max-heap `BinaryHeap` pops the earliest record
/// first.
#[derive(PartialEq, Eq)]
struct Key(u128);

/// Bits of a [`Key`] below the op id: the slab slot.
const SLOT_BITS: u32 = 24;
/// op ids a writer orders, and records it holds at once.
const MAX_OP_ID: u64 = 1 << (64 - SLOT_BITS);
const MAX_BUFFERED: usize = 1 << SLOT_BITS;

impl Key {
    fn new(t_start: Ps, op_id: u64, slot: usize) -> Key {
        debug_assert!(op_id < MAX_OP_ID && slot < MAX_BUFFERED);
        Key((t_start as u128) << 64 | ((op_id << SLOT_BITS) | slot as u64) as u128)
    }

    fn t_start(&self) -> Ps {
        (self.0 >> 64) as Ps
    }

    fn slot(&self) -> usize {
        (self.0 as u64 & (MAX_BUFFERED as u64 - 1)) as usize
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.cmp(&self.0)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The least seq of a record's effects (`u64::MAX`: none).
fn least_seq(rec: &Record) -> u64 {
    [rec.read.as_ref(), rec.write.as_ref()]
        .into_iter()
        .flatten()
        .map(|e| e.seq)
        .min()
        .unwrap_or(u64::MAX)
}

impl Reorder {
    /// Buffer `rec` (its op id below [`MAX_OP_ID`], fewer than
    /// [`MAX_BUFFERED`] records held: [`TraceWriter::push`] checks both).
    fn push(&mut self, rec: Record) {
        let (t_start, op_id) = (rec.t_start, rec.op_id);
        let least = least_seq(&rec);
        let slot = match self.free.pop() {
            Some(i) => {
                self.slab[i] = rec;
                self.min_seq[i] = least;
                i
            }
            None => {
                self.slab.push(rec);
                self.min_seq.push(least);
                self.slab.len() - 1
            }
        };
        self.heap.push(Key::new(t_start, op_id, slot));
    }

    /// The slot of the earliest record, if it starts before `watermark`;
    /// removed from the heap (the caller frees the slot once done).
    fn pop_before(&mut self, watermark: Ps) -> Option<usize> {
        match self.heap.peek() {
            Some(k) if k.t_start() < watermark => self.pop(),
            _ => None,
        }
    }

    /// The slot of the earliest record, removed from the heap (the caller
    /// frees the slot once done).
    fn pop(&mut self) -> Option<usize> {
        let slot = self.heap.pop()?.slot();
        self.min_seq[slot] = u64::MAX;
        Some(slot)
    }

    /// Drop the record in `slot`, keep its vectors, and reuse the slot.
    fn release(&mut self, slot: usize) {
        let rec = std::mem::take(&mut self.slab[slot]);
        for e in [rec.read, rec.write].into_iter().flatten() {
            keep(&mut self.spare_ranges, e.ranges);
        }
        keep(&mut self.spare_deps, rec.deps);
        if let Params::Math(m) = rec.params {
            keep(&mut self.spare_math_inputs, m.inputs);
        }
        self.free.push(slot);
    }

    fn len(&self) -> usize {
        self.heap.len()
    }

    /// The least effect seq of the records in the heap (`u64::MAX`: none).
    fn least_buffered_seq(&self) -> u64 {
        self.min_seq.iter().copied().min().unwrap_or(u64::MAX)
    }
}

/// Streams a trace into `W`.
///
/// Protocol: `new` (header + metadata), then any mix of `intern`,
/// `tensor_data`, `push` and `advance`, then `finish` (verify spec, footer,
/// trailer). Memory use is bounded by the records pushed but not yet
/// released by `advance`, never by the length of the run.
pub struct TraceWriter<W: Write> {
    sink: Sink<W>,
    ordinal: u32,
    index: Vec<IndexEntry>,
    string_ids: HashMap<String, u32>,
    strings_unwritten: Vec<String>,
    string_count: u32,
    reorder: Reorder,
    seq_floor: u64,
    /// Scratch for a records chunk's payload.
    payload: Vec<u8>,
    watermark: Ps,
    last_emitted: Option<(Ps, u64)>,
    enc: RecordEncoder,
    chunk_target: usize,
    counts: Counts,
    tensor_sizes: Vec<u64>,
    /// HBM channel service, written at finish (before the launches).
    channels: Vec<ChannelLog>,
}

impl<W: Write> std::fmt::Debug for TraceWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("offset", &self.sink.offset)
            .field("counts", &self.counts)
            .field("buffered", &self.reorder.len())
            .finish()
    }
}

impl<W: Write> TraceWriter<W> {
    /// Write the file header and the metadata chunk.
    pub fn new(out: W, meta: &Meta) -> Result<Self> {
        let mut w = TraceWriter {
            sink: Sink {
                out,
                offset: 0,
                digest: Fingerprinter::new(),
            },
            ordinal: 0,
            index: Vec::new(),
            string_ids: HashMap::new(),
            strings_unwritten: Vec::new(),
            string_count: 0,
            reorder: Reorder::default(),
            seq_floor: 0,
            payload: Vec::new(),
            watermark: 0,
            last_emitted: None,
            enc: RecordEncoder::default(),
            chunk_target: RECORDS_CHUNK_TARGET,
            counts: Counts::default(),
            channels: Vec::new(),
            tensor_sizes: meta.tensors.iter().map(|t| t.nbytes()).collect(),
        };
        w.sink.write(&chunk::encode_file_header())?;
        let payload = postcard::to_stdvec(meta)
            .map_err(|e| FormatError::Usage(format!("encoding metadata: {e}")))?;
        w.chunk(ChunkKind::Meta, [0, 0, 0], &payload)?;
        Ok(w)
    }

    /// Cut records chunks when their payload reaches `bytes` (default
    /// [`RECORDS_CHUNK_TARGET`]; clamped to 1..=1 MiB). Smaller chunks make
    /// small test traces with many chunks; the writer's memory bound is one
    /// chunk of this size plus the reorder buffer.
    pub fn set_records_chunk_target(&mut self, bytes: usize) {
        self.chunk_target = bytes.clamp(1, 1 << 20);
    }

    /// The id of a string (component or op name), defining it if new.
    /// Definitions are written before the first records chunk that uses them.
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.string_count;
        self.string_count += 1;
        self.string_ids.insert(s.to_string(), id);
        self.strings_unwritten.push(s.to_string());
        id
    }

    /// Host-provided bytes of tensor `tensor` (index into `Meta::tensors`),
    /// starting at byte `offset`. Write them before the records that read them.
    pub fn tensor_data(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<()> {
        let size = *self.tensor_sizes.get(tensor as usize).ok_or_else(|| {
            FormatError::Usage(format!("tensor id {tensor} is not in the metadata"))
        })?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > size)
        {
            return Err(FormatError::Usage(format!(
                "tensor {tensor}: bytes {offset}..+{} exceed its size {size}",
                data.len()
            )));
        }
        for (i, piece) in data.chunks(TENSOR_CHUNK_MAX).enumerate() {
            let at = offset + (i * TENSOR_CHUNK_MAX) as u64;
            self.chunk(ChunkKind::Tensor, [tensor as u64, at, 0], piece)?;
            self.counts.tensor_bytes += piece.len() as u64;
        }
        Ok(())
    }

    /// Input `operand` of op `op_id` as Phase 1 observed it (debug mode,
    /// docs/design.md L4): Phase 2 can compare the bytes it computed with these.
    pub fn snapshot(&mut self, op_id: u64, operand: u32, bytes: &[u8]) -> Result<()> {
        self.chunk(ChunkKind::Snapshot, [op_id, operand as u64, 0], bytes)
    }

    /// Buffer a finished record. Its t_start must not be below the last
    /// `advance` watermark.
    pub fn push(&mut self, rec: Record) -> Result<()> {
        if rec.t_start < self.watermark {
            return Err(FormatError::Usage(format!(
                "op {} starts at {} ps, before the watermark {} ps already released",
                rec.op_id, rec.t_start, self.watermark
            )));
        }
        if rec.t_end < rec.t_start {
            return Err(FormatError::Usage(format!(
                "op {} ends at {} ps before it starts at {} ps",
                rec.op_id, rec.t_end, rec.t_start
            )));
        }
        if rec.component >= self.string_count || rec.op_name >= self.string_count {
            return Err(FormatError::Usage(format!(
                "op {} uses a string id that was not interned",
                rec.op_id
            )));
        }
        if rec.op_id >= MAX_OP_ID {
            return Err(FormatError::Usage(format!(
                "op {} has an id of 2^{} or more, beyond what a trace writer orders",
                rec.op_id,
                64 - SLOT_BITS
            )));
        }
        if self.reorder.slab.len() - self.reorder.free.len() >= MAX_BUFFERED {
            return Err(FormatError::Usage(format!(
                "op {}: 2^{SLOT_BITS} records are already buffered, more than a trace writer holds (advance the watermark)",
                rec.op_id
            )));
        }
        check_record(&rec)?;
        self.reorder.push(rec);
        Ok(())
    }

    /// An empty vector for a record's effect ranges: one of an emitted
    /// record's, where there is one (no allocation), else a new one.
    pub fn take_ranges(&mut self) -> Vec<Extent> {
        self.reorder.spare_ranges.pop().unwrap_or_default()
    }

    /// An empty vector for a record's dependencies, as [`Self::take_ranges`].
    pub fn take_deps(&mut self) -> Vec<Dep> {
        self.reorder.spare_deps.pop().unwrap_or_default()
    }

    /// An empty vector for a math record's inputs, as [`Self::take_ranges`].
    pub fn take_math_inputs(&mut self) -> Vec<MathInput> {
        self.reorder.spare_math_inputs.pop().unwrap_or_default()
    }

    /// Promise that every data effect not yet in a pushed record will have
    /// a seq of at least `floor` (the simulator's next seq, lowered by the
    /// effects its unfinished ops already hold). Records chunks then carry
    /// a seq watermark that lets a streaming reader apply effects early.
    /// Without it the watermark is 0: no promise.
    pub fn set_seq_floor(&mut self, floor: u64) {
        self.seq_floor = floor;
    }

    /// Promise that no record pushed from now on starts before `watermark`,
    /// and emit every buffered record that starts before it.
    pub fn advance(&mut self, watermark: Ps) -> Result<()> {
        if watermark > self.watermark {
            self.watermark = watermark;
        }
        while let Some(slot) = self.reorder.pop_before(self.watermark) {
            let r = self.emit_slot(slot);
            self.reorder.release(slot);
            r?;
        }
        Ok(())
    }

    /// Records buffered in the reorder buffer, waiting for the watermark.
    pub fn buffered(&self) -> usize {
        self.reorder.len()
    }

    fn emit_slot(&mut self, slot: usize) -> Result<()> {
        let rec = &self.reorder.slab[slot];
        let key = (rec.t_start, rec.op_id);
        if let Some(last) = self.last_emitted
            && key <= last
        {
            return Err(FormatError::Usage(format!(
                "op {} at {} ps is not after op {} at {} ps (duplicate op id?)",
                rec.op_id, rec.t_start, last.1, last.0
            )));
        }
        self.last_emitted = Some(key);
        self.enc.push(rec);
        self.counts.records += 1;
        self.counts.max_t_end = self.counts.max_t_end.max(rec.t_end);
        if self.enc.len() >= self.chunk_target {
            self.flush_records()?;
        }
        Ok(())
    }

    fn flush_strings(&mut self) -> Result<()> {
        if self.strings_unwritten.is_empty() {
            return Ok(());
        }
        let first = (self.string_count as usize - self.strings_unwritten.len()) as u64;
        let mut p = Vec::new();
        for s in &self.strings_unwritten {
            let mut v = s.len() as u64;
            while v >= 0x80 {
                p.push((v as u8) | 0x80);
                v >>= 7;
            }
            p.push(v as u8);
            p.extend_from_slice(s.as_bytes());
        }
        let n = self.strings_unwritten.len() as u64;
        self.strings_unwritten.clear();
        self.counts.strings += n;
        self.chunk(ChunkKind::Strings, [first, n, 0], &p)
    }

    fn flush_records(&mut self) -> Result<()> {
        if self.enc.is_empty() {
            return Ok(());
        }
        self.flush_strings()?;
        let (t0, id0) = self.enc.first.expect("non-empty chunk has a first record");
        let count = self.enc.count;
        // The payload starts with the seq watermark: no effect below it
        // is in a later chunk (buffered records still count against it).
        let buffered = self.reorder.least_buffered_seq();
        let watermark = self.seq_floor.min(buffered);
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        payload.extend_from_slice(&watermark.to_le_bytes());
        payload.extend_from_slice(&self.enc.buf);
        let res = self.chunk(ChunkKind::Records, [count, t0, id0], &payload);
        self.payload = payload;
        self.enc.reset();
        res
    }

    fn chunk(&mut self, kind: ChunkKind, aux: [u64; 3], payload: &[u8]) -> Result<()> {
        if payload.len() as u64 > kind.max_payload() {
            return Err(FormatError::Usage(format!(
                "{} chunk of {} bytes is larger than readers accept ({} bytes)",
                kind.name(),
                payload.len(),
                kind.max_payload()
            )));
        }
        let header = ChunkHeader {
            kind,
            len: payload.len() as u64,
            aux,
            payload_checksum: xxh3_64(payload),
            ordinal: self.ordinal,
        };
        if kind != ChunkKind::Footer {
            self.index.push(IndexEntry {
                offset: self.sink.offset,
                kind,
                ordinal: self.ordinal,
                aux: [aux[0], aux[1]],
            });
        }
        self.ordinal += 1;
        self.sink.write(&header.encode())?;
        self.sink.write(payload)?;
        let pad = (chunk::pad_to_align(payload.len() as u64) - payload.len() as u64) as usize;
        self.sink.write(&[0u8; ALIGN as usize][..pad])?;
        Ok(())
    }

    /// Emit every buffered record, the launches, the verification spec, the
    /// footer and the trailer; flush and return the inner writer.
    /// Record that the run ended at `t` (the footer's end time: at least
    /// every record's `t_end`), so readers report the same simulated time
    /// as the simulator, which goes on after its last record (frees,
    /// unmaps, completion messages).
    pub fn end_at(&mut self, t: Ps) {
        self.counts.max_t_end = self.counts.max_t_end.max(t);
    }

    /// Record what each HBM pseudo channel served (the channels chunk,
    /// written at finish). Channels must be in (sip, cube, channel) order,
    /// each once, with sorted disjoint non-empty busy intervals.
    pub fn channels(&mut self, usage: Vec<ChannelUsage>) -> Result<()> {
        let logs = usage
            .iter()
            .map(ChannelLog::of_usage)
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(FormatError::Usage)?;
        self.channel_logs(logs)
    }

    /// [`channels`](Self::channels) as a simulator logged them while it
    /// ran (the intervals already encoded).
    pub fn channel_logs(&mut self, logs: Vec<ChannelLog>) -> Result<()> {
        for w in logs.windows(2) {
            if (w[0].sip, w[0].cube, w[0].channel) >= (w[1].sip, w[1].cube, w[1].channel) {
                return Err(FormatError::Usage(format!(
                    "channels out of order: sip {} cube {} channel {} before sip {} cube {} channel {}",
                    w[0].sip, w[0].cube, w[0].channel, w[1].sip, w[1].cube, w[1].channel
                )));
            }
        }
        self.channels = logs;
        Ok(())
    }

    pub fn finish(self, verify: &VerifySpec) -> Result<W> {
        self.finish_with_launches(&[], verify)
    }

    /// [`finish`](Self::finish), recording the run's kernel launches. A
    /// launch whose grid has an empty axis is a usage error (the format
    /// writes axis 2 of one program and of none alike).
    pub fn finish_with_launches(mut self, launches: &[Launch], verify: &VerifySpec) -> Result<W> {
        if let Some((i, l)) = launches
            .iter()
            .enumerate()
            .find(|(_, l)| l.grid.contains(&0))
        {
            return Err(FormatError::Usage(format!(
                "launch {i} ({}) has a grid of {}: every axis needs a program",
                l.kernel,
                l.grid_label()
            )));
        }
        // Every record is about to be written.
        self.seq_floor = u64::MAX;
        self.advance(Ps::MAX)?;
        // Records that start at Ps::MAX itself.
        while let Some(slot) = self.reorder.pop() {
            self.emit_slot(slot)?;
        }
        self.flush_records()?;
        self.flush_strings()?;
        if !self.channels.is_empty() {
            let payload = crate::channels::encode(&self.channels);
            self.chunk(ChunkKind::Channels, [0, 0, 0], &payload)?;
        }
        if !launches.is_empty() {
            let payload = postcard::to_stdvec(launches)
                .map_err(|e| FormatError::Usage(format!("encoding launches: {e}")))?;
            self.chunk(ChunkKind::Launches, [0, 0, 0], &payload)?;
        }
        let payload = postcard::to_stdvec(verify)
            .map_err(|e| FormatError::Usage(format!("encoding verify spec: {e}")))?;
        self.chunk(ChunkKind::Verify, [0, 0, 0], &payload)?;
        self.counts.chunks = self.index.len() as u64;
        let footer_offset = self.sink.offset;
        let footer = Footer {
            counts: self.counts,
            digest: self.sink.digest.digest(),
            index: std::mem::take(&mut self.index),
        };
        self.chunk(ChunkKind::Footer, [0, 0, 0], &footer.encode())?;
        let total_len = self.sink.offset + BLOCK as u64;
        self.sink.write(
            &Trailer {
                footer_offset,
                total_len,
            }
            .encode(),
        )?;
        self.sink.out.flush()?;
        Ok(self.sink.out)
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.sink.offset
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }
}

/// Reject records that would not read back as written: params that do not
/// match the kind, reserved codes, counts above the decoder's limits,
/// an active interval outside the op's span, dependencies that do not
/// precede the op.
fn check_record(r: &Record) -> Result<()> {
    let bad = |what: String| Err(FormatError::Usage(format!("op {}: {what}", r.op_id)));
    let params_ok = matches!(
        (&r.params, r.kind),
        (Params::None, _)
            | (Params::Memory(_), OpKind::Memory)
            | (Params::Gemm(_), OpKind::Gemm)
            | (Params::Math(_), OpKind::Math)
            | (Params::Atomic(_), OpKind::Atomic)
            | (Params::Raw(_), OpKind::Unknown(_))
    );
    if !params_ok {
        return bad(format!(
            "params {} do not match op kind {}",
            match &r.params {
                Params::None => "none",
                Params::Memory(_) => "memory",
                Params::Gemm(_) => "gemm",
                Params::Math(_) => "math",
                Params::Atomic(_) => "atomic",
                Params::Raw(_) => "raw",
            },
            r.kind.name()
        ));
    }
    if let OpKind::Unknown(c) = r.kind
        && c < 5
    {
        return bad(format!("OpKind::Unknown({c}) has the code of a known kind"));
    }
    if let Params::Atomic(a) = &r.params
        && let Err(e) = a.check()
    {
        return bad(e);
    }
    if let Params::Math(m) = &r.params {
        if m.inputs.len() > MAX_MATH_INPUTS {
            return bad(format!(
                "{} math inputs, at most {MAX_MATH_INPUTS}",
                m.inputs.len()
            ));
        }
        if m.axis == Some(0xff) {
            return bad("math axis 255 is reserved (it encodes None)".into());
        }
    }
    for e in [&r.read, &r.write].into_iter().flatten() {
        if e.ranges.len() > MAX_RANGES {
            return bad(format!(
                "{} ranges in an effect, at most {MAX_RANGES}",
                e.ranges.len()
            ));
        }
    }
    if let Some((a0, a1)) = r.active
        && (a0 < r.t_start || a1 < a0 || r.t_end < a1)
    {
        return bad(format!(
            "active interval [{a0}, {a1}) ps is not within its span [{}, {}] ps",
            r.t_start, r.t_end
        ));
    }
    if r.deps.len() > MAX_DEPS {
        return bad(format!("{} dependencies, at most {MAX_DEPS}", r.deps.len()));
    }
    if let Some(d) = r.deps.iter().find(|d| d.op >= r.op_id) {
        return bad(format!("dependency {} does not precede the op", d.op));
    }
    if let Some(d) = r.deps.iter().find(|d| r.op_id - d.op >= 1 << 61) {
        return bad(format!(
            "dependency {} is 2^61 or more ops before the op",
            d.op
        ));
    }
    Ok(())
}

/// A file written under a temporary name in the target's directory and
/// renamed to the target only by `commit`. Dropped without `commit` (an
/// error, a panic), the temporary file is removed; a killed process leaves
/// only a `.<name>.partial*` file, never the target name.
///
/// A target that exists and is not a regular file (`/dev/null`, a FIFO,
/// `/dev/stdout`) is written in place: renaming over it would replace a
/// device with a plain file, and such a target cannot look complete.
///
/// A target that is a symbolic link (or a chain of them) is resolved
/// first, as `open` would: each link's target is read and, when relative,
/// taken relative to the link's directory. The temporary file is made in
/// the resolved file's directory and renamed onto the resolved file, so
/// the link stays a link and points at the new content (renaming onto the
/// link itself would replace it with a plain file and leave the file it
/// pointed at stale). A dangling link is followed too: its target is
/// created if its directory exists (and `create` fails if it does not).
/// A loop of links fails at `create`. Only the last component is resolved
/// link by link; links among the directories are left to the kernel.
#[derive(Debug)]
pub struct AtomicFile {
    /// The file renamed onto at commit: the target, or where its symbolic
    /// links lead.
    target: PathBuf,
    file: io::BufWriter<Destination>,
    /// Set by [`AtomicFile::remove_on_signal`]: dropped last (after the
    /// temporary file is renamed or removed), it stops the removal.
    signal_guard: Option<SignalGuard>,
}

/// Forgets the signal-time removal of an [`AtomicFile`]'s temporary file
/// (its slot in [`crate::signals`]).
#[derive(Debug)]
struct SignalGuard(usize);

impl Drop for SignalGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        crate::signals::forget(self.0);
    }
}

#[derive(Debug)]
enum Destination {
    Temporary(tempfile::NamedTempFile),
    InPlace(std::fs::File),
}

impl Write for Destination {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Destination::Temporary(f) => f.write(buf),
            Destination::InPlace(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Destination::Temporary(f) => f.flush(),
            Destination::InPlace(f) => f.flush(),
        }
    }
}

/// Whether `path` is a terminal, whatever its name (`/dev/tty`, a pts
/// device, `/dev/stdout` on a terminal): the tools refuse to write binary
/// output (traces, .npy) there. Only character devices are opened for the
/// check, so it never creates or truncates a file.
pub fn is_terminal_path(path: &Path) -> bool {
    use std::io::IsTerminal;
    #[cfg(unix)]
    let device = std::fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_char_device()
    });
    #[cfg(not(unix))]
    let device = false;
    device
        && std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .is_ok_and(|f| f.is_terminal())
}

/// At most this many symbolic links are followed from an [`AtomicFile`]'s
/// target (Linux's limit for a path lookup).
const MAX_SYMLINKS: usize = 40;

/// Where the symbolic links at `path` lead: `path` itself when it is not a
/// link (or does not exist), else the end of the chain of links, each
/// relative target taken relative to its link's directory. The last path
/// may not exist (a dangling link). A chain longer than [`MAX_SYMLINKS`]
/// (a loop) is an error, as it is for `open`.
fn resolve_symlinks(start: &Path) -> io::Result<PathBuf> {
    let mut path = start.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let next = std::fs::read_link(&path)?;
                // `join` keeps an absolute `next` as it is; `..` is not
                // folded here, the kernel resolves it from the real
                // directory as it would for the link.
                path = match path.parent() {
                    Some(dir) => dir.join(next),
                    None => next,
                };
            }
            Ok(_) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(path),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "{}: too many levels of symbolic links",
        start.display()
    )))
}

impl AtomicFile {
    pub fn create(target: &Path) -> io::Result<AtomicFile> {
        // Follows symlinks: `/dev/stdout` is a link to a pipe or a tty.
        let special = std::fs::metadata(target).is_ok_and(|m| !m.is_file() && !m.is_dir());
        let (target, dest) = if special {
            let f = std::fs::OpenOptions::new().write(true).open(target)?;
            (target.to_path_buf(), Destination::InPlace(f))
        } else {
            // Rename onto the file a symlink leads to, not onto the link.
            let target = resolve_symlinks(target)?;
            let dir = match target.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tmp = tempfile::Builder::new()
                .prefix(&format!(".{name}.partial"))
                .tempfile_in(dir)?;
            (target, Destination::Temporary(tmp))
        };
        Ok(AtomicFile {
            target,
            file: io::BufWriter::with_capacity(1 << 20, dest),
            signal_guard: None,
        })
    }

    /// Remove the temporary file if SIGINT, SIGTERM or SIGHUP ends the
    /// process before [`commit`](Self::commit) or drop, exiting 128 + the
    /// signal ([`crate::signals`]; unix; up to
    /// [`SLOTS`](crate::signals::SLOTS) files at a time). A file written in
    /// place has nothing to remove.
    pub fn remove_on_signal(mut self) -> AtomicFile {
        #[cfg(unix)]
        if let Some(p) = self.temporary_path()
            && let Some(slot) = crate::signals::remove_on_signal(p)
        {
            self.signal_guard = Some(SignalGuard(slot));
        }
        self
    }

    /// Commit `files` as a set: each is flushed and synced first, and only
    /// when all are written are they renamed into place, one after
    /// another. A file that cannot be written (a full disk) leaves every
    /// target as it was, the temporary files removed.
    pub fn commit_all(files: Vec<AtomicFile>) -> io::Result<()> {
        let mut ready = Vec::with_capacity(files.len());
        for mut f in files {
            f.file.flush()?;
            if let Destination::Temporary(t) = f.file.get_ref() {
                t.as_file().sync_all()?;
            }
            ready.push(f);
        }
        for f in ready {
            f.commit()?;
        }
        Ok(())
    }

    /// The temporary file being written, renamed to the target (or the
    /// file its symbolic links lead to) at `commit`; `None` for a special
    /// target written in place.
    pub fn temporary_path(&self) -> Option<&Path> {
        match self.file.get_ref() {
            Destination::Temporary(t) => Some(t.path()),
            Destination::InPlace(_) => None,
        }
    }

    /// Flush, sync and rename into place (a special target: flush).
    pub fn commit(self) -> io::Result<()> {
        let tmp = match self.file.into_inner().map_err(|e| e.into_error())? {
            Destination::Temporary(tmp) => tmp,
            Destination::InPlace(mut f) => return f.flush(),
        };
        // Temporary files are private (0600); a trace is an ordinary file.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        }
        tmp.as_file().sync_all()?;
        tmp.persist(&self.target).map_err(|e| e.error)?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::Reorder;
    use crate::{Effect, Record};

    fn rec(t_start: u64, op_id: u64, read: Option<u64>, write: Option<u64>) -> Record {
        let effect = |seq| Effect {
            time: t_start,
            seq,
            ranges: Vec::new(),
        };
        Record {
            t_start,
            t_end: t_start,
            op_id,
            read: read.map(effect),
            write: write.map(effect),
            ..Record::default()
        }
    }

    /// The least effect seq of the buffered records, against a walk of
    /// the records still buffered, as records enter, leave in time order
    /// and their slots are reused.
    #[test]
    fn least_buffered_seq_follows_the_buffer() {
        let mut r = Reorder::default();
        assert_eq!(r.least_buffered_seq(), u64::MAX);
        let mut naive: Vec<(u64, Option<u64>, Option<u64>)> = Vec::new();
        let mut x: u64 = 12345;
        let mut op = 0;
        for step in 0..3000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if step % 3 == 2 && !naive.is_empty() {
                let slot = r.pop().expect("a buffered record");
                let t = r.slab[slot].t_start;
                let i = naive.iter().position(|n| n.0 == t).expect("buffered");
                naive.remove(i);
                r.release(slot);
            } else {
                // Distinct start times (the op id breaks no ties here).
                let t = (x >> 20) % 1_000_000 * 4096 + op;
                let seq = |k: u64| (!(x >> k).is_multiple_of(7)).then_some((x >> (k + 8)) % 500);
                let (read, write) = (seq(3), seq(40));
                naive.push((t, read, write));
                r.push(rec(t, op, read, write));
                op += 1;
            }
            let want = naive
                .iter()
                .flat_map(|n| [n.1, n.2])
                .flatten()
                .min()
                .unwrap_or(u64::MAX);
            assert_eq!(r.least_buffered_seq(), want, "step {step}");
        }
    }

    /// Records come out by (t_start, op id) whatever slots they sit in: the
    /// slot packed under the op id never decides (ties in t_start, op ids
    /// pushed in falling order into reused slots of rising index).
    #[test]
    fn buffered_records_pop_by_start_then_op_id_not_slot() {
        let mut r = Reorder::default();
        let mut want: Vec<(u64, u64)> = Vec::new();
        let mut x: u64 = 99;
        for round in 0..50u64 {
            for k in 0..40u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = 1_000 * round + (x >> 33) % 4;
                let op = (1 << 39) - 1 - (round * 40 + k) * 1_000;
                r.push(rec(t, op, None, None));
                want.push((t, op));
            }
            want.sort();
            // Pop the earliest half; the freed slots are reused next round.
            for _ in 0..20 {
                let slot = r.pop().expect("buffered");
                let got = (r.slab[slot].t_start, r.slab[slot].op_id);
                assert_eq!(got, want.remove(0), "round {round}");
                r.release(slot);
            }
        }
        while let Some(slot) = r.pop() {
            assert_eq!((r.slab[slot].t_start, r.slab[slot].op_id), want.remove(0));
            r.release(slot);
        }
        assert!(want.is_empty());
    }
}
