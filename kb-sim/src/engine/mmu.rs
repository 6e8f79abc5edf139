//! The VA model's PE_MMU (docs/design.md A2): page tables per PE, filled
//! and emptied by map and unmap messages that walk the fabric (host ->
//! pcie_ep -> io_cpu -> m_cpu -> noc -> pe_mmu), sent only to the SIPs that
//! hold target PEs, with their latency measured end to end; translation of
//! DMA addresses page by page, with PA fallback on a page fault.

use std::collections::BTreeMap;
use std::io::Write;

use kb_format::pa::Pa;
use kb_format::{Dep, DepKind, Extent, Ps, Space};

use super::host::HostArrive;
use super::{Arrive, Engine};
use crate::component::Request;
use crate::machine::{NodeKind, PeCoord, pes_within};
use crate::runtime::PageRun;

/// Bytes of one page-table entry in a map message.
const ENTRY_BYTES: u64 = 16;
/// Bytes of a BAAW segment descriptor, before its per-channel PAs.
const SEGMENT_BYTES: u64 = 64;

/// Map and unmap messages arriving at io_cpu, m_cpu and pe_mmu.
#[derive(Debug, Clone, Copy)]
pub(super) enum MmuArrive {
    Io { msg: MapMsg, sip: u32 },
    Mcpu { msg: MapMsg, sip: u32, cube: u32 },
    Mmu { msg: MapMsg, pe: u32 },
}

/// Map and unmap fan-out steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum MmuAct {
    IoFanout { msg: MapMsg, sip: u32 },
    McpuFanout { msg: MapMsg, sip: u32, cube: u32 },
}

/// Which mapping group of which tensor, map or unmap, sent when.
#[derive(Debug, Clone, Copy)]
pub(super) struct MapMsg {
    tensor: u32,
    group: u32,
    unmap: bool,
    sent: Ps,
}

impl From<MmuArrive> for Arrive {
    fn from(a: MmuArrive) -> Arrive {
        Arrive::Mmu(a)
    }
}

/// Map and unmap traffic of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MmuStats {
    /// Map (unmap) messages that reached a PE_MMU.
    pub maps: u64,
    pub unmaps: u64,
    /// Host send to PE_MMU install, end to end, over all map messages.
    pub max_map_latency_ps: Ps,
    pub min_map_latency_ps: Ps,
    /// Translations that found no mapping and used the address as a PA.
    pub page_faults: u64,
}

