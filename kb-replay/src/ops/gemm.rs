//! GEMM replay: `out = op(a) x op(b) (+ acc)`.
//!
//! Operand bytes arrive concatenated in operand order (a, b, then acc when
//! `GemmParams::acc` is set). Conventions:
//!
//! - `a` is logically m x k and `b` k x n. A transposed operand is stored
//!   as its transpose (`a` as k x m, `b` as n x k); `layout_*` says whether
//!   the *stored* matrix is row- or column-major.
//! - `acc` and `out` are m x n in `layout_out`; `acc` is in `dtype_acc`,
//!   `out` in `dtype_out`.
//! - Arithmetic is in the accumulation dtype (from the record): f32 for
//!   `dtype_acc` f32, f16 and bf16 (f16/bf16 inputs are widened exactly to
//!   f32; an f16/bf16 accumulator's result is rounded through that
//!   precision before the output conversion); wrapping i32 for `dtype_acc`
//!   i32, which needs integer inputs. Other combinations are errors.
//! - Integer GEMMs are exact. When every partial sum is an integer below
//!   2^24 (i8 inputs with k <= 1024, say) the products run through the f32
//!   backend, below 2^53 through f64, and only otherwise through wrapping
//!   i32 loops; the accumulator is added in wrapping i32 afterwards. Exact
//!   arithmetic gives the same bits on every path.
//!
//! A GEMM runs in three steps so that the engine can batch: [`prepare`]
//! decodes the operands into logical row-major matrices, [`compute`] or
//! [`compute_batch`] calls the [`GemmBackend`], [`finish`] encodes the
//! output. GEMMs with equal [`BatchKey`]s can share one batched call;
//! [`execute`] does all three for one GEMM.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use kb_format::{Dtype, GemmParams, Layout};

use crate::backend::{Dims, GemmArgs, GemmBackend};
use crate::backend::{MatMut, MatRef, ViewArgs};
use crate::dtype;

fn dims(p: &GemmParams) -> Option<(Dims, [usize; 3])> {
    let (m, k, n) = (p.m as usize, p.k as usize, p.n as usize);
    let mk = m.checked_mul(k)?;
    let kn = k.checked_mul(n)?;
    let mn = m.checked_mul(n)?;
    Some((Dims { m, k, n }, [mk, kn, mn]))
}

/// Whether an operand stored with these flags is already the logical
/// row-major matrix (row-major untransposed, or column-major transposed).
pub fn stored_as_is(transpose: bool, layout: Layout) -> bool {
    transpose == (layout == Layout::ColMajor)
}

/// Dims and element counts (a, b, output) of a GEMM that can run on its
/// matrices where they are stored: f32 in, accumulated and out, a
/// row-major output (and accumulator), and `a` and `b` stored as the
/// logical row-major matrices. `None` for any other GEMM.
pub fn in_place_dims(p: &GemmParams) -> Option<(Dims, [usize; 3])> {
    let as_is = |transpose: bool, layout: Layout| transpose == (layout == Layout::ColMajor);
    (p.dtype_in == Dtype::F32
        && p.dtype_acc == Dtype::F32
        && p.dtype_out == Dtype::F32
        && p.layout_out == Layout::RowMajor
        && as_is(p.transpose_a, p.layout_a)
        && as_is(p.transpose_b, p.layout_b))
    .then(|| dims(p))
    .flatten()
}

/// Bytes of the operands (a, b, acc), `None` on overflow.
pub fn input_len(p: &GemmParams) -> Option<u64> {
    let (_, [mk, kn, mn]) = dims(p)?;
    let s = p.dtype_in.size() as u64;
    let acc = if p.acc.is_some() {
        (mn as u64).checked_mul(p.dtype_acc.size() as u64)?
    } else {
        0
    };
    (mk as u64)
        .checked_add(kn as u64)?
        .checked_mul(s)?
        .checked_add(acc)
}

/// Bytes of the output, `None` on overflow.
pub fn output_len(p: &GemmParams) -> Option<u64> {
    let (_, [_, _, mn]) = dims(p)?;
    (mn as u64).checked_mul(p.dtype_out.size() as u64)
}

/// Floating-point operations (2mnk), saturating.
pub fn flops(p: &GemmParams) -> u64 {
    2u64.saturating_mul(p.m as u64)
        .saturating_mul(p.n as u64)
        .saturating_mul(p.k as u64)
}

/// What makes GEMMs batchable together: equal shape, dtypes, layouts,
/// transpose flags and accumulator presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchKey {
    mkn: [u32; 3],
    dtypes: [u8; 3],
    /// transpose_a, transpose_b, col-major a, b, out, has acc.
    flags: [bool; 6],
}

/// The batch key of a GEMM.
pub fn batch_key(p: &GemmParams) -> BatchKey {
    let col = |l: Layout| l == Layout::ColMajor;
    BatchKey {
        mkn: [p.m, p.k, p.n],
        dtypes: [p.dtype_in as u8, p.dtype_acc as u8, p.dtype_out as u8],
        flags: [
            p.transpose_a,
            p.transpose_b,
            col(p.layout_a),
            col(p.layout_b),
            col(p.layout_out),
            p.acc.is_some(),
        ],
    }
}

/// The logical `rows x cols` matrix, row-major, from its stored form.
pub(crate) fn logical<T: Copy>(
    stored: Vec<T>,
    rows: usize,
    cols: usize,
    transpose: bool,
    layout: Layout,
) -> Vec<T> {
    // Stored dims; a transposed operand is stored as cols x rows.
    let (sr, sc) = if transpose {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let col_major = layout == Layout::ColMajor;
    if transpose == col_major {
        // Row-major untransposed, or column-major transposed: already the
        // logical row-major order.
        return stored;
    }
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let (r, c) = if transpose { (j, i) } else { (i, j) };
            let idx = if col_major { c * sr + r } else { r * sc + c };
            out.push(stored[idx]);
        }
    }
    out
}

