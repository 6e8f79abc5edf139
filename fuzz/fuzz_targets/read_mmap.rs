//! Arbitrary bytes written to a file and read with `MmapTrace`: open,
//! verify the digest, decode every record, fetch every tensor's chunks.
//! Any input must give Ok or Err, never a panic.
#![no_main]

use std::io::Write;

use kb_format::{Event, MmapTrace, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(data).expect("write");
    f.flush().expect("flush");
    let Ok(m) = MmapTrace::open(f.path()) else {
        return;
    };
    let _ = m.verify_digest();
    let _ = m.for_each_record(|r, strings| {
        std::hint::black_box((r.op_id, strings.name(r.component)));
        Ok(())
    });
    for t in 0..m.meta().tensors.len() as u32 {
        if let Ok(chunks) = m.tensor_chunks(t) {
            std::hint::black_box(chunks.len());
        }
    }
    let mut r = Record::default();
    let _ = m.for_each_event(|ev| {
        if let Event::Records(mut c) = ev {
            while c.next_into(&mut r)? {}
        }
        Ok(())
    });
});
