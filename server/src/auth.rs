//! Auth: HS256 client tokens (claim `sub` = user id, `exp`) and the node's secrets.
//!
//! With no `jwt_secret` / `admin_token` configured, random ones are created in the data
//! dir on first start (mode 0600) and reused; a secret file readable by group or world
//! is refused. Secrets never reach logs: only their file paths do.

use std::io::Write;
use std::path::{Path, PathBuf};
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

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

/// Signs and verifies client tokens with one HS256 secret.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKeys(<redacted>)")
    }
}

impl TokenKeys {
    /// Keys from a shared secret.
    pub fn new(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        validation.set_required_spec_claims(&["exp", "sub"]);
        TokenKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// Issues a token for `user` valid for `ttl`.
    pub fn issue(&self, user: &str, ttl: Duration) -> Result<String, AuthError> {
        if !im_proto::valid_id(user) {
            return Err(AuthError::Sign(format!(
                "user id {user:?} is not valid: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
            )));
        }
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(ttl)
            .as_secs();
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims {
                sub: user.to_string(),
                exp,
            },
            &self.encoding,
        )
        .map_err(|e| AuthError::Sign(e.to_string()))
    }

    /// Verifies a token and returns its user id.
    pub fn verify(&self, token: &str) -> Result<String, AuthError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| AuthError::InvalidToken(e.to_string()))?;
        if !im_proto::valid_id(&data.claims.sub) {
            return Err(AuthError::InvalidToken("sub is not a valid user id".into()));
        }
        Ok(data.claims.sub)
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
            keys: TokenKeys::new(jwt.as_bytes()),
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
