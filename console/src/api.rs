//! Admin API client: one [`AdminClient`] per node, plain HTTP with a bearer token, a
//! timeout and a body-size cap on every request, and the typed response structs of
//! `docs/admin-api.md`. Every struct is `#[serde(default)]`, so fields the server adds
//! later (or leaves out) never break the console; errors come back as [`ApiError`].

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Largest response body read from a node (a profile bundle with its SVG is the biggest).
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// Extra time a CPU capture may take past its `seconds` before the request gives up.
pub const PROFILE_SLACK: Duration = Duration::from_secs(30);

/// Why a request to a node failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The node URL given on the command line or in the config is not usable.
    #[error("bad node URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made or it broke (refused, reset, DNS).
    #[error("{0}")]
    Unreachable(String),
    /// The node did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The node answered `404 {"error":"no such route"}`: it does not have this route yet.
    #[error("{path}: not available on this node (404 no such route)")]
    RouteMissing {
        /// The path asked for.
        path: String,
    },
    /// Any other error status, with the node's `{"error": ...}` message.
    #[error("HTTP {status}: {message}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The node's error message (or the start of the body).
        message: String,
    },
    /// The body was larger than the cap.
    #[error("response larger than {limit} bytes")]
    TooLarge {
        /// The cap in bytes.
        limit: usize,
    },
    /// The body was not the JSON expected.
    #[error("unexpected response from {path}: {reason}")]
    Decode {
        /// The path asked for.
        path: String,
        /// The decoder's message, naming the field.
        reason: String,
    },
}

impl ApiError {
    /// True when the node itself could not be reached (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ApiError::Unreachable(_) | ApiError::Timeout(_))
    }

    /// True for the 404 a node gives for a route it does not have.
    pub fn is_route_missing(&self) -> bool {
        matches!(self, ApiError::RouteMissing { .. })
    }

    /// The HTTP status, when the node answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            ApiError::RouteMissing { .. } => Some(404),
            _ => None,
        }
    }
}

/// Latency of one stage over the node's window (`overview.stages[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageLatency {
    /// Stage label (`decode`, ..., `end_to_end`).
    pub stage: String,
    /// Samples in the window; 0 means the stage did not run.
    pub count: u64,
    /// Median in microseconds.
    pub p50_us: f64,
    /// 99th percentile in microseconds.
    pub p99_us: f64,
    /// 99.9th percentile in microseconds.
    pub p999_us: f64,
}

/// jemalloc figures in bytes (`overview.memory`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocStats {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages.
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained (unmapped but kept for reuse).
    pub retained: u64,
    /// Allocator metadata bytes.
    pub metadata: u64,
}

/// Process figures (`overview.process`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessStats {
    /// CPU seconds used since start.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// RLIMIT_NOFILE.
    pub max_fds: u64,
    /// Memory limit in bytes (cgroup, config or physical).
    pub memory_limit_bytes: u64,
    /// Where the memory limit comes from.
    pub memory_limit_source: String,
    /// CPU cores available.
    pub cores: u32,
}

/// Capacity headroom (`overview.capacity`, see `runbooks/capacity-headroom.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capacity {
    /// Memory cost of one connection in bytes.
    pub per_connection_bytes: u64,
    /// Whether that cost was measured (false: the configured estimate).
    pub per_connection_measured: bool,
    /// How many more connections fit before the first resource runs out.
    pub headroom_connections: u64,
    /// How many more messages per second fit; `None` while the node is too idle to tell.
    pub headroom_msgs_per_sec: Option<f64>,
    /// Free fraction of the memory limit (1.0 = all free).
    pub ratio_memory: f64,
    /// Free fraction of the fd limit.
    pub ratio_fds: f64,
    /// Free fraction of CPU.
    pub ratio_cpu: f64,
    /// Free fraction of the store's disk above its floor (`None`: not measured, Postgres).
    pub ratio_disk: Option<f64>,
    /// The resource that runs out first.
    pub limiting_resource: String,
}

