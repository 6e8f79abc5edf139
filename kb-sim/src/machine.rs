//! The machine built from a topology: named nodes (the original simulator's components),
//! directed links with latency and bandwidth, and memoized shortest routes.

use std::cell::RefCell;
use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::rc::Rc;

use crate::event::{Ps, ceil_ps, ns_to_ps};
use crate::topology::{AddressModel, LinkSpec, MappingMode, Positive, Topology};

pub type NodeId = u32;
pub type LinkId = u32;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Host,
    PcieEp,
    IoCpu,
    MCpu,
    Noc,
    HbmRouter,
    HbmCtrl,
    Sram,
    PeCpu,
    PeDma,
    PeGemm,
    PeMath,
    Tcm,
    /// The PE's MMU (VA model only).
    PeMmu,
    /// A per-channel HBM router of a PE (LA model, 1:1 mapping).
    ChRouter,
    /// The aggregated HBM router of a PE (LA model, n:1 mapping).
    AggRouter,
}

impl NodeKind {
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Host => "host",
            NodeKind::PcieEp => "pcie_ep",
            NodeKind::IoCpu => "io_cpu",
            NodeKind::MCpu => "m_cpu",
            NodeKind::Noc => "noc",
            NodeKind::HbmRouter => "hbm_router",
            NodeKind::HbmCtrl => "hbm_ctrl",
            NodeKind::Sram => "sram",
            NodeKind::PeCpu => "pe_cpu",
            NodeKind::PeDma => "pe_dma",
            NodeKind::PeGemm => "pe_gemm",
            NodeKind::PeMath => "pe_math",
            NodeKind::Tcm => "tcm",
            NodeKind::PeMmu => "pe_mmu",
            NodeKind::ChRouter => "ch_r",
            NodeKind::AggRouter => "agg_router",
        }
    }

    const PE_KINDS: [NodeKind; 5] = [
        NodeKind::PeCpu,
        NodeKind::PeDma,
        NodeKind::PeGemm,
        NodeKind::PeMath,
        NodeKind::Tcm,
    ];
    const CUBE_KINDS: [NodeKind; 5] = [
        NodeKind::MCpu,
        NodeKind::Noc,
        NodeKind::HbmRouter,
        NodeKind::HbmCtrl,
        NodeKind::Sram,
    ];
}

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    pub sip: u32,
    pub cube: u32,
    pub pe: u32,
}

/// A directed link.
#[derive(Debug, Clone)]
pub struct Link {
    pub from: NodeId,
    pub to: NodeId,
    pub latency_ps: Ps,
    pub bw_gbs: f64,
    pub class: &'static str,
}

impl Link {
    /// Time to serialize `bytes` onto this link.
    #[inline]
    pub fn serialize_ps(&self, bytes: u64) -> Ps {
        // GB/s = bytes per ns; x1000 for ps.
        ceil_ps(bytes as f64 * 1000.0 / self.bw_gbs)
    }
}

/// Coordinates of a PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeCoord {
    /// The SIP (chip), from 0.
    pub sip: u32,
    /// The cube within its SIP, from 0.
    pub cube: u32,
    /// The PE within its cube, from 0.
    pub pe: u32,
}

impl std::fmt::Display for PeCoord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sip{}.cube{}.pe{}", self.sip, self.cube, self.pe)
    }
}

/// Routes by (from, to), filled on first use.
type RouteCache = HashMap<(NodeId, NodeId), Rc<[LinkId]>>;
/// Routes by (from, via, to), filled on first use.
type ViaRouteCache = HashMap<(NodeId, NodeId, NodeId), Rc<[LinkId]>>;

/// A route search's state over the nodes: node `v` is seen in the current
/// search when `seen[v]` is its mark (then `via[v]` is the link it was
/// reached by); a new search takes a new mark instead of clearing.
#[derive(Debug, Default)]
struct Search {
    mark: u32,
    seen: Vec<u32>,
    via: Vec<LinkId>,
    q: VecDeque<NodeId>,
}

