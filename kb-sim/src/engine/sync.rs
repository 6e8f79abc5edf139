//! Synchronization between PEs, and the race detector built on it.
//!
//! - **Signals**: per (launch, PE, signal id) a 64-bit value. A signal
//!   update (`Tl::signal`, or a copy's notification) is a control message
//!   through the fabric to the target's pe_cpu, which serves it and then
//!   applies it; a PE waiting for its signal to reach a value resumes then.
//!   Signals belong to a launch, so a later launch starts from zero and an
//!   update that arrives before its kernel starts is kept for it.
//! - **Barriers**: over a group of PEs of the running launch; the first
//!   member's pe_cpu coordinates. Each member sends an arrival there (after
//!   its fence); the coordinator serves every arrival, then sends a release
//!   to each member, whose pe_cpu serves it before the kernel resumes. So a
//!   barrier costs its 2 x (members) messages and their handling, no less.
//! - **Fences**: stores, copies and compute ops apply their data effects
//!   at issue, loads when they are served. A signal waits for the PE's
//!   compute ops (its receiver may reuse what they read), a barrier for
//!   every op; a notifying copy waits for nothing. Loads in flight are
//!   not waited for: they are left out of the release (`Engine::release`
//!   relabels them as issued after it), so the race detector still checks
//!   them against whatever the release orders. A kernel that wants a load
//!   covered waits for it first (`Tl::wait`), as a real DMA engine's
//!   asynchronous reads are not fenced by a flag write.
//! - **Notifications in order**: a copy's notification is raised once its
//!   bytes, and those of every earlier notifying copy from the same PE to
//!   the same signal, have arrived (`copy_landed_notify`): a counting
//!   signal counts messages in the order they were sent, even when a
//!   shorter or TCM-sourced copy lands before an earlier one.
//! - **Happens-before** (`crate::race`): releases at signals, barrier
//!   arrivals, notifying copies, kernel ends and launches; acquires at
//!   satisfied waits, barrier releases, kernel starts and the host's
//!   waits. Every HBM and SRAM access, and TCM accesses within TCM buffers
//!   (the only TCM another PE can reach), is checked when its effect is
//!   applied.

use std::collections::BTreeMap;
use std::io::Write;
use std::rc::Rc;

use kb_format::pa::{self, Pa};
use kb_format::{Dep, DepKind, Extent, Space};

use super::{Act, Arrive, CONTROL_BYTES, Engine, OpenOp, SimError, Slab, Wait, ns};
use crate::component::Request;
use crate::machine::{Machine, NodeId, NodeKind, PeCoord};
use crate::program::{Reply, SignalOp};
use crate::race::{Access, Clock, Clocks, OpInfo, Race, Shadow};

/// What to do about data races (`kb-sim --races`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RacePolicy {
    /// Do not look for them.
    Off,
    /// Report them (on stderr) and count them in the summary.
    #[default]
    Warn,
    /// Fail the run at the first, naming both ops.
    Error,
}

impl RacePolicy {
    /// The policy named `off`, `warn` or `error`.
    pub fn parse(s: &str) -> Option<RacePolicy> {
        match s {
            "off" => Some(RacePolicy::Off),
            "warn" => Some(RacePolicy::Warn),
            "error" => Some(RacePolicy::Error),
            _ => None,
        }
    }
}

/// Sync-protocol message arrivals.
#[derive(Debug, Clone, Copy)]
pub(super) enum SyncArrive {
    /// A signal update at its PE's pe_cpu.
    Signal(u32),
    /// A barrier arrival at the coordinator's pe_cpu.
    BarrierArrive(u32),
    /// A barrier release at a member's pe_cpu.
    BarrierRelease { barrier: u32, pe: u32 },
}

/// Sync-protocol steps.
#[derive(Debug, Clone, Copy)]
pub(super) enum SyncAct {
    SignalApply(u32),
    BarrierCounted(u32),
    BarrierResume { barrier: u32, pe: u32 },
}

impl From<SyncArrive> for Arrive {
    fn from(a: SyncArrive) -> Arrive {
        Arrive::Sync(a)
    }
}

impl From<SyncAct> for Act {
    fn from(a: SyncAct) -> Act {
        Act::Sync(a)
    }
}

