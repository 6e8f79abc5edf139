//! The simulation framework: the event loop, messages walking the fabric,
//! the op-log hook, data effects, and the host and DMA protocols.
//!
//! Fabric model (cut-through): a message of B bytes crosses link i when the
//! link is free; the link is then busy for B / bw. Its head reaches the next
//! node after the link latency plus a first-flit overhead at each
//! intermediate node; its tail can leave a link no earlier than it arrived
//! there. The destination handles the message when the tail arrives. Every
//! hop is an event, so contention is resolved in simulated-time order.
//!
//! Op-log hook: `hook_start` / `hook_end` are the only places records are
//! made; they wrap the service of a data-op message at the component that
//! serves it (pe_dma for DMA commands, hbm_ctrl for host writes). Every data
//! effect is applied to the data plane by an event at the simulated time the
//! record states, and numbered in application order (`seq`).

use std::collections::{BTreeSet, VecDeque};

use rustc_hash::{FxHashMap as HashMap, FxHashSet};
use std::io::Write;
use std::rc::Rc;

use kb_format::pa::{self, Pa};
use kb_format::{
    Addr, Effect, Extent, MemoryParams, OpKind, Params, Ps, Record, Space, TraceWriter,
};

use crate::component::{Component, ControlCpu, HbmController, Request, Scratchpad};
use crate::data::DataPlane;
use crate::event::{EventQueue, ns_to_ps};
use crate::machine::{LinkId, Machine, NodeId, NodeKind, PeCoord};
use crate::program::{Command, DataOp, DmaCmd, Labeled, PeProgram, Reply};
use crate::runtime::Tensor;
use kb_format::{Dtype, GemmParams, MathInput, MathParams};

/// Size of a control message (requests, acks, launch, command issue).
pub const CONTROL_BYTES: u64 = 64;

/// A failed simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("kernel on {pe} at {time_ns} ns: {message}")]
    Kernel {
        pe: PeCoord,
        time_ns: f64,
        message: String,
    },
    #[error("writing the trace: {0}")]
    Trace(#[from] kb_format::FormatError),
    #[error("deadlock at {time_ns} ns: no events left, but {pes}")]
    Stalled { time_ns: f64, pes: String },
}

/// What happens when a message's tail reaches its destination.
#[derive(Debug, Clone, Copy)]
enum Arrive {
    DmaCmdAtDma(u32),
    DmaReqAtHbm(u32),
    DmaDataAtDma(u32),
    DmaDataAtHbm(u32),
    DmaAckAtDma(u32),
    CmdDoneAtCpu { pe: u32, cmd: CmdRef },
    ComputeAtUnit(u32),
    DeployAtIo { tensor: u32, sip: u32 },
    HostWriteAtHbm(u32),
    HostAck,
    LaunchAtIo(u32),
    LaunchAtMcpu { sip: u32, cube: u32, target: Ps },
    LaunchAtPe { pe: u32, target: Ps },
}

/// A protocol step scheduled at a time.
#[derive(Debug, Clone, Copy)]
enum Act {
    DmaBegin(u32),
    DmaFetch(u32),
    DmaSrcRead(u32),
    DmaDeliver(u32),
    DmaDstWrite(u32),
    DmaFinish(u32),
    ComputeEnd(u32),
    DeployFanout { tensor: u32, sip: u32 },
    HostWriteDone(u32),
    IoFanout { sip: u32, target: Ps },
    McpuFanout { sip: u32, cube: u32, target: Ps },
    KernelStart(u32),
}

/// A command in flight, for completion notices: its op id, which (unlike
/// a slab index) is never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CmdRef(u64);

/// Something waiting for a compute op's result.
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Compute(u32),
    DmaFetch(u32),
}

/// A GEMM or math op between issue and completion. Its data effects were
/// applied at issue; the unit's timing follows.
#[derive(Debug)]
struct Compute {
    pe: u32,
    op_id: u64,
    op: ComputeOp,
    unit: NodeId,
    work_ps: Ps,
    read: Option<Effect>,
    write: Option<Effect>,
    out_pa: u64,
    deps: Vec<u64>,
    /// Producers not yet finished.
    waiting_on: u32,
    dependents: Vec<Waiter>,
    open: Option<OpenOp>,
}

#[derive(Debug, Clone)]
enum ComputeOp {
    Gemm(Labeled<GemmParams>),
    Math(Labeled<MathParams>),
}

impl ComputeOp {
    fn decl(&self) -> &dyn DataOp {
        match self {
            ComputeOp::Gemm(g) => g,
            ComputeOp::Math(m) => m,
        }
    }
}

/// Who last wrote a TCM tile (by base address): a compute op still
/// running (its slab index) or finished.
#[derive(Debug, Clone, Copy)]
struct Producer {
    op_id: u64,
    running: Option<u32>,
}

/// A serial compute unit (pe_gemm, pe_math): ops start in issue order.
#[derive(Debug, Default)]
struct UnitQueue {
    busy: bool,
    queue: VecDeque<u32>,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Hop(u32),
    Arrive(u32),
    Act(Act),
}

#[derive(Debug)]
struct Msg {
    route: Rc<[LinkId]>,
    hop: usize,
    bytes: u64,
    /// When the tail is at the current node.
    tail: Ps,
    then: Arrive,
}

/// A data op between hook_start and hook_end.
#[derive(Debug, Clone, Copy)]
struct OpenOp {
    op_id: u64,
    t_start: Ps,
    component: u32,
    op_name: u32,
    kind: OpKind,
}

#[derive(Debug)]
struct Dma {
    pe: u32,
    op_id: u64,
    cmd: DmaCmd,
    /// A store: data effects were applied at issue; the transfer is timing only.
    at_issue: bool,
    op: Option<OpenOp>,
    data: Vec<u8>,
    fingerprint: Option<u64>,
    read: Option<Effect>,
    write: Option<Effect>,
}