impl Search {
    /// Begin a search over `n` nodes: none seen, the queue empty; returns
    /// its mark.
    fn start(&mut self, n: usize) -> u32 {
        if self.seen.len() != n || self.mark == u32::MAX {
            self.seen = vec![0; n];
            self.via = vec![0; n];
            self.mark = 0;
        }
        self.mark += 1;
        self.q.clear();
        self.mark
    }
}

/// The built machine. Immutable after construction except the route cache.
#[derive(Debug)]
pub struct Machine {
    pub topo: Topology,
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    adj: Vec<Vec<(NodeId, LinkId)>>,
    sip_base: Vec<NodeId>,
    cube_base: Vec<NodeId>,
    pe_base: Vec<NodeId>,
    /// Per PE (dense index), its coordinates: the engine asks for them on
    /// most steps, and computing them takes three divisions.
    pe_coords: Vec<PeCoord>,
    routes: RefCell<RouteCache>,
    via_routes: RefCell<ViaRouteCache>,
    /// The route search's marks, kept from one search to the next: a
    /// search of a large machine touches a fraction of its nodes, and
    /// fresh arrays of every node per search were a tenth of a 4,096-PE
    /// run.
    search: RefCell<Search>,
    /// Per PE (dense index), its PE_MMU node, in the VA model.
    mmu_nodes: Vec<NodeId>,
    /// Per PE (dense index), its HBM routers in the LA model: `ch_r0..` (1:1)
    /// or one `agg_router` (n:1).
    hbm_routers: Vec<Vec<NodeId>>,
    pub first_flit_ps: Ps,
}

