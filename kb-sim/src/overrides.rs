//! `--set KEY=VALUE`: override any field of a resolved topology by its
//! dotted path (`hbm.channel_bw_gbs=64`, `pe_gemm.tflops.f16=128`,
//! `counts.pes_per_cube=16`, `links.noc_pe.bw_gbs=512`), the paths
//! `kb-sim topology NAME` prints.
//!
//! The topology is turned back into its YAML value tree ([`Topology::to_yaml`]),
//! each key's field is replaced by the value (read as YAML: `64`, `1e-3`,
//! `pa`), and the tree goes through [`Topology::parse`] again, so an
//! overridden topology is validated exactly like a file (units, ranges,
//! cross-field rules; errors name the field). A key that names no field
//! is an error naming the key and the fields that exist there.

// Public surface of the library: every public item is documented.
#![warn(missing_docs)]

use serde_yaml_ng::Value;

use crate::topology::Topology;

/// Parse `KEY=VALUE` (the key trimmed and non-empty).
pub fn parse_set(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("--set: expected KEY=VALUE (a topology field path), got {s:?}"))
}

fn key_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

/// Replace the field at `key` (dotted) of `tree` with `value`.
fn set_one(tree: &mut Value, key: &str, value: &str) -> Result<(), String> {
    let segs: Vec<&str> = key.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(format!("--set {key}: an empty path segment"));
    }
    // YAML reads nothing as null (`--set name=` named the topology "null").
    if value.trim().is_empty() {
        return Err(format!(
            "--set {key}=: no value (give one: --set {key}=VALUE)"
        ));
    }
    let mut node = tree;
    for (i, seg) in segs.iter().enumerate() {
        let here = segs[..i].join(".");
        if matches!(node, Value::Null) {
            return Err(format!(
                "--set {key}: this topology has no {here} (it is not set: write it in a topology file)"
            ));
        }
        let Value::Mapping(m) = node else {
            return Err(format!(
                "--set {key}: {here} is a value, not a section: it has no field {seg:?}"
            ));
        };
        let fields: Vec<String> = m.keys().map(key_str).collect();
        let Some(child) = m.get_mut(Value::String((*seg).to_string())) else {
            let at = if here.is_empty() {
                "the topology".to_string()
            } else {
                here
            };
            return Err(format!(
                "--set {key}: unknown topology field {seg:?} in {at} (fields: {})",
                fields.join(", ")
            ));
        };
        node = child;
    }
    if let Value::Mapping(m) = node {
        let fields: Vec<String> = m.keys().map(key_str).collect();
        return Err(format!(
            "--set {key}: a section, not a field: set one of {}",
            fields
                .iter()
                .map(|f| format!("{key}.{f}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if matches!(node, Value::Null) {
        return Err(format!(
            "--set {key}: this topology has no {key} (it is not set: write it in a topology file)"
        ));
    }
    crate::topology::check_flow_depth(value).map_err(|e| format!("--set {key}: {e}"))?;
    let v: Value = serde_yaml_ng::from_str(value)
        .map_err(|e| format!("--set {key}={value}: not a YAML value: {e}"))?;
    if matches!(v, Value::Mapping(_) | Value::Sequence(_)) {
        return Err(format!(
            "--set {key}={value}: a single value is expected (a number or a name)"
        ));
    }
    *node = v;
    Ok(())
}

/// The topology `t` with every `(key, value)` of `sets` applied in order,
/// validated as a file would be. Errors name the key.
pub fn apply(t: &Topology, sets: &[(String, String)]) -> Result<Topology, String> {
    if sets.is_empty() {
        return Ok(t.clone());
    }
    for (i, (k, v)) in sets.iter().enumerate() {
        if let Some((_, first)) = sets[..i].iter().find(|(k0, _)| k0 == k) {
            return Err(format!(
                "--set {k} is given twice ({k}={first}, then {k}={v}): give it once"
            ));
        }
    }
    let mut tree: Value =
        serde_yaml_ng::from_str(&t.to_yaml()).map_err(|e| format!("topology {}: {e}", t.name))?;
    for (k, v) in sets {
        set_one(&mut tree, k, v)?;
    }
    let text = serde_yaml_ng::to_string(&tree).map_err(|e| format!("topology {}: {e}", t.name))?;
    let what = sets
        .iter()
        .map(|(k, v)| format!("--set {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    Topology::parse(&text, &format!("topology {} with {what}", t.name)).map_err(|e| {
        // The line numbers would be those of the regenerated YAML, not of
        // anything the user wrote: leave them out.
        let msg = match e.message.strip_prefix("line ") {
            Some(rest) => rest.split_once(": ").map_or(rest, |(_, m)| m).to_string(),
            None => e.message,
        };
        format!("{}: {msg}", e.source_name)
    })
}

/// Every field path of `t` with its value, in YAML order (`hbm.channel_bw_gbs = 32`).
pub fn fields(t: &Topology) -> Vec<(String, String)> {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut Vec<(String, String)>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    path.push(key_str(k));
                    walk(v, path, out);
                    path.pop();
                }
            }
            other => out.push((path.join("."), key_str(other))),
        }
    }
    let tree: Value = serde_yaml_ng::from_str(&t.to_yaml()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    walk(&tree, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, sets: &[(&str, &str)]) -> Result<Topology, String> {
        let t = Topology::load(name).unwrap();
        let sets: Vec<(String, String)> = sets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        apply(&t, &sets)
    }

    #[test]
    fn fields_are_overridden_by_their_dotted_paths() {
        let base = Topology::load("default").unwrap();
        let t = set(
            "default",
            &[
                ("pe_gemm.tflops.f16", "128"),
                ("counts.pes_per_cube", "16"),
                ("hbm.channel_bw_gbs", "64.5"),
                ("links.noc_pe.bw_gbs", "512"),
                ("address_model", "pa"),
            ],
        )
        .unwrap();
        assert_eq!(t.pe_gemm.tflops.f16.0, 128.0);
        assert_eq!(t.counts.pes_per_cube, 16);
        assert_eq!(t.hbm.channel_bw_gbs.0, 64.5);
        assert_eq!(t.links.noc_pe.bw_gbs.0, 512.0);
        assert_eq!(t.address_model.name(), "pa");
        // Nothing else changed.
        let mut back = t.clone();
        back.pe_gemm.tflops.f16 = base.pe_gemm.tflops.f16;
        back.counts.pes_per_cube = base.counts.pes_per_cube;
        back.hbm.channel_bw_gbs = base.hbm.channel_bw_gbs;
        back.links.noc_pe.bw_gbs = base.links.noc_pe.bw_gbs;
        back.address_model = base.address_model;
        assert_eq!(back, base);
        // No sets: the same topology.
        assert_eq!(set("default", &[]).unwrap(), base);
    }

    #[test]
    fn an_empty_value_is_refused() {
        let t = Topology::load("small").unwrap();
        for v in ["", "  "] {
            let e = apply(&t, &[("name".to_string(), v.to_string())]).unwrap_err();
            assert_eq!(e, "--set name=: no value (give one: --set name=VALUE)");
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_both_values() {
        let t = Topology::load("small").unwrap();
        let set = |k: &str, v: &str| (k.to_string(), v.to_string());
        let e = apply(
            &t,
            &[
                set("hbm.latency_ns", "1"),
                set("tcm.size_kib", "512"),
                set("hbm.latency_ns", "2"),
            ],
        )
        .unwrap_err();
        assert_eq!(
            e,
            "--set hbm.latency_ns is given twice (hbm.latency_ns=1, then hbm.latency_ns=2): give it once"
        );
    }

    #[test]
    fn unknown_keys_are_named_with_the_fields_that_exist() {
        let e = set("default", &[("hbm.bw_gbs", "512")]).unwrap_err();
        assert!(
            e.contains("--set hbm.bw_gbs")
                && e.contains("unknown topology field \"bw_gbs\" in hbm"),
            "{e}"
        );
        assert!(e.contains("channel_bw_gbs"), "{e}");
        let e = set("default", &[("nope", "1")]).unwrap_err();
        assert!(e.contains("in the topology"), "{e}");
        let e = set("default", &[("hbm", "1")]).unwrap_err();
        assert!(
            e.contains("a section") && e.contains("hbm.channel_bw_gbs"),
            "{e}"
        );
        let e = set("default", &[("hbm.channel_bw_gbs.x", "1")]).unwrap_err();
        assert!(e.contains("is a value"), "{e}");
        let e = set("default", &[("memory_map.hbm_channels_per_pe", "1")]).unwrap_err();
        assert!(e.contains("has no memory_map"), "{e}");
        assert!(parse_set("=3").is_err() && parse_set("x").is_err());
        assert_eq!(parse_set(" a.b = 3 "), Ok(("a.b".into(), "3".into())));
    }

    #[test]
    fn overridden_topologies_are_validated_like_files() {
        let e = set("default", &[("hbm.channel_bw_gbs", "-1")]).unwrap_err();
        assert!(
            e.contains("hbm.channel_bw_gbs") && e.contains("positive"),
            "{e}"
        );
        assert!(
            e.starts_with("topology default with --set hbm.channel_bw_gbs=-1: "),
            "{e}"
        );
        assert!(!e.contains("line "), "{e}");
        let e = set("default", &[("counts.pes_per_cube", "0")]).unwrap_err();
        assert!(e.contains("counts.pes_per_cube: must be 1..="), "{e}");
        let e = set("default", &[("counts.sips", "two")]).unwrap_err();
        assert!(e.contains("counts.sips"), "{e}");
        let e = set("default", &[("address_model", "la")]).unwrap_err();
        assert!(e.contains("memory_map"), "{e}");
    }

    #[test]
    fn field_listing_covers_the_yaml() {
        let t = Topology::load("default").unwrap();
        let f = fields(&t);
        assert!(
            f.contains(&("hbm.channel_bw_gbs".into(), "32.0".into())),
            "{f:?}"
        );
        assert!(f.iter().any(|(k, _)| k == "pe_gemm.tflops.f16"));
        // Every listed field can be set to its own value.
        let sets: Vec<(String, String)> = f
            .iter()
            .filter(|(_, v)| v != "null" && v != "~")
            .cloned()
            .collect();
        assert_eq!(apply(&t, &sets).unwrap(), t);
    }
}