impl<W: Write> Engine<'_, W> {
    fn group_bytes(&self, msg: &MapMsg) -> u64 {
        let m = &self.tensors[msg.tensor as usize].mappings[msg.group as usize];
        match &m.segment {
            // A BaawSegmentInstallMsg: the descriptor and a PA per channel.
            Some(seg) => SEGMENT_BYTES + 8 * seg.channel_pas.len() as u64,
            None => m.pages * ENTRY_BYTES,
        }
    }

    /// Where a PE keeps this kind of mapping: its PE_MMU (VA pages) or its
    /// PE_DMA (BAAW segments, LA).
    fn install_node(&self, msg: &MapMsg, pc: PeCoord) -> crate::machine::NodeId {
        if self.tensors[msg.tensor as usize].mappings[msg.group as usize]
            .segment
            .is_some()
        {
            self.m.pe_node(pc, NodeKind::PeDma)
        } else {
            self.m.mmu_node(pc).expect("VA model")
        }
    }

    fn targets(&self, msg: &MapMsg) -> &[PeCoord] {
        &self.tensors[msg.tensor as usize].mappings[msg.group as usize].targets
    }

    /// Send every tensor's mappings, one message per target SIP; returns
    /// how many PE_MMU installs to wait for.
    pub(super) fn send_mappings(&mut self) -> usize {
        (0..self.tensors.len() as u32)
            .map(|t| self.send_tensor_mappings(t, false))
            .sum()
    }

    /// Send one tensor's mappings (or unmappings), one message per target
    /// SIP; returns how many installs (removals) it makes.
    pub(super) fn send_tensor_mappings(&mut self, tensor: u32, unmap: bool) -> usize {
        let now = self.q.now();
        let mut installs = 0;
        let tensors = self.tensors;
        let t = &tensors[tensor as usize];
        // An unmap waits for what the host last heard of (its launches).
        let cause = if unmap { self.host_last } else { None };
        for (g, mapping) in t.mappings.iter().enumerate() {
            let msg = MapMsg {
                tensor,
                group: g as u32,
                unmap,
                sent: now,
            };
            // On record: each install, from the host's send to the PE's
            // (one record per PE: a record left open would hold the op
            // log's watermark for the rest of the run).
            for &pc in &mapping.targets {
                let key = (tensor, g as u32, unmap, self.m.pe_index(pc) as u32);
                if self.map_records.contains_key(&key) {
                    continue;
                }
                let node = self.install_node(&msg, pc);
                let open = self.sync_open(node, if unmap { "unmap" } else { "map" });
                let cause = cause.map(|(_, op)| Dep {
                    op,
                    kind: DepKind::Host,
                });
                self.map_records.insert(key, (open, cause));
            }
            let mut sips: Vec<u32> = mapping.targets.iter().map(|p| p.sip).collect();
            sips.dedup();
            for sip in sips {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let bytes = self.group_bytes(&msg);
                self.send(self.m.host(), io, bytes, MmuArrive::Io { msg, sip });
            }
            installs += mapping.targets.len();
        }
        installs
    }

    pub(super) fn mmu_arrive(&mut self, a: MmuArrive) -> Result<(), super::SimError> {
        let now = self.q.now();
        match a {
            MmuArrive::Io { msg, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                self.at_mmu(end, MmuAct::IoFanout { msg, sip });
            }
            MmuArrive::Mcpu { msg, sip, cube } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let end = self.serve(mcpu, Request::control());
                self.at_mmu(end, MmuAct::McpuFanout { msg, sip, cube });
            }
            MmuArrive::Mmu { msg, pe } => {
                let key = (msg.tensor, msg.group, msg.unmap, pe);
                if let Some((open, cause)) = self.map_records.remove(&key) {
                    let id = self.sync_close(open, cause.as_slice())?;
                    if !msg.unmap {
                        self.host_done(id);
                    }
                }
                let mapping = &self.tensors[msg.tensor as usize].mappings[msg.group as usize];
                if let Some(seg) = &mapping.segment {
                    let table = &mut self.baaw[pe as usize];
                    table.retain(|s| s.la_base != seg.la_base);
                    if !msg.unmap {
                        table.push(seg.clone());
                    }
                } else {
                    let page = self.m.topo.pe_mmu.page_bytes;
                    self.va_tables.apply(
                        pe as usize,
                        msg.tensor,
                        msg.group,
                        &mapping.runs,
                        page,
                        msg.unmap,
                    );
                }
                let latency = now - msg.sent;
                let s = &mut self.stats.mmu;
                if msg.unmap {
                    s.unmaps += 1;
                } else {
                    s.min_map_latency_ps = if s.maps == 0 {
                        latency
                    } else {
                        s.min_map_latency_ps.min(latency)
                    };
                    s.maps += 1;
                    s.max_map_latency_ps = s.max_map_latency_ps.max(latency);
                    // The host launches only after every mapping is in place.
                    let pc = self.m.pe_coord(pe as usize);
                    let node = self.install_node(&msg, pc);
                    self.send(
                        node,
                        self.m.host(),
                        super::CONTROL_BYTES,
                        HostArrive::HostAck,
                    );
                }
            }
        }
        Ok(())
    }

    pub(super) fn mmu_act(&mut self, a: MmuAct) {
        match a {
            MmuAct::IoFanout { msg, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let mut cubes: Vec<u32> = pes_within(self.targets(&msg), (sip, 0), (sip, u32::MAX))
                    .iter()
                    .map(|p| p.cube)
                    .collect();
                cubes.dedup();
                let bytes = self.group_bytes(&msg);
                for cube in cubes {
                    let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                    self.send(io, mcpu, bytes, MmuArrive::Mcpu { msg, sip, cube });
                }
            }
            MmuAct::McpuFanout { msg, sip, cube } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let pes: Vec<PeCoord> =
                    pes_within(self.targets(&msg), (sip, cube), (sip, cube)).to_vec();
                let bytes = self.group_bytes(&msg);
                for pc in pes {
                    let node = self.install_node(&msg, pc);
                    let pe = self.m.pe_index(pc) as u32;
                    self.send(mcpu, node, bytes, MmuArrive::Mmu { msg, pe });
                }
            }
        }
    }

    /// Translate `len` bytes at virtual `va` for `pe`, run by run, into
    /// physical pieces; an unmapped page that is a valid HBM PA is used as
    /// one (the PA fallback). `run` carries the last run used from one
    /// call to the next (the rows of one transfer).
    pub(super) fn translate(
        &mut self,
        pe: PeCoord,
        va: u64,
        len: u64,
        run: &mut Option<(u64, u64, u64)>,
        out: &mut Vec<Extent>,
    ) -> Result<(), String> {
        let page = self.m.topo.pe_mmu.page_bytes;
        let pe_index = self.m.pe_index(pe);
        let mut done = 0;
        while done < len {
            let at = va + done;
            // Rows of a tile mostly fall in the run the previous row used.
            let hit = match *run {
                Some((s, e, p)) if s <= at && at < e => Some((p + (at - s), e)),
                _ => self.va_tables.run_at(pe_index, at).map(|(s, e, p)| {
                    *run = Some((s, e, p));
                    (p + (at - s), e)
                }),
            };
            let (pa, n) = match hit {
                // A whole run of contiguous pages at once.
                Some((pa, end)) => (pa, (end - at).min(len - done)),
                // A fault is counted per page, as the MMU would take them.
                None => match Pa::decode(at) {
                    Some(p) if p.space == Space::Hbm => {
                        self.stats.mmu.page_faults += 1;
                        let base = at & !(page - 1);
                        (at, (page - (at - base)).min(len - done))
                    }
                    _ => {
                        return Err(format!(
                            "{at:#x} is not mapped on {pe} and is not an HBM PA (page fault)"
                        ));
                    }
                },
            };
            match out.last_mut() {
                Some(prev) if prev.rows == 1 && prev.pa + prev.len == pa => prev.len += n,
                _ => out.push(Extent::contiguous(pa, n)),
            }
            done += n;
        }
        Ok(())
    }
}

