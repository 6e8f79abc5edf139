//! A streaming writer of Perfetto's native trace format (protobuf
//! `perfetto.protos.Trace`): the few messages a timeline needs, encoded by
//! hand. The field numbers are those of Perfetto's schema; the subset used
//! is vendored in `kb-inspect/proto/perfetto_trace.proto` and a test
//! decodes every packet against it.
//!
//! A trace is a sequence of `Trace.packet` fields (tag 1, length-delimited
//! `TracePacket`), so packets are written as they are made: memory is the
//! interning tables, not the trace. Event names, categories, annotation
//! names and annotation string values are interned (`InternedData`,
//! emitted in the packet that first uses them on its sequence).
//!
//! Sequences (`trusted_packet_sequence_id`): op slices, nearly all of the
//! bytes, go on a sequence of their own per track (ids from 2); everything
//! else (descriptors, counters, launch, kernel and channel slices, flow
//! instants) on sequence 1 with absolute timestamps and explicit track
//! uuids. The first packet of an op track's sequence clears its
//! incremental state and sets its defaults (`TracePacketDefaults`: the
//! event's track, so events leave `track_uuid` out, and the timestamp
//! clock, a sequence-scoped incremental clock defined by a
//! `ClockSnapshot` against BOOTTIME, so each packet's timestamp is the
//! delta from the previous packet's on that sequence: slices on a track
//! never overlap, so the deltas are the gaps and the durations, a byte or
//! two). Every packet that uses interned data, the defaults or the
//! incremental clock says it needs the incremental state.
//!
//! Flow ids are varints (`flow_ids_old`, `terminating_flow_ids_old`:
//! deprecated in the schema but read by trace processor as the fixed64
//! fields are; ids are small counts, 3-4 bytes instead of 8). Track uuids
//! are small (a track's tid). Op slices are held back for [`DEFER`] later
//! ones, so a flow out of an op goes on the op's own BEGIN instead of an
//! instant packet of its own.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};

/// Wire types.
const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;

/// Field numbers (perfetto.protos).
mod f {
    pub const TRACE_PACKET: u32 = 1;
    // TracePacket
    pub const CLOCK_SNAPSHOT: u32 = 6;
    pub const TIMESTAMP: u32 = 8;
    pub const TRUSTED_SEQ: u32 = 10;
    pub const TRACK_EVENT: u32 = 11;
    pub const INTERNED_DATA: u32 = 12;
    pub const SEQUENCE_FLAGS: u32 = 13;
    pub const TIMESTAMP_CLOCK_ID: u32 = 58;
    pub const TRACE_PACKET_DEFAULTS: u32 = 59;
    pub const TRACK_DESCRIPTOR: u32 = 60;
    // TracePacketDefaults (and its timestamp_clock_id = 58)
    pub const TPD_TRACK_EVENT_DEFAULTS: u32 = 11;
    // TrackEventDefaults
    pub const TED_TRACK_UUID: u32 = 11;
    // ClockSnapshot / ClockSnapshot.Clock
    pub const CS_CLOCKS: u32 = 1;
    pub const CLK_ID: u32 = 1;
    pub const CLK_TIMESTAMP: u32 = 2;
    pub const CLK_INCREMENTAL: u32 = 3;
    // TrackDescriptor
    pub const TD_UUID: u32 = 1;
    pub const TD_NAME: u32 = 2;
    pub const TD_PROCESS: u32 = 3;
    pub const TD_PARENT: u32 = 5;
    pub const TD_COUNTER: u32 = 8;
    // ProcessDescriptor
    pub const PD_PID: u32 = 1;
    pub const PD_NAME: u32 = 6;
    // CounterDescriptor
    pub const CD_CATEGORIES: u32 = 2;
    pub const CD_UNIT: u32 = 3;
    // TrackEvent
    pub const TE_CATEGORY_IIDS: u32 = 3;
    pub const TE_ANNOTATIONS: u32 = 4;
    pub const TE_TYPE: u32 = 9;
    pub const TE_NAME_IID: u32 = 10;
    pub const TE_TRACK: u32 = 11;
    pub const TE_FLOW_IDS_OLD: u32 = 36;
    pub const TE_TERMINATING_FLOW_IDS_OLD: u32 = 42;
    pub const TE_DOUBLE_COUNTER: u32 = 44;
    // DebugAnnotation
    pub const DA_NAME_IID: u32 = 1;
    pub const DA_BOOL: u32 = 2;
    pub const DA_UINT: u32 = 3;
    pub const DA_DOUBLE: u32 = 5;
    pub const DA_STRING_IID: u32 = 17;
    // InternedData
    pub const ID_CATEGORIES: u32 = 1;
    pub const ID_EVENT_NAMES: u32 = 2;
    pub const ID_ANNOTATION_NAMES: u32 = 3;
    pub const ID_STRING_VALUES: u32 = 29;
    // EventName / EventCategory / DebugAnnotationName / InternedString
    pub const IID: u32 = 1;
    pub const IID_NAME: u32 = 2;
}

