//! K-chains: GEMMs accumulating into one output tile, planned as one
//! node (see [`super::super`]'s module docs, "K-chains").

use std::sync::Arc;

use kb_format::Extent;
use rustc_hash::FxHashMap;

use super::{Action, Dense, Pass};
use crate::engine::PendingOp;
use crate::plane::lazy::overlaps;
use crate::plane::mem_key;

/// A K-chain of GEMMs planned as one node: each link is the compute a
/// GEMM's node would have been (its operands' physical bytes, decoded
/// operands, the shared output `dst`), run in order, each by the same
/// backend call as alone, so the bits are those of the GEMMs run one by
/// one. The node stands where the first GEMM's did; a GEMM joins only when
/// running it there changes nothing (see `Pass::chain_to_join`).
#[derive(Debug)]
pub(crate) struct Chain {
    pub dst: Vec<Extent>,
    pub links: Vec<Link>,
    /// Every link's reads, one link's after another's (the node's
    /// accesses; each link's are a run of them, see [`Chain::reads_of`]).
    pub reads: Vec<Extent>,
}

impl Chain {
    /// The physical extents `link` reads (in operand order).
    pub fn reads_of(&self, link: &Link) -> &[Extent] {
        &self.reads[link.reads.start as usize..link.reads.end as usize]
    }
}

/// One GEMM of a [`Chain`]: its record, where its reads lie in the
/// chain's [`Chain::reads`] (a run, not a vector of its own: a GEMM
/// joining a chain allocates nothing), its decoded operands.
#[derive(Debug)]
pub(crate) struct Link {
    pub op: Arc<PendingOp>,
    pub reads: std::ops::Range<u32>,
    pub dense: [Option<Dense>; 2],
}

/// A K-chain ([`Chain`]) more GEMMs may join: its node, its output, and
/// where the window's log of physical writes stood at its first GEMM and
/// at its last. It closes (leaves [`Planner::chains`]) when a node reads
/// its output: a later GEMM run at the chain's node would then change
/// bytes that node reads too early.
#[derive(Debug)]
pub(super) struct OpenChain {
    node: usize,
    dst: Extent,
    /// Physical writes planned before the chain's node ran (its first
    /// GEMM's own write included) and before its last GEMM's write.
    writes_first: usize,
    writes_last: usize,
    /// Its GEMMs' op ids.
    members: Vec<u64>,
}

/// Links a new chain has room for (a 64x64 tile's chain within one window
/// on gemm_tiled 2048^3 has about 15).
const CHAIN_ROOM: usize = 16;

/// Close the open chains whose output `reads` touch.
pub(super) fn close_chains_read(chains: &mut FxHashMap<u64, Vec<OpenChain>>, reads: &[Extent]) {
    if chains.is_empty() {
        return;
    }
    for e in reads {
        if let Some(open) = chains.get_mut(&mem_key(e.pa)) {
            open.retain(|c| !overlaps(&c.dst, e));
        }
    }
}

impl Pass<'_, '_> {
    /// The open chain (its index in `chains[key]`, `key`) that the GEMM
    /// in `slot`, reading `reads` and writing `dst` (its effects planned
    /// together), may join, before its write is planned. Running it at the
    /// chain's node, right after the chain's GEMMs, is what running it
    /// here does when, since that node:
    ///
    /// - nothing wrote the bytes it reads, but the chain's output (which
    ///   only the chain's GEMMs wrote: nothing else did since its last);
    /// - nothing read the output (the chain would be closed);
    /// - its data dependencies are the chain's GEMMs (no node between
    ///   must come first).
    ///
    /// Its write is then the chain's, and whatever the window does after
    /// the chain's node and before this GEMM neither reads nor writes what
    /// it touches (the output: not read, written only by the chain; its
    /// operands: not written), so moving it there changes no byte anyone
    /// reads. [`Pass::still_joins`] checks what planning its write did.
    pub(super) fn chain_to_join(
        &self,
        slot: u32,
        reads: &[Extent],
        dst: &[Extent],
    ) -> Option<(u64, usize)> {
        let [d] = dst else { return None };
        let key = mem_key(d.pa);
        let open = self.pl.chains.get(&key)?;
        let at = open.iter().position(|c| c.dst == *d)?;
        let c = &open[at];
        let r = &self.op(slot).rec;
        let deps_in = r
            .deps
            .iter()
            .filter(|x| x.kind == kb_format::DepKind::Data)
            .all(|x| c.members.contains(&x.op));
        if !deps_in || self.pl.written_since(c.writes_last, dst) {
            return None;
        }
        for e in reads {
            if e == d {
                continue;
            }
            if overlaps(e, d)
                || self
                    .pl
                    .written_since(c.writes_first, std::slice::from_ref(e))
            {
                return None;
            }
        }
        Some((key, at))
    }

