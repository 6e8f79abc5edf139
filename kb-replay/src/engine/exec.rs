//! Running a planned window's nodes: what each node does (check, copy,
//! capture, write, compute) on physical bytes, one by one in order, or
//! handed to [`super::dataflow`] to run in parallel (see the module docs
//! of [`super`]).

use kb_format::{Dtype, Extent, Layout, Params, Strings, TensorMeta};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::plan::{Action, Dense, PNode, is_gemm};
use super::{Delta, Held, PendingOp, Stats, op_error};
use crate::backend::{MatMut, MatRef, ViewArgs};
use crate::error::{Error, Result, fmt_ns};
use crate::ops::{self, GemmBackend, gemm};
use crate::plane::lazy::{overlaps, slice_into};
use crate::plane::{PlaneError, Shared, fmt_extents};
use crate::pool;

/// What running a node needs besides its op.
pub(crate) struct Cx<'a> {
    pub plane: Shared<'a>,
    pub tensors: &'a [TensorMeta],
    pub strings: &'a Strings,
    pub backend: &'a dyn GemmBackend,
    pub batch: bool,
    pub lookahead: usize,
    pub hold_budget: u64,
    /// Phase 1's input snapshots, when checking intermediates.
    pub snapshots: Option<&'a std::collections::HashMap<(u64, u32), Vec<u8>>>,
}

/// The error for a memory op whose `len` bytes hash to `got`, not `fp`.
fn check_fingerprint(cx: &Cx, r: &kb_format::Record, fp: u64, got: u64, len: u64) -> Result<()> {
    if got == fp {
        return Ok(());
    }
    let (time, ranges) = r
        .read
        .as_ref()
        .map_or((0, &[][..]), |e| (e.time, &e.ranges[..]));
    Err(op_error(
        r,
        cx.strings,
        format!(
            "fingerprint mismatch: the trace records {fp:#018x}, but the {len} bytes \
             replay read at {} hash to {got:#018x}; read {}; write {}",
            fmt_ns(time),
            fmt_extents(ranges, cx.tensors),
            r.write
                .as_ref()
                .map_or("(none)".into(), |w| fmt_extents(&w.ranges, cx.tensors)),
        ),
    ))
}

/// The error of a failed write of `op`'s write ranges.
fn write_error(cx: &Cx, op: &PendingOp, x: PlaneError) -> Error {
    let Some(write) = &op.rec.write else {
        return op_error(&op.rec, cx.strings, x.to_string());
    };
    let what = match x {
        PlaneError::LengthMismatch { data, ranges } => {
            format!("has {data} bytes to write, but its write ranges hold {ranges}")
        }
        x => x.to_string(),
    };
    op_error(
        &op.rec,
        cx.strings,
        format!(
            "writing {} at {}: {what}",
            fmt_extents(&write.ranges, cx.tensors),
            fmt_ns(write.time)
        ),
    )
}

/// An error moving bytes the planner checked (should not happen).
fn plane_error(cx: &Cx, op: &PendingOp, what: &str, x: PlaneError) -> Error {
    op_error(&op.rec, cx.strings, format!("{what}: {x}"))
}

/// Whether an extent list is one contiguous run.
fn contiguous(es: &[Extent]) -> bool {
    matches!(es, [e] if e.rows <= 1 || e.stride == e.len)
}

/// A GEMM ready to compute: its operands (views where they lie, or
/// decoded), and its output in place when it is written where it lies.
struct Job<'a> {
    x: gemm::Prepared<'a>,
    /// The output's own bytes (f32, row-major), holding the accumulator
    /// (or zeros) already.
    out: Option<MatMut<'a, f32>>,
}

impl Job<'_> {
    /// The f32 multiply, if it computes in f32.
    fn args(&mut self) -> Option<ViewArgs<'_>> {
        let Job { x, out } = self;
        match out {
            Some(o) => {
                let (a, b) = x.ab()?;
                Some(ViewArgs {
                    a,
                    b,
                    c: o.reborrow(),
                })
            }
            None => x.f32_args(),
        }
    }

    fn compute(&mut self, backend: &dyn GemmBackend, share_pool: bool) {
        let d = self.x.dims();
        match self.args() {
            Some(g) => backend.gemm_f32_view(d, g.a, g.b, g.c, share_pool),
            None => gemm::compute(&mut self.x, backend, share_pool),
        }
    }
}

