//! Math op replay: elementwise, comparisons, where, cast/copy and
//! reductions over tiles.
//!
//! Tile inputs arrive concatenated in input order (`rows x cols` row-major
//! elements of their dtype each); scalar inputs are immediates and take no
//! bytes. The output is `rows x cols` of `dtype`.
//!
//! - Elementwise ops broadcast: an input of 1 x cols repeats across rows,
//!   rows x 1 across columns, 1 x 1 (or a scalar) everywhere.
//! - `where` takes (cond, a, b): a where cond is non-zero (NaN counts as
//!   non-zero), else b; cond may have any dtype (a u8 mask, typically).
//! - Comparisons (`lt` `le` `gt` `ge` `eq` `ne`) write a u8 mask of 0/1
//!   and need a u8 output. They compare exact values (every dtype decodes
//!   exactly to f64); NaN compares false, except `ne`, true.
//! - Reductions reduce one tile along `axis` 0 (over rows, giving 1 x cols)
//!   or 1 (over columns, giving rows x 1); the output may be declared as
//!   either vector orientation. `sum` adds in order from the lane's first
//!   element, in f64; `mean` is that sum divided by the lane length, and
//!   needs a float output. `argmax`/`argmin` write the i32 index along the
//!   axis of the first maximum/minimum (ties: the lowest index); a NaN
//!   counts as both the largest and the smallest value, so the first NaN
//!   wins (numpy's rule, consistent with `reduce_max` giving NaN).
//! - Values are computed in f64 and rounded once to the output dtype. When
//!   the output and every input are integers (and scalars integral), add,
//!   sub, mul, max, min, abs, neg, where, cast, copy, sum, reduce_max and
//!   reduce_min use wrapping i64 arithmetic instead, wrapped to the output
//!   width like numpy (abs of i8 -128 is -128). Maximum and minimum (and
//!   their reductions) propagate NaN, as numpy's do.
//! - `sigmoid`, `tanh`, `erf` and `exp2` need float inputs and a float
//!   output. `exp`, `log`, `erf`, `tanh`, `sigmoid` and `rsqrt` are
//!   [`fmath`]'s, within 1 to 4 f64 ulps of the exact value (its table),
//!   the same bits on every CPU; `sqrt` is IEEE's, `exp2` std's.
//! - Float elementwise ops run one loop per op over the whole tile (row
//!   and column broadcasts expanded first), which the compiler vectorises;
//!   the result does not depend on how the tile is cut or on threads.
//! - `arange` takes no inputs: each element is its index along `axis` (0:
//!   its row, 1: its column), rounded to the output dtype.
//! - `copy`/`cast` between equal dtypes and shapes copy bytes verbatim.
//! - `and`, `or`, `xor` and `not` treat non-zero (NaN included) as true and
//!   write a u8 0/1 mask. `pow`, `log2`, `sin` and `cos` need floats and
//!   use std's f64 functions. `floor`, `ceil` and `clamp` (x, lo, hi:
//!   `min(max(x, lo), hi)`, NaN propagating) keep integers in i64. `rem`
//!   is C's `fmod` in f64 (the sign of the dividend; integers exactly).
//! - `transpose`, `reshape`, `slice` (a tile, then its first row and
//!   column as scalars) and `concat` move bytes (the input's dtype);
//!   `cumsum`, `cumprod` and `cummax` scan along `axis` in f64 (wrapping
//!   i64 for integers), each running value rounded once; `rand` writes the
//!   f32 [`kb_format::philox::rand`] of integer offsets (mod 2^32) under
//!   the seed given as two scalar words.

use kb_format::{Dtype, MathInput, MathOp, MathParams};

use super::fmath;
use crate::dtype;

/// A dense row-major matrix of values.
#[derive(Debug, Clone)]
struct Mat<T> {
    rows: usize,
    cols: usize,
    data: Vec<T>,
}

impl<T: Copy> Mat<T> {
    /// Element (i, j) of the broadcast matrix.
    fn at(&self, i: usize, j: usize) -> T {
        let r = if self.rows == 1 { 0 } else { i };
        let c = if self.cols == 1 { 0 } else { j };
        self.data[r * self.cols + c]
    }
}

fn op_name(op: MathOp) -> &'static str {
    op.name()
}

fn arity(op: MathOp) -> usize {
    match op {
        MathOp::Add | MathOp::Sub | MathOp::Mul | MathOp::Div | MathOp::Max | MathOp::Min => 2,
        op if is_comparison(op) => 2,
        MathOp::And | MathOp::Or | MathOp::Xor | MathOp::Pow | MathOp::Rem | MathOp::Concat => 2,
        MathOp::Where | MathOp::Clamp | MathOp::Slice | MathOp::Rand => 3,
        MathOp::Arange => 0,
        _ => 1,
    }
}

fn is_reduction(op: MathOp) -> bool {
    matches!(
        op,
        MathOp::Sum
            | MathOp::ReduceMax
            | MathOp::ReduceMin
            | MathOp::Mean
            | MathOp::ArgMax
            | MathOp::ArgMin
    )
}

/// Ops that move or scan a whole tile rather than map elements
/// (see [`structural`]).
fn is_structural(op: MathOp) -> bool {
    matches!(
        op,
        MathOp::Transpose
            | MathOp::Reshape
            | MathOp::Slice
            | MathOp::Concat
            | MathOp::Cumsum
            | MathOp::Cumprod
            | MathOp::Cummax
            | MathOp::Rand
    )
}

fn is_logical(op: MathOp) -> bool {
    matches!(op, MathOp::And | MathOp::Or | MathOp::Xor | MathOp::Not)
}

fn is_comparison(op: MathOp) -> bool {
    matches!(
        op,
        MathOp::Lt | MathOp::Le | MathOp::Gt | MathOp::Ge | MathOp::Eq | MathOp::Ne
    )
}

/// Ops defined on floats only (no integer meaning worth guessing).
fn needs_float(op: MathOp) -> bool {
    matches!(
        op,
        MathOp::Sigmoid
            | MathOp::Tanh
            | MathOp::Erf
            | MathOp::Exp2
            | MathOp::Pow
            | MathOp::Log2
            | MathOp::Sin
            | MathOp::Cos
    )
}

fn tile_len(rows: u32, cols: u32, d: Dtype) -> Option<u64> {
    (rows as u64)
        .checked_mul(cols as u64)?
        .checked_mul(d.size() as u64)
}

/// Bytes of the tile inputs, `None` on overflow.
pub fn input_len(p: &MathParams) -> Option<u64> {
    p.inputs.iter().try_fold(0u64, |acc, i| match *i {
        MathInput::Tile {
            rows, cols, dtype, ..
        } => acc.checked_add(tile_len(rows, cols, dtype)?),
        MathInput::Scalar(_) => Some(acc),
    })
}

/// Bytes of the output, `None` on overflow.
pub fn output_len(p: &MathParams) -> Option<u64> {
    tile_len(p.rows, p.cols, p.dtype)
}

enum Operand<'a> {
    Tile {
        rows: usize,
        cols: usize,
        dtype: Dtype,
        bytes: &'a [u8],
    },
    Scalar(f64),
}

