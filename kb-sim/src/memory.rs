//! The host memory a run needs, estimated at setup, and the budget it is
//! checked against (`--max-memory`), so that a run too big for the machine
//! is refused with the estimate instead of being killed.
//!
//! What the estimate counts, in the data plane's terms ([`crate::data`]):
//! - **host data**: every tensor's host bytes (the workload's inputs), held
//!   for the whole run;
//! - **device data**: the data-plane pages of every shard. Shards with the
//!   same bytes at the same in-page offset (a replicated tensor's copies,
//!   [`ShardKey`]) share their whole pages, so they count once, plus the
//!   two partial pages at their ends each; shards written by kernels (no
//!   host data) count in full;
//! - **TCM**: each PE a launch uses may fill its TCM, so its size counts
//!   once per such PE (an upper bound: kernels often use less);
//! - a fixed [`BASELINE`] for the engine, its queues and the trace writer.
//!
//! What it does not count: a kernel's own Rust allocations, and the host's
//! copies of tensors a kernel writes to the host (none of the built-in
//! workloads does).

use std::collections::BTreeSet;
use std::path::Path;

use crate::data::PAGE;
use crate::engine::Step;
use crate::runtime::Tensor;

/// The engine, its event queues and the trace writer's buffers.
pub const BASELINE: u64 = 64 << 20;

/// Which bytes of its tensor a shard holds and where they sit in a page:
/// shards with equal keys hold the same bytes laid out the same way, so
/// the data plane keeps one set of whole pages for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    tensor: u32,
    tensor_offset: u64,
    rows: u64,
    row_bytes: u64,
    stride: u64,
    page_offset: usize,
}

impl ShardKey {
    /// The key of shard `shard` of `t`.
    pub fn of(t: &Tensor, shard: usize) -> ShardKey {
        let s = &t.meta.shards[shard];
        ShardKey {
            tensor: t.id,
            tensor_offset: s.tensor_offset,
            rows: s.rows,
            row_bytes: s.row_bytes,
            stride: s.tensor_row_stride,
            page_offset: s.pa as usize % PAGE,
        }
    }

    /// The shard's bytes.
    pub fn bytes(&self) -> u64 {
        self.rows.saturating_mul(self.row_bytes)
    }

    /// In-page offset of the shard's first byte.
    pub fn page_offset(&self) -> usize {
        self.page_offset
    }

    /// Data-plane pages the shard's bytes span.
    fn pages(&self) -> u64 {
        (self.page_offset as u64)
            .saturating_add(self.bytes())
            .div_ceil(PAGE as u64)
    }
}

/// The estimate, by part (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryEstimate {
    /// Tensors' host data.
    pub host_data: u64,
    /// Data-plane pages of the tensors' shards.
    pub device_data: u64,
    /// TCM of the PEs launches use.
    pub tcm: u64,
}

impl MemoryEstimate {
    /// Everything, with [`BASELINE`].
    pub fn total(&self) -> u64 {
        BASELINE
            .saturating_add(self.host_data)
            .saturating_add(self.device_data)
            .saturating_add(self.tcm)
    }

    /// The estimate of a built program: its tensors and the PEs its
    /// launches run on, with `tcm_bytes` of TCM each.
    pub fn of(tensors: &[Tensor], steps: &[Step], tcm_bytes: u64) -> MemoryEstimate {
        let page = PAGE as u64;
        let mut e = MemoryEstimate::default();
        let mut seen = BTreeSet::new();
        for t in tensors {
            let shared = t.data.is_some();
            if let Some(d) = &t.data {
                e.host_data = e.host_data.saturating_add(d.len() as u64);
            }
            for k in 0..t.meta.shards.len() {
                let key = ShardKey::of(t, k);
                let pages = if !shared || seen.insert(key) {
                    key.pages()
                } else {
                    key.pages().min(2)
                };
                e.device_data = e.device_data.saturating_add(pages.saturating_mul(page));
            }
        }
        let pes: BTreeSet<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(l) => Some(l.pes.iter().map(|p| (p.sip, p.cube, p.pe))),
                _ => None,
            })
            .flatten()
            .collect();
        e.tcm = (pes.len() as u64).saturating_mul(tcm_bytes.next_multiple_of(page));
        e
    }

    /// One line for an error or a log: the total and its parts.
    pub fn describe(&self) -> String {
        format!(
            "{} (host data {}, device data {}, TCM of the launches' PEs {}, engine {})",
            human(self.total()),
            human(self.host_data),
            human(self.device_data),
            human(self.tcm),
            human(BASELINE)
        )
    }
}

