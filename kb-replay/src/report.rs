//! The JSON report (`--report`) and the human summary on stderr.
//!
//! JSON numbers that are not finite (an infinite relative error, a NaN
//! output value) are written as the strings `"inf"`, `"-inf"` and `"nan"`.

use serde_json::{Value, json};

use crate::engine::Stats;
use crate::verify::{OutputReport, TolSource};

/// A finite number as a JSON number, anything else as a string.
pub fn num(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("nan")
    } else if v > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

/// A compact error magnitude: `0`, or three significant digits.
fn err(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:.3e}")
    }
}

/// An output's PASS or FAIL line. Both state the allclose rule an element
/// passes by and the worst element's margin against it, so a PASS with a
/// large relative error reads as what it is, and the tolerance, with a
/// note when the trace's is looser than the dtype's default.
fn output_line(o: &OutputReport) -> String {
    // Each value with where it came from.
    let from = |src: TolSource, flag: &str| match src {
        TolSource::Default => format!("the {} default", o.dtype),
        TolSource::Trace => "the trace".to_string(),
        TolSource::Flag => flag.to_string(),
    };
    let mut tol = format!(
        "rtol {:e} from {}, atol {:e} from {}",
        o.tolerance.rtol,
        from(o.rtol_from, "--rtol"),
        o.tolerance.atol,
        from(o.atol_from, "--atol")
    );
    if let Some(note) = o.tolerance_note() {
        tol = format!("{tol}; {note}");
    }
    let worst = o.worst.as_ref().map_or(String::new(), |(index, margin)| {
        format!("; worst |got - ref| / (atol + rtol |ref|) = {margin:.3} at {index:?}")
    });
    if o.pass {
        format!(
            "PASS {} {} {:?}: every element within atol + rtol |ref|{worst}; max abs err {}, max rel err {} ({tol}; {})",
            o.name,
            o.dtype,
            o.shape,
            err(o.max_abs_err),
            err(o.max_rel_err),
            o.reference
        )
    } else {
        let first = o.first_mismatch.as_ref().map_or(String::new(), |m| {
            format!(
                "; first at {:?}: got {}, expected {}",
                m.index, m.got, m.expected
            )
        });
        format!(
            "FAIL {} {} {:?}: {} of {} elements outside atol + rtol |ref|{worst}; max abs err {}, max rel err {} ({tol}; {}){first}",
            o.name,
            o.dtype,
            o.shape,
            o.mismatches,
            o.elements,
            err(o.max_abs_err),
            err(o.max_rel_err),
            o.reference
        )
    }
}

/// Everything one run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub trace: String,
    pub stats: Stats,
    /// `None` when verification was not asked for.
    pub outputs: Option<Vec<OutputReport>>,
    pub wall_seconds: f64,
    /// The GEMM backend and the worker threads.
    pub backend: String,
    pub threads: usize,
    /// Which fingerprints were checked (`all`, `sample`, `off`).
    pub fingerprints: String,
    /// `--allow-unknown`: verification may pass with ops of unknown kinds
    /// skipped (what they computed then goes unchecked).
    pub allow_unknown: bool,
}

impl Report {
    /// True when the replay succeeded and every checked output passed
    /// (and, verifying, no op of an unknown kind was skipped, unless
    /// allowed: a forged kind byte must not turn an op off unnoticed).
    pub fn pass(&self) -> bool {
        !self.unknown_blocks()
            && self
                .outputs
                .as_ref()
                .is_none_or(|o| o.iter().all(|r| r.pass))
    }

    /// Verifying, ops of unknown kinds were skipped without
    /// `--allow-unknown`.
    fn unknown_blocks(&self) -> bool {
        self.outputs.is_some() && self.stats.unknown_skipped > 0 && !self.allow_unknown
    }

    /// The FAIL line for skipped unknown ops, when they fail verification.
    fn unknown_line(&self) -> Option<String> {
        self.unknown_blocks().then(|| {
            format!(
                "FAIL: {} ops of kinds this kb-replay does not know were skipped, so what they computed is not checked (--allow-unknown verifies without them)",
                self.stats.unknown_skipped
            )
        })
    }

