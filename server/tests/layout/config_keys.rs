//! The config reference (`docs/config.md`) against the `Config` types: every key of
//! `Config::default()`, serialized, has a row, every row names a real key, and the default
//! a row states is the one the code gives.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use im_server::config::Config;
use serde_json::Value;

/// Defaults the reference states in words: the key and the words.
const WORDED_DEFAULTS: [(&str, &str); 1] = [("node_id", "host name")];

/// Every leaf key of `value` (dotted paths) with its value.
fn leaves(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&key, v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_owned(), leaf.clone());
        }
    }
}

/// The reference's rows: each key of a row (a row may name several, `a` / `b`) with the
/// row's default cell.
fn documented(reference: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in reference.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let keys = cells[0].trim_start_matches("| ");
        let default = cells.get(1).copied().unwrap_or_default().trim();
        for (i, key) in keys.split('`').enumerate() {
            if i % 2 == 1 {
                out.push((key.to_owned(), default.to_owned()));
            }
        }
    }
    out
}

/// Whether the default cell states `value`; `Err` says how the cell reads instead.
fn states(cell: &str, value: &Value) -> Result<(), String> {
    let literal = cell
        .strip_prefix('`')
        .and_then(|c| c.strip_suffix('`'))
        .unwrap_or(cell);
    let matches = match value {
        Value::String(s) => (s.is_empty() && cell == "empty") || literal == s,
        Value::Bool(b) => literal == b.to_string(),
        Value::Number(n) => literal.parse::<f64>().is_ok_and(|d| Some(d) == n.as_f64()),
        Value::Array(a) => a.is_empty() && literal == "[]",
        Value::Null => cell == "empty",
        Value::Object(_) => false,
    };
    if matches {
        Ok(())
    } else {
        Err(format!("the reference says {cell}, the code {value}"))
    }
}

/// Every disagreement between the reference and the code.
fn problems(reference: &str, code: &BTreeMap<String, Value>) -> Vec<String> {
    let rows = documented(reference);
    let mut out = Vec::new();
    for key in code.keys() {
        if !rows.iter().any(|(k, _)| k == key) {
            out.push(format!(
                "`{key}` is a config key without a row in docs/config.md"
            ));
        }
    }
    for (key, cell) in &rows {
        let Some(value) = code.get(key) else {
            out.push(format!(
                "docs/config.md documents `{key}`, which is not a config key"
            ));
            continue;
        };
        let worded = WORDED_DEFAULTS.iter().any(|(k, w)| k == key && w == cell);
        if let (false, Err(e)) = (worded, states(cell, value)) {
            out.push(format!("`{key}`: {e}"));
        }
    }
    out
}

#[test]
fn the_config_reference_matches_the_config_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let reference =
        fs::read_to_string(root.join("docs/config.md")).expect("reading docs/config.md");
    let value = serde_json::to_value(Config::default()).expect("the config serializes");
    let mut code = BTreeMap::new();
    leaves("", &value, &mut code);
    assert!(code.len() > 100, "the config has {} keys", code.len());
    let found = problems(&reference, &code);
    assert!(
        found.is_empty(),
        "docs/config.md and the Config types disagree:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_check_catches_missing_extra_and_wrong_rows() {
    let reference = "| key | default | meaning |\n|---|---|---|\n| `a` | 1 | x |\n| `b.c` / `b.d` | empty | y |\n| `gone` | 2 | z |\n| `e` | `on` | w |\n";
    let code: BTreeMap<String, Value> = [
        ("a", Value::from(2)),
        ("b.c", Value::from("")),
        ("b.d", Value::from("")),
        ("e", Value::from("on")),
        ("f", Value::from(true)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let found = problems(reference, &code);
    assert_eq!(
        found,
        [
            "`f` is a config key without a row in docs/config.md",
            "`a`: the reference says 1, the code 2",
            "docs/config.md documents `gone`, which is not a config key",
        ]
    );
}
