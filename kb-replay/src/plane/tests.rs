//! The plane's tests: pages, regions, host data, and aliases seen from
//! outside (logical reads and writes).

use super::*;
use kb_format::Dtype;

fn dev(space: Space, offset: u64) -> u64 {
    Pa {
        space,
        sip: 1,
        cube: 2,
        pe: 3,
        offset,
    }
    .encode()
    .expect("valid PA")
}

fn tensor(name: &str, n: u64) -> TensorMeta {
    TensorMeta {
        name: name.into(),
        dtype: Dtype::U8,
        shape: vec![n],
        address: 0,
        host_data: true,
        shards: vec![],
    }
}

fn plane() -> DataPlane {
    DataPlane::new(&[tensor("x", 100_000), tensor("y", 8)], DEFAULT_MAX_BYTES)
}

fn read(p: &DataPlane, addr: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0xaa; n];
    p.read(addr, &mut v).unwrap();
    v
}

#[test]
fn unwritten_device_memory_reads_zero() {
    let p = plane();
    assert_eq!(read(&p, dev(Space::Hbm, 12345), 5), vec![0; 5]);
}

#[test]
fn partial_and_overlapping_writes_keep_the_latest_bytes() {
    let mut p = plane();
    let base = dev(Space::Tcm, 100);
    p.write(base, &[1, 2, 3, 4, 5, 6]).unwrap();
    p.write(base + 2, &[9, 9]).unwrap();
    p.write(base + 5, &[7, 8]).unwrap();
    assert_eq!(read(&p, base - 1, 9), vec![0, 1, 2, 9, 9, 5, 7, 8, 0]);
    // A read inside a written range.
    assert_eq!(read(&p, base + 3, 2), vec![9, 5]);
}

#[test]
fn writes_and_reads_cross_page_boundaries() {
    let mut p = plane();
    // Beyond the largest region HBM is paged.
    let base = dev(Space::Hbm, REGION_MAX + PAGE as u64 * 3 - 3);
    let data: Vec<u8> = (0..PAGE as u32 + 10).map(|i| (i % 251) as u8).collect();
    p.write(base, &data).unwrap();
    assert_eq!(read(&p, base, data.len()), data);
    assert_eq!(p.page_count(), 3);
    assert!(p.regions.is_empty());
    // Below it, in a region.
    let low = dev(Space::Hbm, PAGE as u64 * 3 - 3);
    p.write(low, &data).unwrap();
    assert_eq!(read(&p, low, data.len()), data);
    assert_eq!((p.page_count(), p.regions.len()), (3, 1));
    // Different spaces with the same offset do not alias.
    assert_eq!(
        read(&p, dev(Space::Tcm, PAGE as u64 * 3 - 3), 4),
        vec![0; 4]
    );
}

#[test]
fn strided_gather_and_scatter() {
    let mut p = plane();
    let src = dev(Space::Hbm, 0);
    p.write(src, &(0u8..32).collect::<Vec<_>>()).unwrap();
    // 3 rows of 2 bytes, 8 apart, then one contiguous run of 3.
    let ex = [
        Extent {
            pa: src + 1,
            len: 2,
            rows: 3,
            stride: 8,
        },
        Extent::contiguous(src + 30, 2),
    ];
    let mut got = Vec::new();
    p.gather(&ex, &mut got).unwrap();
    assert_eq!(got, vec![1, 2, 9, 10, 17, 18, 30, 31]);

    let dst = dev(Space::Tcm, 0);
    let out = [Extent {
        pa: dst,
        len: 4,
        rows: 2,
        stride: 6,
    }];
    p.scatter(&out, &got).unwrap();
    assert_eq!(read(&p, dst, 10), vec![1, 2, 9, 10, 0, 0, 17, 18, 30, 31]);
    // Wrong byte count is an error, not a partial write.
    assert!(p.scatter(&out, &got[..7]).is_err());
}

