//! An HBM controller's pseudo channels: when each is free, and what each
//! served (bytes, busy intervals) for the trace.
//!
//! A request striped evenly over every channel (a contiguous tile of whole
//! interleave rounds) that starts on all of them at once, because they
//! are free at the same time or all free before it, is served once for
//! all ([`Channels::serve_all`]): one free time and one common log, not
//! one update per channel (64 on the default HBM). A channel's own log
//! parts from the common one when it first serves alone, and takes the
//! striped services it missed, in order, before its next own service and
//! at the end: every log is the one serving each channel in turn gives.

use kb_format::{BusyHead, BusyLog, ChannelLog, ClosedPairs};

use crate::event::Ps;

/// Bytes of closed intervals held in [`Channels`]' shared buffer before
/// they move into their channels' logs: small enough to stay in cache,
/// large enough that each move touches a channel's block for many
/// intervals at once.
const CLOSED_KEPT: usize = if cfg!(test) { 64 } else { 32 << 10 };

/// Striped services kept for parted channels before they all take them
/// (few under test, so that the property test passes the limit often).
const STRIPED_KEPT: usize = if cfg!(test) { 8 } else { 1024 };

/// What one channel's service changes, in one cache line: a request
/// spread over a controller's channels (64 on the default HBM) walks them
/// in order, and with each channel's state in its log (two lines, and
/// three more arrays) the walk missed the cache at every channel on a
/// machine of thousands of PEs.
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct Chan {
    /// When it is free (stale while `same_free` is set).
    free: Ps,
    /// Its log's head, once the log parted from the common one (the
    /// log's own head is stale until `take_logs` puts this back).
    head: BusyHead,
    /// Its own bytes (striped services' are counted once for all).
    read: u64,
    written: u64,
    /// How many of `striped` its log has taken since it parted.
    taken: u32,
    /// Whether it served alone (its log parted from the common one).
    parted: bool,
}

#[derive(Debug)]
pub(super) struct Channels {
    chans: Vec<Chan>,
    /// When every channel is free, while that is one time.
    same_free: Option<Ps>,
    /// The latest time any channel is free.
    max_free: Ps,
    /// Per channel: its busy intervals once it parted (the closed pairs;
    /// its head is in `chans`), and its identity.
    logs: Vec<ChannelLog>,
    /// Intervals the parted channels' logs closed since they last took
    /// them (one sequential buffer, not a store into each channel's own
    /// block as each closes).
    closed: ClosedPairs,
    any_parted: bool,
    /// The busy log of every channel that never served alone.
    common: BusyLog,
    /// Striped services that some parted channel has not taken.
    striped: Vec<(Ps, Ps)>,
    /// Bytes each channel served in striped services.
    striped_read: u64,
    striped_written: u64,
}