/// Prepare a GEMM's job from its operands' physical bytes (`reads`, in
/// operand order): f32 operands stored as the logical matrices are read
/// where they lie, the rest decoded; with `dst`, an f32 row-major output
/// lying in a region is computed in place.
fn gemm_job<'a>(
    cx: &Cx<'a>,
    op: &'a PendingOp,
    reads: &'a [Extent],
    dst: Option<&'a [Extent]>,
    dense: &'a [Option<Dense>; 2],
    delta: &mut Delta,
) -> Result<Job<'a>> {
    let r = &op.rec;
    let Params::Gemm(p) = &r.params else {
        unreachable!("gemm_job is for gemm ops");
    };
    let err = |d: String| op_error(r, cx.strings, d);
    let floats = |d: Dtype| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16);
    if cx.snapshots.is_some() || !floats(p.dtype_in) || !floats(p.dtype_acc) {
        // The generic path: the operands' bytes gathered and decoded.
        let x = with_gathered(cx, op, reads, delta, |bytes| {
            gemm::prepare(p, bytes).map_err(err)
        })?;
        return Ok(Job { x, out: None });
    }
    let [la, lb, lacc] = operand_bytes(p);
    // The operands' pieces, in vectors the thread keeps from one GEMM to
    // the next (they are only looked at here).
    let mut parts = PARTS.take();
    let [pa, pb, pacc] = &mut parts;
    for (v, off, len) in [
        (&mut *pa, 0, la),
        (&mut *pb, la, lb),
        (&mut *pacc, la + lb, lacc),
    ] {
        v.clear();
        slice_into(reads, off, len, v);
    }
    let job = gemm_job_on(cx, op, p, dst, dense, delta, [&*pa, &*pb, &*pacc]);
    PARTS.set(parts);
    job
}

/// Bytes of a GEMM's `a`, `b` and accumulator (0 without one) in its
/// read, in that order.
fn operand_bytes(p: &kb_format::GemmParams) -> [u64; 3] {
    let (m, k, n) = (p.m as u64, p.k as u64, p.n as u64);
    let si = p.dtype_in.size() as u64;
    let lacc = if p.acc.is_some() {
        m * n * p.dtype_acc.size() as u64
    } else {
        0
    };
    [m * k * si, k * n * si, lacc]
}

