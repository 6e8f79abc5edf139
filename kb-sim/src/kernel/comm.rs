//! PEs that talk: copies to other PEs' TCM buffers and to SRAM, signals,
//! and barriers over groups of PEs. Every one is a message through the
//! fabric, timed by its route; nothing synchronizes for free.

use kb_format::{Addr, MemoryParams, Space};

use super::{Block, Operand, Tl};
use crate::machine::PeCoord;
use crate::program::{Command, DmaCmd, Notify, Reply, SignalOp};

/// An ordered set of distinct PEs: a barrier's members, a collective's
/// ranks (rank k is `pes()[k]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    pes: Vec<PeCoord>,
}

impl Group {
    /// The group of `pes` in this order; panics (a kernel failure) if it
    /// is empty or names a PE twice.
    pub fn new(pes: &[PeCoord]) -> Group {
        assert!(!pes.is_empty(), "a group needs at least one PE");
        // A set, not a scan of the members before each: every PE of a
        // launch builds its groups, so a scan was O(PEs^3) per launch for
        // a group of all of them.
        let mut seen = rustc_hash::FxHashSet::default();
        for p in pes {
            assert!(seen.insert(*p), "group: {p} is listed twice");
        }
        Group { pes: pes.to_vec() }
    }

    /// The members whose cube is `pe`'s, in order.
    pub fn cube_of(&self, pe: PeCoord) -> Group {
        self.filter(|p| (p.sip, p.cube) == (pe.sip, pe.cube))
    }

    /// The members whose SIP is `pe`'s, in order.
    pub fn sip_of(&self, pe: PeCoord) -> Group {
        self.filter(|p| p.sip == pe.sip)
    }

    fn filter(&self, f: impl Fn(&PeCoord) -> bool) -> Group {
        Group {
            pes: self.pes.iter().copied().filter(f).collect(),
        }
    }

    /// The members, in order.
    pub fn pes(&self) -> &[PeCoord] {
        &self.pes
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.pes.len()
    }

    /// Whether it has no members.
    pub fn is_empty(&self) -> bool {
        self.pes.is_empty()
    }

    /// `pe`'s rank (its index), if it is a member.
    pub fn rank(&self, pe: PeCoord) -> Option<usize> {
        self.pes.iter().position(|&p| p == pe)
    }
}

