//! Trust: how this node talks to NATS (credentials and TLS from `[cluster]`) and what it
//! believes of what it reads there. With `cluster.key` set, load reports and envelopes
//! are signed with HMAC-SHA256 under that shared key, and anything unsigned or badly
//! signed is ignored, so a NATS writer without the key can neither advertise a node
//! (and collect clients' tokens through `/v1/route`) nor inject deliveries. Without the
//! key, NATS is trusted as it is: see docs/cluster-trust.md.

use std::path::PathBuf;

use base64::Engine as _;
use prost::Message as _;
use ring::hmac;

use super::registry::LoadReport;
use super::relay::Envelope;
use crate::config::ClusterConfig;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The cluster key, when one is configured.
#[derive(Clone)]
pub struct ClusterKey(Option<hmac::Key>);

impl ClusterKey {
    /// The key of `cluster.key` (empty: no signing).
    pub fn new(key: &str) -> Self {
        ClusterKey((!key.is_empty()).then(|| hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes())))
    }

    /// The KV value of a report: its JSON, or with a key `SIG.JSON` (SIG: base64 HMAC of
    /// the JSON bytes).
    pub fn seal_report(&self, report: &LoadReport) -> serde_json::Result<Vec<u8>> {
        let json = serde_json::to_vec(report)?;
        Ok(match &self.0 {
            None => json,
            Some(k) => {
                let sig = B64.encode(hmac::sign(k, &json).as_ref());
                let mut v = Vec::with_capacity(sig.len() + 1 + json.len());
                v.extend_from_slice(sig.as_bytes());
                v.push(b'.');
                v.extend_from_slice(&json);
                v
            }
        })
    }

    /// The report in a KV value, if it parses and (with a key) its signature holds.
    pub fn open_report(&self, value: &[u8]) -> Option<LoadReport> {
        let json = match &self.0 {
            None => value,
            Some(k) => {
                let dot = value.iter().position(|b| *b == b'.')?;
                let sig = B64.decode(&value[..dot]).ok()?;
                let json = &value[dot + 1..];
                hmac::verify(k, json, &sig).ok()?;
                json
            }
        };
        serde_json::from_slice(json).ok()
    }

    /// Signs an envelope (sets `sig`, `trace_sig` when it carries a trace and
    /// `notify_sig` when it is marked `notify`; nothing without a key). `sig` covers the
    /// envelope without those fields and `trace`, as it did before they existed.
    pub fn seal_envelope(&self, env: &mut Envelope) {
        env.sig = Default::default();
        env.trace_sig = Default::default();
        env.notify_sig = Default::default();
        if let Some(k) = &self.0 {
            let trace = env.trace.take();
            let notify = std::mem::take(&mut env.notify);
            env.sig = hmac::sign(k, &env.encode_to_vec()).as_ref().to_vec().into();
            env.trace = trace;
            env.notify = notify;
            if let Some(t) = &env.trace {
                env.trace_sig = hmac::sign(k, &trace_signed(&env.sig, t))
                    .as_ref()
                    .to_vec()
                    .into();
            }
            if env.notify {
                env.notify_sig = hmac::sign(k, &notify_signed(&env.sig))
                    .as_ref()
                    .to_vec()
                    .into();
            }
        }
    }

    /// Whether an envelope may be believed: always without a key; with one, its `sig`
    /// must be the HMAC of the envelope without it (and without the trace and notify
    /// fields).
    pub fn check_envelope(&self, env: &Envelope) -> bool {
        let Some(k) = &self.0 else {
            return true;
        };
        let mut bare = env.clone();
        let sig = std::mem::take(&mut bare.sig);
        bare.trace = None;
        bare.trace_sig = Default::default();
        bare.notify = false;
        bare.notify_sig = Default::default();
        hmac::verify(k, &bare.encode_to_vec(), &sig).is_ok()
    }

    /// Whether an envelope's `notify` mark may be believed (true without a key); with a
    /// bad one the frame is pushed as any other group message.
    pub fn check_notify(&self, env: &Envelope) -> bool {
        match &self.0 {
            Some(k) => hmac::verify(k, &notify_signed(&env.sig), &env.notify_sig).is_ok(),
            None => true,
        }
    }

    /// Whether an envelope's trace context may be believed (true without a key or a
    /// trace); a bad one is dropped, the delivery still stands.
    pub fn check_trace(&self, env: &Envelope) -> bool {
        match (&self.0, &env.trace) {
            (Some(k), Some(t)) => {
                hmac::verify(k, &trace_signed(&env.sig, t), &env.trace_sig).is_ok()
            }
            _ => true,
        }
    }

    /// The HMAC-SHA256 of `bytes` under the key (empty without one): the `sig` of a cluster
    /// query or trace request and reply, computed as an envelope's is.
    pub fn sign(&self, bytes: &[u8]) -> bytes::Bytes {
        match &self.0 {
            Some(k) => hmac::sign(k, bytes).as_ref().to_vec().into(),
            None => bytes::Bytes::new(),
        }
    }

    /// Whether `sig` is the HMAC of `bytes` (always true without a key).
    pub fn verify(&self, bytes: &[u8], sig: &[u8]) -> bool {
        match &self.0 {
            Some(k) => hmac::verify(k, bytes, sig).is_ok(),
            None => true,
        }
    }
}

