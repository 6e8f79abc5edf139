//! The writer's contracts: bounded memory, usage errors, AtomicFile.

mod common;

use common::*;
use kb_format::*;

/// Counts the bytes that reach the underlying writer.
#[derive(Debug, Default)]
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn memory_is_bounded_by_the_reorder_window_not_the_run() {
    let n = 50_000u64;
    let mut w = TraceWriter::new(Counter::default(), &sample_meta()).unwrap();
    let c = w.intern("c");
    let name = w.intern("n");
    let mut max_buffered = 0;
    // Records emitted since bytes last reached the output.
    let (mut last_written, mut emitted_then, mut max_held) = (w.bytes_written(), 0u64, 0u64);
    for i in 0..n {
        // Start times jitter by up to 3 steps around the op order.
        let mut r = sample_record(i, c, name);
        r.t_start = i * 100 + (i * 7919) % 300;
        r.t_end = r.t_start + 50;
        r.active = r.active.map(|_| (r.t_start + 20, r.t_start + 45));
        r.deps.clear();
        w.push(r).unwrap();
        // Ops created later start at or after (i + 1) * 100.
        w.advance((i + 1) * 100).unwrap();
        max_buffered = max_buffered.max(w.buffered());
        let emitted = w.counts().records;
        if w.bytes_written() != last_written {
            last_written = w.bytes_written();
            emitted_then = emitted;
        }
        max_held = max_held.max(emitted - emitted_then);
    }
    assert!(
        max_buffered <= 4,
        "reorder buffer held {max_buffered} records"
    );
    // Each sample record encodes to at least 20 bytes (the fingerprint
    // alone is 8), so one records chunk holds at most 64 KiB / 20 records:
    // emitted records reach the output at least that often.
    let per_chunk = writer::RECORDS_CHUNK_TARGET as u64 / 20;
    assert!(
        max_held > 100 && max_held <= per_chunk,
        "{max_held} records emitted but not written"
    );
    assert!(w.counts().records >= n - 4);
    let out = w.finish(&sample_verify()).unwrap();
    assert!(out.0 > n * 20, "{} bytes for {n} records", out.0);
}

#[test]
fn advance_releases_only_records_before_the_watermark() {
    let mut w = TraceWriter::new(Vec::new(), &Meta::default()).unwrap();
    let c = w.intern("c");
    for (id, t) in [(0u64, 30u64), (1, 10), (2, 20), (3, 20)] {
        w.push(Record {
            op_id: id,
            t_start: t,
            t_end: t,
            component: c,
            op_name: c,
            ..Default::default()
        })
        .unwrap();
    }
    w.advance(20).unwrap();
    assert_eq!(w.buffered(), 3);
    assert_eq!(w.counts().records, 1);
    // A lower watermark is not a step back.
    w.advance(5).unwrap();
    let e = w
        .push(Record {
            op_id: 4,
            t_start: 19,
            t_end: 19,
            component: c,
            op_name: c,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, FormatError::Usage(_)), "{e}");
    w.advance(31).unwrap();
    assert_eq!(w.buffered(), 0);
    let b = w.finish(&VerifySpec::default()).unwrap();
    let ids: Vec<u64> = read_stream(&b)
        .unwrap()
        .records
        .iter()
        .map(|r| r.op_id)
        .collect();
    assert_eq!(ids, [1, 2, 3, 0]);
}

