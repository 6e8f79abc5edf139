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
use xxhash_rust::xxh3::xxh3_64;

const BLOCK: usize = 64;

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn seal(b: &mut [u8], at: usize) {
    let sum = xxh3_64(&b[at..at + 56]);
    put(b, at + 56, sum);
}

/// Recompute the checksums of the file header, of every chunk found by
/// walking the stream, the footer digest and the trailer checksum.
fn reseal(b: &mut [u8]) {
    if b.len() < BLOCK {
        return;
    }
    seal(b, 0);
    let mut at = BLOCK;
    while at + BLOCK <= b.len() && &b[at..at + 4] == b"KBCH" {
        let kind = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap());
        let len = u64_at(b, at + 8);
        let pat = at + BLOCK;
        let Some(end) = usize::try_from(len).ok().and_then(|l| pat.checked_add(l)) else {
            seal(b, at);
            break;
        };
        if end > b.len() {
            seal(b, at);
            break;
        }
        if kind == 6 && len >= 48 {
            let digest = xxh3_64(&b[..at]);
            put(b, pat + 40, digest);
        }
        let sum = xxh3_64(&b[pat..end]);
        put(b, at + 40, sum);
        seal(b, at);
        at = pat + (len as usize).div_ceil(BLOCK) * BLOCK;
    }
    if b.len() >= 2 * BLOCK && b.len().is_multiple_of(BLOCK) {
        let t = b.len() - BLOCK;
        seal(b, t);
    }
}

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
        threads: Some(1),
        progress: false,
        options,
    };
    let _ = run(&cfg, &NaiveGemm);
});
