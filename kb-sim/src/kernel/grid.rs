//! Launch grids: up to three axes of programs (Triton's grid), which
//! program a PE runs next, and `tl.program_id` / `tl.num_programs`.

use std::sync::Arc;

use super::{KernelArgs, KernelBody, KernelFn, Port, Tl};
use crate::alloc::FreeList;
use crate::machine::PeCoord;

/// A launch's grid: programs along axes 0, 1 and 2, as Triton's `grid`.
/// A 1-D grid is `[n, 1, 1]`, a 2-D one `[x, y, 1]`; `launch_grid` takes
/// any of `n`, `[x, y]` and `[x, y, z]` through `Into<Grid>`. Programs are
/// numbered with axis 0 fastest: program `k = i0 + i1*x + i2*x*y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grid {
    axes: [u32; 3],
}

impl Grid {
    /// A grid of `x x y x z` programs.
    pub fn new(x: u32, y: u32, z: u32) -> Self {
        Grid { axes: [x, y, z] }
    }

    /// Programs along axes 0, 1 and 2.
    pub fn axes(self) -> [u32; 3] {
        self.axes
    }

    /// Programs in the grid (the product of its axes), `None` when it
    /// does not fit in a u64.
    pub fn programs(self) -> Option<u64> {
        kb_format::launch::grid_programs(self.axes)
    }

    /// The axis that has no programs, if any.
    pub fn empty_axis(self) -> Option<usize> {
        self.axes.iter().position(|&n| n == 0)
    }

    /// The (i0, i1, i2) of linear program `k` (axis 0 fastest).
    pub fn program_id(self, k: u64) -> [u32; 3] {
        let [x, y, _] = self.axes.map(|n| n.max(1) as u64);
        let rest = k / x;
        [(k % x) as u32, (rest % y) as u32, (rest / y) as u32]
    }
}

impl From<u32> for Grid {
    /// A 1-D grid of `n` programs.
    fn from(n: u32) -> Self {
        Grid::new(n, 1, 1)
    }
}

impl From<[u32; 2]> for Grid {
    /// A 2-D grid (`[n, 1]` is 1-D).
    fn from([x, y]: [u32; 2]) -> Self {
        Grid::new(x, y, 1)
    }
}

impl From<[u32; 3]> for Grid {
    fn from([x, y, z]: [u32; 3]) -> Self {
        Grid::new(x, y, z)
    }
}

impl std::fmt::Display for Grid {
    /// `x x y`, or `x x y x z` when axis 2 has more than one program (as
    /// kb-inspect shows launches).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&kb_format::launch::grid_label(self.axes))
    }
}

impl Tl<'_> {
    /// This program's index along `axis` (0, 1 or 2) of the launch's
    /// grid, as Triton's `tl.program_id(axis)`.
    #[track_caller]
    pub fn program_id(&self, axis: usize) -> u32 {
        self.check_axis("program_id", axis);
        self.program_id[axis]
    }

    /// Programs along `axis` (0, 1 or 2) of the launch's grid, as
    /// Triton's `tl.num_programs(axis)`.
    #[track_caller]
    pub fn num_programs(&self, axis: usize) -> u32 {
        self.check_axis("num_programs", axis);
        self.grid.axes()[axis]
    }

    #[track_caller]
    fn check_axis(&self, op: &str, axis: usize) {
        if axis >= 3 {
            self.fail(op, format!("axis {axis} (a grid has axes 0, 1 and 2)"));
        }
    }
}

/// Build the body that runs program `program_id` of a 1-D grid of
/// `num_programs` on `pe` with a TCM allocator.
pub fn body(
    kernel: KernelFn,
    args: Arc<KernelArgs>,
    pe: PeCoord,
    program_id: u32,
    num_programs: u32,
    tcm: FreeList,
) -> KernelBody {
    Box::new(move |port: &mut dyn Port| {
        let mut tl = Tl::new(port, pe, [program_id, 0, 0], num_programs.into(), tcm);
        tl.args = Some(args.clone());
        kernel(&mut tl, &args);
        tl.wait_all();
    })
}

/// Build the body that runs, on `pes[slot]` (a launch on `pes`), the
/// programs of `grid` dealt to it: linear program
/// k = i0 + i1 * x + i2 * x * y runs on slot k mod pes, in increasing k.
/// Each program sees its own (i0, i1, i2); tiles it leaves are dropped
/// before the next starts.
pub fn grid_body(
    kernel: KernelFn,
    args: Arc<KernelArgs>,
    pes: Arc<[PeCoord]>,
    slot: u32,
    grid: Grid,
    tcm: FreeList,
) -> KernelBody {
    Box::new(move |port: &mut dyn Port| {
        let pe = pes[slot as usize];
        let n = (pes.len() as u64).max(1);
        let mut tl = Tl::new(port, pe, [0, 0, 0], grid, tcm);
        tl.pes = pes;
        tl.args = Some(args.clone());
        // `launch_grid` refuses a grid whose programs overflow a u64.
        let total = grid.programs().unwrap_or(u64::MAX);
        let mut k = slot as u64;
        while k < total {
            tl.program_id = grid.program_id(k);
            kernel(&mut tl, &args);
            let Some(next) = k.checked_add(n) else { break };
            k = next;
        }
        tl.wait_all();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_numbered_axis_0_fastest() {
        let g = Grid::new(4, 2, 3);
        assert_eq!(g.programs(), Some(24));
        assert_eq!(g.program_id(0), [0, 0, 0]);
        assert_eq!(g.program_id(3), [3, 0, 0]);
        assert_eq!(g.program_id(4), [0, 1, 0]);
        assert_eq!(g.program_id(7), [3, 1, 0]);
        assert_eq!(g.program_id(8), [0, 0, 1]);
        // 23 = 3 + 1*4 + 2*8
        assert_eq!(g.program_id(23), [3, 1, 2]);
        // Every program once.
        let mut seen: Vec<[u32; 3]> = (0..24).map(|k| g.program_id(k)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 24);
    }

    #[test]
    fn a_2d_grid_numbers_its_programs_as_before() {
        let g = Grid::from([5, 3]);
        for k in 0..15u64 {
            assert_eq!(g.program_id(k), [(k % 5) as u32, (k / 5) as u32, 0]);
        }
    }

    #[test]
    fn grids_from_one_two_and_three_axes() {
        assert_eq!(Grid::from(7).axes(), [7, 1, 1]);
        assert_eq!(Grid::from([7, 2]).axes(), [7, 2, 1]);
        assert_eq!(Grid::from([7, 2, 3]).axes(), [7, 2, 3]);
        assert_eq!(Grid::from([7, 2]).to_string(), "7 x 2");
        assert_eq!(Grid::from([7, 2, 3]).to_string(), "7 x 2 x 3");
        assert_eq!(Grid::from([7, 0, 3]).empty_axis(), Some(1));
        assert_eq!(Grid::from([7, 2, 3]).empty_axis(), None);
        assert_eq!(Grid::from([u32::MAX, u32::MAX, 2]).programs(), None);
    }
}
