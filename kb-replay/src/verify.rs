//! Verification: gather each output tensor from its shards after replay,
//! compute its reference (the spec's [`Expr`] over input host data, or an
//! `--expect` array) and compare element by element.
//!
//! Comparison follows numpy's `allclose`: `|got - ref| <= atol + rtol*|ref|`,
//! with the tolerance from the spec or, by default, per docs/design.md P7
//! ([`default_tolerance`]); `--strict-tolerance`, `--atol` and `--rtol`
//! override the spec ([`TolerancePolicy`]), and a spec tolerance looser than
//! the default is named in the verdict ([`OutputReport::tolerance_note`]).
//! NaN matches only NaN; an infinity matches only the same infinity. Output
//! bytes are decoded by the reference's decoder ([`crate::reference::decode_into`]),
//! a few thousand elements at a time as they are compared, not by the
//! replay's codecs.

use std::path::PathBuf;

use kb_format::{Dtype, Expr, Meta, TensorMeta, Tolerance, VerifySpec};

use crate::error::{Error, Result};
use crate::npy::NpyArray;
use crate::plane::{DataPlane, tensor_nbytes};
use crate::reference::{self, Evaluator, Matrix, matrix_shape};

/// Where an output's reference comes from.
#[derive(Debug, Clone)]
pub enum RefSource {
    /// The trace's verification spec.
    Expr(Expr),
    /// A numpy file given with `--expect`.
    Npy { path: PathBuf, array: NpyArray },
}

impl RefSource {
    pub fn describe(&self) -> String {
        match self {
            RefSource::Expr(_) => "spec".into(),
            RefSource::Npy { path, .. } => format!("npy:{}", path.display()),
        }
    }
}

/// One output to check.
#[derive(Debug, Clone)]
pub struct Check {
    pub tensor: String,
    pub reference: RefSource,
    /// The spec's: overrides the per-dtype default (unless the
    /// [`TolerancePolicy`] says otherwise).
    pub tolerance: Option<Tolerance>,
}

/// The spec's outputs, with `--expect` arrays replacing the reference of
/// the tensors they name (keeping the spec's tolerance) or added as new
/// checks, in the order given.
pub fn plan_checks(
    spec: Option<&VerifySpec>,
    expect: Vec<(String, PathBuf, NpyArray)>,
) -> Vec<Check> {
    let mut checks: Vec<Check> = spec
        .map(|s| {
            s.outputs
                .iter()
                .map(|o| Check {
                    tensor: o.tensor.clone(),
                    reference: RefSource::Expr(o.reference.clone()),
                    tolerance: o.tolerance,
                })
                .collect()
        })
        .unwrap_or_default();
    for (name, path, array) in expect {
        let reference = RefSource::Npy { path, array };
        match checks.iter_mut().find(|c| c.tensor == name) {
            Some(c) => c.reference = reference,
            None => checks.push(Check {
                tensor: name,
                reference,
                tolerance: None,
            }),
        }
    }
    checks
}

/// Where an output's rtol or atol came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TolSource {
    /// The dtype's default ([`default_tolerance`]).
    Default,
    /// The trace's verification spec.
    Trace,
    /// `--rtol` or `--atol`.
    Flag,
}

impl TolSource {
    /// How the JSON report names it.
    pub fn name(self) -> &'static str {
        match self {
            TolSource::Default => "default",
            TolSource::Trace => "trace",
            TolSource::Flag => "flag",
        }
    }
}

/// One `--atol` or `--rtol`: a value for every output, for the outputs of
/// a dtype (`f16=1e-2`), or for one output tensor (`y=1e-4`).
#[derive(Debug, Clone, PartialEq)]
pub struct TolFlag {
    /// The tensor or dtype name it is for; `None`: every output.
    pub target: Option<String>,
    pub value: f64,
}

impl TolFlag {
    /// `X`, or `NAME=X` (NAME a tensor or a dtype); X a finite number
    /// >= 0.
    pub fn parse(s: &str) -> std::result::Result<TolFlag, String> {
        let (target, value) = match s.split_once('=') {
            Some((name, v)) if !name.trim().is_empty() => (Some(name.trim().to_string()), v),
            Some(_) => return Err("expected X or NAME=X (NAME a tensor or a dtype)".into()),
            None => (None, s),
        };
        match value.trim().parse::<f64>() {
            // -0 is 0.
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(TolFlag {
                target,
                value: v.abs(),
            }),
            _ => Err("expected a finite number >= 0 (X, or NAME=X for a tensor or a dtype)".into()),
        }
    }
}