thread_local! {
    /// [`gemm_job`]'s operand pieces.
    static PARTS: std::cell::Cell<[Vec<Extent>; 3]> = const { std::cell::Cell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// [`gemm_job`] once its operands' pieces are sliced from its reads.
fn gemm_job_on<'a>(
    cx: &Cx<'a>,
    op: &'a PendingOp,
    p: &'a kb_format::GemmParams,
    dst: Option<&'a [Extent]>,
    dense: &'a [Option<Dense>; 2],
    delta: &mut Delta,
    [pa, pb, pacc]: [&[Extent]; 3],
) -> Result<Job<'a>> {
    let r = &op.rec;
    let err = |d: String| op_error(r, cx.strings, d);
    let reading = |x: PlaneError| {
        let ranges = r.read.as_ref().map_or(&[][..], |e| &e.ranges[..]);
        err(format!("reading {}: {x}", fmt_extents(ranges, cx.tensors)))
    };
    let (m, k, n) = (p.m as usize, p.k as usize, p.n as usize);
    let [la, lb, lacc] = operand_bytes(p);
    let f32_in = p.dtype_in == Dtype::F32;
    // An operand decoded once for several GEMMs (by whichever runs first).
    // Two GEMMs that start together both decode it rather than one
    // sleeping until the other is done (a tile's decode is a few
    // microseconds; the futex waits and wake-ups were 2 % of a gemm_tiled
    // 2048^3 replay's samples, and left a core idle); the first to finish fills
    // the slot and the other's copy, the same bits, is dropped. Only the
    // decode that fills it is counted, so the counters do not depend on
    // timing.
    let mut shared = |i: usize, pieces: &[Extent], rows: usize, cols: usize| {
        dense[i].as_ref().map(|slot| {
            let v = match slot.cell.get() {
                Some(v) => v,
                None => {
                    let v = gemm::decode_operand(p, i, slot.take_room(), |f| {
                        let _ = cx.plane.gather_each(pieces, f);
                    });
                    if slot.cell.set(v).is_ok() {
                        delta.bytes_copied += if i == 0 { la } else { lb };
                    }
                    slot.cell.get().expect("filled")
                }
            };
            MatRef::dense(v, rows, cols).expect("decoded to its size")
        })
    };
    let (sa, sb) = (shared(0, pa, m, k), shared(1, pb, k, n));
    // SAFETY (both views): the node that runs this applies the op's read
    // (and write, with `dst`), so by the plane's contract no other node
    // writes these bytes while it runs; the views live no longer than
    // the node. The output view below overlaps neither (checked).
    #[allow(unsafe_code)]
    let va = sa.or_else(|| {
        (f32_in && gemm::stored_as_is(p.transpose_a, p.layout_a))
            .then(|| unsafe { cx.plane.f32_view(pa, m, k * 4) })
            .flatten()
    });
    #[allow(unsafe_code)]
    let vb = sb.or_else(|| {
        (f32_in && gemm::stored_as_is(p.transpose_b, p.layout_b))
            .then(|| unsafe { cx.plane.f32_view(pb, k, n * 4) })
            .flatten()
    });
    let meets = |x: &[Extent], y: &[Extent]| x.iter().any(|a| y.iter().any(|b| overlaps(a, b)));
    let acc_here = dst.is_some_and(|d| p.acc.is_some() && pacc == d);
    let out = dst
        .filter(|d| {
            p.dtype_acc == Dtype::F32
                && p.dtype_out == Dtype::F32
                && p.layout_out == Layout::RowMajor
                && !meets(d, pa)
                && !meets(d, pb)
                && (acc_here || !meets(d, pacc))
        })
        // SAFETY: this node applies the op's write: nothing else touches
        // the output's bytes while it runs (the plane's contract), and
        // they overlap neither operand (checked above), so this is the
        // only slice of them.
        .and_then(|d| {
            #[allow(unsafe_code)]
            unsafe {
                cx.plane.f32_view_mut(d, m, n * 4)
            }
        });
    let in_place_acc = acc_here && out.is_some();
    // Both operands read where they lie (not decoded, not shared).
    let raw_views = dense[0].is_none() && dense[1].is_none() && va.is_some() && vb.is_some();
    let mut dec = gemm::Decoder::with_views(p, va, vb).ok_or_else(|| err("gemm sizes".into()))?;
    for (pieces, viewed, len) in [(pa, va.is_some(), la), (pb, vb.is_some(), lb)] {
        if viewed {
            dec.skip(len as usize);
        } else {
            cx.plane
                .gather_each(pieces, |b| dec.feed(b))
                .map_err(reading)?;
            delta.bytes_copied += len;
        }
    }
    if in_place_acc {
        dec.acc_in_place();
    } else if lacc > 0 {
        cx.plane
            .gather_each(pacc, |b| dec.feed(b))
            .map_err(reading)?;
        if out.is_none() {
            delta.bytes_copied += lacc;
        }
    }
    let x = dec.finish().map_err(err)?;
    let mut out = out;
    if let Some(o) = &mut out {
        match (p.acc.is_some(), in_place_acc) {
            (false, _) => o.fill(0.0),
            (true, true) => {}
            (true, false) => {
                let acc = x.acc_view().expect("decoded accumulator");
                o.copy_from(&acc);
                delta.bytes_copied += lacc;
            }
        }
        if raw_views {
            delta.gemm_in_place += 1;
        }
    }
    Ok(Job { x, out })
}

/// Write a computed GEMM's output (held in a buffer) to `dst`.
fn write_gemm(
    cx: &Cx,
    op: &PendingOp,
    dst: &[Extent],
    x: &gemm::Prepared<'_>,
    delta: &mut Delta,
) -> Result<()> {
    let Params::Gemm(p) = &op.rec.params else {
        unreachable!("write_gemm is for gemm ops");
    };
    let mut out = gemm::Output::new(p, x);
    let n = out.len() as u64;
    cx.plane
        .scatter_each(dst, n, |piece| out.fill(piece))
        .map_err(|e| write_error(cx, op, e))?;
    delta.bytes_copied += n;
    Ok(())
}

/// A computed job's output: written to `dst` (unless written in place),
/// or held for the op's write.
fn finish_gemm(
    cx: &Cx,
    op: &PendingOp,
    dst: Option<&[Extent]>,
    job: Job<'_>,
    delta: &mut Delta,
) -> Result<Option<Held>> {
    if job.out.is_some() {
        job.x.recycle();
        return Ok(None);
    }
    match dst {
        Some(d) => {
            let res = write_gemm(cx, op, d, &job.x, delta);
            job.x.recycle();
            res.map(|_| None)
        }
        None => Ok(Some(Held::Gemm(job.x.detach()))),
    }
}

