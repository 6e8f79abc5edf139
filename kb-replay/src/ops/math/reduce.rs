//! Reductions along an axis: the float ones (`sum`, `mean`, `reduce_max`,
//! `reduce_min`) read the tile where it lies, a block of each lane at a
//! time, and fold each lane in order from its first element in f64 (the
//! contract's order: the same bits as one element at a time); rows are
//! folded eight at a time, interleaved, so that eight independent chains
//! of additions are in flight rather than one. Integer reductions and the
//! arg reductions work on decoded matrices ([`Mat`]).

use kb_format::{Dtype, MathOp};

use super::kernels::BLOCK;
use super::{Mat, max_nan, min_nan};
use crate::dtype;

/// Rows folded together along axis 1.
const LANES: usize = 8;

/// Each row of the `rows x cols` tile `b` (elements of `d`) folded by `f`
/// in order from its first element.
// Indices, not iterators: element j of every lane, lane by lane.
#[allow(clippy::needless_range_loop)]
fn fold_rows(
    d: Dtype,
    b: &[u8],
    rows: usize,
    cols: usize,
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let es = d.size();
    let mut out = vec![0.0; rows];
    let mut blk = [[0.0f64; BLOCK]; LANES];
    for i0 in (0..rows).step_by(LANES) {
        let m = LANES.min(rows - i0);
        let mut acc = [0.0f64; LANES];
        let mut j0 = 0;
        while j0 < cols {
            let n = BLOCK.min(cols - j0);
            for (l, lane) in blk.iter_mut().enumerate().take(m) {
                let at = ((i0 + l) * cols + j0) * es;
                dtype::decode_f64(d, &b[at..], &mut lane[..n]);
            }
            let first = if j0 == 0 {
                for l in 0..m {
                    acc[l] = blk[l][0];
                }
                1
            } else {
                0
            };
            for j in first..n {
                // Lanes past `m` fold stale values into accumulators that
                // are never read.
                for l in 0..LANES {
                    acc[l] = f(acc[l], blk[l][j]);
                }
            }
            j0 += n;
        }
        out[i0..i0 + m].copy_from_slice(&acc[..m]);
    }
    out
}

/// Each column of the `rows x cols` tile `b` folded by `f` in order from
/// its first element.
fn fold_cols(
    d: Dtype,
    b: &[u8],
    rows: usize,
    cols: usize,
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let es = d.size();
    let mut out = vec![0.0; cols];
    let mut blk = [0.0f64; BLOCK];
    let mut j0 = 0;
    while j0 < cols {
        let n = BLOCK.min(cols - j0);
        let acc = &mut out[j0..j0 + n];
        dtype::decode_f64(d, &b[j0 * es..], acc);
        for i in 1..rows {
            dtype::decode_f64(d, &b[(i * cols + j0) * es..], &mut blk[..n]);
            for (a, &v) in acc.iter_mut().zip(&blk[..n]) {
                *a = f(*a, v);
            }
        }
        j0 += n;
    }
    out
}

/// `sum`, `mean`, `reduce_max` or `reduce_min` of a `rows x cols` tile
/// (`rows`, `cols` > 0) along `axis`, in f64: the values before rounding
/// to the output dtype.
pub(super) fn float_reduce(
    op: MathOp,
    d: Dtype,
    b: &[u8],
    rows: usize,
    cols: usize,
    axis: u8,
) -> Vec<f64> {
    match op {
        MathOp::ReduceMax => fold(axis, d, b, rows, cols, max_nan),
        MathOp::ReduceMin => fold(axis, d, b, rows, cols, min_nan),
        MathOp::Mean => {
            let n = if axis == 0 { rows } else { cols } as f64;
            let mut v = fold(axis, d, b, rows, cols, |a, b| a + b);
            v.iter_mut().for_each(|s| *s /= n);
            v
        }
        _ => fold(axis, d, b, rows, cols, |a, b| a + b),
    }
}

/// Each lane along `axis` folded by `f` (a function item or closure, so
/// each fold gets its own loop).
fn fold(
    axis: u8,
    d: Dtype,
    b: &[u8],
    rows: usize,
    cols: usize,
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    if axis == 0 {
        fold_cols(d, b, rows, cols, f)
    } else {
        fold_rows(d, b, rows, cols, f)
    }
}

pub(super) fn reduce<T: Copy>(x: &Mat<T>, axis: u8, f: impl Fn(T, T) -> T) -> Vec<T> {
    if axis == 0 {
        (0..x.cols)
            .map(|j| (1..x.rows).fold(x.data[j], |acc, i| f(acc, x.data[i * x.cols + j])))
            .collect()
    } else {
        x.data
            .chunks_exact(x.cols)
            .map(|row| row[1..].iter().fold(row[0], |acc, &v| f(acc, v)))
            .collect()
    }
}

/// Index along `axis` of the first element `better` than every earlier one
/// in each lane; a NaN beats everything and is never beaten.
pub(super) fn arg_reduce(x: &Mat<f64>, axis: u8, better: fn(f64, f64) -> bool) -> Vec<i64> {
    let pick = |lane: &mut dyn Iterator<Item = f64>| {
        let mut best = (0i64, f64::NAN);
        for (i, v) in lane.enumerate() {
            if i == 0 || (!best.1.is_nan() && (v.is_nan() || better(v, best.1))) {
                best = (i as i64, v);
            }
        }
        best.0
    };
    if axis == 0 {
        (0..x.cols)
            .map(|j| pick(&mut (0..x.rows).map(|i| x.data[i * x.cols + j])))
            .collect()
    } else {
        x.data
            .chunks_exact(x.cols)
            .map(|row| pick(&mut row.iter().copied()))
            .collect()
    }
}
