//! The tree: reduce up a binary tree to the root, broadcast down it, tile
//! by tile.

use kb_format::Dtype;

use super::{Buf, Channel, Comm};
use crate::kernel::{LoadHandle, Operand, Pending, TensorArg, Tl};
use crate::machine::PeCoord;

/// A tree reduction's running value: the own tile, then a sum (no box per
/// tile).
enum Acc {
    Own(crate::kernel::Tile),
    Sum(Pending),
}

impl Acc {
    fn operand(&self) -> &dyn Operand {
        match self {
            Acc::Own(t) => t,
            Acc::Sum(s) => s,
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
    /// tile: the broadcast of tile t - lag follows the reduction of tile t,
    /// so both directions stream.
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
        let parent = (v > 0).then(|| ((v - 1) / 2, (v - 1) % 2));
        let children: Vec<(usize, usize)> = (0..2)
            .map(|c| (c, 2 * v + 1 + c))
            .filter(|&(_, r)| r < p)
            .collect();
        let dtype = data.dtype;
        // Only the root's data is needed when broadcasting.
        let din = || Buf::whole(data, me);
        let dout = Buf::whole(out, me);
        let (rows, cols) = dout.shape();
        let tile = self.tile_rows(cols, dtype);
        let ntiles = rows.div_ceil(tile);
        let span = |t: u64| (t * tile, tile.min(rows - t * tile));
        let lag = self.depth.saturating_sub(1);
        let down_to: Vec<(usize, PeCoord)> = children.iter().map(|&(c, r)| (c, abs(r))).collect();
        let up = parent.map(|(r, c)| (abs(r), c));
        // Own data, loaded one tile ahead.
        let needs_data = reduce || v == 0;
        let mut next: Option<LoadHandle> = (needs_data && ntiles > 0).then(|| {
            let (r0, n) = span(0);
            tl.load_async(din().block(r0, n))
        });
        let mut bcast = 0u64;
        for t in 0..ntiles {
            let (r0, n) = span(t);
            if needs_data {
                let own = tl.wait(next.take().expect("prefetched"));
                if t + 1 < ntiles {
                    let (r1, n1) = span(t + 1);
                    next = Some(tl.load_async(din().block(r1, n1)));
                }
                // The own tile, then its sums with the children's (each
                // dropped, its TCM freed, as soon as the next is made).
                let mut acc = Acc::Own(own);
                if reduce {
                    for &(c, child) in &down_to {
                        let slot = self.recv(tl, Channel::Up(c), n, cols, dtype);
                        acc = Acc::Sum(tl.add(&slot, acc.operand()));
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
            }
            if let Some(up) = up
                && (t >= lag || !reduce)
            {
                self.tree_down(tl, &dout, &down_to, up, span(bcast), cols, dtype);
                bcast += 1;
            }
        }
        while let Some(up) = up
            && bcast < ntiles
        {
            self.tree_down(tl, &dout, &down_to, up, span(bcast), cols, dtype);
            bcast += 1;
        }
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
