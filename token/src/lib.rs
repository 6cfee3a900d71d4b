//! im-token: the client tokens of im-server. HS256 JWTs with claims `sub` (the user
//! id), `exp` and `iat`; [`TokenKeys`] mints and verifies them, and consults the
//! [`Revocations`] table (a user's tokens issued at or before a revocation are refused).
//! A key set may hold several keys told apart by the header's `kid` (one signs, all
//! verify; a token without `kid` verifies against the default key), replaced in place
//! when secrets are rotated.
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
    /// A key set is inconsistent (a duplicate or empty kid, a signing or default kid
    /// that names no key).
    #[error("token keys: {0}")]
    Keys(String),
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

/// One HS256 key of a key set: its id (`kid` in the token header) and secret.
#[derive(Clone)]
pub struct Key {
    /// The key id; empty for the single key of a node configured without key ids.
    pub kid: String,
    /// The shared secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?}, <redacted>)", self.kid)
    }
}

/// The keys in force: the one that signs, and every one that verifies.
struct KeySet {
    /// The signing key's id (`None`: tokens are minted without a `kid` header).
    signing_kid: Option<String>,
    encoding: EncodingKey,
    /// Verification keys by id.
    by_kid: HashMap<String, DecodingKey>,
    /// The key a token without `kid` is verified against.
    default: DecodingKey,
    /// The ids, in the order given (for reports).
    kids: Vec<String>,
}

/// Signs and verifies client tokens: one signing key and one or more verification keys
/// told apart by the `kid` header. A token without `kid` verifies against the default
/// key. Clones share the keys and the revocations, so [`TokenKeys::replace_keys`] on
/// one (a secret rotation) is seen by all.
#[derive(Clone)]
pub struct TokenKeys {
    keys: Arc<RwLock<Arc<KeySet>>>,
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

    /// Keys from a shared secret, allowing `leeway_secs` of clock skew on `exp`: the one
    /// key signs (no `kid` header) and verifies every token.
    pub fn with_leeway(secret: &[u8], leeway_secs: u32) -> Self {
        let set = KeySet {
            signing_kid: None,
            encoding: EncodingKey::from_secret(secret),
            by_kid: HashMap::new(),
            default: DecodingKey::from_secret(secret),
            kids: Vec::new(),
        };
        Self::from_set(set, leeway_secs)
    }

    /// A key set: `keys` verify the tokens that name their `kid`; the one whose id is
    /// `signing_kid` signs (its id in each token's header); `default_kid` names the key
    /// a token without `kid` verifies against. Ids are unique and non-empty.
    pub fn with_keys(
        keys: &[Key],
        signing_kid: &str,
        default_kid: &str,
        leeway_secs: u32,
    ) -> Result<Self, TokenError> {
        let mut by_kid = HashMap::new();
        let mut kids = Vec::new();
        for k in keys {
            if k.kid.is_empty() {
                return Err(TokenError::Keys("a key has an empty kid".into()));
            }
            if by_kid
                .insert(k.kid.clone(), DecodingKey::from_secret(&k.secret))
                .is_some()
            {
                return Err(TokenError::Keys(format!("kid {:?} is listed twice", k.kid)));
            }
            kids.push(k.kid.clone());
        }
        let find = |kid: &str, what: &str| {
            keys.iter()
                .find(|k| k.kid == kid)
                .ok_or_else(|| TokenError::Keys(format!("{what} {kid:?} names no listed key")))
        };
        let signing = find(signing_kid, "the signing kid")?;
        let default = find(default_kid, "the default kid")?;
        let set = KeySet {
            signing_kid: Some(signing.kid.clone()),
            encoding: EncodingKey::from_secret(&signing.secret),
            by_kid,
            default: DecodingKey::from_secret(&default.secret),
            kids,
        };
        Ok(Self::from_set(set, leeway_secs))
    }

