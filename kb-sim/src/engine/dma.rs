//! PE_DMA: 2-D transfers between HBM, SRAM and TCM (this PE's, or another
//! PE's TCM buffers: PE-to-PE copies).
//!
//! At issue, each side of a command is resolved to physical pieces in data
//! order (the address model's job for HBM: identity for PA; TCM and SRAM
//! are always PAs), and the pieces are grouped by the node that serves
//! them (a PE's TCM, a cube's hbm_ctrl or SRAM). Each group is one part:
//! parts are requested and served in parallel. A record keeps one read and
//! one write effect. A load reads the source once every part has been
//! served and writes the destination once every part has been delivered;
//! a store or a copy does both at issue (docs/design.md P3: store visibility, so
//! a release after it covers its bytes), and its transfer is timed after.
//! A copy's notification leaves the destination once the bytes are there.

use std::collections::VecDeque;
use std::io::Write;

use kb_format::pa::Pa;
use kb_format::{Addr, Dep, DepKind, Effect, Extent, Space};

use super::sync::HbTag;
use super::{Act, Arrive, CONTROL_BYTES, CmdRef, Engine, OpenOp, SimError, Wait, ns};
use crate::component::{Request, Streamed};
use crate::machine::{NodeId, NodeKind, PeCoord};
use crate::program::{DataOp, DmaCmd, Loaded, Notify, Unknown};
use crate::topology::{AddressModel, MappingMode};
use kb_format::Ps;

/// DMA message arrivals.
#[derive(Debug, Clone, Copy)]
pub(super) enum DmaArrive {
    CmdAtDma(u32),
    ReqAtTarget {
        dma: u32,
        group: u32,
    },
    /// The head of a source part's data reached this PE's DMA engine.
    DataHeadAtDma(u32),
    DataAtTarget {
        dma: u32,
        group: u32,
    },
    /// An acknowledgement (an atomic: its old values, head now).
    AckAtDma(u32),
    /// An atomic's old values reached its TCM.
    OldAtTcm(u32),
}

/// DMA protocol steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum DmaAct {
    Begin(u32),
    Fetch(u32),
    /// A source part's first burst is ready: its data leaves for the DMA
    /// engine.
    SrcHead {
        dma: u32,
        group: u32,
    },
    SrcPartDone(u32),
    SrcRead(u32),
    DstPartDone(u32),
    DstWrite(u32),
    Finish(u32),
}

impl From<DmaArrive> for Arrive {
    fn from(a: DmaArrive) -> Arrive {
        Arrive::Dma(a)
    }
}

impl From<DmaAct> for Act {
    fn from(a: DmaAct) -> Act {
        Act::Dma(a)
    }
}

/// When a DMA's data effects happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DmaMode {
    /// Read when served, write when delivered (loads).
    Load,
    /// Read and write at issue (stores, copies).
    Store,
}

/// LA model: the router a piece goes through and its pinned channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LaPath {
    via: NodeId,
    channels: (u32, u32),
}

/// One side of a DMA resolved: its physical pieces in data order and,
/// under LA only, each piece's path (a piece of the PA fallback has none;
/// under PA and VA the list is empty: every piece goes the plain route).
/// The order is the side's data and effect order, kept as it is (no copy
/// per DMA).
#[derive(Debug, Default)]
pub(super) struct Resolved {
    order: Vec<Extent>,
    paths: Vec<Option<LaPath>>,
}

impl Resolved {
    fn push(&mut self, x: Extent, path: Option<LaPath>) {
        self.order.push(x);
        self.paths.push(path);
    }

    /// Piece `i`'s path, if it has one.
    fn path(&self, i: usize) -> Option<LaPath> {
        self.paths.get(i).copied().flatten()
    }
}

/// One side of a DMA for timing: its pieces grouped by serving node. The
/// vectors are kept from one DMA to the next (`Engine::dma_sides`).
#[derive(Debug, Default)]
pub(super) struct Side {
    pub(super) groups: Vec<Group>,
    /// The pieces, group after group, each group's in data order.
    pub(super) pieces: Vec<Extent>,
}

impl Side {
    /// The pieces of group `g`.
    pub(super) fn pieces(&self, g: usize) -> &[Extent] {
        let (lo, hi) = self.groups[g].pieces;
        &self.pieces[lo as usize..hi as usize]
    }
}

/// Physical pieces of one side served by one node.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) target: NodeId,
    /// LA model: the PE's router on the way (`ch_rK` or `agg_router`) and
    /// the pseudo channels the request is pinned to.
    pub(super) via: Option<NodeId>,
    channels: Option<(u32, u32)>,
    /// Served by this PE's own TCM: no request or acknowledgement (the
    /// engine drives its TCM port); data still crosses its tcm_port link.
    local: bool,
    /// Its pieces: `Side::pieces[lo..hi]`.
    pieces: (u32, u32),
    pub(super) bytes: u64,
    /// A source part: when its last byte is ready at the source.
    tail: Ps,
}

