use super::snapshot::SPARE;
use super::*;

#[test]
fn images_share_whole_pages_and_a_write_copies_only_its_page() {
    // Bytes i % 251 over two rows, at in-page offset 100: the image
    // spans 4 pages, the middle two whole.
    let len = 3 * PAGE;
    let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let (r0, r1) = src.split_at(PAGE + 7);
    let img = PageImage::new(100, len as u64, [r0, r1]);
    assert_eq!(img.chunks().map(<[u8]>::len).sum::<usize>(), len);
    assert_eq!(img.chunks().flatten().copied().collect::<Vec<_>>(), src);
    let mut d = DataPlane::new();
    // A neighbour's bytes in the first and last page must survive.
    let (a, b) = (100u64, 100 + 8 * PAGE as u64);
    d.write(a - 2, &[7, 7]);
    d.write(b + len as u64, &[8, 8]);
    d.mark_pending(b + 10, 20, 3);
    d.write_image(a, &img);
    d.write_image(b, &img);
    assert_eq!(d.page_counts(), (8, 4), "2 x 2 whole pages shared");
    let read = |d: &DataPlane, pa: u64, n: usize| {
        let mut out = vec![0u8; n];
        d.read(pa, &mut out).unwrap();
        out
    };
    assert_eq!(read(&d, a, len), src);
    assert_eq!(read(&d, b, len), src, "the pending mark is cleared");
    assert_eq!(read(&d, a - 2, 2), [7, 7]);
    assert_eq!(read(&d, b + len as u64, 2), [8, 8]);
    // A PE writes its copy: only that page is copied, the other copy
    // keeps the image's bytes.
    let at = a + PAGE as u64;
    d.write(at, &[0xee; 4]);
    assert_eq!(read(&d, at, 4), [0xee; 4]);
    let off = (at - a) as usize;
    assert_eq!(read(&d, b + off as u64, 4), src[off..off + 4]);
    // a's page is its own now; b's still shares with the image.
    assert_eq!(d.page_counts(), (8, 3));
    // Without the image, b's copy of that page is b's alone; the
    // other whole page stays shared between the two copies.
    drop(img);
    assert_eq!(d.page_counts(), (8, 2));
    assert_eq!(
        read(&d, a + 2 * PAGE as u64, 100),
        src[2 * PAGE..2 * PAGE + 100]
    );
}

#[test]
fn partial_overlapping_and_cross_page_access() {
    let mut d = DataPlane::new();
    let base = (PAGE as u64) - 3;
    d.write(base, &[1, 2, 3, 4, 5, 6]);
    d.write(base + 2, &[9, 9]);
    let mut out = [0u8; 8];
    d.read(base - 1, &mut out).unwrap();
    assert_eq!(out, [0, 1, 2, 9, 9, 5, 6, 0]);
}

#[test]
fn strided_extents_round_trip() {
    let mut d = DataPlane::new();
    let x = Extent {
        pa: 1000,
        len: 3,
        rows: 2,
        stride: 10,
    };
    assert_eq!(d.write_extent(&x, &[1, 2, 3, 4, 5, 6]), 6);
    let mut out = Vec::new();
    d.read_extent(&x, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 5, 6]);
    let mut gap = [7u8; 1];
    d.read(1003, &mut gap).unwrap();
    assert_eq!(gap, [0]);
}

fn writer(op_id: u64) -> Writer {
    Writer {
        op_id,
        op_name: "add",
        pe: crate::machine::PeCoord {
            sip: 0,
            cube: 1,
            pe: 2,
        },
        time: 5000,
    }
}

#[test]
fn moved_pending_bytes_keep_their_writer_after_the_source_is_overwritten() {
    let mut d = DataPlane::new();
    d.write(0, &[9; 32]);
    d.register_writer(writer(3));
    d.mark_pending(8, 8, 3);
    // Two rows of 12 bytes, 16 apart: row 0 holds pending 8..12 (its
    // last 4 bytes); row 1 (16..28) none.
    let src = [Extent {
        pa: 0,
        len: 12,
        rows: 2,
        stride: 16,
    }];
    let (mut out, mut unknown) = (Vec::new(), Vec::new());
    d.read_partial(&src, &mut out, &mut unknown);
    assert_eq!(out.len(), 24);
    assert_eq!(unknown.len(), 1);
    assert_eq!((unknown[0].offset, unknown[0].len), (8, 4));
    assert_eq!(unknown[0].writer, writer(3));
    // The source is overwritten (its writer's last interval goes)
    // before the bytes land: the destination still names op 3.
    d.write(0, &[1; 32]);
    assert!(d.read(8, &mut [0u8; 8]).is_ok());
    let dst = [Extent::contiguous(1000, 24)];
    d.mark_unknown(&dst, &unknown);
    let e = d.read(1000, &mut [0u8; 24]).unwrap_err();
    assert_eq!((e.pa, e.writer), (1008, 3));
    let mut again = Vec::new();
    let mut u2 = Vec::new();
    d.read_partial(&dst, &mut again, &mut u2);
    assert_eq!(u2, unknown, "same range, same writer");
}

