//! Component timing models, replaceable behind one trait
//! (docs/design.md L6): a component says when it can serve a request and when the
//! service ends. Components never log; the framework's op-log hook in
//! `engine` records data ops around their service.

use kb_format::ChannelLog;

use crate::event::{Ps, ceil_ps, ns_to_ps};
use crate::topology::Topology;

mod channels;
use channels::Channels;

/// A request presented to a component.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Physical address of the first byte (0 for control messages).
    pub pa: u64,
    /// Bytes per row and number of rows `stride` apart.
    pub row_bytes: u64,
    pub rows: u32,
    pub stride: u64,
    /// Pin an HBM request to pseudo channels `first..first+count`, spread
    /// evenly (LA model); `None` selects channels by address.
    pub channels: Option<(u32, u32)>,
}

impl Request {
    pub fn control() -> Request {
        Request {
            pa: 0,
            row_bytes: 0,
            rows: 0,
            stride: 0,
            channels: None,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.row_bytes * self.rows as u64
    }
}

/// When a service starts and ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    pub start: Ps,
    pub end: Ps,
}

/// When a streamed read makes its data available: the first burst at
/// `head`, the last byte at `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed {
    pub head: Ps,
    pub end: Ps,
}

/// Time to move `bytes` at `gbs` GB/s, rounded up to a picosecond.
fn ser(bytes: u64, gbs: f64) -> Ps {
    ceil_ps(bytes as f64 * 1000.0 / gbs)
}

/// The part of `share` bytes that a stream's first (or last) burst of
/// `burst` out of `total` bytes puts on one resource: in proportion,
/// rounded up, at most `share`.
fn burst_share(share: u64, burst: u64, total: u64) -> u64 {
    if burst >= total || total == 0 {
        return share;
    }
    ((share as u128 * burst as u128).div_ceil(total as u128) as u64).min(share)
}

/// A component's timing model.
pub trait Component: std::fmt::Debug {
    /// Serve `req` arriving at `now`; the component records its own
    /// occupancy, so later requests queue behind this one.
    fn serve(&mut self, now: Ps, req: &Request) -> Service;

    /// Read `req` as a stream of `burst`-byte bursts: the first burst is
    /// ready at `head`, the whole at `end` (a transfer of at most one burst
    /// is `serve`'s: `head == end`).
    fn serve_read(&mut self, now: Ps, req: &Request, burst: u64) -> Streamed {
        let _ = burst;
        let s = self.serve(now, req);
        Streamed {
            head: s.end,
            end: s.end,
        }
    }

    /// Write `req`, whose bytes arrived as a stream: the first at `head`,
    /// the last at `now`. The write overlaps the arrival (in time the
    /// component had free), so it ends a burst's service after the last
    /// byte arrived, or when the component finishes, whichever is later.
    fn serve_write(&mut self, now: Ps, head: Ps, req: &Request, burst: u64) -> Service {
        let _ = (head, burst);
        self.serve(now, req)
    }

    /// What each HBM pseudo channel of this component served so far (those
    /// that served anything), handed over once: an HBM controller's.
    fn take_channel_logs(&mut self) -> Vec<ChannelLog> {
        Vec::new()
    }
}

/// An HBM controller: pseudo channels selected by address (interleaved
/// every `interleave` bytes), each serving its share of a request at
/// `channel_bw`; a fixed access latency on top.
#[derive(Debug)]
pub struct HbmController {
    /// When each channel is free, and what each served.
    chans: Channels,
    channel_bw_gbs: f64,
    latency_ps: Ps,
    interleave: u64,
    /// Channels by `kb_format::pa::hbm_channel`'s hash (PA, VA models).
    hashed: bool,
    scratch: Vec<u64>,
    /// Service times by byte count, last two asked: a request's channels
    /// mostly serve equal shares.
    ser_memo: [(u64, Ps); 2],
}

impl HbmController {
    /// The controller of cube `cube` of SIP `sip`.
    pub fn new(t: &Topology, sip: u32, cube: u32) -> Self {
        let n = t.hbm.pseudo_channels as usize;
        HbmController {
            chans: Channels::new(sip, cube, n),
            channel_bw_gbs: t.hbm.channel_bw_gbs.0,
            latency_ps: ns_to_ps(t.hbm.latency_ns.0),
            interleave: t.hbm.interleave_bytes as u64,
            hashed: t.hbm.hash_channels,
            scratch: vec![0; n],
            ser_memo: [(u64::MAX, 0); 2],
        }
    }