/// Connections refused before the upgrade, by reason (overview `connections_refused`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Refusals {
    /// At `limits.max_connections`.
    pub node_full: u64,
    /// At `limits.max_connections_per_ip`.
    pub per_ip: u64,
    /// While draining.
    pub draining: u64,
}

impl Refusals {
    /// All refusals.
    pub fn total(&self) -> u64 {
        self.node_full + self.per_ip + self.draining
    }
}

/// `GET /admin/v1/overview`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Overview {
    /// Node id.
    pub node_id: String,
    /// Server version.
    pub version: String,
    /// Store backend (`sqlite`, `postgres`).
    pub store: String,
    /// Whether stage probes are on.
    pub probes: bool,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Live connections.
    pub connections: u64,
    /// The node's connection cap (0: none, or an older server).
    pub max_connections: u64,
    /// The per-source-address cap (0: none).
    pub max_connections_per_ip: u64,
    /// Connections refused with HTTP 503 since start, by reason.
    pub connections_refused: Refusals,
    /// A graceful shutdown has begun.
    pub draining: bool,
    /// Why the node refuses Sends now (a store fault or `disk_low`), if it does.
    pub store_refusal: Option<String>,
    /// Distinct users online.
    pub users_online: u64,
    /// Messages received per second.
    pub msg_rate_in: f64,
    /// Messages delivered per second.
    pub msg_rate_out: f64,
    /// Messages received since start.
    pub messages_in_total: u64,
    /// Messages delivered since start.
    pub messages_out_total: u64,
    /// Writes waiting in the persistence queue.
    pub persist_backlog: u64,
    /// Capacity of the persistence queue.
    pub persist_queue_capacity: u64,
    /// Connections above the soft mark now.
    pub slow_consumers: u64,
    /// Slow consumers closed since start.
    pub slow_consumer_disconnects: u64,
    /// Bytes queued for writing across connections.
    pub outbound_queued_bytes: u64,
    /// Window of the stage percentiles in seconds.
    pub latency_window_secs: u64,
    /// Per-stage latency, in path order.
    pub stages: Vec<StageLatency>,
    /// Allocator stats, `None` when unavailable.
    pub memory: Option<AllocStats>,
    /// Process figures.
    pub process: ProcessStats,
    /// CPU busy ratio (0..1 of all cores).
    pub cpu_busy: f64,
    /// Capacity headroom.
    pub capacity: Capacity,
    /// The cluster as this node sees it (`enabled: false` on a single node).
    pub cluster: ClusterInfo,
}

/// `overview.cluster`: every node of the registry and a summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterInfo {
    /// Cluster mode on.
    pub enabled: bool,
    /// Registry TTL in seconds.
    pub ttl_secs: u64,
    /// Users this node knows on other nodes.
    pub users_on_other_nodes: u64,
    /// Whether this node's NATS connection is up.
    pub nats_connected: bool,
    /// Every known node, sorted by id.
    pub nodes: Vec<ClusterNode>,
    /// Totals over the healthy nodes.
    pub summary: Option<ClusterSummary>,
}

/// One node of `overview.cluster.nodes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterNode {
    /// Node id.
    pub node_id: String,
    /// Its client WebSocket URL.
    pub ws_url: String,
    /// Live connections.
    pub connections: u64,
    /// Sends accepted per second.
    pub msg_rate_in: f64,
    /// Copies queued per second.
    pub msg_rate_out: f64,
    /// Resident memory.
    pub rss_bytes: u64,
    /// CPU busy ratio.
    pub cpu_busy: f64,
    /// Connections it can still take.
    pub headroom_connections: u64,
    /// Age of its last report, ms.
    pub report_age_ms: u64,
    /// `up`, `draining` or `down`.
    pub state: String,
    /// Routing score (lower is chosen first).
    pub score: f64,
}

