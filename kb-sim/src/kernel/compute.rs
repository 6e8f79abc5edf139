//! The `tl` compute ops: dot, elementwise math, comparisons, constants
//! and reductions, each issued as one record on the PE's GEMM or vector
//! unit and returned as a [`Pending`] tile.

use super::*;

impl<'p> Tl<'p> {
    /// `a @ b` (+ `acc`, which the result replaces in place), accumulated
    /// in f32 for float inputs and i32 for integer ones; the result has the
    /// accumulation dtype (cast it to store it narrower). See
    /// [`Tl::dot_with`] for transposed operands and an output dtype.
    #[track_caller]
    pub fn dot(&mut self, a: &dyn Operand, b: &dyn Operand, acc: Option<Pending>) -> Pending {
        self.dot_with(a, b, acc, Dot::default())
    }

    /// [`Tl::dot`] with options: `transpose_a` reads `a` as its transpose
    /// (a k x m tile used as m x k), `transpose_b` likewise for `b` (an
    /// n x k tile used as k x n, e.g. `q @ k^T` with `k` loaded row-major);
    /// `out` rounds the result to another dtype once, from the
    /// accumulator (not with `acc`, which is updated in place).
    #[track_caller]
    pub fn dot_with(
        &mut self,
        a: &dyn Operand,
        b: &dyn Operand,
        acc: Option<Pending>,
        opts: Dot,
    ) -> Pending {
        let (pa_a, ar, ac, da) = a.operand();
        let (pa_b, br, bc, db) = b.operand();
        let (m, k) = if opts.transpose_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if opts.transpose_b { (bc, br) } else { (br, bc) };
        let swap = |(r, c): (u32, u32), t: bool| if t { (c, r) } else { (r, c) };
        let (vm, vka) = swap(a.valid(), opts.transpose_a);
        let (vkb, vn) = swap(b.valid(), opts.transpose_b);
        let useful_flops = 2 * vm as u64 * vn as u64 * vka.min(vkb) as u64;
        if k != kb {
            self.fail(
                "dot",
                format!("inner dimensions differ: {m}x{k} @ {kb}x{n} (a is {ar}x{ac}, b is {br}x{bc}, transpose_a {}, transpose_b {})", opts.transpose_a, opts.transpose_b),
            );
        }
        if da != db {
            self.fail("dot", format!("operand dtypes differ ({da} and {db})"));
        }
        self.check_operand("dot", 0, pa_a);
        self.check_operand("dot", 1, pa_b);
        let dtype_acc = accumulation_dtype(da);
        let dtype_out = opts.out.unwrap_or(dtype_acc);
        let tcm = |pa| Addr {
            space: Space::Tcm,
            addr: pa,
        };
        // With an accumulator the result replaces it in place: the output
        // range is also the third input.
        let (mut out, acc_addr) = match acc {
            Some(acc) => {
                if (acc.rows, acc.cols, acc.dtype) != (m, n, dtype_acc) {
                    self.fail(
                        "dot",
                        format!(
                            "the accumulator is {}x{} {}, the product {m}x{n} {dtype_acc}",
                            acc.rows, acc.cols, acc.dtype
                        ),
                    );
                }
                if dtype_out != dtype_acc {
                    self.fail(
                        "dot",
                        format!("an accumulator is updated in place, in {dtype_acc}; cast the result instead"),
                    );
                }
                let at = tcm(acc.pa);
                (acc, Some(at))
            }
            None => (self.pending("dot", m, n, dtype_out, (0, 0)), None),
        };
        // What the accumulator held stays valid; the product adds its part.
        out.valid = (out.valid.0.max(vm), out.valid.1.max(vn));
        let params = GemmParams {
            a: tcm(pa_a),
            b: tcm(pa_b),
            out: tcm(out.pa),
            acc: acc_addr,
            m,
            k,
            n,
            dtype_in: da,
            dtype_acc,
            dtype_out,
            transpose_a: opts.transpose_a,
            transpose_b: opts.transpose_b,
            layout_a: Layout::RowMajor,
            layout_b: Layout::RowMajor,
            layout_out: Layout::RowMajor,
        };
        self.port.post(Command::Gemm(Labeled {
            op: params,
            label: self.stage,
            useful_flops,
        }));
        out
    }

