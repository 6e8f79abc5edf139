//! Tensor shapes of 1 to [`MAX_RANK`] dimensions (issue 34).
//!
//! A tensor is declared with its N-d dims (outermost first, row-major);
//! everything that stores, shards, places or moves it works on its 2-D
//! view `[product of the leading dims, last dim]` ([`Shape::matrix`]):
//! rows of the view are sharded as a 2-D tensor's rows, so every memory
//! model and placement holds an N-d tensor unchanged. A 1-D `[n]` tensor
//! is the view `[1, n]`; a 2-D one is its own view. The trace records the
//! N-d dims (`TensorMeta::shape`).

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

/// Most dimensions a tensor may have.
pub const MAX_RANK: usize = 6;

/// A tensor's dimensions, outermost first (row-major). Built from
/// `[u64; N]`, `&[u64]` or `Vec<u64>`, so `prog.zeros("y", dt, [r, c], ..)`
/// and `prog.zeros("y", dt, [b, r, c], ..)` both read naturally. Not
/// checked when built: [`Shape::check`] says what is wrong with it (the
/// program API refuses a bad shape naming the tensor).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(Vec<u64>);

impl Shape {
    /// The dims, outermost first.
    pub fn dims(&self) -> &[u64] {
        &self.0
    }

    /// How many dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The 2-D view `[product of the leading dims, last dim]` storage,
    /// sharding and the kernel API's `shape` use (`[1, n]` for `[n]`).
    /// Saturates on overflow (which [`Shape::check`] refuses).
    pub fn matrix(&self) -> [u64; 2] {
        match self.0.split_last() {
            None => [1, 1],
            Some((&last, lead)) => [
                lead.iter().fold(1u64, |acc, &d| acc.saturating_mul(d)),
                last,
            ],
        }
    }

    /// The 2-D view, or what is wrong: no dims, more than [`MAX_RANK`],
    /// a zero dim, or more elements than a `u64` counts.
    pub fn check(&self) -> Result<[u64; 2], String> {
        let d = &self.0;
        if d.is_empty() {
            return Err("a tensor needs at least one dimension, got shape []".into());
        }
        if d.len() > MAX_RANK {
            return Err(format!(
                "shape {d:?} has {} dimensions, more than the {MAX_RANK} a tensor may have",
                d.len()
            ));
        }
        if let Some(i) = d.iter().position(|&x| x == 0) {
            return Err(format!(
                "shape {d:?} has a zero dimension (dim {i}): every dimension must be at least 1"
            ));
        }
        if d.iter()
            .try_fold(1u64, |acc, &x| acc.checked_mul(x))
            .is_none()
        {
            return Err(format!("shape {d:?} has more elements than a u64 counts"));
        }
        Ok(self.matrix())
    }

    /// Elements in all, saturating.
    pub fn elements(&self) -> u64 {
        self.0.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

impl std::fmt::Display for Shape {
    /// `4 x 300 x 64`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&s.join(" x "))
    }
}

impl<const N: usize> From<[u64; N]> for Shape {
    fn from(d: [u64; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<&[u64; N]> for Shape {
    fn from(d: &[u64; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<&[u64]> for Shape {
    fn from(d: &[u64]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<Vec<u64>> for Shape {
    fn from(d: Vec<u64>) -> Shape {
        Shape(d)
    }
}

impl From<&Vec<u64>> for Shape {
    fn from(d: &Vec<u64>) -> Shape {
        Shape(d.clone())
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Shape {
        s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_2d_view_flattens_the_leading_dims() {
        assert_eq!(Shape::from([4, 300, 64]).check(), Ok([1200, 64]));
        assert_eq!(Shape::from([2, 3, 5, 7]).check(), Ok([30, 7]));
        assert_eq!(Shape::from([9]).check(), Ok([1, 9]));
        assert_eq!(Shape::from([3, 5]).check(), Ok([3, 5]));
        assert_eq!(
            Shape::from(&[1u64, 2, 3, 4, 5, 6][..]).check(),
            Ok([120, 6])
        );
        assert_eq!(Shape::from([2, 3, 4]).to_string(), "2 x 3 x 4");
    }

    #[test]
    fn bad_shapes_say_what_is_wrong() {
        let e = Shape::from(Vec::new()).check().unwrap_err();
        assert!(e.contains("at least one dimension"), "{e}");
        let e = Shape::from([1, 1, 1, 1, 1, 1, 1]).check().unwrap_err();
        assert!(e.contains("has 7 dimensions, more than the 6"), "{e}");
        let e = Shape::from([4, 0, 3]).check().unwrap_err();
        assert!(e.contains("zero dimension (dim 1)"), "{e}");
        let e = Shape::from([1 << 32, 1 << 32, 2]).check().unwrap_err();
        assert!(e.contains("more elements than a u64"), "{e}");
    }
}
