//! `tensors` (list the named tensors of a run) and `tensor NAME -o FILE.npy`
//! (export a tensor's host data as a NumPy `.npy`, C order, shape from the
//! metadata).
//!
//! Only tensors the host provides (`host_data`) have their bytes in a trace;
//! outputs exist only on the device and are computed by kb-replay, so
//! exporting one is an error.
//!
//! Dtypes: f32 `<f4`, f16 `<f2` (numpy float16), i8 `|i1`, i32 `<i4`,
//! u8 `|u1`. bf16 has no numpy dtype: by default it is widened to `<f4`
//! (exact: every bf16 value is an f32); with [`Bf16As::Bits`] the raw bf16
//! bit patterns are written as `<u2` (`x.view(ml_dtypes.bfloat16)` or
//! `(x.astype(np.uint32) << 16).view(np.float32)` recovers the values).

use std::io::{self, Write};
use std::path::Path;

use kb_format::{Dtype, Meta, Record, Strings, TensorMeta};
use npyz::WriterBuilder;
use serde_json::json;

use crate::source::{self, End, Flow, Input, Visitor};
use crate::{Error, Result, out_err};

/// Size in bytes of a tensor, `None` if it overflows 64 bits.
pub fn nbytes(t: &TensorMeta) -> Option<u64> {
    t.shape
        .iter()
        .try_fold(t.dtype.size() as u64, |a, &d| a.checked_mul(d))
}

/// How bf16 tensors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bf16As {
    /// Widened to float32 (`<f4`), exactly.
    #[default]
    F32,
    /// Raw bit patterns as uint16 (`<u2`).
    Bits,
}

/// The numpy type string a tensor is written with.
pub fn npy_dtype(d: Dtype, bf16: Bf16As) -> &'static str {
    match d {
        Dtype::F32 => "<f4",
        Dtype::F16 => "<f2",
        Dtype::Bf16 => match bf16 {
            Bf16As::F32 => "<f4",
            Bf16As::Bits => "<u2",
        },
        Dtype::I8 => "|i1",
        Dtype::I32 => "<i4",
        Dtype::U8 => "|u1",
    }
}

/// The metadata and the host data bytes present per tensor (records are
/// not decoded).
#[derive(Debug, Default)]
struct Present {
    meta: Meta,
    have: Vec<u64>,
}

impl Visitor for Present {
    fn wants_records(&self) -> bool {
        false
    }
    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        self.meta = meta.clone();
        self.have = vec![0; meta.tensors.len()];
        Ok(Flow::Continue)
    }
    fn tensor(&mut self, t: u32, _off: u64, data: &[u8]) -> Result<Flow> {
        if let Some(n) = self.have.get_mut(t as usize) {
            *n += data.len() as u64;
        }
        Ok(Flow::Continue)
    }
    fn record(&mut self, _: &Record, _: &Strings) -> Result<Flow> {
        Ok(Flow::Continue)
    }
}

