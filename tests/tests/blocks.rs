//! Triton-style kernels in tensor coordinates (issue 34): `rmsnorm` over
//! a 1-D grid of row blocks whose size does not divide the shards (blocks
//! span shards and lie in other PEs' and cubes' HBM) verifies through
//! kb-replay; so does the shard-local walk; under LA the grid form is a
//! clear error naming the kernel's line.

use kb_e2e::*;

fn sim_and_verify(topo: &str, params: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("r.kbt");
    let t = t.to_str().unwrap();
    let mut args = vec!["-q", "-t", topo, "-b", "rmsnorm", "-o", t];
    for p in params {
        args.extend(["-p", p]);
    }
    let sim = run("kb-sim", &args, b"");
    assert!(sim.status.success(), "{params:?}: {}", stderr(&sim));
    let replay = run("kb-replay", &[t, "--verify"], b"");
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{params:?}: {}{}",
        String::from_utf8_lossy(&replay.stdout),
        stderr(&replay)
    );
}

#[test]
fn rmsnorm_over_a_grid_of_row_blocks_in_tensor_coordinates_verifies_at_300_x_700() {
    // default: 300 rows over its PEs; 64-row blocks (and 7-row ones)
    // straddle shard edges and other cubes' HBM.
    for block in ["64", "7"] {
        sim_and_verify(
            "default",
            &[
                "rows=300",
                "cols=700",
                &format!("block_rows={block}"),
                "mode=grid",
            ],
        );
    }
    sim_and_verify(
        "small",
        &["rows=300", "cols=700", "block_rows=64", "mode=grid"],
    );
    // auto picks the shard walk under LA.
    sim_and_verify("la-nto1", &["rows=300", "cols=700", "block_rows=64"]);
}

#[test]
fn rmsnorm_walking_each_shards_row_blocks_verifies() {
    for topo in ["default", "la-1to1"] {
        sim_and_verify(
            topo,
            &["rows=300", "cols=700", "block_rows=64", "mode=local"],
        );
    }
}

#[test]
fn under_la_a_grid_block_in_another_pes_shard_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("la.kbt");
    let out = run(
        "kb-sim",
        &[
            "-q",
            "-t",
            "la-1to1",
            "-b",
            "rmsnorm",
            "-p",
            "mode=grid",
            "-o",
            t.to_str().unwrap(),
        ],
        b"",
    );
    assert!(!t.exists(), "a failed run left {}", t.display());
    assert_clean_error(&out, "rmsnorm grid on la-1to1");
    let e = stderr(&out);
    for want in [
        "kb-workloads/src/rmsnorm.rs:",
        "cannot address under the LA model",
        "of x (300x700)",
        "kernel rmsnorm[",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
}
