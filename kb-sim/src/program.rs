//! What runs on a PE: a program that issues one command at a time and is
//! resumed when it completes. (The kernels issue replaces hand-written
//! programs with `tl` kernels driven by a KernelRunner through this seam.)

use kb_format::{Addr, Dtype, MemoryParams, OpKind, Params, Space};

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

/// A message that is a data op declares itself (ADR-0020 D4); the
/// framework's op-log hook records its service from this declaration, so
/// no component or protocol names op kinds itself.
pub trait DataOp {
    fn op_name(&self) -> &'static str;
    fn op_kind(&self) -> OpKind;
    fn params(&self) -> Params;
}

impl DataOp for DmaCmd {
    fn op_name(&self) -> &'static str {
        match (self.src.space, self.dst.space) {
            (_, Space::Tcm) => "dma_read",
            (Space::Tcm, _) => "dma_write",
            _ => "dma_copy",
        }
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Memory
    }

    fn params(&self) -> Params {
        Params::Memory(MemoryParams {
            src: self.src,
            dst: self.dst,
            rows: self.rows,
            row_bytes: self.row_bytes,
            src_stride: self.src_stride,
            dst_stride: self.dst_stride,
            dtype: self.dtype,
        })
    }
}

/// A command a PE program issues.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Issue a DMA and resume when it completes.
    Dma(DmaCmd),
    /// Issue a DMA and resume at once; `WaitAll` waits for it.
    DmaAsync(DmaCmd),
    /// Resume when every DMA this PE issued has completed.
    WaitAll,
}

/// A PE's program: `next` is called at kernel start, after a blocking
/// command completes, and right after an asynchronous one is issued;
/// `None` ends the kernel (outstanding DMAs still complete).
pub trait PeProgram: std::fmt::Debug {
    fn next(&mut self) -> Option<Command>;
}

/// A program that issues a fixed list of commands in order.
#[derive(Debug)]
pub struct Script {
    cmds: std::vec::IntoIter<Command>,
}

impl Script {
    pub fn new(cmds: Vec<Command>) -> Script {
        Script {
            cmds: cmds.into_iter(),
        }
    }
}

impl PeProgram for Script {
    fn next(&mut self) -> Option<Command> {
        self.cmds.next()
    }
}