#[derive(Debug)]
struct HostWrite {
    tensor: u32,
    shard: u32,
    op: Option<OpenOp>,
    data: Vec<u8>,
    read: Option<Effect>,
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
                space: Space::Hbm,
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

/// A pool of items addressed by u32 index, reusing freed slots.
#[derive(Debug)]
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    fn insert(&mut self, t: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(t);
                i
            }
            None => {
                self.items.push(Some(t));
                (self.items.len() - 1) as u32
            }
        }
    }

    fn get(&mut self, i: u32) -> &mut T {
        self.items[i as usize].as_mut().expect("live slab entry")
    }

    fn remove(&mut self, i: u32) -> T {
        self.free.push(i);
        self.items[i as usize].take().expect("live slab entry")
    }
}

/// DMA engines of one PE: up to `engines` commands in service, the rest
/// queued in arrival order.
#[derive(Debug)]
struct DmaEngines {
    idle: u32,
    waiting: VecDeque<u32>,
}

/// Run totals.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    pub end_time: Ps,
    pub records: u64,
    pub events: u64,
    pub kernel_start: Ps,
}

/// The op log: assigns op ids and effect sequence numbers, feeds the
/// trace writer, and releases records once no earlier one can appear.
struct OpLog<W: Write> {
    writer: TraceWriter<W>,
    next_op: u64,
    next_seq: u64,
    open: BTreeSet<(Ps, u64)>,
    names: Vec<Option<u32>>,
}

pub struct Engine<'m, W: Write> {
    m: &'m Machine,
    q: EventQueue<Ev>,
    link_free: Vec<Ps>,
    comps: Vec<Option<Box<dyn Component>>>,
    engines: Vec<DmaEngines>,
    dma_setup_ps: Ps,
    msgs: Slab<Msg>,
    dmas: Slab<Dma>,
    computes: Slab<Compute>,
    units: Vec<UnitQueue>,
    producers: HashMap<u64, Producer>,
    host_writes: Slab<HostWrite>,
    host_pending: usize,
    /// Per (tensor, SIP): shard writes not yet in HBM.
    deploy_left: Vec<u32>,
    data: DataPlane,
    log: OpLog<W>,
    tensors: &'m [Tensor],
    programs: Vec<Box<dyn PeProgram>>,
    pes: Vec<PeState>,
    replies: Vec<PendingReply>,
    /// Ops issued and not yet completed (for `WaitOp`).
    in_flight: FxHashSet<u64>,
    /// Data of completed asynchronous loads, until the kernel waits on them.
    async_data: HashMap<u64, Vec<u8>>,
    stats: RunStats,
}

/// Per-PE kernel state.
#[derive(Debug, Clone, Copy, Default)]
struct PeState {
    finished: bool,
    /// DMAs issued and not yet completed.
    outstanding: u32,
    /// What the program waits on: a specific DMA, or all of them.
    waiting: Wait,
}

/// Per-PE reply data: the bytes of the blocking DMA it waits on.
type PendingReply = Option<Vec<u8>>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Wait {
    #[default]
    Nothing,
    Cmd(CmdRef),
    All,
}

impl<W: Write> std::fmt::Debug for Engine<'_, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("now", &self.q.now())
            .finish()
    }
}

fn ns(t: Ps) -> f64 {
    t as f64 / 1000.0
}

impl<'m, W: Write> Engine<'m, W> {
    pub fn new(
        m: &'m Machine,
        writer: TraceWriter<W>,
        tensors: &'m [Tensor],
        programs: Vec<Box<dyn PeProgram>>,
    ) -> Self {
        let t = &m.topo;
        let comps = m
            .nodes
            .iter()
            .map(|n| -> Option<Box<dyn Component>> {
                match n.kind {
                    NodeKind::HbmCtrl => Some(Box::new(HbmController::new(t))),
                    NodeKind::Tcm => Some(Box::new(Scratchpad::new(
                        t.tcm.latency_ns.0,
                        t.tcm.bw_gbs.0,
                    ))),
                    NodeKind::Sram => Some(Box::new(Scratchpad::new(
                        t.sram.latency_ns.0,
                        t.links.noc_sram.bw_gbs.0,
                    ))),
                    NodeKind::IoCpu | NodeKind::MCpu | NodeKind::PeCpu => {
                        Some(Box::new(ControlCpu::new(t.cpu.handle_ns.0)))
                    }
                    _ => None,
                }
            })
            .collect();
        let n_pes = t.total_pes() as usize;
        Engine {
            m,
            q: EventQueue::default(),
            link_free: vec![0; m.links.len()],
            comps,
            engines: (0..n_pes)
                .map(|_| DmaEngines {
                    idle: t.pe_dma.engines,
                    waiting: VecDeque::new(),
                })
                .collect(),
            dma_setup_ps: ns_to_ps(t.pe_dma.setup_ns.0),
            msgs: Slab::new(),
            dmas: Slab::new(),
            computes: Slab::new(),
            units: (0..m.nodes.len()).map(|_| UnitQueue::default()).collect(),
            producers: HashMap::default(),
            host_writes: Slab::new(),
            host_pending: 0,
            deploy_left: {
                let sips = t.counts.sips;
                let mut v = vec![0u32; tensors.len() * sips as usize];
                for tensor in tensors.iter().filter(|t| t.data.is_some()) {
                    for pe in &tensor.shard_pes {
                        v[(tensor.id * sips + pe.sip) as usize] += 1;
                    }
                }
                v
            },
            data: DataPlane::new(),
            log: OpLog {
                writer,
                next_op: 0,
                next_seq: 0,
                open: BTreeSet::new(),
                names: vec![None; m.nodes.len()],
            },
            tensors,
            pes: vec![PeState::default(); programs.len()],
            replies: vec![None; programs.len()],
            in_flight: Default::default(),
            async_data: HashMap::default(),
            programs,
            stats: RunStats::default(),
        }
    }