fn plane_with(writes: &[(u64, u16, u8)]) -> DataPlane {
    let mut d = DataPlane::new();
    for &(pa, len, v) in writes {
        d.write(pa, &vec![v; len as usize]);
    }
    d
}

proptest::proptest! {
    /// A snapshot holds what a copying read returns (bytes,
    /// fingerprint), keeps it when the source is overwritten after,
    /// and writes the same bytes as writing the copy would.
    #[test]
    fn snapshots_read_and_write_as_copies_do(
        writes in proptest::collection::vec((0u64..200_000, 1u16..5000, 1u8..255), 0..12),
        src in proptest::collection::vec((0u64..200_000, 1u64..3000, 1u32..6, 0u64..70_000), 1..4),
        dst_at in 0u64..300_000,
    ) {
        let src: Vec<Extent> = src
            .into_iter()
            .map(|(pa, len, rows, gap)| Extent { pa, len, rows, stride: if rows > 1 { len + gap } else { 0 } })
            .collect();
        let d = plane_with(&writes);
        let (mut copy, mut u1, mut u2) = (Vec::new(), Vec::new(), Vec::new());
        d.read_partial(&src, &mut copy, &mut u1);
        d.unknown_in(&src, &mut u2);
        let snap = d.snapshot(&src);
        proptest::prop_assert_eq!(snap.len(), copy.len());
        proptest::prop_assert!(snap.to_vec() == copy);
        proptest::prop_assert_eq!(snap.fingerprint(), kb_format::fingerprint(&copy));
        proptest::prop_assert_eq!(u1, u2);
        // Two destination pieces: a strided one and the rest.
        let total = copy.len() as u64;
        let head = total / 2;
        let dst = vec![
            Extent { pa: dst_at, len: head.max(1).min(total), rows: 1, stride: 0 },
            Extent::contiguous(dst_at + 2 * PAGE as u64, total - head.max(1).min(total)),
        ];
        let (mut a, mut b) = (plane_with(&writes), plane_with(&writes));
        a.write_snapshot(&dst, &snap);
        let mut at = 0;
        for x in &dst {
            at += b.write_extent(x, &copy[at..]);
        }
        let (mut ra, mut rb) = (vec![0u8; 600_000], vec![0u8; 600_000]);
        a.read(0, &mut ra).unwrap();
        b.read(0, &mut rb).unwrap();
        proptest::prop_assert!(ra == rb);
        // Overwriting the source leaves the snapshot as it was.
        let mut d = d;
        for x in &src {
            d.write_extent(&Extent { rows: 1, stride: 0, len: x.bytes(), ..*x }, &vec![0xEE; x.bytes() as usize]);
        }
        proptest::prop_assert!(snap.to_vec() == copy);
    }
}

/// What a sequence of TCM operations does to a plain byte array.
#[derive(Debug, Clone)]
enum TcmOp {
    /// A move from `rows` rows of `len` bytes `stride` apart at `src`
    /// into the one range at `dst` (lands by reference).
    Move {
        src: u64,
        len: u64,
        rows: u32,
        gap: u64,
        dst: u64,
    },
    /// The same bytes into two rows `gap` apart at `dst` (copied).
    MoveStrided {
        src: u64,
        len: u64,
        dst: u64,
        gap: u64,
    },
    Write {
        at: u64,
        len: u64,
        v: u8,
    },
    Pending {
        at: u64,
        len: u64,
    },
}

