//! Arbitrary bytes as a results table (`kb-inspect merge` / `plot`): as
//! CSV text and as a Parquet file, Ok or Err, never a panic, a hang or a
//! huge allocation; a table that reads writes back and reads again.
#![no_main]

use std::io::Write;

use kb_table::Table;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(t) = Table::read_csv(text, "fuzz.csv")
    {
        let mut out = Vec::new();
        t.write_csv(&mut out).unwrap();
        let again = Table::read_csv(std::str::from_utf8(&out).unwrap(), "fuzz.csv (written back)");
        assert!(again.is_ok(), "{again:?}");
    }
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    f.flush().unwrap();
    let _ = Table::read_parquet(f.reopen().unwrap(), "fuzz.parquet");
});
