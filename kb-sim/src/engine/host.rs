//! The host runtime's deploy protocol: host -> pcie_ep -> io_cpu, then one
//! write per shard to the memory holding it (a cube's HBM or SRAM, a PE's
//! TCM). (Launches are `launch.rs`.)

use std::io::Write;

use kb_format::pa;
use kb_format::{Addr, Extent, MemoryParams, OpKind, Params, Space};

use super::{Act, Arrive, CONTROL_BYTES, Engine, OpenOp, SimError};
use crate::component::Request;
use crate::data::PageImage;
use crate::machine::NodeKind;
use crate::memory::ShardKey;
use crate::program::DataOp;
use crate::runtime::Tensor;

/// Host-protocol message arrivals.
#[derive(Debug, Clone, Copy)]
pub(super) enum HostArrive {
    DeployAtIo { tensor: u32, sip: u32 },
    HostWriteAtHbm(u32),
    HostAck,
}

/// Host-protocol steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum HostAct {
    DeployFanout { tensor: u32, sip: u32 },
    HostWriteDone(u32),
}

impl From<HostArrive> for Arrive {
    fn from(a: HostArrive) -> Arrive {
        Arrive::Host(a)
    }
}

impl From<HostAct> for Act {
    fn from(a: HostAct) -> Act {
        Act::Host(a)
    }
}

#[derive(Debug)]
pub(super) struct HostWrite {
    pub(super) tensor: u32,
    pub(super) shard: u32,
    pub(super) op: Option<OpenOp>,
    pub(super) read: Option<kb_format::Effect>,
}

/// A shard image in use: the pages, the bytes' fingerprint and how many
/// shards still have to be written from it (dropped at zero).
#[derive(Debug)]
pub(super) struct SharedImage {
    image: PageImage,
    fingerprint: u64,
    left: usize,
}

/// The host's write of one shard of a tensor into HBM.
struct ShardWrite<'a> {
    tensor: &'a Tensor,
    shard: usize,
}

impl DataOp for ShardWrite<'_> {
    fn op_name(&self) -> &'static str {
        "host_write"
    }

    fn op_kind(&self) -> OpKind {
        OpKind::Memory
    }

    fn params(&self) -> Params {
        let s = &self.tensor.meta.shards[self.shard];
        Params::Memory(MemoryParams {
            src: Addr {
                space: Space::Host,
                addr: pa::host(self.tensor.id, s.tensor_offset),
            },
            dst: Addr {
                space: kb_format::pa::space_of(s.pa).unwrap_or(Space::Hbm),
                addr: s.pa,
            },
            rows: s.rows as u32,
            row_bytes: s.row_bytes,
            src_stride: s.tensor_row_stride,
            dst_stride: s.row_bytes,
            dtype: Some(self.tensor.meta.dtype),
        })
    }
}

