//! Built-in benchmarks: each declares its tensors (inputs with seeded
//! random data), a program per PE, and a verification spec whose reference
//! is an expression over the inputs.

use std::collections::BTreeMap;

use kb_format::{Addr, Dtype, Expr, Space, VerifyOutput, VerifySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::program::{Command, DmaCmd, PeProgram, Script};
use crate::runtime::{Runtime, SetupError, Sharding};

/// A benchmark parameter with its default.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// What a benchmark builds for a run.
#[derive(Debug)]
pub struct Built {
    /// One program per PE, in `Machine::pes()` order.
    pub programs: Vec<Box<dyn PeProgram>>,
    pub verify: VerifySpec,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("unknown benchmark {0:?} (see `kb-sim list`)")]
    Unknown(String),
    #[error("benchmark {bench}: parameter {param}: {message}")]
    Param {
        bench: &'static str,
        param: String,
        message: String,
    },
    #[error(transparent)]
    Setup(#[from] SetupError),
}

/// Resolved parameters: every declared one, user values over defaults.
#[derive(Debug, Clone)]
pub struct BenchParams {
    bench: &'static str,
    values: BTreeMap<String, String>,
}

impl BenchParams {
    pub fn resolve(
        bench: &dyn Benchmark,
        given: &[(String, String)],
    ) -> Result<BenchParams, BenchError> {
        let mut values: BTreeMap<String, String> = bench
            .params()
            .iter()
            .map(|p| (p.name.to_string(), p.default.to_string()))
            .collect();
        for (k, v) in given {
            if !values.contains_key(k) {
                let known: Vec<_> = bench.params().iter().map(|p| p.name).collect();
                return Err(BenchError::Param {
                    bench: bench.name(),
                    param: k.clone(),
                    message: format!("unknown parameter (known: {})", known.join(", ")),
                });
            }
            values.insert(k.clone(), v.clone());
        }
        Ok(BenchParams {
            bench: bench.name(),
            values,
        })
    }

    pub fn pairs(&self) -> Vec<(String, String)> {
        self.values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn err(&self, param: &str, message: String) -> BenchError {
        BenchError::Param {
            bench: self.bench,
            param: param.to_string(),
            message,
        }
    }

    pub fn u64(&self, name: &str, min: u64) -> Result<u64, BenchError> {
        let v = &self.values[name];
        let n: u64 = v
            .parse()
            .map_err(|_| self.err(name, format!("{v:?} is not a whole number")))?;
        if n < min {
            return Err(self.err(name, format!("must be at least {min}, got {n}")));
        }
        Ok(n)
    }

    pub fn dtype(&self, name: &str) -> Result<Dtype, BenchError> {
        let v = &self.values[name];
        Dtype::from_name(v).ok_or_else(|| {
            self.err(
                name,
                format!("{v:?} is not a dtype (f32, f16, bf16, i8, i32, u8)"),
            )
        })
    }
}

/// A built-in benchmark.
pub trait Benchmark: std::fmt::Debug {
    fn name(&self) -> &'static str;
    fn about(&self) -> &'static str;
    fn params(&self) -> &'static [ParamSpec];
    fn build(
        &self,
        p: &BenchParams,
        rng: &mut ChaCha8Rng,
        rt: &mut Runtime,
    ) -> Result<Built, BenchError>;
}

/// Every built-in benchmark.
pub fn all() -> Vec<Box<dyn Benchmark>> {
    vec![Box::new(Copy)]
}

pub fn find(name: &str) -> Result<Box<dyn Benchmark>, BenchError> {
    all()
        .into_iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| BenchError::Unknown(name.to_string()))
}

/// Seeded random tensor data of `n` elements.
pub fn random_data(rng: &mut ChaCha8Rng, dtype: Dtype, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let x: f32 = rng.random_range(-1.0f32..1.0);
        match dtype {
            Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            Dtype::I8 => out.push(rng.random_range(-128i32..128) as i8 as u8),
            Dtype::U8 => out.push(rng.random::<u8>()),
            Dtype::I32 => out.extend_from_slice(&rng.random_range(-1000i32..1000).to_le_bytes()),
        }
    }
    out
}

