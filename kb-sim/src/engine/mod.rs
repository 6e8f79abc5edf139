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
//! Op-log hook (`oplog`): `hook_start` / `hook_end` are the only places
//! records are made; they wrap the service of a data-op message at the
//! component that serves it (pe_dma for DMA commands, hbm_ctrl for host
//! writes). Every data effect is applied to the data plane by an event at
//! the simulated time the record states, and numbered in application order
//! (`seq`).

use std::collections::VecDeque;

use rustc_hash::{FxHashMap as HashMap, FxHashSet};
use std::io::Write;

use kb_format::{Dep, DepKind, Extent, Ps, TraceWriter};

use crate::component::{Component, ControlCpu, HbmController, Request, Scratchpad};
use crate::data::DataPlane;
use crate::event::{EventQueue, ns_to_ps};
use crate::machine::{LinkId, Machine, NodeId, NodeKind, PeCoord};
use crate::program::{Command, Loaded, PeProgram, Reply, Script};
use crate::runtime::Tensor;

/// Size of a control message (requests, acks, launch, command issue).
pub const CONTROL_BYTES: u64 = 64;

mod acc;
mod atomic;
mod compute;
mod dma;
mod fabric;
mod host;
mod launch;
mod mmu;
mod oplog;
mod order;
mod sync;
mod va_tables;

use launch::{HostWait, LaunchAct, LaunchArrive, LaunchState, PeLaunches};
pub use launch::{LaunchBody, LaunchSpec, Step};

pub use fabric::{FabricLoad, Load};
pub use mmu::MmuStats;
use mmu::{MmuAct, MmuArrive};
use oplog::{OpLog, OpenOp};

use compute::{Compute, ComputeAct, ComputeOp, Producer, UnitQueue};
use dma::{Dma, DmaAct, DmaArrive, DmaEngines, DmaMode};
use host::{HostAct, HostArrive, HostWrite};
pub use sync::RacePolicy;
use sync::{Sync, SyncAct, SyncArrive};

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
    /// A data race found under `--races error`.
    #[error("{0}")]
    Race(String),
    /// Simulated time passed the model's limit (about 53 days).
    #[error(
        "simulated time passed {limit_s:.0} s, the model's limit, at an event of {what}: the topology's latencies and bandwidths with this run's sizes take longer than the model can count in picoseconds"
    )]
    TimeLimit { limit_s: f64, what: String },
}

/// What happens when a message's tail reaches its destination.
#[derive(Debug, Clone, Copy)]
enum Arrive {
    Host(HostArrive),
    Dma(DmaArrive),
    Mmu(MmuArrive),
    Launch(LaunchArrive),
    Sync(SyncArrive),
    ComputeAtUnit(u32),
    /// A compute op's operands reach its unit (head; tail at `arrival.1`).
    OperandsAtUnit(u32),
    /// A compute op's result reaches TCM.
    ResultAtTcm(u32),
    /// An accumulator writeback (`Engine::writebacks`) reaches TCM.
    AccAtTcm(u32),
    /// An op's completion notice reaches its PE's pe_cpu.
    CmdDoneAtCpu {
        pe: u32,
        cmd: CmdRef,
        kind: Done,
    },
}

/// What kind of op completed (fences count them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Load,
    Store,
    Compute,
}

/// A protocol step scheduled at a time. The rare steps with large
/// payloads (launch and mapping fan-out) wait in slabs, named by index,
/// so that every event stays small.
#[derive(Debug, Clone, Copy)]
enum Act {
    Host(HostAct),
    Dma(DmaAct),
    /// `Engine::mmu_acts[i]`.
    Mmu(u32),
    /// `Engine::launch_acts[i]`.
    Launch(u32),
    Sync(SyncAct),
    Compute(ComputeAct),
}

/// A command in flight, for completion notices: its op id, which (unlike
/// a slab index) is never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CmdRef(u64);

#[derive(Debug, Clone, Copy)]
enum Ev {
    Hop(u32),
    Arrive(u32),
    Act(Act),
}

// Events are copied into and out of the event queue's FIFOs: keep them
// within 16 bytes (a larger payload goes in a slab, as `Act::Launch`'s).
const _: () = assert!(std::mem::size_of::<Ev>() <= 16);

/// A route's links: `Routes::links[start..start + len]`.
#[derive(Debug, Clone, Copy)]
struct Route {
    start: u32,
    len: u32,
}

impl Route {
    fn is_empty(self) -> bool {
        self.len == 0
    }
}