/// `--max-memory`'s value: a byte count with an optional unit (`512M`,
/// `4GiB`, `1.5G`; K/M/G/T are binary multiples, as `free` and `top` use).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| format!("{s:?} is not a size such as 512M or 4G ({e})"))
}

/// The memory this machine has available now (Linux: `MemAvailable` in
/// /proc/meminfo), or `None` when it cannot tell.
pub fn available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&info, "MemAvailable:")
}

/// The most host memory a run may use, and which limit sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// The limit, for people: `memory available now (MemAvailable)`,
    /// `the address-space limit (ulimit -v) less what kb-sim maps`...;
    /// empty for `--max-memory`.
    pub source: String,
}

impl Budget {
    /// `--max-memory SIZE`.
    pub fn given(bytes: u64) -> Budget {
        Budget {
            bytes,
            source: String::new(),
        }
    }

    /// What a refusal says it passed: `--max-memory 100 MiB`, or `the 3.8
    /// GiB of the address-space limit (ulimit -v) ...`.
    pub fn describe(&self) -> String {
        if self.source.is_empty() {
            format!("--max-memory {}", human(self.bytes))
        } else {
            format!("the {} of {}", human(self.bytes), self.source)
        }
    }

    /// What a refusal suggests.
    pub fn advice(&self) -> &'static str {
        if self.source.is_empty() {
            "use a smaller problem or machine, or raise --max-memory if the machine has the memory"
        } else {
            "use a smaller problem or machine (--max-memory overrides the limit's estimate)"
        }
    }
}

/// The smallest of the limits this process runs under (Linux): the
/// memory available now, the address-space and data-segment limits
/// (`ulimit -v`, `ulimit -d`: RLIMIT_AS and RLIMIT_DATA, less what the
/// process already maps), and its cgroup's memory limit less its usage
/// (cgroup v2 `memory.max`, every ancestor's too; v1
/// `memory.limit_in_bytes`). `None` when none can be read.
pub fn budget() -> Option<Budget> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut all = Vec::new();
    if let Some(b) = available() {
        all.push(Budget {
            bytes: b,
            source: "the memory available now (MemAvailable)".into(),
        });
    }
    for (limit, used, what) in [
        (
            "Max address space",
            "VmSize:",
            "the address-space limit (ulimit -v) less what kb-sim maps",
        ),
        (
            "Max data size",
            "VmData:",
            "the data-segment limit (ulimit -d) less kb-sim's data",
        ),
    ] {
        if let Some(max) = rlimit(&limits, limit) {
            let used = kib_field(&status, used).unwrap_or(0);
            all.push(Budget {
                bytes: max.saturating_sub(used),
                source: what.into(),
            });
        }
    }
    all.extend(cgroup_budget(&cgroup, |p| {
        std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(p)).ok()
    }));
    all.into_iter().min_by_key(|b| b.bytes)
}

/// A `kB` field of /proc/meminfo or /proc/self/status, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut parts = line[key.len()..].split_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then(|| kib.saturating_mul(1024))
}