/// Row-major m x n values in `layout` order, through `f`.
fn store<T: Copy>(c: &[T], m: usize, n: usize, layout: Layout, mut f: impl FnMut(T)) {
    match layout {
        Layout::RowMajor => c.iter().for_each(|&v| f(v)),
        Layout::ColMajor => (0..n).for_each(|j| (0..m).for_each(|i| f(c[i * n + j]))),
    }
}

/// Operands decoded for the backend: logical row-major matrices, some
/// perhaps read where they lie (views borrowed for `'a`).
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    d: Dims,
    kind: Kind<'a>,
}

/// An f32 input matrix: decoded into a dense buffer, or, when the stored
/// operand is already the row-major f32 matrix, a view of it where it
/// lies (no copy; rows may be strided).
#[derive(Debug, Clone)]
enum Mat<'a> {
    Owned(Vec<f32>),
    View(MatRef<'a, f32>),
}

impl Mat<'_> {
    /// As a view of `rows x cols`.
    fn view(&self, rows: usize, cols: usize) -> MatRef<'_, f32> {
        match self {
            Mat::Owned(v) => MatRef::dense(v, rows, cols).expect("decoded to its size"),
            Mat::View(v) => *v,
        }
    }

    fn is_view(&self) -> bool {
        matches!(self, Mat::View(_))
    }
}

impl From<Vec<f32>> for Mat<'_> {
    fn from(v: Vec<f32>) -> Self {
        Mat::Owned(v)
    }
}

#[derive(Debug, Clone)]
enum Kind<'a> {
    /// Float arithmetic in f32; `c` starts as the accumulator.
    F32 { a: Mat<'a>, b: Mat<'a>, c: Vec<f32> },
    /// Exact integer products in f32 (`c` starts at zero); `acc` is added
    /// in wrapping i32 afterwards.
    IntF32 {
        a: Mat<'a>,
        b: Mat<'a>,
        c: Vec<f32>,
        acc: Option<Vec<i32>>,
    },
    /// As `IntF32`, in f64.
    IntF64 {
        a: Vec<f64>,
        b: Vec<f64>,
        c: Vec<f64>,
        acc: Option<Vec<i32>>,
    },
    /// Wrapping i32; `c` starts as the accumulator.
    I32 {
        a: Vec<i32>,
        b: Vec<i32>,
        c: Vec<i32>,
    },
}

fn max_abs(v: &[i32]) -> u64 {
    v.iter().map(|x| x.unsigned_abs() as u64).max().unwrap_or(0)
}

/// Decode a GEMM's concatenated operand bytes; an error says what does not fit.
pub fn prepare(p: &GemmParams, input: &[u8]) -> Result<Prepared<'static>, String> {
    let (d, [mk, kn, mn]) = dims(p).ok_or("gemm sizes overflow")?;
    let want = input_len(p).ok_or("gemm sizes overflow")?;
    if want != input.len() as u64 {
        return Err(format!(
            "gemm {}x{}x{} ({} in{}) needs {want} operand bytes, but its read ranges hold {}",
            p.m,
            p.k,
            p.n,
            p.dtype_in,
            if p.acc.is_some() {
                format!(", {} acc", p.dtype_acc)
            } else {
                String::new()
            },
            input.len()
        ));
    }
    if let Some(mut dec) = Decoder::new(p) {
        dec.feed(input);
        return dec.finish();
    }
    let si = p.dtype_in.size();
    let (a, rest) = input.split_at(mk * si);
    let (b, acc) = rest.split_at(kn * si);
    let kind = match p.dtype_acc {
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 => Kind::F32 {
            a: logical(
                dtype::to_f32(p.dtype_in, a),
                d.m,
                d.k,
                p.transpose_a,
                p.layout_a,
            )
            .into(),
            b: logical(
                dtype::to_f32(p.dtype_in, b),
                d.k,
                d.n,
                p.transpose_b,
                p.layout_b,
            )
            .into(),
            c: if p.acc.is_some() {
                logical(
                    dtype::to_f32(p.dtype_acc, acc),
                    d.m,
                    d.n,
                    false,
                    p.layout_out,
                )
            } else {
                vec![0f32; mn]
            },
        },
        Dtype::I32 => {
            if !dtype::is_int(p.dtype_in) {
                return Err(format!(
                    "gemm with {} inputs cannot accumulate in i32",
                    p.dtype_in
                ));
            }
            let a = logical(
                dtype::to_i32(p.dtype_in, a),
                d.m,
                d.k,
                p.transpose_a,
                p.layout_a,
            );
            let b = logical(
                dtype::to_i32(p.dtype_in, b),
                d.k,
                d.n,
                p.transpose_b,
                p.layout_b,
            );
            let acc = p.acc.is_some().then(|| {
                logical(
                    dtype::to_i32(Dtype::I32, acc),
                    d.m,
                    d.n,
                    false,
                    p.layout_out,
                )
            });
            // Every partial sum is at most k * max|a| * max|b| in magnitude.
            let bound = (d.k as u128) * (max_abs(&a) as u128) * (max_abs(&b) as u128);
            if bound <= 1 << 24 {
                Kind::IntF32 {
                    a: Mat::Owned(a.iter().map(|&v| v as f32).collect()),
                    b: Mat::Owned(b.iter().map(|&v| v as f32).collect()),
                    c: vec![0f32; mn],
                    acc,
                }
            } else if bound <= 1 << 53 {
                Kind::IntF64 {
                    a: a.iter().map(|&v| v as f64).collect(),
                    b: b.iter().map(|&v| v as f64).collect(),
                    c: vec![0f64; mn],
                    acc,
                }
            } else {
                Kind::I32 {
                    a,
                    b,
                    c: acc.unwrap_or_else(|| vec![0i32; mn]),
                }
            }
        }
        other => return Err(format!("gemm cannot accumulate in {other}")),
    };
    Ok(Prepared { d, kind })
}

