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
//! - Float elementwise ops and reductions run a block of elements at a
//!   time (`kernels`, `reduce`): operands decoded where they lie into
//!   arrays on the stack (broadcasts read in place), one loop per op over
//!   the block, which the compiler vectorises, results encoded straight
//!   into the output; the result does not depend on how the tile is cut or
//!   on threads.
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

mod kernels;
mod reduce;
mod structural;
#[cfg(test)]
mod tests;

use reduce::{arg_reduce, float_reduce, reduce};

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

#[derive(Clone, Copy)]
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

/// The shape rules: a reduction's output is its tile's lanes along its
/// axis; an elementwise op's inputs broadcast to its output.
fn check_shapes(
    p: &MathParams,
    ops: &[Operand],
    rows: usize,
    cols: usize,
    count: usize,
) -> Result<(), String> {
    let name = op_name(p.op);
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
    Ok(())
}

/// A math op's operands, in input order: at most three (every op's
/// arity), held inline so that no op allocates for them.
struct Operands<'a> {
    v: [Operand<'a>; 3],
    n: usize,
}

impl<'a> std::ops::Deref for Operands<'a> {
    type Target = [Operand<'a>];
    fn deref(&self) -> &[Operand<'a>] {
        &self.v[..self.n]
    }
}

impl<'a> Operands<'a> {
    /// The operands of `p` (at most three inputs: [`arity`] checked
    /// first), each tile's bytes from `bytes(k, len)` for the `k`-th tile
    /// input of `len` bytes; `None` when `bytes` has none that size.
    fn new(
        p: &MathParams,
        mut bytes: impl FnMut(usize, usize) -> Option<&'a [u8]>,
    ) -> Option<Operands<'a>> {
        let mut v = [Operand::Scalar(0.0); 3];
        let mut k = 0;
        for (o, i) in v.iter_mut().zip(&p.inputs) {
            *o = match *i {
                MathInput::Tile {
                    rows, cols, dtype, ..
                } => {
                    let len = usize::try_from(tile_len(rows, cols, dtype)?).ok()?;
                    let b = bytes(k, len).filter(|b| b.len() == len)?;
                    k += 1;
                    Operand::Tile {
                        rows: rows as usize,
                        cols: cols as usize,
                        dtype,
                        bytes: b,
                    }
                }
                MathInput::Scalar(s) => Operand::Scalar(s),
            };
        }
        Some(Operands {
            v,
            n: p.inputs.len().min(3),
        })
    }
}

/// How an elementwise op or reduction whose shapes and dtypes are
/// checked runs: the one dispatch of [`execute`] and [`execute_tiles`].
enum Route<'a> {
    /// Only scalar inputs: one value, repeated ([`execute`] only).
    Fill,
    /// A copy or cast of a whole tile to its own dtype: these bytes.
    Verbatim(&'a [u8]),
    /// A copy or cast of a whole tile between f32 and f16: this tile.
    Convert(Dtype, &'a [u8]),
    /// `argmax` / `argmin` ([`execute`] only).
    Arg,
    /// Integer arithmetic in wrapping i64 ([`execute`] only).
    Int,
    /// A float elementwise op or reduction ([`float_into`]).
    Float,
}

/// The checks and the choice of path every elementwise op and reduction
/// goes through (not `arange` or the structural ops, which have their
/// own rules): shapes, dtypes, then the fill, whole-tile copy or cast,
/// arg, integer or float path, in that order.
fn route<'a>(
    p: &MathParams,
    ops: &[Operand<'a>],
    rows: usize,
    cols: usize,
    count: usize,
) -> Result<Route<'a>, String> {
    check_shapes(p, ops, rows, cols, count)?;
    check_dtypes(p, ops)?;
    if !is_reduction(p.op) && count > 1 && ops.iter().all(|o| matches!(o, Operand::Scalar(_))) {
        return Ok(Route::Fill);
    }
    // Copies and casts of a whole tile: verbatim between equal dtypes;
    // f32 <-> f16 through half's slice conversion (F16C where the CPU has
    // it): the bits of the f64 path for every input (checked over all
    // 2^32 f32 values and all 2^16 f16 ones).
    if matches!(p.op, MathOp::Copy | MathOp::Cast)
        && let Some(&Operand::Tile {
            rows: r,
            cols: c,
            dtype,
            bytes,
        }) = ops.first()
        && (r, c) == (rows, cols)
    {
        if dtype == p.dtype {
            return Ok(Route::Verbatim(bytes));
        }
        if dtype::converts_f32_f16(dtype, p.dtype) {
            return Ok(Route::Convert(dtype, bytes));
        }
    }
    if matches!(p.op, MathOp::ArgMax | MathOp::ArgMin) {
        return Ok(Route::Arg);
    }
    if int_op(p.op) && dtype::is_int(p.dtype) && ops.iter().all(Operand::is_integral) {
        return Ok(Route::Int);
    }
    Ok(Route::Float)
}

