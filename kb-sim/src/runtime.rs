//! The host runtime's setup side: per-PE memory allocators, tensors and
//! their placement (which memory: HBM, TCM or SRAM; split over the cubes
//! and PEs of the machine, or over a list of PEs), and freeing. (Deploy,
//! launch and the timed free are protocols of `engine`.)

use kb_format::pa::Pa;
use kb_format::{Dtype, Shard, Space, TensorMeta};

use crate::alloc::FreeList;
use crate::machine::{Machine, PeCoord};
use crate::topology::{AddressModel, MappingMode};

/// How one level of the hierarchy splits its part of a 2-D tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every member holds the whole part.
    Replicate,
    /// Member k of N holds rows [k*R/N, (k+1)*R/N).
    RowWise,
    /// Member k of N holds columns [k*C/N, (k+1)*C/N), stored contiguously.
    ColumnWise,
}

impl Policy {
    /// The policy named `replicate`, `row_wise` or `column_wise`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "replicate" => Some(Policy::Replicate),
            "row_wise" => Some(Policy::RowWise),
            "column_wise" => Some(Policy::ColumnWise),
            _ => None,
        }
    }

    /// Member `k` of `n`'s part of the rectangle `[r0, r1) x [c0, c1)`.
    fn split(self, rect: [u64; 4], k: u64, n: u64) -> [u64; 4] {
        let [r0, r1, c0, c1] = rect;
        match self {
            Policy::Replicate => rect,
            Policy::RowWise => [r0 + k * (r1 - r0) / n, r0 + (k + 1) * (r1 - r0) / n, c0, c1],
            Policy::ColumnWise => [r0, r1, c0 + k * (c1 - c0) / n, c0 + (k + 1) * (c1 - c0) / n],
        }
    }
}

/// Sharding of a tensor: first over all cubes of the machine, then over
/// the PEs of each cube (the original simulator's DPPolicy with `cube` and `pe` levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// How the tensor is split over all cubes of the machine.
    pub cube: Policy,
    /// How each cube's part is split over its PEs.
    pub pe: Policy,
}

impl Sharding {
    /// Split rows over every PE of the machine.
    pub const ROWS: Sharding = Sharding {
        cube: Policy::RowWise,
        pe: Policy::RowWise,
    };
    /// Split columns over every PE of the machine.
    pub const COLUMNS: Sharding = Sharding {
        cube: Policy::ColumnWise,
        pe: Policy::ColumnWise,
    };
    /// A full copy in every PE.
    pub const REPLICATE: Sharding = Sharding {
        cube: Policy::Replicate,
        pe: Policy::Replicate,
    };

    /// The rectangle `[r0, r1, c0, c1]` of a `rows` x `cols` tensor that
    /// PE `pe` of `pes_per_cube` in cube `cube` of `cubes` holds (empty
    /// when the split leaves it nothing).
    pub fn part(
        self,
        [rows, cols]: [u64; 2],
        (cube, cubes): (u64, u64),
        (pe, pes_per_cube): (u64, u64),
    ) -> [u64; 4] {
        let cube_rect = self.cube.split([0, rows, 0, cols], cube, cubes);
        self.pe.split(cube_rect, pe, pes_per_cube)
    }
}

/// Which memory a tensor lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Memory {
    /// Each holder PE's HBM partition, addressed the address model's way
    /// (PA, VA or LA).
    #[default]
    Hbm,
    /// Each holder PE's TCM, addressed by PA under every model (a fixed
    /// on-chip resource, docs/design.md A1): receive slots for PE-to-PE copies and
    /// data kept on chip across launches. Kernels allocate their tiles
    /// around it.
    Tcm,
    /// Each holder cube's SRAM, shared by the cube's PEs, addressed by PA
    /// under every model.
    Sram,
}

impl Memory {
    /// The PA space it lives in.
    pub fn space(self) -> Space {
        match self {
            Memory::Hbm => Space::Hbm,
            Memory::Tcm => Space::Tcm,
            Memory::Sram => Space::Sram,
        }
    }
}

/// How a placement splits a tensor among its holders.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Split {
    /// Over every cube, then every PE of each cube.
    Machine(Sharding),
    /// Over the listed PEs, in order.
    Pes(Vec<PeCoord>, Policy),
    /// Nowhere on the device: host data a reference reads.
    Host,
}

/// Where a tensor lives: which [`Memory`], and how it is split among the
/// PEs (in SRAM: the cubes) that hold it. A [`Sharding`] is a placement in
/// HBM over the whole machine; [`Placement::over`] splits over a list of
/// PEs (a tensor-parallel group, a collective's members);
/// [`Placement::in_tcm`] and [`Placement::in_sram`] move either on chip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    memory: Memory,
    split: Split,
}

impl Placement {
    /// In HBM, split by `policy` over `pes` in order: member k of N holds
    /// part k (`Replicate`: each holds a whole copy).
    pub fn over(pes: &[PeCoord], policy: Policy) -> Placement {
        Placement {
            memory: Memory::Hbm,
            split: Split::Pes(pes.to_vec(), policy),
        }
    }

