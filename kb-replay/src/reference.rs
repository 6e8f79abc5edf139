//! Reference evaluation of a verification [`Expr`] in f64 over the input
//! tensors' host data (the contract's rule 5).
//!
//! Deliberately independent of op replay: its own element decoder (no
//! `half`, no [`crate::dtype`]), its own matmul and reductions, f64
//! throughout, so a bug in the replay path cannot be mirrored here.
//!
//! Values are matrices. A tensor of shape `[]` is 1 x 1, `[n]` is a 1 x n
//! row, `[r, c]` is r x c, and higher ranks fold their leading dimensions
//! into rows (`[a, b, c]` is (a*b) x c). Ops of several operands
//! (arithmetic, maximum/minimum/pow, comparisons, where) broadcast like
//! numpy over two dimensions: each dim equal or 1, so a 1 x c row repeats
//! across rows, an r x 1 column across columns, a 1 x 1 value (or a
//! scalar) everywhere. Reductions and softmax take `axis` 0 (down the rows,
//! per column) or 1 (along each row); `Sum`/`Max`/`Min`/`Mean` along axis
//! 0 give 1 x cols, along axis 1 rows x 1. Comparisons give 1.0 or 0.0
//! (false against NaN, except `Ne`); maximum/minimum and the reductions
//! propagate NaN; `where` picks `a` where `cond` is non-zero (or NaN).
//! `sum_blocks` adds up equal row blocks (R x C into `blocks` gives
//! R/blocks x C); `tile` stacks its operand `reps` times down the rows.

use kb_format::Expr;

mod batched;
mod decode;
mod lanes;
mod matmul;

pub use decode::decode_into;

use lanes::Func;

use matmul::matmul_into;

/// A dense row-major f64 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Matrix, String> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(format!(
                "{} values do not make a {rows} x {cols} matrix",
                data.len()
            ));
        }
        Ok(Matrix { rows, cols, data })
    }

    pub fn scalar(v: f64) -> Matrix {
        Matrix {
            rows: 1,
            cols: 1,
            data: vec![v],
        }
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.cols + j]
    }
}

/// The matrix view of a tensor shape (see the module docs); `None` on overflow.
pub fn matrix_shape(shape: &[u64]) -> Option<(usize, usize)> {
    match shape {
        [] => Some((1, 1)),
        [n] => Some((1, usize::try_from(*n).ok()?)),
        [lead @ .., c] => {
            let rows = lead
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))?;
            Some((rows, usize::try_from(*c).ok()?))
        }
    }
}

/// Elements one task of the reference's element-wise work takes (the
/// verifier's decoding and comparison too): large tensors run on the
/// pool, a few pieces per thread.
pub const PAR_CHUNK: usize = 1 << 16;

/// Evaluates expressions; `tensor` resolves `Expr::Tensor` names.
pub struct Evaluator<'a> {
    pub tensor: &'a dyn Fn(&str) -> Result<Matrix, String>,
    /// Most elements one intermediate may hold.
    pub max_elems: usize,
}

impl std::fmt::Debug for Evaluator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("max_elems", &self.max_elems)
            .finish()
    }
}

const MAX_DEPTH: usize = 256;

/// The matmuls an expression holds more than once, each evaluated once:
/// specs repeat subtrees (GELU's `x` appears twice in
/// `x * 0.5 * (1 + erf(x / sqrt 2))`, and there `x` is a layer's matmul:
/// measured, about a fifth of an mlp trace's reference). Subtrees are the same
/// when their `Debug` texts are (every scalar printed so that it reads
/// back to its bits; NaNs of any payload print alike, and compare alike),
/// and evaluation is deterministic, so a reused value is the one a second
/// evaluation would give. Only matmuls are kept: elsewhere a repeat costs
/// less than the copy that reusing it takes. The values kept at once
/// hold at most `budget` elements (the evaluator's limit for one
/// intermediate): past it a repeat is evaluated again, as before.
struct Repeats {
    /// Key, uses left, the value once evaluated.
    entries: Vec<(String, usize, Option<Matrix>)>,
    /// Elements more that may be kept.
    budget: usize,
}

impl Repeats {
    fn of(e: &Expr, budget: usize) -> Repeats {
        let mut seen: rustc_hash::FxHashMap<String, usize> = Default::default();
        let mut stack = vec![e];
        while let Some(x) = stack.pop() {
            if Repeats::kept(x) {
                *seen.entry(format!("{x:?}")).or_default() += 1;
            }
            stack.extend(x.children());
        }
        let mut entries: Vec<_> = seen
            .into_iter()
            .filter(|&(_, uses)| uses > 1)
            .map(|(key, uses)| (key, uses, None))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Repeats { entries, budget }
    }

    fn kept(e: &Expr) -> bool {
        matches!(e, Expr::Matmul(..) | Expr::BatchedMatmul { .. })
    }

    /// `e`'s entry, if it is a repeated matmul.
    fn find(&self, e: &Expr) -> Option<usize> {
        if self.entries.is_empty() || !Repeats::kept(e) {
            return None;
        }
        let key = format!("{e:?}");
        self.entries.binary_search_by(|x| x.0.cmp(&key)).ok()
    }

    /// Entry `i`'s value when it was evaluated before: a copy, or the
    /// value itself at its last use.
    fn reuse(&mut self, i: usize) -> Option<Matrix> {
        let (_, uses, value) = &mut self.entries[i];
        let len = value.as_ref()?.data.len();
        *uses -= 1;
        if *uses == 0 {
            self.budget += len;
            value.take()
        } else {
            value.clone()
        }
    }

    /// Entry `i` was evaluated as `m` (not kept before): kept for its
    /// remaining uses, if any, while the budget allows.
    fn keep(&mut self, i: usize, m: Matrix) -> Matrix {
        let (_, uses, value) = &mut self.entries[i];
        *uses -= 1;
        if *uses > 0 && m.data.len() <= self.budget {
            self.budget -= m.data.len();
            *value = Some(m.clone());
        }
        m
    }
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

impl Evaluator<'_> {
    pub fn eval(&self, e: &Expr) -> Result<Matrix, String> {
        self.eval_at(e, 0, &mut Repeats::of(e, self.max_elems))
    }

    fn alloc_check(&self, rows: usize, cols: usize) -> Result<usize, String> {
        rows.checked_mul(cols)
            .filter(|&n| n <= self.max_elems)
            .ok_or_else(|| format!("a {rows} x {cols} intermediate is too large"))
    }

    // The recursion evaluates operands only; `apply` (many arms, a large
    // frame in debug builds) runs outside it, so deep nesting stays cheap
    // on the stack.
    fn eval_at(&self, e: &Expr, depth: usize, repeats: &mut Repeats) -> Result<Matrix, String> {
        if depth > MAX_DEPTH {
            return Err(format!("expression nests deeper than {MAX_DEPTH} levels"));
        }
        let repeat = repeats.find(e);
        if let Some(m) = repeat.and_then(|i| repeats.reuse(i)) {
            return Ok(m);
        }
        let mut args = Vec::with_capacity(3);
        for x in e.children() {
            args.push(self.eval_at(x, depth + 1, repeats)?);
        }
        let m = self.apply(e, args)?;
        Ok(match repeat {
            Some(i) => repeats.keep(i, m),
            None => m,
        })
    }