/// The routes this run's messages took, each copied once out of the
/// machine's route memo into one array: a message names its route by a
/// `Copy` handle and a hop reads its link from there (no reference count
/// per message, no borrow of the machine's memo per send).
#[derive(Debug, Default)]
struct Routes {
    /// `(from, via or NO_VIA, to)` -> its route.
    known: HashMap<(NodeId, NodeId, NodeId), Route>,
    links: Vec<LinkId>,
    /// Per node: the last routes asked from it, `(via, to, route)`, the
    /// newest first: a node sends to a few others over and over (a PE's
    /// DMA engine to its CPU, its TCM and its cube's HBM).
    near: Vec<[(NodeId, NodeId, Route); NEAR_ROUTES]>,
}

const NEAR_ROUTES: usize = 4;

const NO_VIA: NodeId = NodeId::MAX;

#[derive(Debug)]
struct Msg {
    route: Route,
    /// Links crossed so far (a route's length is a `u32`).
    hop: u32,
    bytes: u64,
    /// When the tail is at the current node (at the source: when the last
    /// byte is ready there, for a streamed message).
    tail: Ps,
    /// When the head reached the destination (set at the last hop).
    head: Ps,
    /// Handle the message when its head arrives (a streamed transfer's
    /// next stage starts then), not its tail.
    on_head: bool,
    then: Arrive,
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

    fn peek(&self, i: u32) -> &T {
        self.items[i as usize].as_ref().expect("live slab entry")
    }

    fn remove(&mut self, i: u32) -> T {
        self.free.push(i);
        self.items[i as usize].take().expect("live slab entry")
    }
}

/// Run totals.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    pub end_time: Ps,
    pub records: u64,
    pub events: u64,
    pub kernel_start: Ps,
    /// PE_MMU traffic (VA model).
    pub mmu: MmuStats,
    /// Data races found (pairs of unordered ops; 0 with races off).
    pub races: u64,
    /// The first races, described (both ops, the bytes they share).
    pub race_reports: Vec<String>,
    /// Accumulator tiles written back from GEMM units to TCM.
    pub acc_writebacks: u64,
    /// Time the GEMM and the math units computed (their ops' FLOPs at
    /// peak rate: the active intervals, which never overlap on a serial
    /// unit), summed over the units.
    pub gemm_busy: Ps,
    pub math_busy: Ps,
    /// DMAs held until an earlier DMA of their PE touching the same bytes
    /// had finished.
    pub dma_hazards: u64,
    /// Per launch (in launch order): its busiest link and HBM.
    pub fabric: Vec<FabricLoad>,
}

