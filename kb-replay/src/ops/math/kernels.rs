//! The float elementwise kernels: a tile is computed a block of
//! [`BLOCK`] output elements at a time, each operand's elements for the
//! block decoded into an array on the stack (a row or column broadcast
//! read where it lies, a scalar repeated), the operation applied to the
//! whole block in one loop chosen per op (monomorphised, the operation
//! inlined, no branch inside: the compiler vectorises it), and the block
//! encoded straight into the output bytes. No buffer is allocated per op
//! and no operand is expanded to the tile's size; each element is the
//! same function of the same decoded values as one at a time, so the bits
//! do not depend on how the tile is cut (or on threads).

use kb_format::{Dtype, MathOp, MathParams};

use super::{Operand, fmath, is_comparison, max_nan, min_nan, truth};
use crate::dtype;

/// Output elements a block holds (what a run of kernels keeps on the
/// stack: three operand arrays and the result).
pub(super) const BLOCK: usize = 256;

/// Where an operand's elements for output elements `k..k + n` (within one
/// output row unless every operand is full-size or 1 x 1) come from.
enum Feed<'a> {
    /// Contiguous elements starting at this element index.
    Run(Dtype, &'a [u8], usize),
    /// One value for the whole block.
    One(f64),
    /// One element (at this index) for the whole block.
    OneAt(Dtype, &'a [u8], usize),
}

fn feed<'a>(o: &Operand<'a>, k: usize, cols: usize, count: usize) -> Feed<'a> {
    match *o {
        Operand::Scalar(v) => Feed::One(v),
        Operand::Tile {
            rows: r,
            cols: c,
            dtype,
            bytes,
        } => {
            if r * c == count {
                Feed::Run(dtype, bytes, k)
            } else if r * c == 1 {
                Feed::OneAt(dtype, bytes, 0)
            } else if r == 1 {
                // A row, repeated down the rows.
                Feed::Run(dtype, bytes, k % cols)
            } else {
                // A column, repeated across each row.
                Feed::OneAt(dtype, bytes, k / cols)
            }
        }
    }
}

/// A lane type of the kernels: f64 (the contract's) or f32 (where it
/// gives the same bits).
pub(super) trait Lane: bytemuck::Pod + Default {
    /// The dtype whose little-endian bytes are this lane's values as
    /// they are (read and written in place, not converted), if any.
    const SAME: Option<Dtype>;
    fn decode(d: Dtype, b: &[u8], out: &mut [Self]);
    fn from_f64(v: f64) -> Self;
}

