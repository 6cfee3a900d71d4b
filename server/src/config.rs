//! Config: the one typed configuration of a node.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config`), `IM_*`
//! environment variables, CLI flags. Every leaf key has an env name derived from its
//! path (`persist.batch_max` -> `IM_PERSIST_BATCH_MAX`, `listen` -> `IM_LISTEN`). A bad
//! value fails start-up with an error naming the key (or env var) and the value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors from loading or validating the config; each names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse.
    #[error("config file {path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key holds a value of the wrong type or an unknown key was given.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment override did not parse.
    #[error("env {var} (config key `{key}`): cannot use value {value:?}: {message}")]
    Env {
        /// The variable name.
        var: String,
        /// Dotted key path.
        key: String,
        /// The raw value.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// A value has the right type but is out of range or inconsistent.
    #[error("config key `{key}` = {value}: {message}")]
    Invalid {
        /// Dotted key path.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole node configuration. Its `Debug` hides the secrets and URL passwords.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Client WebSocket listener (`GET /ws`).
    pub listen: String,
    /// Admin HTTP listener.
    pub admin_listen: String,
    /// Data directory: SQLite database, generated secrets, logs.
    pub data_dir: PathBuf,
    /// `postgres://...` or `sqlite:PATH`; empty means SQLite at `<data_dir>/im.db`.
    pub database_url: String,
    /// HS256 secret for client tokens; empty means generated into `<data_dir>/jwt_secret`.
    pub jwt_secret: String,
    /// Bearer token for the admin API; empty means generated into `<data_dir>/admin_token`.
    pub admin_token: String,
    /// Serve `/metrics` without the admin token (for scrapers on a trusted network).
    pub admin_metrics_open: bool,
    /// A TLS-terminating proxy sits in front of the listeners: silences the start-up
    /// warning about serving tokens in clear on a non-loopback address.
    pub behind_tls: bool,
    /// NATS URL for cluster mode; empty means single node.
    pub nats_url: String,
    /// This node's id; empty means derived from the host name.
    pub node_id: String,
    /// Protocol limits and timers.
    pub limits: Limits,
    /// Persistence (group commit) settings.
    pub persist: Persist,
    /// Outbound flow control.
    pub flow: Flow,
    /// Store tuning.
    pub store: StoreConfig,
    /// Observability.
    pub obs: Obs,
    /// Logs: level, rolling files, per-uid filters, off-peak compression.
    pub log: LogConfig,
    /// Cluster mode (with `nats_url`): registry TTL, load reports, routing.
    pub cluster: ClusterConfig,
    /// HTTP hardening of both listeners: header timeout and size, admin connection cap.
    pub http: Http,
}

/// HTTP settings of both listeners (`[http]`), applied per accepted socket before any
/// request is read.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Http {
    /// A request head must arrive complete within this many seconds of the server
    /// starting to wait for it, or the socket is closed; this is also how long a
    /// kept-alive connection may sit idle between requests (both listeners).
    pub header_read_timeout_secs: u32,
    /// Largest request head (request line and headers) accepted, in bytes; larger: 431.
    pub max_header_bytes: u32,
    /// Most admin connections at once; more are closed at accept.
    pub admin_max_connections: u32,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            header_read_timeout_secs: 10,
            max_header_bytes: 16 * 1024,
            admin_max_connections: 64,
        }
    }
}

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
            .field("nats_tls_key_file", &self.nats_tls_key_file)
            .field("nats_tls_required", &self.nats_tls_required)
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
        }
    }
}

impl ClusterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
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

/// Log settings (`[log]`): global level, rolling JSON files, per-uid filters and the
/// off-peak compactor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Global level: `LEVEL` or `LEVEL,target=LEVEL,...` (env `IM_LOG` wins over `IM_LOG_LEVEL`).
    pub level: String,
    /// Write JSON lines to rolling files (stderr always gets text).
    pub files: bool,
    /// Log file directory; empty means `<data_dir>/logs`.
    pub dir: PathBuf,
    /// File name prefix: files are `<prefix>.<date>.log`.
    pub prefix: String,
    /// `minutely`, `hourly`, `daily` or `never`.
    pub rotation: String,
    /// Drop lines rather than block when the file writer falls behind (counted).
    pub lossy: bool,
    /// Lines buffered between the logging threads and the file writer.
    pub buffered_lines: u32,
    /// Per-uid log filters (admin API); off removes the connection span entirely.
    pub uid_filters: bool,
    /// Most per-uid filters at once.
    pub max_uid_filters: u32,
    /// Off-peak window start, local `HH:MM`: rotated files are compressed inside it.
    pub window_start: String,
    /// Off-peak window end, local `HH:MM` (may be before the start: the window wraps midnight).
    pub window_end: String,
    /// Rotated and compressed files older than this are deleted.
    pub retention_hours: u32,
    /// Outside the window, the node counts as idle below this many messages per second (in + out).
    pub idle_msgs_per_sec: f64,
    /// ... sustained for this many minutes.
    pub idle_minutes: u32,
    /// zstd level (1-19).
    pub zstd_level: i32,
    /// Share of one core the compactor may use while compressing (0.01-1.0).
    pub compress_cpu_share: f64,
    /// How often the compactor looks at the directory.
    pub compact_interval_secs: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            files: true,
            dir: PathBuf::new(),
            prefix: "im-server".into(),
            rotation: "hourly".into(),
            lossy: true,
            buffered_lines: 128_000,
            uid_filters: true,
            max_uid_filters: 10_000,
            window_start: "03:00".into(),
            window_end: "05:00".into(),
            retention_hours: 168,
            idle_msgs_per_sec: 1.0,
            idle_minutes: 10,
            zstd_level: 3,
            compress_cpu_share: 0.25,
            compact_interval_secs: 60,
        }
    }
}