#[test]
fn tcm_regions_grow_keeping_their_bytes_and_page_what_lies_beyond() {
    let mut p = plane();
    let at = |o| dev(Space::Tcm, o);
    p.write(at(10), &[1, 2, 3]).unwrap();
    assert_eq!(
        p.regions[&(at(0) >> OFFSET_BITS)].len(),
        super::REGION_MIN as usize
    );
    // Growing copies what the region held.
    p.write(at(3 << 20), &[4, 5]).unwrap();
    assert_eq!(p.regions[&(at(0) >> OFFSET_BITS)].len(), 4 << 20);
    assert_eq!(read(&p, at(9), 5), [0, 1, 2, 3, 0]);
    // Past REGION_MAX bytes are paged; a run across the end is split.
    let end = TCM_REGION_MAX;
    p.write(at(end - 2), &[6, 7, 8, 9]).unwrap();
    assert_eq!(
        p.regions[&(at(0) >> OFFSET_BITS)].len(),
        TCM_REGION_MAX as usize
    );
    assert_eq!(p.page_count(), 1);
    assert_eq!(read(&p, at(end - 3), 6), [0, 6, 7, 8, 9, 0]);
    assert_eq!(read(&p, at(3 << 20), 2), [4, 5]);
    // Another PE's TCM is a region of its own.
    let other = Pa {
        pe: 4,
        ..Pa::decode(at(0)).unwrap()
    }
    .encode()
    .unwrap();
    assert_eq!(read(&p, other + 10, 3), [0, 0, 0]);
    p.write(other + 10, &[7]).unwrap();
    assert_eq!(read(&p, at(10), 1), [1]);
    assert_eq!(p.regions.len(), 2);
}

#[test]
fn fingerprints_match_the_gathered_bytes_in_one_piece_or_many() {
    let mut p = plane();
    let data: Vec<u8> = (0..3 * PAGE as u32).map(|i| (i % 241) as u8).collect();
    for space in [Space::Hbm, Space::Tcm] {
        p.write(dev(space, 100), &data).unwrap();
        let cases = [
            vec![Extent::contiguous(dev(space, 100), 3 * PAGE as u64)],
            vec![Extent {
                pa: dev(space, 100),
                len: 700,
                rows: 90,
                stride: 2000,
            }],
            vec![
                Extent::contiguous(dev(space, 5), 50),
                Extent::contiguous(dev(space, PAGE as u64 - 7), 20),
            ],
            vec![],
        ];
        for ex in cases {
            let mut want = Vec::new();
            p.gather(&ex, &mut want).unwrap();
            assert_eq!(
                p.fingerprint(&ex).unwrap(),
                kb_format::fingerprint(&want),
                "{space:?} {ex:?}"
            );
        }
    }
}

/// The piece hasher gives the one-pass fingerprint of the concatenation
/// whatever the pieces: one piece, rows gathered into one pass, more than
/// a gathering's worth (streamed in parts), pieces larger than a
/// gathering between small ones, and the gathering's edges.
#[test]
fn piece_hasher_matches_the_one_pass_fingerprint_however_the_bytes_are_cut() {
    let data: Vec<u8> = (0..3 * HASH_GATHER as u32 + 1234)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let g = HASH_GATHER;
    let cuts: [&[usize]; 9] = [
        &[],
        &[256],
        &[1],
        &[4096],
        &[g],
        &[g - 1, 1],
        &[100, g + 5, 3],
        &[g / 2, g / 2, g / 2],
        &[7, 256, 1000, 2 * g, 13],
    ];
    for total in [0, 1, 300, g - 1, g, g + 1, 2 * g + 17, data.len()] {
        let want = kb_format::fingerprint(&data[..total]);
        for cut in cuts {
            let mut h = PieceHasher::new(total as u64);
            // The cut's sizes over and over (none: one piece).
            let mut sizes = cut.iter().cycle();
            let mut at = 0;
            while at < total {
                let n = sizes.next().map_or(total - at, |&n| n.min(total - at));
                h.feed(&data[at..at + n]);
                at += n;
            }
            assert_eq!(h.digest(), want, "total {total}, pieces {cut:?}");
        }
    }
}

