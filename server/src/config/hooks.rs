//! `[hooks]`: calls out to the application's backend. `[hooks.before_send]` is the
//! synchronous moderation hook on the send path (off while its `url` is empty): the
//! endpoint, its secret, the strict timeout, what a failure means (`on_error`), the
//! circuit breaker and the bound on calls in flight, with defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::redact::redacted;
use super::{ConfigError, MIN_SECRET_BYTES};

/// Hooks to the application's backend.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Hooks {
    /// The before-send moderation hook.
    pub before_send: BeforeSendConfig,
}

impl Hooks {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.before_send.validate()
    }
}

/// `[hooks.before_send]`: one signed HTTP POST per Send, answered allow, reject or replace.
/// Its `Debug` hides the secret.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BeforeSendConfig {
    /// `http(s)://HOST:PORT/PATH` of the hook; empty: no hook (the send path does not call out).
    pub url: String,
    /// HMAC-SHA256 key of the `X-IM-Signature` header (at least 32 bytes).
    pub secret: String,
    /// A file holding the secret instead (mode 0600 or stricter; trimmed).
    pub secret_file: String,
    /// How long one call may take, ms; then `on_error` decides.
    pub timeout_ms: u32,
    /// `fail_open` (deliver unchecked) or `fail_closed` (refuse, retryable) when the hook
    /// cannot answer: timeout, connection error, a non-200 status, a bad answer, the
    /// breaker open or too many calls in flight.
    pub on_error: String,
    /// The breaker opens after this many failed calls within `breaker_window_ms`.
    pub breaker_failures: u32,
    /// The window the failures are counted in, ms.
    pub breaker_window_ms: u32,
    /// How long an open breaker stays open before one probe call is let through, ms.
    pub breaker_cooldown_ms: u32,
    /// Most calls in flight at once on this node; a Send beyond it is handled by `on_error`.
    pub max_in_flight: u32,
    /// PEM CA certificates trusted for an https:// hook besides the webpki roots.
    pub ca_file: String,
}

impl std::fmt::Debug for BeforeSendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeSendConfig")
            .field("url", &super::redact_url(&self.url))
            .field("secret", &redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .field("timeout_ms", &self.timeout_ms)
            .field("on_error", &self.on_error)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_window_ms", &self.breaker_window_ms)
            .field("breaker_cooldown_ms", &self.breaker_cooldown_ms)
            .field("max_in_flight", &self.max_in_flight)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl Default for BeforeSendConfig {
    fn default() -> Self {
        BeforeSendConfig {
            url: String::new(),
            secret: String::new(),
            secret_file: String::new(),
            timeout_ms: 200,
            on_error: "fail_open".into(),
            breaker_failures: 5,
            breaker_window_ms: 10_000,
            breaker_cooldown_ms: 5_000,
            max_in_flight: 256,
            ca_file: String::new(),
        }
    }
}

impl BeforeSendConfig {
    /// Whether a hook is configured.
    pub fn enabled(&self) -> bool {
        !self.url.trim().is_empty()
    }

    /// Whether a failed call refuses the Send (`fail_closed`).
    pub fn fails_closed(&self) -> bool {
        self.on_error == "fail_closed"
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("hooks.before_send.timeout_ms", self.timeout_ms, 1, 10_000)?;
        if !matches!(self.on_error.as_str(), "fail_open" | "fail_closed") {
            return Err(invalid(
                "hooks.before_send.on_error",
                &self.on_error,
                "use \"fail_open\" or \"fail_closed\"",
            ));
        }
        range(
            "hooks.before_send.breaker_failures",
            self.breaker_failures,
            1,
            100_000,
        )?;
        range(
            "hooks.before_send.breaker_window_ms",
            self.breaker_window_ms,
            100,
            3_600_000,
        )?;
        range(
            "hooks.before_send.breaker_cooldown_ms",
            self.breaker_cooldown_ms,
            100,
            3_600_000,
        )?;
        range(
            "hooks.before_send.max_in_flight",
            self.max_in_flight,
            1,
            100_000,
        )?;
        if !self.enabled() {
            return Ok(());
        }
        let url = self.url.trim();
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| {
                invalid(
                    "hooks.before_send.url",
                    super::redact_url(url),
                    "use http://HOST:PORT/PATH or https://HOST:PORT/PATH",
                )
            })?;
        if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
            return Err(invalid(
                "hooks.before_send.url",
                super::redact_url(url),
                "needs a host: http(s)://HOST:PORT/PATH",
            ));
        }
        match (self.secret.is_empty(), self.secret_file.trim().is_empty()) {
            (true, true) => Err(invalid(
                "hooks.before_send.secret",
                "<empty>",
                "a hook needs a secret (at least 32 bytes) or hooks.before_send.secret_file",
            )),
            (false, false) => Err(invalid(
                "hooks.before_send.secret_file",
                &self.secret_file,
                "set hooks.before_send.secret or secret_file, not both",
            )),
            (false, true) if self.secret.len() < MIN_SECRET_BYTES => Err(invalid(
                "hooks.before_send.secret",
                format!("<redacted, {} bytes>", self.secret.len()),
                &format!("must be at least {MIN_SECRET_BYTES} bytes"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut BeforeSendConfig)) -> Result<(), String> {
        let mut c = BeforeSendConfig {
            url: "http://127.0.0.1:9000/check".into(),
            secret: "s".repeat(32),
            ..BeforeSendConfig::default()
        };
        f(&mut c);
        c.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_validate_and_bad_values_name_the_key() {
        assert!(BeforeSendConfig::default().validate().is_ok());
        assert!(with(|_| {}).is_ok());
        let e = with(|c| c.on_error = "maybe".into()).unwrap_err();
        assert!(
            e.contains("hooks.before_send.on_error") && e.contains("maybe"),
            "{e}"
        );
        assert!(with(|c| c.url = "https://x/check".into()).is_ok());
        let e = with(|c| c.url = "ftp://x/check".into()).unwrap_err();
        assert!(e.contains("hooks.before_send.url"), "{e}");
        let e = with(|c| c.secret = "short".into()).unwrap_err();
        assert!(
            e.contains("hooks.before_send.secret") && !e.contains("short"),
            "{e}"
        );
        let e = with(|c| c.secret = String::new()).unwrap_err();
        assert!(e.contains("secret_file"), "{e}");
        let e = with(|c| c.secret_file = "/x".into()).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = with(|c| c.timeout_ms = 0).unwrap_err();
        assert!(e.contains("hooks.before_send.timeout_ms"), "{e}");
        let e = with(|c| c.max_in_flight = 0).unwrap_err();
        assert!(e.contains("hooks.before_send.max_in_flight"), "{e}");
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = BeforeSendConfig {
            secret: "topsecret-topsecret-topsecret-xx".into(),
            ..BeforeSendConfig::default()
        };
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
