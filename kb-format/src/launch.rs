//! Kernel launches of a run: what ran where and when (the launches chunk).

use serde::{Deserialize, Serialize};

use crate::types::Ps;

/// One kernel launch of a host program: the kernel, its grid, the PEs it
/// ran on and when. Written in the launches chunk, in launch order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: String,
    /// Programs along axis 0 and axis 1 (`[n, 1]` for a 1-D grid).
    pub grid: [u32; 2],
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
