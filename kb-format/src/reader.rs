//! Reading traces: `StreamReader` over any `io::Read` (sequential, no full
//! spool), and `MmapTrace` over a file (random access through the footer
//! index, tensor data viewed zero-copy). Both validate the same way.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;

use crate::{Fingerprinter, xxh3_64};

use crate::chunk::{self, BLOCK, ChunkHeader, ChunkKind, Trailer};
use crate::error::{FormatError, Result};
use crate::footer::{FOOTER_FIXED, Footer, IndexEntry};
use crate::record_codec::RecordDecoder;

/// Bytes of the seq watermark that starts every records payload.
pub const SEQ_WATERMARK_BYTES: usize = 8;
use crate::channels::{ChannelUsage, Payload};
use crate::launch::Launch;
use crate::types::{Meta, Ps, Record, VerifySpec};

/// The string table (component and op names), grown by strings chunks.
#[derive(Debug, Default, Clone)]
pub struct Strings {
    items: Vec<String>,
}

impl Strings {
    pub fn get(&self, id: u32) -> Option<&str> {
        self.items.get(id as usize).map(String::as_str)
    }

    /// The string, or `"?<id>"` for an id that is not defined.
    pub fn name(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.get(id) {
            Some(s) => s.into(),
            None => format!("?{id}").into(),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.items.iter().map(String::as_str)
    }

    fn append(&mut self, h: &ChunkHeader, p: &[u8], at: u64) -> Result<()> {
        let [first, n, _] = h.aux;
        if first != self.items.len() as u64 {
            return Err(FormatError::malformed(
                at,
                "strings chunk",
                format!("first id {first}, expected {}", self.items.len()),
            ));
        }
        if n > p.len() as u64 {
            return Err(FormatError::BadLength {
                offset: at,
                what: "string count".into(),
                len: n,
                limit: p.len() as u64,
            });
        }
        let mut pos = 0usize;
        for i in 0..n {
            let mut len = 0u64;
            let mut shift = 0;
            loop {
                let b = *p.get(pos).ok_or_else(|| {
                    FormatError::malformed(
                        at + pos as u64,
                        "strings chunk",
                        "string length runs past the chunk",
                    )
                })?;
                pos += 1;
                len |= ((b & 0x7f) as u64) << shift;
                if b & 0x80 == 0 {
                    break;
                }
                shift += 7;
                if shift > 63 {
                    return Err(FormatError::malformed(
                        at + pos as u64,
                        "strings chunk",
                        "overlong varint",
                    ));
                }
            }
            let end = pos
                .checked_add(len as usize)
                .filter(|&e| e <= p.len() && len <= p.len() as u64)
                .ok_or_else(|| FormatError::BadLength {
                    offset: at + pos as u64,
                    what: format!("string {}", first + i),
                    len,
                    limit: (p.len() - pos) as u64,
                })?;
            let s = std::str::from_utf8(&p[pos..end]).map_err(|e| {
                FormatError::malformed(
                    at + pos as u64,
                    "strings chunk",
                    format!("string is not UTF-8: {e}"),
                )
            })?;
            self.items.push(s.to_string());
            pos = end;
        }
        if pos != p.len() {
            return Err(FormatError::malformed(
                at + pos as u64,
                "strings chunk",
                "bytes after the last string",
            ));
        }
        Ok(())
    }
}

/// A records chunk being decoded. Checks ids against the string table and
/// record order against the previous records of the trace.
#[derive(Debug)]
pub struct RecordChunk<'a> {
    seq_watermark: u64,
    dec: RecordDecoder<'a>,
    strings: &'a Strings,
    last: &'a mut Option<(Ps, u64)>,
    /// (t_start, op_id) the chunk header says the first record has; taken
    /// when the first record is checked.
    first: Option<(Ps, u64)>,
    /// Strings defined before this chunk: the ids its records may use.
    defined: u64,
}