impl Machine {
    pub fn build(topo: &Topology) -> Machine {
        let c = topo.counts;
        let mut m = Machine {
            topo: topo.clone(),
            nodes: Vec::new(),
            links: Vec::new(),
            adj: Vec::new(),
            sip_base: Vec::new(),
            cube_base: Vec::new(),
            pe_base: Vec::new(),
            pe_coords: Vec::new(),
            routes: RefCell::new(HashMap::default()),
            via_routes: RefCell::new(HashMap::default()),
            search: RefCell::new(Search::default()),
            mmu_nodes: Vec::new(),
            hbm_routers: Vec::new(),
            first_flit_ps: ns_to_ps(topo.fabric.first_flit_ns.0),
        };
        let host = m.add_node("host".into(), NodeKind::Host, 0, 0, 0);
        for s in 0..c.sips {
            m.sip_base.push(m.nodes.len() as NodeId);
            m.add_node(format!("sip{s}.pcie_ep"), NodeKind::PcieEp, s, 0, 0);
            m.add_node(format!("sip{s}.io_cpu"), NodeKind::IoCpu, s, 0, 0);
            for q in 0..c.cubes_per_sip {
                m.cube_base.push(m.nodes.len() as NodeId);
                for k in NodeKind::CUBE_KINDS {
                    m.add_node(format!("sip{s}.cube{q}.{}", k.name()), k, s, q, 0);
                }
                for p in 0..c.pes_per_cube {
                    m.pe_base.push(m.nodes.len() as NodeId);
                    m.pe_coords.push(PeCoord {
                        sip: s,
                        cube: q,
                        pe: p,
                    });
                    for k in NodeKind::PE_KINDS {
                        m.add_node(format!("sip{s}.cube{q}.pe{p}.{}", k.name()), k, s, q, p);
                    }
                    if topo.address_model == AddressModel::Va {
                        let mmu = m.add_node(
                            format!("sip{s}.cube{q}.pe{p}.pe_mmu"),
                            NodeKind::PeMmu,
                            s,
                            q,
                            p,
                        );
                        m.mmu_nodes.push(mmu);
                    }
                    if let (AddressModel::La, Some(mm)) = (topo.address_model, topo.memory_map) {
                        let routers = match mm.hbm_mapping_mode {
                            MappingMode::OneToOne => (0..mm.hbm_channels_per_pe)
                                .map(|k| {
                                    m.add_node(
                                        format!("sip{s}.cube{q}.pe{p}.ch_r{k}"),
                                        NodeKind::ChRouter,
                                        s,
                                        q,
                                        p,
                                    )
                                })
                                .collect(),
                            MappingMode::NToOne => {
                                vec![m.add_node(
                                    format!("sip{s}.cube{q}.pe{p}.agg_router"),
                                    NodeKind::AggRouter,
                                    s,
                                    q,
                                    p,
                                )]
                            }
                        };
                        m.hbm_routers.push(routers);
                    }
                }
            }
        }
        let l = topo.links;
        for s in 0..c.sips {
            let pcie = m.sip_node(s, NodeKind::PcieEp);
            let io = m.sip_node(s, NodeKind::IoCpu);
            m.connect(host, pcie, l.host_pcie, "host_pcie");
            m.connect(pcie, io, l.pcie_io, "pcie_io");
            if c.sips > 1 && (s + 1 < c.sips || c.sips > 2) {
                let next = m.sip_node((s + 1) % c.sips, NodeKind::IoCpu);
                m.connect(io, next, l.sip_link, "sip_link");
            }
            for q in 0..c.cubes_per_sip {
                let cn = |m: &Machine, k| m.cube_node(s, q, k);
                let (mcpu, noc, router, hbm, sram) = (
                    cn(&m, NodeKind::MCpu),
                    cn(&m, NodeKind::Noc),
                    cn(&m, NodeKind::HbmRouter),
                    cn(&m, NodeKind::HbmCtrl),
                    cn(&m, NodeKind::Sram),
                );
                m.connect(io, mcpu, l.io_mcpu, "io_mcpu");
                m.connect(mcpu, noc, l.mcpu_noc, "mcpu_noc");
                m.connect(noc, router, l.noc_hbm, "noc_hbm");
                m.connect(router, hbm, l.noc_hbm, "noc_hbm");
                m.connect(noc, sram, l.noc_sram, "noc_sram");
                if c.cubes_per_sip > 1 && (q + 1 < c.cubes_per_sip || c.cubes_per_sip > 2) {
                    let next = m.cube_node(s, (q + 1) % c.cubes_per_sip, NodeKind::Noc);
                    m.connect(noc, next, l.cube_link, "cube_link");
                }
                for p in 0..c.pes_per_cube {
                    let pc = PeCoord {
                        sip: s,
                        cube: q,
                        pe: p,
                    };
                    let (cpu, dma, gemm, math, tcm) = (
                        m.pe_node(pc, NodeKind::PeCpu),
                        m.pe_node(pc, NodeKind::PeDma),
                        m.pe_node(pc, NodeKind::PeGemm),
                        m.pe_node(pc, NodeKind::PeMath),
                        m.pe_node(pc, NodeKind::Tcm),
                    );
                    m.connect(noc, dma, l.noc_pe, "noc_pe");
                    if let Some(mmu) = m.mmu_node(pc) {
                        m.connect(noc, mmu, l.noc_pe, "noc_pe");
                    }
                    // LA: the PE reaches its own pseudo channels directly.
                    if let Some(mm) = topo
                        .memory_map
                        .filter(|_| topo.address_model == AddressModel::La)
                    {
                        let n = mm.hbm_channels_per_pe as f64;
                        let per_router = match mm.hbm_mapping_mode {
                            MappingMode::OneToOne => mm.hbm_channel_bw_gbs.0,
                            MappingMode::NToOne => n * mm.hbm_channel_bw_gbs.0,
                        };
                        let spec = LinkSpec {
                            latency_ns: l.noc_hbm.latency_ns,
                            bw_gbs: Positive(per_router),
                        };
                        let hbm = m.cube_node(s, q, NodeKind::HbmCtrl);
                        for r in m.hbm_routers[m.pe_index(pc)].clone() {
                            m.connect(dma, r, spec, "pe_hbm_router");
                            m.connect(r, hbm, spec, "pe_hbm_router");
                        }
                    }
                    for unit in [dma, gemm, math] {
                        m.connect(cpu, unit, l.pe_internal, "pe_internal");
                        m.connect(unit, tcm, l.tcm_port, "tcm_port");
                    }
                }
            }
        }
        m
    }

