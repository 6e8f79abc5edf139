//! Arbitrary bytes, with every checksum and the stream digest recomputed
//! before reading, so that mutations reach the decoders behind them
//! (metadata, strings, records, footer) instead of stopping at a checksum.
//! Seed the corpus with real traces. Any input must give Ok or Err, never
//! a panic.
#![no_main]

use kb_format::{Event, Record, StreamReader};
use libfuzzer_sys::fuzz_target;

#[path = "reseal.rs"]
mod reseal;
use reseal::reseal;

fuzz_target!(|data: &[u8]| {
    let mut b = data.to_vec();
    reseal(&mut b);
    let Ok(mut s) = StreamReader::open(&b[..]) else {
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
                        Ok(Some(Event::Tensor { .. } | Event::Snapshot { .. })) => {}
            Ok(None) | Err(_) => return,
        }
    }
});