/// How each output's tolerance is chosen (`--atol`, `--rtol`,
/// `--strict-tolerance`). The default policy takes the spec's tolerance
/// where it gives one and the dtype's default otherwise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TolerancePolicy {
    /// `--atol`s: a tensor's beats its dtype's, which beats the one for
    /// every output; of equals, the last.
    pub atol: Vec<TolFlag>,
    /// `--rtol`s, likewise.
    pub rtol: Vec<TolFlag>,
    /// `--strict-tolerance`: ignore the spec's tolerances and use the
    /// dtype defaults (where `atol`/`rtol` do not say otherwise).
    pub strict: bool,
}

impl TolerancePolicy {
    /// The flag of `flags` that applies to output `tensor` of `dtype`.
    fn flag(flags: &[TolFlag], tensor: &str, dtype: Dtype) -> Option<f64> {
        let dtype = dtype.name();
        let of = |t: Option<&str>| {
            flags
                .iter()
                .rev()
                .find(|f| f.target.as_deref() == t)
                .map(|f| f.value)
        };
        of(Some(tensor))
            .or_else(|| of(Some(dtype)))
            .or_else(|| of(None))
    }

    /// Targets of the flags that name neither a dtype nor one of
    /// `outputs`: a misspelt name would silently change nothing.
    pub fn unknown_targets<'a>(&'a self, outputs: &[&str]) -> Vec<&'a str> {
        self.atol
            .iter()
            .chain(&self.rtol)
            .filter_map(|f| f.target.as_deref())
            .filter(|t| !outputs.contains(t) && Dtype::from_name(t).is_none())
            .collect()
    }

    /// The tolerance for output `tensor` of `dtype` whose spec gives
    /// `spec`, and where its rtol and atol came from.
    pub fn resolve(
        &self,
        tensor: &str,
        dtype: Dtype,
        spec: Option<Tolerance>,
    ) -> (Tolerance, TolSource, TolSource) {
        let (base, from) = match spec {
            Some(t) if !self.strict => (t, TolSource::Trace),
            _ => (default_tolerance(dtype), TolSource::Default),
        };
        let pick = |flag: Option<f64>, base: f64| match flag {
            Some(v) => (v, TolSource::Flag),
            None => (base, from),
        };
        let (rtol, rtol_from) = pick(Self::flag(&self.rtol, tensor, dtype), base.rtol);
        let (atol, atol_from) = pick(Self::flag(&self.atol, tensor, dtype), base.atol);
        (Tolerance { rtol, atol }, rtol_from, atol_from)
    }
}

/// The default tolerance for a dtype (docs/design.md P7).
pub fn default_tolerance(d: Dtype) -> Tolerance {
    let t = match d {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 1e-3,
        Dtype::Bf16 => 1e-2,
        Dtype::I8 | Dtype::I32 | Dtype::U8 => 0.0,
    };
    Tolerance { rtol: t, atol: t }
}

/// The first element that differs.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Index in the tensor's shape.
    pub index: Vec<u64>,
    pub got: f64,
    pub expected: f64,
}

/// The result of comparing one output.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputReport {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub reference: String,
    /// The tolerance applied, and where its rtol and atol came from.
    pub tolerance: Tolerance,
    pub rtol_from: TolSource,
    pub atol_from: TolSource,
    pub elements: u64,
    /// Over elements where both values are finite.
    pub max_abs_err: f64,
    /// Over elements where both are finite and the reference is non-zero.
    pub max_rel_err: f64,
    pub mismatches: u64,
    pub first_mismatch: Option<Mismatch>,
    /// The element closest to failing (or furthest past it): its index
    /// and its margin `|got - ref| / (atol + rtol |ref|)`, which the
    /// allclose rule keeps at most 1. `None` when no element is finite.
    pub worst: Option<(Vec<u64>, f64)>,
    pub pass: bool,
}

/// A tolerance in a note: `1e-5`, or `0 (exact)`.
fn tol_text(v: f64) -> String {
    if v == 0.0 {
        "0 (exact)".into()
    } else {
        format!("{v:e}")
    }
}

impl OutputReport {
    /// Whether the rtol and the atol applied came from the trace and are
    /// looser than the dtype's default: a trace that loosens its own check
    /// is named, so that a user sees it.
    pub fn looser_than_default(&self) -> (bool, bool) {
        let d = default_tolerance(self.dtype);
        (
            self.rtol_from == TolSource::Trace && self.tolerance.rtol > d.rtol,
            self.atol_from == TolSource::Trace && self.tolerance.atol > d.atol,
        )
    }