/// A cluster message that carries its own HMAC in a `sig` field (admin queries, trace
/// requests and their replies), signed with a domain tag so one kind never verifies as
/// another.
pub trait Sealed: prost::Message + Clone {
    /// The tag signed before the encoded message.
    const DOMAIN: &'static [u8];
    /// The message's `sig` field.
    fn sig_mut(&mut self) -> &mut bytes::Bytes;
}

impl ClusterKey {
    /// Signs `m` in place: `sig` becomes the HMAC of the domain tag and `m` without it.
    pub fn seal<M: Sealed>(&self, m: &mut M) {
        *m.sig_mut() = bytes::Bytes::new();
        *m.sig_mut() = self.sign(&sealed_bytes(m));
    }

    /// Whether `m`'s `sig` is its HMAC under the key (always true without a key).
    pub fn check<M: Sealed>(&self, m: &M) -> bool {
        let mut bare = m.clone();
        let sig = std::mem::take(bare.sig_mut());
        self.verify(&sealed_bytes(&bare), &sig)
    }
}

fn sealed_bytes<M: Sealed>(m: &M) -> Vec<u8> {
    let mut v = M::DOMAIN.to_vec();
    v.extend_from_slice(&m.encode_to_vec());
    v
}

/// What `notify_sig` covers: a domain tag and the envelope's `sig`.
fn notify_signed(sig: &[u8]) -> Vec<u8> {
    let mut v = b"im-notify\0".to_vec();
    v.extend_from_slice(sig);
    v
}

/// What `trace_sig` covers: a domain tag, the envelope's `sig` and the encoded trace.
fn trace_signed(sig: &[u8], trace: &super::relay::TraceCtx) -> Vec<u8> {
    let mut v = b"im-trace\0".to_vec();
    v.extend_from_slice(sig);
    v.extend_from_slice(&trace.encode_to_vec());
    v
}

/// NATS connect options from `[cluster]`: one of user/password, token or a creds file,
/// and TLS (trusted CAs, a client certificate, TLS required).
pub async fn connect_options(
    c: &ClusterConfig,
    name: String,
) -> std::io::Result<async_nats::ConnectOptions> {
    let mut o = if !c.nats_creds_file.is_empty() {
        async_nats::ConnectOptions::with_credentials_file(PathBuf::from(&c.nats_creds_file))
            .await
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cluster.nats_creds_file = {}: {e}", c.nats_creds_file),
                )
            })?
    } else if !c.nats_token.is_empty() {
        async_nats::ConnectOptions::with_token(c.nats_token.clone())
    } else if !c.nats_user.is_empty() {
        async_nats::ConnectOptions::with_user_and_password(
            c.nats_user.clone(),
            c.nats_password.clone(),
        )
    } else {
        async_nats::ConnectOptions::new()
    };
    o = o.name(name);
    if !c.nats_tls_ca_file.is_empty() {
        o = o.add_root_certificates(PathBuf::from(&c.nats_tls_ca_file));
    }
    if !c.nats_tls_cert_file.is_empty() {
        o = o.add_client_certificate(
            PathBuf::from(&c.nats_tls_cert_file),
            PathBuf::from(&c.nats_tls_key_file),
        );
    }
    if c.nats_tls_required {
        o = o.require_tls(true);
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_reports_and_envelopes_verify_and_forgeries_do_not() {
        let key = ClusterKey::new("k".repeat(32).as_str());
        let other = ClusterKey::new("x".repeat(32).as_str());
        let none = ClusterKey::new("");
        let r = LoadReport {
            node_id: "a".into(),
            ws_url: "ws://a/ws".into(),
            ..Default::default()
        };
        let v = key.seal_report(&r).unwrap();
        assert_eq!(key.open_report(&v), Some(r.clone()));
        assert_eq!(other.open_report(&v), None, "another key");
        let plain = none.seal_report(&r).unwrap();
        assert_eq!(none.open_report(&plain), Some(r.clone()));
        assert_eq!(key.open_report(&plain), None, "unsigned under a key");
        let mut forged = v.clone();
        let n = forged.len();
        forged[n - 3] ^= 1;
        assert_eq!(key.open_report(&forged), None, "tampered JSON");

        let mut e = Envelope {
            from: "a".into(),
            users: vec!["u".into()],
            ..Default::default()
        };
        key.seal_envelope(&mut e);
        assert!(key.check_envelope(&e));
        assert!(!other.check_envelope(&e));
        e.users.push("mallory".into());
        assert!(!key.check_envelope(&e), "tampered envelope");
        assert!(none.check_envelope(&e));
    }
}
