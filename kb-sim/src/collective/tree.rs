//! The tree: reduce up a binary tree to the root, broadcast down it, tile
//! by tile. The tree follows the members' order, which for the groups of
//! `Group` is the machine's (SIP, cube, PE): each subtree is a contiguous
//! range of members (its root first, then two halves), so only the top
//! levels cross SIPs and cubes and the rest stay inside one. A node does
//! whatever is ready, reducing the next tile or passing the next
//! broadcast tile down, so both directions stream at once.

use kb_format::Dtype;

use super::{Buf, Channel, Comm, Partial};
use crate::kernel::{LoadHandle, TensorArg, Tl};
use crate::machine::PeCoord;

/// A tree member's parent (and which child of it the member is), and its
/// children (child index, member).
type Place = (Option<(usize, usize)>, Vec<(usize, usize)>);

/// Member `v`'s place in the tree over `0..p` built by halving: the range
/// `[lo, hi)` is a subtree rooted at `lo`, its children the first members
/// of `[lo + 1, mid)` and `[mid, hi)`. Returns `v`'s parent (and which
/// child of it `v` is) and `v`'s children (child index, member).
pub(super) fn halving(v: usize, p: usize) -> Place {
    let (mut lo, mut hi) = (0, p);
    let mut parent = None;
    loop {
        let rest = lo + 1;
        let mid = rest + (hi - rest).div_ceil(2);
        if v == lo {
            let children = [(0, rest, mid), (1, mid, hi)]
                .into_iter()
                .filter(|&(_, a, b)| a < b)
                .map(|(c, a, _)| (c, a))
                .collect();
            return (parent, children);
        }
        if v < mid {
            parent = Some((lo, 0));
            (lo, hi) = (rest, mid);
        } else {
            parent = Some((lo, 1));
            lo = mid;
        }
    }
}

impl Comm<'_> {
    pub(super) fn tree(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        reduce: bool,
    ) {
        self.tree_with_root(tl, data, out, reduce, 0)
    }

    /// Tree reduce to `root` (if `reduce`) and broadcast from it, tile by
    /// tile, doing whichever is ready: the next tile's reduction (the own
    /// tile loaded ahead, every child's part arrived, room at the parent)
    /// or the next broadcast tile (arrived from the parent, room at every
    /// child).
    pub(super) fn tree_with_root(
        &mut self,
        tl: &mut Tl<'_>,
        data: &TensorArg,
        out: &TensorArg,
        reduce: bool,
        root: usize,
    ) {
        let (p, me) = (self.size(), tl.pe());
        // Ranks relative to the root: the root is 0.
        let v = (self.rank + p - root) % p;
        let abs = |rel: usize| self.group.pes()[(rel + root) % p];
        let (parent, children) = halving(v, p);
        let dtype = data.dtype;
        // Only the root's data is needed when broadcasting.
        let din = || Buf::whole(data, me);
        let dout = Buf::whole(out, me);
        let (rows, cols) = dout.shape();
        let tile = self.tile_rows(cols, dtype);
        let ntiles = rows.div_ceil(tile);
        let span = |t: u64| (t * tile, tile.min(rows - t * tile));
        let down_to: Vec<(usize, PeCoord)> = children.iter().map(|&(c, r)| (c, abs(r))).collect();
        let up = parent.map(|(r, c)| (abs(r), c));
        // The reduction (or, broadcasting, the root's sends) runs over
        // the own data, loaded two tiles ahead.
        let needs_data = reduce || v == 0;
        let ups = if needs_data { ntiles } else { 0 };
        let downs = if up.is_some() { ntiles } else { 0 };
        let mut loads: std::collections::VecDeque<LoadHandle> = (0..ups.min(2))
            .map(|t| {
                let (r0, n) = span(t);
                tl.load_async(din().block(r0, n))
            })
            .collect();
        let (mut next_up, mut next_down) = (0u64, 0u64);
        while next_up < ups || next_down < downs {
            let mut progressed = false;
            // Where the reduced tile goes: up, or (the root) down.
            let outgoing: Vec<Channel> = match up {
                Some((_, c)) if reduce => vec![Channel::Up(c)],
                _ => down_to.iter().map(|&(c, _)| Channel::Down(c)).collect(),
            };
            if next_up < ups
                && (!reduce
                    || down_to
                        .iter()
                        .all(|&(c, _)| self.arrived(tl, Channel::Up(c))))
                && outgoing.iter().all(|&ch| self.slot_free(tl, ch))
            {
                let (r0, n) = span(next_up);
                let own = tl.wait(loads.pop_front().expect("loaded ahead"));
                if next_up + 2 < ups {
                    let (r2, n2) = span(next_up + 2);
                    loads.push_back(tl.load_async(din().block(r2, n2)));
                }
                // The own tile, then its sums with the children's (each
                // dropped, its TCM freed, as soon as the next is made).
                let mut acc = Partial::Tile(own);
                if reduce {
                    for &(c, child) in &down_to {
                        let slot = self.recv(tl, Channel::Up(c), n, cols, dtype);
                        acc = Partial::Sum(tl.add(&slot, acc.operand()));
                        self.consumed(tl, Channel::Up(c), child);
                    }
                }
                let acc = acc.operand();
                match up {
                    Some((to, c)) if reduce => self.send(tl, acc, Channel::Up(c), to),
                    _ => {
                        // The root: the result, stored and sent down.
                        tl.store(dout.block(r0, n), acc);
                        for &(c, child) in &down_to {
                            self.send(tl, acc, Channel::Down(c), child);
                        }
                    }
                }
                next_up += 1;
                progressed = true;
            }
            if let Some(up) = up
                && next_down < downs
                && self.arrived(tl, Channel::Down(up.1))
                && down_to
                    .iter()
                    .all(|&(c, _)| self.slot_free(tl, Channel::Down(c)))
            {
                self.tree_down(tl, &dout, &down_to, up, span(next_down), cols, dtype);
                next_down += 1;
                progressed = true;
            }
            if !progressed {
                // Nothing is ready: hand back credits, then wait for a
                // part, a broadcast tile or room.
                self.flush_all(tl);
                // Only what is missing now: a condition already met would
                // end the wait at once.
                let mut any: Vec<(u32, u64)> = Vec::new();
                let need = |comm: &mut Self,
                            tl: &mut Tl<'_>,
                            any: &mut Vec<(u32, u64)>,
                            ch: Channel,
                            incoming: bool| {
                    if incoming && !comm.arrived(tl, ch) {
                        let r = comm.region(ch);
                        any.push((comm.filled(r), comm.received[r] + 1));
                    } else if !incoming && !comm.slot_free(tl, ch) {
                        any.push(comm.room_signal(ch));
                    }
                };
                // A path with nothing missing any more became ready while
                // the credits went back: look again instead of waiting
                // for the other path (which may wait for this one).
                let mut ready = false;
                if next_up < ups {
                    let before = any.len();
                    for &(c, _) in down_to.iter().filter(|_| reduce) {
                        need(self, tl, &mut any, Channel::Up(c), true);
                    }
                    for &ch in &outgoing {
                        need(self, tl, &mut any, ch, false);
                    }
                    ready |= any.len() == before;
                }
                if let Some(up) = up
                    && next_down < downs
                {
                    let before = any.len();
                    need(self, tl, &mut any, Channel::Down(up.1), true);
                    for &(c, _) in &down_to {
                        need(self, tl, &mut any, Channel::Down(c), false);
                    }
                    ready |= any.len() == before;
                }
                if !ready && !any.is_empty() {
                    tl.wait_any(&any);
                }
            }
        }
    }

    /// The credit that frees the next slot on `ch`, as a `(signal, value)`
    /// to wait for.
    fn room_signal(&self, ch: Channel) -> (u32, u64) {
        let m = self.sent[ch.link()];
        (self.credit(ch.link()), (m + 1).saturating_sub(self.depth))
    }

    /// Receive the next broadcast tile (rows `r0..r0+n` of `dout`) from the
    /// parent `up` (this node is its child `up.1`), store it, forward it to
    /// the children.
    #[allow(clippy::too_many_arguments)]
    fn tree_down(
        &mut self,
        tl: &mut Tl<'_>,
        dout: &Buf<'_>,
        down_to: &[(usize, PeCoord)],
        up: (PeCoord, usize),
        (r0, n): (u64, u64),
        cols: u64,
        dtype: Dtype,
    ) {
        let from_parent = Channel::Down(up.1);
        let slot = self.recv(tl, from_parent, n, cols, dtype);
        tl.store(dout.block(r0, n), &slot);
        for &(c, child) in down_to {
            self.send(tl, &slot, Channel::Down(c), child);
        }
        self.consumed(tl, from_parent, up.0);
    }
}