impl LogConfig {
    /// What `obs::logfiles::init` takes: these settings, the file directory resolved
    /// against `data_dir` (`None` when `files` is off).
    pub fn options(&self, data_dir: &Path) -> crate::obs::logfiles::LogOptions {
        crate::obs::logfiles::LogOptions {
            level: self.level.clone(),
            uid_filters: self.uid_filters,
            max_uid_filters: self.max_uid_filters as usize,
            dir: self.files.then(|| self.dir_in(data_dir)),
            prefix: self.prefix.clone(),
            rotation: self.rotation.clone(),
            lossy: self.lossy,
            buffered_lines: self.buffered_lines as usize,
            window_start: self.window_start.clone(),
            window_end: self.window_end.clone(),
            retention_hours: self.retention_hours,
        }
    }

    /// The log directory: `dir`, or `<data_dir>/logs` when empty.
    pub fn dir_in(&self, data_dir: &Path) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            data_dir.join("logs")
        } else {
            self.dir.clone()
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = crate::obs::logfilter::LevelSpec::parse(&self.level) {
            return Err(invalid("log.level", &self.level, &e));
        }
        if !matches!(
            self.rotation.as_str(),
            "minutely" | "hourly" | "daily" | "never"
        ) {
            return Err(invalid(
                "log.rotation",
                &self.rotation,
                "use \"minutely\", \"hourly\", \"daily\" or \"never\"",
            ));
        }
        name_chars("log.prefix", &self.prefix)?;
        range("log.buffered_lines", self.buffered_lines, 1, 10_000_000)?;
        range("log.max_uid_filters", self.max_uid_filters, 1, 1_000_000)?;
        let start = crate::obs::compactor::TimeOfDay::parse(&self.window_start)
            .map_err(|e| invalid("log.window_start", &self.window_start, &e))?;
        let end = crate::obs::compactor::TimeOfDay::parse(&self.window_end)
            .map_err(|e| invalid("log.window_end", &self.window_end, &e))?;
        if start == end {
            return Err(invalid(
                "log.window_end",
                &self.window_end,
                "must differ from log.window_start (for an all-day window use 00:00 to 23:59)",
            ));
        }
        range("log.retention_hours", self.retention_hours, 1, 24 * 3650)?;
        if !self.idle_msgs_per_sec.is_finite() || self.idle_msgs_per_sec < 0.0 {
            return Err(invalid(
                "log.idle_msgs_per_sec",
                self.idle_msgs_per_sec,
                "must be a number >= 0 (0: never idle)",
            ));
        }
        range("log.idle_minutes", self.idle_minutes, 1, 1440)?;
        range("log.zstd_level", self.zstd_level, 1, 19)?;
        if !(0.01..=1.0).contains(&self.compress_cpu_share) {
            return Err(invalid(
                "log.compress_cpu_share",
                self.compress_cpu_share,
                "must be between 0.01 and 1.0",
            ));
        }
        range(
            "log.compact_interval_secs",
            self.compact_interval_secs,
            1,
            3600,
        )?;
        Ok(())
    }
}

/// Observability settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Obs {
    /// Stage latency probes on (turn off only to measure their cost).
    pub probes: bool,
    /// How often the sampler refreshes allocator, process and headroom figures.
    pub sample_interval_ms: u32,
    /// Memory per connection assumed until enough connections exist to measure it.
    pub conn_bytes_estimate: u64,
    /// Memory limit for headroom when no cgroup limit is set (0: physical memory).
    pub memory_limit_bytes: u64,
}

impl Default for Obs {
    fn default() -> Self {
        Obs {
            probes: true,
            sample_interval_ms: 1000,
            conn_bytes_estimate: 32 * 1024,
            memory_limit_bytes: 0,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = redacted;
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &redact_url(&self.database_url))
            .field("jwt_secret", &secret(&self.jwt_secret))
            .field("admin_token", &secret(&self.admin_token))
            .field("admin_metrics_open", &self.admin_metrics_open)
            .field("behind_tls", &self.behind_tls)
            .field("nats_url", &redact_url(&self.nats_url))
            .field("node_id", &self.node_id)
            .field("limits", &self.limits)
            .field("persist", &self.persist)
            .field("flow", &self.flow)
            .field("store", &self.store)
            .field("obs", &self.obs)
            .field("log", &self.log)
            .field("cluster", &self.cluster)
            .field("http", &self.http)
            .finish()
    }
}

