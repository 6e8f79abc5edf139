//! Arbitrary bytes through `StreamReader`, read to the end: any input must
//! give Ok or Err, never a panic, a hang or a huge allocation.
#![no_main]

use kb_format::{Event, Record, StreamReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut s) = StreamReader::open(data) else {
        return;
    };
    let mut r = Record::default();
    loop {
        match s.next_event() {
            Ok(Some(Event::Records(mut c))) => loop {
                match c.next_into(&mut r) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(_) => return,
                }
            },
                        Ok(Some(Event::Tensor { data, .. } | Event::Snapshot { data, .. })) => {
                std::hint::black_box(data);
            }
            Ok(None) => {
                // A trace that reads to the end has a footer and a spec.
                assert!(s.footer().is_some() && s.verify_spec().is_some());
                return;
            }
            Err(_) => return,
        }
    }
});