/// Element size of a float operand dtype the decoder handles.
fn float_size(d: Dtype) -> Option<usize> {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16).then(|| d.size())
}

/// Append the f32 values of whole `d` elements in `b` to `out`.
pub(crate) fn decode_f32(d: Dtype, b: &[u8], out: &mut Vec<f32>) {
    match d {
        // Straight into `out` (F16C where the CPU has it).
        Dtype::F16 if cfg!(target_endian = "little") => {
            let n = b.len() / 2;
            let at = out.len();
            out.resize(at + n, 0.0);
            match bytemuck::try_cast_slice::<u8, u16>(&b[..2 * n]) {
                Ok(bits) => bits
                    .reinterpret_cast::<half::f16>()
                    .convert_to_f32_slice(&mut out[at..]),
                Err(_) => {
                    for (o, w) in out[at..].iter_mut().zip(b.chunks_exact(2)) {
                        *o = half::f16::from_bits(u16::from_le_bytes([w[0], w[1]])).to_f32();
                    }
                }
            }
        }
        Dtype::F32 => match bytemuck::try_cast_slice::<u8, f32>(b) {
            Ok(v) if cfg!(target_endian = "little") => out.extend_from_slice(v),
            _ => out.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
        },
        Dtype::Bf16 => out.extend(
            b.chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
        ),
        _ => out.extend(dtype::to_f32(d, b)),
    }
}

/// Operand `which` (0: a, 1: b) of a float GEMM as its logical row-major
/// f32 matrix, decoded from its stored bytes fed piece by piece through
/// `feed` (which calls its argument with each piece, in order), into
/// `room` (cleared first) when it is stored that way.
pub fn decode_operand(
    p: &GemmParams,
    which: usize,
    room: Vec<f32>,
    feed: impl FnOnce(&mut dyn FnMut(&[u8])),
) -> Vec<f32> {
    let (m, k, n) = (p.m as usize, p.k as usize, p.n as usize);
    let (rows, cols, transpose, layout) = if which == 0 {
        (m, k, p.transpose_a, p.layout_a)
    } else {
        (k, n, p.transpose_b, p.layout_b)
    };
    let es = p.dtype_in.size();
    let mut out = room;
    out.clear();
    out.reserve(rows * cols);
    let mut carry = [0u8; 4];
    let mut carried = 0;
    feed(&mut |mut b: &[u8]| {
        if carried > 0 {
            let take = (es - carried).min(b.len());
            carry[carried..carried + take].copy_from_slice(&b[..take]);
            carried += take;
            b = &b[take..];
            if carried < es {
                return;
            }
            decode_f32(p.dtype_in, &carry[..es], &mut out);
            carried = 0;
        }
        let whole = b.len() / es * es;
        decode_f32(p.dtype_in, &b[..whole], &mut out);
        carry[..b.len() - whole].copy_from_slice(&b[whole..]);
        carried = b.len() - whole;
    });
    out.resize(rows * cols, 0.0);
    logical(out, rows, cols, transpose, layout)
}

/// Decodes a GEMM's operand bytes as they are gathered, piece by piece,
/// straight into the f32 matrices [`compute`] needs: one pass over the
/// bytes instead of a copy and a decode. For float inputs accumulating in
/// a float dtype; other GEMMs gather their bytes and use [`prepare`].
#[derive(Debug)]
pub struct Decoder<'p, 'a> {
    p: &'p GemmParams,
    d: Dims,
    /// Bytes of a, b and acc.
    lens: [usize; 3],
    dtypes: [Dtype; 3],
    /// The operand being decoded, and bytes of it seen.
    part: usize,
    seen: usize,
    vals: [Vec<f32>; 3],
    /// Operands used where they lie ([`Decoder::with_views`]); their
    /// bytes are skipped, not decoded.
    borrowed: [Option<Mat<'a>>; 2],
    /// The accumulator is the output's own bytes ([`Decoder::acc_in_place`]).
    acc_here: bool,
    /// A partial element split across pieces.
    carry: [u8; 4],
    carry_len: usize,
    /// Bytes fed beyond the operands.
    extra: usize,
}

impl<'p, 'a> Decoder<'p, 'a> {
    /// A decoder, when this GEMM can use one.
    pub fn new(p: &'p GemmParams) -> Option<Decoder<'p, 'a>> {
        Decoder::with_borrowed(p, [None, None])
    }

    /// A decoder that takes `a` and/or `b` as given: the logical
    /// row-major f32 matrices (m x k and k x n), read where they lie (an
    /// f32 operand stored as the logical matrix, see [`stored_as_is`]) or
    /// decoded once for several GEMMs. Their bytes are then skipped
    /// ([`Decoder::skip`]), not fed.
    pub fn with_views(
        p: &'p GemmParams,
        a: Option<MatRef<'a, f32>>,
        b: Option<MatRef<'a, f32>>,
    ) -> Option<Decoder<'p, 'a>> {
        let (d, _) = dims(p)?;
        let fits =
            |v: &MatRef<'a, f32>, rows: usize, cols: usize| v.rows() == rows && v.cols() == cols;
        if a.as_ref().is_some_and(|v| !fits(v, d.m, d.k))
            || b.as_ref().is_some_and(|v| !fits(v, d.k, d.n))
        {
            return None;
        }
        Decoder::with_borrowed(p, [a.map(Mat::View), b.map(Mat::View)])
    }

