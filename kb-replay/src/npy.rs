//! Reading reference arrays (`--expect`) and writing outputs
//! (`--dump-outputs`) as numpy `.npy` files, through npyz.
//!
//! Reading accepts float (f2, f4, f8), signed and unsigned integer (1, 2,
//! 4, 8 bytes) and bool arrays of either endianness and order, converted to
//! f64 in C order. The header's shape is checked against the file size
//! before npyz sees it, so a corrupt header cannot make it allocate or
//! overflow.
//!
//! Writing uses the tensor's dtype (`<f4`, `<f2`, `|i1`, `<i4`, `|u1`),
//! except bf16, which numpy has no dtype for: it is written as `<f4`
//! (exactly, every bf16 is an f32).

use std::path::Path;

use half::f16;
use kb_format::{AtomicFile, Dtype};
use npyz::{DType, NpyFile, Order, TypeChar, TypeStr, WriteOptions, WriterBuilder};

use crate::error::{Error, Result};

/// A numpy array as f64 values in C order.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<u64>,
    pub data: Vec<f64>,
}

/// Parse the shape tuple out of an .npy header and check it against the
/// bytes that follow, so npyz never sees a shape the file cannot hold.
/// Returns the element count and the data bytes after the header.
fn precheck(b: &[u8]) -> std::result::Result<(u64, u64), String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, start): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = b
        .get(start..start.saturating_add(hlen))
        .ok_or("truncated .npy header")?;
    nesting(header)?;
    let header = String::from_utf8_lossy(header);
    let data_len = (b.len() - start - hlen) as u64;
    let count = element_count(&header)?;
    if count > data_len {
        return Err(format!(
            "the .npy shape holds {count} elements, but the file has {data_len} data bytes"
        ));
    }
    Ok((count, data_len))
}