    fn from_set(set: KeySet, leeway_secs: u32) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = leeway_secs as u64;
        validation.set_required_spec_claims(&["exp", "sub"]);
        TokenKeys {
            keys: Arc::new(RwLock::new(Arc::new(set))),
            validation,
            revocations: Arc::new(Revocations::default()),
        }
    }

    /// Puts `other`'s keys in force in this key set and every clone of it (the
    /// revocations stay). Tokens in flight are checked against one set or the other.
    pub fn replace_keys(&self, other: &TokenKeys) {
        let new = other.current();
        if let Ok(mut k) = self.keys.write() {
            *k = new;
        }
    }

    /// The signing key's id (`None` without key ids) and every verification key's id.
    pub fn kids(&self) -> (Option<String>, Vec<String>) {
        let set = self.current();
        (set.signing_kid.clone(), set.kids.clone())
    }

    fn current(&self) -> Arc<KeySet> {
        match self.keys.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Issues a token for `user` valid for `ttl`, signed with the signing key.
    pub fn issue(&self, user: &str, ttl: Duration) -> Result<String, TokenError> {
        if !im_proto::valid_id(user) {
            return Err(TokenError::Sign(format!(
                "user id {user:?} is not valid: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.sign(&Claims {
            sub: user.to_owned(),
            exp: now.saturating_add(ttl).as_secs(),
            iat: now.as_secs(),
        })
    }

    /// Signs `claims` as they are, unchecked: for tokens a test or the bench needs
    /// wrong on purpose (expired, say). Live tokens come from [`TokenKeys::issue`].
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        let set = self.current();
        let mut header = Header::new(Algorithm::HS256);
        header.kid = set.signing_kid.clone();
        jsonwebtoken::encode(&header, claims, &set.encoding)
            .map_err(|e| TokenError::Sign(e.to_string()))
    }

    /// Verifies a token (signature, `exp` within the leeway, not revoked) and returns
    /// its user id.
    pub fn verify(&self, token: &str) -> Result<String, TokenError> {
        self.verify_claims(token).map(|c| c.sub)
    }

    /// As [`TokenKeys::verify`], returning every claim.
    pub fn verify_claims(&self, token: &str) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| TokenError::InvalidToken(e.to_string()))?;
        let set = self.current();
        let key = match header.kid.as_deref() {
            None => &set.default,
            Some(kid) => set.by_kid.get(kid).ok_or_else(|| {
                TokenError::InvalidToken(format!("unknown key id {:?}", truncate(kid)))
            })?,
        };
        let data = jsonwebtoken::decode::<Claims>(token, key, &self.validation)
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

/// A client-supplied key id cut to 64 characters for an error message.
fn truncate(kid: &str) -> &str {
    match kid.char_indices().nth(64) {
        Some((i, _)) => &kid[..i],
        None => kid,
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

    fn key(kid: &str, secret: &str) -> Key {
        Key {
            kid: kid.into(),
            secret: secret.as_bytes().to_vec(),
        }
    }

    #[test]
    fn key_ids_pick_the_key_and_rotation_is_seen_by_clones() {
        let old = TokenKeys::with_keys(&[key("k1", "one")], "k1", "k1", 5).unwrap();
        let live = old.clone();
        let t1 = old.issue("alice", Duration::from_secs(60)).unwrap();
        let header = jsonwebtoken::decode_header(&t1).unwrap();
        assert_eq!(header.kid.as_deref(), Some("k1"));
        // Both keys listed, k2 signs: k1's tokens still pass, k2's too.
        let both =
            TokenKeys::with_keys(&[key("k1", "one"), key("k2", "two")], "k2", "k1", 5).unwrap();
        live.replace_keys(&both);
        let t2 = old.issue("bob", Duration::from_secs(60)).unwrap();
        assert_eq!(
            jsonwebtoken::decode_header(&t2).unwrap().kid.as_deref(),
            Some("k2")
        );
        assert_eq!(live.verify(&t1).unwrap(), "alice");
        assert_eq!(live.verify(&t2).unwrap(), "bob");
        // A token without kid verifies against the default key (k1's secret).
        let legacy = TokenKeys::new(b"one")
            .issue("carol", Duration::from_secs(60))
            .unwrap();
        assert_eq!(live.verify(&legacy).unwrap(), "carol");
        // k1 removed: its tokens are refused, naming the key id.
        let only2 = TokenKeys::with_keys(&[key("k2", "two")], "k2", "k2", 5).unwrap();
        old.replace_keys(&only2);
        let e = live.verify(&t1).unwrap_err().to_string();
        assert!(e.contains("unknown key id \"k1\""), "{e}");
        assert!(live.verify(&legacy).is_err());
        assert_eq!(live.verify(&t2).unwrap(), "bob");
        assert_eq!(live.kids(), (Some("k2".into()), vec!["k2".to_owned()]));
    }

    #[test]
    fn inconsistent_key_sets_are_refused() {
        let e = |r: Result<TokenKeys, TokenError>| r.unwrap_err().to_string();
        assert!(e(TokenKeys::with_keys(&[key("a", "x")], "b", "a", 5)).contains("signing kid"));
        assert!(e(TokenKeys::with_keys(&[key("a", "x")], "a", "c", 5)).contains("default kid"));
        assert!(e(TokenKeys::with_keys(
            &[key("a", "x"), key("a", "y")],
            "a",
            "a",
            5
        ))
        .contains("twice"));
        assert!(e(TokenKeys::with_keys(&[key("", "x")], "", "", 5)).contains("empty kid"));
    }
}
