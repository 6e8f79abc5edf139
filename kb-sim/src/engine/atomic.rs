//! Atomics (`Command::Atomic`): a read-modify-write performed at the
//! target memory's side, on the DMA protocol of `dma.rs`.
//!
//! Timing: the values tile travels from TCM to the target memory as a
//! DMA write's data does (setup, TCM read, the route); the memory then
//! serves a read of the block's bytes and, from its end, a write of them
//! (the near-memory atomic unit: no cost of its own beyond the memory's);
//! once every part is written the old values come back as a read's data
//! does (memory -> DMA engine, streamed, then into TCM over the tcm_port
//! link and the TCM's write). The kernel resumes when they are in TCM.
//!
//! Data: the whole read-modify-write is applied at one instant, when the
//! last part's write is served: read effect values, mask, target (old
//! bytes); write effect target (new bytes), then the old-values tile.
//! Atomics of several PEs on the same bytes thus apply in the simulated
//! order in which their writes end, which replay follows by `seq`.

use std::io::Write;

use kb_format::pa::Pa;
use kb_format::{AtomicParams, AtomicValues, Extent, Space};

use super::dma::{DmaAct, DmaArrive, DmaMode};
use super::{Engine, SimError};
use crate::component::Request;
use crate::machine::{NodeKind, PeCoord};
use crate::program::{AtomicCmd, DmaCmd, Unknown, Writer};

/// What an atomic DMA carries beyond a DMA's state.
#[derive(Debug)]
pub(super) struct AtomicState {
    pub(super) cmd: AtomicCmd,
    /// The mask tile's pieces (TCM), if any.
    mask: Vec<Extent>,
    /// The old-values tile's pieces (TCM).
    old: Vec<Extent>,
    /// Return parts not yet at the DMA engine.
    pub(super) back_left: u32,
    /// The latest head and tail of the old values at the DMA engine.
    back: (u64, u64),
}

impl AtomicState {
    /// Where the mask tile starts, if there is one.
    pub(super) fn mask_pa(&self) -> Option<u64> {
        self.mask.first().map(|x| x.pa)
    }
}