/// A secret as `Debug` shows it: empty, or `<redacted>`.
fn redacted(s: &str) -> &'static str {
    if s.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

/// `url` with the password of its user-info part (`scheme://user:PASSWORD@host`)
/// replaced by `***`, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// Protocol limits and timers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted WebSocket message, in bytes.
    pub max_frame_bytes: u32,
    /// Heartbeat interval advertised in LoginOk.
    pub heartbeat_secs: u32,
    /// A connection with no frame for this long is closed.
    pub idle_timeout_secs: u32,
    /// A connection must log in within this time.
    pub login_timeout_secs: u32,
    /// Undecodable frames tolerated on one connection before it is closed.
    pub max_bad_frames: u32,
    /// Largest `SyncRequest.limit` honoured (and the default when 0).
    pub sync_limit_max: u32,
    /// Most members a group may have.
    pub max_group_members: u32,
    /// Sends per second one connection may sustain (0: unlimited); over it: RATE_LIMITED.
    pub send_rate_per_sec: u32,
    /// Sends one connection may burst above the sustained rate.
    pub send_burst: u32,
    /// Pings per second one connection may sustain (0: unlimited); over it: RATE_LIMITED.
    pub ping_rate_per_sec: u32,
    /// Pings one connection may burst above the sustained rate.
    pub ping_burst: u32,
    /// RATE_LIMITED refusals (of Sends, and apart of Pings) one connection may collect
    /// within `rate_limited_window_secs`; the next closes it (1008; 0: never).
    pub max_rate_limited: u32,
    /// The window `max_rate_limited` is counted in.
    pub rate_limited_window_secs: u32,
    /// Most client connections at once; more get HTTP 503 before the upgrade. 0: the
    /// RLIMIT_NOFILE soft limit less [`FD_RESERVE`] (store, logs, admin, cluster).
    pub max_connections: u32,
    /// Most client connections from one source address (0: no cap; mind NAT gateways).
    /// The address is the socket peer, or the client named by `X-Forwarded-For` when
    /// the peer is one of `trusted_proxies`.
    pub max_connections_per_ip: u32,
    /// Proxies (IP addresses) whose `X-Forwarded-For` names the client; from any other
    /// peer the header is ignored. A trusted proxy's own address has no per-IP cap.
    pub trusted_proxies: Vec<String>,
    /// Most logged-in connections one user may hold on this node; the next login is
    /// refused (`RESOURCE_EXHAUSTED`-style error, close 1008; 0: no cap).
    pub max_sessions_per_user: u32,
    /// DeliverAcks per second one connection may sustain (0: unlimited).
    pub deliver_ack_rate_per_sec: u32,
    /// DeliverAcks one connection may burst above the sustained rate.
    pub deliver_ack_burst: u32,
    /// SyncRequests per second one connection may sustain (0: unlimited).
    pub sync_rate_per_sec: u32,
    /// SyncRequests one connection may burst above the sustained rate.
    pub sync_burst: u32,
    /// GroupOps per second one connection, and one user on this node, may sustain (0:
    /// unlimited); over it: RATE_LIMITED with retry_after_ms.
    pub group_op_rate_per_sec: u32,
    /// GroupOps one connection (and one user) may burst above the sustained rate.
    pub group_op_burst: u32,
    /// Most frames one `Batch` frame may carry; more is a bad frame and nothing of it
    /// is handled.
    pub max_batch_frames: u32,
    /// Most live groups one user may have created (0: no limit).
    pub max_groups_per_user: u32,
    /// A session ends this many seconds after its token's `exp` (close 4003 "token
    /// expired"); also the clock skew allowed when a token is verified.
    pub token_leeway_secs: u32,
}

/// Shortest configured `jwt_secret` or `admin_token` accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// File descriptors kept free for the store, log files, the admin listener and NATS
/// when `limits.max_connections` is automatic.
pub const FD_RESERVE: u64 = 256;

impl Flow {
    /// The sync page budget in effect: `sync_page_bytes`, at most half the soft mark.
    pub fn sync_page_budget(&self) -> usize {
        self.sync_page_bytes.min(self.soft_mark_bytes / 2) as usize
    }
}

impl Limits {
    /// `max_connections` with 0 resolved against this process's RLIMIT_NOFILE.
    pub fn max_connections_resolved(&self) -> usize {
        if self.max_connections > 0 {
            return self.max_connections as usize;
        }
        let fds = crate::obs::process::max_fds();
        if fds == 0 || fds >= u32::MAX as u64 {
            0
        } else {
            fds.saturating_sub(FD_RESERVE).max(1) as usize
        }
    }
}

/// Persistence (group commit) settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Persist {
    /// A batch closes at this many messages.
    pub batch_max: u32,
    /// ... or after this many milliseconds of waiting for more (0: commit what is queued).
    pub batch_wait_ms: u32,
    /// Bounded persistence queue; a full queue answers OVERLOADED.
    pub queue_capacity: u32,
    /// retry_after_ms sent with OVERLOADED.
    pub retry_after_ms: u32,
}

