//! The sequential replay engine: collects a trace's host data and records,
//! then applies every data effect in `seq` order (the contract's rule 2).
//!
//! Records arrive in (t_start, op_id) order, but Phase 1 applied their
//! effects in `seq` order, which can differ (a long DMA that started early
//! may write after a later op read). The engine therefore keeps the records
//! (they are small; host data goes straight into the data plane), sorts the
//! effects by (seq, read before write, op_id) and applies them:
//!
//! - at a read effect it gathers the read ranges; a memory op checks the
//!   bytes against the record's fingerprint and holds them, a compute op
//!   computes its output from them and holds that;
//! - at the write effect (same seq or later) it scatters what it held.
//!
//! Future work: stream with a bounded window (apply effects whose seq is
//! below the smallest seq any unread record can still carry, which the
//! reorder bound of the writer limits) instead of holding every record, and
//! run independent ops in parallel. Op execution lives in [`crate::ops`]
//! and touches no plane state, so both changes stay inside this module.

use std::collections::HashMap;
use std::time::Instant;

use kb_format::{Meta, OpKind, Record, Strings, TensorMeta};
use serde::Serialize;

use crate::error::{Error, Result, fmt_ns};
use crate::ops::{self, GemmBackend, Plan};
use crate::plane::{DataPlane, PlaneError, fmt_extents};

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Most bytes one op may read or write, and one output tensor may hold.
    pub max_bytes: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            max_bytes: crate::plane::DEFAULT_MAX_BYTES,
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub records: u64,
    /// Ops executed, by kind.
    pub memory: u64,
    pub gemm: u64,
    pub math: u64,
    /// Records of kinds this build does not know, skipped.
    pub unknown_skipped: u64,
    /// Fingerprints recomputed and matched.
    pub fingerprints_checked: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// 2mnk summed over gemm ops.
    pub gemm_flops: u64,
    /// Seconds spent applying effects.
    pub replay_seconds: f64,
}

#[derive(Debug, Clone, Copy)]
struct Eff {
    seq: u64,
    write: bool,
    op_id: u64,
    idx: usize,
}

fn op_error(r: &Record, strings: &Strings, detail: String) -> Error {
    Error::Op {
        op_id: r.op_id,
        component: strings.name(r.component).into_owned(),
        op_name: strings.name(r.op_name).into_owned(),
        time: fmt_ns(r.t_start),
        detail,
    }
}

/// Collects a trace and replays it onto a [`DataPlane`].
#[derive(Debug)]
pub struct Replayer {
    tensors: Vec<TensorMeta>,
    plane: DataPlane,
    records: Vec<Record>,
}

impl Replayer {
    pub fn new(meta: &Meta, opts: &ReplayOptions) -> Replayer {
        Replayer {
            tensors: meta.tensors.clone(),
            plane: DataPlane::new(&meta.tensors, opts.max_bytes),
            records: Vec::new(),
        }
    }

    /// Host-provided bytes of a tensor (a tensor chunk).
    pub fn load_host(&mut self, tensor: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.plane
            .load_host(tensor, offset, data)
            .map_err(|e| Error::Trace(format!("tensor data chunk: {e}")))
    }