/// Ops that run in wrapping i64 when the output and every input are
/// integers (see the module docs).
fn int_op(op: MathOp) -> bool {
    matches!(
        op,
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
    )
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
    // The tiles lie one after the other (their sizes add up: checked).
    let mut pos = 0usize;
    let ops = Operands::new(p, |_, n| {
        let b = input.get(pos..pos + n);
        pos += n;
        b
    })
    .ok_or("math tile sizes overflow")?;

    if p.op == MathOp::Arange {
        return arange(p, rows, cols, count);
    }
    if is_structural(p.op) {
        return structural::structural(p, &ops);
    }

    let route = route(p, &ops, rows, cols, count)?;
    let size = p.dtype.size();
    let out_len = count * size;
    // The output's buffer comes from the pool the engine returns it to
    // once written, so an op allocates nothing in the steady state.
    let mut out = crate::pool::BYTES.take(out_len);
    let axis = p.axis.unwrap_or(0);
    match route {
        Route::Fill => {
            let one = MathParams {
                rows: 1,
                cols: 1,
                ..p.clone()
            };
            let one = execute(&one, input)?;
            out.resize(out_len, 0);
            for c in out.chunks_exact_mut(size) {
                c.copy_from_slice(&one);
            }
            crate::pool::BYTES.give(one);
        }
        Route::Verbatim(bytes) => out.extend_from_slice(bytes),
        Route::Convert(from, bytes) => {
            out.resize(out_len, 0);
            dtype::convert_f32_f16(from, p.dtype, bytes, &mut out);
        }
        Route::Arg => {
            // Every dtype decodes exactly to f64, so comparing there is exact.
            let x = ops[0].f64s();
            let idx = if p.op == MathOp::ArgMax {
                arg_reduce(&x, axis, |v, best| v > best)
            } else {
                arg_reduce(&x, axis, |v, best| v < best)
            };
            dtype::extend_i64(p.dtype, &idx, &mut out);
        }
        Route::Int => {
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
        }
        Route::Float => {
            out.resize(out_len, 0);
            float_into(p, &ops, rows, cols, &mut out);
        }
    }
    Ok(out)
}

/// `arange`: each element its index along `axis`, rounded to the output
/// dtype.
fn arange(p: &MathParams, rows: usize, cols: usize, count: usize) -> Result<Vec<u8>, String> {
    let idx: Vec<i64> = match p.axis {
        Some(0) => (0..rows)
            .flat_map(|i| std::iter::repeat_n(i as i64, cols))
            .collect(),
        Some(1) => (0..rows).flat_map(|_| 0..cols as i64).collect(),
        a => {
            return Err(format!(
                "math {} needs axis 0 or 1, not {a:?}",
                op_name(p.op)
            ));
        }
    };
    let mut out = Vec::with_capacity(count * p.dtype.size());
    if dtype::is_int(p.dtype) {
        dtype::extend_i64(p.dtype, &idx, &mut out);
    } else {
        let v: Vec<f64> = idx.iter().map(|&i| i as f64).collect();
        dtype::extend_f64(p.dtype, &v, &mut out);
    }
    Ok(out)
}

/// Bytes of each tile input, in input order (scalars take none); `None`
/// on overflow.
pub fn tile_lens(p: &MathParams) -> Option<Vec<usize>> {
    p.inputs
        .iter()
        .filter_map(|i| match *i {
            MathInput::Tile {
                rows, cols, dtype, ..
            } => Some(tile_len(rows, cols, dtype).and_then(|n| usize::try_from(n).ok())),
            MathInput::Scalar(_) => None,
        })
        .collect()
}

/// Run a float math op (an elementwise op or a float reduction, a copy or
/// cast of a whole tile) on its tiles where they lie, one slice per tile
/// input in order ([`tile_lens`]), writing its output into `out`, exactly
/// its [`output_len`] bytes: the bits [`execute`] gives, without
/// gathering the operands or scattering the result. `Ok(false)`: an op
/// this path does not run (integer, arg, structural, fill, or slices of
/// the wrong sizes), nothing written: run [`execute`] instead. Errors are
/// [`execute`]'s.
pub fn execute_tiles(p: &MathParams, tiles: &[&[u8]], out: &mut [u8]) -> Result<bool, String> {
    if p.op == MathOp::Arange || is_structural(p.op) || p.inputs.len() != arity(p.op) {
        return Ok(false);
    }
    let (rows, cols) = (p.rows as usize, p.cols as usize);
    let Some(count) = rows.checked_mul(cols) else {
        return Ok(false);
    };
    let n_tiles = p
        .inputs
        .iter()
        .filter(|i| matches!(i, MathInput::Tile { .. }))
        .count();
    if n_tiles != tiles.len() || output_len(p) != Some(out.len() as u64) {
        return Ok(false);
    }
    let Some(ops) = Operands::new(p, |k, _| tiles.get(k).copied()) else {
        return Ok(false);
    };
    match route(p, &ops, rows, cols, count)? {
        Route::Fill | Route::Arg | Route::Int => return Ok(false),
        Route::Verbatim(bytes) => out.copy_from_slice(bytes),
        Route::Convert(from, bytes) => {
            dtype::convert_f32_f16(from, p.dtype, bytes, out);
        }
        Route::Float => float_into(p, &ops, rows, cols, out),
    }
    Ok(true)
}

/// A float reduction or elementwise op (not an integer, arg, structural
/// or fill one) into `out`, exactly its output's bytes.
fn float_into(p: &MathParams, ops: &[Operand], rows: usize, cols: usize, out: &mut [u8]) {
    if is_reduction(p.op) {
        let vals = match ops[0] {
            Operand::Tile {
                rows: r,
                cols: c,
                dtype,
                bytes,
            } => float_reduce(p.op, dtype, bytes, r, c, p.axis.unwrap_or(0)),
            // A scalar is its own sum, mean, maximum and minimum.
            Operand::Scalar(v) => vec![v],
        };
        dtype::encode_f64(p.dtype, &vals, out);
    } else if cfg!(target_endian = "little") && kernels::f32_exact(p, ops) {
        kernels::f32_lanes(p, ops, rows, cols, out);
    } else {
        kernels::float_elementwise(p.op, ops, rows, cols, p.dtype, out);
    }
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
