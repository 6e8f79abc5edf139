//! Tests of the math ops against hand values and f64 evaluation.

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

fn params(op: MathOp, inputs: Vec<MathInput>, rows: u32, cols: u32, dtype: Dtype) -> MathParams {
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
    // Small tiles, and tiles whose rows or whole cross the kernels'
    // 256-element blocks (a row segment, a flat run, a column).
    for (rows, cols) in [(5, 7), (3, 300), (17, 31), (300, 1)] {
        float_kernels_match_on(rows, cols);
    }
}

fn float_kernels_match_on(rows: usize, cols: usize) {
    let f = Dtype::F32;
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
                assert!(got == want, "{op:?} {sa:?} {sb:?} of {rows} x {cols}");
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
                assert!(got == want, "{op:?} {s:?} -> {out} of {rows} x {cols}");
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

/// Where (f32 lanes: a u8 condition) and clamp (f64) with operands of
/// every broadcast shape, a scalar among them, across block boundaries,
/// against the values worked out element by element in f64.
#[test]
fn three_input_ops_broadcast_across_blocks() {
    let f = Dtype::F32;
    for (rows, cols) in [(4, 5), (2, 400), (300, 1)] {
        let shapes = [(rows, cols), (1, cols), (rows, 1), (1, 1)];
        let at = |v: &[f32], (r, c): (usize, usize), i: usize, j: usize| {
            v[if r == 1 { 0 } else { i } * c + if c == 1 { 0 } else { j }] as f64
        };
        for sc in shapes {
            for sa in shapes {
                let cond: Vec<u8> = (0..sc.0 * sc.1).map(|k| (k % 3 == 0) as u8).collect();
                let a = mixed_f32(sa.0 * sa.1, 5, 8.0);
                let b = -2.5f64;
                let p = params(
                    MathOp::Where,
                    vec![
                        tile(sc.0 as u32, sc.1 as u32, Dtype::U8),
                        tile(sa.0 as u32, sa.1 as u32, f),
                        MathInput::Scalar(b),
                    ],
                    rows as u32,
                    cols as u32,
                    f,
                );
                let input: Vec<u8> = cond.iter().copied().chain(f32b(&a)).collect();
                let got = dtype::to_f64(f, &execute(&p, &input).unwrap());
                for i in 0..rows {
                    for j in 0..cols {
                        let c = cond
                            [if sc.0 == 1 { 0 } else { i } * sc.1 + if sc.1 == 1 { 0 } else { j }];
                        let want = if c != 0 { at(&a, sa, i, j) } else { b };
                        let g = got[i * cols + j];
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "where {sc:?} {sa:?} of {rows} x {cols} at ({i}, {j}): {g} vs {want}"
                        );
                    }
                }
                // clamp(x, lo, hi) with lo a tile of shape `sc`, hi a scalar.
                let lo = mixed_f32(sc.0 * sc.1, 9, 4.0);
                let hi = 1.5f64;
                let p = params(
                    MathOp::Clamp,
                    vec![
                        tile(sa.0 as u32, sa.1 as u32, f),
                        tile(sc.0 as u32, sc.1 as u32, f),
                        MathInput::Scalar(hi),
                    ],
                    rows as u32,
                    cols as u32,
                    Dtype::F16,
                );
                let input: Vec<u8> = f32b(&a).into_iter().chain(f32b(&lo)).collect();
                let got = execute(&p, &input).unwrap();
                let mut want = Vec::new();
                for i in 0..rows {
                    for j in 0..cols {
                        let v = min_nan(max_nan(at(&a, sa, i, j), at(&lo, sc, i, j)), hi);
                        dtype::push_f64(Dtype::F16, v, &mut want);
                    }
                }
                assert!(got == want, "clamp {sa:?} {sc:?} of {rows} x {cols}");
            }
        }
    }
}