/// The issuing PE's clock when an op was issued: its label, its clock
/// (shared), and its launch.
#[derive(Debug, Clone)]
pub(super) struct HbTag {
    pub(super) label: u32,
    clock: Rc<Clock>,
    pub(super) launch: u32,
}

/// A signal update in flight.
#[derive(Debug)]
struct Update {
    launch: u32,
    pe: u32,
    signal: u32,
    op: SignalOp,
    clock: Clock,
    /// Its `signal` sync record, from sending to applying.
    record: OpenOp,
    /// Why it was sent: the sender's program, or the copy it notifies.
    cause: Option<Dep>,
}

/// A signal's value and the join of the clocks of its updates.
#[derive(Debug, Default)]
struct SignalState {
    value: u64,
    clock: Clock,
    /// Raised whenever an update raises `clock`.
    version: u64,
    /// `version` when its PE (the only one that acquires it) last joined
    /// `clock`: while they are equal, a join would raise nothing (a PE's
    /// clock never goes down), so it is skipped.
    acquired: u64,
}

/// One barrier instance (a group's n-th barrier in a launch).
#[derive(Debug)]
struct Barrier {
    key: (u32, Vec<u32>, u32),
    /// Members' dense indices, the coordinator first.
    members: Vec<u32>,
    arrived: u32,
    released: u32,
    clock: Clock,
    /// What the last member to arrive had last finished: the release's
    /// cause.
    last_cause: Option<Dep>,
}

/// Most races reported in full; the rest are counted.
const REPORTED_RACES: usize = 20;

#[derive(Debug)]
pub(super) struct Sync {
    pub(super) clocks: Clocks,
    pub(super) policy: RacePolicy,
    shadow: Shadow,
    /// Scratch for the shadow's findings.
    found: Vec<Race>,
    /// Races reported so far (at most REPORTED_RACES) and their count.
    pub(super) reports: Vec<String>,
    pub(super) race_count: u64,
    signals: BTreeMap<(u32, u32, u32), SignalState>,
    updates: Slab<Update>,
    barriers: Slab<Barrier>,
    barrier_ids: BTreeMap<(u32, Vec<u32>, u32), u32>,
    /// Notifying copies per (sender, receiver, signal), raised in the
    /// order they were issued (`Engine::copy_landed_notify`).
    notify_order: BTreeMap<(u32, u32, u32), NotifyOrder>,
    /// The host's thread index (after the PEs).
    pub(super) host: u32,
}

/// The notifying copies from one PE to one signal of another: how many
/// were issued and raised, and those that landed before an earlier one.
#[derive(Debug, Default)]
struct NotifyOrder {
    issued: u64,
    raised: u64,
    held: BTreeMap<u64, HeldNotify>,
}

/// A landed copy's notification, waiting for an earlier one to land.
#[derive(Debug)]
pub(super) struct HeldNotify {
    pub(super) from: NodeId,
    pub(super) launch: u32,
    pub(super) notify: crate::program::Notify,
    pub(super) clock: Clock,
    pub(super) cause: Option<Dep>,
}

impl Sync {
    pub(super) fn new(pes: usize) -> Sync {
        Sync {
            clocks: Clocks::new(pes + 1),
            policy: RacePolicy::default(),
            shadow: Shadow::default(),
            found: Vec::new(),
            reports: Vec::new(),
            race_count: 0,
            signals: BTreeMap::new(),
            updates: Slab::new(),
            barriers: Slab::new(),
            barrier_ids: BTreeMap::new(),
            notify_order: BTreeMap::new(),
            host: pes as u32,
        }
    }

    /// Signal `signal` of PE `pe` in `launch` (0 if never raised).
    pub(super) fn signal_value(&self, launch: Option<u32>, pe: u32, signal: u32) -> u64 {
        launch
            .and_then(|l| self.signals.get(&(l, pe, signal)))
            .map_or(0, |s| s.value)
    }

    /// Whether any `(signal, at_least)` of PE `pe` in `launch` is reached;
    /// if so, the PE acquires every signal of the list that is.
    pub(super) fn acquire_reached(&mut self, launch: u32, pe: u32, any: &[(u32, u64)]) -> bool {
        let mut reached = false;
        for &(signal, at_least) in any {
            if self.signal_value(Some(launch), pe, signal) >= at_least {
                self.acquire_signal(launch, pe, signal);
                reached = true;
            }
        }
        reached
    }

