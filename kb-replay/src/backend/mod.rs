//! GEMM backends behind one interface, [`GemmBackend`]: `c += a . b` on
//! dense row-major matrices of f32, f64 or wrapping i32, one at a time or
//! as a batch of independent multiplies of one shape.
//!
//! Compiled in:
//!
//! - `gemm` ([`GemmCrate`], the default): the pure-Rust `gemm` crate
//!   (runtime-dispatched AVX2/FMA kernels on x86-64). Chosen by measurement
//!   over `matrixmultiply` and `faer` (BENCHMARKS.md, kb-replay section).
//! - `openblas` (cargo feature `openblas`): the system OpenBLAS through
//!   CBLAS, single-threaded per call; large multiplies are split into
//!   fixed row blocks run in parallel.
//! - [`NaiveGemm`]: plain loops, the reference the tests compare with; not
//!   selectable from the command line.
//!
//! Rules every backend follows, so that replay is reproducible:
//!
//! - The bits of a result depend only on the operands and the shape, never
//!   on the number of threads or on batching: `gemm_f32_batch` gives each
//!   item exactly what `gemm_f32` gives it alone (tested for each backend).
//! - Backends may sum k in any fixed order; results then differ from the
//!   naive reference in the last bits, within the verification tolerances.
//! - Parallelism comes from the rayon pool the call runs in (the engine's
//!   `--threads` pool).
//!
//! A GPU backend fits the same trait: a batch is one launch; the slices
//! are host memory it copies in and out.

mod gemm_crate;
mod naive;
#[cfg(feature = "openblas")]
mod openblas;

use rayon::prelude::*;

pub use gemm_crate::GemmCrate;
pub use naive::NaiveGemm;
#[cfg(feature = "openblas")]
pub use openblas::OpenBlas;

/// Matrix sizes of one multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl Dims {
    /// Panics unless the slices have the lengths these dims need. Backends
    /// call it first: a wrong length is a bug in the caller.
    pub fn check<T>(&self, a: &[T], b: &[T], c: &[T]) {
        assert!(
            self.m.checked_mul(self.k) == Some(a.len())
                && self.k.checked_mul(self.n) == Some(b.len())
                && self.m.checked_mul(self.n) == Some(c.len()),
            "gemm {}x{}x{}: operand lengths a {} b {} c {}",
            self.m,
            self.k,
            self.n,
            a.len(),
            b.len(),
            c.len()
        );
    }

    /// Floating-point operations of the multiply (2mnk).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// A matrix in memory that need not be dense: `rows` rows of `cols`
/// elements, each row `stride` elements after the previous (a tile of a
/// larger matrix, read where it lies).
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    stride: usize,
}

/// As [`MatRef`], to write.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
    stride: usize,
}

/// Elements from the first to the last of a `rows x cols` matrix whose
/// rows are `stride` apart; `None` when rows would overlap.
fn strided_len(rows: usize, cols: usize, stride: usize) -> Option<usize> {
    if rows <= 1 {
        return Some(rows * cols);
    }
    (stride >= cols).then(|| (rows - 1).checked_mul(stride)?.checked_add(cols))?
}

impl<'a, T> MatRef<'a, T> {
    /// `data` from the first element to the last; `None` when it is not
    /// exactly that long or rows would overlap.
    pub fn new(data: &'a [T], rows: usize, cols: usize, stride: usize) -> Option<MatRef<'a, T>> {
        (strided_len(rows, cols, stride) == Some(data.len())).then_some(MatRef {
            data,
            rows,
            cols,
            stride: if rows <= 1 { cols } else { stride },
        })
    }

    /// A dense row-major matrix.
    pub fn dense(data: &'a [T], rows: usize, cols: usize) -> Option<MatRef<'a, T>> {
        MatRef::new(data, rows, cols, cols)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements between the starts of two rows.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// From the first element to the last.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &'a [T] {
        &self.data[i * self.stride..i * self.stride + self.cols]
    }

    /// Whether the rows lie back to back.
    pub fn is_dense(&self) -> bool {
        self.rows <= 1 || self.stride == self.cols
    }
}

impl<T: Copy> MatRef<'_, T> {
    /// The rows, back to back.
    pub fn to_dense(&self, out: &mut Vec<T>) {
        out.clear();
        if self.is_dense() {
            out.extend_from_slice(self.data);
        } else {
            for i in 0..self.rows {
                out.extend_from_slice(self.row(i));
            }
        }
    }
}

impl<'a, T> MatMut<'a, T> {
    /// As [`MatRef::new`].
    pub fn new(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        stride: usize,
    ) -> Option<MatMut<'a, T>> {
        (strided_len(rows, cols, stride) == Some(data.len())).then_some(MatMut {
            data,
            rows,
            cols,
            stride: if rows <= 1 { cols } else { stride },
        })
    }

