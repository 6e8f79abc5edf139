//! Running a window's nodes: what each node does (gather, check, compute,
//! scatter), one by one in order, or handed to [`super::dataflow`] to run
//! in parallel (see the module docs of [`super`]).

use kb_format::{Effect, OpKind, Params, Strings, TensorMeta};
use rayon::prelude::*;

use super::graph::{Node, Step};
use super::{Delta, EffKey, Held, PendingOp, Stats, op_error};
use crate::error::{Error, Result, fmt_ns};
use crate::ops::{self, GemmBackend, Plan, gemm};
use crate::plane::{PlaneError, Shared, fmt_extents};
use crate::pool;

/// What running a node needs besides its op.
pub(crate) struct Cx<'a> {
    pub plane: Shared<'a>,
    pub tensors: &'a [TensorMeta],
    pub strings: &'a Strings,
    pub backend: &'a dyn GemmBackend,
    pub batch: bool,
    pub fuse: bool,
    pub lookahead: usize,
    pub hold_budget: u64,
    /// Phase 1's input snapshots, when checking intermediates.
    pub snapshots: Option<&'a std::collections::HashMap<(u64, u32), Vec<u8>>>,
}

/// What a read produced.
enum ReadOut {
    /// Nothing to hold (the op has no write).
    Nothing,
    /// Bytes for the write as they are (a memory op).
    Held(Held),
    /// Operand bytes of a compute op whose output the write needs.
    Operands(Vec<u8>),
}