/// Refuse a header whose brackets nest more than 8 deep (a real one: a
/// dict holding a shape tuple): npyz's header parser takes time
/// exponential in the depth (60 nested `{` took over 10 s; kb-sim's
/// `--input` reader found it first, under fuzzing). Quoted strings do not
/// count.
fn nesting(header: &[u8]) -> std::result::Result<(), String> {
    let (mut depth, mut quote) = (0usize, None);
    for &c in header {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'{' | b'[' | b'(') => {
                depth += 1;
                if depth > 8 {
                    return Err("the .npy header nests brackets more than 8 deep".into());
                }
            }
            (None, b'}' | b']' | b')') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The element count of a .npy header's shape.
fn element_count(header: &str) -> std::result::Result<u64, String> {
    let at = header
        .find("'shape'")
        .or_else(|| header.find("\"shape\""))
        .ok_or("the .npy header has no shape")?;
    let rest = &header[at..];
    let open = rest.find('(').ok_or("cannot parse the .npy shape")?;
    let close = rest.find(')').ok_or("cannot parse the .npy shape")?;
    if close < open {
        return Err("cannot parse the .npy shape".into());
    }
    let mut count: u64 = 1;
    for part in rest[open + 1..close].split(',') {
        let part = part.trim().trim_end_matches('L');
        if part.is_empty() {
            continue;
        }
        let d: u64 = part
            .parse()
            .map_err(|_| format!("bad dimension {part:?} in the .npy shape"))?;
        count = count
            .checked_mul(d)
            .ok_or("the .npy shape's element count overflows")?;
    }
    Ok(count)
}

fn convert<T: npyz::Deserialize>(
    f: NpyFile<&[u8]>,
    to: impl Fn(T) -> f64,
) -> std::io::Result<Vec<f64>> {
    Ok(f.into_vec::<T>()?.into_iter().map(to).collect())
}

/// C-order copy of Fortran-order data.
fn fortran_to_c(shape: &[u64], data: &[f64]) -> Vec<f64> {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let n = data.len();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; dims.len()];
    for _ in 0..n {
        // Fortran offset: first index fastest.
        let mut off = 0;
        let mut stride = 1;
        for (k, &d) in dims.iter().enumerate() {
            off += idx[k] * stride;
            stride *= d;
        }
        out.push(data[off]);
        // Advance the C-order index: last index fastest.
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// The most a .npy header may hold (numpy writes a few hundred bytes).
const MAX_HEADER: usize = 1 << 20;

/// The bytes of an .npy file, read no further than its header says the
/// data goes (plus one byte, so trailing bytes are seen and refused): a
/// FIFO or a device (`/dev/zero`) cannot make it read without end.
fn read_bounded(path: &Path) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut b = Vec::with_capacity(12);
    (&mut f)
        .take(10)
        .read_to_end(&mut b)
        .map_err(|e| e.to_string())?;
    if b.len() < 6 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    if b.len() < 10 {
        return Err("truncated .npy header".into());
    }
    let hlen = match b[6] {
        1 => u16::from_le_bytes([b[8], b[9]]) as usize,
        2 | 3 => {
            b.resize(12, 0);
            f.read_exact(&mut b[10..12])
                .map_err(|_| "truncated .npy header".to_string())?;
            u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    if hlen > MAX_HEADER {
        return Err(format!(
            "a .npy header of {hlen} bytes (at most {MAX_HEADER})"
        ));
    }
    let start = b.len();
    b.resize(start + hlen, 0);
    f.read_exact(&mut b[start..])
        .map_err(|_| "truncated .npy header".to_string())?;
    let header = String::from_utf8_lossy(&b[start..]).into_owned();
    // Item size: the digits ending the descr string ('<f4', '|u1').
    let descr = header
        .find("'descr'")
        .or_else(|| header.find("\"descr\""))
        .map(|at| &header[at + 7..])
        .and_then(|rest| {
            let q = rest.find(['\'', '"'])?;
            let rest = &rest[q + 1..];
            Some(&rest[..rest.find(['\'', '"'])?])
        })
        .ok_or("structured .npy arrays are not supported")?;
    let digits: String = descr.chars().filter(|c| c.is_ascii_digit()).collect();
    let item: u64 = digits
        .parse()
        .map_err(|_| format!("unsupported .npy dtype {descr:?}"))?;
    let want = element_count(&header)?
        .checked_mul(item)
        .ok_or("the .npy data size overflows")?;
    let data_start = b.len();
    f.take(want.saturating_add(1))
        .read_to_end(&mut b)
        .map_err(|e| e.to_string())?;
    if (b.len() - data_start) as u64 > want {
        // Not something numpy writes: a damaged or concatenated file.
        return Err(format!(
            "the .npy header's shape and dtype {descr:?} need {want} data bytes, but the file has more after them"
        ));
    }
    Ok(b)
}

/// Read an .npy file as f64.
pub fn read(path: &Path) -> Result<NpyArray> {
    let bytes = read_bounded(path).map_err(|e| Error::file(path, e))?;
    let (count, data_len) = precheck(&bytes).map_err(|e| Error::file(path, e))?;
    let f = NpyFile::new(&bytes[..]).map_err(|e| Error::file(path, e))?;
    let shape = f.shape().to_vec();
    let order = f.order();
    let DType::Plain(ts) = f.dtype() else {
        return Err(Error::file(
            path,
            "structured .npy arrays are not supported",
        ));
    };
    // Bytes past the array are not something numpy writes: a damaged or
    // concatenated file, refused rather than ignored.
    let want = count.saturating_mul(ts.size_field());
    if data_len != want {
        return Err(Error::file(
            path,
            format!(
                "the .npy shape {shape:?} of {ts} needs {want} data bytes, but the file has {data_len}"
            ),
        ));
    }
    let data = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 2) => convert(f, |v: f16| v.to_f64()),
        (TypeChar::Float, 4) => convert(f, |v: f32| v as f64),
        (TypeChar::Float, 8) => convert(f, |v: f64| v),
        (TypeChar::Int, 1) => convert(f, |v: i8| v as f64),
        (TypeChar::Int, 2) => convert(f, |v: i16| v as f64),
        (TypeChar::Int, 4) => convert(f, |v: i32| v as f64),
        (TypeChar::Int, 8) => convert(f, |v: i64| v as f64),
        (TypeChar::Uint, 1) => convert(f, |v: u8| v as f64),
        (TypeChar::Uint, 2) => convert(f, |v: u16| v as f64),
        (TypeChar::Uint, 4) => convert(f, |v: u32| v as f64),
        (TypeChar::Uint, 8) => convert(f, |v: u64| v as f64),
        (TypeChar::Bool, 1) => convert(f, |v: bool| v as u8 as f64),
        _ => {
            return Err(Error::file(
                path,
                format!(
                    "unsupported .npy dtype {}: a reference may be float16/32/64, int8-64, uint8-64 or bool",
                    kb_format::npy_descr_named(&ts.to_string())
                ),
            ));
        }
    }
    .map_err(|e| Error::file(path, e))?;
    let data = match order {
        Order::Fortran if shape.len() > 1 => fortran_to_c(&shape, &data),
        _ => data,
    };
    Ok(NpyArray { shape, data })
}

fn words<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N).map(|c| {
        let mut w = [0u8; N];
        w.copy_from_slice(c);
        w
    })
}