    /// `e`'s op on its evaluated operands (in [`Expr::children`] order).
    #[inline(never)]
    fn apply(&self, e: &Expr, args: Vec<Matrix>) -> Result<Matrix, String> {
        let mut args = args.into_iter();
        let mut arg = || {
            args.next()
                .ok_or_else(|| "an operand is missing".to_string())
        };
        Ok(match e {
            Expr::Tensor(name) => (self.tensor)(name)?,
            Expr::Scalar(v) => Matrix::scalar(*v),
            Expr::Matmul(..) => self.matmul(&arg()?, &arg()?)?,
            Expr::Transpose(_) => {
                let a = arg()?;
                let mut data = Vec::with_capacity(a.data.len());
                for j in 0..a.cols {
                    for i in 0..a.rows {
                        data.push(a.get(i, j));
                    }
                }
                Matrix {
                    rows: a.cols,
                    cols: a.rows,
                    data,
                }
            }
            Expr::Add(..) => self.broadcast("add", arg()?, arg()?, |x, y| x + y)?,
            Expr::Sub(..) => self.broadcast("sub", arg()?, arg()?, |x, y| x - y)?,
            Expr::Mul(..) => self.broadcast("mul", arg()?, arg()?, |x, y| x * y)?,
            Expr::Div(..) => self.broadcast("div", arg()?, arg()?, |x, y| x / y)?,
            Expr::Maximum(..) => self.broadcast("maximum", arg()?, arg()?, max_nan)?,
            Expr::Minimum(..) => self.broadcast("minimum", arg()?, arg()?, min_nan)?,
            Expr::Pow(..) => self.broadcast("pow", arg()?, arg()?, f64::powf)?,
            Expr::Lt(..) => self.broadcast("lt", arg()?, arg()?, |x, y| truth(x < y))?,
            Expr::Le(..) => self.broadcast("le", arg()?, arg()?, |x, y| truth(x <= y))?,
            Expr::Gt(..) => self.broadcast("gt", arg()?, arg()?, |x, y| truth(x > y))?,
            Expr::Ge(..) => self.broadcast("ge", arg()?, arg()?, |x, y| truth(x >= y))?,
            Expr::Eq(..) => self.broadcast("eq", arg()?, arg()?, |x, y| truth(x == y))?,
            Expr::Ne(..) => self.broadcast("ne", arg()?, arg()?, |x, y| truth(x != y))?,
            Expr::Where { .. } => {
                let (c, a, b) = (arg()?, arg()?, arg()?);
                self.broadcast_n("where", &[&c, &a, &b], |v| {
                    if v[0] != 0.0 { v[1] } else { v[2] }
                })?
            }
            Expr::Exp(_) => map_lanes(arg()?, Func::Exp),
            Expr::Sqrt(_) => map(arg()?, f64::sqrt),
            Expr::Rsqrt(_) => map(arg()?, |v| 1.0 / v.sqrt()),
            Expr::Log(_) => map(arg()?, f64::ln),
            Expr::Abs(_) => map(arg()?, f64::abs),
            Expr::Neg(_) => map(arg()?, |v| -v),
            Expr::Tanh(_) => map(arg()?, f64::tanh),
            Expr::Erf(_) => map_lanes(arg()?, Func::Erf),
            Expr::Sigmoid(_) => map_lanes(arg()?, Func::Sigmoid),
            Expr::Softmax { axis, .. } => softmax(arg()?, *axis)?,
            Expr::Sum { axis, .. } => reduce(&arg()?, *axis, 0.0, |a, b| a + b)?,
            Expr::Max { axis, .. } => reduce(&arg()?, *axis, f64::NEG_INFINITY, max_nan)?,
            Expr::Min { axis, .. } => reduce(&arg()?, *axis, f64::INFINITY, min_nan)?,
            Expr::Mean { axis, .. } => {
                let m = arg()?;
                // Lane length; an empty lane gives 0 / 0 = NaN, as numpy.
                let n = if *axis == 0 { m.rows } else { m.cols } as f64;
                map(reduce(&m, *axis, 0.0, |a, b| a + b)?, |s| s / n)
            }
            Expr::Gather { .. } => self.gather(&arg()?, &arg()?)?,
            Expr::SumBlocks { blocks, .. } => self.sum_blocks(&arg()?, *blocks)?,
            Expr::Tile { reps, .. } => self.tile(&arg()?, *reps)?,
            Expr::Iota { rows, cols, axis } => self.iota(*rows, *cols, *axis)?,
            Expr::Tril { diagonal, .. } => band(arg()?, |i, j| j - i <= *diagonal as i128),
            Expr::Triu { diagonal, .. } => band(arg()?, |i, j| j - i >= *diagonal as i128),
            Expr::And(..) => {
                self.broadcast("and", arg()?, arg()?, |x, y| truth(x != 0.0 && y != 0.0))?
            }
            Expr::Or(..) => {
                self.broadcast("or", arg()?, arg()?, |x, y| truth(x != 0.0 || y != 0.0))?
            }
            Expr::Xor(..) => self.broadcast("xor", arg()?, arg()?, |x, y| {
                truth((x != 0.0) != (y != 0.0))
            })?,
            Expr::Not(_) => map(arg()?, |v| truth(v == 0.0)),
            Expr::Log2(_) => map(arg()?, f64::log2),
            Expr::Sin(_) => map(arg()?, f64::sin),
            Expr::Cos(_) => map(arg()?, f64::cos),
            Expr::Floor(_) => map(arg()?, f64::floor),
            Expr::Ceil(_) => map(arg()?, f64::ceil),
            // Rust's `%` on floats is C's fmod: the sign of the dividend.
            Expr::Rem(..) => self.broadcast("rem", arg()?, arg()?, |x, y| x % y)?,
            Expr::Clamp { .. } => {
                let (x, lo, hi) = (arg()?, arg()?, arg()?);
                self.broadcast_n("clamp", &[&x, &lo, &hi], |v| {
                    min_nan(max_nan(v[0], v[1]), v[2])
                })?
            }
            Expr::Cumsum { axis, .. } => scan(arg()?, *axis, |a, b| a + b)?,
            Expr::Cumprod { axis, .. } => scan(arg()?, *axis, |a, b| a * b)?,
            Expr::Cummax { axis, .. } => scan(arg()?, *axis, max_nan)?,
            Expr::Reshape { rows, cols, .. } => {
                let m = arg()?;
                let what = format!("reshape of {} x {} to {rows} x {cols}", m.rows, m.cols);
                let (r, c) = (usize::try_from(*rows), usize::try_from(*cols));
                match (r, c) {
                    (Ok(r), Ok(c)) if r.checked_mul(c) == Some(m.data.len()) => {
                        Matrix::new(r, c, m.data)?
                    }
                    _ => return Err(format!("{what}: the element counts differ")),
                }
            }
            Expr::Slice {
                row,
                col,
                rows,
                cols,
                ..
            } => {
                let m = arg()?;
                let fits =
                    |at: u64, n: u64, of: usize| at.checked_add(n).is_some_and(|e| e <= of as u64);
                if !fits(*row, *rows, m.rows) || !fits(*col, *cols, m.cols) {
                    return Err(format!(
                        "slice {rows} x {cols} at ({row}, {col}) is not within {} x {}",
                        m.rows, m.cols
                    ));
                }
                let (r0, c0, r, c) = (*row as usize, *col as usize, *rows as usize, *cols as usize);
                let mut data = Vec::with_capacity(r * c);
                for i in r0..r0 + r {
                    data.extend_from_slice(&m.data[i * m.cols + c0..i * m.cols + c0 + c]);
                }
                Matrix::new(r, c, data)?
            }
            Expr::Concat { axis, .. } => self.concat(arg()?, arg()?, *axis)?,
            Expr::Rand { seed, .. } => map(arg()?, |v| philox_uniform(*seed, v)),
            Expr::BatchedMatmul { batch, .. } => self.batched_matmul(&arg()?, &arg()?, *batch)?,
        })
    }