/// Float reductions read in place, eight rows at a time, against each
/// lane folded in order in f64 here: shapes not a multiple of eight rows
/// or of the 256-element blocks, signed zeros (a lane of one -0 sums to
/// -0, not +0), NaN propagating through max and min, f16 and bf16
/// inputs and outputs.
#[test]
fn float_reductions_fold_each_lane_in_order() {
    for (rows, cols) in [(1, 1), (13, 300), (9, 1), (1, 600), (300, 3)] {
        let mut x = mixed_f32(rows * cols, 21, 1e3);
        x[0] = -0.0;
        if rows * cols > 40 {
            x[37] = f32::NAN;
        }
        for din in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            // The input as `din` (rounded), and its exact values.
            let mut bytes = Vec::new();
            x.iter()
                .for_each(|&v| dtype::push_f64(din, v as f64, &mut bytes));
            let vals = dtype::to_f64(din, &bytes);
            for axis in [0u8, 1] {
                let lanes = if axis == 0 { cols } else { rows };
                let len = if axis == 0 { rows } else { cols };
                let lane = |l: usize| -> Vec<f64> {
                    (0..len)
                        .map(|k| {
                            if axis == 0 {
                                vals[k * cols + l]
                            } else {
                                vals[l * cols + k]
                            }
                        })
                        .collect()
                };
                type Fold = fn(f64, f64) -> f64;
                let folds: [(MathOp, Fold); 4] = [
                    (MathOp::Sum, |a, b| a + b),
                    (MathOp::Mean, |a, b| a + b),
                    (MathOp::ReduceMax, max_nan),
                    (MathOp::ReduceMin, min_nan),
                ];
                for (op, g) in folds {
                    for dout in [Dtype::F32, Dtype::Bf16] {
                        let (orow, ocol) = if axis == 0 { (1, cols) } else { (rows, 1) };
                        let mut p = params(
                            op,
                            vec![tile(rows as u32, cols as u32, din)],
                            orow as u32,
                            ocol as u32,
                            dout,
                        );
                        p.axis = Some(axis);
                        let got = execute(&p, &bytes).unwrap();
                        let mut want = Vec::new();
                        for l in 0..lanes {
                            let v = lane(l);
                            let mut acc = v[0];
                            for &e in &v[1..] {
                                acc = g(acc, e);
                            }
                            if op == MathOp::Mean {
                                acc /= len as f64;
                            }
                            dtype::push_f64(dout, acc, &mut want);
                        }
                        // A NaN's sign and payload are not part of the
                        // contract: with a NaN and an inf - inf in one
                        // lane, which of the two comes out depends on the
                        // order the compiler gives an addition's operands
                        // (in release builds the replay's sum of such a
                        // lane gave +NaN where this fold gave -NaN).
                        let (g, w) = (dtype::to_f64(dout, &got), dtype::to_f64(dout, &want));
                        assert!(
                            g.len() == w.len()
                                && g.iter().zip(&w).all(|(a, b)| {
                                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                                }),
                            "{op:?} axis {axis} of {rows} x {cols} {din} -> {dout}"
                        );
                    }
                }
            }
        }
    }
    // A lane of one negative zero keeps its sign.
    let mut p = params(MathOp::Sum, vec![tile(2, 1, Dtype::F32)], 2, 1, Dtype::F32);
    p.axis = Some(1);
    let got = execute(&p, &f32b(&[-0.0, 1.0])).unwrap();
    assert_eq!(got, f32b(&[-0.0, 1.0]));
}

/// `execute_tiles` (operands and output where they lie) gives
/// `execute`'s bytes for the float ops it takes, declines the others
/// without writing, and reports `execute`'s errors.
#[test]
fn tiles_in_place_give_the_gathered_bits() {
    let f = Dtype::F32;
    let (rows, cols) = (6usize, 300usize);
    let a = mixed_f32(rows * cols, 3, 6.0);
    let col = mixed_f32(rows, 4, 2.0);
    let h: Vec<u8> = a
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let cases: Vec<(MathParams, Vec<Vec<u8>>)> = vec![
        (
            params(MathOp::Sub, vec![tile(6, 300, f), tile(6, 1, f)], 6, 300, f),
            vec![f32b(&a), f32b(&col)],
        ),
        (
            params(MathOp::Exp, vec![tile(6, 300, f)], 6, 300, f),
            vec![f32b(&a)],
        ),
        (
            params(
                MathOp::Mul,
                vec![tile(6, 300, Dtype::F16), MathInput::Scalar(0.1)],
                6,
                300,
                Dtype::Bf16,
            ),
            vec![h.clone()],
        ),
        (
            params(MathOp::Cast, vec![tile(6, 300, f)], 6, 300, Dtype::F16),
            vec![f32b(&a)],
        ),
        (
            params(
                MathOp::Copy,
                vec![tile(6, 300, Dtype::F16)],
                6,
                300,
                Dtype::F16,
            ),
            vec![h.clone()],
        ),
        (
            params(
                MathOp::Lt,
                vec![tile(6, 300, f), tile(1, 300, f)],
                6,
                300,
                Dtype::U8,
            ),
            vec![f32b(&a), f32b(&a[..300])],
        ),
        (
            MathParams {
                axis: Some(1),
                ..params(MathOp::Sum, vec![tile(6, 300, f)], 6, 1, f)
            },
            vec![f32b(&a)],
        ),
    ];
    for (p, tiles) in &cases {
        let want = execute(p, &tiles.concat()).unwrap();
        let mut got = vec![0xa5u8; want.len()];
        let parts: Vec<&[u8]> = tiles.iter().map(|t| &t[..]).collect();
        assert_eq!(execute_tiles(p, &parts, &mut got), Ok(true), "{:?}", p.op);
        assert!(got == want, "{:?}", p.op);
    }
    // Declined, nothing written: integer ops, structural ops, arg
    // reductions, fills, slices of the wrong sizes.
    let i = Dtype::I32;
    let ints: Vec<u8> = (0..12i32).flat_map(|v| v.to_le_bytes()).collect();
    let declined: Vec<(MathParams, Vec<&[u8]>)> = vec![
        (
            params(MathOp::Add, vec![tile(3, 4, i), tile(3, 4, i)], 3, 4, i),
            vec![&ints, &ints],
        ),
        (
            params(MathOp::Transpose, vec![tile(3, 4, i)], 4, 3, i),
            vec![&ints],
        ),
        (
            MathParams {
                axis: Some(1),
                ..params(MathOp::ArgMax, vec![tile(3, 4, i)], 3, 1, i)
            },
            vec![&ints],
        ),
        (
            params(MathOp::Copy, vec![MathInput::Scalar(1.0)], 3, 4, f),
            vec![],
        ),
        (
            params(MathOp::Exp, vec![tile(3, 4, f)], 3, 4, f),
            vec![&ints[..40]],
        ),
    ];
    for (p, parts) in &declined {
        let n = output_len(p).unwrap() as usize;
        let mut out = vec![0xa5u8; n];
        assert_eq!(execute_tiles(p, parts, &mut out), Ok(false), "{:?}", p.op);
        assert!(out.iter().all(|&b| b == 0xa5), "{:?} wrote", p.op);
    }
    // A shape error is execute's.
    let bad = params(MathOp::Add, vec![tile(2, 3, f), tile(3, 2, f)], 2, 3, f);
    let x = f32b(&[1.0; 6]);
    let mut out = vec![0u8; 24];
    let e = execute_tiles(&bad, &[&x, &x], &mut out).unwrap_err();
    assert_eq!(
        e,
        execute(&bad, &[x.clone(), x.clone()].concat()).unwrap_err()
    );
}