/// Pages as runs of pages mapped to contiguous PAs: a mapping group's
/// pages (see [`super::va_tables`], which puts a PE_MMU's table together
/// from them). A tensor's VA range is a few runs (one per contiguous PA
/// part), so memory and lookups follow runs, not pages. Behaves exactly
/// as a table of pages: a later mapping of a page replaces the earlier
/// one, and an unmap removes the pages it names whatever they map to.
#[derive(Debug, Clone, Default)]
pub(super) struct PageRuns {
    /// VA start -> (VA end, PA of the start); disjoint, page-aligned.
    runs: BTreeMap<u64, (u64, u64)>,
    /// The runs found last (VA start, VA end, PA; empty: start == end),
    /// cleared when the map changes: a kernel's DMAs mostly go to the one
    /// or two tensors it streams.
    recent: std::cell::Cell<[(u64, u64, u64); 2]>,
}

impl PageRuns {
    /// Map (or unmap) the pages of `runs`, in order, each `page` bytes
    /// long: as each page in turn would, a run continuing the one gathered
    /// (in VA, and in PA unless unmapping) joins it.
    pub(super) fn apply(&mut self, runs: &[PageRun], page: u64, unmap: bool) {
        self.recent.set(Default::default());
        // (VA start, VA end, PA of the start) of the run being gathered.
        let mut run: Option<(u64, u64, u64)> = None;
        for &PageRun { va, pa, pages } in runs {
            if pages == 0 {
                continue;
            }
            let len = pages * page;
            if let Some((s, e, p)) = &mut run
                && *e == va
                && (unmap || *p + (*e - *s) == pa)
            {
                *e += len;
                continue;
            }
            if let Some(r) = run.replace((va, va + len, pa)) {
                self.put(r, unmap);
            }
        }
        if let Some(r) = run {
            self.put(r, unmap);
        }
    }