/// Run `f` on the bytes of `reads` gathered into a pooled buffer (checked
/// against the trace's input snapshots when it has them); the copy is
/// counted in `delta`.
fn with_gathered<T>(
    cx: &Cx,
    op: &PendingOp,
    reads: &[Extent],
    delta: &mut Delta,
    f: impl FnOnce(&[u8]) -> Result<T>,
) -> Result<T> {
    let r = &op.rec;
    let reading = |x: PlaneError| {
        let ranges = r.read.as_ref().map_or(&[][..], |e| &e.ranges[..]);
        op_error(
            r,
            cx.strings,
            format!("reading {}: {x}", fmt_extents(ranges, cx.tensors)),
        )
    };
    let total = cx.plane.extent_bytes(reads).map_err(reading)?;
    let mut bytes = pool::BYTES.take(total as usize);
    let out = cx
        .plane
        .gather(reads, &mut bytes)
        .map_err(reading)
        .and_then(|()| {
            delta.bytes_copied += bytes.len() as u64;
            if let (Some(snaps), Some(read)) = (cx.snapshots, &r.read) {
                check_inputs(cx, r, &read.ranges, &bytes, snaps)?;
            }
            f(&bytes)
        });
    pool::BYTES.give(bytes);
    out
}

/// A float math op on tiles that lie whole in regions, computed where
/// they lie: no gather, no scatter, the same bits (`ops::math::
/// execute_tiles`). `Ok(false)`: not done (the generic path runs it).
#[allow(unsafe_code)]
fn math_in_place(cx: &Cx, op: &PendingOp, reads: &[Extent], dst: &[Extent]) -> Result<bool> {
    let r = &op.rec;
    let (Params::Math(p), None) = (&r.params, cx.snapshots) else {
        return Ok(false);
    };
    let Some(lens) = ops::math::tile_lens(p) else {
        return Ok(false);
    };
    // SAFETY: this node applies the op's read and write, so by the
    // plane's contract no other node touches these bytes while it runs;
    // `with_in_place` checks that the write overlaps no read, and the
    // slices live no longer than the call.
    let done = unsafe {
        cx.plane.with_in_place(reads, &lens, dst, |tiles, out| {
            ops::math::execute_tiles(p, tiles, out)
        })
    };
    done.map_or(Ok(false), |res| res.map_err(|e| op_error(r, cx.strings, e)))
}

/// A compute op on its operands' physical bytes.
fn compute_node(
    cx: &Cx,
    op: &PendingOp,
    reads: &[Extent],
    dst: Option<&[Extent]>,
    dense: &[Option<Dense>; 2],
    share_pool: bool,
    delta: &mut Delta,
) -> Result<Option<Held>> {
    let r = &op.rec;
    if is_gemm(op) && !reads.is_empty() {
        let mut job = gemm_job(cx, op, reads, dst, dense, delta)?;
        job.compute(cx.backend, share_pool);
        return finish_gemm(cx, op, dst, job, delta);
    }
    if let Some(d) = dst
        && math_in_place(cx, op, reads, d)?
    {
        return Ok(None);
    }
    let out = with_gathered(cx, op, reads, delta, |bytes| {
        ops::compute(r, bytes, cx.backend).map_err(|d| op_error(r, cx.strings, d))
    })?;
    match dst {
        Some(d) => {
            cx.plane
                .scatter(d, &out)
                .map_err(|e| write_error(cx, op, e))?;
            delta.bytes_copied += out.len() as u64;
            pool::BYTES.give(out);
            Ok(None)
        }
        None => Ok(Some(Held::Bytes(out))),
    }
}

/// Write what an op's read held to `dst`.
fn release(
    cx: &Cx,
    op: &PendingOp,
    dst: &[Extent],
    held: Option<Held>,
    delta: &mut Delta,
) -> Result<()> {
    match held {
        Some(Held::Gemm(x)) => {
            let res = write_gemm(cx, op, dst, &x, delta);
            x.recycle();
            res
        }
        Some(Held::Bytes(b)) => {
            cx.plane
                .scatter(dst, &b)
                .map_err(|e| write_error(cx, op, e))?;
            delta.bytes_copied += b.len() as u64;
            pool::BYTES.give(b);
            Ok(())
        }
        // No read effect: nothing to write.
        None => cx
            .plane
            .scatter(dst, &[])
            .map_err(|e| write_error(cx, op, e)),
    }
}