/// `overview.cluster.summary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterSummary {
    /// Nodes known.
    pub nodes: u64,
    /// Nodes healthy.
    pub healthy: u64,
    /// Connections on healthy nodes.
    pub connections: u64,
    /// Sends per second.
    pub msg_rate_in: f64,
    /// Copies per second.
    pub msg_rate_out: f64,
    /// Resident memory.
    pub rss_bytes: u64,
    /// Connections the healthy nodes can still take.
    pub headroom_connections: u64,
}

/// One connection row (`connections[]`, `slow_consumers[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Connection {
    /// Node-unique connection id (used to kick).
    pub conn_id: u64,
    /// Logged-in user, empty before login.
    pub user_id: String,
    /// Remote address.
    pub remote: String,
    /// Seconds since accept.
    pub age_secs: f64,
    /// Bytes queued for writing.
    pub queued_bytes: u64,
    /// Frames received.
    pub msgs_in: u64,
    /// Frames written.
    pub msgs_out: u64,
    /// `handshake`, `active`, `slow` or `closing`.
    pub state: String,
}

/// `GET /admin/v1/connections`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectionList {
    /// Connections on the node (before the limit).
    pub total: u64,
    /// The rows returned.
    pub connections: Vec<Connection>,
}

/// `DELETE /admin/v1/connections/{id}` reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Kicked {
    /// The connection closed.
    pub kicked: u64,
}

/// `POST /admin/v1/users/{uid}/revoke` reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Revoked {
    /// The user.
    pub user: String,
    /// Tokens issued at or before this unix second are refused.
    pub revoked_at: i64,
    /// Sessions closed on the node asked (other nodes close theirs too).
    pub closed: u64,
}

/// `GET /admin/v1/slow-consumers`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlowConsumers {
    /// Slow consumers now.
    pub total: u64,
    /// Queue size above which a connection is slow.
    pub soft_mark_bytes: u64,
    /// Queue size above which a connection is closed.
    pub hard_mark_bytes: u64,
    /// A socket write stuck this long closes the connection.
    pub write_timeout_secs: u64,
    /// Connections ever marked slow.
    pub marked_total: u64,
    /// Slow consumers the node closed (hard mark or write timeout).
    pub disconnects_total: u64,
    /// The marked connections, largest queue first.
    pub slow_consumers: Vec<Connection>,
}

/// `GET /admin/v1/memory`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Memory {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages.
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained for reuse.
    pub retained: u64,
    /// Allocator metadata bytes.
    pub metadata: u64,
    /// `active - allocated`.
    pub fragmentation: u64,
    /// `resident - active - metadata`.
    pub dirty: u64,
    /// Process RSS in bytes.
    pub rss: u64,
    /// Live connections.
    pub connections: u64,
    /// Memory cost of one connection in bytes.
    pub per_connection_bytes: u64,
    /// Whether that cost was measured.
    pub per_connection_measured: bool,
}

/// One per-uid log level override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFilter {
    /// The user id.
    pub uid: String,
    /// The level events for this user come out at.
    pub level: String,
    /// The TTL it was set with, in seconds.
    pub ttl_secs: Option<f64>,
    /// Seconds until it expires.
    pub remaining_secs: Option<f64>,
}

/// `GET /admin/v1/log-filters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFilters {
    /// The node's global level.
    pub global_level: String,
    /// Whether per-uid filters are enabled on the node (`None`: the node does not say).
    pub uid_filters_enabled: Option<bool>,
    /// Active per-uid filters.
    pub filters: Vec<LogFilter>,
}

/// Body of `PUT /admin/v1/log-filters/{uid}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetLogFilter {
    /// Level to log this user at.
    pub level: String,
    /// How long the filter lasts.
    pub ttl_secs: u64,
}

/// `PUT /admin/v1/log-level` reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GlobalLevel {
    /// The global level now in force.
    pub global_level: String,
}

/// One log file (`logs.files[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFile {
    /// File name inside the log dir.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// e.g. `active`, `rotated`, `compressed`.
    #[serde(deserialize_with = "lenient_string")]
    pub state: String,
    /// Last modification, Unix milliseconds.
    pub modified_ms: i64,
}

