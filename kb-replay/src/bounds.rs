//! Where a record's ranges may lie: within the machine and the memories
//! its trace declares (the resolved topology in the metadata: counts, HBM,
//! TCM and SRAM sizes), or, for host space, within a tensor's host data.
//! Checked for every record before replay allocates anything for it, so a
//! forged trace (checksums resealed) cannot make replay allocate beyond
//! what the machine it describes holds. A trace without a readable
//! topology (a hand-made one) is bounded by the PA layout alone: no range
//! may spill from one PE's or cube's memory into the next.

use kb_format::pa::{self, MAX_CUBES, MAX_PES, MAX_SIPS, OFFSET_BITS, Pa};
use kb_format::{Effect, Extent, Meta, Space};
use serde::Deserialize;

/// Sizes of the machine's memories, in bytes, and its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    pub sips: u32,
    pub cubes_per_sip: u32,
    pub pes_per_cube: u32,
    /// One PE's HBM partition.
    pub hbm: u64,
    pub tcm: u64,
    pub sram: u64,
}

#[derive(Deserialize)]
struct Resolved {
    counts: Counts,
    hbm: Size,
    tcm: Size,
    sram: Size,
}

#[derive(Deserialize)]
struct Counts {
    sips: u32,
    cubes_per_sip: u32,
    pes_per_cube: u32,
}

#[derive(Deserialize)]
struct Size {
    size_gib: Option<f64>,
    size_kib: Option<f64>,
}

impl Size {
    fn bytes(&self) -> Option<u64> {
        let b = match (self.size_gib, self.size_kib) {
            (Some(g), None) => g * (1u64 << 30) as f64,
            (None, Some(k)) => k * 1024.0,
            _ => return None,
        };
        (b.is_finite() && b >= 0.0).then_some(b as u64)
    }
}

impl Machine {
    /// The machine a trace's metadata declares, if its resolved topology
    /// parses and makes sense.
    pub fn from_meta(meta: &Meta) -> Option<Machine> {
        let r: Resolved = serde_yaml_ng::from_str(&meta.topology.resolved).ok()?;
        let c = r.counts;
        let ok = (1..=MAX_SIPS).contains(&c.sips)
            && (1..=MAX_CUBES).contains(&c.cubes_per_sip)
            && (1..=MAX_PES).contains(&c.pes_per_cube);
        let hbm = r.hbm.bytes()? / c.pes_per_cube.max(1) as u64;
        ok.then_some(Machine {
            sips: c.sips,
            cubes_per_sip: c.cubes_per_sip,
            pes_per_cube: c.pes_per_cube,
            hbm: hbm.min(1 << OFFSET_BITS),
            tcm: r.tcm.bytes()?.min(1 << OFFSET_BITS),
            sram: r.sram.bytes()?.min(1 << OFFSET_BITS),
        })
    }
}

/// The bounds of one trace's ranges.
#[derive(Debug, Clone)]
pub struct Bounds {
    machine: Option<Machine>,
    /// Each tensor's host data bytes (0 without host data).
    host: Vec<u64>,
}

impl Bounds {
    pub fn new(meta: &Meta) -> Bounds {
        Bounds {
            machine: Machine::from_meta(meta),
            host: meta
                .tensors
                .iter()
                .map(|t| if t.host_data { t.nbytes() } else { 0 })
                .collect(),
        }
    }

    /// The machine the bounds come from, if the trace declares one.
    pub fn machine(&self) -> Option<Machine> {
        self.machine
    }

    /// Every range of both effects within its memory; the error says which
    /// range and why.
    pub fn check(&self, read: &Option<Effect>, write: &Option<Effect>) -> Result<(), String> {
        for (side, e) in [("read", read), ("write", write)] {
            for x in e.iter().flat_map(|e| &e.ranges) {
                self.extent(x).map_err(|why| {
                    format!(
                        "its {side} range {:#x} ({} x {} bytes): {why}",
                        x.pa, x.rows, x.len
                    )
                })?;
            }
        }
        Ok(())
    }