impl<'a> RecordChunk<'a> {
    /// A chunk whose header is `h` and payload `p`, at stream offset `at`.
    /// `defined` strings of `strings` were defined before the chunk.
    fn new(
        h: &ChunkHeader,
        p: &'a [u8],
        at: u64,
        (strings, defined): (&'a Strings, usize),
        last: &'a mut Option<(Ps, u64)>,
    ) -> Self {
        // The caller checked the payload holds the 8-byte seq watermark.
        let (w, records) = p.split_at(SEQ_WATERMARK_BYTES);
        RecordChunk {
            seq_watermark: u64::from_le_bytes(w.try_into().expect("8 bytes")),
            dec: RecordDecoder::new(records, at + SEQ_WATERMARK_BYTES as u64, h.aux[0]),
            strings,
            last,
            first: Some((h.aux[1], h.aux[2])),
            defined: defined.min(strings.len()) as u64,
        }
    }

    /// Every data effect with a seq below this is in this chunk or an
    /// earlier one (0: the writer made no promise). A streaming replay can
    /// apply effects below it as soon as the chunk is read.
    pub fn seq_watermark(&self) -> u64 {
        self.seq_watermark
    }

    /// Decode the next record into `r` (reusing its allocations); false at
    /// the end of the chunk.
    pub fn next_into(&mut self, r: &mut Record) -> Result<bool> {
        let at = self.dec.offset();
        if !self.dec.next_into(r)? {
            return Ok(false);
        }
        let key = (r.t_start, r.op_id);
        if let Some(first) = self.first.take()
            && first != key
        {
            return Err(FormatError::malformed(
                at,
                "records chunk",
                format!(
                    "first record is op {} at {} ps, but the chunk header says op {} at {} ps",
                    r.op_id, r.t_start, first.1, first.0
                ),
            ));
        }
        let n = self.defined;
        if (r.component as u64) < n
            && (r.op_name as u64) < n
            && r.deps.iter().all(|d| d.op < r.op_id)
        {
            // Fast path: nothing to report (most records have
            // dependencies: checked here, not through the cold path).
        } else {
            self.check_ids(r, at)?;
        }
        if let Some(last) = *self.last
            && key <= last
        {
            return Err(FormatError::malformed(
                at,
                "records chunk",
                format!(
                    "op {} at {} ps is out of (t_start, op_id) order after op {} at {} ps",
                    r.op_id, r.t_start, last.1, last.0
                ),
            ));
        }
        *self.last = Some(key);
        Ok(true)
    }

    #[cold]
    fn check_ids(&self, r: &Record, at: u64) -> Result<()> {
        let n = self.defined;
        for (what, id) in [("component", r.component), ("op name", r.op_name)] {
            if id as u64 >= n {
                return Err(FormatError::DanglingId {
                    offset: at,
                    what,
                    id: id as u64,
                    detail: format!(
                        "op {} refers to string {id}, but only {n} are defined",
                        r.op_id
                    ),
                });
            }
        }
        for d in &r.deps {
            if d.op >= r.op_id {
                return Err(FormatError::DanglingId {
                    offset: at,
                    what: "dependency",
                    id: d.op,
                    detail: format!("op {} depends on an op that does not precede it", r.op_id),
                });
            }
        }
        Ok(())
    }

    pub fn strings(&self) -> &Strings {
        self.strings
    }
}

/// What a stream reader yields, chunk by chunk.
#[derive(Debug)]
pub enum Event<'a> {
    /// Host-provided bytes of tensor `tensor` at byte `offset`.
    Tensor {
        tensor: u32,
        offset: u64,
        data: &'a [u8],
    },
    Records(RecordChunk<'a>),
    /// Input `operand` of op `op_id` as Phase 1 observed it (debug mode,
    /// `kb-sim --capture-inputs`); it comes before the op's record.
    Snapshot {
        op_id: u64,
        operand: u32,
        data: &'a [u8],
    },
}

/// Decode a postcard payload that must be used up exactly.
fn decode_all<T: serde::de::DeserializeOwned>(p: &[u8], at: u64, what: &str) -> Result<T> {
    let (v, rest) = postcard::take_from_bytes(p)
        .map_err(|e| FormatError::malformed(at, what, e.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::malformed(
            at + (p.len() - rest.len()) as u64,
            what,
            format!("{} bytes after the encoded value", rest.len()),
        ));
    }
    Ok(v)
}

fn channels_error(at: u64, (off, detail): crate::channels::PayloadError) -> FormatError {
    FormatError::malformed(at + off as u64, "channels chunk", detail)
}

/// The channels of a channels chunk (`p` at offset `at`, its checksum
/// checked), decoded and checked on the first call: kb-replay never asks,
/// and a long run's chunk holds millions of intervals.
fn decode_channels<'c>(
    cell: &'c OnceLock<Vec<ChannelUsage>>,
    p: &[u8],
    at: u64,
) -> Result<&'c [ChannelUsage]> {
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let c = Payload::new(p)
        .decode()
        .map_err(|e| channels_error(at, e))?;
    Ok(cell.get_or_init(|| c))
}

/// Validation state shared by both readers.
#[derive(Debug, Default)]
struct State {
    meta: Meta,
    strings: Strings,
    verify: Option<VerifySpec>,
    launches: Option<Vec<Launch>>,
    /// The channels chunk's payload (offset, length), once checked.
    channels: Option<(u64, usize)>,
    footer: Option<Footer>,
    last: Option<(Ps, u64)>,
    records: u64,
    tensor_bytes: u64,
    chunks: u64,
}

impl State {
    fn meta(p: &[u8], at: u64) -> Result<Meta> {
        decode_all(p, at, "metadata chunk")
    }