/// The off-peak compression window (`logs.window`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogWindow {
    /// Start, as the node gives it (e.g. `03:00`).
    #[serde(deserialize_with = "lenient_string")]
    pub start: String,
    /// End, as the node gives it.
    #[serde(deserialize_with = "lenient_string")]
    pub end: String,
}

/// `GET /admin/v1/logs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Logs {
    /// Log directory on the node (empty when the node writes no files).
    #[serde(deserialize_with = "lenient_string")]
    pub dir: String,
    /// The files, as the node lists them.
    pub files: Vec<LogFile>,
    /// Off-peak compression window.
    pub window: LogWindow,
    /// Whether the node is inside the window now.
    pub in_window: bool,
    /// Next window start, Unix milliseconds.
    pub next_window_start_ms: Option<i64>,
    /// Files older than this are deleted.
    pub retention_hours: f64,
    /// Log bytes written since start.
    pub written_bytes_total: u64,
    /// Bytes the compressor produced since start.
    pub compressed_bytes_total: u64,
    /// Files compressed since start.
    pub compressed_files_total: u64,
    /// Files deleted past retention since start.
    pub deleted_files_total: u64,
    /// Log lines dropped by the writer since start.
    pub dropped_lines_total: u64,
    /// Whether the node counts as idle (compression may run outside the window).
    pub idle: bool,
}

/// One function of a CPU profile's top list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopFunction {
    /// Symbol name.
    pub function: String,
    /// Samples with this function on top of the stack.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack.
    pub total_samples: u64,
}

/// `GET /admin/v1/profile/cpu?format=bundle`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileBundle {
    /// Capture length in seconds.
    pub seconds: f64,
    /// Sampling frequency in Hz.
    pub frequency: u64,
    /// Samples taken.
    pub samples: u64,
    /// Functions by samples, largest first.
    pub top: Vec<TopFunction>,
    /// Flamegraph SVG.
    pub svg: String,
    /// gzipped pprof protobuf, base64.
    pub pprof_gz_base64: String,
}

/// Accepts a string, a number, a bool or null (as an empty string) for a text field.
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    })
}

/// A client for one node's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
    timeout: Duration,
}

/// Parses a node URL: `http://host:port[/prefix]`, or `host:port` (http assumed).
pub fn parse_base_url(url: &str) -> Result<Url, ApiError> {
    let bad = |reason: &str| ApiError::BadUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let text = url.trim();
    let text = if text.contains("://") {
        text.to_owned()
    } else {
        format!("http://{text}")
    };
    let parsed = Url::parse(&text).map_err(|e| bad(&e.to_string()))?;
    match parsed.scheme() {
        "http" => {}
        "https" => return Err(bad(
            "https is not supported: the admin listener speaks plain HTTP (tunnel it, e.g. ssh -L)",
        )),
        other => return Err(bad(&format!("scheme {other:?}: expected http"))),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("no query or fragment expected"));
    }
    Ok(parsed)
}

impl AdminClient {
    /// A client for the node at `url`, sending `token` as the bearer, each request
    /// bounded by `timeout` (a profile capture gets its length on top).
    pub fn new(url: &str, token: Option<String>, timeout: Duration) -> Result<Self, ApiError> {
        let base = parse_base_url(url)?;
        let http = reqwest::Client::builder()
            .connect_timeout(timeout)
            .no_proxy()
            .user_agent(concat!("im-console/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ApiError::BadUrl {
                url: url.to_owned(),
                reason: format!("HTTP client: {e}"),
            })?;
        Ok(AdminClient {
            http,
            base,
            token,
            timeout,
        })
    }