/// `tensors`: list the named tensors (table or JSON).
pub fn list(input: &Input, json: bool, w: &mut dyn Write) -> Result<()> {
    let mut p = Present::default();
    source::visit(input, &mut p)?;
    let meta = &p.meta;
    if json {
        let v: Vec<_> = meta
            .tensors
            .iter()
            .zip(&p.have)
            .enumerate()
            .map(|(i, (t, &have))| {
                json!({
                    "index": i,
                    "name": t.name,
                    "dtype": t.dtype.name(),
                    "shape": t.shape,
                    "bytes": nbytes(t),
                    "host_data": t.host_data,
                    "host_bytes_present": have,
                    "address": format!("{:#x}", t.address),
                    "shards": t.shards.len(),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut *w, &v).map_err(|e| out_err(io::Error::other(e)))?;
        return writeln!(w).map_err(out_err);
    }
    let width = meta
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        w,
        "{:>5}  {:width$}  {:5}  {:16}  {:>12}  {:>10}  data",
        "index", "name", "dtype", "shape", "bytes", "address"
    )
    .map_err(out_err)?;
    for (i, (t, &have)) in meta.tensors.iter().zip(&p.have).enumerate() {
        let size = nbytes(t);
        let data = if t.host_data {
            format!("host ({have} bytes present)")
        } else {
            format!("device output ({} shards)", t.shards.len())
        };
        writeln!(
            w,
            "{i:>5}  {:width$}  {:5}  {:16}  {:>12}  {:>#10x}  {data}",
            t.name,
            t.dtype.name(),
            format!("{:?}", t.shape),
            size.map_or("overflow".to_string(), |s| s.to_string()),
            t.address,
        )
        .map_err(out_err)?;
    }
    Ok(())
}

/// Gathers the host data chunks of one tensor.
#[derive(Debug)]
struct Gather {
    name: String,
    input: String,
    index: Option<u32>,
    meta: Option<TensorMeta>,
    pieces: Vec<(u64, Vec<u8>)>,
}

impl Visitor for Gather {
    fn wants_records(&self) -> bool {
        false
    }

    fn meta(&mut self, meta: &Meta) -> Result<Flow> {
        let Some((i, t)) = meta.tensor(&self.name) else {
            let names: Vec<&str> = meta.tensors.iter().map(|t| t.name.as_str()).collect();
            return Err(Error::usage(format!(
                "{}: no tensor named {:?} (tensors: {})",
                self.input,
                self.name,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        };
        if !t.host_data {
            return Err(Error::usage(format!(
                "{}: tensor {:?} has no host data in the trace: it is a device output, \
                 which only kb-replay computes (replay the trace to get its values)",
                self.input, self.name
            )));
        }
        self.index = Some(i);
        self.meta = Some(t.clone());
        Ok(Flow::Continue)
    }

    fn tensor(&mut self, t: u32, off: u64, data: &[u8]) -> Result<Flow> {
        if Some(t) == self.index {
            self.pieces.push((off, data.to_vec()));
        }
        Ok(Flow::Continue)
    }

    fn record(&mut self, _: &Record, _: &Strings) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    fn end(&mut self, _: &End<'_>) -> Result<()> {
        Ok(())
    }
}

/// Assemble pieces (byte offset, bytes) into one buffer of `size` bytes;
/// where pieces overlap, the later one in stream order wins; an error names
/// the first byte no piece covers.
fn assemble(pieces: Vec<(u64, Vec<u8>)>, size: u64, what: &str) -> Result<Vec<u8>> {
    let mut spans: Vec<(u64, u64)> = pieces.iter().map(|(o, d)| (*o, d.len() as u64)).collect();
    spans.sort_unstable();
    let mut covered = 0u64;
    for &(off, len) in &spans {
        if off > covered {
            break;
        }
        covered = covered.max(off + len);
    }
    if covered < size {
        return Err(Error::usage(format!(
            "{what}: the trace holds its host data only up to byte {covered} of {size}"
        )));
    }
    // Justified: the pieces read hold at least `size` bytes.
    let mut buf = vec![0u8; size as usize];
    for (off, d) in pieces {
        let o = off as usize;
        buf.get_mut(o..o.saturating_add(d.len()))
            .ok_or_else(|| {
                Error::usage(format!(
                    "{what}: host data at byte {off} runs past the tensor's {size} bytes"
                ))
            })?
            .copy_from_slice(&d);
    }
    Ok(buf)
}

/// A tensor's metadata and host bytes, read from a trace.
pub fn read_host_data(input: &Input, name: &str) -> Result<(TensorMeta, Vec<u8>)> {
    let mut g = Gather {
        name: name.to_string(),
        input: input.to_string(),
        index: None,
        meta: None,
        pieces: Vec::new(),
    };
    source::visit(input, &mut g)?;
    let t = g
        .meta
        .ok_or_else(|| Error::usage(format!("{input}: no tensor named {name:?}")))?;
    let size = nbytes(&t).ok_or_else(|| {
        Error::usage(format!(
            "{input}: tensor {name:?} has a shape {:?} too large to export",
            t.shape
        ))
    })?;
    let data = assemble(g.pieces, size, &format!("{input}: tensor {name:?}"))?;
    Ok((t, data))
}

fn write_items<T: npyz::Serialize, W: Write>(
    w: W,
    dtype: &str,
    shape: &[u64],
    items: impl Iterator<Item = T>,
) -> io::Result<()> {
    let ts: npyz::TypeStr = dtype
        .parse()
        .map_err(|e| io::Error::other(format!("{e}")))?;
    let mut wr = npyz::WriteOptions::<T>::new()
        .dtype(npyz::DType::Plain(ts))
        .shape(shape)
        .writer(w)
        .begin_nd()?;
    for x in items {
        wr.push(&x)?;
    }
    wr.finish()
}

/// Write a tensor's bytes (little-endian elements) as `.npy`.
pub fn write_npy<W: Write>(w: W, t: &TensorMeta, data: &[u8], bf16: Bf16As) -> io::Result<()> {
    let dt = npy_dtype(t.dtype, bf16);
    let sh = &t.shape[..];
    macro_rules! le {
        ($ty:ty, $n:expr) => {
            data.chunks_exact($n)
                .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk size")))
        };
    }
    match t.dtype {
        Dtype::F32 => write_items::<f32, _>(w, dt, sh, le!(f32, 4)),
        Dtype::F16 => write_items::<half::f16, _>(w, dt, sh, le!(half::f16, 2)),
        Dtype::Bf16 => match bf16 {
            Bf16As::F32 => write_items::<f32, _>(
                w,
                dt,
                sh,
                le!(u16, 2).map(|b| half::bf16::from_bits(b).to_f32()),
            ),
            Bf16As::Bits => write_items::<u16, _>(w, dt, sh, le!(u16, 2)),
        },
        Dtype::I8 => write_items::<i8, _>(w, dt, sh, data.iter().map(|&b| b as i8)),
        Dtype::I32 => write_items::<i32, _>(w, dt, sh, le!(i32, 4)),
        Dtype::U8 => write_items::<u8, _>(w, dt, sh, data.iter().copied()),
    }
}

/// `tensor NAME -o FILE`: export a host tensor as `.npy` (`-` is stdout).
/// Returns the tensor's metadata.
pub fn export(input: &Input, name: &str, out: &Path, bf16: Bf16As) -> Result<TensorMeta> {
    if crate::is_terminal_path(out) {
        return Err(Error::usage(format!(
            "refusing to write .npy bytes to a terminal ({}): give a file, or pipe standard output",
            out.display()
        )));
    }
    let (t, data) = read_host_data(input, name)?;
    let what = format!("writing {}", out.display());
    crate::write_output(out, |w| {
        write_npy(w, &t, &data, bf16).map_err(|e| Error::io(&what, e))
    })?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    fn read_npy(path: &Path) -> npyz::NpyFile<io::Cursor<Vec<u8>>> {
        let b = std::fs::read(path).unwrap();
        npyz::NpyFile::new(io::Cursor::new(b)).unwrap()
    }

    #[test]
    fn f16_tensor_round_trips_through_npy() {
        let bytes = testutil::sample_trace();
        let (d, p) = testutil::write_temp(&bytes);
        let out = d.path().join("a.npy");
        let t = export(&Input::Path(p), "a", &out, Bf16As::F32).unwrap();
        assert_eq!(t.shape, vec![2, 3]);
        let npy = read_npy(&out);
        assert_eq!(npy.shape(), &[2, 3]);
        assert_eq!(npy.order(), npyz::Order::C);
        assert_eq!(npy.dtype().descr(), "'<f2'");
        let v: Vec<half::f16> = npy.into_vec().unwrap();
        let want: Vec<half::f16> = testutil::A_F16
            .iter()
            .map(|&x| half::f16::from_f32(x))
            .collect();
        assert_eq!(
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bf16_is_widened_to_f32_or_kept_as_bits() {
        let bytes = testutil::sample_trace();
        let (d, p) = testutil::write_temp(&bytes);
        let out = d.path().join("b.npy");
        export(&Input::Path(p.clone()), "b", &out, Bf16As::F32).unwrap();
        let npy = read_npy(&out);
        assert_eq!(npy.dtype().descr(), "'<f4'");
        assert_eq!(npy.shape(), &[2, 2]);
        let v: Vec<f32> = npy.into_vec().unwrap();
        let want: Vec<f32> = testutil::B_BF16
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(v, want);
        assert_eq!(v[0], 1.0);

        export(&Input::Path(p), "b", &out, Bf16As::Bits).unwrap();
        let npy = read_npy(&out);
        assert_eq!(npy.dtype().descr(), "'<u2'");
        let bits: Vec<u16> = npy.into_vec().unwrap();
        assert_eq!(bits[0], half::bf16::from_f32(1.0).to_bits());
    }

    #[test]
    fn every_dtype_writes_a_readable_npy() {
        for (dtype, data) in [
            (Dtype::F32, 1.5f32.to_le_bytes().repeat(2)),
            (Dtype::I32, (-3i32).to_le_bytes().repeat(2)),
            (Dtype::I8, vec![0xff, 1]),
            (Dtype::U8, vec![0xff, 1]),
        ] {
            let t = TensorMeta {
                name: "x".into(),
                dtype,
                shape: vec![2],
                address: 0,
                host_data: true,
                shards: vec![],
            };
            let mut buf = Vec::new();
            write_npy(&mut buf, &t, &data, Bf16As::F32).unwrap();
            let npy = npyz::NpyFile::new(&buf[..]).unwrap();
            assert_eq!(npy.shape(), &[2]);
            match dtype {
                Dtype::F32 => assert_eq!(npy.into_vec::<f32>().unwrap(), [1.5, 1.5]),
                Dtype::I32 => assert_eq!(npy.into_vec::<i32>().unwrap(), [-3, -3]),
                Dtype::I8 => assert_eq!(npy.into_vec::<i8>().unwrap(), [-1, 1]),
                _ => assert_eq!(npy.into_vec::<u8>().unwrap(), [255, 1]),
            }
        }
    }

    #[test]
    fn stream_export_matches_file_export() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let (_, a) = read_host_data(&Input::Path(p), "a").unwrap();
        let mut g = Gather {
            name: "a".into(),
            input: "-".into(),
            index: None,
            meta: None,
            pieces: vec![],
        };
        source::visit_reader("-", &bytes[..], &mut g).unwrap();
        let b = assemble(g.pieces, 12, "a").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 12);
    }

    #[test]
    fn outputs_and_unknown_names_are_clear_errors() {
        let bytes = testutil::sample_trace();
        let (d, p) = testutil::write_temp(&bytes);
        let out = d.path().join("c.npy");
        let e = export(&Input::Path(p.clone()), "c", &out, Bf16As::F32).unwrap_err();
        assert!(e.to_string().contains("no host data"), "{e}");
        assert!(e.to_string().contains("kb-replay"), "{e}");
        assert!(!out.exists());
        let e = export(&Input::Path(p), "zz", &out, Bf16As::F32).unwrap_err();
        assert!(e.to_string().contains("tensors: a, b, c"), "{e}");
    }

    #[test]
    fn missing_host_bytes_are_reported() {
        let e = assemble(vec![(0, vec![0; 4]), (6, vec![0; 6])], 12, "t").unwrap_err();
        assert!(e.to_string().contains("up to byte 4 of 12"), "{e}");
        assert_eq!(
            assemble(vec![(4, vec![2; 8]), (0, vec![1; 6])], 12, "t").unwrap(),
            [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]
        );
    }

    #[test]
    fn listing_shows_every_tensor() {
        let bytes = testutil::sample_trace();
        let (_d, p) = testutil::write_temp(&bytes);
        let mut out = Vec::new();
        list(&Input::Path(p.clone()), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(text.contains("host (12 bytes present)"), "{text}");
        assert!(text.contains("device output (1 shards)"), "{text}");
        let mut out = Vec::new();
        list(&Input::Path(p), true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v[1]["name"], "b");
        assert_eq!(v[1]["bytes"], 8);
        assert_eq!(v[2]["host_data"], false);
    }
}
