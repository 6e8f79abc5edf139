//! The 51-bit physical address (PA) that keys the data plane (docs/design.md A1):
//! which SIP, cube and PE, which memory space, and the byte offset there.
//!
//! ```text
//! bit  50..48  47..43  42..39  38..35  34..0
//!      space   sip     cube    pe      offset (32 GiB)
//! ```
//! HBM is per cube; its `pe` field names the PE partition (PE-local HBM).
//! SRAM is per cube (`pe` = 0). Host space holds the trace's tensor data:
//! bits 47..36 are the tensor index and bits 35..0 the byte offset.

use crate::types::Space;

pub const PA_BITS: u32 = 51;
pub const OFFSET_BITS: u32 = 35;
pub const MAX_SIPS: u32 = 32;
pub const MAX_CUBES: u32 = 16;
pub const MAX_PES: u32 = 16;
const HOST_OFFSET_BITS: u32 = 36;

/// A decoded device physical address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pa {
    pub space: Space,
    pub sip: u32,
    pub cube: u32,
    pub pe: u32,
    pub offset: u64,
}

impl Pa {
    /// Encode; `None` if a field is out of range.
    pub fn encode(&self) -> Option<u64> {
        if self.space == Space::Host
            || self.sip >= MAX_SIPS
            || self.cube >= MAX_CUBES
            || self.pe >= MAX_PES
            || self.offset >= 1 << OFFSET_BITS
        {
            return None;
        }
        Some(
            (self.space as u64) << 48
                | (self.sip as u64) << 43
                | (self.cube as u64) << 39
                | (self.pe as u64) << 35
                | self.offset,
        )
    }

    /// Decode a device PA; `None` for host addresses or bits above 50.
    pub fn decode(pa: u64) -> Option<Pa> {
        if pa >> PA_BITS != 0 {
            return None;
        }
        let space = Space::from_code((pa >> 48) as u8 & 7)?;
        if space == Space::Host {
            return None;
        }
        Some(Pa {
            space,
            sip: (pa >> 43) as u32 & 31,
            cube: (pa >> 39) as u32 & 15,
            pe: (pa >> 35) as u32 & 15,
            offset: pa & ((1 << OFFSET_BITS) - 1),
        })
    }
}

/// Space of any 51-bit address (device or host); `None` if invalid.
pub fn space_of(pa: u64) -> Option<Space> {
    if pa >> PA_BITS != 0 {
        return None;
    }
    Space::from_code((pa >> 48) as u8 & 7)
}

/// Host-space address of byte `offset` of tensor `tensor`'s host data.
pub fn host(tensor: u32, offset: u64) -> u64 {
    debug_assert!(tensor < 1 << 12 && offset < 1 << HOST_OFFSET_BITS);
    (Space::Host as u64) << 48 | (tensor as u64) << HOST_OFFSET_BITS | offset
}

/// Split a host-space address into (tensor index, byte offset).
pub fn split_host(addr: u64) -> Option<(u32, u64)> {
    if space_of(addr)? != Space::Host {
        return None;
    }
    Some((
        ((addr >> HOST_OFFSET_BITS) & 0xfff) as u32,
        addr & ((1 << HOST_OFFSET_BITS) - 1),
    ))
}

/// Largest tensor index a host address can carry.
pub const MAX_HOST_TENSORS: u32 = 1 << 12;

impl std::fmt::Display for Pa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sip{}.cube{}.pe{}.{}+{:#x}",
            self.sip,
            self.cube,
            self.pe,
            self.space.name(),
            self.offset
        )
    }
}

