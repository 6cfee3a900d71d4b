//! The layering of a config before it is typed: a TOML file deep-merged over the
//! defaults, then `IM_*` environment variables applied to the leaves they name; an
//! `IM_*` variable that names no key (and is not one other tools read) is refused.

use std::collections::HashMap;

use super::ConfigError;

/// `IM_*` variables the server knowingly ignores, read by other programs of the
/// repository (a shell may export them when the server starts). Documented in
/// docs/config.md; every other `IM_*` name must be a config key (or the `IM_LOG` alias).
const IGNORED_ENV: &[&str] = &[
    // The `im` CLI: endpoint, token, token file, device id.
    "IM_URL",
    "IM_TOKEN",
    "IM_TOKEN_FILE",
    "IM_DEVICE",
    // The TypeScript SDK's tests and bench, scripts/test: the server binary to start.
    "IM_SERVER_BIN",
    // The runbooks' shell variables: the admin base URL, the user being debugged.
    "IM_ADMIN",
    "IM_UID",
    // The fault tests' sizes and the log-tail fixture recorder.
    "IM_FAULT_SECS",
    "IM_FAULT_USERS",
    "IM_FAULTS_PAIRS",
    "IM_RECORD_TAIL",
];

/// Prefixes of ignored `IM_*` variables: `IM_TEST_*` (tests, .ci/run, bench scripts) and
/// `IM_BENCH_*` (im-bench). No config section is named `test` or `bench`.
const IGNORED_ENV_PREFIXES: &[&str] = &["IM_TEST_", "IM_BENCH_"];

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
pub(super) fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Applies `IM_<PATH>` overrides to every leaf of the (defaults-shaped) tree, parsing each
/// raw value as the type the default has.
pub(super) fn apply_env(
    node: &mut toml::Value,
    path: &mut Vec<String>,
    env: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    if let toml::Value::Table(table) = node {
        for (k, v) in table.iter_mut() {
            path.push(k.clone());
            apply_env(v, path, env)?;
            path.pop();
        }
        return Ok(());
    }
    let var = env_name(path);
    let Some(raw) = env.get(&var) else {
        return Ok(());
    };
    let err = |message: String| ConfigError::Env {
        var: var.clone(),
        key: path.join("."),
        value: raw.clone(),
        message,
    };
    *node = match node {
        toml::Value::Integer(_) => toml::Value::Integer(
            raw.trim()
                .parse()
                .map_err(|e: std::num::ParseIntError| err(e.to_string()))?,
        ),
        toml::Value::Float(_) => toml::Value::Float(
            raw.trim()
                .parse()
                .map_err(|e: std::num::ParseFloatError| err(e.to_string()))?,
        ),
        toml::Value::Boolean(_) => toml::Value::Boolean(match raw.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => return Err(err("expected true or false".into())),
        }),
        // Lists (e.g. `limits.trusted_proxies`): comma-separated.
        toml::Value::Array(_) => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| toml::Value::String(v.to_owned()))
                .collect(),
        ),
        _ => toml::Value::String(raw.clone()),
    };
    Ok(())
}

/// The env name of the key at `path`: `["persist", "batch_max"]` is `IM_PERSIST_BATCH_MAX`.
fn env_name(path: &[String]) -> String {
    format!("IM_{}", path.join("_").to_uppercase())
}

/// The env name of every leaf of the (defaults-shaped) tree, e.g. `IM_PERSIST_BATCH_MAX`.
pub(super) fn env_names(node: &toml::Value, path: &mut Vec<String>, out: &mut Vec<String>) {
    if let toml::Value::Table(table) = node {
        for (k, v) in table {
            path.push(k.clone());
            env_names(v, path, out);
            path.pop();
        }
        return;
    }
    out.push(env_name(path));
}

/// Refuses the first (by name) `IM_*` variable of `env` that is neither in `known` (the
/// config keys' env names and aliases) nor one the server knowingly ignores.
pub(super) fn refuse_unknown_env(
    known: &[String],
    env: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    let mut names: Vec<&String> = env.keys().filter(|k| k.starts_with("IM_")).collect();
    names.sort();
    let unknown = names.into_iter().find(|var| {
        !known.iter().any(|k| k == *var)
            && !IGNORED_ENV.contains(&var.as_str())
            && !IGNORED_ENV_PREFIXES.iter().any(|p| var.starts_with(p))
    });
    let Some(var) = unknown else {
        return Ok(());
    };
    let closest = known
        .iter()
        .map(|k| (distance(k, var), k))
        .filter(|(d, _)| *d <= 2)
        .min();
    Err(ConfigError::UnknownEnv {
        var: var.clone(),
        hint: closest
            .map(|(_, k)| format!(" (did you mean {k}?)"))
            .unwrap_or_default(),
    })
}

/// Edit distance (insertions, deletions, substitutions) between two ASCII-ish names.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}