impl<W: Write> Engine<'_, W> {
    /// Issue an atomic: checked, resolved, then a DMA from the values
    /// tile to the target whose data steps are this file's. Returns its
    /// op id (the kernel waits for it).
    pub(super) fn issue_atomic(
        &mut self,
        pc: PeCoord,
        pe: u32,
        c: AtomicCmd,
    ) -> Result<u64, SimError> {
        let p = c.params;
        let err = |e: &Engine<'_, W>, m: String| SimError::Kernel {
            pe: pc,
            time_ns: super::ns(e.q.now()),
            message: format!("{}: {m}", p.op.name()),
        };
        if let Err(m) = p.check() {
            return Err(err(self, m));
        }
        if !matches!(p.target.space, Space::Hbm | Space::Sram) {
            return Err(err(
                self,
                format!(
                    "the target is in {}: atomics act on HBM or SRAM",
                    p.target.space.name()
                ),
            ));
        }
        let rb = p.row_bytes().unwrap_or(0);
        let n = p.nbytes().unwrap_or(0);
        let old = match self.resolve_tcm(pc, "old values", p.old, n) {
            Ok(x) => x,
            Err(m) => return Err(err(self, m)),
        };
        let mask = match p.mask {
            Some(a) => match self.resolve_tcm(pc, "mask", a, p.elements()) {
                Ok(x) => x,
                Err(m) => return Err(err(self, m)),
            },
            None => Vec::new(),
        };
        // A scalar value travels as a tile would (timing only: the
        // request's bytes are the block's); its DMA's source is then the
        // old-values tile, whose bytes it does not use.
        let src = match p.values {
            AtomicValues::Tile(a) => a,
            AtomicValues::Scalar(_) => p.old,
        };
        let cmd = DmaCmd {
            mem: kb_format::MemoryParams {
                src,
                dst: p.target,
                rows: p.rows,
                row_bytes: rb,
                src_stride: rb,
                dst_stride: p.stride,
                dtype: Some(p.dtype),
            },
            label: None,
        };
        let state = AtomicState {
            cmd: c,
            mask,
            old,
            back_left: 0,
            back: (0, 0),
        };
        self.issue_dma(pc, pe, cmd, DmaMode::Load, None, Some(Box::new(state)))
    }

    /// Serve an atomic's target part: a read of its pieces from now, then
    /// a write of them from the read's end. Returns when the write ends.
    pub(super) fn serve_part_rmw(&mut self, d: u32, group: usize) -> u64 {
        let (now, burst) = (self.q.now(), self.burst);
        let side = &self.dmas.get(d).dst;
        let g = &side.groups[group];
        let c = self.comps[g.target as usize]
            .as_mut()
            .expect("node has a timing model");
        let mut end = now;
        for x in side.pieces(group) {
            let req = g.request(x);
            let read = c.serve_read(now, &req, burst);
            end = end.max(c.serve_write(read.end, read.end, &req, burst).end);
        }
        end
    }

    /// Apply atomic `d`'s read-modify-write now (its last part is
    /// written): read effect values, mask, target; write effect target,
    /// old-values tile. Values unknown in Phase 1 (a compute result) make
    /// the whole target block unknown, written by this op; the old values
    /// are the target's bytes as they were, unknown where those were.
    pub(super) fn apply_atomic(&mut self, d: u32) -> Result<(), SimError> {
        let (pe, op_id, state) = {
            let x = self.dmas.get(d);
            (x.pe, x.op_id, x.atomic.take().expect("an atomic"))
        };
        let p: AtomicParams = state.cmd.params;
        let mut values = std::mem::take(&mut self.dmas.get(d).src_order);
        if let AtomicValues::Scalar(_) = p.values {
            values.clear();
        }
        let target = std::mem::take(&mut self.dmas.get(d).dst_order);
        let n = p.nbytes().unwrap_or(0) as usize;
        let mut read = values.clone();
        read.extend_from_slice(&state.mask);
        let at_target = (p.input_len().unwrap_or(0) as usize) - n;
        read.extend_from_slice(&target);
        let mut unknown = Vec::new();
        self.data.unknown_in(&read, &mut unknown);
        let input = self.data.snapshot(&read).to_vec();
        let out = state
            .cmd
            .params
            .apply(&input)
            .map_err(|m| self.kernel_err(self.m.pe_coord(pe as usize), m))?;
        let mut write = target.clone();
        write.extend_from_slice(&state.old);
        // What is unknown after: the target wholly if any operand byte
        // was; the old tile where the target was.
        let pc = self.m.pe_coord(pe as usize);
        let mut after: Vec<Unknown> = Vec::new();
        if !unknown.is_empty() {
            after.push(Unknown {
                offset: 0,
                len: n,
                writer: Writer {
                    op_id,
                    op_name: p.op.name(),
                    pe: pc,
                    time: self.q.now(),
                },
            });
        }
        let mut old_unknown = Vec::new();
        for u in &unknown {
            if u.offset >= at_target {
                let o = Unknown {
                    offset: u.offset - at_target,
                    ..*u
                };
                old_unknown.push(o);
                after.push(Unknown {
                    offset: n + o.offset,
                    ..o
                });
            }
        }
        let snap = crate::data::Snapshot::from_vec(out);
        let known = after.is_empty();
        self.data.land(&write, &snap, known);
        self.data.mark_unknown(&write, &after);
        let old_bytes = crate::data::Snapshot::from_vec(snap.to_vec()[n..].to_vec());
        // Race checks: the TCM tiles as plain accesses, the target as
        // atomic ones.
        let (name, hb) = (p.op.name(), self.dmas.peek(d).hb.clone());
        let tiles_read: Vec<Extent> = values.iter().chain(&state.mask).copied().collect();
        self.race_check_as(pe, &tiles_read, (false, false), op_id, name, &hb)?;
        self.race_check_as(pe, &target, (true, true), op_id, name, &hb)?;
        self.race_check_as(pe, &state.old, (true, false), op_id, name, &hb)?;
        let read = self.effect(read);
        let write = self.effect(write);
        let x = self.dmas.get(d);
        x.read = Some(read);
        x.write = Some(write);
        x.data = old_bytes;
        x.unknown = old_unknown;
        x.atomic = Some(state);
        Ok(())
    }

    /// The old values leave each target part for the DMA engine (as a
    /// read's data: streamed, the arrival at the head).
    pub(super) fn atomic_return(&mut self, d: u32) {
        let (_, dma) = self.dma_node(d);
        let n = self.dmas.get(d).dst.groups.len();
        self.dmas
            .get(d)
            .atomic
            .as_mut()
            .expect("an atomic")
            .back_left = n as u32;
        let now = self.q.now();
        for g in 0..n {
            let (target, via, bytes) = {
                let grp = &self.dmas.get(d).dst.groups[g];
                (grp.target, grp.via, grp.bytes)
            };
            let route = self.route(target, via, dma);
            self.send_streamed(route, bytes, DmaArrive::AckAtDma(d).into(), now, true);
        }
        if n == 0 {
            self.at(now, DmaAct::Finish(d));
        }
    }

    /// A part's old values reached the DMA engine (head now, tail at
    /// `arrival.1`); after the last, they go on into TCM.
    pub(super) fn atomic_back_at_dma(&mut self, d: u32) {
        let (now, tail) = (self.q.now(), self.arrival.1);
        let s = self.dmas.get(d).atomic.as_mut().expect("an atomic");
        s.back = (s.back.0.max(now), s.back.1.max(tail));
        s.back_left -= 1;
        if s.back_left > 0 {
            return;
        }
        let tail = s.back.1;
        let bytes: u64 = s.old.iter().map(Extent::bytes).sum();
        let (pc, dma) = self.dma_node(d);
        let tcm = self.m.pe_node(pc, NodeKind::Tcm);
        let route = self.route(dma, None, tcm);
        self.send_streamed(route, bytes, DmaArrive::OldAtTcm(d).into(), tail, false);
    }

    /// The old values arrived at TCM (head and tail in `arrival`): the
    /// TCM writes them; the atomic finishes then.
    pub(super) fn atomic_old_at_tcm(&mut self, d: u32) {
        let (now, head, burst) = (self.q.now(), self.arrival.0, self.burst);
        let (pc, _) = self.dma_node(d);
        let tcm = self.m.pe_node(pc, NodeKind::Tcm);
        let pieces = self
            .dmas
            .get(d)
            .atomic
            .as_ref()
            .expect("an atomic")
            .old
            .clone();
        let c = self.comps[tcm as usize]
            .as_mut()
            .expect("node has a timing model");
        let mut end = now;
        for x in &pieces {
            let req = Request {
                pa: x.pa,
                row_bytes: x.len,
                rows: x.rows,
                stride: x.stride,
                channels: None,
            };
            end = end.max(c.serve_write(now, head, &req, burst).end);
        }
        // The old tile is this PE's TCM: a pending producer there is gone.
        for x in &pieces {
            if Pa::decode(x.pa).is_some_and(|p| p.space == Space::Tcm) {
                self.producers.remove(&x.pa);
            }
        }
        self.at(end, DmaAct::Finish(d));
    }
}
