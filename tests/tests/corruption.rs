//! Every truncation and many corruptions of a real trace make kb-replay and
//! kb-inspect exit 2 with a message, never panic.

use kb_e2e::*;

fn small_trace() -> Vec<u8> {
    let o = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "copy",
            "-o",
            "-",
            "-p",
            "rows=8",
            "-p",
            "cols=8",
            "-p",
            "tile_rows=2",
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    o.stdout
}

/// Both tools reject `bytes` read from a file and, when `stdin_too`, from stdin.
fn check_rejected(bytes: &[u8], dir: &std::path::Path, what: &str, stdin_too: bool) {
    let p = dir.join("t.kbt");
    std::fs::write(&p, bytes).unwrap();
    let p = p.to_str().unwrap();
    assert_clean_error(
        &run("kb-replay", &[p, "--verify"], b""),
        &format!("kb-replay file, {what}"),
    );
    assert_clean_error(
        &run("kb-inspect", &["summary", p], b""),
        &format!("kb-inspect file, {what}"),
    );
    if stdin_too {
        assert_clean_error(
            &run("kb-replay", &["-", "--verify"], bytes),
            &format!("kb-replay stdin, {what}"),
        );
        assert_clean_error(
            &run("kb-inspect", &["summary", "-"], bytes),
            &format!("kb-inspect stdin, {what}"),
        );
    }
}

#[test]
fn every_truncation_is_a_clean_error() {
    let t = small_trace();
    assert!(
        t.len() < 8192,
        "sample trace should stay small, is {} bytes",
        t.len()
    );
    let dir = tempfile::tempdir().unwrap();
    // Every offset through a file; stdin at every 5th offset, since the
    // stream reader is also covered byte by byte by kb-format's own tests.
    for cut in 0..t.len() {
        check_rejected(
            &t[..cut],
            dir.path(),
            &format!("cut at {cut}"),
            cut % 5 == 0,
        );
    }
    // A cut in a pipe says it was truncated.
    let o = run("kb-replay", &["--verify"], &t[..t.len() / 2]);
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
}

#[test]
fn corrupted_bytes_are_clean_errors() {
    let t = small_trace();
    let dir = tempfile::tempdir().unwrap();
    let step = (t.len() / 400).max(1);
    for at in (0..t.len()).step_by(step) {
        let mut bad = t.clone();
        bad[at] ^= 0x20;
        check_rejected(&bad, dir.path(), &format!("flip at {at}"), true);
    }
}

/// A real `softmax` trace with one `exp` grown 4096-fold in rows, its
/// params and ranges kept consistent and the trace written anew (every
/// checksum right): what a forger can do, as the format is public.
fn forged_softmax() -> (Vec<u8>, u64) {
    use kb_format::{Event, MathInput, Params, Record, StreamReader, TraceWriter};
    let o = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "small",
            "-b",
            "softmax",
            "-p",
            "rows=16",
            "-p",
            "cols=64",
            "-p",
            "block_rows=4",
            "-o",
            "-",
        ],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut reader = StreamReader::open(&o.stdout[..]).unwrap();
    let meta = reader.meta().clone();
    let mut tensors = Vec::new();
    let mut records: Vec<(Record, String, String)> = Vec::new();
    let mut r = Record::default();
    while let Some(ev) = reader.next_event().unwrap() {
        match ev {
            Event::Tensor {
                tensor,
                offset,
                data,
            } => tensors.push((tensor, offset, data.to_vec())),
            Event::Records(mut c) => {
                while c.next_into(&mut r).unwrap() {
                    let s = c.strings();
                    let names = (
                        s.name(r.component).into_owned(),
                        s.name(r.op_name).into_owned(),
                    );
                    records.push((r.clone(), names.0, names.1));
                }
            }
            Event::Snapshot { .. } => {}
        }
    }
    let (verify, launches) = (
        reader.verify_spec().unwrap().clone(),
        reader.launches().to_vec(),
    );
    let grow = 4096;
    let (victim, _, _) = records
        .iter_mut()
        .find(|(_, _, n)| n == "exp")
        .expect("softmax has an exp");
    let Params::Math(m) = &mut victim.params else {
        panic!("math params")
    };
    m.rows *= grow;
    for i in &mut m.inputs {
        if let MathInput::Tile { rows, .. } = i {
            *rows *= grow;
        }
    }
    for e in [&mut victim.read, &mut victim.write].into_iter().flatten() {
        for x in &mut e.ranges {
            x.len *= grow as u64 * x.rows.max(1) as u64;
            x.rows = 1;
            x.stride = 0;
        }
    }
    let id = victim.op_id;
    let mut w = TraceWriter::new(Vec::new(), &meta).unwrap();
    for (t, off, data) in &tensors {
        w.tensor_data(*t, *off, data).unwrap();
    }
    for (mut rec, comp, name) in records {
        rec.component = w.intern(&comp);
        rec.op_name = w.intern(&name);
        w.push(rec).unwrap();
    }
    (w.finish_with_launches(&launches, &verify).unwrap(), id)
}

#[test]
fn a_consistently_forged_op_is_refused_before_it_allocates() {
    let (bytes, op) = forged_softmax();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("forged.kbt");
    std::fs::write(&p, &bytes).unwrap();
    for out in [
        run("kb-replay", &[p.to_str().unwrap(), "--verify"], b""),
        run("kb-replay", &["--verify"], &bytes),
    ] {
        assert_clean_error(&out, "forged exp");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("op {op} (exp on sip0.cube0.pe"))
                && err.contains(
                    "runs past the end of its TCM (1048576 bytes, as the trace's topology declares)"
                ),
            "{err}"
        );
    }
}

#[test]
fn two_traces_in_one_file_are_named_as_such() {
    let one = small_trace();
    let mut two = one.clone();
    two.extend_from_slice(&one);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("two.kbt");
    std::fs::write(&p, &two).unwrap();
    let p = p.to_str().unwrap();
    for (tool, args) in [
        ("kb-replay", vec![p, "--verify"]),
        ("kb-inspect", vec!["summary", p]),
    ] {
        let out = run(tool, &args, b"");
        assert_clean_error(&out, tool);
        assert!(
            stderr(&out).contains("two traces concatenated?"),
            "{tool}: {}",
            stderr(&out)
        );
    }
    // Through a pipe the first trace ends, and the rest is named.
    let out = run("kb-replay", &["--verify"], &two);
    assert_clean_error(&out, "stdin");
    assert!(
        stderr(&out).contains("bytes after the trailer"),
        "{}",
        stderr(&out)
    );
}
