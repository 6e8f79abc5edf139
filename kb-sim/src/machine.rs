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

/// The run of `sorted` (PEs in the machine's order, repeats allowed)
/// whose (SIP, cube) lies in `from..=to`, found by two searches: a
/// fanout to each SIP or cube that scanned every PE of a launch or a
/// mapping was O(cubes x PEs).
pub(crate) fn pes_within(sorted: &[PeCoord], from: (u32, u32), to: (u32, u32)) -> &[PeCoord] {
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "PEs in order");
    let lo = sorted.partition_point(|p| (p.sip, p.cube) < from);
    let hi = sorted.partition_point(|p| (p.sip, p.cube) <= to);
    &sorted[lo..hi.max(lo)]
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
    /// Far searches (see [`Machine::route`]) toward each destination and
    /// from each source: those that met more than [`FAR_NODES`] nodes.
    far_destinations: HashMap<NodeId, u32>,
    far_sources: HashMap<NodeId, u32>,
    /// Per far destination, every node's hop count to it (`u32::MAX`:
    /// none).
    destination_trees: HashMap<NodeId, Vec<u32>>,
    /// Per far source, the link its search reaches each node by
    /// (`LinkId::MAX`: none, or the source itself).
    source_trees: HashMap<NodeId, Vec<LinkId>>,
    /// Per node, the nodes with a link to it (built with the first
    /// destination tree).
    into: Vec<Vec<NodeId>>,
}

/// A route search that meets more nodes than this before reaching its
/// destination is far; the second far search toward one destination, or
/// from one source, builds that node's tree. (A PE's own TCM or cube is a
/// few nodes away; a shared HBM across a 4,096-PE machine, or every PE
/// from the host, most of its 27 K nodes.)
const FAR_NODES: u32 = 1024;
/// Trees of each kind kept at most (4 bytes a node each: 7 MB for 64 of
/// a 4,096-PE machine); routes beyond them are searched.
const MAX_TREES: usize = 64;