/// The read effect up to computing: a memory op's bytes as a snapshot of
/// their pages (fingerprint checked), a compute op's operands gathered;
/// counts, and checks the sizes.
fn read_phase(cx: &Cx, op: &PendingOp, delta: &mut Delta) -> Result<ReadOut> {
    let r = &op.rec;
    let err = |d: String| op_error(r, cx.strings, d);
    let Some(read) = &r.read else {
        return Ok(ReadOut::Nothing);
    };
    let reading = |x: PlaneError| {
        err(format!(
            "reading {}: {x}",
            fmt_extents(&read.ranges, cx.tensors)
        ))
    };
    let write_len = match &r.write {
        Some(w) => Some(cx.plane.extent_bytes(&w.ranges).map_err(|x| {
            err(format!(
                "writing {}: {x}",
                fmt_extents(&w.ranges, cx.tensors)
            ))
        })?),
        None => None,
    };
    let out = match op.plan {
        Plan::Skip => {
            delta.bytes_read += cx.plane.extent_bytes(&read.ranges).map_err(reading)?;
            ReadOut::Nothing
        }
        Plan::Move => {
            let snap = cx.plane.snapshot(&read.ranges).map_err(reading)?;
            delta.bytes_read += snap.len();
            // Hash whichever side is in fewer pieces: the streaming hasher
            // is slow on small ones (a strided tile's rows). Only a write
            // whose bytes do not overlap reads back what was read.
            let defer = r.write.as_ref().is_some_and(|w| {
                matches!(w.ranges.as_slice(), [e] if e.rows <= 1 || e.stride >= e.len)
                    && cx.plane.piece_count(&w.ranges) < snap.piece_count()
            });
            let mut check = None;
            if let Some(fp) = r.fingerprint {
                if defer {
                    check = Some(fp);
                } else {
                    check_fingerprint(cx, r, fp, snap.fingerprint(), snap.len())?;
                    delta.fingerprints += 1;
                }
            }
            match write_len {
                Some(wl) if wl != snap.len() => {
                    return Err(err(format!(
                        "reads {} bytes ({}) but writes {wl} bytes ({})",
                        snap.len(),
                        fmt_extents(&read.ranges, cx.tensors),
                        r.write
                            .as_ref()
                            .map_or(String::new(), |w| fmt_extents(&w.ranges, cx.tensors)),
                    )));
                }
                Some(_) => ReadOut::Held(Held::Snapshot { snap, check }),
                None => ReadOut::Nothing,
            }
        }
        Plan::Compute { input, output } => {
            let total = cx.plane.extent_bytes(&read.ranges).map_err(reading)?;
            let mut bytes = pool::BYTES.take(total as usize);
            cx.plane.gather(&read.ranges, &mut bytes).map_err(reading)?;
            delta.bytes_read += bytes.len() as u64;
            if input != bytes.len() as u64 {
                return Err(err(format!(
                    "its operands take {input} bytes, but its read ranges ({}) hold {}",
                    fmt_extents(&read.ranges, cx.tensors),
                    bytes.len()
                )));
            }
            if let Some(snaps) = cx.snapshots {
                check_inputs(cx, r, &read.ranges, &bytes, snaps)?;
            }
            match write_len {
                Some(wl) if wl != output => {
                    return Err(err(format!(
                        "its output takes {output} bytes, but its write ranges hold {wl}"
                    )));
                }
                Some(_) => ReadOut::Operands(bytes),
                None => ReadOut::Nothing,
            }
        }
    };
    Ok(out)
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

/// A GEMM's read, decoding its operands straight from the plane when it
/// can (see [`gemm::Decoder`]); `Ok(None)` when the generic path must
/// handle it (integer GEMMs; sizes that disagree, which that path reports).
fn gemm_fast_read(cx: &Cx, op: &PendingOp, delta: &mut Delta) -> Result<Option<gemm::Prepared>> {
    let r = &op.rec;
    let (Params::Gemm(p), Some(read), Some(write), Plan::Compute { input, output }) =
        (&r.params, &r.read, &r.write, op.plan)
    else {
        return Ok(None);
    };
    if cx.plane.extent_bytes(&read.ranges).ok() != Some(input)
        || cx.plane.extent_bytes(&write.ranges).ok() != Some(output)
    {
        return Ok(None);
    }
    let snap = cx.plane.snapshot(&read.ranges).map_err(|x| {
        op_error(
            r,
            cx.strings,
            format!("reading {}: {x}", fmt_extents(&read.ranges, cx.tensors)),
        )
    })?;
    let Some(prepared) = gemm::Decoder::from_snapshot(p, &snap) else {
        return Ok(None);
    };
    delta.bytes_read += snap.len();
    prepared.map(Some).map_err(|d| op_error(r, cx.strings, d))
}

/// Where an f32 GEMM's matrices lie when each is back to back in a TCM
/// region (see [`gemm::in_place_dims`]): addresses of a, b, the
/// accumulator and the output.
#[derive(Debug, Clone, Copy)]
struct InRegion {
    d: crate::backend::Dims,
    /// Elements of a, b and the output.
    elems: [usize; 3],
    a: u64,
    b: u64,
    acc: Option<u64>,
    out: u64,
}

impl InRegion {
    fn find(cx: &Cx, op: &PendingOp) -> Option<InRegion> {
        let r = &op.rec;
        let (Params::Gemm(p), Some(read), Some(write), Plan::Compute { input, output }) =
            (&r.params, &r.read, &r.write, op.plan)
        else {
            return None;
        };
        // Checking intermediates compares the operands' bytes: the generic path.
        if cx.snapshots.is_some()
            || cx.plane.extent_bytes(&read.ranges).ok() != Some(input)
            || cx.plane.extent_bytes(&write.ranges).ok() != Some(output)
        {
            return None;
        }
        let (d, elems @ [mk, kn, mn]) = gemm::in_place_dims(p)?;
        let bytes = |e: usize| e as u64 * 4;
        let at =
            |start: usize, e: usize| cx.plane.region_addr(&read.ranges, bytes(start), bytes(e));
        let x = InRegion {
            d,
            elems,
            a: at(0, mk)?,
            b: at(mk, kn)?,
            acc: match p.acc {
                Some(_) => Some(at(mk + kn, mn)?),
                None => None,
            },
            out: cx.plane.region_addr(&write.ranges, 0, bytes(mn))?,
        };
        let range = |addr: u64, e: usize| addr..addr + bytes(e);
        let meets =
            |x: &std::ops::Range<u64>, y: &std::ops::Range<u64>| x.start < y.end && y.start < x.end;
        let out = range(x.out, mn);
        // The output is written while a and b are read, and the
        // accumulator is the output itself or apart from it.
        (!meets(&out, &range(x.a, mk))
            && !meets(&out, &range(x.b, kn))
            && x.acc
                .is_none_or(|acc| acc == x.out || !meets(&out, &range(acc, mn))))
        .then_some(x)
    }
}

/// An f32 GEMM's matrices taken where they lie in TCM, for the backend:
/// a and b in place; the output's own bytes when the node applies both
/// effects (no copy at all), else a buffer the write takes.
struct RegionGemm<'a> {
    x: InRegion,
    a: &'a [f32],
    b: &'a [f32],
    c: RegionOut<'a>,
}