    fn add_node(&mut self, name: String, kind: NodeKind, sip: u32, cube: u32, pe: u32) -> NodeId {
        self.nodes.push(Node {
            name,
            kind,
            sip,
            cube,
            pe,
        });
        self.adj.push(Vec::new());
        (self.nodes.len() - 1) as NodeId
    }

    fn connect(&mut self, a: NodeId, b: NodeId, spec: LinkSpec, class: &'static str) {
        for (from, to) in [(a, b), (b, a)] {
            let id = self.links.len() as LinkId;
            self.links.push(Link {
                from,
                to,
                latency_ps: ns_to_ps(spec.latency_ns.0),
                bw_gbs: spec.bw_gbs.0,
                class,
            });
            self.adj[from as usize].push((to, id));
        }
    }

    pub fn host(&self) -> NodeId {
        0
    }

    pub fn sip_node(&self, sip: u32, kind: NodeKind) -> NodeId {
        let off = match kind {
            NodeKind::PcieEp => 0,
            NodeKind::IoCpu => 1,
            _ => panic!("{kind:?} is not a SIP-level node"),
        };
        self.sip_base[sip as usize] + off
    }

    pub fn cube_node(&self, sip: u32, cube: u32, kind: NodeKind) -> NodeId {
        let off = NodeKind::CUBE_KINDS
            .iter()
            .position(|&k| k == kind)
            .unwrap_or_else(|| panic!("{kind:?} is not a cube-level node"));
        self.cube_base[(sip * self.topo.counts.cubes_per_sip + cube) as usize] + off as NodeId
    }

    /// The PE's HBM routers (LA model; empty otherwise).
    pub fn hbm_routers(&self, pe: PeCoord) -> &[NodeId] {
        self.hbm_routers
            .get(self.pe_index(pe))
            .map_or(&[], |v| v.as_slice())
    }

    /// The PE's MMU node; `None` outside the VA model.
    pub fn mmu_node(&self, pe: PeCoord) -> Option<NodeId> {
        self.mmu_nodes.get(self.pe_index(pe)).copied()
    }

    pub fn pe_node(&self, pe: PeCoord, kind: NodeKind) -> NodeId {
        let off = NodeKind::PE_KINDS
            .iter()
            .position(|&k| k == kind)
            .unwrap_or_else(|| panic!("{kind:?} is not a PE-level node"));
        self.pe_base[self.pe_index(pe)] + off as NodeId
    }

    /// Dense index of a PE, 0..total_pes.
    pub fn pe_index(&self, pe: PeCoord) -> usize {
        let c = self.topo.counts;
        ((pe.sip * c.cubes_per_sip + pe.cube) * c.pes_per_cube + pe.pe) as usize
    }

    pub fn pe_coord(&self, index: usize) -> PeCoord {
        if let Some(&pc) = self.pe_coords.get(index) {
            return pc;
        }
        let c = self.topo.counts;
        let i = index as u32;
        PeCoord {
            sip: i / (c.cubes_per_sip * c.pes_per_cube),
            cube: (i / c.pes_per_cube) % c.cubes_per_sip,
            pe: i % c.pes_per_cube,
        }
    }

