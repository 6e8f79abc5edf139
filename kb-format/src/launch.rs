//! Kernel launches of a run: what ran where and when (the launches chunk).

use serde::{Deserialize, Serialize};

use crate::types::Ps;

/// One kernel launch of a host program: the kernel, its grid, the PEs it
/// ran on and when. Written in the launches chunk, in launch order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: String,
    /// Programs along axes 0, 1 and 2 (`[n, 1, 1]` for a 1-D grid,
    /// `[x, y, 1]` for a 2-D one). Encoded as two varints, axis 0 and
    /// `y | z << 32` with `z` written as 0 when it is 1 (see
    /// [`grid_wire`]): a grid with one program along axis 2 has the
    /// bytes of the 2-D `[u32; 2]` of format 3.4's first readers.
    #[serde(with = "grid_wire")]
    pub grid: [u32; 3],
    /// The PEs it ran on, as (sip, cube, pe), in program-assignment order.
    pub pes: Vec<[u32; 3]>,
    /// When its kernels started (the launch barrier's time).
    pub t_start: Ps,
    /// When its last kernel finished (every transfer it issued included).
    pub t_end: Ps,
    /// FLOPs its compute ops executed ([`crate::Params::flops`] summed).
    pub flops: u64,
    /// The part of `flops` spent on data rather than padding: the lanes a
    /// masked edge tile fills, the fill itself and what is computed from
    /// them do not count. At most `flops`.
    pub useful_flops: u64,
}

impl Launch {
    /// The grid as people read it: `4 x 2` for a 1-D or 2-D grid (axis 2
    /// of one program), `4 x 2 x 3` when axis 2 has more.
    pub fn grid_label(&self) -> String {
        grid_label(self.grid)
    }

    /// Programs in the grid (the product of its axes), `None` when it
    /// does not fit in a u64.
    pub fn programs(&self) -> Option<u64> {
        grid_programs(self.grid)
    }
}

/// `grid` as people read it: `x x y`, or `x x y x z` when `z > 1`.
pub fn grid_label(grid: [u32; 3]) -> String {
    let [x, y, z] = grid;
    if z == 1 {
        format!("{x} x {y}")
    } else {
        format!("{x} x {y} x {z}")
    }
}

/// The product of `grid`'s axes, `None` when it overflows a u64.
pub fn grid_programs(grid: [u32; 3]) -> Option<u64> {
    (grid[0] as u64)
        .checked_mul(grid[1] as u64)?
        .checked_mul(grid[2] as u64)
}

/// The grid's encoding in the launches chunk: a 2-tuple of varints, axis 0
/// as a u32 and `y | z << 32` as a u64, `z` written as 0 when it is 1.
///
/// Postcard writes a u64 below 2^32 with the bytes of the same u32, so a
/// grid with `z = 1` is byte for byte the `[u32; 2]` that format 3.4
/// wrote before axis 2 existed, and every existing trace reads as before.
/// A reader from before axis 2 decodes the second varint as a u32 and
/// refuses one of `2^32` or more (postcard's "varint that didn't
/// terminate"), so it cannot misread a 3-D grid as a 2-D one. Reading is
/// total: a high half of 0 or 1 is `z = 1`, anything else is `z`; zero
/// axes and grids too large to count are the reader's checks.
pub mod grid_wire {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;
    use serde::{Deserializer, Serializer};

    /// The two wire values of `grid`.
    pub fn pack(grid: [u32; 3]) -> (u32, u64) {
        let [x, y, z] = grid;
        let hi = if z == 1 { 0 } else { z as u64 };
        (x, y as u64 | hi << 32)
    }

    /// The grid of two wire values.
    pub fn unpack(x: u32, yz: u64) -> [u32; 3] {
        let (y, hi) = (yz as u32, (yz >> 32) as u32);
        [x, y, hi.max(1)]
    }