/// Outbound flow control.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Flow {
    /// Above this many queued bytes a connection is a slow consumer.
    pub soft_mark_bytes: u64,
    /// Above this many queued bytes a connection is closed.
    pub hard_mark_bytes: u64,
    /// A socket write stuck this long closes the connection.
    pub write_timeout_secs: u32,
    /// Most frames coalesced into one socket write.
    pub coalesce_max_frames: u32,
    /// Groups with more members than this use notify-and-pull: members get a small
    /// sync hint (an unsolicited `SyncResponse{more: true}`) instead of the payload.
    pub notify_group_threshold: u32,
    /// WebSocket read buffer per connection (tungstenite allocates it eagerly).
    pub ws_read_buffer_bytes: u32,
    /// WebSocket write buffer per connection.
    pub ws_write_buffer_bytes: u32,
    /// Accept backlog of the client listener (capped by `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// Kernel send buffer per client socket (SO_SNDBUF; 0: OS default).
    pub socket_send_buffer_bytes: u32,
    /// Kernel receive buffer per client socket (SO_RCVBUF; 0: OS default).
    pub socket_recv_buffer_bytes: u32,
    /// Graceful shutdown (SIGTERM): how long the drain may take to commit, flush and
    /// close before the process exits.
    pub drain_timeout_secs: u32,
    /// Byte budget of one sync page: a page stops before its messages pass this many
    /// bytes and says `more = true` (a single larger message still goes out alone). At
    /// most half of `soft_mark_bytes` is used, whatever is set here.
    pub sync_page_bytes: u64,
}

/// Store tuning.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// SQLite `synchronous`: `full` (durable against power loss) or `normal` (against process crash).
    pub sqlite_synchronous: String,
    /// Reader connections (SQLite) or pool size (Postgres).
    pub pool_size: u32,
    /// Longest wait for a pooled connection before the store counts as down.
    pub acquire_timeout_ms: u32,
    /// Postgres `statement_timeout` on every pooled connection (0: none).
    pub statement_timeout_ms: u32,
    /// A commit (or group change) that has not finished after this long is abandoned:
    /// its Sends get OVERLOADED with a retry hint (the retry, with the same
    /// client_msg_id, is answered from the dedup if the commit did land), and the node
    /// refuses Sends until a write succeeds again.
    pub unavailable_after_ms: u32,
    /// While the store is failing, how often the writer tries a small probe write.
    pub probe_interval_ms: u32,
    /// Sends are refused (OVERLOADED, `/readyz` 503 `disk_low`) while the data dir's file
    /// system has less than this free, before SQLite runs into a full disk (0: off;
    /// SQLite only).
    pub min_free_disk_mb: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".into(),
            admin_listen: "127.0.0.1:7071".into(),
            data_dir: PathBuf::from("./data"),
            database_url: String::new(),
            jwt_secret: String::new(),
            admin_token: String::new(),
            admin_metrics_open: false,
            behind_tls: false,
            nats_url: String::new(),
            node_id: String::new(),
            limits: Limits::default(),
            persist: Persist::default(),
            flow: Flow::default(),
            store: StoreConfig::default(),
            obs: Obs::default(),
            log: LogConfig::default(),
            cluster: ClusterConfig::default(),
            http: Http::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 64 * 1024,
            heartbeat_secs: 30,
            idle_timeout_secs: 90,
            login_timeout_secs: 10,
            max_bad_frames: 10,
            sync_limit_max: 1000,
            max_group_members: 100_000,
            send_rate_per_sec: 500,
            send_burst: 1000,
            ping_rate_per_sec: 10,
            ping_burst: 20,
            max_rate_limited: 100,
            rate_limited_window_secs: 10,
            max_connections: 0,
            max_connections_per_ip: 0,
            trusted_proxies: Vec::new(),
            max_sessions_per_user: 16,
            deliver_ack_rate_per_sec: 200,
            deliver_ack_burst: 1000,
            sync_rate_per_sec: 50,
            sync_burst: 100,
            group_op_rate_per_sec: 5,
            group_op_burst: 20,
            max_batch_frames: 128,
            max_groups_per_user: 100,
            token_leeway_secs: 5,
        }
    }
}

impl Default for Persist {
    fn default() -> Self {
        Persist {
            batch_max: 512,
            batch_wait_ms: 1,
            queue_capacity: 20_000,
            retry_after_ms: 50,
        }
    }
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            soft_mark_bytes: 1 << 20,
            hard_mark_bytes: 4 << 20,
            write_timeout_secs: 10,
            coalesce_max_frames: 64,
            notify_group_threshold: 2000,
            ws_read_buffer_bytes: 4096,
            ws_write_buffer_bytes: 4096,
            listen_backlog: 4096,
            socket_send_buffer_bytes: 0,
            socket_recv_buffer_bytes: 0,
            drain_timeout_secs: 10,
            sync_page_bytes: 256 * 1024,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            sqlite_synchronous: "full".into(),
            pool_size: 4,
            acquire_timeout_ms: 2_000,
            statement_timeout_ms: 10_000,
            unavailable_after_ms: 2_000,
            probe_interval_ms: 1_000,
            min_free_disk_mb: 256,
        }
    }
}