    /// GEMM throughput of the replay on this host, in GFLOP/s: how fast
    /// the host replayed the trace, not the simulated machine's speed
    /// (that is kb-sim's: `kb-inspect stats`).
    pub fn gflops(&self) -> f64 {
        if self.stats.replay_seconds > 0.0 {
            self.stats.gemm_flops as f64 / self.stats.replay_seconds / 1e9
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> Value {
        let s = &self.stats;
        let outputs: Vec<Value> = self
            .outputs
            .iter()
            .flatten()
            .map(|o| {
                json!({
                    "name": o.name,
                    "dtype": o.dtype.name(),
                    "shape": o.shape,
                    "reference": o.reference,
                    "rtol": o.tolerance.rtol,
                    "atol": o.tolerance.atol,
                    "rtol_from": o.rtol_from.name(),
                    "atol_from": o.atol_from.name(),
                    "tolerance_note": o.tolerance_note(),
                    "elements": o.elements,
                    "max_abs_err": num(o.max_abs_err),
                    "max_rel_err": num(o.max_rel_err),
                    "mismatches": o.mismatches,
                    "first_mismatch": o.first_mismatch.as_ref().map(|m| json!({
                        "index": m.index,
                        "got": num(m.got),
                        "expected": num(m.expected),
                    })),
                    "worst": o.worst.as_ref().map(|(index, margin)| json!({
                        "index": index,
                        "margin": num(*margin),
                    })),
                    "pass": o.pass,
                })
            })
            .collect();
        json!({
            "tool": "kb-replay",
            "version": env!("CARGO_PKG_VERSION"),
            "trace": self.trace,
            "pass": self.pass(),
            "verified": self.outputs.is_some(),
            "outputs": outputs,
            "records": s.records,
            "ops": { "memory": s.memory, "gemm": s.gemm, "math": s.math, "atomic": s.atomic },
            "sync_records": s.sync,
            "unknown_ops_skipped": s.unknown_skipped,
            "fingerprints": self.fingerprints,
            "fingerprints_checked": s.fingerprints_checked,
            "fingerprints_reused": s.fingerprints_reused,
            "fingerprints_skipped": s.fingerprints_skipped,
            "fingerprint_bytes": s.fingerprint_bytes,
            "bytes_read": s.bytes_read,
            "bytes_written": s.bytes_written,
            "bytes_copied": s.bytes_copied,
            "bytes_copied_per_gemm_flop": num(s.bytes_copied_per_gemm_flop()),
            "gemm_flops": s.gemm_flops,
            "gflops": num(self.gflops()),
            "replay_seconds": num(s.replay_seconds),
            "wall_seconds": num(self.wall_seconds),
            "backend": self.backend,
            "threads": self.threads,
            "engine": {
                "windows": s.windows,
                "max_window_effects": s.max_window_effects,
                "max_pending_records": s.max_pending_records,
                "tasks": s.tasks,
                "gemm_batches": s.gemm_batches,
                "gemm_batched_ops": s.gemm_batched_ops,
                "copies_elided": s.copies_elided,
                "materialized": s.materialized,
                "captured": s.captured,
                "gemms_fused": s.gemms_fused,
                "gemm_in_place": s.gemm_in_place,
                "plan_seconds": num(s.plan_seconds),
                "queue_seconds": num(s.queue_seconds),
                "serial_seconds": num(s.serial_seconds),
            },
        })
    }

    /// The FAIL line of each output that failed (what `--quiet` keeps).
    pub fn failures(&self) -> Vec<String> {
        self.outputs
            .iter()
            .flatten()
            .filter(|o| !o.pass)
            .map(output_line)
            .chain(self.unknown_line())
            .collect()
    }

    /// Human-readable lines: one per output, then a summary.
    pub fn summary(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.outputs.iter().flatten().map(output_line).collect();
        lines.extend(self.unknown_line());
        let s = &self.stats;

        let verdict = match &self.outputs {
            None => "replay OK (not verified)".to_string(),
            Some(o) => {
                let failed = o.iter().filter(|r| !r.pass).count();
                if failed == 0 && self.unknown_blocks() {
                    format!(
                        "verification FAILED ({} outputs passed, but {} unknown ops were skipped)",
                        o.len(),
                        s.unknown_skipped
                    )
                } else if failed == 0 {
                    format!("verification PASSED ({} outputs)", o.len())
                } else {
                    format!("verification FAILED ({failed} of {} outputs)", o.len())
                }
            }
        };
        let skipped = if s.fingerprints_skipped > 0 {
            format!(
                " ({} not checked: --fingerprints {})",
                s.fingerprints_skipped, self.fingerprints
            )
        } else {
            String::new()
        };
        // Atomics are named only in traces that have them.
        let atomic = if s.atomic > 0 {
            format!(", atomic {}", s.atomic)
        } else {
            String::new()
        };
        lines.push(format!(
            "{} ops replayed (memory {}, gemm {}, math {}{atomic}; {} sync records, {} unknown skipped), {} fingerprints checked{skipped}; replayed in {:.3} s at {:.2} GFLOP/s on this host (the host's replay speed, not the simulated machine's); {verdict}",
            s.memory + s.gemm + s.math + s.atomic,
            s.memory,
            s.gemm,
            s.math,
            s.sync,
            s.unknown_skipped,
            s.fingerprints_checked,
            s.replay_seconds,
            self.gflops(),
        ));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::{Mismatch, TolSource};
    use kb_format::{Dtype, Tolerance};

    fn output(pass: bool) -> OutputReport {
        OutputReport {
            name: "y".into(),
            dtype: Dtype::F32,
            shape: vec![2, 2],
            reference: "spec".into(),
            tolerance: Tolerance {
                rtol: 1e-5,
                atol: 1e-5,
            },
            rtol_from: TolSource::Default,
            atol_from: TolSource::Default,
            elements: 4,
            max_abs_err: if pass { 0.0 } else { 1.0 },
            max_rel_err: f64::INFINITY,
            mismatches: if pass { 0 } else { 1 },
            first_mismatch: (!pass).then(|| Mismatch {
                index: vec![1, 0],
                got: 3.0,
                expected: 2.0,
            }),
            worst: Some((vec![1, 0], if pass { 0.41 } else { 1e5 })),
            pass,
        }
    }

    #[test]
    fn json_and_summary_carry_the_verdict() {
        let mut r = Report {
            trace: "t".into(),
            stats: Stats::default(),
            outputs: Some(vec![output(true), output(false)]),
            wall_seconds: 0.5,
            backend: "gemm".into(),
            threads: 2,
            fingerprints: "all".into(),
            allow_unknown: false,
        };
        assert!(!r.pass());
        let j = r.to_json();
        assert_eq!(j["pass"], false);
        assert_eq!(j["outputs"][1]["first_mismatch"]["index"], json!([1, 0]));
        assert_eq!(j["outputs"][0]["first_mismatch"], Value::Null);
        assert_eq!(j["outputs"][0]["max_rel_err"], "inf");
        let lines = r.summary();
        assert!(lines[0].starts_with("PASS y"));
        assert!(
            lines[0].contains("worst |got - ref| / (atol + rtol |ref|) = 0.410 at [1, 0]"),
            "{}",
            lines[0]
        );
        assert!(lines[1].starts_with("FAIL y"));
        assert!(lines[1].contains("= 100000.000 at [1, 0]"), "{}", lines[1]);
        assert_eq!(r.failures(), [lines[1].clone()]);
        assert_eq!(j["outputs"][0]["worst"]["margin"], 0.41);
        assert!(
            lines[1].contains("first at [1, 0]: got 3, expected 2"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("FAILED (1 of 2"));
        assert_eq!(j["outputs"][0]["rtol_from"], "default");
        assert_eq!(j["outputs"][0]["tolerance_note"], Value::Null);
        assert!(!lines[0].contains("looser"), "{}", lines[0]);
        // A trace's tolerance looser than the default is named in the
        // line (a FAIL line too, which --quiet keeps) and the JSON.
        for o in r.outputs.as_mut().unwrap() {
            o.tolerance.atol = 1e-3;
            o.atol_from = TolSource::Trace;
        }
        let note = "atol from the trace, looser than the f32 default 1e-5";
        assert!(r.summary()[0].contains(note), "{}", r.summary()[0]);
        assert!(r.failures()[0].contains(note), "{}", r.failures()[0]);
        let j = r.to_json();
        assert_eq!(j["outputs"][1]["atol_from"], "trace");
        assert!(
            j["outputs"][1]["tolerance_note"]
                .as_str()
                .unwrap()
                .starts_with(note)
        );
        r.outputs = None;
        assert!(r.pass());
        assert_eq!(r.to_json()["verified"], false);
    }

    #[test]
    fn skipped_unknown_ops_fail_verification_unless_allowed() {
        let mut r = Report {
            trace: "t".into(),
            stats: Stats {
                unknown_skipped: 3,
                ..Stats::default()
            },
            outputs: Some(vec![output(true)]),
            wall_seconds: 0.5,
            backend: "gemm".into(),
            threads: 2,
            fingerprints: "all".into(),
            allow_unknown: false,
        };
        assert!(!r.pass());
        assert_eq!(r.to_json()["pass"], false);
        let fail = "FAIL: 3 ops of kinds this kb-replay does not know were skipped";
        assert!(r.failures()[0].starts_with(fail), "{:?}", r.failures());
        let lines = r.summary();
        assert!(lines[1].starts_with(fail));
        assert!(
            lines[2]
                .contains("verification FAILED (1 outputs passed, but 3 unknown ops were skipped)"),
            "{}",
            lines[2]
        );
        // Allowed, or not verifying: no verdict on them.
        r.allow_unknown = true;
        assert!(r.pass() && r.failures().is_empty());
        assert!(r.summary().last().unwrap().contains("verification PASSED"));
        r.allow_unknown = false;
        r.outputs = None;
        assert!(r.pass());
    }
}
