//! The dependency graph of a planned window: which earlier nodes each
//! node must wait for.
//!
//! Nodes are in effect order (with the planner's materializations before
//! the writes that need them); an edge always goes from an earlier node to
//! a later one, so running a node after its predecessors applies every
//! conflicting pair of accesses in effect order, and that is all the order
//! the result depends on. Edges:
//!
//! - physical byte ranges, through an interval index of the window's
//!   accesses: a read waits for the last earlier write of any byte it
//!   reads (RAW); a write waits for the last earlier write (WAW) and every
//!   read since (WAR) of any byte it writes. A strided extent counts as
//!   the whole span from its first to its last byte: a superset, which can
//!   only add edges (less parallelism, never a different result). Reads of
//!   a memory that no node of the window writes need no edge and are left
//!   out (operands read where they lie in host data or HBM, mostly);
//! - an op's nodes wait for its earlier nodes (a write for what its read
//!   held);
//! - the record's dependency ids: the op's first node waits for the latest
//!   earlier node of each op it names, when that op has one in the window.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::plan::PNode;
use crate::plane::{mem_key, span};

/// Predecessor counts and successor lists (node `i`'s successors are
/// `succ[first[i]..first[i + 1]]`: one vector for the window, not one per
/// node).
#[derive(Debug, Default)]
pub struct Graph {
    pub preds: Vec<u32>,
    first: Vec<u32>,
    succ: Vec<u32>,
}

impl Graph {
    /// The nodes that wait for node `i`, in order.
    pub fn succs(&self, i: u32) -> &[u32] {
        let i = i as usize;
        &self.succ[self.first[i] as usize..self.first[i + 1] as usize]
    }
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Seg {
    end: u64,
    writer: u32,
    readers: Vec<u32>,
}

/// Who last wrote and who read since, for disjoint byte intervals.
#[derive(Debug, Default)]
struct Intervals {
    map: BTreeMap<u64, Seg>,
}

impl Intervals {
    /// Make `x` a segment boundary.
    fn split_at(&mut self, x: u64) {
        let Some((&start, seg)) = self.map.range_mut(..x).next_back() else {
            return;
        };
        if seg.end > x {
            let tail = Seg {
                end: seg.end,
                writer: seg.writer,
                readers: seg.readers.clone(),
            };
            seg.end = x;
            debug_assert!(start < x);
            self.map.insert(x, tail);
        }
    }

