//! What each launch asked of the fabric: the bytes every link carried
//! while it ran, and from them the least time its traffic needs: the
//! busiest link's bytes at its bandwidth, and the busiest cube HBM's bytes
//! (in and out of its controller) at its pseudo channels' aggregate
//! bandwidth. No schedule of the same traffic finishes sooner, so the
//! ratio of that bound to the launch's time says how close the launch
//! came to the fabric's limit (a collective whose time is far above it
//! is bound by its algorithm, not by the machine).

use kb_format::Ps;

use crate::machine::{Link, Machine, NodeKind};

/// A link as a hop uses it: its timing (copied from the machine's
/// `Link`) beside when it is next free and the bytes it has carried, in
/// one 32-byte entry: a hop touches one cache line of link state, where
/// the machine's links and two per-link arrays were three (misses, once
/// a large machine's events interleave).
#[derive(Debug, Clone, Copy)]
pub(super) struct LinkState {
    /// When the link is free for the next message.
    pub(super) free: Ps,
    /// Bytes it has carried so far (launches take their share).
    pub(super) bytes: u64,
    pub(super) latency_ps: Ps,
    bw_gbs: f64,
}

impl LinkState {
    pub(super) fn new(l: &Link) -> Self {
        LinkState {
            free: 0,
            bytes: 0,
            latency_ps: l.latency_ps,
            bw_gbs: l.bw_gbs,
        }
    }

    /// Time to serialize `bytes` onto the link (as `Link::serialize_ps`).
    #[inline]
    pub(super) fn serialize_ps(&self, bytes: u64) -> Ps {
        crate::event::ceil_ps(bytes as f64 * 1000.0 / self.bw_gbs)
    }
}

const _: () = assert!(std::mem::size_of::<LinkState>() == 32);

/// One resource's share of a launch's traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// The link (`from -> to`) or HBM (`sip0.cube0.hbm`).
    pub name: String,
    /// Bytes it carried while the launch ran.
    pub bytes: u64,
    /// Its bandwidth, GB/s.
    pub bw_gbs: f64,
    /// `bytes` at `bw_gbs`: the least time it needed.
    pub busy_ps: Ps,
}

/// A launch's busiest link and busiest HBM.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabricLoad {
    /// The link whose bytes take longest at its bandwidth.
    pub link: Option<Load>,
    /// The cube HBM whose bytes take longest at its channels' bandwidth.
    pub hbm: Option<Load>,
}

impl FabricLoad {
    /// The busier of the two: the launch's fabric bound.
    pub fn bound(&self) -> Option<&Load> {
        match (&self.link, &self.hbm) {
            (Some(l), Some(h)) => Some(if h.busy_ps > l.busy_ps { h } else { l }),
            (l, h) => l.as_ref().or(h.as_ref()),
        }
    }

    /// From the bytes each link carried (`bytes[l]`, by link index).
    pub(super) fn of(m: &Machine, bytes: &[u64]) -> FabricLoad {
        // GB/s = bytes per ns; x1000 for ps, rounded up as links do.
        let time = |b: u64, bw: f64| -> Ps { crate::event::ceil_ps(b as f64 * 1000.0 / bw) };
        let link = (0..m.links.len())
            .filter(|&l| bytes[l] > 0)
            .max_by_key(|&l| (m.links[l].serialize_ps(bytes[l]), std::cmp::Reverse(l)))
            .map(|l| {
                let k = &m.links[l];
                Load {
                    name: format!(
                        "{} -> {}",
                        m.nodes[k.from as usize].name, m.nodes[k.to as usize].name
                    ),
                    bytes: bytes[l],
                    bw_gbs: k.bw_gbs,
                    busy_ps: k.serialize_ps(bytes[l]),
                }
            });
        // Every byte an HBM serves crosses a link into or out of its
        // controller.
        let hbm_bw = m.topo.hbm.pseudo_channels as f64 * m.topo.hbm.channel_bw_gbs.0;
        let mut per_ctrl: Vec<(u32, u64)> = Vec::new();
        for (l, k) in m.links.iter().enumerate() {
            if bytes[l] == 0 {
                continue;
            }
            for node in [k.from, k.to] {
                if m.nodes[node as usize].kind == NodeKind::HbmCtrl {
                    match per_ctrl.iter_mut().find(|(n, _)| *n == node) {
                        Some((_, b)) => *b += bytes[l],
                        None => per_ctrl.push((node, bytes[l])),
                    }
                }
            }
        }
        let hbm = per_ctrl
            .into_iter()
            .max_by_key(|&(n, b)| (b, std::cmp::Reverse(n)))
            .map(|(n, b)| {
                let node = &m.nodes[n as usize];
                Load {
                    name: format!("sip{}.cube{}.hbm", node.sip, node.cube),
                    bytes: b,
                    bw_gbs: hbm_bw,
                    busy_ps: time(b, hbm_bw),
                }
            });
        FabricLoad { link, hbm }
    }
}

#[cfg(test)]
mod link_state_tests {
    use super::LinkState;
    use crate::machine::Link;

    /// A hop's timing from the engine's copy equals the machine link's.
    #[test]
    fn link_state_times_as_its_link() {
        for (bw, lat) in [(64.0, 1500), (12.8, 0), (1000.0, 7), (3.0, 250_000)] {
            let link = Link {
                from: 0,
                to: 1,
                latency_ps: lat,
                bw_gbs: bw,
                class: "noc",
            };
            let s = LinkState::new(&link);
            assert_eq!((s.free, s.bytes, s.latency_ps), (0, 0, lat));
            for bytes in [0, 1, 64, 4096, 1 << 20, 3 << 30] {
                assert_eq!(
                    s.serialize_ps(bytes),
                    link.serialize_ps(bytes),
                    "{bw} GB/s {bytes} B"
                );
            }
        }
    }
}
