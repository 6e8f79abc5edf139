//! Arbitrary text as a topology file and as a `--set` value: Ok or a
//! clear error, never a panic or a hang; a topology that parses is valid
//! and reads back the same from its own YAML.
#![no_main]

use kb_sim::topology::Topology;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = Topology::parse(text, "fuzz.yaml") {
        let again = Topology::parse(&t.to_yaml(), "fuzz.yaml (written back)")
            .expect("a topology's own YAML parses");
        assert_eq!(again.to_yaml(), t.to_yaml());
    }
    // The same text as a value of one field.
    if let Ok(base) = Topology::load("small") {
        let _ = kb_sim::overrides::apply(&base, &[("hbm.latency_ns".to_string(), text.to_string())]);
    }
});
