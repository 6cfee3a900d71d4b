//! `[webhooks]`: event webhooks to the application's backend (the endpoints, each with
//! its URL, secret and event kinds; the sender's concurrency, timeout, retry age; the
//! offline-push collapse window; the outbox bound), with defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::{ConfigError, MIN_SECRET_BYTES};

/// The event kinds an endpoint may ask for.
pub const EVENT_KINDS: [&str; 7] = [
    "message.offline",
    "message.created",
    "message.edited",
    "message.recalled",
    "user.online",
    "user.offline",
    "group.changed",
];

/// The event kinds that come from committed messages (they need the outbox rows the
/// message commit writes).
pub const MESSAGE_KINDS: [&str; 5] = [
    "message.offline",
    "message.created",
    "message.edited",
    "message.recalled",
    "group.changed",
];

/// Event webhooks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Webhooks {
    /// The endpoints (none: webhooks off, and the message path writes nothing for them).
    pub endpoints: Vec<Endpoint>,
    /// Requests in flight per endpoint.
    pub concurrency: u32,
    /// One request's time bound, ms.
    pub timeout_ms: u32,
    /// First retry delay, ms (doubled per attempt, full jitter).
    pub retry_base_ms: u32,
    /// Longest retry delay, ms.
    pub retry_max_ms: u32,
    /// An event still failing this long after it was created is parked, seconds.
    pub max_age_secs: u32,
    /// `message.offline` for one user: later ones within this window after one fires
    /// are merged into one event at the window's end, ms (0: every one fires).
    pub offline_window_ms: u32,
    /// Most events the outbox holds (queued and parked); past it new events are stored
    /// parked.
    pub outbox_max: u32,
    /// Redirects are not followed; a response body is read up to this many bytes.
    pub max_response_bytes: u32,
    /// PEM CA certificates trusted for https:// endpoints besides the webpki roots
    /// (empty: the webpki roots only).
    pub ca_file: String,
}

/// One endpoint.
#[derive(Clone, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Endpoint {
    /// Its name (metrics label, admin routes): 1-64 characters of A-Z a-z 0-9 _ -.
    pub name: String,
    /// `http://` or `https://` URL events are POSTed to.
    pub url: String,
    /// The HMAC secret (at least 32 bytes); or empty with `secret_file`.
    pub secret: String,
    /// A file holding the secret (mode 0600), instead of `secret`.
    pub secret_file: String,
    /// The event kinds it gets ([`EVENT_KINDS`]).
    pub events: Vec<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("url", &super::redact_url(&self.url))
            .field("secret", &super::redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .field("events", &self.events)
            .finish()
    }
}

impl Default for Webhooks {
    fn default() -> Self {
        Webhooks {
            endpoints: Vec::new(),
            concurrency: 8,
            timeout_ms: 5000,
            retry_base_ms: 500,
            retry_max_ms: 60_000,
            max_age_secs: 86_400,
            offline_window_ms: 10_000,
            outbox_max: 1_000_000,
            max_response_bytes: 4096,
            ca_file: String::new(),
        }
    }
}

impl Endpoint {
    /// Whether it gets events of `kind`.
    pub fn wants(&self, kind: &str) -> bool {
        self.events.iter().any(|k| k == kind)
    }
}

impl Webhooks {
    /// Whether any endpoint wants an event made from committed messages.
    pub fn wants_messages(&self) -> bool {
        self.endpoints
            .iter()
            .any(|e| MESSAGE_KINDS.iter().any(|k| e.wants(k)))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("webhooks.concurrency", self.concurrency, 1, 256)?;
        range("webhooks.timeout_ms", self.timeout_ms, 100, 120_000)?;
        range("webhooks.retry_base_ms", self.retry_base_ms, 10, 600_000)?;
        range(
            "webhooks.retry_max_ms",
            self.retry_max_ms,
            self.retry_base_ms,
            3_600_000,
        )?;
        range("webhooks.max_age_secs", self.max_age_secs, 1, 30 * 86_400)?;
        range(
            "webhooks.offline_window_ms",
            self.offline_window_ms,
            0,
            3_600_000,
        )?;
        range("webhooks.outbox_max", self.outbox_max, 100, 1_000_000_000)?;
        range(
            "webhooks.max_response_bytes",
            self.max_response_bytes,
            0,
            1 << 20,
        )?;
        if self.endpoints.len() > 32 {
            return Err(invalid(
                "webhooks.endpoints",
                self.endpoints.len(),
                "at most 32 endpoints",
            ));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            e.validate(i)?;
            if self.endpoints[..i].iter().any(|o| o.name == e.name) {
                return Err(key_error(i, "name", &e.name, "names must be unique"));
            }
        }
        Ok(())
    }
}

