//! The dependency graph of a window: which earlier nodes each node must
//! wait for.
//!
//! Nodes are in effect order; an edge always goes from an earlier node to
//! a later one, so running a node after its predecessors applies every
//! conflicting pair of effects in effect order, and that is all the order
//! the result depends on. Edges:
//!
//! - byte ranges, through an interval index of the window's accesses: a
//!   read waits for the last earlier write of any byte it reads (RAW); a
//!   write waits for the last earlier write (WAW) and every read since
//!   (WAR) of any byte it writes. A strided extent counts as the whole
//!   span from its first to its last byte: a superset, which can only add
//!   edges (less parallelism, never a different result);
//! - an op's write waits for its own read (it writes what the read made);
//! - the record's dependency ids: the op's first node waits for the latest
//!   earlier node of each op it names, when that op has one in the window.
//!
//! Fusion: when nothing between an op's read node and its write node
//! touches the bytes the write covers, applying the write right after the
//! read changes no result. The read node then does both ([`Step::Both`])
//! and the write node becomes an empty [`Step::Fused`] (later accesses of
//! those bytes still wait for it, and it waits for the read node). The
//! read node also waits for every node the write would have waited for:
//! all of them come before the read, so this adds no wait that was not
//! already implied, and no access to the written bytes can run beside it.
//! A fused op holds nothing between its effects, and a GEMM accumulates
//! straight into its output.

use std::collections::BTreeMap;

use kb_format::Extent;
use rustc_hash::FxHashMap;

use super::PendingOp;
use crate::plane::span;

/// What a node applies of its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The read effect: gather, check or compute, hold.
    Read,
    /// The write effect: scatter what the read held.
    Write,
    /// Both, back to back.
    Both,
    /// A write that its op's read node applies (see the module docs).
    Fused,
}

/// One node of a window.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub slot: u32,
    pub step: Step,
}

/// Predecessor counts and successor lists.
#[derive(Debug, Default)]
pub struct Graph {
    pub preds: Vec<u32>,
    pub succs: Vec<Vec<u32>>,
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

    fn extents(&mut self, es: &[Extent], node: u32, write: bool, preds: &mut Vec<u32>) {
        for e in es {
            if let Some((start, end)) = span(e) {
                self.access(start, end, node, write, preds);
            }
        }
    }
}

