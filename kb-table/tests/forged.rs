//! Tables a fuzzer forged: each read gives a table or an error, never a
//! panic.

use kb_table::Table;

#[test]
fn a_parquet_file_with_a_forged_arrow_schema_is_read_without_panicking() {
    // The table_read fuzz target's find: a sweep table's Parquet with the
    // embedded Arrow schema corrupted made arrow-ipc panic ("Type
    // <UNKNOWN 49> not supported"). The Parquet schema alone says what the
    // columns are.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/forged-arrow-schema.parquet"
    );
    let f = std::fs::File::open(path).unwrap();
    let e = Table::read_parquet(f, "forged.parquet")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("forged.parquet: "), "{e}");
}

#[test]
fn a_parquet_file_the_reader_asserts_on_is_an_error_not_a_panic() {
    // table_read's second find: metadata with a negative column chunk
    // start makes the parquet crate assert.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/negative-column-start.parquet"
    );
    let f = std::fs::File::open(path).unwrap();
    let e = Table::read_parquet(f, "negative.parquet")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("negative.parquet: "), "{e}");
}

#[test]
fn an_endless_or_binary_csv_stops_at_its_first_impossible_byte() {
    // /dev/zero as a table read 2 GB before failing (or forever).
    #[cfg(unix)]
    {
        let t = std::time::Instant::now();
        let e = Table::load(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
        assert_eq!(e, "/dev/zero: not a CSV table (a NUL byte at offset 0)");
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.csv");
    std::fs::write(&p, b"a,b\n1,2\n3,\xff\n").unwrap();
    let e = Table::load(&p).unwrap_err().to_string();
    assert!(
        e.ends_with("not a CSV table (not UTF-8 at offset 10)"),
        "{e}"
    );
    std::fs::write(&p, b"a,b\n1,2\n").unwrap();
    assert_eq!(Table::load(&p).unwrap().rows(), 1);
}
