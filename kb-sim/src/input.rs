//! Input tensors from numpy `.npy` files (`kb-sim --input NAME=FILE.npy`).
//!
//! The file's dtype and shape must match the tensor the workload declares:
//! f32 `<f4`, f16 `<f2`, i8 `|i1`, i32 `<i4`, u8 `|u1` (either byte order),
//! and bf16 from `<f4` holding only bf16 values (as `kb-inspect tensor`
//! writes bf16). The file's shape is the tensor's dims (1 to 6 of them;
//! a Fortran-order file of any rank is reordered to row-major); a 1-D
//! file also fits a tensor with at most one dim other than 1 and as many
//! elements (`[n, 1]`, `[1, n]`, `[1, 1, n]`). The bytes
//! become the tensor's host data exactly, so `kb-inspect tensor` exports
//! the same array. The read is bounded by the declared tensor's size, so a
//! huge or endless file cannot exhaust memory.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use std::io::Read;
use std::path::Path;

use kb_format::Dtype;
use npyz::{DType, NpyFile, Order, TypeChar};

/// Room for the .npy header beyond the data (a v1 header is < 64 KiB).
const HEADER_SLACK: u64 = 1 << 17;

/// Deepest nesting of brackets a .npy header may have: a real one is a
/// dict holding a shape tuple (2 deep; a structured dtype's list adds a
/// few).
const MAX_HEADER_DEPTH: usize = 8;

/// Refuse a .npy header whose brackets nest deeper than
/// [`MAX_HEADER_DEPTH`] before npyz parses it: its parser takes time
/// exponential in that depth (60 nested `{` took over 10 s, found by the
/// `npy_input` fuzz target). Quoted strings do not count.
fn check_header_depth(bytes: &[u8]) -> Result<(), String> {
    let Some(rest) = bytes.strip_prefix(b"\x93NUMPY") else {
        return Ok(()); // npyz says what is wrong
    };
    let (len, start) = match rest {
        [1, _, a, b, ..] => (u16::from_le_bytes([*a, *b]) as usize, 10),
        [2 | 3, _, a, b, c, d, ..] => (u32::from_le_bytes([*a, *b, *c, *d]) as usize, 12),
        _ => return Ok(()),
    };
    let header = &bytes[start.min(bytes.len())..start.saturating_add(len).min(bytes.len())];
    let (mut depth, mut quote) = (0usize, None);
    for &c in header {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'{' | b'[' | b'(') => {
                depth += 1;
                if depth > MAX_HEADER_DEPTH {
                    return Err(format!(
                        "its header nests brackets more than {MAX_HEADER_DEPTH} deep"
                    ));
                }
            }
            (None, b'}' | b']' | b')') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The host bytes of a `dtype` tensor of dims `shape` read from `path`,
/// or a message naming what the file holds and what was declared.
pub fn read(path: &Path, dtype: Dtype, shape: &[u64]) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let elems = shape.iter().fold(1u64, |acc, &d| acc.saturating_mul(d));
    let want = elems.saturating_mul(dtype.size() as u64);
    // The file's bytes: bf16 comes as <f4, 4 bytes an element.
    let file_es = if dtype == Dtype::Bf16 {
        4
    } else {
        dtype.size() as u64
    };
    let limit = elems.saturating_mul(file_es).saturating_add(HEADER_SLACK);
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{shown}: {e}"))?;
    if bytes.len() as u64 > limit {
        // Name what it holds when its header says (a wider dtype, a
        // larger shape); the data was not read past the bound.
        return Err(match NpyFile::new(&bytes[..]) {
            Ok(f) => {
                let (descr, ok_dtype) = match f.dtype() {
                    DType::Plain(ts) => (ts.to_string(), accepts(dtype, &ts)),
                    other => (other.descr(), false),
                };
                mismatch(path, &descr, f.shape(), dtype, shape, ok_dtype)
            }
            Err(_) => format!(
                "{shown} is larger than a {dtype} {shape:?} array ({want} data bytes) can be"
            ),
        });
    }
    check_header_depth(&bytes).map_err(|e| format!("{shown}: not a readable .npy file: {e}"))?;
    let f =
        NpyFile::new(&bytes[..]).map_err(|e| format!("{shown}: not a readable .npy file: {e}"))?;
    let file_shape = f.shape().to_vec();
    let DType::Plain(ts) = f.dtype() else {
        return Err(format!("{shown}: structured arrays are not supported"));
    };
    let ok_dtype = accepts(dtype, &ts);
    let ok_shape = file_shape == shape
        || (file_shape.len() == 1
            && shape.iter().filter(|&&d| d != 1).count() <= 1
            && file_shape[0] == elems);
    if !ok_dtype || !ok_shape {
        return Err(mismatch(
            path,
            &ts.to_string(),
            &file_shape,
            dtype,
            shape,
            ok_dtype,
        ));
    }
    let fortran = f.order() == Order::Fortran && file_shape.len() >= 2;
    let io = |e: std::io::Error| format!("{shown}: {e}");
    let mut out = match dtype {
        Dtype::F32 => le(f.into_vec::<f32>().map_err(io)?, f32::to_le_bytes),
        Dtype::F16 => le(
            f.into_vec::<half::f16>().map_err(io)?,
            half::f16::to_le_bytes,
        ),
        Dtype::I8 => le(f.into_vec::<i8>().map_err(io)?, i8::to_le_bytes),
        Dtype::I32 => le(f.into_vec::<i32>().map_err(io)?, i32::to_le_bytes),
        Dtype::U8 => f.into_vec::<u8>().map_err(io)?,
        Dtype::Bf16 => {
            let mut out = Vec::new();
            for (i, v) in f.into_vec::<f32>().map_err(io)?.into_iter().enumerate() {
                let b = half::bf16::from_f32(v);
                if b.to_f32().to_bits() != v.to_bits() && !(v.is_nan() && b.is_nan()) {
                    return Err(format!(
                        "{shown}: element {i} ({v}) is not a bf16 value; the workload declares bf16 {shape:?}"
                    ));
                }
                out.extend_from_slice(&b.to_le_bytes());
            }
            out
        }
    };
    if out.len() as u64 != want {
        return Err(format!("{shown}: {} data bytes for {want}", out.len()));
    }
    if fortran {
        out = fortran_to_c(&out, shape, dtype.size());
    }
    Ok(out)
}