/// CLI flags that override the config.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--listen`
    pub listen: Option<String>,
    /// `--admin-listen`
    pub admin_listen: Option<String>,
    /// `--data-dir`
    pub data_dir: Option<PathBuf>,
    /// `--database-url`
    pub database_url: Option<String>,
}

/// Which database backs the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// Embedded SQLite file.
    Sqlite(PathBuf),
    /// Postgres connection URL.
    Postgres(String),
}

impl Config {
    /// Loads defaults, then `file`, then the process environment, then `overrides`; validates.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Self::load_from(file, overrides, std::env::vars())
    }

    /// As [`Config::load`] with an explicit environment (for tests).
    pub fn load_from(
        file: Option<&Path>,
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut tree = toml::Value::try_from(Config::default()).map_err(|e| ConfigError::Key {
            key: String::new(),
            message: e.to_string(),
        })?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let from_file: toml::Value =
                toml::from_str(&text).map_err(|e| ConfigError::Syntax {
                    path: path.to_owned(),
                    message: e.message().to_string(),
                })?;
            merge(&mut tree, from_file);
        }
        let env: std::collections::HashMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("IM_"))
            .collect();
        apply_env(&mut tree, &mut Vec::new(), &env)?;
        // `IM_LOG` (the documented level variable) is an alias of `log.level` that wins.
        if let (Some(level), Some(toml::Value::Table(log))) =
            (env.get("IM_LOG"), tree.get_mut("log"))
        {
            log.insert("level".into(), toml::Value::String(level.clone()));
        }
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Key {
                key,
                message: e.into_inner().to_string(),
            }
        })?;
        if let Some(v) = &overrides.listen {
            config.listen = v.clone();
        }
        if let Some(v) = &overrides.admin_listen {
            config.admin_listen = v.clone();
        }
        if let Some(v) = &overrides.data_dir {
            config.data_dir = v.clone();
        }
        if let Some(v) = &overrides.database_url {
            config.database_url = v.clone();
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and formats; the error names the key and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        addr("listen", &self.listen)?;
        addr("admin_listen", &self.admin_listen)?;
        self.database()?;
        if !self.node_id.is_empty() && !im_proto::valid_id(&self.node_id) {
            return Err(invalid(
                "node_id",
                &self.node_id,
                "use 1-64 characters of A-Z a-z 0-9 _ . @ -",
            ));
        }
        let l = &self.limits;
        range("limits.max_frame_bytes", l.max_frame_bytes, 256, 16 << 20)?;
        range("limits.heartbeat_secs", l.heartbeat_secs, 1, 3600)?;
        range("limits.idle_timeout_secs", l.idle_timeout_secs, 1, 86_400)?;
        if l.idle_timeout_secs <= l.heartbeat_secs {
            return Err(invalid(
                "limits.idle_timeout_secs",
                l.idle_timeout_secs,
                "must be greater than limits.heartbeat_secs",
            ));
        }
        range("limits.login_timeout_secs", l.login_timeout_secs, 1, 3600)?;
        range("limits.sync_limit_max", l.sync_limit_max, 1, 100_000)?;
        range(
            "limits.max_group_members",
            l.max_group_members,
            2,
            10_000_000,
        )?;
        range(
            "limits.ping_rate_per_sec",
            l.ping_rate_per_sec,
            0,
            1_000_000,
        )?;
        range("limits.ping_burst", l.ping_burst, 1, 1_000_000)?;
        range("limits.max_rate_limited", l.max_rate_limited, 0, 1_000_000)?;
        range(
            "limits.rate_limited_window_secs",
            l.rate_limited_window_secs,
            1,
            3600,
        )?;
        range("limits.max_connections", l.max_connections, 0, 100_000_000)?;
        range(
            "limits.max_groups_per_user",
            l.max_groups_per_user,
            0,
            100_000_000,
        )?;
        range("limits.token_leeway_secs", l.token_leeway_secs, 0, 3600)?;
        range(
            "limits.max_connections_per_ip",
            l.max_connections_per_ip,
            0,
            100_000_000,
        )?;
        for p in &l.trusted_proxies {
            if p.trim().parse::<std::net::IpAddr>().is_err() {
                return Err(invalid(
                    "limits.trusted_proxies",
                    p,
                    "expected IP addresses, e.g. [\"10.0.0.5\"] (env: comma-separated)",
                ));
            }
        }
        range(
            "limits.max_sessions_per_user",
            l.max_sessions_per_user,
            0,
            1_000_000,
        )?;
        for (key, rate, burst_key, burst) in [
            (
                "limits.deliver_ack_rate_per_sec",
                l.deliver_ack_rate_per_sec,
                "limits.deliver_ack_burst",
                l.deliver_ack_burst,
            ),
            (
                "limits.sync_rate_per_sec",
                l.sync_rate_per_sec,
                "limits.sync_burst",
                l.sync_burst,
            ),
            (
                "limits.group_op_rate_per_sec",
                l.group_op_rate_per_sec,
                "limits.group_op_burst",
                l.group_op_burst,
            ),
        ] {
            range(key, rate, 0, 1_000_000)?;
            range(burst_key, burst, 1, 1_000_000)?;
        }
        range("limits.max_batch_frames", l.max_batch_frames, 1, 100_000)?;
        for (key, secret) in [
            ("jwt_secret", &self.jwt_secret),
            ("admin_token", &self.admin_token),
        ] {
            if !secret.is_empty() && secret.len() < MIN_SECRET_BYTES {
                return Err(invalid(
                    key,
                    format!("<redacted, {} bytes>", secret.len()),
                    &format!(
                        "must be at least {MIN_SECRET_BYTES} bytes (or empty: generated into the data dir)"
                    ),
                ));
            }
        }
        let p = &self.persist;
        range("persist.batch_max", p.batch_max, 1, 10_000)?;
        range("persist.batch_wait_ms", p.batch_wait_ms, 0, 1000)?;
        range("persist.queue_capacity", p.queue_capacity, 1, 10_000_000)?;
        range("persist.retry_after_ms", p.retry_after_ms, 1, 60_000)?;
        let f = &self.flow;
        range("flow.soft_mark_bytes", f.soft_mark_bytes, 1024, 1 << 40)?;
        if f.hard_mark_bytes <= f.soft_mark_bytes {
            return Err(invalid(
                "flow.hard_mark_bytes",
                f.hard_mark_bytes,
                "must be greater than flow.soft_mark_bytes",
            ));
        }
        range("flow.write_timeout_secs", f.write_timeout_secs, 1, 3600)?;
        range("flow.drain_timeout_secs", f.drain_timeout_secs, 1, 3600)?;
        range("flow.sync_page_bytes", f.sync_page_bytes, 1024, 1 << 30)?;
        if u64::from(self.limits.max_frame_bytes) * 2 > f.hard_mark_bytes {
            return Err(invalid(
                "limits.max_frame_bytes",
                self.limits.max_frame_bytes,
                "must be at most half of flow.hard_mark_bytes (a reply carrying one message must fit under the hard mark)",
            ));
        }
        let h = &self.http;
        range(
            "http.header_read_timeout_secs",
            h.header_read_timeout_secs,
            1,
            3600,
        )?;
        range("http.max_header_bytes", h.max_header_bytes, 1024, 1 << 20)?;
        range(
            "http.admin_max_connections",
            h.admin_max_connections,
            1,
            1_000_000,
        )?;
        range("flow.coalesce_max_frames", f.coalesce_max_frames, 1, 4096)?;
        range("flow.listen_backlog", f.listen_backlog, 1, 1 << 20)?;
        range(
            "flow.notify_group_threshold",
            f.notify_group_threshold,
            1,
            100_000_000,
        )?;
        range(
            "flow.ws_read_buffer_bytes",
            f.ws_read_buffer_bytes,
            256,
            16 << 20,
        )?;
        range(
            "flow.ws_write_buffer_bytes",
            f.ws_write_buffer_bytes,
            0,
            16 << 20,
        )?;
        if !matches!(self.store.sqlite_synchronous.as_str(), "full" | "normal") {
            return Err(invalid(
                "store.sqlite_synchronous",
                &self.store.sqlite_synchronous,
                "use \"full\" or \"normal\"",
            ));
        }
        range("store.pool_size", self.store.pool_size, 1, 1024)?;
        let st = &self.store;
        range(
            "store.acquire_timeout_ms",
            st.acquire_timeout_ms,
            50,
            600_000,
        )?;
        range(
            "store.statement_timeout_ms",
            st.statement_timeout_ms,
            0,
            3_600_000,
        )?;
        range(
            "store.unavailable_after_ms",
            st.unavailable_after_ms,
            100,
            600_000,
        )?;
        range("store.probe_interval_ms", st.probe_interval_ms, 50, 600_000)?;
        range("store.min_free_disk_mb", st.min_free_disk_mb, 0, 1 << 30)?;
        range(
            "obs.sample_interval_ms",
            self.obs.sample_interval_ms,
            100,
            60_000,
        )?;
        range(
            "obs.conn_bytes_estimate",
            self.obs.conn_bytes_estimate,
            1,
            1 << 30,
        )?;
        self.log.validate()?;
        self.cluster.validate()?;
        let nats = self.nats_url.trim();
        if !nats.is_empty() {
            if !(nats.starts_with("nats://") || nats.starts_with("tls://") || !nats.contains("://"))
            {
                return Err(invalid(
                    "nats_url",
                    redact_url(nats),
                    "use nats://HOST:PORT (or HOST:PORT)",
                ));
            }
            if !matches!(self.database()?, Database::Postgres(_)) {
                return Err(invalid(
                    "nats_url",
                    redact_url(nats),
                    "cluster mode needs a shared Postgres database_url (nodes share messages, cursors and groups)",
                ));
            }
        }
        Ok(())
    }

    /// Whether this node runs in cluster mode (`nats_url` set).
    pub fn clustered(&self) -> bool {
        !self.nats_url.trim().is_empty()
    }

    /// The database this config selects.
    pub fn database(&self) -> Result<Database, ConfigError> {
        let url = self.database_url.trim();
        if url.is_empty() {
            Ok(Database::Sqlite(self.data_dir.join("im.db")))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Database::Postgres(url.to_string()))
        } else if let Some(path) = url
            .strip_prefix("sqlite://")
            .or(url.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(invalid("database_url", url, "sqlite: needs a file path"));
            }
            Ok(Database::Sqlite(PathBuf::from(path)))
        } else {
            Err(invalid(
                "database_url",
                redact_url(url),
                "use postgres://..., sqlite:PATH, or leave it empty for SQLite in data_dir",
            ))
        }
    }

    /// The client listener address (validated).
    pub fn listen_addr(&self) -> SocketAddr {
        // validate() has parsed it already.
        self.listen.parse().unwrap_or(([127, 0, 0, 1], 7070).into())
    }

    /// The admin listener address (validated).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listen
            .parse()
            .unwrap_or(([127, 0, 0, 1], 7071).into())
    }
}