/// `execute` and `execute_tiles` share one dispatch (`route`): every op
/// the in-place path takes gives `execute`'s bytes, including the
/// integer ones that are not integer arithmetic (a verbatim copy, a
/// division in f64), and the ones it declines (integer arithmetic, a
/// fill) are declined before anything is written.
#[test]
fn one_dispatch_for_both_entry_points() {
    let i = Dtype::I32;
    let ints: Vec<u8> = [7i32, -3, 1 << 30, -1, 0, 12]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let twos: Vec<u8> = [2i32; 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let taken: Vec<(MathParams, Vec<&[u8]>)> = vec![
        // An integer copy to its own dtype: the bytes, verbatim.
        (
            params(MathOp::Copy, vec![tile(2, 3, i)], 2, 3, i),
            vec![&ints],
        ),
        // An integer division is float arithmetic (`div` has no integer
        // form): in f64, truncated to the output.
        (
            params(MathOp::Div, vec![tile(2, 3, i), tile(2, 3, i)], 2, 3, i),
            vec![&ints, &twos],
        ),
        // A reduction's float path, along each axis.
        (
            MathParams {
                axis: Some(1),
                ..params(MathOp::Sum, vec![tile(2, 3, i)], 2, 1, Dtype::F32)
            },
            vec![&ints],
        ),
    ];
    for (p, parts) in &taken {
        let want = execute(p, &parts.concat()).unwrap();
        let mut got = vec![0xa5u8; want.len()];
        assert_eq!(execute_tiles(p, parts, &mut got), Ok(true), "{:?}", p.op);
        assert_eq!(got, want, "{:?}", p.op);
    }
    assert_eq!(
        execute(&taken[0].0, &ints).unwrap(),
        ints,
        "a copy is verbatim"
    );
    assert_eq!(
        dtype::to_i64(
            i,
            &execute(&taken[1].0, &[&ints[..], &twos].concat()).unwrap()
        ),
        vec![3, -1, 1 << 29, 0, 0, 6],
        "division truncates toward zero"
    );
    // Declined, nothing written: integer arithmetic (a cast between
    // integer dtypes is one) and a fill.
    let bytes: Vec<u8> = vec![1, 2, 3, 4, 5, 6];
    let declined: Vec<(MathParams, Vec<&[u8]>)> = vec![
        (
            params(MathOp::Cast, vec![tile(2, 3, Dtype::I8)], 2, 3, i),
            vec![&bytes],
        ),
        (
            params(MathOp::Max, vec![tile(2, 3, i), tile(2, 3, i)], 2, 3, i),
            vec![&ints, &twos],
        ),
        (
            params(
                MathOp::Add,
                vec![MathInput::Scalar(1.0), MathInput::Scalar(2.0)],
                2,
                3,
                Dtype::F32,
            ),
            vec![],
        ),
    ];
    for (p, parts) in &declined {
        let n = output_len(p).unwrap() as usize;
        let mut out = vec![0xa5u8; n];
        assert_eq!(execute_tiles(p, parts, &mut out), Ok(false), "{:?}", p.op);
        assert!(out.iter().all(|&b| b == 0xa5), "{:?} wrote", p.op);
        // `execute` runs them.
        assert_eq!(execute(p, &parts.concat()).unwrap().len(), n, "{:?}", p.op);
    }
    // A tile of the wrong size is declined, not misread.
    let p = params(MathOp::Copy, vec![tile(2, 3, i)], 2, 3, i);
    let mut out = vec![0xa5u8; 24];
    assert_eq!(execute_tiles(&p, &[&ints[..20]], &mut out), Ok(false));
    assert_eq!(execute_tiles(&p, &[&ints, &ints], &mut out), Ok(false));
}
