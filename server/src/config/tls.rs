//! `[tls]`: native TLS of the client and admin listeners (certificate and key files in
//! PEM, one pair per listener; empty: plain TCP), the handshake timeout and how often
//! the files are checked for a new certificate.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

/// TLS settings of both listeners (`[tls]`). A listener serves TLS when both its
/// certificate and key files are set, plain TCP when both are empty.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Tls {
    /// The client listener's certificate chain (PEM, leaf first); empty: plain `ws://`.
    pub cert_file: PathBuf,
    /// The client listener's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// The admin listener's certificate chain (PEM); empty: plain HTTP.
    pub admin_cert_file: PathBuf,
    /// The admin listener's private key (PEM).
    pub admin_key_file: PathBuf,
    /// A TLS handshake must complete within this many seconds of the accept, or the
    /// socket is closed (counted as a `timeout` failure).
    pub handshake_timeout_secs: u32,
    /// How often the certificate and key files are checked for a change (mtime); a
    /// changed, valid pair serves the next handshakes.
    pub reload_interval_secs: u32,
}

/// The defaults of the two timers (the file paths default to empty: TLS off).
const HANDSHAKE_TIMEOUT_SECS: u32 = 10;
const RELOAD_INTERVAL_SECS: u32 = 5;

impl Default for Tls {
    /// TLS off on both listeners.
    fn default() -> Self {
        Tls {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            admin_cert_file: PathBuf::new(),
            admin_key_file: PathBuf::new(),
            handshake_timeout_secs: HANDSHAKE_TIMEOUT_SECS,
            reload_interval_secs: RELOAD_INTERVAL_SECS,
        }
    }
}

impl Tls {
    /// Whether the client listener serves TLS.
    pub fn client_on(&self) -> bool {
        !self.cert_file.as_os_str().is_empty()
    }

    /// Whether the admin listener serves TLS.
    pub fn admin_on(&self) -> bool {
        !self.admin_cert_file.as_os_str().is_empty()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (cert_key, cert, key_key, key) in [
            (
                "tls.cert_file",
                &self.cert_file,
                "tls.key_file",
                &self.key_file,
            ),
            (
                "tls.admin_cert_file",
                &self.admin_cert_file,
                "tls.admin_key_file",
                &self.admin_key_file,
            ),
        ] {
            match (cert.as_os_str().is_empty(), key.as_os_str().is_empty()) {
                (false, true) => {
                    return Err(invalid(
                        key_key,
                        "\"\"",
                        &format!("must be set when {cert_key} is ({})", cert.display()),
                    ))
                }
                (true, false) => {
                    return Err(invalid(
                        cert_key,
                        "\"\"",
                        &format!("must be set when {key_key} is ({})", key.display()),
                    ))
                }
                _ => {}
            }
        }
        range(
            "tls.handshake_timeout_secs",
            self.handshake_timeout_secs,
            1,
            300,
        )?;
        range(
            "tls.reload_interval_secs",
            self.reload_interval_secs,
            1,
            3600,
        )?;
        Ok(())
    }
}