    /// Whether the GEMM may still join the chain `at` once its write is
    /// planned (from the write count `before`): only when that write
    /// logged nothing but itself, so it materialized no alias (whose copy
    /// might read the output or write the GEMM's operands).
    pub(super) fn still_joins(
        &self,
        (key, at): (u64, usize),
        before: usize,
        dst: &[Extent],
    ) -> bool {
        self.pl.write_count == before + 1
            && self
                .pl
                .chains
                .get(&key)
                .and_then(|o| o.get(at))
                .is_some_and(|c| [c.dst] == dst)
    }

    /// Make the GEMM in `slot`, reading `reads` (a scratch buffer: the
    /// chain keeps a copy), the last link of the open chain `at`.
    pub(super) fn join_chain(
        &mut self,
        slot: u32,
        (key, at): (u64, usize),
        reads: &[Extent],
        dense: [Option<Dense>; 2],
    ) {
        let op = self.op_arc(slot);
        let write_count = self.pl.write_count;
        let c = &mut self.pl.chains.get_mut(&key).expect("open")[at];
        c.writes_last = write_count;
        c.members.push(op.rec.op_id);
        let node = &mut self.nodes[c.node];
        if let Action::Compute { .. } = node.action {
            let Action::Compute {
                reads: mut first,
                dst: Some(dst),
                dense,
            } = std::mem::replace(&mut node.action, Action::None)
            else {
                unreachable!("a chain's first node computes into its output");
            };
            let n = first.len() as u32;
            // Room for a typical chain (they grow a link at a time).
            first.reserve(first.len() * (CHAIN_ROOM - 1));
            let mut links = Vec::with_capacity(CHAIN_ROOM);
            links.push(Link {
                op: node.op.clone(),
                reads: 0..n,
                dense,
            });
            node.action = Action::Chain(Box::new(Chain {
                dst,
                links,
                reads: first,
            }));
        }
        let Action::Chain(ch) = &mut node.action else {
            unreachable!("a chain");
        };
        let from = ch.reads.len() as u32;
        ch.reads.extend_from_slice(reads);
        ch.links.push(Link {
            op,
            reads: from..ch.reads.len() as u32,
            dense,
        });
        self.stats.gemms_fused += 1;
    }

    /// Open a chain at node `i`, the GEMM in `slot` computing into its
    /// output (one extent), whose write was the last planned.
    pub(super) fn open_chain(&mut self, slot: u32, i: usize) {
        let Action::Compute { dst: Some(dst), .. } = &self.nodes[i].action else {
            return;
        };
        let [d] = dst[..] else { return };
        let id = self.op(slot).rec.op_id;
        let open = self.pl.chains.entry(mem_key(d.pa)).or_default();
        open.retain(|c| !overlaps(&c.dst, &d));
        open.push(OpenChain {
            node: i,
            dst: d,
            writes_first: self.pl.write_count,
            writes_last: self.pl.write_count,
            members: vec![id],
        });
    }
}
