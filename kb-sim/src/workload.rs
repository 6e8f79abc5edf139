//! Workloads: host programs over the public kernel API.
//!
//! A [`Workload`] declares its parameters and, given their values, builds a
//! [`Program`]: tensors (seeded random, zeros, constants, or data from a
//! `.npy` file through `kb-sim --input`), then steps (launch a kernel on all
//! PEs or a subset with a 1-D, 2-D or 3-D grid, wait for a launch, free a
//! tensor) and the verification spec (a reference [`Expr`] per output).
//! Tensors persist across launches: a later launch reads what an earlier
//! one wrote. The built-in workloads (the `kb-workloads` crate) use nothing
//! but this module and [`crate::kernel`]; [`crate::cli::main`] gives any
//! set of workloads the full `kb-sim` command line.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use std::collections::BTreeMap;

use kb_format::{Dtype, Expr, Tolerance, VerifyOutput, VerifySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::{LaunchBody, LaunchSpec, Step};
use crate::kernel::{Executor, Grid, KernelArgs, KernelFn, TensorArg};
use crate::machine::{Machine, PeCoord};
use crate::runtime::{Runtime, SetupError};

pub use crate::runtime::{Memory, Placement, Policy, Sharding};
pub use crate::shape::{MAX_RANK, Shape};

/// A workload parameter with its default, as `kb-sim list` shows it.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    /// The name `-p NAME=VALUE` sets.
    pub name: &'static str,
    /// The value used when `-p` does not set it.
    pub default: &'static str,
    /// One line for `kb-sim list`.
    pub help: &'static str,
}

/// Whether a workload states the reference its outputs are verified
/// against (`kb-sim list` says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// The trace carries a reference expression for every output.
    BuiltIn,
    /// The reference cannot be written in the trace's expression language:
    /// verify with `kb-replay --expect NAME=FILE.npy`.
    Expect,
}