    fn with_borrowed(p: &'p GemmParams, borrowed: [Option<Mat<'a>>; 2]) -> Option<Decoder<'p, 'a>> {
        let si = float_size(p.dtype_in)?;
        let sa = float_size(p.dtype_acc)?;
        let (d, [mk, kn, mn]) = dims(p)?;
        let acc = if p.acc.is_some() { mn } else { 0 };
        let lens = [
            mk.checked_mul(si)?,
            kn.checked_mul(si)?,
            acc.checked_mul(sa)?,
        ];
        let take = |borrowed: bool, n: usize| {
            if borrowed {
                Vec::new()
            } else {
                crate::pool::F32.take(n)
            }
        };
        // The accumulator's buffer is taken when it is fed: most GEMMs
        // accumulate in place and never need it.
        let vals = [
            take(borrowed[0].is_some(), mk),
            take(borrowed[1].is_some(), kn),
            Vec::new(),
        ];
        Some(Decoder {
            p,
            d,
            lens,
            dtypes: [p.dtype_in, p.dtype_in, p.dtype_acc],
            part: 0,
            seen: 0,
            vals,
            borrowed,
            acc_here: false,
            carry: [0; 4],
            carry_len: 0,
            extra: 0,
        })
    }

    /// The accumulator stays where it lies (the output, computed in
    /// place): its bytes are not fed, and the result holds no `c`.
    pub fn acc_in_place(&mut self) {
        self.lens[2] = 0;
        self.acc_here = true;
    }

    /// Pass over the next `n` bytes of the operands without decoding
    /// them (they belong to operands taken as views).
    pub fn skip(&mut self, mut n: usize) {
        while n > 0 {
            while self.part < 3 && self.seen == self.lens[self.part] {
                self.part += 1;
                self.seen = 0;
            }
            if self.part == 3 {
                self.extra += n;
                return;
            }
            debug_assert!(self.part < 2 && self.borrowed[self.part].is_some());
            let take = (self.lens[self.part] - self.seen).min(n);
            self.seen += take;
            n -= take;
        }
    }

    /// The next bytes of the operands, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            while self.part < 3 && self.seen == self.lens[self.part] {
                self.part += 1;
                self.seen = 0;
            }
            if self.part == 3 {
                self.extra += bytes.len();
                return;
            }
            let take = (self.lens[self.part] - self.seen).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.decode(now);
            self.seen += take;
            bytes = rest;
        }
    }

    fn decode(&mut self, mut b: &[u8]) {
        if self.part < 2 && self.borrowed[self.part].is_some() {
            return;
        }
        let dt = self.dtypes[self.part];
        let es = dt.size();
        if self.part == 2 && self.vals[2].capacity() == 0 {
            self.vals[2] = crate::pool::F32.take(self.d.m * self.d.n);
        }
        let out = &mut self.vals[self.part];
        if self.carry_len > 0 {
            let n = (es - self.carry_len).min(b.len());
            self.carry[self.carry_len..self.carry_len + n].copy_from_slice(&b[..n]);
            self.carry_len += n;
            b = &b[n..];
            if self.carry_len < es {
                return;
            }
            decode_f32(dt, &self.carry[..es], out);
            self.carry_len = 0;
        }
        let whole = b.len() / es * es;
        decode_f32(dt, &b[..whole], out);
        let rest = &b[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carry_len = rest.len();
    }

    /// The decoded operands; an error when the bytes fed were not exactly
    /// the operands.
    pub fn finish(self) -> Result<Prepared<'a>, String> {
        let fed = self.lens[..self.part].iter().sum::<usize>()
            + if self.part < 3 { self.seen } else { 0 }
            + self.extra;
        let want: usize = self.lens.iter().sum();
        if fed != want {
            return Err(format!(
                "gemm {}x{}x{} needs {want} operand bytes, but its read ranges hold {fed}",
                self.p.m, self.p.k, self.p.n
            ));
        }
        let p = self.p;
        let d = self.d;
        let [a, b, mut c] = self.vals;
        let [ba, bb] = self.borrowed;
        if p.acc.is_none() && !self.acc_here {
            if c.capacity() == 0 {
                c = crate::pool::F32.take(d.m * d.n);
            }
            c.resize(d.m * d.n, 0.0);
        }
        Ok(Prepared {
            d,
            kind: Kind::F32 {
                a: ba.unwrap_or_else(|| logical(a, d.m, d.k, p.transpose_a, p.layout_a).into()),
                b: bb.unwrap_or_else(|| logical(b, d.k, d.n, p.transpose_b, p.layout_b).into()),
                c: if self.acc_here {
                    c
                } else {
                    logical(c, d.m, d.n, false, p.layout_out)
                },
            },
        })
    }
}

/// A computed GEMM's output bytes, handed out in order in pieces of any
/// size ([`Output::fill`]): straight from the f32 result when the output is
/// row-major f32 accumulated in f32, else encoded once up front.
#[derive(Debug)]
pub struct Output<'a> {
    src: OutSrc<'a>,
    pos: usize,
}

#[derive(Debug)]
enum OutSrc<'a> {
    F32(&'a [f32]),
    Bytes(Vec<u8>),
}