    /// Nowhere on the device: a tensor whose host data only the
    /// verification reference reads (no memory, no upload, no mapping;
    /// kernels see it with no shards).
    pub fn host_only() -> Placement {
        Placement {
            memory: Memory::Hbm,
            split: Split::Host,
        }
    }

    /// The same split in each holder PE's TCM.
    pub fn in_tcm(self) -> Placement {
        Placement {
            memory: Memory::Tcm,
            ..self
        }
    }

    /// The same split in SRAM: the holders are cubes (the cubes of the
    /// listed PEs, each once, in order of first appearance; with a
    /// [`Sharding`], its `cube` policy over every cube, and its `pe`
    /// policy must be `Replicate`).
    pub fn in_sram(self) -> Placement {
        Placement {
            memory: Memory::Sram,
            ..self
        }
    }

    /// The memory it places in.
    pub fn memory(&self) -> Memory {
        self.memory
    }
}

impl From<Sharding> for Placement {
    fn from(s: Sharding) -> Placement {
        Placement {
            memory: Memory::Hbm,
            split: Split::Machine(s),
        }
    }
}

/// Errors while setting up a run.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "{pe}: out of {space} memory allocating {bytes} bytes for {what} ({used} of {limit} bytes in use, largest free block {largest})"
    )]
    OutOfMemory {
        pe: PeCoord,
        space: &'static str,
        bytes: u64,
        what: String,
        used: u64,
        limit: u64,
        largest: u64,
    },
    #[error("tensor {0:?}: {1}")]
    Tensor(String, String),
}

/// What is installed in some PEs at deploy and removed at free: VA pages
/// for their PE_MMU (VA model) or a BAAW segment for their PE_DMA (LA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The PEs that get it.
    pub targets: Vec<PeCoord>,
    /// Its VA pages, in order, as runs onto contiguous PAs (VA model). A
    /// list of (VA page, PA page) pairs per mapping was O(PEs^2) memory
    /// for a tensor replicated per PE whose size follows the PEs (268 MB
    /// of `atomics` at 4,096 PEs).
    pub runs: Vec<PageRun>,
    /// How many pages its runs map (a map message's size follows it;
    /// kept, as every fanout step sends one).
    pub pages: u64,
    /// A BAAW segment (LA model).
    pub segment: Option<Segment>,
}

/// `pages` VA pages from `va` mapped onto as many contiguous PA pages
/// from `pa`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRun {
    pub va: u64,
    pub pa: u64,
    pub pages: u64,
}

/// A BAAW segment (docs/design.md A3): a PE-local LA range and where its bytes
/// live. 1:1: striped across the PE's channels `stripe` bytes at a time,
/// stripe j in channel j % N at `channel_pas[j % N] + (j / N) * stripe`.
/// n:1: contiguous at `agg_pa`, served by the PE's channels together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub la_base: u64,
    pub la_size: u64,
    pub mode: MappingMode,
    pub channel_pas: Vec<u64>,
    pub agg_pa: u64,
    /// The PE's first pseudo channel in its cube, and how many it owns.
    pub first_channel: u32,
    pub channels: u32,
    pub stripe: u64,
}

/// One PE's part of a tensor as kernels see it: `rows` x `row_bytes` at
/// `addr`, the address kernels use (PA, VA or LA, by model), holding the
/// tensor's rows from `row0` and columns from `col0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardArg {
    /// The PE that holds it.
    pub pe: PeCoord,
    /// Address of its first byte, in the model's address space.
    pub addr: u64,
    /// Its rows.
    pub rows: u64,
    /// Bytes per row (its columns times the element size); rows are
    /// contiguous, `row_bytes` apart.
    pub row_bytes: u64,
    /// The tensor row of the shard's first row.
    pub row0: u64,
    /// The tensor column of the shard's first column.
    pub col0: u64,
}

/// Where a tensor's bytes went.
struct Layout {
    shards: Vec<Shard>,
    shard_pes: Vec<PeCoord>,
    kernel_shards: Vec<ShardArg>,
    va: Option<(u64, u64)>,
    mappings: Vec<Mapping>,
}

/// A tensor declared by a benchmark.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub id: u32,
    pub meta: TensorMeta,
    /// Host data (row-major bytes), when the host provides it.
    pub data: Option<Vec<u8>>,
    /// Which PE holds each shard, parallel to `meta.shards`.
    pub shard_pes: Vec<PeCoord>,
    /// Each PE's part as kernels address it (PA, VA or LA by model). In
    /// the LA 1:1 model one part spans several physical shards.
    pub kernel_shards: Vec<ShardArg>,
    /// VA range (base, bytes), in the VA model.
    pub va: Option<(u64, u64)>,
    /// MMU mappings to install at deploy, in the VA model.
    pub mappings: Vec<Mapping>,
    /// The memory its shards are in.
    pub memory: Memory,
    pub freed: bool,
}

impl Tensor {
    /// The shard a PE holds, if any.
    pub fn shard_of(&self, pe: PeCoord) -> Option<&Shard> {
        self.shard_pes
            .iter()
            .position(|&p| p == pe)
            .map(|i| &self.meta.shards[i])
    }
}