/// A workload: a named host program with parameters.
pub trait Workload: std::fmt::Debug {
    /// The name `-b/--bench` selects it by.
    fn name(&self) -> &str;
    /// One line for `kb-sim list`.
    fn about(&self) -> &str;
    /// Its parameters and their defaults.
    fn params(&self) -> &[ParamSpec];
    /// Whether `build` states a reference for its outputs.
    fn reference(&self) -> Reference {
        Reference::BuiltIn
    }
    /// Declare tensors, steps and the verification spec.
    fn build(&self, p: &Params, prog: &mut Program<'_>) -> Result<(), WorkloadError>;
}

/// Errors while building a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// No workload of that name.
    #[error("unknown workload {0:?} (see `kb-sim list`)")]
    Unknown(String),
    /// A parameter is unknown, malformed or out of range.
    #[error("workload {workload}: parameter {param}: {message}")]
    Param {
        /// The workload's name.
        workload: String,
        /// The parameter's name.
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// An `--input` file does not fit the tensor it names.
    #[error("--input {name}: {message}")]
    Input {
        /// The tensor's name.
        name: String,
        /// What is wrong (file, dtype, shape).
        message: String,
    },
    /// The tensors' host data alone would pass `--max-memory`.
    #[error(
        "workload {workload}: tensor {tensor} would bring the run's host data to {needed}, more than {limit}"
    )]
    Memory {
        /// The workload's name.
        workload: String,
        /// The tensor being declared.
        tensor: String,
        /// Host data with it.
        needed: String,
        /// The limit and where it comes from.
        limit: String,
    },
    /// The host program is inconsistent (an unknown tensor, a bad step).
    #[error("workload {workload}: {message}")]
    Program {
        /// The workload's name.
        workload: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor could not be placed (out of memory, a layout the
    /// address model cannot hold).
    #[error(transparent)]
    Setup(#[from] SetupError),
}

/// Resolved parameters: every declared one, user values over defaults.
#[derive(Debug, Clone)]
pub struct Params {
    workload: String,
    values: BTreeMap<String, String>,
}

impl Params {
    /// Resolve `given` KEY=VALUE pairs against `w`'s declared parameters.
    pub fn resolve(w: &dyn Workload, given: &[(String, String)]) -> Result<Params, WorkloadError> {
        let mut values: BTreeMap<String, String> = w
            .params()
            .iter()
            .map(|p| (p.name.to_string(), p.default.to_string()))
            .collect();
        for (i, (k, v)) in given.iter().enumerate() {
            if let Some((_, first)) = given[..i].iter().find(|(k0, _)| k0 == k) {
                return Err(WorkloadError::Param {
                    workload: w.name().into(),
                    param: k.clone(),
                    message: format!("given twice ({k}={first}, then {k}={v}): give it once"),
                });
            }
            if !values.contains_key(k) {
                let known: Vec<_> = w.params().iter().map(|p| p.name).collect();
                return Err(WorkloadError::Param {
                    workload: w.name().into(),
                    param: k.clone(),
                    message: format!("unknown parameter (known: {})", known.join(", ")),
                });
            }
            values.insert(k.clone(), v.clone());
        }
        Ok(Params {
            workload: w.name().into(),
            values,
        })
    }

    /// Every parameter and its value, by name.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// An error about parameter `param`.
    pub fn err(&self, param: &str, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Param {
            workload: self.workload.clone(),
            param: param.to_string(),
            message: message.into(),
        }
    }

    /// The raw text of parameter `name` (declared, so always present).
    /// Panics, at the caller's line and listing the declared names, if
    /// the workload does not declare `name` (a bug in its `build`).
    #[track_caller]
    pub fn str(&self, name: &str) -> &str {
        match self.values.get(name) {
            Some(v) => v,
            None => {
                let declared: Vec<&str> = self.values.keys().map(String::as_str).collect();
                panic!(
                    "parameter {name:?} is not declared by workload {}; it declares: {} (Workload::params)",
                    self.workload,
                    if declared.is_empty() {
                        "none".to_string()
                    } else {
                        declared.join(", ")
                    }
                )
            }
        }
    }

    /// A whole number of at least `min`, at most 2^32 (shapes and tile
    /// sizes are u32 in the kernel API; larger values would truncate).
    #[track_caller]
    pub fn u64(&self, name: &str, min: u64) -> Result<u64, WorkloadError> {
        let v = self.str(name);
        let n: u64 = v
            .parse()
            .map_err(|_| self.err(name, format!("{v:?} is not a whole number")))?;
        if n < min {
            return Err(self.err(name, format!("must be at least {min}, got {n}")));
        }
        if n > u32::MAX as u64 {
            return Err(self.err(name, format!("must be at most {}, got {n}", u32::MAX)));
        }
        Ok(n)
    }

    /// A signed whole number.
    #[track_caller]
    pub fn i64(&self, name: &str) -> Result<i64, WorkloadError> {
        let v = self.str(name);
        v.parse()
            .map_err(|_| self.err(name, format!("{v:?} is not a whole number")))
    }

    /// A finite number (`1e-5`, `0.5`, `-3`).
    #[track_caller]
    pub fn f64(&self, name: &str) -> Result<f64, WorkloadError> {
        let v = self.str(name);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(self.err(name, format!("{v:?} is not a finite number"))),
        }
    }

    /// A dtype name (f32, f16, bf16, i8, i32, u8).
    #[track_caller]
    pub fn dtype(&self, name: &str) -> Result<Dtype, WorkloadError> {
        let v = self.str(name);
        Dtype::from_name(v).ok_or_else(|| {
            self.err(
                name,
                format!("{v:?} is not a dtype (f32, f16, bf16, i8, i32, u8)"),
            )
        })
    }
}

/// A tensor declared by a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TensorId(pub u32);

/// A launch of a program, for [`Program::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchId(usize);

/// What a collective launch moves, so kb-sim can give its bus bandwidth
/// (NCCL's definition: `bytes / time x bus_factor`, the bandwidth each
/// member's links would need under a ring, comparable across group sizes
/// and algorithms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Payload {
    /// The collective's size: each member's buffer (all-reduce,
    /// broadcast), whole input (reduce-scatter) or whole output
    /// (all-gather), in bytes.
    pub bytes: u64,
    /// `2 (P-1)/P` for all-reduce, `(P-1)/P` for reduce-scatter and
    /// all-gather, 1 for broadcast.
    pub bus_factor: f64,
}

impl Payload {
    /// An all-reduce of `bytes` per member over `p` members.
    pub fn all_reduce(bytes: u64, p: usize) -> Payload {
        Payload {
            bytes,
            bus_factor: 2.0 * (p as f64 - 1.0) / p as f64,
        }
    }

    /// A reduce-scatter of a `bytes` input, or an all-gather of a `bytes`
    /// output, over `p` members.
    pub fn scatter_or_gather(bytes: u64, p: usize) -> Payload {
        Payload {
            bytes,
            bus_factor: (p as f64 - 1.0) / p as f64,
        }
    }

