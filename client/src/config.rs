//! `ClientConfig`: what [`crate::Client::connect`] needs, with defaults that work as is.

use std::time::Duration;

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
        }
    }
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
}