/// A soft limit of /proc/self/limits in bytes (`None`: unlimited or
/// absent).
fn rlimit(limits: &str, name: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// The cgroup memory limit less usage for the cgroups in `proc_cgroup`
/// (/proc/self/cgroup's text), reading controller files (paths relative
/// to /sys/fs/cgroup) with `read`: v2 (`0::/path`, the tightest of the
/// cgroup and its ancestors) and v1 (`N:...memory...:/path`).
fn cgroup_budget(proc_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<Budget> {
    let number = |p: &str| -> Option<u64> { read(p)?.trim().parse().ok() };
    let mut best: Option<Budget> = None;
    let mut consider = |bytes: u64, source: String| {
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            best = Some(Budget { bytes, source });
        }
    };
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if ctrl.is_empty() {
            // v2: this cgroup and each ancestor up to the root.
            let mut dir = Some(path);
            while let Some(d) = dir {
                let join = |f: &str| {
                    if d.is_empty() {
                        f.to_string()
                    } else {
                        format!("{d}/{f}")
                    }
                };
                if let (Some(max), Some(cur)) =
                    (number(&join("memory.max")), number(&join("memory.current")))
                {
                    consider(
                        max.saturating_sub(cur),
                        format!(
                            "the cgroup memory limit (/sys/fs/cgroup/{}) less its usage",
                            join("memory.max")
                        ),
                    );
                }
                dir = (!d.is_empty()).then(|| d.rsplit_once('/').map_or("", |(a, _)| a));
            }
        } else if ctrl.split(',').any(|c| c == "memory") {
            let join = |f: &str| {
                if path.is_empty() {
                    format!("memory/{f}")
                } else {
                    format!("memory/{path}/{f}")
                }
            };
            if let (Some(max), Some(cur)) = (
                number(&join("memory.limit_in_bytes")),
                number(&join("memory.usage_in_bytes")),
            ) {
                // v1 says "no limit" with a number near 2^63.
                if max < 1 << 62 {
                    consider(
                        max.saturating_sub(cur),
                        format!(
                            "the cgroup memory limit (/sys/fs/cgroup/{}) less its usage",
                            join("memory.limit_in_bytes")
                        ),
                    );
                }
            }
        }
    }
    best
}

/// Bytes for people: `1.5 GiB`, `64 MiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units_and_bad_ones_are_errors() {
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "ten", "-1G", "5X"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(1000 << 20), "1000 MiB");
    }

    #[test]
    fn limits_parse_from_proc_text() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max data size             unlimited            unlimited            bytes\n\
                      Max address space         4096000000           unlimited            bytes\n";
        assert_eq!(rlimit(limits, "Max address space"), Some(4_096_000_000));
        assert_eq!(rlimit(limits, "Max data size"), None);
        assert_eq!(rlimit(limits, "Max stack size"), None);
        let status = "Name:\tkb-sim\nVmSize:\t  123456 kB\nVmData:\t 1000 kB\n";
        assert_eq!(kib_field(status, "VmSize:"), Some(123_456 * 1024));
        assert_eq!(kib_field(status, "VmData:"), Some(1_024_000));
        assert_eq!(kib_field(status, "VmRSS:"), None);
    }

    #[test]
    fn cgroup_limits_are_the_tightest_ancestor_less_usage() {
        use std::collections::BTreeMap;
        let files: BTreeMap<&str, &str> = [
            ("memory.max", "max\n"),
            ("memory.current", "5000000000\n"),
            ("user.slice/memory.max", "8000000000\n"),
            ("user.slice/memory.current", "3000000000\n"),
            ("user.slice/job/memory.max", "max\n"),
            ("user.slice/job/memory.current", "100\n"),
            ("memory/slurm/job1/memory.limit_in_bytes", "2000000000\n"),
            ("memory/slurm/job1/memory.usage_in_bytes", "500000000\n"),
            ("memory/free/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/free/memory.usage_in_bytes", "1\n"),
        ]
        .into_iter()
        .collect();
        let read = |p: &str| files.get(p).map(|s| s.to_string());
        // v2: "max" is no limit; the parent's 8 GB less 3 GB in use binds.
        let b = cgroup_budget("0::/user.slice/job\n", read).unwrap();
        assert_eq!(b.bytes, 5_000_000_000);
        assert!(b.source.contains("user.slice/memory.max"), "{}", b.source);
        // v1: a limit, and v1's "unlimited" number, which is none.
        let b = cgroup_budget("4:memory:/slurm/job1\n3:cpu:/x\n", read).unwrap();
        assert_eq!(b.bytes, 1_500_000_000);
        assert!(cgroup_budget("4:cpuacct,memory:/free\n", read).is_none());
        assert!(cgroup_budget("", read).is_none());
    }

    #[test]
    fn this_machine_reports_its_available_memory() {
        if cfg!(target_os = "linux") {
            let a = available().expect("MemAvailable on Linux");
            assert!(a > 1 << 20, "{a}");
            let b = budget().expect("a budget on Linux");
            assert!(b.bytes <= a && b.bytes > 0, "{b:?}");
        }
    }
}