    /// `tolerance from the trace, looser than the f32 default 1e-5 ...`
    /// when [`Self::looser_than_default`] says so.
    pub fn tolerance_note(&self) -> Option<String> {
        let what = match self.looser_than_default() {
            (true, true) => "tolerance",
            (true, false) => "rtol",
            (false, true) => "atol",
            (false, false) => return None,
        };
        let d = default_tolerance(self.dtype);
        let default = if d.rtol == d.atol {
            tol_text(d.rtol)
        } else {
            format!("rtol {}, atol {}", tol_text(d.rtol), tol_text(d.atol))
        };
        Some(format!(
            "{what} from the trace, looser than the {} default {default}, which --strict-tolerance applies",
            self.dtype
        ))
    }
}

/// Element comparison statistics (the default: no elements, nothing
/// wrong).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Comparison {
    pub max_abs_err: f64,
    pub max_rel_err: f64,
    pub mismatches: u64,
    /// Flat index and values of the first mismatch.
    pub first: Option<(usize, f64, f64)>,
    /// Flat index and margin of the finite element with the largest
    /// `|got - ref| / (atol + rtol |ref|)` (the first of equals).
    pub worst: Option<(usize, f64)>,
}

/// Elements decoded at a time into a stack buffer, reading inputs and
/// comparing outputs.
const PART: usize = 2048;

/// Compare `got` with `expected` (same length) under `tol`: pieces of
/// [`reference::PAR_CHUNK`] elements on the current rayon pool, merged in
/// order, so the result is the one pass's (the first mismatch, the first
/// of equally worst elements) for every thread count.
pub fn compare(got: &[f64], expected: &[f64], tol: Tolerance) -> Comparison {
    assert_eq!(got.len(), expected.len(), "compare: lengths differ");
    compare_by(expected, tol, |at, out| {
        out.copy_from_slice(&got[at..at + out.len()])
    })
}

/// [`compare`] of the replay's output bytes, elements of `dtype` (as many
/// as `expected` has), decoded a few thousand at a time as they are
/// compared: a 2048 x 2048 output's f64 copy was 32 MB of page faults and
/// memory traffic.
pub fn compare_encoded(dtype: Dtype, got: &[u8], expected: &[f64], tol: Tolerance) -> Comparison {
    let size = dtype.size();
    assert_eq!(got.len() / size, expected.len(), "compare: lengths differ");
    compare_by(expected, tol, |at, out| {
        reference::decode_into(dtype, &got[at * size..(at + out.len()) * size], out)
    })
}

/// The comparison of `expected` with the values `fill(at, out)` writes
/// (elements `at..at + out.len()` of what is checked).
fn compare_by(
    expected: &[f64],
    tol: Tolerance,
    fill: impl Fn(usize, &mut [f64]) + Sync,
) -> Comparison {
    use rayon::prelude::*;
    let pieces: Vec<Comparison> = expected
        .par_chunks(reference::PAR_CHUNK)
        .enumerate()
        .map(|(p, piece)| {
            let mut got = [0.0; PART];
            let mut c = Comparison::default();
            for (q, e) in piece.chunks(PART).enumerate() {
                let at = p * reference::PAR_CHUNK + q * PART;
                let got = &mut got[..e.len()];
                fill(at, got);
                c.merge(compare_piece(got, e, tol, at));
            }
            c
        })
        .collect();
    let mut c = Comparison::default();
    for p in pieces {
        c.merge(p);
    }
    c
}

impl Comparison {
    /// Fold in the comparison of the elements after this one's.
    fn merge(&mut self, later: Comparison) {
        self.max_abs_err = self.max_abs_err.max(later.max_abs_err);
        self.max_rel_err = self.max_rel_err.max(later.max_rel_err);
        self.mismatches += later.mismatches;
        self.first = self.first.or(later.first);
        if let Some((i, m)) = later.worst
            && self.worst.is_none_or(|(_, w)| m > w)
        {
            self.worst = Some((i, m));
        }
    }
}