pub struct Engine<'m, W: Write> {
    m: &'m Machine,
    q: EventQueue<Ev>,
    /// Per link: its timing, when it is free, the bytes it has carried.
    links: Vec<fabric::LinkState>,
    comps: Vec<Option<Box<dyn Component>>>,
    engines: Vec<DmaEngines>,
    dma_setup_ps: Ps,
    /// Every PE's VA page -> PA page table (VA model), each mapping
    /// group's runs held once.
    va_tables: va_tables::VaTables,
    /// Per PE (dense index): the BAAW segment table in its PE_DMA (LA model).
    baaw: Vec<Vec<crate::runtime::Segment>>,
    /// Added to a DMA per translated side (VA model).
    tlb_ps: Ps,
    /// Host program steps not yet run.
    steps: VecDeque<Step>,
    host_wait: HostWait,
    launches: Vec<LaunchState>,
    /// Per PE: the launch running there and those queued behind it.
    pe_launches: Vec<PeLaunches>,
    /// Per tensor: unmapped by a free step or at the end.
    freed: Vec<bool>,
    /// Per PE: the TCM allocator each kernel starts with (the program's
    /// TCM buffers reserved).
    kernel_tcm: Vec<crate::alloc::FreeList>,
    /// Per PE: its TCM buffers, as PA ranges `[start, end)`: the only TCM
    /// another PE may copy into or read from.
    tcm_buffers: Vec<Vec<(u64, u64)>>,
    /// Write snapshots of compute inputs (`--capture-inputs`).
    capture_inputs: bool,
    msgs: Slab<Msg>,
    routes: Routes,
    /// Payloads of scheduled `Act::Launch` and `Act::Mmu` steps.
    launch_acts: Slab<LaunchAct>,
    mmu_acts: Slab<MmuAct>,
    dmas: Slab<Dma>,
    computes: Slab<Compute>,
    units: Vec<UnitQueue>,
    /// Per PE (dense index): its GEMM unit's accumulator buffer.
    accs: Vec<acc::AccBuffer>,
    /// Its size in bytes (0: no buffer).
    acc_cap: u64,
    writebacks: Slab<acc::Writeback>,
    producers: HashMap<u64, Producer>,
    host_writes: Slab<HostWrite>,
    host_pending: usize,
    /// Per (tensor, SIP): shard writes not yet in HBM.
    deploy_left: Vec<u32>,
    /// Shard images of deploys in flight, shared by equal shards.
    shard_images: HashMap<crate::memory::ShardKey, host::SharedImage>,
    data: DataPlane,
    log: OpLog<W>,
    tensors: &'m [Tensor],
    /// Per PE: the program of the launch running there (an empty script
    /// when none has started).
    programs: Vec<Box<dyn PeProgram>>,
    pes: Vec<PeState>,
    replies: Vec<PendingReply>,
    /// Ops issued and not yet completed (for `WaitOp`).
    in_flight: FxHashSet<u64>,
    /// Data of completed asynchronous loads, until the kernel waits on them.
    async_data: HashMap<u64, Loaded>,
    /// Signals, barriers, clocks and race checks.
    sync: Sync,
    /// No event may happen later (times saturate rather than wrap, and the
    /// run stops past this).
    time_limit: Ps,
    /// The message being handled: when its head and its tail reached the
    /// destination.
    arrival: (Ps, Ps),
    /// Bytes a transfer streams in (`pe_dma.burst_bytes`).
    burst: u64,
    stats: RunStats,
    /// Scratch vectors reused across ops (no allocation per op): a VA
    /// side's row pieces before folding, a store's unknown source bytes,
    /// the running producers a compute op waits on.
    va_pieces: Vec<Extent>,
    unknown_scratch: Vec<crate::program::Unknown>,
    waiting_scratch: Vec<u32>,
    /// The group and piece vectors of finished DMAs, for the next ones.
    dma_sides: Vec<dma::Side>,
    /// Finished compute ops' dependents vectors, for the next ones.
    dependents_spare: Vec<Vec<compute::Waiter>>,
    /// A constant fill's bytes, before they are written to the plane.
    fill_scratch: Vec<u8>,
    /// The host-side op that ended last (an upload, a map message, a
    /// launch's last kernel end as the host hears it), with its end: the
    /// host edge of the next launch.
    host_last: Option<(Ps, u64)>,
    /// The `map`/`unmap` sync records in flight, by (tensor, mapping
    /// group, unmap, PE), with their cause.
    map_records: HashMap<MapKey, (OpenOp, Option<Dep>)>,
    /// Told the simulated time and the records so far, every
    /// `PROGRESS_EVENTS` events (display only: it sees, never steers).
    progress: Option<Box<dyn FnMut(Ps, u64) + 'm>>,
}

/// A map message's install: (tensor, mapping group, unmap, PE).
type MapKey = (u32, u32, bool, u32);

/// Events between two progress reports.
const PROGRESS_EVENTS: u64 = 1 << 18;

/// Per-PE kernel state (reset when a kernel starts).
#[derive(Debug, Clone, Default)]
struct PeState {
    /// Ops issued and not yet completed (DMAs and compute).
    outstanding: u32,
    /// Compute ops issued and not yet completed.
    computing: u32,
    /// What the program waits on: a specific DMA, or all of them.
    waiting: Wait,
    /// A command held until its fence is satisfied.
    deferred: Option<Command>,
    /// Barriers passed, per group (its members' dense indices, sorted).
    barrier_epochs: std::collections::BTreeMap<Vec<u32>, u32>,
    /// What a `Wait::Signals` waits for: (signal, at least) pairs, any.
    awaited: Vec<(u32, u64)>,
    /// Why the program runs now: the op (or wait, or kernel start) it
    /// last stopped for. Every op it issues has this program edge.
    after: Option<Dep>,
    /// The sync record of the wait (a signal, a barrier) it is in.
    wait: Option<OpenOp>,
}

/// What a release waits for before it goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fence {
    /// Compute ops (a signal: its receiver may reuse what the compute
    /// reads). Loads in flight are not waited for: they are left out of
    /// the release instead (`Engine::release`).
    Compute,
    /// Every op (a barrier).
    All,
}

impl PeState {
    fn fenced(&self, f: Fence) -> bool {
        match f {
            Fence::Compute => self.computing == 0,
            Fence::All => self.outstanding == 0,
        }
    }
}