    fn tensor(&mut self, h: &ChunkHeader, at: u64) -> Result<()> {
        let [id, off, _] = h.aux;
        let t = self
            .meta
            .tensors
            .get(id as usize)
            .ok_or_else(|| FormatError::DanglingId {
                offset: at,
                what: "tensor",
                id,
                detail: format!("the metadata lists {} tensors", self.meta.tensors.len()),
            })?;
        let size = t.nbytes();
        if off.checked_add(h.len).is_none_or(|e| e > size) {
            return Err(FormatError::BadLength {
                offset: at,
                what: format!("data of tensor {:?} at byte {off}", t.name),
                len: h.len,
                limit: size.saturating_sub(off),
            });
        }
        self.tensor_bytes += h.len;
        Ok(())
    }

    /// Account for a records chunk whose header `h` is at `at`.
    fn records(&mut self, h: &ChunkHeader, at: u64) -> Result<()> {
        // Every record takes at least one byte (in fact eight), so a count
        // larger than the payload is corrupt; this also keeps the sum of
        // counts from overflowing.
        if h.len < SEQ_WATERMARK_BYTES as u64 {
            return Err(FormatError::BadLength {
                offset: at + 8,
                what: "records chunk payload (it starts with an 8-byte seq watermark)".into(),
                len: h.len,
                limit: SEQ_WATERMARK_BYTES as u64,
            });
        }
        let body = h.len - SEQ_WATERMARK_BYTES as u64;
        let count = h.aux[0];
        if count > body || (count == 0) != (body == 0) {
            return Err(FormatError::BadLength {
                offset: at + 16,
                what: "records chunk record count".into(),
                len: count,
                limit: body,
            });
        }
        self.records += count;
        Ok(())
    }

    /// Called for every chunk after the meta chunk and before the footer:
    /// the verify chunk comes exactly once, last.
    fn order(&self, h: &ChunkHeader, at: u64) -> Result<()> {
        if self.verify.is_some() {
            return Err(FormatError::malformed(
                at,
                "trace",
                format!(
                    "{} chunk after the verify chunk (only the footer may follow it)",
                    h.kind.name()
                ),
            ));
        }
        Ok(())
    }

    fn verify(p: &[u8], at: u64) -> Result<VerifySpec> {
        decode_all(p, at, "verify chunk")
    }

    /// The launches chunk comes at most once (traces without one ran no
    /// recorded launch).
    fn launches(&mut self, p: &[u8], at: u64) -> Result<()> {
        if self.launches.is_some() {
            return Err(FormatError::malformed(
                at,
                "trace",
                "a second launches chunk",
            ));
        }
        let launches: Vec<Launch> = decode_all(p, at, "launches chunk")?;
        for (i, l) in launches.iter().enumerate() {
            let bad = if l.grid.contains(&0) {
                Some(format!("a grid of {}", l.grid_label()))
            } else if l.programs().is_none() {
                Some(format!(
                    "a grid of {} (more than 2^64 programs)",
                    l.grid_label()
                ))
            } else if l.pes.is_empty() {
                Some("no PEs".to_string())
            } else if l.t_end < l.t_start {
                Some(format!("t_end {} before t_start {}", l.t_end, l.t_start))
            } else if l.useful_flops > l.flops {
                Some(format!(
                    "useful_flops {} above flops {}",
                    l.useful_flops, l.flops
                ))
            } else {
                None
            };
            if let Some(bad) = bad {
                return Err(FormatError::malformed(
                    at,
                    "launches chunk",
                    format!("launch {i} ({}) has {bad}", l.kernel),
                ));
            }
        }
        self.launches = Some(launches);
        Ok(())
    }

    /// The channels chunk comes at most once. Its payload is checked (each
    /// channel once, in (sip, cube, channel) order, ...) when it is read,
    /// as records and tensors are: see [`decode_channels`].
    fn channels(&mut self, p: &[u8], at: u64) -> Result<()> {
        if self.channels.is_some() {
            return Err(FormatError::malformed(
                at,
                "trace",
                "a second channels chunk",
            ));
        }
        self.channels = Some((at, p.len()));
        Ok(())
    }

    /// Compare the footer with what was read.
    fn check_footer(&self, f: &Footer, at: u64, digest: Option<u64>) -> Result<()> {
        let c = &f.counts;
        let checks = [
            ("record count", c.records, self.records),
            ("chunk count", c.chunks, self.chunks),
            ("tensor byte count", c.tensor_bytes, self.tensor_bytes),
            ("string count", c.strings, self.strings.len() as u64),
            ("index length", f.index.len() as u64, self.chunks),
        ];
        for (what, stored, seen) in checks {
            if stored != seen {
                return Err(FormatError::malformed(
                    at,
                    "footer",
                    format!("{what} is {stored}, but the stream holds {seen}"),
                ));
            }
        }
        if let Some(d) = digest
            && d != f.digest
        {
            return Err(FormatError::Checksum {
                offset: at,
                what: "stream digest".into(),
                stored: f.digest,
                computed: d,
            });
        }
        Ok(())
    }
}

