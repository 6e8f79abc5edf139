//! Topologies: the machine description in YAML (counts, per-component
//! attributes with units in their names), parsed strictly: unknown fields
//! and bad values are errors naming the file, line and field.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Topologies shipped with kb-sim, embedded in the binary.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("small", include_str!("../../topologies/small.yaml")),
    ("default", include_str!("../../topologies/default.yaml")),
    ("large", include_str!("../../topologies/large.yaml")),
    ("pa", include_str!("../../topologies/pa.yaml")),
    ("va", include_str!("../../topologies/va.yaml")),
    ("la-1to1", include_str!("../../topologies/la-1to1.yaml")),
    ("la-nto1", include_str!("../../topologies/la-nto1.yaml")),
];

/// A strictly positive, finite number (bandwidths, sizes, rates);
/// checked after parsing by `check_units`, which knows the field's line.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Positive(pub f64);

/// A non-negative, finite number (latencies, overheads); checked after
/// parsing like [`Positive`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NonNegative(pub f64);

/// A link class: latency and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub latency_ns: NonNegative,
    pub bw_gbs: Positive,
}

/// Address model (docs/design.md A1-A4): what addresses kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressModel {
    /// Physical addresses, no translation.
    Pa,
    /// Virtual addresses: one contiguous VA range per tensor, translated
    /// page by page by each PE's PE_MMU (mappings installed through the
    /// fabric at deploy); an unmapped address falls back to PA.
    Va,
    /// Logical addresses, PE-local, resolved by the BAAW segment table in
    /// PE_DMA onto the PE's HBM pseudo channels (`memory_map`).
    La,
}

impl AddressModel {
    pub fn name(self) -> &'static str {
        match self {
            AddressModel::Pa => "pa",
            AddressModel::Va => "va",
            AddressModel::La => "la",
        }
    }
}

/// How an LA access reaches the PE's HBM pseudo channels (docs/design.md A4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingMode {
    /// One request per channel, each through its own `ch_rN` router.
    OneToOne,
    /// One aggregated request through `agg_router` (N x channel bandwidth).
    NToOne,
}

/// The LA model's channel mapping (docs/design.md A4).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryMap {
    pub hbm_mapping_mode: MappingMode,
    /// Pseudo channels per cube (must equal `hbm.pseudo_channels`).
    pub hbm_pseudo_channels: u32,
    /// Channels owned by each PE (at most pseudo channels / PEs per cube).
    pub hbm_channels_per_pe: u32,
    pub hbm_channel_bw_gbs: Positive,
}

/// PE_MMU attributes (VA model).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmuSpec {
    /// Translation page size (a power of two, at least 64).
    #[serde(default = "MmuSpec::default_page")]
    pub page_bytes: u64,
    /// Added to a DMA once per translated side (a TLB access).
    #[serde(default = "MmuSpec::default_tlb")]
    pub tlb_overhead_ns: NonNegative,
}

impl MmuSpec {
    fn default_page() -> u64 {
        4096
    }

    fn default_tlb() -> NonNegative {
        NonNegative(2.0)
    }
}