/// TrackEvent.Type.
pub const SLICE_BEGIN: u64 = 1;
pub const SLICE_END: u64 = 2;
pub const INSTANT: u64 = 3;
pub const COUNTER: u64 = 4;

/// TracePacket.SequenceFlags.
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;

/// Clock ids: BOOTTIME (the trace's clock; packets that name none use
/// it) and the first sequence-scoped one, the op tracks' incremental clock.
const CLOCK_BOOTTIME: u64 = 6;
const CLOCK_INCREMENTAL: u64 = 64;

/// The sequence of everything but op slices.
const MAIN_SEQ: u32 = 1;

/// CounterDescriptor.Unit.
pub const UNIT_UNSPECIFIED: u64 = 0;
pub const UNIT_SIZE_BYTES: u64 = 3;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn put_u64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

#[cfg(test)]
fn put_fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, I64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f64(out: &mut Vec<u8>, field: u32, v: f64) {
    tag(out, field, I64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// An annotation value.
#[derive(Debug, Clone, Copy)]
pub enum Val<'a> {
    U(u64),
    F(f64),
    S(&'a str),
    B(bool),
}

/// One interning table: string -> iid (1-based).
#[derive(Debug, Default)]
struct Table(HashMap<String, u64>);

impl Table {
    /// The iid of `s`; a new one is appended to `pending` as
    /// `field { iid, name }`.
    fn iid(&mut self, s: &str, field: u32, pending: &mut Vec<u8>, scratch: &mut Vec<u8>) -> u64 {
        if let Some(&i) = self.0.get(s) {
            return i;
        }
        let i = self.0.len() as u64 + 1;
        self.0.insert(s.to_string(), i);
        scratch.clear();
        put_u64(scratch, f::IID, i);
        put_bytes(scratch, f::IID_NAME, s.as_bytes());
        put_bytes(pending, field, scratch);
        i
    }
}

/// A packet sequence's incremental state: its interning tables and, for
/// an op track's sequence, its incremental clock.
#[derive(Debug, Default)]
struct Seq {
    id: u32,
    /// Its first packet (which clears the state) is written.
    started: bool,
    /// The incremental clock's value: the last timestamp written.
    last: u64,
    names: Table,
    cats: Table,
    anames: Table,
    svalues: Table,
}

impl Seq {
    fn new(id: u32) -> Self {
        Seq {
            id,
            ..Default::default()
        }
    }
}

/// Name, category and args of a track event into `event`, interning on
/// `seq` (new entries appended to `interned`).
struct Encoder<'a> {
    seq: &'a mut Seq,
    event: &'a mut Vec<u8>,
    interned: &'a mut Vec<u8>,
    scratch: &'a mut Vec<u8>,
    ann: &'a mut Vec<u8>,
}

impl Encoder<'_> {
    fn name(&mut self, name: &str, cat: &str) {
        let n = self
            .seq
            .names
            .iid(name, f::ID_EVENT_NAMES, self.interned, self.scratch);
        put_u64(self.event, f::TE_NAME_IID, n);
        if !cat.is_empty() {
            let c = self
                .seq
                .cats
                .iid(cat, f::ID_CATEGORIES, self.interned, self.scratch);
            put_u64(self.event, f::TE_CATEGORY_IIDS, c);
        }
    }

    fn annotations(&mut self, args: &[(&str, Val<'_>)]) {
        for (k, v) in args {
            self.ann.clear();
            let n = self
                .seq
                .anames
                .iid(k, f::ID_ANNOTATION_NAMES, self.interned, self.scratch);
            put_u64(self.ann, f::DA_NAME_IID, n);
            match *v {
                Val::U(x) => put_u64(self.ann, f::DA_UINT, x),
                Val::F(x) => put_f64(self.ann, f::DA_DOUBLE, x),
                Val::B(x) => put_u64(self.ann, f::DA_BOOL, u64::from(x)),
                Val::S(s) => {
                    let i =
                        self.seq
                            .svalues
                            .iid(s, f::ID_STRING_VALUES, self.interned, self.scratch);
                    put_u64(self.ann, f::DA_STRING_IID, i);
                }
            }
            put_bytes(self.event, f::TE_ANNOTATIONS, self.ann);
        }
    }
}

/// Writes packets to `W`.
#[derive(Debug)]
pub struct PerfettoWriter<W: Write> {
    w: W,
    /// Sequence 1: descriptors, counters, other slices, flow instants.
    main: Seq,
    /// Op tracks' sequences, by track uuid.
    op_seqs: Vec<Option<Box<Seq>>>,
    /// The id of the next op track's sequence.
    next_seq: u32,
    /// InternedData entries for the packet being built.
    interned: Vec<u8>,
    event: Vec<u8>,
    ann: Vec<u8>,
    packet: Vec<u8>,
    scratch: Vec<u8>,
    /// Op slices not yet written (see [`PerfettoWriter::op_slice`]), in
    /// order; the first is number `deferred_base`.
    deferred: VecDeque<Deferred>,
    deferred_base: u64,
    /// Spent buffers of written slices, for reuse.
    pool: Vec<Vec<u8>>,
    pub packets: u64,
    pub bytes: u64,
}

/// An op slice held back so flows out of it can still be added.
#[derive(Debug)]
struct Deferred {
    track: u64,
    t0: u64,
    t1: u64,
    /// The BEGIN TrackEvent's fields, flows out excepted.
    event: Vec<u8>,
    /// InternedData entries its names first used on its track's sequence.
    interned: Vec<u8>,
    flows_out: Vec<u64>,
}

/// Op slices held back at most (a flow out of an older one gets an
/// instant of its own, as before deferral).
pub const DEFER: usize = 1 << 14;

impl<W: Write> PerfettoWriter<W> {
    pub fn new(w: W) -> Self {
        let mut p = PerfettoWriter {
            w,
            main: Seq::new(MAIN_SEQ),
            op_seqs: Vec::new(),
            next_seq: MAIN_SEQ + 1,
            interned: Vec::new(),
            event: Vec::new(),
            ann: Vec::new(),
            packet: Vec::new(),
            scratch: Vec::new(),
            deferred: VecDeque::new(),
            deferred_base: 0,
            pool: Vec::new(),
            packets: 0,
            bytes: 0,
        };
        // Flow instants are in category `dep`: interned up front.
        p.main
            .cats
            .iid("dep", f::ID_CATEGORIES, &mut p.interned, &mut p.scratch);
        p
    }

    /// Frame `self.packet` (with the pending interned data) as a
    /// Trace.packet of sequence 1; `needs`: whether it refers to interned
    /// data.
    fn emit(&mut self, needs: bool) -> io::Result<()> {
        let flags = if !self.main.started {
            self.main.started = true;
            SEQ_INCREMENTAL_STATE_CLEARED
        } else if needs {
            SEQ_NEEDS_INCREMENTAL_STATE
        } else {
            0
        };
        self.emit_on(MAIN_SEQ, flags)
    }

    /// Frame `self.packet` (with the pending interned data) as a
    /// Trace.packet of sequence `seq` with `flags` (0: none).
    fn emit_on(&mut self, seq: u32, flags: u64) -> io::Result<()> {
        if !self.interned.is_empty() {
            put_bytes(&mut self.packet, f::INTERNED_DATA, &self.interned);
            self.interned.clear();
        }
        put_u64(&mut self.packet, f::TRUSTED_SEQ, u64::from(seq));
        // Only packets that depend on the sequence's incremental state
        // say so (Perfetto drops those while the state is invalid);
        // descriptors and sequence 1's slice ends and counters do not,
        // and save the two bytes.
        if flags != 0 {
            put_u64(&mut self.packet, f::SEQUENCE_FLAGS, flags);
        }
        let mut head = [0u8; 11];
        head[0] = (f::TRACE_PACKET << 3 | LEN) as u8;
        let mut n = 1;
        let mut len = self.packet.len() as u64;
        while len >= 0x80 {
            head[n] = (len as u8) | 0x80;
            len >>= 7;
            n += 1;
        }
        head[n] = len as u8;
        n += 1;
        self.w.write_all(&head[..n])?;
        self.w.write_all(&self.packet)?;
        self.bytes += (n + self.packet.len()) as u64;
        self.packets += 1;
        self.packet.clear();
        Ok(())
    }

    /// A process track: `uuid`, pid and name.
    pub fn process(&mut self, uuid: u64, pid: u32, name: &str) -> io::Result<()> {
        self.scratch.clear();
        put_u64(&mut self.scratch, f::PD_PID, u64::from(pid));
        put_bytes(&mut self.scratch, f::PD_NAME, name.as_bytes());
        self.event.clear();
        put_u64(&mut self.event, f::TD_UUID, uuid);
        put_bytes(&mut self.event, f::TD_PROCESS, &self.scratch);
        put_bytes(&mut self.packet, f::TRACK_DESCRIPTOR, &self.event);
        self.emit(false)
    }

    /// A child track of `parent` (a slice track, or a counter track when
    /// `counter` is given: its unit).
    pub fn track(
        &mut self,
        uuid: u64,
        parent: u64,
        name: &str,
        counter: Option<u64>,
    ) -> io::Result<()> {
        self.event.clear();
        put_u64(&mut self.event, f::TD_UUID, uuid);
        put_u64(&mut self.event, f::TD_PARENT, parent);
        put_bytes(&mut self.event, f::TD_NAME, name.as_bytes());
        if let Some(unit) = counter {
            self.scratch.clear();
            put_bytes(&mut self.scratch, f::CD_CATEGORIES, b"kb");
            if unit != UNIT_UNSPECIFIED {
                put_u64(&mut self.scratch, f::CD_UNIT, unit);
            }
            put_bytes(&mut self.event, f::TD_COUNTER, &self.scratch);
        }
        put_bytes(&mut self.packet, f::TRACK_DESCRIPTOR, &self.event);
        self.emit(false)
    }

    /// Begin building a sequence-1 track event of `kind` on `track` at
    /// `ts_ns`.
    fn event_head(&mut self, ts_ns: u64, kind: u64, track: u64) {
        put_u64(&mut self.packet, f::TIMESTAMP, ts_ns);
        self.event.clear();
        put_u64(&mut self.event, f::TE_TYPE, kind);
        put_u64(&mut self.event, f::TE_TRACK, track);
    }

    /// An encoder of names and args on sequence 1.
    fn main_encoder(&mut self) -> Encoder<'_> {
        Encoder {
            seq: &mut self.main,
            event: &mut self.event,
            interned: &mut self.interned,
            scratch: &mut self.scratch,
            ann: &mut self.ann,
        }
    }

    fn event_tail(&mut self, interned: bool) -> io::Result<()> {
        put_bytes(&mut self.packet, f::TRACK_EVENT, &self.event);
        self.emit(interned)
    }

    /// A slice `[t0, t1]` ns on `track` (sequence 1): a BEGIN (name,
    /// category, args, the flows it ends) and an END packet.
    #[allow(clippy::too_many_arguments)]
    pub fn slice(
        &mut self,
        track: u64,
        t0: u64,
        t1: u64,
        name: &str,
        cat: &str,
        args: &[(&str, Val<'_>)],
        flows_in: &[u64],
    ) -> io::Result<()> {
        self.event_head(t0, SLICE_BEGIN, track);
        let mut e = self.main_encoder();
        e.name(name, cat);
        e.annotations(args);
        for &id in flows_in {
            put_u64(&mut self.event, f::TE_TERMINATING_FLOW_IDS_OLD, id);
        }
        self.event_tail(true)?;
        self.event_head(t1, SLICE_END, track);
        self.event_tail(false)
    }

    /// The sequence of op track `track`, made on first use (ids from 2,
    /// in order of first use).
    fn op_seq(&mut self, track: u64) -> &mut Seq {
        let i = track as usize;
        if i >= self.op_seqs.len() {
            self.op_seqs.resize_with(i + 1, || None);
        }
        let next = &mut self.next_seq;
        self.op_seqs[i].get_or_insert_with(|| {
            *next += 1;
            Box::new(Seq::new(*next - 1))
        })
    }

    /// An op slice, as [`PerfettoWriter::slice`] but on its track's own
    /// sequence, held back for up to [`DEFER`] later op slices so that
    /// flows out of it go on its own BEGIN ([`PerfettoWriter::flow_out`])
    /// rather than on an instant packet of their own. Returns its number
    /// for `flow_out`. Op slices on one track must come in time order and
    /// not overlap (`t0` at or after the previous one's `t1`).
    #[allow(clippy::too_many_arguments)]
    pub fn op_slice(
        &mut self,
        track: u64,
        t0: u64,
        t1: u64,
        name: &str,
        cat: &str,
        args: &[(&str, Val<'_>)],
        flows_in: &[u64],
    ) -> io::Result<u64> {
        if self.deferred.len() >= DEFER {
            self.write_deferred()?;
        }
        let mut event = self.pool.pop().unwrap_or_default();
        event.clear();
        put_u64(&mut event, f::TE_TYPE, SLICE_BEGIN);
        let mut interned = Vec::new();
        {
            let mut scratch = std::mem::take(&mut self.scratch);
            let mut ann = std::mem::take(&mut self.ann);
            let seq = self.op_seq(track);
            let mut e = Encoder {
                seq,
                event: &mut event,
                interned: &mut interned,
                scratch: &mut scratch,
                ann: &mut ann,
            };
            e.name(name, cat);
            e.annotations(args);
            self.scratch = scratch;
            self.ann = ann;
        }
        for &id in flows_in {
            put_u64(&mut event, f::TE_TERMINATING_FLOW_IDS_OLD, id);
        }
        self.deferred.push_back(Deferred {
            track,
            t0,
            t1,
            event,
            interned,
            flows_out: Vec::new(),
        });
        Ok(self.deferred_base + self.deferred.len() as u64 - 1)
    }

    /// Start flow `id` on held-back op slice `n`; false when it has been
    /// written already.
    pub fn flow_out(&mut self, n: u64, id: u64) -> bool {
        match n
            .checked_sub(self.deferred_base)
            .and_then(|i| self.deferred.get_mut(i as usize))
        {
            Some(d) => {
                d.flows_out.push(id);
                true
            }
            None => false,
        }
    }

    /// The timestamp field of the next packet on op sequence `seq` at
    /// `ts`: the delta from its last one, or (never for slices in time
    /// order) an absolute BOOTTIME timestamp (`true`).
    fn op_timestamp(seq: &mut Seq, ts: u64) -> (u64, bool) {
        match ts.checked_sub(seq.last) {
            Some(d) => {
                seq.last = ts;
                (d, false)
            }
            None => (ts, true),
        }
    }

    fn put_op_timestamp(&mut self, track: u64, ts: u64) {
        let (v, absolute) = Self::op_timestamp(self.op_seq(track), ts);
        put_u64(&mut self.packet, f::TIMESTAMP, v);
        if absolute {
            put_u64(&mut self.packet, f::TIMESTAMP_CLOCK_ID, CLOCK_BOOTTIME);
        }
    }

    /// Write the oldest held-back op slice on its track's sequence.
    fn write_deferred(&mut self) -> io::Result<()> {
        let Some(mut d) = self.deferred.pop_front() else {
            return Ok(());
        };
        self.deferred_base += 1;
        for &id in &d.flows_out {
            put_u64(&mut d.event, f::TE_FLOW_IDS_OLD, id);
        }
        let seq = self.op_seq(d.track);
        let id = seq.id;
        if !seq.started {
            // Clear the state; defaults: this track, the incremental
            // clock, which starts at the first slice's begin.
            seq.started = true;
            seq.last = d.t0;
            let mut ted = Vec::with_capacity(4);
            put_u64(&mut ted, f::TED_TRACK_UUID, d.track);
            let mut tpd = Vec::with_capacity(8);
            put_u64(&mut tpd, f::TIMESTAMP_CLOCK_ID, CLOCK_INCREMENTAL);
            put_bytes(&mut tpd, f::TPD_TRACK_EVENT_DEFAULTS, &ted);
            let mut snap = Vec::with_capacity(32);
            let mut clk = Vec::with_capacity(16);
            put_u64(&mut clk, f::CLK_ID, CLOCK_INCREMENTAL);
            put_u64(&mut clk, f::CLK_TIMESTAMP, d.t0);
            put_u64(&mut clk, f::CLK_INCREMENTAL, 1);
            put_bytes(&mut snap, f::CS_CLOCKS, &clk);
            clk.clear();
            put_u64(&mut clk, f::CLK_ID, CLOCK_BOOTTIME);
            put_u64(&mut clk, f::CLK_TIMESTAMP, d.t0);
            put_bytes(&mut snap, f::CS_CLOCKS, &clk);
            put_bytes(&mut self.packet, f::TRACE_PACKET_DEFAULTS, &tpd);
            put_bytes(&mut self.packet, f::CLOCK_SNAPSHOT, &snap);
            self.emit_on(id, SEQ_INCREMENTAL_STATE_CLEARED)?;
        }
        self.put_op_timestamp(d.track, d.t0);
        if !d.interned.is_empty() {
            put_bytes(&mut self.packet, f::INTERNED_DATA, &d.interned);
        }
        put_bytes(&mut self.packet, f::TRACK_EVENT, &d.event);
        self.emit_on(id, SEQ_NEEDS_INCREMENTAL_STATE)?;
        self.put_op_timestamp(d.track, d.t1);
        self.event.clear();
        put_u64(&mut self.event, f::TE_TYPE, SLICE_END);
        put_bytes(&mut self.packet, f::TRACK_EVENT, &self.event);
        self.emit_on(id, SEQ_NEEDS_INCREMENTAL_STATE)?;
        if self.pool.len() < 64 {
            self.pool.push(d.event);
        }
        Ok(())
    }

    /// Write every held-back op slice.
    pub fn write_all_deferred(&mut self) -> io::Result<()> {
        while !self.deferred.is_empty() {
            self.write_deferred()?;
        }
        Ok(())
    }

    /// An instant named `name` (the edge's kind) on `track` at `ts`
    /// (sequence 1) that starts flow `id`.
    pub fn flow_source(&mut self, track: u64, ts: u64, id: u64, name: &str) -> io::Result<()> {
        self.event_head(ts, INSTANT, track);
        self.main_encoder().name(name, "dep");
        put_u64(&mut self.event, f::TE_FLOW_IDS_OLD, id);
        self.event_tail(true)
    }

    /// A counter value.
    pub fn counter(&mut self, track: u64, ts: u64, value: f64) -> io::Result<()> {
        self.event_head(ts, COUNTER, track);
        put_f64(&mut self.event, f::TE_DOUBLE_COUNTER, value);
        self.event_tail(false)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.write_all_deferred()?;
        self.w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_tags_encode_as_protobuf_does() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        v.clear();
        put_u64(&mut v, 60, 1);
        assert_eq!(v, [0xe0, 0x03, 0x01]);
        v.clear();
        put_fixed64(&mut v, 47, 1);
        assert_eq!(v, [0xf9, 0x02, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
