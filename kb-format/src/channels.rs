//! What each HBM pseudo channel served over a run (the channels chunk):
//! bytes and the intervals it was busy, as the simulator's HBM controllers
//! timed them. Records say which op moved which bytes; this says when each
//! channel worked, which no record can (a transfer spreads over channels,
//! each serving its share at its own time).

use crate::cursor::Cur;
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

/// One pseudo channel's service as a simulator logs it: the same fields as
/// [`ChannelUsage`], with the busy intervals kept in their wire form as
/// they close (a long run closes millions; kept as pairs, then gathered,
/// converted and serialized, they were copied four times, and the fresh
/// memory's page faults were a tenth of a small kernel's run).
#[derive(Debug, Clone, Default)]
pub struct ChannelLog {
    pub sip: u32,
    pub cube: u32,
    pub channel: u32,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub busy: BusyLog,
}

/// The part of a channel's [`BusyLog`] that each service changes: the
/// interval still growing, the end of the last closed one and how many
/// closed, in 32 bytes. A simulator with thousands of channels keeps their
/// heads in one dense array ([`BusyLog::head`], [`BusyLog::set_head`]), a
/// service touching its channel's head and not the log around it (whose
/// blocks change only when closed pairs move in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusyHead {
    open_start: Ps,
    /// 0 while no interval is open (a service is non-empty, so an open
    /// one ends after 0).
    open_end: Ps,
    /// End of the last closed interval (0 before the first).
    closed_end: Ps,
    closed: u64,
}

impl BusyHead {
    /// The interval still growing.
    #[inline]
    fn open(&self) -> Option<(Ps, Ps)> {
        (self.open_end > 0).then_some((self.open_start, self.open_end))
    }

    /// Service `[start, end)` by the rule of [`extend_busy`]: the interval
    /// it closes, if any.
    #[inline]
    fn serve(&mut self, start: Ps, end: Ps) -> Option<(Ps, Ps)> {
        let mut open = self.open();
        let closed = extend_busy(&mut open, start, end);
        if let Some((s, e)) = open {
            (self.open_start, self.open_end) = (s, e);
        }
        closed
    }

    /// [`BusyLog::serve`] for the log whose head this is, but an interval
    /// it closes goes to `sink`, tagged `ch`, not into the log's blocks:
    /// [`ClosedPairs::drain_into`] moves it there. A simulator with
    /// thousands of channels closes intervals on one sequential buffer,
    /// not on each channel's own block (a cache miss per close).
    #[inline]
    pub fn serve_deferred(&mut self, start: Ps, end: Ps, ch: u32, sink: &mut ClosedPairs) {
        if let Some(iv) = self.serve(start, end) {
            put_varint(&mut sink.bytes, ch as u64);
            put_pair(&mut sink.bytes, self.closed_end, iv);
            self.closed_end = iv.1;
            self.closed += 1;
        }
    }
}

/// A channel's busy intervals, served in order (the rule of
/// [`extend_busy`]): the one still growing, and the closed ones encoded
/// as the channels chunk holds them, (gap after the previous end, length)
/// varint pairs, in blocks that double in capacity up to a fixed one: a
/// log grows by a block now and then, never by copying what it holds (one
/// growing `Vec` per channel reallocated a few times per channel as a run
/// went on).
#[derive(Debug, Clone, Default)]
pub struct BusyLog {
    head: BusyHead,
    /// The block being filled, and the full ones before it: whole pairs
    /// only, a pair never straddles two blocks.
    block: Vec<u8>,
    full: Vec<Vec<u8>>,
}

impl BusyLog {
    /// Bytes per block, at most (a pair takes at most 20).
    const BLOCK: usize = 16 << 10;
    /// Bytes of a log's first block: each next one is twice the one
    /// before, up to [`BusyLog::BLOCK`], so that a channel that served a
    /// few times holds a few hundred bytes, not a full block (a 4,096-PE
    /// machine has 32 K channels).
    const FIRST_BLOCK: usize = 128;

