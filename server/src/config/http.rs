//! `[http]`: the HTTP hardening of both listeners (header timeout and size, admin
//! connection cap), with its defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::range;
use super::ConfigError;

/// HTTP settings of both listeners (`[http]`), applied per accepted socket before any
/// request is read.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Http {
    /// A request head must arrive complete within this many seconds of the server
    /// starting to wait for it, or the socket is closed; this is also how long a
    /// kept-alive connection may sit idle between requests (both listeners).
    pub header_read_timeout_secs: u32,
    /// Largest request head (request line and headers) accepted, in bytes; larger: 431.
    pub max_header_bytes: u32,
    /// Most admin connections at once; more are closed at accept.
    pub admin_max_connections: u32,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            header_read_timeout_secs: 10,
            max_header_bytes: 16 * 1024,
            admin_max_connections: 64,
        }
    }
}

impl Http {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "http.header_read_timeout_secs",
            self.header_read_timeout_secs,
            1,
            3600,
        )?;
        range(
            "http.max_header_bytes",
            self.max_header_bytes,
            1024,
            1 << 20,
        )?;
        range(
            "http.admin_max_connections",
            self.admin_max_connections,
            1,
            1_000_000,
        )?;
        Ok(())
    }
}