/// Build the graph of `nodes` (in effect order) over the ops they apply,
/// fusing the read and write nodes of ops where nothing lies between them
/// (their steps in `nodes` change to [`Step::Both`] and [`Step::Fused`]).
pub fn build(nodes: &mut [Node], ops: &[Option<PendingOp>], fuse: bool) -> Graph {
    let n = nodes.len();
    let mut g = Graph {
        preds: vec![0; n],
        succs: vec![Vec::new(); n],
    };
    let mut iv = Intervals::default();
    // Op id -> its latest node so far.
    let mut latest: FxHashMap<u64, u32> = FxHashMap::default();
    let mut preds = Vec::new();
    let mut write_preds = Vec::new();
    for i in 0..n {
        let node = nodes[i];
        let i = i as u32;
        let Some(op) = ops[node.slot as usize].as_ref() else {
            continue;
        };
        let r = &op.rec;
        preds.clear();
        let reads = matches!(node.step, Step::Read | Step::Both);
        let writes = matches!(node.step, Step::Write | Step::Both);
        let own = latest.get(&r.op_id).copied();
        match own {
            // Its own read, earlier in this window.
            Some(own) => preds.push(own),
            // The op's first node here: its explicit dependencies.
            None => preds.extend(r.deps.iter().filter_map(|d| latest.get(d).copied())),
        }
        if reads && let Some(e) = &r.read {
            iv.extents(&e.ranges, i, false, &mut preds);
        }
        if writes && let Some(e) = &r.write {
            write_preds.clear();
            iv.extents(&e.ranges, i, true, &mut write_preds);
            match own {
                // Nothing after its read touched these bytes: fuse.
                Some(own)
                    if fuse
                        && node.step == Step::Write
                        && nodes[own as usize].step == Step::Read
                        && write_preds.iter().all(|&p| p <= own) =>
                {
                    nodes[own as usize].step = Step::Both;
                    nodes[i as usize].step = Step::Fused;
                    write_preds.sort_unstable();
                    write_preds.dedup();
                    // (`own` is among them when the op writes bytes it reads.)
                    for &p in write_preds.iter().filter(|&&p| p != own) {
                        g.succs[p as usize].push(own);
                        g.preds[own as usize] += 1;
                    }
                }
                _ => preds.extend_from_slice(&write_preds),
            }
        }
        latest.insert(r.op_id, i);
        preds.sort_unstable();
        preds.dedup();
        for &p in preds.iter().filter(|&&p| p != i) {
            debug_assert!(p < i, "edges go forward");
            g.succs[p as usize].push(i);
            g.preds[i as usize] += 1;
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn op(id: u64, read: (u64, u64), write: (u64, u64)) -> Option<PendingOp> {
        let effect = |seq, (s, e): (u64, u64)| kb_format::Effect {
            time: 0,
            seq,
            ranges: vec![Extent::contiguous(s, e - s)],
        };
        Some(PendingOp {
            rec: kb_format::Record {
                op_id: id,
                read: Some(effect(0, read)),
                write: Some(effect(1, write)),
                ..Default::default()
            },
            plan: crate::ops::Plan::Move,
            left: 2,
            held: None,
        })
    }

    fn steps(nodes: &[Node]) -> Vec<Step> {
        nodes.iter().map(|n| n.step).collect()
    }

    #[test]
    fn a_write_joins_its_read_when_nothing_between_touches_its_bytes() {
        use Step::*;
        let node = |slot, step| Node { slot, step };
        // Op 0 moves 0..10 to 100..110; op 1 runs between its effects.
        let unrelated = vec![op(0, (0, 10), (100, 110)), op(1, (200, 210), (300, 310))];
        let mut nodes = [node(0, Read), node(1, Both), node(0, Write)];
        let g = build(&mut nodes, &unrelated, true);
        assert_eq!(steps(&nodes), [Both, Both, Fused]);
        // The fused write waits for its read only; nothing waits on op 1.
        assert_eq!(g.preds, [0, 0, 1]);
        assert_eq!(g.succs[0], [2]);
        // Without fusion nothing changes.
        let mut nodes = [node(0, Read), node(1, Both), node(0, Write)];
        build(&mut nodes, &unrelated, false);
        assert_eq!(steps(&nodes), [Read, Both, Write]);
        // Op 1 reads (or writes) bytes op 0 writes: no fusion.
        for between in [op(1, (105, 106), (300, 310)), op(1, (200, 210), (109, 120))] {
            let ops = vec![op(0, (0, 10), (100, 110)), between];
            let mut nodes = [node(0, Read), node(1, Both), node(0, Write)];
            let g = build(&mut nodes, &ops, true);
            assert_eq!(steps(&nodes), [Read, Both, Write]);
            assert_eq!(g.preds, [0, 0, 2]);
        }
        // A writer of those bytes before the read: the fused read waits
        // for it, as the write would have.
        let ops = vec![op(0, (0, 10), (100, 110)), op(1, (200, 210), (100, 104))];
        let mut nodes = [node(1, Both), node(0, Read), node(0, Write)];
        let g = build(&mut nodes, &ops, true);
        assert_eq!(steps(&nodes), [Both, Both, Fused]);
        assert_eq!(g.preds, [0, 1, 1]);
        assert_eq!(g.succs[0], [1]);
        // An op writing bytes it reads fuses too (reading them comes first).
        let ops = vec![op(0, (0, 10), (0, 10)), op(1, (200, 210), (300, 310))];
        let mut nodes = [node(0, Read), node(1, Both), node(0, Write)];
        build(&mut nodes, &ops, true);
        assert_eq!(steps(&nodes), [Both, Both, Fused]);
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