/// Per-PE reply data: the bytes of the blocking DMA it waits on.
type PendingReply = Option<Loaded>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Wait {
    #[default]
    Nothing,
    Cmd(CmdRef),
    All,
    /// A deferred command's fence.
    Fence(Fence),
    /// One of this PE's signals reaching its value (`PeState::awaited`).
    Signals,
    /// A barrier's release.
    Barrier,
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
    /// An engine that runs one launch of hand-written programs, one per PE
    /// in `Machine::pes()` order.
    pub fn new(
        m: &'m Machine,
        writer: TraceWriter<W>,
        tensors: &'m [Tensor],
        programs: Vec<Box<dyn PeProgram>>,
    ) -> Self {
        let pes: Vec<PeCoord> = m.pes().take(programs.len()).collect();
        let launch = LaunchSpec {
            name: "script".into(),
            grid: (pes.len() as u32).into(),
            pes,
            body: LaunchBody::Scripts(programs),
        };
        Self::with_program(m, writer, tensors, vec![Step::Launch(launch)])
    }

    /// An engine that runs a host program: deploy every tensor with host
    /// data, then `steps` in order, then free every tensor.
    pub fn with_program(
        m: &'m Machine,
        writer: TraceWriter<W>,
        tensors: &'m [Tensor],
        steps: Vec<Step>,
    ) -> Self {
        let t = &m.topo;
        let comps = m
            .nodes
            .iter()
            .map(|n| -> Option<Box<dyn Component>> {
                match n.kind {
                    NodeKind::HbmCtrl => Some(Box::new(HbmController::new(t, n.sip, n.cube))),
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
        let mut kernel_tcm = vec![crate::alloc::FreeList::new(t.tcm_bytes()); n_pes];
        let mut tcm_buffers = vec![Vec::new(); n_pes];
        for tensor in tensors {
            for s in &tensor.meta.shards {
                let Some(p) =
                    kb_format::pa::Pa::decode(s.pa).filter(|p| p.space == kb_format::Space::Tcm)
                else {
                    continue;
                };
                let i = m.pe_index(PeCoord {
                    sip: p.sip,
                    cube: p.cube,
                    pe: p.pe,
                });
                let bytes = s.rows * s.row_bytes;
                let reserved = kernel_tcm[i].reserve(p.offset, bytes);
                debug_assert!(
                    reserved,
                    "TCM buffers are allocated disjoint by the runtime"
                );
                tcm_buffers[i].push((s.pa, s.pa + bytes));
            }
        }
        Engine {
            m,
            q: EventQueue::default(),
            links: m.links.iter().map(fabric::LinkState::new).collect(),
            comps,
            engines: (0..n_pes)
                .map(|_| DmaEngines {
                    idle: t.pe_dma.engines,
                    waiting: VecDeque::new(),
                    unfinished: Vec::new(),
                    held: Vec::new(),
                })
                .collect(),
            dma_setup_ps: ns_to_ps(t.pe_dma.setup_ns.0),
            va_tables: va_tables::VaTables::new(n_pes, tensors.iter().map(|t| t.mappings.len())),
            baaw: vec![Vec::new(); n_pes],
            tlb_ps: ns_to_ps(t.pe_mmu.tlb_overhead_ns.0),
            steps: steps.into(),
            host_wait: HostWait::Deploy,
            launches: Vec::new(),
            pe_launches: (0..n_pes).map(|_| PeLaunches::default()).collect(),
            freed: vec![false; tensors.len()],
            kernel_tcm,
            tcm_buffers,
            capture_inputs: false,
            msgs: Slab::new(),
            routes: Routes {
                near: vec![
                    [(NO_VIA, NO_VIA, Route { start: 0, len: 0 }); NEAR_ROUTES];
                    m.nodes.len()
                ],
                ..Routes::default()
            },
            launch_acts: Slab::new(),
            mmu_acts: Slab::new(),
            dmas: Slab::new(),
            computes: Slab::new(),
            units: (0..m.nodes.len()).map(|_| UnitQueue::default()).collect(),
            accs: (0..n_pes).map(|_| acc::AccBuffer::default()).collect(),
            acc_cap: u64::from(t.pe_gemm.acc_kib) * 1024,
            writebacks: Slab::new(),
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
            shard_images: HashMap::default(),
            data: DataPlane::new(),
            log: OpLog::new(writer, m.nodes.len()),
            tensors,
            pes: (0..n_pes).map(|_| PeState::default()).collect(),
            replies: vec![None; n_pes],
            in_flight: Default::default(),
            async_data: HashMap::default(),
            sync: Sync::new(n_pes),
            time_limit: crate::event::MAX_TIME,
            arrival: (0, 0),
            burst: t.pe_dma.burst_bytes as u64,
            programs: (0..n_pes)
                .map(|_| -> Box<dyn PeProgram> { Box::new(Script::new(Vec::new())) })
                .collect(),
            stats: RunStats::default(),
            va_pieces: Vec::new(),
            unknown_scratch: Vec::new(),
            waiting_scratch: Vec::new(),
            dma_sides: Vec::new(),
            dependents_spare: Vec::new(),
            fill_scratch: Vec::new(),
            host_last: None,
            map_records: HashMap::default(),
            progress: None,
        }
    }

    /// Snapshot every compute op's known inputs into the trace (debug
    /// mode, docs/design.md L4; `kb-replay --check-intermediates` compares).
    pub fn capture_inputs(mut self, on: bool) -> Self {
        self.capture_inputs = on;
        self
    }

    /// Stop the run with [`SimError::TimeLimit`] at any event later than
    /// `ps` (default [`crate::event::MAX_TIME`]; lower for tests).
    pub fn time_limit(mut self, ps: Ps) -> Self {
        self.time_limit = ps.min(crate::event::MAX_TIME);
        self
    }

    /// What to do with data races: ignore them, count and report them, or
    /// fail on the first.
    /// Report progress to `f` (simulated time, records so far) now and
    /// then during the run.
    pub fn progress(mut self, f: impl FnMut(Ps, u64) + 'm) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    pub fn races(mut self, policy: RacePolicy) -> Self {
        self.sync.policy = policy;
        self
    }

    /// Deploy every tensor with host data, run the host program, and run
    /// to completion.
    pub fn run(self) -> Result<(TraceWriter<W>, RunStats), SimError> {
        self.run_with_launches().map(|(w, s, _)| (w, s))
    }

    /// [`run`](Self::run), also returning the launches for the trace.
    #[allow(clippy::type_complexity)]
    pub fn run_with_launches(
        mut self,
    ) -> Result<(TraceWriter<W>, RunStats, Vec<kb_format::Launch>), SimError> {
        self.deploy();
        if self.host_pending == 0 {
            self.host_wait = HostWait::Running;
            self.host_continue()?;
        }
        let mut events = 0u64;
        while let Some((t, ev)) = self.q.pop() {
            events += 1;
            if events.is_multiple_of(PROGRESS_EVENTS)
                && let Some(f) = &mut self.progress
            {
                f(t, self.log.next_op);
            }
            if t > self.time_limit {
                let what = match ev {
                    Ev::Hop(_) | Ev::Arrive(_) => "a message",
                    Ev::Act(_) => "a protocol step",
                };
                return Err(SimError::TimeLimit {
                    limit_s: self.time_limit as f64 / 1e12,
                    what: what.into(),
                });
            }
            match ev {
                Ev::Hop(msg) => self.hop(msg),
                Ev::Arrive(msg) => {
                    let m = self.msgs.remove(msg);
                    self.arrival = (m.head, m.tail);
                    self.arrive(m.then)?;
                }
                Ev::Act(a) => self.act(a)?,
            }
        }
        let mut stuck: Vec<String> = self
            .pes
            .iter()
            .enumerate()
            .filter(|(i, _)| self.pe_launches[*i].current.is_some())
            .map(|(i, s)| {
                let what = match s.waiting {
                    Wait::Cmd(CmdRef(op)) => format!("op {op}, which will never wake it"),
                    Wait::All => format!("all of its {} outstanding ops", s.outstanding),
                    Wait::Nothing => "nothing (it was never resumed)".to_string(),
                    Wait::Fence(_) => "its earlier ops to complete before a release".to_string(),
                    Wait::Signals => {
                        let launch = self.pe_launches[i].current;
                        let each: Vec<String> = s
                            .awaited
                            .iter()
                            .map(|&(signal, at_least)| {
                                let now = self.sync.signal_value(launch, i as u32, signal);
                                format!("its signal {signal} to reach {at_least} (it is {now})")
                            })
                            .collect();
                        each.join(" or ")
                    }
                    Wait::Barrier => self.sync.barrier_wait(i as u32, self.m),
                };
                format!(
                    "kernel {} on {} waits for {what}",
                    self.programs[i].name(),
                    self.m.pe_coord(i)
                )
            })
            .collect();
        match self.host_wait {
            HostWait::Done => {}
            HostWait::Launch(n) => stuck.push(format!(
                "the host waits for launch {n} ({})",
                self.launches[n as usize].spec.name
            )),
            w => stuck.push(format!("the host waits ({w:?})")),
        }
        if !stuck.is_empty() {
            return Err(SimError::Stalled {
                time_ns: ns(self.q.now()),
                pes: stuck.join(", "),
            });
        }
        self.stats.end_time = self.q.now();
        self.stats.events = self.q.scheduled();
        self.stats.records = self.log.next_op;
        self.stats.races = self.sync.race_count;
        self.stats.race_reports = std::mem::take(&mut self.sync.reports);
        let launches = self.launch_records();
        self.stats.fabric = self.launches.iter_mut().map(|l| l.take_fabric()).collect();
        let mut channels: Vec<kb_format::ChannelLog> = self
            .comps
            .iter_mut()
            .flatten()
            .flat_map(|c| c.take_channel_logs())
            .collect();
        channels.sort_by_key(|c| (c.sip, c.cube, c.channel));
        self.log.writer.channel_logs(channels)?;
        Ok((self.log.writer, self.stats, launches))
    }

    // ---- fabric ----

    fn send(&mut self, from: NodeId, to: NodeId, bytes: u64, then: impl Into<Arrive>) {
        let route = self.route(from, None, to);
        self.send_route(route, bytes, then.into());
    }

    /// Send along `from -> via -> to`, or `from -> to` without a via.
    fn send_via(
        &mut self,
        from: NodeId,
        via: Option<NodeId>,
        to: NodeId,
        bytes: u64,
        then: impl Into<Arrive>,
    ) {
        let route = self.route(from, via, to);
        self.send_route(route, bytes, then.into());
    }

    /// The route `from -> via -> to`, or `from -> to` without a via.
    fn route(&mut self, from: NodeId, via: Option<NodeId>, to: NodeId) -> Route {
        let key = (from, via.unwrap_or(NO_VIA), to);
        let near = &mut self.routes.near[from as usize];
        if let Some(&(_, _, r)) = near.iter().find(|&&(v, t, _)| (v, t) == (key.1, key.2)) {
            return r;
        }
        if let Some(&r) = self.routes.known.get(&key) {
            near.rotate_right(1);
            near[0] = (key.1, key.2, r);
            return r;
        }
        let links = match via {
            Some(v) => self.m.route_via(from, v, to),
            None => self.m.route(from, to),
        };
        let r = Route {
            start: self.routes.links.len() as u32,
            len: links.len() as u32,
        };
        self.routes.links.extend_from_slice(&links);
        self.routes.known.insert(key, r);
        let near = &mut self.routes.near[from as usize];
        near.rotate_right(1);
        near[0] = (key.1, key.2, r);
        r
    }

    fn send_route(&mut self, route: Route, bytes: u64, then: Arrive) {
        let now = self.q.now();
        self.send_streamed(route, bytes, then, now, false);
    }

    /// Send a message whose head leaves now and whose last byte is ready
    /// at the source at `tail` (a streamed transfer: no link carries the
    /// tail before it is ready); handle it when its head arrives with
    /// `on_head`, else when its tail does.
    fn send_streamed(&mut self, route: Route, bytes: u64, then: Arrive, tail: Ps, on_head: bool) {
        let now = self.q.now();
        let local = route.is_empty();
        let tail = tail.max(now);
        let id = self.msgs.insert(Msg {
            route,
            hop: 0,
            bytes,
            tail,
            head: now,
            on_head,
            then,
        });
        let at = if local && !on_head { tail } else { now };
        self.q
            .push(at, if local { Ev::Arrive(id) } else { Ev::Hop(id) });
    }

    /// The head of `msg` is at the start of link `route[hop]`.
    fn hop(&mut self, id: u32) {
        let now = self.q.now();
        let flit = self.m.first_flit_ps;
        let msg = self.msgs.get(id);
        let l = self.routes.links[(msg.route.start + msg.hop) as usize] as usize;
        let link = &mut self.links[l];
        let start = now.max(link.free);
        // Saturating: a run that passes the time limit stops with an error
        // (`run_with_launches`), never wraps.
        let end = start
            .saturating_add(link.serialize_ps(msg.bytes))
            .max(msg.tail);
        link.free = end;
        link.bytes += msg.bytes;
        msg.tail = end.saturating_add(link.latency_ps);
        msg.hop += 1;
        if msg.hop == msg.route.len {
            msg.head = start.saturating_add(link.latency_ps);
            let at = if msg.on_head { msg.head } else { msg.tail };
            self.q.push(at, Ev::Arrive(id));
        } else {
            self.q
                .push(start.saturating_add(link.latency_ps + flit), Ev::Hop(id));
        }
    }

    fn serve(&mut self, node: NodeId, req: Request) -> Ps {
        let now = self.q.now();
        let c = self.comps[node as usize]
            .as_mut()
            .expect("node has a timing model");
        c.serve(now, &req).end
    }

    fn at(&mut self, t: Ps, a: impl Into<Act>) {
        let a = a.into();
        self.q.push(t, Ev::Act(a));
    }

    fn at_launch(&mut self, t: Ps, a: LaunchAct) {
        let i = self.launch_acts.insert(a);
        self.at(t, Act::Launch(i));
    }

    fn at_mmu(&mut self, t: Ps, a: MmuAct) {
        let i = self.mmu_acts.insert(a);
        self.at(t, Act::Mmu(i));
    }

    /// Host-side op `op` ended now (the host program's next step may
    /// have waited for it).
    fn host_done(&mut self, op: u64) {
        let now = self.q.now();
        if self.host_last.is_none_or(|(t, _)| t <= now) {
            self.host_last = Some((now, op));
        }
    }

    /// PE `pe`'s wait (for a signal, a barrier) ends now, caused by
    /// `cause`: its record closes, and what the program issues next
    /// waited for it.
    fn end_wait(&mut self, pe: u32, cause: Option<Dep>) -> Result<(), SimError> {
        if let Some(open) = self.pes[pe as usize].wait.take() {
            let id = self.sync_close(open, cause.as_slice())?;
            self.pes[pe as usize].after = Some(Dep {
                op: id,
                kind: DepKind::Program,
            });
        }
        Ok(())
    }

    // ---- host runtime ----

    fn arrive(&mut self, then: Arrive) -> Result<(), SimError> {
        match then {
            Arrive::Host(a) => self.host_arrive(a)?,
            Arrive::Dma(a) => self.dma_arrive(a),
            Arrive::Mmu(a) => self.mmu_arrive(a)?,
            Arrive::Launch(a) => self.launch_arrive(a)?,
            Arrive::Sync(a) => self.sync_arrive(a)?,
            Arrive::ComputeAtUnit(c) => self.compute_arrive(c),
            Arrive::OperandsAtUnit(c) => self.operands_at_unit(c),
            Arrive::ResultAtTcm(c) => self.result_at_tcm(c),
            Arrive::AccAtTcm(w) => self.acc_at_tcm(w),
            Arrive::CmdDoneAtCpu { pe, cmd, kind } => {
                self.in_flight.remove(&cmd.0);
                let s = &mut self.pes[pe as usize];
                s.outstanding -= 1;
                match kind {
                    Done::Compute => s.computing -= 1,
                    Done::Load | Done::Store => {}
                }
                // The program resumes (below) because this op is done:
                // what it issues next waited for it.
                let resumed = Some(Dep {
                    op: cmd.0,
                    kind: DepKind::Program,
                });
                match s.waiting {
                    Wait::Cmd(c) if c == cmd => {}
                    Wait::All if s.outstanding == 0 => {}
                    Wait::Fence(f) if s.fenced(f) => {
                        s.after = resumed;
                        s.waiting = Wait::Nothing;
                        let deferred = s.deferred.take().expect("a fence holds a command");
                        if let Some(reply) = self.run_command(pe, deferred)? {
                            self.step_program(pe, reply)?;
                        }
                        return Ok(());
                    }
                    _ => return Ok(()),
                }
                s.after = resumed;
                s.waiting = Wait::Nothing;
                let data = match self.replies[pe as usize].take() {
                    Some(d) => Some(d),
                    None => self.async_data.remove(&cmd.0),
                };
                let reply = match data {
                    Some(data) => Reply::Data(data),
                    None => Reply::Done,
                };
                self.step_program(pe, reply)?;
            }
        }
        Ok(())
    }

    fn act(&mut self, a: Act) -> Result<(), SimError> {
        match a {
            Act::Host(a) => self.host_act(a)?,
            Act::Dma(a) => self.dma_act(a)?,
            Act::Mmu(i) => {
                let a = self.mmu_acts.remove(i);
                self.mmu_act(a)
            }
            Act::Launch(i) => {
                let a = self.launch_acts.remove(i);
                self.launch_act(a)?
            }
            Act::Sync(a) => self.sync_act(a)?,
            Act::Compute(a) => self.compute_act(a)?,
        }
        Ok(())
    }

    /// Resume a PE's program: issue commands until it blocks or ends.
    fn step_program(&mut self, pe: u32, mut reply: Reply) -> Result<(), SimError> {
        let pc = self.m.pe_coord(pe as usize);
        loop {
            let program = &mut self.programs[pe as usize];
            let next = program.resume(std::mem::replace(&mut reply, Reply::Go));
            let cmd = match next {
                Ok(Some(cmd)) => cmd,
                Ok(None) => return self.kernel_finished(pe),
                Err(message) => {
                    return Err(SimError::Kernel {
                        pe: pc,
                        time_ns: ns(self.q.now()),
                        message: format!("kernel {} failed: {message}", program.name()),
                    });
                }
            };
            match self.run_command(pe, cmd)? {
                Some(r) => reply = r,
                None => return Ok(()),
            }
        }
    }

    /// Run one command of PE `pe`'s program: `Some(reply)` resumes the
    /// program at once, `None` when it waits (for an op, a fence, a signal
    /// or a barrier).
    fn run_command(&mut self, pe: u32, cmd: Command) -> Result<Option<Reply>, SimError> {
        let pc = self.m.pe_coord(pe as usize);
        let p = pe as usize;
        Ok(match cmd {
            Command::Atomic(c) => {
                let op_id = self.issue_atomic(pc, pe, c)?;
                self.pes[p].waiting = Wait::Cmd(CmdRef(op_id));
                None
            }
            Command::Dma(c) => {
                let op_id = self.issue_dma(pc, pe, c, DmaMode::Load, None, None)?;
                self.pes[p].waiting = Wait::Cmd(CmdRef(op_id));
                None
            }
            Command::DmaAsync(c) => Some(Reply::Issued(self.issue_dma(
                pc,
                pe,
                c,
                DmaMode::Load,
                None,
                None,
            )?)),
            Command::Store(c) => Some(Reply::Issued(self.issue_dma(
                pc,
                pe,
                c,
                DmaMode::Store,
                None,
                None,
            )?)),
            Command::Send { cmd, notify } => Some(Reply::Issued(self.issue_dma(
                pc,
                pe,
                cmd,
                DmaMode::Store,
                notify,
                None,
            )?)),
            Command::Signal { pe: to, signal, op } => {
                if !self.pes[p].fenced(Fence::Compute) {
                    let cmd = Command::Signal { pe: to, signal, op };
                    self.defer(pe, cmd, Fence::Compute);
                    return Ok(None);
                }
                self.check_pe(pc, to, "signal")?;
                let clock = self.release(pe);
                let launch = self.current_launch(pe);
                let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
                let cause = self.pes[p].after;
                self.send_signal_update(cpu, launch, to, signal, op, clock, cause);
                Some(Reply::Done)
            }
            Command::WaitSignal(any) => {
                let launch = self.current_launch(pe);
                if self.sync.acquire_reached(launch, pe, &any) {
                    crate::program::spare_signal_list(any);
                    Some(Reply::Done)
                } else {
                    let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
                    self.pes[p].wait = Some(self.sync_open(cpu, "wait_signal"));
                    self.pes[p].awaited = any;
                    self.pes[p].waiting = Wait::Signals;
                    None
                }
            }
            Command::ReadSignal(signal) => {
                let launch = self.current_launch(pe);
                self.sync.acquire_signal(launch, pe, signal);
                Some(Reply::Value(self.sync.signal_value(
                    Some(launch),
                    pe,
                    signal,
                )))
            }
            Command::Barrier(members) => {
                if !self.pes[p].fenced(Fence::All) {
                    self.defer(pe, Command::Barrier(members), Fence::All);
                    return Ok(None);
                }
                self.barrier_arrive(pe, members)?;
                None
            }
            Command::WaitOp(op_id) => {
                if self.in_flight.contains(&op_id) {
                    self.pes[p].waiting = Wait::Cmd(CmdRef(op_id));
                    return Ok(None);
                }
                Some(match self.async_data.remove(&op_id) {
                    Some(data) => Reply::Data(data),
                    None => Reply::Done,
                })
            }
            Command::Gemm(g) => {
                self.count_flops(pe, g.op.flops(), g.useful_flops);
                Some(Reply::Issued(self.issue_compute(
                    pc,
                    pe,
                    ComputeOp::Gemm(g),
                )?))
            }
            Command::Math(m) => {
                self.count_flops(pe, m.op.flops(), m.useful_flops);
                Some(Reply::Issued(self.issue_compute(
                    pc,
                    pe,
                    ComputeOp::Math(m),
                )?))
            }
            Command::WaitAll => {
                if self.pes[p].outstanding > 0 {
                    self.pes[p].waiting = Wait::All;
                    return Ok(None);
                }
                Some(Reply::Done)
            }
        })
    }

    /// Hold `cmd` until PE `pe`'s fence `f` is satisfied.
    fn defer(&mut self, pe: u32, cmd: Command, f: Fence) {
        let s = &mut self.pes[pe as usize];
        s.deferred = Some(cmd);
        s.waiting = Wait::Fence(f);
    }
}