proptest::proptest! {
    /// Pending marks (by new writers and by one writer again) and
    /// writes, often over exactly the bytes marked before (a result
    /// rewritten in place), keep every byte's writer as a byte-level
    /// model does, the intervals disjoint, touching ranges of one
    /// writer merged, and each writer counted once per interval.
    #[test]
    fn pending_marks_follow_a_byte_model(
        ops in proptest::collection::vec(
            (0u8..3, 0u64..6, proptest::option::of((0u64..600, 1u64..200))),
            1..40,
        )
    ) {
        const SLOT: u64 = 100;
        let mut d = DataPlane::new();
        let mut model = vec![None::<u64>; 800];
        let mut next = 0;
        for (op, slot, free) in ops {
            let (at, len) = free.unwrap_or((slot * SLOT, SLOT));
            let bytes = at as usize..(at + len) as usize;
            // 0: a new writer's mark; 1: the same writer marks again
            // (its ranges merge where they touch); 2: a write.
            if op < 2 {
                if op == 0 || next == 0 {
                    next += 1;
                }
                // As the engine does: registered before each mark.
                d.register_writer(writer(next));
                d.mark_pending(at, len, next);
                model[bytes].iter_mut().for_each(|b| *b = Some(next));
            } else {
                d.write(at, &vec![1; len as usize]);
                model[bytes].iter_mut().for_each(|b| *b = None);
            }
            let mut got = vec![None; 800];
            let mut counts = std::collections::BTreeMap::new();
            let (mut prev_end, mut prev_writer) = (0, None);
            for (s, &(e, w)) in d.pending.iter() {
                proptest::prop_assert!(s >= prev_end && e > s, "[{}, {}) after {}", s, e, prev_end);
                proptest::prop_assert!(
                    s > prev_end || prev_writer != Some(w),
                    "touching ranges of writer {} not merged at {}", w, s
                );
                (prev_end, prev_writer) = (e, Some(w));
                got[s as usize..e as usize].iter_mut().for_each(|b| *b = Some(w));
                *counts.entry(w).or_insert(0u32) += 1;
            }
            proptest::prop_assert_eq!(&got, &model);
            let held: std::collections::BTreeMap<u64, u32> =
                d.writers.iter().map(|(&w, &(_, n))| (w, n)).collect();
            proptest::prop_assert_eq!(held, counts);
            // A move's view of them: each slot, a span across slots,
            // and rows with gaps, listed as runs of one writer.
            let queries = (0..7)
                .map(|k| Extent::contiguous(k * SLOT, SLOT))
                .chain([
                    Extent::contiguous(50, 700),
                    Extent { pa: 20, len: 60, rows: 5, stride: 150 },
                ]);
            for x in queries {
                let mut want: Vec<(usize, usize, u64)> = Vec::new();
                let mut at = 0;
                for r in 0..x.rows as u64 {
                    let row = x.pa + r * x.stride;
                    for b in row..row + x.len {
                        if let Some(w) = model[b as usize] {
                            match want.last_mut() {
                                Some(u) if u.2 == w && u.0 + u.1 == at => u.1 += 1,
                                _ => want.push((at, 1, w)),
                            }
                        }
                        at += 1;
                    }
                }
                let mut unknown = Vec::new();
                d.unknown_in(&[x], &mut unknown);
                let got: Vec<(usize, usize, u64)> =
                    unknown.iter().map(|u| (u.offset, u.len, u.writer.op_id)).collect();
                proptest::prop_assert_eq!(got, want, "{:?}", x);
            }
        }
    }
}

fn tcm_op() -> impl proptest::strategy::Strategy<Value = TcmOp> {
    use proptest::prelude::*;
    const R: u64 = 3 * PAGE as u64;
    prop_oneof![
        3 => (0..R / 2, 1u64..9000, 1u32..4, 0u64..5000, 0..R / 2)
            .prop_map(|(src, len, rows, gap, dst)| TcmOp::Move { src, len, rows, gap, dst }),
        1 => (0..R / 2, 2u64..9000, 0..R / 2, 1u64..3000)
            .prop_map(|(src, len, dst, gap)| TcmOp::MoveStrided { src, len, dst, gap }),
        2 => (0..R - 9000, 1u64..9000, 1u8..255).prop_map(|(at, len, v)| TcmOp::Write { at, len, v }),
        1 => (0..R - 9000, 1u64..9000).prop_map(|(at, len)| TcmOp::Pending { at, len }),
    ]
}

