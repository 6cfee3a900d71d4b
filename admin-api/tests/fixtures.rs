//! Every answer the console's fixtures recorded from a real node (`console/tests/fixtures/`)
//! decodes into this crate's types strictly: each field of the recorded JSON, at every
//! depth, must be declared (a field the types do not know would be dropped silently on
//! the read side, which is what `#[serde(default)]` allows and this test does not).

use std::path::{Path, PathBuf};

use im_admin_api::{
    ConnectionList, ErrorBody, HeapProfileBundle, LogFilters, LogTailLine, Logs, Memory,
    MessageTrace, Overview, ParkedEvents, PostedMessages, ProfileBundle, SlowConsumers, UserDiag,
    Webhooks,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../console/tests/fixtures")
}

/// The paths of `recorded` (object keys at every depth, array items by index) that
/// `decoded` (the typed value serialized again) does not have.
fn unknown(recorded: &Value, decoded: &Value, at: &str, out: &mut Vec<String>) {
    match (recorded, decoded) {
        (Value::Object(r), Value::Object(d)) => {
            for (k, v) in r {
                let path = format!("{at}.{k}");
                match d.get(k) {
                    Some(dv) => unknown(v, dv, &path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(r), Value::Array(d)) => {
            for (i, v) in r.iter().enumerate() {
                match d.get(i) {
                    Some(dv) => unknown(v, dv, &format!("{at}[{i}]"), out),
                    None => out.push(format!("{at}[{i}]")),
                }
            }
        }
        (Value::Object(_) | Value::Array(_), _) => out.push(format!("{at} (shape)")),
        _ => {}
    }
}

/// Decodes `file` as `T` and fails on any field `T` does not declare.
fn strict<T: DeserializeOwned + Serialize>(file: &str) {
    let text = std::fs::read_to_string(dir().join(file)).expect("fixture readable");
    let recorded: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let de = &mut serde_json::Deserializer::from_str(&text);
    let typed: T = serde_path_to_error::deserialize(de)
        .unwrap_or_else(|e| panic!("{file}: does not decode: {e}"));
    let decoded = serde_json::to_value(&typed).expect("serializes");
    let mut out = Vec::new();
    unknown(&recorded, &decoded, "", &mut out);
    assert!(
        out.is_empty(),
        "{file}: fields the types do not declare: {out:?}"
    );
}

/// Decodes each line of the NDJSON `file` as `T`, strictly as [`strict`] does (blank
/// lines are keep-alives and skipped); fails on an empty file.
fn strict_lines<T: DeserializeOwned + Serialize>(file: &str) {
    let text = std::fs::read_to_string(dir().join(file)).expect("fixture readable");
    let mut n = 0;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let recorded: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{file}:{}: not JSON: {e}", i + 1));
        let de = &mut serde_json::Deserializer::from_str(line);
        let typed: T = serde_path_to_error::deserialize(de)
            .unwrap_or_else(|e| panic!("{file}:{}: does not decode: {e}", i + 1));
        let decoded = serde_json::to_value(&typed).expect("serializes");
        let mut out = Vec::new();
        unknown(&recorded, &decoded, "", &mut out);
        assert!(
            out.is_empty(),
            "{file}:{}: fields the types do not declare: {out:?}",
            i + 1
        );
        n += 1;
    }
    assert!(n > 0, "{file}: no lines");
}

const FILES: &[&str] = &[
    "overview.json",
    "overview_cluster.json",
    "overview_limits.json",
    "overview_store_full.json",
    "overview_hook_open.json",
    "overview_series.json",
    "overview_runtime.json",
    "overview_regions.json",
    "connections.json",
    "slow_consumers_1.json",
    "slow_consumers_2.json",
    "memory.json",
    "log_filters.json",
    "logs.json",
    "logs_rotated.json",
    "profile_bundle.json",
    "heap_profile_bundle.json",
    "error_unauthorized.json",
    "error_no_such_route.json",
    "error_no_connection.json",
    "error_profile_busy.json",
    "posted_messages.json",
    "error_no_group.json",
    "log_tail.ndjson",
    "user.json",
    "user_missing_node.json",
    "error_no_user.json",
    "trace.json",
    "error_no_trace.json",
    "webhooks.json",
    "webhooks_parked.json",
];

#[test]
fn every_recorded_answer_decodes_strictly() {
    strict::<Overview>("overview.json");
    strict::<Overview>("overview_cluster.json");
    strict::<Overview>("overview_limits.json");
    strict::<Overview>("overview_store_full.json");
    strict::<Overview>("overview_hook_open.json");
    strict::<Vec<Overview>>("overview_series.json");
    strict::<Overview>("overview_runtime.json");
    strict::<Overview>("overview_regions.json");
    strict::<ConnectionList>("connections.json");
    strict::<SlowConsumers>("slow_consumers_1.json");
    strict::<SlowConsumers>("slow_consumers_2.json");
    strict::<Memory>("memory.json");
    strict::<LogFilters>("log_filters.json");
    strict::<Logs>("logs.json");
    strict::<Logs>("logs_rotated.json");
    strict::<ProfileBundle>("profile_bundle.json");
    strict::<HeapProfileBundle>("heap_profile_bundle.json");
    strict::<PostedMessages>("posted_messages.json");
    strict::<UserDiag>("user.json");
    strict::<UserDiag>("user_missing_node.json");
    for f in FILES.iter().filter(|f| f.starts_with("error_")) {
        strict::<ErrorBody>(f);
    }
    strict_lines::<LogTailLine>("log_tail.ndjson");
    strict::<MessageTrace>("trace.json");
    strict::<Webhooks>("webhooks.json");
    strict::<ParkedEvents>("webhooks_parked.json");
}

#[test]
fn every_fixture_is_checked() {
    let mut on_disk: Vec<String> = std::fs::read_dir(dir())
        .expect("fixtures dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") || n.ends_with(".ndjson"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FILES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "a fixture is not checked by this test");
}

#[test]
fn the_checker_sees_an_unknown_field() {
    let recorded = serde_json::json!({"total": 1, "connections": [{"conn_id": 1, "extra": 2}]});
    let typed: ConnectionList = serde_json::from_value(recorded.clone()).expect("decodes");
    let mut out = Vec::new();
    unknown(
        &recorded,
        &serde_json::to_value(typed).unwrap(),
        "",
        &mut out,
    );
    assert_eq!(out, [".connections[0].extra"]);
}
