//! GEMM replay: `out = op(a) x op(b) (+ acc)`.
//!
//! Operand bytes arrive concatenated in operand order (a, b, then acc when
//! `GemmParams::acc` is set). Conventions:
//!
//! - `a` is logically m x k and `b` k x n. A transposed operand is stored
//!   as its transpose (`a` as k x m, `b` as n x k); `layout_*` says whether
//!   the *stored* matrix is row- or column-major.
//! - `acc` and `out` are m x n in `layout_out`; `acc` is in `dtype_acc`,
//!   `out` in `dtype_out`.
//! - Arithmetic is in the accumulation dtype: f32 for `dtype_acc` f32 (and
//!   for f16/bf16, whose result is rounded through that precision before
//!   the output conversion); wrapping i32 for `dtype_acc` i32, which needs
//!   integer inputs. Other combinations are errors.
//!
//! The multiply itself is behind [`GemmBackend`], which sees row-major f32
//! or i32 matrices only, so a BLAS or batched backend can be swapped in.

use kb_format::{Dtype, GemmParams, Layout};

use crate::dtype;

/// Matrix sizes of one multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// A GEMM implementation: `c[m x n] += a[m x k] . b[k x n]`, every matrix
/// row-major and dense. Backends may reorder the k sum (results then differ
/// in the last bits, within the verification tolerances).
pub trait GemmBackend: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]);
    /// Integer GEMM with wrapping i32 arithmetic.
    fn gemm_i32(&self, d: Dims, a: &[i32], b: &[i32], c: &mut [i32]);
}

/// The default backend: straightforward loops (i, p, j order), summing k
/// in increasing order.
#[derive(Debug, Default, Clone, Copy)]
pub struct NaiveGemm;

impl GemmBackend for NaiveGemm {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        if d.n == 0 {
            return;
        }
        for (i, crow) in c.chunks_exact_mut(d.n).enumerate().take(d.m) {
            for p in 0..d.k {
                let av = a[i * d.k + p];
                let brow = &b[p * d.n..(p + 1) * d.n];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv += av * bv;
                }
            }
        }
    }

    fn gemm_i32(&self, d: Dims, a: &[i32], b: &[i32], c: &mut [i32]) {
        if d.n == 0 {
            return;
        }
        for (i, crow) in c.chunks_exact_mut(d.n).enumerate().take(d.m) {
            for p in 0..d.k {
                let av = a[i * d.k + p];
                let brow = &b[p * d.n..(p + 1) * d.n];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv = cv.wrapping_add(av.wrapping_mul(bv));
                }
            }
        }
    }
}

fn dims(p: &GemmParams) -> Option<(Dims, [usize; 3])> {
    let (m, k, n) = (p.m as usize, p.k as usize, p.n as usize);
    let mk = m.checked_mul(k)?;
    let kn = k.checked_mul(n)?;
    let mn = m.checked_mul(n)?;
    Some((Dims { m, k, n }, [mk, kn, mn]))
}

/// Bytes of the operands (a, b, acc), `None` on overflow.
pub fn input_len(p: &GemmParams) -> Option<u64> {
    let (_, [mk, kn, mn]) = dims(p)?;
    let s = p.dtype_in.size() as u64;
    let acc = if p.acc.is_some() {
        (mn as u64).checked_mul(p.dtype_acc.size() as u64)?
    } else {
        0
    };
    (mk as u64)
        .checked_add(kn as u64)?
        .checked_mul(s)?
        .checked_add(acc)
}

/// Bytes of the output, `None` on overflow.
pub fn output_len(p: &GemmParams) -> Option<u64> {
    let (_, [_, _, mn]) = dims(p)?;
    (mn as u64).checked_mul(p.dtype_out.size() as u64)
}

/// Floating-point operations (2mnk), saturating.
pub fn flops(p: &GemmParams) -> u64 {
    2u64.saturating_mul(p.m as u64)
        .saturating_mul(p.n as u64)
        .saturating_mul(p.k as u64)
}

