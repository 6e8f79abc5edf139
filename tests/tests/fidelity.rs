//! Bandwidth fidelity as a user measures it: `kb-sim` runs of the `copy`
//! and `gather` workloads, read back with `kb-inspect summary`, against the
//! configured HBM bandwidth; and one simulated time for both tools.

use kb_e2e::*;

/// Simulate `args` into a trace in `dir`; its `kb-inspect summary` JSON.
fn summary(dir: &tempfile::TempDir, args: &[&str]) -> serde_json::Value {
    let t = dir.path().join("t.kbt");
    let t = t.to_str().unwrap();
    let mut a = vec!["-q", "-o", t];
    a.extend_from_slice(args);
    let sim = run("kb-sim", &a, b"");
    assert!(sim.status.success(), "{args:?}: {}", stderr(&sim));
    let s = run("kb-inspect", &["summary", t, "--format", "json"], b"");
    assert!(s.status.success(), "{}", stderr(&s));
    serde_json::from_slice(&s.stdout).unwrap()
}

/// The first launch's duration in ps.
fn launch_ps(s: &serde_json::Value) -> u64 {
    let l = &s["launches"][0];
    l["t_end_ps"].as_u64().unwrap() - l["t_start_ps"].as_u64().unwrap()
}

/// The resolved topology's number at `path` (dotted).
fn topo_number(s: &serde_json::Value, path: &str) -> f64 {
    let text = s["topology"]["resolved"].as_str().unwrap();
    let mut v: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
    for key in path.split('.') {
        v = v[key].clone();
    }
    v.as_f64().unwrap_or_else(|| panic!("{path} in {text}"))
}

/// `copy` of `rows x cols` f32 in `tile_rows`-row tiles on `topo`: the
/// fraction of the configured HBM bandwidth (every cube's channels) that
/// its reads and writes reach over the launch.
fn copy_fraction(topo: &str, rows: u64, cols: u64, tile_rows: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let p = [
        format!("rows={rows}"),
        format!("cols={cols}"),
        format!("tile_rows={tile_rows}"),
    ];
    let s = summary(
        &dir,
        &[
            "-t", topo, "-b", "copy", "-p", &p[0], "-p", &p[1], "-p", &p[2],
        ],
    );
    let cubes = topo_number(&s, "counts.sips") * topo_number(&s, "counts.cubes_per_sip");
    let hbm_gbs =
        cubes * topo_number(&s, "hbm.pseudo_channels") * topo_number(&s, "hbm.channel_bw_gbs");
    let moved = 2.0 * (rows * cols * 4) as f64;
    moved * 1000.0 / launch_ps(&s) as f64 / hbm_gbs
}

#[test]
fn copy_reaches_the_configured_hbm_bandwidth_on_small_and_default() {
    // The same work per PE as `copy`'s defaults on `small` (512 rows of
    // 512 f32 per PE): default tiles (8 rows, 16 KiB) and large ones (64
    // rows, 128 KiB).
    for (topo, pes) in [("small", 4), ("default", 32)] {
        let rows = 512 * pes;
        let small_tiles = copy_fraction(topo, rows, 512, 8);
        assert!(
            small_tiles >= 0.85,
            "{topo}, 16 KiB tiles: {:.1} %",
            100.0 * small_tiles
        );
        let large_tiles = copy_fraction(topo, rows, 512, 64);
        assert!(
            large_tiles >= 0.95,
            "{topo}, 128 KiB tiles: {:.1} %",
            100.0 * large_tiles
        );
    }
}