impl Default for MmuSpec {
    fn default() -> Self {
        MmuSpec {
            page_bytes: Self::default_page(),
            tlb_overhead_ns: Self::default_tlb(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    pub sips: u32,
    pub cubes_per_sip: u32,
    pub pes_per_cube: u32,
}

/// Links of the fabric, by class.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    /// host <-> each SIP's pcie_ep.
    pub host_pcie: LinkSpec,
    /// pcie_ep <-> io_cpu.
    pub pcie_io: LinkSpec,
    /// io_cpu <-> each cube's m_cpu (the deploy and launch fan-out).
    pub io_mcpu: LinkSpec,
    /// m_cpu <-> noc.
    pub mcpu_noc: LinkSpec,
    /// noc <-> each PE's pe_dma.
    pub noc_pe: LinkSpec,
    /// noc <-> hbm_router, and hbm_router <-> hbm_ctrl.
    pub noc_hbm: LinkSpec,
    /// noc <-> sram.
    pub noc_sram: LinkSpec,
    /// pe_cpu <-> pe_dma / pe_gemm / pe_math (command issue).
    pub pe_internal: LinkSpec,
    /// pe_dma / pe_gemm / pe_math <-> tcm.
    pub tcm_port: LinkSpec,
    /// noc <-> noc of the next cube in the SIP (a ring).
    pub cube_link: LinkSpec,
    /// io_cpu <-> io_cpu of the next SIP (a ring).
    pub sip_link: LinkSpec,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    /// Per-hop forwarding overhead before the first flit leaves a node
    /// (cut-through routing).
    pub first_flit_ns: NonNegative,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HbmSpec {
    /// HBM capacity per cube.
    pub size_gib: Positive,
    pub pseudo_channels: u32,
    pub channel_bw_gbs: Positive,
    /// Access latency of a pseudo channel, added to each request's service.
    pub latency_ns: NonNegative,
    /// Bytes of contiguous address per pseudo channel before the next one.
    pub interleave_bytes: u32,
    /// PA and VA models: rotate each round of channels by a hash of the
    /// higher address bits, so PE partitions (which all start at a
    /// multiple of the channel count) spread over the channels
    /// (`kb_format::pa::hbm_channel`); false is plain interleaving. The LA
    /// model pins accesses to channels explicitly.
    #[serde(default = "yes")]
    pub hash_channels: bool,
}

fn yes() -> bool {
    true
}

fn default_burst() -> u32 {
    4096
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DmaSpec {
    /// Independent DMA engines per PE (commands in service at once).
    pub engines: u32,
    /// Per-command setup time before the first request leaves.
    pub setup_ns: NonNegative,
    /// Bytes a transfer streams in: each stage (HBM service, links, the
    /// destination's write) passes a burst on while later bursts come, so
    /// a large transfer runs at its narrowest stage's bandwidth; a transfer
    /// of at most one burst is served whole, stage after stage. Compute
    /// ops' operands and results cross the TCM port in the same bursts.
    #[serde(default = "default_burst")]
    pub burst_bytes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcmSpec {
    pub size_kib: Positive,
    pub latency_ns: NonNegative,
    pub bw_gbs: Positive,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SramSpec {
    pub size_kib: Positive,
    pub latency_ns: NonNegative,
}

/// Peak throughput per dtype, in TFLOP/s (GEMM) or GFLOP/s (vector).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerDtype {
    pub f32: Positive,
    pub f16: Positive,
    pub bf16: Positive,
    pub i8: Positive,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmSpec {
    pub tflops: PerDtype,
    pub setup_ns: NonNegative,
    /// The unit's accumulator buffer: a dot whose result fits stays in the
    /// unit, and the next dot on the unit that accumulates into it reads it
    /// there instead of through the TCM port; it is written back to TCM only
    /// when another op needs it or the buffer needs room. 0: every
    /// accumulator goes through the TCM port on each dot (the model before
    /// the buffer).
    #[serde(default = "default_acc_kib")]
    pub acc_kib: u32,
}

/// Room for one 256 x 256 f32 accumulator tile.
pub const DEFAULT_ACC_KIB: u32 = 256;

fn default_acc_kib() -> u32 {
    DEFAULT_ACC_KIB
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathSpec {
    pub gflops: PerDtype,
    pub setup_ns: NonNegative,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSpec {
    /// Time io_cpu, m_cpu and pe_cpu take to handle one control message.
    pub handle_ns: NonNegative,
}

/// A whole machine description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    pub address_model: AddressModel,
    pub counts: Counts,
    pub fabric: FabricSpec,
    pub links: Links,
    pub hbm: HbmSpec,
    pub pe_dma: DmaSpec,
    pub tcm: TcmSpec,
    pub sram: SramSpec,
    pub pe_gemm: GemmSpec,
    pub pe_math: MathSpec,
    pub cpu: CpuSpec,
    /// PE_MMU attributes (used by the VA model; defaults apply if absent).
    #[serde(default)]
    pub pe_mmu: MmuSpec,
    /// Channel mapping (required by the LA model).
    #[serde(default)]
    pub memory_map: Option<MemoryMap>,
}

/// A topology that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {message}")]
pub struct TopologyError {
    pub source_name: String,
    pub message: String,
}

/// Largest latency or overhead (`*_ns`): one second. Beyond it simulated
/// picoseconds could overflow within a run.
/// The largest topology file read (a topology is a page of YAML).
pub const MAX_TOPOLOGY_BYTES: u64 = 1 << 20;
const MAX_NS: f64 = 1e9;
/// Smallest bandwidth (`*_gbs`): 1 MB/s. Slower links make transfer
/// times that overflow simulated picoseconds.
const MIN_GBS: f64 = 1e-3;
/// Largest bandwidth or compute rate: 10^9 GB/s or T/GFLOP/s.
const MAX_RATE: f64 = 1e9;
/// Largest memory size: 2^20 GiB (a PA offset holds far less; this bounds
/// the arithmetic before that check).
const MAX_GIB: f64 = (1u64 << 20) as f64;

/// Units are in field names: `*_gbs`, `*_gib`, `*_kib` and the per-dtype
/// throughputs under `tflops`/`gflops` must be positive; `*_ns` must be
/// non-negative. Each is also bounded (`MAX_NS`, `MIN_GBS`, `MAX_RATE`,
/// `MAX_GIB`), so simulated time stays far from overflowing. Returns the
/// offending field's path.
fn check_units(
    v: &serde_yaml_ng::Value,
    path: &mut Vec<String>,
) -> Result<(), (Vec<String>, String)> {
    use serde_yaml_ng::Value;
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                path.push(k.as_str().unwrap_or("?").to_string());
                check_units(v, path)?;
                path.pop();
            }
        }
        Value::Number(n) => {
            let key = path.last().map(String::as_str).unwrap_or("");
            let parent = path
                .len()
                .checked_sub(2)
                .map(|i| path[i].as_str())
                .unwrap_or("");
            let x = n.as_f64().unwrap_or(f64::NAN);
            // A GEMM unit may have no accumulator buffer (`acc_kib: 0`).
            let positive = key.ends_with("_gbs")
                || key.ends_with("_gib")
                || key.ends_with("_kib") && key != "acc_kib"
                || parent == "tflops"
                || parent == "gflops";
            if positive && !(x.is_finite() && x > 0.0) {
                return Err((path.clone(), format!("must be a positive number, got {x}")));
            }
            if key.ends_with("_ns") && !(x.is_finite() && x >= 0.0) {
                return Err((
                    path.clone(),
                    format!("must be a non-negative number, got {x}"),
                ));
            }
            let bound = if key.ends_with("_ns") {
                (x > MAX_NS).then(|| format!("at most {MAX_NS:e} ns (one second)"))
            } else if key.ends_with("_gbs") {
                (!(MIN_GBS..=MAX_RATE).contains(&x))
                    .then(|| format!("between {MIN_GBS:e} and {MAX_RATE:e} GB/s"))
            } else if parent == "tflops" || parent == "gflops" {
                (x > MAX_RATE).then(|| format!("at most {MAX_RATE:e}"))
            } else if key.ends_with("_gib") {
                (x > MAX_GIB).then(|| format!("at most {MAX_GIB} GiB"))
            } else if key.ends_with("_kib") {
                (x > MAX_GIB * 1024.0 * 1024.0)
                    .then(|| format!("at most {} KiB", MAX_GIB * 1024.0 * 1024.0))
            } else {
                None
            };
            if let Some(range) = bound {
                return Err((path.clone(), format!("must be {range}, got {x}")));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The 1-based line where the key at `path` is written, following block
/// indentation and one level of `{flow: mappings}`.
fn line_of(text: &str, path: &[String]) -> Option<usize> {
    let mut stack: Vec<(usize, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let body = line.split('#').next().unwrap_or("");
        let trimmed = body.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        let indent = body.len() - trimmed.len();
        let Some((key, rest)) = trimmed.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|&(d, _)| d >= indent) {
            stack.pop();
        }
        stack.push((indent, key.trim()));
        let keys: Vec<&str> = stack.iter().map(|&(_, k)| k).collect();
        if keys.len() == path.len() && keys.iter().zip(path).all(|(a, b)| a == b) {
            return Some(i + 1);
        }
        if keys.len() + 1 == path.len()
            && keys.iter().zip(path).all(|(a, b)| a == b)
            && rest.trim_start().starts_with('{')
            && rest.contains(&format!("{}:", path[path.len() - 1]))
        {
            return Some(i + 1);
        }
    }
    None
}

/// Deepest nesting of `[...]` / `{...}` a topology may have (the real
/// ones nest two deep).
pub const MAX_FLOW_DEPTH: usize = 64;

/// Refuse YAML whose flow collections nest deeper than
/// [`MAX_FLOW_DEPTH`], naming the line: the YAML parser takes time
/// quadratic in that depth (100,000 levels, 200 KB: about a minute)
/// before any error could be reported. Brackets in quoted strings and
/// comments do not count; a plain scalar's do, which only errs toward
/// refusing nonsense.
pub fn check_flow_depth(text: &str) -> Result<(), String> {
    let (mut depth, mut line) = (0usize, 1usize);
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    let mut prev = '\n';
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\n') => {
                line += 1;
                if quote.is_none() {
                    prev = c;
                    continue;
                }
            }
            (Some('"'), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => {
                // '' inside single quotes is an escaped quote.
                if q == '\'' && chars.peek() == Some(&'\'') {
                    chars.next();
                } else {
                    quote = None;
                }
            }
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev.is_whitespace() => {
                // A comment: skip to the end of the line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
                prev = '\n';
                continue;
            }
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(format!(
                        "line {line}: collections nested more than {MAX_FLOW_DEPTH} deep: not a topology"
                    ));
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = c;
    }
    Ok(())
}

impl Topology {
    /// Load by embedded name (`small`, `default`, `large`) or by file path.
    pub fn load(name_or_path: &str) -> Result<Topology, TopologyError> {
        if let Some((_, text)) = EMBEDDED.iter().find(|(n, _)| *n == name_or_path) {
            return Topology::parse(text, &format!("topologies/{name_or_path}.yaml (embedded)"));
        }
        let path = Path::new(name_or_path);
        let err = |message: String| TopologyError {
            source_name: name_or_path.to_string(),
            message,
        };
        // Bounded: a topology is a page of YAML, and `/dev/zero` is not one.
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| {
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(f, MAX_TOPOLOGY_BYTES + 1),
                    &mut text,
                )
            })
            .map_err(|e| {
                err(format!(
                    "cannot read topology: {e} (embedded topologies: {})",
                    EMBEDDED
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if text.len() as u64 > MAX_TOPOLOGY_BYTES {
            return Err(err(format!(
                "more than {MAX_TOPOLOGY_BYTES} bytes: not a topology (a topology is a page of YAML)"
            )));
        }
        Topology::parse(&text, name_or_path)
    }

    /// Parse YAML text; `source_name` names the file in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Topology, TopologyError> {
        let err = |message: String| TopologyError {
            source_name: source_name.to_string(),
            message,
        };
        check_flow_depth(text).map_err(err)?;
        let t: Topology = serde_yaml_ng::from_str(text)
            .map_err(|e| {
                // serde_yaml_ng says "path: message at line L column C"; lead
                // with file:line so editors can jump to it.
                let msg = e.to_string();
                match e.location() {
                    Some(loc) => format!("line {}: {msg}", loc.line()),
                    None => msg,
                }
            })
            .map_err(err)?;
        let value: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| err(e.to_string()))?;
        check_units(&value, &mut Vec::new()).map_err(|(path, why)| {
            let at = line_of(text, &path)
                .map(|l| format!("line {l}: "))
                .unwrap_or_default();
            err(format!("{at}{}: {why}", path.join(".")))
        })?;
        t.validate().map_err(|(path, why)| {
            let segs: Vec<String> = path.split('.').map(String::from).collect();
            let at = line_of(text, &segs)
                .map(|l| format!("line {l}: "))
                .unwrap_or_default();
            err(format!("{at}{path}: {why}"))
        })?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let c = &self.counts;
        let check = |ok: bool, field: &'static str, why: String| {
            if ok { Ok(()) } else { Err((field, why)) }
        };
        check(
            (1..=kb_format::pa::MAX_SIPS).contains(&c.sips),
            "counts.sips",
            format!("must be 1..={}, got {}", kb_format::pa::MAX_SIPS, c.sips),
        )?;
        check(
            (1..=kb_format::pa::MAX_CUBES).contains(&c.cubes_per_sip),
            "counts.cubes_per_sip",
            format!(
                "must be 1..={}, got {}",
                kb_format::pa::MAX_CUBES,
                c.cubes_per_sip
            ),
        )?;
        check(
            (1..=kb_format::pa::MAX_PES).contains(&c.pes_per_cube),
            "counts.pes_per_cube",
            format!(
                "must be 1..={}, got {}",
                kb_format::pa::MAX_PES,
                c.pes_per_cube
            ),
        )?;
        check(
            self.hbm.pseudo_channels >= 1 && self.hbm.pseudo_channels <= 1024,
            "hbm.pseudo_channels",
            format!("must be 1..=1024, got {}", self.hbm.pseudo_channels),
        )?;
        check(
            self.hbm.interleave_bytes >= 64 && self.hbm.interleave_bytes.is_power_of_two(),
            "hbm.interleave_bytes",
            format!(
                "must be a power of two >= 64, got {}",
                self.hbm.interleave_bytes
            ),
        )?;
        let per_pe = self.hbm.size_gib.0 * (1u64 << 30) as f64 / c.pes_per_cube as f64;
        check(
            per_pe <= (1u64 << kb_format::pa::OFFSET_BITS) as f64,
            "hbm.size_gib",
            "more than 32 GiB per PE partition does not fit the PA offset".into(),
        )?;
        for (field, kib) in [
            ("tcm.size_kib", self.tcm.size_kib.0),
            ("sram.size_kib", self.sram.size_kib.0),
        ] {
            check(
                kib * 1024.0 <= (1u64 << kb_format::pa::OFFSET_BITS) as f64 && kib * 1024.0 >= 64.0,
                field,
                format!("must be 1/16 to 33554432 KiB (64 B to 32 GiB, the PA offset), got {kib}"),
            )?;
        }
        check(
            self.memory_map.is_none() || self.address_model == AddressModel::La,
            "memory_map",
            format!(
                "the {} address model does not use a memory_map (only la maps HBM channels to PEs): remove it, or set address_model: la",
                self.address_model.name()
            ),
        )?;
        if self.address_model == AddressModel::La {
            let mm = self.memory_map.as_ref().ok_or((
                "memory_map",
                "the la address model needs a memory_map section".to_string(),
            ))?;
            check(
                mm.hbm_pseudo_channels == self.hbm.pseudo_channels,
                "memory_map.hbm_pseudo_channels",
                format!(
                    "must equal hbm.pseudo_channels ({}), got {}",
                    self.hbm.pseudo_channels, mm.hbm_pseudo_channels
                ),
            )?;
            check(
                mm.hbm_channels_per_pe >= 1
                    && mm.hbm_channels_per_pe * c.pes_per_cube <= mm.hbm_pseudo_channels,
                "memory_map.hbm_channels_per_pe",
                format!(
                    "must be 1..={} ({} channels over {} PEs), got {}",
                    mm.hbm_pseudo_channels / c.pes_per_cube,
                    mm.hbm_pseudo_channels,
                    c.pes_per_cube,
                    mm.hbm_channels_per_pe
                ),
            )?;
        }
        check(
            self.pe_mmu.page_bytes >= 64 && self.pe_mmu.page_bytes.is_power_of_two(),
            "pe_mmu.page_bytes",
            format!(
                "must be a power of two >= 64, got {}",
                self.pe_mmu.page_bytes
            ),
        )?;
        check(
            self.pe_dma.burst_bytes >= 64 && self.pe_dma.burst_bytes <= 1 << 30,
            "pe_dma.burst_bytes",
            format!("must be 64 B to 1 GiB, got {}", self.pe_dma.burst_bytes),
        )?;
        check(
            self.pe_gemm.acc_kib <= 1 << 20,
            "pe_gemm.acc_kib",
            format!(
                "must be 0 to 1048576 KiB (1 GiB), got {}",
                self.pe_gemm.acc_kib
            ),
        )?;
        check(
            (1..=64).contains(&self.pe_dma.engines),
            "pe_dma.engines",
            format!("must be 1..=64, got {}", self.pe_dma.engines),
        )?;
        Ok(())
    }

    /// The topology as YAML (what the trace's metadata records).
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_default()
    }

    pub fn total_pes(&self) -> u32 {
        self.counts.sips * self.counts.cubes_per_sip * self.counts.pes_per_cube
    }

    /// HBM bytes of one PE's partition.
    pub fn hbm_bytes_per_pe(&self) -> u64 {
        (self.hbm.size_gib.0 * (1u64 << 30) as f64) as u64 / self.counts.pes_per_cube as u64
    }

    pub fn tcm_bytes(&self) -> u64 {
        (self.tcm.size_kib.0 * 1024.0) as u64
    }

    /// Bytes of one cube's SRAM.
    pub fn sram_bytes(&self) -> u64 {
        (self.sram.size_kib.0 * 1024.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_at_once_naming_the_line() {
        let deep = format!(
            "name: x\nextra: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let t = std::time::Instant::now();
        let e = Topology::parse(&deep, "deep.yaml").unwrap_err().to_string();
        assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
        assert!(
            e.contains("deep.yaml") && e.contains("line 2") && e.contains("nested more than 64"),
            "{e}"
        );
        // Brackets in quotes and comments do not count; 64 deep is fine.
        let quoted = format!(
            "a: \"{}\"\nb: '{}''{}'\n# {}\nc: {}{}\n",
            "[".repeat(100),
            "{".repeat(100),
            "[".repeat(100),
            "[".repeat(100),
            "[".repeat(64),
            "]".repeat(64)
        );
        assert_eq!(check_flow_depth(&quoted), Ok(()));
        assert!(check_flow_depth(&format!("c: {}", "{".repeat(65))).is_err());
    }

    #[test]
    fn embedded_topologies_parse_with_the_documented_counts() {
        let t = Topology::load("small").unwrap();
        assert_eq!(
            (t.counts.sips, t.counts.cubes_per_sip, t.counts.pes_per_cube),
            (1, 1, 4)
        );
        let t = Topology::load("default").unwrap();
        assert_eq!(
            (t.counts.sips, t.counts.cubes_per_sip, t.counts.pes_per_cube),
            (1, 4, 8)
        );
        let t = Topology::load("large").unwrap();
        assert_eq!(t.total_pes(), 256);
    }

    #[test]
    fn unknown_field_names_line_and_field() {
        let text = EMBEDDED[0].1.replace("engines:", "engines_typo:");
        let e = Topology::parse(&text, "bad.yaml").unwrap_err().to_string();
        assert!(e.starts_with("bad.yaml: line "), "{e}");
        assert!(e.contains("engines_typo"), "{e}");
    }

    #[test]
    fn negative_bandwidth_is_rejected_with_its_line() {
        let text = EMBEDDED[0]
            .1
            .replacen("channel_bw_gbs: 32", "channel_bw_gbs: -32", 1);
        assert_ne!(text, EMBEDDED[0].1);
        let e = Topology::parse(&text, "neg.yaml").unwrap_err().to_string();
        let line = text.lines().position(|l| l.contains("-32")).unwrap() + 1;
        assert!(e.contains(&format!("line {line}")), "{e}");
        assert!(
            e.contains("hbm.channel_bw_gbs") && e.contains("positive"),
            "{e}"
        );
    }

    #[test]
    fn bad_yaml_and_out_of_range_counts_are_errors() {
        assert!(
            Topology::parse("name: [", "x.yaml")
                .unwrap_err()
                .to_string()
                .contains("line")
        );
        let text = EMBEDDED[0]
            .1
            .replacen("pes_per_cube: 4", "pes_per_cube: 0", 1);
        let e = Topology::parse(&text, "x.yaml").unwrap_err().to_string();
        let line = text
            .lines()
            .position(|l| l.contains("pes_per_cube: 0"))
            .unwrap()
            + 1;
        assert!(
            e.contains("counts.pes_per_cube") && e.contains(&format!("line {line}:")),
            "{e}"
        );
    }

    #[test]
    fn numbers_that_would_overflow_simulated_time_are_refused() {
        let base = EMBEDDED[0].1;
        for (from, to, want) in [
            (
                "latency_ns: 500, bw_gbs: 64}",
                "latency_ns: 2e16, bw_gbs: 64}",
                "at most 1e9 ns",
            ),
            (
                "latency_ns: 500, bw_gbs: 64}",
                "latency_ns: 1e300, bw_gbs: 64}",
                "at most 1e9 ns",
            ),
            (
                "latency_ns: 500, bw_gbs: 64}",
                "latency_ns: 500, bw_gbs: 1e-12}",
                "between 1e-3 and 1e9 GB/s",
            ),
        ] {
            let text = base.replacen(from, to, 1);
            assert_ne!(text, base, "{to}");
            let e = Topology::parse(&text, "x.yaml").unwrap_err().to_string();
            let line = text.lines().position(|l| l.contains(to)).unwrap() + 1;
            assert!(
                e.contains(&format!("line {line}: links.host_pcie")) && e.contains(want),
                "{to}: {e}"
            );
        }
        // The bounds leave every shipped topology alone.
        for (name, text) in EMBEDDED {
            assert!(Topology::parse(text, name).is_ok(), "{name}");
        }
    }

    #[test]
    fn flow_mapping_fields_are_located() {
        let text = EMBEDDED[0]
            .1
            .replacen("bw_gbs: 64}    # host", "bw_gbs: 0}    # host", 1);
        assert_ne!(text, EMBEDDED[0].1);
        let e = Topology::parse(&text, "x.yaml").unwrap_err().to_string();
        let line = text.lines().position(|l| l.contains("bw_gbs: 0}")).unwrap() + 1;
        assert!(
            e.contains(&format!("line {line}: links.host_pcie.bw_gbs")),
            "{e}"
        );
    }

    #[test]
    fn a_memory_map_outside_the_la_model_is_refused() {
        let text = EMBEDDED
            .iter()
            .find(|(n, _)| *n == "la-1to1")
            .unwrap()
            .1
            .replace("address_model: la", "address_model: pa");
        let e = Topology::parse(&text, "pa-with-map.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pa-with-map.yaml")
                && e.contains("memory_map: the pa address model does not use a memory_map"),
            "{e}"
        );
    }
}