    /// A `rows x cols` matrix of each element's index along `axis`.
    fn iota(&self, rows: u64, cols: u64, axis: u8) -> Result<Matrix, String> {
        check_axis(axis)?;
        let what = format!("iota {rows} x {cols}");
        let (r, c) = match (usize::try_from(rows), usize::try_from(cols)) {
            (Ok(r), Ok(c)) => (r, c),
            _ => return Err(format!("{what}: too large")),
        };
        self.alloc_check(r, c).map_err(|e| format!("{what}: {e}"))?;
        let mut data = Vec::with_capacity(r * c);
        for i in 0..r {
            for j in 0..c {
                data.push(if axis == 0 { i } else { j } as f64);
            }
        }
        Matrix::new(r, c, data)
    }

    /// `a` and `b` joined along `axis`.
    fn concat(&self, a: Matrix, b: Matrix, axis: u8) -> Result<Matrix, String> {
        check_axis(axis)?;
        let what = format!(
            "concat of {} x {} and {} x {} along axis {axis}",
            a.rows, a.cols, b.rows, b.cols
        );
        if axis == 0 {
            if a.cols != b.cols {
                return Err(format!("{what}: the column counts differ"));
            }
            self.alloc_check(a.rows + b.rows, a.cols)?;
            let mut data = a.data;
            data.extend_from_slice(&b.data);
            Matrix::new(a.rows + b.rows, a.cols, data)
        } else {
            if a.rows != b.rows {
                return Err(format!("{what}: the row counts differ"));
            }
            self.alloc_check(a.rows, a.cols + b.cols)?;
            let mut data = Vec::with_capacity(a.rows * (a.cols + b.cols));
            for i in 0..a.rows {
                data.extend_from_slice(&a.data[i * a.cols..(i + 1) * a.cols]);
                data.extend_from_slice(&b.data[i * b.cols..(i + 1) * b.cols]);
            }
            Matrix::new(a.rows, a.cols + b.cols, data)
        }
    }

    /// The elementwise sum of `m`'s `blocks` equal row blocks:
    /// `out[i, j] = sum_k m[k * rows/blocks + i, j]`.
    fn sum_blocks(&self, m: &Matrix, blocks: u64) -> Result<Matrix, String> {
        let what = format!("sum_blocks of {} x {} into {blocks} blocks", m.rows, m.cols);
        if blocks == 0 {
            return Err(format!("{what}: blocks must be at least 1"));
        }
        let b = usize::try_from(blocks)
            .ok()
            .filter(|&b| m.rows.is_multiple_of(b))
            .ok_or_else(|| format!("{what}: {} rows do not split evenly", m.rows))?;
        let rows = m.rows / b;
        let n = self
            .alloc_check(rows, m.cols)
            .map_err(|e| format!("{what}: {e}"))?;
        let mut data = vec![0.0; n];
        // An empty block sums to nothing (and `blocks` may be huge then).
        if n > 0 {
            for block in m.data.chunks_exact(n) {
                for (o, &v) in data.iter_mut().zip(block) {
                    *o += v;
                }
            }
        }
        Ok(Matrix {
            rows,
            cols: m.cols,
            data,
        })
    }

    /// `m` stacked `reps` times along the rows.
    fn tile(&self, m: &Matrix, reps: u64) -> Result<Matrix, String> {
        let what = format!("tile of {} x {} {reps} times", m.rows, m.cols);
        if reps == 0 {
            return Err(format!("{what}: reps must be at least 1"));
        }
        let (r, rows) = usize::try_from(reps)
            .ok()
            .and_then(|r| Some((r, r.checked_mul(m.rows)?)))
            .ok_or_else(|| format!("{what}: {reps}*{} rows is too large", m.rows))?;
        self.alloc_check(rows, m.cols)
            .map_err(|e| format!("{what}: {e}"))?;
        // Within `max_elems`, so `r` is small unless `m` is empty, and
        // `repeat` doubles its copy (log2(r) steps).
        let data = m.data.repeat(r);
        Ok(Matrix {
            rows,
            cols: m.cols,
            data,
        })
    }

    /// `out[i, :] = table[indices[i], :]`; indices is a column (or a row).
    fn gather(&self, table: &Matrix, indices: &Matrix) -> Result<Matrix, String> {
        let n = indices.data.len();
        self.alloc_check(n, table.cols)?;
        let mut data = Vec::with_capacity(n * table.cols);
        for (i, &v) in indices.data.iter().enumerate() {
            if !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < table.rows) {
                return Err(format!(
                    "gather: index {v} at {i} is not a row of the {}-row table",
                    table.rows
                ));
            }
            let r = v as usize;
            data.extend_from_slice(&table.data[r * table.cols..(r + 1) * table.cols]);
        }
        Matrix::new(n, table.cols, data)
    }

    fn matmul(&self, a: &Matrix, b: &Matrix) -> Result<Matrix, String> {
        if a.cols != b.rows {
            return Err(format!(
                "matmul of {} x {} by {} x {}: inner dimensions differ",
                a.rows, a.cols, b.rows, b.cols
            ));
        }
        let len = self.alloc_check(a.rows, b.cols)?;
        let mut c = vec![0.0; len];
        matmul_into(&a.data, &b.data, a.cols, b.cols, &mut c);
        Ok(Matrix {
            rows: a.rows,
            cols: b.cols,
            data: c,
        })
    }

    /// `f(a, b)` elementwise, broadcast as [`Evaluator::broadcast_n`]'s;
    /// written over an operand of the result's shape where there is one
    /// (operands are owned: no allocation), rows in parallel on the pool.
    fn broadcast(
        &self,
        what: &str,
        a: Matrix,
        b: Matrix,
        f: impl Fn(f64, f64) -> f64 + Sync,
    ) -> Result<Matrix, String> {
        let (rows, cols) = (a.rows.max(b.rows), a.cols.max(b.cols));
        let full = |m: &Matrix| m.rows == rows && m.cols == cols;
        if !full(&a) && !full(&b) {
            return self.broadcast_n(what, &[&a, &b], |v| f(v[0], v[1]));
        }
        let fits = |m: &Matrix| (m.rows == rows || m.rows == 1) && (m.cols == cols || m.cols == 1);
        if !fits(&a) || !fits(&b) {
            return self.broadcast_n(what, &[&a, &b], |v| f(v[0], v[1]));
        }
        let (mut out, other, out_is_a) = if full(&a) {
            (a, b, true)
        } else {
            (b, a, false)
        };
        let f = |x: f64, y: f64| if out_is_a { f(x, y) } else { f(y, x) };
        rows_in_parallel(&mut out.data, cols, |i, row| {
            let o = &other.data[if other.rows == 1 { 0 } else { i * other.cols }..];
            if other.cols == 1 {
                let y = o[0];
                row.iter_mut().for_each(|x| *x = f(*x, y));
            } else {
                row.iter_mut().zip(o).for_each(|(x, &y)| *x = f(*x, y));
            }
        });
        Ok(out)
    }

    /// `f` of the operands' elements, each operand broadcast numpy-style
    /// to the common shape (per dim: all equal, or 1).
    fn broadcast_n(
        &self,
        what: &str,
        ms: &[&Matrix],
        f: impl Fn(&[f64]) -> f64,
    ) -> Result<Matrix, String> {
        let dim = |x: Option<usize>, y: usize| match x? {
            x if x == y => Some(x),
            1 => Some(y),
            x if y == 1 => Some(x),
            _ => None,
        };
        let rows = ms.iter().try_fold(1, |acc, m| dim(Some(acc), m.rows));
        let cols = ms.iter().try_fold(1, |acc, m| dim(Some(acc), m.cols));
        let (Some(rows), Some(cols)) = (rows, cols) else {
            let shapes: Vec<String> = ms
                .iter()
                .map(|m| format!("{} x {}", m.rows, m.cols))
                .collect();
            return Err(format!(
                "{what} of {}: shapes do not broadcast",
                shapes.join(" and ")
            ));
        };
        let n = self.alloc_check(rows, cols)?;
        let pick = |m: &Matrix, i: usize, j: usize| {
            m.get(
                if m.rows == 1 { 0 } else { i },
                if m.cols == 1 { 0 } else { j },
            )
        };
        let mut data = Vec::with_capacity(n);
        let mut args = vec![0.0; ms.len()];
        for i in 0..rows {
            for j in 0..cols {
                for (a, m) in args.iter_mut().zip(ms) {
                    *a = pick(m, i, j);
                }
                data.push(f(&args));
            }
        }
        Ok(Matrix { rows, cols, data })
    }
}