impl Tl<'_> {
    /// The PEs of this launch, in the order programs are dealt to them.
    #[track_caller]
    pub fn pes(&self) -> &[PeCoord] {
        &self.pes
    }

    /// Every PE of this launch as a group.
    #[track_caller]
    pub fn launch_group(&self) -> Group {
        Group::new(&self.pes)
    }

    /// Send a tile of this PE's TCM to `dst`: another PE's TCM buffer (a
    /// tensor placed with `Placement::in_tcm`), an SRAM slot, or any other
    /// memory (the original simulator's IPCQ copy, recorded as `ipcq_copy`). Like a
    /// store, its data effects happen at issue (the tile may be dropped or
    /// reused at once) and the transfer is timed after: it walks the route
    /// from this PE's DMA engine to the destination, with the route's
    /// latency and serialization. With `notify`, the copy raises that PE's
    /// signal once the bytes have arrived, so the receiver `wait_signal`s
    /// for them: reading the destination before that is a data race
    /// (`kb-sim --races`). Notifications from this PE to one signal are
    /// raised in the order their copies were issued, so a counting signal
    /// at n means the first n copies arrived. A notifying copy is a release
    /// of everything this PE did before it except loads still in flight
    /// (wait for those first if the receiver may overwrite what they read).
    /// Returns at once; `wait_all` waits for the transfer.
    #[track_caller]
    pub fn put(&mut self, tile: &dyn Operand, dst: Block, notify: Option<Notify>) {
        let (pa, rows, cols, dtype) = tile.operand();
        assert_eq!(
            (dst.rows, dst.cols, dst.dtype),
            (rows, cols, dtype),
            "put: block and tile differ in shape or dtype"
        );
        let rb = dst.row_bytes();
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: Addr {
                    space: Space::Tcm,
                    addr: pa,
                },
                dst: dst.addr,
                rows: dst.rows,
                row_bytes: rb,
                src_stride: rb,
                dst_stride: dst.row_stride,
                dtype: Some(dst.dtype),
            },
            label: Some("ipcq_copy"),
        };
        self.port.post(Command::Send { cmd, notify });
    }

    /// Copy block `src` to block `dst` (same shape and dtype) by this PE's
    /// DMA engine, between any of HBM, SRAM and TCM (this PE's, or another
    /// PE's TCM buffers): recorded as `dma_copy`, or `ipcq_copy` when it
    /// reaches another PE's TCM. Data effects at issue, transfer timed
    /// after, `notify` as for [`Tl::put`]. Returns at once.
    #[track_caller]
    pub fn copy(&mut self, dst: Block, src: Block, notify: Option<Notify>) {
        assert_eq!(
            (dst.rows, dst.cols, dst.dtype),
            (src.rows, src.cols, src.dtype),
            "copy: blocks differ in shape or dtype"
        );
        let remote_tcm = |b: &Block| {
            b.addr.space == Space::Tcm
                && kb_format::pa::Pa::decode(b.addr.addr).is_some_and(|p| {
                    (p.sip, p.cube, p.pe) != (self.pe.sip, self.pe.cube, self.pe.pe)
                })
        };
        let label = if remote_tcm(&dst) || remote_tcm(&src) {
            "ipcq_copy"
        } else {
            "dma_copy"
        };
        let cmd = DmaCmd {
            mem: MemoryParams {
                src: src.addr,
                dst: dst.addr,
                rows: dst.rows,
                row_bytes: dst.row_bytes(),
                src_stride: src.row_stride,
                dst_stride: dst.row_stride,
                dtype: Some(dst.dtype),
            },
            label: Some(label),
        };
        self.port.post(Command::Send { cmd, notify });
    }

    /// Set or add to signal `signal` of PE `pe` (any PE of the machine,
    /// this one included), as a message from this PE's pe_cpu through the
    /// fabric, handled by the receiver's pe_cpu. A release: it is sent
    /// once this PE's compute ops in flight have completed (stores and
    /// copies applied their data at issue; `wait_all` first to wait for
    /// their transfers too); loads still in flight are not covered by it
    /// (`Tl::wait` for them first if the receiver may overwrite what they
    /// read: the race detector reports it otherwise). The kernel goes on
    /// once it is sent. Signals belong to the launch: each launch's start at 0.
    #[track_caller]
    pub fn signal(&mut self, pe: PeCoord, signal: u32, op: SignalOp) {
        match self.port.call(Command::Signal { pe, signal, op }) {
            Reply::Done => {}
            other => panic!("signal: the simulation answered {other:?}"),
        }
    }

    /// Wait until this PE's signal `signal` is at least `at_least` (at
    /// once if it already is). What the updates' senders did before them
    /// is then ordered before what this kernel does next.
    #[track_caller]
    pub fn wait_signal(&mut self, signal: u32, at_least: u64) {
        self.wait_any(&[(signal, at_least)]);
    }

    /// Wait until any of this PE's signals reaches its value (`(signal,
    /// at_least)` pairs; at once if one already has). Each that has is
    /// acquired, as by [`Tl::wait_signal`]; read them with
    /// [`Tl::signal_value`] to see which.
    #[track_caller]
    pub fn wait_any(&mut self, any: &[(u32, u64)]) {
        assert!(!any.is_empty(), "wait_any: no signal to wait for");
        let mut list = crate::program::signal_list();
        list.extend_from_slice(any);
        match self.port.call(Command::WaitSignal(list)) {
            Reply::Done => {}
            other => panic!("wait_any: the simulation answered {other:?}"),
        }
    }

    /// This PE's signal `signal` now (0 if never raised in this launch).
    /// Reading it takes no simulated time (a register of the PE) and, like
    /// a satisfied wait, orders what its updates' senders did before what
    /// the kernel does next.
    #[track_caller]
    pub fn signal_value(&mut self, signal: u32) -> u64 {
        match self.port.call(Command::ReadSignal(signal)) {
            Reply::Value(v) => v,
            other => panic!("signal_value: the simulation answered {other:?}"),
        }
    }

    /// Wait at a barrier over `group` (this PE among its members; every
    /// member must run this launch). Everything this PE issued completes
    /// first; then an arrival goes to the group's first PE, which releases
    /// every member once all have arrived. What any member did before the
    /// barrier is ordered before what every member does after it.
    #[track_caller]
    pub fn barrier(&mut self, group: &Group) {
        match self.port.call(Command::Barrier(group.pes().to_vec())) {
            Reply::Done => {}
            other => panic!("barrier: the simulation answered {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pe(sip: u32, cube: u32, pe: u32) -> PeCoord {
        PeCoord { sip, cube, pe }
    }

    /// A group names the first member that repeats an earlier one, and
    /// keeps its members in the order given.
    #[test]
    fn a_group_refuses_a_repeated_member_and_keeps_order() {
        let (a, b, c) = (pe(0, 0, 1), pe(0, 1, 0), pe(1, 0, 0));
        let e = std::panic::catch_unwind(|| Group::new(&[a, b, c, b, a]))
            .expect_err("b is listed twice");
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(msg, format!("group: {b} is listed twice"));
        let g = Group::new(&[c, a, b]);
        assert_eq!(g.pes(), &[c, a, b]);
        assert_eq!((g.rank(a), g.rank(pe(2, 0, 0))), (Some(1), None));
        assert_eq!(g.cube_of(pe(0, 0, 7)).pes(), &[a]);
        assert_eq!(g.sip_of(a).pes(), &[a, b]);
    }
}
