//! The GEMM units' accumulator buffers (`pe_gemm.acc_kib`): timing only.
//!
//! A GEMM result that fits the buffer stays in its unit: the op ends when
//! the unit has computed it, and the next dot on the unit that
//! accumulates into the same tile (`acc` at the entry's address) reads it
//! there, not through the TCM port. The tile reaches TCM only when it
//! leaves the unit:
//!
//! - another op reads bytes of it (a store, a copy, a math op, a dot that
//!   uses it as `a` or `b`): the entry is written back (unit -> `tcm_port`
//!   -> TCM, timed like a result) and the reader waits until it is
//!   written; the entry stays, clean, so the chain may go on;
//! - the buffer needs room for another result: the least recently used
//!   entries are evicted, a dirty one written back first; the new op
//!   starts once they have left;
//! - another op writes bytes of it: the entry is dropped (its bytes are
//!   replaced), after any writeback in flight has landed.
//!
//! Data effects are untouched: every compute op applies them at issue, so
//! an entry only says where the tile's latest bytes are in time. Every
//! writer of a tile's bytes other than the chain drops its entry, so an
//! entry at an address always holds that address's latest value.

use std::io::Write;

use kb_format::pa::Pa;
use kb_format::{Dep, DepKind, Extent, Space};

use super::compute::{ComputeAct, Waiter};
use super::dma::DmaAct;
use super::{Arrive, Engine};
use crate::machine::{NodeKind, PeCoord};

/// One tile held by a GEMM unit.
#[derive(Debug, Clone, Copy)]
pub(super) struct AccEntry {
    /// The tile's TCM range (contiguous).
    pub(super) pa: u64,
    pub(super) len: u64,
    /// TCM's copy is older than the unit's.
    dirty: bool,
    /// Bumped at every result into the entry: a writeback cleans it only
    /// if no result came after the writeback started.
    version: u32,
    /// The op whose result the entry holds.
    writer: u64,
    /// A writeback in flight (`Engine::writebacks` index).
    writeback: Option<u32>,
    /// Evicted: leaves the buffer when its writeback lands.
    leaving: bool,
    last_use: u64,
}

/// A GEMM unit's accumulator buffer.
#[derive(Debug, Default)]
pub(super) struct AccBuffer {
    entries: Vec<AccEntry>,
    /// Use stamps, for least-recently-used eviction.
    stamp: u64,
}

/// An entry on its way from the unit to TCM.
#[derive(Debug)]
pub(super) struct Writeback {
    pe: u32,
    pa: u64,
    len: u64,
    version: u32,
    /// The op whose result it carries.
    writer: u64,
    waiters: Vec<Waiter>,
}

/// How a compute op uses its unit's buffer, decided when it starts.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AccUse {
    /// The accumulator operand is read from the buffer (not streamed).
    pub(super) acc_in_unit: bool,
    /// The result stays in the buffer (not streamed back to TCM).
    pub(super) keep: bool,
}

impl AccEntry {
    fn overlaps(&self, x: &Extent) -> bool {
        let (lo, hi) = super::order::bounds(x);
        self.pa < hi
            && lo < self.pa + self.len
            && crate::race::overlap(x, &Extent::contiguous(self.pa, self.len)).is_some()
    }
}