impl Lane for f64 {
    const SAME: Option<Dtype> = None;
    fn decode(d: Dtype, b: &[u8], out: &mut [f64]) {
        dtype::decode_f64(d, b, out)
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
}

impl Lane for f32 {
    const SAME: Option<Dtype> = Some(Dtype::F32);
    fn decode(d: Dtype, b: &[u8], out: &mut [f32]) {
        dtype::decode_f32(d, b, out)
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

/// `b` (elements of `d`) as lanes where it lies, when they are the lane
/// type's own bytes, aligned (`None`: decode them).
fn view<T: Lane>(d: Dtype, b: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "little") && T::SAME == Some(d) {
        bytemuck::try_cast_slice(b).ok()
    } else {
        None
    }
}

fn fill<T: Lane>(f: Feed, block: &mut [T]) {
    match f {
        Feed::One(v) => block.fill(T::from_f64(v)),
        Feed::Run(d, b, k) => T::decode(d, &b[k * d.size()..], block),
        Feed::OneAt(d, b, k) => {
            let mut one = [T::default()];
            T::decode(d, &b[k * d.size()..], &mut one);
            block.fill(one[0]);
        }
    }
}

/// The operands' values for output elements `k..k + n`: a run of a tile
/// read in place where it can be ([`view`]), else decoded into `bufs`
/// (an operand past the op's arity: `n` zeros).
#[allow(clippy::too_many_arguments)]
fn operands<'b, T: Lane>(
    ops: &[Operand<'b>],
    views: &[Option<&'b [T]>; 3],
    k: usize,
    n: usize,
    cols: usize,
    count: usize,
    bufs: &'b mut [[T; BLOCK]; 3],
) -> [&'b [T]; 3] {
    let mut args: [&[T]; 3] = [&[]; 3];
    for (a, buf) in bufs.iter_mut().enumerate() {
        args[a] = match (ops.get(a).map(|o| feed(o, k, cols, count)), views[a]) {
            (Some(Feed::Run(_, _, at)), Some(v)) => &v[at..at + n],
            (Some(f), _) => {
                fill(f, &mut buf[..n]);
                &buf[..n]
            }
            (None, _) => &buf[..n],
        };
    }
    args
}

/// Where [`blocks`] writes: the output as lanes, or its bytes.
enum Dst<'o, T> {
    Lanes(&'o mut [T]),
    Bytes(&'o mut [u8]),
}

/// Run `kernel` over the output a block at a time: `kernel(args, res)`
/// gets the operands' values for the block (`args[i]`, each as long as
/// `res`) and writes the block's results, straight into `out` where the
/// output dtype is the lane type's own (aligned), else into a block that
/// `encode` writes to `out` (the output's bytes, `size` bytes an element).
#[allow(clippy::too_many_arguments)]
fn blocks<T: Lane>(
    ops: &[Operand],
    rows: usize,
    cols: usize,
    out: &mut [u8],
    out_dtype: Dtype,
    mut kernel: impl FnMut([&[T]; 3], &mut [T]),
    encode: impl Fn(&[T], &mut [u8]),
) {
    let count = rows * cols;
    if count == 0 || ops.len() > 3 {
        return;
    }
    // Every operand full-size or 1 x 1: blocks may span rows.
    let flat = ops.iter().all(|o| {
        let (r, c) = o.shape();
        r * c == count || r * c == 1
    });
    let seg = if flat { count } else { cols };
    let mut views: [Option<&[T]>; 3] = [None; 3];
    for (v, o) in views.iter_mut().zip(ops) {
        if let Operand::Tile { dtype, bytes, .. } = *o {
            *v = view(dtype, bytes);
        }
    }
    let mut bufs = [[T::default(); BLOCK]; 3];
    let size = out_dtype.size();
    let direct = cfg!(target_endian = "little") && T::SAME == Some(out_dtype);
    // Checked on a reborrow first: `cast_slice_mut` panics where
    // `try_cast_slice_mut` would fail.
    let lanes = direct && bytemuck::try_cast_slice_mut::<u8, T>(&mut *out).is_ok();
    let mut dst = if lanes {
        Dst::Lanes(bytemuck::cast_slice_mut::<u8, T>(out))
    } else {
        Dst::Bytes(out)
    };
    let mut res = [T::default(); BLOCK];
    let mut k = 0;
    while k < count {
        let seg_end = (k / seg + 1) * seg;
        let n = BLOCK.min(seg_end - k);
        let args = operands(ops, &views, k, n, cols, count, &mut bufs);
        match &mut dst {
            Dst::Lanes(o) => kernel(args, &mut o[k..k + n]),
            Dst::Bytes(o) => {
                kernel(args, &mut res[..n]);
                encode(&res[..n], &mut o[k * size..(k + n) * size]);
            }
        }
        k += n;
    }
}

#[inline(always)]
fn map1<T: Copy>(res: &mut [T], a: &[T], f: impl Fn(T) -> T) {
    for (r, &x) in res.iter_mut().zip(a) {
        *r = f(x);
    }
}

#[inline(always)]
fn map2<T: Copy>(res: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((r, &x), &y) in res.iter_mut().zip(a).zip(b) {
        *r = f(x, y);
    }
}

#[inline(always)]
fn map3<T: Copy>(res: &mut [T], a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T) {
    for (((r, &x), &y), &z) in res.iter_mut().zip(a).zip(b).zip(c) {
        *r = f(x, y, z);
    }
}

/// `res = f(a)` for [`fmath`]'s slice functions (their loops are their own).
fn in_place(res: &mut [f64], a: &[f64], f: fn(&mut [f64])) {
    res.copy_from_slice(a);
    f(res);
}

/// One block of a float elementwise op in f64 (before rounding to the
/// output dtype).
fn f64_block(op: MathOp, args: [&[f64]; 3], res: &mut [f64]) {
    let [a, b, c] = args;
    match op {
        MathOp::Where => map3(res, a, b, c, |c, a, b| if c != 0.0 { a } else { b }),
        MathOp::Clamp => map3(res, a, b, c, |x, lo, hi| min_nan(max_nan(x, lo), hi)),
        MathOp::And => map2(res, a, b, |x, y| truth(x != 0.0 && y != 0.0)),
        MathOp::Or => map2(res, a, b, |x, y| truth(x != 0.0 || y != 0.0)),
        MathOp::Xor => map2(res, a, b, |x, y| truth((x != 0.0) != (y != 0.0))),
        MathOp::Pow => map2(res, a, b, f64::powf),
        // C's fmod: the sign of the dividend.
        MathOp::Rem => map2(res, a, b, |x, y| x % y),
        MathOp::Add => map2(res, a, b, |x, y| x + y),
        MathOp::Sub => map2(res, a, b, |x, y| x - y),
        MathOp::Mul => map2(res, a, b, |x, y| x * y),
        MathOp::Div => map2(res, a, b, |x, y| x / y),
        MathOp::Max => map2(res, a, b, max_nan),
        MathOp::Min => map2(res, a, b, min_nan),
        MathOp::Lt => map2(res, a, b, |x, y| truth(x < y)),
        MathOp::Le => map2(res, a, b, |x, y| truth(x <= y)),
        MathOp::Gt => map2(res, a, b, |x, y| truth(x > y)),
        MathOp::Ge => map2(res, a, b, |x, y| truth(x >= y)),
        MathOp::Eq => map2(res, a, b, |x, y| truth(x == y)),
        MathOp::Ne => map2(res, a, b, |x, y| truth(x != y)),
        MathOp::Exp => in_place(res, a, fmath::exp_in_place),
        MathOp::Log => in_place(res, a, fmath::log_in_place),
        MathOp::Sqrt => map1(res, a, f64::sqrt),
        MathOp::Rsqrt => in_place(res, a, fmath::rsqrt_in_place),
        MathOp::Abs => map1(res, a, f64::abs),
        MathOp::Neg => map1(res, a, |v| -v),
        MathOp::Sigmoid => in_place(res, a, fmath::sigmoid_in_place),
        MathOp::Tanh => in_place(res, a, fmath::tanh_in_place),
        MathOp::Erf => in_place(res, a, fmath::erf_in_place),
        MathOp::Exp2 => map1(res, a, f64::exp2),
        MathOp::Not => map1(res, a, |v| truth(v == 0.0)),
        MathOp::Log2 => map1(res, a, f64::log2),
        MathOp::Sin => map1(res, a, f64::sin),
        MathOp::Cos => map1(res, a, f64::cos),
        MathOp::Floor => map1(res, a, f64::floor),
        MathOp::Ceil => map1(res, a, f64::ceil),
        // copy and cast: the values, rounded to the output dtype.
        _ => res.copy_from_slice(a),
    }
}

/// A float elementwise op (any arity up to 3) into `out`, `rows x cols`
/// elements of `d`: each value computed in f64 and rounded once to `d`.
pub(super) fn float_elementwise(
    op: MathOp,
    ops: &[Operand],
    rows: usize,
    cols: usize,
    d: Dtype,
    out: &mut [u8],
) {
    blocks(
        ops,
        rows,
        cols,
        out,
        d,
        |args, res| f64_block(op, args, res),
        |vals, bytes| dtype::encode_f64(d, vals, bytes),
    );
}

fn max32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.max(y)
    }
}

fn min32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.min(y)
    }
}