    /// A dense row-major matrix.
    pub fn dense(data: &'a mut [T], rows: usize, cols: usize) -> Option<MatMut<'a, T>> {
        MatMut::new(data, rows, cols, cols)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn stride(&self) -> usize {
        self.stride
    }

    pub fn is_dense(&self) -> bool {
        self.rows <= 1 || self.stride == self.cols
    }

    /// From the first element to the last.
    pub fn data_mut(&mut self) -> &mut [T] {
        self.data
    }

    /// Row `i`.
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        &mut self.data[i * self.stride..i * self.stride + self.cols]
    }

    /// The same matrix, reborrowed.
    pub fn reborrow(&mut self) -> MatMut<'_, T> {
        MatMut {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
            stride: self.stride,
        }
    }
}

impl<T: Copy> MatMut<'_, T> {
    /// Copy `src`'s rows in (same shape).
    pub fn copy_from(&mut self, src: &MatRef<'_, T>) {
        assert_eq!(
            (self.rows, self.cols),
            (src.rows, src.cols),
            "shapes differ"
        );
        for i in 0..self.rows {
            self.row_mut(i).copy_from_slice(src.row(i));
        }
    }

    /// Set every element to `v`.
    pub fn fill(&mut self, v: T) {
        for i in 0..self.rows {
            self.row_mut(i).fill(v);
        }
    }
}

/// A multiply on matrices that may be strided: `c += a . b`.
#[derive(Debug)]
pub struct ViewArgs<'a> {
    pub a: MatRef<'a, f32>,
    pub b: MatRef<'a, f32>,
    pub c: MatMut<'a, f32>,
}

/// `c += a . b` on views through a dense backend call: the rows copied
/// into buffers (the same bits: backends compute from values alone).
fn dense_view_gemm(
    d: Dims,
    a: &MatRef<'_, f32>,
    b: &MatRef<'_, f32>,
    c: &mut MatMut<'_, f32>,
    mut call: impl FnMut(&[f32], &[f32], &mut [f32]),
) {
    let (mut da, mut db) = (Vec::new(), Vec::new());
    a.to_dense(&mut da);
    b.to_dense(&mut db);
    if c.is_dense() {
        call(&da, &db, c.data_mut());
    } else {
        let mut dc = Vec::with_capacity(d.m * d.n);
        for i in 0..c.rows() {
            dc.extend_from_slice(c.row_mut(i));
        }
        call(&da, &db, &mut dc);
        for i in 0..c.rows() {
            c.row_mut(i).copy_from_slice(&dc[i * d.n..(i + 1) * d.n]);
        }
    }
}

impl Dims {
    /// Panics unless the views have the shapes these dims need.
    pub fn check_views<T>(&self, a: &MatRef<'_, T>, b: &MatRef<'_, T>, c: &MatMut<'_, T>) {
        assert!(
            (a.rows, a.cols, b.rows, b.cols, c.rows, c.cols)
                == (self.m, self.k, self.k, self.n, self.m, self.n),
            "gemm {}x{}x{}: views a {}x{} b {}x{} c {}x{}",
            self.m,
            self.k,
            self.n,
            a.rows,
            a.cols,
            b.rows,
            b.cols,
            c.rows,
            c.cols
        );
    }
}