/// Start of the device VA space (docs/design.md A2: 4 GiB).
pub const VA_BASE: u64 = 0x1_0000_0000;
/// Size of the device VA space.
pub const VA_BYTES: u64 = 1 << 44;
/// Start of each PE's LA space (docs/design.md A3).
pub const LA_BASE: u64 = 0x1_0000_0000;
/// Size of each PE's LA space (docs/design.md A3: 64 GiB per PE).
pub const LA_BYTES: u64 = 64 << 30;

/// Setup-time state: allocators and declared tensors.
#[derive(Debug)]
pub struct Runtime<'m> {
    pub machine: &'m Machine,
    hbm: Vec<FreeList>,
    tcm: Vec<FreeList>,
    /// Per cube (dense index): its SRAM.
    sram: Vec<FreeList>,
    /// Device-wide VA space (VA model), offsets from `VA_BASE`.
    va: FreeList,
    /// Per PE: its LA space (LA model), offsets from `LA_BASE`.
    la: Vec<FreeList>,
    /// Per PE and channel: the channel's region of the PE's HBM partition
    /// (LA model, 1:1 mapping).
    channels: Vec<Vec<FreeList>>,
    pub tensors: Vec<Tensor>,
}

impl<'m> Runtime<'m> {
    pub fn new(machine: &'m Machine) -> Self {
        let n = machine.topo.total_pes() as usize;
        Runtime {
            machine,
            hbm: vec![FreeList::new(machine.topo.hbm_bytes_per_pe()); n],
            tcm: vec![FreeList::new(machine.topo.tcm_bytes()); n],
            sram: vec![
                FreeList::new(machine.topo.sram_bytes());
                (machine.topo.counts.sips * machine.topo.counts.cubes_per_sip) as usize
            ],
            va: FreeList::new(VA_BYTES),
            la: vec![FreeList::new(LA_BYTES); n],
            channels: match machine.topo.memory_map {
                Some(mm)
                    if machine.topo.address_model == AddressModel::La
                        && mm.hbm_mapping_mode == MappingMode::OneToOne =>
                {
                    let region = Self::channel_region(machine);
                    vec![vec![FreeList::new(region); mm.hbm_channels_per_pe as usize]; n]
                }
                _ => Vec::new(),
            },

            tensors: Vec::new(),
        }
    }

    fn pool(&mut self, pe: PeCoord, space: Space) -> &mut FreeList {
        let i = self.machine.pe_index(pe);
        match space {
            Space::Tcm => &mut self.tcm[i],
            Space::Sram => {
                &mut self.sram[(pe.sip * self.machine.topo.counts.cubes_per_sip + pe.cube) as usize]
            }
            _ => &mut self.hbm[i],
        }
    }

    fn alloc(
        &mut self,
        pe: PeCoord,
        space: Space,
        bytes: u64,
        what: &str,
    ) -> Result<u64, SetupError> {
        self.alloc_aligned(pe, space, bytes, 64, what)
    }

    fn alloc_aligned(
        &mut self,
        pe: PeCoord,
        space: Space,
        bytes: u64,
        align: u64,
        what: &str,
    ) -> Result<u64, SetupError> {
        let pool = self.pool(pe, space);
        let offset = pool
            .alloc(bytes, align)
            .ok_or_else(|| SetupError::OutOfMemory {
                pe,
                space: space.name(),
                bytes,
                what: what.to_string(),
                used: pool.used(),
                limit: pool.limit(),
                largest: pool.largest_free(),
            })?;
        Ok(Pa {
            space,
            sip: pe.sip,
            cube: pe.cube,
            pe: pe.pe,
            offset,
        }
        .encode()
        .expect("topology validation keeps PAs in range"))
    }

    fn release(&mut self, pa: u64) {
        let p = Pa::decode(pa).expect("allocated PA");
        let pe = PeCoord {
            sip: p.sip,
            cube: p.cube,
            pe: p.pe,
        };
        let freed = self.pool(pe, p.space).free(p.offset);
        debug_assert!(freed, "release of an address that is not allocated");
    }

    /// Allocate `bytes` of the PE's TCM; returns its PA.
    pub fn tcm_alloc(&mut self, pe: PeCoord, bytes: u64, what: &str) -> Result<u64, SetupError> {
        self.alloc(pe, Space::Tcm, bytes, what)
    }

    /// Return TCM allocated by `tcm_alloc`.
    pub fn tcm_free(&mut self, pa: u64) {
        self.release(pa);
    }

    /// Hand a PE's TCM allocator to the kernel that runs there (tiles are
    /// allocated kernel-side during the run).
    pub fn take_tcm(&mut self, pe: PeCoord) -> FreeList {
        let i = self.machine.pe_index(pe);
        std::mem::replace(&mut self.tcm[i], FreeList::new(0))
    }