    /// The node's base URL, as shown in the console.
    pub fn base_url(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// `GET /admin/v1/overview`.
    pub async fn overview(&self) -> Result<Overview, ApiError> {
        self.get(&["admin", "v1", "overview"], &[]).await
    }

    /// `GET /admin/v1/connections?sort=&limit=`.
    pub async fn connections(&self, sort: &str, limit: u32) -> Result<ConnectionList, ApiError> {
        let limit = limit.to_string();
        self.get(
            &["admin", "v1", "connections"],
            &[("sort", sort), ("limit", &limit)],
        )
        .await
    }

    /// `DELETE /admin/v1/connections/{conn_id}`: the client gets close code 4002.
    pub async fn kick(&self, conn_id: u64) -> Result<Kicked, ApiError> {
        let id = conn_id.to_string();
        self.call(
            Method::DELETE,
            &["admin", "v1", "connections", &id],
            &[],
            None,
            self.timeout,
        )
        .await
    }

    /// `POST /admin/v1/users/{uid}/revoke`: closes every session of the user (close code
    /// 4003) and refuses the tokens issued so far.
    pub async fn revoke(&self, uid: &str) -> Result<Revoked, ApiError> {
        self.call(
            Method::POST,
            &["admin", "v1", "users", uid, "revoke"],
            &[],
            None,
            self.timeout,
        )
        .await
    }

    /// `GET /admin/v1/slow-consumers`.
    pub async fn slow_consumers(&self) -> Result<SlowConsumers, ApiError> {
        self.get(&["admin", "v1", "slow-consumers"], &[]).await
    }

    /// `GET /admin/v1/memory`.
    pub async fn memory(&self) -> Result<Memory, ApiError> {
        self.get(&["admin", "v1", "memory"], &[]).await
    }

    /// `GET /admin/v1/log-filters`.
    pub async fn log_filters(&self) -> Result<LogFilters, ApiError> {
        self.get(&["admin", "v1", "log-filters"], &[]).await
    }

    /// `PUT /admin/v1/log-filters/{uid}` with `{"level", "ttl_secs"}`.
    pub async fn set_log_filter(
        &self,
        uid: &str,
        level: &str,
        ttl_secs: u64,
    ) -> Result<serde_json::Value, ApiError> {
        let body = serde_json::to_value(SetLogFilter {
            level: level.to_owned(),
            ttl_secs,
        })
        .map_err(|e| ApiError::Decode {
            path: "log-filters".into(),
            reason: e.to_string(),
        })?;
        self.call(
            Method::PUT,
            &["admin", "v1", "log-filters", uid],
            &[],
            Some(body),
            self.timeout,
        )
        .await
    }

    /// `DELETE /admin/v1/log-filters/{uid}`.
    pub async fn delete_log_filter(&self, uid: &str) -> Result<serde_json::Value, ApiError> {
        self.call(
            Method::DELETE,
            &["admin", "v1", "log-filters", uid],
            &[],
            None,
            self.timeout,
        )
        .await
    }

    /// `PUT /admin/v1/log-level` with `{"level"}` (an EnvFilter string); returns the level in force.
    pub async fn set_global_level(&self, level: &str) -> Result<GlobalLevel, ApiError> {
        self.call(
            Method::PUT,
            &["admin", "v1", "log-level"],
            &[],
            Some(serde_json::json!({ "level": level })),
            self.timeout,
        )
        .await
    }

    /// `GET /admin/v1/logs`.
    pub async fn logs(&self) -> Result<Logs, ApiError> {
        self.get(&["admin", "v1", "logs"], &[]).await
    }

    /// `GET /admin/v1/profile/cpu?seconds=&frequency=&format=bundle`: blocks for the
    /// capture; 409 means another capture is running on the node.
    pub async fn profile(&self, seconds: u64, frequency: u64) -> Result<ProfileBundle, ApiError> {
        let (s, f) = (seconds.to_string(), frequency.to_string());
        let timeout = self.timeout + Duration::from_secs(seconds) + PROFILE_SLACK;
        self.call(
            Method::GET,
            &["admin", "v1", "profile", "cpu"],
            &[("seconds", &s), ("frequency", &f), ("format", "bundle")],
            None,
            timeout,
        )
        .await
    }

    async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, ApiError> {
        self.call(Method::GET, segments, query, None, self.timeout)
            .await
    }

    /// Builds the URL from path segments (each percent-encoded), sends, reads the body
    /// under the cap and decodes it, mapping every failure to an [`ApiError`].
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| ApiError::BadUrl {
                url: self.base.to_string(),
                reason: "cannot be a base".into(),
            })?;
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let path = url.path().to_owned();
        let mut req = self.http.request(method, url).timeout(timeout);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let read = async {
            let mut resp = req.send().await.map_err(|e| transport(e, timeout))?;
            let status = resp.status();
            let mut buf = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, timeout))? {
                if buf.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(ApiError::TooLarge {
                        limit: MAX_BODY_BYTES,
                    });
                }
                buf.extend_from_slice(&chunk);
            }
            Ok((status, buf))
        };
        // reqwest's timeout covers the body too; this bounds anything it might miss.
        let (status, buf) = tokio::time::timeout(timeout + Duration::from_secs(1), read)
            .await
            .map_err(|_| ApiError::Timeout(timeout))??;
        if !status.is_success() {
            return Err(status_error(status, &buf, &path));
        }
        let de = &mut serde_json::Deserializer::from_slice(&buf);
        serde_path_to_error::deserialize(de).map_err(|e| ApiError::Decode {
            path,
            reason: e.to_string(),
        })
    }
}