/// Sequential reader over any `io::Read`. Reads one chunk at a time; memory
/// is bounded by the largest chunk, not the stream.
pub struct StreamReader<R: Read> {
    r: R,
    offset: u64,
    digest: Fingerprinter,
    buf: Vec<u8>,
    state: State,
    ordinal: u32,
    /// Hash of the footer index entries the chunks read so far call for.
    index: Fingerprinter,
    /// The channels chunk's payload, kept (checked) until asked for.
    channels_payload: Vec<u8>,
    channels: OnceLock<Vec<ChannelUsage>>,
}

impl<R: Read> std::fmt::Debug for StreamReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader")
            .field("offset", &self.offset)
            .finish()
    }
}

impl<R: Read> StreamReader<R> {
    /// Read and validate the header and the metadata chunk.
    pub fn open(r: R) -> Result<Self> {
        let mut s = StreamReader {
            r,
            offset: 0,
            digest: Fingerprinter::new(),
            buf: Vec::new(),
            state: State::default(),
            ordinal: 0,
            index: Fingerprinter::new(),
            channels_payload: Vec::new(),
            channels: OnceLock::new(),
        };
        let mut h = [0u8; BLOCK];
        s.read_exact(&mut h, "the 64-byte file header")?;
        chunk::decode_file_header(&h)?;
        let (hd, at) = s.read_chunk()?;
        if hd.kind != ChunkKind::Meta {
            return Err(FormatError::malformed(
                at,
                "trace",
                format!("first chunk is {}, expected meta", hd.kind.name()),
            ));
        }
        s.state.meta = State::meta(&s.buf, at)?;
        s.state.chunks = 1;
        Ok(s)
    }

    pub fn meta(&self) -> &Meta {
        &self.state.meta
    }

    pub fn strings(&self) -> &Strings {
        &self.state.strings
    }

    /// The verification spec, once the stream has been read to its end.
    pub fn verify_spec(&self) -> Option<&VerifySpec> {
        self.state.verify.as_ref()
    }

    /// The run's kernel launches, once the stream has been read to its
    /// end (empty for a trace without a launches chunk).
    pub fn launches(&self) -> &[Launch] {
        self.state.launches.as_deref().unwrap_or_default()
    }

    /// What each HBM pseudo channel served, once the stream has been read
    /// to its end (empty for a trace without a channels chunk). Decoded on
    /// the first call; a malformed payload is an error then.
    pub fn channels(&self) -> Result<&[ChannelUsage]> {
        match self.state.channels {
            None => Ok(&[]),
            Some((at, _)) => decode_channels(&self.channels, &self.channels_payload, at),
        }
    }

