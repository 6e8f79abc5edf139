//! The `tl` atomics (Triton's `tl.atomic_add/max/min/xchg/cas/and/or/xor`):
//! an element-wise read-modify-write of a block of a tensor in HBM or
//! SRAM, performed at the memory (docs/ARCHITECTURE.md, "Atomics"), that
//! returns the old values in a new TCM tile.
//!
//! Phase 1 applies each atomic when its memory writes (the simulated
//! order, the one replay follows): a later load sees it, and the old
//! values are real data, unless an operand was a compute result (a
//! [`Pending`], e.g. a `dot`'s partial sum): then the block's new values
//! exist only in Phase 2, and so do the old values later atomics return.

use super::*;
use kb_format::{AtomicOp, AtomicParams, AtomicValues};

impl<'p> Tl<'p> {
    /// `tl.atomic_add(target, values, mask)`: add `values` (a tile of the
    /// block's shape and dtype, or a scalar) to each element of `target`
    /// where `mask` (a u8 tile of the block's shape; `None`: everywhere)
    /// is non-zero. f32 and i32 (wrapping); an f32 add rounds to f32 on
    /// each update. Returns the old values (all of them, masked or not).
    #[track_caller]
    pub fn atomic_add<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Add, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_max`: the larger of each element and its value (f32:
    /// a NaN value never replaces; i32). Returns the old values.
    #[track_caller]
    pub fn atomic_max<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Max, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_min`: the smaller of each element and its value.
    #[track_caller]
    pub fn atomic_min<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Min, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_xchg`: each element becomes its value; returns the old.
    #[track_caller]
    pub fn atomic_xchg<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Xchg, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_cas(target, cmp, values)`: each element equal to `cmp`
    /// becomes its value (i32); returns the old values (an element took
    /// the new value exactly where its old one equals `cmp`).
    #[track_caller]
    pub fn atomic_cas<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        cmp: i32,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(
            AtomicOp::Cas,
            target.into(),
            values.into(),
            mask,
            cmp as i64,
        )
    }

    /// `tl.atomic_and`: bitwise and (i32); returns the old values.
    #[track_caller]
    pub fn atomic_and<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::And, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_or`: bitwise or (i32); returns the old values.
    #[track_caller]
    pub fn atomic_or<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Or, target.into(), values.into(), mask, 0)
    }

    /// `tl.atomic_xor`: bitwise exclusive or (i32); returns the old values.
    #[track_caller]
    pub fn atomic_xor<'a>(
        &mut self,
        target: impl Into<TensorBlock>,
        values: impl Into<Rhs<'a>>,
        mask: Option<&dyn Operand>,
    ) -> Tile {
        self.atomic(AtomicOp::Xor, target.into(), values.into(), mask, 0)
    }

    /// Any atomic: checks the operands (naming the op, the tensor and,
    /// through the executor, the kernel's line), then one blocking
    /// atomic on the block's one part.
    #[track_caller]
    fn atomic(
        &mut self,
        op: AtomicOp,
        target: TensorBlock,
        values: Rhs<'_>,
        mask: Option<&dyn Operand>,
        cmp: i64,
    ) -> Tile {
        let name = op.name();
        let (rows, cols, dtype) = (target.rows, target.cols, target.dtype);
        let what = || {
            format!(
                "the {rows}x{cols} {dtype} block{}",
                self.block_name(&target)
            )
        };
        if !op.allows(dtype) {
            let on = if matches!(
                op,
                AtomicOp::Add | AtomicOp::Max | AtomicOp::Min | AtomicOp::Xchg
            ) {
                "f32 and i32"
            } else {
                "i32"
            };
            self.fail(name, format!("{} is {dtype}: {name} acts on {on}", what()));
        }
        let Some(b) = target.single() else {
            self.fail(
                name,
                format!(
                    "{} spans {} shards: an atomic acts on a block one shard holds (split it by shard, e.g. with TensorArg::row_blocks)",
                    what(),
                    target.parts().len()
                ),
            );
        };
        if !matches!(b.addr.space, Space::Hbm | Space::Sram) {
            self.fail(
                name,
                format!(
                    "{} is in {}: atomics act on HBM or SRAM",
                    what(),
                    b.addr.space.name()
                ),
            );
        }
        let values = match values {
            Rhs::Tile(t) => {
                let (pa, r, c, d) = t.operand();
                if (r, c, d) != (rows, cols, dtype) {
                    self.fail(
                        name,
                        format!(
                            "the {r}x{c} {d} values tile and {} differ in shape or dtype",
                            what()
                        ),
                    );
                }
                self.check_operand(name, 1, pa);
                AtomicValues::Tile(Addr {
                    space: Space::Tcm,
                    addr: pa,
                })
            }
            Rhs::Scalar(v) => {
                if dtype == Dtype::I32
                    && !(v.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&v))
                {
                    self.fail(name, format!("the value {v} is not an i32 ({})", what()));
                }
                AtomicValues::Scalar(v)
            }
        };
        let mask = mask.map(|m| {
            let (pa, r, c, d) = m.operand();
            if (r, c, d) != (rows, cols, Dtype::U8) {
                self.fail(
                    name,
                    format!(
                        "the mask is a {r}x{c} {d} tile; {} needs a {rows}x{cols} u8 one",
                        what()
                    ),
                );
            }
            self.check_operand(name, 2, pa);
            Addr {
                space: Space::Tcm,
                addr: pa,
            }
        });
        let n = b.row_bytes() * rows as u64;
        let pa = self.tcm_alloc(n, name);
        let mut tile = Tile {
            pa,
            rows,
            cols,
            dtype,
            valid: (rows, cols),
            data: Snapshot::default(),
            flat: OnceCell::new(),
            unknown: Vec::new(),
            tcm: self.tcm.clone(),
        };
        let params = AtomicParams {
            op,
            dtype,
            target: b.addr,
            values,
            old: Addr {
                space: Space::Tcm,
                addr: pa,
            },
            mask,
            rows,
            cols,
            stride: if rows > 1 {
                b.row_stride
            } else {
                b.row_bytes()
            },
            cmp,
        };
        match self
            .port
            .call(Command::Atomic(crate::program::AtomicCmd { params }))
        {
            Reply::Data(old) => {
                tile.fill(old);
                tile
            }
            other => panic!("{name}: the simulation answered {other:?} instead of data"),
        }
    }
}
