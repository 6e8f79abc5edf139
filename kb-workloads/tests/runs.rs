//! Built-in workloads through `kb_sim::run`: both executors write the
//! same trace, records chunks keep their seq promises, debug snapshots.

use kb_sim::kernel::Executor;
use kb_sim::run::{RunConfig, run};
use kb_sim::topology::Topology;
use kb_workloads::{Copy, GemmTiled, VectorAdd};

fn config(topo: &str, executor: Executor) -> RunConfig {
    RunConfig {
        topology: Topology::load(topo).unwrap(),
        params: vec![
            ("rows".into(), "301".into()),
            ("cols".into(), "45".into()),
            ("tile_rows".into(), "6".into()),
        ],
        seed: 3,
        inputs: Default::default(),
        executor,
        capture_inputs: false,
        races: Default::default(),
        command_line: vec!["kb-sim".into()],
        max_memory: None,
    }
}

#[test]
fn both_executors_write_identical_traces() {
    for topo in ["small", "default"] {
        let (a, _) = run(&config(topo, Executor::Coroutine), &Copy, Vec::new()).unwrap();
        let (b, _) = run(&config(topo, Executor::Thread), &Copy, Vec::new()).unwrap();
        assert!(a.len() > 1000);
        assert!(
            a == b,
            "{topo}: coroutine and thread executors wrote different traces"
        );
    }
}

#[test]
fn records_chunks_carry_a_seq_watermark_that_later_chunks_respect() {
    let cfg = RunConfig {
        topology: Topology::load("small").unwrap(),
        params: vec![
            ("rows".into(), "2048".into()),
            ("cols".into(), "16".into()),
            ("tile_rows".into(), "1".into()),
        ],
        seed: 1,
        inputs: Default::default(),
        executor: Executor::Coroutine,
        capture_inputs: false,
        races: Default::default(),
        command_line: vec![],
        max_memory: None,
    };
    let (bytes, _) = run(&cfg, &VectorAdd, Vec::new()).unwrap();
    let mut r = kb_format::StreamReader::open(&bytes[..]).unwrap();
    let mut chunks: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut rec = kb_format::Record::default();
    while let Some(ev) = r.next_event().unwrap() {
        if let kb_format::Event::Records(mut c) = ev {
            let w = c.seq_watermark();
            let mut seqs = Vec::new();
            while c.next_into(&mut rec).unwrap() {
                seqs.extend(
                    [rec.read.as_ref(), rec.write.as_ref()]
                        .into_iter()
                        .flatten()
                        .map(|e| e.seq),
                );
            }
            chunks.push((w, seqs));
        }
    }
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    assert_eq!(
        chunks.last().unwrap().0,
        u64::MAX,
        "the last chunk promises everything"
    );
    let (mid, _) = chunks[chunks.len() / 2];
    assert!(mid > 0, "an intermediate chunk makes a real promise");
    for (k, (w, _)) in chunks.iter().enumerate() {
        for (_, later) in &chunks[k + 1..] {
            assert!(
                later.iter().all(|s| s >= w),
                "chunk {k} promised no effect below {w}"
            );
        }
    }
}

#[test]
fn capture_inputs_snapshots_the_inputs_phase_1_knows() {
    let mut cfg = config("small", Executor::Coroutine);
    cfg.params = vec![
        ("m".into(), "40".into()),
        ("n".into(), "24".into()),
        ("k".into(), "50".into()),
    ];
    cfg.capture_inputs = true;
    let (bytes, _) = run(&cfg, &GemmTiled, Vec::new()).unwrap();
    let mut r = kb_format::StreamReader::open(&bytes[..]).unwrap();
    let mut gemms = Vec::new();
    let mut snaps = Vec::new();
    let mut rec = kb_format::Record::default();
    while let Some(ev) = r.next_event().unwrap() {
        match ev {
            kb_format::Event::Records(mut c) => {
                while c.next_into(&mut rec).unwrap() {
                    if rec.kind == kb_format::OpKind::Gemm {
                        gemms.push(rec.op_id);
                    }
                }
            }
            kb_format::Event::Snapshot {
                op_id,
                operand,
                data,
            } => {
                // A snapshot comes before its op's record.
                assert!(!gemms.contains(&op_id));
                snaps.push((op_id, operand, data.len()));
            }
            kb_format::Event::Tensor { .. } => {}
        }
    }
    assert!(!gemms.is_empty());
    // Each dot's A and B tiles were loaded (known); an accumulator is a
    // pending result and is not captured.
    assert_eq!(snaps.len(), 2 * gemms.len());
    for &(op, operand, len) in &snaps {
        assert!(gemms.contains(&op) && operand < 2, "{op} {operand}");
        assert!(len > 0);
    }
    cfg.capture_inputs = false;
    let (plain, _) = run(&cfg, &GemmTiled, Vec::new()).unwrap();
    assert!(
        plain.len() < bytes.len(),
        "snapshots only with --capture-inputs"
    );
}

/// gemm_tiled 256^3 on `default` (4 cubes x 8 PEs) with 64^3 tiles: split
/// by rows each PE gets 8 rows, padded to a 64-row tile (8 x the useful
/// GEMM work); on the 2-D grid a PE gets 64 rows x 32 columns, padded to
/// 64 columns (2 x). Every grid does the same useful work.
#[test]
fn gemm_tiled_on_a_2d_grid_pads_less_and_auto_picks_it() {
    let launch = |grid: &str| {
        let mut cfg = config("default", Executor::Coroutine);
        cfg.params = vec![("grid".into(), grid.into())];
        let (_, report) = run(&cfg, &GemmTiled, Vec::new()).unwrap();
        assert_eq!(report.launches.len(), 1);
        report.launches[0].clone()
    };
    let (rows, two_d, auto) = (launch("rows"), launch("2d"), launch("auto"));
    // Useful: 2 * 256^3 for the dots, plus casting each of the 256 x 256
    // outputs to f16 once.
    let useful = 2 * 256u64.pow(3) + 256 * 256;
    for l in [&rows, &two_d, &auto] {
        assert_eq!(l.useful_flops, useful);
    }
    // Executed dots: per PE, (padded rows / 64) x (padded cols / 64) x 4
    // K steps of 2 * 64^3; 32 PEs.
    let dot = 2 * 64u64.pow(3);
    let dots = |tiles: u64| 32 * tiles * 4 * dot;
    assert!(rows.flops > dots(4) && rows.flops < dots(4) + dots(4) / 8);
    assert!(two_d.flops > dots(1) && two_d.flops < dots(1) + dots(1) / 8);
    assert_eq!(auto.flops, two_d.flops);
}

#[test]
fn gemm_tiled_refuses_a_column_grid_the_address_model_cannot_hold() {
    let mut cfg = config("la-1to1", Executor::Coroutine);
    cfg.params = vec![("grid".into(), "2d".into())];
    let e = run(&cfg, &GemmTiled, Vec::new()).unwrap_err().to_string();
    assert!(e.contains("grid") && e.contains("LA 1:1"), "{e}");
    // auto falls back to rows there.
    cfg.params = vec![("grid".into(), "auto".into())];
    assert!(run(&cfg, &GemmTiled, Vec::new()).is_ok());
    cfg.params = vec![("grid".into(), "diagonal".into())];
    let e = run(&cfg, &GemmTiled, Vec::new()).unwrap_err().to_string();
    assert!(e.contains("unknown grid \"diagonal\""), "{e}");
}