impl Operand<'_> {
    fn shape(&self) -> (usize, usize) {
        match *self {
            Operand::Tile { rows, cols, .. } => (rows, cols),
            Operand::Scalar(_) => (1, 1),
        }
    }

    fn f64s(&self) -> Mat<f64> {
        match *self {
            Operand::Tile {
                rows,
                cols,
                dtype,
                bytes,
            } => Mat {
                rows,
                cols,
                data: dtype::to_f64(dtype, bytes),
            },
            Operand::Scalar(v) => Mat {
                rows: 1,
                cols: 1,
                data: vec![v],
            },
        }
    }

    fn i64s(&self) -> Mat<i64> {
        match *self {
            Operand::Tile {
                rows,
                cols,
                dtype,
                bytes,
            } => Mat {
                rows,
                cols,
                data: dtype::to_i64(dtype, bytes),
            },
            Operand::Scalar(v) => Mat {
                rows: 1,
                cols: 1,
                data: vec![v as i64],
            },
        }
    }

    /// Integer-valued (an integer tile or an integral scalar).
    fn is_integral(&self) -> bool {
        match *self {
            Operand::Tile { dtype, .. } => dtype::is_int(dtype),
            Operand::Scalar(v) => v.fract() == 0.0 && v.abs() < 9.0e15,
        }
    }
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn truth(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// Index along `axis` of the first element `better` than every earlier one
/// in each lane; a NaN beats everything and is never beaten.
fn arg_reduce(x: &Mat<f64>, axis: u8, better: fn(f64, f64) -> bool) -> Vec<i64> {
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

fn elementwise<T: Copy>(ins: &[Mat<T>], rows: usize, cols: usize, f: impl Fn(&[T]) -> T) -> Vec<T> {
    let count = rows * cols;
    // Every input a 1 x 1 (a fill): one value, repeated.
    if ins.iter().all(|m| m.data.len() == 1) {
        let args: Vec<T> = ins.iter().map(|m| m.data[0]).collect();
        return if count == 0 {
            Vec::new()
        } else {
            vec![f(&args); count]
        };
    }
    // Every input full-size or 1 x 1: no row/column broadcasting.
    if ins
        .iter()
        .all(|m| m.data.len() == count || m.data.len() == 1)
    {
        let mut args: Vec<T> = ins.iter().map(|m| m.data[0]).collect();
        return (0..count)
            .map(|i| {
                for (a, m) in args.iter_mut().zip(ins) {
                    if m.data.len() == count {
                        *a = m.data[i];
                    }
                }
                f(&args)
            })
            .collect();
    }
    let mut out = Vec::with_capacity(count);
    let mut args = Vec::with_capacity(ins.len());
    for i in 0..rows {
        for j in 0..cols {
            args.clear();
            args.extend(ins.iter().map(|m| m.at(i, j)));
            out.push(f(&args));
        }
    }
    out
}

/// An operand of the float elementwise kernels: one value per output
/// element (a row or column broadcast expanded), or one value for all;
/// lanes of f64 or f32.
enum Arg<T> {
    Full(Vec<T>),
    One(T),
}

impl<T: Copy> Arg<T> {
    /// `o` decoded by `decode` (a tile) or `scalar` (a scalar).
    fn of(
        o: &Operand,
        rows: usize,
        cols: usize,
        decode: fn(Dtype, &[u8]) -> Vec<T>,
        scalar: fn(f64) -> T,
    ) -> Arg<T> {
        match *o {
            Operand::Scalar(v) => Arg::One(scalar(v)),
            Operand::Tile {
                rows: r,
                cols: c,
                dtype,
                bytes,
            } => {
                let v = decode(dtype, bytes);
                if (r, c) == (rows, cols) {
                    Arg::Full(v)
                } else if (r, c) == (1, 1) {
                    Arg::One(v[0])
                } else if r == 1 {
                    // A row, repeated down the rows.
                    Arg::Full(v.repeat(rows))
                } else {
                    // A column, repeated across each row.
                    let mut full = Vec::with_capacity(rows * cols);
                    for &x in &v {
                        full.extend(std::iter::repeat_n(x, cols));
                    }
                    Arg::Full(full)
                }
            }
        }
    }

    fn full(self, count: usize) -> Vec<T> {
        match self {
            Arg::Full(v) => v,
            Arg::One(x) => vec![x; count],
        }
    }
}

// The kernels below take the operation as a closure type, so each op gets
// its own loop (monomorphised, the operation inlined, no branch inside):
// the compiler vectorises them.

/// `f` of a whole slice in place (for [`fmath`]'s large functions, whose
/// loops are their own).
fn map1_slice(x: Arg<f64>, count: usize, f: fn(&mut [f64])) -> Vec<f64> {
    let mut v = x.full(count);
    f(&mut v);
    v
}

fn map1<T: Copy>(x: Arg<T>, count: usize, f: impl Fn(T) -> T) -> Vec<T> {
    match x {
        Arg::Full(mut v) => {
            for e in &mut v {
                *e = f(*e);
            }
            v
        }
        Arg::One(a) => vec![f(a); count],
    }
}

fn map2<T: Copy>(a: &Arg<T>, b: &Arg<T>, count: usize, f: impl Fn(T, T) -> T) -> Vec<T> {
    match (a, b) {
        (Arg::Full(a), Arg::Full(b)) => a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect(),
        (Arg::Full(a), &Arg::One(y)) => a.iter().map(|&x| f(x, y)).collect(),
        (&Arg::One(x), Arg::Full(b)) => b.iter().map(|&y| f(x, y)).collect(),
        (&Arg::One(x), &Arg::One(y)) => vec![f(x, y); count],
    }
}

/// The f32 lanes: ops whose f32 result is the f64 path's, bit for bit,
/// when the output is f32 (a u8 mask for comparisons) and every input is
/// exact in f32 (f32, f16, bf16, i8 or u8 tiles; scalars that f32 holds
/// exactly), so that the f64 contract costs nothing where it need not. Add,
/// sub, mul, div and sqrt of f32 values in f32 are correctly rounded, and
/// so is their f64 result rounded to f32: f64 carries more than 2 x 24 + 2
/// bits, which makes the double rounding innocuous (Figueroa, 1995); max,
/// min, abs, neg, comparisons and where are exact. `None`: the f64 path.
fn f32_lanes(p: &MathParams, ops: &[Operand], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let op = p.op;
    let exact = matches!(
        op,
        MathOp::Add
            | MathOp::Sub
            | MathOp::Mul
            | MathOp::Div
            | MathOp::Max
            | MathOp::Min
            | MathOp::Abs
            | MathOp::Neg
            | MathOp::Sqrt
            | MathOp::Where
    ) || is_comparison(op);
    let out_ok = if is_comparison(op) {
        p.dtype == Dtype::U8
    } else {
        p.dtype == Dtype::F32
    };
    if !exact || !out_ok || !cfg!(target_endian = "little") {
        return None;
    }
    // Every value exact in f32; where's condition tile only needs its
    // zeros kept, which an i32 tile does too (a scalar condition such as
    // 1e-50 would not: it must be exact like the rest).
    let in_f32 = |(k, o): (usize, &Operand)| match *o {
        Operand::Tile { dtype, .. } => dtype != Dtype::I32 || (op == MathOp::Where && k == 0),
        Operand::Scalar(v) => v.is_nan() || v as f32 as f64 == v,
    };
    if !ops.iter().enumerate().all(in_f32) {
        return None;
    }
    let count = rows * cols;
    let mut args: Vec<Arg<f32>> = ops
        .iter()
        .map(|o| Arg::of(o, rows, cols, dtype::to_f32, |v| v as f32))
        .collect();
    let truth32 = |b: bool| if b { 1.0f32 } else { 0.0 };
    let vals = if op == MathOp::Where {
        let b = args.pop()?.full(count);
        let a = args.pop()?.full(count);
        let c = args.pop()?.full(count);
        c.iter()
            .zip(a.iter().zip(&b))
            .map(|(&c, (&a, &b))| if c != 0.0 { a } else { b })
            .collect()
    } else if args.len() == 2 {
        let (a, b) = (&args[0], &args[1]);
        let max32 = |x: f32, y: f32| {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.max(y)
            }
        };
        let min32 = |x: f32, y: f32| {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.min(y)
            }
        };
        match op {
            MathOp::Add => map2(a, b, count, |x, y| x + y),
            MathOp::Sub => map2(a, b, count, |x, y| x - y),
            MathOp::Mul => map2(a, b, count, |x, y| x * y),
            MathOp::Div => map2(a, b, count, |x, y| x / y),
            MathOp::Max => map2(a, b, count, max32),
            MathOp::Min => map2(a, b, count, min32),
            MathOp::Lt => map2(a, b, count, |x, y| truth32(x < y)),
            MathOp::Le => map2(a, b, count, |x, y| truth32(x <= y)),
            MathOp::Gt => map2(a, b, count, |x, y| truth32(x > y)),
            MathOp::Ge => map2(a, b, count, |x, y| truth32(x >= y)),
            MathOp::Eq => map2(a, b, count, |x, y| truth32(x == y)),
            _ => map2(a, b, count, |x, y| truth32(x != y)),
        }
    } else {
        let x = args.pop()?;
        match op {
            MathOp::Abs => map1(x, count, |v| v.abs()),
            MathOp::Neg => map1(x, count, |v| -v),
            _ => map1(x, count, |v| v.sqrt()),
        }
    };
    Some(if p.dtype == Dtype::U8 {
        vals.iter().map(|&v| v as u8).collect()
    } else if cfg!(target_endian = "little") {
        bytemuck::cast_slice(&vals).to_vec()
    } else {
        let mut out = vec![0u8; count * 4];
        dtype::put_words(&mut out, &vals, f32::to_le_bytes);
        out
    })
}

