//! Encoding of op records inside a records chunk: LEB128 varints, with
//! op ids, start times, effect sequence numbers and addresses delta-coded
//! against the previous value in the same chunk. Each chunk starts from a
//! zero state, so any records chunk decodes on its own (random access).
//!
//! Addresses code against predictors held per (component, op name)
//! context, because one context's records walk nearby addresses while
//! different contexts interleave in time. Each context has four: read-side
//! and write-side params addresses, read and write range addresses (apart
//! from the params, which carry the VA or LA a kernel used while ranges
//! carry PAs). docs/trace-format.md gives the exact layout and the context
//! table.

use crate::atomic::{AtomicOp, AtomicParams, AtomicValues};
use crate::cursor::{Cur, V};
use crate::error::{FormatError, Result};
use crate::types::*;

mod decode;
mod encode;

pub use decode::RecordDecoder;
pub use encode::RecordEncoder;

const F_FINGERPRINT: u8 = 1 << 0;
const F_READ: u8 = 1 << 1;
const F_WRITE: u8 = 1 << 2;
/// Dependencies, all data ones (before format 3.4): a count, then each
/// as a signed varint `op_id - dep`. Read, never written.
const F_DEPS: u8 = 1 << 3;
/// An active interval follows the duration (format 3.3): two varints,
/// `start - t_start` and `end - start`.
const F_ACTIVE: u8 = 1 << 4;
/// Causal edges (format 3.4): a count, then each as a varint
/// `(op_id - dep) << 3 | kind`.
const F_EDGES: u8 = 1 << 5;
/// An atomic op (kind 4, set exactly on those records): a reader built
/// before atomics refuses the record (unknown flags) instead of skipping
/// its effects as an unknown kind's. The trace's version stays 3.4.
const F_ATOMIC: u8 = 1 << 6;
const F_KNOWN: u8 = F_FINGERPRINT | F_READ | F_WRITE | F_DEPS | F_ACTIVE | F_EDGES | F_ATOMIC;

/// Address predictor of the read-side params.
const RD: usize = 0;
/// Address predictor of the write-side params.
const WR: usize = 1;

/// Largest number of math inputs, effect ranges and dependencies a record
/// may have (the decoder refuses more; the writer checks before encoding).
pub const MAX_MATH_INPUTS: usize = 64;
pub const MAX_RANGES: usize = 1 << 20;
pub const MAX_DEPS: usize = 1 << 20;

/// Offset of the range predictors from the params ones.
const RANGES: usize = 2;

/// Delta-coding state shared by the encoder and decoder.
#[derive(Debug, Default, Clone)]
struct State {
    op_id: u64,
    t_start: u64,
    seq: u64,
    /// The slot of the current record's context in `ctx`.
    slot: usize,
    /// The address predictors of each (component, op name) context: a
    /// context's records move similar addresses, while records of
    /// different contexts interleave in time (PEs, loads and stores).
    ctx: Contexts,
}

/// Predictors by (component, op name) context: a direct-mapped table of
/// `CONTEXTS` slots, the slot being the top bits of
/// `(component << 32 | op_name) * 0x9E37_79B9_7F4A_7C15` (wrapping). A
/// context not in its slot starts from zero predictors and takes the slot
/// over. Each slot holds four predictors: read-side params, write-side
/// params, read ranges, write ranges. No allocation per record; both sides
/// evict the same way.
#[derive(Debug, Clone)]
struct Contexts(Box<[(u64, [u64; 4]); CONTEXTS]>);

/// Slots of the context table (a power of two).
const CONTEXTS: usize = 256;

impl Default for Contexts {
    fn default() -> Self {
        Contexts(Box::new([(u64::MAX, [0; 4]); CONTEXTS]))
    }
}

impl State {
    /// Selects the context of a record's (component, op name).
    #[inline(always)]
    fn enter(&mut self, component: u32, op_name: u32) {
        let key = (component as u64) << 32 | op_name as u64;
        let slot = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CONTEXTS.trailing_zeros()))
            as usize
            & (CONTEXTS - 1);
        if self.ctx.0[slot].0 != key {
            // A new context starts from the previous record's predictors:
            // its first addresses are often near those.
            let from = self.ctx.0[self.slot & (CONTEXTS - 1)].1;
            self.ctx.0[slot] = (key, from);
        }
        self.slot = slot;
    }

    /// The current context's predictor `side`.
    #[inline(always)]
    fn addr(&mut self, side: usize) -> &mut u64 {
        &mut self.ctx.0[self.slot & (CONTEXTS - 1)].1[side & 3]
    }
}

