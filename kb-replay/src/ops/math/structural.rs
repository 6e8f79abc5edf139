//! The ops that move or scan whole tiles (see [`structural`]).

use kb_format::{Dtype, MathOp, MathParams};

use super::{Operand, max_nan, op_name, word};
use crate::dtype;

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
pub(super) fn structural(p: &MathParams, ops: &[Operand]) -> Result<Vec<u8>, String> {
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