#[test]
fn records_that_would_not_read_back_are_refused() {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let c = w.intern("c");
    let ok = || Record {
        op_id: 5,
        t_start: 10,
        t_end: 20,
        component: c,
        op_name: c,
        ..Default::default()
    };
    let math = MathParams {
        op: MathOp::Sum,
        inputs: vec![],
        out: Addr::default(),
        rows: 1,
        cols: 1,
        dtype: Dtype::F32,
        axis: None,
    };
    let bad = [
        ("before it starts", Record { t_end: 9, ..ok() }),
        (
            "not interned",
            Record {
                component: 9,
                ..ok()
            },
        ),
        (
            "do not match op kind",
            Record {
                kind: OpKind::Gemm,
                params: Params::Memory(MemoryParams::default()),
                ..ok()
            },
        ),
        (
            "do not match op kind",
            Record {
                kind: OpKind::Memory,
                params: Params::Raw(vec![1]),
                ..ok()
            },
        ),
        (
            "code of a known kind",
            Record {
                kind: OpKind::Unknown(1),
                ..ok()
            },
        ),
        (
            "axis 255",
            Record {
                kind: OpKind::Math,
                params: Params::Math(MathParams {
                    axis: Some(255),
                    ..math.clone()
                }),
                ..ok()
            },
        ),
        (
            "math inputs",
            Record {
                kind: OpKind::Math,
                params: Params::Math(MathParams {
                    inputs: vec![MathInput::Scalar(1.0); 65],
                    ..math.clone()
                }),
                ..ok()
            },
        ),
        (
            "does not precede",
            Record {
                deps: vec![Dep::data(1), Dep::data(5)],
                ..ok()
            },
        ),
        (
            "active interval [9, 15) ps is not within its span [10, 20] ps",
            Record {
                active: Some((9, 15)),
                ..ok()
            },
        ),
        (
            "not within its span",
            Record {
                active: Some((12, 21)),
                ..ok()
            },
        ),
        (
            "not within its span",
            Record {
                active: Some((15, 14)),
                ..ok()
            },
        ),
    ];
    for (what, r) in bad {
        let e = w.push(r).unwrap_err();
        assert!(
            matches!(&e, FormatError::Usage(m) if m.contains(what)),
            "{what}: {e}"
        );
    }
    assert_eq!(w.buffered(), 0);
    w.push(ok()).unwrap();
    // Tensor data must fit the tensor named in the metadata (64 bytes).
    assert!(matches!(
        w.tensor_data(2, 0, &[0]),
        Err(FormatError::Usage(_))
    ));
    assert!(matches!(
        w.tensor_data(0, 60, &[0; 5]),
        Err(FormatError::Usage(_))
    ));
    assert!(matches!(
        w.tensor_data(0, u64::MAX, &[0]),
        Err(FormatError::Usage(_))
    ));
    w.tensor_data(0, 60, &[0; 4]).unwrap();
    // Duplicate (t_start, op_id): caught when emitted.
    w.push(ok()).unwrap();
    let e = w.finish(&VerifySpec::default()).unwrap_err();
    assert!(
        matches!(&e, FormatError::Usage(m) if m.contains("duplicate")),
        "{e}"
    );
}

#[test]
fn active_intervals_within_the_span_are_written_and_read_back() {
    let mut w = TraceWriter::new(Vec::new(), &sample_meta()).unwrap();
    let c = w.intern("c");
    // The span's ends, an empty interval at either end, one inside.
    let actives = [
        Some((10, 20)),
        Some((20, 20)),
        Some((10, 10)),
        Some((12, 17)),
        None,
    ];
    for (i, &active) in actives.iter().enumerate() {
        w.push(Record {
            op_id: i as u64,
            t_start: 10,
            t_end: 20,
            component: c,
            op_name: c,
            active,
            ..Default::default()
        })
        .unwrap();
    }
    let b = w.finish(&VerifySpec::default()).unwrap();
    let got = read_stream(&b).unwrap();
    let back: Vec<_> = got.records.iter().map(|r| r.active).collect();
    assert_eq!(back, actives);
}

#[test]
fn atomic_file_dropped_without_commit_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("run.kbt");
    {
        let f = AtomicFile::create(&target).unwrap();
        let mut w = TraceWriter::new(f, &sample_meta()).unwrap();
        w.tensor_data(0, 0, &[1; 64]).unwrap();
        // While writing, only a temporary file exists, named after the target.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with(".run.kbt.partial"), "{names:?}");
        // Dropped: an error or a panic on the way.
    }
    assert!(!target.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn atomic_file_commit_produces_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("run.kbt");
    std::fs::write(&target, b"an older trace").unwrap();
    let f = AtomicFile::create(&target).unwrap();
    let mut w = TraceWriter::new(f, &sample_meta()).unwrap();
    let c = w.intern("c");
    w.push(sample_record(0, c, c)).unwrap();
    let f = w.finish(&sample_verify()).unwrap();
    // Until the commit, the old file is untouched.
    assert_eq!(std::fs::read(&target).unwrap(), b"an older trace");
    f.commit().unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file is left");
    let d = read_mmap(&target).unwrap();
    assert_eq!(d.records, vec![sample_record(0, c, c)]);
    assert_eq!(d, read_stream(&std::fs::read(&target).unwrap()).unwrap());
}

#[test]
fn atomic_file_goes_in_the_target_directory() {
    // The temporary file is made next to the target (so the rename stays
    // on one file system): a missing directory fails at create.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("sub").join("t.kbt");
    assert!(AtomicFile::create(&target).is_err(), "missing directory");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut f = AtomicFile::create(&target).unwrap();
    std::io::Write::write_all(&mut f, b"x").unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
        1
    );
    f.commit().unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"x");
    assert_eq!(
        std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
        1
    );
}