/// A seeded RNG for a run.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `copy`: y = x. The host deploys x row-wise over the PEs; each PE copies
/// its rows tile by tile HBM -> TCM -> HBM.
#[derive(Debug)]
pub struct Copy;

const COPY_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "rows",
        default: "2048",
        help: "rows of x",
    },
    ParamSpec {
        name: "cols",
        default: "512",
        help: "columns of x",
    },
    ParamSpec {
        name: "tile_rows",
        default: "8",
        help: "rows per DMA tile",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type",
    },
];

impl Benchmark for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn about(&self) -> &'static str {
        "y = x: each PE copies its row shard HBM -> TCM -> HBM, one tile at a time"
    }

    fn params(&self) -> &'static [ParamSpec] {
        COPY_PARAMS
    }

    fn build(
        &self,
        p: &BenchParams,
        rng: &mut ChaCha8Rng,
        rt: &mut Runtime,
    ) -> Result<Built, BenchError> {
        let rows = p.u64("rows", 1)?;
        let cols = p.u64("cols", 1)?;
        let tile_rows = p.u64("tile_rows", 1)?;
        let dtype = p.dtype("dtype")?;
        let n = rows
            .checked_mul(cols)
            .filter(|&n| n <= 1 << 31)
            .ok_or_else(|| {
                p.err(
                    "rows",
                    format!("{rows} x {cols} elements is more than this benchmark supports (2^31)"),
                )
            })?;
        let data = random_data(rng, dtype, n as usize);
        let x = rt.tensor("x", dtype, [rows, cols], Some(data), Sharding::ROWS)?;
        let y = rt.tensor("y", dtype, [rows, cols], None, Sharding::ROWS)?;
        let row_bytes = cols * dtype.size() as u64;
        let mut programs: Vec<Box<dyn PeProgram>> = Vec::new();
        let pes: Vec<_> = rt.machine.pes().collect();
        for pe in pes {
            let (xs, ys) = (
                rt.tensors[x as usize].shard_of(pe).cloned(),
                rt.tensors[y as usize].shard_of(pe).cloned(),
            );
            let mut cmds = Vec::new();
            if let (Some(xs), Some(ys)) = (xs, ys) {
                let tile = tile_rows.min(xs.rows);
                let buf = rt.tcm_alloc(pe, tile * row_bytes, "copy tile buffer")?;
                let mut r = 0;
                while r < xs.rows {
                    let nr = tile.min(xs.rows - r);
                    let bytes = nr * row_bytes;
                    let load = DmaCmd {
                        src: Addr {
                            space: Space::Hbm,
                            addr: xs.pa + r * row_bytes,
                        },
                        dst: Addr {
                            space: Space::Tcm,
                            addr: buf,
                        },
                        rows: 1,
                        row_bytes: bytes,
                        src_stride: bytes,
                        dst_stride: bytes,
                        dtype: Some(dtype),
                    };
                    let store = DmaCmd {
                        src: Addr {
                            space: Space::Tcm,
                            addr: buf,
                        },
                        dst: Addr {
                            space: Space::Hbm,
                            addr: ys.pa + r * row_bytes,
                        },
                        ..load
                    };
                    cmds.push(Command::Dma(load));
                    cmds.push(Command::Dma(store));
                    r += nr;
                }
            }
            programs.push(Box::new(Script::new(cmds)));
        }
        Ok(Built {
            programs,
            verify: VerifySpec {
                outputs: vec![VerifyOutput {
                    tensor: "y".into(),
                    reference: Expr::Tensor("x".into()),
                    tolerance: None,
                }],
            },
        })
    }
}
