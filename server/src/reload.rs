//! Reloading the secrets of a running node: the client token keys (`auth.jwt_keys`, or
//! the single `jwt_secret`) and the admin token, read again from the config (the same
//! file, environment and flags the node started with) and their secret files, then put
//! in force for every connection's next login and every admin request. Asked for by
//! SIGHUP (the binary) and `POST /admin/v1/reload`; a reload that fails (a bad file, a
//! missing secret, a signing key that names no key) keeps the keys in force and says why.
//! Nothing else of the config changes without a restart.

use crate::auth::{Reloaded, Secrets};
use crate::config::{Config, ConfigError};
use crate::Node;

/// Reads the node's config again, as it was read at start.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The config did not load (the error names the key or the file).
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    /// A secret did not load (the error names the file or the key).
    #[error("secrets: {0}")]
    Secrets(#[from] crate::auth::AuthError),
}

impl Node {
    /// Sets where [`Node::reload_secrets`] reads the config; without it a reload uses the
    /// config the node started with (secret files are still read again). Set once.
    pub fn set_config_source(&self, source: ConfigSource) {
        let _ = self.config_source.set(source);
    }

    /// Reads the config and secrets again and puts the new token keys and admin token
    /// in force; on any error the old ones stay and the error says why. Logged either way.
    pub fn reload_secrets(&self) -> Result<Reloaded, ReloadError> {
        let result = self.load_secrets().map(|new| self.secrets.replace(&new));
        match &result {
            Ok(r) => {
                metrics::counter!("im_secret_reloads_total", "result" => "ok").increment(1);
                tracing::info!(
                    signing_kid = r.signing_kid.as_deref().unwrap_or(""),
                    kids = %r.kids.join(","),
                    admin_token_changed = r.admin_token_changed,
                    "secrets reloaded"
                );
            }
            Err(e) => {
                metrics::counter!("im_secret_reloads_total", "result" => "error").increment(1);
                tracing::error!(error = %e, "secrets not reloaded; the old ones stay in force");
            }
        }
        result
    }

    fn load_secrets(&self) -> Result<Secrets, ReloadError> {
        let config = match self.config_source.get() {
            Some(source) => source()?,
            None => self.config.clone(),
        };
        Ok(Secrets::load(&config)?)
    }
}
