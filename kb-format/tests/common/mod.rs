//! Helpers shared by the integration tests: reading a whole trace with each
//! reader, a representative sample trace, and a raw trace builder for
//! crafting inputs the writer refuses to produce.

#![allow(dead_code)]

use std::path::Path;

use kb_format::chunk::{self, BLOCK, ChunkHeader, ChunkKind, Trailer};
use kb_format::*;
use xxhash_rust::xxh3::xxh3_64;

/// Everything a reader yields for a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Dump {
    pub meta: Meta,
    pub strings: Vec<String>,
    /// (tensor, byte offset, bytes) in stream order.
    pub tensors: Vec<(u32, u64, Vec<u8>)>,
    pub records: Vec<Record>,
    pub verify: VerifySpec,
    pub footer: Footer,
}

/// Read a whole trace with `StreamReader`.
pub fn read_stream(bytes: &[u8]) -> Result<Dump> {
    let mut s = StreamReader::open(bytes)?;
    let mut tensors = Vec::new();
    let mut records = Vec::new();
    let mut r = Record::default();
    while let Some(ev) = s.next_event()? {
        match ev {
            Event::Tensor {
                tensor,
                offset,
                data,
            } => tensors.push((tensor, offset, data.to_vec())),
            Event::Snapshot { .. } => {}
            Event::Records(mut c) => {
                while c.next_into(&mut r)? {
                    records.push(r.clone());
                }
            }
        }
    }
    // Reading past the end stays at the end.
    assert!(s.next_event()?.is_none());
    Ok(Dump {
        meta: s.meta().clone(),
        strings: s.strings().iter().map(String::from).collect(),
        tensors,
        records,
        verify: s.verify_spec().expect("verify spec after the end").clone(),
        footer: s.footer().expect("footer after the end").clone(),
    })
}

/// Read a whole trace file with `MmapTrace`: open, verify the digest, every
/// record, every tensor's chunks, and the event walk.
pub fn read_mmap(path: &Path) -> Result<Dump> {
    let m = MmapTrace::open(path)?;
    let mut records = Vec::new();
    m.for_each_record(|r, _| {
        records.push(r.clone());
        Ok(())
    })?;
    let mut per_tensor = Vec::new();
    for t in 0..m.meta().tensors.len() as u32 {
        for (off, data) in m.tensor_chunks(t)? {
            per_tensor.push((t, off, data.to_vec()));
        }
    }
    let mut tensors = Vec::new();
    let mut n = 0;
    m.for_each_event(|ev| {
        match ev {
            Event::Tensor {
                tensor,
                offset,
                data,
            } => tensors.push((tensor, offset, data.to_vec())),
            Event::Snapshot { .. } => {}
            Event::Records(mut c) => {
                let mut r = Record::default();
                while c.next_into(&mut r)? {
                    assert_eq!(r, records[n]);
                    n += 1;
                }
            }
        }
        Ok(())
    })?;
    assert_eq!(n, records.len());
    // tensor_chunks gives the same chunks, grouped by tensor.
    let mut sorted = tensors.clone();
    sorted.sort_by_key(|t| t.0);
    assert_eq!(sorted, per_tensor);
    // Last, so that damage the chunk checksums catch is reported by them.
    m.verify_digest()?;
    Ok(Dump {
        meta: m.meta().clone(),
        strings: m.strings().iter().map(String::from).collect(),
        tensors,
        records,
        verify: m.verify_spec().clone(),
        footer: m.footer().clone(),
    })
}

/// `read_mmap` on `bytes` written to a new file next to `path` (a new
/// file rather than rewriting one: ext4 flushes a file truncated and
/// rewritten when it is closed, which makes thousands of cases slow).
pub fn read_mmap_bytes(path: &Path, bytes: &[u8]) -> Result<Dump> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}", N.fetch_add(1, Ordering::Relaxed)));
    let p = std::path::PathBuf::from(name);
    std::fs::write(&p, bytes).expect("write temp file");
    let r = read_mmap(&p);
    std::fs::remove_file(&p).expect("remove temp file");
    r
}

