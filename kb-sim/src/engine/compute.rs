//! Compute units (pe_gemm, pe_math): issuing GEMM and math ops, their
//! in-order unit queues, producer -> consumer readiness, completion.
//! Data effects of a compute op are applied at issue (its output becomes
//! pending); only timing happens here afterwards.
//!
//! An op's operands stream out of the PE's TCM (its one port, shared with
//! DMAs) over the unit's `tcm_port` link, in `pe_dma.burst_bytes` bursts.
//! The unit computes from the first burst's arrival and finishes no
//! earlier than the last byte's: `done = max(head + work, tail)`, so an
//! op whose operands arrive slower than it computes is port-bound. The
//! unit takes its next op at `done`; the result then streams back over
//! the link into TCM, and the op ends when it is written. A GEMM's result
//! that fits the unit's accumulator buffer stays in the unit instead (the
//! op ends when computed) and a dot accumulating into it reads it there
//! (`acc.rs`).

use std::collections::VecDeque;
use std::io::Write;

use kb_format::pa::Pa;
use kb_format::{
    Dep, DepKind, Dtype, Effect, Extent, GemmParams, MathInput, MathParams, Ps, Space,
};

use super::dma::DmaAct;
use super::{Act, Arrive, CONTROL_BYTES, CmdRef, Engine, OpenOp, SimError, ns};
use crate::component::Request;
use crate::event::{ceil_ps, ns_to_ps};
use crate::machine::{NodeId, NodeKind, PeCoord};
use crate::program::{DataOp, Labeled};

/// Something waiting for a compute op's result.
#[derive(Debug, Clone, Copy)]
pub(super) enum Waiter {
    /// A compute op waiting for its producers (`waiting_on`).
    Compute(u32),
    /// A DMA whose fetch waits.
    DmaFetch(u32),
    /// A compute op at its unit's queue front waiting for an accumulator
    /// writeback: its unit tries to start it again.
    Start(u32),
}

/// A GEMM or math op between issue and completion. Its data effects were
/// applied at issue; the unit's timing follows.
#[derive(Debug)]
pub(super) struct Compute {
    pub(super) pe: u32,
    pub(super) op_id: u64,
    pub(super) op: ComputeOp,
    pub(super) unit: NodeId,
    /// The PE's TCM, where operands are read and the result written.
    pub(super) tcm: NodeId,
    pub(super) work_ps: Ps,
    /// The part of `work_ps` the unit computes (the FLOPs at its peak
    /// rate, without setup): the record's active interval ends at done.
    pub(super) compute_ps: Ps,
    /// How it uses its unit's accumulator buffer (GEMM).
    pub(super) acc: super::acc::AccUse,
    /// Operand bytes streamed out of TCM.
    pub(super) streamed: u64,
    /// The result tile in TCM; the operand tiles, in order, are the read
    /// effect's ranges.
    pub(super) out: Extent,
    pub(super) read: Option<Effect>,
    pub(super) write: Option<Effect>,
    pub(super) out_pa: u64,
    /// Its causal edges: the program's, its producers', the op that held
    /// its unit.
    pub(super) deps: Vec<Dep>,
    /// Producers not yet finished.
    pub(super) waiting_on: u32,
    pub(super) dependents: Vec<Waiter>,
    pub(super) open: Option<OpenOp>,
    /// When the last operand byte is out of TCM.
    pub(super) operands_tail: Ps,
}

/// Compute-op protocol steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum ComputeAct {
    /// The operands' first burst is out of TCM: they leave for the unit.
    OperandsHead(u32),
    /// The unit finished computing.
    Done(u32),
    /// The result is written: the op ends.
    End(u32),
    /// An accumulator writeback (`Engine::writebacks`) is written to TCM.
    Written(u32),
}

impl From<ComputeAct> for Act {
    fn from(a: ComputeAct) -> Act {
        Act::Compute(a)
    }
}

#[derive(Debug, Clone)]
pub(super) enum ComputeOp {
    Gemm(Labeled<GemmParams>),
    Math(Labeled<MathParams>),
}

