//! Every PE_MMU's page table (VA model), kept as what each PE was sent
//! rather than as a copy of it per PE: a mapping group's pages become runs
//! once, when its first message arrives anywhere, and a PE's table is the
//! list of the map and unmap messages it took, in order, each naming a
//! group. A page translates through the newest message that names it
//! (map: its PA; unmap: none), which is what applying the messages to a
//! table of pages, one after the other, leaves. A sharded tensor mapped on
//! every PE is thus held once, not once per PE, and a PE that maps nothing
//! holds nothing.

use super::mmu::PageRuns;
use crate::runtime::PageRun;

/// One mapping group's pages as runs, and the VA span they lie in.
#[derive(Debug)]
struct Group {
    runs: PageRuns,
    lo: u64,
    hi: u64,
}

/// A message a PE took: which group, map or unmap, and the group's span.
#[derive(Debug, Clone, Copy)]
struct Took {
    group: u32,
    unmap: bool,
    lo: u64,
    hi: u64,
}

/// One PE's table: the messages it took that still decide a page, oldest
/// first, and the runs found last (VA start, VA end, PA; empty: start ==
/// end), cleared when the list changes: a kernel's DMAs mostly go to the
/// one or two tensors it streams.
#[derive(Debug, Default)]
struct PeTable {
    took: Vec<Took>,
    recent: std::cell::Cell<[(u64, u64, u64); 2]>,
}

#[derive(Debug, Default)]
pub(super) struct VaTables {
    /// Per tensor: the index of its first group in `groups`.
    first_group: Vec<u32>,
    /// Per mapping group (tensors' groups in order): its runs, once built.
    groups: Vec<Option<Group>>,
    pes: Vec<PeTable>,
}

impl VaTables {
    /// Tables for `n_pes` PEs, with tensors of `groups[t]` mapping groups.
    pub(super) fn new(n_pes: usize, groups: impl IntoIterator<Item = usize>) -> Self {
        let mut first_group = Vec::new();
        let mut n = 0u32;
        for g in groups {
            first_group.push(n);
            n += g as u32;
        }
        VaTables {
            first_group,
            groups: (0..n).map(|_| None).collect(),
            pes: (0..n_pes).map(|_| PeTable::default()).collect(),
        }
    }

    /// PE `pe` takes the map (or unmap) message of `tensor`'s `group`,
    /// whose pages (`runs` of them) are `page` bytes each.
    pub(super) fn apply(
        &mut self,
        pe: usize,
        tensor: u32,
        group: u32,
        runs: &[PageRun],
        page: u64,
        unmap: bool,
    ) {
        let id = self.first_group[tensor as usize] + group;
        let g = self.groups[id as usize].get_or_insert_with(|| {
            let mut table = PageRuns::default();
            table.apply(runs, page, false);
            let (lo, hi) = table.span().unwrap_or((0, 0));
            Group {
                runs: table,
                lo,
                hi,
            }
        });
        let (lo, hi) = (g.lo, g.hi);
        let t = &mut self.pes[pe];
        t.recent.set(Default::default());
        // An earlier message of the same group names the same pages: this
        // one decides all of them from now on.
        t.took.retain(|x| x.group != id);
        // An unmap that names no page an earlier message names leaves
        // what it would leave without it.
        if unmap && !t.took.iter().any(|x| x.lo < hi && lo < x.hi) {
            return;
        }
        t.took.push(Took {
            group: id,
            unmap,
            lo,
            hi,
        });
    }

    /// The run holding `va` on `pe` (VA start, VA end, PA of the start):
    /// pages that map to contiguous PAs, though not always all of them.
    pub(super) fn run_at(&self, pe: usize, va: u64) -> Option<(u64, u64, u64)> {
        let t = &self.pes[pe];
        let recent = t.recent.get();
        if let Some(&r) = recent.iter().find(|&&(s, e, _)| s <= va && va < e) {
            return Some(r);
        }
        let found = self.find(t, va)?;
        t.recent.set([found, recent[0]]);
        Some(found)
    }

