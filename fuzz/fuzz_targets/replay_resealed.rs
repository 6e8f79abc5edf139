//! A trace mutated and resealed (every checksum and the digest recomputed,
//! as a forger can), then replayed and verified by kb-replay: mutations
//! reach replay semantics (params, ranges, seqs, shapes, the verify spec),
//! not only the checksum check. Any input must give a report or an error,
//! never a panic, an abort or an allocation past what the trace declares
//! (`max_bytes` is lowered to 64 MiB so libFuzzer's RSS limit holds).
//! Seed corpus: `fuzz/corpus/replay_resealed` (small kb-sim traces).
#![no_main]

use std::io::Write;

use kb_replay::app::{Config, Input, run};
use kb_replay::engine::ReplayOptions;
use kb_replay::ops::NaiveGemm;
use libfuzzer_sys::fuzz_target;

#[path = "reseal.rs"]
mod reseal;
use reseal::reseal;

fuzz_target!(|data: &[u8]| {
    let mut b = data.to_vec();
    reseal(&mut b);
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(&b).expect("write");
    f.flush().expect("flush");
    let options = ReplayOptions {
        max_bytes: 64 << 20,
        ..ReplayOptions::default()
    };
    let cfg = Config {
        input: Input::Path(f.path().to_path_buf()),
        verify: true,
        report: None,
        expect: Vec::new(),
        dump_outputs: None,
        quiet: true,
        allow_unknown: false,
        tolerance: Default::default(),
        threads: Some(1),
        progress: false,
        options,
    };
    let _ = run(&cfg, &NaiveGemm);
});