fn write_typed<T: npyz::Serialize>(
    path: &Path,
    descr: &str,
    shape: &[u64],
    vals: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    let ts: TypeStr = descr
        .parse()
        .map_err(|e| std::io::Error::other(format!("dtype {descr}: {e}")))?;
    let mut file = AtomicFile::create(path)?.remove_on_signal();
    let mut w = WriteOptions::<T>::new()
        .dtype(DType::Plain(ts))
        .shape(shape)
        .writer(&mut file)
        .begin_nd()?;
    w.extend(vals)?;
    w.finish()?;
    file.commit()
}

/// Write `bytes` (a tensor of `dtype` and `shape`, C order) as an .npy file.
pub fn write(path: &Path, dtype: Dtype, shape: &[u64], bytes: &[u8]) -> Result<()> {
    match dtype {
        Dtype::F32 => write_typed(
            path,
            "<f4",
            shape,
            words::<4>(bytes).map(f32::from_le_bytes),
        ),
        Dtype::F16 => write_typed(
            path,
            "<f2",
            shape,
            words::<2>(bytes).map(f16::from_le_bytes),
        ),
        Dtype::Bf16 => write_typed(
            path,
            "<f4",
            shape,
            words::<2>(bytes).map(|w| f32::from_bits((u16::from_le_bytes(w) as u32) << 16)),
        ),
        Dtype::I8 => write_typed(path, "|i1", shape, bytes.iter().map(|&b| b as i8)),
        Dtype::U8 => write_typed(path, "|u1", shape, bytes.iter().copied()),
        Dtype::I32 => write_typed(
            path,
            "<i4",
            shape,
            words::<4>(bytes).map(i32::from_le_bytes),
        ),
    }
    .map_err(|e| Error::file(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_for_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(Dtype, Vec<u8>, Vec<f64>); 6] = [
            (
                Dtype::F32,
                [1.5f32, -2.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                vec![1.5, -2.0],
            ),
            (Dtype::F16, vec![0x00, 0x3c, 0x00, 0xc0], vec![1.0, -2.0]),
            (
                Dtype::Bf16,
                vec![0x49, 0x40, 0x80, 0xbf],
                vec![3.140625, -1.0],
            ),
            (Dtype::I8, vec![0xff, 7], vec![-1.0, 7.0]),
            (Dtype::U8, vec![0xff, 7], vec![255.0, 7.0]),
            (
                Dtype::I32,
                [-9i32, 1 << 20]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                vec![-9.0, 1048576.0],
            ),
        ];
        for (d, bytes, want) in cases {
            let p = dir.path().join(format!("{d}.npy"));
            write(&p, d, &[1, 2], &bytes).unwrap();
            let a = read(&p).unwrap();
            assert_eq!(a.shape, [1, 2], "{d}");
            assert_eq!(a.data, want, "{d}");
        }
    }

    #[test]
    fn fortran_order_is_converted_to_c_order() {
        // 2x3 [[0,1,2],[3,4,5]] in Fortran order is 0,3,1,4,2,5.
        assert_eq!(
            fortran_to_c(&[2, 3], &[0., 3., 1., 4., 2., 5.]),
            [0., 1., 2., 3., 4., 5.]
        );
    }

    #[test]
    fn a_header_nested_deep_is_refused_before_npyz_parses_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        // 30 nested braces beside a valid shape.
        let mut header = format!(
            "{{'x': {}{}, 'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }}",
            "{".repeat(30),
            "}".repeat(30)
        );
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&[0u8; 16]);
        std::fs::write(&p, &b).unwrap();
        let t = std::time::Instant::now();
        let e = read(&p).unwrap_err().to_string();
        assert!(t.elapsed().as_secs() < 2, "{:?}", t.elapsed());
        assert!(e.contains("more than 8 deep"), "{e}");
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        write(&p, Dtype::F32, &[2, 2], &[0u8; 16]).unwrap();
        let good = std::fs::read(&p).unwrap();
        // A shape whose element count overflows, or exceeds the data.
        let text = String::from_utf8_lossy(&good).into_owned();
        for bad_shape in ["(99999999999, 99999999999)", "(1000, 1000)"] {
            // Keep the header length: take the extra characters from its padding.
            let extra = bad_shape.len() - "(2, 2, )".len();
            let evil = text
                .replacen("(2, 2, )", bad_shape, 1)
                .replacen(&" ".repeat(extra), "", 1);
            assert_eq!(evil.len(), text.len());
            std::fs::write(&p, evil.as_bytes()).unwrap();
            assert!(read(&p).is_err(), "{bad_shape}");
        }
        std::fs::write(&p, &good[..good.len() - 3]).unwrap();
        assert!(read(&p).is_err());
        // Trailing bytes (a file concatenated with another) are refused.
        let mut junk = good.clone();
        junk.extend_from_slice(b"junk");
        std::fs::write(&p, &junk).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(
            e.contains("need 16 data bytes, but the file has more after them"),
            "{e}"
        );
        std::fs::write(&p, b"not numpy").unwrap();
        assert!(read(&p).unwrap_err().to_string().contains("magic"));
        // A device that never ends is refused at its first bytes.
        let e = read(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("bad magic"), "{e}");
        assert!(read(&dir.path().join("missing.npy")).is_err());
    }

    /// A dtype a reference cannot be: named with its numpy name, and the
    /// ones accepted listed; an f64 reference reads.
    #[test]
    fn an_unsupported_dtype_is_named_with_what_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        write(&p, Dtype::F32, &[2, 2], &[0u8; 16]).unwrap();
        let good = std::fs::read(&p).unwrap();
        // The header's text changed in place (same lengths).
        let edit = |pairs: &[(&str, &str)]| {
            let mut b = good.clone();
            for (from, to) in pairs {
                let at = b
                    .windows(from.len())
                    .position(|w| w == from.as_bytes())
                    .unwrap();
                b[at..at + to.len()].copy_from_slice(to.as_bytes());
            }
            b
        };
        // '<f4' -> '<c8': the same 16 data bytes are two complex64.
        let c8 = edit(&[("'<f4'", "'<c8'"), ("(2, 2, )", "(2, 1, )")]);
        std::fs::write(&p, c8).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string())
                && e.contains(
                    "unsupported .npy dtype <c8 (complex64): a reference may be float16/32/64"
                ),
            "{e}"
        );
        let f8 = edit(&[("'<f4'", "'<f8'"), ("(2, 2, )", "(2, 1, )")]);
        std::fs::write(&p, f8).unwrap();
        assert_eq!(read(&p).unwrap().shape, vec![2, 1]);
    }
}