/// What a node left behind.
pub(super) struct Done {
    pub node: u32,
    /// Held for the op's write (a capture, a compute op's read).
    pub held: Option<Held>,
    pub delta: Delta,
}

/// Run one node; a GEMM in it uses the pool's threads when `share_pool`.
pub(super) fn run_node(
    cx: &Cx,
    index: u32,
    node: &PNode,
    op: &PendingOp,
    held: Option<Held>,
    share_pool: bool,
) -> Result<Done> {
    let mut delta = Delta::default();
    let r = &op.rec;
    let mut out = None;
    match &node.action {
        Action::None => {}
        Action::Fail(detail) => return Err(op_error(r, cx.strings, detail.clone())),
        Action::Hash { src, fp } => {
            let got = cx
                .plane
                .fingerprint(src)
                .map_err(|x| plane_error(cx, op, "hashing", x))?;
            let len = cx.plane.extent_bytes(src).unwrap_or(0);
            check_fingerprint(cx, r, *fp, got, len)?;
        }
        Action::Capture { src, fp } => {
            let total = cx.plane.extent_bytes(src).unwrap_or(0);
            let mut b = pool::BYTES.take(total as usize);
            cx.plane
                .gather(src, &mut b)
                .map_err(|x| plane_error(cx, op, "reading", x))?;
            delta.bytes_copied += b.len() as u64;
            if let Some(fp) = fp {
                check_fingerprint(cx, r, *fp, kb_format::fingerprint(&b), b.len() as u64)?;
            }
            out = Some(Held::Bytes(b));
        }
        Action::Copy { src, dst, fp } => {
            // Hash whichever side is one piece when the other is not: the
            // streaming hasher is slower on many small pieces.
            let after = fp.is_some() && contiguous(dst) && !contiguous(src);
            if let (Some(fp), false) = (fp, after) {
                let got = cx
                    .plane
                    .fingerprint(src)
                    .map_err(|x| plane_error(cx, op, "hashing", x))?;
                check_fingerprint(cx, r, *fp, got, cx.plane.extent_bytes(src).unwrap_or(0))?;
            }
            delta.bytes_copied += cx
                .plane
                .copy(src, dst)
                .map_err(|x| write_error(cx, op, x))?;
            if let (Some(fp), true) = (fp, after) {
                let got = cx
                    .plane
                    .fingerprint(dst)
                    .map_err(|x| plane_error(cx, op, "hashing", x))?;
                check_fingerprint(cx, r, *fp, got, cx.plane.extent_bytes(dst).unwrap_or(0))?;
            }
        }
        Action::Release { dst } => release(cx, op, dst, held, &mut delta)?,
        Action::Compute { reads, dst, dense } => {
            out = compute_node(cx, op, reads, dst.as_deref(), dense, share_pool, &mut delta)?;
        }
        Action::Chain(c) => {
            // Each GEMM as its own node would run it, in effect order.
            for l in &c.links {
                let held = compute_node(
                    cx,
                    &l.op,
                    c.reads_of(l),
                    Some(&c.dst),
                    &l.dense,
                    share_pool,
                    &mut delta,
                )?;
                debug_assert!(held.is_none(), "a chain's GEMMs write their output");
            }
        }
    }
    Ok(Done {
        node: index,
        held: out,
        delta,
    })
}

/// GEMM nodes of one batch key (each computing into its output), run as
/// one batched backend call. Each gets the bits it gets alone.
pub(super) fn run_gemm_batch(cx: &Cx, items: &[u32], nodes: &[PNode]) -> Vec<(u32, Result<Done>)> {
    let op = |i: u32| &*nodes[i as usize].op;
    let parts = |i: u32| match &nodes[i as usize].action {
        Action::Compute { reads, dst, dense } => (&reads[..], dst.as_deref(), dense),
        _ => unreachable!("batched nodes are computes"),
    };
    // Prepare in parallel.
    let prepared: Vec<(u32, Result<(Job, Delta)>)> = items
        .par_iter()
        .with_max_len(1)
        .map(|&i| {
            let (reads, dst, dense) = parts(i);
            let mut delta = Delta::default();
            (
                i,
                gemm_job(cx, op(i), reads, dst, dense, &mut delta).map(|j| (j, delta)),
            )
        })
        .collect();
    let mut jobs: Vec<(u32, Job, Delta)> = Vec::new();
    let mut out: Vec<(u32, Result<Done>)> = Vec::new();
    for (i, r) in prepared {
        match r {
            Ok((j, d)) => jobs.push((i, j, d)),
            Err(e) => out.push((i, Err(e))),
        }
    }
    if let Some((_, j, _)) = jobs.first() {
        let d = j.x.dims();
        let mut args: Vec<ViewArgs> = Vec::new();
        let mut rest = Vec::new();
        for (_, j, _) in jobs.iter_mut() {
            let f32 = j.args().is_some();
            if f32 {
                args.push(j.args().expect("f32"));
            } else {
                rest.push(j);
            }
        }
        if !args.is_empty() {
            cx.backend.gemm_f32_view_batch(d, &mut args);
        }
        drop(args);
        for j in rest {
            j.compute(cx.backend, false);
        }
    }
    let finished: Vec<(u32, Result<Done>)> = jobs
        .into_par_iter()
        .with_max_len(1)
        .map(|(i, job, mut delta)| {
            let (_, dst, _) = parts(i);
            let r = finish_gemm(cx, op(i), dst, job, &mut delta).map(|held| Done {
                node: i,
                held,
                delta,
            });
            (i, r)
        })
        .collect();
    out.extend(finished);
    out
}

