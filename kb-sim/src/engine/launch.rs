//! The host program: its steps (launch, wait, free) run in order once the
//! tensors are deployed. A launch fans out host -> io_cpu -> m_cpu ->
//! pe_cpu to the SIPs, cubes and PEs it runs on, behind a start barrier
//! stamped by io_cpu; each PE runs its share of the grid's programs; its
//! completion travels back pe_cpu -> m_cpu -> io_cpu -> host, aggregated
//! per cube and per SIP. A wait resumes the host when that message arrives.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

use kb_format::{Dep, DepKind, Ps};

use super::{Arrive, CONTROL_BYTES, Engine, SimError};
use crate::component::Request;
use crate::event::ns_to_ps;
use crate::kernel::{self, Executor, Grid, KernelArgs, KernelFn};
use crate::machine::{NodeKind, PeCoord, pes_within};
use crate::program::{PeProgram, Reply};

/// What a launch runs on its PEs.
pub enum LaunchBody {
    /// A kernel: the grid's programs are dealt to the launch's PEs in turn
    /// (program k to PE k mod P), and each PE runs its share in order.
    Kernel {
        kernel: KernelFn,
        args: Arc<KernelArgs>,
        executor: Executor,
    },
    /// One hand-written program per PE of the launch, in its PE order.
    Scripts(Vec<Box<dyn PeProgram>>),
}

impl std::fmt::Debug for LaunchBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchBody::Kernel { executor, .. } => write!(f, "Kernel({executor:?})"),
            LaunchBody::Scripts(p) => write!(f, "Scripts({})", p.len()),
        }
    }
}

/// One launch of a host program.
#[derive(Debug)]
pub struct LaunchSpec {
    /// The kernel's name (records, errors, the trace's launch list).
    pub name: String,
    /// The PEs it runs on, in program-assignment order; no duplicates.
    pub pes: Vec<PeCoord>,
    /// Programs along axes 0, 1 and 2.
    pub grid: Grid,
    pub body: LaunchBody,
}

/// A step of a host program.
#[derive(Debug)]
pub enum Step {
    /// Start a launch; the host goes on at once.
    Launch(LaunchSpec),
    /// Block the host until launch `n` (counting launches from 0) has
    /// completed and the host has heard so.
    Wait(usize),
    /// Free a tensor: wait for every launch so far, then unmap it through
    /// the fabric (VA pages, LA segments; nothing to send under PA).
    Free(u32),
}

/// What the host is blocked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostWait {
    /// The deploy (host writes and map acknowledgements).
    Deploy,
    Running,
    Launch(u32),
    AllLaunches,
    Done,
}

/// A launch in flight or done.
#[derive(Debug)]
pub(super) struct LaunchState {
    pub(super) spec: LaunchSpec,
    pub(super) t_start: Option<Ps>,
    pub(super) t_end: Ps,
    /// FLOPs its compute ops executed, and the useful part of them.
    flops: u64,
    useful_flops: u64,
    /// The host's clock when it launched (kernels acquire it as they start).
    start_clock: crate::race::Clock,
    /// The join of its kernels' clocks at their ends (the host acquires it
    /// when it hears the launch is done).
    end_clock: crate::race::Clock,
    /// Per dense cube index: its PEs in this launch not yet reported.
    cube_left: Vec<u32>,
    /// Per SIP: its cubes in this launch not yet reported.
    sip_left: Vec<u32>,
    /// SIPs not yet reported to the host.
    sips_left: u32,
    pub(super) done: bool,
    /// Its `launch` sync record: open from the host's launch to the first
    /// kernel start, then its op id.
    record: LaunchRecord,
    /// What the host had last finished when it launched.
    cause: Option<Dep>,
    /// The `kernel_end` record of its last kernel to end.
    last_end: Option<(Ps, u64)>,
    /// Bytes each link had carried when its first kernel started.
    link_bytes_at_start: Vec<u64>,
    /// Its share of the fabric, once done.
    fabric: super::FabricLoad,
    /// Its PEs, shared by its kernels' bodies (made at its first kernel
    /// start: a copy per kernel was P x P coordinates at P PEs).
    pes_shared: Option<Arc<[PeCoord]>>,
    /// Its PEs in the machine's order (the fanouts take each SIP's and
    /// cube's run of them), and beside each its slot in `spec.pes`, the
    /// slots of a PE listed twice in order: a kernel start finds its slot
    /// by a search (a scan of `spec.pes` per start was P x P comparisons
    /// at P PEs).
    sorted_pes: Vec<PeCoord>,
    sorted_slots: Vec<u32>,
}