proptest::proptest! {
    /// Moves into TCM land by reference; every read after any mix of
    /// moves, writes and pending marks sees what copying every byte
    /// gives (known bytes; fingerprints of known moves too).
    #[test]
    fn tcm_moves_landed_by_reference_read_as_copies(
        ops in proptest::collection::vec(tcm_op(), 1..24)
    ) {
        const R: usize = 3 * PAGE;
        let base = kb_format::pa::Pa {
            space: kb_format::Space::Tcm, sip: 0, cube: 0, pe: 1, offset: 0,
        }.encode().unwrap();
        let mut d = DataPlane::new();
        let mut bytes = vec![0u8; R];
        let mut known = vec![true; R];
        let mut writer = 0u64;
        for op in ops {
            match op {
                TcmOp::Move { src, len, rows, gap, dst } => {
                    let stride = if rows > 1 { len + gap } else { 0 };
                    let x = Extent { pa: base + src, len, rows, stride };
                    let (mut moved, mut moved_known) = (Vec::new(), Vec::new());
                    for r in 0..rows as u64 {
                        let at = (src + r * stride) as usize;
                        moved.extend_from_slice(&bytes[at..at + len as usize]);
                        moved_known.extend_from_slice(&known[at..at + len as usize]);
                    }
                    let k = moved_known.iter().all(|&b| b);
                    let mut unknown = Vec::new();
                    d.unknown_in(&[x], &mut unknown);
                    proptest::prop_assert_eq!(unknown.is_empty(), k);
                    let snap = d.snapshot(&[x]);
                    let n = moved.len();
                    let to = [Extent::contiguous(base + dst, n as u64)];
                    let fp = d.land(&to, &snap, k);
                    // As the engine does: unknown bytes stay unknown.
                    d.mark_unknown(&to, &unknown);
                    proptest::prop_assert_eq!(fp, k.then(|| kb_format::fingerprint(&moved)));
                    let dst = dst as usize;
                    bytes[dst..dst + n].copy_from_slice(&moved);
                    known[dst..dst + n].copy_from_slice(&moved_known);
                }
                TcmOp::MoveStrided { src, len, dst, gap } => {
                    let from = [Extent::contiguous(base + src, len)];
                    let mut unknown = Vec::new();
                    d.unknown_in(&from, &mut unknown);
                    let snap = d.snapshot(&from);
                    let half = len / 2;
                    let rows = [(dst, half), (dst + half + gap, len - half)];
                    let pieces: Vec<Extent> = rows.iter().map(|&(a, n)| Extent::contiguous(base + a, n)).collect();
                    d.land(&pieces, &snap, false);
                    d.mark_unknown(&pieces, &unknown);
                    let moved = bytes[src as usize..(src + len) as usize].to_vec();
                    let moved_known = known[src as usize..(src + len) as usize].to_vec();
                    let mut at = 0;
                    for (a, n) in rows {
                        let (a, n) = (a as usize, n as usize);
                        bytes[a..a + n].copy_from_slice(&moved[at..at + n]);
                        known[a..a + n].copy_from_slice(&moved_known[at..at + n]);
                        at += n;
                    }
                }
                TcmOp::Write { at, len, v } => {
                    d.write(base + at, &vec![v; len as usize]);
                    let (a, n) = (at as usize, len as usize);
                    bytes[a..a + n].fill(v);
                    known[a..a + n].iter_mut().for_each(|b| *b = true);
                }
                TcmOp::Pending { at, len } => {
                    writer += 1;
                    d.register_writer(self::writer(writer));
                    d.mark_pending(base + at, len, writer);
                    known[at as usize..(at + len) as usize].iter_mut().for_each(|b| *b = false);
                }
            }
            let got = d.snapshot(&[Extent::contiguous(base, R as u64)]).to_vec();
            for i in 0..R {
                if known[i] {
                    proptest::prop_assert_eq!(got[i], bytes[i], "byte {}", i);
                }
            }
            // The copying reads agree with the snapshot.
            let mut v = Vec::new();
            d.append_unchecked(base, R as u64, &mut v);
            proptest::prop_assert!(v == got);
            let mut whole = vec![0u8; 4096];
            if known[..4096].iter().all(|&b| b) {
                d.read(base, &mut whole).unwrap();
                proptest::prop_assert!(whole[..] == bytes[..4096]);
            }
        }
    }
}

