//! Auth: HS256 client tokens (claims `sub` = user id, `exp`, `iat`), the revocation
//! table (a user's tokens issued at or before a revocation are refused) and the node's
//! secrets.
//!
//! With no `jwt_secret` / `admin_token` configured, random ones are created in the data
//! dir on first start (mode 0600) and reused; a secret file readable by group or world
//! is refused. Secrets never reach logs: only their file paths do.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::config::Config;

/// Errors from token handling and secret files.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token is malformed, badly signed, expired, or names no valid user.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// The token was issued at or before its user's revocation.
    #[error("token revoked: issued at or before the revocation of {0}")]
    Revoked(String),
    /// A secret file could not be read or written.
    #[error("secret file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A secret file is readable by group or others.
    #[error("secret file {path} has mode {mode:o}: it must not be readable by group or others (chmod 600)")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Token signing failed.
    #[error("cannot sign token: {0}")]
    Sign(String),
}

/// A verified token's claims.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The user id.
    pub sub: String,
    /// Expiry, unix seconds.
    pub exp: u64,
    /// Issued at, unix seconds (0 for tokens that carry none: revoked by any revocation).
    #[serde(default)]
    pub iat: u64,
}

/// Revocations: user -> unix second at or before which their tokens are refused.
/// Shared by every clone of [`TokenKeys`]; filled from the store at start, by the
/// admin API and by other nodes' notices.
#[derive(Debug, Default)]
pub struct Revocations {
    users: RwLock<HashMap<String, i64>>,
}

impl Revocations {
    /// Records a revocation (the later one wins).
    pub fn revoke(&self, user: &str, at: i64) {
        if let Ok(mut m) = self.users.write() {
            let e = m.entry(user.to_string()).or_insert(at);
            *e = (*e).max(at);
        }
    }

    /// Whether a token of `user` issued at `iat` is revoked.
    pub fn is_revoked(&self, user: &str, iat: u64) -> bool {
        self.users
            .read()
            .ok()
            .and_then(|m| m.get(user).copied())
            .is_some_and(|at| iat as i64 <= at)
    }
}

/// Signs and verifies client tokens with one HS256 secret.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    /// Revoked users.
    pub revocations: Arc<Revocations>,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKeys(<redacted>)")
    }
}

impl TokenKeys {
    /// Keys from a shared secret, allowing 5 s of clock skew.
    pub fn new(secret: &[u8]) -> Self {
        Self::with_leeway(secret, 5)
    }

    /// Keys from a shared secret, allowing `leeway_secs` of clock skew on `exp`.
    pub fn with_leeway(secret: &[u8], leeway_secs: u32) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = leeway_secs as u64;
        validation.set_required_spec_claims(&["exp", "sub"]);
        TokenKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            revocations: Arc::new(Revocations::default()),
        }
    }

    /// Issues a token for `user` valid for `ttl`.
    pub fn issue(&self, user: &str, ttl: Duration) -> Result<String, AuthError> {
        if !im_proto::valid_id(user) {
            return Err(AuthError::Sign(format!(
                "user id {user:?} is not valid: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims {
                sub: user.to_string(),
                exp: now.saturating_add(ttl).as_secs(),
                iat: now.as_secs(),
            },
            &self.encoding,
        )
        .map_err(|e| AuthError::Sign(e.to_string()))
    }

    /// Verifies a token (signature, `exp` within the leeway, not revoked) and returns
    /// its user id.
    pub fn verify(&self, token: &str) -> Result<String, AuthError> {
        self.verify_claims(token).map(|c| c.sub)
    }

    /// As [`TokenKeys::verify`], returning every claim.
    pub fn verify_claims(&self, token: &str) -> Result<Claims, AuthError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| AuthError::InvalidToken(e.to_string()))?;
        if !im_proto::valid_id(&data.claims.sub) {
            return Err(AuthError::InvalidToken("sub is not a valid user id".into()));
        }
        if self
            .revocations
            .is_revoked(&data.claims.sub, data.claims.iat)
        {
            return Err(AuthError::Revoked(data.claims.sub));
        }
        Ok(data.claims)
    }
}

/// The node's resolved secrets.
#[derive(Clone)]
pub struct Secrets {
    /// Client token keys.
    pub keys: TokenKeys,
    /// Admin bearer token.
    pub admin_token: String,
}

impl Secrets {
    /// Uses the configured secrets, or loads/creates them in the data dir.
    pub fn load(config: &Config) -> Result<Secrets, AuthError> {
        let jwt = if config.jwt_secret.is_empty() {
            secret_file(&config.data_dir.join("jwt_secret"))?
        } else {
            config.jwt_secret.clone()
        };
        let admin_token = if config.admin_token.is_empty() {
            secret_file(&config.data_dir.join("admin_token"))?
        } else {
            config.admin_token.clone()
        };
        Ok(Secrets {
            keys: TokenKeys::with_leeway(jwt.as_bytes(), config.limits.token_leeway_secs),
            admin_token,
        })
    }
}

/// Reads a secret file, creating it with 32 random bytes (hex) and mode 0600 if absent.
pub fn secret_file(path: &Path) -> Result<String, AuthError> {
    let io = |source| AuthError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            check_mode(path)?;
            let secret = text.trim().to_string();
            if secret.is_empty() {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "file is empty",
                )));
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            let mut bytes = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut bytes);
            let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            match opts.open(path) {
                Ok(mut f) => {
                    f.write_all(secret.as_bytes()).map_err(io)?;
                    f.sync_all().map_err(io)?;
                    tracing::info!(path = %path.display(), "created secret file");
                    Ok(secret)
                }
                // Another process created it first: use theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => secret_file(path),
                Err(e) => Err(io(e)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

fn check_mode(path: &Path) -> Result<(), AuthError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|source| AuthError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(AuthError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
    }
    Ok(())
}

/// Parses a TTL like `90s`, `10m`, `1h`, `7d` (a bare number is seconds).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 90s, 10m, 1h, 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => {
            return Err(format!(
                "invalid duration {text:?}: unit must be s, m, h or d"
            ))
        }
    };
    if secs == 0 {
        return Err(format!("invalid duration {text:?}: must be more than zero"));
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let keys = TokenKeys::new(b"secret");
        let t = keys.issue("alice", Duration::from_secs(60)).unwrap();
        assert_eq!(keys.verify(&t).unwrap(), "alice");
        assert!(TokenKeys::new(b"other").verify(&t).is_err());
        assert!(keys.verify("not.a.token").is_err());
        assert!(keys.issue("bad:id", Duration::from_secs(60)).is_err());
        let c = keys.verify_claims(&t).unwrap();
        assert!(c.iat > 0 && c.exp >= c.iat + 59);
        keys.revocations.revoke("alice", c.iat as i64);
        assert!(matches!(keys.verify(&t), Err(AuthError::Revoked(_))));
        keys.revocations.revoke("alice", c.iat as i64 - 10);
        assert!(
            keys.verify(&t).is_err(),
            "an earlier revocation does not undo a later one"
        );
    }

    #[test]
    fn secret_files_are_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt_secret");
        let a = secret_file(&path).unwrap();
        assert_eq!(a, secret_file(&path).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = secret_file(&path).unwrap_err().to_string();
            assert!(e.contains("644"), "{e}");
        }
    }

    #[test]
    fn ttl_parses() {
        assert_eq!(parse_ttl("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_ttl("90").unwrap(), Duration::from_secs(90));
        assert!(parse_ttl("1y").is_err());
        assert!(parse_ttl("0s").is_err());
    }
}
