//! Reading a point's trace back into its row: times, bytes, FLOPs and
//! per unit kind busy and held time ([`analyze`]), and the machine's
//! peaks ([`Peaks`]).

use super::*;

/// What one point's trace says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PointStats {
    /// Simulated time: the end of the last op (ps).
    pub sim_ps: u64,
    /// The kernels' window: first launch start to last launch end (ps);
    /// the whole run when there are no launches.
    pub kernel_window_ps: (u64, u64),
    /// Records in the trace.
    pub records: u64,
    /// Bytes moved by every memory op (write extents).
    pub bytes: u64,
    /// Bytes moved by memory ops that start within the kernel window.
    pub kernel_bytes: u64,
    /// FLOPs executed by the launches.
    pub flops: u64,
    /// The useful part of them (padding of edge tiles left out).
    pub useful_flops: u64,
    /// Per unit kind: busy and held time within the kernel window summed
    /// over its units, and the units of that kind in the machine.
    pub units: BTreeMap<String, UnitUse>,
    /// xxh3 of every record's id, times, component, name, kind, active
    /// interval and data fingerprint: points with equal digests ran the
    /// same ops at the same times on the same data.
    pub digest: u64,
}

/// One unit kind's time in a point's kernel window ([`kb_format::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitUse {
    /// Active time (computing or transferring), summed over the units (ps).
    pub busy: u64,
    /// Held time (op spans, waiting included), summed over the units (ps).
    pub held: u64,
    /// Units of that kind in the machine.
    pub units: u64,
}

/// The unit kind of a node or component name: the name less its leading
/// `sipN.`, `cubeN.`, `peN.` coordinates (`sip0.cube1.pe3.pe_dma` ->
/// `pe_dma`); [`kb_format::usage::unit_kind`].
pub fn unit_kind(name: &str) -> &str {
    usage::unit_kind(name)
}

/// A machine's peak rates, for a roofline beside the achieved ones.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Peaks {
    /// Every PE's GEMM unit at its peak, per dtype (f32, f16, bf16, i8),
    /// GFLOP/s.
    pub gemm_gflops: [f64; 4],
    /// Every PE's vector unit at its peak, per dtype, GFLOP/s.
    pub math_gflops: [f64; 4],
    /// Every HBM pseudo channel at its bandwidth, GB/s.
    pub hbm_gbs: f64,
}

/// The dtypes of [`Peaks`]' arrays, in order.
pub const PEAK_DTYPES: [&str; 4] = ["f32", "f16", "bf16", "i8"];

impl Peaks {
    /// The peaks of topology `t`.
    pub fn of(t: &Topology) -> Peaks {
        let pes = f64::from(t.total_pes());
        let per = |d: &crate::topology::PerDtype, scale: f64| {
            [d.f32.0, d.f16.0, d.bf16.0, d.i8.0].map(|x| x * scale * pes)
        };
        let c = t.counts;
        Peaks {
            gemm_gflops: per(&t.pe_gemm.tflops, 1e3),
            math_gflops: per(&t.pe_math.gflops, 1.0),
            hbm_gbs: f64::from(c.sips * c.cubes_per_sip)
                * f64::from(t.hbm.pseudo_channels)
                * t.hbm.channel_bw_gbs.0,
        }
    }
}

/// What a point's machine gives its row: unit counts and peaks.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineInfo {
    /// Units of each kind ([`unit_counts`]).
    pub units: BTreeMap<String, u64>,
    /// Peak rates ([`Peaks::of`]).
    pub peaks: Peaks,
}

/// Units of each kind in a machine (`pe_dma` -> 32 on `default`).
pub fn unit_counts(machine: &Machine) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for n in &machine.nodes {
        *counts.entry(unit_kind(&n.name).to_string()).or_default() += 1;
    }
    // HBM pseudo channels are not nodes: the trace's channels chunk times
    // them (`hbm_channel_*` columns).
    let c = machine.topo.counts;
    counts.insert(
        "hbm_channel".into(),
        u64::from(c.sips * c.cubes_per_sip) * u64::from(machine.topo.hbm.pseudo_channels),
    );
    counts
}

