//! Static checks of reference expressions: the shape an [`Expr`] has
//! over tensors of given shapes, with errors that name the problem, so a
//! producer (kb-sim, when the program is built) can refuse a bad verify
//! spec before running anything. The rules are kb-replay's reference
//! evaluator's (`kb-replay/src/reference.rs`), which computes the values.

use crate::Expr;

/// Deepest nesting [`Expr::shape`] follows (kb-replay's evaluator stops
/// at 256 too).
const MAX_DEPTH: usize = 256;

fn axis_ok(what: &str, axis: u8) -> Result<(), String> {
    if axis > 1 {
        return Err(format!("{what}: axis {axis} is not 0 or 1"));
    }
    Ok(())
}

fn fmt(s: (u64, u64)) -> String {
    format!("{} x {}", s.0, s.1)
}

/// The numpy broadcast of `shapes` (per dim: all equal, or 1).
fn broadcast(what: &str, shapes: &[(u64, u64)]) -> Result<(u64, u64), String> {
    let dim = |a: u64, b: u64| match (a, b) {
        (a, b) if a == b => Some(a),
        (1, b) => Some(b),
        (a, 1) => Some(a),
        _ => None,
    };
    shapes
        .iter()
        .try_fold((1, 1), |(r, c), &(sr, sc)| Some((dim(r, sr)?, dim(c, sc)?)))
        .ok_or_else(|| {
            let s: Vec<String> = shapes.iter().map(|&s| fmt(s)).collect();
            format!("{what} of {}: shapes do not broadcast", s.join(" and "))
        })
}

/// A tensor's `(rows, cols)` by name, or why there is none.
pub type TensorShape<'a> = dyn Fn(&str) -> Result<(u64, u64), String> + 'a;

impl Expr {
    /// The `(rows, cols)` of this expression's value, `tensor` giving each
    /// named tensor's (or an error, such as "no tensor named ..."); an
    /// error says which operator and shapes do not fit.
    pub fn shape(&self, tensor: &TensorShape<'_>) -> Result<(u64, u64), String> {
        self.shape_at(tensor, 0)
    }