#[test]
fn la_one_to_one_and_n_to_one_agree_on_copy_and_differ_on_gather_by_the_channel_time() {
    let dir = tempfile::tempdir().unwrap();
    let launch = |topo, bench| launch_ps(&summary(&dir, &["-t", topo, "-b", bench]));
    // copy streams tiles through every channel the PE owns either way.
    // (Within 2 %: a load into a tile waits until the store before it has
    // read the tile (WAR), which 1:1's per-channel queues feel a little
    // more: 4303.5 against 4236 ns, 0.08 % apart before that rule.)
    let (one, agg) = (launch("la-1to1", "copy"), launch("la-nto1", "copy"));
    let diff = one.abs_diff(agg) as f64 / agg as f64;
    assert!(diff < 0.02, "copy: 1:1 {one} ps, n:1 {agg} ps");

    // gather's chain per PE: the index load (32 x 4 B = 128 B), then per
    // row a 256 B load (the next waits for it) and an asynchronous store;
    // the last store ends the launch. 1:1 serves each access from the one
    // channel that holds it, through that channel's router: at 32 GB/s,
    // on the HBM and on the router link; n:1 spreads it over the PE's 8
    // channels and its aggregated router: at 256 GB/s. The 64 B request
    // also crosses the router link (one way; the response the other).
    let s = summary(&dir, &["-t", "la-1to1", "-b", "gather"]);
    let ch = topo_number(&s, "memory_map.hbm_channel_bw_gbs");
    let n = topo_number(&s, "memory_map.hbm_channels_per_pe");
    let pes = ["sips", "cubes_per_sip", "pes_per_cube"]
        .iter()
        .map(|c| topo_number(&s, &format!("counts.{c}")) as u64)
        .product::<u64>();
    assert_eq!((ch, n), (32.0, 8.0));
    let ser = |bytes: u64, gbs: f64| (bytes as f64 * 1000.0 / gbs).ceil() as u64;
    let slower = |bytes| 2 * (ser(bytes, ch) - ser(bytes, ch * n)) + ser(64, ch) - ser(64, ch * n);
    let rows = 256 / pes; // gather's default: 256 indices, row-wise
    let (one, agg) = (launch("la-1to1", "gather"), launch("la-nto1", "gather"));
    let channel_time = slower(rows * 4) + (rows + 1) * slower(256);
    // A row's load starts once the store before it has read the row from
    // TCM (a PE's DMAs on the same bytes stay in order), when the store's
    // 256 B are on their way: under 1:1 the load's request can queue
    // behind them on the router link, at most their serialization (8 ns)
    // per row. Measured: 34.5 ns over that.
    assert!(
        (channel_time..=channel_time + (rows + 1) * ser(256, ch)).contains(&(one - agg)),
        "gather: 1:1 {one} ps, n:1 {agg} ps, channel time {channel_time} ps"
    );
}

#[test]
fn kb_sim_and_kb_inspect_report_one_simulated_time() {
    for topo in ["small", "default"] {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t.kbt");
        let t = t.to_str().unwrap();
        let sim = run("kb-sim", &["-t", topo, "-o", t], b"");
        assert!(sim.status.success(), "{}", stderr(&sim));
        let err = stderr(&sim);
        let ns: f64 = err
            .split("simulated ")
            .nth(1)
            .and_then(|r| r.split(" ns").next())
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("no simulated time in {err}"));
        let s = run("kb-inspect", &["summary", t, "--format", "json"], b"");
        let s: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
        let ps = s["sim_time_ps"].as_u64().unwrap();
        // kb-sim prints nanoseconds to 3 decimals: every picosecond.
        assert_eq!(
            format!("{:.3}", ps as f64 / 1e3),
            format!("{ns:.3}"),
            "{topo}"
        );
        // The run's end is past the last record (the frees and unmaps).
        let last = s["launches"][0]["t_end_ps"].as_u64().unwrap();
        assert!(
            ps >= last,
            "{topo}: sim time {ps} before the launch end {last}"
        );
    }
}

#[test]
fn stats_by_channel_accounts_for_every_hbm_byte() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.kbt");
    let t = t.to_str().unwrap();
    let sim = run("kb-sim", &["-q", "-t", "small", "-b", "copy", "-o", t], b"");
    assert!(sim.status.success(), "{}", stderr(&sim));
    let stats = |by: &str| -> serde_json::Value {
        let o = run(
            "kb-inspect",
            &["stats", t, "--by", by, "--format", "json"],
            b"",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let ch = stats("channel");
    let groups = ch["groups"].as_array().unwrap();
    // small: one cube of 32 channels at 32 GB/s; copy's tiles spread over
    // all of them.
    assert_eq!(groups.len(), 32);
    let mut total = 0;
    for g in groups {
        let (bytes, service) = (
            g["bytes"].as_u64().unwrap(),
            g["op_time_ps"].as_u64().unwrap(),
        );
        // Every share is whole 256 B blocks: 8 ns each at 32 GB/s, over
        // the whole run (busy_ps is the part in the kernel window: the
        // deploy's writes come before it).
        assert_eq!(service, bytes * 1000 / 32, "{g}");
        assert!(g["busy_ps"].as_u64().unwrap() < service, "{g}");
        total += bytes;
    }
    // What the records say went in and out of HBM: the host's deploy of
    // x, the loads of x and the stores of y.
    let ops = stats("op_name");
    let bytes = |name: &str| {
        ops["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == name)
            .unwrap_or_else(|| panic!("no {name} in {ops}"))["bytes"]
            .as_u64()
            .unwrap()
    };
    // The deploy's writes come before the kernel window `stats` counts:
    // sum them from the op list.
    let o = run(
        "kb-inspect",
        &["ops", t, "--name", "host_write", "--format", "jsonl"],
        b"",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let host: u64 = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["bytes"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let x = 2048 * 512 * 4;
    assert_eq!((host, bytes("dma_read"), bytes("dma_write")), (x, x, x));
    assert_eq!(total, 3 * x);
}