impl Group {
    /// The request for piece `x` of this part.
    pub(super) fn request(&self, x: &Extent) -> Request {
        Request {
            pa: x.pa,
            row_bytes: x.len,
            rows: x.rows,
            stride: x.stride,
            channels: self.channels,
        }
    }
}

#[derive(Debug)]
pub(super) struct Dma {
    pub(super) pe: u32,
    /// Its PE's coordinates and PE_DMA node, kept here: most of its
    /// steps ask for them, and the machine's tables are cache misses
    /// on a large machine.
    pc: PeCoord,
    node: NodeId,
    pub(super) op_id: u64,
    cmd: DmaCmd,
    /// An atomic's own state (`atomic.rs`); taken while its data step
    /// runs.
    pub(super) atomic: Option<Box<super::atomic::AtomicState>>,
    /// Parts per serving node (timing).
    pub(super) src: Side,
    pub(super) dst: Side,
    /// Physical pieces in data order (data and effects).
    pub(super) src_order: Vec<Extent>,
    pub(super) dst_order: Vec<Extent>,
    /// Source parts not yet served (the read effect follows the last).
    reads_left: u32,
    /// Source parts whose data has not begun to reach the DMA engine (the
    /// destination side starts after the last).
    heads_left: u32,
    /// Over the source parts: the latest first byte and last byte at the
    /// DMA engine.
    src_head: Ps,
    src_tail: Ps,
    /// Destination parts not yet written, then acknowledgements not yet in.
    left: u32,
    /// The source was read (a load's read effect applied then); the
    /// destination parts were written (the write effect waits for both).
    /// Once the source is read, a later DMA of the PE that only writes
    /// what this one reads may start (`order.rs`).
    pub(super) read_done: bool,
    dst_done: bool,
    /// Its destination is written (a later DMA of the PE writing the same
    /// bytes may go: `order.rs`).
    pub(super) landed: bool,
    /// Both effects were applied at issue (stores, copies): the rest is
    /// timing.
    pub(super) at_issue: bool,
    /// Raised once the destination is written (a copy's notification),
    /// with the clock the copy released.
    notify: Option<(Notify, crate::race::Clock, u64)>,
    /// The issuing PE's clock at issue, for race checks.
    pub(super) hb: HbTag,
    /// Its fetch went ahead (a DMA woken by two writebacks landing at one
    /// time fetches once).
    fetched: bool,
    /// When its bytes started to move (after setup and any wait for a
    /// producer or an accumulator writeback): its record's active
    /// interval runs from here to the last byte written.
    xfer_start: Ps,
    op: Option<OpenOp>,
    pub(super) data: crate::data::Snapshot,
    /// Bytes of `data` that are compute results unknown in Phase 1.
    pub(super) unknown: Vec<Unknown>,
    fingerprint: Option<u64>,
    pub(super) read: Option<Effect>,
    pub(super) write: Option<Effect>,
    /// Its causal edges: the program's, the DMA whose engine it took, an
    /// earlier DMA on the same bytes, the producer of the tile it stores.
    pub(super) deps: Vec<Dep>,
}

/// DMA engines of one PE: up to `engines` commands in service, the rest
/// queued in arrival order.
#[derive(Debug)]
pub(super) struct DmaEngines {
    pub(super) idle: u32,
    pub(super) waiting: VecDeque<u32>,
    /// The PE's DMAs issued and not finished, in issue order (`order.rs`).
    pub(super) unfinished: Vec<super::order::Unfinished>,
    /// Those held until an earlier one touching the same bytes finishes.
    pub(super) held: Vec<u32>,
}