impl Compute {
    /// Operand tiles in TCM, in order.
    pub(super) fn inputs(&self) -> &[Extent] {
        self.read.as_ref().map_or(&[], |e| &e.ranges)
    }
}

impl ComputeOp {
    pub(super) fn decl(&self) -> &dyn DataOp {
        match self {
            ComputeOp::Gemm(g) => g,
            ComputeOp::Math(m) => m,
        }
    }
}

/// Who last wrote a TCM tile (by base address): a compute op still
/// running (its slab index) or finished.
#[derive(Debug, Clone, Copy)]
pub(super) struct Producer {
    pub(super) op_id: u64,
    pub(super) running: Option<u32>,
}

/// A serial compute unit (pe_gemm, pe_math): ops start in issue order.
#[derive(Debug, Default)]
pub(super) struct UnitQueue {
    pub(super) busy: bool,
    pub(super) queue: VecDeque<u32>,
}

impl<W: Write> Engine<'_, W> {
    /// Issue a GEMM or math op: apply its data effects now (its output
    /// becomes pending), then send it to its unit.
    pub(super) fn issue_compute(
        &mut self,
        pc: PeCoord,
        pe: u32,
        op: ComputeOp,
    ) -> Result<u64, SimError> {
        let now = self.q.now();
        let err = |message: String| SimError::Kernel {
            pe: pc,
            time_ns: ns(now),
            message,
        };
        let t = &self.m.topo;
        let tile = |a: kb_format::Addr, rows: u32, cols: u32, d: Dtype| {
            Extent::contiguous(a.addr, rows as u64 * cols as u64 * d.size() as u64)
        };
        // The operands become the read effect: a vector an emitted record
        // handed back.
        let mut inputs = self.log.writer.take_ranges();
        let (out, unit_kind, (compute_ps, setup_ps)) = match &op {
            ComputeOp::Gemm(Labeled { op: g, .. }) => {
                let (ar, ac) = if g.transpose_a {
                    (g.k, g.m)
                } else {
                    (g.m, g.k)
                };
                let (br, bc) = if g.transpose_b {
                    (g.n, g.k)
                } else {
                    (g.k, g.n)
                };
                inputs.push(tile(g.a, ar, ac, g.dtype_in));
                inputs.push(tile(g.b, br, bc, g.dtype_in));
                if let Some(acc) = g.acc {
                    inputs.push(tile(acc, g.m, g.n, g.dtype_acc));
                }
                let tflops = rate(&t.pe_gemm.tflops, g.dtype_in);
                let flops = 2.0 * g.m as f64 * g.n as f64 * g.k as f64;
                let ps = ceil_ps(flops / tflops);
                (
                    tile(g.out, g.m, g.n, g.dtype_out),
                    NodeKind::PeGemm,
                    (ps, ns_to_ps(t.pe_gemm.setup_ns.0)),
                )
            }
            ComputeOp::Math(Labeled { op: m, .. }) => {
                let mut elems = m.rows as u64 * m.cols as u64;
                for i in &m.inputs {
                    if let MathInput::Tile {
                        addr,
                        rows,
                        cols,
                        dtype,
                    } = *i
                    {
                        inputs.push(tile(addr, rows, cols, dtype));
                        elems = elems.max(rows as u64 * cols as u64);
                    }
                }
                let gflops = rate(&t.pe_math.gflops, math_rate_dtype(m));
                let ps = ceil_ps(elems as f64 * 1000.0 / gflops);
                (
                    tile(m.out, m.rows, m.cols, m.dtype),
                    NodeKind::PeMath,
                    (ps, ns_to_ps(t.pe_math.setup_ns.0)),
                )
            }
        };
        for x in inputs.iter().chain([&out]) {
            match Pa::decode(x.pa) {
                Some(p)
                    if p.space == Space::Tcm
                        && (p.sip, p.cube, p.pe) == (pc.sip, pc.cube, pc.pe) => {}
                _ => {
                    return Err(err(format!(
                        "{} operand {:#x} is not in this PE's TCM",
                        op.decl().op_name(),
                        x.pa
                    )));
                }
            }
        }
        let op_id = self.new_op_id();
        let mut deps = self.log.writer.take_deps();
        deps.extend(self.pes[pe as usize].after);
        let mut waiting_on = std::mem::take(&mut self.waiting_scratch);
        waiting_on.clear();
        for x in &inputs {
            if let Some(p) = self.producers.get(&x.pa).copied() {
                deps.push(Dep::data(p.op_id));
                if let Some(c) = p.running
                    && !waiting_on.contains(&c)
                {
                    waiting_on.push(c);
                }
            }
        }
        if self.capture_inputs {
            // Debug mode (docs/design.md L4): the inputs Phase 1 knows (loaded
            // tiles; results of other compute ops exist only in Phase 2).
            for (i, x) in inputs.iter().enumerate() {
                let mut bytes = Vec::new();
                if self.data.read_extent(x, &mut bytes).is_ok() {
                    self.log.writer.snapshot(op_id, i as u32, &bytes)?;
                }
            }
        }
        // Operands in TCM buffers can be another PE's copy destination.
        let hb = self.hb_tag(pe);
        let name = op.decl().op_name();
        self.race_check(pe, &inputs, false, op_id, name, &hb)?;
        self.race_check(pe, &[out], true, op_id, name, &hb)?;
        let mut fill = std::mem::take(&mut self.fill_scratch);
        let known = constant_fill(&op, &mut fill) || self.rand_fill(&op, &inputs, &mut fill);
        let read = self.effect(inputs);
        let mut outs = self.log.writer.take_ranges();
        outs.push(out);
        let write = self.effect(outs);
        if known {
            // A fill's value is known now: Phase 1 materializes it (the op
            // is still recorded and replayed), so masked tiles stay readable.
            self.data.write(out.pa, &fill);
        } else {
            self.data.register_writer(crate::program::Writer {
                op_id,
                op_name: op.decl().op_name(),
                pe: pc,
                time: now,
            });
            self.data.mark_pending(out.pa, out.len, op_id)
        }
        self.fill_scratch = fill;
        let unit = self.m.pe_node(pc, unit_kind);
        let tcm = self.m.pe_node(pc, NodeKind::Tcm);
        let c = self.computes.insert(Compute {
            pe,
            op_id,
            op,
            unit,
            tcm,
            work_ps: compute_ps.saturating_add(setup_ps),
            compute_ps,
            acc: Default::default(),
            streamed: 0,
            out,
            read: Some(read),
            write: Some(write),
            out_pa: out.pa,
            deps,
            waiting_on: waiting_on.len() as u32,
            dependents: self.dependents_spare.pop().unwrap_or_default(),
            open: None,
            operands_tail: 0,
        });
        for &p in &waiting_on {
            self.computes.get(p).dependents.push(Waiter::Compute(c));
        }
        self.waiting_scratch = waiting_on;
        self.producers.insert(
            out.pa,
            Producer {
                op_id,
                running: Some(c),
            },
        );
        self.pes[pe as usize].outstanding += 1;
        self.pes[pe as usize].computing += 1;
        self.in_flight.insert(op_id);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.send(cpu, unit, CONTROL_BYTES, Arrive::ComputeAtUnit(c));
        Ok(op_id)
    }

    /// Start the next op on a compute unit if it is idle and the op's
    /// inputs are ready: its operands start to stream out of TCM.
    /// `freed_by`: the op whose end of computing freed the unit just now;
    /// an op started then waited for it (a resource edge).
    pub(super) fn try_start(&mut self, unit: NodeId, freed_by: Option<u64>) {
        let u = &mut self.units[unit as usize];
        if u.busy {
            return;
        }
        let Some(&c) = u.queue.front() else { return };
        if self.computes.get(c).waiting_on > 0 {
            return;
        }
        if self.acc_cap > 0 && !self.acc_ready(c) {
            return;
        }
        let u = &mut self.units[unit as usize];
        u.queue.pop_front();
        u.busy = true;
        let (name, kind, op_id) = {
            let x = self.computes.get(c);
            if let Some(p) = freed_by {
                x.deps.push(Dep {
                    op: p,
                    kind: DepKind::Resource,
                });
            }
            (x.op.decl().op_name(), x.op.decl().op_kind(), x.op_id)
        };
        let open = self.hook_start_named(unit, name, kind, op_id);
        self.computes.get(c).open = Some(open);
        let now = self.q.now();
        let burst = self.burst;
        let x = self.computes.get(c);
        if x.inputs().is_empty() {
            // No operands (a fill, an arange): the unit just computes.
            let work = x.work_ps;
            self.at(now.saturating_add(work), ComputeAct::Done(c));
            return;
        }
        let port = self.comps[x.tcm as usize]
            .as_mut()
            .expect("TCM has a timing model");
        let mut head = None;
        let mut end = now;
        let mut streamed = 0;
        // An accumulator in the unit (the third GEMM operand) is not read.
        let n = x.inputs().len() - usize::from(x.acc.acc_in_unit);
        for input in &x.inputs()[..n] {
            let s = port.serve_read(now, &tcm_request(input), burst);
            head.get_or_insert(s.head);
            end = end.max(s.end);
            streamed += input.bytes();
        }
        x.operands_tail = end;
        x.streamed = streamed;
        self.at(head.unwrap_or(now), ComputeAct::OperandsHead(c));
    }

    /// A compute op's protocol steps.
    pub(super) fn compute_act(&mut self, a: ComputeAct) -> Result<(), SimError> {
        let now = self.q.now();
        match a {
            ComputeAct::OperandsHead(c) => {
                let (tcm, unit, bytes, tail) = {
                    let x = self.computes.get(c);
                    (x.tcm, x.unit, x.streamed, x.operands_tail)
                };
                let route = self.route(tcm, None, unit);
                self.send_streamed(route, bytes, Arrive::OperandsAtUnit(c), tail, true);
            }
            ComputeAct::Done(c) => {
                // The unit is free for its next op; the result streams
                // back into TCM.
                let (unit, tcm, bytes, keep) = {
                    let x = self.computes.get(c);
                    // The unit computed for the last `compute_ps` (at its
                    // peak rate) before done.
                    let open = x.open.as_mut().expect("started");
                    let from = now.saturating_sub(x.compute_ps).max(open.t_start);
                    open.active = Some((from, now));
                    let busy = match x.op {
                        ComputeOp::Gemm(_) => &mut self.stats.gemm_busy,
                        ComputeOp::Math(_) => &mut self.stats.math_busy,
                    };
                    *busy += now - from;
                    (x.unit, x.tcm, x.out.bytes(), x.acc.keep)
                };
                let op_id = self.computes.peek(c).op_id;
                self.units[unit as usize].busy = false;
                self.try_start(unit, Some(op_id));
                if keep {
                    // The result stays in the unit's accumulator buffer.
                    self.at(now, ComputeAct::End(c));
                } else {
                    let route = self.route(unit, None, tcm);
                    self.send_streamed(route, bytes, Arrive::ResultAtTcm(c), now, false);
                }
            }
            ComputeAct::End(c) => self.finish_compute(c)?,
            ComputeAct::Written(w) => self.acc_written(w),
        }
        Ok(())
    }

    /// The operands' first burst reached the unit (their last byte comes
    /// at the arrival's tail).
    pub(super) fn operands_at_unit(&mut self, c: u32) {
        let (head, tail) = self.arrival;
        let work = self.computes.get(c).work_ps;
        self.at(head.saturating_add(work).max(tail), ComputeAct::Done(c));
    }

    /// The result's bytes reached TCM; the op ends when they are written.
    pub(super) fn result_at_tcm(&mut self, c: u32) {
        let (tcm, out) = {
            let x = self.computes.get(c);
            (x.tcm, x.out)
        };
        let end = self.tcm_write_end(tcm, &out);
        self.at(end, ComputeAct::End(c));
    }

    /// When TCM `tcm` has written tile `x`, whose bytes arrive from the
    /// message's head to now (a result or an accumulator writeback).
    pub(super) fn tcm_write_end(&mut self, tcm: NodeId, x: &Extent) -> Ps {
        let (head, now, burst) = (self.arrival.0, self.q.now(), self.burst);
        self.comps[tcm as usize]
            .as_mut()
            .expect("TCM has a timing model")
            .serve_write(now, head, &tcm_request(x), burst)
            .end
    }

    fn finish_compute(&mut self, c: u32) -> Result<(), SimError> {
        let x = self.computes.remove(c);
        let params = match x.op {
            ComputeOp::Gemm(g) => g.params(),
            ComputeOp::Math(m) => {
                // The record takes a copy in a vector the writer handed
                // back; the kernel's vector goes back to the kernels.
                let mut op = m.op;
                let mut inputs = self.log.writer.take_math_inputs();
                inputs.extend_from_slice(&op.inputs);
                crate::program::spare_math_inputs(std::mem::replace(&mut op.inputs, inputs));
                kb_format::Params::Math(op)
            }
        };
        self.hook_end_with_deps(
            x.open.expect("started"),
            params,
            None,
            x.read,
            x.write,
            x.deps,
        )?;
        if let Some(p) = self.producers.get_mut(&x.out_pa)
            && p.running == Some(c)
        {
            p.running = None;
        }
        let mut dependents = x.dependents;
        for &w in &dependents {
            match w {
                Waiter::Compute(d) => {
                    let dep = self.computes.get(d);
                    dep.waiting_on -= 1;
                    let unit = dep.unit;
                    self.try_start(unit, None);
                }
                Waiter::DmaFetch(d) => self.at(self.q.now(), DmaAct::Fetch(d)),
                // Only writebacks wake these.
                Waiter::Start(_) => {}
            }
        }
        dependents.clear();
        self.dependents_spare.push(dependents);
        let pc = self.m.pe_coord(x.pe as usize);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.send(
            x.unit,
            cpu,
            CONTROL_BYTES,
            Arrive::CmdDoneAtCpu {
                pe: x.pe,
                cmd: CmdRef(x.op_id),
                kind: super::Done::Compute,
            },
        );
        Ok(())
    }

    /// Whether op `c` can start as far as accumulator buffers go: the
    /// bytes it reads are in TCM (a writeback of a unit's copy started and
    /// waited for otherwise), entries it overwrites dropped, and, for a
    /// GEMM, room for its result in its unit's buffer. False: it is woken
    /// when what it waits for has landed.
    fn acc_ready(&mut self, c: u32) -> bool {
        let (n, acc, out, gemm, op_id) = {
            let x = self.computes.get(c);
            let gemm = matches!(x.op, ComputeOp::Gemm(_));
            let acc = match &x.op {
                ComputeOp::Gemm(g) if g.op.acc.is_some() => x.inputs().get(2).copied(),
                _ => None,
            };
            (x.inputs().len(), acc, x.out, gemm, x.op_id)
        };
        let mut wait = false;
        for i in 0..n {
            let input = self.computes.get(c).inputs()[i];
            // A GEMM's own accumulator may stay where it is.
            let chain = acc.filter(|_| gemm && i == 2).map(|a| a.pa);
            wait |= self.acc_access(&input, false, chain, op_id, Waiter::Start(c));
        }
        let own = (gemm && out.bytes() <= self.acc_cap).then_some(out.pa);
        wait |= self.acc_access(&out, true, own, op_id, Waiter::Start(c));
        if wait {
            return false;
        }
        if gemm {
            match self.acc_reserve(c, acc.as_ref(), &out) {
                Some(u) => self.computes.get(c).acc = u,
                None => return false,
            }
        }
        true
    }

    pub(super) fn compute_arrive(&mut self, c: u32) {
        let unit = self.computes.get(c).unit;
        self.units[unit as usize].queue.push_back(c);
        self.try_start(unit, None);
    }
}

