//! Statistics a replay gathers: [`Stats`] (the report's counters) and the
//! [`Delta`] each node adds to them.

use serde::Serialize;

/// What a replay did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub records: u64,
    /// Ops executed, by kind.
    pub memory: u64,
    pub gemm: u64,
    pub math: u64,
    /// Atomic read-modify-writes.
    pub atomic: u64,
    /// Sync records (kernels, waits, signals, launches, map messages):
    /// timing only, nothing to replay.
    pub sync: u64,
    /// Records of kinds this build does not know, skipped.
    pub unknown_skipped: u64,
    /// Fingerprints checked and matched (each by a hash of the bytes it
    /// names, or by an earlier check of the same unchanged bytes: see
    /// `fingerprints_reused`).
    pub fingerprints_checked: u64,
    /// Of those, checked by the hash of an earlier op that read the same
    /// bytes, unchanged since, with the same recorded fingerprint.
    pub fingerprints_reused: u64,
    /// Recorded fingerprints not checked (`--fingerprints sample|off`).
    pub fingerprints_skipped: u64,
    /// Bytes hashed to check fingerprints.
    pub fingerprint_bytes: u64,
    /// Bytes the trace's effects read and wrote (what Phase 1 moved).
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes replay copied to apply them: memory ops done physically,
    /// materialized aliases, operands decoded or gathered into buffers,
    /// outputs written from buffers (an operand read where it lies and an
    /// output computed in place count nothing).
    pub bytes_copied: u64,
    /// Memory ops applied as lazy copies (nothing copied).
    pub copies_elided: u64,
    /// Lazy copies done after all, because their source was about to be
    /// overwritten or their destination cut by a strided write.
    pub materialized: u64,
    /// GEMMs planned as links of a K-chain after its first (run by the
    /// chain's node, see `--no-fuse`): planning alone decides, so this
    /// does not depend on threads or timing.
    pub gemms_fused: u64,
    /// Memory ops whose read gathered their bytes for a later write:
    /// something overwrote them first, or the write comes in a later
    /// window.
    pub captured: u64,
    /// 2mnk summed over gemm ops.
    pub gemm_flops: u64,
    /// Seconds spent applying effects.
    pub replay_seconds: f64,
    /// Of those, seconds spent planning windows and building their
    /// dependency graphs (serial work).
    pub plan_seconds: f64,
    /// Seconds spent decoding records and queueing their effects in seq
    /// order (serial work, besides `replay_seconds`).
    pub queue_seconds: f64,
    /// Of `plan_seconds` and `queue_seconds`, the seconds during which no
    /// window ran: the part the threads wait for. With more than one
    /// thread a window runs while the next records are decoded and the
    /// next window is planned, so this is less than their sum.
    pub serial_seconds: f64,
    /// Windows applied, and the most effects one held.
    pub windows: u64,
    pub max_window_effects: u64,
    /// Most records held at once (waiting for their effects' turn).
    pub max_pending_records: u64,
    /// Tasks started in parallel windows (0 with one thread): a node, or
    /// a batched call of GEMMs. With more than one thread this and the
    /// batch counts depend on timing (what is ready when); the results
    /// never do.
    pub tasks: u64,
    /// Batched GEMM calls of two or more GEMMs, and the GEMMs in them.
    pub gemm_batches: u64,
    pub gemm_batched_ops: u64,
    /// GEMMs computed where their matrices lie: both operands read in
    /// place (TCM, HBM or host data, strided) and the output accumulated
    /// in its own bytes; no byte copied.
    pub gemm_in_place: u64,
}

impl Stats {
    /// Bytes copied per GEMM flop (0 without GEMMs).
    pub fn bytes_copied_per_gemm_flop(&self) -> f64 {
        if self.gemm_flops == 0 {
            0.0
        } else {
            self.bytes_copied as f64 / self.gemm_flops as f64
        }
    }
}

/// Counters a node adds to [`Stats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Delta {
    pub bytes_copied: u64,
    pub gemm_in_place: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, d: Delta) {
        self.bytes_copied += d.bytes_copied;
        self.gemm_in_place += d.gemm_in_place;
    }
}

impl Delta {
    pub(crate) fn add(&mut self, d: Delta) {
        self.bytes_copied += d.bytes_copied;
        self.gemm_in_place += d.gemm_in_place;
    }
}