/// An error naming `webhooks.endpoints[i].field` and the value.
fn key_error(i: usize, field: &str, value: &str, message: &str) -> ConfigError {
    ConfigError::Key {
        key: format!("webhooks.endpoints[{i}].{field}"),
        message: format!("{value:?}: {message}"),
    }
}

impl Endpoint {
    fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        if !name_ok {
            return Err(key_error(
                i,
                "name",
                &self.name,
                "use 1-64 characters of A-Z a-z 0-9 _ -",
            ));
        }
        let url = self.url.trim();
        match reqwest_url(url) {
            Ok(()) => {}
            Err(m) => return Err(key_error(i, "url", &super::redact_url(url), m)),
        }
        match (self.secret.is_empty(), self.secret_file.is_empty()) {
            (true, true) => {
                return Err(key_error(
                    i,
                    "secret",
                    "",
                    "set secret (at least 32 bytes) or secret_file",
                ))
            }
            (false, false) => {
                return Err(key_error(
                    i,
                    "secret_file",
                    &self.secret_file,
                    "set secret or secret_file, not both",
                ))
            }
            (false, true) if self.secret.len() < MIN_SECRET_BYTES => {
                return Err(key_error(
                    i,
                    "secret",
                    &format!("<redacted, {} bytes>", self.secret.len()),
                    &format!("must be at least {MIN_SECRET_BYTES} bytes"),
                ))
            }
            _ => {}
        }
        if self.events.is_empty() {
            return Err(key_error(
                i,
                "events",
                "[]",
                &format!("name at least one of {}", EVENT_KINDS.join(", ")),
            ));
        }
        if let Some(bad) = self
            .events
            .iter()
            .find(|k| !EVENT_KINDS.contains(&k.as_str()))
        {
            return Err(key_error(
                i,
                "events",
                bad,
                &format!("unknown event kind; use {}", EVENT_KINDS.join(", ")),
            ));
        }
        Ok(())
    }
}

/// Checks the URL's shape: `http://` or `https://HOST[:PORT]/...` without credentials.
fn reqwest_url(url: &str) -> Result<(), &'static str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("use an http:// or https:// URL")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains('@') || url.len() > 2048 {
        return Err("expected http(s)://HOST[:PORT]/PATH without credentials, at most 2048 bytes");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            name: "push".into(),
            url: "http://127.0.0.1:9000/hook".into(),
            secret: "x".repeat(32),
            secret_file: String::new(),
            events: vec!["message.offline".into()],
        }
    }

    #[test]
    fn endpoints_are_checked_by_key() {
        let mut w = Webhooks::default();
        w.endpoints.push(endpoint());
        assert!(w.validate().is_ok());
        assert!(w.wants_messages());
        w.endpoints[0].secret = "short".into();
        let e = w.validate().unwrap_err().to_string();
        assert!(e.contains("webhooks.endpoints[0].secret"), "{e}");
        w.endpoints[0] = endpoint();
        w.endpoints[0].events = vec!["message.sent".into()];
        let e = w.validate().unwrap_err().to_string();
        assert!(e.contains("events") && e.contains("message.sent"), "{e}");
        w.endpoints[0] = endpoint();
        w.endpoints[0].url = "https://hooks.example.com/im".into();
        assert!(w.validate().is_ok());
        w.endpoints[0].url = "ftp://x".into();
        assert!(w.validate().unwrap_err().to_string().contains("url"));
        w.endpoints[0] = endpoint();
        w.endpoints.push(endpoint());
        assert!(w.validate().unwrap_err().to_string().contains("unique"));
    }
}
