//! Executors: how a kernel (a plain Rust function) runs beside the event
//! loop. Both hand control back and forth so that exactly one side runs at
//! a time, so both produce identical traces.
//!
//! - [`Executor::Coroutine`] (the default): each kernel is a stackful
//!   coroutine (corosensei) on the simulation thread; a switch is a few
//!   nanoseconds.
//! - [`Executor::Thread`]: each kernel on its own OS thread; the handshake
//!   is a baton (an atomic turn flag plus a slot) that each side spins on
//!   briefly before parking.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

use crate::program::{Command, PeProgram, Reply};

/// The kernel's side of the handshake.
pub trait Port {
    /// Hand `cmd` to the simulation and wait for its reply.
    fn call(&mut self, cmd: Command) -> Reply;

    /// Hand `cmd` to the simulation without waiting for its reply: for a
    /// command the simulation answers at once (a GEMM, a math op, a store,
    /// a copy: `Reply::Issued`) whose reply the kernel does not use. The
    /// simulation runs posted commands in the order they were posted,
    /// before the next [`Port::call`]'s command and before the kernel's
    /// end, at the same simulated time as calls in their place (no time
    /// passes between commands the simulation answers at once), so the
    /// trace is the same; an executor may hand several over in one switch.
    fn post(&mut self, cmd: Command) {
        self.call(cmd);
    }
}

/// Which executor runs kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Executor {
    /// Each kernel a stackful coroutine on the simulation thread (the
    /// default; a switch costs nanoseconds).
    #[default]
    Coroutine,
    /// Each kernel on its own OS thread, handing control back and forth
    /// with the event loop (the same traces, a slower handshake).
    Thread,
}

impl Executor {
    /// The executor named `coroutine` or `thread` (`--executor`).
    pub fn parse(s: &str) -> Option<Executor> {
        match s {
            "coroutine" => Some(Executor::Coroutine),
            "thread" => Some(Executor::Thread),
            _ => None,
        }
    }

    /// Start `body` (which drives a kernel through the port) as a program.
    pub fn spawn(self, name: String, body: KernelBody) -> Result<Box<dyn PeProgram>, String> {
        note_kernel_panic_locations();
        match self {
            Executor::Coroutine => {
                CoroutineProgram::new(name, body).map(|p| Box::new(p) as Box<dyn PeProgram>)
            }
            Executor::Thread => {
                ThreadProgram::new(name, body).map(|p| Box::new(p) as Box<dyn PeProgram>)
            }
        }
    }
}

/// A kernel ready to run: given a port, runs to completion.
pub type KernelBody = Box<dyn FnOnce(&mut dyn Port) + Send + 'static>;

/// The message of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Unwinds a kernel whose run was cancelled (the simulation failed).
struct Cancelled;

thread_local! {
    static IN_KERNEL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last kernel panic on this thread happened (`file:line`).
    static PANIC_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

static HOOK: std::sync::Once = std::sync::Once::new();

/// Install (once per process) a panic hook that notes where a kernel
/// panicked, so the failure names the kernel's source line, and stays
/// quiet about it (the simulation reports it with the kernel, PE and
/// time); any other panic goes to the hook that was there before. The
/// `tl` methods are `#[track_caller]`, so a panic inside one is located
/// at the kernel's call.
pub fn note_kernel_panic_locations() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if in_kernel() {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                let _ = PANIC_AT.try_with(|p| *p.borrow_mut() = at);
            } else {
                prev(info);
            }
        }));
    });
}

/// True while kernel code (not the simulation) runs on this thread. A
/// panic hook uses it to stay quiet about kernel panics, which the
/// simulation reports itself with the kernel, PE and time.
pub fn in_kernel() -> bool {
    IN_KERNEL.with(|k| k.get())
}

fn set_in_kernel(v: bool) {
    IN_KERNEL.with(|k| k.set(v));
}

fn run_body(body: KernelBody, port: &mut dyn Port) -> Result<(), String> {
    set_in_kernel(true);
    let r = catch_unwind(AssertUnwindSafe(|| body(port)));
    set_in_kernel(false);
    match r {
        Ok(()) => Ok(()),
        Err(p) if p.is::<Cancelled>() => Err("cancelled".into()),
        Err(p) => {
            let message = panic_message(p.as_ref());
            match PANIC_AT.with(|a| a.borrow_mut().take()) {
                Some(at) => Err(format!("{at}: {message}")),
                None => Err(message),
            }
        }
    }
}

const STACK_BYTES: usize = 1 << 20;

/// Commands a coroutine kernel posted ([`Port::post`]) and the simulation
/// has not taken yet, shared by the kernel's port and its program.
type Posted = Rc<RefCell<VecDeque<Command>>>;