    /// Time for one channel to move `bytes` (as `ser`).
    fn channel_ser(&mut self, bytes: u64) -> Ps {
        match self.ser_memo {
            [(b, ps), _] | [_, (b, ps)] if b == bytes => ps,
            [a, _] => {
                let ps = ser(bytes, self.channel_bw_gbs);
                self.ser_memo = [(bytes, ps), a];
                ps
            }
        }
    }

    /// Which pseudo channel serves the byte at `pa` (by address; the LA
    /// model pins requests instead).
    pub fn channel_of(&self, pa: u64) -> usize {
        kb_format::pa::hbm_channel(pa, self.interleave, self.chans.len() as u64, self.hashed)
            as usize
    }
}

impl HbmController {
    /// Each channel's bytes of `req` into `scratch` (pinned: spread evenly
    /// over its channels); or, for whole rounds over every channel (a
    /// contiguous range of a multiple of `interleave` x channels bytes at
    /// such an address), the share each gets, with `scratch` untouched.
    fn shares(&mut self, req: &Request) -> Option<u64> {
        let n = self.chans.len() as u64;
        let span = self.interleave * n;
        let bytes = req.bytes();
        if req.channels.is_none()
            && (req.rows == 1 || req.stride == req.row_bytes)
            && bytes > 0
            && req.pa.is_multiple_of(span)
            && bytes.is_multiple_of(span)
        {
            return Some(bytes / span * self.interleave);
        }
        self.scratch.iter_mut().for_each(|b| *b = 0);
        if let Some((first, count)) = req.channels {
            let share = req.bytes().div_ceil(count as u64);
            for ch in first as u64..(first + count) as u64 {
                self.scratch[(ch % n) as usize] += share;
            }
            return None;
        }
        // Rows that touch are one contiguous range.
        let req = &if req.rows > 1 && req.stride == req.row_bytes {
            Request {
                row_bytes: req.bytes(),
                rows: 1,
                ..*req
            }
        } else {
            *req
        };
        for r in 0..req.rows as u64 {
            let mut at = req.pa + r * req.stride;
            let end = at + req.row_bytes;
            // Whole rounds over every channel, then the remainder piecewise.
            while at < end {
                if end - at >= span && at.is_multiple_of(span) {
                    let rounds = (end - at) / span;
                    self.scratch
                        .iter_mut()
                        .for_each(|b| *b += rounds * self.interleave);
                    at += rounds * span;
                    continue;
                }
                let block_end = next_multiple(at, self.interleave);
                let piece = block_end.min(end) - at;
                let ch = self.channel_of(at);
                self.scratch[ch] += piece;
                at += piece;
            }
        }
        None
    }
}

/// The service times of one request's channel shares, by share size:
/// the whole share's and its part of a first or last burst's. A request's
/// channels mostly serve equal shares, so each size is timed once.
struct ShareTimes {
    bytes: u64,
    times: (Ps, Ps),
}

impl Default for ShareTimes {
    fn default() -> Self {
        ShareTimes {
            bytes: u64::MAX,
            times: (0, 0),
        }
    }
}

impl ShareTimes {
    /// `(busy, burst part)` for a share of `bytes` of a stream of `total`
    /// bytes in `burst`-byte bursts.
    #[inline]
    fn of(&mut self, hbm: &mut HbmController, bytes: u64, burst: u64, total: u64) -> (Ps, Ps) {
        if bytes != self.bytes {
            self.bytes = bytes;
            self.times = (
                hbm.channel_ser(bytes),
                hbm.channel_ser(burst_share(bytes, burst, total)),
            );
        }
        self.times
    }
}

/// The first multiple of `unit` above `at` (by a mask when `unit` is a
/// power of two: this runs for every interleave block of every request).
fn next_multiple(at: u64, unit: u64) -> u64 {
    if unit.is_power_of_two() {
        (at & !(unit - 1)) + unit
    } else {
        (at / unit + 1) * unit
    }
}

impl Component for HbmController {
    /// A plain request is a write: the host deploying a tensor. Its bytes
    /// are all there now (a write whose first byte arrived now, with no
    /// burst to wait for).
    fn serve(&mut self, now: Ps, req: &Request) -> Service {
        self.serve_write(now, now, req, 0)
    }