/// One multiply of a batch: `c += a . b`.
#[derive(Debug)]
pub struct GemmArgs<'a, T> {
    pub a: &'a [T],
    pub b: &'a [T],
    pub c: &'a mut [T],
}

/// A GEMM implementation: `c[m x n] += a[m x k] . b[k x n]`, every matrix
/// row-major and dense. See the module docs for the rules.
pub trait GemmBackend: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;

    fn gemm_f32(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]);

    /// Most GEMMs the engine puts in one batched call. A CPU backend wants
    /// about one per thread: the engine decodes a batch's operands before
    /// the call and encodes the outputs after it, so a large batch no
    /// longer fits in cache by the time it is computed (measured: batches
    /// of 32 128^3 GEMMs ran 25 % slower than one by one on 2 threads). A
    /// GPU backend would want large batches (one launch).
    fn max_batch(&self) -> usize {
        rayon::current_num_threads().max(2)
    }

    fn gemm_f64(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]);

    /// As [`GemmBackend::gemm_f32`], on the calling thread alone. The
    /// engine calls it when every thread of the pool has a task of its own:
    /// splitting a tile-sized GEMM across busy threads costs more than it
    /// gains (each part packs its operands again). Same bits.
    fn gemm_f32_one_thread(&self, d: Dims, a: &[f32], b: &[f32], c: &mut [f32]) {
        self.gemm_f32(d, a, b, c)
    }

    /// As [`GemmBackend::gemm_f32_one_thread`], in f64.
    fn gemm_f64_one_thread(&self, d: Dims, a: &[f64], b: &[f64], c: &mut [f64]) {
        self.gemm_f64(d, a, b, c)
    }

    /// Integer GEMM with wrapping i32 arithmetic (exact, so every order of
    /// summation gives the same bits).
    fn gemm_i32(&self, d: Dims, a: &[i32], b: &[i32], c: &mut [i32]) {
        naive::gemm_i32(d, a, b, c);
    }

    /// `c += a . b` on views that may be strided (operands read where they
    /// lie), on the pool when `share_pool`, else on the calling thread.
    /// Must give the bits the dense call gives on the same values. The
    /// default copies strided views into dense buffers.
    fn gemm_f32_view(
        &self,
        d: Dims,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        mut c: MatMut<'_, f32>,
        share_pool: bool,
    ) {
        d.check_views(&a, &b, &c);
        if a.is_dense() && b.is_dense() && c.is_dense() {
            if share_pool {
                self.gemm_f32(d, a.data(), b.data(), c.data_mut());
            } else {
                self.gemm_f32_one_thread(d, a.data(), b.data(), c.data_mut());
            }
            return;
        }
        dense_view_gemm(d, &a, &b, &mut c, |a, b, c| {
            if share_pool {
                self.gemm_f32(d, a, b, c)
            } else {
                self.gemm_f32_one_thread(d, a, b, c)
            }
        });
    }

    /// Independent multiplies of one shape on views, as
    /// [`GemmBackend::gemm_f32_batch`]; each gets the bits
    /// [`GemmBackend::gemm_f32_view`] gives it alone.
    fn gemm_f32_view_batch(&self, d: Dims, batch: &mut [ViewArgs<'_>]) {
        let alone = batch.len() >= rayon::current_num_threads();
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| self.gemm_f32_view(d, g.a, g.b, g.c.reborrow(), !alone));
    }

    /// Independent multiplies of one shape. Each item must get the bits
    /// `gemm_f32` gives it alone. The default runs them on the pool.
    fn gemm_f32_batch(&self, d: Dims, batch: &mut [GemmArgs<'_, f32>]) {
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| self.gemm_f32(d, g.a, g.b, g.c));
    }

    /// As [`GemmBackend::gemm_f32_batch`], in f64.
    fn gemm_f64_batch(&self, d: Dims, batch: &mut [GemmArgs<'_, f64>]) {
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| self.gemm_f64(d, g.a, g.b, g.c));
    }

    /// As [`GemmBackend::gemm_f32_batch`], in wrapping i32.
    fn gemm_i32_batch(&self, d: Dims, batch: &mut [GemmArgs<'_, i32>]) {
        batch
            .par_iter_mut()
            .with_max_len(1)
            .for_each(|g| self.gemm_i32(d, g.a, g.b, g.c));
    }
}