impl<'a> Output<'a> {
    pub fn new(p: &GemmParams, x: &'a Prepared<'_>) -> Output<'a> {
        let src = match &x.kind {
            Kind::F32 { c, .. }
                if p.dtype_out == Dtype::F32
                    && p.dtype_acc == Dtype::F32
                    && p.layout_out == Layout::RowMajor =>
            {
                OutSrc::F32(c)
            }
            _ => OutSrc::Bytes(finish(p, x)),
        };
        Output { src, pos: 0 }
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        match &self.src {
            OutSrc::F32(c) => c.len() * 4,
            OutSrc::Bytes(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next `dst.len()` bytes.
    pub fn fill(&mut self, dst: &mut [u8]) {
        match &self.src {
            OutSrc::Bytes(b) => dst.copy_from_slice(&b[self.pos..self.pos + dst.len()]),
            OutSrc::F32(c) => {
                let mut i = 0;
                while i < dst.len() {
                    let at = self.pos + i;
                    let (e, o) = (at / 4, at % 4);
                    let left = dst.len() - i;
                    if o == 0 && left >= 4 {
                        let n = left / 4;
                        let dst = &mut dst[i..i + 4 * n];
                        if cfg!(target_endian = "little") {
                            dst.copy_from_slice(bytemuck::cast_slice(&c[e..e + n]));
                        } else {
                            for (w, v) in dst.chunks_exact_mut(4).zip(&c[e..e + n]) {
                                w.copy_from_slice(&v.to_le_bytes());
                            }
                        }
                        i += 4 * n;
                    } else {
                        let k = (4 - o).min(left);
                        dst[i..i + k].copy_from_slice(&c[e].to_le_bytes()[o..o + k]);
                        i += k;
                    }
                }
            }
        }
        self.pos += dst.len();
    }
}

impl<'a> Prepared<'a> {
    /// A GEMM computed on its operands where they lie (see
    /// [`in_place_dims`]): its row-major f32 result, for the write.
    pub fn computed(d: Dims, c: Vec<f32>) -> Prepared<'a> {
        Prepared {
            d,
            kind: Kind::F32 {
                a: Mat::Owned(Vec::new()),
                b: Mat::Owned(Vec::new()),
                c,
            },
        }
    }

    /// The dims.
    pub fn dims(&self) -> Dims {
        self.d
    }

    /// Operands taken as views (not decoded).
    pub fn views(&self) -> usize {
        match &self.kind {
            Kind::F32 { a, b, .. } => a.is_view() as usize + b.is_view() as usize,
            _ => 0,
        }
    }

    /// The result alone, after computing: inputs given back to the pool,
    /// views let go.
    pub fn detach(mut self) -> Prepared<'static> {
        self.release_inputs();
        let kind = match self.kind {
            Kind::F32 { c, .. } => Kind::F32 {
                a: Mat::Owned(Vec::new()),
                b: Mat::Owned(Vec::new()),
                c,
            },
            Kind::IntF32 { c, acc, .. } => Kind::IntF32 {
                a: Mat::Owned(Vec::new()),
                b: Mat::Owned(Vec::new()),
                c,
                acc,
            },
            Kind::IntF64 { a, b, c, acc } => Kind::IntF64 { a, b, c, acc },
            Kind::I32 { a, b, c } => Kind::I32 { a, b, c },
        };
        Prepared { d: self.d, kind }
    }

    /// The operands as views, when this GEMM computes in f32.
    pub fn ab(&self) -> Option<(MatRef<'_, f32>, MatRef<'_, f32>)> {
        let d = self.d;
        match &self.kind {
            Kind::F32 { a, b, .. } => Some((a.view(d.m, d.k), b.view(d.k, d.n))),
            _ => None,
        }
    }

    /// The decoded accumulator (logical, row-major), for an f32 GEMM.
    pub fn acc_view(&self) -> Option<MatRef<'_, f32>> {
        match &self.kind {
            Kind::F32 { c, .. } => MatRef::dense(c, self.d.m, self.d.n),
            _ => None,
        }
    }

    /// The f32 multiply to run, when this GEMM computes in f32 (as
    /// [`compute`] would).
    pub fn f32_args(&mut self) -> Option<ViewArgs<'_>> {
        let d = self.d;
        match &mut self.kind {
            Kind::F32 { a, b, c } | Kind::IntF32 { a, b, c, .. } => Some(ViewArgs {
                a: a.view(d.m, d.k),
                b: b.view(d.k, d.n),
                c: MatMut::dense(c, d.m, d.n).expect("sized at decode"),
            }),
            _ => None,
        }
    }

    /// Give the input buffers back to the pool (after computing: the
    /// result stays).
    pub fn release_inputs(&mut self) {
        if let Kind::F32 { a, b, .. } | Kind::IntF32 { a, b, .. } = &mut self.kind {
            for m in [a, b] {
                if let Mat::Owned(v) = std::mem::replace(m, Mat::Owned(Vec::new())) {
                    crate::pool::F32.give(v);
                }
            }
        }
    }

    /// Give the buffers back to the pool.
    pub fn recycle(mut self) {
        self.release_inputs();
        if let Kind::F32 { c, .. } | Kind::IntF32 { c, .. } = self.kind {
            crate::pool::F32.give(c);
        }
    }
}

/// Run one prepared GEMM on the backend, with the pool's threads when
/// `share_pool` (else on the calling thread alone).
pub fn compute(x: &mut Prepared<'_>, backend: &dyn GemmBackend, share_pool: bool) {
    let d = x.d;
    if let Some(g) = x.f32_args() {
        backend.gemm_f32_view(d, g.a, g.b, g.c, share_pool);
        return;
    }
    match &mut x.kind {
        Kind::F32 { .. } | Kind::IntF32 { .. } => unreachable!("f32 args above"),
        Kind::IntF64 { a, b, c, .. } if share_pool => backend.gemm_f64(d, a, b, c),
        Kind::IntF64 { a, b, c, .. } => backend.gemm_f64_one_thread(d, a, b, c),
        Kind::I32 { a, b, c } => backend.gemm_i32(d, a, b, c),
    }
}