pub fn sample_meta() -> Meta {
    Meta {
        tool: "kb-format tests".into(),
        tool_version: "0.1.0".into(),
        command_line: vec!["kb-sim".into(), "run".into()],
        topology: TopologyMeta {
            name: "tiny".into(),
            address_model: "pa".into(),
            resolved: "sips: 1\n".into(),
        },
        benchmark: "gemm".into(),
        params: vec![("m".into(), "4".into())],
        seed: 7,
        tensors: vec![
            TensorMeta {
                name: "a".into(),
                dtype: Dtype::F16,
                shape: vec![4, 8],
                address: 0x1000,
                host_data: true,
                shards: vec![Shard {
                    tensor_offset: 0,
                    rows: 4,
                    row_bytes: 16,
                    tensor_row_stride: 16,
                    pa: 0x0001_0000_0000_1000,
                }],
            },
            TensorMeta {
                name: "out".into(),
                dtype: Dtype::F32,
                shape: vec![4],
                address: 0x2000,
                host_data: false,
                shards: vec![],
            },
        ],
    }
}

pub fn sample_verify() -> VerifySpec {
    VerifySpec {
        outputs: vec![VerifyOutput {
            tensor: "out".into(),
            reference: Expr::Sum {
                input: Box::new(Expr::Tensor("a".into())),
                axis: 1,
            },
            tolerance: Some(Tolerance {
                rtol: 1e-3,
                atol: 1e-5,
            }),
        }],
    }
}

/// Record `i` of the sample: every third one a gemm, the rest DMAs.
pub fn sample_record(i: u64, component: u32, op_name: u32) -> Record {
    let t = i * 100;
    let mut r = Record {
        op_id: i,
        t_start: t,
        t_end: t + 50,
        component,
        op_name,
        kind: OpKind::Memory,
        params: Params::Memory(MemoryParams {
            src: Addr {
                space: Space::Host,
                addr: pa::host(0, i * 4),
            },
            dst: Addr {
                space: Space::Hbm,
                addr: 0x0001_0000_0000_1000 + i * 4,
            },
            rows: 1,
            row_bytes: 4,
            src_stride: 4,
            dst_stride: 4,
            dtype: Some(Dtype::F16),
        }),
        deps: if i > 0 {
            vec![Dep::data(i - 1)]
        } else {
            vec![]
        },
        fingerprint: Some(0x0123_4567_89ab_cdef ^ i),
        read: Some(Effect {
            time: t,
            seq: 2 * i,
            ranges: vec![Extent::contiguous(pa::host(0, i * 4), 4)],
        }),
        write: Some(Effect {
            time: t + 50,
            seq: 2 * i + 1,
            ranges: vec![Extent {
                pa: 0x0001_0000_0000_1000 + i * 4,
                len: 2,
                rows: 2,
                stride: 16,
            }],
        }),
        active: None,
    };
    if i % 3 == 2 {
        r.kind = OpKind::Gemm;
        r.fingerprint = None;
        // Computing part of the span (format 3.3).
        r.active = Some((t + 20, t + 45));
        r.params = Params::Gemm(GemmParams {
            a: Addr {
                space: Space::Tcm,
                addr: 0x10,
            },
            b: Addr {
                space: Space::Tcm,
                addr: 0x20,
            },
            out: Addr {
                space: Space::Tcm,
                addr: 0x30,
            },
            acc: None,
            m: 4,
            k: 8,
            n: 4,
            dtype_in: Dtype::F16,
            dtype_acc: Dtype::F32,
            dtype_out: Dtype::F32,
            transpose_a: false,
            transpose_b: true,
            layout_a: Layout::RowMajor,
            layout_b: Layout::ColMajor,
            layout_out: Layout::RowMajor,
        });
    }
    r
}

/// Records in the sample trace.
pub const SAMPLE_RECORDS: u64 = 24;

/// A small trace with every kind of chunk: meta, two strings chunks,
/// tensor data, several records chunks, verify, footer; about 3 KB. The
/// footer has padding (an odd number of index entries).
pub fn sample_trace() -> Vec<u8> {
    let b = sample_trace_with(2);
    // The index lists every chunk but the footer.
    if (chunk_offsets(&b).len() - 1) % 2 == 1 {
        b
    } else {
        sample_trace_with(3)
    }
}