/// `m` with the elements (i, j) for which `keep(i, j)` is false zeroed.
fn band(mut m: Matrix, keep: impl Fn(i128, i128) -> bool) -> Matrix {
    for i in 0..m.rows {
        for j in 0..m.cols {
            if !keep(i as i128, j as i128) {
                m.data[i * m.cols + j] = 0.0;
            }
        }
    }
    m
}

/// Inclusive running `f` along `axis`.
fn scan(mut m: Matrix, axis: u8, f: impl Fn(f64, f64) -> f64) -> Result<Matrix, String> {
    check_axis(axis)?;
    for lane in lanes(&m, axis) {
        for w in lane.windows(2) {
            m.data[w[1]] = f(m.data[w[0]], m.data[w[1]]);
        }
    }
    Ok(m)
}

/// Triton's `tl.rand(seed, offset)` for an integer-valued `offset` (taken
/// mod 2^32), written here apart from `kb_format::philox` (which op replay
/// and kb-sim use): Philox4x32-10 of the counter (offset, 0, 0, 0) under
/// the key (seed mod 2^32, seed >> 32), its first word folded to a
/// non-negative i32 and scaled by 4.6566127342e-10, in f64 (NaN for an
/// offset that is not an integer).
fn philox_uniform(seed: u64, offset: f64) -> f64 {
    if offset.fract() != 0.0 || !offset.is_finite() {
        return f64::NAN;
    }
    let word = (offset.rem_euclid(4_294_967_296.0)) as u64;
    let bits = philox_words([word, 0, 0, 0], seed)[0];
    // Read as an i32 and fold the negatives: -x - 1.
    let x = if bits >= 1 << 31 {
        (1u64 << 32) - 1 - bits
    } else {
        bits
    };
    x as f64 * 4.6566127342e-10
}

/// Philox4x32-10 with 32-bit words held in u64s.
fn philox_words(mut c: [u64; 4], seed: u64) -> [u64; 4] {
    const MASK: u64 = 0xFFFF_FFFF;
    let (mut k0, mut k1) = (seed & MASK, seed >> 32);
    for _ in 0..10 {
        let a = 0xD251_1F53 * c[0];
        let b = 0xCD9E_8D57 * c[2];
        c = [
            (b >> 32) ^ c[1] ^ k0,
            b & MASK,
            (a >> 32) ^ c[3] ^ k1,
            a & MASK,
        ];
        k0 = (k0 + 0x9E37_79B9) & MASK;
        k1 = (k1 + 0xBB67_AE85) & MASK;
    }
    c
}

/// [`lanes::map`] over `m`, [`PAR_CHUNK`] elements a task.
fn map_lanes(mut m: Matrix, f: Func) -> Matrix {
    use rayon::prelude::*;
    m.data
        .par_chunks_mut(PAR_CHUNK)
        .for_each(|piece| lanes::map(f, piece));
    m
}

fn map(mut m: Matrix, f: impl Fn(f64) -> f64 + Sync) -> Matrix {
    let cols = m.cols;
    rows_in_parallel(&mut m.data, cols, |_, row| {
        row.iter_mut().for_each(|v| *v = f(*v))
    });
    m
}

/// `f(i, row i)` for the rows of `data` (`cols` each), in parallel on
/// the current pool in pieces of at least 64 Ki elements (each element's
/// result is its own: the same bits for any thread count).
fn rows_in_parallel(data: &mut [f64], cols: usize, f: impl Fn(usize, &mut [f64]) + Sync) {
    use rayon::prelude::*;
    if cols == 0 {
        return;
    }
    let per = (65536 / cols).max(1);
    data.par_chunks_mut(per * cols)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (r, row) in chunk.chunks_mut(cols).enumerate() {
                f(c * per + r, row);
            }
        });
}