/// Run prepared GEMMs of one [`BatchKey`] as batched backend calls (one
/// per arithmetic; integer GEMMs can differ in it). Each gets the bits
/// [`compute`] would give it.
pub fn compute_batch(xs: &mut [Prepared<'_>], backend: &dyn GemmBackend) {
    let Some(d) = xs.first().map(|x| x.d) else {
        return;
    };
    let mut f32s = Vec::new();
    let mut f64s = Vec::new();
    let mut i32s = Vec::new();
    for x in xs.iter_mut() {
        assert_eq!(x.d, d, "a gemm batch has one shape");
        match &mut x.kind {
            Kind::F32 { a, b, c } | Kind::IntF32 { a, b, c, .. } => f32s.push(ViewArgs {
                a: a.view(d.m, d.k),
                b: b.view(d.k, d.n),
                c: MatMut::dense(c, d.m, d.n).expect("sized at decode"),
            }),
            Kind::IntF64 { a, b, c, .. } => f64s.push(GemmArgs { a, b, c }),
            Kind::I32 { a, b, c } => i32s.push(GemmArgs { a, b, c }),
        }
    }
    if !f32s.is_empty() {
        backend.gemm_f32_view_batch(d, &mut f32s);
    }
    if !f64s.is_empty() {
        backend.gemm_f64_batch(d, &mut f64s);
    }
    if !i32s.is_empty() {
        backend.gemm_i32_batch(d, &mut i32s);
    }
}

/// Exact integer results plus the accumulator, wrapped to i32.
fn int_out(v: i64, acc: Option<&Vec<i32>>, i: usize) -> i64 {
    let v = v as i32;
    acc.map_or(v, |acc| acc[i].wrapping_add(v)) as i64
}

/// Encode a computed GEMM's output bytes.
pub fn finish(p: &GemmParams, x: &Prepared<'_>) -> Vec<u8> {
    let Dims { m, n, .. } = x.d;
    let mut out = Vec::with_capacity(m * n * p.dtype_out.size());
    match &x.kind {
        // Row-major float outputs accumulated in f32: whole-slice conversion
        // (half's uses F16C where the CPU has it).
        Kind::F32 { c, .. }
            if p.layout_out == Layout::RowMajor
                && p.dtype_acc == Dtype::F32
                && matches!(p.dtype_out, Dtype::F32 | Dtype::F16 | Dtype::Bf16) =>
        {
            match p.dtype_out {
                Dtype::F32 => out.extend(c.iter().flat_map(|v| v.to_le_bytes())),
                Dtype::F16 => {
                    let mut h = vec![half::f16::ZERO; c.len()];
                    h.convert_from_f32_slice(c);
                    out.extend(h.iter().flat_map(|v| v.to_le_bytes()));
                }
                _ => {
                    let mut h = vec![half::bf16::ZERO; c.len()];
                    h.convert_from_f32_slice(c);
                    out.extend(h.iter().flat_map(|v| v.to_le_bytes()));
                }
            }
        }
        Kind::F32 { c, .. } => store(c, m, n, p.layout_out, |v| {
            dtype::push_f32(p.dtype_out, dtype::round_f32(p.dtype_acc, v), &mut out)
        }),
        Kind::IntF32 { c, acc, .. } => {
            let vals: Vec<i64> = (0..c.len())
                .map(|i| int_out(c[i] as i64, acc.as_ref(), i))
                .collect();
            store(&vals, m, n, p.layout_out, |v| {
                dtype::push_i64(p.dtype_out, v, &mut out)
            });
        }
        Kind::IntF64 { c, acc, .. } => {
            let vals: Vec<i64> = (0..c.len())
                .map(|i| int_out(c[i] as i64, acc.as_ref(), i))
                .collect();
            store(&vals, m, n, p.layout_out, |v| {
                dtype::push_i64(p.dtype_out, v, &mut out)
            });
        }
        Kind::I32 { c, .. } => store(c, m, n, p.layout_out, |v| {
            dtype::push_i64(p.dtype_out, v as i64, &mut out)
        }),
    }
    out
}

/// Run one GEMM on its concatenated operand bytes; returns the output bytes.
pub fn execute(p: &GemmParams, input: &[u8], backend: &dyn GemmBackend) -> Result<Vec<u8>, String> {
    let mut x = prepare(p, input)?;
    compute(&mut x, backend, true);
    Ok(finish(p, &x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{GemmCrate, NaiveGemm};
    use kb_format::Addr;

    fn params(m: u32, k: u32, n: u32) -> GemmParams {
        GemmParams {
            a: Addr::default(),
            b: Addr::default(),
            out: Addr::default(),
            acc: None,
            m,
            k,
            n,
            dtype_in: Dtype::F32,
            dtype_acc: Dtype::F32,
            dtype_out: Dtype::F32,
            transpose_a: false,
            transpose_b: false,
            layout_a: Layout::RowMajor,
            layout_b: Layout::RowMajor,
            layout_out: Layout::RowMajor,
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn run(p: &GemmParams, parts: &[&[f32]]) -> Vec<f32> {
        let input: Vec<u8> = parts.iter().flat_map(|s| f32s(s)).collect();
        dtype::to_f32(Dtype::F32, &execute(p, &input, &NaiveGemm).unwrap())
    }

    // a = [[1,2,3],[4,5,6]] (2x3), b = [[7,8],[9,10],[11,12]] (3x2)
    // a.b = [[58,64],[139,154]] (by hand).
    const A: [f32; 6] = [1., 2., 3., 4., 5., 6.];
    const B: [f32; 6] = [7., 8., 9., 10., 11., 12.];
    const AB: [f32; 4] = [58., 64., 139., 154.];

    #[test]
    fn row_major_product_matches_hand_computation() {
        assert_eq!(run(&params(2, 3, 2), &[&A, &B]), AB);
    }

    #[test]
    fn transposes_and_layouts_give_the_same_product() {
        // a^T stored row-major (3x2) is a stored column-major (2x3).
        let at = [1., 4., 2., 5., 3., 6.];
        let bt = [7., 9., 11., 8., 10., 12.];
        let mut p = params(2, 3, 2);
        p.transpose_a = true;
        assert_eq!(run(&p, &[&at, &B]), AB);
        p.transpose_a = false;
        p.layout_a = Layout::ColMajor;
        assert_eq!(run(&p, &[&at, &B]), AB);
        p.layout_a = Layout::RowMajor;
        p.transpose_b = true;
        assert_eq!(run(&p, &[&A, &bt]), AB);
        p.transpose_b = false;
        p.layout_out = Layout::ColMajor;
        assert_eq!(run(&p, &[&A, &B]), [58., 139., 64., 154.]);
        // Transposed and column-major: stored n x k column-major = k x n row-major.
        p.layout_out = Layout::RowMajor;
        p.transpose_b = true;
        p.layout_b = Layout::ColMajor;
        assert_eq!(run(&p, &[&A, &B]), AB);
    }

    #[test]
    fn accumulator_is_added() {
        let mut p = params(2, 3, 2);
        p.acc = Some(Addr::default());
        assert_eq!(
            run(&p, &[&A, &B, &[1., -1., 0.5, 100.]]),
            [59., 63., 139.5, 254.]
        );
    }

    #[test]
    fn int8_accumulates_in_wrapping_i32() {
        let mut p = params(1, 2, 1);
        p.dtype_in = Dtype::I8;
        p.dtype_acc = Dtype::I32;
        p.dtype_out = Dtype::I32;
        let input = [(-128i8) as u8, 127, (-128i8) as u8, 127];
        let out = execute(&p, &input, &NaiveGemm).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I32, &out), [128 * 128 + 127 * 127]);
        // i8 output wraps.
        p.dtype_out = Dtype::I8;
        let out = execute(&p, &input, &NaiveGemm).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I8, &out), [(32513i32 as i8) as i64]);
    }

    #[test]
    fn size_and_dtype_errors_are_reported() {
        let p = params(2, 3, 2);
        let err = execute(&p, &[0u8; 10], &NaiveGemm).unwrap_err();
        assert!(err.contains("needs 48 operand bytes"), "{err}");
        let mut p = params(1, 1, 1);
        p.dtype_acc = Dtype::I32;
        assert!(
            execute(&p, &[0u8; 8], &NaiveGemm)
                .unwrap_err()
                .contains("i32")
        );
        p.dtype_acc = Dtype::U8;
        assert!(execute(&p, &[0u8; 8], &NaiveGemm).is_err());
        assert_eq!(flops(&params(2, 3, 4)), 48);
        assert_eq!(output_len(&params(u32::MAX, 1, u32::MAX)), None);
        assert_eq!(output_len(&params(3, 1, 5)), Some(60));
    }

    fn bytes_of(d: Dtype, vals: &[f64]) -> Vec<u8> {
        let mut b = Vec::new();
        for &v in vals {
            dtype::push_f64(d, v, &mut b);
        }
        b
    }

    /// Pseudo-random integers in [-r, r].
    fn ints(n: usize, r: i64, seed: u64) -> Vec<f64> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as i64 % (2 * r + 1) - r) as f64
            })
            .collect()
    }

    /// Operands taken as strided views where they lie give the bits of
    /// the operands decoded from their bytes.
    #[test]
    fn operands_read_as_strided_views_give_the_same_bits() {
        let (m, k, n) = (8usize, 16usize, 12usize);
        let mut p = params(m as u32, k as u32, n as u32);
        p.acc = Some(Addr::default());
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32 / 7.0).collect::<Vec<f32>>();
        let (a, b, c) = (
            f(ints(m * k, 9, 1)),
            f(ints(k * n, 9, 2)),
            f(ints(m * n, 9, 3)),
        );
        let bytes = [f32s(&a), f32s(&b), f32s(&c)].concat();
        let want = execute(&p, &bytes, &GemmCrate).unwrap();
        // a and b inside larger matrices (row strides 21 and 40).
        let embed = |v: &[f32], rows: usize, cols: usize, stride: usize| {
            let mut big = vec![f32::NAN; (rows - 1) * stride + cols];
            for r in 0..rows {
                big[r * stride..r * stride + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
            }
            big
        };
        let (ba, bb) = (embed(&a, m, k, 21), embed(&b, k, n, 40));
        for (use_a, use_b) in [(true, true), (true, false), (false, true)] {
            let va = use_a.then(|| MatRef::new(&ba, m, k, 21).unwrap());
            let vb = use_b.then(|| MatRef::new(&bb, k, n, 40).unwrap());
            let mut dec = Decoder::with_views(&p, va, vb).unwrap();
            for (part, used) in [(f32s(&a), use_a), (f32s(&b), use_b)] {
                if used {
                    dec.skip(part.len());
                } else {
                    dec.feed(&part);
                }
            }
            dec.feed(&f32s(&c));
            let mut x = dec.finish().unwrap();
            assert_eq!(x.views(), use_a as usize + use_b as usize);
            for share in [true, false] {
                let mut y = x.clone();
                compute(&mut y, &GemmCrate, share);
                assert_eq!(finish(&p, &y), want, "{use_a} {use_b} {share}");
            }
            compute(&mut x, &GemmCrate, true);
            assert_eq!(finish(&p, &x.detach()), want);
        }
        // A view of the wrong shape is refused.
        assert!(Decoder::with_views(&p, Some(MatRef::new(&bb, k, n, 40).unwrap()), None).is_none());
    }

    #[test]
    fn decoding_in_pieces_of_any_size_gives_the_same_operands() {
        for (din, dacc) in [
            (Dtype::F32, Dtype::F32),
            (Dtype::F16, Dtype::F32),
            (Dtype::Bf16, Dtype::F32),
            (Dtype::F16, Dtype::F16),
        ] {
            let mut p = params(5, 7, 3);
            p.dtype_in = din;
            p.dtype_acc = dacc;
            p.acc = Some(Addr::default());
            p.transpose_b = true;
            let mut input = bytes_of(din, &ints(35 + 21, 3, 1));
            input.extend(bytes_of(dacc, &ints(15, 3, 2)));
            let whole = execute(&p, &input, &GemmCrate).unwrap();
            for piece in [1, 3, 5, 64] {
                let mut dec = Decoder::new(&p).unwrap();
                for c in input.chunks(piece) {
                    dec.feed(c);
                }
                let mut x = dec.finish().unwrap();
                compute(&mut x, &GemmCrate, true);
                assert_eq!(finish(&p, &x), whole, "{din} pieces of {piece}");
                // Output handed out in odd pieces.
                let mut o = Output::new(&p, &x);
                let mut got = vec![0u8; o.len()];
                for c in got.chunks_mut(3) {
                    o.fill(c);
                }
                assert_eq!(got, whole);
            }
            let mut dec = Decoder::new(&p).unwrap();
            dec.feed(&input[1..]);
            assert!(dec.finish().unwrap_err().contains("needs"));
        }
        // Integer accumulation has no decoder.
        let mut p = params(1, 1, 1);
        p.dtype_in = Dtype::I8;
        p.dtype_acc = Dtype::I32;
        assert!(Decoder::new(&p).is_none());
    }

    #[test]
    fn batches_give_each_gemm_its_own_bits() {
        let mut p = params(9, 33, 17);
        p.acc = Some(Addr::default());
        p.layout_out = Layout::ColMajor;
        let inputs: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                let v: Vec<f64> = ints(9 * 33 + 33 * 17 + 9 * 17, 100, i)
                    .into_iter()
                    .map(|x| x / 37.0)
                    .collect();
                bytes_of(Dtype::F32, &v)
            })
            .collect();
        let mut xs: Vec<Prepared> = inputs.iter().map(|b| prepare(&p, b).unwrap()).collect();
        compute_batch(&mut xs, &GemmCrate);
        for (x, b) in xs.iter().zip(&inputs) {
            assert_eq!(finish(&p, x), execute(&p, b, &GemmCrate).unwrap());
        }
        assert_eq!(batch_key(&p), batch_key(&p.clone()));
        let mut q = p;
        q.transpose_a = true;
        assert_ne!(batch_key(&p), batch_key(&q));
    }

    /// Integer GEMMs against i64 loops, wrapped to i32: small values go
    /// through f32, medium through f64, large through i32 loops, and a
    /// batch may mix them.
    #[test]
    fn integer_gemms_are_exact_on_every_path() {
        let (m, k, n) = (4usize, 9usize, 5usize);
        let mut p = params(m as u32, k as u32, n as u32);
        p.dtype_in = Dtype::I32;
        p.dtype_acc = Dtype::I32;
        p.dtype_out = Dtype::I32;
        p.acc = Some(Addr::default());
        let mut batch = Vec::new();
        let mut wants = Vec::new();
        let mut inputs = Vec::new();
        for (i, r) in [100i64, 1 << 20, 1 << 30].into_iter().enumerate() {
            let a = ints(m * k, r, 3 * i as u64 + 1);
            let b = ints(k * n, r, 3 * i as u64 + 2);
            let acc = ints(m * n, 1 << 30, 3 * i as u64 + 3);
            let want: Vec<i64> = (0..m * n)
                .map(|e| {
                    let (row, col) = (e / n, e % n);
                    let dot = (0..k).fold(0i64, |s, q| {
                        s.wrapping_add((a[row * k + q] as i64).wrapping_mul(b[q * n + col] as i64))
                    });
                    (acc[e] as i64).wrapping_add(dot) as i32 as i64
                })
                .collect();
            let mut input = bytes_of(Dtype::I32, &a);
            input.extend(bytes_of(Dtype::I32, &b));
            input.extend(bytes_of(Dtype::I32, &acc));
            let out = execute(&p, &input, &GemmCrate).unwrap();
            assert_eq!(dtype::to_i64(Dtype::I32, &out), want, "range {r}");
            let naive = execute(&p, &input, &NaiveGemm).unwrap();
            assert_eq!(out, naive, "range {r}");
            batch.push(prepare(&p, &input).unwrap());
            wants.push(out);
            inputs.push(input);
        }
        compute_batch(&mut batch, &GemmCrate);
        for (x, w) in batch.iter().zip(&wants) {
            assert_eq!(&finish(&p, x), w);
        }
        // i8 inputs with a k too large for f32 (k * 2^14 > 2^24) use f64.
        let k = 2000usize;
        let mut p = params(1, k as u32, 1);
        p.dtype_in = Dtype::I8;
        p.dtype_acc = Dtype::I32;
        p.dtype_out = Dtype::I32;
        let input = vec![0x80u8; 2 * k];
        let out = execute(&p, &input, &GemmCrate).unwrap();
        assert_eq!(dtype::to_i64(Dtype::I32, &out), [128 * 128 * k as i64]);
    }
}