/// [`compare`] of one piece, whose first element is element `base`.
fn compare_piece(got: &[f64], expected: &[f64], tol: Tolerance, base: usize) -> Comparison {
    let mut c = Comparison::default();
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let i = base + i;
        let ok = if g.is_nan() || e.is_nan() {
            g.is_nan() && e.is_nan()
        } else if g.is_infinite() || e.is_infinite() {
            g == e
        } else {
            let abs = (g - e).abs();
            c.max_abs_err = c.max_abs_err.max(abs);
            if e != 0.0 {
                c.max_rel_err = c.max_rel_err.max(abs / e.abs());
            }
            let allowed = tol.atol + tol.rtol * e.abs();
            // With no tolerance (exact dtypes) any difference is infinitely
            // far past it.
            let margin = if abs == 0.0 {
                0.0
            } else if allowed == 0.0 {
                f64::INFINITY
            } else {
                abs / allowed
            };
            // A NaN margin (an infinite difference within an infinite
            // allowance) ranks nowhere, so the pieces' worst merge as one
            // pass's would.
            if !margin.is_nan() && c.worst.is_none_or(|(_, m)| margin > m) {
                c.worst = Some((i, margin));
            }
            abs <= allowed
        };
        if !ok {
            c.mismatches += 1;
            if c.first.is_none() {
                c.first = Some((i, g, e));
            }
        }
    }
    c
}

/// Multi-index of flat index `i` in `shape` (C order).
pub fn unravel(mut i: u64, shape: &[u64]) -> Vec<u64> {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

fn tensor<'m>(meta: &'m Meta, name: &str) -> Result<(u32, &'m TensorMeta)> {
    meta.tensor(name)
        .ok_or_else(|| Error::Trace(format!("the trace has no tensor named {name:?}")))
}

fn checked_nbytes(t: &TensorMeta, max_bytes: u64) -> Result<u64> {
    match tensor_nbytes(t) {
        Some(n) if n <= max_bytes => Ok(n),
        Some(n) => Err(Error::Trace(format!(
            "tensor {:?} has {n} bytes, more than the limit of {max_bytes}",
            t.name
        ))),
        None => Err(Error::Trace(format!(
            "tensor {:?} has a shape {:?} whose size overflows",
            t.name, t.shape
        ))),
    }
}