    /// The footer, once the stream has been read to its end.
    pub fn footer(&self) -> Option<&Footer> {
        self.state.footer.as_ref()
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn read_exact(&mut self, b: &mut [u8], expected: &str) -> Result<()> {
        let mut got = 0;
        while got < b.len() {
            match self.r.read(&mut b[got..]) {
                Ok(0) => return Err(FormatError::truncated(self.offset + got as u64, expected)),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.digest.update(b);
        self.offset += b.len() as u64;
        Ok(())
    }

    /// Read one chunk into `self.buf`; returns its header and payload offset.
    fn read_chunk(&mut self) -> Result<(ChunkHeader, u64)> {
        let at = self.offset;
        let mut hb = [0u8; BLOCK];
        self.read_exact(&mut hb, "a chunk header (the trace ends before its footer)")?;
        let h = ChunkHeader::decode(&hb, at, None)?;
        if h.ordinal != self.ordinal {
            return Err(FormatError::malformed(
                at + 48,
                "chunk header",
                format!("chunk ordinal {}, expected {}", h.ordinal, self.ordinal),
            ));
        }
        self.ordinal += 1;
        let pat = self.offset;
        let padded = chunk::pad_to_align(h.len);
        // Grow with the data actually read, so a large declared length
        // on a short input never allocates more than the input holds.
        self.buf.clear();
        let got = (&mut self.r).take(padded).read_to_end(&mut self.buf)? as u64;
        if got < padded {
            return Err(FormatError::truncated(
                pat + got,
                format!(
                    "{} more bytes of {} chunk #{} payload",
                    padded - got,
                    h.kind.name(),
                    h.ordinal
                ),
            ));
        }
        self.digest_pending(&h, pat)?;
        chunk::check_padding(&self.buf[h.len as usize..], pat + h.len)?;
        self.buf.truncate(h.len as usize);
        if h.kind != ChunkKind::Footer {
            self.index.update(
                &IndexEntry {
                    offset: at,
                    kind: h.kind,
                    ordinal: h.ordinal,
                    aux: [h.aux[0], h.aux[1]],
                }
                .encode(),
            );
        }
        Ok((h, pat))
    }

    fn digest_pending(&mut self, h: &ChunkHeader, pat: u64) -> Result<()> {
        self.digest.update(&self.buf);
        self.offset += self.buf.len() as u64;
        h.check_payload(&self.buf[..h.len as usize], pat)
    }

    /// The next tensor or records chunk; `None` after the footer and trailer
    /// have been read and checked.
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>> {
        loop {
            if self.state.footer.is_some() {
                return Ok(None);
            }
            // The stream digest covers every byte before the footer chunk.
            let digest_before = self.digest.digest();
            let (h, at) = self.read_chunk()?;
            if h.kind != ChunkKind::Footer {
                self.state.order(&h, at - BLOCK as u64)?;
            }
            match h.kind {
                ChunkKind::Meta => {
                    return Err(FormatError::malformed(at, "trace", "a second meta chunk"));
                }
                ChunkKind::Strings => {
                    self.state.strings.append(&h, &self.buf, at)?;
                    self.state.chunks += 1;
                }
                ChunkKind::Verify => {
                    self.state.verify = Some(State::verify(&self.buf, at)?);
                    self.state.chunks += 1;
                }
                ChunkKind::Launches => {
                    self.state.launches(&self.buf, at)?;
                    self.state.chunks += 1;
                }
                ChunkKind::Channels => {
                    self.state.channels(&self.buf, at)?;
                    self.channels_payload = std::mem::take(&mut self.buf);
                    self.state.chunks += 1;
                }
                ChunkKind::Footer => {
                    // The digest must exclude the footer chunk header too.
                    let footer = Footer::decode(&self.buf, at)?;
                    if self.state.verify.is_none() {
                        return Err(FormatError::malformed(
                            at - BLOCK as u64,
                            "trace",
                            "no verify chunk before the footer",
                        ));
                    }
                    self.state.check_footer(&footer, at, Some(digest_before))?;
                    let stored = xxh3_64(&self.buf[FOOTER_FIXED..]);
                    if stored != self.index.digest() {
                        return Err(FormatError::malformed(
                            at + FOOTER_FIXED as u64,
                            "footer index",
                            "does not list the chunks of the stream",
                        ));
                    }
                    let mut tb = [0u8; BLOCK];
                    let tat = self.offset;
                    self.read_exact(&mut tb, "the 64-byte trailer")?;
                    let t = Trailer::decode(&tb, tat)?;
                    if t.footer_offset != at - BLOCK as u64 || t.total_len != self.offset {
                        return Err(FormatError::malformed(
                            tat,
                            "trailer",
                            "footer offset or total length disagree with the stream",
                        ));
                    }
                    let mut extra = [0u8; 1];
                    if self.r.read(&mut extra)? != 0 {
                        return Err(FormatError::malformed(
                            self.offset,
                            "trace",
                            "bytes after the trailer",
                        ));
                    }
                    self.state.footer = Some(footer);
                    return Ok(None);
                }
                ChunkKind::Snapshot => {
                    self.state.chunks += 1;
                    return Ok(Some(Event::Snapshot {
                        op_id: h.aux[0],
                        operand: h.aux[1] as u32,
                        data: &self.buf,
                    }));
                }
                ChunkKind::Tensor => {
                    self.state.tensor(&h, at - BLOCK as u64)?;
                    self.state.chunks += 1;
                    return Ok(Some(Event::Tensor {
                        tensor: h.aux[0] as u32,
                        offset: h.aux[1],
                        data: &self.buf,
                    }));
                }
                ChunkKind::Records => {
                    self.state.records(&h, at - BLOCK as u64)?;
                    self.state.chunks += 1;
                    return Ok(Some(Event::Records(RecordChunk::new(
                        &h,
                        &self.buf,
                        at,
                        (&self.state.strings, self.state.strings.len()),
                        &mut self.state.last,
                    ))));
                }
            }
        }
    }

    /// Read to the end, decoding every record; returns the record count.
    pub fn skip_to_end(&mut self) -> Result<u64> {
        let mut r = Record::default();
        let mut n = 0;
        while let Some(ev) = self.next_event()? {
            if let Event::Records(mut c) = ev {
                while c.next_into(&mut r)? {
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// A trace file mapped into memory.
#[derive(Debug)]
pub struct MmapTrace {
    map: std::sync::Arc<memmap2::Mmap>,
    meta: Meta,
    strings: Strings,
    verify: VerifySpec,
    launches: Vec<Launch>,
    /// The channels chunk's payload (offset, length), checked at open.
    channels_at: Option<(u64, usize)>,
    channels: OnceLock<Vec<ChannelUsage>>,
    footer: Footer,
    footer_offset: u64,
    /// For each chunk (by ordinal), the strings defined before it.
    strings_before: Vec<u32>,
    /// Chunks (by ordinal) whose payload checksum a [`PayloadCheck`] has
    /// verified already.
    checked: std::sync::Arc<[std::sync::atomic::AtomicBool]>,
}

/// The check of one chunk's payload checksum, taken out of an
/// [`MmapTrace`] to run on another thread ahead of the reader
/// ([`MmapTrace::payload_checks`]). A payload it verifies is not hashed
/// again when read; one it finds damaged is checked again when read, which
/// reports the error in its place in the stream.
#[derive(Debug)]
pub struct PayloadCheck {
    map: std::sync::Arc<memmap2::Mmap>,
    checked: std::sync::Arc<[std::sync::atomic::AtomicBool]>,
    ordinal: usize,
    at: usize,
    len: usize,
    stored: u64,
}

impl PayloadCheck {
    pub fn run(self) {
        let ok = self
            .map
            .get(self.at..self.at + self.len)
            .is_some_and(|p| xxh3_64(p) == self.stored);
        if ok {
            self.checked[self.ordinal].store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// The check of a mapped trace's stream digest ([`MmapTrace::verify_digest`]),
/// taken out of it to run on another thread.
#[derive(Debug)]
pub struct DigestCheck {
    map: std::sync::Arc<memmap2::Mmap>,
    end: u64,
    stored: u64,
}

impl DigestCheck {
    pub fn run(&self) -> Result<()> {
        let computed = xxh3_64(&self.map[..self.end as usize]);
        if computed != self.stored {
            return Err(FormatError::Checksum {
                offset: self.end,
                what: "stream digest".into(),
                stored: self.stored,
                computed,
            });
        }
        Ok(())
    }
}

impl MmapTrace {
    /// Map and validate a trace: header, trailer, footer, the chunk index
    /// (every entry must point at a chunk header of the stated kind), the
    /// metadata, strings, verify and launches chunks. Record, tensor and
    /// channels payloads are checked when they are read (every payload's
    /// checksum is checked here).
    pub fn open(path: &Path) -> Result<MmapTrace> {
        let file = File::open(path)?;
        // SAFETY: the map is read-only and private to this process. A trace
        // modified by another process while mapped could change under us;
        // every read re-validates lengths and checksums, so that yields an
        // error, not undefined behaviour in our code. Exercised by every
        // test that opens a trace file (e.g. tests/pipeline.rs).
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Self::from_map(map)
    }

    fn from_map(map: memmap2::Mmap) -> Result<MmapTrace> {
        let map = std::sync::Arc::new(map);
        let b: &[u8] = &map;
        let len = b.len() as u64;
        let block = |at: u64| -> Result<&[u8; BLOCK]> {
            b.get(at as usize..at as usize + BLOCK)
                .map(|s| s.try_into().expect("64 bytes"))
                .ok_or_else(|| FormatError::truncated(len, format!("64 bytes at offset {at}")))
        };
        chunk::decode_file_header(block(0)?)?;
        if len < 3 * BLOCK as u64 || !len.is_multiple_of(chunk::ALIGN) {
            return Err(FormatError::truncated(
                len,
                "a file of whole 64-byte blocks ending in a trailer",
            ));
        }
        let tat = len - BLOCK as u64;
        let t = Trailer::decode(block(tat)?, tat)?;
        if t.total_len < len {
            // A whole trace ends the file, with more bytes before it: two
            // traces concatenated, or junk in front of one.
            return Err(FormatError::malformed(
                len - t.total_len,
                "trace",
                format!(
                    "the file is {len} bytes, but the trace its trailer ends is {} bytes: {} bytes come before it (two traces concatenated?)",
                    t.total_len,
                    len - t.total_len
                ),
            ));
        }
        if t.total_len != len {
            return Err(FormatError::truncated(
                len,
                format!("{} bytes, as the trailer states", t.total_len),
            ));
        }
        let fat = t.footer_offset;
        // The footer chunk needs at least its header between the first
        // chunk (after the file header) and the trailer.
        if fat < BLOCK as u64
            || !fat.is_multiple_of(chunk::ALIGN)
            || fat.checked_add(BLOCK as u64).is_none_or(|e| e > tat)
        {
            return Err(FormatError::malformed(
                tat + 8,
                "trailer",
                format!("footer offset {fat} is outside the file"),
            ));
        }
        let fh = ChunkHeader::decode(block(fat)?, fat, Some(tat - fat - BLOCK as u64))?;
        if fh.kind != ChunkKind::Footer {
            return Err(FormatError::malformed(
                fat,
                "trailer",
                "footer offset does not point at the footer chunk",
            ));
        }
        if fat + fh.total_len() != tat {
            return Err(FormatError::malformed(
                fat,
                "footer",
                "footer chunk does not end at the trailer",
            ));
        }
        let fpat = fat + BLOCK as u64;
        let fp = &b[fpat as usize..(fpat + fh.len) as usize];
        fh.check_payload(fp, fpat)?;
        // No checksum or digest covers the footer's padding.
        chunk::check_padding(&b[(fpat + fh.len) as usize..tat as usize], fpat + fh.len)?;
        let footer = Footer::decode(fp, fpat)?;
        if fh.ordinal as usize != footer.index.len() {
            return Err(FormatError::malformed(
                fat + 48,
                "chunk header",
                format!(
                    "footer ordinal {}, expected {} (one after the last indexed chunk)",
                    fh.ordinal,
                    footer.index.len()
                ),
            ));
        }

        let mut state = State::default();
        let mut strings_before = Vec::with_capacity(footer.index.len());
        let mut expect_at = BLOCK as u64;
        for (i, e) in footer.index.iter().enumerate() {
            strings_before.push(state.strings.len() as u32);
            if e.offset != expect_at || e.ordinal as usize != i {
                return Err(FormatError::malformed(
                    fat,
                    "footer index",
                    format!(
                        "entry {i} points at offset {}, expected chunk #{i} at {expect_at}",
                        e.offset
                    ),
                ));
            }
            // Chunks before the footer must end before it.
            let room = fat.checked_sub(e.offset + BLOCK as u64).ok_or_else(|| {
                FormatError::malformed(
                    fat,
                    "footer index",
                    format!("entry {i} at offset {} overlaps the footer", e.offset),
                )
            })?;
            let h = ChunkHeader::decode(block(e.offset)?, e.offset, Some(room))?;
            if h.kind != e.kind || h.ordinal != e.ordinal || [h.aux[0], h.aux[1]] != e.aux {
                return Err(FormatError::malformed(
                    e.offset,
                    "chunk header",
                    format!("does not match footer index entry {i}"),
                ));
            }
            if i > 0 && h.kind != ChunkKind::Footer {
                state.order(&h, e.offset)?;
            }
            let pat = e.offset + BLOCK as u64;
            let payload = &b[pat as usize..(pat + h.len) as usize];
            let pad_end = (e.offset + h.total_len()) as usize;
            chunk::check_padding(&b[(pat + h.len) as usize..pad_end], pat + h.len)?;
            match h.kind {
                ChunkKind::Meta if i == 0 => {
                    h.check_payload(payload, pat)?;
                    state.meta = State::meta(payload, pat)?;
                }
                ChunkKind::Meta => {
                    return Err(FormatError::malformed(
                        e.offset,
                        "trace",
                        "a second meta chunk",
                    ));
                }
                _ if i == 0 => {
                    return Err(FormatError::malformed(
                        e.offset,
                        "trace",
                        "first chunk is not meta",
                    ));
                }
                ChunkKind::Strings => {
                    h.check_payload(payload, pat)?;
                    state.strings.append(&h, payload, pat)?;
                }
                ChunkKind::Verify => {
                    h.check_payload(payload, pat)?;
                    state.verify = Some(State::verify(payload, pat)?);
                }
                ChunkKind::Launches => {
                    h.check_payload(payload, pat)?;
                    state.launches(payload, pat)?;
                }
                ChunkKind::Channels => {
                    h.check_payload(payload, pat)?;
                    state.channels(payload, pat)?;
                }
                ChunkKind::Tensor => state.tensor(&h, e.offset)?,
                ChunkKind::Records => state.records(&h, e.offset)?,
                ChunkKind::Snapshot => {}
                ChunkKind::Footer => {
                    return Err(FormatError::malformed(
                        e.offset,
                        "footer index",
                        "lists a footer chunk",
                    ));
                }
            }
            state.chunks += 1;
            // Cannot pass `fat`: the payload ends before it and `fat` is
            // aligned, so the padded end is at most `fat`.
            expect_at += h.total_len();
        }
        if expect_at != fat {
            return Err(FormatError::malformed(
                fat,
                "footer index",
                format!("chunks end at {expect_at}, but the footer is at {fat}"),
            ));
        }
        state.check_footer(&footer, fat, None)?;
        let verify = state
            .verify
            .take()
            .ok_or_else(|| FormatError::malformed(fat, "trace", "no verify chunk"))?;
        Ok(MmapTrace {
            map,
            meta: state.meta,
            strings: state.strings,
            verify,
            launches: state.launches.unwrap_or_default(),
            channels_at: state.channels,
            channels: OnceLock::new(),
            footer_offset: fat,
            strings_before,
            checked: (0..footer.index.len())
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            footer,
        })
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn strings(&self) -> &Strings {
        &self.strings
    }

    pub fn verify_spec(&self) -> &VerifySpec {
        &self.verify
    }

    /// The run's kernel launches (empty for a trace without a launches chunk).
    pub fn launches(&self) -> &[Launch] {
        &self.launches
    }

    /// What each HBM pseudo channel served (empty for a trace without a
    /// channels chunk). Decoded on the first call; a malformed payload is
    /// an error then.
    pub fn channels(&self) -> Result<&[ChannelUsage]> {
        match self.channels_at {
            None => Ok(&[]),
            Some((at, len)) => {
                let p = self
                    .map
                    .get(at as usize..at as usize + len)
                    .unwrap_or_default();
                decode_channels(&self.channels, p, at)
            }
        }
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// Hash the stream and compare with the footer digest (catches damage
    /// in padding, which no chunk checksum covers).
    pub fn verify_digest(&self) -> Result<()> {
        self.digest_check().run()
    }

    /// [`MmapTrace::verify_digest`] as a job for another thread.
    pub fn digest_check(&self) -> DigestCheck {
        DigestCheck {
            map: self.map.clone(),
            end: self.footer_offset,
            stored: self.footer.digest,
        }
    }

    /// The payload checksum checks of the chunks of `kind`, as jobs that
    /// other threads may run while this one reads the stream: a payload
    /// one of them has verified is not hashed again when read.
    pub fn payload_checks(&self, kind: ChunkKind) -> Vec<PayloadCheck> {
        let mut out = Vec::new();
        for e in self.footer.index.iter().filter(|e| e.kind == kind) {
            let hb: &[u8; BLOCK] = self.map[e.offset as usize..e.offset as usize + BLOCK]
                .try_into()
                .expect("index validated at open");
            // (A header that does not decode is reported when read.)
            if let Ok(h) = ChunkHeader::decode(hb, e.offset, None) {
                out.push(PayloadCheck {
                    map: self.map.clone(),
                    checked: self.checked.clone(),
                    ordinal: e.ordinal as usize,
                    at: (e.offset as usize) + BLOCK,
                    len: h.len as usize,
                    stored: h.payload_checksum,
                });
            }
        }
        out
    }

    fn payload(&self, e: &IndexEntry) -> Result<(ChunkHeader, &[u8], u64)> {
        let offset = e.offset;
        let hb: &[u8; BLOCK] = self.map[offset as usize..offset as usize + BLOCK]
            .try_into()
            .expect("index validated at open");
        let h = ChunkHeader::decode(hb, offset, None)?;
        let pat = offset + BLOCK as u64;
        let p = &self.map[pat as usize..(pat + h.len) as usize];
        let checked = self.checked[e.ordinal as usize].load(std::sync::atomic::Ordering::Acquire);
        if !checked {
            h.check_payload(p, pat)?;
        }
        let end = offset + h.total_len();
        chunk::check_padding(&self.map[(pat + h.len) as usize..end as usize], pat + h.len)?;
        Ok((h, p, pat))
    }

    /// Tensor data chunks of tensor `tensor`, as (byte offset, bytes)
    /// borrowed from the map (zero-copy), each checksum-verified.
    pub fn tensor_chunks(&self, tensor: u32) -> Result<Vec<(u64, &[u8])>> {
        let mut out = Vec::new();
        for e in &self.footer.index {
            if e.kind == ChunkKind::Tensor && e.aux[0] == tensor as u64 {
                let (h, p, _) = self.payload(e)?;
                out.push((h.aux[1], p));
            }
        }
        Ok(out)
    }

    /// Index entries of the records chunks, in stream order.
    pub fn record_chunks(&self) -> impl Iterator<Item = &crate::footer::IndexEntry> {
        self.footer
            .index
            .iter()
            .filter(|e| e.kind == ChunkKind::Records)
    }

    /// Decode every record in order, calling `f` with each one.
    pub fn for_each_record(
        &self,
        mut f: impl FnMut(&Record, &Strings) -> Result<()>,
    ) -> Result<()> {
        let mut r = Record::default();
        let mut last = None;
        for e in self.record_chunks() {
            let (h, p, pat) = self.payload(e)?;
            let mut c = RecordChunk::new(&h, p, pat, self.strings_at(e.ordinal), &mut last);
            while c.next_into(&mut r)? {
                f(&r, &self.strings)?;
            }
        }
        Ok(())
    }

    /// Visit the chunks in stream order like a `StreamReader` would:
    /// tensor data, records and snapshot chunks, each checksum-verified.
    pub fn for_each_event(&self, mut f: impl FnMut(Event<'_>) -> Result<()>) -> Result<()> {
        let mut last = None;
        for e in &self.footer.index {
            match e.kind {
                ChunkKind::Tensor => {
                    let (h, p, _) = self.payload(e)?;
                    f(Event::Tensor {
                        tensor: h.aux[0] as u32,
                        offset: h.aux[1],
                        data: p,
                    })?;
                }
                ChunkKind::Records => {
                    let (h, p, pat) = self.payload(e)?;
                    f(Event::Records(RecordChunk::new(
                        &h,
                        p,
                        pat,
                        self.strings_at(e.ordinal),
                        &mut last,
                    )))?;
                }
                ChunkKind::Snapshot => {
                    let (h, p, _) = self.payload(e)?;
                    f(Event::Snapshot {
                        op_id: h.aux[0],
                        operand: h.aux[1] as u32,
                        data: p,
                    })?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The string table and how many of its strings chunk `ordinal` may use.
    fn strings_at(&self, ordinal: u32) -> (&Strings, usize) {
        let n = self.strings_before.get(ordinal as usize).copied();
        (&self.strings, n.unwrap_or(0) as usize)
    }

    /// The whole file as bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The whole file's bytes, shared: for a reader that keeps tensor data
    /// where it lies after the trace is dropped (a tensor chunk's `data`
    /// lies at `data.as_ptr() - bytes().as_ptr()` in it).
    pub fn shared_bytes(&self) -> std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> {
        self.map.clone()
    }
}
