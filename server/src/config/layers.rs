//! The layering of a config before it is typed: a TOML file deep-merged over the
//! defaults, then `IM_*` environment variables applied to the leaves they name.

use super::ConfigError;

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
    env: &std::collections::HashMap<String, String>,
) -> Result<(), ConfigError> {
    if let toml::Value::Table(table) = node {
        for (k, v) in table.iter_mut() {
            path.push(k.clone());
            apply_env(v, path, env)?;
            path.pop();
        }
        return Ok(());
    }
    let var = format!("IM_{}", path.join("_").to_uppercase());
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