    /// Add service `[start, end)`, starting no earlier than every service
    /// before it started; it merges into the open interval when they touch.
    #[inline]
    pub fn serve(&mut self, start: Ps, end: Ps) {
        if let Some(iv) = self.head.serve(start, end) {
            self.close(iv);
        }
    }

    fn close(&mut self, (start, end): (Ps, Ps)) {
        self.make_room();
        put_pair(&mut self.block, self.head.closed_end, (start, end));
        self.head.closed_end = end;
        self.head.closed += 1;
    }

    /// Room in the block for one more pair (a new block when it is full).
    #[inline]
    fn make_room(&mut self) {
        if self.block.capacity() - self.block.len() < 2 * crate::cursor::V {
            let size = (2 * self.block.capacity()).clamp(Self::FIRST_BLOCK, Self::BLOCK);
            let next = Vec::with_capacity(size);
            let done = std::mem::replace(&mut self.block, next);
            if !done.is_empty() {
                self.full.push(done);
            }
        }
    }

    /// [`BusyHead::serve_deferred`] on this log's own head.
    #[inline]
    pub fn serve_deferred(&mut self, start: Ps, end: Ps, ch: u32, sink: &mut ClosedPairs) {
        self.head.serve_deferred(start, end, ch, sink);
    }

    /// The part each service changes, for a caller that keeps it apart
    /// while serving ([`BusyHead::serve_deferred`]) and puts it back
    /// ([`BusyLog::set_head`]) before the log is read; meanwhile the
    /// log's own head is stale.
    pub fn head(&self) -> BusyHead {
        self.head
    }

    /// Put back a head taken with [`BusyLog::head`] and served since (the
    /// pairs it closed moved into this log's blocks by
    /// [`ClosedPairs::drain_into`]).
    pub fn set_head(&mut self, head: BusyHead) {
        self.head = head;
    }

    /// The blocks in order.
    fn blocks(&self) -> impl Iterator<Item = &[u8]> {
        self.full
            .iter()
            .map(Vec::as_slice)
            .chain(std::iter::once(self.block.as_slice()))
    }

    /// How many intervals there are.
    pub fn len(&self) -> u64 {
        self.head.closed + self.head.open().is_some() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The intervals, `[start, end)` in order.
    pub fn intervals(&self) -> Vec<(Ps, Ps)> {
        let mut out = Vec::with_capacity(self.len() as usize);
        let mut end = 0;
        for b in self.blocks() {
            let mut cur = Cur::new(b);
            while cur.left() > 0 {
                let start = end + cur.varint();
                end = start + cur.varint();
                out.push((start, end));
            }
        }
        out.extend(self.head.open());
        out
    }

    /// Bytes of the closed pairs.
    fn wire_len(&self) -> usize {
        self.blocks().map(<[u8]>::len).sum()
    }

    /// The wire form: the count, then the pairs.
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.len());
        for b in self.blocks() {
            out.extend_from_slice(b);
        }
        if let Some(iv) = self.head.open() {
            put_pair(out, self.head.closed_end, iv);
        }
    }
}

/// Closed intervals of many channels' [`BusyLog`]s, in the order they
/// closed, in wire form, each tagged with its channel's index
/// ([`BusyLog::serve_deferred`]); [`ClosedPairs::drain_into`] moves them
/// into their logs. Each log's bytes are the ones `serve` would have
/// written: the same pairs, in the same order.
#[derive(Debug, Clone, Default)]
pub struct ClosedPairs {
    /// (channel index, gap, length) varint triples.
    bytes: Vec<u8>,
}

impl ClosedPairs {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Move every pair into the log of its channel, `logs[index]`, and
    /// empty this (its allocation is kept).
    pub fn drain_into(&mut self, logs: &mut [ChannelLog]) {
        let mut cur = Cur::new(&self.bytes);
        while cur.left() > 0 {
            let ch = cur.varint() as usize;
            let at = cur.p;
            cur.varint();
            cur.varint();
            let log = &mut logs[ch].busy;
            log.make_room();
            log.block.extend_from_slice(&self.bytes[at..cur.p]);
        }
        self.bytes.clear();
    }
}