    /// A math op with a `rows` x `cols` result whose top-left `valid`
    /// part is computed from data (one useful FLOP per element of it).
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub(super) fn math(
        &mut self,
        op: MathOp,
        inputs: Vec<MathInput>,
        rows: u32,
        cols: u32,
        dtype: Dtype,
        axis: Option<u8>,
        valid: (u32, u32),
    ) -> Pending {
        // The op as the kernel called it: a copy of a scalar is `full`
        // (and `zeros`).
        let mut name = "full";
        for (i, x) in inputs.iter().enumerate() {
            if let MathInput::Tile { addr, .. } = x {
                self.check_operand(op.name(), i, addr.addr);
                name = op.name();
            }
        }
        if op != MathOp::Copy {
            name = op.name();
        }
        let out = self.pending(name, rows, cols, dtype, valid);
        let params = MathParams {
            op,
            inputs,
            out: Addr {
                space: Space::Tcm,
                addr: out.pa,
            },
            rows,
            cols,
            dtype,
            axis,
        };
        self.port.post(Command::Math(Labeled {
            op: params,
            label: self.stage,
            useful_flops: valid.0 as u64 * valid.1 as u64,
        }));
        out
    }

    #[track_caller]
    pub(super) fn unary(&mut self, op: MathOp, x: &dyn Operand) -> Pending {
        let (_, r, c, d) = x.operand();
        self.math(op, one_input(tile_input(x)), r, c, d, None, x.valid())
    }

    /// A float-only unary op (sigmoid, tanh, erf, exp2).
    #[track_caller]
    pub(super) fn unary_float(&mut self, op: MathOp, x: &dyn Operand) -> Pending {
        let (_, _, _, d) = x.operand();
        assert!(is_float(d), "tl.{}: needs a float tile, not {d}", op.name());
        self.unary(op, x)
    }

    /// The shape inputs of shapes `shapes` broadcast to (numpy's rule:
    /// each dim equal, or 1).
    #[track_caller]
    pub(super) fn broadcast(op: MathOp, shapes: &[(u32, u32)]) -> (u32, u32) {
        let dim = |a: u32, b: u32| match (a, b) {
            (a, b) if a == b => Some(a),
            (1, b) => Some(b),
            (a, 1) => Some(a),
            _ => None,
        };
        let out = shapes
            .iter()
            .try_fold((1, 1), |(r, c), &(sr, sc)| Some((dim(r, sr)?, dim(c, sc)?)));
        match out {
            Some(o) => o,
            None => {
                let s: Vec<String> = shapes.iter().map(|(r, c)| format!("{r}x{c}")).collect();
                panic!(
                    "tl.{}: shapes {} do not broadcast",
                    op.name(),
                    s.join(" and ")
                )
            }
        }
    }