/// At most this many posted commands wait for the kernel's next switch;
/// one more switches at once (a kernel that only posts, in a long loop,
/// hands them over in batches instead of growing the queue without end).
const MAX_POSTED: usize = 64;

struct YieldPort<'y> {
    y: &'y Yielder<Reply, Command>,
    posted: Posted,
}

impl Port for YieldPort<'_> {
    /// Switch to the simulation with the first posted command (`cmd`
    /// itself when none waits; else `cmd` joins the back of the queue):
    /// [`CoroutineProgram::resume`] hands the simulation the rest in
    /// order, without switching back, and resumes the kernel with the
    /// reply to the last, `cmd`.
    fn call(&mut self, cmd: Command) -> Reply {
        let first = {
            let mut q = self.posted.borrow_mut();
            match q.pop_front() {
                None => cmd,
                Some(first) => {
                    q.push_back(cmd);
                    first
                }
            }
        };
        set_in_kernel(false);
        let r = self.y.suspend(first);
        set_in_kernel(true);
        r
    }

    /// Queue `cmd` for the kernel's next switch (no switch now, unless
    /// [`MAX_POSTED`] commands wait already).
    fn post(&mut self, cmd: Command) {
        if self.posted.borrow().len() >= MAX_POSTED {
            self.call(cmd);
        } else {
            self.posted.borrow_mut().push_back(cmd);
        }
    }
}

type KernelCoroutine = Coroutine<Reply, Command, Result<(), String>, DefaultStack>;

/// A kernel as a stackful coroutine on the simulation thread.
pub struct CoroutineProgram {
    name: String,
    co: Option<KernelCoroutine>,
    /// Commands the kernel posted, handed to the simulation one per
    /// [`PeProgram::resume`] before the kernel runs again.
    posted: Posted,
    /// How the kernel ended, held until its posted commands are handed
    /// over (they ran before its end).
    ended: Option<Result<(), String>>,
}

impl std::fmt::Debug for CoroutineProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoroutineProgram")
            .field("name", &self.name)
            .finish()
    }
}

impl CoroutineProgram {
    fn new(name: String, body: KernelBody) -> Result<Self, String> {
        let stack = DefaultStack::new(STACK_BYTES)
            .map_err(|e| format!("allocating a kernel stack: {e}"))?;
        let posted = Posted::default();
        let port_posted = posted.clone();
        let co = Coroutine::with_stack(stack, move |y: &Yielder<Reply, Command>, _first: Reply| {
            run_body(
                body,
                &mut YieldPort {
                    y,
                    posted: port_posted,
                },
            )
        });
        Ok(CoroutineProgram {
            name,
            co: Some(co),
            posted,
            ended: None,
        })
    }
}

impl PeProgram for CoroutineProgram {
    /// The kernel's next command: a posted one while any waits (`reply`
    /// answers the one before it, which the kernel posted and does not
    /// read), else the kernel's, resumed with `reply`.
    fn resume(&mut self, reply: Reply) -> Result<Option<Command>, String> {
        if let Some(cmd) = self.posted.borrow_mut().pop_front() {
            return Ok(Some(cmd));
        }
        if let Some(r) = self.ended.take() {
            return r.map(|()| None);
        }
        let Some(co) = self.co.as_mut() else {
            return Ok(None);
        };
        match co.resume(reply) {
            CoroutineResult::Yield(cmd) => Ok(Some(cmd)),
            CoroutineResult::Return(r) => {
                self.co = None;
                // What it posted last runs before its end.
                match self.posted.borrow_mut().pop_front() {
                    Some(cmd) => {
                        self.ended = Some(r);
                        Ok(Some(cmd))
                    }
                    None => r.map(|()| None),
                }
            }
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

// ---- thread executor ----

const SIM_TURN: u8 = 0;
const KERNEL_TURN: u8 = 1;
/// Spins before parking: the simulation waits for a kernel that is
/// usually quick to answer; a kernel waits for a turn that may be long.
const SIM_SPINS: u32 = 200_000;
const KERNEL_SPINS: u32 = 2_000;

enum Slot {
    Empty,
    Reply(Reply),
    Command(Command),
    Finished(Result<(), String>),
}

struct Baton {
    turn: AtomicU8,
    cancel: AtomicBool,
    slot: Mutex<Slot>,
    sim: Thread,
}

impl Baton {
    fn put(&self, s: Slot) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn take(&self) -> Slot {
        std::mem::replace(
            &mut *self.slot.lock().unwrap_or_else(|e| e.into_inner()),
            Slot::Empty,
        )
    }

    fn wait_for(&self, turn: u8, spins: u32) {
        for _ in 0..spins {
            if self.turn.load(Ordering::Acquire) == turn {
                return;
            }
            std::hint::spin_loop();
        }
        while self.turn.load(Ordering::Acquire) != turn {
            thread::park();
        }
    }
}

struct ThreadPort {
    baton: Arc<Baton>,
}

impl Port for ThreadPort {
    fn call(&mut self, cmd: Command) -> Reply {
        let b = &self.baton;
        b.put(Slot::Command(cmd));
        b.turn.store(SIM_TURN, Ordering::Release);
        b.sim.unpark();
        b.wait_for(KERNEL_TURN, KERNEL_SPINS);
        if b.cancel.load(Ordering::Acquire) {
            resume_unwind(Box::new(Cancelled));
        }
        match b.take() {
            Slot::Reply(r) => r,
            _ => unreachable!("the simulation always answers a command with a reply"),
        }
    }
}

/// A kernel on its own OS thread.
pub struct ThreadProgram {
    name: String,
    baton: Arc<Baton>,
    thread: Option<JoinHandle<()>>,
    finished: bool,
}

impl std::fmt::Debug for ThreadProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadProgram")
            .field("name", &self.name)
            .finish()
    }
}

impl ThreadProgram {
    fn new(name: String, body: KernelBody) -> Result<Self, String> {
        let baton = Arc::new(Baton {
            turn: AtomicU8::new(SIM_TURN),
            cancel: AtomicBool::new(false),
            slot: Mutex::new(Slot::Empty),
            sim: thread::current(),
        });
        let b = baton.clone();
        let thread = thread::Builder::new()
            .name(format!("kernel {name}"))
            .stack_size(STACK_BYTES)
            .spawn(move || {
                b.wait_for(KERNEL_TURN, 0);
                let mut port = ThreadPort { baton: b.clone() };
                let result = if b.cancel.load(Ordering::Acquire) {
                    Err("cancelled".into())
                } else {
                    run_body(body, &mut port)
                };
                b.put(Slot::Finished(result));
                b.turn.store(SIM_TURN, Ordering::Release);
                b.sim.unpark();
            })
            .map_err(|e| format!("starting a kernel thread: {e}"))?;
        Ok(ThreadProgram {
            name,
            baton,
            thread: Some(thread),
            finished: false,
        })
    }