    fn shape_at(&self, tensor: &TensorShape<'_>, depth: usize) -> Result<(u64, u64), String> {
        if depth > MAX_DEPTH {
            return Err(format!("expression nests deeper than {MAX_DEPTH} levels"));
        }
        let s = |e: &Expr| e.shape_at(tensor, depth + 1);
        let bin = |what: &str, a: &Expr, b: &Expr| broadcast(what, &[s(a)?, s(b)?]);
        Ok(match self {
            Expr::Tensor(name) => tensor(name)?,
            Expr::Scalar(_) => (1, 1),
            Expr::Matmul(a, b) => {
                let (a, b) = (s(a)?, s(b)?);
                if a.1 != b.0 {
                    return Err(format!(
                        "matmul of {} by {}: inner dimensions differ",
                        fmt(a),
                        fmt(b)
                    ));
                }
                (a.0, b.1)
            }
            Expr::Transpose(a) => {
                let (r, c) = s(a)?;
                (c, r)
            }
            Expr::Add(a, b) => bin("add", a, b)?,
            Expr::Sub(a, b) => bin("sub", a, b)?,
            Expr::Mul(a, b) => bin("mul", a, b)?,
            Expr::Div(a, b) => bin("div", a, b)?,
            Expr::Maximum(a, b) => bin("maximum", a, b)?,
            Expr::Minimum(a, b) => bin("minimum", a, b)?,
            Expr::Pow(a, b) => bin("pow", a, b)?,
            Expr::Lt(a, b) => bin("lt", a, b)?,
            Expr::Le(a, b) => bin("le", a, b)?,
            Expr::Gt(a, b) => bin("gt", a, b)?,
            Expr::Ge(a, b) => bin("ge", a, b)?,
            Expr::Eq(a, b) => bin("eq", a, b)?,
            Expr::Ne(a, b) => bin("ne", a, b)?,
            Expr::And(a, b) => bin("and", a, b)?,
            Expr::Or(a, b) => bin("or", a, b)?,
            Expr::Xor(a, b) => bin("xor", a, b)?,
            Expr::Rem(a, b) => bin("rem", a, b)?,
            Expr::Where { cond, a, b } => broadcast("where", &[s(cond)?, s(a)?, s(b)?])?,
            Expr::Clamp { input, lo, hi } => broadcast("clamp", &[s(input)?, s(lo)?, s(hi)?])?,
            Expr::Exp(a)
            | Expr::Sqrt(a)
            | Expr::Rsqrt(a)
            | Expr::Log(a)
            | Expr::Abs(a)
            | Expr::Neg(a)
            | Expr::Tanh(a)
            | Expr::Erf(a)
            | Expr::Sigmoid(a)
            | Expr::Not(a)
            | Expr::Log2(a)
            | Expr::Sin(a)
            | Expr::Cos(a)
            | Expr::Floor(a)
            | Expr::Ceil(a)
            | Expr::Tril { input: a, .. }
            | Expr::Triu { input: a, .. } => s(a)?,
            Expr::Softmax { input, axis } => {
                axis_ok("softmax", *axis)?;
                s(input)?
            }
            Expr::Cumsum { input, axis }
            | Expr::Cumprod { input, axis }
            | Expr::Cummax { input, axis } => {
                axis_ok("cumulative op", *axis)?;
                s(input)?
            }
            Expr::Sum { input, axis }
            | Expr::Max { input, axis }
            | Expr::Min { input, axis }
            | Expr::Mean { input, axis } => {
                axis_ok("reduction", *axis)?;
                let (r, c) = s(input)?;
                if *axis == 0 { (1, c) } else { (r, 1) }
            }
            Expr::Gather { table, indices } => {
                let (t, i) = (s(table)?, s(indices)?);
                (i.0.saturating_mul(i.1), t.1)
            }
            Expr::SumBlocks { input, blocks } => {
                let (r, c) = s(input)?;
                if *blocks == 0 || !r.is_multiple_of(*blocks) {
                    return Err(format!(
                        "sum_blocks of {} into {blocks} blocks: the rows do not split evenly",
                        fmt((r, c))
                    ));
                }
                (r / blocks, c)
            }
            Expr::Tile { input, reps } => {
                let (r, c) = s(input)?;
                if *reps == 0 {
                    return Err(format!("tile of {}: reps must be at least 1", fmt((r, c))));
                }
                (r.saturating_mul(*reps), c)
            }
            Expr::Iota { rows, cols, axis } => {
                axis_ok("iota", *axis)?;
                (*rows, *cols)
            }
            Expr::Reshape { input, rows, cols } => {
                let (r, c) = s(input)?;
                if r.checked_mul(c) != rows.checked_mul(*cols) {
                    return Err(format!(
                        "reshape of {} to {}: the element counts differ",
                        fmt((r, c)),
                        fmt((*rows, *cols))
                    ));
                }
                (*rows, *cols)
            }
            Expr::Slice {
                input,
                row,
                col,
                rows,
                cols,
            } => {
                let (r, c) = s(input)?;
                let fits = |at: &u64, n: &u64, of: u64| at.checked_add(*n).is_some_and(|e| e <= of);
                if !fits(row, rows, r) || !fits(col, cols, c) {
                    return Err(format!(
                        "slice {} at ({row}, {col}) is not within {}",
                        fmt((*rows, *cols)),
                        fmt((r, c))
                    ));
                }
                (*rows, *cols)
            }
            Expr::Concat { a, b, axis } => {
                axis_ok("concat", *axis)?;
                let (a, b) = (s(a)?, s(b)?);
                match *axis {
                    0 if a.1 == b.1 => (a.0.saturating_add(b.0), a.1),
                    1 if a.0 == b.0 => (a.0, a.1.saturating_add(b.1)),
                    _ => {
                        return Err(format!(
                            "concat of {} and {} along axis {axis}: the other dims differ",
                            fmt(a),
                            fmt(b)
                        ));
                    }
                }
            }
            Expr::Rand { offsets, .. } => s(offsets)?,
            Expr::BatchedMatmul { a, b, batch } => {
                let (a, b) = (s(a)?, s(b)?);
                let what = || {
                    format!(
                        "batched matmul of {} by {} in {batch} batches",
                        fmt(a),
                        fmt(b)
                    )
                };
                if *batch == 0 || !a.0.is_multiple_of(*batch) || !b.0.is_multiple_of(*batch) {
                    return Err(format!("{}: the rows do not split evenly", what()));
                }
                if a.1 != b.0 / batch {
                    return Err(format!(
                        "{}: inner dimensions differ ({} by {})",
                        what(),
                        fmt((a.0 / batch, a.1)),
                        fmt((b.0 / batch, b.1))
                    ));
                }
                (a.0, b.1)
            }
        })
    }