    /// Tensor `id` as kernels see it (name, dtype, shape, each PE's shard).
    pub fn kernel_arg(&self, id: u32) -> crate::kernel::TensorArg {
        let t = &self.tensors[id as usize];
        crate::kernel::TensorArg {
            name: t.meta.name.clone(),
            dtype: t.meta.dtype,
            shape: crate::shape::Shape::from(&t.meta.shape).matrix(),
            dims: t.meta.shape.clone(),
            space: t.memory.space(),
            shards: t.kernel_shards.clone(),
            shards_in_order: crate::kernel::TensorArg::holders_in_order(
                t.memory.space(),
                &t.kernel_shards,
            ),
            peers_reach: !(t.memory.space() == Space::Hbm
                && self.machine.topo.address_model == AddressModel::La),
        }
    }

    /// Launch arguments holding tensors `ids`.
    pub fn kernel_args(&self, ids: &[u32]) -> crate::kernel::KernelArgs {
        crate::kernel::KernelArgs {
            tensors: ids.iter().map(|&id| self.kernel_arg(id)).collect(),
            ..Default::default()
        }
    }

    /// Each holder's rectangle `[r0, r1, c0, c1]` of a `shape` tensor under
    /// `placement`, in holder order (empty parts included). In SRAM a
    /// holder is a cube, named by its PE 0.
    pub fn parts(
        &self,
        shape: [u64; 2],
        placement: &Placement,
    ) -> Result<Vec<(PeCoord, [u64; 4])>, String> {
        let c = self.machine.topo.counts;
        let whole = [0, shape[0], 0, shape[1]];
        let sram = placement.memory == Memory::Sram;
        let holders: Vec<(PeCoord, [u64; 4])> = match &placement.split {
            Split::Host => Vec::new(),
            Split::Machine(sharding) if sram => {
                if sharding.pe != Policy::Replicate {
                    return Err("SRAM is per cube: a tensor in SRAM splits over cubes only (its sharding's pe policy must be replicate)".into());
                }
                let cubes = (c.sips * c.cubes_per_sip) as u64;
                (0..cubes)
                    .map(|k| {
                        let pe = PeCoord {
                            sip: (k / c.cubes_per_sip as u64) as u32,
                            cube: (k % c.cubes_per_sip as u64) as u32,
                            pe: 0,
                        };
                        (pe, sharding.cube.split(whole, k, cubes))
                    })
                    .collect()
            }
            Split::Machine(sharding) => {
                let cubes = (c.sips * c.cubes_per_sip) as u64;
                let per_cube = c.pes_per_cube as u64;
                self.machine
                    .pes()
                    .map(|pe| {
                        let cube = (pe.sip * c.cubes_per_sip + pe.cube) as u64;
                        (
                            pe,
                            sharding.part(shape, (cube, cubes), (pe.pe as u64, per_cube)),
                        )
                    })
                    .collect()
            }
            Split::Pes(pes, policy) => {
                if pes.is_empty() {
                    return Err("placed over an empty list of PEs".into());
                }
                let mut seen = std::collections::BTreeSet::new();
                for p in pes {
                    if p.sip >= c.sips || p.cube >= c.cubes_per_sip || p.pe >= c.pes_per_cube {
                        return Err(format!("{p} is not a PE of this machine"));
                    }
                    if !sram && !seen.insert(*p) {
                        return Err(format!("{p} is listed twice"));
                    }
                }
                let holders: Vec<PeCoord> = if sram {
                    let mut cubes: Vec<PeCoord> = Vec::new();
                    for p in pes {
                        let cube = PeCoord { pe: 0, ..*p };
                        if !cubes.contains(&cube) {
                            cubes.push(cube);
                        }
                    }
                    cubes
                } else {
                    pes.clone()
                };
                let n = holders.len() as u64;
                holders
                    .into_iter()
                    .enumerate()
                    .map(|(k, pe)| (pe, policy.split(whole, k as u64, n)))
                    .collect()
            }
        };
        Ok(holders)
    }