    fn kernel_thread(&self) -> &Thread {
        self.thread.as_ref().expect("running").thread()
    }
}

impl PeProgram for ThreadProgram {
    fn resume(&mut self, reply: Reply) -> Result<Option<Command>, String> {
        if self.finished {
            return Ok(None);
        }
        let b = &self.baton;
        b.put(Slot::Reply(reply));
        b.turn.store(KERNEL_TURN, Ordering::Release);
        self.kernel_thread().unpark();
        b.wait_for(SIM_TURN, SIM_SPINS);
        match b.take() {
            Slot::Command(cmd) => Ok(Some(cmd)),
            Slot::Finished(r) => {
                self.finished = true;
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                r.map(|()| None)
            }
            Slot::Empty | Slot::Reply(_) => Err("kernel thread handshake lost its message".into()),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ThreadProgram {
    /// Unwind and join a kernel that has not finished, so no thread is
    /// left behind when the simulation stops early.
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.baton.cancel.store(true, Ordering::Release);
            self.baton.turn.store(KERNEL_TURN, Ordering::Release);
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting_body(n: u32) -> KernelBody {
        Box::new(move |port: &mut dyn Port| {
            for _ in 0..n {
                assert_eq!(port.call(Command::WaitAll), Reply::Done);
            }
        })
    }

    #[test]
    fn both_executors_hand_commands_and_replies_back_and_forth() {
        for ex in [Executor::Coroutine, Executor::Thread] {
            let mut p = ex.spawn("k".into(), counting_body(3)).unwrap();
            assert_eq!(p.resume(Reply::Go), Ok(Some(Command::WaitAll)), "{ex:?}");
            assert_eq!(p.resume(Reply::Done), Ok(Some(Command::WaitAll)));
            assert_eq!(p.resume(Reply::Done), Ok(Some(Command::WaitAll)));
            assert_eq!(p.resume(Reply::Done), Ok(None));
            assert_eq!(
                p.resume(Reply::Done),
                Ok(None),
                "a finished kernel stays finished"
            );
        }
    }

    /// The commands a program hands over from `Go` on, each answered with
    /// `Reply::Value(n)` (n = its place in the sequence), and how it ended.
    fn drain(mut p: Box<dyn PeProgram>) -> (Vec<Command>, Result<(), String>) {
        let mut cmds = Vec::new();
        let mut reply = Reply::Go;
        loop {
            match p.resume(reply) {
                Ok(Some(c)) => cmds.push(c),
                Ok(None) => return (cmds, Ok(())),
                Err(e) => return (cmds, Err(e)),
            }
            reply = Reply::Value(cmds.len() as u64);
        }
    }

    /// Posted commands reach the simulation in order, before the next
    /// call's command and before the kernel's end, and the kernel gets the
    /// reply to its call; both executors hand over the same sequence.
    #[test]
    fn posted_commands_run_in_order_before_the_next_call_and_the_end() {
        for ex in [Executor::Coroutine, Executor::Thread] {
            let got = Arc::new(Mutex::new(Vec::new()));
            let g = got.clone();
            let body: KernelBody = Box::new(move |port: &mut dyn Port| {
                port.post(Command::ReadSignal(1));
                port.post(Command::ReadSignal(2));
                let r = port.call(Command::ReadSignal(3));
                g.lock().unwrap().push(r);
                port.post(Command::ReadSignal(4));
                let r = port.call(Command::ReadSignal(5));
                g.lock().unwrap().push(r);
                port.post(Command::ReadSignal(6));
            });
            let (cmds, end) = drain(ex.spawn("k".into(), body).unwrap());
            let want: Vec<Command> = (1..=6).map(Command::ReadSignal).collect();
            assert_eq!((cmds, end), (want, Ok(())), "{ex:?}");
            // The replies to the calls: the 3rd and 5th command's.
            assert_eq!(
                *got.lock().unwrap(),
                [Reply::Value(3), Reply::Value(5)],
                "{ex:?}"
            );
        }
    }

    /// A kernel that panics after posting: what it posted runs first, then
    /// the failure is reported.
    #[test]
    fn a_kernel_failing_after_posting_hands_over_its_posted_commands_first() {
        for ex in [Executor::Coroutine, Executor::Thread] {
            let body: KernelBody = Box::new(|port: &mut dyn Port| {
                port.post(Command::ReadSignal(7));
                port.post(Command::ReadSignal(8));
                panic!("boom after posting");
            });
            let (cmds, end) = drain(ex.spawn("k".into(), body).unwrap());
            assert_eq!(
                cmds,
                [Command::ReadSignal(7), Command::ReadSignal(8)],
                "{ex:?}"
            );
            let e = end.expect_err("the kernel panicked");
            assert!(e.ends_with("boom after posting"), "{ex:?}: {e}");
        }
    }

    /// A kernel that only posts hands its commands over in batches of
    /// `MAX_POSTED` + 1 (the one that found the queue full switches), not
    /// all at its end: the simulation has the first batch before the
    /// kernel posts past it.
    #[test]
    fn a_kernel_that_only_posts_switches_when_its_queue_is_full() {
        let posted = Arc::new(AtomicU8::new(0));
        let n = posted.clone();
        let body: KernelBody = Box::new(move |port: &mut dyn Port| {
            for i in 0..200u32 {
                port.post(Command::ReadSignal(i));
                n.store((i + 1).min(255) as u8, Ordering::SeqCst);
            }
        });
        let mut p = Executor::Coroutine.spawn("k".into(), body).unwrap();
        assert_eq!(p.resume(Reply::Go), Ok(Some(Command::ReadSignal(0))));
        // The kernel stopped inside its post of command MAX_POSTED.
        assert_eq!(posted.load(Ordering::SeqCst) as usize, MAX_POSTED);
        for i in 1..200 {
            assert_eq!(p.resume(Reply::Issued(0)), Ok(Some(Command::ReadSignal(i))));
        }
        assert_eq!(p.resume(Reply::Issued(0)), Ok(None));
        assert_eq!(posted.load(Ordering::SeqCst), 200);
    }

    #[test]
    fn a_panicking_kernel_reports_its_message() {
        for ex in [Executor::Coroutine, Executor::Thread] {
            let body: KernelBody = Box::new(|port: &mut dyn Port| {
                port.call(Command::WaitAll);
                panic!("boom at tile 3");
            });
            let mut p = ex.spawn("k".into(), body).unwrap();
            assert!(p.resume(Reply::Go).unwrap().is_some());
            let line = line!() - 4;
            assert_eq!(
                p.resume(Reply::Done),
                Err(format!("{}:{line}: boom at tile 3", file!())),
                "{ex:?}"
            );
        }
    }

    #[test]
    fn dropping_an_unfinished_kernel_unwinds_and_joins_it() {
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        for ex in [Executor::Coroutine, Executor::Thread] {
            dropped.store(false, Ordering::SeqCst);
            let d = dropped.clone();
            let body: KernelBody = Box::new(move |port: &mut dyn Port| {
                let _flag = Flag(d);
                loop {
                    port.call(Command::WaitAll);
                }
            });
            let mut p = ex.spawn("k".into(), body).unwrap();
            assert!(p.resume(Reply::Go).unwrap().is_some());
            drop(p);
            assert!(
                dropped.load(Ordering::SeqCst),
                "{ex:?}: the kernel's stack was not unwound"
            );
        }
    }
}