#[test]
fn host_space_reads_tensor_data_and_keeps_the_input_pristine() {
    let mut p = plane();
    p.load_host(1, 0, &[1, 2, 3, 4]).unwrap();
    p.load_host(1, 4, &[5, 6, 7, 8]).unwrap();
    assert_host_writes_shadow_the_input(&mut p);
    assert_eq!(p.host_coverage(1), Some((8, Some(8))));
}

/// Tensor 1 holds 1..=8: a read of host space gives them, a write to
/// byte 2 shows in later reads, and the input itself stays 1..=8.
fn assert_host_writes_shadow_the_input(p: &mut DataPlane) {
    let h = pa::host(1, 2);
    assert_eq!(read(p, h, 4), vec![3, 4, 5, 6]);
    p.write(h, &[0xee]).unwrap();
    assert_eq!(read(p, pa::host(1, 0), 8), vec![1, 2, 0xee, 4, 5, 6, 7, 8]);
    let mut orig = [0u8; 8];
    p.read_host_input(1, 0, &mut orig).unwrap();
    assert_eq!(orig, [1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn a_whole_tensor_is_read_where_its_owner_keeps_it() {
    let bytes: Vec<u8> = vec![9, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    let owner: Owner = Arc::new(bytes);
    let data = &(*owner).as_ref()[1..9];
    let mut p = plane();
    p.load_host_in(1, 0, data, &owner, 1).unwrap();
    assert_eq!(p.host_coverage(1), Some((8, Some(8))));
    // Borrowed, not copied: the region reads the owner's bytes.
    let r = &p.regions[&mem_key(pa::host(1, 0))];
    assert!(r.is_borrowed());
    // A host-space write shadows it; the owner's bytes stay.
    assert_host_writes_shadow_the_input(&mut p);
    assert_eq!((*owner).as_ref()[3], 3);
    // A copy, moved on the device, reads the same.
    let d = dev(Space::Hbm, 0);
    let mut b = Vec::new();
    p.gather(&[Extent::contiguous(pa::host(1, 0), 8)], &mut b)
        .unwrap();
    p.write(d, &b).unwrap();
    assert_eq!(read(&p, d, 3), vec![1, 2, 0xee]);

    // Part of a tensor, or bytes that do not lie where said: copied.
    let mut q = plane();
    q.load_host_in(1, 0, &data[..4], &owner, 1).unwrap();
    q.load_host_in(1, 4, &data[4..], &owner, 5).unwrap();
    assert!(!q.regions[&mem_key(pa::host(1, 0))].is_borrowed());
    let elsewhere = data.to_vec();
    let mut q = plane();
    q.load_host_in(1, 0, &elsewhere, &owner, 1).unwrap();
    assert!(!q.regions[&mem_key(pa::host(1, 0))].is_borrowed());
    assert_eq!(read(&q, pa::host(1, 0), 8), vec![1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn bad_addresses_are_errors() {
    let mut p = plane();
    // Past the tensor's bytes.
    assert!(matches!(
        p.read(pa::host(1, 6), &mut [0; 4]),
        Err(PlaneError::HostOutOfRange { .. })
    ));
    // A tensor the trace does not have.
    assert!(matches!(
        p.read(pa::host(7, 0), &mut [0; 1]),
        Err(PlaneError::UnknownTensor { tensor: 7, .. })
    ));
    // Beyond 51 bits.
    assert!(p.write(1 << 51, &[1]).is_err());
    // Running from one space into the next.
    let end_of_hbm = (2u64 << 48) - 2;
    assert!(matches!(
        p.write(end_of_hbm, &[1, 2, 3]),
        Err(PlaneError::CrossesSpace { .. })
    ));
    assert!(p.load_host(1, 7, &[1, 2]).is_err());
}

#[test]
fn absurd_extents_are_refused_before_allocating() {
    let p = DataPlane::new(&[], 1 << 20);
    let huge = [Extent {
        pa: dev(Space::Hbm, 0),
        len: 1 << 30,
        rows: 1 << 20,
        stride: 1 << 30,
    }];
    let mut v = Vec::new();
    assert!(matches!(
        p.gather(&huge, &mut v),
        Err(PlaneError::TooLarge { .. })
    ));
    let overflow = Extent {
        pa: dev(Space::Hbm, 0),
        len: 1,
        rows: 3,
        stride: u64::MAX / 2,
    };
    assert!(matches!(
        runs(&overflow).map(|_| ()),
        Err(PlaneError::ExtentOverflow { .. })
    ));
}

#[test]
fn addresses_format_readably() {
    let ts = [tensor("x", 4)];
    assert_eq!(
        fmt_addr(dev(Space::Tcm, 0x40), &ts),
        "sip1.cube2.pe3.tcm+0x40"
    );
    assert_eq!(fmt_addr(pa::host(0, 16), &ts), "host:x+0x10");
    let e = Extent {
        pa: pa::host(0, 0),
        len: 2,
        rows: 2,
        stride: 4,
    };
    assert_eq!(fmt_extent(&e, &ts), "host:x+0x0 [2 x 2 B, stride 4]");
}

/// Bytes at `addr` through the raw (physical) path, ignoring aliases.
fn read_phys(p: &DataPlane, addr: u64, n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    p.gather_phys(&[Extent::contiguous(addr, n as u64)], &mut v)
        .unwrap();
    v
}

#[test]
fn aliases_are_read_through_and_materialized_before_their_sources_change() {
    let mut p = plane();
    let data: Vec<u8> = (0..64).collect();
    p.load_host(0, 0, &data).unwrap();
    let hbm = dev(Space::Hbm, 0x100);
    let tcm = dev(Space::Tcm, 0);
    // HBM := host[0..64] (lazily), TCM := rows 1 and 3 of HBM (8 bytes each,
    // 16 apart), resolved through HBM to host.
    let src = p.resolve(&[Extent::contiguous(pa::host(0, 0), 64)]);
    p.lazy_mut().set(hbm, 64, src);
    let rows = p.resolve(&[Extent {
        pa: hbm + 16,
        len: 8,
        rows: 2,
        stride: 32,
    }]);
    assert_eq!(
        rows,
        [Extent {
            pa: pa::host(0, 16),
            len: 8,
            rows: 2,
            stride: 32
        }]
    );
    p.lazy_mut().set(tcm, 16, rows);
    p.lazy().check();
    let want: Vec<u8> = (16..24).chain(48..56).collect();
    assert_eq!(read(&p, tcm, 16), want);
    assert_eq!(read(&p, hbm, 64), data);
    // Physically nothing moved.
    assert_eq!(read_phys(&p, hbm, 4), [0; 4]);
    // A write into the middle of HBM: the TCM alias keeps its bytes (its
    // source is host data), the HBM alias is trimmed around the write.
    p.write(hbm + 20, &[0xee; 4]).unwrap();
    p.lazy().check();
    assert_eq!(read(&p, tcm, 16), want);
    let mut now = data.clone();
    now[20..24].fill(0xee);
    assert_eq!(read(&p, hbm, 64), now);
    // New host data for those bytes: the aliases of the old are
    // materialized first.
    p.load_host(0, 16, &[0xaa; 8]).unwrap();
    p.lazy().check();
    assert_eq!(read(&p, tcm, 16), want);
    assert_eq!(read_phys(&p, tcm, 16), want);
    assert_eq!(read(&p, hbm, 64), now);
    // Everything materialized: physical is logical.
    p.materialize_all();
    assert!(p.lazy().is_empty());
    assert_eq!(read_phys(&p, hbm, 64), now);
    assert_eq!(read_phys(&p, tcm, 16), want);
    assert_eq!(
        p.fingerprint(&[Extent::contiguous(hbm, 64)]).unwrap(),
        kb_format::fingerprint(&now)
    );
}

/// Two aliases of one source, the younger's target inside the older's
/// source (a tile stored lazily to HBM, then the tile's first half
/// loaded lazily from its second half): a write to their shared source
/// bytes materializes the older first, which still reads the tile as it
/// was. Slab ids are reused, so the younger alias here has the lower id
/// (the order aliases were taken in before, which copied the younger
/// first and stored the changed tile: the hierarchical all-reduce's
/// wrong rows, `kb-sim -t large -b allreduce -p group=all -p
/// algorithm=hierarchical -p depth=16`).
#[test]
fn aliases_taken_together_are_materialized_oldest_first() {
    let tcm = dev(Space::Tcm, 0x40);
    let hbm = dev(Space::Hbm, 0x200);
    let spare = dev(Space::Hbm, 0x900);
    let tile: Vec<u8> = (0..16).collect();
    for finish in ["write to the source", "materialize everything"] {
        let mut p = plane();
        p.write(tcm, &tile).unwrap();
        // An alias made first and dropped, so its slab id is reused.
        p.lazy_mut()
            .set(spare, 4, vec![Extent::contiguous(tcm + 12, 4)]);
        // hbm := tile (older), then tile[0..8] := tile[8..16] (younger).
        p.lazy_mut().set(hbm, 16, vec![Extent::contiguous(tcm, 16)]);
        p.write(spare, &[0; 4]).unwrap();
        p.lazy_mut()
            .set(tcm, 8, vec![Extent::contiguous(tcm + 8, 8)]);
        p.lazy().check();
        assert_eq!(read(&p, hbm, 16), tile, "{finish}");
        let mut now: Vec<u8> = (8..16).chain(8..16).collect();
        if finish == "write to the source" {
            p.write(tcm + 8, &[0xee; 8]).unwrap();
            now[8..].fill(0xee);
        } else {
            p.materialize_all();
            assert_eq!(read_phys(&p, tcm, 16), now, "{finish}");
        }
        p.lazy().check();
        assert_eq!(read(&p, hbm, 16), tile, "{finish}: the stored tile");
        assert_eq!(read_phys(&p, hbm, 16), tile, "{finish}: the stored tile");
        assert_eq!(read(&p, tcm, 16), now, "{finish}: the tile");
    }
}

#[test]
fn copies_and_views_move_physical_bytes() {
    let mut p = plane();
    let hbm = dev(Space::Hbm, 0);
    let vals: Vec<f32> = (0..64).map(|i| i as f32).collect();
    p.write(hbm, bytemuck::cast_slice(&vals)).unwrap();
    let tcm = dev(Space::Tcm, 0);
    p.reserve(&[Extent::contiguous(tcm, 1024)]);
    // SAFETY: nothing else uses the plane while the view lives.
    #[allow(unsafe_code)]
    let shared = unsafe { p.shared() };
    // Column block 2..6 of the 8 x 8 matrix: 8 rows of 16 bytes, 32 apart.
    let block = Extent {
        pa: hbm + 8,
        len: 16,
        rows: 8,
        stride: 32,
    };
    #[allow(unsafe_code)]
    let v = unsafe { shared.f32_view(&[block], 8, 16) }.unwrap();
    assert_eq!((v.rows(), v.cols(), v.stride()), (8, 4, 8));
    assert_eq!(v.row(3), [26.0, 27.0, 28.0, 29.0]);
    // Copied into TCM straight (a region), then written in place.
    let dst = [Extent::contiguous(tcm, 128)];
    assert_eq!(shared.copy(&[block], &dst).unwrap(), 128);
    #[allow(unsafe_code)]
    let mut w = unsafe { shared.f32_view_mut(&dst, 8, 16) }.unwrap();
    assert_eq!(w.row_mut(7), [58.0, 59.0, 60.0, 61.0]);
    w.row_mut(0).fill(-1.0);
    // Views need one region, whole rows, 4-byte strides.
    #[allow(unsafe_code)]
    unsafe {
        assert!(shared.f32_view(&[block], 8, 12).is_none());
        assert!(shared.f32_view(&[block, block], 16, 16).is_none());
        let odd = Extent {
            stride: 30,
            ..block
        };
        assert!(shared.f32_view(&[odd], 8, 16).is_none());
        let far = Extent::contiguous(dev(Space::Hbm, REGION_MAX + 64), 64);
        assert!(shared.f32_view(&[far], 1, 64).is_none());
    }
    let mut back = vec![0u8; 16];
    p.read(tcm, &mut back).unwrap();
    assert_eq!(back, bytemuck::cast_slice::<f32, u8>(&[-1.0; 4]));
    // Into pages (beyond the region): through a buffer, the same bytes.
    let paged = [Extent::contiguous(dev(Space::Hbm, REGION_MAX + 4096), 128)];
    #[allow(unsafe_code)]
    let shared = unsafe { p.shared() };
    shared.copy(&[block], &paged).unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    p.gather(&[block], &mut a).unwrap();
    p.gather(&paged, &mut b).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_copy_into_one_region_writes_each_row_where_it_lies_however_the_source_is_cut() {
    let mut p = plane();
    let hbm = dev(Space::Hbm, 0);
    p.write(hbm, &(0..=255u8).cycle().take(4096).collect::<Vec<_>>())
        .unwrap();
    // Pieces that end inside destination rows and rows that end inside
    // pieces: 5 rows of 7 bytes 19 apart, one run of 11, 3 rows of 4.
    let src = [
        Extent {
            pa: hbm + 3,
            len: 7,
            rows: 5,
            stride: 19,
        },
        Extent::contiguous(hbm + 700, 11),
        Extent {
            pa: hbm + 1000,
            len: 4,
            rows: 3,
            stride: 40,
        },
    ];
    let mut bytes = Vec::new();
    p.gather(&src, &mut bytes).unwrap();
    assert_eq!(bytes.len(), 58);
    let tcm = dev(Space::Tcm, 0);
    let fill = vec![0xeeu8; 2048];
    for (dst, row_len, stride) in [
        // Rows of 29 bytes, 100 apart; rows back to back; one run.
        (
            Extent {
                pa: tcm + 5,
                len: 29,
                rows: 2,
                stride: 100,
            },
            29,
            100,
        ),
        (
            Extent {
                pa: tcm + 64,
                len: 29,
                rows: 2,
                stride: 29,
            },
            58,
            0,
        ),
        (Extent::contiguous(tcm + 7, 58), 58, 0),
    ] {
        p.write(tcm, &fill).unwrap();
        // SAFETY: nothing else uses the plane while the view lives.
        #[allow(unsafe_code)]
        let shared = unsafe { p.shared() };
        assert_eq!(shared.copy(&src, &[dst]).unwrap(), 58);
        // What a plain row-by-row scatter of the gathered bytes writes,
        // the bytes between the rows untouched.
        let mut want = fill.clone();
        let base = (dst.pa - tcm) as usize;
        for (r, chunk) in bytes.chunks(row_len).enumerate() {
            let at = base + r * stride;
            want[at..at + chunk.len()].copy_from_slice(chunk);
        }
        assert_eq!(read(&p, tcm, 2048), want, "{dst:?}");
    }
    // A last row past the region goes the general way, the same bytes.
    let region = p.regions.get(&mem_key(tcm)).expect("a TCM region").len() as u64;
    let across = Extent {
        pa: tcm + region - 60,
        len: 29,
        rows: 2,
        stride: 40,
    };
    #[allow(unsafe_code)]
    let shared = unsafe { p.shared() };
    shared.copy(&src, &[across]).unwrap();
    let mut back = Vec::new();
    p.gather(&[across], &mut back).unwrap();
    assert_eq!(back, bytes);
}

/// One step of the lazy-copy model check.
#[derive(Debug, Clone)]
enum Step {
    /// Write `byte` physically over `len` bytes at `at` (memory `mem`).
    Write {
        mem: u8,
        at: u64,
        len: u64,
        byte: u8,
    },
    /// Write `rows` rows of `len` bytes, `stride` apart.
    Rows {
        mem: u8,
        at: u64,
        len: u64,
        rows: u32,
        stride: u64,
        byte: u8,
    },
    /// Copy `len` bytes, lazily where the planner would.
    Copy {
        from: (u8, u64),
        to: (u8, u64),
        len: u64,
    },
    /// Write every alias to its target.
    MaterializeAll,
}

const MODEL_BYTES: u64 = 64;

fn model_addr(mem: u8) -> u64 {
    if mem == 0 {
        dev(Space::Tcm, 0x40)
    } else {
        dev(Space::Hbm, 0x1000)
    }
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let at_len = (0u64..MODEL_BYTES).prop_flat_map(|at| (Just(at), 1..=MODEL_BYTES - at));
    prop_oneof![
        2 => (0u8..2, at_len, any::<u8>())
            .prop_map(|(mem, (at, len), byte)| Step::Write { mem, at, len, byte }),
        1 => (0u8..2, 0u64..16, 1u64..6, 2u32..5, 6u64..12, any::<u8>()).prop_map(
            |(mem, at, len, rows, stride, byte)| Step::Rows { mem, at, len, rows, stride, byte }
        ),
        4 => (0u8..2, 0u8..2, 1u64..=32, 0u64..=32, 0u64..=32).prop_map(
            |(fm, tm, len, fa, ta)| Step::Copy { from: (fm, fa), to: (tm, ta), len }
        ),
        1 => Just(Step::MaterializeAll),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
    /// Lazy copies against plain bytes: after every step the plane's logical
    /// bytes are the model's, whatever aliases were made, trimmed, taken
    /// together or materialized (copies are made lazily exactly when the
    /// planner would make them so: the destination one range, no resolved
    /// source byte inside it or inside a live target).
    #[test]
    fn lazy_copies_read_as_plain_copies(steps in proptest::collection::vec(step(), 1..40)) {
        let mut p = plane();
        let mut model = [vec![0u8; MODEL_BYTES as usize], vec![0u8; MODEL_BYTES as usize]];
        for s in &steps {
            match *s {
                Step::Write { mem, at, len, byte } => {
                    p.write(model_addr(mem) + at, &vec![byte; len as usize]).unwrap();
                    model[mem as usize][at as usize..(at + len) as usize].fill(byte);
                }
                Step::Rows { mem, at, len, rows, stride, byte } => {
                    let e = Extent { pa: model_addr(mem) + at, len, rows, stride };
                    p.scatter(&[e], &vec![byte; (len * rows as u64) as usize]).unwrap();
                    for r in 0..rows as u64 {
                        let o = (at + r * stride) as usize;
                        model[mem as usize][o..o + len as usize].fill(byte);
                    }
                }
                Step::Copy { from, to, len } => {
                    let src = Extent::contiguous(model_addr(from.0) + from.1, len);
                    let dst = Extent::contiguous(model_addr(to.0) + to.1, len);
                    let resolved = p.resolve(&[src]);
                    let lazy_ok = !resolved.iter().any(|x| lazy::overlaps(x, &dst))
                        && !p.lazy().any_target(&resolved);
                    let bytes = read(&p, src.pa, len as usize);
                    if lazy_ok {
                        p.lazy_mut().set(dst.pa, len, resolved);
                    } else {
                        p.write(dst.pa, &bytes).unwrap();
                    }
                    model[to.0 as usize][to.1 as usize..(to.1 + len) as usize]
                        .copy_from_slice(&bytes);
                }
                Step::MaterializeAll => p.materialize_all(),
            }
            p.lazy().check();
            for mem in 0..2u8 {
                proptest::prop_assert_eq!(
                    &read(&p, model_addr(mem), MODEL_BYTES as usize),
                    &model[mem as usize],
                    "memory {} after {:?}", mem, s
                );
            }
        }
        p.materialize_all();
        for mem in 0..2u8 {
            proptest::prop_assert_eq!(
                &read_phys(&p, model_addr(mem), MODEL_BYTES as usize),
                &model[mem as usize]
            );
        }
    }
}

/// `with_in_place` hands an op its operands and output where they lie
/// only when each is one contiguous run in a region and the output
/// overlaps no operand; otherwise it calls nothing.
#[test]
fn in_place_operands_are_whole_runs_and_never_alias_the_output() {
    let mut p = plane();
    let hbm = dev(Space::Hbm, 0);
    p.write(hbm, &(0u8..64).collect::<Vec<_>>()).unwrap();
    let tcm = dev(Space::Tcm, 0);
    p.reserve(&[Extent::contiguous(tcm, 256)]);
    let a = Extent::contiguous(hbm, 16);
    let b = Extent::contiguous(hbm + 32, 8);
    let out = Extent::contiguous(tcm + 64, 16);
    // SAFETY: nothing else uses the plane while these calls run.
    #[allow(unsafe_code)]
    let shared = unsafe { p.shared() };
    #[allow(unsafe_code)]
    let got = unsafe {
        shared.with_in_place(&[a, b], &[16, 8], &[out], |t, o| {
            assert_eq!(t.len(), 2);
            assert_eq!(t[0], (0u8..16).collect::<Vec<_>>());
            assert_eq!(t[1], (32u8..40).collect::<Vec<_>>());
            assert_eq!(o.len(), 16);
            o.copy_from_slice(t[0]);
            o[0] = 99;
            7
        })
    };
    assert_eq!(got, Some(7));
    let called = std::cell::Cell::new(false);
    let call = |_: &[&[u8]], _: &mut [u8]| called.set(true);
    #[allow(unsafe_code)]
    unsafe {
        // The output overlapping an operand (in place), rows apart, a
        // length that is not the operand's, two output pieces, the
        // output in host space or past the region (paged): not called.
        let over = Extent::contiguous(hbm + 8, 16);
        assert!(shared.with_in_place(&[a], &[16], &[over], call).is_none());
        let rows = Extent {
            pa: hbm,
            len: 8,
            rows: 2,
            stride: 16,
        };
        assert!(shared.with_in_place(&[rows], &[16], &[out], call).is_none());
        assert!(shared.with_in_place(&[a], &[8], &[out], call).is_none());
        let halves = [Extent::contiguous(tcm, 8), Extent::contiguous(tcm + 8, 8)];
        assert!(shared.with_in_place(&[a], &[16], &halves, call).is_none());
        let host = Extent::contiguous(pa::host(0, 0), 16);
        assert!(shared.with_in_place(&[a], &[16], &[host], call).is_none());
        let paged = Extent::contiguous(dev(Space::Hbm, REGION_MAX + 64), 16);
        assert!(shared.with_in_place(&[a], &[16], &[paged], call).is_none());
    }
    assert!(!called.get());
    let mut want: Vec<u8> = (0u8..16).collect();
    want[0] = 99;
    assert_eq!(read(&p, tcm + 64, 16), want);
}

/// A window's extents grow a region straight to the size the furthest
/// needs (whatever their order), keeping what it held.
#[test]
fn reserve_grows_a_region_to_its_furthest_extent() {
    let mut p = plane();
    let at = |o| dev(Space::Tcm, o);
    p.write(at(10), &[1, 2, 3]).unwrap();
    let key = at(0) >> OFFSET_BITS;
    let first = p.regions[&key].len();
    let extents: Vec<Extent> = (0..8)
        .map(|i| Extent::contiguous(at(i << 18), 1 << 18))
        .collect();
    p.reserve(&extents);
    assert!(first < 1 << 21);
    assert_eq!(p.regions[&key].len(), 1 << 21);
    assert_eq!(p.regions[&key].written(), 1 << 21);
    assert_eq!(read(&p, at(9), 5), [0, 1, 2, 3, 0]);
}