enum RegionOut<'a> {
    InPlace(&'a mut [f32]),
    Buffer(Vec<f32>),
}

impl<'a> RegionGemm<'a> {
    /// The GEMM's matrices with `c` holding the accumulator (or zeros);
    /// `both`: the node applies the op's write too. `None` (nothing done)
    /// unless the GEMM is one [`InRegion::find`] finds.
    #[allow(unsafe_code)]
    fn take(cx: &Cx<'a>, op: &PendingOp, both: bool) -> Option<RegionGemm<'a>> {
        let x = InRegion::find(cx, op)?;
        let [mk, kn, mn] = x.elems;
        // SAFETY: the node that takes these applies the op's read effect
        // (and its write when `both`), so until it ends no other node
        // writes a, b or the accumulator (nor, when `both`, touches the
        // output): the contract of `DataPlane::shared` that the engine
        // keeps. The slices live no longer than the node. The output
        // overlaps none of a, b or a separate accumulator
        // (`InRegion::find`), so its mutable slice is the only one over
        // its bytes.
        unsafe {
            let a = cx.plane.f32s(x.a, mk)?;
            let b = cx.plane.f32s(x.b, kn)?;
            let acc = match x.acc {
                Some(acc) if !(both && acc == x.out) => Some(cx.plane.f32s(acc, mn)?),
                _ => None,
            };
            let c = if both {
                let c = cx.plane.f32s_mut(x.out, mn)?;
                match (x.acc, acc) {
                    (None, _) => c.fill(0.0),
                    (Some(_), Some(acc)) => c.copy_from_slice(acc),
                    // The accumulator is the output.
                    (Some(_), None) => {}
                }
                RegionOut::InPlace(c)
            } else {
                let mut c = pool::F32.take(mn);
                match acc {
                    Some(acc) => c.extend_from_slice(acc),
                    None => c.resize(mn, 0.0),
                }
                RegionOut::Buffer(c)
            };
            Some(RegionGemm { x, a, b, c })
        }
    }

    fn c(&mut self) -> &mut [f32] {
        match &mut self.c {
            RegionOut::InPlace(c) => c,
            RegionOut::Buffer(c) => c,
        }
    }

    /// `c += a . b`, with the pool's threads when `share_pool`.
    fn compute(&mut self, cx: &Cx, share_pool: bool) {
        let (d, a, b) = (self.x.d, self.a, self.b);
        if share_pool {
            cx.backend.gemm_f32(d, a, b, self.c());
        } else {
            cx.backend.gemm_f32_one_thread(d, a, b, self.c());
        }
    }

    /// Count what was moved; what the op's write needs, if anything.
    fn finish(self, delta: &mut Delta) -> Option<Held> {
        let [mk, kn, mn] = self.x.elems;
        let acc = if self.x.acc.is_some() { mn } else { 0 };
        delta.bytes_read += 4 * (mk + kn + acc) as u64;
        match self.c {
            RegionOut::InPlace(_) => {
                delta.bytes_written += 4 * mn as u64;
                delta.gemm_in_place += 1;
                None
            }
            RegionOut::Buffer(c) => Some(Held::Gemm(gemm::Prepared::computed(self.x.d, c))),
        }
    }
}

/// A GEMM's read as prepared operands (`None`: the op has no write, so
/// nothing is computed).
fn gemm_read(cx: &Cx, op: &PendingOp, delta: &mut Delta) -> Result<Option<gemm::Prepared>> {
    // Checking intermediates needs the operands' bytes: the generic path.
    if cx.snapshots.is_none()
        && let Some(x) = gemm_fast_read(cx, op, delta)?
    {
        return Ok(Some(x));
    }
    let Params::Gemm(p) = &op.rec.params else {
        unreachable!("gemm_read is for gemm ops");
    };
    match read_phase(cx, op, delta)? {
        ReadOut::Operands(b) => {
            let x = gemm::prepare(p, &b).map_err(|d| op_error(&op.rec, cx.strings, d));
            pool::BYTES.give(b);
            x.map(Some)
        }
        ReadOut::Held(_) | ReadOut::Nothing => Ok(None),
    }
}

fn is_gemm(op: &PendingOp) -> bool {
    op.rec.kind == OpKind::Gemm && matches!(op.rec.params, Params::Gemm(_))
}

/// The whole read effect: what to hold for the write, if anything.
fn read_node(cx: &Cx, op: &PendingOp, delta: &mut Delta, share_pool: bool) -> Result<Option<Held>> {
    if is_gemm(op) {
        if let Some(mut g) = RegionGemm::take(cx, op, false) {
            g.compute(cx, share_pool);
            return Ok(g.finish(delta));
        }
        return Ok(gemm_read(cx, op, delta)?.map(|mut x| {
            gemm::compute(&mut x, cx.backend, share_pool);
            x.release_inputs();
            Held::Gemm(x)
        }));
    }
    match read_phase(cx, op, delta)? {
        ReadOut::Nothing => Ok(None),
        ReadOut::Held(h) => Ok(Some(h)),
        ReadOut::Operands(b) => {
            let out = ops::compute(&op.rec, &b, cx.backend);
            pool::BYTES.give(b);
            out.map(|o| Some(Held::Bytes(o)))
                .map_err(|d| op_error(&op.rec, cx.strings, d))
        }
    }
}

/// The error of a failed scatter.
fn write_error(cx: &Cx, op: &PendingOp, write: &Effect, x: PlaneError) -> Error {
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

/// The write of a GEMM computed in place: its output straight to the plane.
fn write_gemm(cx: &Cx, op: &PendingOp, x: &gemm::Prepared, delta: &mut Delta) -> Result<()> {
    let (Params::Gemm(p), Some(write)) = (&op.rec.params, &op.rec.write) else {
        unreachable!("write_gemm is for gemm ops with a write");
    };
    let mut out = gemm::Output::new(p, x);
    let n = out.len() as u64;
    cx.plane
        .scatter_each(&write.ranges, n, |dst| out.fill(dst))
        .map_err(|e| write_error(cx, op, write, e))?;
    delta.bytes_written += n;
    Ok(())
}

/// The write effect: scatter `held` (what the read produced; `None` when
/// the op has no read effect).
fn write_node(cx: &Cx, op: &PendingOp, held: Option<Held>, delta: &mut Delta) -> Result<()> {
    let r = &op.rec;
    let err = |d: String| op_error(r, cx.strings, d);
    let Some(write) = &r.write else {
        return Ok(());
    };
    let held = match held {
        Some(d) => d,
        None => match op.plan {
            Plan::Skip => return Ok(()),
            Plan::Move => Held::Bytes(Vec::new()),
            Plan::Compute { input, output } => {
                if input != 0 {
                    return Err(err(format!(
                        "its operands take {input} bytes, but it has no read effect"
                    )));
                }
                let wl = cx.plane.extent_bytes(&write.ranges).map_err(|x| {
                    err(format!(
                        "writing {}: {x}",
                        fmt_extents(&write.ranges, cx.tensors)
                    ))
                })?;
                if wl != output {
                    return Err(err(format!(
                        "its output takes {output} bytes, but its write ranges hold {wl}"
                    )));
                }
                Held::Bytes(ops::compute(r, &[], cx.backend).map_err(err)?)
            }
        },
    };
    let writing = |x: PlaneError| write_error(cx, op, write, x);
    match held {
        Held::Gemm(x) => {
            let res = write_gemm(cx, op, &x, delta);
            x.recycle();
            res
        }
        Held::Bytes(b) => {
            cx.plane.scatter(&write.ranges, &b).map_err(writing)?;
            delta.bytes_written += b.len() as u64;
            pool::BYTES.give(b);
            Ok(())
        }
        Held::Snapshot { snap, check } => {
            cx.plane
                .scatter_snapshot(&write.ranges, &snap)
                .map_err(writing)?;
            delta.bytes_written += snap.len();
            if let Some(fp) = check {
                // The read left the check to the written bytes (fewer pieces).
                let written = cx.plane.fingerprint(&write.ranges).map_err(writing)?;
                check_fingerprint(cx, r, fp, written, snap.len())?;
                delta.fingerprints += 1;
            }
            Ok(())
        }
    }
}

/// What a node left behind.
pub(super) struct Done {
    pub node: u32,
    /// Held for the op's write (a `Read` node of an op with a write).
    pub held: Option<Held>,
    pub delta: Delta,
}

/// Run one node; a GEMM in it uses the pool's threads when `share_pool`.
pub(super) fn run_node(
    cx: &Cx,
    node: u32,
    n: Node,
    op: &PendingOp,
    held: Option<Held>,
    share_pool: bool,
) -> Result<Done> {
    let mut delta = Delta::default();
    let held = match n.step {
        Step::Read => read_node(cx, op, &mut delta, share_pool)?,
        // Its read node applied it.
        Step::Fused => None,
        Step::Both
            if is_gemm(op)
                && let Some(mut g) = RegionGemm::take(cx, op, true) =>
        {
            g.compute(cx, share_pool);
            g.finish(&mut delta)
        }
        Step::Write => {
            write_node(cx, op, held, &mut delta)?;
            None
        }
        Step::Both if is_gemm(op) && op.rec.read.is_some() => {
            match gemm_read(cx, op, &mut delta)? {
                Some(mut x) => {
                    gemm::compute(&mut x, cx.backend, share_pool);
                    let res = write_gemm(cx, op, &x, &mut delta);
                    x.recycle();
                    res?;
                }
                None => write_node(cx, op, None, &mut delta)?,
            }
            None
        }
        Step::Both => {
            let h = read_node(cx, op, &mut delta, share_pool)?;
            write_node(cx, op, h, &mut delta)?;
            None
        }
    };
    Ok(Done { node, held, delta })
}

/// GEMM reads of one batch key, run as one batched backend call. Each
/// node's result is the one it gets alone.
pub(super) fn run_gemm_batch(
    cx: &Cx,
    items: &[(u32, Node)],
    ops: &[Option<PendingOp>],
) -> Vec<(u32, Result<Done>)> {
    let op = |n: &Node| ops[n.slot as usize].as_ref().expect("live op");
    /// An item's matrices: where they lie in TCM, or gathered and decoded.
    enum Taken<'a> {
        Region(RegionGemm<'a>),
        Decoded(Result<(Option<gemm::Prepared>, Delta)>),
    }
    // Take, gather and decode in parallel.
    let taken: Vec<Taken> = items
        .par_iter()
        .with_max_len(1)
        .map(
            |(_, n)| match RegionGemm::take(cx, op(n), n.step == Step::Both) {
                Some(g) => Taken::Region(g),
                None => {
                    let mut delta = Delta::default();
                    Taken::Decoded(gemm_read(cx, op(n), &mut delta).map(|x| (x, delta)))
                }
            },
        )
        .collect();
    let mut xs: Vec<gemm::Prepared> = Vec::new();
    let mut ok = Vec::with_capacity(items.len());
    let mut region = Vec::new();
    let mut out: Vec<Option<Result<Done>>> = Vec::with_capacity(items.len());
    for (i, t) in taken.into_iter().enumerate() {
        let p = match t {
            Taken::Region(g) => {
                region.push((i, g));
                out.push(None);
                continue;
            }
            Taken::Decoded(p) => p,
        };
        match p {
            Ok((Some(x), delta)) => {
                ok.push((i, delta));
                xs.push(x);
                out.push(None);
            }
            // Nothing to compute (cannot happen for batched ops, which
            // have a write; handled for completeness).
            Ok((None, delta)) => out.push(Some(Ok(Done {
                node: items[i].0,
                held: None,
                delta,
            }))),
            Err(e) => out.push(Some(Err(e))),
        }
    }
    if let Some((_, g)) = region.first() {
        let d = g.x.d;
        let mut args: Vec<crate::backend::GemmArgs<'_, f32>> = region
            .iter_mut()
            .map(|(_, g)| {
                let (a, b) = (g.a, g.b);
                crate::backend::GemmArgs { a, b, c: g.c() }
            })
            .collect();
        cx.backend.gemm_f32_batch(d, &mut args);
    }
    for (i, g) in region {
        let mut delta = Delta::default();
        let held = g.finish(&mut delta);
        out[i] = Some(Ok(Done {
            node: items[i].0,
            held,
            delta,
        }));
    }
    gemm::compute_batch(&mut xs, cx.backend);
    let finished: Vec<(usize, Result<Done>)> = ok
        .into_par_iter()
        .zip(xs.into_par_iter())
        .with_max_len(1)
        .map(|((i, mut delta), mut x)| {
            let (node, n) = items[i];
            let o = op(&n);
            let held = if n.step == Step::Both {
                let res = write_gemm(cx, o, &x, &mut delta);
                x.recycle();
                if let Err(e) = res {
                    return (i, Err(e));
                }
                None
            } else {
                // The output waits in f32 for the op's write.
                x.release_inputs();
                Some(Held::Gemm(x))
            };
            (i, Ok(Done { node, held, delta }))
        })
        .collect();
    for (i, r) in finished {
        out[i] = Some(r);
    }
    out.into_iter()
        .zip(items)
        .map(|(r, &(node, _))| (node, r.expect("every item ran")))
        .collect()
}

/// The nodes of a sorted window: an op's read and write share a node when
/// they are next to each other.
fn nodes(keys: &[EffKey]) -> Vec<Node> {
    let mut v = Vec::with_capacity(keys.len());
    let mut i = 0;
    while i < keys.len() {
        let k = keys[i];
        let both = !k.write && keys.get(i + 1).is_some_and(|n| n.slot == k.slot && n.write);
        v.push(Node {
            slot: k.slot,
            step: match (both, k.write) {
                (true, _) => Step::Both,
                (false, true) => Step::Write,
                (false, false) => Step::Read,
            },
        });
        i += 1 + both as usize;
    }
    v
}

/// Effects a node applies.
pub(super) fn effects(n: Node) -> u8 {
    match n.step {
        Step::Both => 2,
        Step::Read | Step::Write => 1,
        Step::Fused => 0,
    }
}

/// Apply a window: `keys` sorted, every op they name live in `ops`.
pub(crate) fn run_window(
    cx: &Cx,
    keys: &[EffKey],
    ops: &mut [Option<PendingOp>],
    pool: Option<&rayon::ThreadPool>,
    stats: &mut Stats,
) -> Result<()> {
    let mut nodes = nodes(keys);
    // On every path: fusion decides how each op runs (the bits never
    // depend on it, and so never on the thread count).
    let graph = super::graph::build(&mut nodes, ops, cx.fuse);
    stats.fused_ops += nodes.iter().filter(|n| n.step == Step::Fused).count() as u64;
    let in_order = |ops: &mut [Option<PendingOp>], stats: &mut Stats| -> Result<()> {
        for (i, &n) in nodes.iter().enumerate() {
            let op = ops[n.slot as usize].as_mut().expect("live op");
            let held = op.held.take();
            let done = run_node(cx, i as u32, n, op, held, true)?;
            op.held = done.held;
            op.left -= effects(n);
            stats.add(done.delta);
        }
        Ok(())
    };
    match pool {
        Some(pool) if pool.current_num_threads() > 1 && nodes.len() > 1 => {
            super::dataflow::run_parallel(cx, &nodes, graph, ops, pool, stats)
        }
        // In the pool even with one thread: backends take their threads
        // from the pool they run in.
        Some(pool) => pool.install(|| in_order(ops, stats)),
        None => in_order(ops, stats),
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
