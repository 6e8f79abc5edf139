//! A streaming writer of Perfetto's native trace format (protobuf
//! `perfetto.protos.Trace`): the few messages a timeline needs, encoded by
//! hand. The field numbers are those of Perfetto's schema; the subset used
//! is vendored in `kb-inspect/proto/perfetto_trace.proto` and a test
//! decodes every packet against it.
//!
//! A trace is a sequence of `Trace.packet` fields (tag 1, length-delimited
//! `TracePacket`), so packets are written as they are made: memory is the
//! interning tables, not the trace. All packets are on one sequence
//! (`trusted_packet_sequence_id` 1): the first clears the incremental
//! state, those that refer to interned data say they need it. Event names, categories, annotation
//! names and annotation string values are interned (`InternedData`,
//! emitted in the packet that first uses them). Track uuids are small
//! (a track's tid). Op slices are held back for [`DEFER`] later ones, so
//! a flow out of an op goes on the op's own BEGIN (`flow_ids`) instead of
//! an instant packet of its own; the packets that refer to interned data
//! are written in the order their names were interned.

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
    pub const TIMESTAMP: u32 = 8;
    pub const TRUSTED_SEQ: u32 = 10;
    pub const TRACK_EVENT: u32 = 11;
    pub const INTERNED_DATA: u32 = 12;
    pub const SEQUENCE_FLAGS: u32 = 13;
    pub const TRACK_DESCRIPTOR: u32 = 60;
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
    pub const TE_DOUBLE_COUNTER: u32 = 44;
    pub const TE_FLOW_IDS: u32 = 47;
    pub const TE_TERMINATING_FLOW_IDS: u32 = 48;
    // DebugAnnotation
    pub const DA_NAME_IID: u32 = 1;
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