impl<W: Write> Engine<'_, W> {
    /// The node that serves writes to a shard at `pa`: its cube's hbm_ctrl
    /// or sram, or its PE's tcm.
    pub(super) fn memory_node(&self, pa: u64) -> crate::machine::NodeId {
        let p = kb_format::pa::Pa::decode(pa).expect("shards are device PAs");
        match p.space {
            Space::Tcm => self.m.pe_node(
                crate::machine::PeCoord {
                    sip: p.sip,
                    cube: p.cube,
                    pe: p.pe,
                },
                NodeKind::Tcm,
            ),
            Space::Sram => self.m.cube_node(p.sip, p.cube, NodeKind::Sram),
            _ => self.m.cube_node(p.sip, p.cube, NodeKind::HbmCtrl),
        }
    }

    /// Deploy: per tensor and SIP, the host sends the SIP's data once over
    /// PCIe to io_cpu, which fans it out as one write per shard to the
    /// cubes' HBM.
    pub(super) fn deploy(&mut self) {
        // VA model: install every tensor's mappings; the launch waits for them.
        self.host_pending += self.send_mappings();
        let tensors = self.tensors;
        for t in tensors.iter().filter(|t| t.data.is_some()) {
            for sip in 0..self.m.topo.counts.sips {
                let bytes: u64 = t
                    .meta
                    .shards
                    .iter()
                    .zip(&t.shard_pes)
                    .filter(|(_, pe)| pe.sip == sip)
                    .map(|(s, _)| s.rows * s.row_bytes)
                    .sum();
                if bytes > 0 {
                    let io = self.m.sip_node(sip, NodeKind::IoCpu);
                    self.host_pending += 1;
                    let unique = bytes.min(t.meta.nbytes());
                    self.send(
                        self.m.host(),
                        io,
                        unique,
                        HostArrive::DeployAtIo { tensor: t.id, sip },
                    );
                }
            }
        }
    }

    pub(super) fn host_arrive(&mut self, then: HostArrive) -> Result<(), SimError> {
        match then {
            HostArrive::DeployAtIo { tensor, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                self.at(end, HostAct::DeployFanout { tensor, sip });
            }
            HostArrive::HostWriteAtHbm(job) => {
                let (tensor, shard) = {
                    let j = self.host_writes.get(job);
                    (j.tensor, j.shard)
                };
                let tensors = self.tensors;
                let t = &tensors[tensor as usize];
                let s = t.meta.shards[shard as usize].clone();
                let hbm = self.memory_node(s.pa);
                let op_id = self.new_op_id();
                let op = self.hook_start(
                    hbm,
                    &ShardWrite {
                        tensor: t,
                        shard: shard as usize,
                    },
                    op_id,
                );
                let read = self.effect(vec![Extent {
                    pa: pa::host(tensor, s.tensor_offset),
                    len: s.row_bytes,
                    rows: s.rows as u32,
                    stride: s.tensor_row_stride,
                }]);
                let end = self.serve(
                    hbm,
                    Request {
                        pa: s.pa,
                        row_bytes: s.rows * s.row_bytes,
                        rows: 1,
                        stride: 0,
                        channels: None,
                    },
                );
                let j = self.host_writes.get(job);
                j.op = Some(op);
                j.read = Some(read);
                self.at(end, HostAct::HostWriteDone(job));
            }
            HostArrive::HostAck => {
                self.host_pending -= 1;
                if self.host_pending == 0 {
                    self.host_wait = super::launch::HostWait::Running;
                    self.host_continue()?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn host_act(&mut self, a: HostAct) -> Result<(), SimError> {
        match a {
            HostAct::DeployFanout { tensor, sip } => {
                let tensors = self.tensors;
                let t = &tensors[tensor as usize];
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                for (k, (s, pe)) in t.meta.shards.iter().zip(&t.shard_pes).enumerate() {
                    if pe.sip != sip {
                        continue;
                    }
                    let hbm = self.memory_node(s.pa);
                    let job = self.host_writes.insert(HostWrite {
                        tensor,
                        shard: k as u32,
                        op: None,
                        read: None,
                    });
                    self.send(
                        io,
                        hbm,
                        s.rows * s.row_bytes,
                        HostArrive::HostWriteAtHbm(job),
                    );
                }
            }
            HostAct::HostWriteDone(job) => {
                let j = self.host_writes.remove(job);
                let tensors = self.tensors;
                let t = &tensors[j.tensor as usize];
                let s = &t.meta.shards[j.shard as usize];
                let pe = t.shard_pes[j.shard as usize];
                // The host's bytes go into pages once per distinct shard
                // (host data is immutable during the run, so reading it at
                // arrival is reading it at send).
                let key = ShardKey::of(t, j.shard as usize);
                let img = self.shard_images.entry(key).or_insert_with(|| {
                    let host = t.data.as_deref().expect("deployed tensors have host data");
                    let rows = (0..s.rows).map(|r| {
                        let at = (s.tensor_offset + r * s.tensor_row_stride) as usize;
                        &host[at..at + s.row_bytes as usize]
                    });
                    let image = PageImage::new(key.page_offset(), s.rows * s.row_bytes, rows);
                    let mut f = kb_format::Fingerprinter::new();
                    for c in image.chunks() {
                        f.update(c);
                    }
                    SharedImage {
                        fingerprint: f.digest(),
                        image,
                        left: (0..t.meta.shards.len())
                            .filter(|&k| ShardKey::of(t, k) == key)
                            .count(),
                    }
                });
                self.data.write_image(s.pa, &img.image);
                let fp = img.fingerprint;
                img.left -= 1;
                if img.left == 0 {
                    self.shard_images.remove(&key);
                }
                let write = self.effect(vec![Extent::contiguous(s.pa, s.rows * s.row_bytes)]);
                let decl = ShardWrite {
                    tensor: t,
                    shard: j.shard as usize,
                };
                let op = j.op.expect("started");
                self.hook_end(op, &decl, Some(fp), j.read, Some(write), Vec::new())?;
                self.host_done(op.op_id);
                let sips_left =
                    &mut self.deploy_left[(j.tensor * self.m.topo.counts.sips + pe.sip) as usize];
                *sips_left -= 1;
                if *sips_left == 0 {
                    // The SIP's last shard of this tensor is in place: ack the host.
                    let io = self.m.sip_node(pe.sip, NodeKind::IoCpu);
                    self.send(io, self.m.host(), CONTROL_BYTES, HostArrive::HostAck);
                }
            }
        }
        Ok(())
    }
}