/// Whether a file of numpy type `ts` holds a `dtype` tensor's values.
fn accepts(dtype: Dtype, ts: &npyz::TypeStr) -> bool {
    matches!(
        (dtype, (ts.type_char(), ts.size_field())),
        (Dtype::F32 | Dtype::Bf16, (TypeChar::Float, 4))
            | (Dtype::F16, (TypeChar::Float, 2))
            | (Dtype::I8, (TypeChar::Int, 1))
            | (Dtype::I32, (TypeChar::Int, 4))
            | (Dtype::U8, (TypeChar::Uint, 1))
    )
}

/// A file that does not fit the declaration: what it holds (its numpy
/// dtype by name: `<f8 (float64)`), what was declared and, when the dtype
/// is what differs, the one this tensor is read from.
fn mismatch(
    path: &Path,
    descr: &str,
    file_shape: &[u64],
    dtype: Dtype,
    shape: &[u64],
    ok_dtype: bool,
) -> String {
    let mut m = format!(
        "{} holds a {} array of shape {file_shape:?}; the workload declares {dtype} {shape:?}",
        path.display(),
        kb_format::npy_descr_named(descr)
    );
    if !ok_dtype {
        let (want, name) = dtype.npy();
        let bf16 = if dtype == Dtype::Bf16 {
            " holding bf16 values"
        } else {
            ""
        };
        m.push_str(&format!(
            ", read from a {want} ({name}) file{bf16} (numpy: `np.save(path, a.astype(np.{name}))`)"
        ));
    }
    m
}

fn le<T, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.into_iter().flat_map(f).collect()
}

