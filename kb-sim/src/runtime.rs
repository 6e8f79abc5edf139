//! The host runtime's setup side: per-PE memory allocators, tensors and
//! their sharding over PEs. (Deploy and launch are timed by `engine`.)

use kb_format::pa::Pa;
use kb_format::{Dtype, Shard, Space, TensorMeta};

use crate::machine::{Machine, PeCoord};

/// How a 2-D tensor is spread over the PEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Every PE holds the whole tensor.
    Replicate,
    /// PE k of P holds rows [k*R/P, (k+1)*R/P).
    RowWise,
    /// PE k of P holds columns [k*C/P, (k+1)*C/P), stored contiguously.
    ColumnWise,
}

/// A bump allocator over one PE-local space (free lists come with the
/// address-models issue).
#[derive(Debug, Clone)]
struct Bump {
    next: u64,
    limit: u64,
}

impl Bump {
    fn alloc(&mut self, bytes: u64, align: u64) -> Option<u64> {
        let at = self.next.div_ceil(align) * align;
        let end = at.checked_add(bytes)?;
        (end <= self.limit).then(|| {
            self.next = end;
            at
        })
    }
}

/// Errors while setting up a run.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "{pe}: out of {space} memory allocating {bytes} bytes for {what} ({used} of {limit} bytes in use)"
    )]
    OutOfMemory {
        pe: PeCoord,
        space: &'static str,
        bytes: u64,
        what: String,
        used: u64,
        limit: u64,
    },
    #[error("tensor {0:?}: {1}")]
    Tensor(String, String),
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

/// Setup-time state: allocators and declared tensors.
#[derive(Debug)]
pub struct Runtime<'m> {
    pub machine: &'m Machine,
    hbm: Vec<Bump>,
    tcm: Vec<Bump>,
    pub tensors: Vec<Tensor>,
}

impl<'m> Runtime<'m> {
    pub fn new(machine: &'m Machine) -> Self {
        let n = machine.topo.total_pes() as usize;
        Runtime {
            machine,
            hbm: vec![
                Bump {
                    next: 0,
                    limit: machine.topo.hbm_bytes_per_pe()
                };
                n
            ],
            tcm: vec![
                Bump {
                    next: 0,
                    limit: machine.topo.tcm_bytes()
                };
                n
            ],
            tensors: Vec::new(),
        }
    }

    fn alloc(
        &mut self,
        pe: PeCoord,
        space: Space,
        bytes: u64,
        what: &str,
    ) -> Result<u64, SetupError> {
        let i = self.machine.pe_index(pe);
        let pool = match space {
            Space::Tcm => &mut self.tcm[i],
            _ => &mut self.hbm[i],
        };
        let offset = pool
            .alloc(bytes, 64)
            .ok_or_else(|| SetupError::OutOfMemory {
                pe,
                space: space.name(),
                bytes,
                what: what.to_string(),
                used: pool.next,
                limit: pool.limit,
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

    /// Allocate `bytes` of the PE's TCM; returns its PA.
    pub fn tcm_alloc(&mut self, pe: PeCoord, bytes: u64, what: &str) -> Result<u64, SetupError> {
        self.alloc(pe, Space::Tcm, bytes, what)
    }

    /// Declare a 2-D tensor sharded over every PE, with optional host data.
    pub fn tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: [u64; 2],
        data: Option<Vec<u8>>,
        sharding: Sharding,
    ) -> Result<u32, SetupError> {
        let [rows, cols] = shape;
        let es = dtype.size() as u64;
        let nbytes = rows * cols * es;
        if let Some(d) = &data
            && d.len() as u64 != nbytes
        {
            return Err(SetupError::Tensor(
                name.into(),
                format!("{} bytes of data for {nbytes}", d.len()),
            ));
        }
        let id = self.tensors.len() as u32;
        if id >= kb_format::pa::MAX_HOST_TENSORS {
            return Err(SetupError::Tensor(name.into(), "too many tensors".into()));
        }
        let pes: Vec<PeCoord> = self.machine.pes().collect();
        let p = pes.len() as u64;
        let mut shards = Vec::new();
        let mut shard_pes = Vec::new();
        for (k, &pe) in pes.iter().enumerate() {
            let k = k as u64;
            let (tensor_offset, srows, row_bytes) = match sharding {
                Sharding::Replicate => (0, rows, cols * es),
                Sharding::RowWise => {
                    let (r0, r1) = (k * rows / p, (k + 1) * rows / p);
                    (r0 * cols * es, r1 - r0, cols * es)
                }
                Sharding::ColumnWise => {
                    let (c0, c1) = (k * cols / p, (k + 1) * cols / p);
                    (c0 * es, rows, (c1 - c0) * es)
                }
            };
            if srows == 0 || row_bytes == 0 {
                continue;
            }
            let pa = self.alloc(pe, Space::Hbm, srows * row_bytes, name)?;
            shards.push(Shard {
                tensor_offset,
                rows: srows,
                row_bytes,
                tensor_row_stride: cols * es,
                pa,
            });
            shard_pes.push(pe);
        }
        let meta = TensorMeta {
            name: name.to_string(),
            dtype,
            shape: vec![rows, cols],
            address: shards.first().map_or(0, |s| s.pa),
            host_data: data.is_some(),
            shards,
        };
        self.tensors.push(Tensor {
            id,
            meta,
            data,
            shard_pes,
        });
        Ok(id)
    }
}