    /// Channels serve their shares in parallel; each channel's part of the
    /// first burst is ready after that part's service.
    fn serve_read(&mut self, now: Ps, req: &Request, burst: u64) -> Streamed {
        let total = req.bytes();
        let (mut head, mut done) = (now, now);
        let mut times = ShareTimes::default();
        if let Some(bytes) = self.shares(req) {
            let (busy, first) = times.of(self, bytes, burst, total);
            if let Some(start) = self.chans.common_start(now) {
                let end = self.chans.serve_all(start, busy, bytes, false);
                return Streamed {
                    head: start
                        .saturating_add(first)
                        .max(now)
                        .saturating_add(self.latency_ps),
                    end: end.max(now).saturating_add(self.latency_ps),
                };
            }
            self.scratch.fill(bytes);
        }
        self.chans.split();
        for ch in 0..self.scratch.len() {
            let bytes = self.scratch[ch];
            if bytes > 0 {
                let (busy, first) = times.of(self, bytes, burst, total);
                let start = self.chans.free(ch).max(now);
                head = head.max(start.saturating_add(first));
                done = done.max(self.chans.serve_one(ch, start, busy, bytes, false));
            }
        }
        Streamed {
            head: head.saturating_add(self.latency_ps),
            end: done.saturating_add(self.latency_ps),
        }
    }

    /// Each channel writes its share as it arrives: it starts no earlier
    /// than the first byte (`head`), than it is free, or than it must to
    /// finish its part of the last burst right after the last byte.
    fn serve_write(&mut self, now: Ps, head: Ps, req: &Request, burst: u64) -> Service {
        let total = req.bytes();
        let mut done = now;
        let mut times = ShareTimes::default();
        if let Some(bytes) = self.shares(req) {
            let (busy, last) = times.of(self, bytes, burst, total);
            let just_in_time = (now + last).saturating_sub(busy);
            if let Some(start) = self.chans.common_start(head.max(just_in_time)) {
                let end = self.chans.serve_all(start, busy, bytes, true);
                return Service {
                    start: now,
                    end: end.max(now).saturating_add(self.latency_ps),
                };
            }
            self.scratch.fill(bytes);
        }
        self.chans.split();
        for ch in 0..self.scratch.len() {
            let bytes = self.scratch[ch];
            if bytes > 0 {
                let (busy, last) = times.of(self, bytes, burst, total);
                let just_in_time = (now + last).saturating_sub(busy);
                let start = self.chans.free(ch).max(head).max(just_in_time);
                done = done.max(self.chans.serve_one(ch, start, busy, bytes, true));
            }
        }
        Service {
            start: now,
            end: done.saturating_add(self.latency_ps),
        }
    }

    fn take_channel_logs(&mut self) -> Vec<ChannelLog> {
        self.chans.take_logs()
    }
}

/// A scratchpad (TCM, SRAM): one port, `latency` plus bytes at `bw`,
/// requests served one after another.
#[derive(Debug)]
pub struct Scratchpad {
    free: Ps,
    latency_ps: Ps,
    bw_gbs: f64,
}

impl Scratchpad {
    pub fn new(latency_ns: f64, bw_gbs: f64) -> Self {
        Scratchpad {
            free: 0,
            latency_ps: ns_to_ps(latency_ns),
            bw_gbs,
        }
    }
}

impl Component for Scratchpad {
    fn serve_read(&mut self, now: Ps, req: &Request, burst: u64) -> Streamed {
        let total = req.bytes();
        let start = self.free.max(now);
        self.free = start.saturating_add(ser(total, self.bw_gbs));
        Streamed {
            head: start
                .saturating_add(ser(total.min(burst), self.bw_gbs))
                .saturating_add(self.latency_ps),
            end: self.free.saturating_add(self.latency_ps),
        }
    }

    fn serve_write(&mut self, now: Ps, head: Ps, req: &Request, burst: u64) -> Service {
        let total = req.bytes();
        let busy = ser(total, self.bw_gbs);
        let just_in_time = (now + ser(total.min(burst), self.bw_gbs)).saturating_sub(busy);
        let start = self.free.max(head).max(just_in_time);
        self.free = start.saturating_add(busy);
        Service {
            start,
            end: self.free.saturating_add(self.latency_ps),
        }
    }