    fn put(&mut self, (va, end, pa): (u64, u64, u64), unmap: bool) {
        self.cut(va, end);
        if unmap {
            return;
        }
        let (mut start, mut stop, mut pa0) = (va, end, pa);
        // Join a neighbour that continues the same contiguous PA range.
        if let Some((&s, &(e, p))) = self.runs.range(..va).next_back()
            && e == va
            && p + (e - s) == pa
        {
            self.runs.remove(&s);
            (start, pa0) = (s, p);
        }
        if let Some(&(e, p)) = self.runs.get(&end)
            && p == pa + (end - va)
        {
            self.runs.remove(&end);
            stop = e;
        }
        self.runs.insert(start, (stop, pa0));
    }

    /// Unmap `[lo, hi)`: trim or split the runs overlapping it.
    fn cut(&mut self, lo: u64, hi: u64) {
        let first = self
            .runs
            .range(..lo)
            .next_back()
            .filter(|(_, (e, _))| *e > lo)
            .map(|(&s, _)| s)
            .unwrap_or(lo);
        let hit: Vec<(u64, (u64, u64))> =
            self.runs.range(first..hi).map(|(&s, &v)| (s, v)).collect();
        for (s, (e, p)) in hit {
            self.runs.remove(&s);
            if s < lo {
                self.runs.insert(s, (lo, p));
            }
            if e > hi {
                self.runs.insert(hi, (e, p + (hi - s)));
            }
        }
    }

    /// The PA of mapped `va` and the end of its run, or `None`.
    #[cfg(test)]
    fn get(&self, va: u64) -> Option<(u64, u64)> {
        self.run_at(va).map(|(s, e, p)| (p + (va - s), e))
    }

    /// The run holding `va`: (VA start, VA end, PA of the start).
    pub(super) fn run_at(&self, va: u64) -> Option<(u64, u64, u64)> {
        let recent = self.recent.get();
        if let Some(&r) = recent.iter().find(|&&(s, e, _)| s <= va && va < e) {
            return Some(r);
        }
        let (&s, &(e, p)) = self.runs.range(..=va).next_back()?;
        let found = (va < e).then_some((s, e, p))?;
        self.recent.set([found, recent[0]]);
        Some(found)
    }

    /// The VA span of the runs, first start to last end, if any.
    pub(super) fn span(&self) -> Option<(u64, u64)> {
        let (&lo, _) = self.runs.first_key_value()?;
        let (_, &(hi, _)) = self.runs.last_key_value()?;
        Some((lo, hi))
    }

    /// Around unmapped `va`: the end of the run below it (0 if none) and
    /// the start of the run above it (`u64::MAX` if none).
    pub(super) fn gap_at(&self, va: u64) -> (u64, u64) {
        let below = self
            .runs
            .range(..=va)
            .next_back()
            .map_or(0, |(_, &(e, _))| e);
        let above = self
            .runs
            .range(va.saturating_add(1)..)
            .next()
            .map_or(u64::MAX, |(&s, _)| s);
        (below, above)
    }
}

