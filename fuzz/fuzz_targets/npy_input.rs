//! Arbitrary bytes as `kb-sim --input NAME=FILE.npy` for a tensor whose
//! dtype and shape the first three bytes choose: Ok or Err, never a panic,
//! a hang or an allocation past the declared tensor's size.
#![no_main]

use std::io::Write;

use kb_format::Dtype;
use libfuzzer_sys::fuzz_target;

const DTYPES: [Dtype; 6] = [
    Dtype::F32,
    Dtype::F16,
    Dtype::Bf16,
    Dtype::I8,
    Dtype::I32,
    Dtype::U8,
];

fuzz_target!(|data: &[u8]| {
    let [d, r, c, rest @ ..] = data else {
        return;
    };
    let dtype = DTYPES[*d as usize % DTYPES.len()];
    let shape = [u64::from(*r % 64) + 1, u64::from(*c % 64) + 1];
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(rest).unwrap();
    f.flush().unwrap();
    if let Ok(bytes) = kb_sim::input::read(f.path(), dtype, &shape) {
        // What it returns is exactly the declared tensor's bytes.
        assert_eq!(bytes.len() as u64, shape[0] * shape[1] * dtype.size() as u64);
    }
});