/// The float elementwise ops (the values of a `rows x cols` output, before
/// rounding to its dtype), the operation chosen once per tile.
fn float_elementwise(op: MathOp, ops: &[Operand], rows: usize, cols: usize) -> Vec<f64> {
    let count = rows * cols;
    let mut args: Vec<Arg<f64>> = ops
        .iter()
        .map(|o| Arg::of(o, rows, cols, dtype::to_f64, |v| v))
        .collect();
    if op == MathOp::Where {
        let b = args.pop().map_or_else(Vec::new, |a| a.full(count));
        let a = args.pop().map_or_else(Vec::new, |a| a.full(count));
        let c = args.pop().map_or_else(Vec::new, |a| a.full(count));
        return c
            .iter()
            .zip(a.iter().zip(&b))
            .map(|(&c, (&a, &b))| if c != 0.0 { a } else { b })
            .collect();
    }
    if op == MathOp::Clamp {
        let hi = args.pop().map_or_else(Vec::new, |a| a.full(count));
        let lo = args.pop().map_or_else(Vec::new, |a| a.full(count));
        let x = args.pop().map_or_else(Vec::new, |a| a.full(count));
        return x
            .iter()
            .zip(lo.iter().zip(&hi))
            .map(|(&x, (&lo, &hi))| min_nan(max_nan(x, lo), hi))
            .collect();
    }
    if args.len() == 2 {
        let (a, b) = (&args[0], &args[1]);
        return match op {
            MathOp::And => map2(a, b, count, |x, y| truth(x != 0.0 && y != 0.0)),
            MathOp::Or => map2(a, b, count, |x, y| truth(x != 0.0 || y != 0.0)),
            MathOp::Xor => map2(a, b, count, |x, y| truth((x != 0.0) != (y != 0.0))),
            MathOp::Pow => map2(a, b, count, f64::powf),
            // C's fmod: the sign of the dividend.
            MathOp::Rem => map2(a, b, count, |x, y| x % y),
            MathOp::Add => map2(a, b, count, |x, y| x + y),
            MathOp::Sub => map2(a, b, count, |x, y| x - y),
            MathOp::Mul => map2(a, b, count, |x, y| x * y),
            MathOp::Div => map2(a, b, count, |x, y| x / y),
            MathOp::Max => map2(a, b, count, max_nan),
            MathOp::Min => map2(a, b, count, min_nan),
            MathOp::Lt => map2(a, b, count, |x, y| truth(x < y)),
            MathOp::Le => map2(a, b, count, |x, y| truth(x <= y)),
            MathOp::Gt => map2(a, b, count, |x, y| truth(x > y)),
            MathOp::Ge => map2(a, b, count, |x, y| truth(x >= y)),
            MathOp::Eq => map2(a, b, count, |x, y| truth(x == y)),
            MathOp::Ne => map2(a, b, count, |x, y| truth(x != y)),
            _ => map2(a, b, count, |x, _| x),
        };
    }
    let Some(x) = args.pop() else {
        return Vec::new();
    };
    match op {
        MathOp::Exp => map1_slice(x, count, fmath::exp_in_place),
        MathOp::Log => map1_slice(x, count, fmath::log_in_place),
        MathOp::Sqrt => map1(x, count, |v| v.sqrt()),
        MathOp::Rsqrt => map1_slice(x, count, fmath::rsqrt_in_place),
        MathOp::Abs => map1(x, count, |v| v.abs()),
        MathOp::Neg => map1(x, count, |v| -v),
        MathOp::Sigmoid => map1_slice(x, count, fmath::sigmoid_in_place),
        MathOp::Tanh => map1_slice(x, count, fmath::tanh_in_place),
        MathOp::Erf => map1_slice(x, count, fmath::erf_in_place),
        MathOp::Exp2 => map1(x, count, |v| v.exp2()),
        MathOp::Not => map1(x, count, |v| truth(v == 0.0)),
        MathOp::Log2 => map1(x, count, f64::log2),
        MathOp::Sin => map1(x, count, f64::sin),
        MathOp::Cos => map1(x, count, f64::cos),
        MathOp::Floor => map1(x, count, f64::floor),
        MathOp::Ceil => map1(x, count, f64::ceil),
        // copy and cast: the values, rounded to the output dtype by the caller.
        _ => x.full(count),
    }
}

