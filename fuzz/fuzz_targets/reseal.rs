//! Resealing shared by the `*_resealed` targets: recompute every checksum
//! and the stream digest of a (mutated) trace, as a forger can, so that
//! mutations reach what lies behind the checksums.

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
pub fn reseal(b: &mut [u8]) {
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