    /// The names of the tensors the expression reads, each once, in
    /// order of first appearance.
    pub fn tensors(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.visit(&mut |e| {
            if let Expr::Tensor(n) = e
                && !out.contains(&n.as_str())
            {
                out.push(n.as_str());
            }
        });
        out
    }

    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        f(self);
        for c in self.children() {
            c.visit(f);
        }
    }

    /// The sub-expressions, in field order.
    pub fn children(&self) -> Vec<&Expr> {
        match self {
            Expr::Tensor(_) | Expr::Scalar(_) | Expr::Iota { .. } => Vec::new(),
            Expr::Transpose(a)
            | Expr::Exp(a)
            | Expr::Sqrt(a)
            | Expr::Rsqrt(a)
            | Expr::Log(a)
            | Expr::Abs(a)
            | Expr::Neg(a)
            | Expr::Tanh(a)
            | Expr::Erf(a)
            | Expr::Sigmoid(a)
            | Expr::Not(a)
            | Expr::Log2(a)
            | Expr::Sin(a)
            | Expr::Cos(a)
            | Expr::Floor(a)
            | Expr::Ceil(a)
            | Expr::Softmax { input: a, .. }
            | Expr::Sum { input: a, .. }
            | Expr::Max { input: a, .. }
            | Expr::Min { input: a, .. }
            | Expr::Mean { input: a, .. }
            | Expr::SumBlocks { input: a, .. }
            | Expr::Tile { input: a, .. }
            | Expr::Tril { input: a, .. }
            | Expr::Triu { input: a, .. }
            | Expr::Cumsum { input: a, .. }
            | Expr::Cumprod { input: a, .. }
            | Expr::Cummax { input: a, .. }
            | Expr::Reshape { input: a, .. }
            | Expr::Slice { input: a, .. }
            | Expr::Rand { offsets: a, .. } => vec![a],
            Expr::Matmul(a, b)
            | Expr::Add(a, b)
            | Expr::Sub(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::Maximum(a, b)
            | Expr::Minimum(a, b)
            | Expr::Pow(a, b)
            | Expr::Lt(a, b)
            | Expr::Le(a, b)
            | Expr::Gt(a, b)
            | Expr::Ge(a, b)
            | Expr::Eq(a, b)
            | Expr::Ne(a, b)
            | Expr::And(a, b)
            | Expr::Or(a, b)
            | Expr::Xor(a, b)
            | Expr::Rem(a, b)
            | Expr::Gather {
                table: a,
                indices: b,
            }
            | Expr::Concat { a, b, .. }
            | Expr::BatchedMatmul { a, b, .. } => vec![a, b],
            Expr::Where { cond, a, b } => vec![cond, a, b],
            Expr::Clamp { input, lo, hi } => vec![input, lo, hi],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: &str) -> Box<Expr> {
        Box::new(Expr::Tensor(n.into()))
    }

    fn shapes(name: &str) -> Result<(u64, u64), String> {
        match name {
            "x" => Ok((4, 6)),
            "w" => Ok((6, 3)),
            "col" => Ok((4, 1)),
            // [3, 4, 5] and [3, 5, 2] as 2-D views.
            "a3" => Ok((12, 5)),
            "b3" => Ok((15, 2)),
            _ => Err(format!("no tensor named {name:?}")),
        }
    }

    #[test]
    fn shapes_follow_the_reference_rules() {
        let sh = |e: Expr| e.shape(&shapes);
        assert_eq!(sh(Expr::Matmul(t("x"), t("w"))), Ok((4, 3)));
        assert_eq!(sh(Expr::Add(t("x"), t("col"))), Ok((4, 6)));
        assert_eq!(
            sh(Expr::Sum {
                input: t("x"),
                axis: 1
            }),
            Ok((4, 1))
        );
        let causal = Expr::Le(
            Box::new(Expr::Iota {
                rows: 1,
                cols: 6,
                axis: 1,
            }),
            Box::new(Expr::Iota {
                rows: 4,
                cols: 1,
                axis: 0,
            }),
        );
        assert_eq!(sh(causal), Ok((4, 6)));
        let cat = Expr::Concat {
            a: t("x"),
            b: t("col"),
            axis: 1,
        };
        assert_eq!(sh(cat), Ok((4, 7)));
        let sl = Expr::Slice {
            input: t("x"),
            row: 1,
            col: 2,
            rows: 3,
            cols: 4,
        };
        assert_eq!(sh(sl), Ok((3, 4)));
        assert_eq!(
            sh(Expr::Reshape {
                input: t("x"),
                rows: 8,
                cols: 3
            }),
            Ok((8, 3))
        );
    }

    fn e_shape(e: Expr) -> Result<(u64, u64), String> {
        e.shape(&shapes)
    }

    #[test]
    fn errors_name_the_problem() {
        let sh = |e: Expr| e.shape(&shapes).unwrap_err();
        assert!(sh(Expr::Exp(t("y"))).contains("\"y\""));
        assert!(sh(Expr::Matmul(t("x"), t("x"))).contains("inner dimensions"));
        assert!(sh(Expr::Add(t("x"), t("w"))).contains("4 x 6 and 6 x 3"));
        let sl = Expr::Slice {
            input: t("x"),
            row: 2,
            col: 0,
            rows: 3,
            cols: 1,
        };
        assert!(sh(sl).contains("not within 4 x 6"));
        assert!(
            sh(Expr::Reshape {
                input: t("x"),
                rows: 5,
                cols: 5
            })
            .contains("counts")
        );
        assert!(
            sh(Expr::Cumsum {
                input: t("x"),
                axis: 2
            })
            .contains("axis 2")
        );
        let bmm = |a, b, batch| Expr::BatchedMatmul { a, b, batch };
        assert_eq!(
            e_shape(bmm(t("a3"), t("b3"), 3)),
            Ok((12, 2)),
            "3 batches of 4 x 5 by 5 x 2"
        );
        assert!(sh(bmm(t("a3"), t("b3"), 4)).contains("do not split evenly"));
        assert!(
            sh(bmm(t("a3"), t("b3"), 1))
                .contains("in 1 batches: inner dimensions differ (12 x 5 by 15 x 2)")
        );
        assert!(sh(bmm(t("a3"), t("b3"), 0)).contains("do not split evenly"));
        let e = Expr::Add(t("x"), Box::new(Expr::Mul(t("col"), t("x"))));
        assert_eq!(e.tensors(), ["x", "col"]);
    }
}