impl LaunchState {
    /// Its share of the fabric (once done; empty before).
    pub(super) fn take_fabric(&mut self) -> super::FabricLoad {
        std::mem::take(&mut self.fabric)
    }
}

/// A launch's `launch` sync record.
#[derive(Debug, Clone, Copy)]
enum LaunchRecord {
    Open(super::OpenOp),
    Closed(u64),
}

/// Launch-protocol message arrivals.
#[derive(Debug, Clone, Copy)]
pub(super) enum LaunchArrive {
    AtIo {
        launch: u32,
        sip: u32,
    },
    AtMcpu {
        launch: u32,
        sip: u32,
        cube: u32,
        target: Ps,
    },
    AtPe {
        launch: u32,
        pe: u32,
        target: Ps,
    },
    DoneAtMcpu {
        launch: u32,
        sip: u32,
        cube: u32,
    },
    DoneAtIo {
        launch: u32,
        sip: u32,
    },
    DoneAtHost {
        launch: u32,
    },
}

/// Launch-protocol steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum LaunchAct {
    IoFanout {
        launch: u32,
        sip: u32,
        target: Ps,
    },
    McpuFanout {
        launch: u32,
        sip: u32,
        cube: u32,
        target: Ps,
    },
    KernelStart {
        launch: u32,
        pe: u32,
    },
    McpuReport {
        launch: u32,
        sip: u32,
        cube: u32,
    },
    IoReport {
        launch: u32,
        sip: u32,
    },
}

impl From<LaunchArrive> for Arrive {
    fn from(a: LaunchArrive) -> Arrive {
        Arrive::Launch(a)
    }
}

/// Per-PE launch state.
#[derive(Debug, Default)]
pub(super) struct PeLaunches {
    /// The launch whose kernel runs here now.
    pub(super) current: Option<u32>,
    /// Launches whose start arrived while another ran, in arrival order.
    queued: VecDeque<u32>,
    /// The `kernel_end` record of the last kernel that ran here.
    last_end: Option<u64>,
}

