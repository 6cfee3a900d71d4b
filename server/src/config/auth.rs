//! `[auth]`: the client token keys by id, for secret rotation: every listed key verifies
//! the tokens that name its `kid`, `signing_kid` signs, `default_kid` verifies tokens
//! without a `kid`. Empty, the node keeps the single `jwt_secret` (or the data dir's
//! file). Owns the section's fields, defaults and validation.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::{invalid, name_chars};
use super::{ConfigError, MIN_SECRET_BYTES};

/// Token key settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The HS256 keys, each with its id; empty: the single `jwt_secret`.
    pub jwt_keys: Vec<JwtKey>,
    /// The key that signs tokens (`im-server token`); empty: the only key, if one.
    pub signing_kid: String,
    /// The key that verifies tokens without a `kid` header; empty: the signing key.
    pub default_kid: String,
}

/// One listed key: its id and its secret, inline or in a file (mode 0600).
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtKey {
    /// The key id, carried in each token's header (`kid`).
    pub kid: String,
    /// The secret itself (at least 32 bytes); or use `secret_file`.
    pub secret: String,
    /// A file holding the secret, read at start and at each reload.
    pub secret_file: PathBuf,
}

impl std::fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKey")
            .field("kid", &self.kid)
            .field("secret", &super::redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .finish()
    }
}

impl AuthConfig {
    /// The signing key's id: `signing_kid`, or the only key's.
    pub fn signing_key(&self) -> &str {
        match (self.signing_kid.as_str(), self.jwt_keys.as_slice()) {
            ("", [only]) => &only.kid,
            (kid, _) => kid,
        }
    }

    /// The id of the key that verifies tokens without `kid`: `default_kid`, or the
    /// signing key's.
    pub fn default_key(&self) -> &str {
        if self.default_kid.is_empty() {
            self.signing_key()
        } else {
            &self.default_kid
        }
    }

    pub(super) fn validate(&self, jwt_secret: &str) -> Result<(), ConfigError> {
        if self.jwt_keys.is_empty() {
            for (key, value) in [
                ("auth.signing_kid", &self.signing_kid),
                ("auth.default_kid", &self.default_kid),
            ] {
                if !value.is_empty() {
                    return Err(invalid(
                        key,
                        value,
                        "names a key, but auth.jwt_keys is empty",
                    ));
                }
            }
            return Ok(());
        }
        if !jwt_secret.is_empty() {
            return Err(invalid(
                "jwt_secret",
                "<redacted>",
                "set either jwt_secret or auth.jwt_keys, not both (list the old secret as a key with its own kid)",
            ));
        }
        for (i, k) in self.jwt_keys.iter().enumerate() {
            name_chars("auth.jwt_keys.kid", &k.kid)?;
            if self.jwt_keys[..i].iter().any(|o| o.kid == k.kid) {
                return Err(invalid("auth.jwt_keys.kid", &k.kid, "listed twice"));
            }
            match (k.secret.is_empty(), k.secret_file.as_os_str().is_empty()) {
                (true, true) | (false, false) => {
                    return Err(invalid(
                        "auth.jwt_keys",
                        &k.kid,
                        "give each key exactly one of secret and secret_file",
                    ))
                }
                (false, true) if k.secret.len() < MIN_SECRET_BYTES => {
                    return Err(invalid(
                        "auth.jwt_keys.secret",
                        format!("<redacted, {} bytes> (kid {})", k.secret.len(), k.kid),
                        &format!("must be at least {MIN_SECRET_BYTES} bytes"),
                    ))
                }
                _ => {}
            }
        }
        if self.signing_kid.is_empty() && self.jwt_keys.len() > 1 {
            return Err(invalid(
                "auth.signing_kid",
                "",
                "name the signing key when auth.jwt_keys lists several",
            ));
        }
        for (key, kid) in [
            ("auth.signing_kid", self.signing_key()),
            ("auth.default_kid", self.default_key()),
        ] {
            if !self.jwt_keys.iter().any(|k| k.kid == kid) {
                return Err(invalid(key, kid, "names no key of auth.jwt_keys"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kid: &str, secret: &str, file: &str) -> JwtKey {
        JwtKey {
            kid: kid.into(),
            secret: secret.into(),
            secret_file: PathBuf::from(file),
        }
    }

    const LONG: &str = "a-secret-of-at-least-thirty-two-bytes!";

    fn refused(auth: &AuthConfig, jwt_secret: &str) -> String {
        auth.validate(jwt_secret).unwrap_err().to_string()
    }

    #[test]
    fn key_lists_are_checked_naming_the_key() {
        let one = AuthConfig {
            jwt_keys: vec![key("k1", LONG, "")],
            ..Default::default()
        };
        assert!(one.validate("").is_ok());
        assert_eq!((one.signing_key(), one.default_key()), ("k1", "k1"));
        assert!(refused(&one, LONG).contains("jwt_secret"));

        let mut two = AuthConfig {
            jwt_keys: vec![key("k1", LONG, ""), key("k2", "", "/etc/im/k2")],
            ..Default::default()
        };
        assert!(refused(&two, "").contains("auth.signing_kid"));
        two.signing_kid = "k3".into();
        let e = refused(&two, "");
        assert!(e.contains("auth.signing_kid") && e.contains("k3"), "{e}");
        two.signing_kid = "k2".into();
        two.default_kid = "k1".into();
        assert!(two.validate("").is_ok());
        assert_eq!((two.signing_key(), two.default_key()), ("k2", "k1"));

        for (bad, name) in [
            (key("k1", "short", ""), "auth.jwt_keys.secret"),
            (key("k1", LONG, "/x"), "exactly one"),
            (key("k1", "", ""), "exactly one"),
            (key("k 1", LONG, ""), "auth.jwt_keys.kid"),
        ] {
            let a = AuthConfig {
                jwt_keys: vec![bad],
                ..Default::default()
            };
            let e = refused(&a, "");
            assert!(e.contains(name), "{name}: {e}");
            assert!(!e.contains(LONG), "the secret leaked: {e}");
        }
        let twice = AuthConfig {
            jwt_keys: vec![key("k1", LONG, ""), key("k1", LONG, "")],
            signing_kid: "k1".into(),
            ..Default::default()
        };
        assert!(refused(&twice, "").contains("listed twice"));
        let dangling = AuthConfig {
            signing_kid: "k1".into(),
            ..Default::default()
        };
        assert!(refused(&dangling, "").contains("auth.jwt_keys is empty"));
    }
}