impl<W: Write> Engine<'_, W> {
    /// The dense index of the PE whose TCM holds `pa`, if its GEMM unit
    /// holds anything.
    fn acc_pe(&self, pa: u64) -> Option<usize> {
        let p = Pa::decode(pa).filter(|p| p.space == Space::Tcm)?;
        let i = self.m.pe_index(PeCoord {
            sip: p.sip,
            cube: p.cube,
            pe: p.pe,
        });
        (!self.accs.get(i)?.entries.is_empty()).then_some(i)
    }

    /// Make the bytes of `x` current in TCM for an access (a write when
    /// `write`) by op `by`, other than the chain whose accumulator is at
    /// `chain`: true when the op must wait (`waiter` is woken when the
    /// writeback it waits for has landed). A reader issued before the op
    /// whose result an entry holds needs the value before it, which a
    /// writeback took (or waits for the one in flight).
    pub(super) fn acc_access(
        &mut self,
        x: &Extent,
        write: bool,
        chain: Option<u64>,
        by: u64,
        waiter: Waiter,
    ) -> bool {
        let Some(pe) = self.acc_pe(x.pa) else {
            return false;
        };
        let mut wait = false;
        let mut i = 0;
        while i < self.accs[pe].entries.len() {
            let e = self.accs[pe].entries[i];
            let hit = Some(e.pa) != chain && e.overlaps(x);
            if !hit {
                i += 1;
                continue;
            }
            if let Some(w) = e.writeback {
                if !write && e.writer > by && self.writebacks.peek(w).writer > by {
                    // It carries a later result than this reader reads.
                    i += 1;
                    continue;
                }
                wait_on(&mut self.writebacks.get(w).waiters, waiter);
                self.waits_for_writeback(waiter, w, DepKind::Data);
                wait = true;
            } else if write {
                // Its bytes are being replaced: it is dead.
                self.accs[pe].entries.remove(i);
                continue;
            } else if e.dirty && e.writer < by {
                let w = self.start_writeback(pe, i);
                wait_on(&mut self.writebacks.get(w).waiters, waiter);
                self.waits_for_writeback(waiter, w, DepKind::Data);
                wait = true;
            }
            i += 1;
        }
        wait
    }

    /// `waiter` waits for writeback `w`: an edge of `kind` to the GEMM op
    /// whose result it carries (the writeback itself is not a record):
    /// data for an op that reads or writes those bytes, resource for one
    /// that waits for room in the unit's buffer.
    fn waits_for_writeback(&mut self, waiter: Waiter, w: u32, kind: DepKind) {
        let dep = Dep {
            op: self.writebacks.peek(w).writer,
            kind,
        };
        match waiter {
            Waiter::DmaFetch(d) => self.dmas.get(d).deps.push(dep),
            Waiter::Compute(c) | Waiter::Start(c) => self.computes.get(c).deps.push(dep),
        }
    }

    /// Whether DMA `d`'s fetch must wait for accumulator writebacks (the
    /// bytes it reads, or overwrites, that a GEMM unit holds).
    pub(super) fn dma_acc_wait(&mut self, d: u32) -> bool {
        let mut wait = false;
        let by = self.dmas.peek(d).op_id;
        for (side, write) in [(0, false), (1, true)] {
            let n = {
                let x = self.dmas.peek(d);
                if side == 0 {
                    x.src.pieces.len()
                } else {
                    x.dst.pieces.len()
                }
            };
            for i in 0..n {
                let piece = {
                    let x = self.dmas.peek(d);
                    if side == 0 {
                        x.src.pieces[i]
                    } else {
                        x.dst.pieces[i]
                    }
                };
                wait |= self.acc_access(&piece, write, None, by, Waiter::DmaFetch(d));
            }
        }
        wait
    }

    /// Decide how GEMM op `c` uses its unit's buffer as it starts: whether
    /// its accumulator is there and whether its result can stay, evicting
    /// (and writing back) older entries, least recently used first, for
    /// room. `None`: it must wait for an eviction to land (it is woken
    /// then).
    pub(super) fn acc_reserve(
        &mut self,
        c: u32,
        acc: Option<&Extent>,
        out: &Extent,
    ) -> Option<AccUse> {
        let cap = self.acc_cap;
        let pe = self.computes.get(c).pe as usize;
        let buf = &mut self.accs[pe];
        let chain = acc.and_then(|a| {
            buf.entries
                .iter()
                .position(|e| e.pa == a.pa && e.len == a.bytes() && a.rows <= 1 && !e.leaving)
        });
        let acc_in_unit = chain.is_some();
        let contiguous = out.rows <= 1 || out.stride == out.len;
        // The result replaces the entry at its address (the chain's, in a
        // chain); the chain's accumulator elsewhere is never evicted for it.
        let own = buf
            .entries
            .iter()
            .position(|e| e.pa == out.pa && !e.leaving);
        let pinned: u64 = chain
            .filter(|&i| Some(i) != own)
            .map_or(0, |i| buf.entries[i].len);
        if !contiguous || out.bytes().saturating_add(pinned) > cap {
            return Some(AccUse {
                acc_in_unit,
                keep: false,
            });
        }
        let mut held: u64 = buf
            .entries
            .iter()
            .enumerate()
            .filter(|&(i, _)| Some(i) != own)
            .map(|(_, e)| e.len)
            .sum();
        // Room: entries already leaving free theirs first (the op waits
        // for them), then the least recently used go one at a time (a
        // buffer holds a few): clean ones at once, dirty ones marked to
        // leave (written back below). By address: removals shift indices.
        let chain_pa = chain.map(|i| buf.entries[i].pa);
        let own_pa = own.map(|i| buf.entries[i].pa);
        let evictable = |e: &AccEntry| Some(e.pa) != chain_pa && Some(e.pa) != own_pa;
        let mut wait = false;
        if held + out.bytes() > cap {
            let going: u64 = buf
                .entries
                .iter()
                .filter(|e| e.leaving && evictable(e))
                .map(|e| e.len)
                .sum();
            wait = going > 0;
            held -= going;
        }
        while held + out.bytes() > cap {
            let victim = buf
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.leaving && evictable(e))
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i);
            let Some(i) = victim else { break };
            let e = &mut buf.entries[i];
            held -= e.len;
            if e.dirty || e.writeback.is_some() {
                e.leaving = true;
                wait = true;
            } else {
                buf.entries.remove(i);
            }
        }
        if wait {
            for i in 0..self.accs[pe].entries.len() {
                let e = self.accs[pe].entries[i];
                if !e.leaving {
                    continue;
                }
                let w = match e.writeback {
                    Some(w) => w,
                    None => self.start_writeback(pe, i),
                };
                wait_on(&mut self.writebacks.get(w).waiters, Waiter::Start(c));
                self.waits_for_writeback(Waiter::Start(c), w, DepKind::Resource);
            }
            return None;
        }
        let writer = self.computes.get(c).op_id;
        let buf = &mut self.accs[pe];
        buf.stamp += 1;
        let stamp = buf.stamp;
        if let Some(e) = buf.entries.iter_mut().find(|e| Some(e.pa) == chain_pa) {
            e.last_use = stamp;
        }
        match buf
            .entries
            .iter_mut()
            .find(|e| e.pa == out.pa && !e.leaving)
        {
            Some(e) => {
                e.len = out.bytes();
                e.dirty = true;
                e.version = e.version.wrapping_add(1);
                e.writer = writer;
                e.last_use = stamp;
            }
            None => buf.entries.push(AccEntry {
                pa: out.pa,
                len: out.bytes(),
                dirty: true,
                version: 0,
                writer,
                writeback: None,
                leaving: false,
                last_use: stamp,
            }),
        }
        Some(AccUse {
            acc_in_unit,
            keep: true,
        })
    }

    /// Send entry `i` of PE `pe`'s buffer to TCM over the unit's TCM port.
    fn start_writeback(&mut self, pe: usize, i: usize) -> u32 {
        let e = self.accs[pe].entries[i];
        let w = self.writebacks.insert(Writeback {
            pe: pe as u32,
            pa: e.pa,
            len: e.len,
            version: e.version,
            writer: e.writer,
            waiters: self.dependents_spare.pop().unwrap_or_default(),
        });
        self.accs[pe].entries[i].writeback = Some(w);
        let pc = self.m.pe_coord(pe);
        let (unit, tcm) = (
            self.m.pe_node(pc, NodeKind::PeGemm),
            self.m.pe_node(pc, NodeKind::Tcm),
        );
        let route = self.route(unit, None, tcm);
        let now = self.q.now();
        self.send_streamed(route, e.len, Arrive::AccAtTcm(w), now, false);
        self.stats.acc_writebacks += 1;
        w
    }

    /// A writeback's bytes reached TCM: it is written as they come.
    pub(super) fn acc_at_tcm(&mut self, w: u32) {
        let (pe, pa, len) = {
            let x = self.writebacks.get(w);
            (x.pe, x.pa, x.len)
        };
        let tcm = self.m.pe_node(self.m.pe_coord(pe as usize), NodeKind::Tcm);
        let end = self.tcm_write_end(tcm, &Extent::contiguous(pa, len));
        self.at(end, ComputeAct::Written(w));
    }

    /// A writeback landed: its entry is clean (or gone, if evicted), and
    /// whoever waited for it tries again.
    pub(super) fn acc_written(&mut self, w: u32) {
        let mut x = self.writebacks.remove(w);
        let buf = &mut self.accs[x.pe as usize];
        if let Some(i) = buf.entries.iter().position(|e| e.writeback == Some(w)) {
            let e = &mut buf.entries[i];
            e.writeback = None;
            if e.version == x.version {
                e.dirty = false;
            }
            if e.leaving {
                buf.entries.remove(i);
            }
        }
        let now = self.q.now();
        for &waiter in &x.waiters {
            match waiter {
                Waiter::Start(c) => {
                    let unit = self.computes.get(c).unit;
                    self.try_start(unit, None);
                }
                Waiter::DmaFetch(d) => self.at(now, DmaAct::Fetch(d)),
                // Only ops that start or fetch wait on a writeback.
                Waiter::Compute(_) => {}
            }
        }
        x.waiters.clear();
        self.dependents_spare.push(x.waiters);
    }
}

fn wait_on(waiters: &mut Vec<Waiter>, w: Waiter) {
    let same = |a: &Waiter| match (a, &w) {
        (Waiter::Start(x), Waiter::Start(y)) | (Waiter::DmaFetch(x), Waiter::DmaFetch(y)) => x == y,
        _ => false,
    };
    if !waiters.iter().any(same) {
        waiters.push(w);
    }
}