impl Channels {
    pub(super) fn new(sip: u32, cube: u32, n: usize) -> Self {
        Channels {
            chans: vec![Chan::default(); n],
            same_free: Some(0),
            max_free: 0,
            logs: (0..n as u32)
                .map(|channel| ChannelLog {
                    sip,
                    cube,
                    channel,
                    ..Default::default()
                })
                .collect(),
            closed: ClosedPairs::default(),
            any_parted: false,
            common: BusyLog::default(),
            striped: Vec::new(),
            striped_read: 0,
            striped_written: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.chans.len()
    }

    /// Channel `ch`'s free time; call [`Channels::split`] first.
    #[inline]
    pub(super) fn free(&self, ch: usize) -> Ps {
        self.chans[ch].free
    }

    /// Before serving channels one by one: their free times apart.
    #[inline]
    pub(super) fn split(&mut self) {
        if let Some(f) = self.same_free.take() {
            self.chans.iter_mut().for_each(|c| c.free = f);
        }
    }

    /// When a service that may start on every channel from `earliest` on
    /// starts on all of them, if that is one time.
    #[inline]
    pub(super) fn common_start(&self, earliest: Ps) -> Option<Ps> {
        match self.same_free {
            Some(f) => Some(f.max(earliest)),
            None => (self.max_free <= earliest).then_some(earliest),
        }
    }

    /// Every channel serves `bytes` from `start` (a [`common_start`]) for
    /// `busy`; returns when they are done.
    ///
    /// [`common_start`]: Channels::common_start
    pub(super) fn serve_all(&mut self, start: Ps, busy: Ps, bytes: u64, write: bool) -> Ps {
        let end = start.saturating_add(busy);
        self.same_free = Some(end);
        self.max_free = self.max_free.max(end);
        self.common.serve(start, end);
        if self.any_parted {
            if self.striped.len() == STRIPED_KEPT {
                for ch in 0..self.chans.len() {
                    if self.chans[ch].parted {
                        self.catch_up(ch);
                    }
                }
                self.striped.clear();
                self.chans.iter_mut().for_each(|c| c.taken = 0);
            }
            self.striped.push((start, end));
        }
        if write {
            self.striped_written += bytes;
        } else {
            self.striped_read += bytes;
        }
        end
    }

    /// Channel `ch` serves `bytes` from `start` (at or after its free
    /// time; [`Channels::split`] first) for `busy`; returns when it is
    /// done.
    #[inline]
    pub(super) fn serve_one(
        &mut self,
        ch: usize,
        start: Ps,
        busy: Ps,
        bytes: u64,
        write: bool,
    ) -> Ps {
        let end = start.saturating_add(busy);
        self.max_free = self.max_free.max(end);
        let c = &self.chans[ch];
        if !c.parted || (c.taken as usize) < self.striped.len() {
            self.catch_up(ch);
        }
        let c = &mut self.chans[ch];
        c.free = end;
        c.head
            .serve_deferred(start, end, ch as u32, &mut self.closed);
        if write {
            c.written += bytes;
        } else {
            c.read += bytes;
        }
        if self.closed.len() >= CLOSED_KEPT {
            self.closed.drain_into(&mut self.logs);
        }
        end
    }

    /// Bring channel `ch`'s own log up to every striped service so far:
    /// on parting, the common log; after, the striped services since.
    fn catch_up(&mut self, ch: usize) {
        let c = &mut self.chans[ch];
        if !c.parted {
            c.parted = true;
            self.any_parted = true;
            self.logs[ch].busy = self.common.clone();
            c.head = self.common.head();
        } else {
            for &(s, e) in &self.striped[c.taken as usize..] {
                c.head.serve_deferred(s, e, ch as u32, &mut self.closed);
            }
        }
        c.taken = self.striped.len() as u32;
        if self.closed.len() >= CLOSED_KEPT {
            self.closed.drain_into(&mut self.logs);
        }
    }

    /// Each channel's log (those that served anything), handed over once.
    pub(super) fn take_logs(&mut self) -> Vec<ChannelLog> {
        self.closed.drain_into(&mut self.logs);
        for ch in 0..self.logs.len() {
            if self.chans[ch].parted {
                self.catch_up(ch);
            } else {
                self.logs[ch].busy = self.common.clone();
            }
        }
        self.closed.drain_into(&mut self.logs);
        for (log, c) in self.logs.iter_mut().zip(&mut self.chans) {
            if c.parted {
                log.busy.set_head(c.head);
            }
            log.bytes_read += c.read + self.striped_read;
            log.bytes_written += c.written + self.striped_written;
            (c.read, c.written) = (0, 0);
        }
        self.striped_read = 0;
        self.striped_written = 0;
        std::mem::take(&mut self.logs)
            .into_iter()
            .filter(|u| u.bytes_read + u.bytes_written > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plain model: every channel served in turn.
    struct Plain {
        free: Vec<Ps>,
        logs: Vec<ChannelLog>,
    }

    impl Plain {
        fn serve(&mut self, ch: usize, start: Ps, busy: Ps, bytes: u64, write: bool) -> Ps {
            let end = start.saturating_add(busy);
            self.free[ch] = end;
            let u = &mut self.logs[ch];
            u.busy.serve(start, end);
            if write {
                u.bytes_written += bytes;
            } else {
                u.bytes_read += bytes;
            }
            end
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Every channel serves (bytes, busy) from `earliest` on.
        All(Ps, Ps, u64, bool),
        /// Channel `ch` alone.
        One(usize, Ps, Ps, u64, bool),
    }

    fn op(n: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..50u64, 0..30u64, 1..1000u64, any::<bool>())
                .prop_map(|(d, b, by, w)| Op::All(d, b, by, w)),
            (0..n, 0..50u64, 0..30u64, 1..1000u64, any::<bool>())
                .prop_map(|(c, d, b, by, w)| Op::One(c, d, b, by, w)),
        ]
    }

    fn logs_eq(a: &[ChannelLog], b: &[ChannelLog]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                (x.channel, x.bytes_read, x.bytes_written, x.busy.intervals())
                    == (y.channel, y.bytes_read, y.bytes_written, y.busy.intervals())
            })
    }

