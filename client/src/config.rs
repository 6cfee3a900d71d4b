//! `ClientConfig`: what [`crate::Client::connect`] needs, with defaults that work as is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Where the SDK gets a fresh token: called before the current token expires (and
/// before each reconnect); `Err` keeps the current token and is retried later.
pub type TokenProvider =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync>;

/// Settings of a [`crate::Client`]; build with [`ClientConfig::new`] and adjust fields.
#[derive(Clone)]
pub struct ClientConfig {
    /// WebSocket endpoint, e.g. `ws://127.0.0.1:7070/ws` (with `route_urls`: the fallback
    /// when no seed answers; may be empty then).
    pub url: String,
    /// Cluster seeds, `http://HOST:PORT` of any nodes' client listeners: before connecting
    /// and before every reconnect the SDK asks one for `GET /v1/route` (the least-loaded
    /// healthy node, leaving out the node just lost) and connects there. Empty: use `url`.
    pub route_urls: Vec<String>,
    /// Login token (HS256 JWT with `sub` = user id).
    pub token: String,
    /// Device id sent in `Login` (default `"default"`, stable across restarts).
    pub device_id: String,
    /// Reconnect (with `resume = true`) after the connection drops (default true).
    pub auto_reconnect: bool,
    /// How long one request waits for its reply (default 10 s).
    pub request_timeout: Duration,
    /// First reconnect backoff delay (default 100 ms; doubles, jittered).
    pub reconnect_min: Duration,
    /// Largest reconnect backoff delay (default 5 s).
    pub reconnect_max: Duration,
    /// How many times one `send` is resent after `OVERLOADED` or a dropped connection (default 50).
    pub max_send_retries: u32,
    /// Fresh tokens (none: the session ends when `token` expires). With a provider, the
    /// SDK logs in again on the open connection when two thirds of the token's lifetime
    /// (its `exp` claim, read without verifying) have passed, so the stream goes on.
    pub token_provider: Option<TokenProvider>,
    /// Multi-region mode (default true): when a `/v1/route` answer lists regions, probe
    /// each region's entry point at start, connect through the nearest one that answers
    /// and fail over to the next nearest when it does not (`crate::regions`).
    pub probe_regions: bool,
    /// The probed regions, nearest first (filled by the SDK; shared by clones).
    pub regions: crate::regions::RegionBook,
    /// The TLS settings of a `wss://` `url` (none: the Mozilla roots), e.g.
    /// [`crate::TlsConfig::from_ca_file`] for a private CA.
    pub tls: Option<crate::TlsConfig>,
}

impl ClientConfig {
    /// A config for `url` and `token` with the defaults above.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        ClientConfig {
            url: url.into(),
            route_urls: Vec::new(),
            token: token.into(),
            device_id: "default".into(),
            auto_reconnect: true,
            request_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            max_send_retries: 50,
            token_provider: None,
            probe_regions: true,
            regions: crate::regions::RegionBook::default(),
            tls: None,
        }
    }

    /// Sets the token provider: an async closure returning a fresh token.
    pub fn with_token_provider<F, Fut>(mut self, provider: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        self.token_provider = Some(Arc::new(move || Box::pin(provider())));
        self
    }
}

/// The `exp` claim of a JWT (unix seconds), read without verifying the signature.
pub fn token_exp(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64url_decode(payload)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("exp")?.as_u64()
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("url", &self.url)
            .field("route_urls", &self.route_urls)
            .field("token", &"<redacted>")
            .field("device_id", &self.device_id)
            .field("auto_reconnect", &self.auto_reconnect)
            .field("request_timeout", &self.request_timeout)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("max_send_retries", &self.max_send_retries)
            .field("token_provider", &self.token_provider.is_some())
            .field("probe_regions", &self.probe_regions)
            .field("regions", &self.regions.order())
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_redacted_debug() {
        let c = ClientConfig::new("ws://h/ws", "secret-token");
        assert!(c.auto_reconnect);
        assert_eq!(c.request_timeout, Duration::from_secs(10));
        assert_eq!(c.reconnect_min, Duration::from_millis(100));
        assert_eq!(c.reconnect_max, Duration::from_secs(5));
        assert_eq!(c.max_send_retries, 50);
        assert!(!format!("{c:?}").contains("secret-token"));
    }

    #[test]
    fn reads_exp_from_a_jwt() {
        // {"sub":"a","exp":1700000000}
        let t = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIiwiZXhwIjoxNzAwMDAwMDAwfQ.sig";
        assert_eq!(token_exp(t), Some(1_700_000_000));
        assert_eq!(token_exp("garbage"), None);
        assert_eq!(token_exp("a.!!.c"), None);
    }
}