    /// The inputs, broadcast shape, dtype and each tile's (shape, valid
    /// extent) of an elementwise op over `args` (at least one a tile;
    /// tiles share one dtype).
    #[track_caller]
    pub(super) fn elementwise_inputs(
        op: MathOp,
        args: &[Rhs<'_>],
    ) -> (Vec<MathInput>, (u32, u32), Dtype, Tiles) {
        let mut tiles = Tiles::default();
        let mut dtype = None;
        let mut inputs = crate::program::math_inputs();
        inputs.extend(args.iter().map(|a| match a {
            Rhs::Tile(x) => {
                let (_, r, c, d) = x.operand();
                tiles.push(((r, c), x.valid()));
                match dtype {
                    None => dtype = Some(d),
                    Some(d0) => {
                        assert!(
                            d0 == d,
                            "tl.{}: operand dtypes differ ({d0} and {d})",
                            op.name()
                        )
                    }
                }
                tile_input(*x)
            }
            Rhs::Scalar(v) => MathInput::Scalar(*v),
        }));
        let Some(dtype) = dtype else {
            panic!("tl.{}: needs at least one tile", op.name())
        };
        let mut shapes = [(0, 0); 3];
        for (s, &(shape, _)) in shapes.iter_mut().zip(tiles.as_slice()) {
            *s = shape;
        }
        let out = Self::broadcast(op, &shapes[..tiles.n]);
        (inputs, out, dtype, tiles)
    }

    /// Elementwise `a op b`, broadcasting numpy-style; `b` may be a tile
    /// or a scalar.
    #[track_caller]
    pub(super) fn binary(&mut self, op: MathOp, a: &dyn Operand, b: Rhs<'_>) -> Pending {
        let (inputs, (r, c), d, tiles) = Self::elementwise_inputs(op, &[Rhs::Tile(a), b]);
        let valid = broadcast_valid((r, c), tiles.as_slice());
        self.math(op, inputs, r, c, d, None, valid)
    }

    /// A comparison: a u8 mask, 1 where true (NaN compares false, except
    /// in `ne`).
    #[track_caller]
    pub(super) fn compare(&mut self, op: MathOp, a: &dyn Operand, b: Rhs<'_>) -> Pending {
        let (inputs, (r, c), _, tiles) = Self::elementwise_inputs(op, &[Rhs::Tile(a), b]);
        let valid = broadcast_valid((r, c), tiles.as_slice());
        self.math(op, inputs, r, c, Dtype::U8, None, valid)
    }

    /// e^x.
    #[track_caller]
    pub fn exp(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Exp, x)
    }
    /// 2^x (float tiles).
    #[track_caller]
    pub fn exp2(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Exp2, x)
    }
    /// Natural logarithm.
    #[track_caller]
    pub fn log(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Log, x)
    }
    /// Square root.
    #[track_caller]
    pub fn sqrt(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Sqrt, x)
    }
    /// 1 / sqrt(x).
    #[track_caller]
    pub fn rsqrt(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Rsqrt, x)
    }
    /// |x| (integers wrap: abs of i8 -128 is -128, as numpy's).
    #[track_caller]
    pub fn abs(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Abs, x)
    }
    /// -x.
    #[track_caller]
    pub fn neg(&mut self, x: &dyn Operand) -> Pending {
        self.unary(MathOp::Neg, x)
    }
    /// 1 / (1 + e^-x) (float tiles).
    #[track_caller]
    pub fn sigmoid(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Sigmoid, x)
    }
    /// tanh(x) (float tiles).
    #[track_caller]
    pub fn tanh(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Tanh, x)
    }
    /// The error function (float tiles).
    #[track_caller]
    pub fn erf(&mut self, x: &dyn Operand) -> Pending {
        self.unary_float(MathOp::Erf, x)
    }

    /// `a + b`: `b` is a tile (broadcast numpy-style: a row, a column, a
    /// 1 x 1) or a scalar (`tl.add(&x, 1.0)`).
    #[track_caller]
    pub fn add<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Add, a, b.into())
    }
    /// `a - b` (see [`Tl::add`] for `b`).
    #[track_caller]
    pub fn sub<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Sub, a, b.into())
    }
    /// `a * b` (see [`Tl::add`] for `b`).
    #[track_caller]
    pub fn mul<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Mul, a, b.into())
    }
    /// `a / b` (see [`Tl::add`] for `b`).
    #[track_caller]
    pub fn div<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Div, a, b.into())
    }
    /// Elementwise maximum (NaN if either is NaN); `b` a tile or a scalar.
    #[track_caller]
    pub fn max<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Max, a, b.into())
    }
    /// Elementwise minimum (NaN if either is NaN); `b` a tile or a scalar.
    #[track_caller]
    pub fn min<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.binary(MathOp::Min, a, b.into())
    }

    /// `a < b` as a u8 mask of 0/1; `b` a tile or a scalar.
    #[track_caller]
    pub fn lt<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Lt, a, b.into())
    }
    /// `a <= b` as a u8 mask.
    #[track_caller]
    pub fn le<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Le, a, b.into())
    }
    /// `a > b` as a u8 mask.
    #[track_caller]
    pub fn gt<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Gt, a, b.into())
    }
    /// `a >= b` as a u8 mask.
    #[track_caller]
    pub fn ge<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Ge, a, b.into())
    }
    /// `a == b` as a u8 mask.
    #[track_caller]
    pub fn eq<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Eq, a, b.into())
    }
    /// `a != b` as a u8 mask (true where either is NaN).
    #[track_caller]
    pub fn ne<'a>(&mut self, a: &dyn Operand, b: impl Into<Rhs<'a>>) -> Pending {
        self.compare(MathOp::Ne, a, b.into())
    }

    /// `cond ? a : b` elementwise (cond non-zero, NaN included, means a);
    /// `a` and `b` are tiles or scalars, at least one a tile; all three
    /// broadcast numpy-style.
    #[track_caller]
    pub fn where_<'a, 'b>(
        &mut self,
        cond: &dyn Operand,
        a: impl Into<Rhs<'a>>,
        b: impl Into<Rhs<'b>>,
    ) -> Pending {
        let (a, b) = (a.into(), b.into());
        let (mut inputs, (r, c), d, mut tiles) = Self::elementwise_inputs(MathOp::Where, &[a, b]);
        let (_, cr, cc, _) = cond.operand();
        let (r, c) = Self::broadcast(MathOp::Where, &[(r, c), (cr, cc)]);
        inputs.insert(0, tile_input(cond));
        tiles.push(((cr, cc), cond.valid()));
        let valid = broadcast_valid((r, c), tiles.as_slice());
        self.math(MathOp::Where, inputs, r, c, d, None, valid)
    }

    /// Convert to `dtype`.
    #[track_caller]
    pub fn cast(&mut self, x: &dyn Operand, dtype: Dtype) -> Pending {
        let (_, r, c, _) = x.operand();
        self.math(
            MathOp::Cast,
            one_input(tile_input(x)),
            r,
            c,
            dtype,
            None,
            x.valid(),
        )
    }

    /// A `rows` x `cols` tile of `value` (rounded to `dtype`; an integer
    /// dtype needs a whole value in its range). Phase 1 knows its values.
    #[track_caller]
    pub fn full(&mut self, rows: u32, cols: u32, dtype: Dtype, value: f64) -> Pending {
        if !is_float(dtype) {
            let (lo, hi) = int_range(dtype);
            assert!(
                value.fract() == 0.0 && (lo..=hi).contains(&value),
                "full: {value} is not a {dtype} value"
            );
        }
        self.math(
            MathOp::Copy,
            vec![MathInput::Scalar(value)],
            rows,
            cols,
            dtype,
            None,
            (rows, cols),
        )
    }

    /// A `rows` x `cols` tile of zeros.
    #[track_caller]
    pub fn zeros(&mut self, rows: u32, cols: u32, dtype: Dtype) -> Pending {
        self.full(rows, cols, dtype, 0.0)
    }

    /// A `rows` x `cols` tile whose elements are their index along `axis`
    /// (0: the row, 1: the column): Triton's `arange`, broadcast. Every
    /// index must be exact in `dtype`. Phase 1 knows its values.
    #[track_caller]
    pub fn arange(&mut self, rows: u32, cols: u32, axis: u8, dtype: Dtype) -> Pending {
        let n = match axis {
            0 => rows,
            1 => cols,
            _ => panic!("arange: axis {axis} of a 2-D tile (0 or 1)"),
        };
        let top = n.saturating_sub(1) as f64;
        let exact = match dtype {
            Dtype::F16 => 2048.0,
            Dtype::Bf16 => 256.0,
            Dtype::F32 => 16_777_216.0,
            d => int_range(d).1,
        };
        assert!(
            top <= exact,
            "arange: index {top} is not exact in {dtype} (at most {exact})"
        );
        self.math(
            MathOp::Arange,
            Vec::new(),
            rows,
            cols,
            dtype,
            Some(axis),
            (rows, cols),
        )
    }

    #[track_caller]
    pub(super) fn reduce_to(
        &mut self,
        op: MathOp,
        x: &dyn Operand,
        axis: u8,
        dtype: Option<Dtype>,
    ) -> Pending {
        let (_, r, c, d) = x.operand();
        let (vr, vc) = x.valid();
        let ((rows, cols), valid) = match axis {
            0 => ((1, c), (1, vc)),
            1 => ((r, 1), (vr, 1)),
            _ => panic!("{}: axis {axis} of a 2-D tile (0 or 1)", op.name()),
        };
        self.math(
            op,
            one_input(tile_input(x)),
            rows,
            cols,
            dtype.unwrap_or(d),
            Some(axis),
            valid,
        )
    }

    /// Sum along `axis`: 1 x cols for axis 0, rows x 1 for axis 1.
    #[track_caller]
    pub fn sum(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce_to(MathOp::Sum, x, axis, None)
    }

    /// Maximum along `axis`: 1 x cols for axis 0, rows x 1 for axis 1.
    #[track_caller]
    pub fn reduce_max(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce_to(MathOp::ReduceMax, x, axis, None)
    }

    /// Minimum along `axis`.
    #[track_caller]
    pub fn reduce_min(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce_to(MathOp::ReduceMin, x, axis, None)
    }

    /// Mean along `axis` (float tiles).
    #[track_caller]
    pub fn mean(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        let (_, _, _, d) = x.operand();
        assert!(is_float(d), "mean: needs a float tile, not {d}");
        self.reduce_to(MathOp::Mean, x, axis, None)
    }

    /// Index (i32) along `axis` of the first maximum (a NaN counts as the
    /// largest).
    #[track_caller]
    pub fn argmax(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce_to(MathOp::ArgMax, x, axis, Some(Dtype::I32))
    }

    /// Index (i32) along `axis` of the first minimum (a NaN counts as the
    /// smallest).
    #[track_caller]
    pub fn argmin(&mut self, x: &dyn Operand, axis: u8) -> Pending {
        self.reduce_to(MathOp::ArgMin, x, axis, Some(Dtype::I32))
    }
}