/// Count a far search at `node`; whether it had one before.
fn far_again(counts: &mut HashMap<NodeId, u32>, node: NodeId) -> bool {
    let n = counts.entry(node).or_insert(0);
    *n += 1;
    *n >= 2
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
    ///
    /// A breadth-first search from `from` finds it: of the shortest routes,
    /// the one whose sequence of link positions in each node's list is
    /// least (the search reaches a node first through the earliest node of
    /// the previous level, by that node's earliest link to it).
    ///
    /// A far route costs a search over most of a large machine. Toward a
    /// far destination that many sources ask for (every PE's route to one
    /// HBM), the destination's tree of hop counts is built once, and a
    /// route is walked from `from` taking at each node its first link that
    /// gets one hop closer: the least such sequence, so the same route
    /// (tested against the search on every built-in topology). From a far
    /// source that asks for many (the host to every PE), its search is run
    /// to the end once and each route read back from it.
    pub fn route(&self, from: NodeId, to: NodeId) -> Rc<[LinkId]> {
        if let Some(r) = self.routes.borrow().get(&(from, to)) {
            return r.clone();
        }
        let r: Rc<[LinkId]> = {
            let search = &mut *self.search.borrow_mut();
            if let Some(dist) = search.destination_trees.get(&to) {
                self.walk(dist, from, to)
            } else if let Some(via) = search.source_trees.get(&from) {
                self.back(via, from, to)
            } else {
                let (path, met) = self.bfs(search, from, to);
                if met > FAR_NODES {
                    if far_again(&mut search.far_destinations, to)
                        && search.destination_trees.len() < MAX_TREES
                    {
                        let dist = self.destination_tree(&mut search.into, to);
                        search.destination_trees.insert(to, dist);
                    }
                    if far_again(&mut search.far_sources, from)
                        && search.source_trees.len() < MAX_TREES
                    {
                        let tree = self.source_tree(search, from);
                        search.source_trees.insert(from, tree);
                    }
                }
                path
            }
        }
        .into();
        self.routes.borrow_mut().insert((from, to), r.clone());
        r
    }

    /// The search's route from `from` to `to`, and the nodes it met.
    fn bfs(&self, search: &mut Search, from: NodeId, to: NodeId) -> (Vec<LinkId>, u32) {
        let (mark, met) = self.reach(search, from, Some(to));
        let Search { seen, via, .. } = search;
        let path = self.path_back(from, to, |v| (seen[v] == mark).then(|| via[v]));
        (path, met)
    }

    /// Breadth-first from `from` until `to` is reached (every node with
    /// `None`): the search's mark and the nodes it met. Stopping early
    /// changes no link a node was reached by (a node is reached once, and
    /// in an order that does not depend on where the search stops).
    fn reach(&self, search: &mut Search, from: NodeId, to: Option<NodeId>) -> (u32, u32) {
        let mark = search.start(self.nodes.len());
        let Search { seen, via, q, .. } = search;
        seen[from as usize] = mark;
        q.push_back(from);
        let mut met = 1;
        let mut reached = to == Some(from);
        while !reached && let Some(u) = q.pop_front() {
            for &(v, l) in &self.adj[u as usize] {
                if seen[v as usize] != mark {
                    seen[v as usize] = mark;
                    via[v as usize] = l;
                    q.push_back(v);
                    met += 1;
                    if to == Some(v) {
                        reached = true;
                        break;
                    }
                }
            }
        }
        (mark, met)
    }

    /// The search from `from` run to the end: the link it reaches each
    /// node by (`LinkId::MAX`: none, or `from` itself).
    fn source_tree(&self, search: &mut Search, from: NodeId) -> Vec<LinkId> {
        let (mark, _) = self.reach(search, from, None);
        let Search { seen, via, .. } = search;
        (0..self.nodes.len())
            .map(|v| {
                if seen[v] == mark && v != from as usize {
                    via[v]
                } else {
                    LinkId::MAX
                }
            })
            .collect()
    }

    /// The route from `from` to `to` back up `from`'s search tree.
    fn back(&self, tree: &[LinkId], from: NodeId, to: NodeId) -> Vec<LinkId> {
        self.path_back(from, to, |v| (tree[v] != LinkId::MAX).then_some(tree[v]))
    }

    /// The route to `to` read back from the link each node was reached by
    /// (`reached_by`, `None`: not reached).
    fn path_back(
        &self,
        from: NodeId,
        to: NodeId,
        reached_by: impl Fn(usize) -> Option<LinkId>,
    ) -> Vec<LinkId> {
        let mut path = Vec::new();
        let mut at = to;
        while at != from {
            let l = reached_by(at as usize).expect("the fabric is connected");
            path.push(l);
            at = self.links[l as usize].from;
        }
        path.reverse();
        path
    }

    /// Every node's hop count to `to` (`u32::MAX`: none), by a
    /// breadth-first search over the links' reverse (`into`, built here on
    /// first use).
    fn destination_tree(&self, into: &mut Vec<Vec<NodeId>>, to: NodeId) -> Vec<u32> {
        if into.len() != self.nodes.len() {
            *into = vec![Vec::new(); self.nodes.len()];
            for l in &self.links {
                into[l.to as usize].push(l.from);
            }
        }
        let mut dist = vec![u32::MAX; self.nodes.len()];
        let mut q = VecDeque::from([to]);
        dist[to as usize] = 0;
        while let Some(v) = q.pop_front() {
            let d = dist[v as usize] + 1;
            for &u in &into[v as usize] {
                if dist[u as usize] == u32::MAX {
                    dist[u as usize] = d;
                    q.push_back(u);
                }
            }
        }
        dist
    }

    /// The route from `from` to `to` down `to`'s tree of hop counts: at
    /// each node its first link one hop closer.
    fn walk(&self, dist: &[u32], from: NodeId, to: NodeId) -> Vec<LinkId> {
        assert_ne!(dist[from as usize], u32::MAX, "the fabric is connected");
        let mut path = Vec::with_capacity(dist[from as usize] as usize);
        let mut at = from;
        while at != to {
            let closer = dist[at as usize] - 1;
            let &(next, l) = self.adj[at as usize]
                .iter()
                .find(|&&(v, _)| dist[v as usize] == closer)
                .expect("a node with a hop count has a link one hop closer");
            path.push(l);
            at = next;
        }
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
    use proptest::prelude::*;

    proptest! {
        /// PEs of a SIP or cube found by search are those a scan of every
        /// PE filters, in the same order, for any SIP or cube (present
        /// or not).
        #[test]
        fn pes_within_a_sip_or_cube_are_those_a_scan_finds(
            list in prop::collection::vec((0u32..4, 0u32..4, 0u32..3), 0..40),
            sip in 0u32..5,
            cube in 0u32..5,
        ) {
            let mut targets: Vec<PeCoord> =
                list.into_iter().map(|(sip, cube, pe)| PeCoord { sip, cube, pe }).collect();
            targets.sort();
            let in_sip: Vec<PeCoord> = targets.iter().filter(|p| p.sip == sip).copied().collect();
            prop_assert_eq!(pes_within(&targets, (sip, 0), (sip, u32::MAX)), &in_sip[..]);
            let in_cube: Vec<PeCoord> = targets
                .iter()
                .filter(|p| (p.sip, p.cube) == (sip, cube))
                .copied()
                .collect();
            prop_assert_eq!(pes_within(&targets, (sip, cube), (sip, cube)), &in_cube[..]);
        }
    }

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

    /// The search's route from `a` to `b` on `m`.
    fn searched(m: &Machine, a: NodeId, b: NodeId) -> Vec<LinkId> {
        m.bfs(&mut m.search.borrow_mut(), a, b).0
    }

    /// Walking a destination's tree of hop counts, and reading back a
    /// source's whole search, give the search's route on every built-in
    /// topology and topology file (nodes sampled), ties included.
    #[test]
    fn tree_walks_give_the_searchs_routes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topologies");
        let mut topos: Vec<Topology> = ["small", "default", "large"]
            .iter()
            .map(|n| Topology::load(n).expect("built-in topology"))
            .collect();
        for e in std::fs::read_dir(&dir).expect("topologies/") {
            let path = e.expect("entry").path();
            topos.push(Topology::load(path.to_str().expect("utf-8")).expect("topology file"));
        }
        let mut compared = 0;
        for topo in &topos {
            let m = Machine::build(topo);
            let n = m.nodes.len() as NodeId;
            let step = (n / 40).max(1);
            let mut into = Vec::new();
            for b in (0..n).step_by(step as usize) {
                let tree = m.destination_tree(&mut into, b);
                for a in (0..n).step_by((step / 2).max(1) as usize) {
                    assert_eq!(m.walk(&tree, a, b), searched(&m, a, b), "{a} -> {b}");
                    compared += 1;
                }
                // And `b` as a source.
                let via = m.source_tree(&mut m.search.borrow_mut(), b);
                for a in (0..n).step_by((step / 2).max(1) as usize) {
                    assert_eq!(m.back(&via, b, a), searched(&m, b, a), "{b} -> {a}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 10_000, "{compared}");
    }

    /// Many equal routes and doubled links: a ladder of rungs, each rung's
    /// nodes linked to the next rung's in both orders, plus a second link
    /// beside some. Both trees give the search's choice among them.
    #[test]
    fn tree_walks_break_ties_as_the_search_does() {
        let mut m = Machine::build(&Topology::load("small").expect("built-in topology"));
        let spec = m.topo.links.noc_pe;
        let first = m.nodes.len() as NodeId;
        let (rungs, width) = (6, 4);
        for i in 0..rungs * width {
            m.add_node(format!("t{i}"), NodeKind::Noc, 0, 0, 0);
        }
        let at = |r: u32, c: u32| first + r * width + c;
        for r in 0..rungs - 1 {
            for c in 0..width {
                // Later columns first from even rungs: the first link in a
                // list is not always the lowest column.
                let order: Vec<u32> = if r % 2 == 0 {
                    (0..width).rev().collect()
                } else {
                    (0..width).collect()
                };
                for &d in &order {
                    if (c + d) % 3 != 1 {
                        m.connect(at(r, c), at(r + 1, d), spec, "test");
                    }
                }
                if c % 2 == 0 {
                    m.connect(at(r, c), at(r + 1, c), spec, "test");
                }
            }
        }
        let mut into = Vec::new();
        let nodes: Vec<NodeId> = (first..first + rungs * width).collect();
        for &b in &nodes {
            let tree = m.destination_tree(&mut into, b);
            let via = m.source_tree(&mut m.search.borrow_mut(), b);
            for &a in &nodes {
                assert_eq!(m.walk(&tree, a, b), searched(&m, a, b), "{a} -> {b}");
                assert_eq!(m.back(&via, b, a), searched(&m, b, a), "{b} -> {a}");
            }
        }
    }

    /// Routes from many PEs to one HBM across a large machine build that
    /// destination's tree (after two searches), routes from the host to
    /// many PEs the host's, and all stay the search's.
    #[test]
    fn far_destinations_get_a_tree() {
        let mut topo = Topology::load("large").expect("built-in topology");
        topo.counts.sips = 8;
        let m = Machine::build(&topo);
        let hbm = m.cube_node(0, 0, NodeKind::HbmCtrl);
        let pes = m.topo.total_pes() as usize;
        let srcs: Vec<NodeId> = (0..pes)
            .step_by(7)
            .map(|i| m.pe_node(m.pe_coord(i), NodeKind::PeDma))
            .collect();
        let routes: Vec<Rc<[LinkId]>> = srcs.iter().map(|&a| m.route(a, hbm)).collect();
        assert!(
            m.search.borrow().destination_trees.contains_key(&hbm),
            "no tree for the shared HBM"
        );
        let other = Machine::build(&topo);
        for (&a, r) in srcs.iter().zip(&routes) {
            assert_eq!(r[..], searched(&other, a, hbm)[..], "{a}");
        }
        let host = m.host();
        let back: Vec<Rc<[LinkId]>> = srcs.iter().map(|&b| m.route(host, b)).collect();
        assert!(
            m.search.borrow().source_trees.contains_key(&host),
            "no tree for the host"
        );
        for (&b, r) in srcs.iter().zip(&back) {
            assert_eq!(r[..], searched(&other, host, b)[..], "host -> {b}");
        }
        // A PE's own TCM is near: searched, no tree.
        let pc = m.pe_coord(3);
        let tcm = m.pe_node(pc, NodeKind::Tcm);
        m.route(m.pe_node(pc, NodeKind::PeDma), tcm);
        assert!(!m.search.borrow().destination_trees.contains_key(&tcm));
        assert!(
            !m.search
                .borrow()
                .source_trees
                .contains_key(&m.pe_node(pc, NodeKind::PeDma))
        );
    }
}