    /// A broadcast of `bytes`.
    pub fn broadcast(bytes: u64) -> Payload {
        Payload {
            bytes,
            bus_factor: 1.0,
        }
    }
}

/// A host program being built: tensors, steps and the verification spec.
#[derive(Debug)]
pub struct Program<'m> {
    workload: String,
    rt: Runtime<'m>,
    rng: ChaCha8Rng,
    executor: Executor,
    inputs: BTreeMap<String, std::path::PathBuf>,
    used_inputs: Vec<String>,
    steps: Vec<Step>,
    launches: usize,
    /// Collective launches' payloads, by launch.
    payloads: Vec<(usize, Payload)>,
    verify: VerifySpec,
    /// `--max-memory`, for host data; and the host data declared so far.
    host_limit: Option<crate::memory::Budget>,
    host_bytes: u64,
}

/// What a built program hands the engine.
#[derive(Debug)]
pub struct Built<'m> {
    /// The declared tensors and their layouts.
    pub rt: Runtime<'m>,
    /// The host program: launches, waits and frees in order.
    pub steps: Vec<Step>,
    /// References the outputs are verified against.
    pub verify: VerifySpec,
    /// Per launch: what it moves, if it is a collective.
    pub payloads: Vec<Option<Payload>>,
}

impl<'m> Program<'m> {
    /// An empty program on `machine`: random data from `seed`, kernels run
    /// by `executor`, `inputs` replacing declared tensors' data by name.
    pub fn new(
        workload: &str,
        machine: &'m Machine,
        seed: u64,
        executor: Executor,
        inputs: BTreeMap<String, std::path::PathBuf>,
    ) -> Self {
        Program {
            workload: workload.into(),
            rt: Runtime::new(machine),
            rng: ChaCha8Rng::seed_from_u64(seed),
            executor,
            inputs,
            used_inputs: Vec::new(),
            steps: Vec::new(),
            launches: 0,
            payloads: Vec::new(),
            verify: VerifySpec::default(),
            host_limit: None,
            host_bytes: 0,
        }
    }

    /// Refuse tensors whose host data would bring the total past `limit`
    /// (`--max-memory`, or the tightest limit the process runs under),
    /// before allocating it.
    pub fn limit_memory(&mut self, limit: Option<crate::memory::Budget>) {
        self.host_limit = limit;
    }

    /// Count `n` elements of `dtype` of host data for tensor `name`.
    fn host_data(&mut self, name: &str, n: usize, dtype: Dtype) -> Result<(), WorkloadError> {
        let needed = self
            .host_bytes
            .saturating_add((n as u64).saturating_mul(dtype.size() as u64));
        if let Some(limit) = &self.host_limit
            && needed > limit.bytes
        {
            return Err(WorkloadError::Memory {
                workload: self.workload.clone(),
                tensor: name.into(),
                needed: crate::memory::human(needed),
                limit: limit.describe(),
            });
        }
        self.host_bytes = needed;
        Ok(())
    }