    pub fn pes(&self) -> impl Iterator<Item = PeCoord> + '_ {
        (0..self.topo.total_pes() as usize).map(|i| self.pe_coord(i))
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| i as NodeId)
    }

    /// The shortest route (fewest hops; ties by link creation order) from
    /// `from` to `to`, as link ids. Computed once per pair.
    pub fn route(&self, from: NodeId, to: NodeId) -> Rc<[LinkId]> {
        if let Some(r) = self.routes.borrow().get(&(from, to)) {
            return r.clone();
        }
        let r: Rc<[LinkId]> = self.bfs(from, to).into();
        self.routes.borrow_mut().insert((from, to), r.clone());
        r
    }

    fn bfs(&self, from: NodeId, to: NodeId) -> Vec<LinkId> {
        let search = &mut *self.search.borrow_mut();
        let mark = search.start(self.nodes.len());
        let Search { seen, via, q, .. } = search;
        seen[from as usize] = mark;
        q.push_back(from);
        while let Some(u) = q.pop_front() {
            if u == to {
                break;
            }
            for &(v, l) in &self.adj[u as usize] {
                if seen[v as usize] != mark {
                    seen[v as usize] = mark;
                    via[v as usize] = l;
                    q.push_back(v);
                }
            }
        }
        let mut path = Vec::new();
        let mut at = to;
        while at != from {
            assert_eq!(seen[at as usize], mark, "the fabric is connected");
            let l = via[at as usize];
            path.push(l);
            at = self.links[l as usize].from;
        }
        path.reverse();
        path
    }

    /// The route from `from` through `via` to `to` (LA: a PE's chosen
    /// channel router on the way to hbm_ctrl). Computed once per triple.
    pub fn route_via(&self, from: NodeId, via: NodeId, to: NodeId) -> Rc<[LinkId]> {
        let key = (from, via, to);
        if let Some(r) = self.via_routes.borrow().get(&key) {
            return r.clone();
        }
        let mut path = self.route(from, via).to_vec();
        path.extend_from_slice(&self.route(via, to));
        let r: Rc<[LinkId]> = path.into();
        self.via_routes.borrow_mut().insert(key, r.clone());
        r
    }

    /// Uncontended time for a message of `bytes` to cross `route`
    /// (cut-through: latencies, a first-flit overhead per intermediate
    /// node, and the slowest link's serialization).
    pub fn uncontended_ps(&self, route: &[LinkId], bytes: u64) -> Ps {
        let mut head: Ps = 0;
        let mut tail: Ps = 0;
        for (i, &l) in route.iter().enumerate() {
            let link = &self.links[l as usize];
            if i > 0 {
                head += self.first_flit_ps;
            }
            let end = head.saturating_add(link.serialize_ps(bytes)).max(tail);
            tail = end.saturating_add(link.latency_ps);
            head += link.latency_ps;
        }
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coordinates table agrees with the arithmetic, and with
    /// `pe_index`, on every PE of the built-in topologies.
    #[test]
    fn pe_coords_are_the_dense_order() {
        for name in ["small", "default", "large"] {
            let m = Machine::build(&Topology::load(name).expect("built-in topology"));
            let c = m.topo.counts;
            let n = m.topo.total_pes() as usize;
            assert_eq!(m.pe_coords.len(), n);
            for i in 0..n {
                let pc = m.pe_coord(i);
                let j = i as u32;
                let want = PeCoord {
                    sip: j / (c.cubes_per_sip * c.pes_per_cube),
                    cube: (j / c.pes_per_cube) % c.cubes_per_sip,
                    pe: j % c.pes_per_cube,
                };
                assert_eq!(pc, want, "{name} PE {i}");
                assert_eq!(m.pe_index(pc), i);
            }
        }
    }

    /// A route is the same whatever searches ran before it (the search's
    /// marks are kept from one to the next), and it is a path of links
    /// from its start to its end.
    #[test]
    fn routes_do_not_depend_on_the_searches_before_them() {
        let topo = Topology::load("small").expect("built-in topology");
        let m = Machine::build(&topo);
        let n = m.nodes.len() as NodeId;
        let pairs: Vec<(NodeId, NodeId)> = (0..n)
            .step_by(3)
            .flat_map(|a| (0..n).step_by(5).map(move |b| (a, b)))
            .collect();
        let seq: Vec<Rc<[LinkId]>> = pairs.iter().map(|&(a, b)| m.route(a, b)).collect();
        // The same routes asked for in the other order, on another machine.
        let other = Machine::build(&topo);
        for (&(a, b), r) in pairs.iter().zip(&seq).rev() {
            assert_eq!(*r, other.route(a, b), "{a} -> {b}");
            let mut at = a;
            for &l in r.iter() {
                assert_eq!(m.links[l as usize].from, at);
                at = m.links[l as usize].to;
            }
            assert_eq!(at, b);
        }
    }
}