    proptest! {
        /// Free times, bytes and busy intervals are those of serving every
        /// channel in turn, whatever mix of striped and single services
        /// (times advance by each op's delay; a striped service goes one
        /// channel at a time when the channels do not start together).
        #[test]
        fn channels_serve_as_each_in_turn(ops in proptest::collection::vec(op(4), 0..300)) {
            let n = 4;
            let mut c = Channels::new(0, 0, n);
            let mut p = Plain { free: vec![0; n], logs: Channels::new(0, 0, n).logs };
            let mut now = 0;
            for op in ops {
                match op {
                    Op::All(delay, busy, bytes, write) => {
                        now += delay;
                        let want: Vec<Ps> = (0..n)
                            .map(|ch| {
                                let s = p.free[ch].max(now);
                                p.serve(ch, s, busy, bytes, write)
                            })
                            .collect();
                        match c.common_start(now) {
                            Some(start) => {
                                let end = c.serve_all(start, busy, bytes, write);
                                prop_assert!(want.iter().all(|&w| w == end));
                            }
                            None => {
                                c.split();
                                for (ch, &w) in want.iter().enumerate() {
                                    let s = c.free(ch).max(now);
                                    prop_assert_eq!(c.serve_one(ch, s, busy, bytes, write), w);
                                }
                            }
                        }
                    }
                    Op::One(ch, delay, busy, bytes, write) => {
                        now += delay;
                        c.split();
                        let s = c.free(ch).max(now);
                        prop_assert_eq!(s, p.free[ch].max(now));
                        let want = p.serve(ch, s, busy, bytes, write);
                        prop_assert_eq!(c.serve_one(ch, s, busy, bytes, write), want);
                    }
                }
            }
            let want: Vec<ChannelLog> = std::mem::take(&mut p.logs)
                .into_iter()
                .filter(|u| u.bytes_read + u.bytes_written > 0)
                .collect();
            prop_assert!(logs_eq(&c.take_logs(), &want));
        }
    }

    #[test]
    fn striped_services_past_the_kept_limit_reach_parted_channels() {
        let n = 2;
        let mut c = Channels::new(0, 0, n);
        c.split();
        c.serve_one(0, 0, 5, 1, false);
        // Channel 1 never serves alone; channel 0 parted first.
        let mut now = 10;
        for _ in 0..STRIPED_KEPT + 10 {
            let start = c.common_start(now).expect("in step");
            now = c.serve_all(start, 3, 2, true) + 1;
        }
        let logs = c.take_logs();
        let iv = STRIPED_KEPT + 10;
        assert_eq!(logs[0].busy.intervals().len(), 1 + iv);
        assert_eq!(logs[1].busy.intervals().len(), iv);
        assert_eq!(logs[0].bytes_written, 2 * iv as u64);
        assert_eq!(logs[0].bytes_read, 1);
        assert_eq!(logs[1].busy.intervals()[0], (10, 13));
    }
}
