//! The hierarchical all-reduce, for groups that span cubes: direct
//! reduce-scatter inside each cube (member `i` of a cube holds the cube's
//! sum of chunk `i`), a ring all-reduce of chunk `i` across the cubes
//! among their members `i` (so each cube link and SIP link carries each
//! chunk's ring once, every cube rank's ring at once), then direct
//! all-gather inside each cube. Rings of odd cube ranks run the other way
//! round, so both directions of every link between cubes carry data.

use super::direct::Steps;
use super::{Buf, Comm, chunk};
use crate::kernel::{Group, Tl};
use crate::machine::PeCoord;

/// The cubes of `group` in order of first appearance, each with its
/// members in group order.
fn cubes(group: &[PeCoord]) -> Vec<Vec<PeCoord>> {
    // Each cube's index by a map: a scan of the cubes per member was
    // O(PEs x cubes) for each member that calls this.
    let mut cubes: Vec<Vec<PeCoord>> = Vec::new();
    let mut index = rustc_hash::FxHashMap::default();
    for &p in group {
        let i = *index.entry((p.sip, p.cube)).or_insert_with(|| {
            cubes.push(Vec::new());
            cubes.len() - 1
        });
        cubes[i].push(p);
    }
    cubes
}

/// The number of members every cube of `group` has, if they all have the
/// same.
pub(super) fn cube_sizes(group: &[PeCoord]) -> Option<usize> {
    let cubes = cubes(group);
    let n = cubes.first()?.len();
    cubes.iter().all(|c| c.len() == n).then_some(n)
}

impl Comm<'_> {
    /// `dout = sum over members of din` (each member's rows), through the
    /// cubes' direct steps and a ring across cubes per cube rank.
    pub(super) fn hierarchical(&mut self, tl: &mut Tl<'_>, din: Buf<'_>, dout: Buf<'_>) {
        let me = tl.pe();
        let all = cubes(self.group.pes());
        let n = all[0].len();
        assert!(
            all.iter().all(|c| c.len() == n),
            "collective: the hierarchical all-reduce needs the same number of members in every cube of the group"
        );
        let mine = all
            .iter()
            .position(|c| (c[0].sip, c[0].cube) == (me.sip, me.cube))
            .expect("a member is in one of the group's cubes");
        let i = all[mine]
            .iter()
            .position(|&p| p == me)
            .expect("found above");
        let cube = Group::new(&all[mine]);
        let mut across: Vec<PeCoord> = all.iter().map(|c| c[i]).collect();
        if i % 2 == 1 {
            across.reverse();
        }
        let rank = across.iter().position(|&p| p == me).expect("built above");
        let (a, b) = chunk(din.shape().0, i, n);
        let part = dout.sub(a, b - a);
        let reduce = Steps {
            reduce: true,
            gather: false,
            handshake: true,
        };
        self.direct(tl, &cube, i, din, part, reduce);
        self.ring(tl, &Group::new(&across), rank, part, part, true, true);
        // The cube's members wrote only their own chunks of their outputs
        // since their handshake above: no second one.
        let gather = Steps {
            reduce: false,
            gather: true,
            handshake: false,
        };
        self.direct(tl, &cube, i, part, dout, gather);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cubes come in order of their first member, each with its members in
    /// group order; sizes are reported only when every cube has as many.
    #[test]
    fn cubes_in_order_of_first_appearance() {
        let pe = |sip, cube, pe| PeCoord { sip, cube, pe };
        let group = [
            pe(1, 0, 0),
            pe(0, 2, 1),
            pe(1, 0, 3),
            pe(0, 2, 0),
            pe(0, 0, 5),
        ];
        assert_eq!(
            cubes(&group),
            vec![
                vec![pe(1, 0, 0), pe(1, 0, 3)],
                vec![pe(0, 2, 1), pe(0, 2, 0)],
                vec![pe(0, 0, 5)],
            ]
        );
        assert_eq!(cube_sizes(&group), None);
        assert_eq!(cube_sizes(&group[..4]), Some(2));
        assert_eq!(cube_sizes(&[]), None);
    }
}