    /// The machine the program runs on.
    pub fn machine(&self) -> &'m Machine {
        self.rt.machine
    }

    /// Every PE of the machine, in launch order (SIP, cube, PE).
    pub fn pes(&self) -> Vec<PeCoord> {
        self.rt.machine.pes().collect()
    }

    /// Each PE's part `[r0, r1, c0, c1]` of a `shape` tensor under
    /// `sharding`, in [`Program::pes`] order, PEs left empty included (to
    /// choose a layout before declaring the tensor). The parts are of the
    /// tensor's 2-D view `[product of the leading dims, last dim]`
    /// ([`Shape::matrix`]).
    pub fn parts(&self, shape: impl Into<Shape>, sharding: Sharding) -> Vec<(PeCoord, [u64; 4])> {
        let shape = shape.into().matrix();
        let c = self.rt.machine.topo.counts;
        let cubes = (c.sips * c.cubes_per_sip) as u64;
        self.rt
            .machine
            .pes()
            .map(|pe| {
                let cube = (pe.sip * c.cubes_per_sip + pe.cube) as u64;
                let part =
                    sharding.part(shape, (cube, cubes), (pe.pe as u64, c.pes_per_cube as u64));
                (pe, part)
            })
            .collect()
    }

    /// Whether the machine's address model can hold a `shape` tensor
    /// under `sharding` (LA 1:1 needs each PE's part contiguous in the
    /// tensor, so no column splits of tensors with several rows).
    pub fn can_shard(&self, shape: impl Into<Shape>, sharding: Sharding) -> bool {
        let shape = shape.into().matrix();
        self.parts(shape, sharding)
            .iter()
            .all(|&(_, part)| self.rt.can_hold(part, shape[1]))
    }

    /// The run's seeded random generator (for workload-specific data).
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    fn error(&self, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Program {
            workload: self.workload.clone(),
            message: message.into(),
        }
    }

    /// Elements of a `shape` tensor, bounded so host buffers stay sane
    /// (2^31 elements); errs naming the tensor on a shape of no dims, more
    /// than [`MAX_RANK`], a zero dim, or too many elements.
    fn elements(&self, name: &str, shape: &Shape) -> Result<usize, WorkloadError> {
        shape
            .check()
            .map_err(|e| self.error(format!("tensor {name}: {e}")))?;
        let n = shape.elements();
        if n > 1 << 31 {
            return Err(self.error(format!(
                "tensor {name}: {shape} elements is more than a workload supports (2^31)"
            )));
        }
        Ok(n as usize)
    }

    /// Declare a tensor with host data `data` (or none: device memory that
    /// reads as zero), unless `--input` gives its data.
    fn declare(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: Shape,
        data: Option<Vec<u8>>,
        placement: Placement,
    ) -> Result<TensorId, WorkloadError> {
        let data = match self.inputs.get(name) {
            Some(path) => {
                let bytes = crate::input::read(path, dtype, shape.dims()).map_err(|message| {
                    WorkloadError::Input {
                        name: name.into(),
                        message: format!("{message} (workload {})", self.workload),
                    }
                })?;
                self.used_inputs.push(name.into());
                Some(bytes)
            }
            None => data,
        };
        let id = self.rt.tensor(name, dtype, shape, data, placement)?;
        Ok(TensorId(id))
    }

    /// A tensor of seeded random values: floats uniform in [-1, 1), i8 in
    /// [-64, 64), u8 in [0, 128), i32 in [-1000, 1000) (so sums of two
    /// inputs still fit their type).
    pub fn random(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: impl Into<Shape>,
        placement: impl Into<Placement>,
    ) -> Result<TensorId, WorkloadError> {
        let shape = shape.into();
        let n = self.elements(name, &shape)?;
        self.host_data(name, n, dtype)?;
        let data = random_data(&mut self.rng, dtype, n);
        self.declare(name, dtype, shape, Some(data), placement.into())
    }

    /// A tensor with no host data: device memory that reads as zero until
    /// a kernel writes it (outputs and intermediates).
    pub fn zeros(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: impl Into<Shape>,
        placement: impl Into<Placement>,
    ) -> Result<TensorId, WorkloadError> {
        let shape = shape.into();
        self.elements(name, &shape)?;
        self.declare(name, dtype, shape, None, placement.into())
    }

    /// A tensor whose every element is `value` (rounded to the dtype).
    pub fn full(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: impl Into<Shape>,
        value: f64,
        placement: impl Into<Placement>,
    ) -> Result<TensorId, WorkloadError> {
        let shape = shape.into();
        let n = self.elements(name, &shape)?;
        self.host_data(name, n, dtype)?;
        let data = crate::kernel::encode(dtype, value).repeat(n);
        self.declare(name, dtype, shape, Some(data), placement.into())
    }

    /// A tensor with the given host bytes (row-major, little-endian).
    pub fn data(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: impl Into<Shape>,
        bytes: Vec<u8>,
        placement: impl Into<Placement>,
    ) -> Result<TensorId, WorkloadError> {
        let shape = shape.into();
        let n = self.elements(name, &shape)?;
        if bytes.len() != n * dtype.size() {
            return Err(self.error(format!(
                "tensor {name}: {} bytes of data for {n} {dtype} elements",
                bytes.len()
            )));
        }
        self.host_data(name, n, dtype)?;
        self.declare(name, dtype, shape, Some(bytes), placement.into())
    }

    /// A tensor as kernels see it (shape, dtype, each PE's shard).
    pub fn arg(&self, t: TensorId) -> TensorArg {
        self.rt.kernel_arg(t.0)
    }

    /// Launch arguments holding tensors `ts` (add scalars with
    /// [`KernelArgs::scalar`] and [`KernelArgs::float`]).
    pub fn args(&self, ts: &[TensorId]) -> KernelArgs {
        let ids: Vec<u32> = ts.iter().map(|t| t.0).collect();
        self.rt.kernel_args(&ids)
    }

    /// Launch arguments holding tensors under the names the kernel uses
    /// (`prog.bind(&[("a", x), ("b", w)])`), so one kernel serves several
    /// launches over different tensors.
    pub fn bind(&self, ts: &[(&str, TensorId)]) -> KernelArgs {
        let mut args = KernelArgs::default();
        for &(name, t) in ts {
            let mut arg = self.arg(t);
            arg.name = name.into();
            args.tensors.push(arg);
        }
        args
    }

    /// Launch `kernel` on every PE, one program per PE (program id =
    /// the PE's index). The host goes on at once; see [`Program::wait`].
    pub fn launch(&mut self, name: &str, kernel: KernelFn, args: KernelArgs) -> LaunchId {
        let pes = self.pes();
        let grid = Grid::from(pes.len() as u32);
        self.push_launch(name, kernel, args, grid, pes)
    }

    /// Launch `kernel` over a grid of `x x y x z` programs on `pes`:
    /// `grid` is `[x, y, z]`, `[x, y]` (z = 1) or `x` (see [`Grid`]). In
    /// order, program k = `i0 + i1 * x + i2 * x * y` runs on
    /// `pes[k % pes.len()]`, each PE running its programs in turn. A grid
    /// with an empty axis, or more than 2^64 programs, is an error.
    pub fn launch_grid(
        &mut self,
        name: &str,
        kernel: KernelFn,
        args: KernelArgs,
        grid: impl Into<Grid>,
        pes: &[PeCoord],
    ) -> Result<LaunchId, WorkloadError> {
        let grid = grid.into();
        if let Some(axis) = grid.empty_axis() {
            return Err(self.error(format!(
                "launch {name}: empty grid {grid} (axis {axis} has no programs)"
            )));
        }
        if grid.programs().is_none() {
            return Err(self.error(format!(
                "launch {name}: grid {grid} has more than 2^64 programs"
            )));
        }
        if pes.is_empty() {
            return Err(self.error(format!("launch {name}: no PEs")));
        }
        let c = self.rt.machine.topo.counts;
        let mut seen = std::collections::BTreeSet::new();
        for p in pes {
            if p.sip >= c.sips || p.cube >= c.cubes_per_sip || p.pe >= c.pes_per_cube {
                return Err(self.error(format!("launch {name}: {p} is not a PE of this machine")));
            }
            if !seen.insert(*p) {
                return Err(self.error(format!("launch {name}: {p} is listed twice")));
            }
        }
        Ok(self.push_launch(name, kernel, args, grid, pes.to_vec()))
    }

    /// Declare `launch` a collective moving `payload`: kb-sim's summary
    /// then gives its bus bandwidth beside its fabric bound. Declaring a
    /// launch twice keeps the last.
    pub fn payload(&mut self, launch: LaunchId, payload: Payload) {
        self.payloads.retain(|&(l, _)| l != launch.0);
        self.payloads.push((launch.0, payload));
    }

    fn push_launch(
        &mut self,
        name: &str,
        kernel: KernelFn,
        args: KernelArgs,
        grid: Grid,
        pes: Vec<PeCoord>,
    ) -> LaunchId {
        self.steps.push(Step::Launch(LaunchSpec {
            name: name.into(),
            pes,
            grid,
            body: LaunchBody::Kernel {
                kernel,
                args: std::sync::Arc::new(args),
                executor: self.executor,
            },
        }));
        self.launches += 1;
        LaunchId(self.launches - 1)
    }

    /// Block the host until `launch` has completed (its kernels finished
    /// and the host heard so through the fabric).
    pub fn wait(&mut self, launch: LaunchId) {
        self.steps.push(Step::Wait(launch.0));
    }

    /// Free a tensor: the host waits for every launch so far, then unmaps
    /// it through the fabric (docs/design.md A2). Its data stays readable by
    /// replay and verification. Every tensor is freed at the end anyway.
    pub fn free(&mut self, t: TensorId) {
        self.steps.push(Step::Free(t.0));
    }

    /// Verify `output` against `reference` (an expression over tensors
    /// with host data), with the dtype's default tolerance or `tolerance`.
    pub fn verify(&mut self, output: TensorId, reference: Expr, tolerance: Option<Tolerance>) {
        let tensor = self.rt.tensors[output.0 as usize].meta.name.clone();
        self.verify.outputs.push(VerifyOutput {
            tensor,
            reference,
            tolerance,
        });
    }

    /// Check every reference of the verify spec against the declared
    /// tensors before anything runs: each name it reads is a tensor with
    /// host data, its operators' shapes fit, and its result has the
    /// output's shape (or, both vectors, as many elements), so a bad
    /// reference fails the build (exit 2, naming the name or the shapes)
    /// rather than kb-replay after the whole simulation.
    fn check_references(&self) -> Result<(), WorkloadError> {
        let names = || -> String {
            let n: Vec<&str> = self
                .rt
                .tensors
                .iter()
                .map(|t| t.meta.name.as_str())
                .collect();
            n.join(", ")
        };
        let shape = |name: &str| -> Result<(u64, u64), String> {
            let t = self
                .rt
                .tensors
                .iter()
                .find(|t| t.meta.name == name)
                .ok_or_else(|| format!("no tensor is named {name:?} (the tensors: {})", names()))?;
            if !t.meta.host_data {
                return Err(format!(
                    "tensor {name:?} has no host data (declared with zeros), so a reference \
                     cannot read it"
                ));
            }
            let [r, c] = Shape::from(&t.meta.shape).matrix();
            Ok((r, c))
        };
        for o in &self.verify.outputs {
            let fail =
                |m: String| self.error(format!("the reference of output {:?}: {m}", o.tensor));
            let got = o.reference.shape(&shape).map_err(fail)?;
            let Some(t) = self.rt.tensors.iter().find(|t| t.meta.name == o.tensor) else {
                continue;
            };
            let [r, c] = Shape::from(&t.meta.shape).matrix();
            let want = (r, c);
            let vectors = (got.0 == 1 || got.1 == 1)
                && (want.0 == 1 || want.1 == 1)
                && got.0.saturating_mul(got.1) == want.0 * want.1;
            if got != want && !vectors {
                return Err(fail(format!(
                    "it is {} x {}, but the output is {} x {}",
                    got.0, got.1, want.0, want.1
                )));
            }
        }
        Ok(())
    }

    /// The finished program; errs if an `--input` named no tensor, or an
    /// output the workload computes and verifies (its data would be
    /// overwritten, and the check would compare against inputs it never
    /// read).
    pub fn finish(self) -> Result<Built<'m>, WorkloadError> {
        if let Some(out) = self
            .verify
            .outputs
            .iter()
            .find(|o| self.used_inputs.contains(&o.tensor))
        {
            let inputs: Vec<_> = self
                .rt
                .tensors
                .iter()
                .filter(|t| {
                    t.meta.host_data && !self.verify.outputs.iter().any(|o| o.tensor == t.meta.name)
                })
                .map(|t| t.meta.name.as_str())
                .collect();
            return Err(WorkloadError::Input {
                name: out.tensor.clone(),
                message: format!(
                    "{:?} is an output workload {} computes and verifies, not an input (its inputs: {})",
                    out.tensor,
                    self.workload,
                    inputs.join(", ")
                ),
            });
        }
        if let Some(name) = self.inputs.keys().find(|n| !self.used_inputs.contains(n)) {
            let names: Vec<_> = self
                .rt
                .tensors
                .iter()
                .map(|t| t.meta.name.as_str())
                .collect();
            return Err(WorkloadError::Input {
                name: name.clone(),
                message: format!(
                    "workload {} has no tensor {name:?} (its tensors: {})",
                    self.workload,
                    names.join(", ")
                ),
            });
        }
        self.check_references()?;
        let mut payloads = vec![None; self.launches];
        for (l, p) in self.payloads {
            payloads[l] = Some(p);
        }
        Ok(Built {
            rt: self.rt,
            steps: self.steps,
            verify: self.verify,
            payloads,
        })
    }
}

/// Seeded random tensor data of `n` elements (see [`Program::random`]).
pub fn random_data(rng: &mut ChaCha8Rng, dtype: Dtype, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let x: f32 = rng.random_range(-1.0f32..1.0);
        match dtype {
            Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            // Half the type's range, so sums of two inputs still fit.
            Dtype::I8 => out.push(rng.random_range(-64i32..64) as i8 as u8),
            Dtype::U8 => out.push(rng.random_range(0..128u8)),
            Dtype::I32 => out.extend_from_slice(&rng.random_range(-1000i32..1000).to_le_bytes()),
        }
    }
    out
}