    /// Deploy every tensor with host data, launch the kernels behind a
    /// global start barrier, and run to completion.
    pub fn run(mut self) -> Result<(TraceWriter<W>, RunStats), SimError> {
        self.deploy();
        if self.host_pending == 0 {
            self.launch();
        }
        while let Some((_, ev)) = self.q.pop() {
            match ev {
                Ev::Hop(msg) => self.hop(msg),
                Ev::Arrive(msg) => {
                    let then = self.msgs.remove(msg).then;
                    self.arrive(then)?;
                }
                Ev::Act(a) => self.act(a)?,
            }
        }
        let stuck: Vec<String> = self
            .pes
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.finished)
            .map(|(i, s)| {
                let what = match s.waiting {
                    Wait::Cmd(CmdRef(op)) => format!("op {op}, which will never wake it"),
                    Wait::All => format!("all of its {} outstanding ops", s.outstanding),
                    Wait::Nothing => "nothing (it was never resumed)".to_string(),
                };
                format!(
                    "kernel {} on {} waits for {what}",
                    self.programs[i].name(),
                    self.m.pe_coord(i)
                )
            })
            .collect();
        if !stuck.is_empty() {
            return Err(SimError::Stalled {
                time_ns: ns(self.q.now()),
                pes: stuck.join(", "),
            });
        }
        self.stats.end_time = self.q.now();
        self.stats.events = self.q.scheduled();
        self.stats.records = self.log.next_op;
        Ok((self.log.writer, self.stats))
    }

    // ---- fabric ----

    fn send(&mut self, from: NodeId, to: NodeId, bytes: u64, then: Arrive) {
        let now = self.q.now();
        let route = self.m.route(from, to);
        if route.is_empty() {
            let id = self.msgs.insert(Msg {
                route,
                hop: 0,
                bytes,
                tail: now,
                then,
            });
            self.q.push(now, Ev::Arrive(id));
            return;
        }
        let id = self.msgs.insert(Msg {
            route,
            hop: 0,
            bytes,
            tail: now,
            then,
        });
        self.q.push(now, Ev::Hop(id));
    }

    /// The head of `msg` is at the start of link `route[hop]`.
    fn hop(&mut self, id: u32) {
        let now = self.q.now();
        let flit = self.m.first_flit_ps;
        let msg = self.msgs.get(id);
        let l = msg.route[msg.hop] as usize;
        let link = &self.m.links[l];
        let start = now.max(self.link_free[l]);
        let end = (start + link.serialize_ps(msg.bytes)).max(msg.tail);
        self.link_free[l] = end;
        msg.tail = end + link.latency_ps;
        msg.hop += 1;
        if msg.hop == msg.route.len() {
            let tail = msg.tail;
            self.q.push(tail, Ev::Arrive(id));
        } else {
            self.q.push(start + link.latency_ps + flit, Ev::Hop(id));
        }
    }

    fn serve(&mut self, node: NodeId, req: Request) -> Ps {
        let now = self.q.now();
        let c = self.comps[node as usize]
            .as_mut()
            .expect("node has a timing model");
        c.serve(now, &req).end
    }

    fn at(&mut self, t: Ps, a: Act) {
        self.q.push(t, Ev::Act(a));
    }

    // ---- op-log hook ----

    /// A new op id. Ids are assigned when an op is created (issued), so
    /// they are stable, and a pending result can name its writer before
    /// the writer's service starts.
    fn new_op_id(&mut self) -> u64 {
        let id = self.log.next_op;
        self.log.next_op += 1;
        id
    }

    fn hook_start(&mut self, node: NodeId, op: &dyn DataOp, op_id: u64) -> OpenOp {
        let (op_name, kind) = (op.op_name(), op.op_kind());
        let t_start = self.q.now();
        let log = &mut self.log;
        let component = match log.names[node as usize] {
            Some(id) => id,
            None => {
                let id = log.writer.intern(&self.m.nodes[node as usize].name);
                log.names[node as usize] = Some(id);
                id
            }
        };
        let op_name = log.writer.intern(op_name);
        log.open.insert((t_start, op_id));
        OpenOp {
            op_id,
            t_start,
            component,
            op_name,
            kind,
        }
    }

    fn hook_end(
        &mut self,
        op: OpenOp,
        decl: &dyn DataOp,
        fingerprint: Option<u64>,
        read: Option<Effect>,
        write: Option<Effect>,
    ) -> Result<(), SimError> {
        self.hook_end_with_deps(op, decl, fingerprint, read, write, Vec::new())
    }

    fn hook_end_with_deps(
        &mut self,
        op: OpenOp,
        decl: &dyn DataOp,
        fingerprint: Option<u64>,
        read: Option<Effect>,
        write: Option<Effect>,
        deps: Vec<u64>,
    ) -> Result<(), SimError> {
        let now = self.q.now();
        let log = &mut self.log;
        log.open.remove(&(op.t_start, op.op_id));
        log.writer.push(Record {
            op_id: op.op_id,
            t_start: op.t_start,
            t_end: now,
            component: op.component,
            op_name: op.op_name,
            kind: op.kind,
            params: decl.params(),
            deps,
            fingerprint,
            read,
            write,
        })?;
        let watermark = log.open.first().map_or(now, |&(t, _)| t.min(now));
        log.writer.advance(watermark)?;
        Ok(())
    }

    /// Number a data effect applied now.
    fn effect(&mut self, ranges: Vec<Extent>) -> Effect {
        let seq = self.log.next_seq;
        self.log.next_seq += 1;
        Effect {
            time: self.q.now(),
            seq,
            ranges,
        }
    }

    // ---- host runtime ----

    /// Deploy: per tensor and SIP, the host sends the SIP's data once over
    /// PCIe to io_cpu, which fans it out as one write per shard to the
    /// cubes' HBM.
    fn deploy(&mut self) {
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
                        Arrive::DeployAtIo { tensor: t.id, sip },
                    );
                }
            }
        }
    }

    fn launch(&mut self) {
        for sip in 0..self.m.topo.counts.sips {
            let io = self.m.sip_node(sip, NodeKind::IoCpu);
            self.send(self.m.host(), io, CONTROL_BYTES, Arrive::LaunchAtIo(sip));
        }
    }

    /// The latest any PE of `sip` can receive a launch stamped at io_cpu:
    /// uncontended fan-out latency plus the m_cpu and pe_cpu handling.
    fn launch_lead(&self, sip: u32) -> Ps {
        let io = self.m.sip_node(sip, NodeKind::IoCpu);
        let handle = ns_to_ps(self.m.topo.cpu.handle_ns.0);
        self.m
            .pes()
            .filter(|p| p.sip == sip)
            .map(|p| {
                let mcpu = self.m.cube_node(sip, p.cube, NodeKind::MCpu);
                let cpu = self.m.pe_node(p, NodeKind::PeCpu);
                self.m
                    .uncontended_ps(&self.m.route(io, mcpu), CONTROL_BYTES)
                    + self
                        .m
                        .uncontended_ps(&self.m.route(mcpu, cpu), CONTROL_BYTES)
                    + 2 * handle
            })
            .max()
            .unwrap_or(0)
    }

    fn arrive(&mut self, then: Arrive) -> Result<(), SimError> {
        let now = self.q.now();
        match then {
            Arrive::DeployAtIo { tensor, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                self.at(end, Act::DeployFanout { tensor, sip });
            }
            Arrive::HostWriteAtHbm(job) => {
                let (tensor, shard) = {
                    let j = self.host_writes.get(job);
                    (j.tensor, j.shard)
                };
                let tensors = self.tensors;
                let t = &tensors[tensor as usize];
                let s = t.meta.shards[shard as usize].clone();
                let pe = t.shard_pes[shard as usize];
                let hbm = self.m.cube_node(pe.sip, pe.cube, NodeKind::HbmCtrl);
                let op_id = self.new_op_id();
                let op = self.hook_start(
                    hbm,
                    &ShardWrite {
                        tensor: t,
                        shard: shard as usize,
                    },
                    op_id,
                );
                let host = t.data.as_deref().expect("deployed tensors have host data");
                let mut data = Vec::with_capacity((s.rows * s.row_bytes) as usize);
                for r in 0..s.rows {
                    let at = (s.tensor_offset + r * s.tensor_row_stride) as usize;
                    data.extend_from_slice(&host[at..at + s.row_bytes as usize]);
                }
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
                    },
                );
                let j = self.host_writes.get(job);
                j.op = Some(op);
                j.data = data;
                j.read = Some(read);
                self.at(end, Act::HostWriteDone(job));
            }
            Arrive::HostAck => {
                self.host_pending -= 1;
                if self.host_pending == 0 {
                    self.launch();
                }
            }
            Arrive::LaunchAtIo(sip) => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                let target = end + self.launch_lead(sip);
                self.at(end, Act::IoFanout { sip, target });
            }
            Arrive::LaunchAtMcpu { sip, cube, target } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let end = self.serve(mcpu, Request::control());
                self.at(end, Act::McpuFanout { sip, cube, target });
            }
            Arrive::LaunchAtPe { pe, target } => {
                let cpu = self
                    .m
                    .pe_node(self.m.pe_coord(pe as usize), NodeKind::PeCpu);
                let end = self.serve(cpu, Request::control());
                self.at(end.max(target), Act::KernelStart(pe));
            }
            Arrive::DmaCmdAtDma(d) => {
                let pe = self.dmas.get(d).pe as usize;
                let e = &mut self.engines[pe];
                if e.idle > 0 {
                    e.idle -= 1;
                    self.at(now, Act::DmaBegin(d));
                } else {
                    e.waiting.push_back(d);
                }
            }
            Arrive::DmaReqAtHbm(d) => {
                let cmd = self.dmas.get(d).cmd;
                let hbm = self.hbm_of(cmd.src.addr);
                let end = self.serve(
                    hbm,
                    Request {
                        pa: cmd.src.addr,
                        row_bytes: cmd.row_bytes,
                        rows: cmd.rows,
                        stride: cmd.src_stride,
                    },
                );
                self.at(end, Act::DmaSrcRead(d));
            }
            Arrive::DmaDataAtDma(d) => self.at(now, Act::DmaDeliver(d)),
            Arrive::DmaDataAtHbm(d) => {
                let cmd = self.dmas.get(d).cmd;
                let hbm = self.hbm_of(cmd.dst.addr);
                let end = self.serve(
                    hbm,
                    Request {
                        pa: cmd.dst.addr,
                        row_bytes: cmd.row_bytes,
                        rows: cmd.rows,
                        stride: cmd.dst_stride,
                    },
                );
                self.at(end, Act::DmaDstWrite(d));
            }
            Arrive::DmaAckAtDma(d) => self.at(now, Act::DmaFinish(d)),
            Arrive::ComputeAtUnit(c) => {
                let unit = self.computes.get(c).unit;
                self.units[unit as usize].queue.push_back(c);
                self.try_start(unit);
            }
            Arrive::CmdDoneAtCpu { pe, cmd } => {
                self.in_flight.remove(&cmd.0);
                let s = &mut self.pes[pe as usize];
                s.outstanding -= 1;
                let resume = match s.waiting {
                    Wait::Cmd(c) => c == cmd,
                    Wait::All => s.outstanding == 0,
                    Wait::Nothing => false,
                };
                if resume {
                    s.waiting = Wait::Nothing;
                    let data = match s.waiting {
                        _ if self.replies[pe as usize].is_some() => {
                            self.replies[pe as usize].take()
                        }
                        _ => self.async_data.remove(&cmd.0),
                    };
                    let reply = match data {
                        Some(data) => Reply::Data(data),
                        None => Reply::Done,
                    };
                    self.step_program(pe, reply)?;
                }
            }
        }
        Ok(())
    }

    fn act(&mut self, a: Act) -> Result<(), SimError> {
        let now = self.q.now();
        match a {
            Act::DeployFanout { tensor, sip } => {
                let tensors = self.tensors;
                let t = &tensors[tensor as usize];
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                for (k, (s, pe)) in t.meta.shards.iter().zip(&t.shard_pes).enumerate() {
                    if pe.sip != sip {
                        continue;
                    }
                    let hbm = self.m.cube_node(pe.sip, pe.cube, NodeKind::HbmCtrl);
                    let job = self.host_writes.insert(HostWrite {
                        tensor,
                        shard: k as u32,
                        op: None,
                        data: Vec::new(),
                        read: None,
                    });
                    self.send(io, hbm, s.rows * s.row_bytes, Arrive::HostWriteAtHbm(job));
                }
            }
            Act::HostWriteDone(job) => {
                let j = self.host_writes.remove(job);
                let tensors = self.tensors;
                let t = &tensors[j.tensor as usize];
                let s = &t.meta.shards[j.shard as usize];
                let pe = t.shard_pes[j.shard as usize];
                self.data.write(s.pa, &j.data);
                let write = self.effect(vec![Extent::contiguous(s.pa, s.rows * s.row_bytes)]);
                let fp = kb_format::fingerprint(&j.data);
                let decl = ShardWrite {
                    tensor: t,
                    shard: j.shard as usize,
                };
                self.hook_end(j.op.expect("started"), &decl, Some(fp), j.read, Some(write))?;
                let sips_left =
                    &mut self.deploy_left[(j.tensor * self.m.topo.counts.sips + pe.sip) as usize];
                *sips_left -= 1;
                if *sips_left == 0 {
                    // The SIP's last shard of this tensor is in place: ack the host.
                    let io = self.m.sip_node(pe.sip, NodeKind::IoCpu);
                    self.send(io, self.m.host(), CONTROL_BYTES, Arrive::HostAck);
                }
            }
            Act::IoFanout { sip, target } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                for cube in 0..self.m.topo.counts.cubes_per_sip {
                    let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                    self.send(
                        io,
                        mcpu,
                        CONTROL_BYTES,
                        Arrive::LaunchAtMcpu { sip, cube, target },
                    );
                }
            }
            Act::McpuFanout { sip, cube, target } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                for p in 0..self.m.topo.counts.pes_per_cube {
                    let pc = PeCoord { sip, cube, pe: p };
                    let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
                    let pe = self.m.pe_index(pc) as u32;
                    self.send(mcpu, cpu, CONTROL_BYTES, Arrive::LaunchAtPe { pe, target });
                }
            }
            Act::KernelStart(pe) => {
                if self.stats.kernel_start == 0 {
                    self.stats.kernel_start = now;
                }
                self.step_program(pe, Reply::Go)?;
            }
            Act::DmaBegin(d) => {
                let pe = self.m.pe_coord(self.dmas.get(d).pe as usize);
                let dma = self.m.pe_node(pe, NodeKind::PeDma);
                let (cmd, op_id) = {
                    let x = self.dmas.get(d);
                    (x.cmd, x.op_id)
                };
                let op = self.hook_start(dma, &cmd, op_id);
                self.dmas.get(d).op = Some(op);
                self.at(now + self.dma_setup_ps, Act::DmaFetch(d));
            }
            Act::DmaFetch(d) => {
                let (pe, cmd) = {
                    let x = self.dmas.get(d);
                    (self.m.pe_coord(x.pe as usize), x.cmd)
                };
                // A store of a pending tile moves it once its producer is done.
                if cmd.src.space == Space::Tcm
                    && let Some(Producer {
                        running: Some(c), ..
                    }) = self.producers.get(&cmd.src.addr).copied()
                {
                    self.computes.get(c).dependents.push(Waiter::DmaFetch(d));
                    return Ok(());
                }
                match cmd.src.space {
                    Space::Tcm => {
                        let tcm = self.m.pe_node(pe, NodeKind::Tcm);
                        let end = self.serve(
                            tcm,
                            Request {
                                pa: cmd.src.addr,
                                row_bytes: cmd.row_bytes,
                                rows: cmd.rows,
                                stride: cmd.src_stride,
                            },
                        );
                        self.at(end, Act::DmaSrcRead(d));
                    }
                    _ => {
                        let dma = self.m.pe_node(pe, NodeKind::PeDma);
                        let hbm = self.hbm_of(cmd.src.addr);
                        self.send(dma, hbm, CONTROL_BYTES, Arrive::DmaReqAtHbm(d));
                    }
                }
            }
            Act::DmaSrcRead(d) => {
                let (pe, cmd) = {
                    let x = self.dmas.get(d);
                    (self.m.pe_coord(x.pe as usize), x.cmd)
                };
                let src = Extent {
                    pa: cmd.src.addr,
                    len: cmd.row_bytes,
                    rows: cmd.rows,
                    stride: cmd.src_stride,
                };
                if !self.dmas.get(d).at_issue {
                    let mut data = Vec::with_capacity(src.bytes() as usize);
                    if let Err(e) = self.data.read_extent(&src, &mut data) {
                        return Err(SimError::Kernel {
                            pe,
                            time_ns: ns(now),
                            message: format!("DMA read refused: {e}"),
                        });
                    }
                    let read = self.effect(vec![src]);
                    let x = self.dmas.get(d);
                    x.fingerprint = Some(kb_format::fingerprint(&data));
                    x.data = data;
                    x.read = Some(read);
                }
                if cmd.src.space == Space::Tcm {
                    self.at(now, Act::DmaDeliver(d));
                } else {
                    let hbm = self.hbm_of(cmd.src.addr);
                    let dma = self.m.pe_node(pe, NodeKind::PeDma);
                    self.send(hbm, dma, src.bytes(), Arrive::DmaDataAtDma(d));
                }
            }
            Act::DmaDeliver(d) => {
                let (pe, cmd) = {
                    let x = self.dmas.get(d);
                    (self.m.pe_coord(x.pe as usize), x.cmd)
                };
                match cmd.dst.space {
                    Space::Tcm => {
                        let tcm = self.m.pe_node(pe, NodeKind::Tcm);
                        let end = self.serve(
                            tcm,
                            Request {
                                pa: cmd.dst.addr,
                                row_bytes: cmd.row_bytes,
                                rows: cmd.rows,
                                stride: cmd.dst_stride,
                            },
                        );
                        self.at(end, Act::DmaDstWrite(d));
                    }
                    _ => {
                        let dma = self.m.pe_node(pe, NodeKind::PeDma);
                        let hbm = self.hbm_of(cmd.dst.addr);
                        self.send(
                            dma,
                            hbm,
                            cmd.row_bytes * cmd.rows as u64,
                            Arrive::DmaDataAtHbm(d),
                        );
                    }
                }
            }
            Act::DmaDstWrite(d) => {
                let (pe, cmd) = {
                    let x = self.dmas.get(d);
                    (self.m.pe_coord(x.pe as usize), x.cmd)
                };
                let dst = Extent {
                    pa: cmd.dst.addr,
                    len: cmd.row_bytes,
                    rows: cmd.rows,
                    stride: cmd.dst_stride,
                };
                if cmd.dst.space == Space::Tcm {
                    self.producers.remove(&cmd.dst.addr);
                }
                if !self.dmas.get(d).at_issue {
                    self.data.write_extent(&dst, &self.dmas.get(d).data);
                    let write = self.effect(vec![dst]);
                    self.dmas.get(d).write = Some(write);
                }
                if cmd.dst.space == Space::Tcm {
                    self.at(now, Act::DmaFinish(d));
                } else {
                    let hbm = self.hbm_of(cmd.dst.addr);
                    let dma = self.m.pe_node(pe, NodeKind::PeDma);
                    self.send(hbm, dma, CONTROL_BYTES, Arrive::DmaAckAtDma(d));
                }
            }
            Act::ComputeEnd(c) => self.finish_compute(c)?,
            Act::DmaFinish(d) => {
                let x = self.dmas.remove(d);
                self.hook_end(
                    x.op.expect("started"),
                    &x.cmd,
                    x.fingerprint,
                    x.read,
                    x.write,
                )?;
                let pe = x.pe as usize;
                if x.cmd.dst.space == Space::Tcm {
                    // A load: its bytes go to the kernel that waits on it,
                    // now or later (an asynchronous load).
                    if self.pes[pe].waiting == Wait::Cmd(CmdRef(x.op_id)) {
                        self.replies[pe] = Some(x.data);
                    } else {
                        self.async_data.insert(x.op_id, x.data);
                    }
                }
                let e = &mut self.engines[pe];
                match e.waiting.pop_front() {
                    Some(next) => self.at(now, Act::DmaBegin(next)),
                    None => e.idle += 1,
                }
                let pc = self.m.pe_coord(pe);
                let (dma, cpu) = (
                    self.m.pe_node(pc, NodeKind::PeDma),
                    self.m.pe_node(pc, NodeKind::PeCpu),
                );
                self.send(
                    dma,
                    cpu,
                    CONTROL_BYTES,
                    Arrive::CmdDoneAtCpu {
                        pe: pe as u32,
                        cmd: CmdRef(x.op_id),
                    },
                );
            }
        }
        Ok(())
    }

    fn hbm_of(&self, addr: u64) -> NodeId {
        let p = Pa::decode(addr).expect("validated at issue");
        self.m.cube_node(p.sip, p.cube, NodeKind::HbmCtrl)
    }

    /// Resume a PE's program: issue commands until it blocks or ends.
    fn step_program(&mut self, pe: u32, mut reply: Reply) -> Result<(), SimError> {
        let pc = self.m.pe_coord(pe as usize);
        loop {
            let program = &mut self.programs[pe as usize];
            let next = program.resume(std::mem::replace(&mut reply, Reply::Go));
            let cmd = match next {
                Ok(Some(cmd)) => cmd,
                Ok(None) => {
                    self.pes[pe as usize].finished = true;
                    return Ok(());
                }
                Err(message) => {
                    return Err(SimError::Kernel {
                        pe: pc,
                        time_ns: ns(self.q.now()),
                        message: format!("kernel {} failed: {message}", program.name()),
                    });
                }
            };
            match cmd {
                Command::Dma(c) => {
                    let d = self.issue_dma(pc, pe, c)?;
                    let op_id = self.dmas.get(d).op_id;
                    self.pes[pe as usize].waiting = Wait::Cmd(CmdRef(op_id));
                    return Ok(());
                }
                Command::DmaAsync(c) => {
                    let d = self.issue_dma(pc, pe, c)?;
                    reply = Reply::Issued(self.dmas.get(d).op_id);
                }
                Command::Store(c) => {
                    let d = self.issue_dma(pc, pe, c)?;
                    self.apply_at_issue(pc, d)?;
                    reply = Reply::Issued(self.dmas.get(d).op_id);
                }
                Command::WaitOp(op_id) => {
                    if self.in_flight.contains(&op_id) {
                        self.pes[pe as usize].waiting = Wait::Cmd(CmdRef(op_id));
                        return Ok(());
                    }
                    reply = match self.async_data.remove(&op_id) {
                        Some(data) => Reply::Data(data),
                        None => Reply::Done,
                    };
                }
                Command::Gemm(g) => {
                    reply = Reply::Issued(self.issue_compute(pc, pe, ComputeOp::Gemm(g))?)
                }
                Command::Math(m) => {
                    reply = Reply::Issued(self.issue_compute(pc, pe, ComputeOp::Math(m))?)
                }
                Command::WaitAll => {
                    if self.pes[pe as usize].outstanding > 0 {
                        self.pes[pe as usize].waiting = Wait::All;
                        return Ok(());
                    }
                }
            }
        }
    }

    fn issue_dma(&mut self, pc: PeCoord, pe: u32, c: DmaCmd) -> Result<u32, SimError> {
        self.validate_dma(pc, &c)?;
        let op_id = self.new_op_id();
        self.in_flight.insert(op_id);
        let d = self.dmas.insert(Dma {
            pe,
            op_id,
            cmd: c,
            at_issue: false,
            op: None,
            data: Vec::new(),
            fingerprint: None,
            read: None,
            write: None,
        });
        self.pes[pe as usize].outstanding += 1;
        let (cpu, dma) = (
            self.m.pe_node(pc, NodeKind::PeCpu),
            self.m.pe_node(pc, NodeKind::PeDma),
        );
        self.send(cpu, dma, CONTROL_BYTES, Arrive::DmaCmdAtDma(d));
        Ok(d)
    }

    /// Issue a GEMM or math op: apply its data effects now (its output
    /// becomes pending), then send it to its unit.
    fn issue_compute(&mut self, pc: PeCoord, pe: u32, op: ComputeOp) -> Result<u64, SimError> {
        let now = self.q.now();
        let err = |message: String| SimError::Kernel {
            pe: pc,
            time_ns: ns(now),
            message,
        };
        let t = &self.m.topo;
        let tile = |a: kb_format::Addr, rows: u32, cols: u32, d: Dtype| {
            Extent::contiguous(a.addr, rows as u64 * cols as u64 * d.size() as u64)
        };
        let (inputs, out, unit_kind, work_ps) = match &op {
            ComputeOp::Gemm(Labeled { op: g, .. }) => {
                let (ar, ac) = if g.transpose_a {
                    (g.k, g.m)
                } else {
                    (g.m, g.k)
                };
                let (br, bc) = if g.transpose_b {
                    (g.n, g.k)
                } else {
                    (g.k, g.n)
                };
                let mut inputs = vec![tile(g.a, ar, ac, g.dtype_in), tile(g.b, br, bc, g.dtype_in)];
                if let Some(acc) = g.acc {
                    inputs.push(tile(acc, g.m, g.n, g.dtype_acc));
                }
                let tflops = rate(&t.pe_gemm.tflops, g.dtype_in);
                let flops = 2.0 * g.m as f64 * g.n as f64 * g.k as f64;
                let ps = (flops / tflops).ceil() as Ps + ns_to_ps(t.pe_gemm.setup_ns.0);
                (
                    inputs,
                    tile(g.out, g.m, g.n, g.dtype_out),
                    NodeKind::PeGemm,
                    ps,
                )
            }
            ComputeOp::Math(Labeled { op: m, .. }) => {
                let mut inputs = Vec::new();
                let mut elems = m.rows as u64 * m.cols as u64;
                for i in &m.inputs {
                    if let MathInput::Tile {
                        addr,
                        rows,
                        cols,
                        dtype,
                    } = *i
                    {
                        inputs.push(tile(addr, rows, cols, dtype));
                        elems = elems.max(rows as u64 * cols as u64);
                    }
                }
                let gflops = rate(&t.pe_math.gflops, m.dtype);
                let ps =
                    (elems as f64 * 1000.0 / gflops).ceil() as Ps + ns_to_ps(t.pe_math.setup_ns.0);
                (
                    inputs,
                    tile(m.out, m.rows, m.cols, m.dtype),
                    NodeKind::PeMath,
                    ps,
                )
            }
        };
        for x in inputs.iter().chain([&out]) {
            match Pa::decode(x.pa) {
                Some(p)
                    if p.space == Space::Tcm
                        && (p.sip, p.cube, p.pe) == (pc.sip, pc.cube, pc.pe) => {}
                _ => {
                    return Err(err(format!(
                        "{} operand {:#x} is not in this PE's TCM",
                        op.decl().op_name(),
                        x.pa
                    )));
                }
            }
        }
        let op_id = self.new_op_id();
        let mut deps = Vec::new();
        let mut waiting_on = Vec::new();
        for x in &inputs {
            if let Some(p) = self.producers.get(&x.pa).copied() {
                if !deps.contains(&p.op_id) {
                    deps.push(p.op_id);
                }
                if let Some(c) = p.running
                    && !waiting_on.contains(&c)
                {
                    waiting_on.push(c);
                }
            }
        }
        let read = self.effect(inputs);
        let write = self.effect(vec![out]);
        self.data.mark_pending(out.pa, out.len, op_id);
        let unit = self.m.pe_node(pc, unit_kind);
        let c = self.computes.insert(Compute {
            pe,
            op_id,
            op,
            unit,
            work_ps,
            read: Some(read),
            write: Some(write),
            out_pa: out.pa,
            deps,
            waiting_on: waiting_on.len() as u32,
            dependents: Vec::new(),
            open: None,
        });
        for p in waiting_on {
            self.computes.get(p).dependents.push(Waiter::Compute(c));
        }
        self.producers.insert(
            out.pa,
            Producer {
                op_id,
                running: Some(c),
            },
        );
        self.pes[pe as usize].outstanding += 1;
        self.in_flight.insert(op_id);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.send(cpu, unit, CONTROL_BYTES, Arrive::ComputeAtUnit(c));
        Ok(op_id)
    }

    /// Start the next op on a compute unit if it is idle and the op's
    /// inputs are ready.
    fn try_start(&mut self, unit: NodeId) {
        let u = &mut self.units[unit as usize];
        if u.busy {
            return;
        }
        let Some(&c) = u.queue.front() else { return };
        if self.computes.get(c).waiting_on > 0 {
            return;
        }
        u.queue.pop_front();
        u.busy = true;
        let (op, op_id, work) = {
            let x = self.computes.get(c);
            (x.op.clone(), x.op_id, x.work_ps)
        };
        let open = self.hook_start(unit, op.decl(), op_id);
        self.computes.get(c).open = Some(open);
        let end = self.q.now() + work;
        self.at(end, Act::ComputeEnd(c));
    }

    fn finish_compute(&mut self, c: u32) -> Result<(), SimError> {
        let x = self.computes.remove(c);
        self.hook_end_with_deps(
            x.open.expect("started"),
            x.op.decl(),
            None,
            x.read,
            x.write,
            x.deps,
        )?;
        if let Some(p) = self.producers.get_mut(&x.out_pa)
            && p.running == Some(c)
        {
            p.running = None;
        }
        self.units[x.unit as usize].busy = false;
        for w in x.dependents {
            match w {
                Waiter::Compute(d) => {
                    let dep = self.computes.get(d);
                    dep.waiting_on -= 1;
                    let unit = dep.unit;
                    self.try_start(unit);
                }
                Waiter::DmaFetch(d) => self.at(self.q.now(), Act::DmaFetch(d)),
            }
        }
        self.try_start(x.unit);
        let pc = self.m.pe_coord(x.pe as usize);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.send(
            x.unit,
            cpu,
            CONTROL_BYTES,
            Arrive::CmdDoneAtCpu {
                pe: x.pe,
                cmd: CmdRef(x.op_id),
            },
        );
        Ok(())
    }

    /// Apply a store's read and write now, at issue.
    fn apply_at_issue(&mut self, pe: PeCoord, d: u32) -> Result<(), SimError> {
        let now = self.q.now();
        let cmd = self.dmas.get(d).cmd;
        let src = Extent {
            pa: cmd.src.addr,
            len: cmd.row_bytes,
            rows: cmd.rows,
            stride: cmd.src_stride,
        };
        let dst = Extent {
            pa: cmd.dst.addr,
            len: cmd.row_bytes,
            rows: cmd.rows,
            stride: cmd.dst_stride,
        };
        let op_id = self.dmas.get(d).op_id;
        let mut data = Vec::with_capacity(src.bytes() as usize);
        let fingerprint = match self.data.read_extent(&src, &mut data) {
            Ok(()) => {
                self.data.write_extent(&dst, &data);
                Some(kb_format::fingerprint(&data))
            }
            Err(_pending) => {
                // A pending result: its bytes exist only in Phase 2; the
                // destination becomes pending, written by this store.
                self.data.mark_pending_extent(&dst, op_id);
                None
            }
        };
        let _ = (pe, now);
        let read = self.effect(vec![src]);
        let write = self.effect(vec![dst]);
        let x = self.dmas.get(d);
        x.at_issue = true;
        x.fingerprint = fingerprint;
        x.read = Some(read);
        x.write = Some(write);
        Ok(())
    }

    fn validate_dma(&self, pe: PeCoord, c: &DmaCmd) -> Result<(), SimError> {
        let err = |message: String| SimError::Kernel {
            pe,
            time_ns: ns(self.q.now()),
            message,
        };
        let c_ = self.m.topo.counts;
        for (side, a, stride) in [
            ("source", c.src, c.src_stride),
            ("destination", c.dst, c.dst_stride),
        ] {
            let p = Pa::decode(a.addr)
                .ok_or_else(|| err(format!("DMA {side} {:#x} is not a device PA", a.addr)))?;
            if p.space != a.space {
                return Err(err(format!(
                    "DMA {side} {:#x} is in {}, not {}",
                    a.addr,
                    p.space.name(),
                    a.space.name()
                )));
            }
            if p.sip >= c_.sips || p.cube >= c_.cubes_per_sip || p.pe >= c_.pes_per_cube {
                return Err(err(format!("DMA {side} {p} is outside the machine")));
            }
            if p.space == Space::Tcm && (p.sip, p.cube, p.pe) != (pe.sip, pe.cube, pe.pe) {
                return Err(err(format!("DMA {side} {p} is another PE's TCM")));
            }
            if !matches!(p.space, Space::Tcm | Space::Hbm) {
                return Err(err(format!(
                    "DMA {side} space {} is not supported yet",
                    p.space.name()
                )));
            }
            if c.rows > 1 && stride < c.row_bytes {
                return Err(err(format!(
                    "DMA {side} stride {stride} is below the row size {}",
                    c.row_bytes
                )));
            }
        }
        Ok(())
    }
}

/// Throughput of a unit for `dtype` (TFLOP/s or GFLOP/s, per the table).
fn rate(t: &crate::topology::PerDtype, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 | Dtype::I32 => t.f32.0,
        Dtype::F16 => t.f16.0,
        Dtype::Bf16 => t.bf16.0,
        Dtype::I8 | Dtype::U8 => t.i8.0,
    }
}
