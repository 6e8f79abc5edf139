//! Race detection: the happens-before order Phase 1 knows, and the
//! accesses checked against it.
//!
//! Threads are the PEs (dense index) and the host (the last index). Each
//! has a vector clock ([`Clocks`]); its own component counts its releases.
//! A release (a signal, a barrier arrival, a copy that notifies, a
//! kernel's end, a launch by the host) publishes the thread's clock and
//! then advances its own component; an acquire (a satisfied signal wait, a
//! barrier release, a kernel's start, the host's wait for a launch) joins
//! a published clock into the thread's. An access is labelled with its
//! thread and the thread's own component when it was issued, and carries
//! the thread's clock at issue: access `e` (thread u, label c) is ordered
//! before access `a` of another thread iff `a`'s clock has `[u] >= c`.
//!
//! The engine makes every release fence what it covers (it waits for the
//! effects issued before it), so an access issued before a release has
//! happened when the release is published. Loads in flight are not
//! covered: the engine relabels them with the label after the release.
//!
//! [`Shadow`] keeps the accesses that a later one may race with, by
//! physical range: two accesses of different threads to overlapping bytes,
//! one a write, neither ordered before the other, are a race. An access
//! that is ordered after an earlier one and covers all of its bytes
//! replaces it (a write replaces anything; a read replaces reads): any
//! later access that would race with the earlier one races with it too.

mod clock;
mod shadow;

pub use clock::{Clock, Clocks, join};
pub use shadow::{Shadow, contains, overlap};

use std::rc::Rc;

use kb_format::Ps;

/// What an access belongs to, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    pub op_id: u64,
    pub op_name: &'static str,
    /// The launch whose kernel issued it.
    pub launch: u32,
    /// When its effect happened.
    pub time: Ps,
}

/// An access about to be applied.
#[derive(Debug, Clone)]
pub struct Access {
    pub thread: u32,
    pub label: u32,
    /// The thread's clock when the op was issued.
    pub clock: Rc<Clock>,
    pub write: bool,
    /// An atomic read-modify-write (also a `write`): two atomics on the
    /// same bytes never race, whatever their order; an atomic and a plain
    /// access do, unordered.
    pub atomic: bool,
    pub op: OpInfo,
}

/// One side of a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    pub thread: u32,
    pub write: bool,
    pub atomic: bool,
    pub op: OpInfo,
}

/// Two unordered accesses to overlapping bytes, one a write: `first` was
/// applied before `second` in this run; `bytes` is where they first
/// overlap (PA and length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Race {
    pub first: Side,
    pub second: Side,
    pub pa: u64,
    pub len: u64,
}
