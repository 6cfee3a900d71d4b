//! The checks every section's validation is made of; each error names the key and the
//! value (`ConfigError::Invalid`).

use std::net::SocketAddr;

use super::ConfigError;

/// A `ConfigError::Invalid` naming `key`, `value` and what is wrong.
pub(super) fn invalid(
    key: &'static str,
    value: impl std::fmt::Display,
    message: &str,
) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.to_string(),
        message: message.to_owned(),
    }
}

/// A name of 1-64 characters of A-Z a-z 0-9 _ - (file prefixes, NATS prefixes).
pub(super) fn name_chars(key: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            value,
            "use 1-64 characters of A-Z a-z 0-9 _ -",
        ))
    }
}

/// An `IP:PORT` listener address.
pub(super) fn addr(key: &'static str, value: &str) -> Result<(), ConfigError> {
    value
        .parse::<SocketAddr>()
        .map(|_| ())
        .map_err(|_| invalid(key, value, "expected IP:PORT, e.g. 127.0.0.1:7070"))
}

/// `v` within `lo..=hi`.
pub(super) fn range<T: PartialOrd + std::fmt::Display>(
    key: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(invalid(key, &v, &format!("must be between {lo} and {hi}")));
    }
    Ok(())
}