/// Maps a transport error, naming the root cause (e.g. "Connection refused").
fn transport(e: reqwest::Error, timeout: Duration) -> ApiError {
    if e.is_timeout() {
        return ApiError::Timeout(timeout);
    }
    // reqwest's own text repeats the URL; the root cause ("Connection refused") says it all.
    let mut root = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        root = s.to_string();
        source = s.source();
    }
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "reading the response"
    } else if e.is_request() {
        "sending the request"
    } else {
        "transport"
    };
    ApiError::Unreachable(format!("{what}: {root}"))
}

/// Turns an error status and its `{"error": ...}` body into an [`ApiError`].
fn status_error(status: StatusCode, body: &[u8], path: &str) -> ApiError {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    let message = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => b.error,
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let mut short: String = text.chars().take(200).collect();
            if short.len() < text.len() {
                short.push('…');
            }
            if short.is_empty() {
                status.canonical_reason().unwrap_or("error").to_owned()
            } else {
                short
            }
        }
    };
    if status == StatusCode::NOT_FOUND && message == "no such route" {
        return ApiError::RouteMissing {
            path: path.to_owned(),
        };
    }
    ApiError::Status {
        status: status.as_u16(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            parse_base_url("127.0.0.1:7071").unwrap().as_str(),
            "http://127.0.0.1:7071/"
        );
        assert_eq!(
            parse_base_url("http://h:1/im/").unwrap().as_str(),
            "http://h:1/im/"
        );
        assert!(parse_base_url("https://h:1").is_err());
        assert!(parse_base_url("ftp://h").is_err());
        assert!(parse_base_url("http://h:1/?a=b").is_err());
    }

    #[test]
    fn error_bodies() {
        let e = status_error(StatusCode::NOT_FOUND, br#"{"error":"no such route"}"#, "/x");
        assert!(e.is_route_missing());
        let e = status_error(
            StatusCode::NOT_FOUND,
            br#"{"error":"no connection 9"}"#,
            "/x",
        );
        assert_eq!(
            e,
            ApiError::Status {
                status: 404,
                message: "no connection 9".into()
            }
        );
        let e = status_error(StatusCode::BAD_GATEWAY, b"", "/x");
        assert_eq!(e.to_string(), "HTTP 502: Bad Gateway");
    }

    #[test]
    fn added_and_missing_fields_decode() {
        let o: Overview =
            serde_json::from_str(r#"{"node_id":"a","new_field":{"x":1},"memory":null}"#).unwrap();
        assert_eq!(o.node_id, "a");
        assert_eq!(o.memory, None);
        let l: Logs = serde_json::from_str(
            r#"{"window":{"start":3,"end":"05:00"},"files":[{"name":"a","state":null}]}"#,
        )
        .unwrap();
        assert_eq!(l.window.start, "3");
        assert_eq!(l.files[0].state, "");
    }
}