    /// A decoded record, in stream order.
    pub fn push(&mut self, r: Record) {
        self.records.push(r);
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn plane(&self) -> &DataPlane {
        &self.plane
    }

    pub fn tensors(&self) -> &[TensorMeta] {
        &self.tensors
    }

    /// Apply every effect in seq order. `strings` names components and ops
    /// in errors. On error the plane holds the effects applied before it.
    pub fn run(&mut self, strings: &Strings, backend: &dyn GemmBackend) -> Result<Stats> {
        let start = Instant::now();
        let Replayer {
            tensors,
            plane,
            records,
        } = self;
        let tensors: &[TensorMeta] = tensors;
        let mut stats = Stats {
            records: records.len() as u64,
            ..Stats::default()
        };
        let mut plans = Vec::with_capacity(records.len());
        let mut effects = Vec::with_capacity(records.len() * 2);
        for (idx, r) in records.iter().enumerate() {
            let plan = ops::plan(r).map_err(|d| op_error(r, strings, d))?;
            plans.push(plan);
            match r.kind {
                OpKind::Memory => stats.memory += 1,
                OpKind::Gemm => stats.gemm += 1,
                OpKind::Math => stats.math += 1,
                OpKind::Unknown(_) => {
                    stats.unknown_skipped += 1;
                    continue;
                }
            }
            stats.gemm_flops = stats.gemm_flops.saturating_add(ops::flops(r));
            if let (Some(rd), Some(wr)) = (&r.read, &r.write)
                && wr.seq < rd.seq
            {
                return Err(op_error(
                    r,
                    strings,
                    format!(
                        "its write (seq {}) comes before its read (seq {})",
                        wr.seq, rd.seq
                    ),
                ));
            }
            for (e, write) in [(&r.read, false), (&r.write, true)] {
                if let Some(e) = e {
                    effects.push(Eff {
                        seq: e.seq,
                        write,
                        op_id: r.op_id,
                        idx,
                    });
                }
            }
        }
        effects.sort_unstable_by_key(|e| (e.seq, e.write, e.op_id));

        let mut held: HashMap<usize, Vec<u8>> = HashMap::new();
        for e in effects {
            let r = &records[e.idx];
            let plan = plans[e.idx];
            let err = |d: String| op_error(r, strings, d);
            if !e.write {
                let Some(read) = &r.read else { continue };
                let mut bytes = Vec::new();
                plane.gather(&read.ranges, &mut bytes).map_err(|x| {
                    err(format!(
                        "reading {}: {x}",
                        fmt_extents(&read.ranges, tensors)
                    ))
                })?;
                stats.bytes_read += bytes.len() as u64;
                let write_len = match &r.write {
                    Some(w) => Some(plane.extent_bytes(&w.ranges).map_err(|x| {
                        err(format!("writing {}: {x}", fmt_extents(&w.ranges, tensors)))
                    })?),
                    None => None,
                };
                match plan {
                    Plan::Skip => {}
                    Plan::Move => {
                        if let Some(fp) = r.fingerprint {
                            let got = kb_format::fingerprint(&bytes);
                            if got != fp {
                                return Err(err(format!(
                                    "fingerprint mismatch: the trace records {fp:#018x}, but the \
                                     {} bytes replay read at {} hash to {got:#018x}; read {}; \
                                     write {}",
                                    bytes.len(),
                                    fmt_ns(read.time),
                                    fmt_extents(&read.ranges, tensors),
                                    r.write.as_ref().map_or("(none)".into(), |w| fmt_extents(
                                        &w.ranges, tensors
                                    )),
                                )));
                            }
                            stats.fingerprints_checked += 1;
                        }
                        if let Some(wl) = write_len {
                            if wl != bytes.len() as u64 {
                                return Err(err(format!(
                                    "reads {} bytes ({}) but writes {wl} bytes ({})",
                                    bytes.len(),
                                    fmt_extents(&read.ranges, tensors),
                                    r.write
                                        .as_ref()
                                        .map_or(String::new(), |w| fmt_extents(&w.ranges, tensors)),
                                )));
                            }
                            held.insert(e.idx, bytes);
                        }
                    }
                    Plan::Compute { input, output } => {
                        if input != bytes.len() as u64 {
                            return Err(err(format!(
                                "its operands take {input} bytes, but its read ranges ({}) hold {}",
                                fmt_extents(&read.ranges, tensors),
                                bytes.len()
                            )));
                        }
                        if let Some(wl) = write_len {
                            if wl != output {
                                return Err(err(format!(
                                    "its output takes {output} bytes, but its write ranges hold {wl}"
                                )));
                            }
                            let out = ops::compute(r, &bytes, backend).map_err(err)?;
                            held.insert(e.idx, out);
                        }
                    }
                }
            } else {
                let Some(write) = &r.write else { continue };
                let data = match held.remove(&e.idx) {
                    Some(d) => d,
                    // No read effect: nothing was gathered.
                    None => match plan {
                        Plan::Skip => continue,
                        Plan::Move => Vec::new(),
                        Plan::Compute { input, output } => {
                            if input != 0 {
                                return Err(err(format!(
                                    "its operands take {input} bytes, but it has no read effect"
                                )));
                            }
                            let wl = plane.extent_bytes(&write.ranges).map_err(|x| {
                                err(format!(
                                    "writing {}: {x}",
                                    fmt_extents(&write.ranges, tensors)
                                ))
                            })?;
                            if wl != output {
                                return Err(err(format!(
                                    "its output takes {output} bytes, but its write ranges hold {wl}"
                                )));
                            }
                            ops::compute(r, &[], backend).map_err(err)?
                        }
                    },
                };
                let n = data.len() as u64;
                plane.scatter(&write.ranges, &data).map_err(|x| {
                    let what = match x {
                        PlaneError::LengthMismatch { data, ranges } => {
                            format!("has {data} bytes to write, but its write ranges hold {ranges}")
                        }
                        x => x.to_string(),
                    };
                    err(format!(
                        "writing {} at {}: {what}",
                        fmt_extents(&write.ranges, tensors),
                        fmt_ns(write.time)
                    ))
                })?;
                stats.bytes_written += n;
            }
        }
        stats.replay_seconds = start.elapsed().as_secs_f64();
        Ok(stats)
    }
}