    /// PE `pe` observed its signal: it acquires every update so far.
    pub(super) fn acquire_signal(&mut self, launch: u32, pe: u32, signal: u32) {
        if let Some(s) = self.signals.get_mut(&(launch, pe, signal))
            && s.acquired != s.version
        {
            self.clocks.acquire(pe, &s.clock);
            s.acquired = s.version;
        }
    }

    /// What PE `pe` waits for at a barrier, for a deadlock report.
    pub(super) fn barrier_wait(&self, pe: u32, m: &Machine) -> String {
        let Some((_, &b)) = self
            .barrier_ids
            .iter()
            .find(|((_, members, _), _)| members.contains(&pe))
        else {
            return "a barrier".into();
        };
        let Some(Some(b)) = self.barriers.items.get(b as usize) else {
            return "a barrier".into();
        };
        let names: Vec<String> = b
            .members
            .iter()
            .map(|&i| m.pe_coord(i as usize).to_string())
            .collect();
        format!(
            "a barrier over {} ({} of {} arrived)",
            names.join(", "),
            b.arrived,
            b.members.len()
        )
    }

    /// The host has waited for every launch: forget every access.
    pub(super) fn quiesce(&mut self) {
        self.shadow.clear();
    }
}

impl<W: Write> Engine<'_, W> {
    /// The launch PE `pe` is running (0 for programs run without one).
    pub(super) fn current_launch(&self, pe: u32) -> u32 {
        self.pe_launches[pe as usize].current.unwrap_or(0)
    }

    /// The tag of an op PE `pe` issues now.
    pub(super) fn hb_tag(&mut self, pe: u32) -> HbTag {
        HbTag {
            label: self.sync.clocks.label(pe),
            clock: self.sync.clocks.snapshot(pe),
            launch: self.current_launch(pe),
        }
    }

    /// Release `pe`'s clock (a signal, a notifying copy): publish it and
    /// advance its own component. Its loads still in flight are not
    /// covered: they apply their effects when served, which may be after
    /// the receiver acts on the release, so they take the new label (as if
    /// issued after it) and an access the release orders after them is
    /// still checked against them.
    pub(super) fn release(&mut self, pe: u32) -> Clock {
        let clock = self.sync.clocks.release(pe);
        if self.sync.policy != RacePolicy::Off {
            let label = self.sync.clocks.label(pe);
            self.relabel_loads_in_flight(pe, label);
        }
        clock
    }

    /// The sequence number of a notifying copy `pe` issues now to `n`.
    pub(super) fn notify_seq(&mut self, pe: u32, n: &crate::program::Notify) -> u64 {
        let to = self.m.pe_index(n.pe) as u32;
        let q = self
            .sync
            .notify_order
            .entry((pe, to, n.signal))
            .or_default();
        q.issued += 1;
        q.issued - 1
    }

    /// Copy number `seq` from `pe` landed: raise its notification once
    /// every earlier notifying copy from `pe` to the same signal has
    /// raised its own. A counting signal then counts messages in the order
    /// they were sent, even when a later copy (a shorter one, or one that
    /// did not wait for HBM) lands first: "n arrived" means the first n.
    pub(super) fn copy_landed_notify(&mut self, pe: u32, seq: u64, h: HeldNotify) {
        let key = (pe, self.m.pe_index(h.notify.pe) as u32, h.notify.signal);
        let q = self.sync.notify_order.get_mut(&key).expect("issued");
        if seq != q.raised {
            q.held.insert(seq, h);
            return;
        }
        let mut next = Some(h);
        while let Some(h) = next {
            let q = self.sync.notify_order.get_mut(&key).expect("issued");
            q.raised += 1;
            next = q.held.remove(&q.raised);
            if q.raised == q.issued {
                self.sync.notify_order.remove(&key);
            }
            let n = h.notify;
            self.send_signal_update(
                h.from,
                h.launch,
                n.pe,
                n.signal,
                SignalOp::Add(n.add),
                h.clock,
                h.cause,
            );
        }
    }

    /// `to` must be a PE of this machine.
    pub(super) fn check_pe(&self, pc: PeCoord, to: PeCoord, what: &str) -> Result<(), SimError> {
        let c = self.m.topo.counts;
        if to.sip >= c.sips || to.cube >= c.cubes_per_sip || to.pe >= c.pes_per_cube {
            return Err(SimError::Kernel {
                pe: pc,
                time_ns: ns(self.q.now()),
                message: format!("{what}: {to} is not a PE of this machine"),
            });
        }
        Ok(())
    }

    /// Whether accesses to `x` can be shared with another PE: HBM and
    /// SRAM, and TCM within TCM buffers.
    fn shared(&self, x: &Extent) -> bool {
        match pa::space_of(x.pa) {
            Some(Space::Hbm | Space::Sram) => true,
            Some(Space::Tcm) => {
                let Some(p) = Pa::decode(x.pa) else {
                    return false;
                };
                let i = self.m.pe_index(PeCoord {
                    sip: p.sip,
                    cube: p.cube,
                    pe: p.pe,
                });
                let end = x.pa + (x.rows.max(1) as u64 - 1) * x.stride + x.len;
                self.tcm_buffers
                    .get(i)
                    .is_some_and(|b| b.iter().any(|&(s, e)| s < end && x.pa < e))
            }
            _ => false,
        }
    }

    /// Check op `op_id`'s access to `ranges` (issued by PE `pe` with `hb`)
    /// against the earlier ones; report or fail on races by the policy.
    pub(super) fn race_check(
        &mut self,
        pe: u32,
        ranges: &[Extent],
        write: bool,
        op_id: u64,
        op_name: &'static str,
        hb: &HbTag,
    ) -> Result<(), SimError> {
        self.race_check_as(pe, ranges, (write, false), op_id, op_name, hb)
    }

    /// [`Engine::race_check`] of a plain access (`kind.1` false) or an
    /// atomic one (`kind` (true, true)): two atomics never race.
    pub(super) fn race_check_as(
        &mut self,
        pe: u32,
        ranges: &[Extent],
        (write, atomic): (bool, bool),
        op_id: u64,
        op_name: &'static str,
        hb: &HbTag,
    ) -> Result<(), SimError> {
        if self.sync.policy == RacePolicy::Off {
            return Ok(());
        }
        // Most ranges of a compute op are private TCM: the access is
        // made for the first shared range only.
        let mut access: Option<Access> = None;
        let mut found = std::mem::take(&mut self.sync.found);
        found.clear();
        for x in ranges {
            if self.shared(x) {
                let access = access.get_or_insert_with(|| Access {
                    thread: pe,
                    label: hb.label,
                    clock: hb.clock.clone(),
                    write,
                    atomic,
                    op: OpInfo {
                        op_id,
                        op_name,
                        launch: hb.launch,
                        time: self.q.now(),
                    },
                });
                self.sync.shadow.access(x, access, &mut found);
            }
        }
        if found.is_empty() {
            self.sync.found = found;
            return Ok(());
        }
        self.report_races(&mut found)
    }

    /// Count and report (or fail on) the races in `found`, by the policy.
    #[cold]
    #[inline(never)]
    fn report_races(&mut self, found: &mut Vec<Race>) -> Result<(), SimError> {
        let mut result = Ok(());
        for race in found.drain(..) {
            self.sync.race_count += 1;
            let text = self.describe_race(&race);
            if self.sync.policy == RacePolicy::Error {
                result = Err(SimError::Race(text));
                break;
            }
            if self.sync.reports.len() < REPORTED_RACES {
                self.sync.reports.push(text);
            }
        }
        found.clear();
        self.sync.found = std::mem::take(found);
        result
    }

    /// A race in words: both ops (id, name, PE, kernel, what they did and
    /// when) and the bytes they share.
    fn describe_race(&self, r: &Race) -> String {
        let side = |s: &crate::race::Side| {
            let kernel = self
                .launches
                .get(s.op.launch as usize)
                .map_or("?", |l| l.spec.name.as_str());
            format!(
                "op {} ({} on {}, kernel {kernel}) {} them at {:.3} ns",
                s.op.op_id,
                s.op.op_name,
                self.m.pe_coord(s.thread as usize),
                if s.atomic {
                    "updated"
                } else if s.write {
                    "wrote"
                } else {
                    "read"
                },
                ns(s.op.time)
            )
        };
        let place = match Pa::decode(r.pa) {
            Some(p) => p.to_string(),
            None => format!("{:#x}", r.pa),
        };
        let tensor = self
            .tensors
            .iter()
            .find(|t| {
                t.meta
                    .shards
                    .iter()
                    .any(|s| s.pa <= r.pa && r.pa < s.pa + s.rows * s.row_bytes)
            })
            .map_or(String::new(), |t| format!(" (tensor {})", t.meta.name));
        format!(
            "data race on {} bytes at {place}{tensor}: {}, and {}, with nothing ordering them (no barrier, signal wait, copy notification or launch wait between the two PEs)",
            r.len,
            side(&r.first),
            side(&r.second)
        )
    }

    /// Send a signal update from node `from` to PE `to`'s pe_cpu.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_signal_update(
        &mut self,
        from: NodeId,
        launch: u32,
        to: PeCoord,
        signal: u32,
        op: SignalOp,
        clock: Clock,
        cause: Option<Dep>,
    ) {
        let pe = self.m.pe_index(to) as u32;
        let record = self.sync_open(from, "signal");
        let u = self.sync.updates.insert(Update {
            launch,
            pe,
            signal,
            op,
            clock,
            record,
            cause,
        });
        let cpu = self.m.pe_node(to, NodeKind::PeCpu);
        self.send(from, cpu, CONTROL_BYTES, SyncArrive::Signal(u));
    }

    /// PE `pe` arrives at a barrier over `members` (its fence is done).
    pub(super) fn barrier_arrive(
        &mut self,
        pe: u32,
        members: Vec<PeCoord>,
    ) -> Result<(), SimError> {
        let pc = self.m.pe_coord(pe as usize);
        let launch = self.current_launch(pe);
        let err = |m: &Self, message: String| SimError::Kernel {
            pe: pc,
            time_ns: ns(m.q.now()),
            message,
        };
        let mut dense = Vec::with_capacity(members.len());
        for &p in &members {
            self.check_pe(pc, p, "barrier")?;
            let i = self.m.pe_index(p) as u32;
            if dense.contains(&i) {
                return Err(err(self, format!("barrier: {p} is listed twice")));
            }
            let runs = self
                .launches
                .get(launch as usize)
                .is_none_or(|l| l.spec.pes.contains(&p));
            if !runs {
                return Err(err(
                    self,
                    format!(
                        "barrier: member {p} does not run launch {} ({}), so it would never arrive",
                        launch, self.launches[launch as usize].spec.name
                    ),
                ));
            }
            dense.push(i);
        }
        if !dense.contains(&pe) {
            return Err(err(
                self,
                format!("barrier: this PE ({pc}) is not one of its members"),
            ));
        }
        let mut sorted = dense.clone();
        sorted.sort_unstable();
        let epochs = &mut self.pes[pe as usize].barrier_epochs;
        let epoch = *epochs.get(&sorted).unwrap_or(&0);
        epochs.insert(sorted.clone(), epoch + 1);
        let key = (launch, sorted, epoch);
        let b = match self.sync.barrier_ids.get(&key) {
            Some(&b) => b,
            None => {
                let b = self.sync.barriers.insert(Barrier {
                    key: key.clone(),
                    members: dense,
                    arrived: 0,
                    released: 0,
                    clock: Clock::default(),
                    last_cause: None,
                });
                self.sync.barrier_ids.insert(key, b);
                b
            }
        };
        let clock = self.sync.clocks.release(pe);
        let cause = self.pes[pe as usize].after.map(|d| Dep {
            op: d.op,
            kind: DepKind::Sync,
        });
        let bar = self.sync.barriers.get(b);
        self.sync.clocks.join_into(&mut bar.clock, &clock);
        bar.last_cause = cause;
        self.sync.clocks.give_back(clock);
        let coordinator = self.m.pe_coord(bar.members[0] as usize);
        let cpu = self.m.pe_node(pc, NodeKind::PeCpu);
        self.pes[pe as usize].wait = Some(self.sync_open(cpu, "barrier"));
        self.pes[pe as usize].waiting = Wait::Barrier;
        let (from, to) = (
            self.m.pe_node(pc, NodeKind::PeCpu),
            self.m.pe_node(coordinator, NodeKind::PeCpu),
        );
        self.send(from, to, CONTROL_BYTES, SyncArrive::BarrierArrive(b));
        Ok(())
    }

    pub(super) fn sync_arrive(&mut self, a: SyncArrive) -> Result<(), SimError> {
        match a {
            SyncArrive::Signal(u) => {
                let pe = self.sync.updates.get(u).pe;
                let cpu = self
                    .m
                    .pe_node(self.m.pe_coord(pe as usize), NodeKind::PeCpu);
                let end = self.serve(cpu, Request::control());
                self.at(end, SyncAct::SignalApply(u));
            }
            SyncArrive::BarrierArrive(b) => {
                let coordinator = self.sync.barriers.get(b).members[0];
                let cpu = self
                    .m
                    .pe_node(self.m.pe_coord(coordinator as usize), NodeKind::PeCpu);
                let end = self.serve(cpu, Request::control());
                self.at(end, SyncAct::BarrierCounted(b));
            }
            SyncArrive::BarrierRelease { barrier, pe } => {
                let cpu = self
                    .m
                    .pe_node(self.m.pe_coord(pe as usize), NodeKind::PeCpu);
                let end = self.serve(cpu, Request::control());
                self.at(end, SyncAct::BarrierResume { barrier, pe });
            }
        }
        Ok(())
    }

    pub(super) fn sync_act(&mut self, a: SyncAct) -> Result<(), SimError> {
        match a {
            SyncAct::SignalApply(u) => {
                let Update {
                    launch,
                    pe,
                    signal,
                    op,
                    clock,
                    record,
                    cause,
                } = self.sync.updates.remove(u);
                let sent = self.sync_close(record, cause.as_slice())?;
                let s = self.sync.signals.entry((launch, pe, signal)).or_default();
                s.value = match op {
                    SignalOp::Set(v) => v,
                    SignalOp::Add(v) => s.value.saturating_add(v),
                };
                if self.sync.clocks.join_into(&mut s.clock, &clock) {
                    s.version += 1;
                }
                self.sync.clocks.give_back(clock);
                let p = pe as usize;
                if self.pe_launches[p].current == Some(launch)
                    && self.pes[p].waiting == Wait::Signals
                    && self.pes[p].awaited.iter().any(|&(s, _)| s == signal)
                {
                    let awaited = std::mem::take(&mut self.pes[p].awaited);
                    if self.sync.acquire_reached(launch, pe, &awaited) {
                        crate::program::spare_signal_list(awaited);
                        self.pes[p].waiting = Wait::Nothing;
                        let by = Dep {
                            op: sent,
                            kind: DepKind::Sync,
                        };
                        self.end_wait(pe, Some(by))?;
                        self.step_program(pe, Reply::Done)?;
                    } else {
                        self.pes[p].awaited = awaited;
                    }
                }
            }
            SyncAct::BarrierCounted(b) => {
                let bar = self.sync.barriers.get(b);
                bar.arrived += 1;
                if bar.arrived as usize == bar.members.len() {
                    let members = bar.members.clone();
                    let from = self
                        .m
                        .pe_node(self.m.pe_coord(members[0] as usize), NodeKind::PeCpu);
                    for pe in members {
                        let to = self
                            .m
                            .pe_node(self.m.pe_coord(pe as usize), NodeKind::PeCpu);
                        self.send(
                            from,
                            to,
                            CONTROL_BYTES,
                            SyncArrive::BarrierRelease { barrier: b, pe },
                        );
                    }
                }
            }
            SyncAct::BarrierResume { barrier, pe } => {
                let sync = &mut self.sync;
                let bar = sync.barriers.get(barrier);
                bar.released += 1;
                let cause = bar.last_cause;
                sync.clocks.acquire(pe, &bar.clock);
                if bar.released as usize == bar.members.len() {
                    let bar = sync.barriers.remove(barrier);
                    sync.barrier_ids.remove(&bar.key);
                }
                self.pes[pe as usize].waiting = Wait::Nothing;
                self.end_wait(pe, cause)?;
                self.step_program(pe, Reply::Done)?;
            }
        }
        Ok(())
    }
}
