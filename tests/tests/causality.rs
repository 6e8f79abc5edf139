//! Traces that explain themselves: every op of a launch has a recorded
//! cause, and following the latest-ending cause back from a launch's end
//! reaches its start (its kernels' start, on record), on the workloads an
//! architect reads first.

use std::collections::HashMap;

use kb_e2e::*;
use kb_format::{Event, Launch, OpKind, Record, StreamReader};

/// A `kb-sim` trace of `args`: its records with their names (component,
/// op name), and its launches.
fn simulate(args: &[&str]) -> (Vec<(Record, String, String)>, Vec<Launch>) {
    let mut a = vec!["-q", "-o", "-"];
    a.extend_from_slice(args);
    let o = run("kb-sim", &a, b"");
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let mut reader = StreamReader::open(&o.stdout[..]).unwrap();
    let mut records = Vec::new();
    let mut r = Record::default();
    while let Some(ev) = reader.next_event().unwrap() {
        if let Event::Records(mut c) = ev {
            while c.next_into(&mut r).unwrap() {
                let s = c.strings();
                let names = (
                    s.name(r.component).into_owned(),
                    s.name(r.op_name).into_owned(),
                );
                records.push((r.clone(), names.0, names.1));
            }
        }
    }
    (records, reader.launches().to_vec())
}

#[test]
fn every_op_of_a_launch_has_a_cause_and_the_causes_reach_its_start() {
    for bench in ["tp_mlp", "attention", "gemm_tiled"] {
        let (records, launches) = simulate(&["-t", "default", "-b", bench]);
        let by_id: HashMap<u64, &Record> = records.iter().map(|(r, _, _)| (r.op_id, r)).collect();
        let names: HashMap<u64, &str> = records
            .iter()
            .map(|(r, _, n)| (r.op_id, n.as_str()))
            .collect();
        for l in &launches {
            let within = records
                .iter()
                .filter(|(r, _, _)| r.t_start >= l.t_start && r.t_end <= l.t_end);
            let mut counted = 0;
            for (r, c, n) in within {
                counted += 1;
                assert!(
                    !r.deps.is_empty(),
                    "{bench}: op {} ({n} on {c}) has no cause",
                    r.op_id
                );
                for d in &r.deps {
                    assert!(
                        by_id.contains_key(&d.op),
                        "{bench}: op {} -> {d:?}",
                        r.op_id
                    );
                }
            }
            assert!(counted > 100, "{bench}: {counted} ops in the launch");
            // The launch ends with a kernel's end; walk back along the
            // latest-ending cause: each step goes to an earlier end, and
            // the chain reaches the launch's own record, which ends when
            // its kernels start.
            let (end, _, _) = records
                .iter()
                .filter(|(r, _, n)| n == "kernel_end" && r.t_end == l.t_end)
                .max_by_key(|(r, _, _)| r.op_id)
                .unwrap_or_else(|| panic!("{bench}: no kernel_end at the launch's end"));
            let mut at = end;
            let mut steps = 0;
            while at.t_end > l.t_start
                && let Some(d) = at
                    .deps
                    .iter()
                    .filter_map(|d| by_id.get(&d.op))
                    .filter(|d| d.t_end <= at.t_end)
                    .max_by_key(|d| (d.t_end, d.op_id))
            {
                at = d;
                steps += 1;
            }
            let name = names[&at.op_id];
            assert!(
                ["launch", "kernel_start"].contains(&name)
                    && (at.kind, at.t_end) == (OpKind::Sync, l.t_start),
                "{bench}: the walk stopped at op {} ({name}, ending at {} ps) after {steps} steps",
                at.op_id,
                at.t_end
            );
            assert!(steps > 5, "{bench}: {steps} steps");
        }
    }
}

#[test]
fn the_critical_path_of_a_launch_is_its_whole_span_explained() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.kbt");
    let t = t.to_str().unwrap();
    for bench in ["tp_mlp", "attention", "gemm_tiled"] {
        let sim = run(
            "kb-sim",
            &["-q", "-t", "default", "-b", bench, "-o", t],
            b"",
        );
        assert!(sim.status.success(), "{}", stderr(&sim));
        let o = run(
            "kb-inspect",
            &["critical-path", t, "--launch", "0", "--format", "json"],
            b"",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let ps = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
        assert_eq!(ps("unexplained_ps"), 0, "{bench}: {}", v["summary"]);
        assert_eq!(ps("op_ps") + ps("wait_ps"), ps("span_ps"), "{bench}");
        // The segments tile the launch: each starts where the last ended.
        let segs = v["segments"].as_array().unwrap();
        let mut at = ps("start_ps");
        for s in segs {
            assert_eq!(s["start_ps"].as_u64(), Some(at), "{bench}: {s}");
            at = s["end_ps"].as_u64().unwrap();
        }
        assert_eq!(at, ps("end_ps"), "{bench}");
        // Most of the span is ops, not waits between them.
        assert!(ps("op_ps") * 10 > ps("span_ps") * 9, "{bench}: {v}");
    }
}
