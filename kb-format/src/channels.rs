//! What each HBM pseudo channel served over a run (the channels chunk):
//! bytes and the intervals it was busy, as the simulator's HBM controllers
//! timed them. Records say which op moved which bytes; this says when each
//! channel worked, which no record can (a transfer spreads over channels,
//! each serving its share at its own time).

use serde::{Deserialize, Serialize};

use crate::types::Ps;

/// One pseudo channel's service over a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChannelUsage {
    /// The cube whose HBM it is, and the channel's index there.
    pub sip: u32,
    pub cube: u32,
    pub channel: u32,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// When it was busy serving: `[start, end)` in ps, sorted, disjoint,
    /// each non-empty (back-to-back service is one interval).
    pub busy: Vec<(Ps, Ps)>,
}

impl ChannelUsage {
    /// The time it was busy, in ps.
    pub fn busy_ps(&self) -> Ps {
        self.busy.iter().map(|&(s, e)| e - s).sum()
    }

    /// Add service `[start, end)` after every interval so far (a channel
    /// serves in order), merging it into the last when they touch.
    pub fn serve(&mut self, start: Ps, end: Ps) {
        let mut last = self.busy.pop();
        self.busy.extend(extend_busy(&mut last, start, end));
        self.busy.extend(last);
    }
}

/// The merge rule of a channel's busy intervals, for a caller that keeps
/// the interval still growing (`open`) apart from the closed ones: service
/// `[start, end)` (after all before it) extends `open` when it starts no
/// later than `open` ends; otherwise it opens a new one and the old one,
/// now closed, is returned. Empty service changes nothing.
pub fn extend_busy(open: &mut Option<(Ps, Ps)>, start: Ps, end: Ps) -> Option<(Ps, Ps)> {
    if end <= start {
        return None;
    }
    match open {
        Some(o) if start <= o.1 => {
            o.1 = o.1.max(end);
            None
        }
        _ => open.replace((start, end)),
    }
}

/// On the wire (postcard): intervals as (gap after the previous end, or
/// after 0 for the first; length), which keeps their varints short.
#[derive(Serialize, Deserialize)]
pub(crate) struct Wire {
    sip: u32,
    cube: u32,
    channel: u32,
    bytes_read: u64,
    bytes_written: u64,
    busy: Vec<(u64, u64)>,
}

impl From<&ChannelUsage> for Wire {
    fn from(c: &ChannelUsage) -> Wire {
        let mut prev = 0;
        let busy = c
            .busy
            .iter()
            .map(|&(s, e)| {
                let gap = s - prev;
                prev = e;
                (gap, e - s)
            })
            .collect();
        Wire {
            sip: c.sip,
            cube: c.cube,
            channel: c.channel,
            bytes_read: c.bytes_read,
            bytes_written: c.bytes_written,
            busy,
        }
    }
}

impl Wire {
    /// The channel it describes, or what is wrong with it: an empty
    /// interval, or one past the end of time.
    pub(crate) fn usage(self) -> Result<ChannelUsage, String> {
        let mut prev: Ps = 0;
        // (gap, len) into (start, end) in place: no second vector.
        let mut busy = self.busy;
        for (i, iv) in busy.iter_mut().enumerate() {
            let (gap, len) = *iv;
            let start = prev.checked_add(gap);
            let end = start.and_then(|s| s.checked_add(len));
            let (Some(start), Some(end)) = (start, end) else {
                return Err(format!("busy interval {i} ends past 2^64 ps"));
            };
            if len == 0 {
                return Err(format!("busy interval {i} is empty"));
            }
            *iv = (start, end);
            prev = end;
        }
        Ok(ChannelUsage {
            sip: self.sip,
            cube: self.cube,
            channel: self.channel,
            bytes_read: self.bytes_read,
            bytes_written: self.bytes_written,
            busy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_merges_when_it_touches_and_the_wire_keeps_intervals() {
        let mut c = ChannelUsage {
            channel: 3,
            ..Default::default()
        };
        c.serve(10, 20);
        c.serve(20, 30); // back to back: one interval
        c.serve(35, 35); // empty: nothing
        c.serve(40, 41);
        assert_eq!(c.busy, vec![(10, 30), (40, 41)]);
        assert_eq!(c.busy_ps(), 21);
        let w = Wire::from(&c);
        assert_eq!(w.busy, vec![(10, 20), (10, 1)]);
        assert_eq!(w.usage().unwrap(), c);
    }

    #[test]
    fn the_wire_refuses_empty_and_overflowing_intervals() {
        let w = |busy| Wire {
            sip: 0,
            cube: 0,
            channel: 0,
            bytes_read: 0,
            bytes_written: 0,
            busy,
        };
        assert!(w(vec![(5, 0)]).usage().unwrap_err().contains("empty"));
        let e = w(vec![(u64::MAX - 1, 1), (0, 1)]).usage().unwrap_err();
        assert!(e.contains("interval 1") && e.contains("2^64"), "{e}");
    }
}