impl<W: Write> Engine<'_, W> {
    pub(super) fn kernel_err(&self, pe: PeCoord, message: String) -> SimError {
        SimError::Kernel {
            pe,
            time_ns: ns(self.q.now()),
            message,
        }
    }

    /// Resolve `rows` x `row_bytes` at `a` (rows `stride` apart) to physical
    /// pieces in data order, under the topology's address model.
    fn resolve(
        &mut self,
        pe: PeCoord,
        side: &str,
        a: Addr,
        rows: u32,
        row_bytes: u64,
        stride: u64,
    ) -> Result<Resolved, String> {
        if rows > 1 && stride < row_bytes {
            return Err(format!(
                "DMA {side} stride {stride} is below the row size {row_bytes}"
            ));
        }
        // Rows that touch are one contiguous range.
        let (rows, row_bytes, stride) = if rows > 1 && stride == row_bytes {
            (1, rows as u64 * row_bytes, row_bytes)
        } else {
            (rows, row_bytes, stride)
        };
        // The order becomes a record's effect: its vector is one an
        // emitted record handed back.
        let mut out = Resolved {
            order: self.log.writer.take_ranges(),
            paths: Vec::new(),
        };
        if self.m.topo.address_model == AddressModel::La && a.space == Space::Hbm {
            for r in 0..rows as u64 {
                self.resolve_la(pe, a.addr + r * stride, row_bytes, &mut out)
                    .map_err(|e| format!("DMA {side}: {e}"))?;
            }
            return Ok(out);
        }
        if self.m.topo.address_model == AddressModel::Va && a.space == Space::Hbm {
            let pe_index = self.m.pe_index(pe);
            match self
                .va_tables
                .extent_within_run(pe_index, a.addr, rows, row_bytes, stride)
            {
                // Every row in one run of pages: one extent, as folding
                // the rows' pieces would give.
                Some(x) => out.order.push(x),
                None => {
                    let mut pieces = std::mem::take(&mut self.va_pieces);
                    pieces.clear();
                    let mut run = None;
                    for r in 0..rows as u64 {
                        self.translate(pe, a.addr + r * stride, row_bytes, &mut run, &mut pieces)
                            .map_err(|e| format!("DMA {side}: {e}"))?;
                    }
                    super::mmu::fold_rows(&pieces, &mut out.order);
                    self.va_pieces = pieces;
                }
            }
            // A folded extent that passes has every row pass; only when
            // one does not are its rows checked one by one (a tile can
            // straddle partitions row by row), naming the row at fault.
            for x in &out.order {
                if self.check_pa(pe, side, Space::Hbm, x).is_err() {
                    for r in 0..x.rows.max(1) as u64 {
                        let row = Extent::contiguous(x.pa + r * x.stride, x.len);
                        self.check_pa(pe, side, Space::Hbm, &row)?;
                    }
                }
            }
            return Ok(out);
        }
        let x = Extent {
            pa: a.addr,
            len: row_bytes,
            rows,
            stride: if rows > 1 { stride } else { 0 },
        };
        self.check_pa(pe, side, a.space, &x)?;
        out.order.push(x);
        Ok(out)
    }

    /// BAAW (docs/design.md A3): resolve `len` bytes at `la` through the PE's
    /// segment table. 1:1: one piece per stripe, each on its channel's
    /// router and pinned to that channel; n:1: one piece through the
    /// aggregated router, spread over the PE's channels. An address in no
    /// segment that is an HBM PA is used as one (the PA fallback).
    fn resolve_la(
        &mut self,
        pe: PeCoord,
        la: u64,
        len: u64,
        out: &mut Resolved,
    ) -> Result<(), String> {
        let i = self.m.pe_index(pe);
        let Some(seg) = self.baaw[i]
            .iter()
            .find(|s| s.la_base <= la && la + len <= s.la_base + s.la_size)
        else {
            return match Pa::decode(la) {
                Some(p) if p.space == Space::Hbm => {
                    out.push(Extent::contiguous(la, len), None);
                    Ok(())
                }
                _ => Err(format!(
                    "{la:#x}+{len} is in no BAAW segment of {pe} and is not an HBM PA"
                )),
            };
        };
        let routers = self.m.hbm_routers(pe);
        let offset = la - seg.la_base;
        match seg.mode {
            MappingMode::NToOne => {
                let path = LaPath {
                    via: routers[0],
                    channels: (seg.first_channel, seg.channels),
                };
                out.push(Extent::contiguous(seg.agg_pa + offset, len), Some(path));
            }
            MappingMode::OneToOne => {
                let (s, n) = (seg.stripe, seg.channels as u64);
                let mut done = 0;
                while done < len {
                    let at = offset + done;
                    let (j, within) = (at / s, at % s);
                    let take = (s - within).min(len - done);
                    let k = j % n;
                    let pa = seg.channel_pas[k as usize] + (j / n) * s + within;
                    let path = LaPath {
                        via: routers[k as usize],
                        channels: (seg.first_channel + k as u32, 1),
                    };
                    let same_path = out.paths.last() == Some(&Some(path));
                    match out.order.last_mut() {
                        Some(prev) if same_path && prev.rows == 1 && prev.pa + prev.len == pa => {
                            prev.len += take
                        }
                        _ => out.push(Extent::contiguous(pa, take), Some(path)),
                    }
                    done += take;
                }
            }
        }
        Ok(())
    }

    /// Whether `x` lies in the machine, in `space`, within that memory's
    /// size, and (another PE's TCM) within one of that PE's TCM buffers.
    /// A tile of `bytes` bytes at `a` (TCM) as its physical pieces.
    pub(super) fn resolve_tcm(
        &mut self,
        pe: PeCoord,
        side: &str,
        a: Addr,
        bytes: u64,
    ) -> Result<Vec<Extent>, String> {
        if a.space != Space::Tcm {
            return Err(format!("the {side} tile is in {}, not tcm", a.space.name()));
        }
        Ok(self.resolve(pe, side, a, 1, bytes, bytes)?.order)
    }

    fn check_pa(&self, pe: PeCoord, side: &str, space: Space, x: &Extent) -> Result<(), String> {
        let p =
            Pa::decode(x.pa).ok_or_else(|| format!("DMA {side} {:#x} is not a device PA", x.pa))?;
        let c = self.m.topo.counts;
        if p.space != space {
            return Err(format!(
                "DMA {side} {p} is in {}, not {}",
                p.space.name(),
                space.name()
            ));
        }
        if p.sip >= c.sips || p.cube >= c.cubes_per_sip || p.pe >= c.pes_per_cube {
            return Err(format!("DMA {side} {p} is outside the machine"));
        }
        // The bytes the extent spans from its first.
        let span = (x.rows.max(1) as u64 - 1)
            .saturating_mul(x.stride)
            .saturating_add(x.len);
        let end = p.offset.saturating_add(span);
        let t = &self.m.topo;
        let (size, what) = match p.space {
            Space::Tcm => (t.tcm_bytes(), "TCM"),
            Space::Sram => (t.sram_bytes(), "SRAM"),
            _ => (t.hbm_bytes_per_pe(), "HBM partition"),
        };
        if end > size {
            return Err(format!(
                "DMA {side} {p} +{span} bytes runs past the end of its {what} ({size} bytes)"
            ));
        }
        if p.space == Space::Sram && p.pe != 0 {
            return Err(format!(
                "DMA {side} {p} names a PE in SRAM (SRAM is per cube: its PAs have pe 0)"
            ));
        }
        if p.space == Space::Tcm && (p.sip, p.cube, p.pe) != (pe.sip, pe.cube, pe.pe) {
            let owner = self.m.pe_index(PeCoord {
                sip: p.sip,
                cube: p.cube,
                pe: p.pe,
            });
            let last = x.pa + span;
            if !self.tcm_buffers[owner]
                .iter()
                .any(|&(s, e)| s <= x.pa && last <= e)
            {
                return Err(format!(
                    "DMA {side} {p} +{span} bytes is another PE's TCM outside its TCM buffers (a kernel may copy into or read from another PE's TCM only within a tensor placed there: Placement::in_tcm)"
                ));
            }
        }
        Ok(())
    }

    /// The serving node of piece `i` of `side`, with its LA path:
    /// (target, via, channels), the key pieces are grouped by.
    fn group_key(&self, side: &Resolved, i: usize) -> (NodeId, Option<NodeId>, Option<(u32, u32)>) {
        let target = self.memory_node(side.order[i].pa);
        match side.path(i) {
            Some(LaPath { via, channels }) => (target, Some(via), Some(channels)),
            None => (target, None, None),
        }
    }

    /// Group pieces by serving node, in order of first appearance, into
    /// `out` (empty; its vectors are reused).
    fn group(&self, pe: PeCoord, side: &Resolved, out: &mut Side) {
        let groups = &mut out.groups;
        for (i, &x) in side.order.iter().enumerate() {
            let key = self.group_key(side, i);
            match groups
                .iter_mut()
                .find(|g| (g.target, g.via, g.channels) == key)
            {
                // `pieces.1` counts the group's pieces until they are placed.
                Some(g) => {
                    g.bytes += x.bytes();
                    g.pieces.1 += 1;
                }
                None => {
                    let p = Pa::decode(x.pa).expect("resolved pieces are PAs");
                    let own_tcm =
                        p.space == Space::Tcm && (p.sip, p.cube, p.pe) == (pe.sip, pe.cube, pe.pe);
                    groups.push(Group {
                        target: key.0,
                        via: key.1,
                        channels: key.2,
                        local: own_tcm,
                        bytes: x.bytes(),
                        pieces: (0, 1),
                        tail: 0,
                    })
                }
            }
        }
        // Each group's range of the pieces, then the pieces group by group
        // (one group, the common case: the data order as it is), each put
        // at its group's cursor, `pieces.1`, which ends at the range's end.
        let mut at = 0;
        for g in groups.iter_mut() {
            let n = g.pieces.1;
            g.pieces = (at, at);
            at += n;
        }
        if let [g] = groups.as_mut_slice() {
            out.pieces.extend_from_slice(&side.order);
            g.pieces.1 = at;
        } else {
            out.pieces
                .resize(side.order.len(), Extent::contiguous(0, 0));
            for (i, &x) in side.order.iter().enumerate() {
                let key = self.group_key(side, i);
                let g = groups
                    .iter_mut()
                    .find(|g| (g.target, g.via, g.channels) == key)
                    .expect("every piece's group was made above");
                out.pieces[g.pieces.1 as usize] = x;
                g.pieces.1 += 1;
            }
        }
    }

    /// Issue a DMA; a store or copy applies its data effects now. A copy
    /// with a notification releases this PE's clock (the caller fenced
    /// it). Returns its op id.
    pub(super) fn issue_dma(
        &mut self,
        pc: PeCoord,
        pe: u32,
        c: DmaCmd,
        mode: DmaMode,
        notify: Option<Notify>,
        atomic: Option<Box<super::atomic::AtomicState>>,
    ) -> Result<u64, SimError> {
        let m = &c.mem;
        let src = self.resolve(pc, "source", m.src, m.rows, m.row_bytes, m.src_stride);
        let dst = self.resolve(pc, "destination", m.dst, m.rows, m.row_bytes, m.dst_stride);
        let (src, dst) = match (src, dst) {
            (Ok(s), Ok(d)) => (s, d),
            (Err(e), _) | (_, Err(e)) => return Err(self.kernel_err(pc, e)),
        };
        // Data and effects follow the pieces in order; groups are timing.
        let mut src_side = self.dma_sides.pop().unwrap_or_default();
        let mut dst_side = self.dma_sides.pop().unwrap_or_default();
        self.group(pc, &src, &mut src_side);
        self.group(pc, &dst, &mut dst_side);
        let (src_order, dst_order) = (src.order, dst.order);
        let (src, dst) = (src_side, dst_side);
        if let Some(n) = notify {
            self.check_pe(pc, n.pe, "notify")?;
        }
        let op_id = self.new_op_id();
        self.in_flight.insert(op_id);
        let hb = self.hb_tag(pe);
        let mut deps = self.log.writer.take_deps();
        deps.extend(self.pes[pe as usize].after);
        let notify = notify.map(|n| {
            let seq = self.notify_seq(pe, &n);
            (n, self.release(pe), seq)
        });
        let node = self.m.pe_node(pc, NodeKind::PeDma);
        let d = self.dmas.insert(Dma {
            pe,
            pc,
            node,
            op_id,
            cmd: c,
            atomic,
            src,
            dst,
            src_order,
            dst_order,
            reads_left: 0,
            heads_left: 0,
            src_head: 0,
            src_tail: 0,
            left: 0,
            read_done: false,
            dst_done: false,
            landed: false,
            at_issue: false,
            notify,
            hb,
            xfer_start: 0,
            fetched: false,
            op: None,
            data: Default::default(),
            unknown: Vec::new(),
            fingerprint: None,
            read: None,
            write: None,
            deps,
        });
        let x = self.dmas.peek(d);
        let u = super::order::Unfinished::new(d, &x.src.pieces, &x.dst.pieces);
        self.engines[pe as usize].unfinished.push(u);
        self.pes[pe as usize].outstanding += 1;
        if mode == DmaMode::Store {
            self.apply_at_issue(d)?;
        }
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.send(cpu, node, CONTROL_BYTES, DmaArrive::CmdAtDma(d));
        Ok(op_id)
    }

    /// Give `pe`'s loads in flight the race label `label` (see
    /// `Engine::release`).
    pub(super) fn relabel_loads_in_flight(&mut self, pe: u32, label: u32) {
        for u in &self.engines[pe as usize].unfinished {
            let x = self.dmas.get(u.dma);
            if !x.at_issue {
                x.hb.label = label;
            }
        }
    }

    /// A store's or copy's read and write, at issue. Pending source bytes
    /// (a compute result) make the matching destination bytes pending,
    /// naming the same writer.
    fn apply_at_issue(&mut self, d: u32) -> Result<(), SimError> {
        // Both orders become the effects.
        let src = std::mem::take(&mut self.dmas.get(d).src_order);
        let dst = std::mem::take(&mut self.dmas.get(d).dst_order);
        let mut unknown = std::mem::take(&mut self.unknown_scratch);
        unknown.clear();
        self.data.unknown_in(&src, &mut unknown);
        let moved: u64 = src.iter().map(Extent::bytes).sum();
        let fingerprint = if moved > 0 && unknown.iter().map(|u| u.len as u64).sum::<u64>() == moved
        {
            // Only unknown bytes (a compute result stored onward): nothing
            // to copy, the destination is all marks.
            self.data.clear_extents(&dst);
            None
        } else {
            let snap = self.data.snapshot(&src);
            self.data.land(&dst, &snap, unknown.is_empty())
        };
        self.data.mark_unknown(&dst, &unknown);
        self.unknown_scratch = unknown;
        self.dma_race_check(d, &src, false)?;
        let read = self.effect(src);
        self.dma_race_check(d, &dst, true)?;
        let write = self.effect(dst);
        let x = self.dmas.get(d);
        x.at_issue = true;
        x.fingerprint = fingerprint;
        x.read = Some(read);
        x.write = Some(write);
        Ok(())
    }

    /// Check a DMA's read or write against the race detector.
    fn dma_race_check(&mut self, d: u32, ranges: &[Extent], write: bool) -> Result<(), SimError> {
        let (pe, op_id, name, hb) = {
            let x = self.dmas.get(d);
            let name = match &x.atomic {
                Some(a) => a.cmd.op_name(),
                None => x.cmd.op_name(),
            };
            (x.pe, x.op_id, name, x.hb.clone())
        };
        self.race_check(pe, ranges, write, op_id, name, &hb)
    }

    /// Read a source part as a stream: its first burst (from the first
    /// piece) is ready at `head`, all of it at `end`. A request per piece,
    /// served by the part's node.
    fn serve_part_read(&mut self, d: u32, group: usize) -> Streamed {
        let (now, burst) = (self.q.now(), self.burst);
        let side = &self.dmas.get(d).src;
        let g = &side.groups[group];
        let c = self.comps[g.target as usize]
            .as_mut()
            .expect("node has a timing model");
        let mut out: Option<Streamed> = None;
        for x in side.pieces(group) {
            let s = c.serve_read(now, &g.request(x), burst);
            out = Some(match out {
                None => s,
                Some(o) => Streamed {
                    head: o.head,
                    end: o.end.max(s.end),
                },
            });
        }
        out.unwrap_or(Streamed {
            head: now,
            end: now,
        })
    }

    /// Write a destination part whose bytes arrived from `head` to now;
    /// returns when the last piece is written.
    fn serve_part_write(&mut self, d: u32, group: usize, head: Ps) -> Ps {
        let (now, burst) = (self.q.now(), self.burst);
        let side = &self.dmas.get(d).dst;
        let g = &side.groups[group];
        let c = self.comps[g.target as usize]
            .as_mut()
            .expect("node has a timing model");
        let mut end = now;
        for x in side.pieces(group) {
            end = end.max(c.serve_write(now, head, &g.request(x), burst).end);
        }
        end
    }

    pub(super) fn dma_node(&mut self, d: u32) -> (PeCoord, NodeId) {
        let x = self.dmas.peek(d);
        (x.pc, x.node)
    }

    pub(super) fn dma_arrive(&mut self, a: DmaArrive) {
        let now = self.q.now();
        match a {
            DmaArrive::CmdAtDma(d) => {
                let pe = self.dmas.get(d).pe as usize;
                self.dma_ready(pe, d);
            }
            DmaArrive::ReqAtTarget { dma, group } => {
                let s = self.serve_part_read(dma, group as usize);
                self.dmas.get(dma).src.groups[group as usize].tail = s.end;
                self.at(s.head, DmaAct::SrcHead { dma, group });
                self.at(s.end, DmaAct::SrcPartDone(dma));
            }
            DmaArrive::DataHeadAtDma(dma) => {
                let tail = self.arrival.1;
                self.src_head_in(dma, now, tail);
            }
            DmaArrive::DataAtTarget { dma, group } => {
                let end = if self.dmas.peek(dma).atomic.is_some() {
                    self.serve_part_rmw(dma, group as usize)
                } else {
                    let head = self.arrival.0;
                    self.serve_part_write(dma, group as usize, head)
                };
                self.at(end, DmaAct::DstPartDone(dma));
            }
            DmaArrive::AckAtDma(d) if self.dmas.peek(d).atomic.is_some() => {
                self.atomic_back_at_dma(d)
            }
            DmaArrive::AckAtDma(d) => self.part_done(d, DmaAct::Finish(d)),
            DmaArrive::OldAtTcm(d) => self.atomic_old_at_tcm(d),
        }
    }

    /// A source part's data is at the DMA engine from `head` (its first
    /// burst) to `tail` (its last byte); after the last part's head, the
    /// destination side starts.
    fn src_head_in(&mut self, d: u32, head: Ps, tail: Ps) {
        let x = self.dmas.get(d);
        x.src_head = x.src_head.max(head);
        x.src_tail = x.src_tail.max(tail);
        x.heads_left -= 1;
        if x.heads_left == 0 {
            self.deliver(d);
        }
    }

    /// One part of the current phase is done; start `next` after the last.
    fn part_done(&mut self, d: u32, next: DmaAct) {
        let x = self.dmas.get(d);
        x.left -= 1;
        if x.left == 0 {
            self.at(self.q.now(), next);
        }
    }

    /// The destination side, from the first burst at the DMA engine (now):
    /// each destination part gets a data message that leaves now, its
    /// tail no earlier than the source's last byte; the memory writes as
    /// the bytes come in.
    fn deliver(&mut self, d: u32) {
        let (_, dma) = self.dma_node(d);
        let (n, tail) = {
            let x = self.dmas.get(d);
            (x.dst.groups.len(), x.src_tail)
        };
        self.dmas.get(d).left = n as u32;
        for g in 0..n {
            let (target, via, bytes) = {
                let grp = &self.dmas.get(d).dst.groups[g];
                (grp.target, grp.via, grp.bytes)
            };
            let route = self.route(dma, via, target);
            self.send_streamed(
                route,
                bytes,
                DmaArrive::DataAtTarget {
                    dma: d,
                    group: g as u32,
                }
                .into(),
                tail,
                false,
            );
        }
    }

    pub(super) fn dma_act(&mut self, a: DmaAct) -> Result<(), SimError> {
        let now = self.q.now();
        match a {
            DmaAct::Begin(d) => {
                // On its engine: held there until an earlier DMA of the PE
                // on the same bytes allows it (`order.rs`).
                if self.dma_hold(d) {
                    return Ok(());
                }
                let (_, dma) = self.dma_node(d);
                let (cmd, op_id, atomic) = {
                    let x = self.dmas.get(d);
                    (x.cmd, x.op_id, x.atomic.as_ref().map(|a| a.cmd))
                };
                let op = match &atomic {
                    Some(a) => self.hook_start(dma, a, op_id),
                    None => self.hook_start(dma, &cmd, op_id),
                };
                self.dmas.get(d).op = Some(op);
                // VA model: one TLB access per translated (HBM) side.
                let tlb = if self.m.topo.address_model == AddressModel::Va {
                    let sides = [cmd.mem.src.space, cmd.mem.dst.space]
                        .iter()
                        .filter(|&&s| s == Space::Hbm)
                        .count();
                    self.tlb_ps * sides as u64
                } else {
                    0
                };
                self.at(
                    now.saturating_add(self.dma_setup_ps + tlb),
                    DmaAct::Fetch(d),
                );
            }
            DmaAct::Fetch(d) => {
                if self.dmas.peek(d).fetched {
                    return Ok(());
                }
                // A store of a pending tile moves it once its producer is done.
                // (An atomic's mask tile likewise.)
                let first = self.dmas.get(d).src.pieces.first().map(|x| x.pa);
                let mask = self.dmas.peek(d).atomic.as_ref().and_then(|a| a.mask_pa());
                for pa in [first, mask].into_iter().flatten() {
                    let producer = self.producers.get(&pa).copied();
                    if let Some(p) = producer {
                        self.dmas.get(d).deps.push(Dep::data(p.op_id));
                    }
                    if let Some(super::compute::Producer {
                        running: Some(c), ..
                    }) = producer
                    {
                        self.computes
                            .get(c)
                            .dependents
                            .push(super::compute::Waiter::DmaFetch(d));
                        return Ok(());
                    }
                }
                // Bytes a GEMM unit holds are written back to TCM first.
                if self.acc_cap > 0 && self.dma_acc_wait(d) {
                    return Ok(());
                }
                {
                    let x = self.dmas.get(d);
                    x.xfer_start = now;
                    x.fetched = true;
                }
                let (_, dma) = self.dma_node(d);
                let n = self.dmas.get(d).src.groups.len();
                {
                    let x = self.dmas.get(d);
                    x.reads_left = n as u32;
                    x.heads_left = n as u32;
                }
                if n == 0 {
                    self.deliver(d);
                }
                for g in 0..n {
                    let (local, target, via) = {
                        let grp = &self.dmas.get(d).src.groups[g];
                        (grp.local, grp.target, grp.via)
                    };
                    if local {
                        // This PE's TCM: read as a stream right here.
                        let s = self.serve_part_read(d, g);
                        self.dmas.get(d).src.groups[g].tail = s.end;
                        self.at(
                            s.head,
                            DmaAct::SrcHead {
                                dma: d,
                                group: g as u32,
                            },
                        );
                        self.at(s.end, DmaAct::SrcPartDone(d));
                    } else {
                        self.send_via(
                            dma,
                            via,
                            target,
                            CONTROL_BYTES,
                            DmaArrive::ReqAtTarget {
                                dma: d,
                                group: g as u32,
                            },
                        );
                    }
                }
            }
            DmaAct::SrcHead { dma: d, group } => {
                // The data leaves the source with its first burst (this
                // PE's TCM: over the DMA's tcm_port link); its head
                // reaching the DMA engine starts the next stage.
                let (target, via, bytes, tail) = {
                    let g = &self.dmas.get(d).src.groups[group as usize];
                    (g.target, g.via, g.bytes, g.tail)
                };
                let (_, dma) = self.dma_node(d);
                let route = self.route(target, via, dma);
                self.send_streamed(route, bytes, DmaArrive::DataHeadAtDma(d).into(), tail, true);
            }
            DmaAct::SrcPartDone(d) => {
                let x = self.dmas.get(d);
                x.reads_left -= 1;
                if x.reads_left == 0 {
                    self.at(now, DmaAct::SrcRead(d));
                }
            }
            DmaAct::SrcRead(d) => {
                // (An atomic reads its values when it applies.)
                let x = self.dmas.peek(d);
                if !x.at_issue && x.atomic.is_none() {
                    // Compute results move without their value (docs/design.md P4:
                    // only reading them in Phase 1 is an error).
                    let src = std::mem::take(&mut self.dmas.get(d).src_order);
                    let mut unknown = Vec::new();
                    self.data.unknown_in(&src, &mut unknown);
                    let data = self.data.snapshot(&src);
                    self.dma_race_check(d, &src, false)?;
                    let read = self.effect(src);
                    let x = self.dmas.get(d);
                    x.data = data;
                    x.unknown = unknown;
                    x.read = Some(read);
                }
                let x = self.dmas.get(d);
                x.read_done = true;
                if x.dst_done {
                    self.at(now, DmaAct::DstWrite(d));
                }
                let (pe, op) = (self.dmas.peek(d).pe as usize, self.dmas.peek(d).op_id);
                self.release_held(pe, op);
            }
            DmaAct::DstPartDone(d) => {
                let x = self.dmas.get(d);
                x.left -= 1;
                if x.left == 0 {
                    x.dst_done = true;
                    if x.read_done {
                        self.at(now, DmaAct::DstWrite(d));
                    }
                }
            }
            DmaAct::DstWrite(d) => {
                let (_, dma) = self.dma_node(d);
                {
                    let x = self.dmas.get(d);
                    let start = x.xfer_start;
                    x.op.as_mut().expect("started").active = Some((start, now));
                    x.landed = true;
                    let (pe, op) = (x.pe as usize, x.op_id);
                    self.release_held(pe, op);
                }
                // The destination's pieces (the order, grouped).
                for x in &self.dmas.get(d).dst.pieces {
                    if Pa::decode(x.pa).is_some_and(|p| p.space == Space::Tcm) {
                        self.producers.remove(&x.pa);
                    }
                }
                if self.dmas.peek(d).atomic.is_some() {
                    self.apply_atomic(d)?;
                    self.atomic_return(d);
                    return Ok(());
                }
                if !self.dmas.get(d).at_issue {
                    let dst = std::mem::take(&mut self.dmas.get(d).dst_order);
                    let data = std::mem::take(&mut self.dmas.get(d).data);
                    let unknown = std::mem::take(&mut self.dmas.get(d).unknown);
                    let fingerprint = self.data.land(&dst, &data, unknown.is_empty());
                    self.data.mark_unknown(&dst, &unknown);
                    let x = self.dmas.get(d);
                    x.fingerprint = fingerprint;
                    x.data = data;
                    x.unknown = unknown;
                    self.dma_race_check(d, &dst, true)?;
                    let write = self.effect(dst);
                    self.dmas.get(d).write = Some(write);
                }
                // A copy's notification leaves the destination memory once
                // the bytes are there.
                if let Some((notify, clock, seq)) = self.dmas.get(d).notify.take() {
                    let from = self
                        .dmas
                        .get(d)
                        .dst
                        .groups
                        .first()
                        .map_or(dma, |g| g.target);
                    let x = self.dmas.peek(d);
                    let (pe, launch, op) = (x.pe, x.hb.launch, x.op_id);
                    let held = super::sync::HeldNotify {
                        from,
                        launch,
                        notify,
                        clock,
                        cause: Some(Dep {
                            op,
                            kind: DepKind::Sync,
                        }),
                    };
                    self.copy_landed_notify(pe, seq, held);
                }
                let x = self.dmas.get(d);
                let remote = x.dst.groups.iter().filter(|g| !g.local).count();
                x.left = remote as u32;
                if remote == 0 {
                    self.at(now, DmaAct::Finish(d));
                }
                for g in 0..self.dmas.get(d).dst.groups.len() {
                    let g = &self.dmas.get(d).dst.groups[g];
                    if !g.local {
                        let (target, via) = (g.target, g.via);
                        self.send_via(target, via, dma, CONTROL_BYTES, DmaArrive::AckAtDma(d));
                    }
                }
            }
            DmaAct::Finish(d) => {
                let mut x = self.dmas.remove(d);
                for mut side in [std::mem::take(&mut x.src), std::mem::take(&mut x.dst)] {
                    side.groups.clear();
                    side.pieces.clear();
                    self.dma_sides.push(side);
                }
                let atomic = x.atomic.take().map(|a| a.cmd);
                match &atomic {
                    Some(a) => {
                        self.hook_end(x.op.expect("started"), a, None, x.read, x.write, x.deps)?
                    }
                    None => self.hook_end(
                        x.op.expect("started"),
                        &x.cmd,
                        x.fingerprint,
                        x.read,
                        x.write,
                        x.deps,
                    )?,
                }
                let pe = x.pe as usize;
                let kind = if x.at_issue {
                    super::Done::Store
                } else {
                    super::Done::Load
                };
                if (x.cmd.mem.dst.space == Space::Tcm || atomic.is_some()) && !x.at_issue {
                    // A load: its bytes go to the kernel that waits on it,
                    // now or later (an asynchronous load).
                    let loaded = Loaded {
                        unknown: x.unknown,
                        bytes: x.data,
                    };
                    if self.pes[pe].waiting == Wait::Cmd(CmdRef(x.op_id)) {
                        self.replies[pe] = Some(loaded);
                    } else {
                        self.async_data.insert(x.op_id, loaded);
                    }
                }
                self.dma_finished(pe, d, x.op_id);
                let pc = self.m.pe_coord(pe);
                let (dma, cpu) = (
                    self.m.pe_node(pc, NodeKind::PeDma),
                    self.m.pe_node(pc, NodeKind::PeCpu),
                );
                self.send(
                    dma,
                    cpu,
                    CONTROL_BYTES,
                    Arrive::CmdDoneAtCpu {
                        pe: pe as u32,
                        cmd: CmdRef(x.op_id),
                        kind,
                    },
                );
            }
        }
        Ok(())
    }
}