/// Whether a window of `nodes` nodes runs as a dataflow on `pool` (and
/// so needs its dependency graph).
pub(crate) fn parallel(nodes: usize, pool: Option<&rayon::ThreadPool>) -> bool {
    pool.is_some_and(|p| p.current_num_threads() > 1) && nodes > 1
}

/// Apply a planned window: `nodes` in effect order; `graph` their
/// dependencies when they run in parallel ([`parallel`]). `held` is what
/// ops' reads hold for their writes, by slot: taken by the writes,
/// added to by reads whose writes come later.
pub(crate) fn run_window(
    cx: &Cx,
    nodes: &[PNode],
    graph: Option<super::graph::Graph>,
    held: &mut FxHashMap<u32, Held>,
    pool: Option<&rayon::ThreadPool>,
    stats: &mut Stats,
) -> Result<()> {
    let in_order = |held: &mut FxHashMap<u32, Held>, stats: &mut Stats| -> Result<()> {
        for (i, n) in nodes.iter().enumerate() {
            let h = match n.action {
                Action::Release { .. } => held.remove(&n.slot),
                _ => None,
            };
            let done = run_node(cx, i as u32, n, &n.op, h, true)?;
            if let Some(h) = done.held {
                held.insert(n.slot, h);
            }
            stats.add(done.delta);
        }
        Ok(())
    };
    match (pool, graph) {
        (Some(pool), Some(graph)) if parallel(nodes.len(), Some(pool)) => {
            super::dataflow::run_parallel(cx, nodes, graph, held, pool, stats)
        }
        // In the pool even with one thread: backends take their threads
        // from the pool they run in.
        (Some(pool), _) => pool.install(|| in_order(held, stats)),
        (None, _) => in_order(held, stats),
    }
}

/// `--check-intermediates`: compare each operand (one read range each, in
/// operand order) with Phase 1's snapshot of it, if there is one.
fn check_inputs(
    cx: &Cx,
    r: &kb_format::Record,
    ranges: &[kb_format::Extent],
    bytes: &[u8],
    snaps: &std::collections::HashMap<(u64, u32), Vec<u8>>,
) -> Result<()> {
    let mut at = 0usize;
    for (i, x) in ranges.iter().enumerate() {
        let n = x.bytes() as usize;
        let got = &bytes[at..at + n];
        at += n;
        let Some(want) = snaps.get(&(r.op_id, i as u32)) else {
            continue;
        };
        if want.as_slice() != got {
            let first = want
                .iter()
                .zip(got)
                .position(|(a, b)| a != b)
                .unwrap_or(want.len().min(got.len()));
            let e = super::op_error(
                r,
                cx.strings,
                format!(
                    "input {i} differs from Phase 1's snapshot: {} bytes replayed vs {} captured, first difference at byte {first} ({:#04x} vs {:#04x}); read {}",
                    got.len(),
                    want.len(),
                    got.get(first).copied().unwrap_or(0),
                    want.get(first).copied().unwrap_or(0),
                    fmt_extents(std::slice::from_ref(x), cx.tensors)
                ),
            );
            return Err(match e {
                Error::Op {
                    op_id,
                    component,
                    op_name,
                    time,
                    detail,
                } => Error::Intermediate {
                    op_id,
                    component,
                    op_name,
                    time,
                    detail,
                },
                other => other,
            });
        }
    }
    Ok(())
}
