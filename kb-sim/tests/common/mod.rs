//! Helpers shared by kb-sim's integration tests.

use kb_format::{Event, Record, StreamReader};

/// Every record of a trace with its component and op names, in order.
pub fn named_records(bytes: &[u8]) -> Vec<(Record, String, String)> {
    let mut r = StreamReader::open(bytes).unwrap();
    let mut out = Vec::new();
    let mut rec = Record::default();
    while let Some(ev) = r.next_event().unwrap() {
        if let Event::Records(mut c) = ev {
            while c.next_into(&mut rec).unwrap() {
                let s = c.strings();
                out.push((
                    rec.clone(),
                    s.name(rec.component).into_owned(),
                    s.name(rec.op_name).into_owned(),
                ));
            }
        }
    }
    out
}