#[cfg(test)]
mod tests {
    use super::halving;

    /// Every member but the root has one parent, which lists it as the
    /// child it says it is; subtrees are contiguous ranges; the depth is
    /// about log2(p).
    #[test]
    fn halving_builds_one_tree_of_contiguous_subtrees() {
        for p in 1..=300usize {
            let mut parent_of = vec![None; p];
            let mut depth = vec![0usize; p];
            for v in 0..p {
                let (parent, children) = halving(v, p);
                assert_eq!(parent.is_none(), v == 0, "p={p} v={v}");
                assert!(children.len() <= 2);
                for &(c, child) in &children {
                    assert!(child > v && child < p, "p={p} v={v} child={child}");
                    assert_eq!(halving(child, p).0, Some((v, c)), "p={p} v={v}");
                    parent_of[child] = Some(v);
                }
            }
            for v in 1..p {
                let up = parent_of[v].unwrap_or_else(|| panic!("p={p}: {v} has no parent"));
                depth[v] = depth[up] + 1;
                assert!(up < v);
            }
            let max = depth.iter().copied().max().unwrap_or(0);
            assert!(
                max <= (usize::BITS - p.leading_zeros()) as usize,
                "p={p} depth {max}"
            );
            // A subtree is the range from its root to before the next
            // member outside it: every member's ancestors are below it.
            for v in 1..p {
                let up = parent_of[v].unwrap();
                assert!((up..v).all(|u| u == up || parent_of[u].is_some_and(|q| q >= up)));
            }
        }
    }

    /// On 4 SIPs of 64 members, in the machine's order, few edges cross a
    /// SIP: 7 of 255, where a heap by rank (children 2v+1 and 2v+2)
    /// crosses on most.
    #[test]
    fn halving_keeps_most_edges_inside_a_sip() {
        let crossing = (1..256usize)
            .filter(|&v| {
                let (parent, _) = halving(v, 256);
                parent.unwrap().0 / 64 != v / 64
            })
            .count();
        let heap = (1..256usize)
            .filter(|&v| (v - 1) / 2 / 64 != v / 64)
            .count();
        assert_eq!(crossing, 7);
        assert!(heap > 150, "{heap}");
    }
}
