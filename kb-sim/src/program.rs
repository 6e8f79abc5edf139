//! What runs on a PE: a program that issues one command at a time and is
//! resumed when it completes. (The kernels issue replaces hand-written
//! programs with `tl` kernels driven by a KernelRunner through this seam.)

use kb_format::{Addr, Dtype};

/// A 2-D DMA: `rows` x `row_bytes` from `src` to `dst`, rows `*_stride`
/// bytes apart on each side. Addresses are PAs (the PA address model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaCmd {
    pub src: Addr,
    pub dst: Addr,
    pub rows: u32,
    pub row_bytes: u64,
    pub src_stride: u64,
    pub dst_stride: u64,
    pub dtype: Option<Dtype>,
}

/// A command a PE program issues.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Dma(DmaCmd),
}

/// A PE's program: `next` is called at kernel start and after each command
/// completes; `None` ends the kernel.
pub trait PeProgram: std::fmt::Debug {
    fn next(&mut self) -> Option<Command>;
}