impl<W: Write> Engine<'_, W> {
    /// The bytes of a `rand` whose offsets Phase 1 knows (loaded, or an
    /// arange), into `out`: kb_format::philox, as replay computes them.
    /// False for any other op, or offsets only Phase 2 knows.
    fn rand_fill(&self, op: &ComputeOp, inputs: &[Extent], out: &mut Vec<u8>) -> bool {
        let ComputeOp::Math(Labeled { op: m, .. }) = op else {
            return false;
        };
        let (
            kb_format::MathOp::Rand,
            [
                MathInput::Tile { dtype, .. },
                MathInput::Scalar(lo),
                MathInput::Scalar(hi),
            ],
            [offsets, ..],
        ) = (m.op, m.inputs.as_slice(), inputs)
        else {
            return false;
        };
        let mut bytes = Vec::new();
        if self.data.read_extent(offsets, &mut bytes).is_err() {
            return false;
        }
        let seed = ((*hi as u64) << 32) | *lo as u64;
        out.clear();
        for e in bytes.chunks_exact(dtype.size()) {
            let offset = crate::kernel::decode(*dtype, e) as i64 as u32;
            out.extend_from_slice(&kb_format::philox::rand(seed, offset).to_le_bytes());
        }
        true
    }
}

/// A TCM access to one tile.
fn tcm_request(x: &Extent) -> Request {
    Request {
        pa: x.pa,
        row_bytes: x.len,
        rows: x.rows,
        stride: x.stride,
        channels: None,
    }
}