/// The sample, with the tensor data written in `pieces` chunks.
fn sample_trace_with(pieces: u8) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    w.set_records_chunk_target(256);
    let c = w.intern("sip0.cube0.pe0.pe_dma");
    let n = w.intern("dma_read");
    let step = 64u8.div_ceil(pieces);
    for at in (0..64u8).step_by(step as usize) {
        let end = (at + step).min(64);
        w.tensor_data(0, at as u64, &(at..end).collect::<Vec<u8>>())
            .unwrap();
    }
    // Pushed in pairs, the later op first, so the reorder buffer works.
    for i in (0..SAMPLE_RECORDS).step_by(2) {
        for j in [i + 1, i] {
            let mut r = sample_record(j, c, n);
            if j == SAMPLE_RECORDS - 1 {
                // A string defined late: a second strings chunk.
                r.op_name = w.intern("gemm_f16");
            }
            w.push(r).unwrap();
        }
        w.advance((i + 2) * 100).unwrap();
    }
    w.finish(&sample_verify()).unwrap()
}

/// Assembles a trace from raw chunks, computing checksums, the index, the
/// digest and the trailer like the writer does, but taking any payload and
/// aux values.
#[derive(Debug, Default)]
pub struct RawTrace {
    pub chunks: Vec<(ChunkKind, [u64; 3], Vec<u8>)>,
    /// Footer counts; `None` computes them from the chunks.
    pub counts: Option<Counts>,
}

impl RawTrace {
    pub fn chunk(mut self, kind: ChunkKind, aux: [u64; 3], payload: Vec<u8>) -> Self {
        self.chunks.push((kind, aux, payload));
        self
    }

    pub fn meta(self, m: &Meta) -> Self {
        self.chunk(ChunkKind::Meta, [0; 3], postcard::to_stdvec(m).unwrap())
    }

    pub fn strings(self, first: u64, items: &[&str]) -> Self {
        let mut p = Vec::new();
        for s in items {
            assert!(s.len() < 128);
            p.push(s.len() as u8);
            p.extend_from_slice(s.as_bytes());
        }
        self.chunk(ChunkKind::Strings, [first, items.len() as u64, 0], p)
    }

    pub fn records(self, recs: &[Record]) -> Self {
        let mut e = kb_format::record_codec::RecordEncoder::default();
        for r in recs {
            e.push(r);
        }
        let aux = [e.count(), recs[0].t_start, recs[0].op_id];
        // The payload starts with the seq watermark (0: no promise).
        let mut p = 0u64.to_le_bytes().to_vec();
        p.extend_from_slice(e.as_bytes());
        self.chunk(ChunkKind::Records, aux, p)
    }

    pub fn verify(self, v: &VerifySpec) -> Self {
        self.chunk(ChunkKind::Verify, [0; 3], postcard::to_stdvec(v).unwrap())
    }

    pub fn build(&self) -> Vec<u8> {
        let mut b = chunk::encode_file_header().to_vec();
        let mut index = Vec::new();
        let mut counts = Counts::default();
        for (i, (kind, aux, payload)) in self.chunks.iter().enumerate() {
            index.push(IndexEntry {
                offset: b.len() as u64,
                kind: *kind,
                ordinal: i as u32,
                aux: [aux[0], aux[1]],
            });
            match kind {
                ChunkKind::Records => counts.records = counts.records.wrapping_add(aux[0]),
                ChunkKind::Strings => counts.strings += aux[1],
                ChunkKind::Tensor => counts.tensor_bytes += payload.len() as u64,
                _ => {}
            }
            push_chunk(&mut b, *kind, *aux, payload, i as u32);
        }
        counts.chunks = index.len() as u64;
        let footer = Footer {
            counts: self.counts.unwrap_or(counts),
            digest: xxh3_64(&b),
            index,
        };
        let footer_offset = b.len() as u64;
        push_chunk(
            &mut b,
            ChunkKind::Footer,
            [0; 3],
            &footer.encode(),
            self.chunks.len() as u32,
        );
        let total_len = b.len() as u64 + BLOCK as u64;
        b.extend_from_slice(
            &Trailer {
                footer_offset,
                total_len,
            }
            .encode(),
        );
        b
    }
}