impl<W: Write> Engine<'_, W> {
    /// Run host steps until one blocks or the program ends. After the last
    /// step the host waits for every launch, then frees what is left.
    pub(super) fn host_continue(&mut self) -> Result<(), SimError> {
        loop {
            if let Some(step) = self.steps.pop_front() {
                match step {
                    Step::Launch(spec) => self.start_launch(spec)?,
                    Step::Wait(n) => {
                        if self.launches.get(n).is_some_and(|l| !l.done) {
                            self.host_wait = HostWait::Launch(n as u32);
                            return Ok(());
                        }
                        self.host_acquire(Some(n));
                    }
                    Step::Free(t) => {
                        if self.launches.iter().any(|l| !l.done) {
                            self.steps.push_front(Step::Free(t));
                            self.host_wait = HostWait::AllLaunches;
                            return Ok(());
                        }
                        self.host_acquire(None);
                        self.free_tensor(t);
                    }
                }
                continue;
            }
            if self.launches.iter().any(|l| !l.done) {
                self.host_wait = HostWait::AllLaunches;
                return Ok(());
            }
            // The end of the program frees every tensor still mapped.
            for t in 0..self.tensors.len() as u32 {
                self.free_tensor(t);
            }
            self.host_wait = HostWait::Done;
            return Ok(());
        }
    }

    /// The host has heard that launch `n` (or, with `None`, every launch)
    /// is done: it acquires what their kernels did. Once every launch is
    /// done, every later access is ordered after every earlier one, so the
    /// race detector forgets them.
    fn host_acquire(&mut self, n: Option<usize>) {
        let host = self.sync.host;
        for (k, l) in self.launches.iter().enumerate() {
            if n.is_none_or(|n| n == k) && l.done {
                self.sync.clocks.acquire(host, &l.end_clock);
            }
        }
        if self.launches.iter().all(|l| l.done) {
            for l in &self.launches {
                self.sync.clocks.acquire(host, &l.end_clock);
            }
            self.sync.quiesce();
        }
    }

    fn free_tensor(&mut self, t: u32) {
        if !std::mem::replace(&mut self.freed[t as usize], true) {
            self.send_tensor_mappings(t, true);
        }
    }

    fn start_launch(&mut self, spec: LaunchSpec) -> Result<(), SimError> {
        let id = self.launches.len() as u32;
        let c = self.m.topo.counts;
        let mut cube_left = vec![0u32; (c.sips * c.cubes_per_sip) as usize];
        let mut sip_left = vec![0u32; c.sips as usize];
        for p in &spec.pes {
            let cube = (p.sip * c.cubes_per_sip + p.cube) as usize;
            if cube_left[cube] == 0 {
                sip_left[p.sip as usize] += 1;
            }
            cube_left[cube] += 1;
        }
        let sips_left = sip_left.iter().filter(|&&n| n > 0).count() as u32;
        let mut order: Vec<(PeCoord, u32)> = spec.pes.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let (sorted_pes, sorted_slots) = order.into_iter().unzip();
        let start_clock = self.sync.clocks.release(self.sync.host);
        let record = LaunchRecord::Open(self.sync_open(self.m.host(), "launch"));
        let cause = self.host_last.map(|(_, op)| Dep {
            op,
            kind: DepKind::Host,
        });
        self.launches.push(LaunchState {
            record,
            cause,
            last_end: None,
            spec,
            start_clock,
            end_clock: crate::race::Clock::default(),
            t_start: None,
            t_end: 0,
            flops: 0,
            useful_flops: 0,
            cube_left,
            sip_left,
            sips_left,
            done: false,
            link_bytes_at_start: Vec::new(),
            fabric: super::FabricLoad::default(),
            pes_shared: None,
            sorted_pes,
            sorted_slots,
        });
        if sips_left == 0 {
            // No PE: done at once.
            self.launches[id as usize].done = true;
            return self.launch_record(id).map(|_| ());
        }
        for sip in 0..c.sips {
            if self.launches[id as usize].sip_left[sip as usize] > 0 {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                self.send(
                    self.m.host(),
                    io,
                    CONTROL_BYTES,
                    LaunchArrive::AtIo { launch: id, sip },
                );
            }
        }
        Ok(())
    }

    /// Launch `launch`'s sync record, closed now if it is still open (its
    /// first kernel starts).
    fn launch_record(&mut self, launch: u32) -> Result<u64, SimError> {
        let l = &self.launches[launch as usize];
        match l.record {
            LaunchRecord::Closed(id) => Ok(id),
            LaunchRecord::Open(open) => {
                let cause = l.cause;
                let id = self.sync_close(open, cause.as_slice())?;
                self.launches[launch as usize].record = LaunchRecord::Closed(id);
                Ok(id)
            }
        }
    }

    /// The latest any PE of the launch on `sip` can receive a launch
    /// stamped at io_cpu: uncontended fan-out latency plus the m_cpu and
    /// pe_cpu handling.
    fn launch_lead(&self, launch: u32, sip: u32) -> Ps {
        let io = self.m.sip_node(sip, NodeKind::IoCpu);
        let handle = ns_to_ps(self.m.topo.cpu.handle_ns.0);
        pes_within(
            &self.launches[launch as usize].sorted_pes,
            (sip, 0),
            (sip, u32::MAX),
        )
        .iter()
        .map(|p| {
            let mcpu = self.m.cube_node(sip, p.cube, NodeKind::MCpu);
            let cpu = self.m.pe_node(*p, NodeKind::PeCpu);
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

    pub(super) fn launch_arrive(&mut self, a: LaunchArrive) -> Result<(), SimError> {
        match a {
            LaunchArrive::AtIo { launch, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                let target = end.saturating_add(self.launch_lead(launch, sip));
                self.at_launch(
                    end,
                    LaunchAct::IoFanout {
                        launch,
                        sip,
                        target,
                    },
                );
            }
            LaunchArrive::AtMcpu {
                launch,
                sip,
                cube,
                target,
            } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let end = self.serve(mcpu, Request::control());
                self.at_launch(
                    end,
                    LaunchAct::McpuFanout {
                        launch,
                        sip,
                        cube,
                        target,
                    },
                );
            }
            LaunchArrive::AtPe { launch, pe, target } => {
                let cpu = self
                    .m
                    .pe_node(self.m.pe_coord(pe as usize), NodeKind::PeCpu);
                let end = self.serve(cpu, Request::control());
                self.at_launch(end.max(target), LaunchAct::KernelStart { launch, pe });
            }
            LaunchArrive::DoneAtMcpu { launch, sip, cube } => {
                let c = self.m.topo.counts;
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let end = self.serve(mcpu, Request::control());
                let left = &mut self.launches[launch as usize].cube_left
                    [(sip * c.cubes_per_sip + cube) as usize];
                *left -= 1;
                if *left == 0 {
                    self.at_launch(end, LaunchAct::McpuReport { launch, sip, cube });
                }
            }
            LaunchArrive::DoneAtIo { launch, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let end = self.serve(io, Request::control());
                let left = &mut self.launches[launch as usize].sip_left[sip as usize];
                *left -= 1;
                if *left == 0 {
                    self.at_launch(end, LaunchAct::IoReport { launch, sip });
                }
            }
            LaunchArrive::DoneAtHost { launch } => {
                let l = &mut self.launches[launch as usize];
                l.sips_left -= 1;
                if l.sips_left == 0 {
                    l.done = true;
                    // The links' bytes since its first kernel started (none
                    // started: no share).
                    let mut bytes = std::mem::take(&mut l.link_bytes_at_start);
                    if bytes.len() == self.links.len() {
                        for (b, now) in bytes.iter_mut().zip(&self.links) {
                            *b = now.bytes - *b;
                        }
                        l.fabric = super::FabricLoad::of(self.m, &bytes);
                    }
                    if let Some((_, end)) = l.last_end {
                        self.host_done(end);
                    }
                    let resume = match self.host_wait {
                        HostWait::Launch(n) => n == launch,
                        HostWait::AllLaunches => self.launches.iter().all(|l| l.done),
                        _ => false,
                    };
                    if resume {
                        match self.host_wait {
                            HostWait::Launch(n) => self.host_acquire(Some(n as usize)),
                            _ => self.host_acquire(None),
                        }
                        self.host_wait = HostWait::Running;
                        self.host_continue()?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn launch_act(&mut self, a: LaunchAct) -> Result<(), SimError> {
        match a {
            LaunchAct::IoFanout {
                launch,
                sip,
                target,
            } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                let mut cubes: Vec<u32> = pes_within(
                    &self.launches[launch as usize].sorted_pes,
                    (sip, 0),
                    (sip, u32::MAX),
                )
                .iter()
                .map(|p| p.cube)
                .collect();
                cubes.dedup();
                for cube in cubes {
                    let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                    self.send(
                        io,
                        mcpu,
                        CONTROL_BYTES,
                        LaunchArrive::AtMcpu {
                            launch,
                            sip,
                            cube,
                            target,
                        },
                    );
                }
            }
            LaunchAct::McpuFanout {
                launch,
                sip,
                cube,
                target,
            } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let pes: Vec<PeCoord> = pes_within(
                    &self.launches[launch as usize].sorted_pes,
                    (sip, cube),
                    (sip, cube),
                )
                .to_vec();
                for pc in pes {
                    let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
                    let pe = self.m.pe_index(pc) as u32;
                    self.send(
                        mcpu,
                        cpu,
                        CONTROL_BYTES,
                        LaunchArrive::AtPe { launch, pe, target },
                    );
                }
            }
            LaunchAct::KernelStart { launch, pe } => {
                if self.pe_launches[pe as usize].current.is_some() {
                    self.pe_launches[pe as usize].queued.push_back(launch);
                } else {
                    self.start_kernel(launch, pe)?;
                }
            }
            LaunchAct::McpuReport { launch, sip, cube } => {
                let mcpu = self.m.cube_node(sip, cube, NodeKind::MCpu);
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                self.send(
                    mcpu,
                    io,
                    CONTROL_BYTES,
                    LaunchArrive::DoneAtIo { launch, sip },
                );
            }
            LaunchAct::IoReport { launch, sip } => {
                let io = self.m.sip_node(sip, NodeKind::IoCpu);
                self.send(
                    io,
                    self.m.host(),
                    CONTROL_BYTES,
                    LaunchArrive::DoneAtHost { launch },
                );
            }
        }
        Ok(())
    }

    /// Start launch `launch`'s kernel on PE `pe` (dense index).
    fn start_kernel(&mut self, launch: u32, pe: u32) -> Result<(), SimError> {
        let now = self.q.now();
        if self.stats.kernel_start == 0 {
            self.stats.kernel_start = now;
        }
        let pc = self.m.pe_coord(pe as usize);
        let l = &mut self.launches[launch as usize];
        if l.t_start.is_none() {
            l.link_bytes_at_start.clear();
            l.link_bytes_at_start
                .extend(self.links.iter().map(|k| k.bytes));
        }
        l.t_start = Some(l.t_start.map_or(now, |t| t.min(now)));
        let at = l.sorted_pes.partition_point(|&p| p < pc);
        assert!(
            l.sorted_pes.get(at) == Some(&pc),
            "a launch starts only on its PEs"
        );
        let slot = l.sorted_slots[at] as usize;
        let program: Box<dyn PeProgram> = match &mut l.spec.body {
            LaunchBody::Kernel {
                kernel,
                args,
                executor,
            } => {
                let tcm = self.kernel_tcm[pe as usize].clone();
                let pes = l
                    .pes_shared
                    .get_or_insert_with(|| l.spec.pes.as_slice().into())
                    .clone();
                let body =
                    kernel::grid_body(*kernel, args.clone(), pes, slot as u32, l.spec.grid, tcm);
                executor
                    .spawn(format!("{}[{slot}]", l.spec.name), body)
                    .map_err(|message| SimError::Kernel {
                        pe: pc,
                        time_ns: super::ns(now),
                        message: format!("starting kernel {}: {message}", l.spec.name),
                    })?
            }
            LaunchBody::Scripts(programs) => std::mem::replace(
                &mut programs[slot],
                Box::new(crate::program::Script::new(Vec::new())),
            ),
        };
        self.programs[pe as usize] = program;
        self.pe_launches[pe as usize].current = Some(launch);
        self.pes[pe as usize] = super::PeState::default();
        // On record: the launch (a kernel queued behind another on this
        // PE also waited for that one's end).
        let launch_rec = self.launch_record(launch)?;
        let mut deps = vec![Dep {
            op: launch_rec,
            kind: DepKind::Host,
        }];
        if let Some(op) = self.pe_launches[pe as usize].last_end {
            deps.push(Dep {
                op,
                kind: DepKind::Resource,
            });
        }
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        let start = self.sync_instant(cpu, "kernel_start", &deps)?;
        self.pes[pe as usize].after = Some(Dep {
            op: start,
            kind: DepKind::Program,
        });
        let start = self.launches[launch as usize].start_clock.clone();
        self.sync.clocks.acquire(pe, &start);
        self.step_program(pe, Reply::Go)
    }

    /// PE `pe`'s kernel ended: report to its m_cpu, start the next launch
    /// queued on it.
    pub(super) fn kernel_finished(&mut self, pe: u32) -> Result<(), SimError> {
        let now = self.q.now();
        let launch = self.pe_launches[pe as usize]
            .current
            .take()
            .expect("a finished kernel belongs to a launch");
        let clock = self.sync.clocks.release(pe);
        let pc = self.m.pe_coord(pe as usize);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        let after = self.pes[pe as usize].after;
        let end = self.sync_instant(cpu, "kernel_end", after.as_slice())?;
        self.pe_launches[pe as usize].last_end = Some(end);
        let l = &mut self.launches[launch as usize];
        l.t_end = l.t_end.max(now);
        if l.last_end.is_none_or(|(t, _)| t <= now) {
            l.last_end = Some((now, end));
        }
        // Merged in the clocks' scratch, the published clock kept for a
        // later release: no allocation per kernel end.
        self.sync.clocks.join_into(&mut l.end_clock, &clock);
        self.sync.clocks.give_back(clock);
        let mcpu = self.m.cube_node(pc.sip, pc.cube, NodeKind::MCpu);
        self.send(
            cpu,
            mcpu,
            CONTROL_BYTES,
            LaunchArrive::DoneAtMcpu {
                launch,
                sip: pc.sip,
                cube: pc.cube,
            },
        );
        if let Some(next) = self.pe_launches[pe as usize].queued.pop_front() {
            self.start_kernel(next, pe)?;
        }
        Ok(())
    }

    /// Count a compute op PE `pe` issued against its current launch.
    pub(super) fn count_flops(&mut self, pe: u32, flops: u64, useful: u64) {
        // Programs run without a host program (engine tests) count nowhere.
        let Some(launch) = self.pe_launches[pe as usize].current else {
            return;
        };
        let l = &mut self.launches[launch as usize];
        l.flops = l.flops.saturating_add(flops);
        // Padding never adds useful work, so useful <= executed holds.
        l.useful_flops = l.useful_flops.saturating_add(useful.min(flops));
    }

    /// The trace's list of launches.
    pub(super) fn launch_records(&self) -> Vec<kb_format::Launch> {
        self.launches
            .iter()
            .map(|l| kb_format::Launch {
                kernel: l.spec.name.clone(),
                grid: l.spec.grid.axes(),
                pes: l.spec.pes.iter().map(|p| [p.sip, p.cube, p.pe]).collect(),
                t_start: l.t_start.unwrap_or(0),
                t_end: l.t_end,
                flops: l.flops,
                useful_flops: l.useful_flops,
            })
            .collect()
    }
}