    fn find(&self, t: &PeTable, va: u64) -> Option<(u64, u64, u64)> {
        for (i, x) in t.took.iter().enumerate().rev() {
            if va < x.lo || x.hi <= va {
                continue;
            }
            let g = self.groups[x.group as usize].as_ref().expect("built");
            let Some((mut s, mut e, mut p)) = g.runs.run_at(va) else {
                continue;
            };
            if x.unmap {
                return None;
            }
            // Newer messages name none of `va`'s page: keep the run to
            // the pages between theirs around it.
            for y in &t.took[i + 1..] {
                if y.hi <= s || e <= y.lo {
                    continue;
                }
                let h = self.groups[y.group as usize].as_ref().expect("built");
                let (below, above) = h.runs.gap_at(va);
                if below > s {
                    p += below - s;
                    s = below;
                }
                e = e.min(above);
            }
            return Some((s, e, p));
        }
        None
    }

    /// `rows` rows of `len` bytes, `stride` apart (rows that touch already
    /// merged, so `stride > len`), at `va` on `pe` as one extent, when one
    /// run holds every byte of them: what translating row by row and
    /// folding the pieces gives then, in one lookup. `None` otherwise.
    pub(super) fn extent_within_run(
        &self,
        pe: usize,
        va: u64,
        rows: u32,
        len: u64,
        stride: u64,
    ) -> Option<kb_format::Extent> {
        if rows == 0 || len == 0 || (rows > 1 && stride <= len) {
            return None;
        }
        let span = (rows as u64 - 1).checked_mul(stride)?.checked_add(len)?;
        let (s, e, p) = self.run_at(pe, va)?;
        (va.checked_add(span)? <= e).then(|| kb_format::Extent {
            pa: p + (va - s),
            len,
            rows,
            stride: if rows > 1 { stride } else { 0 },
        })
    }

    /// Messages `pe` holds (for tests: what a PE's table costs).
    #[cfg(test)]
    fn held(&self, pe: usize) -> usize {
        self.pes[pe].took.len()
    }