/// Read a point's trace back: the numbers of its row (`counts`: units of
/// each kind in the point's machine, [`unit_counts`]).
pub fn analyze(trace: &Path, counts: &BTreeMap<String, u64>) -> Result<PointStats, String> {
    let t = MmapTrace::open(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let launches = t.launches();
    let mut s = PointStats {
        flops: launches.iter().map(|l| l.flops).sum(),
        useful_flops: launches.iter().map(|l| l.useful_flops).sum(),
        ..Default::default()
    };
    let window = usage::kernel_window(launches);
    // Without launches the whole run (its end is known only after the
    // records: clip at u64::MAX, which the run cannot pass).
    let clip = window.unwrap_or((0, u64::MAX));
    let mut time: Vec<Option<UnitTime>> = Vec::new();
    let mut digest = kb_format::Fingerprinter::new();
    t.for_each_record(|r, _| {
        s.records += 1;
        let (a0, a1) = r.active.unwrap_or((r.t_start, r.t_end));
        for x in [
            r.op_id,
            r.t_start,
            r.t_end,
            u64::from(r.component),
            u64::from(r.op_name),
            u64::from(r.kind.code()),
            a0,
            a1,
            r.fingerprint.unwrap_or(0),
        ] {
            digest.update(&x.to_le_bytes());
        }
        s.sim_ps = s.sim_ps.max(r.t_end);
        let b = if r.kind == OpKind::Memory {
            match (&r.write, &r.params) {
                (Some(w), _) => w.ranges.iter().map(|x| x.bytes()).sum(),
                (None, Params::Memory(p)) => p.nbytes(),
                _ => 0,
            }
        } else {
            0
        };
        s.bytes = s.bytes.saturating_add(b);
        let (k0, k1) = clip;
        if r.t_start >= k0 && r.t_start <= k1 {
            s.kernel_bytes = s.kernel_bytes.saturating_add(b);
        }
        // Sync records (kernels, waits, signals, maps) are not a unit's
        // work: no busy time, and no held time in a unit kind's column.
        if r.kind == OpKind::Sync {
            return Ok(());
        }
        let i = r.component as usize;
        if i >= time.len() {
            time.resize(i + 1, None);
        }
        time[i].get_or_insert_with(|| UnitTime::new(clip)).add(r);
        Ok(())
    })
    .map_err(|e| format!("{}: {e}", trace.display()))?;
    // The simulated time is the footer's end time (kb-sim's, which may pass
    // the last record's end), as `kb-inspect summary` reports it.
    s.sim_ps = s.sim_ps.max(t.footer().counts.max_t_end);
    s.kernel_window_ps = window.unwrap_or((0, s.sim_ps));
    s.digest = digest.digest();
    let strings = t.strings();
    for (id, u) in time.iter_mut().enumerate() {
        let Some(u) = u else { continue };
        let total = u.finish(clip);
        let name = strings.name(id as u32);
        let kind = unit_kind(&name).to_string();
        let units = counts.get(&kind).copied().unwrap_or(1);
        let e = s.units.entry(kind).or_insert(UnitUse {
            units,
            ..UnitUse::default()
        });
        e.busy += total.busy;
        e.held += total.held;
    }
    // Components with no ops were idle: the unit kinds that compute or move
    // data always get a column.
    for k in ["pe_dma", "pe_gemm", "pe_math"] {
        if let Some(&units) = counts.get(k) {
            s.units.entry(k.to_string()).or_insert(UnitUse {
                units,
                ..UnitUse::default()
            });
        }
    }
    // HBM channels: their busy intervals in the kernel window (service
    // time: held = busy).
    if let Some(&units) = counts.get("hbm_channel") {
        let (k0, k1) = clip;
        let busy = t
            .channels()
            .map_err(|e| format!("{}: {e}", trace.display()))?
            .iter()
            .flat_map(|c| c.busy.iter())
            .map(|&(a, b)| b.min(k1).saturating_sub(a.max(k0)))
            .fold(0u64, u64::saturating_add);
        s.units.insert(
            "hbm_channel".into(),
            UnitUse {
                busy,
                held: busy,
                units,
            },
        );
    }
    // Op-name strings are not components: drop kinds no node has.
    s.units
        .retain(|k, v| counts.contains_key(k) && (v.held > 0 || v.units > 0));
    Ok(s)
}