/// The HBM pseudo channel that serves the byte at device PA `pa`, under
/// the PA and VA models: the address in `interleave`-byte blocks (a power
/// of two), block `b` of `channels` going to `(b + rotation) mod channels`.
/// Unhashed, the rotation is 0 (plain interleaving: every PE partition
/// starts on channel 0, so small tiles of different PEs collide). Hashed,
/// it is a mix of the block's higher bits (`b / channels`, which include the
/// PE partition), so partitions start on different channels; each aligned
/// round of `channels` blocks still covers every channel once.
pub fn hbm_channel(pa: u64, interleave: u64, channels: u64, hashed: bool) -> u64 {
    let (channels, interleave) = (channels.max(1), interleave.max(1));
    // Powers of two (the shipped topologies) by shifts and masks: the
    // simulator asks this for every block of every HBM request, and four
    // 64-bit divisions were most of its cost. Same values as below.
    if channels.is_power_of_two() && interleave.is_power_of_two() {
        let block = pa >> interleave.trailing_zeros();
        let mask = channels - 1;
        let (round, within) = (block >> channels.trailing_zeros(), block & mask);
        if !hashed {
            return within;
        }
        return (within + (round_mix(round) & mask)) & mask;
    }
    let block = pa / interleave;
    let (round, within) = (block / channels, block % channels);
    if !hashed {
        return within;
    }
    (within + round_mix(round) % channels) % channels
}

/// A xorshift-multiply mix (splitmix64's finalizer) of a round of blocks.
fn round_mix(round: u64) -> u64 {
    let mut z = round.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pa_round_trips_and_rejects_out_of_range() {
        let p = Pa {
            space: Space::Tcm,
            sip: 3,
            cube: 7,
            pe: 15,
            offset: (1 << 35) - 1,
        };
        let raw = p.encode().unwrap();
        assert!(raw < 1 << 51);
        assert_eq!(Pa::decode(raw), Some(p));
        assert_eq!(Pa { sip: 32, ..p }.encode(), None);
        assert_eq!(
            Pa {
                offset: 1 << 35,
                ..p
            }
            .encode(),
            None
        );
        assert_eq!(Pa::decode(1 << 51), None);
    }

    proptest::proptest! {
        /// The shift-and-mask path answers as the division formula.
        #[test]
        fn powers_of_two_take_the_division_formulas_values(
            pa in 0u64..1 << 51,
            interleave_log in 0u32..16,
            channels_log in 0u32..8,
            hashed: bool,
        ) {
            let (interleave, channels) = (1u64 << interleave_log, 1u64 << channels_log);
            let block = pa / interleave;
            let (round, within) = (block / channels, block % channels);
            let want = if hashed {
                (within + round_mix(round) % channels) % channels
            } else {
                within
            };
            proptest::prop_assert_eq!(hbm_channel(pa, interleave, channels, hashed), want);
        }
    }

    #[test]
    fn hashed_channels_spread_partitions_and_keep_rounds_whole() {
        let dev = |pe, offset| {
            Pa {
                space: Space::Hbm,
                sip: 0,
                cube: 0,
                pe,
                offset,
            }
            .encode()
            .unwrap()
        };
        // Plain interleaving: every partition starts on channel 0.
        for pe in 0..8 {
            assert_eq!(hbm_channel(dev(pe, 0), 256, 64, false), 0);
        }
        // Hashed: the 8 partitions' first blocks land on several channels.
        let firsts: std::collections::BTreeSet<u64> = (0..8)
            .map(|pe| hbm_channel(dev(pe, 0), 256, 64, true))
            .collect();
        assert!(firsts.len() >= 6, "{firsts:?}");
        // Any aligned round of 64 blocks covers the 64 channels once, for
        // any channel count (here also 48, not a power of two).
        for n in [64u64, 48] {
            // Rounds are aligned in absolute blocks (as the controller's
            // whole-round fast path assumes).
            let base = (dev(3, 0) / 256).div_ceil(n) * n;
            for round in [0u64, 1, 12345] {
                let mut seen: Vec<u64> = (0..n)
                    .map(|k| hbm_channel((base + round * n + k) * 256, 256, n, true))
                    .collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn host_addresses_are_distinct_from_device_ones() {
        let h = host(5, 1234);
        assert_eq!(space_of(h), Some(Space::Host));
        assert_eq!(split_host(h), Some((5, 1234)));
        assert_eq!(Pa::decode(h), None);
    }
}