#[inline(always)]
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// An upper bound of the encoded size of `r`, so that the encoder can
/// write into a slice sized once per record.
fn size_bound(r: &Record) -> usize {
    let effect = |e: &Option<Effect>| e.as_ref().map_or(0, |e| 3 * V + e.ranges.len() * 4 * V);
    let params = match &r.params {
        Params::None => 0,
        Params::Raw(b) => b.len(),
        Params::Memory(_) => 2 * (1 + V) + 4 * V + 1,
        Params::Gemm(_) => 4 * (1 + V) + 1 + 3 * V + 4,
        Params::Math(m) => 1 + V + m.inputs.len() * (2 + 3 * V + 1) + (1 + V) + 2 * V + 2,
        Params::Atomic(_) => 2 + 4 * (1 + V) + 2 + 8 + 4 * V,
    };
    let active = if r.active.is_some() { 2 * V } else { 0 };
    2 + 5 * V + active + 8 + V + r.deps.len() * V + effect(&r.read) + effect(&r.write) + V + params
}

#[cfg(test)]
mod tests {
    use super::encode::{Out, encode_varint};
    use super::*;
    use crate::cursor::unzigzag;

    fn varint(d: &mut RecordDecoder<'_>) -> Result<u64> {
        let v = d.cur.varint();
        match d.cur.bad {
            Some((at, what)) => Err(d.cursor_error(at, what)),
            None => Ok(v),
        }
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn varints_decode_the_same_on_both_paths() {
        let mut values = vec![0u64, 1, 127, 128, 255, 16383, 16384, u64::MAX, u64::MAX - 1];
        for shift in 0..64 {
            values.push(1 << shift);
            values.push((1 << shift) - 1);
        }
        for v in values {
            let mut tmp = [0u8; 10];
            let n = encode_varint(v, &mut tmp);
            // At the end of the buffer (byte by byte) and with slack after
            // it (the unchecked path).
            for slack in [0usize, 1, 10] {
                let mut buf = tmp[..n].to_vec();
                buf.resize(n + slack, 0x80);
                let mut d = RecordDecoder::new(&buf, 0, 1);
                assert_eq!(varint(&mut d).unwrap(), v, "{v} with {slack} bytes after");
                assert_eq!(d.cur.p, n);
            }
        }
        // A 10-byte varint whose last byte carries more than bit 63.
        for slack in [0usize, 5] {
            let mut buf = vec![0x80u8; 9];
            buf.push(0x02);
            buf.resize(10 + slack, 0);
            let mut d = RecordDecoder::new(&buf, 0, 1);
            assert!(
                varint(&mut d)
                    .unwrap_err()
                    .to_string()
                    .contains("overflows")
            );
        }
        // Truncated varints.
        for len in 1..10 {
            let buf = vec![0x80u8; len];
            let mut d = RecordDecoder::new(&buf, 0, 1);
            assert!(
                varint(&mut d)
                    .unwrap_err()
                    .to_string()
                    .contains("past the end")
            );
        }
    }

    #[test]
    fn encoder_varints_match_the_plain_encoding() {
        let mut values = vec![0u64, 127, 128, u64::MAX, (1 << 56) - 1, 1 << 56];
        for shift in 0..64 {
            values.push(1 << shift);
            values.push((1 << shift) - 1);
            values.push((1u64 << shift).wrapping_mul(0x9e37_79b9));
        }
        for v in values {
            let mut want = [0u8; V];
            let n = encode_varint(v, &mut want);
            let mut buf = [0xaau8; V + 8];
            let mut o = Out {
                b: &mut buf,
                pos: 0,
            };
            o.varint(v);
            assert_eq!(o.pos, n, "{v:#x}");
            assert_eq!(&buf[..n], &want[..n], "{v:#x}");
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let buf = [0xffu8; 11];
        let mut d = RecordDecoder::new(&buf, 100, 1);
        let err = varint(&mut d).unwrap_err();
        assert!(
            err.to_string().contains("offset 110") && err.to_string().contains("overflows"),
            "{err}"
        );
    }

    /// A record with one read range and nothing else.
    fn read_at(op_id: u64, component: u32, pa: u64) -> Record {
        Record {
            op_id,
            component,
            read: Some(Effect {
                time: 0,
                seq: 0,
                ranges: vec![Extent::contiguous(pa, 64)],
            }),
            ..Record::default()
        }
    }

    /// Encodes `records` and returns each record's bytes.
    fn encode_each(records: &[Record]) -> Vec<Vec<u8>> {
        let mut enc = RecordEncoder::default();
        let mut out = Vec::new();
        for r in records {
            let before = enc.len();
            enc.push(r);
            out.push(enc.as_bytes()[before..].to_vec());
        }
        out
    }

    fn decode_all(bytes: &[u8], n: usize) -> Vec<Record> {
        let mut d = RecordDecoder::new(bytes, 0, n as u64);
        let mut out = Vec::new();
        let mut r = Record::default();
        while d.next_into(&mut r).unwrap() {
            out.push(r.clone());
        }
        out
    }

    #[test]
    fn a_context_codes_against_its_own_last_address() {
        // Context (0, 0) lives in slot 0; (1, 0) in slot 0x7f (the top
        // byte of 2^32 * 0x9E3779B97F4A7C15), so they do not collide.
        let records = [
            read_at(0, 0, 0x1000),
            read_at(1, 1, 0x9000_0000),
            read_at(2, 0, 0x1040),
        ];
        let bytes = encode_each(&records);
        // flags (read), kind, op_id +0, dt, duration, component, op_name,
        // time, seq, 1 range, pa, len 64, rows 1, no params.
        let head = [0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        // pa 0x1000 against zero: zigzag 0x2000.
        assert_eq!(
            bytes[0],
            [&head[..], &[0x80, 0x40, 0x40, 0x01, 0x00]].concat()
        );
        // A new context starts from the previous record's predictors:
        // 0x9000_0000 - 0x1000, zigzag 0x1_1fff_e000.
        let mut second = head;
        second[2] = 0x02; // op_id +1
        second[5] = 0x01; // component 1
        let pa = [0x80, 0xc0, 0xff, 0xff, 0x11];
        assert_eq!(bytes[1], [&second[..], &pa, &[0x40, 0x01, 0x00]].concat());
        // Back in context (0, 0): 0x1040 against its own 0x1000, not
        // against the other context's 0x9000_0000.
        let mut third = head;
        third[2] = 0x02;
        assert_eq!(
            bytes[2],
            [&third[..], &[0x80, 0x01, 0x40, 0x01, 0x00]].concat()
        );
        assert_eq!(decode_all(&bytes.concat(), 3), records);
    }

    #[test]
    fn contexts_that_share_a_slot_evict_each_other() {
        // (360, 0) shares slot 0 with (0, 0): its record takes the slot
        // over, so (0, 0) then starts again from (360, 0)'s predictors.
        let records = [
            read_at(0, 0, 0x1000),
            read_at(1, 360, 0x5000),
            read_at(2, 0, 0x1040),
        ];
        let bytes = encode_each(&records);
        // 0x1040 against 0x5000: zigzag(-0x3fc0) = 0x7f7f.
        assert_eq!(&bytes[2][10..13], &[0xff, 0xfe, 0x01]);
        assert_eq!(decode_all(&bytes.concat(), 3), records);
    }

    #[test]
    fn an_active_interval_is_two_varints_after_the_duration() {
        let r = Record {
            op_id: 0,
            t_start: 1000,
            t_end: 1500,
            active: Some((1100, 1400)),
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        // flags (active), kind, op_id, t_start 1000, duration 500,
        // active: +100, 300 long; component, op_name, params length.
        assert_eq!(
            bytes,
            [
                0x10, 0x00, 0x00, 0xe8, 0x07, 0xf4, 0x03, 0x64, 0xac, 0x02, 0x00, 0x00, 0x00
            ]
        );
        assert_eq!(decode_all(&bytes, 1), [r]);
    }

    fn decode_err(bytes: &[u8]) -> String {
        let mut d = RecordDecoder::new(bytes, 0, 1);
        d.next_into(&mut Record::default()).unwrap_err().to_string()
    }

    #[test]
    fn an_active_interval_outside_the_span_is_refused() {
        // Span [5, 15]: the interval +4 (at 9), 7 long, ends at 16.
        let past_end = [0x10, 0x00, 0x00, 0x05, 0x0a, 0x04, 0x07, 0x00, 0x00, 0x00];
        let e = decode_err(&past_end);
        assert!(
            e.contains(
                "op 0: active interval (+4 ps, 7 ps long) is not within its span [5, 15] ps"
            ),
            "{e}"
        );
        // +4 and 6 long ends at 15 exactly: accepted.
        let mut at_end = past_end;
        at_end[6] = 0x06;
        assert_eq!(decode_all(&at_end, 1)[0].active, Some((9, 15)));
        // A start past 2^64: t_start 5 plus a 10-byte varint of u64::MAX.
        let mut overflow = vec![0x10, 0x00, 0x00, 0x05, 0x0a];
        overflow.extend([0xff; 9]);
        overflow.extend([0x01, 0x00, 0x00, 0x00, 0x00]);
        let e = decode_err(&overflow);
        assert!(e.contains("is not within its span"), "{e}");
        // Truncated inside the interval.
        let e = decode_err(&past_end[..6]);
        assert!(e.contains("past the end"), "{e}");
    }

    #[test]
    fn edges_carry_their_kind_in_the_low_three_bits() {
        let r = Record {
            op_id: 9,
            deps: vec![
                Dep {
                    op: 7,
                    kind: DepKind::Resource,
                },
                Dep::data(1),
            ],
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        // flags (edges), kind, op_id zigzag(9), t_start, duration,
        // component, op_name; 2 edges: 2 << 3 | 4, 8 << 3 | 0; params.
        assert_eq!(
            bytes,
            [
                0x20, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x02, 0x14, 0x40, 0x00
            ]
        );
        assert_eq!(decode_all(&bytes, 1), [r]);
    }

    #[test]
    fn dependencies_before_3_4_read_as_data_edges() {
        // Flag bit 3: a count, then signed deltas (zigzag(9 - 7) = 4).
        let old = [0x08, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00];
        assert_eq!(decode_all(&old, 1)[0].deps, [Dep::data(7)]);
        // Both forms at once, and edge kinds 5 to 7, are refused.
        let mut both = old;
        both[0] = 0x28;
        assert!(decode_err(&both).contains("both dependency flags"));
        let unknown = [0x20, 0x00, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x15, 0x00];
        assert!(decode_err(&unknown).contains("unknown dependency kind"));
    }

    #[test]
    fn the_newest_math_ops_round_trip_and_the_next_code_is_refused() {
        let rec = |op| Record {
            kind: OpKind::Math,
            params: Params::Math(MathParams {
                op,
                inputs: vec![MathInput::Scalar(1.0)],
                out: Addr::default(),
                rows: 1,
                cols: 1,
                dtype: Dtype::F32,
                axis: None,
            }),
            ..Record::default()
        };
        let (a, b) = (rec(MathOp::Rand), rec(MathOp::Clamp));
        let (ea, eb) = (
            encode_each(std::slice::from_ref(&a)).concat(),
            encode_each(std::slice::from_ref(&b)).concat(),
        );
        assert_eq!(decode_all(&ea, 1), [a]);
        // The one byte that differs is the op code (51, 50): 52 is unknown.
        let diff: Vec<usize> = (0..ea.len()).filter(|&i| ea[i] != eb[i]).collect();
        assert_eq!(diff.len(), 1);
        assert_eq!((ea[diff[0]], eb[diff[0]]), (51, 50));
        let mut next = ea.clone();
        next[diff[0]] = 52;
        assert!(decode_err(&next).contains("unknown math op code 52"));
    }

    #[test]
    fn a_sync_op_has_no_params() {
        let r = Record {
            kind: OpKind::Sync,
            ..Record::default()
        };
        let bytes = encode_each(std::slice::from_ref(&r)).concat();
        assert_eq!(decode_all(&bytes, 1), [r]);
        // The same record with one params byte.
        let mut with = bytes.clone();
        *with.last_mut().unwrap() = 1;
        with.push(0);
        assert!(
            decode_err(&with).contains("sync op 0 has params"),
            "{}",
            decode_err(&with)
        );
    }

    #[test]
    fn many_contexts_round_trip() {
        // More contexts than slots, interleaved, with both effects and
        // params: the encoder and decoder evict alike.
        let records: Vec<Record> = (0..4000u64)
            .map(|i| {
                let h = i.wrapping_mul(0x2545_F491_4F6C_DD1D);
                let pa = 0x1_0000_0000 + (h >> 40) * 64;
                let mut r = read_at(i, (h >> 20) as u32 % 700, pa);
                r.op_name = (h >> 10) as u32 % 3;
                r.write = Some(Effect {
                    time: 5,
                    seq: 1,
                    ranges: vec![Extent::contiguous(pa ^ 0x4000_0000, 64)],
                });
                r.params = Params::Memory(MemoryParams {
                    src: Addr {
                        space: Space::Hbm,
                        addr: pa + 7,
                    },
                    dst: Addr {
                        space: Space::Tcm,
                        addr: h >> 50,
                    },
                    rows: 1,
                    row_bytes: 64,
                    src_stride: 64,
                    dst_stride: 64,
                    dtype: None,
                });
                r
            })
            .collect();
        let bytes = encode_each(&records).concat();
        assert_eq!(decode_all(&bytes, records.len()), records);
    }
}
