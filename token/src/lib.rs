//! im-token: the client tokens of im-server. HS256 JWTs with claims `sub` (the user
//! id), `exp` and `iat`; [`TokenKeys`] mints and verifies them, and consults the
//! [`Revocations`] table (a user's tokens issued at or before a revocation are refused).
//!
//! It owns nothing else: the server keeps where secrets come from (config or files in
//! the data dir), the bench and the tests only mint tokens with a known secret.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Errors from minting and verifying tokens. The text of a verification error is what
/// the server sends a refused client, so it stays stable.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token is malformed, badly signed, expired, or names no valid user.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// The token was issued at or before its user's revocation.
    #[error("token revoked: issued at or before the revocation of {0}")]
    Revoked(String),
    /// Token signing failed (or the user id is not valid).
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
/// Shared by every clone of [`TokenKeys`].
#[derive(Debug, Default)]
pub struct Revocations {
    users: RwLock<HashMap<String, i64>>,
}

impl Revocations {
    /// Records a revocation (the later one wins).
    pub fn revoke(&self, user: &str, at: i64) {
        if let Ok(mut m) = self.users.write() {
            let e = m.entry(user.to_owned()).or_insert(at);
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
    pub fn issue(&self, user: &str, ttl: Duration) -> Result<String, TokenError> {
        if !im_proto::valid_id(user) {
            return Err(TokenError::Sign(format!(
                "user id {user:?} is not valid: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims {
                sub: user.to_owned(),
                exp: now.saturating_add(ttl).as_secs(),
                iat: now.as_secs(),
            },
            &self.encoding,
        )
        .map_err(|e| TokenError::Sign(e.to_string()))
    }

    /// Signs `claims` as they are, unchecked: for tokens a test or the bench needs
    /// wrong on purpose (expired, say). Live tokens come from [`TokenKeys::issue`].
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .map_err(|e| TokenError::Sign(e.to_string()))
    }

    /// Verifies a token (signature, `exp` within the leeway, not revoked) and returns
    /// its user id.
    pub fn verify(&self, token: &str) -> Result<String, TokenError> {
        self.verify_claims(token).map(|c| c.sub)
    }

    /// As [`TokenKeys::verify`], returning every claim.
    pub fn verify_claims(&self, token: &str) -> Result<Claims, TokenError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| TokenError::InvalidToken(e.to_string()))?;
        if !im_proto::valid_id(&data.claims.sub) {
            return Err(TokenError::InvalidToken(
                "sub is not a valid user id".into(),
            ));
        }
        if self
            .revocations
            .is_revoked(&data.claims.sub, data.claims.iat)
        {
            return Err(TokenError::Revoked(data.claims.sub));
        }
        Ok(data.claims)
    }
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
        assert!(matches!(keys.verify(&t), Err(TokenError::Revoked(_))));
        keys.revocations.revoke("alice", c.iat as i64 - 10);
        assert!(
            keys.verify(&t).is_err(),
            "an earlier revocation does not undo a later one"
        );
    }

    #[test]
    fn signed_expired_claims_are_refused() {
        let keys = TokenKeys::with_leeway(b"secret", 0);
        let t = keys
            .sign(&Claims {
                sub: "carol".into(),
                exp: 1,
                iat: 0,
            })
            .unwrap();
        assert!(matches!(keys.verify(&t), Err(TokenError::InvalidToken(_))));
    }

    #[test]
    fn errors_keep_their_wire_text() {
        let keys = TokenKeys::new(b"secret");
        let e = keys.verify("not.a.token").unwrap_err().to_string();
        assert!(e.starts_with("invalid token: "), "{e}");
        let t = keys.issue("bob", Duration::from_secs(60)).unwrap();
        keys.revocations.revoke("bob", i64::MAX);
        assert_eq!(
            keys.verify(&t).unwrap_err().to_string(),
            "token revoked: issued at or before the revocation of bob"
        );
    }
}