    fn extent(&self, x: &Extent) -> Result<(), String> {
        // Bytes from its first byte to past its last.
        let span = (x.rows.max(1) as u64 - 1)
            .checked_mul(x.stride)
            .and_then(|s| s.checked_add(x.len))
            .ok_or("its rows overflow")?;
        match pa::space_of(x.pa) {
            None => Err("not a valid address".into()),
            Some(Space::Host) => {
                let (t, offset) = pa::split_host(x.pa).ok_or("not a host address")?;
                let have = *self.host.get(t as usize).ok_or_else(|| {
                    format!("host data of tensor {t}, which the trace does not declare")
                })?;
                if offset.checked_add(span).is_none_or(|end| end > have) {
                    return Err(format!(
                        "past the end of tensor {t}'s {have} bytes of host data"
                    ));
                }
                Ok(())
            }
            Some(space) => {
                let p = Pa::decode(x.pa).ok_or("not a device address")?;
                let (size, what) = match (self.machine, space) {
                    (Some(m), _) => {
                        if p.sip >= m.sips || p.cube >= m.cubes_per_sip || p.pe >= m.pes_per_cube {
                            return Err(format!(
                                "sip{}.cube{}.pe{} is outside the trace's {} x {} x {} machine",
                                p.sip, p.cube, p.pe, m.sips, m.cubes_per_sip, m.pes_per_cube
                            ));
                        }
                        match space {
                            Space::Tcm => (m.tcm, "TCM"),
                            Space::Sram => (m.sram, "SRAM"),
                            _ => (m.hbm, "HBM partition"),
                        }
                    }
                    (None, _) => (1u64 << OFFSET_BITS, "PA offset range"),
                };
                if p.offset.checked_add(span).is_none_or(|end| end > size) {
                    return Err(format!(
                        "{} +{span} bytes runs past the end of its {what} ({size} bytes{})",
                        p,
                        if self.machine.is_some() {
                            ", as the trace's topology declares"
                        } else {
                            ""
                        }
                    ));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kb_format::{Dtype, TensorMeta, TopologyMeta};

    fn meta(resolved: &str) -> Meta {
        Meta {
            topology: TopologyMeta {
                resolved: resolved.into(),
                ..Default::default()
            },
            tensors: vec![TensorMeta {
                name: "x".into(),
                dtype: Dtype::F32,
                shape: vec![4, 4],
                address: 0,
                host_data: true,
                shards: Vec::new(),
            }],
            ..Default::default()
        }
    }

    const SMALL: &str = "counts: {sips: 1, cubes_per_sip: 1, pes_per_cube: 4}\nhbm: {size_gib: 16.0, pseudo_channels: 32}\ntcm: {size_kib: 1024.0}\nsram: {size_kib: 8192.0}\n";

    fn dev(space: Space, pe: u32, offset: u64) -> u64 {
        Pa {
            space,
            sip: 0,
            cube: 0,
            pe,
            offset,
        }
        .encode()
        .unwrap()
    }

    fn eff(x: Extent) -> Option<Effect> {
        Some(Effect {
            time: 0,
            seq: 0,
            ranges: vec![x],
        })
    }

    #[test]
    fn ranges_stay_within_the_declared_memories() {
        let b = Bounds::new(&meta(SMALL));
        assert_eq!(
            b.machine(),
            Some(Machine {
                sips: 1,
                cubes_per_sip: 1,
                pes_per_cube: 4,
                hbm: 4 << 30,
                tcm: 1 << 20,
                sram: 8 << 20,
            })
        );
        let ok = eff(Extent::contiguous(dev(Space::Tcm, 3, (1 << 20) - 64), 64));
        assert_eq!(b.check(&ok, &None), Ok(()));
        // One byte past the 1 MiB TCM.
        let e = b
            .check(
                &None,
                &eff(Extent::contiguous(dev(Space::Tcm, 3, (1 << 20) - 64), 65)),
            )
            .unwrap_err();
        assert!(
            e.contains("write range") && e.contains("past the end of its TCM (1048576 bytes"),
            "{e}"
        );
        // The hardening report's forgery, made consistent with its params:
        // 12,582,912 x 1,024 bytes on the 1 MiB TCM.
        let forged = Extent {
            pa: dev(Space::Tcm, 0, 0),
            len: 12_582_911,
            rows: 1024,
            stride: 12_582_912,
        };
        assert!(b.check(&eff(forged), &None).is_err());
        // PE 4 of a 4-PE cube; HBM past the partition; SRAM inside.
        let e = b
            .check(&eff(Extent::contiguous(dev(Space::Hbm, 4, 0), 8)), &None)
            .unwrap_err();
        assert!(e.contains("outside the trace's 1 x 1 x 4 machine"), "{e}");
        assert!(
            b.check(
                &eff(Extent::contiguous(dev(Space::Hbm, 0, 4 << 30), 1)),
                &None
            )
            .is_err()
        );
        assert_eq!(
            b.check(
                &eff(Extent::contiguous(dev(Space::Sram, 0, 0), 8 << 20)),
                &None
            ),
            Ok(())
        );
        // Host data: tensor 0 has 64 bytes; tensor 1 does not exist.
        assert_eq!(
            b.check(&eff(Extent::contiguous(pa::host(0, 0), 64)), &None),
            Ok(())
        );
        assert!(
            b.check(&eff(Extent::contiguous(pa::host(0, 8), 64)), &None)
                .is_err()
        );
        assert!(
            b.check(&eff(Extent::contiguous(pa::host(1, 0), 1)), &None)
                .is_err()
        );
        // Rows whose span overflows.
        let wild = Extent {
            pa: dev(Space::Hbm, 0, 0),
            len: 1,
            rows: u32::MAX,
            stride: u64::MAX,
        };
        assert!(b.check(&eff(wild), &None).unwrap_err().contains("overflow"));
    }

    #[test]
    fn without_a_topology_the_pa_layout_bounds_ranges() {
        let b = Bounds::new(&meta(""));
        assert_eq!(b.machine(), None);
        assert_eq!(
            b.check(
                &eff(Extent::contiguous(dev(Space::Tcm, 9, 0), 1 << 30)),
                &None
            ),
            Ok(())
        );
        let e = b
            .check(
                &eff(Extent::contiguous(dev(Space::Tcm, 0, (1 << 35) - 1), 2)),
                &None,
            )
            .unwrap_err();
        assert!(e.contains("PA offset range"), "{e}");
    }
}