fn truth(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn check_axis(axis: u8) -> Result<(), String> {
    if axis > 1 {
        return Err(format!("axis {axis} is not 0 or 1"));
    }
    Ok(())
}

/// Indices of the lanes along `axis`: per column for 0, per row for 1.
fn lanes(m: &Matrix, axis: u8) -> Vec<Vec<usize>> {
    if axis == 0 {
        (0..m.cols)
            .map(|j| (0..m.rows).map(|i| i * m.cols + j).collect())
            .collect()
    } else {
        (0..m.rows)
            .map(|i| (0..m.cols).map(|j| i * m.cols + j).collect())
            .collect()
    }
}

fn reduce(m: &Matrix, axis: u8, init: f64, f: impl Fn(f64, f64) -> f64) -> Result<Matrix, String> {
    check_axis(axis)?;
    let data: Vec<f64> = lanes(m, axis)
        .iter()
        .map(|lane| lane.iter().fold(init, |acc, &k| f(acc, m.data[k])))
        .collect();
    Ok(if axis == 0 {
        Matrix {
            rows: 1,
            cols: m.cols,
            data,
        }
    } else {
        Matrix {
            rows: m.rows,
            cols: 1,
            data,
        }
    })
}

/// Numerically stable softmax: exp(x - max) / sum along the axis.
fn softmax(mut m: Matrix, axis: u8) -> Result<Matrix, String> {
    check_axis(axis)?;
    if axis == 1 {
        // Rows lie contiguous: each row on its own, rows in parallel (the
        // same operations in the same order as a lane below).
        let cols = m.cols;
        rows_in_parallel(&mut m.data, cols, |_, row| {
            let mx = row
                .iter()
                .fold(f64::NEG_INFINITY, |acc, &v| max_nan(acc, v));
            row.iter_mut().for_each(|v| *v -= mx);
            lanes::map(Func::Exp, row);
            let sum = row.iter().fold(0.0, |acc, &v| acc + v);
            row.iter_mut().for_each(|v| *v /= sum);
        });
        return Ok(m);
    }
    for lane in lanes(&m, axis) {
        let mx = lane
            .iter()
            .fold(f64::NEG_INFINITY, |acc, &k| max_nan(acc, m.data[k]));
        let mut sum = 0.0;
        for &k in &lane {
            let e = lanes::exp(m.data[k] - mx);
            m.data[k] = e;
            sum += e;
        }
        for &k in &lane {
            m.data[k] /= sum;
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::lanes::erf;
    use super::*;

    fn t(name: &str) -> Box<Expr> {
        Box::new(Expr::Tensor(name.into()))
    }

    fn inputs(name: &str) -> Result<Matrix, String> {
        match name {
            // [[1,2,3],[4,5,6]]
            "a" => Matrix::new(2, 3, vec![1., 2., 3., 4., 5., 6.]),
            // [[7,8],[9,10],[11,12]]
            "b" => Matrix::new(3, 2, vec![7., 8., 9., 10., 11., 12.]),
            "row" => Matrix::new(1, 3, vec![10., 20., 30.]),
            "col" => Matrix::new(2, 1, vec![1., 2.]),
            // [[1,2],[3,4],[5,6],[7,8]]
            "q" => Matrix::new(4, 2, vec![1., 2., 3., 4., 5., 6., 7., 8.]),
            // A shape with no elements.
            "empty" => Matrix::new(0, 3, vec![]),
            _ => Err(format!("no tensor {name:?}")),
        }
    }

    fn eval(e: Expr) -> Result<Matrix, String> {
        Evaluator {
            tensor: &inputs,
            max_elems: 1 << 20,
        }
        .eval(&e)
    }

    #[test]
    fn a_repeated_matmul_is_evaluated_once() {
        // GELU's shape: x * 0.5 * (1 + erf(x * c)) with x = a . b twice,
        // and a . b a third time inside another repeated product.
        let x = || Box::new(Expr::Matmul(t("a"), t("b")));
        let gelu = |x: Box<Expr>, x2: Box<Expr>| {
            Expr::Mul(
                Box::new(Expr::Mul(x, Box::new(Expr::Scalar(0.5)))),
                Box::new(Expr::Add(
                    Box::new(Expr::Scalar(1.0)),
                    Box::new(Expr::Erf(Box::new(Expr::Mul(
                        x2,
                        Box::new(Expr::Scalar(0.7)),
                    )))),
                )),
            )
        };
        let outer = |x: Box<Expr>| Box::new(Expr::Matmul(t("q"), Box::new(Expr::Transpose(x))));
        let e = Expr::Add(
            Box::new(gelu(x(), x())),
            Box::new(Expr::Matmul(
                Box::new(Expr::Transpose(outer(x()))),
                outer(x()),
            )),
        );
        let lookups = std::cell::Cell::new(0);
        let counting = |name: &str| {
            lookups.set(lookups.get() + 1);
            inputs(name)
        };
        let ev = Evaluator {
            tensor: &counting,
            max_elems: 1 << 20,
        };
        let got = ev.eval(&e).unwrap();
        // a and b for the first x; q for the first outer product (whose
        // x is the first x again); the second outer product reused.
        assert_eq!(lookups.get(), 3);
        // Room to keep x (4 elements) but not x and an outer product
        // (8 more) at once: x is kept, each outer product evaluated.
        lookups.set(0);
        let tight = Evaluator {
            tensor: &counting,
            max_elems: 8,
        };
        let again = tight.eval(&e).unwrap();
        assert_eq!(lookups.get(), 4);
        assert!(
            again
                .data
                .iter()
                .zip(&got.data)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
        // The same expression with every repeat spelled differently (b
        // under another name), evaluated in full, gives the same bits.
        let renamed = |name: &str| inputs(if name.starts_with('b') { "b" } else { name });
        let full = Evaluator {
            tensor: &renamed,
            max_elems: 1 << 20,
        };
        let y = |i: usize| Box::new(Expr::Matmul(t("a"), t(&format!("b{i}"))));
        let e2 = Expr::Add(
            Box::new(gelu(y(0), y(1))),
            Box::new(Expr::Matmul(
                Box::new(Expr::Transpose(outer(y(2)))),
                Box::new(Expr::Matmul(t("q"), Box::new(Expr::Transpose(y(3))))),
            )),
        );
        let want = full.eval(&e2).unwrap();
        assert_eq!((got.rows, got.cols), (2, 2));
        assert!(
            got.data
                .iter()
                .zip(&want.data)
                .all(|(g, w)| g.to_bits() == w.to_bits())
        );
    }

    #[test]
    fn matmul_matches_hand_computation() {
        let m = eval(Expr::Matmul(t("a"), t("b"))).unwrap();
        assert_eq!(m, Matrix::new(2, 2, vec![58., 64., 139., 154.]).unwrap());
        // (a.b)^T = b^T . a^T
        let lhs = eval(Expr::Transpose(Box::new(Expr::Matmul(t("a"), t("b"))))).unwrap();
        let rhs = eval(Expr::Matmul(
            Box::new(Expr::Transpose(t("b"))),
            Box::new(Expr::Transpose(t("a"))),
        ))
        .unwrap();
        assert_eq!(lhs, rhs);
        assert!(
            eval(Expr::Matmul(t("a"), t("a")))
                .unwrap_err()
                .contains("inner")
        );
    }

    /// Rows (contiguous, in parallel) and columns (by lanes) are the same
    /// computation: softmax along rows is softmax along the transpose's
    /// columns, bit for bit.
    #[test]
    fn softmax_along_rows_is_along_the_transposes_columns() {
        let (rows, cols) = (300, 257);
        let val = |i: usize| ((i * 7919 % 1013) as f64 - 506.0) / 37.0;
        let m = Matrix::new(rows, cols, (0..rows * cols).map(val).collect()).unwrap();
        let mut t = Vec::with_capacity(rows * cols);
        for j in 0..cols {
            for i in 0..rows {
                t.push(m.get(i, j));
            }
        }
        let by_rows = softmax(m, 1).unwrap();
        let by_cols = softmax(Matrix::new(cols, rows, t).unwrap(), 0).unwrap();
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(by_rows.get(i, j).to_bits(), by_cols.get(j, i).to_bits());
            }
        }
    }

    #[test]
    fn softmax_rows_and_columns_sum_to_one() {
        for axis in [0u8, 1] {
            let m = eval(Expr::Softmax {
                input: t("a"),
                axis,
            })
            .unwrap();
            let sums = eval(Expr::Sum {
                input: Box::new(Expr::Softmax {
                    input: t("a"),
                    axis,
                }),
                axis,
            })
            .unwrap();
            for s in &sums.data {
                assert!((s - 1.0).abs() < 1e-15, "axis {axis}: {s}");
            }
            assert!(m.data.iter().all(|&v| v > 0.0 && v < 1.0));
        }
        // Row [1,2,3]: softmax = e^(x-3) / sum, by hand.
        let m = eval(Expr::Softmax {
            input: t("a"),
            axis: 1,
        })
        .unwrap();
        let z = (-2f64).exp() + (-1f64).exp() + 1.0;
        assert!((m.get(0, 2) - 1.0 / z).abs() < 1e-15);
        // Large values do not overflow.
        let big = Expr::Softmax {
            input: Box::new(Expr::Mul(t("a"), Box::new(Expr::Scalar(1000.0)))),
            axis: 1,
        };
        assert!(eval(big).unwrap().data.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn elementwise_ops_broadcast() {
        let m = eval(Expr::Add(t("a"), t("row"))).unwrap();
        assert_eq!(m.data, [11., 22., 33., 14., 25., 36.]);
        let m = eval(Expr::Sub(t("a"), t("col"))).unwrap();
        assert_eq!(m.data, [0., 1., 2., 2., 3., 4.]);
        let m = eval(Expr::Div(t("a"), Box::new(Expr::Scalar(2.0)))).unwrap();
        assert_eq!(m.data, [0.5, 1., 1.5, 2., 2.5, 3.]);
        let m = eval(Expr::Mul(t("col"), t("row"))).unwrap();
        assert_eq!((m.rows, m.cols), (2, 3));
        assert_eq!(m.data, [10., 20., 30., 20., 40., 60.]);
        assert!(
            eval(Expr::Add(t("a"), t("b")))
                .unwrap_err()
                .contains("broadcast")
        );
        // fdlibm's exp(1) is e rounded up, one ulp above the nearest.
        let e = eval(Expr::Exp(Box::new(Expr::Scalar(1.0)))).unwrap();
        assert_eq!(e.data, [f64::from_bits(std::f64::consts::E.to_bits() + 1)]);
    }

    /// The smaller operand first: `f(x, y)` keeps its operand order
    /// whichever operand's buffer the result is written over.
    #[test]
    fn broadcast_keeps_operand_order_when_the_first_is_smaller() {
        let m = eval(Expr::Sub(t("row"), t("a"))).unwrap();
        assert_eq!(m.data, [9., 18., 27., 6., 15., 24.]);
        let m = eval(Expr::Div(s(12.0), t("a"))).unwrap();
        assert_eq!(m.data, [12., 6., 4., 3., 2.4, 2.]);
        let m = eval(Expr::Lt(t("col"), t("a"))).unwrap();
        assert_eq!(m.data, [0., 1., 1., 1., 1., 1.]);
        let m = eval(Expr::Sub(t("a"), t("a"))).unwrap();
        assert_eq!(m.data, [0.; 6]);
    }

    /// Large operands (rows split across the pool): every element is the
    /// plain loop's, bit for bit, for each operand shape and order.
    #[test]
    fn large_broadcasts_are_the_plain_loop_bit_for_bit() {
        let (rows, cols) = (300, 517);
        let val = |i: usize| ((i * 7919 % 1013) as f64 - 506.0) / 97.0;
        let full = Matrix::new(rows, cols, (0..rows * cols).map(val).collect()).unwrap();
        let row = Matrix::new(1, cols, (0..cols).map(|i| val(i + 5)).collect()).unwrap();
        let col = Matrix::new(rows, 1, (0..rows).map(|i| val(i + 9)).collect()).unwrap();
        let ev = Evaluator {
            tensor: &|_| Err("none".into()),
            max_elems: 1 << 30,
        };
        let div = |x: f64, y: f64| x / (y + 0.5);
        for (a, b) in [
            (&full, &full),
            (&full, &row),
            (&row, &full),
            (&full, &col),
            (&col, &full),
            (&col, &row),
        ] {
            let got = ev.broadcast("div", a.clone(), b.clone(), div).unwrap();
            assert_eq!((got.rows, got.cols), (rows, cols));
            for i in 0..rows {
                for j in 0..cols {
                    let pick = |m: &Matrix| {
                        m.get(
                            if m.rows == 1 { 0 } else { i },
                            if m.cols == 1 { 0 } else { j },
                        )
                    };
                    let want = div(pick(a), pick(b));
                    assert_eq!(got.get(i, j).to_bits(), want.to_bits(), "{i} {j}");
                }
            }
        }
        let got = map(full.clone(), f64::exp);
        assert!(
            got.data
                .iter()
                .zip(&full.data)
                .all(|(g, x)| g.to_bits() == x.exp().to_bits())
        );
        // The vector functions, in parallel pieces: libm's bits.
        let got = map_lanes(full.clone(), Func::Erf);
        assert!(
            got.data
                .iter()
                .zip(&full.data)
                .all(|(g, x)| g.to_bits() == libm::erf(*x).to_bits())
        );
    }

    #[test]
    fn reductions_give_rows_or_columns() {
        let s0 = eval(Expr::Sum {
            input: t("a"),
            axis: 0,
        })
        .unwrap();
        assert_eq!(
            (s0.rows, s0.cols, s0.data.clone()),
            (1, 3, vec![5., 7., 9.])
        );
        let s1 = eval(Expr::Sum {
            input: t("a"),
            axis: 1,
        })
        .unwrap();
        assert_eq!((s1.rows, s1.cols, s1.data.clone()), (2, 1, vec![6., 15.]));
        let m1 = eval(Expr::Max {
            input: t("b"),
            axis: 1,
        })
        .unwrap();
        assert_eq!(m1.data, [8., 10., 12.]);
        assert!(
            eval(Expr::Max {
                input: t("b"),
                axis: 2
            })
            .is_err()
        );
    }

    fn s(v: f64) -> Box<Expr> {
        Box::new(Expr::Scalar(v))
    }

    #[test]
    fn unary_ops_match_hand_values() {
        let m = eval(Expr::Sqrt(t("a"))).unwrap();
        assert_eq!(m.data[3], 2.0);
        let m = eval(Expr::Rsqrt(t("a"))).unwrap();
        assert_eq!(m.data[3], 0.5);
        let m = eval(Expr::Log(s(1.0))).unwrap();
        assert_eq!(m.data, [0.0]);
        let m = eval(Expr::Abs(Box::new(Expr::Neg(t("a"))))).unwrap();
        assert_eq!(m.data, [1., 2., 3., 4., 5., 6.]);
        let m = eval(Expr::Neg(t("col"))).unwrap();
        assert_eq!((m.rows, m.cols, m.data), (2, 1, vec![-1., -2.]));
        // tanh(x) = (e^2x - 1) / (e^2x + 1); sigmoid(0) = 1/2.
        let m = eval(Expr::Tanh(s(0.5))).unwrap();
        assert!((m.data[0] - (1f64.exp() - 1.0) / (1f64.exp() + 1.0)).abs() < 1e-16);
        assert_eq!(eval(Expr::Sigmoid(s(0.0))).unwrap().data, [0.5]);
        let m = eval(Expr::Sigmoid(s(2.0))).unwrap();
        assert!((m.data[0] - 1.0 / (1.0 + (-2f64).exp())).abs() < 1e-16);
        assert_eq!(eval(Expr::Sigmoid(s(-1000.0))).unwrap().data, [0.0]);
    }

    #[test]
    fn erf_matches_tabulated_values() {
        // erf to 16 digits (the nearest f64 values).
        let table = [
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (1.5, 0.9661051464753108),
            (2.0, 0.9953222650189527),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
        ];
        for (x, want) in table {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erf(x);
                assert!((got - want).abs() <= 3e-15 * want.abs(), "erf({x}) = {got}");
            }
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
        // Tiny x: erf(x) = 2x/sqrt(pi).
        let tiny = std::f64::consts::FRAC_2_SQRT_PI * 1e-300;
        assert!((erf(1e-300) - tiny).abs() <= 2e-16 * tiny);
        let m = eval(Expr::Erf(t("col"))).unwrap();
        assert_eq!(m.data, [erf(1.0), erf(2.0)]);
    }

    #[test]
    fn binary_ops_comparisons_and_where_broadcast() {
        // maximum(a, 2x1 column [1, 2] -> broadcast): [[1,2,3],[4,5,6]].
        let m = eval(Expr::Maximum(t("a"), Box::new(Expr::Scalar(3.5)))).unwrap();
        assert_eq!(m.data, [3.5, 3.5, 3.5, 4., 5., 6.]);
        let m = eval(Expr::Minimum(t("col"), t("row"))).unwrap();
        assert_eq!((m.rows, m.cols), (2, 3));
        assert_eq!(m.data, [1., 1., 1., 2., 2., 2.]);
        let m = eval(Expr::Maximum(s(f64::NAN), s(1.0))).unwrap();
        assert!(m.data[0].is_nan(), "maximum propagates NaN");
        let m = eval(Expr::Pow(t("col"), t("row"))).unwrap();
        assert_eq!(m.data, [1., 1., 1., 1024., 1048576., 1073741824.]);
        // a (2x3) against the column [1, 2]: row 0 vs 1, row 1 vs 2.
        let cmp = |e: fn(Box<Expr>, Box<Expr>) -> Expr| eval(e(t("a"), t("col"))).unwrap().data;
        assert_eq!(cmp(Expr::Lt), [0., 0., 0., 0., 0., 0.]);
        assert_eq!(cmp(Expr::Le), [1., 0., 0., 0., 0., 0.]);
        assert_eq!(cmp(Expr::Gt), [0., 1., 1., 1., 1., 1.]);
        assert_eq!(cmp(Expr::Ge), [1., 1., 1., 1., 1., 1.]);
        assert_eq!(cmp(Expr::Eq), [1., 0., 0., 0., 0., 0.]);
        assert_eq!(cmp(Expr::Ne), [0., 1., 1., 1., 1., 1.]);
        let nan = || s(f64::NAN);
        assert_eq!(eval(Expr::Eq(nan(), nan())).unwrap().data, [0.0]);
        assert_eq!(eval(Expr::Ne(nan(), nan())).unwrap().data, [1.0]);
        assert_eq!(eval(Expr::Lt(nan(), s(1.0))).unwrap().data, [0.0]);
        // where(a > 2.5, a, row): three shapes, one 2x3 result.
        let m = eval(Expr::Where {
            cond: Box::new(Expr::Gt(t("a"), s(2.5))),
            a: t("a"),
            b: t("row"),
        })
        .unwrap();
        assert_eq!((m.rows, m.cols), (2, 3));
        assert_eq!(m.data, [10., 20., 3., 4., 5., 6.]);
        // A column condition, scalar branches: a 2x1 result.
        let m = eval(Expr::Where {
            cond: Box::new(Expr::Sub(t("col"), s(1.0))),
            a: s(7.0),
            b: s(-7.0),
        })
        .unwrap();
        assert_eq!((m.rows, m.cols, m.data), (2, 1, vec![-7., 7.]));
        let err = eval(Expr::Where {
            cond: t("a"),
            a: t("b"),
            b: s(0.0),
        })
        .unwrap_err();
        assert!(err.contains("where of 2 x 3 and 3 x 2 and 1 x 1"), "{err}");
        assert!(
            eval(Expr::Lt(t("a"), t("b")))
                .unwrap_err()
                .contains("lt of")
        );
    }

    #[test]
    fn mean_and_min_keep_dims_and_broadcast_back() {
        let m = eval(Expr::Mean {
            input: t("a"),
            axis: 1,
        })
        .unwrap();
        assert_eq!((m.rows, m.cols, m.data), (2, 1, vec![2., 5.]));
        let m = eval(Expr::Mean {
            input: t("a"),
            axis: 0,
        })
        .unwrap();
        assert_eq!((m.rows, m.cols, m.data), (1, 3, vec![2.5, 3.5, 4.5]));
        let m = eval(Expr::Min {
            input: t("b"),
            axis: 0,
        })
        .unwrap();
        assert_eq!((m.rows, m.cols, m.data), (1, 2, vec![7., 8.]));
        let m = eval(Expr::Min {
            input: t("b"),
            axis: 1,
        })
        .unwrap();
        assert_eq!((m.rows, m.cols, m.data), (3, 1, vec![7., 9., 11.]));
        // x - mean(x, 1): the row means broadcast across columns.
        let m = eval(Expr::Sub(
            t("a"),
            Box::new(Expr::Mean {
                input: t("a"),
                axis: 1,
            }),
        ))
        .unwrap();
        assert_eq!(m.data, [-1., 0., 1., -1., 0., 1.]);
        let m = eval(Expr::Min {
            input: Box::new(Expr::Div(t("col"), s(0.0))),
            axis: 0,
        })
        .unwrap();
        assert_eq!(m.data, [f64::INFINITY]);
        assert!(
            eval(Expr::Mean {
                input: t("a"),
                axis: 2
            })
            .is_err()
        );
    }

    #[test]
    fn philox_matches_random123_known_answers() {
        assert_eq!(
            philox_words([0; 4], 0),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        let m = 0xFFFF_FFFF;
        assert_eq!(
            philox_words([m; 4], u64::MAX),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox_words(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                0x299f_31d0_a409_3822
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
        // First word 0x6627e8d5 is positive as an i32.
        assert_eq!(
            philox_uniform(0, 0.0),
            0x6627_e8d5 as f64 * 4.6566127342e-10
        );
        assert!(philox_uniform(0, 0.5).is_nan());
    }

    #[test]
    fn positions_masks_scans_and_blocks() {
        let iota = |rows, cols, axis| Box::new(Expr::Iota { rows, cols, axis });
        // A causal mask: column <= row.
        let m = eval(Expr::Le(iota(1, 3, 1), iota(3, 1, 0))).unwrap();
        assert_eq!(m.data, [1., 0., 0., 1., 1., 0., 1., 1., 1.]);
        let ones = || {
            Box::new(Expr::Add(
                Box::new(Expr::Mul(iota(3, 3, 0), s(0.0))),
                s(1.0),
            ))
        };
        let m = eval(Expr::Tril {
            input: ones(),
            diagonal: 0,
        })
        .unwrap();
        assert_eq!(m.data, [1., 0., 0., 1., 1., 0., 1., 1., 1.]);
        let m = eval(Expr::Triu {
            input: ones(),
            diagonal: 1,
        })
        .unwrap();
        assert_eq!(m.data, [0., 1., 1., 0., 0., 1., 0., 0., 0.]);
        let m = eval(Expr::Tril {
            input: ones(),
            diagonal: -1,
        })
        .unwrap();
        assert_eq!(m.data, [0., 0., 0., 1., 0., 0., 1., 1., 0.]);
        // a = [[1, 2, 3], [4, 5, 6]]
        let m = eval(Expr::Cumsum {
            input: t("a"),
            axis: 1,
        })
        .unwrap();
        assert_eq!(m.data, [1., 3., 6., 4., 9., 15.]);
        let m = eval(Expr::Cumprod {
            input: t("a"),
            axis: 0,
        })
        .unwrap();
        assert_eq!(m.data, [1., 2., 3., 4., 10., 18.]);
        let m = eval(Expr::Cummax {
            input: Box::new(Expr::Neg(t("a"))),
            axis: 1,
        })
        .unwrap();
        assert_eq!(m.data, [-1., -1., -1., -4., -4., -4.]);
        let m = eval(Expr::Reshape {
            input: t("a"),
            rows: 3,
            cols: 2,
        })
        .unwrap();
        assert_eq!((m.rows, m.data), (3, vec![1., 2., 3., 4., 5., 6.]));
        let m = eval(Expr::Slice {
            input: t("a"),
            row: 1,
            col: 1,
            rows: 1,
            cols: 2,
        })
        .unwrap();
        assert_eq!(m.data, [5., 6.]);
        let m = eval(Expr::Concat {
            a: t("a"),
            b: t("col"),
            axis: 1,
        })
        .unwrap();
        assert_eq!((m.cols, m.data), (4, vec![1., 2., 3., 1., 4., 5., 6., 2.]));
        let m = eval(Expr::Concat {
            a: t("a"),
            b: t("a"),
            axis: 0,
        })
        .unwrap();
        assert_eq!(m.rows, 4);
        assert!(
            eval(Expr::Concat {
                a: t("a"),
                b: t("col"),
                axis: 0
            })
            .unwrap_err()
            .contains("column counts")
        );
        assert!(
            eval(Expr::Slice {
                input: t("a"),
                row: 1,
                col: 0,
                rows: 2,
                cols: 1
            })
            .unwrap_err()
            .contains("not within")
        );
    }

    #[test]
    fn logic_rounding_and_remainders() {
        let and = eval(Expr::And(s(2.0), s(0.0))).unwrap().data;
        let or = eval(Expr::Or(s(2.0), s(0.0))).unwrap().data;
        let xor = eval(Expr::Xor(s(2.0), s(1.0))).unwrap().data;
        let not = eval(Expr::Not(s(0.0))).unwrap().data;
        assert_eq!([and, or, xor, not], [[0.0], [1.0], [0.0], [1.0]]);
        assert_eq!(eval(Expr::Floor(s(-1.5))).unwrap().data, [-2.0]);
        assert_eq!(eval(Expr::Ceil(s(-1.5))).unwrap().data, [-1.0]);
        // fmod: the sign of the dividend.
        assert_eq!(eval(Expr::Rem(s(-7.0), s(3.0))).unwrap().data, [-1.0]);
        assert_eq!(eval(Expr::Rem(s(7.0), s(-3.0))).unwrap().data, [1.0]);
        assert_eq!(eval(Expr::Log2(s(8.0))).unwrap().data, [3.0]);
        assert_eq!(eval(Expr::Sin(s(0.0))).unwrap().data, [0.0]);
        assert_eq!(eval(Expr::Cos(s(0.0))).unwrap().data, [1.0]);
        let m = eval(Expr::Clamp {
            input: t("a"),
            lo: s(2.0),
            hi: s(5.0),
        })
        .unwrap();
        assert_eq!(m.data, [2., 2., 3., 4., 5., 5.]);
    }

    #[test]
    fn sum_blocks_adds_equal_row_blocks() {
        let sb = |input, blocks| eval(Expr::SumBlocks { input, blocks });
        // Blocks [[1,2],[3,4]] and [[5,6],[7,8]]: [[6,8],[10,12]].
        let m = sb(t("q"), 2).unwrap();
        assert_eq!(m, Matrix::new(2, 2, vec![6., 8., 10., 12.]).unwrap());
        // Four 1-row blocks: the column sums [1+3+5+7, 2+4+6+8].
        assert_eq!(sb(t("q"), 4).unwrap().data, [16., 20.]);
        // One block is the input itself.
        assert_eq!(sb(t("q"), 1).unwrap(), inputs("q").unwrap());
        // Composes: blocks of a - a summed are zero.
        let m = sb(Box::new(Expr::Sub(t("q"), t("q"))), 2).unwrap();
        assert_eq!((m.rows, m.cols, m.data), (2, 2, vec![0.; 4]));
        // No rows split into any number of blocks, even a huge one.
        let m = sb(t("empty"), u64::MAX).unwrap();
        assert_eq!((m.rows, m.cols, m.data), (0, 3, vec![]));
    }

    #[test]
    fn tile_stacks_rows() {
        let tile = |input, reps| eval(Expr::Tile { input, reps });
        let m = tile(t("q"), 3).unwrap();
        assert_eq!((m.rows, m.cols), (12, 2));
        #[rustfmt::skip]
        let want = [
            1., 2., 3., 4., 5., 6., 7., 8.,
            1., 2., 3., 4., 5., 6., 7., 8.,
            1., 2., 3., 4., 5., 6., 7., 8.,
        ];
        assert_eq!(m.data, want);
        // A row tiled: [[10,20,30],[10,20,30]].
        let m = tile(t("row"), 2).unwrap();
        assert_eq!((m.rows, m.cols), (2, 3));
        assert_eq!(m.data, [10., 20., 30., 10., 20., 30.]);
        assert_eq!(tile(t("q"), 1).unwrap(), inputs("q").unwrap());
        // sum_blocks(tile(x, 3), 3) = 3x.
        let m = eval(Expr::SumBlocks {
            input: Box::new(Expr::Tile {
                input: t("a"),
                reps: 3,
            }),
            blocks: 3,
        })
        .unwrap();
        assert_eq!(
            m,
            Matrix::new(2, 3, vec![3., 6., 9., 12., 15., 18.]).unwrap()
        );
        // Nothing tiled is nothing, however many times.
        let m = tile(t("empty"), u64::MAX).unwrap();
        assert_eq!((m.rows, m.cols, m.data), (0, 3, vec![]));
    }

    #[test]
    fn sum_blocks_and_tile_errors() {
        let err = eval(Expr::SumBlocks {
            input: t("q"),
            blocks: 0,
        })
        .unwrap_err();
        assert_eq!(
            err,
            "sum_blocks of 4 x 2 into 0 blocks: blocks must be at least 1"
        );
        let err = eval(Expr::SumBlocks {
            input: t("q"),
            blocks: 3,
        })
        .unwrap_err();
        assert_eq!(
            err,
            "sum_blocks of 4 x 2 into 3 blocks: 4 rows do not split evenly"
        );
        let err = eval(Expr::SumBlocks {
            input: t("q"),
            blocks: 8,
        })
        .unwrap_err();
        assert!(err.contains("4 rows do not split evenly"), "{err}");
        let err = eval(Expr::Tile {
            input: t("q"),
            reps: 0,
        })
        .unwrap_err();
        assert_eq!(err, "tile of 4 x 2 0 times: reps must be at least 1");
        // reps * rows overflows: an error, not a panic or an allocation.
        let err = eval(Expr::Tile {
            input: t("q"),
            reps: u64::MAX,
        })
        .unwrap_err();
        assert!(
            err.starts_with("tile of 4 x 2 18446744073709551615 times"),
            "{err}"
        );
        assert!(err.contains("too large"), "{err}");
        // Fits in usize but not in max_elems (1 << 20).
        let err = eval(Expr::Tile {
            input: t("q"),
            reps: 1 << 20,
        })
        .unwrap_err();
        assert_eq!(
            err,
            "tile of 4 x 2 1048576 times: a 4194304 x 2 intermediate is too large"
        );
        let small = Evaluator {
            tensor: &inputs,
            max_elems: 3,
        };
        let err = small
            .eval(&Expr::SumBlocks {
                input: t("q"),
                blocks: 1,
            })
            .unwrap_err();
        assert!(err.contains("too large"), "{err}");
        assert_eq!(
            small
                .eval(&Expr::SumBlocks {
                    input: t("q"),
                    blocks: 4,
                })
                .unwrap()
                .data,
            [16., 20.]
        );
    }

    #[test]
    fn errors_and_limits() {
        assert!(
            eval(Expr::Tensor("nope".into()))
                .unwrap_err()
                .contains("nope")
        );
        let mut e = Expr::Scalar(1.0);
        for _ in 0..300 {
            e = Expr::Exp(Box::new(e));
        }
        assert!(eval(e).unwrap_err().contains("deeper"));
        let small = Evaluator {
            tensor: &inputs,
            max_elems: 3,
        };
        assert!(
            small
                .eval(&Expr::Matmul(t("a"), t("b")))
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn matrix_shapes_fold_leading_dims() {
        assert_eq!(matrix_shape(&[]), Some((1, 1)));
        assert_eq!(matrix_shape(&[5]), Some((1, 5)));
        assert_eq!(matrix_shape(&[2, 3, 4]), Some((6, 4)));
        assert_eq!(matrix_shape(&[u64::MAX, 2, 1]), None);
    }
}
