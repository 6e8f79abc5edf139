//! Built-in benchmarks: each declares its tensors (inputs with seeded
//! random data), a program per PE, and a verification spec whose reference
//! is an expression over the inputs.

use std::collections::BTreeMap;

use kb_format::{Dtype, Expr, VerifyOutput, VerifySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::kernel::{Block, KernelArgs, KernelFn, TensorArg, Tl};
use crate::program::PeProgram;
use crate::runtime::{Runtime, SetupError, Sharding};

/// A benchmark parameter with its default.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// What runs on the PEs.
pub enum Programs {
    /// One hand-written program per PE, in `Machine::pes()` order.
    Scripts(Vec<Box<dyn PeProgram>>),
    /// One kernel launched on every PE (program id = PE index).
    Kernel {
        name: &'static str,
        kernel: KernelFn,
        args: KernelArgs,
    },
}

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Programs::Scripts(p) => write!(f, "Scripts({})", p.len()),
            Programs::Kernel { name, .. } => write!(f, "Kernel({name})"),
        }
    }
}

/// What a benchmark builds for a run.
#[derive(Debug)]
pub struct Built {
    pub programs: Programs,
    pub verify: VerifySpec,
}

/// The launch arguments for tensors `ids` of the runtime.
pub fn kernel_args(rt: &Runtime, ids: &[u32]) -> KernelArgs {
    KernelArgs {
        tensors: ids
            .iter()
            .map(|&id| {
                let t = &rt.tensors[id as usize];
                TensorArg {
                    name: t.meta.name.clone(),
                    dtype: t.meta.dtype,
                    shape: [t.meta.shape[0], t.meta.shape[1]],
                    shards: t
                        .shard_pes
                        .iter()
                        .copied()
                        .zip(t.meta.shards.iter().cloned())
                        .collect(),
                }
            })
            .collect(),
        scalars: Vec::new(),
    }
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

/// `copy`: y = x. The host deploys x row-wise over the PEs; each PE's
/// kernel loads its rows tile by tile into TCM and stores them to y (the
/// store of one tile overlaps the load of the next).
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
        help: "rows per tile",
    },
    ParamSpec {
        name: "dtype",
        default: "f32",
        help: "element type",
    },
];

fn copy_kernel(tl: &mut Tl<'_>, args: &KernelArgs) {
    let (x, y) = (args.tensor("x"), args.tensor("y"));
    let tile_rows = args.scalar("tile_rows");
    let (Some(xs), Some(ys)) = (x.shard(tl.pe()), y.shard(tl.pe())) else {
        return;
    };
    let cols = (xs.row_bytes / x.elem_bytes()) as u32;
    let mut r = 0;
    while r < xs.rows {
        let n = tile_rows.min(xs.rows - r) as u32;
        let tile = tl.load(Block::in_shard(x, xs, r, 0, n, cols));
        tl.store(Block::in_shard(y, ys, r, 0, n, cols), &tile);
        r += n as u64;
    }
}

impl Benchmark for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn about(&self) -> &'static str {
        "y = x: each PE copies its row shard HBM -> TCM -> HBM, tile by tile"
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
        let mut args = kernel_args(rt, &[x, y]);
        args.scalars.push(("tile_rows".into(), tile_rows));
        Ok(Built {
            programs: Programs::Kernel {
                name: "copy",
                kernel: copy_kernel,
                args,
            },
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