    fn serve(&mut self, now: Ps, req: &Request) -> Service {
        let start = self.free.max(now);
        let busy = ceil_ps(req.bytes() as f64 * 1000.0 / self.bw_gbs);
        self.free = start.saturating_add(busy);
        Service {
            start,
            end: self.free.saturating_add(self.latency_ps),
        }
    }
}

/// A control processor (io_cpu, m_cpu, pe_cpu): handles one message at a
/// time, each taking a fixed time.
#[derive(Debug)]
pub struct ControlCpu {
    free: Ps,
    handle_ps: Ps,
}

impl ControlCpu {
    pub fn new(handle_ns: f64) -> Self {
        ControlCpu {
            free: 0,
            handle_ps: ns_to_ps(handle_ns),
        }
    }
}

impl Component for ControlCpu {
    fn serve(&mut self, now: Ps, _req: &Request) -> Service {
        let start = self.free.max(now);
        self.free = start.saturating_add(self.handle_ps);
        Service {
            start,
            end: self.free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl HbmController {
        fn frees(&mut self) -> Vec<Ps> {
            self.chans.split();
            (0..self.chans.len())
                .map(|ch| self.chans.free(ch))
                .collect()
        }
    }

    fn hbm() -> HbmController {
        HbmController {
            chans: Channels::new(0, 0, 4),
            channel_bw_gbs: 1.0, // 1 byte per ns
            latency_ps: 10_000,
            interleave: 256,
            hashed: false,
            scratch: vec![0; 4],
            ser_memo: [(u64::MAX, 0); 2],
        }
    }

    #[test]
    fn hbm_spreads_a_request_over_channels_by_address() {
        let mut h = hbm();
        // 1024 bytes from 0: 256 bytes on each of 4 channels in parallel.
        let s = h.serve(
            0,
            &Request {
                pa: 0,
                row_bytes: 1024,
                rows: 1,
                stride: 0,
                channels: None,
            },
        );
        assert_eq!(s.end, 256_000 + 10_000);
        // 256 bytes at 512 go to channel 2 only, queued behind the first.
        let s = h.serve(
            0,
            &Request {
                pa: 512,
                row_bytes: 256,
                rows: 1,
                stride: 0,
                channels: None,
            },
        );
        assert_eq!(s.end, 512_000 + 10_000);
        assert_eq!(h.frees(), vec![256_000, 256_000, 512_000, 256_000]);
        // A read of 256 B on channel 1 after both: its usage shows it.
        h.serve_read(
            600_000,
            &Request {
                pa: 256,
                row_bytes: 256,
                rows: 1,
                stride: 0,
                channels: None,
            },
            4096,
        );
        let u = h.take_channel_logs();
        assert_eq!(u.len(), 4);
        assert_eq!((u[1].bytes_read, u[1].bytes_written), (256, 256));
        assert_eq!(
            u[1].busy.intervals(),
            vec![(0, 256_000), (600_000, 856_000)]
        );
        // Channel 2's two writes ran back to back: one interval.
        assert_eq!(
            (u[2].bytes_written, u[2].busy.intervals()),
            (512, vec![(0, 512_000)])
        );
    }

    #[test]
    fn hbm_unaligned_and_strided_requests_count_every_byte() {
        let mut h = hbm();
        // Two rows of 300 bytes at 100 and 1124: channel 0 gets 156+0,
        // channel 1 144, row 2 starts at 1124 = ch0 offset 100: 156 on ch0, 144 on ch1.
        h.serve(
            0,
            &Request {
                pa: 100,
                row_bytes: 300,
                rows: 2,
                stride: 1024,
                channels: None,
            },
        );
        assert_eq!(h.frees(), vec![312_000, 288_000, 0, 0]);
    }

    #[test]
    fn scratchpad_and_cpu_serialize_requests() {
        let mut t = Scratchpad::new(2.0, 1.0);
        let r = Request {
            pa: 0,
            row_bytes: 100,
            rows: 1,
            stride: 0,
            channels: None,
        };
        assert_eq!(
            t.serve(0, &r),
            Service {
                start: 0,
                end: 102_000
            }
        );
        assert_eq!(
            t.serve(50_000, &r),
            Service {
                start: 100_000,
                end: 202_000
            }
        );
        let mut c = ControlCpu::new(50.0);
        assert_eq!(c.serve(0, &Request::control()).end, 50_000);
        assert_eq!(
            c.serve(10_000, &Request::control()),
            Service {
                start: 50_000,
                end: 100_000
            }
        );
    }
}