/// The bytes of tensor `idx` after replay, in tensor layout: gathered from
/// its shards (device PAs), or from its host space when it has none.
pub fn gather_tensor(plane: &DataPlane, idx: u32, t: &TensorMeta) -> Result<Vec<u8>> {
    let max = plane.max_bytes();
    let nbytes = checked_nbytes(t, max)?;
    let mut buf = vec![0u8; nbytes as usize];
    if t.shards.is_empty() {
        plane
            .read(kb_format::pa::host(idx, 0), &mut buf)
            .map_err(|e| Error::Trace(format!("tensor {:?} host data: {e}", t.name)))?;
        return Ok(buf);
    }
    let mut total = 0u64;
    for (k, s) in t.shards.iter().enumerate() {
        let err = |d: String| Error::Trace(format!("tensor {:?} shard {k}: {d}", t.name));
        if s.row_bytes == 0 || s.rows == 0 {
            continue;
        }
        total = s
            .rows
            .checked_mul(s.row_bytes)
            .and_then(|b| b.checked_add(total))
            .filter(|&b| b <= max)
            .ok_or_else(|| err(format!("its shards hold more than {max} bytes")))?;
        for r in 0..s.rows {
            let dst = r
                .checked_mul(s.tensor_row_stride)
                .and_then(|o| o.checked_add(s.tensor_offset))
                .filter(|&d| d.checked_add(s.row_bytes).is_some_and(|e| e <= nbytes))
                .ok_or_else(|| {
                    err(format!(
                        "row {r} ({} bytes at tensor offset {} + {r} x {}) is outside the tensor's {nbytes} bytes",
                        s.row_bytes, s.tensor_offset, s.tensor_row_stride
                    ))
                })? as usize;
            let src = s.pa.saturating_add(r * s.row_bytes);
            plane
                .read(src, &mut buf[dst..dst + s.row_bytes as usize])
                .map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(buf)
}

/// An input tensor's host data (as the trace gave it) as an f64 matrix.
pub fn input_matrix(plane: &DataPlane, meta: &Meta, name: &str) -> Result<Matrix, String> {
    let (idx, t) = meta
        .tensor(name)
        .ok_or_else(|| format!("the trace has no tensor named {name:?}"))?;
    if !t.host_data {
        return Err(format!(
            "tensor {name:?} has no host data, so it cannot be a reference input"
        ));
    }
    let nbytes = tensor_nbytes(t).ok_or_else(|| format!("tensor {name:?} size overflows"))?;
    let (loaded, _) = plane.host_coverage(idx).unwrap_or((0, None));
    if loaded < nbytes {
        return Err(format!(
            "the trace holds {loaded} of the {nbytes} bytes of tensor {name:?}'s host data"
        ));
    }
    let (rows, cols) =
        matrix_shape(&t.shape).ok_or_else(|| format!("tensor {name:?} shape overflows"))?;
    // Read and decoded a part at a time on the pool, its pages first
    // touched there (no copy of the bytes: a 2048 x 2048 f32 input's was
    // 16 MB of page faults).
    use rayon::prelude::*;
    let size = t.dtype.size();
    let mut data = vec![0.0; nbytes as usize / size];
    data.par_chunks_mut(reference::PAR_CHUNK)
        .enumerate()
        .try_for_each(|(p, piece)| {
            let mut bytes = [0u8; PART * MAX_ELEMENT_BYTES];
            for (q, out) in piece.chunks_mut(PART).enumerate() {
                let at = (p * reference::PAR_CHUNK + q * PART) * size;
                let bytes = &mut bytes[..out.len() * size];
                plane
                    .read_host_input(idx, at as u64, bytes)
                    .map_err(|e| e.to_string())?;
                reference::decode_into(t.dtype, bytes, out);
            }
            Ok::<(), String>(())
        })?;
    Matrix::new(rows, cols, data)
}

/// The widest dtype's element (f32, i32).
const MAX_ELEMENT_BYTES: usize = 4;

/// Check every output, telling `on_output` (index, tensor) as each starts;
/// an error (exit 2) means a check could not be made. Tolerances as the
/// default [`TolerancePolicy`] chooses them.
pub fn verify(
    plane: &DataPlane,
    meta: &Meta,
    checks: &[Check],
    on_output: impl Fn(usize, &str),
) -> Result<Vec<OutputReport>> {
    verify_with(plane, meta, checks, &TolerancePolicy::default(), on_output)
}

/// [`verify`], with tolerances chosen by `policy`.
pub fn verify_with(
    plane: &DataPlane,
    meta: &Meta,
    checks: &[Check],
    policy: &TolerancePolicy,
    on_output: impl Fn(usize, &str),
) -> Result<Vec<OutputReport>> {
    let lookup = |name: &str| input_matrix(plane, meta, name);
    let eval = Evaluator {
        tensor: &lookup,
        max_elems: (plane.max_bytes() / 8) as usize,
    };
    let mut out = Vec::with_capacity(checks.len());
    for (i, c) in checks.iter().enumerate() {
        on_output(i, &c.tensor);
        let (idx, t) = tensor(meta, &c.tensor)?;
        let (rows, cols) = matrix_shape(&t.shape)
            .ok_or_else(|| Error::Trace(format!("tensor {:?} shape overflows", t.name)))?;
        let expected: std::borrow::Cow<[f64]> = match &c.reference {
            RefSource::Expr(e) => {
                let m = eval.eval(e).map_err(|d| {
                    Error::Trace(format!("reference for output {:?}: {d}", c.tensor))
                })?;
                let same = (m.rows, m.cols) == (rows, cols);
                let both_vectors = (m.rows == 1 || m.cols == 1)
                    && (rows == 1 || cols == 1)
                    && m.data.len() == rows * cols;
                if !same && !both_vectors {
                    return Err(Error::Trace(format!(
                        "reference for output {:?} is {} x {}, but the tensor's shape is {:?}",
                        c.tensor, m.rows, m.cols, t.shape
                    )));
                }
                m.data.into()
            }
            RefSource::Npy { path, array } => {
                if array.shape != t.shape {
                    return Err(Error::file(
                        path,
                        format!(
                            "shape {:?} does not match tensor {:?} of shape {:?}",
                            array.shape, c.tensor, t.shape
                        ),
                    ));
                }
                array.data.as_slice().into()
            }
        };
        let bytes = gather_tensor(plane, idx, t)?;
        let elements = bytes.len() / t.dtype.size();
        if elements != expected.len() {
            return Err(Error::Trace(format!(
                "reference for output {:?} has {} values, but the tensor has {elements}",
                c.tensor,
                expected.len(),
            )));
        }
        let (tol, rtol_from, atol_from) = policy.resolve(&c.tensor, t.dtype, c.tolerance);
        let cmp = compare_encoded(t.dtype, &bytes, &expected, tol);
        out.push(OutputReport {
            name: c.tensor.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            reference: c.reference.describe(),
            tolerance: tol,
            rtol_from,
            atol_from,
            elements: elements as u64,
            max_abs_err: cmp.max_abs_err,
            max_rel_err: cmp.max_rel_err,
            mismatches: cmp.mismatches,
            first_mismatch: cmp.first.map(|(i, g, e)| Mismatch {
                index: unravel(i as u64, &t.shape),
                got: g,
                expected: e,
            }),
            worst: cmp.worst.map(|(i, m)| (unravel(i as u64, &t.shape), m)),
            pass: cmp.mismatches == 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance {
        rtol: 1e-3,
        atol: 1e-3,
    };

    #[test]
    fn allclose_rule_with_absolute_and_relative_parts() {
        // |1001 - 1000| = 1 <= 1e-3 + 1e-3 * 1000 = 1.001: passes.
        let c = compare(&[1001.0], &[1000.0], TOL);
        assert_eq!(c.mismatches, 0);
        assert_eq!(c.max_abs_err, 1.0);
        assert_eq!(c.max_rel_err, 1e-3);
        // 1.002 off at 1000 fails.
        let c = compare(&[0.0, 1001.002], &[0.0, 1000.0], TOL);
        assert_eq!((c.mismatches, c.first.map(|f| f.0)), (1, Some(1)));
        // Near zero only atol counts.
        assert_eq!(compare(&[0.0009], &[0.0], TOL).mismatches, 0);
        assert_eq!(compare(&[0.0011], &[0.0], TOL).mismatches, 1);
    }

    /// `Comparison`s equal bit for bit (NaNs in `first` included).
    fn same(a: &Comparison, b: &Comparison) -> bool {
        let bits = |c: &Comparison| {
            (
                c.max_abs_err.to_bits(),
                c.max_rel_err.to_bits(),
                c.mismatches,
                c.first.map(|(i, g, e)| (i, g.to_bits(), e.to_bits())),
                c.worst.map(|(i, m)| (i, m.to_bits())),
            )
        };
        bits(a) == bits(b)
    }

    #[test]
    fn pieces_merge_as_one_pass_on_special_values_and_tolerances() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(38);
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            -f64::MAX,
            f64::MIN_POSITIVE / 4.0,
            1e-3,
        ];
        let value = |rng: &mut rand::rngs::StdRng, near: f64| -> f64 {
            match rng.random_range(0..6) {
                0 => specials[rng.random_range(0..specials.len())],
                1 => near,
                2 => near + rng.random_range(-1e-3..1e-3),
                _ => near * (1.0 + rng.random_range(-1e-2..1e-2)),
            }
        };
        let tols = [
            TOL,
            Tolerance {
                rtol: 0.0,
                atol: 0.0,
            },
            Tolerance {
                rtol: -1e-3,
                atol: 1e-3,
            },
            Tolerance {
                rtol: f64::NAN,
                atol: 0.0,
            },
            Tolerance {
                rtol: 1.0,
                atol: f64::INFINITY,
            },
            Tolerance {
                rtol: 1e300,
                atol: 1e300,
            },
        ];
        for case in 0..12 {
            let n = 3 * reference::PAR_CHUNK + 17;
            let expected: Vec<f64> = (0..n)
                .map(|_| {
                    let near = rng.random_range(-10.0..10.0);
                    value(&mut rng, near)
                })
                .collect();
            let got: Vec<f64> = expected.iter().map(|&e| value(&mut rng, e)).collect();
            let tol = tols[case % tols.len()];
            let one = compare_piece(&got, &expected, tol, 0);
            let pieces = compare(&got, &expected, tol);
            assert!(same(&pieces, &one), "case {case}: {pieces:?} vs {one:?}");
        }
    }

    /// The replay's bytes compared as they are decoded give the
    /// comparison of the decoded values, for every dtype (mismatches
    /// spread over several pieces and parts), and no dtype is wider than
    /// the reader's buffer allows.
    #[test]
    fn encoded_outputs_compare_as_their_decoded_values() {
        let n = 2 * reference::PAR_CHUNK + 4_099;
        for dtype in Dtype::ALL {
            assert!(dtype.size() <= MAX_ELEMENT_BYTES, "{dtype:?}");
            let bytes: Vec<u8> = (0..n * dtype.size())
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
                .collect();
            let mut got = vec![0.0; n];
            reference::decode_into(dtype, &bytes, &mut got);
            // The reference: the decoded values, every 997th moved.
            let expected: Vec<f64> = got
                .iter()
                .enumerate()
                .map(|(i, &g)| if i % 997 == 3 { g * 1.5 + 1.0 } else { g })
                .collect();
            let want = compare_piece(&got, &expected, TOL, 0);
            assert!(want.mismatches > 100, "{dtype:?}: {want:?}");
            let c = compare_encoded(dtype, &bytes, &expected, TOL);
            assert!(same(&c, &want), "{dtype:?}: {c:?} vs {want:?}");
        }
    }

    #[test]
    fn pieces_merge_as_one_pass_for_every_thread_count() {
        // Four pieces and a part: mismatches in the second and fourth,
        // the two worst margins equal (the earlier, in the second piece,
        // must win).
        let p = reference::PAR_CHUNK;
        let n = 4 * p + 100;
        let expected: Vec<f64> = (0..n).map(|i| 1.0 + (i % 2) as f64 * 1e-12).collect();
        let mut got = expected.clone();
        // |d| <= 1e-3 + 1e-3 |e|: e = 1 allows 0.002.
        let at = |piece: usize, i: usize| piece * p + 2 * i; // e = 1 there
        got[at(1, 10)] += 0.01; // margin 5, mismatch
        got[at(3, 2)] += 0.01; // margin 5 again: not the worst (later)
        got[at(3, 5)] -= 0.004; // margin 2, mismatch
        got[at(2, 1)] += 0.001; // margin 0.5, passes
        got[n - 1] = f64::NAN; // NaN against a number: mismatch
        let want = |c: &Comparison| {
            assert_eq!(c.mismatches, 4);
            assert_eq!(c.first.map(|f| f.0), Some(at(1, 10)));
            assert_eq!(c.worst.map(|w| w.0), Some(at(1, 10)));
            assert!((c.worst.unwrap().1 - 0.01 / 0.002).abs() < 1e-9);
            assert!((c.max_abs_err - 0.01).abs() < 1e-12);
        };
        for threads in [1, 2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let c = pool.install(|| compare(&got, &expected, TOL));
            want(&c);
            // The same as one piece over the whole.
            assert_eq!(
                c,
                compare_piece(&got, &expected, TOL, 0),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn the_worst_margin_is_the_allclose_ratio_of_the_closest_call() {
        // Margins: 0; 1 / 1.001 (the largest relative error is not the
        // worst margin); 0.0005 / 0.001 = 0.5 near zero.
        let c = compare(&[1.0, 1001.0, 0.0005], &[1.0, 1000.0, 0.0], TOL);
        let (i, m) = c.worst.unwrap();
        assert_eq!(i, 1);
        assert!((m - 1.0 / 1.001).abs() < 1e-12, "{m}");
        let c = compare(&[0.0008, 2.0], &[0.0, 2.0], TOL);
        assert_eq!(c.worst.map(|w| w.0), Some(0));
        // Exact dtypes: any difference is infinitely past the tolerance.
        let exact = default_tolerance(Dtype::I32);
        assert_eq!(
            compare(&[3.0, 4.0], &[3.0, 5.0], exact).worst,
            Some((1, f64::INFINITY))
        );
        assert_eq!(compare(&[f64::NAN], &[f64::NAN], TOL).worst, None);
    }

    #[test]
    fn nan_and_infinity_match_only_themselves() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let c = compare(&[nan, inf, -inf], &[nan, inf, -inf], TOL);
        assert_eq!(c.mismatches, 0);
        let c = compare(&[nan, 1.0, inf, 1.0], &[1.0, nan, -inf, inf], TOL);
        assert_eq!(c.mismatches, 4);
        assert_eq!(
            c.max_abs_err, 0.0,
            "non-finite pairs do not enter the error maxima"
        );
    }

    #[test]
    fn integers_are_exact_by_default() {
        let t = default_tolerance(Dtype::I32);
        assert_eq!(compare(&[3.0], &[3.0], t).mismatches, 0);
        assert_eq!(compare(&[3.0], &[4.0], t).mismatches, 1);
        assert_eq!(default_tolerance(Dtype::Bf16).rtol, 1e-2);
        assert_eq!(default_tolerance(Dtype::F32).atol, 1e-5);
    }

    #[test]
    fn flags_and_strict_choose_the_tolerance_and_say_where_it_came_from() {
        use TolSource::*;
        let f32d = default_tolerance(Dtype::F32);
        let none = TolerancePolicy::default();
        assert_eq!(
            none.resolve("y", Dtype::F32, None),
            (f32d, Default, Default)
        );
        assert_eq!(
            none.resolve("y", Dtype::F32, Some(TOL)),
            (TOL, Trace, Trace)
        );
        let strict = TolerancePolicy {
            strict: true,
            ..none.clone()
        };
        assert_eq!(
            strict.resolve("y", Dtype::F32, Some(TOL)),
            (f32d, Default, Default)
        );
        let flag = |s: &str| TolFlag::parse(s).unwrap();
        // Each flag on its own; they win over --strict-tolerance.
        let atol = TolerancePolicy {
            atol: vec![flag("0")],
            ..none.clone()
        };
        let want = Tolerance {
            rtol: TOL.rtol,
            atol: 0.0,
        };
        assert_eq!(
            atol.resolve("y", Dtype::F32, Some(TOL)),
            (want, Trace, Flag)
        );
        let both = TolerancePolicy {
            atol: vec![flag("0.5")],
            rtol: vec![flag("0.25")],
            strict: true,
        };
        let want = Tolerance {
            rtol: 0.25,
            atol: 0.5,
        };
        assert_eq!(both.resolve("y", Dtype::I8, Some(TOL)), (want, Flag, Flag));
        // A tensor's beats its dtype's, which beats the one for all; of
        // equals, the last.
        let scoped = TolerancePolicy {
            atol: vec![flag("y=1e-4"), flag("0.5"), flag("f16=1e-2"), flag("0.25")],
            ..none
        };
        let atol_of = |t: &str, d| scoped.resolve(t, d, None).0.atol;
        assert_eq!(atol_of("y", Dtype::F16), 1e-4);
        assert_eq!(atol_of("z", Dtype::F16), 1e-2);
        assert_eq!(atol_of("z", Dtype::F32), 0.25);
        assert_eq!(scoped.unknown_targets(&["y"]), Vec::<&str>::new());
        assert_eq!(scoped.unknown_targets(&["x"]), vec!["y"]);
        for bad in ["", "-1", "nan", "inf", "=1", "y=", "y=-2", "abc"] {
            assert!(TolFlag::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_trace_tolerance_looser_than_the_default_is_named() {
        let report = |dtype, policy: &TolerancePolicy, spec| {
            let (tolerance, rtol_from, atol_from) = policy.resolve("y", dtype, spec);
            OutputReport {
                name: "y".into(),
                dtype,
                shape: vec![1],
                reference: "spec".into(),
                tolerance,
                rtol_from,
                atol_from,
                elements: 1,
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                mismatches: 0,
                first_mismatch: None,
                worst: None,
                pass: true,
            }
        };
        let none = TolerancePolicy::default();
        let r = report(Dtype::F32, &none, Some(TOL));
        assert_eq!(r.looser_than_default(), (true, true));
        let note = r.tolerance_note().unwrap();
        assert!(
            note.starts_with("tolerance from the trace, looser than the f32 default 1e-5"),
            "{note}"
        );
        // Tighter or equal, the default, or overridden: no note.
        assert_eq!(report(Dtype::F16, &none, Some(TOL)).tolerance_note(), None);
        assert_eq!(report(Dtype::Bf16, &none, Some(TOL)).tolerance_note(), None);
        assert_eq!(report(Dtype::F32, &none, None).tolerance_note(), None);
        let strict = TolerancePolicy {
            strict: true,
            ..none.clone()
        };
        assert_eq!(
            report(Dtype::F32, &strict, Some(TOL)).tolerance_note(),
            None
        );
        // Half overridden: the other half is still the trace's.
        let atol = TolerancePolicy {
            atol: vec![TolFlag::parse("0").unwrap()],
            ..none.clone()
        };
        let note = report(Dtype::F32, &atol, Some(TOL))
            .tolerance_note()
            .unwrap();
        assert!(note.starts_with("rtol from the trace, looser"), "{note}");
        // Integers are exact by default.
        let note = report(Dtype::I32, &none, Some(TOL))
            .tolerance_note()
            .unwrap();
        assert!(note.contains("the i32 default 0 (exact)"), "{note}");
    }

    #[test]
    fn unravel_gives_c_order_indices() {
        assert_eq!(unravel(5, &[2, 3]), [1, 2]);
        assert_eq!(unravel(7, &[2, 2, 2]), [1, 1, 1]);
        assert_eq!(unravel(0, &[]), Vec::<u64>::new());
    }

    #[test]
    fn expect_overrides_or_adds_checks() {
        let spec = VerifySpec {
            outputs: vec![kb_format::VerifyOutput {
                tensor: "y".into(),
                reference: Expr::Tensor("x".into()),
                tolerance: Some(TOL),
            }],
        };
        let arr = NpyArray {
            shape: vec![1],
            data: vec![0.0],
        };
        let checks = plan_checks(
            Some(&spec),
            vec![
                ("y".into(), "y.npy".into(), arr.clone()),
                ("z".into(), "z.npy".into(), arr),
            ],
        );
        assert_eq!(checks.len(), 2);
        assert!(matches!(checks[0].reference, RefSource::Npy { .. }));
        assert_eq!(checks[0].tolerance, Some(TOL));
        assert_eq!(checks[1].tensor, "z");
    }
}