/// The logical `rows x cols` matrix, row-major, from its stored form.
fn logical<T: Copy>(
    stored: Vec<T>,
    rows: usize,
    cols: usize,
    transpose: bool,
    layout: Layout,
) -> Vec<T> {
    // Stored dims; a transposed operand is stored as cols x rows.
    let (sr, sc) = if transpose {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let col_major = layout == Layout::ColMajor;
    if transpose == col_major {
        // Row-major untransposed, or column-major transposed: already the
        // logical row-major order.
        return stored;
    }
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let (r, c) = if transpose { (j, i) } else { (i, j) };
            let idx = if col_major { c * sr + r } else { r * sc + c };
            out.push(stored[idx]);
        }
    }
    out
}

/// Row-major m x n to `layout` order.
fn store<T: Copy>(c: &[T], m: usize, n: usize, layout: Layout) -> Vec<T> {
    match layout {
        Layout::RowMajor => c.to_vec(),
        Layout::ColMajor => (0..n)
            .flat_map(|j| (0..m).map(move |i| c[i * n + j]))
            .collect(),
    }
}

/// Run one GEMM on its concatenated operand bytes; returns the output bytes.
pub fn execute(p: &GemmParams, input: &[u8], backend: &dyn GemmBackend) -> Result<Vec<u8>, String> {
    let (d, [mk, kn, mn]) = dims(p).ok_or("gemm sizes overflow")?;
    let want = input_len(p).ok_or("gemm sizes overflow")?;
    if want != input.len() as u64 {
        return Err(format!(
            "gemm {}x{}x{} ({} in{}) needs {want} operand bytes, but its read ranges hold {}",
            p.m,
            p.k,
            p.n,
            p.dtype_in,
            if p.acc.is_some() {
                format!(", {} acc", p.dtype_acc)
            } else {
                String::new()
            },
            input.len()
        ));
    }
    let si = p.dtype_in.size();
    let (a, rest) = input.split_at(mk * si);
    let (b, acc) = rest.split_at(kn * si);
    let mut out = Vec::with_capacity(mn * p.dtype_out.size());
    match p.dtype_acc {
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 => {
            let a = logical(
                dtype::to_f32(p.dtype_in, a),
                d.m,
                d.k,
                p.transpose_a,
                p.layout_a,
            );
            let b = logical(
                dtype::to_f32(p.dtype_in, b),
                d.k,
                d.n,
                p.transpose_b,
                p.layout_b,
            );
            let mut c = if p.acc.is_some() {
                logical(
                    dtype::to_f32(p.dtype_acc, acc),
                    d.m,
                    d.n,
                    false,
                    p.layout_out,
                )
            } else {
                vec![0f32; mn]
            };
            backend.gemm_f32(d, &a, &b, &mut c);
            for v in store(&c, d.m, d.n, p.layout_out) {
                dtype::push_f32(p.dtype_out, dtype::round_f32(p.dtype_acc, v), &mut out);
            }
        }
        Dtype::I32 => {
            if !dtype::is_int(p.dtype_in) {
                return Err(format!(
                    "gemm with {} inputs cannot accumulate in i32",
                    p.dtype_in
                ));
            }
            let ints = |d: Dtype, b: &[u8]| -> Vec<i32> {
                dtype::to_i64(d, b).into_iter().map(|v| v as i32).collect()
            };
            let a = logical(ints(p.dtype_in, a), d.m, d.k, p.transpose_a, p.layout_a);
            let b = logical(ints(p.dtype_in, b), d.k, d.n, p.transpose_b, p.layout_b);
            let mut c = if p.acc.is_some() {
                logical(ints(Dtype::I32, acc), d.m, d.n, false, p.layout_out)
            } else {
                vec![0i32; mn]
            };
            backend.gemm_i32(d, &a, &b, &mut c);
            for v in store(&c, d.m, d.n, p.layout_out) {
                dtype::push_i64(p.dtype_out, v as i64, &mut out);
            }
        }
        other => return Err(format!("gemm cannot accumulate in {other}")),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::Addr;

    fn params(m: u32, k: u32, n: u32) -> GemmParams {
        GemmParams {
            a: Addr::default(),
            b: Addr::default(),
            out: Addr::default(),
            acc: None,
            m,
            k,
            n,
            dtype_in: Dtype::F32,
            dtype_acc: Dtype::F32,
            dtype_out: Dtype::F32,
            transpose_a: false,
            transpose_b: false,
            layout_a: Layout::RowMajor,
            layout_b: Layout::RowMajor,
            layout_out: Layout::RowMajor,
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn run(p: &GemmParams, parts: &[&[f32]]) -> Vec<f32> {
        let input: Vec<u8> = parts.iter().flat_map(|s| f32s(s)).collect();
        dtype::to_f32(Dtype::F32, &execute(p, &input, &NaiveGemm).unwrap())
    }

    // a = [[1,2,3],[4,5,6]] (2x3), b = [[7,8],[9,10],[11,12]] (3x2)
    // a.b = [[58,64],[139,154]] (by hand).
    const A: [f32; 6] = [1., 2., 3., 4., 5., 6.];
    const B: [f32; 6] = [7., 8., 9., 10., 11., 12.];
    const AB: [f32; 4] = [58., 64., 139., 154.];

    #[test]
    fn row_major_product_matches_hand_computation() {
        assert_eq!(run(&params(2, 3, 2), &[&A, &B]), AB);
    }

    #[test]
    fn transposes_and_layouts_give_the_same_product() {
        // a^T stored row-major (3x2) is a stored column-major (2x3).
        let at = [1., 4., 2., 5., 3., 6.];
        let bt = [7., 9., 11., 8., 10., 12.];
        let mut p = params(2, 3, 2);
        p.transpose_a = true;
        assert_eq!(run(&p, &[&at, &B]), AB);
        p.transpose_a = false;
        p.layout_a = Layout::ColMajor;
        assert_eq!(run(&p, &[&at, &B]), AB);
        p.layout_a = Layout::RowMajor;
        p.transpose_b = true;
        assert_eq!(run(&p, &[&A, &bt]), AB);
        p.transpose_b = false;
        p.layout_out = Layout::ColMajor;
        assert_eq!(run(&p, &[&A, &B]), [58., 139., 64., 154.]);
        // Transposed and column-major: stored n x k column-major = k x n row-major.
        p.layout_out = Layout::RowMajor;
        p.transpose_b = true;
        p.layout_b = Layout::ColMajor;
        assert_eq!(run(&p, &[&A, &B]), AB);
    }

    #[test]
    fn accumulator_is_added() {
        let mut p = params(2, 3, 2);
        p.acc = Some(Addr::default());
        assert_eq!(
            run(&p, &[&A, &B, &[1., -1., 0.5, 100.]]),
            [59., 63., 139.5, 254.]
        );
    }

    #[test]
    fn int8_accumulates_in_wrapping_i32() {
        let mut p = params(1, 2, 1);
        p.dtype_in = Dtype::I8;
        p.dtype_acc = Dtype::I32;
        p.dtype_out = Dtype::I32;
        let input = [(-128i8) as u8, 127, (-128i8) as u8, 127];
        let out = execute(&p, &input, &NaiveGemm).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I32, &out), [128 * 128 + 127 * 127]);
        // i8 output wraps.
        p.dtype_out = Dtype::I8;
        let out = execute(&p, &input, &NaiveGemm).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I8, &out), [(32513i32 as i8) as i64]);
    }

    #[test]
    fn size_and_dtype_errors_are_reported() {
        let p = params(2, 3, 2);
        let err = execute(&p, &[0u8; 10], &NaiveGemm).unwrap_err();
        assert!(err.contains("needs 48 operand bytes"), "{err}");
        let mut p = params(1, 1, 1);
        p.dtype_acc = Dtype::I32;
        assert!(
            execute(&p, &[0u8; 8], &NaiveGemm)
                .unwrap_err()
                .contains("i32")
        );
        p.dtype_acc = Dtype::U8;
        assert!(execute(&p, &[0u8; 8], &NaiveGemm).is_err());
        assert_eq!(flops(&params(2, 3, 4)), 48);
        assert_eq!(output_len(&params(u32::MAX, 1, u32::MAX)), None);
        assert_eq!(output_len(&params(3, 1, 5)), Some(60));
    }
}