fn truth32(b: bool) -> f32 {
    if b { 1.0 } else { 0.0 }
}

/// One block of an op in f32 lanes (see [`f32_lanes`]).
fn f32_block(op: MathOp, args: [&[f32]; 3], res: &mut [f32]) {
    let [a, b, c] = args;
    match op {
        MathOp::Where => map3(res, a, b, c, |c, a, b| if c != 0.0 { a } else { b }),
        MathOp::Add => map2(res, a, b, |x, y| x + y),
        MathOp::Sub => map2(res, a, b, |x, y| x - y),
        MathOp::Mul => map2(res, a, b, |x, y| x * y),
        MathOp::Div => map2(res, a, b, |x, y| x / y),
        MathOp::Max => map2(res, a, b, max32),
        MathOp::Min => map2(res, a, b, min32),
        MathOp::Lt => map2(res, a, b, |x, y| truth32(x < y)),
        MathOp::Le => map2(res, a, b, |x, y| truth32(x <= y)),
        MathOp::Gt => map2(res, a, b, |x, y| truth32(x > y)),
        MathOp::Ge => map2(res, a, b, |x, y| truth32(x >= y)),
        MathOp::Eq => map2(res, a, b, |x, y| truth32(x == y)),
        MathOp::Ne => map2(res, a, b, |x, y| truth32(x != y)),
        MathOp::Abs => map1(res, a, f32::abs),
        MathOp::Neg => map1(res, a, |v| -v),
        _ => map1(res, a, f32::sqrt),
    }
}

/// Whether `p` may run in f32 lanes: ops whose f32 result is the f64
/// path's, bit for bit, when the output is f32 (a u8 mask for
/// comparisons) and every input is exact in f32 (f32, f16, bf16, i8 or u8
/// tiles; scalars that f32 holds exactly), so that the f64 contract costs
/// nothing where it need not. Add, sub, mul, div and sqrt of f32 values in
/// f32 are correctly rounded, and so is their f64 result rounded to f32:
/// f64 carries more than 2 x 24 + 2 bits, which makes the double rounding
/// innocuous (Figueroa, 1995); max, min, abs, neg, comparisons and where
/// are exact.
pub(super) fn f32_exact(p: &MathParams, ops: &[Operand]) -> bool {
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
    if !exact || !out_ok {
        return false;
    }
    // Every value exact in f32; where's condition tile only needs its
    // zeros kept, which an i32 tile does too (a scalar condition such as
    // 1e-50 would not: it must be exact like the rest).
    ops.iter().enumerate().all(|(k, o)| match *o {
        Operand::Tile { dtype, .. } => dtype != Dtype::I32 || (op == MathOp::Where && k == 0),
        Operand::Scalar(v) => v.is_nan() || v as f32 as f64 == v,
    })
}

/// An op [`f32_exact`] admits, in f32 lanes, into `out` (`rows x cols`
/// elements of the output dtype: f32, or a u8 mask).
pub(super) fn f32_lanes(p: &MathParams, ops: &[Operand], rows: usize, cols: usize, out: &mut [u8]) {
    let op = p.op;
    let d = p.dtype;
    blocks(
        ops,
        rows,
        cols,
        out,
        d,
        |args, res| f32_block(op, args, res),
        |vals, bytes| dtype::encode_f32(d, vals, bytes),
    );
}