/// Fold equally long, equally spaced contiguous pieces into 2-D extents,
/// appended to `out`.
pub(super) fn fold_rows(pieces: &[Extent], out: &mut Vec<Extent>) {
    let start = out.len();
    for &x in pieces {
        if let Some(prev) = out[start..].last_mut()
            && x.rows == 1
            && x.len == prev.len
        {
            if prev.rows == 1 && x.pa > prev.pa {
                prev.stride = x.pa - prev.pa;
                prev.rows = 2;
                continue;
            }
            if prev.rows > 1 && x.pa == prev.pa + prev.rows as u64 * prev.stride {
                prev.rows += 1;
                continue;
            }
        }
        out.push(x);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each (VA page, PA page) pair as a run of one page.
    pub(crate) fn single_pages(pages: &[(u64, u64)]) -> Vec<PageRun> {
        pages
            .iter()
            .map(|&(va, pa)| PageRun { va, pa, pages: 1 })
            .collect()
    }

    proptest! {
        /// A message's pages given as runs of several pages (as the runtime
        /// builds them, each VA- and PA-contiguous, split anywhere) leave
        /// the same runs as the same pages given one by one, for maps and
        /// unmaps in any sequence.
        #[test]
        fn runs_of_pages_apply_as_their_pages_one_by_one(
            groups in prop::collection::vec(
                (any::<bool>(), prop::collection::vec((0u64..24, 0u64..40, 0u64..3), 1..12)),
                1..10,
            )
        ) {
            const PAGE: u64 = 4096;
            let (mut by_runs, mut by_pages) = (PageRuns::default(), PageRuns::default());
            for (unmap, pieces) in groups {
                // Runs of 1 to 3 pages, mostly following on in VA and PA.
                let (mut va, mut pa) = (0u64, 0u64);
                let mut runs = Vec::new();
                for (dv, dp, extra) in pieces {
                    va = if dv < 16 { va } else { dv * PAGE };
                    pa = if dp < 30 { pa } else { dp * 7 * PAGE };
                    let pages = 1 + extra;
                    runs.push(PageRun { va, pa, pages });
                    (va, pa) = (va + pages * PAGE, pa + pages * PAGE);
                }
                let pages: Vec<(u64, u64)> = runs
                    .iter()
                    .flat_map(|r| (0..r.pages).map(move |i| (r.va + i * PAGE, r.pa + i * PAGE)))
                    .collect();
                by_runs.apply(&runs, PAGE, unmap);
                by_pages.apply(&single_pages(&pages), PAGE, unmap);
                prop_assert_eq!(&by_runs.runs, &by_pages.runs);
            }
        }

        /// Page runs answer every lookup as a table of pages does, after
        /// any sequence of maps and unmaps (overlapping, out of order,
        /// contiguous or not).
        #[test]
        fn page_runs_behave_as_a_page_table(
            groups in prop::collection::vec(
                (any::<bool>(), prop::collection::vec((0u64..24, 0u64..40), 1..12)),
                1..12,
            )
        ) {
            const PAGE: u64 = 4096;
            let mut runs = PageRuns::default();
            let mut model = std::collections::HashMap::new();
            for (unmap, pages) in groups {
                // Mostly ascending, contiguous pages, as tensors map them,
                // with jumps where the random values say so.
                let pages: Vec<(u64, u64)> = pages
                    .iter()
                    .scan((0u64, 0u64), |(va, pa), &(dv, dp)| {
                        *va = if dv < 16 { *va + 1 } else { dv };
                        *pa = if dp < 30 { *pa + 1 } else { dp * 7 };
                        Some((*va * PAGE, *pa * PAGE))
                    })
                    .collect();
                runs.apply(&single_pages(&pages), PAGE, unmap);
                for &(va, pa) in &pages {
                    if unmap {
                        model.remove(&va);
                    } else {
                        model.insert(va, pa);
                    }
                }
                for va in 0..48u64 {
                    for off in [0, 1, PAGE - 1] {
                        let at = va * PAGE + off;
                        let want = model.get(&(va * PAGE)).map(|&pa| pa + off);
                        let got = runs.get(at);
                        prop_assert_eq!(got.map(|g| g.0), want, "va {:#x}", at);
                        if let Some((pa, end)) = got {
                            // The run's end is where contiguity stops.
                            let page_pa = pa - off;
                            let mut v = va * PAGE;
                            while v < end {
                                prop_assert_eq!(model.get(&v).copied(), Some(page_pa + (v - va * PAGE)));
                                v += PAGE;
                            }
                        }
                    }
                }
            }
        }
    }

    proptest! {
        /// A strided extent inside one run translates, in one step, to
        /// what translating each row through a table of pages and folding
        /// the pieces gives; one that leaves its run is not taken.
        #[test]
        fn an_extent_within_one_run_is_its_rows_translated_and_folded(
            pages in prop::collection::vec((0u64..20, 0u64..40), 1..16),
            va in 0u64..24 * 4096,
            rows in 1u32..40,
            len in 1u64..3000,
            extra in 1u64..5000,
        ) {
            const PAGE: u64 = 4096;
            let stride = len + extra;
            let pages: Vec<(u64, u64)> = pages
                .iter()
                .scan((0u64, 0u64), |(v, p), &(dv, dp)| {
                    *v = if dv < 14 { *v + 1 } else { dv };
                    *p = if dp < 30 { *p + 1 } else { dp * 7 };
                    Some((*v * PAGE, *p * PAGE))
                })
                .collect();
            let mut tables = super::super::va_tables::VaTables::new(1, [1]);
            tables.apply(0, 0, 0, &single_pages(&pages), PAGE, false);
            let model: std::collections::HashMap<u64, u64> = pages.iter().copied().collect();
            // Each row byte by page through the model; None if unmapped.
            let mut pieces: Vec<Extent> = Vec::new();
            let mut mapped = true;
            'rows: for r in 0..rows as u64 {
                let (mut at, end) = (va + r * stride, va + r * stride + len);
                while at < end {
                    let base = at & !(PAGE - 1);
                    let Some(&pa) = model.get(&base) else {
                        mapped = false;
                        break 'rows;
                    };
                    let n = (base + PAGE).min(end) - at;
                    match pieces.last_mut() {
                        Some(prev) if prev.pa + prev.len == pa + (at - base) => prev.len += n,
                        _ => pieces.push(Extent::contiguous(pa + (at - base), n)),
                    }
                    at += n;
                }
            }
            let mut folded = Vec::new();
            fold_rows(&pieces, &mut folded);
            match tables.extent_within_run(0, va, rows, len, stride) {
                Some(x) => {
                    prop_assert!(mapped);
                    prop_assert_eq!(vec![x], folded);
                }
                // Not in one run: either unmapped somewhere, or more than
                // one run (pieces that do not fold into one extent, or
                // the run ends inside the span).
                None => {
                    let (s, e, _) = tables.run_at(0, va).unwrap_or((0, 0, 0));
                    prop_assert!(!(mapped && s <= va && va + (rows as u64 - 1) * stride + len <= e));
                }
            }
        }
    }

    #[test]
    fn equally_spaced_pieces_fold_into_one_extent() {
        let p = |pa, len| Extent::contiguous(pa, len);
        let mut folded = vec![p(36, 8)];
        fold_rows(
            &[p(100, 8), p(164, 8), p(228, 8), p(300, 8), p(400, 4)],
            &mut folded,
        );
        // What was there before is kept, and not folded into.
        assert_eq!(folded.remove(0), p(36, 8));
        assert_eq!(
            folded,
            vec![
                Extent {
                    pa: 100,
                    len: 8,
                    rows: 3,
                    stride: 64
                },
                p(300, 8),
                p(400, 4)
            ]
        );
    }
}