/// Names `--backend` accepts in this build, the default first.
pub fn names() -> Vec<&'static str> {
    let mut v = vec!["gemm"];
    if cfg!(feature = "openblas") {
        v.push("openblas");
    }
    v
}

/// The backend called `name`, if this build has it.
pub fn by_name(name: &str) -> Option<Box<dyn GemmBackend>> {
    match name {
        "gemm" => Some(Box::new(GemmCrate)),
        #[cfg(feature = "openblas")]
        "openblas" => Some(Box::new(OpenBlas::new())),
        _ => None,
    }
}

/// The default backend.
pub fn default_backend() -> Box<dyn GemmBackend> {
    Box::new(GemmCrate)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-1, 1).
    pub fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    /// What every backend must do: agree with the naive reference within
    /// f32 rounding, give the same bits on 1 and 2 threads, and give each
    /// batch item the bits of the single call.
    pub fn conformance(be: &dyn GemmBackend) {
        let shapes = [
            (1, 1, 1),
            (0, 3, 2),
            (2, 0, 3),
            (3, 5, 0),
            (7, 13, 5),
            (8, 64, 64),
            (33, 70, 17),
            (200, 150, 300),
        ];
        for (i, &(m, k, n)) in shapes.iter().enumerate() {
            let d = Dims { m, k, n };
            let a = values(m * k, i as u64 * 3 + 1);
            let b = values(k * n, i as u64 * 3 + 2);
            let c0 = values(m * n, i as u64 * 3 + 3);
            let mut want = c0.clone();
            NaiveGemm.gemm_f32(d, &a, &b, &mut want);
            let run = |threads: usize| {
                let mut c = c0.clone();
                pool(threads).install(|| be.gemm_f32(d, &a, &b, &mut c));
                c
            };
            let one = run(1);
            for (x, y) in one.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-5 * (k as f32 + 1.0),
                    "{} {m}x{k}x{n}: {x} vs {y}",
                    be.name()
                );
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&run(2)), "{} {m}x{k}x{n}", be.name());
            // On the calling thread alone, in a pool of two: the same bits.
            let mut alone = c0.clone();
            pool(2).install(|| be.gemm_f32_one_thread(d, &a, &b, &mut alone));
            assert_eq!(bits(&alone), bits(&one), "{} alone {m}x{k}x{n}", be.name());
            // A batch of three: the single call's bits for each item.
            let mut cs = vec![c0.clone(); 3];
            let mut batch: Vec<GemmArgs<f32>> = cs
                .iter_mut()
                .map(|c| GemmArgs { a: &a, b: &b, c })
                .collect();
            pool(2).install(|| be.gemm_f32_batch(d, &mut batch));
            for c in &cs {
                assert_eq!(bits(c), bits(&one), "{} batch {m}x{k}x{n}", be.name());
            }
            // f64 agrees with the reference closely.
            let (a64, b64): (Vec<f64>, Vec<f64>) = (
                a.iter().map(|&x| x as f64).collect(),
                b.iter().map(|&x| x as f64).collect(),
            );
            let mut c64: Vec<f64> = c0.iter().map(|&x| x as f64).collect();
            let mut want64 = c64.clone();
            NaiveGemm.gemm_f64(d, &a64, &b64, &mut want64);
            let mut alone64 = c64.clone();
            be.gemm_f64(d, &a64, &b64, &mut c64);
            for (x, y) in c64.iter().zip(&want64) {
                assert!((x - y).abs() <= 1e-12 * (k as f64 + 1.0), "{x} vs {y}");
            }
            pool(2).install(|| be.gemm_f64_one_thread(d, &a64, &b64, &mut alone64));
            assert!(alone64 == c64, "{} f64 alone {m}x{k}x{n}", be.name());
        }
        // Strided views (tiles of larger matrices, rows apart) give the
        // dense call's bits, on the pool or alone, alone or batched.
        for (i, &(m, k, n)) in [(1, 5, 7), (7, 1, 3), (9, 13, 1), (16, 16, 16), (33, 70, 17)]
            .iter()
            .enumerate()
        {
            let d = Dims { m, k, n };
            let (a, b, c0) = (
                values(m * k, i as u64 + 40),
                values(k * n, i as u64 + 50),
                values(m * n, i as u64 + 60),
            );
            let mut want = c0.clone();
            pool(1).install(|| be.gemm_f32(d, &a, &b, &mut want));
            let embed = |v: &[f32], rows: usize, cols: usize, stride: usize| {
                let mut big = vec![f32::NAN; (rows.max(1) - 1) * stride + cols];
                for r in 0..rows {
                    big[r * stride..r * stride + cols]
                        .copy_from_slice(&v[r * cols..(r + 1) * cols]);
                }
                big
            };
            let (sa, sb) = (embed(&a, m, k, k + 3), embed(&b, k, n, n + 5));
            for share in [false, true] {
                let mut sc = embed(&c0, m, n, n + 2);
                let va = MatRef::new(&sa, m, k, k + 3).unwrap();
                let vb = MatRef::new(&sb, k, n, n + 5).unwrap();
                let vc = MatMut::new(&mut sc, m, n, n + 2).unwrap();
                pool(2).install(|| be.gemm_f32_view(d, va, vb, vc, share));
                let got: Vec<f32> = (0..m)
                    .flat_map(|r| sc[r * (n + 2)..r * (n + 2) + n].to_vec())
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{} view {m}x{k}x{n}", be.name());
                // The padding between rows is untouched.
                assert!(m == 1 || sc[n..n + 2].iter().all(|x| x.is_nan()));
            }
            let mut cs = vec![c0.clone(); 3];
            let mut batch: Vec<ViewArgs> = cs
                .iter_mut()
                .map(|c| ViewArgs {
                    a: MatRef::new(&sa, m, k, k + 3).unwrap(),
                    b: MatRef::new(&sb, k, n, n + 5).unwrap(),
                    c: MatMut::dense(c, m, n).unwrap(),
                })
                .collect();
            pool(2).install(|| be.gemm_f32_view_batch(d, &mut batch));
            drop(batch);
            for c in &cs {
                assert!(c == &want, "{} view batch {m}x{k}x{n}", be.name());
            }
        }
        // Wrapping i32.
        let d = Dims { m: 1, k: 2, n: 1 };
        let mut c = [5];
        be.gemm_i32(d, &[i32::MAX, 2], &[1, 3], &mut c);
        assert_eq!(c, [i32::MAX.wrapping_add(11)]);
    }

    #[test]
    fn naive_backend_conforms() {
        conformance(&NaiveGemm);
    }

    #[test]
    fn gemm_crate_backend_conforms() {
        conformance(&GemmCrate);
    }

    #[cfg(feature = "openblas")]
    #[test]
    fn openblas_backend_conforms() {
        conformance(&OpenBlas::new());
    }

    #[test]
    fn large_gemms_are_bit_identical_across_thread_counts() {
        // Above the gemm crate's threading threshold, so 2 threads do split
        // the work.
        let d = Dims {
            m: 160,
            k: 300,
            n: 200,
        };
        let a = values(d.m * d.k, 7);
        let b = values(d.k * d.n, 8);
        let run = |threads| {
            let mut c = vec![0f32; d.m * d.n];
            pool(threads).install(|| GemmCrate.gemm_f32(d, &a, &b, &mut c));
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(2));
    }

    #[test]
    fn names_list_the_default_first() {
        assert_eq!(names()[0], "gemm");
        assert_eq!(default_backend().name(), "gemm");
        assert!(by_name("gemm").is_some());
        assert!(by_name("naive").is_none());
        assert!(by_name("cuda").is_none());
    }
}
