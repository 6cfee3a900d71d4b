//! Auth: the node's secrets, and the client tokens they sign. The tokens themselves
//! (HS256, claims `sub` = user id, `exp`, `iat`; the revocation table: a user's tokens
//! issued at or before a revocation are refused) are the `im-token` crate's, re-exported
//! here so that the server's API stays `im_server::auth::TokenKeys`.
//!
//! With no `jwt_secret` / `admin_token` configured, random ones are created in the data
//! dir on first start (mode 0600) and reused; a secret file readable by group or world
//! is refused. With `auth.jwt_keys`, several keys told apart by `kid` verify and one
//! signs (secret rotation); the keys and the admin token are replaced in place by a
//! reload ([`Secrets::replace`]), which keeps the old ones when the new do not load. Only the server creates them: `im-server token` reads the existing ones
//! and fails when there are none. Secrets never reach logs: only their file paths do.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rand::RngCore;

use crate::config::Config;

pub use im_token::{Claims, Key, Revocations, TokenError, TokenKeys};

/// Errors from token handling and secret files.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Minting or verifying a token failed (its text is the token error's).
    #[error(transparent)]
    Token(#[from] TokenError),
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
    /// No secret is configured and the data dir has none (minting tokens needs the server's).
    #[error(
        "no JWT secret: jwt_secret / IM_JWT_SECRET is not set and {path} does not exist; \
         run this where the server runs, pass the server's --config or --data-dir, \
         or set IM_JWT_SECRET to the server's secret"
    )]
    NoSecret {
        /// The secret file looked for.
        path: PathBuf,
    },
}

/// The node's resolved secrets. Clones share them: [`Secrets::replace`] (a reload) is
/// seen by every holder.
#[derive(Clone)]
pub struct Secrets {
    /// Client token keys.
    pub keys: TokenKeys,
    /// Admin bearer token.
    pub admin_token: AdminToken,
}

/// The admin bearer token in force, replaced in place by a reload.
#[derive(Clone, Default)]
pub struct AdminToken(Arc<RwLock<Arc<str>>>);

impl AdminToken {
    /// A token holder with `token` in force.
    pub fn new(token: &str) -> AdminToken {
        AdminToken(Arc::new(RwLock::new(Arc::from(token))))
    }

    /// The token in force.
    pub fn get(&self) -> Arc<str> {
        match self.0.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, token: Arc<str>) {
        if let Ok(mut t) = self.0.write() {
            *t = token;
        }
    }
}

/// What a reload put in force: the key ids and whether the admin token changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The signing key's id (`None`: the single `jwt_secret`, no key ids).
    pub signing_kid: Option<String>,
    /// Every verification key's id.
    pub kids: Vec<String>,
    /// Whether the admin token is a new one.
    pub admin_token_changed: bool,
}

impl Secrets {
    /// Uses the configured secrets, or loads/creates them in the data dir.
    pub fn load(config: &Config) -> Result<Secrets, AuthError> {
        let admin_token = if config.admin_token.is_empty() {
            secret_file(&config.data_dir.join("admin_token"))?
        } else {
            config.admin_token.clone()
        };
        let keys = if config.auth.jwt_keys.is_empty() {
            let jwt = if config.jwt_secret.is_empty() {
                secret_file(&config.data_dir.join("jwt_secret"))?
            } else {
                config.jwt_secret.clone()
            };
            TokenKeys::with_leeway(jwt.as_bytes(), config.limits.token_leeway_secs)
        } else {
            listed_keys(config)?
        };
        Ok(Secrets {
            keys,
            admin_token: AdminToken::new(&admin_token),
        })
    }

    /// Puts `new`'s keys and admin token in force for every holder of these secrets
    /// (the revocations stay); says what is in force now.
    pub fn replace(&self, new: &Secrets) -> Reloaded {
        self.keys.replace_keys(&new.keys);
        let token = new.admin_token.get();
        let admin_token_changed = *self.admin_token.get() != *token;
        self.admin_token.set(token);
        let (signing_kid, kids) = self.keys.kids();
        Reloaded {
            signing_kid,
            kids,
            admin_token_changed,
        }
    }
}

/// The keys `auth.jwt_keys` lists, each secret read from the config or its file (which
/// must exist: a listed key is never created).
fn listed_keys(config: &Config) -> Result<TokenKeys, AuthError> {
    let mut keys = Vec::with_capacity(config.auth.jwt_keys.len());
    for k in &config.auth.jwt_keys {
        let secret = if k.secret.is_empty() {
            let secret = read_secret(&k.secret_file)?.ok_or_else(|| AuthError::Io {
                path: k.secret_file.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("the secret file of key {:?} does not exist", k.kid),
                ),
            })?;
            if secret.len() < crate::config::MIN_SECRET_BYTES {
                return Err(AuthError::Io {
                    path: k.secret_file.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "the secret of key {:?} is shorter than {} bytes",
                            k.kid,
                            crate::config::MIN_SECRET_BYTES
                        ),
                    ),
                });
            }
            secret
        } else {
            k.secret.clone()
        };
        keys.push(Key {
            kid: k.kid.clone(),
            secret: secret.into_bytes(),
        });
    }
    Ok(TokenKeys::with_keys(
        &keys,
        config.auth.signing_key(),
        config.auth.default_key(),
        config.limits.token_leeway_secs,
    )?)
}

/// The token keys of an existing node, for minting tokens outside it (signed with the
/// signing key): the listed keys, the configured secret or the data dir's `jwt_secret`,
/// never a newly created one.
pub fn existing_token_keys(config: &Config) -> Result<TokenKeys, AuthError> {
    if !config.auth.jwt_keys.is_empty() {
        return listed_keys(config);
    }
    let jwt = if config.jwt_secret.is_empty() {
        let path = config.data_dir.join("jwt_secret");
        match read_secret(&path)? {
            Some(secret) => secret,
            None => {
                let path = std::path::absolute(&path).unwrap_or(path);
                return Err(AuthError::NoSecret { path });
            }
        }
    } else {
        config.jwt_secret.clone()
    };
    Ok(TokenKeys::with_leeway(
        jwt.as_bytes(),
        config.limits.token_leeway_secs,
    ))
}

/// Reads an existing secret file (`None` if absent); refuses an empty or shared one.
pub fn read_secret(path: &Path) -> Result<Option<String>, AuthError> {
    let io = |source| AuthError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            check_mode(path)?;
            let secret = text.trim().to_owned();
            if secret.is_empty() {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "file is empty",
                )));
            }
            Ok(Some(secret))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(e)),
    }
}

/// Reads a secret file, creating it with 32 random bytes (hex) and mode 0600 if absent.
pub fn secret_file(path: &Path) -> Result<String, AuthError> {
    let io = |source| AuthError::Io {
        path: path.to_owned(),
        source,
    };
    match read_secret(path)? {
        Some(secret) => Ok(secret),
        None => {
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
