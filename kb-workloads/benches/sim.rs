//! kb-sim benchmarks (not timed tests): `cargo bench -p kb-workloads --bench sim`.
//! - event core: schedule and pop events with a realistic queue depth;
//! - building the `large` machine (256 PEs);
//! - a whole copy run on `large` to /dev/null (events/s, records/s).

use std::hint::black_box;
use std::time::Instant;

use kb_sim::event::EventQueue;
use kb_sim::machine::Machine;
use kb_sim::run::{RunConfig, run};
use kb_sim::topology::Topology;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn event_core() {
    // A queue holding `depth` pending events (like in-flight messages);
    // each pop schedules one new event a pseudo-random distance ahead.
    for depth in [64usize, 4096] {
        let n = 20_000_000u64;
        let rates: Vec<f64> = (0..5)
            .map(|_| {
                let mut q: EventQueue<(u32, u32)> = EventQueue::default();
                let mut x = 0x9e3779b97f4a7c15u64;
                for i in 0..depth {
                    q.push(i as u64, (i as u32, 0));
                }
                let t = Instant::now();
                for _ in 0..n {
                    let (now, ev) = q.pop().unwrap();
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    q.push(now + (x % 10_000), black_box(ev));
                }
                n as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        println!(
            "event core, queue depth {depth}: {:.1} M events/s (median of 5, {n} pop+push each)",
            median(rates) / 1e6
        );
    }
}

fn build_large() {
    let topo = Topology::load("large").unwrap();
    let times: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let m = Machine::build(&topo);
            // Routes are computed on first use; include a PE->HBM route per PE.
            for pe in m.pes() {
                let from = m.pe_node(pe, kb_sim::machine::NodeKind::PeDma);
                let to = m.cube_node(pe.sip, pe.cube, kb_sim::machine::NodeKind::HbmCtrl);
                black_box(m.route(from, to));
            }
            black_box(&m);
            t.elapsed().as_secs_f64()
        })
        .collect();
    println!(
        "build large (256 PEs) + one route per PE: {:.4} s (median of 5)",
        median(times)
    );
}

fn copy_run() {
    let cfg = RunConfig {
        topology: Topology::load("large").unwrap(),
        params: vec![
            ("rows".into(), "16384".into()),
            ("cols".into(), "256".into()),
            ("tile_rows".into(), "4".into()),
        ],
        seed: 0,
        inputs: Default::default(),
        executor: Default::default(),
        capture_inputs: false,
        races: Default::default(),
        command_line: vec![],
        max_memory: None,
    };
    let t = Instant::now();
    let stats = run(&cfg, &kb_workloads::Copy, std::io::sink())
        .unwrap()
        .1
        .stats;
    let s = t.elapsed().as_secs_f64();
    println!(
        "copy on large (rows=16384 cols=256 tile_rows=4): {} records, {} events in {:.3} s: {:.2} M events/s, {:.2} M records/s",
        stats.records,
        stats.events,
        s,
        stats.events as f64 / s / 1e6,
        stats.records as f64 / s / 1e6
    );
}

fn main() {
    event_core();
    build_large();
    copy_run();
}