fn reduce<T: Copy>(x: &Mat<T>, axis: u8, f: impl Fn(T, T) -> T) -> Vec<T> {
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

/// The dtype rules of ops that have them (see the module docs).
fn check_dtypes(p: &MathParams, ops: &[Operand]) -> Result<(), String> {
    let name = op_name(p.op);
    let need_out = |want: Dtype, what: &str| {
        if p.dtype == want {
            Ok(())
        } else {
            Err(format!(
                "math {name} writes {what} ({want}), but the record's output dtype is {}",
                p.dtype
            ))
        }
    };
    if is_comparison(p.op) || is_logical(p.op) {
        need_out(Dtype::U8, "a 0/1 mask")?;
    }
    if matches!(p.op, MathOp::ArgMax | MathOp::ArgMin) {
        need_out(Dtype::I32, "indices")?;
    }
    let float_only = needs_float(p.op);
    if (float_only || p.op == MathOp::Mean) && dtype::is_int(p.dtype) {
        return Err(format!(
            "math {name} needs a float output dtype (f32, f16 or bf16), not {}",
            p.dtype
        ));
    }
    if float_only {
        for (k, o) in ops.iter().enumerate() {
            if let Operand::Tile { dtype, .. } = *o
                && dtype::is_int(dtype)
            {
                return Err(format!(
                    "math {name} is defined for float inputs, but input {k} is {dtype}"
                ));
            }
        }
    }
    Ok(())
}

/// Run one math op on its concatenated tile bytes; returns the output bytes.
pub fn execute(p: &MathParams, input: &[u8]) -> Result<Vec<u8>, String> {
    let name = op_name(p.op);
    if p.inputs.len() != arity(p.op) {
        return Err(format!(
            "math {name} takes {} inputs, but the record gives {}",
            arity(p.op),
            p.inputs.len()
        ));
    }
    let want = input_len(p).ok_or("math tile sizes overflow")?;
    if want != input.len() as u64 {
        return Err(format!(
            "math {name} needs {want} input bytes, but its read ranges hold {}",
            input.len()
        ));
    }
    let (rows, cols) = (p.rows as usize, p.cols as usize);
    let count = rows.checked_mul(cols).ok_or("math output size overflows")?;
    let mut pos = 0usize;
    let mut ops = Vec::with_capacity(p.inputs.len());
    for i in &p.inputs {
        ops.push(match *i {
            MathInput::Tile {
                rows, cols, dtype, ..
            } => {
                let n = rows as usize * cols as usize * dtype.size();
                let bytes = &input[pos..pos + n];
                pos += n;
                Operand::Tile {
                    rows: rows as usize,
                    cols: cols as usize,
                    dtype,
                    bytes,
                }
            }
            MathInput::Scalar(v) => Operand::Scalar(v),
        });
    }

    if p.op == MathOp::Arange {
        let idx: Vec<i64> = match p.axis {
            Some(0) => (0..rows)
                .flat_map(|i| std::iter::repeat_n(i as i64, cols))
                .collect(),
            Some(1) => (0..rows).flat_map(|_| 0..cols as i64).collect(),
            a => return Err(format!("math {name} needs axis 0 or 1, not {a:?}")),
        };
        let mut out = Vec::with_capacity(count * p.dtype.size());
        if dtype::is_int(p.dtype) {
            dtype::extend_i64(p.dtype, &idx, &mut out);
        } else {
            let v: Vec<f64> = idx.iter().map(|&i| i as f64).collect();
            dtype::extend_f64(p.dtype, &v, &mut out);
        }
        return Ok(out);
    }

    if is_structural(p.op) {
        return structural(p, &ops);
    }

    if is_reduction(p.op) {
        let axis = p.axis.ok_or_else(|| format!("math {name} has no axis"))?;
        let (ir, ic) = ops[0].shape();
        let n = match axis {
            0 => ic,
            1 => ir,
            a => return Err(format!("math {name} axis {a} is not 0 or 1")),
        };
        if ir == 0 || ic == 0 {
            return Err(format!("math {name} of an empty {ir} x {ic} tile"));
        }
        if count != n || (rows != 1 && cols != 1) {
            return Err(format!(
                "math {name} along axis {axis} of a {ir} x {ic} tile gives {n} values, \
                 but the output is {rows} x {cols}"
            ));
        }
    } else {
        for (k, o) in ops.iter().enumerate() {
            let (r, c) = o.shape();
            if !((r == rows || r == 1) && (c == cols || c == 1)) {
                return Err(format!(
                    "math {name} input {k} is {r} x {c}, which does not broadcast to the \
                     {rows} x {cols} output"
                ));
            }
        }
    }

    check_dtypes(p, &ops)?;

    // Only scalar inputs (a fill): one value, repeated.
    if !is_reduction(p.op) && count > 1 && ops.iter().all(|o| matches!(o, Operand::Scalar(_))) {
        let one = MathParams {
            rows: 1,
            cols: 1,
            ..p.clone()
        };
        return Ok(execute(&one, input)?.repeat(count));
    }

    // Verbatim copy between equal dtypes and shapes.
    if matches!(p.op, MathOp::Copy | MathOp::Cast)
        && let Operand::Tile {
            rows: r,
            cols: c,
            dtype,
            bytes,
        } = ops[0]
        && dtype == p.dtype
        && (r, c) == (rows, cols)
    {
        return Ok(bytes.to_vec());
    }

    // f32 <-> f16 casts through half's slice conversion (F16C where the
    // CPU has it): the bits of the f64 path for every input (checked over
    // all 2^32 f32 values and all 2^16 f16 ones).
    if matches!(p.op, MathOp::Copy | MathOp::Cast)
        && let Operand::Tile {
            rows: r,
            cols: c,
            dtype,
            bytes,
        } = ops[0]
        && (r, c) == (rows, cols)
        && let Some(out) = dtype::convert_f32_f16(dtype, p.dtype, bytes)
    {
        return Ok(out);
    }

    if !is_reduction(p.op)
        && let Some(out) = f32_lanes(p, &ops, rows, cols)
    {
        return Ok(out);
    }

    let mut out = Vec::with_capacity(count * p.dtype.size());
    let axis = p.axis.unwrap_or(0);
    let int_op = matches!(
        p.op,
        MathOp::Add
            | MathOp::Sub
            | MathOp::Mul
            | MathOp::Max
            | MathOp::Min
            | MathOp::Abs
            | MathOp::Neg
            | MathOp::Where
            | MathOp::Cast
            | MathOp::Copy
            | MathOp::Sum
            | MathOp::ReduceMax
            | MathOp::ReduceMin
            | MathOp::Floor
            | MathOp::Ceil
            | MathOp::Clamp
    );
    if matches!(p.op, MathOp::ArgMax | MathOp::ArgMin) {
        // Every dtype decodes exactly to f64, so comparing there is exact.
        let x = ops[0].f64s();
        let idx = if p.op == MathOp::ArgMax {
            arg_reduce(&x, axis, |v, best| v > best)
        } else {
            arg_reduce(&x, axis, |v, best| v < best)
        };
        dtype::extend_i64(p.dtype, &idx, &mut out);
    } else if int_op && dtype::is_int(p.dtype) && ops.iter().all(Operand::is_integral) {
        let ins: Vec<Mat<i64>> = ops.iter().map(Operand::i64s).collect();
        let vals = match p.op {
            MathOp::Sum => reduce(&ins[0], axis, i64::wrapping_add),
            MathOp::ReduceMax => reduce(&ins[0], axis, i64::max),
            MathOp::ReduceMin => reduce(&ins[0], axis, i64::min),
            op => elementwise(&ins, rows, cols, |a| match op {
                MathOp::Add => a[0].wrapping_add(a[1]),
                MathOp::Sub => a[0].wrapping_sub(a[1]),
                MathOp::Mul => a[0].wrapping_mul(a[1]),
                MathOp::Max => a[0].max(a[1]),
                MathOp::Min => a[0].min(a[1]),
                MathOp::Abs => a[0].wrapping_abs(),
                MathOp::Neg => a[0].wrapping_neg(),
                MathOp::Where => {
                    if a[0] != 0 {
                        a[1]
                    } else {
                        a[2]
                    }
                }
                MathOp::Clamp => a[0].max(a[1]).min(a[2]),
                _ => a[0],
            }),
        };
        dtype::extend_i64(p.dtype, &vals, &mut out);
    } else {
        let ins: Vec<Mat<f64>> = if is_reduction(p.op) {
            ops.iter().map(Operand::f64s).collect()
        } else {
            Vec::new()
        };
        let vals = match p.op {
            MathOp::Sum => reduce(&ins[0], axis, |a, b| a + b),
            MathOp::ReduceMax => reduce(&ins[0], axis, max_nan),
            MathOp::ReduceMin => reduce(&ins[0], axis, min_nan),
            MathOp::Mean => {
                let n = if axis == 0 { ins[0].rows } else { ins[0].cols } as f64;
                let mut v = reduce(&ins[0], axis, |a, b| a + b);
                v.iter_mut().for_each(|s| *s /= n);
                v
            }
            op => float_elementwise(op, &ops, rows, cols),
        };
        dtype::extend_f64(p.dtype, &vals, &mut out);
    }
    Ok(out)
}

/// A scalar input that must be a whole number in `[0, 2^32)`.
fn word(o: &Operand, name: &str, what: &str) -> Result<u32, String> {
    match *o {
        Operand::Scalar(v) if v.fract() == 0.0 && (0.0..4_294_967_296.0).contains(&v) => {
            Ok(v as u32)
        }
        _ => Err(format!(
            "math {name} needs its {what} as a scalar whole number below 2^32"
        )),
    }
}

/// The ops that move or scan whole tiles:
///
/// - `transpose` (R x C into C x R), `reshape` (the elements in row-major
///   order, as many of them), `slice` (a tile and the scalars row0, col0:
///   the output-sized block there) and `concat` (two tiles along `axis`)
///   move bytes: the output dtype is the inputs'.
/// - `cumsum`, `cumprod` and `cummax` run along `axis`, each element
///   the op of the running value and itself, in f64 (wrapping i64 when the
///   dtype is an integer), each rounded once to the dtype (the input's);
///   cummax propagates NaN.
/// - `rand` takes an integer tile of offsets (each taken mod 2^32) and the
///   seed's low and high 32 bits as scalars, and writes f32
///   [`kb_format::philox::rand`] of each.
fn structural(p: &MathParams, ops: &[Operand]) -> Result<Vec<u8>, String> {
    let name = op_name(p.op);
    let (rows, cols) = (p.rows as usize, p.cols as usize);
    let out_size = rows * cols * p.dtype.size();
    let tile = |k: usize| match ops.get(k) {
        Some(&Operand::Tile {
            rows,
            cols,
            dtype,
            bytes,
        }) => Ok((rows, cols, dtype, bytes)),
        _ => Err(format!("math {name} needs a tile as input {k}")),
    };
    let (r, c, d, x) = tile(0)?;
    let same_dtype = |d: Dtype| {
        if d == p.dtype {
            Ok(())
        } else {
            Err(format!(
                "math {name} keeps its input's dtype ({d}), but the record's output is {}",
                p.dtype
            ))
        }
    };
    let bad_shape = |want: String| {
        Err(format!(
            "math {name} of a {r} x {c} input gives {want}, but the output is {rows} x {cols}"
        ))
    };
    let es = d.size();
    match p.op {
        MathOp::Transpose => {
            same_dtype(d)?;
            if (rows, cols) != (c, r) {
                return bad_shape(format!("{c} x {r}"));
            }
            let mut out = vec![0u8; out_size];
            for i in 0..r {
                for j in 0..c {
                    let (src, dst) = ((i * c + j) * es, (j * r + i) * es);
                    out[dst..dst + es].copy_from_slice(&x[src..src + es]);
                }
            }
            Ok(out)
        }
        MathOp::Reshape => {
            same_dtype(d)?;
            if rows * cols != r * c {
                return bad_shape(format!("{} elements", r * c));
            }
            Ok(x.to_vec())
        }
        MathOp::Slice => {
            same_dtype(d)?;
            let r0 = word(&ops[1], name, "first row")? as usize;
            let c0 = word(&ops[2], name, "first column")? as usize;
            if r0 + rows > r || c0 + cols > c {
                return Err(format!(
                    "math {name}: a {rows} x {cols} block at ({r0}, {c0}) is not within the \
                     {r} x {c} input"
                ));
            }
            let mut out = Vec::with_capacity(out_size);
            for i in r0..r0 + rows {
                out.extend_from_slice(&x[(i * c + c0) * es..(i * c + c0 + cols) * es]);
            }
            Ok(out)
        }
        MathOp::Concat => {
            same_dtype(d)?;
            let (r2, c2, d2, y) = tile(1)?;
            same_dtype(d2)?;
            let axis = p.axis.ok_or_else(|| format!("math {name} has no axis"))?;
            let want = match axis {
                0 if c == c2 => (r + r2, c),
                1 if r == r2 => (r, c + c2),
                0 | 1 => {
                    return Err(format!(
                        "math {name} of {r} x {c} and {r2} x {c2} along axis {axis}: the other \
                         dims differ"
                    ));
                }
                a => return Err(format!("math {name} axis {a} is not 0 or 1")),
            };
            if want != (rows, cols) {
                return bad_shape(format!("{} x {}", want.0, want.1));
            }
            if axis == 0 {
                return Ok([x, y].concat());
            }
            let mut out = Vec::with_capacity(out_size);
            for i in 0..r {
                out.extend_from_slice(&x[i * c * es..(i + 1) * c * es]);
                out.extend_from_slice(&y[i * c2 * es..(i + 1) * c2 * es]);
            }
            Ok(out)
        }
        MathOp::Cumsum | MathOp::Cumprod | MathOp::Cummax => {
            same_dtype(d)?;
            if (rows, cols) != (r, c) {
                return bad_shape(format!("{r} x {c}"));
            }
            let axis = p.axis.ok_or_else(|| format!("math {name} has no axis"))?;
            if axis > 1 {
                return Err(format!("math {name} axis {axis} is not 0 or 1"));
            }
            // Element k's predecessor along the axis.
            let prev = |k: usize| match axis {
                0 if k >= c => Some(k - c),
                1 if !k.is_multiple_of(c) => Some(k - 1),
                _ => None,
            };
            let mut out = Vec::with_capacity(out_size);
            if dtype::is_int(d) {
                let mut v = dtype::to_i64(d, x);
                for k in 0..v.len() {
                    if let Some(j) = prev(k) {
                        v[k] = match p.op {
                            MathOp::Cumsum => v[j].wrapping_add(v[k]),
                            MathOp::Cumprod => v[j].wrapping_mul(v[k]),
                            _ => v[j].max(v[k]),
                        };
                    }
                }
                dtype::extend_i64(d, &v, &mut out);
            } else {
                let mut v = dtype::to_f64(d, x);
                for k in 0..v.len() {
                    if let Some(j) = prev(k) {
                        v[k] = match p.op {
                            MathOp::Cumsum => v[j] + v[k],
                            MathOp::Cumprod => v[j] * v[k],
                            _ => max_nan(v[j], v[k]),
                        };
                    }
                }
                dtype::extend_f64(d, &v, &mut out);
            }
            Ok(out)
        }
        _ => {
            // rand
            if !dtype::is_int(d) {
                return Err(format!("math {name} needs integer offsets, not {d}"));
            }
            if p.dtype != Dtype::F32 {
                return Err(format!("math {name} writes f32, not {}", p.dtype));
            }
            if (rows, cols) != (r, c) {
                return bad_shape(format!("{r} x {c}"));
            }
            let lo = word(&ops[1], name, "seed's low word")? as u64;
            let hi = word(&ops[2], name, "seed's high word")? as u64;
            let seed = (hi << 32) | lo;
            let v: Vec<f32> = dtype::to_i64(d, x)
                .iter()
                .map(|&o| kb_format::philox::rand(seed, o as u32))
                .collect();
            Ok(v.iter().flat_map(|f| f.to_le_bytes()).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::Addr;

    fn tile(rows: u32, cols: u32, dtype: Dtype) -> MathInput {
        MathInput::Tile {
            addr: Addr::default(),
            rows,
            cols,
            dtype,
        }
    }

    fn params(
        op: MathOp,
        inputs: Vec<MathInput>,
        rows: u32,
        cols: u32,
        dtype: Dtype,
    ) -> MathParams {
        MathParams {
            op,
            inputs,
            out: Addr::default(),
            rows,
            cols,
            dtype,
            axis: None,
        }
    }

    fn f32b(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn run_f32(p: &MathParams, parts: &[&[f32]]) -> Vec<f32> {
        let input: Vec<u8> = parts.iter().flat_map(|s| f32b(s)).collect();
        dtype::to_f32(p.dtype, &execute(p, &input).unwrap())
    }

    fn run_bytes(p: &MathParams, input: &[u8]) -> Vec<f64> {
        crate::dtype::to_f64(p.dtype, &execute(p, input).unwrap())
    }

    #[test]
    fn new_unary_ops_match_hand_values() {
        let f = Dtype::F32;
        let x = [-2.0f32, 0.0, 0.5];
        let un = |op| run_f32(&params(op, vec![tile(1, 3, f)], 1, 3, f), &[&x]);
        assert_eq!(un(MathOp::Abs), [2.0, 0.0, 0.5]);
        assert_eq!(un(MathOp::Neg), [2.0, -0.0, -0.5]);
        assert_eq!(un(MathOp::Exp2), [0.25, 1.0, 2f64.sqrt() as f32]);
        assert_eq!(
            un(MathOp::Sigmoid),
            [
                (1.0 / (1.0 + 2f64.exp())) as f32,
                0.5,
                (1.0 / (1.0 + (-0.5f64).exp())) as f32
            ]
        );
        assert_eq!(
            un(MathOp::Tanh),
            [(-2f64).tanh() as f32, 0.0, 0.5f64.tanh() as f32]
        );
        // erf(0.5) = 0.5204998778130465 (tabulated).
        assert_eq!(un(MathOp::Erf)[2], 0.520_499_877_813_046_5_f64 as f32);
        // Float-only ops refuse integer outputs.
        let p = params(MathOp::Tanh, vec![tile(1, 1, Dtype::I32)], 1, 1, Dtype::I32);
        assert!(execute(&p, &[0; 4]).unwrap_err().contains("float"));
    }

    #[test]
    fn comparisons_write_u8_masks() {
        let f = Dtype::F32;
        let a = [1.0f32, 2.0, f32::NAN];
        let b = [2.0f32, 2.0, 1.0];
        let input: Vec<u8> = f32b(&a).into_iter().chain(f32b(&b)).collect();
        let cmp = |op| {
            execute(
                &params(op, vec![tile(1, 3, f), tile(1, 3, f)], 1, 3, Dtype::U8),
                &input,
            )
            .unwrap()
        };
        assert_eq!(cmp(MathOp::Lt), [1, 0, 0]);
        assert_eq!(cmp(MathOp::Le), [1, 1, 0]);
        assert_eq!(cmp(MathOp::Gt), [0, 0, 0]);
        assert_eq!(cmp(MathOp::Ge), [0, 1, 0]);
        assert_eq!(cmp(MathOp::Eq), [0, 1, 0]);
        assert_eq!(cmp(MathOp::Ne), [1, 0, 1]);
        // A comparison into a float output is refused.
        let p = params(MathOp::Lt, vec![tile(1, 3, f), tile(1, 3, f)], 1, 3, f);
        assert!(execute(&p, &input).unwrap_err().contains("u8"));
    }

    #[test]
    fn min_mean_and_arg_reductions() {
        let f = Dtype::F32;
        // 2 x 3: [[3, 1, 1], [0, 5, 5]]
        let x = [3.0f32, 1.0, 1.0, 0.0, 5.0, 5.0];
        let red = |op, axis, rows, cols, dtype| {
            let mut p = params(op, vec![tile(2, 3, f)], rows, cols, dtype);
            p.axis = Some(axis);
            run_bytes(&p, &f32b(&x))
        };
        assert_eq!(red(MathOp::ReduceMin, 1, 2, 1, f), [1.0, 0.0]);
        assert_eq!(red(MathOp::ReduceMin, 0, 1, 3, f), [0.0, 1.0, 1.0]);
        let third = |v: f64| (v / 3.0) as f32 as f64;
        assert_eq!(red(MathOp::Mean, 1, 2, 1, f), [third(5.0), third(10.0)]);
        assert_eq!(red(MathOp::Mean, 0, 1, 3, f), [1.5, 3.0, 3.0]);
        // Ties go to the lowest index.
        assert_eq!(red(MathOp::ArgMax, 1, 2, 1, Dtype::I32), [0.0, 1.0]);
        assert_eq!(red(MathOp::ArgMin, 1, 2, 1, Dtype::I32), [1.0, 0.0]);
        assert_eq!(red(MathOp::ArgMax, 0, 1, 3, Dtype::I32), [0.0, 1.0, 1.0]);
        // A NaN wins argmax and argmin (numpy's rule).
        let mut p = params(MathOp::ArgMin, vec![tile(1, 3, f)], 1, 1, Dtype::I32);
        p.axis = Some(1);
        assert_eq!(run_bytes(&p, &f32b(&[2.0, f32::NAN, -1.0])), [1.0]);
        // Indices need an i32 output.
        let mut p = params(MathOp::ArgMax, vec![tile(2, 3, f)], 2, 1, f);
        p.axis = Some(1);
        assert!(execute(&p, &f32b(&x)).unwrap_err().contains("i32"));
    }

    #[test]
    fn arange_counts_along_its_axis() {
        let mut p = params(MathOp::Arange, vec![], 2, 3, Dtype::I32);
        p.axis = Some(1);
        assert_eq!(run_bytes(&p, &[]), [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
        p.axis = Some(0);
        p.dtype = Dtype::F16;
        assert_eq!(run_bytes(&p, &[]), [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        p.axis = None;
        assert!(execute(&p, &[]).unwrap_err().contains("axis"));
        let p = params(
            MathOp::Arange,
            vec![tile(1, 1, Dtype::I32)],
            1,
            1,
            Dtype::I32,
        );
        assert!(execute(&p, &[0; 4]).unwrap_err().contains("takes 0 inputs"));
    }

    #[test]
    fn unary_ops() {
        let f = Dtype::F32;
        let x = [1.0f32, 4.0, 0.25];
        assert_eq!(
            run_f32(&params(MathOp::Sqrt, vec![tile(1, 3, f)], 1, 3, f), &[&x]),
            [1.0, 2.0, 0.5]
        );
        assert_eq!(
            run_f32(&params(MathOp::Rsqrt, vec![tile(1, 3, f)], 1, 3, f), &[&x]),
            [1.0, 0.5, 2.0]
        );
        let e = run_f32(
            &params(MathOp::Exp, vec![tile(1, 3, f)], 1, 3, f),
            &[&[0.0, 1.0, -1.0]],
        );
        assert_eq!(e, [1.0, std::f32::consts::E, (-1.0f64).exp() as f32]);
        let l = run_f32(&params(MathOp::Log, vec![tile(1, 3, f)], 1, 3, f), &[&x]);
        assert_eq!(l, [0.0, 4f64.ln() as f32, 0.25f64.ln() as f32]);
    }

    #[test]
    fn scalar_only_inputs_fill_the_tile() {
        // A fill (copy of a scalar), in f16: every element is 2.5.
        let p = params(MathOp::Copy, vec![MathInput::Scalar(2.5)], 3, 4, Dtype::F16);
        let want: Vec<u8> = (0..12)
            .flat_map(|_| half::f16::from_f32(2.5).to_le_bytes())
            .collect();
        assert_eq!(execute(&p, &[]).unwrap(), want);
        // Wrapping i8 arithmetic on two scalars: 100 + 100 = -56.
        let p = params(
            MathOp::Add,
            vec![MathInput::Scalar(100.0), MathInput::Scalar(100.0)],
            2,
            2,
            Dtype::I8,
        );
        assert_eq!(execute(&p, &[]).unwrap(), vec![(-56i8) as u8; 4]);
    }

    #[test]
    fn binary_ops_broadcast_rows_columns_and_scalars() {
        let f = Dtype::F32;
        // 2x3 tile + 1x3 row.
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let p = params(MathOp::Add, vec![tile(2, 3, f), tile(1, 3, f)], 2, 3, f);
        assert_eq!(
            run_f32(&p, &[&a, &[10.0, 20.0, 30.0]]),
            [11., 22., 33., 14., 25., 36.]
        );
        // 2x3 tile - 2x1 column.
        let p = params(MathOp::Sub, vec![tile(2, 3, f), tile(2, 1, f)], 2, 3, f);
        assert_eq!(run_f32(&p, &[&a, &[1.0, 4.0]]), [0., 1., 2., 0., 1., 2.]);
        // Scalar on either side.
        let p = params(
            MathOp::Div,
            vec![MathInput::Scalar(12.0), tile(2, 3, f)],
            2,
            3,
            f,
        );
        assert_eq!(run_f32(&p, &[&a]), [12., 6., 4., 3., 2.4, 2.]);
        let p = params(
            MathOp::Mul,
            vec![tile(2, 3, f), MathInput::Scalar(-1.0)],
            2,
            3,
            f,
        );
        assert_eq!(run_f32(&p, &[&a]), [-1., -2., -3., -4., -5., -6.]);
        // Row x column outer broadcast.
        let p = params(MathOp::Max, vec![tile(1, 3, f), tile(2, 1, f)], 2, 3, f);
        assert_eq!(
            run_f32(&p, &[&[1.0, 5.0, 3.0], &[2.0, 4.0]]),
            [2., 5., 3., 4., 5., 4.]
        );
        let p = params(MathOp::Min, vec![tile(1, 2, f), tile(1, 2, f)], 1, 2, f);
        let m = run_f32(&p, &[&[1.0, f32::NAN], &[0.0, 1.0]]);
        assert_eq!(m[0], 0.0);
        assert!(m[1].is_nan(), "min propagates NaN");
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let f = Dtype::F32;
        let p = params(MathOp::Add, vec![tile(2, 3, f), tile(3, 1, f)], 2, 3, f);
        let err = execute(&p, &[0u8; 36]).unwrap_err();
        assert!(err.contains("does not broadcast"), "{err}");
        let p = params(MathOp::Add, vec![tile(2, 3, f)], 2, 3, f);
        assert!(
            execute(&p, &[0u8; 24])
                .unwrap_err()
                .contains("takes 2 inputs")
        );
        let p = params(MathOp::Exp, vec![tile(2, 3, f)], 2, 3, f);
        assert!(execute(&p, &[0u8; 20]).unwrap_err().contains("needs 24"));
    }

    #[test]
    fn where_selects_by_condition() {
        let f = Dtype::F32;
        let p = params(
            MathOp::Where,
            vec![
                tile(1, 4, Dtype::U8),
                tile(1, 4, f),
                MathInput::Scalar(-1.0),
            ],
            1,
            4,
            f,
        );
        let mut input = vec![1u8, 0, 2, 0];
        input.extend(f32b(&[10., 20., 30., 40.]));
        let out = dtype::to_f32(f, &execute(&p, &input).unwrap());
        assert_eq!(out, [10., -1., 30., -1.]);
        // A scalar condition that f32 would flush to zero is still true;
        // an i32 condition tile counts its non-zeros.
        let p = params(
            MathOp::Where,
            vec![MathInput::Scalar(1e-50), tile(1, 2, f), tile(1, 2, f)],
            1,
            2,
            f,
        );
        let input = f32b(&[1., 2., 3., 4.]);
        assert_eq!(run_f32(&p, &[&[1., 2.], &[3., 4.]]), [1., 2.]);
        assert_eq!(execute(&p, &input).unwrap(), f32b(&[1., 2.]));
        let p = params(
            MathOp::Where,
            vec![tile(1, 2, Dtype::I32), tile(1, 2, f), tile(1, 2, f)],
            1,
            2,
            f,
        );
        let mut input: Vec<u8> = [i32::MIN, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        input.extend(f32b(&[1., 2., 3., 4.]));
        assert_eq!(execute(&p, &input).unwrap(), f32b(&[1., 4.]));
    }

    #[test]
    fn reductions_along_both_axes() {
        let f = Dtype::F32;
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2x3
        let mut p = params(MathOp::Sum, vec![tile(2, 3, f)], 1, 3, f);
        p.axis = Some(0);
        assert_eq!(run_f32(&p, &[&a]), [5., 7., 9.]);
        let mut p = params(MathOp::Sum, vec![tile(2, 3, f)], 2, 1, f);
        p.axis = Some(1);
        assert_eq!(run_f32(&p, &[&a]), [6., 15.]);
        let mut p = params(MathOp::ReduceMax, vec![tile(2, 3, f)], 1, 2, f);
        p.axis = Some(1);
        assert_eq!(run_f32(&p, &[&[1., 9., 3., -4., -5., -6.]]), [9., -4.]);
        p.axis = Some(0);
        assert!(
            execute(&p, &f32b(&a))
                .unwrap_err()
                .contains("gives 3 values")
        );
        p.axis = None;
        assert!(execute(&p, &f32b(&a)).unwrap_err().contains("no axis"));
    }

    #[test]
    fn integer_ops_wrap_and_casts_convert() {
        let p = params(
            MathOp::Add,
            vec![tile(1, 2, Dtype::I8), MathInput::Scalar(100.0)],
            1,
            2,
            Dtype::I8,
        );
        let out = execute(&p, &[100u8, (-5i8) as u8]).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I8, &out), [-56, 95]);
        let mut p = params(MathOp::Sum, vec![tile(1, 3, Dtype::I32)], 1, 1, Dtype::I32);
        p.axis = Some(1);
        let big: Vec<u8> = [i32::MAX, 1, 1]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let out = execute(&p, &big).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I32, &out), [i32::MIN as i64 + 1]);
        // Cast f32 -> f16 rounds; f32 -> i32 truncates.
        let p = params(MathOp::Cast, vec![tile(1, 2, Dtype::F32)], 1, 2, Dtype::F16);
        let out = execute(&p, &f32b(&[2049.0, 0.5])).unwrap();
        assert_eq!(dtype::to_f64(Dtype::F16, &out), [2048.0, 0.5]);
        let p = params(MathOp::Cast, vec![tile(1, 2, Dtype::F32)], 1, 2, Dtype::I32);
        let out = execute(&p, &f32b(&[-2.7, 3.9])).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I32, &out), [-2, 3]);
    }

    /// xorshift bits as f32 values: every class (subnormals, NaN, inf)
    /// turns up, and ordinary magnitudes from `scale`.
    fn mixed_f32(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut x = seed | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match i % 4 {
                    0 => f32::from_bits(x),
                    _ => (x as f32 / u32::MAX as f32 - 0.5) * scale,
                }
            })
            .collect()
    }

    /// Every float elementwise op, with every broadcast shape, gives what
    /// an element-by-element evaluation in f64 gives (written here with no
    /// vector loops), rounded once to f32; the unary functions through
    /// `fmath`'s scalar calls, so the vectorised loops keep their bits.
    #[test]
    fn float_kernels_match_element_by_element_evaluation() {
        let f = Dtype::F32;
        let (rows, cols) = (5usize, 7usize);
        let mut a = mixed_f32(rows * cols, 7, 20.0);
        a[..5].copy_from_slice(&[0.0, -0.0, 1.0, f32::INFINITY, f32::from_bits(1)]);
        let at = |v: &[f32], (r, c): (usize, usize), i: usize, j: usize| {
            v[if r == 1 { 0 } else { i } * c + if c == 1 { 0 } else { j }] as f64
        };
        type Binary = fn(f64, f64) -> f64;
        let binary: [(MathOp, Binary); 12] = [
            (MathOp::Add, |x, y| x + y),
            (MathOp::Sub, |x, y| x - y),
            (MathOp::Mul, |x, y| x * y),
            (MathOp::Div, |x, y| x / y),
            (MathOp::Max, max_nan),
            (MathOp::Min, min_nan),
            (MathOp::Lt, |x, y| truth(x < y)),
            (MathOp::Le, |x, y| truth(x <= y)),
            (MathOp::Gt, |x, y| truth(x > y)),
            (MathOp::Ge, |x, y| truth(x >= y)),
            (MathOp::Eq, |x, y| truth(x == y)),
            (MathOp::Ne, |x, y| truth(x != y)),
        ];
        let shapes = [(rows, cols), (1, cols), (rows, 1), (1, 1)];
        for (op, g) in binary {
            let out = if is_comparison(op) { Dtype::U8 } else { f };
            for sa in shapes {
                for sb in shapes {
                    let x = &a[..sa.0 * sa.1];
                    let mut y = mixed_f32(sb.0 * sb.1, 11, 3.0);
                    if y.len() >= 5 {
                        // Signed zeros against zeros, NaN, infinities.
                        y[..5].copy_from_slice(&[-0.0, 0.0, f32::NAN, f32::NEG_INFINITY, -0.0]);
                    }
                    let p = params(
                        op,
                        vec![
                            tile(sa.0 as u32, sa.1 as u32, f),
                            tile(sb.0 as u32, sb.1 as u32, f),
                        ],
                        rows as u32,
                        cols as u32,
                        out,
                    );
                    let input: Vec<u8> = f32b(x).into_iter().chain(f32b(&y)).collect();
                    let got = execute(&p, &input).unwrap();
                    let mut want = Vec::new();
                    for i in 0..rows {
                        for j in 0..cols {
                            let v = g(at(x, sa, i, j), at(&y, sb, i, j));
                            dtype::push_f64(out, v, &mut want);
                        }
                    }
                    assert!(got == want, "{op:?} {sa:?} {sb:?}");
                }
            }
        }
        type Unary = fn(f64) -> f64;
        let unary: [(MathOp, Unary); 10] = [
            (MathOp::Exp, fmath::exp),
            (MathOp::Log, fmath::log),
            (MathOp::Sqrt, f64::sqrt),
            (MathOp::Rsqrt, fmath::rsqrt),
            (MathOp::Abs, f64::abs),
            (MathOp::Neg, |x| -x),
            (MathOp::Sigmoid, fmath::sigmoid),
            (MathOp::Tanh, fmath::tanh),
            (MathOp::Erf, fmath::erf),
            (MathOp::Exp2, f64::exp2),
        ];
        for (op, g) in unary {
            for out in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                for s in shapes {
                    let x = &a[..s.0 * s.1];
                    let p = params(
                        op,
                        vec![tile(s.0 as u32, s.1 as u32, f)],
                        rows as u32,
                        cols as u32,
                        out,
                    );
                    let got = execute(&p, &f32b(x)).unwrap();
                    let mut want = Vec::new();
                    for i in 0..rows {
                        for j in 0..cols {
                            let v = std::hint::black_box(g)(at(x, s, i, j));
                            dtype::push_f64(out, v, &mut want);
                        }
                    }
                    assert!(got == want, "{op:?} {s:?} -> {out}");
                }
            }
        }
    }

    #[test]
    fn copy_of_equal_dtype_keeps_bits() {
        let f = Dtype::F32;
        let nan = f32::from_bits(0x7fc0_1234);
        let p = params(MathOp::Copy, vec![tile(1, 2, f)], 1, 2, f);
        let input = f32b(&[nan, 1.5]);
        assert_eq!(execute(&p, &input).unwrap(), input);
        // Copy with broadcasting goes through values.
        let p = params(MathOp::Copy, vec![tile(1, 1, f)], 2, 2, f);
        assert_eq!(run_f32(&p, &[&[7.0]]), [7.0; 4]);
    }
}