#[cfg(unix)]
#[test]
fn atomic_file_writes_a_special_target_in_place() {
    // `-o /dev/null` or a FIFO: renaming over it would replace the device
    // or pipe with a plain file. A FIFO stands in for /dev/null here.
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let mut f = AtomicFile::create(&fifo).unwrap();
    std::io::Write::write_all(&mut f, b"through the pipe").unwrap();
    f.commit().unwrap();
    // Checked before joining: a reader of a replaced FIFO waits forever.
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// An emitted record's effect and dependency vectors come back, empty and
/// with their capacity, for the producer's next records: a producer that
/// takes its vectors from the writer allocates none in steady state.
#[test]
fn emitted_records_hand_their_vectors_back() {
    let mut w = TraceWriter::new(std::io::sink(), &sample_meta()).unwrap();
    let c = w.intern("c");
    // Nothing emitted yet: a new, empty vector.
    assert_eq!(w.take_ranges().capacity(), 0);
    let mut ptrs = Vec::new();
    for i in 0..3 {
        let mut r = sample_record(i, c, c);
        r.deps = Vec::with_capacity(2);
        for e in [r.read.as_mut(), r.write.as_mut()].into_iter().flatten() {
            e.ranges.reserve(3);
            ptrs.push(e.ranges.as_ptr());
        }
        w.push(r).unwrap();
    }
    assert_eq!(w.take_ranges().capacity(), 0, "none emitted before advance");
    w.advance(u64::MAX).unwrap();
    let mut back = Vec::new();
    for _ in 0..ptrs.len() {
        let v = w.take_ranges();
        assert!(v.is_empty() && v.capacity() >= 4);
        back.push(v.as_ptr());
    }
    back.sort();
    ptrs.sort();
    assert_eq!(back, ptrs, "the same allocations");
    assert_eq!(w.take_ranges().capacity(), 0, "each one handed back once");
    let deps = w.take_deps();
    assert!(deps.is_empty() && deps.capacity() >= 2);
}

/// A math record's inputs vector comes back too.
#[test]
fn emitted_math_records_hand_their_inputs_back() {
    let mut w = TraceWriter::new(std::io::sink(), &sample_meta()).unwrap();
    let c = w.intern("c");
    let mut r = sample_record(0, c, c);
    r.kind = OpKind::Math;
    let inputs = vec![MathInput::Scalar(1.0), MathInput::Scalar(2.0)];
    let ptr = inputs.as_ptr();
    r.params = Params::Math(MathParams {
        op: MathOp::Add,
        inputs,
        out: Addr::default(),
        rows: 1,
        cols: 1,
        dtype: Dtype::F32,
        axis: None,
    });
    w.push(r).unwrap();
    assert_eq!(w.take_math_inputs().capacity(), 0, "not emitted yet");
    w.advance(u64::MAX).unwrap();
    let back = w.take_math_inputs();
    assert!(back.is_empty() && back.capacity() >= 2);
    assert_eq!(back.as_ptr(), ptr);
}

/// The names in `dir`, sorted.
#[cfg(unix)]
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Write `bytes` to `path` through an [`AtomicFile`] and commit, checking
/// on the way that the temporary file lies in `real_dir`.
#[cfg(unix)]
fn write_through(path: &std::path::Path, real_dir: &std::path::Path, bytes: &[u8]) {
    let mut f = AtomicFile::create(path).unwrap().remove_on_signal();
    let tmp = f.temporary_path().unwrap().to_path_buf();
    assert_eq!(
        tmp.parent().unwrap().canonicalize().unwrap(),
        real_dir.canonicalize().unwrap(),
        "{tmp:?}"
    );
    std::io::Write::write_all(&mut f, bytes).unwrap();
    f.commit().unwrap();
    assert!(!tmp.exists());
}

#[cfg(unix)]
fn assert_symlink(path: &std::path::Path) {
    let kind = std::fs::symlink_metadata(path).unwrap().file_type();
    assert!(kind.is_symlink(), "{path:?} was replaced: {kind:?}");
}

#[cfg(unix)]
#[test]
fn atomic_file_writes_through_a_symlink_to_its_target() {
    // `-o link.kbt` with link.kbt -> /elsewhere/real.kbt updates real.kbt
    // and keeps the link.
    use std::os::unix::fs::PermissionsExt;
    let links = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let target = real.path().join("real.kbt");
    std::fs::write(&target, b"an older trace").unwrap();
    let link = links.path().join("link.kbt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    write_through(&link, real.path(), b"the new trace");
    assert_symlink(&link);
    assert_eq!(std::fs::read_link(&link).unwrap(), target);
    assert_eq!(std::fs::read(&target).unwrap(), b"the new trace");
    assert_eq!(std::fs::read(&link).unwrap(), b"the new trace");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(names_in(links.path()), ["link.kbt"]);
    assert_eq!(names_in(real.path()), ["real.kbt"]);
}

#[cfg(unix)]
#[test]
fn atomic_file_follows_a_chain_of_symlinks() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let target = real.path().join("real.kbt");
    std::fs::write(&target, b"old").unwrap();
    let second = b.path().join("second");
    std::os::unix::fs::symlink(&target, &second).unwrap();
    let first = a.path().join("first");
    std::os::unix::fs::symlink(&second, &first).unwrap();
    write_through(&first, real.path(), b"new");
    assert_symlink(&first);
    assert_symlink(&second);
    assert_eq!(std::fs::read_link(&first).unwrap(), second);
    assert_eq!(std::fs::read_link(&second).unwrap(), target);
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    assert_eq!(names_in(a.path()), ["first"]);
    assert_eq!(names_in(b.path()), ["second"]);
    assert_eq!(names_in(real.path()), ["real.kbt"]);
}

#[cfg(unix)]
#[test]
fn atomic_file_resolves_a_relative_symlink_from_its_directory() {
    // dir/links/link -> ../data/real.kbt, and a relative link at the end
    // of a chain: each is taken relative to its own link's directory.
    let dir = tempfile::tempdir().unwrap();
    let links = dir.path().join("links");
    let data = dir.path().join("data");
    std::fs::create_dir(&links).unwrap();
    std::fs::create_dir(&data).unwrap();
    let target = data.join("real.kbt");
    std::fs::write(&target, b"old").unwrap();
    let link = links.join("link");
    std::os::unix::fs::symlink("../data/real.kbt", &link).unwrap();
    write_through(&link, &data, b"new");
    assert_symlink(&link);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        std::path::Path::new("../data/real.kbt")
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    // links/outer -> link (relative, same directory) -> ../data/real.kbt.
    let outer = links.join("outer");
    std::os::unix::fs::symlink("link", &outer).unwrap();
    write_through(&outer, &data, b"newer");
    assert_symlink(&outer);
    assert_symlink(&link);
    assert_eq!(std::fs::read(&target).unwrap(), b"newer");
    assert_eq!(names_in(&links), ["link", "outer"]);
    assert_eq!(names_in(&data), ["real.kbt"]);
}

#[cfg(unix)]
#[test]
fn atomic_file_creates_the_target_of_a_dangling_symlink() {
    let links = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let target = real.path().join("new.kbt");
    let link = links.path().join("link.kbt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    write_through(&link, real.path(), b"created");
    assert_symlink(&link);
    assert_eq!(std::fs::read(&target).unwrap(), b"created");
    assert_eq!(names_in(links.path()), ["link.kbt"]);
    assert_eq!(names_in(real.path()), ["new.kbt"]);
    // A dangling link into a missing directory fails, as a missing
    // directory does, and leaves the link.
    let gone = links.path().join("gone.kbt");
    std::os::unix::fs::symlink(real.path().join("no/such.kbt"), &gone).unwrap();
    assert!(AtomicFile::create(&gone).is_err());
    assert_symlink(&gone);
}

#[cfg(unix)]
#[test]
fn atomic_file_through_a_symlink_dropped_without_commit_leaves_the_target() {
    let links = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    let target = real.path().join("real.kbt");
    std::fs::write(&target, b"an older trace").unwrap();
    let link = links.path().join("link.kbt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    {
        let f = AtomicFile::create(&link).unwrap().remove_on_signal();
        let mut w = TraceWriter::new(f, &sample_meta()).unwrap();
        w.tensor_data(0, 0, &[1; 64]).unwrap();
        // The temporary file is beside the real target, named after it.
        let names = names_in(real.path());
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with(".real.kbt.partial"), "{names:?}");
        assert_eq!(names_in(links.path()), ["link.kbt"]);
        // Dropped: an error or a panic on the way.
    }
    assert_symlink(&link);
    assert_eq!(std::fs::read(&target).unwrap(), b"an older trace");
    assert_eq!(names_in(links.path()), ["link.kbt"]);
    assert_eq!(names_in(real.path()), ["real.kbt"]);
}

#[cfg(unix)]
#[test]
fn atomic_file_refuses_a_symlink_loop() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    assert!(AtomicFile::create(&a).is_err());
    assert_symlink(&a);
    assert_symlink(&b);
    assert_eq!(names_in(dir.path()), ["a", "b"]);
}

#[cfg(unix)]
#[test]
fn atomic_file_writes_a_symlinked_special_target_in_place() {
    // Like `/dev/stdout` -> a pipe: the link leads to a FIFO, written in
    // place; neither the link nor the FIFO is replaced.
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let link = dir.path().join("out");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let mut f = AtomicFile::create(&link).unwrap();
    assert!(f.temporary_path().is_none());
    std::io::Write::write_all(&mut f, b"through the link").unwrap();
    f.commit().unwrap();
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
    assert_symlink(&link);
    assert_eq!(reader.join().unwrap(), b"through the link");
    assert_eq!(names_in(dir.path()), ["out", "pipe"]);
}