#[test]
fn a_remembered_fingerprint_is_never_one_of_bytes_since_overwritten() {
    let mut d = DataPlane::new();
    let src = [Extent {
        pa: 1000,
        len: 300,
        rows: 4,
        stride: 20_000,
    }];
    // Copied (not landed by reference), so no snapshot outlives the
    // move and the source pages are written in place where they can.
    let dst = [Extent {
        pa: 900_000,
        len: 600,
        rows: 2,
        stride: 1000,
    }];
    let expect = |d: &DataPlane| {
        let mut b = Vec::new();
        d.read_extent(&src[0], &mut b).unwrap();
        kb_format::fingerprint(&b)
    };
    for round in 0..4u8 {
        d.write(1000, &vec![round; 70_000]);
        let first = d.snapshot(&src);
        let fp = d.land(&dst, &first, true);
        drop(first);
        assert_eq!(fp, Some(expect(&d)), "round {round}");
        // The same bytes again: the same fingerprint (remembered).
        let again = d.snapshot(&src);
        assert_eq!(d.land(&dst, &again, true), Some(expect(&d)));
    }
    // A write inside one row only.
    d.write(21_050, &[77; 4]);
    let snap = d.snapshot(&src);
    assert_eq!(d.land(&dst, &snap, true), Some(expect(&d)));
}

/// A snapshot's allocation goes back to the pool only when its last
/// holder drops it: one still shared keeps its bytes.
#[test]
fn a_dropped_snapshot_is_reused_and_a_shared_one_is_not() {
    let ptr = |s: &Snapshot| Arc::as_ptr(s.0.as_ref().expect("not empty"));
    let mut d = DataPlane::new();
    d.write(0, &[7u8; 300]);
    let a = d.snapshot(&[Extent::contiguous(0, 300)]);
    let kept = a.clone();
    let p = ptr(&a);
    drop(a);
    let b = d.snapshot(&[Extent::contiguous(0, 300)]);
    assert_ne!(ptr(&b), p, "still held: not reused");
    assert_eq!(kept.to_vec(), vec![7u8; 300]);
    drop(kept);
    let c = d.snapshot(&[Extent::contiguous(100, 50)]);
    assert_eq!(ptr(&c), p, "the last holder gave it back");
    assert_eq!(c.to_vec(), vec![7u8; 50]);
    assert_eq!(b.to_vec(), vec![7u8; 300]);
}

/// With the thread executor a kernel thread drops tiles it did not
/// make: it keeps no spares (each such thread would hold up to the
/// pool's bound); the thread that makes snapshots does.
#[test]
fn only_a_thread_that_makes_snapshots_keeps_spares() {
    let mut d = DataPlane::new();
    d.write(0, &[1u8; 64]);
    let x = [Extent::contiguous(0, 64)];
    let snaps: Vec<Snapshot> = (0..4).map(|_| d.snapshot(&x)).collect();
    let kept = std::thread::spawn(move || {
        drop(snaps);
        SPARE.with(|s| s.borrow().len())
    })
    .join()
    .unwrap();
    assert_eq!(kept, 0);
    drop(d.snapshot(&x));
    assert_eq!(SPARE.with(|s| s.borrow().len()), 1);
}

/// A kernel's own bytes go back for a later buffer of their size once
/// their snapshot is dropped, never while it is held.
#[test]
fn own_bytes_are_reused_once_their_snapshot_is_gone() {
    let own = |len: usize, v: u8| {
        let mut b = OwnBytes::new(len);
        b.bytes_mut().fill(v);
        let p = Arc::as_ptr(&b.0);
        (Snapshot::from_own(b), p)
    };
    let (a, pa) = own(100, 1);
    let (b, pb) = own(100, 2);
    assert_ne!(pa, pb, "a held buffer is not handed out again");
    drop(a);
    let (c, pc) = own(64, 3);
    assert_ne!(pc, pa, "only a buffer of the same size");
    let (d, pd) = own(100, 4);
    assert_eq!(pd, pa, "the dropped one, rewritten");
    assert_eq!(
        (b.to_vec(), c.to_vec(), d.to_vec()),
        (vec![2; 100], vec![3; 64], vec![4; 100])
    );
}

#[test]
fn a_snapshot_inside_one_page_is_one_slice_and_absent_pages_read_zero() {
    let mut d = DataPlane::new();
    d.write(100, &[5; 64]);
    let mut u = Vec::new();
    let snap = d.snapshot(&[Extent::contiguous(90, 80)]);
    let b = snap.as_slice().expect("one page, one piece");
    assert_eq!(&b[..10], &[0; 10]);
    assert_eq!(&b[10..74], &[5; 64]);
    // Across a written page and an absent one: two pieces, zeros after.
    let snap = d.snapshot(&[Extent::contiguous(PAGE as u64 - 8, 16)]);
    d.unknown_in(&[Extent::contiguous(PAGE as u64 - 8, 16)], &mut u);
    assert!(snap.as_slice().is_none());
    assert_eq!(snap.to_vec(), vec![0; 16]);
    assert!(u.is_empty());
}