fn invalid(key: &'static str, value: impl std::fmt::Display, message: &str) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.to_string(),
        message: message.to_string(),
    }
}

/// A name of 1-64 characters of A-Z a-z 0-9 _ - (file prefixes, NATS prefixes).
fn name_chars(key: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            value,
            "use 1-64 characters of A-Z a-z 0-9 _ -",
        ))
    }
}

fn addr(key: &'static str, value: &str) -> Result<(), ConfigError> {
    value
        .parse::<SocketAddr>()
        .map(|_| ())
        .map_err(|_| invalid(key, value, "expected IP:PORT, e.g. 127.0.0.1:7070"))
}

fn range<T: PartialOrd + std::fmt::Display>(
    key: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(invalid(key, &v, &format!("must be between {lo} and {hi}")));
    }
    Ok(())
}

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Applies `IM_<PATH>` overrides to every leaf of the (defaults-shaped) tree, parsing each
/// raw value as the type the default has.
fn apply_env(
    node: &mut toml::Value,
    path: &mut Vec<String>,
    env: &std::collections::HashMap<String, String>,
) -> Result<(), ConfigError> {
    if let toml::Value::Table(table) = node {
        for (k, v) in table.iter_mut() {
            path.push(k.clone());
            apply_env(v, path, env)?;
            path.pop();
        }
        return Ok(());
    }
    let var = format!("IM_{}", path.join("_").to_uppercase());
    let Some(raw) = env.get(&var) else {
        return Ok(());
    };
    let err = |message: String| ConfigError::Env {
        var: var.clone(),
        key: path.join("."),
        value: raw.clone(),
        message,
    };
    *node = match node {
        toml::Value::Integer(_) => toml::Value::Integer(
            raw.trim()
                .parse()
                .map_err(|e: std::num::ParseIntError| err(e.to_string()))?,
        ),
        toml::Value::Float(_) => toml::Value::Float(
            raw.trim()
                .parse()
                .map_err(|e: std::num::ParseFloatError| err(e.to_string()))?,
        ),
        toml::Value::Boolean(_) => toml::Value::Boolean(match raw.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => return Err(err("expected true or false".into())),
        }),
        // Lists (e.g. `limits.trusted_proxies`): comma-separated.
        toml::Value::Array(_) => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| toml::Value::String(v.to_string()))
                .collect(),
        ),
        _ => toml::Value::String(raw.clone()),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn urls_and_secrets_are_redacted() {
        assert_eq!(
            redact_url("postgres://im:s3cret@db:5432/im?sslmode=require"),
            "postgres://im:***@db:5432/im?sslmode=require"
        );
        assert_eq!(redact_url("nats://u:p@h:4222"), "nats://u:***@h:4222");
        assert_eq!(redact_url("nats://tok@h:4222"), "nats://tok@h:4222");
        assert_eq!(redact_url("postgres://db/im"), "postgres://db/im");
        assert_eq!(redact_url("sqlite:/a@b/c"), "sqlite:/a@b/c");
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_JWT_SECRET", "jwt-SECRET-value-of-thirty-two-bytes"),
                ("IM_ADMIN_TOKEN", "admin-TOKEN-value-of-thirty-two-bytes"),
                ("IM_DATABASE_URL", "postgres://im:pw-SECRET@db/im"),
            ]),
        )
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["jwt-SECRET-value", "admin-TOKEN-value", "pw-SECRET"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("<redacted>") && shown.contains("postgres://im:***@db/im"));
    }

    #[test]
    fn defaults_validate_and_select_sqlite_in_data_dir() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(
            c.database().unwrap(),
            Database::Sqlite("./data/im.db".into())
        );
        assert_eq!(c.limits.max_frame_bytes, 65536);
    }

    #[test]
    fn env_overrides_leaf_keys_and_flags_win() {
        let c = Config::load_from(
            None,
            &Overrides {
                listen: Some("127.0.0.1:9000".into()),
                ..Default::default()
            },
            env(&[
                ("IM_LISTEN", "127.0.0.1:1"),
                ("IM_PERSIST_BATCH_MAX", "7"),
                ("IM_NODE_ID", "n1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:9000");
        assert_eq!(c.persist.batch_max, 7);
        assert_eq!(c.node_id, "n1");
    }

    #[test]
    fn log_keys_default_validate_and_im_log_wins() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.log.level, "info");
        assert_eq!(c.log.dir_in(Path::new("/d")), PathBuf::from("/d/logs"));
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LOG_LEVEL", "warn"),
                ("IM_LOG", "info,im_server::store=debug"),
                ("IM_LOG_IDLE_MSGS_PER_SEC", "2.5"),
                ("IM_LOG_WINDOW_START", "23:00"),
                ("IM_LOG_WINDOW_END", "01:00"),
            ]),
        )
        .unwrap();
        assert_eq!(c.log.level, "info,im_server::store=debug");
        assert_eq!(c.log.idle_msgs_per_sec, 2.5);
        for (var, value, key) in [
            ("IM_LOG_LEVEL", "loud", "log.level"),
            ("IM_LOG_ROTATION", "weekly", "log.rotation"),
            ("IM_LOG_WINDOW_END", "25:00", "log.window_end"),
            ("IM_LOG_WINDOW_END", "03:00", "log.window_end"),
            ("IM_LOG_ZSTD_LEVEL", "30", "log.zstd_level"),
            ("IM_LOG_COMPRESS_CPU_SHARE", "0", "log.compress_cpu_share"),
            ("IM_LOG_PREFIX", "a/b", "log.prefix"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }

    #[test]
    fn flood_limit_keys_default_and_validate() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.limits.ping_rate_per_sec, 10);
        assert_eq!(c.limits.ping_burst, 20);
        assert_eq!(c.limits.max_rate_limited, 100);
        assert_eq!(c.limits.rate_limited_window_secs, 10);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LIMITS_PING_RATE_PER_SEC", "0"),
                ("IM_LIMITS_MAX_RATE_LIMITED", "0"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.ping_rate_per_sec, 0);
        assert_eq!(c.limits.max_rate_limited, 0);
        for (var, value, key) in [
            ("IM_LIMITS_PING_BURST", "0", "limits.ping_burst"),
            (
                "IM_LIMITS_RATE_LIMITED_WINDOW_SECS",
                "0",
                "limits.rate_limited_window_secs",
            ),
            (
                "IM_LIMITS_RATE_LIMITED_WINDOW_SECS",
                "7200",
                "limits.rate_limited_window_secs",
            ),
            (
                "IM_LIMITS_MAX_RATE_LIMITED",
                "2000000",
                "limits.max_rate_limited",
            ),
            (
                "IM_LIMITS_PING_RATE_PER_SEC",
                "2000000",
                "limits.ping_rate_per_sec",
            ),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }

    #[test]
    fn bound_keys_default_parse_lists_and_refuse_short_secrets() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.limits.max_sessions_per_user, 16);
        assert_eq!(c.http.header_read_timeout_secs, 10);
        assert_eq!(c.flow.sync_page_budget(), 256 * 1024);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LIMITS_TRUSTED_PROXIES", "10.0.0.5, ::1"),
                ("IM_FLOW_SOFT_MARK_BYTES", "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.trusted_proxies, ["10.0.0.5", "::1"]);
        assert_eq!(
            c.flow.sync_page_budget(),
            32768,
            "at most half the soft mark"
        );
        for (var, value, key) in [
            (
                "IM_LIMITS_TRUSTED_PROXIES",
                "proxy.local",
                "limits.trusted_proxies",
            ),
            (
                "IM_HTTP_HEADER_READ_TIMEOUT_SECS",
                "0",
                "http.header_read_timeout_secs",
            ),
            ("IM_LIMITS_MAX_BATCH_FRAMES", "0", "limits.max_batch_frames"),
            ("IM_LIMITS_SYNC_BURST", "0", "limits.sync_burst"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
        for (var, key) in [
            ("IM_JWT_SECRET", "jwt_secret"),
            ("IM_ADMIN_TOKEN", "admin_token"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, "short-SECRET")]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("at least 32 bytes"), "{e}");
            assert!(!e.contains("short-SECRET"), "{e}");
        }
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = Config::load_from(
            None,
            &Overrides::default(),
            env(&[("IM_PERSIST_BATCH_MAX", "lots")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("IM_PERSIST_BATCH_MAX") && e.contains("lots"),
            "{e}"
        );

        let e = Config::load_from(None, &Overrides::default(), env(&[("IM_LISTEN", "nope")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`listen`") && e.contains("nope"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[persist]\nbatch_max = \"x\"\n").unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("persist.batch_max"), "{e}");

        std::fs::write(&file, "[persist]\nbatch_mux = 3\n").unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_mux"), "{e}");

        std::fs::write(
            &file,
            "[flow]\nsoft_mark_bytes = 5000\nhard_mark_bytes = 10\n",
        )
        .unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flow.hard_mark_bytes") && e.contains("10"),
            "{e}"
        );

        let e = Config::load_from(
            None,
            &Overrides {
                database_url: Some("mysql://x".into()),
                ..Default::default()
            },
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("database_url") && e.contains("mysql://x"), "{e}");
    }
}