/// Throughput of a unit for `dtype` (TFLOP/s or GFLOP/s, per the table).
fn rate(t: &crate::topology::PerDtype, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 | Dtype::I32 => t.f32.0,
        Dtype::F16 => t.f16.0,
        Dtype::Bf16 => t.bf16.0,
        Dtype::I8 | Dtype::U8 => t.i8.0,
    }
}

/// The dtype whose pe_math rate times a math op: its output's, except for
/// ops whose output is a mask or an index (comparisons, argmax, argmin),
/// which run at their input's.
fn math_rate_dtype(m: &kb_format::MathParams) -> Dtype {
    use kb_format::MathOp::*;
    let input = m.inputs.iter().find_map(|i| match i {
        MathInput::Tile { dtype, .. } => Some(*dtype),
        MathInput::Scalar(_) => None,
    });
    match (m.op, input) {
        (Lt | Le | Gt | Ge | Eq | Ne | ArgMax | ArgMin, Some(d)) => d,
        _ => m.dtype,
    }
}

/// The bytes of a constant fill (a copy of one scalar over the output) or
/// an arange, the compute results Phase 1 can know without computing,
/// into `out` (emptied first); false for any other op.
fn constant_fill(op: &ComputeOp, out: &mut Vec<u8>) -> bool {
    let ComputeOp::Math(Labeled { op: m, .. }) = op else {
        return false;
    };
    out.clear();
    let element = |v: f64| crate::kernel::encode_element(m.dtype, v);
    match (m.op, m.inputs.as_slice()) {
        (kb_format::MathOp::Copy, [MathInput::Scalar(v)]) => {
            let (b, n) = element(*v);
            let total = m.rows as usize * m.cols as usize * n;
            if total > 0 {
                out.extend_from_slice(&b[..n]);
            }
            // Doubling copies, as `repeat` does.
            while out.len() < total {
                let k = (total - out.len()).min(out.len());
                out.extend_from_within(..k);
            }
            true
        }
        (kb_format::MathOp::Arange, []) => {
            for i in 0..m.rows as usize {
                for j in 0..m.cols as usize {
                    let v = if m.axis == Some(0) { i } else { j };
                    let (b, n) = element(v as f64);
                    out.extend_from_slice(&b[..n]);
                }
            }
            true
        }
        _ => false,
    }
}