#[test]
fn an_all_unknown_move_marks_as_the_copying_move_does() {
    // Source: two strided rows all pending (writers 3 and 4); the
    // destination holds older marks (writer 5) and known bytes.
    let setup = || {
        let mut d = DataPlane::new();
        d.write(0, &[7; 256]);
        for w in [3, 4, 5] {
            d.register_writer(writer(w));
        }
        d.mark_pending(0, 16, 3);
        d.mark_pending(32, 16, 4);
        d.mark_pending(130, 40, 5);
        d
    };
    let src = [Extent {
        pa: 0,
        len: 16,
        rows: 2,
        stride: 32,
    }];
    let dst = [Extent::contiguous(120, 8), Extent::contiguous(140, 24)];
    let mut unknown = Vec::new();
    let d0 = setup();
    d0.unknown_in(&src, &mut unknown);
    let (mut bytes, mut u_read) = (Vec::new(), Vec::new());
    d0.read_partial(&src, &mut bytes, &mut u_read);
    assert_eq!(unknown, u_read, "unknown_in lists what read_partial does");
    assert_eq!(unknown.iter().map(|u| u.len).sum::<usize>(), 32);
    // The copying move, and the move that copies nothing.
    let mut copied = setup();
    let mut at = 0;
    for x in &dst {
        at += copied.write_extent(x, &bytes[at..]);
    }
    copied.mark_unknown(&dst, &unknown);
    let mut marked = setup();
    marked.clear_extents(&dst);
    marked.mark_unknown(&dst, &unknown);
    assert_eq!(
        copied.pending.iter().collect::<Vec<_>>(),
        marked.pending.iter().collect::<Vec<_>>()
    );
    assert_eq!(*marked.pending.get(120).unwrap(), (128, 3));
    // The second piece's 24 bytes: 8 more of 3's, then 16 of 4's.
    assert_eq!(*marked.pending.get(140).unwrap(), (148, 3));
    assert_eq!(*marked.pending.get(148).unwrap(), (164, 4));
    // Writer 5's mark survives where neither move wrote (128..130 is
    // not pending: 130..140 and 164..170 are 5's).
    assert_eq!(*marked.pending.get(130).unwrap(), (140, 5));
    assert_eq!(*marked.pending.get(164).unwrap(), (170, 5));
    assert!(marked.read(128, &mut [0u8; 2]).is_ok());
}

#[test]
fn adjacent_pending_ranges_of_one_writer_merge() {
    let mut d = DataPlane::new();
    d.mark_pending_extent(
        &Extent {
            pa: 0,
            len: 10,
            rows: 4,
            stride: 10,
        },
        7,
    );
    assert_eq!(d.pending.len(), 1);
    d.mark_pending(40, 10, 7);
    d.mark_pending(60, 10, 8);
    assert_eq!(d.pending.len(), 2);
    assert_eq!(*d.pending.get(0).unwrap(), (50, 7));
    d.mark_pending_extent(
        &Extent {
            pa: 100,
            len: 4,
            rows: 3,
            stride: 8,
        },
        9,
    );
    assert_eq!(d.pending.len(), 5, "rows with gaps stay separate");
    assert_eq!(
        d.read(104, &mut [0u8; 4]),
        Ok(()),
        "the gaps are not pending"
    );
}

#[test]
fn pending_bytes_refuse_reads_until_overwritten() {
    let mut d = DataPlane::new();
    d.mark_pending(100, 50, 42);
    let mut b = [0u8; 10];
    assert!(d.read(0, &mut b[..]).is_ok());
    let e = d.read(95, &mut b).unwrap_err();
    assert_eq!((e.pa, e.writer), (100, 42));
    assert_eq!(d.read(145, &mut b).unwrap_err().writer, 42);
    d.write(100, &[0; 20]);
    assert!(d.read(100, &mut b).is_ok());
    assert!(
        d.read(118, &mut b).is_err(),
        "bytes 120.. are still pending"
    );
    assert!(d.read(150, &mut b).is_ok());
}