    /// Serialize `grid` as [`pack`] gives it.
    pub fn serialize<S: Serializer>(grid: &[u32; 3], s: S) -> Result<S::Ok, S::Error> {
        let (x, yz) = pack(*grid);
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&x)?;
        t.serialize_element(&yz)?;
        t.end()
    }

    /// Deserialize a grid written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u32; 3], D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = [u32; 3];
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a grid (axis 0, then axes 1 and 2)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u32; 3], A::Error> {
                let x: u32 = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let yz: u64 = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                Ok(unpack(x, yz))
            }
        }
        d.deserialize_tuple(2, V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(grid: [u32; 3]) -> Launch {
        Launch {
            kernel: "k".into(),
            grid,
            pes: vec![[0, 0, 0]],
            t_start: 1,
            t_end: 2,
            flops: 3,
            useful_flops: 3,
        }
    }

    /// The bytes of the launch as format 3.4 wrote it before axis 2: the
    /// grid a `[u32; 2]`.
    fn two_d_bytes(l: &Launch) -> Vec<u8> {
        #[derive(Serialize)]
        struct Old<'a> {
            kernel: &'a str,
            grid: [u32; 2],
            pes: &'a [[u32; 3]],
            t_start: Ps,
            t_end: Ps,
            flops: u64,
            useful_flops: u64,
        }
        postcard::to_stdvec(&Old {
            kernel: &l.kernel,
            grid: [l.grid[0], l.grid[1]],
            pes: &l.pes,
            t_start: l.t_start,
            t_end: l.t_end,
            flops: l.flops,
            useful_flops: l.useful_flops,
        })
        .unwrap()
    }

    #[test]
    fn a_grid_with_one_program_along_axis_2_has_the_2d_bytes() {
        for grid in [[1, 1, 1], [4, 2, 1], [u32::MAX, u32::MAX, 1], [127, 128, 1]] {
            let l = launch(grid);
            let b = postcard::to_stdvec(&l).unwrap();
            assert_eq!(b, two_d_bytes(&l), "{grid:?}");
            assert_eq!(postcard::from_bytes::<Launch>(&b).unwrap(), l);
        }
        // Hand-encoded: "k", then 4 and 2 as one-byte varints.
        let b = postcard::to_stdvec(&launch([4, 2, 1])).unwrap();
        assert_eq!(&b[..4], [1, b'k', 4, 2]);
    }

    #[test]
    fn a_3d_grid_round_trips_and_an_old_reader_refuses_it() {
        for grid in [
            [4, 2, 3],
            [1, 1, 2],
            [u32::MAX, u32::MAX, u32::MAX],
            [5, 0, 7],
        ] {
            let l = launch(grid);
            let b = postcard::to_stdvec(&l).unwrap();
            assert_eq!(postcard::from_bytes::<Launch>(&b).unwrap(), l, "{grid:?}");
            // A reader whose grid is a [u32; 2] stops at the second axis.
            #[derive(Debug, Deserialize)]
            #[allow(dead_code)]
            struct Old {
                kernel: String,
                grid: [u32; 2],
            }
            let e = postcard::from_bytes::<Old>(&b).unwrap_err();
            assert_eq!(e, postcard::Error::DeserializeBadVarint, "{grid:?}");
        }
        // y = 2, z = 3: 2 + 3 * 2^32 as a varint.
        assert_eq!(grid_wire::pack([4, 2, 3]), (4, 2 + (3 << 32)));
    }

    #[test]
    fn reading_is_total() {
        assert_eq!(grid_wire::unpack(4, 2 | 1 << 32), [4, 2, 1]);
        assert_eq!(grid_wire::unpack(4, 2), [4, 2, 1]);
        assert_eq!(grid_wire::unpack(4, u64::MAX), [4, u32::MAX, u32::MAX]);
    }

    #[test]
    fn labels_and_program_counts() {
        assert_eq!(launch([4, 2, 1]).grid_label(), "4 x 2");
        assert_eq!(launch([4, 2, 3]).grid_label(), "4 x 2 x 3");
        assert_eq!(launch([4, 2, 3]).programs(), Some(24));
        assert_eq!(
            launch([u32::MAX, u32::MAX, 1]).programs(),
            Some(0xffff_fffe_0000_0001)
        );
        assert_eq!(launch([u32::MAX, 2, 3]).programs(), Some(0x5_ffff_fffa));
        // (2^32 - 1)^2 * 2 is above 2^64.
        assert_eq!(launch([u32::MAX, u32::MAX, 2]).programs(), None);
    }
}