/// Writes packets to `W`.
#[derive(Debug)]
pub struct PerfettoWriter<W: Write> {
    w: W,
    first: bool,
    names: Table,
    cats: Table,
    anames: Table,
    svalues: Table,
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
    /// InternedData entries its names first used.
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
            first: true,
            names: Table::default(),
            cats: Table::default(),
            anames: Table::default(),
            svalues: Table::default(),
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
        // Flow instants (written at once) name themselves `dep`: interned
        // up front, in the first packet, so that an op named `dep` held
        // back never defines it after an instant used it.
        p.names
            .iid("dep", f::ID_EVENT_NAMES, &mut p.interned, &mut p.scratch);
        p.cats
            .iid("dep", f::ID_CATEGORIES, &mut p.interned, &mut p.scratch);
        p
    }

    /// Frame `self.packet` (with the pending interned data) as a
    /// Trace.packet; `interned`: whether it refers to interned data.
    fn emit(&mut self, interned: bool) -> io::Result<()> {
        if !self.interned.is_empty() {
            let d = std::mem::take(&mut self.interned);
            put_bytes(&mut self.packet, f::INTERNED_DATA, &d);
            self.interned = d;
            self.interned.clear();
        }
        put_u64(&mut self.packet, f::TRUSTED_SEQ, 1);
        // Only packets that refer to interned data need the incremental
        // state (Perfetto drops those while the state is invalid); slice
        // ends, counters and descriptors do not, and save the two bytes.
        if self.first {
            put_u64(
                &mut self.packet,
                f::SEQUENCE_FLAGS,
                SEQ_INCREMENTAL_STATE_CLEARED,
            );
        } else if interned {
            put_u64(
                &mut self.packet,
                f::SEQUENCE_FLAGS,
                SEQ_NEEDS_INCREMENTAL_STATE,
            );
        }
        self.first = false;
        let mut head = Vec::with_capacity(6);
        tag(&mut head, f::TRACE_PACKET, LEN);
        varint(&mut head, self.packet.len() as u64);
        self.w.write_all(&head)?;
        self.w.write_all(&self.packet)?;
        self.bytes += (head.len() + self.packet.len()) as u64;
        self.packets += 1;
        self.packet.clear();
        Ok(())
    }

    /// A process track: `uuid`, pid and name.
    pub fn process(&mut self, uuid: u64, pid: u32, name: &str) -> io::Result<()> {
        self.scratch.clear();
        put_u64(&mut self.scratch, f::PD_PID, u64::from(pid));
        put_bytes(&mut self.scratch, f::PD_NAME, name.as_bytes());
        let pd = std::mem::take(&mut self.scratch);
        self.event.clear();
        put_u64(&mut self.event, f::TD_UUID, uuid);
        put_bytes(&mut self.event, f::TD_PROCESS, &pd);
        self.scratch = pd;
        let td = std::mem::take(&mut self.event);
        put_bytes(&mut self.packet, f::TRACK_DESCRIPTOR, &td);
        self.event = td;
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
            let cd = std::mem::take(&mut self.scratch);
            put_bytes(&mut self.event, f::TD_COUNTER, &cd);
            self.scratch = cd;
        }
        let td = std::mem::take(&mut self.event);
        put_bytes(&mut self.packet, f::TRACK_DESCRIPTOR, &td);
        self.event = td;
        self.emit(false)
    }

    /// Begin building a track event of `kind` on `track` at `ts_ns`.
    fn event_head(&mut self, ts_ns: u64, kind: u64, track: u64) {
        put_u64(&mut self.packet, f::TIMESTAMP, ts_ns);
        self.event.clear();
        put_u64(&mut self.event, f::TE_TYPE, kind);
        put_u64(&mut self.event, f::TE_TRACK, track);
    }

    fn event_name(&mut self, name: &str, cat: &str) {
        let n = self.names.iid(
            name,
            f::ID_EVENT_NAMES,
            &mut self.interned,
            &mut self.scratch,
        );
        put_u64(&mut self.event, f::TE_NAME_IID, n);
        if !cat.is_empty() {
            let c = self
                .cats
                .iid(cat, f::ID_CATEGORIES, &mut self.interned, &mut self.scratch);
            put_u64(&mut self.event, f::TE_CATEGORY_IIDS, c);
        }
    }

    fn annotations(&mut self, args: &[(&str, Val<'_>)]) {
        for (k, v) in args {
            self.ann.clear();
            let n = self.anames.iid(
                k,
                f::ID_ANNOTATION_NAMES,
                &mut self.interned,
                &mut self.scratch,
            );
            put_u64(&mut self.ann, f::DA_NAME_IID, n);
            match *v {
                Val::U(x) => put_u64(&mut self.ann, f::DA_UINT, x),
                Val::F(x) => put_f64(&mut self.ann, f::DA_DOUBLE, x),
                Val::S(s) => {
                    let i = self.svalues.iid(
                        s,
                        f::ID_STRING_VALUES,
                        &mut self.interned,
                        &mut self.scratch,
                    );
                    put_u64(&mut self.ann, f::DA_STRING_IID, i);
                }
            }
            let a = std::mem::take(&mut self.ann);
            put_bytes(&mut self.event, f::TE_ANNOTATIONS, &a);
            self.ann = a;
        }
    }

    fn event_tail(&mut self, interned: bool) -> io::Result<()> {
        let e = std::mem::take(&mut self.event);
        put_bytes(&mut self.packet, f::TRACK_EVENT, &e);
        self.event = e;
        self.emit(interned)
    }

    /// A slice `[t0, t1]` ns on `track`: a BEGIN (name, category, args,
    /// the flows it ends) and an END packet.
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
        self.event_name(name, cat);
        self.annotations(args);
        for &id in flows_in {
            put_fixed64(&mut self.event, f::TE_TERMINATING_FLOW_IDS, id);
        }
        self.event_tail(true)?;
        self.event_head(t1, SLICE_END, track);
        self.event_tail(false)
    }

    /// An op slice, as [`PerfettoWriter::slice`], held back for up to
    /// [`DEFER`] later op slices so that flows out of it go on its own
    /// BEGIN ([`PerfettoWriter::flow_out`]) rather than on an instant
    /// packet of their own. Returns its number for `flow_out`.
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
        self.event.clear();
        put_u64(&mut self.event, f::TE_TYPE, SLICE_BEGIN);
        put_u64(&mut self.event, f::TE_TRACK, track);
        self.event_name(name, cat);
        self.annotations(args);
        for &id in flows_in {
            put_fixed64(&mut self.event, f::TE_TERMINATING_FLOW_IDS, id);
        }
        let mut event = self.pool.pop().unwrap_or_default();
        event.clear();
        event.extend_from_slice(&self.event);
        let interned = if self.interned.is_empty() {
            Vec::new()
        } else {
            let i = self.interned.clone();
            self.interned.clear();
            i
        };
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

    /// Write the oldest held-back op slice.
    fn write_deferred(&mut self) -> io::Result<()> {
        let Some(mut d) = self.deferred.pop_front() else {
            return Ok(());
        };
        self.deferred_base += 1;
        for &id in &d.flows_out {
            put_fixed64(&mut d.event, f::TE_FLOW_IDS, id);
        }
        // Its interned names go before any pending for later packets.
        if !d.interned.is_empty() {
            d.interned.extend_from_slice(&self.interned);
            std::mem::swap(&mut self.interned, &mut d.interned);
        }
        put_u64(&mut self.packet, f::TIMESTAMP, d.t0);
        put_bytes(&mut self.packet, f::TRACK_EVENT, &d.event);
        self.emit(true)?;
        self.event_head(d.t1, SLICE_END, d.track);
        self.event_tail(false)?;
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

    /// An instant on `track` at `ts` that starts flow `id`.
    pub fn flow_source(&mut self, track: u64, ts: u64, id: u64) -> io::Result<()> {
        self.event_head(ts, INSTANT, track);
        self.event_name("dep", "dep");
        put_fixed64(&mut self.event, f::TE_FLOW_IDS, id);
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