/// Row-major copy of a column-major array of dims `shape` of `es`-byte
/// elements (`b` holds exactly their product).
fn fortran_to_c(b: &[u8], shape: &[u64], es: usize) -> Vec<u8> {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    // Column-major: dim 0 varies fastest.
    let fstride: Vec<usize> = dims
        .iter()
        .scan(1usize, |acc, &d| {
            let s = *acc;
            *acc *= d;
            Some(s)
        })
        .collect();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(b.len());
    let mut idx = vec![0usize; dims.len()];
    for _ in 0..n {
        let at = idx.iter().zip(&fstride).map(|(i, s)| i * s).sum::<usize>() * es;
        out.extend_from_slice(&b[at..at + es]);
        // The next index, row-major (last dim fastest).
        for (i, &d) in idx.iter_mut().zip(&dims).rev() {
            *i += 1;
            if *i < d {
                break;
            }
            *i = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 .npy file of `descr` and `shape` holding `data`.
    fn npy(descr: &str, shape: [u64; 2], data: &[u8]) -> tempfile::NamedTempFile {
        npy_nd(descr, false, &shape, data)
    }

    /// A v1 .npy file of `descr`, order and dims `shape` holding `data`.
    fn npy_nd(descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> tempfile::NamedTempFile {
        let dims: String = shape.iter().map(|d| format!("{d}, ")).collect();
        let order = if fortran { "True" } else { "False" };
        npy_with_header(
            format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': ({dims}), }}"),
            data,
        )
    }

    fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
        v.into_iter().flat_map(f32::to_le_bytes).collect()
    }

    #[test]
    fn an_nd_file_reads_into_an_nd_tensor_in_either_order() {
        // 2 x 3 x 4, element (i, j, k) = 100 i + 10 j + k.
        let at = |i: u64, j: u64, k: u64| (100 * i + 10 * j + k) as f32;
        let mut c = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    c.push(at(i, j, k));
                }
            }
        }
        let f = npy_nd("<f4", false, &[2, 3, 4], &f32s(c.clone()));
        assert_eq!(
            read(f.path(), Dtype::F32, &[2, 3, 4]).unwrap(),
            f32s(c.clone())
        );
        // Column-major: dim 0 fastest.
        let mut fo = Vec::new();
        for k in 0..4 {
            for j in 0..3 {
                for i in 0..2 {
                    fo.push(at(i, j, k));
                }
            }
        }
        let f = npy_nd("<f4", true, &[2, 3, 4], &f32s(fo));
        assert_eq!(
            read(f.path(), Dtype::F32, &[2, 3, 4]).unwrap(),
            f32s(c.clone())
        );
        // The same elements in another shape are refused, naming both.
        let f = npy_nd("<f4", false, &[2, 3, 4], &f32s(c.clone()));
        let e = read(f.path(), Dtype::F32, &[6, 4]).unwrap_err();
        assert!(
            e.ends_with(
                "holds a <f4 (float32) array of shape [2, 3, 4]; the workload declares f32 [6, 4]"
            ),
            "{e}"
        );
        // A 1-D file fits [1, 1, n], not [2, 1, n/2].
        let f = npy_nd("<f4", false, &[24], &f32s(c.clone()));
        assert_eq!(read(f.path(), Dtype::F32, &[1, 1, 24]).unwrap(), f32s(c));
        assert!(read(f.path(), Dtype::F32, &[2, 1, 12]).is_err());
    }

    /// A v1 .npy file with header text `header` (padded) and `data`.
    fn npy_with_header(mut header: String, data: &[u8]) -> tempfile::NamedTempFile {
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b).unwrap();
        f
    }

    #[test]
    fn a_header_nested_deep_is_refused_at_once() {
        // The npy_input fuzz target's find: 60 nested `{` in the header
        // took npyz over 10 s.
        let header = format!("{{{}    ape': (0, 3),%}}", "{".repeat(60));
        let f = npy_with_header(header, &[0, 0x40, 0xa0, 0, 0]);
        let t = std::time::Instant::now();
        let e = read(f.path(), Dtype::F32, &[2, 3]).unwrap_err();
        assert!(t.elapsed().as_secs() < 2, "{:?}", t.elapsed());
        assert!(e.contains("nests brackets more than 8 deep"), "{e}");
        // A real header passes the check (and the read).
        let data: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let ok = npy("<f4", [2, 3], &data);
        assert_eq!(read(ok.path(), Dtype::F32, &[2, 3]).unwrap(), data);
    }

    #[test]
    fn a_bf16_tensor_reads_its_f4_file_whatever_its_size() {
        // 300 x 300 = 90,000 elements, more than 65,536: 360,000 file
        // bytes for 180,000 tensor bytes. 1.5 is exact in bf16.
        let shape = [300, 300];
        let data: Vec<u8> = (0..90_000).flat_map(|_| 1.5f32.to_le_bytes()).collect();
        let f = npy("<f4", shape, &data);
        let b = read(f.path(), Dtype::Bf16, &shape).unwrap();
        assert_eq!(b.len(), 180_000);
        assert_eq!(&b[..2], &half::bf16::from_f32(1.5).to_le_bytes());
    }

    #[test]
    fn a_wider_file_is_named_by_its_dtype_even_when_too_large_to_read() {
        // f64 for an f32 tensor: twice the bytes, past the read bound.
        let shape = [300, 300];
        let f = npy("<f8", shape, &vec![0u8; 90_000 * 8]);
        let e = read(f.path(), Dtype::F32, &shape).unwrap_err();
        assert!(
            e.ends_with(
                "holds a <f8 (float64) array of shape [300, 300]; the workload declares f32 [300, 300], read from a <f4 (float32) file (numpy: `np.save(path, a.astype(np.float32))`)"
            ),
            "{e}"
        );
        // Small enough to read: the same words.
        let f = npy("<f8", [2, 2], &[0u8; 32]);
        let e = read(f.path(), Dtype::F32, &[2, 2]).unwrap_err();
        assert!(
            e.contains("holds a <f8 (float64) array of shape [2, 2]")
                && e.contains("read from a <f4 (float32) file"),
            "{e}"
        );
        assert!(e.starts_with(&f.path().display().to_string()), "{e}");
        // The shape alone differs: no word about dtypes.
        let f = npy("<f4", [2, 2], &[0u8; 16]);
        let e = read(f.path(), Dtype::F32, &[4, 1]).unwrap_err();
        assert!(
            e.ends_with(
                "holds a <f4 (float32) array of shape [2, 2]; the workload declares f32 [4, 1]"
            ),
            "{e}"
        );
        // Each dtype names its file's.
        let f = npy("<f4", [2, 2], &[0u8; 16]);
        let e = read(f.path(), Dtype::I32, &[2, 2]).unwrap_err();
        assert!(e.contains("read from a <i4 (int32) file"), "{e}");
    }
}
