//! The reference's batched matmul ([`Expr::BatchedMatmul`]): the stacked
//! matrices of 3-D tensors' 2-D views, multiplied batch by batch in f64.

use super::{Evaluator, Matrix, matmul_into};

#[cfg(doc)]
use kb_format::Expr;

impl Evaluator<'_> {
    /// `batch` matmuls of the stacked matrices of `a` (`batch*m x k`) and
    /// `b` (`batch*k x n`), stacked (`batch*m x n`).
    pub(super) fn batched_matmul(
        &self,
        a: &Matrix,
        b: &Matrix,
        batch: u64,
    ) -> Result<Matrix, String> {
        let what = || {
            format!(
                "batched matmul of {} x {} by {} x {} in {batch} batches",
                a.rows, a.cols, b.rows, b.cols
            )
        };
        let nb = usize::try_from(batch).unwrap_or(usize::MAX);
        if nb == 0 || !a.rows.is_multiple_of(nb) || !b.rows.is_multiple_of(nb) {
            return Err(format!("{}: the rows do not split evenly", what()));
        }
        let (m, k, n) = (a.rows / nb, a.cols, b.cols);
        if b.rows / nb != k {
            return Err(format!("{}: inner dimensions differ", what()));
        }
        let len = self.alloc_check(a.rows, n)?;
        let mut c = vec![0.0; len];
        if m > 0 && n > 0 {
            for (i, out) in c.chunks_mut(m * n).enumerate() {
                let ai = &a.data[i * m * k..(i + 1) * m * k];
                let bi = &b.data[i * k * n..(i + 1) * k * n];
                matmul_into(ai, bi, k, n, out);
            }
        }
        Ok(Matrix {
            rows: a.rows,
            cols: n,
            data: c,
        })
    }
}

#[cfg(test)]
mod tests {
    use kb_format::Expr;

    use super::*;

    /// `a` (3 x 4 x 5) and `b` (3 x 5 x 2) as 2-D views, of small whole
    /// numbers so every sum is exact.
    fn inputs(name: &str) -> Result<Matrix, String> {
        match name {
            "a" => Matrix::new(12, 5, (0..60).map(|i| (i % 7) as f64 - 3.0).collect()),
            "b" => Matrix::new(15, 2, (0..30).map(|i| (i % 5) as f64 - 2.0).collect()),
            _ => Err(format!("no tensor {name:?}")),
        }
    }

    fn eval(batch: u64) -> Result<Matrix, String> {
        Evaluator {
            tensor: &inputs,
            max_elems: 1 << 20,
        }
        .eval(&Expr::BatchedMatmul {
            a: Box::new(Expr::Tensor("a".into())),
            b: Box::new(Expr::Tensor("b".into())),
            batch,
        })
    }

    #[test]
    fn each_batch_is_its_own_matmul() {
        let (a, b) = (inputs("a").unwrap(), inputs("b").unwrap());
        let got = eval(3).unwrap();
        assert_eq!((got.rows, got.cols), (12, 2));
        // The triple loop, batch by batch.
        for bi in 0..3 {
            for i in 0..4 {
                for j in 0..2 {
                    let mut want = 0.0;
                    for p in 0..5 {
                        want += a.data[(bi * 4 + i) * 5 + p] * b.data[(bi * 5 + p) * 2 + j];
                    }
                    assert_eq!(got.data[(bi * 4 + i) * 2 + j], want, "{bi} {i} {j}");
                }
            }
        }
        // One batch is a plain matmul only when the shapes fit: 12 x 5
        // by 15 x 2 do not.
        let e = eval(1).unwrap_err();
        assert!(e.contains("inner dimensions differ"), "{e}");
        let e = eval(4).unwrap_err();
        assert!(e.contains("the rows do not split evenly"), "{e}");
        assert!(eval(0).is_err());
    }
}