    /// Groups built (for tests: a group's runs are built once).
    #[cfg(test)]
    fn built(&self) -> usize {
        self.groups.iter().filter(|g| g.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::mmu::tests::single_pages;
    use super::*;
    use proptest::prelude::*;

    const PAGE: u64 = 4096;

    /// Mostly ascending, contiguous pages, as tensors map them, with jumps
    /// where the random values say so.
    fn pages_of(raw: &[(u64, u64)]) -> Vec<(u64, u64)> {
        raw.iter()
            .scan((0u64, 0u64), |(va, pa), &(dv, dp)| {
                *va = if dv < 16 { *va + 1 } else { dv };
                *pa = if dp < 30 { *pa + 1 } else { dp * 7 };
                Some((*va * PAGE, *pa * PAGE))
            })
            .collect()
    }

    proptest! {
        /// Every PE's shared table answers every lookup as a table of
        /// pages of its own does, after any messages in any order per PE
        /// (groups that overlap, maps and unmaps of groups never mapped,
        /// repeated messages).
        #[test]
        fn shared_tables_behave_as_a_page_table_per_pe(
            groups in prop::collection::vec(prop::collection::vec((0u64..24, 0u64..40), 1..10), 1..6),
            msgs in prop::collection::vec((0usize..3, any::<prop::sample::Index>(), any::<bool>()), 1..24),
        ) {
            let groups: Vec<Vec<(u64, u64)>> = groups.iter().map(|g| pages_of(g)).collect();
            // Tensor 0 has the first two groups, tensor 1 the rest.
            let split = 2.min(groups.len());
            let mut tables = VaTables::new(3, [split, groups.len() - split]);
            let mut model = vec![std::collections::HashMap::new(); 3];
            for (pe, g, unmap) in msgs {
                let g = g.index(groups.len());
                let (tensor, group) = if g < split { (0, g) } else { (1, g - split) };
                tables.apply(pe, tensor, group as u32, &single_pages(&groups[g]), PAGE, unmap);
                for &(va, pa) in &groups[g] {
                    if unmap {
                        model[pe].remove(&va);
                    } else {
                        model[pe].insert(va, pa);
                    }
                }
                for (p, m) in model.iter().enumerate() {
                    for va in 0..48u64 {
                        for off in [0, 1, PAGE - 1] {
                            let at = va * PAGE + off;
                            let want = m.get(&(va * PAGE)).map(|&pa| pa + off);
                            let got = tables.run_at(p, at);
                            prop_assert_eq!(got.map(|(s, _, pa)| pa + (at - s)), want, "pe {} va {:#x}", p, at);
                            if let Some((s, e, pa)) = got {
                                // Every page of the run maps as the run says.
                                let mut v = s;
                                while v < e {
                                    prop_assert_eq!(m.get(&v).copied(), Some(pa + (v - s)));
                                    v += PAGE;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pes_that_map_one_tensor_share_its_runs_and_see_the_same_translation() {
        // A tensor of 8 pages in two PA-contiguous halves, mapped on 4 PEs.
        let pages: Vec<(u64, u64)> = (0..8)
            .map(|i| (i * PAGE, if i < 4 { 100 } else { 900 } * PAGE + i * PAGE))
            .collect();
        let mut tables = VaTables::new(4, [1]);
        for pe in 0..4 {
            tables.apply(pe, 0, 0, &single_pages(&pages), PAGE, false);
        }
        assert_eq!(tables.built(), 1);
        for pe in 0..4 {
            assert_eq!(
                tables.run_at(pe, 5 * PAGE + 3),
                Some((4 * PAGE, 8 * PAGE, 904 * PAGE))
            );
            assert_eq!(tables.run_at(pe, 0), Some((0, 4 * PAGE, 100 * PAGE)));
            assert_eq!(tables.held(pe), 1);
        }
        // Unmapped on one PE, still mapped on the others; the unmap undoes
        // the map, and the PE holds nothing again.
        tables.apply(2, 0, 0, &single_pages(&pages), PAGE, true);
        assert_eq!(tables.run_at(2, 0), None);
        assert_eq!(tables.held(2), 0);
        assert_eq!(tables.run_at(1, 0), Some((0, 4 * PAGE, 100 * PAGE)));
    }

    #[test]
    fn a_pe_that_maps_nothing_holds_nothing() {
        let pages = [(0, 7 * PAGE)];
        let mut tables = VaTables::new(3, [1, 1]);
        tables.apply(0, 1, 0, &single_pages(&pages), PAGE, false);
        // An unmap that names nothing the PE has is not kept either.
        tables.apply(1, 0, 0, &single_pages(&pages), PAGE, true);
        assert_eq!((tables.held(1), tables.held(2)), (0, 0));
        assert_eq!(tables.run_at(1, 0), None);
        assert_eq!(tables.run_at(2, 0), None);
        assert_eq!(tables.run_at(0, 5), Some((0, PAGE, 7 * PAGE)));
    }

    #[test]
    fn a_newer_group_cuts_the_run_of_an_older_one() {
        // Group 0: pages 0..8 contiguous; group 1 remaps page 5 elsewhere.
        let g0: Vec<(u64, u64)> = (0..8).map(|i| (i * PAGE, (50 + i) * PAGE)).collect();
        let g1 = [(5 * PAGE, 3 * PAGE)];
        let mut tables = VaTables::new(1, [2]);
        tables.apply(0, 0, 0, &single_pages(&g0), PAGE, false);
        tables.apply(0, 0, 1, &single_pages(&g1), PAGE, false);
        assert_eq!(tables.run_at(0, 2 * PAGE), Some((0, 5 * PAGE, 50 * PAGE)));
        assert_eq!(
            tables.run_at(0, 5 * PAGE),
            Some((5 * PAGE, 6 * PAGE, 3 * PAGE))
        );
        assert_eq!(
            tables.run_at(0, 7 * PAGE),
            Some((6 * PAGE, 8 * PAGE, 56 * PAGE))
        );
        assert_eq!(
            tables.extent_within_run(0, PAGE, 3, 16, PAGE),
            Some(kb_format::Extent {
                pa: 51 * PAGE,
                len: 16,
                rows: 3,
                stride: PAGE
            })
        );
        assert_eq!(tables.extent_within_run(0, PAGE, 5, 16, PAGE), None);
    }
}
