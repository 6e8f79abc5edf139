//! Component timing models, replaceable behind one trait (the seeds'
//! ADR-0015): a component says when it can serve a request and when the
//! service ends. Components never log; the framework's op-log hook in
//! `engine` records data ops around their service.

use crate::event::{Ps, ns_to_ps};
use crate::topology::Topology;

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

/// A component's timing model.
pub trait Component: std::fmt::Debug {
    /// Serve `req` arriving at `now`; the component records its own
    /// occupancy, so later requests queue behind this one.
    fn serve(&mut self, now: Ps, req: &Request) -> Service;
}

/// An HBM controller: pseudo channels selected by address (interleaved
/// every `interleave` bytes), each serving its share of a request at
/// `channel_bw`; a fixed access latency on top.
#[derive(Debug)]
pub struct HbmController {
    channel_free: Vec<Ps>,
    channel_bw_gbs: f64,
    latency_ps: Ps,
    interleave: u64,
    scratch: Vec<u64>,
}

impl HbmController {
    pub fn new(t: &Topology) -> Self {
        let n = t.hbm.pseudo_channels as usize;
        HbmController {
            channel_free: vec![0; n],
            channel_bw_gbs: t.hbm.channel_bw_gbs.0,
            latency_ps: ns_to_ps(t.hbm.latency_ns.0),
            interleave: t.hbm.interleave_bytes as u64,
            scratch: vec![0; n],
        }
    }

    /// Serve `bytes` spread evenly over channels `first..first+count`.
    fn serve_pinned(&mut self, now: Ps, bytes: u64, first: u32, count: u32) -> Service {
        let share = bytes.div_ceil(count as u64);
        let mut done = now;
        let n = self.channel_free.len();
        for ch in first as usize..(first + count) as usize {
            let free = &mut self.channel_free[ch % n];
            let start = (*free).max(now);
            *free =
                start.saturating_add((share as f64 * 1000.0 / self.channel_bw_gbs).ceil() as Ps);
            done = done.max(*free);
        }
        Service {
            start: now,
            end: done.saturating_add(self.latency_ps),
        }
    }

    /// Which pseudo channel serves the byte at `pa`.
    pub fn channel_of(&self, pa: u64) -> usize {
        ((pa / self.interleave) % self.channel_free.len() as u64) as usize
    }
}

impl Component for HbmController {
    fn serve(&mut self, now: Ps, req: &Request) -> Service {
        if let Some((first, count)) = req.channels {
            return self.serve_pinned(now, req.bytes(), first, count);
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
        let n = self.channel_free.len() as u64;
        self.scratch.iter_mut().for_each(|b| *b = 0);
        for r in 0..req.rows as u64 {
            let mut at = req.pa + r * req.stride;
            let end = at + req.row_bytes;
            // Whole rounds over every channel, then the remainder piecewise.
            let span = self.interleave * n;
            while at < end {
                if at.is_multiple_of(span) && end - at >= span {
                    let rounds = (end - at) / span;
                    self.scratch
                        .iter_mut()
                        .for_each(|b| *b += rounds * self.interleave);
                    at += rounds * span;
                    continue;
                }
                let block_end = (at / self.interleave + 1) * self.interleave;
                let piece = block_end.min(end) - at;
                let ch = self.channel_of(at);
                self.scratch[ch] += piece;
                at += piece;
            }
        }
        let mut done = now;
        for (free, &bytes) in self.channel_free.iter_mut().zip(&self.scratch) {
            if bytes > 0 {
                let start = (*free).max(now);
                *free = start
                    .saturating_add((bytes as f64 * 1000.0 / self.channel_bw_gbs).ceil() as Ps);
                done = done.max(*free);
            }
        }
        Service {
            start: now,
            end: done.saturating_add(self.latency_ps),
        }
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
    fn serve(&mut self, now: Ps, req: &Request) -> Service {
        let start = self.free.max(now);
        let busy = (req.bytes() as f64 * 1000.0 / self.bw_gbs).ceil() as Ps;
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

    fn hbm() -> HbmController {
        HbmController {
            channel_free: vec![0; 4],
            channel_bw_gbs: 1.0, // 1 byte per ns
            latency_ps: 10_000,
            interleave: 256,
            scratch: vec![0; 4],
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
        assert_eq!(h.channel_free, vec![256_000, 256_000, 512_000, 256_000]);
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
        assert_eq!(h.channel_free, vec![312_000, 288_000, 0, 0]);
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
