//! Tensors of more than 2 dims (issue 34) end to end: `softmax_nd` over a
//! 4 x 300 x 64 tensor, in blocks of N-d coordinates that span shards,
//! verifies through kb-replay on every address model; a 4-D round trip
//! from an N-d `.npy` input through `Block::nd` loads and stores comes
//! out of `kb-replay --dump-outputs` as a 4-D `.npy` holding the input's
//! values; kb-inspect shows the N-d shapes.

use kb_e2e::*;

fn sim(topo: &str, params: &[&str], extra: &[&str], out: &str) {
    let mut args = vec!["-q", "-t", topo, "-b", "softmax_nd", "-o", out];
    for p in params {
        args.extend(["-p", p]);
    }
    args.extend(extra);
    let s = run("kb-sim", &args, b"");
    assert!(s.status.success(), "{args:?}: {}", stderr(&s));
}

#[test]
fn softmax_along_the_last_dim_of_a_3d_tensor_verifies_on_every_model() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("s.kbt");
    let t = t.to_str().unwrap();
    // default and va: a grid of 1 x 64 x 64 blocks (the last of each
    // batch 44 rows) over row shards that do not align with the batches;
    // la-1to1: each PE its own shard's rows.
    for (topo, params) in [
        ("default", vec!["shape=4x300x64"]),
        ("va", vec!["shape=4x300x64", "block=2x64x64"]),
        ("small", vec!["shape=4x300x64", "block=3x100x64"]),
        ("la-1to1", vec!["shape=4x300x64"]),
    ] {
        sim(topo, &params, &[], t);
        let replay = run("kb-replay", &[t, "--verify"], b"");
        let out = String::from_utf8_lossy(&replay.stdout).into_owned();
        assert_eq!(
            replay.status.code(),
            Some(0),
            "{topo} {params:?}: {out}{}",
            stderr(&replay)
        );
        assert!(out.contains("PASS y f32 [4, 300, 64]"), "{topo}: {out}");
    }
    let summary = run("kb-inspect", &["summary", t], b"");
    let text = String::from_utf8_lossy(&summary.stdout).into_owned();
    assert!(summary.status.success(), "{}", stderr(&summary));
    assert!(
        text.contains("f32   [4, 300, 64]") || text.contains("[4, 300, 64]"),
        "{text}"
    );
}

/// A v1 `.npy` of little-endian f32 `data` with dims `shape`.
fn npy_f32(shape: &[u64], data: &[f32]) -> Vec<u8> {
    let dims: String = shape.iter().map(|d| format!("{d}, ")).collect();
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims}), }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    for x in data {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

/// The header text and data bytes of a v1 or v2 `.npy`.
fn npy_parts(b: &[u8]) -> (String, &[u8]) {
    assert_eq!(&b[..6], b"\x93NUMPY");
    let (len, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        _ => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
    };
    (
        String::from_utf8_lossy(&b[start..start + len]).into_owned(),
        &b[start + len..],
    )
}

#[test]
fn a_4d_tensor_round_trips_through_nd_blocks_from_an_npy_input() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [2u64, 3, 50, 64];
    let n: u64 = shape.iter().product();
    // Every element its index: exact in f32 (19,200 < 2^24).
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let input = dir.path().join("x.npy");
    std::fs::write(&input, npy_f32(&shape, &values)).unwrap();
    let t = dir.path().join("c.kbt");
    // Blocks of 1 x 2 x 16 x 48: two 16-row slabs each, the last of each
    // dim shorter, spanning the row shards of the 300 x 64 view.
    for topo in ["default", "la-1to1"] {
        let dump = dir.path().join(format!("out-{topo}"));
        sim(
            topo,
            &["shape=2x3x50x64", "block=1x2x16x48", "op=copy"],
            &["--input", &format!("x={}", input.display())],
            t.to_str().unwrap(),
        );
        let replay = run(
            "kb-replay",
            &[
                t.to_str().unwrap(),
                "--verify",
                "--dump-outputs",
                dump.to_str().unwrap(),
            ],
            b"",
        );
        assert_eq!(replay.status.code(), Some(0), "{topo}: {}", stderr(&replay));
        let bytes = std::fs::read(dump.join("y.npy")).unwrap();
        let (header, data) = npy_parts(&bytes);
        assert!(
            header.contains("'shape': (2, 3, 50, 64,"),
            "{topo}: {header}"
        );
        let got: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(got == values, "{topo}: y differs from x");
    }
}

#[test]
fn an_input_of_another_shape_or_a_bad_shape_parameter_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("x.npy");
    // The right elements in the 2-D view's shape: refused, naming both.
    std::fs::write(&input, npy_f32(&[6, 4], &[0.0; 24])).unwrap();
    let t = dir.path().join("e.kbt");
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-b",
            "softmax_nd",
            "-p",
            "shape=2x3x4",
            "--input",
            &format!("x={}", input.display()),
            "-o",
            t.to_str().unwrap(),
        ],
        b"",
    );
    assert_clean_error(&out, "an input of the 2-D view's shape");
    let e = stderr(&out);
    assert!(
        e.contains(
            "holds a <f4 (float32) array of shape [6, 4]; the workload declares f32 [2, 3, 4]"
        ),
        "{e}"
    );
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-b",
            "softmax_nd",
            "-p",
            "shape=1x1x1x1x1x1x1",
            "-o",
            t.to_str().unwrap(),
        ],
        b"",
    );
    assert_clean_error(&out, "7 dims");
    assert!(
        stderr(&out).contains("give 1 to 6 dims"),
        "{}",
        stderr(&out)
    );
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-b",
            "softmax_nd",
            "-p",
            "block=1x64x16",
            "-o",
            t.to_str().unwrap(),
        ],
        b"",
    );
    assert_clean_error(&out, "a softmax block of part rows");
    assert!(
        stderr(&out).contains(
            "softmax needs whole rows: the block's last size must be the last dim (64), got 16"
        ),
        "{}",
        stderr(&out)
    );
}
