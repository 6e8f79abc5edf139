//! The second round of `tl` compute ops (issue 34): logical ops on
//! masks, tile transpose, reshape, slice and concatenation, scans, full
//! reductions, more math (pow, log2, sin, cos, floor, ceil, rem, clamp)
//! and Triton's counter-based `rand`. Each is one math record on the PE's
//! vector unit (a full reduction two), timed like every math op: one
//! element per cycle of its dtype's rate over the larger of its input and
//! output tiles, plus the unit's setup.

use super::*;

impl<'p> Tl<'p> {
    /// A logical op on masks (non-zero is true): a u8 0/1 mask.
    fn logical(&mut self, op: MathOp, a: &dyn Operand, b: Rhs<'_>) -> Pending {
        self.compare(op, a, b)
    }

    /// `a && b` elementwise on masks (any dtype, non-zero is true; NaN
    /// too): a u8 0/1 mask. `b` a tile (broadcast) or a scalar.
    #[track_caller]
    pub fn and<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.logical(MathOp::And, a, b.into())
    }
    /// `a || b` on masks (see [`Tl::and`]).
    #[track_caller]
    pub fn or<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.logical(MathOp::Or, a, b.into())
    }
    /// `a != b` as truth values, on masks (see [`Tl::and`]).
    #[track_caller]
    pub fn xor<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.logical(MathOp::Xor, a, b.into())
    }
    /// 1 where `x` is zero, else 0: a u8 mask.
    #[track_caller]
    pub fn not(&mut self, x: &dyn Operand) -> Pending {
        let (_, r, c, _) = x.operand();
        self.math(
            MathOp::Not,
            one_input(tile_input(x)),
            r,
            c,
            Dtype::U8,
            None,
            x.valid(),
        )
    }

    /// The transpose: an R x C tile gives C x R.
    #[track_caller]
    pub fn transpose(&mut self, x: &dyn Operand) -> Pending {
        let (_, r, c, d) = x.operand();
        let (vr, vc) = x.valid();
        self.math(
            MathOp::Transpose,
            one_input(tile_input(x)),
            c,
            r,
            d,
            None,
            (vc, vr),
        )
    }

    /// The elements in row-major order as a `rows x cols` tile (as many
    /// elements as `x`). A tile with padding keeps its valid rows when
    /// the width stays, and counts as padding throughout otherwise.
    #[track_caller]
    pub fn reshape(&mut self, x: &dyn Operand, rows: u32, cols: u32) -> Pending {
        let (_, r, c, d) = x.operand();
        assert!(
            rows as u64 * cols as u64 == r as u64 * c as u64,
            "reshape: a {r}x{c} tile has {} elements, not {rows}x{cols}",
            r as u64 * c as u64
        );
        let valid = match x.valid() {
            v if v == (r, c) => (rows, cols),
            (vr, vc) if cols == c => (vr, vc),
            _ => (0, 0),
        };
        self.math(
            MathOp::Reshape,
            one_input(tile_input(x)),
            rows,
            cols,
            d,
            None,
            valid,
        )
    }

    /// The `rows x cols` block of `x` whose top-left element is
    /// (`row`, `col`), as a new tile (Triton's `x[row:row+rows,
    /// col:col+cols]`).
    #[track_caller]
    pub fn slice(&mut self, x: &dyn Operand, row: u32, col: u32, rows: u32, cols: u32) -> Pending {
        let (_, r, c, d) = x.operand();
        assert!(
            row as u64 + rows as u64 <= r as u64 && col as u64 + cols as u64 <= c as u64,
            "slice: a {rows}x{cols} block at ({row}, {col}) is not within the {r}x{c} tile"
        );
        let (vr, vc) = x.valid();
        let valid = (
            vr.saturating_sub(row).min(rows),
            vc.saturating_sub(col).min(cols),
        );
        let mut inputs = one_input(tile_input(x));
        inputs.extend([MathInput::Scalar(row as f64), MathInput::Scalar(col as f64)]);
        self.math(MathOp::Slice, inputs, rows, cols, d, None, valid)
    }

    /// `a` and `b` joined along `axis` (0: `a` above `b`, equal widths;
    /// 1: side by side, equal heights); one dtype.
    #[track_caller]
    pub fn concat(&mut self, a: &dyn Operand, b: &dyn Operand, axis: u8) -> Pending {
        let (_, ar, ac, ad) = a.operand();
        let (_, br, bc, bd) = b.operand();
        assert_eq!(ad, bd, "concat: operand dtypes differ ({ad} and {bd})");
        let ((va_r, va_c), (vb_r, vb_c)) = (a.valid(), b.valid());
        let (shape, valid) = match axis {
            0 => {
                assert_eq!(
                    ac, bc,
                    "concat along axis 0: widths differ ({ar}x{ac} and {br}x{bc})"
                );
                // Valid rows run on into `b` only where `a` has no padding.
                let rows = if va_r == ar { ar + vb_r } else { va_r };
                ((ar + br, ac), (rows, va_c.min(vb_c)))
            }
            1 => {
                assert_eq!(
                    ar, br,
                    "concat along axis 1: heights differ ({ar}x{ac} and {br}x{bc})"
                );
                let cols = if va_c == ac { ac + vb_c } else { va_c };
                ((ar, ac + bc), (va_r.min(vb_r), cols))
            }
            _ => panic!("concat: axis {axis} of a 2-D tile (0 or 1)"),
        };
        let mut inputs = one_input(tile_input(a));
        inputs.push(tile_input(b));
        self.math(
            MathOp::Concat,
            inputs,
            shape.0,
            shape.1,
            ad,
            Some(axis),
            valid,
        )
    }

    fn scan(&mut self, op: MathOp, x: &dyn Operand, axis: u8) -> Pending {
        let (_, r, c, d) = x.operand();
        assert!(
            axis <= 1,
            "{}: axis {axis} of a 2-D tile (0 or 1)",
            op.name()
        );
        self.math(op, one_input(tile_input(x)), r, c, d, Some(axis), x.valid())
    }

    /// Inclusive running sum along `axis` (Triton's `cumsum`): element
    /// (i, j) of axis 1 is `x[i, 0] + ... + x[i, j]`; same shape and dtype.
    #[track_caller]
    pub fn cumsum(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.scan(MathOp::Cumsum, x, axis)
    }
    /// Inclusive running product along `axis`.
    #[track_caller]
    pub fn cumprod(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.scan(MathOp::Cumprod, x, axis)
    }
    /// Inclusive running maximum along `axis` (NaN propagates).
    #[track_caller]
    pub fn cummax(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.scan(MathOp::Cummax, x, axis)
    }

    /// Sum of every element, a 1 x 1 tile (Triton's `sum(x, axis=None)`):
    /// two records, along the rows then down the column.
    #[track_caller]
    pub fn sum_all(&mut self, x: &dyn Operand) -> Pending {
        let rows = self.reduce_to(MathOp::Sum, x, 1, None);
        self.reduce_to(MathOp::Sum, &rows, 0, None)
    }
    /// Maximum of every element, 1 x 1 (two records, as [`Tl::sum_all`]).
    #[track_caller]
    pub fn max_all(&mut self, x: &dyn Operand) -> Pending {
        let rows = self.reduce_to(MathOp::ReduceMax, x, 1, None);
        self.reduce_to(MathOp::ReduceMax, &rows, 0, None)
    }
    /// Minimum of every element, 1 x 1.
    #[track_caller]
    pub fn min_all(&mut self, x: &dyn Operand) -> Pending {
        let rows = self.reduce_to(MathOp::ReduceMin, x, 1, None);
        self.reduce_to(MathOp::ReduceMin, &rows, 0, None)
    }
    /// Mean of every element, 1 x 1 (float tiles): the mean of the row
    /// means, which is the mean (every row has as many elements), rounded
    /// to the dtype twice.
    #[track_caller]
    pub fn mean_all(&mut self, x: &dyn Operand) -> Pending {
        let rows = self.mean(x, 1);
        self.mean(&rows, 0)
    }

    /// `a` to the power `b` (float tiles; `b` a tile or a scalar).
    #[track_caller]
    pub fn pow<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        let (_, _, _, d) = a.operand();
        assert!(is_float(d), "pow: needs a float tile, not {d}");
        self.binary(MathOp::Pow, a, b.into())
    }
    /// Base-2 logarithm (float tiles).
    #[track_caller]
    pub fn log2(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Log2, x)
    }
    /// Sine, in radians (float tiles).
    #[track_caller]
    pub fn sin(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Sin, x)
    }
    /// Cosine, in radians (float tiles).
    #[track_caller]
    pub fn cos(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Cos, x)
    }
    /// Round toward negative infinity (integers unchanged).
    #[track_caller]
    pub fn floor(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Floor, x)
    }
    /// Round toward positive infinity (integers unchanged).
    #[track_caller]
    pub fn ceil(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Ceil, x)
    }
    /// The remainder of truncated division, C's `fmod` (Triton's `%` and
    /// `fmod` on floats): `a - trunc(a / b) * b`, the sign of `a`
    /// (`-7 rem 3` is -1), NaN for `b = 0`. Integers go through the same
    /// f64 rule (exact).
    #[track_caller]
    pub fn rem<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Rem, a, b.into())
    }
    /// `min(max(x, lo), hi)` elementwise (NaN propagates); `lo` and `hi`
    /// tiles or scalars, all three broadcast numpy-style.
    #[track_caller]
    pub fn clamp<'a, 'b>(
        &mut self,
        x: &dyn Operand,
        lo: impl Into<Rhs<'a>>,
        hi: impl Into<Rhs<'b>>,
    ) -> Pending {
        let args = [Rhs::Tile(x), lo.into(), hi.into()];
        let (inputs, (r, c), d, tiles) = Self::elementwise_inputs(MathOp::Clamp, &args);
        let valid = broadcast_valid((r, c), tiles.as_slice());
        self.math(MathOp::Clamp, inputs, r, c, d, None, valid)
    }

    /// Triton's `tl.rand(seed, offsets)`: an f32 tile, uniform in [0, 1),
    /// one value per element of `offsets` (an integer tile; each taken mod
    /// 2^32), from Philox4x32-10 ([`kb_format::philox`]). The same seed
    /// and offsets give the same bits in every run, in Phase 1 and in
    /// replay; when `offsets` is known in Phase 1 (loaded, or an
    /// [`Tl::arange`]) so is the result.
    #[track_caller]
    pub fn rand(&mut self, seed: u64, offsets: &dyn Operand) -> Pending {
        let (_, r, c, d) = offsets.operand();
        assert!(
            !is_float(d),
            "rand: offsets must be an integer tile, not {d}"
        );
        let mut inputs = one_input(tile_input(offsets));
        inputs.extend([
            MathInput::Scalar((seed & 0xFFFF_FFFF) as f64),
            MathInput::Scalar((seed >> 32) as f64),
        ]);
        self.math(
            MathOp::Rand,
            inputs,
            r,
            c,
            Dtype::F32,
            None,
            offsets.valid(),
        )
    }
}
