//! `[cluster]`: cluster mode's settings (registry TTL, load reports, routing weight,
//! membership cache, the cluster key, NATS credentials and TLS), with their defaults,
//! validation and a `Debug` that hides the secrets.

use serde::{Deserialize, Serialize};

use super::check::{invalid, name_chars, range};
use super::redact::redacted;
use super::{ConfigError, MIN_SECRET_BYTES};

/// Cluster settings (`[cluster]`); used when `nats_url` is set.
/// Its `Debug` hides the key and the NATS password and token.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// A node whose load report is older than this is out of rotation.
    pub ttl_secs: u32,
    /// How often this node publishes its load report.
    pub report_interval_ms: u32,
    /// WebSocket URL clients use to reach this node; empty: `ws://<client listener>/ws`.
    pub advertise_url: String,
    /// Prefix of the NATS subjects and KV buckets (several clusters may share one NATS).
    pub prefix: String,
    /// Weight of CPU busy in the routing score `(connections + 1) * (1 + cpu_weight * cpu_busy)`.
    pub cpu_weight: f64,
    /// A cached group member list older than this is read again from the store, so a
    /// change on another node whose notice was lost applies within this time.
    pub membership_ttl_ms: u32,
    /// Most groups in the membership cache (least recently used go first).
    pub membership_cache_groups: u32,
    /// Fault injection for tests: do not publish group-change notices to other nodes.
    pub drop_group_notices: bool,
    /// Shared cluster key (at least 32 bytes): load reports and envelopes are signed with
    /// HMAC-SHA256 under it, and unsigned or badly signed ones are ignored. Empty: unsigned.
    pub key: String,
    /// NATS user (with `nats_password`).
    pub nats_user: String,
    /// NATS password.
    pub nats_password: String,
    /// NATS token.
    pub nats_token: String,
    /// NATS credentials file (JWT and nkey seed, `.creds`).
    pub nats_creds_file: String,
    /// PEM file of CA certificates to trust for the NATS server's TLS certificate.
    pub nats_tls_ca_file: String,
    /// PEM client certificate for NATS TLS (with `nats_tls_key_file`).
    pub nats_tls_cert_file: String,
    /// PEM private key of `nats_tls_cert_file`.
    pub nats_tls_key_file: String,
    /// Refuse to talk to NATS without TLS (also implied by a `tls://` URL).
    pub nats_tls_required: bool,
    /// How long a cluster-wide admin query (`GET /admin/v1/users/{uid}`) waits for each
    /// other node's answer; a node that does not answer in time is listed as missing.
    pub query_timeout_ms: u32,
    /// How long the node serving a trace request waits for the other nodes' parts.
    pub trace_timeout_ms: u32,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = redacted;
        f.debug_struct("ClusterConfig")
            .field("ttl_secs", &self.ttl_secs)
            .field("report_interval_ms", &self.report_interval_ms)
            .field("advertise_url", &self.advertise_url)
            .field("prefix", &self.prefix)
            .field("cpu_weight", &self.cpu_weight)
            .field("membership_ttl_ms", &self.membership_ttl_ms)
            .field("membership_cache_groups", &self.membership_cache_groups)
            .field("drop_group_notices", &self.drop_group_notices)
            .field("key", &secret(&self.key))
            .field("nats_user", &self.nats_user)
            .field("nats_password", &secret(&self.nats_password))
            .field("nats_token", &secret(&self.nats_token))
            .field("nats_creds_file", &self.nats_creds_file)
            .field("nats_tls_ca_file", &self.nats_tls_ca_file)
            .field("nats_tls_cert_file", &self.nats_tls_cert_file)
            .field("query_timeout_ms", &self.query_timeout_ms)
            .field("nats_tls_key_file", &self.nats_tls_key_file)
            .field("nats_tls_required", &self.nats_tls_required)
            .field("trace_timeout_ms", &self.trace_timeout_ms)
            .finish()
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            ttl_secs: 15,
            report_interval_ms: 2000,
            advertise_url: String::new(),
            prefix: "im".into(),
            cpu_weight: 1.0,
            membership_ttl_ms: 2000,
            membership_cache_groups: 10_000,
            drop_group_notices: false,
            key: String::new(),
            nats_user: String::new(),
            nats_password: String::new(),
            nats_token: String::new(),
            nats_creds_file: String::new(),
            nats_tls_ca_file: String::new(),
            nats_tls_cert_file: String::new(),
            nats_tls_key_file: String::new(),
            nats_tls_required: false,
            query_timeout_ms: 1000,
            trace_timeout_ms: 1000,
        }
    }
}

impl ClusterConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("cluster.ttl_secs", self.ttl_secs, 1, 3600)?;
        range(
            "cluster.report_interval_ms",
            self.report_interval_ms,
            100,
            600_000,
        )?;
        if u64::from(self.report_interval_ms) * 2 > u64::from(self.ttl_secs) * 1000 {
            return Err(invalid(
                "cluster.report_interval_ms",
                self.report_interval_ms,
                "must be at most half of cluster.ttl_secs (in ms), or live nodes drop out",
            ));
        }
        let u = &self.advertise_url;
        if !(u.is_empty() || u.starts_with("ws://") || u.starts_with("wss://")) {
            return Err(invalid(
                "cluster.advertise_url",
                u,
                "use ws://HOST:PORT/ws or wss://..., or leave it empty",
            ));
        }
        name_chars("cluster.prefix", &self.prefix)?;
        range(
            "cluster.query_timeout_ms",
            self.query_timeout_ms,
            10,
            60_000,
        )?;
        range(
            "cluster.trace_timeout_ms",
            self.trace_timeout_ms,
            10,
            30_000,
        )?;
        range(
            "cluster.membership_ttl_ms",
            self.membership_ttl_ms,
            10,
            3_600_000,
        )?;
        range(
            "cluster.membership_cache_groups",
            self.membership_cache_groups,
            1,
            10_000_000,
        )?;
        if !(0.0..=100.0).contains(&self.cpu_weight) {
            return Err(invalid(
                "cluster.cpu_weight",
                self.cpu_weight,
                "must be between 0 and 100",
            ));
        }
        if !self.key.is_empty() && self.key.len() < MIN_SECRET_BYTES {
            return Err(invalid(
                "cluster.key",
                format!("<redacted, {} bytes>", self.key.len()),
                &format!("must be at least {MIN_SECRET_BYTES} bytes (or empty: unsigned)"),
            ));
        }
        let auths = [
            !self.nats_user.is_empty() || !self.nats_password.is_empty(),
            !self.nats_token.is_empty(),
            !self.nats_creds_file.is_empty(),
        ];
        if auths.iter().filter(|a| **a).count() > 1 {
            return Err(invalid(
                "cluster.nats_token",
                "<redacted>",
                "use one of nats_user/nats_password, nats_token or nats_creds_file",
            ));
        }
        if self.nats_user.is_empty() != self.nats_password.is_empty() {
            return Err(invalid(
                "cluster.nats_user",
                &self.nats_user,
                "nats_user and nats_password go together",
            ));
        }
        if self.nats_tls_cert_file.is_empty() != self.nats_tls_key_file.is_empty() {
            return Err(invalid(
                "cluster.nats_tls_cert_file",
                &self.nats_tls_cert_file,
                "nats_tls_cert_file and nats_tls_key_file go together",
            ));
        }
        Ok(())
    }
}