fn push_chunk(b: &mut Vec<u8>, kind: ChunkKind, aux: [u64; 3], payload: &[u8], ordinal: u32) {
    let h = ChunkHeader {
        kind,
        len: payload.len() as u64,
        aux,
        payload_checksum: xxh3_64(payload),
        ordinal,
    };
    b.extend_from_slice(&h.encode());
    b.extend_from_slice(payload);
    b.resize(chunk::pad_to_align(b.len() as u64) as usize, 0);
}

/// Recompute the checksum of the 64-byte block at `at` (file header, chunk
/// header or trailer) after editing it.
/// The errors both readers give for `b` (each must refuse it).
pub fn errors(b: &[u8]) -> Vec<String> {
    let s = StreamReader::open(b).and_then(|mut s| s.skip_to_end().map(|_| ()));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.kbt");
    std::fs::write(&p, b).unwrap();
    let m = MmapTrace::open(&p).map(|_| ());
    [s, m]
        .into_iter()
        .map(|r| r.expect_err("the reader accepted it").to_string())
        .collect()
}

pub fn reseal_block(b: &mut [u8], at: usize) {
    let sum = xxh3_64(&b[at..at + 56]);
    b[at + 56..at + 64].copy_from_slice(&sum.to_le_bytes());
}

/// After editing bytes before the footer, recompute the footer digest, the
/// footer payload checksum and the footer header checksum.
pub fn refooter(b: &mut [u8]) {
    let (fat, fh) = *chunk_offsets(b).last().unwrap();
    assert_eq!(fh.kind, ChunkKind::Footer);
    let digest = xxh3_64(&b[..fat]);
    let p = fat + BLOCK;
    b[p + 40..p + 48].copy_from_slice(&digest.to_le_bytes());
    let sum = xxh3_64(&b[p..p + fh.len as usize]);
    b[fat + 40..fat + 48].copy_from_slice(&sum.to_le_bytes());
    reseal_block(b, fat);
}

/// Offsets of the chunk headers of `bytes`, walking the stream.
pub fn chunk_offsets(bytes: &[u8]) -> Vec<(usize, ChunkHeader)> {
    let mut out = Vec::new();
    let mut at = BLOCK;
    while at + BLOCK <= bytes.len() {
        let hb: &[u8; BLOCK] = bytes[at..at + BLOCK].try_into().unwrap();
        let Ok(h) = ChunkHeader::decode(hb, at as u64, None) else {
            break;
        };
        out.push((at, h));
        at += h.total_len() as usize;
    }
    out
}

/// Recompute every checksum (file header, each chunk header and payload
/// found by walking the chunk lengths, the footer digest, the trailer), so
/// that damage reaches the decoders behind the checksums.
pub fn reseal_all(b: &mut [u8]) {
    if b.len() < BLOCK {
        return;
    }
    reseal_block(b, 0);
    let mut at = BLOCK;
    while at + BLOCK <= b.len() && &b[at..at + 4] == b"KBCH" {
        let kind = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap());
        let len = u64::from_le_bytes(b[at + 8..at + 16].try_into().unwrap());
        let pat = at + BLOCK;
        let end = match usize::try_from(len).ok().and_then(|l| pat.checked_add(l)) {
            Some(e) if e <= b.len() => e,
            _ => {
                reseal_block(b, at);
                return;
            }
        };
        if kind == ChunkKind::Footer.code() && len >= 48 {
            let digest = xxh3_64(&b[..at]);
            b[pat + 40..pat + 48].copy_from_slice(&digest.to_le_bytes());
        }
        let sum = xxh3_64(&b[pat..end]);
        b[at + 40..at + 48].copy_from_slice(&sum.to_le_bytes());
        reseal_block(b, at);
        at = pat + chunk::pad_to_align(len) as usize;
    }
    if b.len() >= 2 * BLOCK && b.len().is_multiple_of(BLOCK) {
        let t = b.len() - BLOCK;
        reseal_block(b, t);
    }
}

/// A small deterministic PRNG (splitmix64) for mutation tests.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