impl ChannelLog {
    /// The log of `usage`, if its intervals are sorted, disjoint and
    /// non-empty (else what is wrong).
    pub fn of_usage(usage: &ChannelUsage) -> Result<ChannelLog, String> {
        let mut busy = BusyLog::default();
        let mut prev = 0;
        for &(start, end) in &usage.busy {
            if start < prev || end <= start {
                return Err(format!(
                    "channel {} of sip {} cube {}: busy [{start}, {end}) is empty or overlaps the one before",
                    usage.channel, usage.sip, usage.cube
                ));
            }
            prev = end;
            // Touching intervals stay apart, as given.
            if let Some(iv) = busy.head.open() {
                busy.close(iv);
            }
            (busy.head.open_start, busy.head.open_end) = (start, end);
        }
        Ok(ChannelLog {
            sip: usage.sip,
            cube: usage.cube,
            channel: usage.channel,
            bytes_read: usage.bytes_read,
            bytes_written: usage.bytes_written,
            busy,
        })
    }
}

/// On the wire (postcard): intervals as (gap after the previous end, or
/// after 0 for the first; length), which keeps their varints short.
/// Written by [`encode`] and read back by [`Payload`], neither through
/// serde (a long run's chunk holds millions of intervals; serde's visitors
/// took 120 instructions each): this is postcard's own encoding, which
/// the tests hold both to.
#[cfg(test)]
#[derive(serde::Serialize)]
pub(crate) struct Wire {
    sip: u32,
    cube: u32,
    channel: u32,
    bytes_read: u64,
    bytes_written: u64,
    busy: Vec<(u64, u64)>,
}

#[cfg(test)]
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

/// The channels chunk's payload for `logs` (in key order): postcard's
/// encoding of a `Vec<Wire>`, written directly.
pub(crate) fn encode(logs: &[ChannelLog]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        10 + logs
            .iter()
            .map(|c| 50 + 10 + c.busy.wire_len() + 20)
            .sum::<usize>(),
    );
    put_varint(&mut out, logs.len() as u64);
    for c in logs {
        for v in [c.sip, c.cube, c.channel] {
            put_varint(&mut out, v as u64);
        }
        put_varint(&mut out, c.bytes_read);
        put_varint(&mut out, c.bytes_written);
        c.busy.encode(&mut out);
    }
    out
}

/// Append interval `[start, end)` as the wire has it: (gap after
/// `prev_end`, length).
#[inline]
fn put_pair(out: &mut Vec<u8>, prev_end: Ps, (start, end): (Ps, Ps)) {
    put_varint(out, start - prev_end);
    put_varint(out, end - start);
}

/// Append `v` as a LEB128 varint (postcard's unsigned integers), a byte at
/// a time: most are one or two bytes, which a slice copy would hand to
/// memmove (a call per interval closed).
#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// What is wrong with a channels payload: the byte offset (in the
/// payload) where it shows, and what.
pub(crate) type PayloadError = (usize, String);

/// A channels chunk's payload as postcard wrote it (`Vec<Wire>`: LEB128
/// varints throughout), decoded with the records codec's cursor and
/// checked: no empty interval, none past 2^64 ps, channels in (sip, cube,
/// channel) order, no bytes after the last.
pub(crate) struct Payload<'a> {
    cur: Cur<'a>,
}