    /// Record an access of `[start, end)` by `node`, adding the nodes it
    /// must wait for to `preds`.
    fn access(&mut self, start: u64, end: u64, node: u32, write: bool, preds: &mut Vec<u32>) {
        if start >= end {
            return;
        }
        self.split_at(start);
        self.split_at(end);
        let mut cursor = start;
        let mut gaps = Vec::new();
        for (&s, seg) in self.map.range_mut(start..end) {
            if s > cursor {
                gaps.push((cursor, s));
            }
            if seg.writer != NONE {
                preds.push(seg.writer);
            }
            if write {
                preds.extend_from_slice(&seg.readers);
                seg.writer = node;
                seg.readers.clear();
            } else if seg.readers.last() != Some(&node) {
                seg.readers.push(node);
            }
            cursor = seg.end;
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        for (s, e) in gaps {
            let seg = if write {
                Seg {
                    end: e,
                    writer: node,
                    readers: Vec::new(),
                }
            } else {
                Seg {
                    end: e,
                    writer: NONE,
                    readers: vec![node],
                }
            };
            self.map.insert(s, seg);
        }
    }
}

/// Build the graph of a planned window's `nodes` (in effect order).
/// `written`: the memories some node writes.
pub(crate) fn build(nodes: &[PNode], written: &FxHashSet<u64>) -> Graph {
    let n = nodes.len();
    let mut preds_of = vec![0u32; n];
    // Edges (from, to), in order of `to`; grouped by `from` at the end.
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut iv = Intervals::default();
    // Op id -> its latest node so far.
    let mut latest: FxHashMap<u64, u32> = FxHashMap::default();
    let mut preds = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let i = i as u32;
        preds.clear();
        if node.of_op {
            // (A K-chain's node applies every one of its GEMMs' effects.)
            for op in node.ops() {
                let r = &op.rec;
                match latest.insert(r.op_id, i) {
                    // Its own earlier node.
                    Some(own) => preds.push(own),
                    // The op's first node here: its explicit dependencies.
                    None => preds.extend(
                        r.deps
                            .iter()
                            .filter(|d| d.kind == kb_format::DepKind::Data)
                            .filter_map(|d| latest.get(&d.op).copied()),
                    ),
                }
            }
        }
        let (reads, writes) = node.accesses();
        for e in reads {
            if written.contains(&mem_key(e.pa))
                && let Some((s, end)) = span(e)
            {
                iv.access(s, end, i, false, &mut preds);
            }
        }
        for e in writes {
            if let Some((s, end)) = span(e) {
                iv.access(s, end, i, true, &mut preds);
            }
        }
        preds.sort_unstable();
        preds.dedup();
        for &p in preds.iter().filter(|&&p| p != i) {
            debug_assert!(p < i, "edges go forward");
            edges.push((p, i));
            preds_of[i as usize] += 1;
        }
    }
    let (first, succ) = successor_lists(n, &edges);
    Graph {
        preds: preds_of,
        first,
        succ,
    }
}

/// The successor lists of `n` nodes with these edges (from, to), by a
/// counting sort on `from`: stable, so each list keeps the order its
/// edges come in.
fn successor_lists(n: usize, edges: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>) {
    let mut first = vec![0u32; n + 1];
    for &(p, _) in edges {
        first[p as usize + 1] += 1;
    }
    for i in 0..n {
        first[i + 1] += first[i];
    }
    let mut at = first.clone();
    let mut succ = vec![0u32; edges.len()];
    for &(p, i) in edges {
        succ[at[p as usize] as usize] = i;
        at[p as usize] += 1;
    }
    (first, succ)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::Extent;

    fn preds(iv: &mut Intervals, s: u64, e: u64, node: u32, write: bool) -> Vec<u32> {
        let mut p = Vec::new();
        iv.access(s, e, node, write, &mut p);
        p.sort();
        p.dedup();
        p
    }

    #[test]
    fn reads_wait_for_writers_and_writes_for_readers_and_writers() {
        let mut iv = Intervals::default();
        assert!(preds(&mut iv, 0, 10, 0, true).is_empty());
        assert!(preds(&mut iv, 20, 30, 1, true).is_empty());
        // A read over both writes and the gap between.
        assert_eq!(preds(&mut iv, 5, 25, 2, false), [0, 1]);
        // Another read: readers do not wait for readers.
        assert_eq!(preds(&mut iv, 0, 30, 3, false), [0, 1]);
        // A write over part of it waits for the writer and both readers.
        assert_eq!(preds(&mut iv, 8, 12, 4, true), [0, 2, 3]);
        // Bytes 12..20 were only read (by 2 and 3).
        assert_eq!(preds(&mut iv, 12, 20, 5, true), [2, 3]);
        // Disjoint ranges do not conflict.
        assert!(preds(&mut iv, 100, 200, 6, true).is_empty());
        // After 4 and 5 overwrote 8..20, a read there waits for them only.
        assert_eq!(preds(&mut iv, 9, 19, 7, false), [4, 5]);
        // Bytes 0..8: written by 0, read by 2 (from 5) and 3.
        assert_eq!(preds(&mut iv, 0, 8, 8, true), [0, 2, 3]);
    }

    #[test]
    fn successor_lists_keep_each_nodes_edges_in_order() {
        let edges = [(0, 3), (2, 3), (0, 1), (2, 4), (0, 4), (3, 4)];
        let (first, succ) = successor_lists(5, &edges);
        let g = Graph {
            preds: Vec::new(),
            first,
            succ,
        };
        let lists: Vec<&[u32]> = (0..5).map(|i| g.succs(i)).collect();
        assert_eq!(lists, [&[3, 1, 4][..], &[], &[3, 4], &[4], &[]]);
    }

    #[test]
    fn strided_extents_cover_their_whole_span() {
        let e = Extent {
            pa: 100,
            len: 4,
            rows: 3,
            stride: 10,
        };
        assert_eq!(span(&e), Some((100, 124)));
        assert_eq!(span(&Extent::contiguous(7, 0)), None);
        let huge = Extent {
            pa: u64::MAX - 10,
            len: 4,
            rows: 3,
            stride: 10,
        };
        assert_eq!(span(&huge), None);
    }
}