    /// Declare a tensor of 1 to [`crate::shape::MAX_RANK`] dims with
    /// optional host data, placed by `placement` (a [`Sharding`] over the
    /// machine's HBM, or a [`Placement`]). It is stored, sharded and placed
    /// as its 2-D view `[product of the leading dims, last dim]`
    /// ([`crate::shape::Shape::matrix`]); the trace records its dims.
    pub fn tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: impl Into<crate::shape::Shape>,
        data: Option<Vec<u8>>,
        placement: impl Into<Placement>,
    ) -> Result<u32, SetupError> {
        let placement = placement.into();
        let dims = shape.into();
        let shape = dims
            .check()
            .map_err(|e| SetupError::Tensor(name.into(), e))?;
        let [rows, cols] = shape;
        let es = dtype.size() as u64;
        let nbytes = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(es))
            .ok_or_else(|| {
                SetupError::Tensor(
                    name.into(),
                    format!("shape {:?} has more bytes than a u64 counts", dims.dims()),
                )
            })?;
        if let Some(d) = &data
            && d.len() as u64 != nbytes
        {
            return Err(SetupError::Tensor(
                name.into(),
                format!("{} bytes of data for {nbytes}", d.len()),
            ));
        }
        if placement.split == Split::Host && data.is_none() {
            return Err(SetupError::Tensor(
                name.into(),
                "a host-only tensor needs host data (it exists only for the reference)".into(),
            ));
        }
        let id = self.tensors.len() as u32;
        if id >= kb_format::pa::MAX_HOST_TENSORS {
            return Err(SetupError::Tensor(name.into(), "too many tensors".into()));
        }
        // Each holder's part of the tensor, before any memory is chosen.
        let mut parts: Vec<(PeCoord, Shard)> = Vec::new();
        let rects = self
            .parts(shape, &placement)
            .map_err(|e| SetupError::Tensor(name.into(), e))?;
        for (pe, [r0, r1, c0, c1]) in rects {
            let (srows, row_bytes) = (r1 - r0, (c1 - c0) * es);
            if srows == 0 || row_bytes == 0 {
                continue;
            }
            let tensor_offset = (r0 * cols + c0) * es;
            parts.push((
                pe,
                Shard {
                    tensor_offset,
                    rows: srows,
                    row_bytes,
                    tensor_row_stride: cols * es,
                    pa: 0,
                },
            ));
        }
        let layout = match (placement.memory, self.machine.topo.address_model) {
            _ if placement.split == Split::Host => Layout {
                shards: Vec::new(),
                shard_pes: Vec::new(),
                kernel_shards: Vec::new(),
                va: None,
                mappings: Vec::new(),
            },
            (Memory::Tcm | Memory::Sram, _) => {
                self.layout_on_chip(name, placement.memory, &parts)?
            }
            (Memory::Hbm, AddressModel::La) => self.layout_la(name, &parts)?,
            (Memory::Hbm, model) => {
                let mut shards = Vec::with_capacity(parts.len());
                for (pe, part) in &parts {
                    // Page-aligned, so a VA page maps to one PA page.
                    let page = self.machine.topo.pe_mmu.page_bytes;
                    let pa = self.alloc_aligned(
                        *pe,
                        Space::Hbm,
                        part.rows * part.row_bytes,
                        page,
                        name,
                    )?;
                    shards.push(Shard { pa, ..part.clone() });
                }
                let pes: Vec<PeCoord> = parts.iter().map(|(pe, _)| *pe).collect();
                let (addrs, va, mappings) = match model {
                    AddressModel::Va => self.map_va(name, &placement.split, &shards, &pes)?,
                    _ => (shards.iter().map(|s| s.pa).collect(), None, Vec::new()),
                };
                let kernel_shards = shards
                    .iter()
                    .zip(&pes)
                    .zip(&addrs)
                    .map(|((s, &pe), &addr)| ShardArg {
                        pe,
                        addr,
                        rows: s.rows,
                        row_bytes: s.row_bytes,
                        row0: 0,
                        col0: 0,
                    })
                    .collect();
                Layout {
                    shards,
                    shard_pes: pes,
                    kernel_shards,
                    va,
                    mappings,
                }
            }
        };
        let Layout {
            shards,
            shard_pes,
            mut kernel_shards,
            va,
            mappings,
        } = layout;
        // Kernel shards follow `parts` in both layouts.
        for (k, (_, part)) in kernel_shards.iter_mut().zip(&parts) {
            k.row0 = part.tensor_offset / (cols * es);
            k.col0 = part.tensor_offset % (cols * es) / es;
        }
        let meta = TensorMeta {
            name: name.to_string(),
            dtype,
            shape: dims.dims().to_vec(),
            address: va.map_or_else(
                || kernel_shards.first().map_or(0, |s| s.addr),
                |(base, _)| base,
            ),
            host_data: data.is_some(),
            shards,
        };
        self.tensors.push(Tensor {
            id,
            meta,
            data,
            shard_pes,
            kernel_shards,
            va,
            mappings,
            memory: placement.memory,
            freed: false,
        });
        Ok(id)
    }

    /// A TCM or SRAM layout: each part in its holder's memory, addressed
    /// by PA under every model (no mappings to install).
    fn layout_on_chip(
        &mut self,
        name: &str,
        memory: Memory,
        parts: &[(PeCoord, Shard)],
    ) -> Result<Layout, SetupError> {
        let mut out = Layout {
            shards: Vec::new(),
            shard_pes: Vec::new(),
            kernel_shards: Vec::new(),
            va: None,
            mappings: Vec::new(),
        };
        for (pe, part) in parts {
            let pa = self.alloc(*pe, memory.space(), part.rows * part.row_bytes, name)?;
            out.shards.push(Shard { pa, ..part.clone() });
            out.shard_pes.push(*pe);
            out.kernel_shards.push(ShardArg {
                pe: *pe,
                addr: pa,
                rows: part.rows,
                row_bytes: part.row_bytes,
                row0: 0,
                col0: 0,
            });
        }
        Ok(out)
    }

    /// Whether a PE's part of `rows` x `row_bytes`, rows `row_stride`
    /// apart in the tensor, is one contiguous run of it (what the LA 1:1
    /// model needs to stripe it over channels).
    fn contiguous(rows: u64, row_bytes: u64, row_stride: u64) -> bool {
        rows <= 1 || row_bytes == row_stride
    }

    /// Whether the address model can lay out the `[r0, r1, c0, c1]` part
    /// of a tensor `cols` wide: anywhere but under LA 1:1, which stripes
    /// parts over channels and so needs them contiguous in the tensor.
    pub fn can_hold(&self, [r0, r1, c0, c1]: [u64; 4], cols: u64) -> bool {
        let one_to_one = self.machine.topo.address_model == AddressModel::La
            && self
                .machine
                .topo
                .memory_map
                .is_some_and(|mm| mm.hbm_mapping_mode == MappingMode::OneToOne);
        !one_to_one || Self::contiguous(r1 - r0, c1 - c0, cols)
    }

    /// Bytes of one channel's region of a PE's HBM partition (LA 1:1).
    fn channel_region(machine: &Machine) -> u64 {
        let t = &machine.topo;
        let n = t.memory_map.map_or(1, |mm| mm.hbm_channels_per_pe) as u64;
        let stripe = t.hbm.interleave_bytes as u64;
        t.hbm_bytes_per_pe() / n / stripe * stripe
    }

    /// The LA layout of a tensor (docs/design.md A3, A4): each PE's part gets a
    /// range of that PE's LA space and a BAAW segment. n:1: the part is
    /// contiguous in the PE's partition. 1:1: it is striped over the PE's
    /// channels, so the trace describes it as one strided shard per channel.
    fn layout_la(&mut self, name: &str, parts: &[(PeCoord, Shard)]) -> Result<Layout, SetupError> {
        let t = &self.machine.topo;
        let mm = t
            .memory_map
            .expect("validated: the la model has a memory_map");
        let n = mm.hbm_channels_per_pe as u64;
        let stripe = t.hbm.interleave_bytes as u64;
        let region = Self::channel_region(self.machine);
        let mut out = Layout {
            shards: Vec::new(),
            shard_pes: Vec::new(),
            kernel_shards: Vec::new(),
            va: None,
            mappings: Vec::new(),
        };
        for (pe, part) in parts {
            let (pe, size) = (*pe, part.rows * part.row_bytes);
            let i = self.machine.pe_index(pe);
            let la = LA_BASE
                + self.la[i].alloc(size, stripe).ok_or_else(|| {
                    SetupError::Tensor(
                        name.into(),
                        format!("{pe}: its LA space has no {size} free bytes"),
                    )
                })?;
            let mut seg = Segment {
                la_base: la,
                la_size: size,
                mode: mm.hbm_mapping_mode,
                channel_pas: Vec::new(),
                agg_pa: 0,
                first_channel: pe.pe * mm.hbm_channels_per_pe,
                channels: mm.hbm_channels_per_pe,
                stripe,
            };
            match mm.hbm_mapping_mode {
                MappingMode::NToOne => {
                    let pa = self.alloc_aligned(pe, Space::Hbm, size, stripe, name)?;
                    out.shards.push(Shard { pa, ..part.clone() });
                    out.shard_pes.push(pe);
                    seg.agg_pa = pa;
                }
                MappingMode::OneToOne => {
                    if !Self::contiguous(part.rows, part.row_bytes, part.tensor_row_stride) {
                        return Err(SetupError::Tensor(
                            name.into(),
                            "the LA 1:1 model stripes each PE's part over its channels and needs it contiguous in the tensor (use row-wise or replicated sharding)".into(),
                        ));
                    }
                    let stripes = size.div_ceil(stripe);
                    for k in 0..n {
                        let count = if k < stripes {
                            (stripes - k).div_ceil(n)
                        } else {
                            0
                        };
                        let offset = self.channels[i][k as usize]
                            .alloc((count * stripe).max(1), stripe)
                            .ok_or_else(|| SetupError::OutOfMemory {
                                pe,
                                space: "hbm channel",
                                bytes: count * stripe,
                                what: name.to_string(),
                                used: self.channels[i][k as usize].used(),
                                limit: region,
                                largest: self.channels[i][k as usize].largest_free(),
                            })?;
                        let pa = Pa {
                            space: Space::Hbm,
                            sip: pe.sip,
                            cube: pe.cube,
                            pe: pe.pe,
                            offset: k * region + offset,
                        }
                        .encode()
                        .expect("topology validation keeps PAs in range");
                        seg.channel_pas.push(pa);
                        // Stripes k, k+n, ... of the part; the last stripe may be short.
                        let last = stripes - 1;
                        let tail = size - last * stripe;
                        let full = if count > 0 && last % n == k && tail < stripe {
                            count - 1
                        } else {
                            count
                        };
                        if full > 0 {
                            out.shards.push(Shard {
                                tensor_offset: part.tensor_offset + k * stripe,
                                rows: full,
                                row_bytes: stripe,
                                tensor_row_stride: stripe * n,
                                pa,
                            });
                            out.shard_pes.push(pe);
                        }
                        if full < count {
                            out.shards.push(Shard {
                                tensor_offset: part.tensor_offset + last * stripe,
                                rows: 1,
                                row_bytes: tail,
                                tensor_row_stride: tail,
                                pa: pa + (last / n) * stripe,
                            });
                            out.shard_pes.push(pe);
                        }
                    }
                }
            }
            out.kernel_shards.push(ShardArg {
                pe,
                addr: la,
                rows: part.rows,
                row_bytes: part.row_bytes,
                row0: 0,
                col0: 0,
            });
            out.mappings.push(Mapping {
                targets: vec![pe],
                runs: Vec::new(),
                pages: 0,
                segment: Some(seg),
            });
        }
        Ok(out)
    }

    /// The VA layout of a tensor (docs/design.md A2): one contiguous VA
    /// range; within one replica, shard k sits at `base + offset_k` (each
    /// shard page-aligned, so pages map whole). Replicated over cubes, each
    /// cube (or, replicated over PEs too, each PE) maps the range to its own
    /// copy; sharded, every PE gets every shard's mapping, so any PE can
    /// DMA any shard.
    #[allow(clippy::type_complexity)]
    fn map_va(
        &mut self,
        name: &str,
        split: &Split,
        shards: &[Shard],
        pes: &[PeCoord],
    ) -> Result<(Vec<u64>, Option<(u64, u64)>, Vec<Mapping>), SetupError> {
        let page = self.machine.topo.pe_mmu.page_bytes;
        // Who shares a replica: its key, and which PEs map it.
        #[derive(Clone, Copy, PartialEq)]
        enum Replicas {
            PerPe,
            PerCube,
            One,
        }
        let replicas = match split {
            Split::Machine(s) => match (s.cube, s.pe) {
                (Policy::Replicate, Policy::Replicate) => Replicas::PerPe,
                (Policy::Replicate, _) => Replicas::PerCube,
                _ => Replicas::One,
            },
            Split::Pes(_, Policy::Replicate) => Replicas::PerPe,
            Split::Pes(..) | Split::Host => Replicas::One,
        };
        let key = |p: &PeCoord| -> (u32, u32, u32) {
            match replicas {
                Replicas::PerPe => (p.sip, p.cube, p.pe),
                Replicas::PerCube => (p.sip, p.cube, 0),
                Replicas::One => (0, 0, 0),
            }
        };
        // Replica groups: the shards each group of PEs sees, in order (by
        // key through a map: a search of the list per PE, and of every PE
        // per group below, were quadratic in the PEs when replicated per
        // PE: 8 % of atomics' CPU at 4,096 PEs).
        let mut groups: Vec<((u32, u32, u32), Vec<usize>)> = Vec::new();
        let mut group_of: rustc_hash::FxHashMap<(u32, u32, u32), usize> = Default::default();
        for (k, p) in pes.iter().enumerate() {
            let g = *group_of.entry(key(p)).or_insert_with(|| {
                groups.push((key(p), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(k);
        }
        let sizes = |g: &[usize]| -> Vec<u64> {
            g.iter()
                .map(|&k| shards[k].rows * shards[k].row_bytes)
                .collect()
        };
        let layout = groups.first().map(|(_, g)| sizes(g)).unwrap_or_default();
        if groups.iter().any(|(_, g)| sizes(g) != layout) {
            return Err(SetupError::Tensor(
                name.into(),
                "replicas differ in shard sizes".into(),
            ));
        }
        let mut offsets = Vec::with_capacity(layout.len());
        let mut total = 0u64;
        for bytes in &layout {
            offsets.push(total);
            total += bytes.div_ceil(page) * page;
        }
        let base = VA_BASE
            + self.va.alloc(total.max(page), page).ok_or_else(|| {
                SetupError::Tensor(
                    name.into(),
                    format!("the device VA space has no {total} free bytes"),
                )
            })?;
        let mut addrs = vec![0; shards.len()];
        let mut mappings = Vec::new();
        for (g, members) in &groups {
            // A run per member: `PageRuns::apply` joins those that follow
            // on in VA and PA.
            let mut runs: Vec<PageRun> = Vec::with_capacity(members.len());
            for (i, &k) in members.iter().enumerate() {
                addrs[k] = base + offsets[i];
                runs.push(PageRun {
                    va: addrs[k],
                    pa: shards[k].pa,
                    pages: layout[i].div_ceil(page),
                });
            }
            // The PEs that map this replica, in the machine's order: the
            // PE itself, its cube's (by PE within the cube), or all.
            let (sip, cube) = (g.0, g.1);
            let targets = match replicas {
                Replicas::PerPe => vec![PeCoord { sip, cube, pe: g.2 }],
                Replicas::PerCube => (0..self.machine.topo.counts.pes_per_cube)
                    .map(|pe| PeCoord { sip, cube, pe })
                    .collect(),
                Replicas::One => self.machine.pes().collect(),
            };
            mappings.push(Mapping {
                targets,
                pages: runs.iter().map(|r| r.pages).sum(),
                runs,
                segment: None,
            });
        }
        Ok((addrs, Some((base, total)), mappings))
    }

    /// Return a tensor's device memory to the allocators.
    pub fn free(&mut self, id: u32) -> Result<(), SetupError> {
        let t = &mut self.tensors[id as usize];
        if t.freed {
            return Err(SetupError::Tensor(
                t.meta.name.clone(),
                "freed twice".into(),
            ));
        }
        t.freed = true;
        let segments: Vec<(PeCoord, Segment)> = t
            .mappings
            .iter()
            .filter_map(|m| m.segment.clone().map(|s| (m.targets[0], s)))
            .collect();
        let pas: Vec<u64> = if segments.is_empty() {
            t.meta.shards.iter().map(|s| s.pa).collect()
        } else {
            Vec::new()
        };
        let va = t.va;
        for pa in pas {
            self.release(pa);
        }
        let region = Self::channel_region(self.machine);
        for (pe, seg) in segments {
            let i = self.machine.pe_index(pe);
            self.la[i].free(seg.la_base - LA_BASE);
            match seg.mode {
                MappingMode::NToOne => self.release(seg.agg_pa),
                MappingMode::OneToOne => {
                    for (k, pa) in seg.channel_pas.iter().enumerate() {
                        let offset = Pa::decode(*pa).expect("allocated PA").offset;
                        self.channels[i][k].free(offset - k as u64 * region);
                    }
                }
            }
        }
        if let Some((base, _)) = va {
            self.va.free(base - VA_BASE);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn shards(t: &Tensor) -> Vec<(u64, u64, u64)> {
        t.meta
            .shards
            .iter()
            .map(|s| (s.tensor_offset, s.rows, s.row_bytes))
            .collect()
    }

    #[test]
    fn two_level_sharding_covers_the_tensor_as_the_policy_says() {
        let m = Machine::build(&Topology::load("default").unwrap()); // 4 cubes x 8 PEs
        let mut rt = Runtime::new(&m);
        // 64 x 32 f32, rows over cubes (16 each), columns over PEs (4 each).
        let id = rt
            .tensor(
                "a",
                Dtype::F32,
                [64, 32],
                None,
                Sharding {
                    cube: Policy::RowWise,
                    pe: Policy::ColumnWise,
                },
            )
            .unwrap();
        let t = &rt.tensors[id as usize];
        assert_eq!(t.meta.shards.len(), 32);
        let s = t
            .shard_of(PeCoord {
                sip: 0,
                cube: 2,
                pe: 3,
            })
            .unwrap();
        assert_eq!(
            (s.tensor_offset, s.rows, s.row_bytes, s.tensor_row_stride),
            ((32 * 32 + 12) * 4, 16, 16, 128)
        );
        // Replicated over cubes, rows over PEs: each cube holds all 64 rows.
        let id = rt
            .tensor(
                "b",
                Dtype::F32,
                [64, 32],
                None,
                Sharding {
                    cube: Policy::Replicate,
                    pe: Policy::RowWise,
                },
            )
            .unwrap();
        let t = &rt.tensors[id as usize];
        let cube1: Vec<_> = shards(t).into_iter().skip(8).take(8).collect();
        assert_eq!(
            cube1,
            (0..8).map(|k| (k * 8 * 128, 8, 128)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn uneven_shapes_leave_no_gaps_and_skip_empty_shards() {
        let m = Machine::build(&Topology::load("small").unwrap()); // 4 PEs
        let mut rt = Runtime::new(&m);
        let id = rt
            .tensor("x", Dtype::F16, [3, 5], None, Sharding::ROWS)
            .unwrap();
        let t = &rt.tensors[id as usize];
        let rows: u64 = t.meta.shards.iter().map(|s| s.rows).sum();
        assert_eq!(rows, 3);
        assert_eq!(t.meta.shards.len(), 3, "one PE gets no rows");
    }

    #[test]
    fn freed_memory_is_reused_and_exhaustion_names_the_pe() {
        let m = Machine::build(&Topology::load("small").unwrap());
        let mut rt = Runtime::new(&m);
        let pe = PeCoord {
            sip: 0,
            cube: 0,
            pe: 1,
        };
        let tcm = m.topo.tcm_bytes();
        let a = rt.tcm_alloc(pe, tcm, "all of it").unwrap();
        let e = rt.tcm_alloc(pe, 64, "one more").unwrap_err().to_string();
        assert!(
            e.contains("sip0.cube0.pe1") && e.contains("tcm") && e.contains("one more"),
            "{e}"
        );
        rt.tcm_free(a);
        assert_eq!(rt.tcm_alloc(pe, 64, "again").unwrap(), a);
        let x = rt
            .tensor("x", Dtype::F32, [16, 16], None, Sharding::ROWS)
            .unwrap();
        let first = rt.tensors[x as usize].meta.shards[0].pa;
        rt.free(x).unwrap();
        assert!(rt.free(x).is_err());
        let y = rt
            .tensor("y", Dtype::F32, [16, 16], None, Sharding::ROWS)
            .unwrap();
        assert_eq!(rt.tensors[y as usize].meta.shards[0].pa, first);
    }
}