impl<'a> Payload<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Payload<'a> {
        Payload { cur: Cur::new(b) }
    }

    /// Every channel it describes.
    pub(crate) fn decode(mut self) -> Result<Vec<ChannelUsage>, PayloadError> {
        // A channel takes at least 6 bytes, an interval 2.
        let n = self.len(6)?;
        let mut out: Vec<ChannelUsage> = Vec::with_capacity(n);
        for i in 0..n {
            let at = self.cur.p;
            let (sip, cube, channel) = (
                self.cur.varint_u32(),
                self.cur.varint_u32(),
                self.cur.varint_u32(),
            );
            let (bytes_read, bytes_written) = (self.cur.varint(), self.cur.varint());
            self.ok()?;
            if let Some(prev) = out.last()
                && (prev.sip, prev.cube, prev.channel) >= (sip, cube, channel)
            {
                return Err((
                    at,
                    format!(
                        "entry {i} (sip {sip} cube {cube} channel {channel}) is not after the one before it"
                    ),
                ));
            }
            let m = self.len(2)?;
            let mut busy = Vec::with_capacity(m);
            let mut end: Ps = 0;
            for j in 0..m {
                let at = self.cur.p;
                let (gap, len) = (self.cur.varint(), self.cur.varint());
                let start = end.checked_add(gap);
                let stop = start.and_then(|s| s.checked_add(len));
                match (start, stop) {
                    (Some(start), Some(stop)) if len > 0 && self.cur.bad.is_none() => {
                        busy.push((start, stop));
                        end = stop;
                    }
                    _ => {
                        self.ok()?;
                        let what = if len == 0 {
                            "is empty"
                        } else {
                            "ends past 2^64 ps"
                        };
                        return Err((at, format!("entry {i}: busy interval {j} {what}")));
                    }
                }
            }
            out.push(ChannelUsage {
                sip,
                cube,
                channel,
                bytes_read,
                bytes_written,
                busy,
            });
        }
        self.ok()?;
        let left = self.cur.left();
        if left > 0 {
            return Err((self.cur.p, format!("{left} bytes after the encoded value")));
        }
        Ok(out)
    }

    /// The cursor's first failure, if any.
    fn ok(&self) -> Result<(), PayloadError> {
        match self.cur.bad {
            None => Ok(()),
            Some((at, what)) => Err((at, what.to_string())),
        }
    }

    /// A sequence length, each element taking at least `min` bytes:
    /// bounded by what is left before anything is reserved.
    fn len(&mut self, min: usize) -> Result<usize, PayloadError> {
        let at = self.cur.p;
        let n = self.cur.varint();
        self.ok()?;
        let left = self.cur.left() as u64;
        if n > left / min as u64 {
            return Err((at, format!("a length of {n}, but only {left} bytes follow")));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wire(channels: &[ChannelUsage]) -> Vec<u8> {
        let w: Vec<Wire> = channels.iter().map(Wire::from).collect();
        postcard::to_stdvec(&w).unwrap()
    }

    /// postcard's encoding of a tuple-shaped entry, written independently
    /// of `Wire`: (sip, cube, channel, read, written, [(gap, length)]).
    type Raw = (u32, u32, u32, u64, u64, Vec<(u64, u64)>);

    fn raw(entries: &[Raw]) -> Vec<u8> {
        postcard::to_stdvec(entries).unwrap()
    }

    fn err(b: &[u8]) -> PayloadError {
        Payload::new(b).decode().unwrap_err()
    }

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
        let b = wire(std::slice::from_ref(&c));
        assert_eq!(b, raw(&[(0, 0, 3, 0, 0, vec![(10, 20), (10, 1)])]));
        assert_eq!(Payload::new(&b).decode().unwrap(), vec![c]);
    }

    #[test]
    fn the_payload_refuses_what_no_writer_writes_naming_where() {
        let e = err(&raw(&[(0, 0, 0, 0, 0, vec![(5, 0)])]));
        assert_eq!(e, (7, "entry 0: busy interval 0 is empty".into()));
        let e = err(&raw(&[(0, 0, 0, 0, 0, vec![(u64::MAX - 1, 1), (0, 1)])]));
        assert!(e.1.contains("interval 1") && e.1.contains("2^64"), "{e:?}");
        let e = err(&raw(&[(0, 1, 0, 0, 0, vec![]), (0, 0, 5, 0, 0, vec![])]));
        assert_eq!(e.0, 7, "{e:?}");
        assert!(e.1.contains("entry 1 (sip 0 cube 0 channel 5) is not after"));
        let mut b = raw(&[(0, 0, 0, 0, 0, vec![])]);
        b.push(0);
        assert_eq!(err(&b), (7, "1 bytes after the encoded value".into()));
        // A length no payload of this size can hold: refused before any
        // allocation.
        let e = err(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(e.1.contains("a length of 4294967295"), "{e:?}");
        // Varints: a u32 field of 2^32, an eleventh byte, a tenth byte
        // with more than bit 63, a value cut off.
        let e = err(&[1, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(e, (6, "value does not fit in 32 bits".into()));
        let mut b = vec![1, 0, 0, 0, 0];
        b.extend([0xff; 10]);
        b.extend([0x01, 0, 0]);
        assert_eq!(err(&b), (15, "varint overflows 64 bits".into()));
        let mut b = vec![1, 0, 0, 0, 0];
        b.extend([0xff; 9]);
        b.extend([0x02, 0, 0]);
        assert_eq!(err(&b), (15, "varint overflows 64 bits".into()));
        assert_eq!(
            err(&[1, 0, 0, 0, 0, 0, 0x80]),
            (7, "runs past the end of its chunk".into())
        );
        // The largest u64 is fine.
        let b = raw(&[(u32::MAX, 0, 0, u64::MAX, 0, vec![(u64::MAX - 1, 1)])]);
        let c = &Payload::new(&b).decode().unwrap()[0];
        assert_eq!(
            (c.sip, c.bytes_read, c.busy[0]),
            (u32::MAX, u64::MAX, (u64::MAX - 1, u64::MAX))
        );
    }

    /// A log long enough to fill several blocks keeps every interval, in
    /// order, and encodes as postcard does.
    /// Logs served through a shared [`ClosedPairs`], drained at arbitrary
    /// points, encode to the bytes of logs served directly (the same pairs
    /// in the same order, across block boundaries).
    #[test]
    fn deferred_closes_encode_as_direct_ones() {
        let n = 5;
        let mk = || -> Vec<ChannelLog> {
            (0..n as u32)
                .map(|channel| ChannelLog {
                    channel,
                    ..Default::default()
                })
                .collect()
        };
        let (mut direct, mut deferred) = (mk(), mk());
        let mut sink = ClosedPairs::default();
        let mut t = [0u64; 5];
        let mut x: u64 = 7;
        for step in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let ch = (x >> 40) as usize % n;
            // Gaps of 0 (merging), small and huge (long varints).
            let gap = match (x >> 20) % 4 {
                0 => 0,
                1 => (x >> 8) % 100,
                2 => 1 + (x >> 8) % 70_000,
                _ => (x >> 3) % (1 << 50),
            };
            let (start, end) = (t[ch] + gap, t[ch] + gap + 1 + (x >> 50) % 300);
            t[ch] = end;
            direct[ch].busy.serve(start, end);
            deferred[ch]
                .busy
                .serve_deferred(start, end, ch as u32, &mut sink);
            assert_eq!(deferred[ch].busy.len(), direct[ch].busy.len());
            if (x >> 30).is_multiple_of(997) || step % 4_000 == 3_999 {
                sink.drain_into(&mut deferred);
            }
        }
        sink.drain_into(&mut deferred);
        assert!(sink.is_empty());
        assert!(direct.iter().any(|c| c.busy.len() > 2_000));
        assert_eq!(encode(&deferred), encode(&direct));
        for (d, e) in direct.iter().zip(&deferred) {
            assert_eq!(d.busy.intervals(), e.busy.intervals());
        }
    }

    #[test]
    fn a_log_across_blocks_keeps_every_interval() {
        let mut usage = ChannelUsage::default();
        let mut log = ChannelLog::default();
        let mut start = 0;
        for i in 0..12_000u64 {
            // Gaps and lengths of 1 to 8 varint bytes.
            start += 1 + (i * 0x9e37_79b9) % (1 << (7 * (1 + i % 8)));
            let end = start + 1 + i % 1000;
            usage.serve(start, end);
            log.busy.serve(start, end);
            start = end;
        }
        assert!(
            log.busy.full.len() > 1,
            "{} full blocks",
            log.busy.full.len()
        );
        assert_eq!(log.busy.intervals(), usage.busy);
        assert_eq!(log.busy.len(), 12_000);
        assert_eq!(
            encode(std::slice::from_ref(&log)),
            wire(std::slice::from_ref(&usage))
        );
    }

    /// Channels as a run leaves them: distinct keys in order (a map's),
    /// disjoint non-empty intervals in order.
    fn usage() -> impl Strategy<Value = Vec<ChannelUsage>> {
        let key = (0u32..3, 0u32..3, prop_oneof![0u32..40, Just(u32::MAX)]);
        let channel = (
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec((0u64..1 << 40, 1u64..1 << 20), 0..20),
        );
        prop::collection::btree_map(key, channel, 0..6).prop_map(|m| {
            m.into_iter()
                .map(|((sip, cube, channel), (bytes_read, bytes_written, ivs))| {
                    let mut end = 0;
                    let busy = ivs
                        .into_iter()
                        .map(|(gap, len)| {
                            let iv = (end + gap, end + gap + len);
                            end = iv.1;
                            iv
                        })
                        .collect();
                    ChannelUsage {
                        sip,
                        cube,
                        channel,
                        bytes_read,
                        bytes_written,
                        busy,
                    }
                })
                .collect()
        })
    }

    proptest! {
        /// The writer's direct encoding is postcard's, byte for byte.
        #[test]
        fn the_direct_encoding_is_postcards(u in usage()) {
            let logs: Vec<ChannelLog> = u.iter().map(|c| ChannelLog::of_usage(c).unwrap()).collect();
            prop_assert_eq!(encode(&logs), wire(&u));
            for (log, c) in logs.iter().zip(&u) {
                prop_assert_eq!(log.busy.intervals(), c.busy.clone());
                prop_assert_eq!(log.busy.len(), c.busy.len() as u64);
            }
        }

        /// Service logged as it comes merges as `ChannelUsage::serve` does
        /// and encodes as postcard encodes the merged intervals: starts in
        /// order, with overlaps, touches, gaps and empty service.
        #[test]
        fn a_log_served_as_it_comes_is_the_usage_served(
            steps in prop::collection::vec((0u64..6, 0u64..8), 0..40),
            big in any::<bool>(),
        ) {
            let scale = if big { 1 << 40 } else { 1 };
            let mut usage = ChannelUsage { channel: 2, cube: 1, bytes_read: 300, ..Default::default() };
            let mut log = ChannelLog { channel: 2, cube: 1, bytes_read: 300, ..Default::default() };
            let mut start = 0;
            for (step, len) in steps {
                start += step * scale;
                usage.serve(start, start + len * scale);
                log.busy.serve(start, start + len * scale);
            }
            prop_assert_eq!(log.busy.intervals(), usage.busy.clone());
            prop_assert_eq!(encode(std::slice::from_ref(&log)), wire(std::slice::from_ref(&usage)));
        }

        #[test]
        fn what_the_writer_encodes_decodes_and_any_cut_is_refused(u in usage()) {
            let b = wire(&u);
            prop_assert_eq!(Payload::new(&b).decode().unwrap(), u);
            for cut in 0..b.len() {
                prop_assert!(Payload::new(&b[..cut]).decode().is_err());
            }
        }

        /// Whatever the bytes, a decoded payload keeps the chunk's rules.
        #[test]
        fn arbitrary_bytes_decode_only_to_channels_a_run_leaves(
            b in prop::collection::vec(any::<u8>(), 0..64)
        ) {
            if let Ok(u) = Payload::new(&b).decode() {
                for w in u.windows(2) {
                    prop_assert!((w[0].sip, w[0].cube, w[0].channel) < (w[1].sip, w[1].cube, w[1].channel));
                }
                for c in &u {
                    for w in c.busy.windows(2) {
                        prop_assert!(w[0].1 <= w[1].0);
                    }
                    prop_assert!(c.busy.iter().all(|&(s, e)| s < e));
                }
            }
        }
    }
}
