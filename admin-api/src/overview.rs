//! `GET /admin/v1/overview`: the node's figures ([`Overview`]) and the parts it is made
//! of, including the cluster as this node sees it ([`ClusterInfo`], each node's
//! [`NodeReport`], the report the nodes publish to each other).

use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocStats {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages (allocated plus fragmentation).
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained (unmapped from use but kept for reuse).
    pub retained: u64,
    /// Allocator metadata bytes.
    pub metadata: u64,
}

/// Process figures (`overview.process`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessStats {
    /// User + system CPU seconds since start.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// RLIMIT_NOFILE soft limit.
    pub max_fds: u64,
    /// The memory the process may use in bytes (cgroup, config or physical).
    pub memory_limit_bytes: u64,
    /// Where the memory limit comes from: `cgroup`, `config`, `physical`.
    pub memory_limit_source: String,
    /// CPU cores available.
    pub cores: u32,
}

/// Capacity headroom (`overview.capacity`, see `runbooks/capacity-headroom.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capacity {
    /// Memory cost of one connection in bytes (measured, or the configured estimate).
    pub per_connection_bytes: u64,
    /// Whether that cost was measured.
    pub per_connection_measured: bool,
    /// How many more connections fit before the first resource runs out.
    pub headroom_connections: u64,
    /// How many more messages per second fit, from CPU; `None` while too idle to tell.
    pub headroom_msgs_per_sec: Option<f64>,
    /// Free share of the memory limit (1 - used/limit).
    pub ratio_memory: f64,
    /// Free share of the fd limit.
    pub ratio_fds: f64,
    /// Free share of CPU.
    pub ratio_cpu: f64,
    /// Free share of the store's disk above its floor (`None`: not measured, Postgres).
    pub ratio_disk: Option<f64>,
    /// Free bytes on the store's disk (`None`: not measured).
    pub disk_free_bytes: Option<u64>,
    /// The resource that runs out first (`memory`, `fds`, `cpu`, `disk`, ...).
    pub limiting_resource: String,
}

/// Connections refused before the upgrade, by reason (`overview.connections_refused`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// `GET /admin/v1/overview`. The node's sampler fills the figures it measures once a
/// second; the route adds the node's own fields (id, version, caps, cluster).
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
    /// Sends accepted per second (last sampler interval).
    pub msg_rate_in: f64,
    /// Message copies queued to recipients per second (last interval).
    pub msg_rate_out: f64,
    /// Sends accepted since start.
    pub messages_in_total: u64,
    /// Message copies queued since start.
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
    /// CPU busy ratio over the last interval (0..1 of all available cores).
    pub cpu_busy: f64,
    /// Capacity headroom.
    pub capacity: Capacity,
    /// The cluster as this node sees it (`enabled: false` on a single node).
    pub cluster: ClusterInfo,
    /// The tokio runtime and the task monitors of the long-lived tasks (`None`: an
    /// older server, or no runtime to read).
    pub runtime: Option<RuntimeStats>,
    /// The configured hooks to the application's backend and their circuit breakers
    /// (empty: none configured, or an older server).
    pub hooks: Vec<crate::hooks::HookStatus>,
    /// Multi-region mode: the replication lag into this region from each other region,
    /// as the node that applies it sees it (empty: one region, an older server, or a
    /// node that does not apply; see docs/multi-region.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionLag>,
    /// Multi-region mode: conversations whose home an operator moved, as this node
    /// knows them (absent: one region, or an older server; `GET /admin/v1/homes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub homes_moved: Option<u64>,
}

/// One region pair of `overview.regions`: the replication from `from` into `to`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegionLag {
    /// The home region the messages come from.
    pub from: String,
    /// The region applying them (this node's).
    pub to: String,
    /// Messages in `from`'s stream not yet applied here, as last known.
    pub lag_messages: u64,
    /// Seconds since this region was last caught up with `from` (0: caught up now).
    pub lag_seconds: f64,
    /// Messages applied from `from` since this node started applying.
    pub applied_total: u64,
    /// Whether the applier's last round reached `from`'s stream (false: the link is
    /// cut or the stream unreachable; absent from an older server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_up: Option<bool>,
    /// Whether `from` announced a `regions` list different from this region's: nothing
    /// is applied from it or forwarded to it until they agree (absent from an older
    /// server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_mismatch: Option<bool>,
}

/// `overview.runtime`: tokio's stable runtime metrics and the task monitors of the
/// node's long-lived tasks (see `runbooks/runtime-saturated.md`). Ratios and means are
/// over the last sampler interval; `*_total` figures count since start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimeStats {
    /// Worker threads of the runtime.
    pub workers: u64,
    /// Tasks alive on the runtime (spawned, not yet finished).
    pub alive_tasks: u64,
    /// Tasks waiting in the runtime's global (injection) queue.
    pub global_queue_depth: u64,
    /// Share of the interval the workers spent polling tasks, over all workers (0..1).
    pub busy_ratio: f64,
    /// The same per worker, in worker order.
    pub worker_busy_ratio: Vec<f64>,
    /// Seconds the workers spent polling tasks since start, summed over the workers.
    pub busy_secs_total: f64,
    /// Whether the task monitors are on (`obs.task_monitors`); `tasks` is empty when off.
    pub task_monitors: bool,
    /// A poll at least this long counts as slow, microseconds.
    pub slow_poll_threshold_us: u64,
    /// One entry per monitored task kind (`writer`, `router`, `receipts`,
    /// `cluster_inbound`, `cluster`).
    pub tasks: Vec<TaskStats>,
}

/// One monitored task kind of `overview.runtime.tasks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskStats {
    /// The task label (`im_task_*{task}`).
    pub task: String,
    /// Tasks of this kind instrumented since start.
    pub instrumented: u64,
    /// Tasks of this kind running now (instrumented and not dropped).
    pub alive: u64,
    /// Polls since start.
    pub polls_total: u64,
    /// Seconds spent in polls since start.
    pub poll_secs_total: f64,
    /// Slow polls since start.
    pub slow_polls_total: u64,
    /// Seconds spent in slow polls since start.
    pub slow_poll_secs_total: f64,
    /// Times the task was woken and then waited for a worker, since start.
    pub scheduled_total: u64,
    /// Seconds between the wakes and the polls that followed, since start.
    pub scheduled_delay_secs_total: f64,
    /// Polls in the last interval.
    pub polls: u64,
    /// Mean poll duration in the last interval, microseconds (0: not polled).
    pub mean_poll_us: f64,
    /// Slow polls in the last interval.
    pub slow_polls: u64,
    /// Mean scheduled delay (wake to poll) in the last interval, microseconds.
    pub mean_scheduled_delay_us: f64,
}

/// `overview.cluster`: every node of the registry and a summary. On a single node only
/// `enabled` (false), `degraded` (null), `nodes` (empty) and `summary` (null) are sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterInfo {
    /// Cluster mode on.
    pub enabled: bool,
    /// This node's id (cluster mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Registry TTL in seconds (cluster mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// Users this node knows on other nodes (cluster mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users_on_other_nodes: Option<u64>,
    /// Whether this node's NATS connection is up (cluster mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_connected: Option<bool>,
    /// `None` while the cluster link works, else why not in one word (`nats_down`,
    /// `resyncing`, `kv_missing`, `kv_error`).
    pub degraded: Option<String>,
    /// Every known node, sorted by id.
    pub nodes: Vec<ClusterNode>,
    /// Totals over the healthy nodes.
    pub summary: Option<ClusterSummary>,
}

/// What a node publishes about itself every `cluster.report_interval_ms` (signed, in the
/// cluster's KV bucket), and what the overview shows of each node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeReport {
    /// The node's id.
    pub node_id: String,
    /// WebSocket URL clients use to reach it.
    pub ws_url: String,
    /// Its admin listener, `http://IP:PORT`.
    pub admin_url: String,
    /// Live connections.
    pub connections: u64,
    /// Distinct users online.
    pub users_online: u64,
    /// Sends accepted per second.
    pub msg_rate_in: f64,
    /// Message copies queued per second.
    pub msg_rate_out: f64,
    /// Resident memory.
    pub rss_bytes: u64,
    /// CPU busy ratio of the node's cores (0..1).
    pub cpu_busy: f64,
    /// More connections it can take (capacity headroom).
    pub headroom_connections: u64,
    /// The resource that limits the headroom.
    pub limiting_resource: String,
    /// Shutting down: out of rotation, still delivering to its clients.
    pub draining: bool,
    /// Seconds since it started.
    pub uptime_secs: u64,
    /// im-server version.
    pub version: String,
    /// The node process's identity: random per start. A report naming a live node with
    /// another identity is ignored until that node's report expires.
    pub instance: String,
}

/// One node of `overview.cluster.nodes`: its last report and how this node sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterNode {
    /// The last report (its fields stand at the top level of the JSON object).
    #[serde(flatten)]
    pub report: NodeReport,
    /// Age of that report, ms.
    pub report_age_ms: u64,
    /// Report younger than the staleness limit (a few report intervals): routable.
    pub healthy: bool,
    /// `up`, `draining` or `down`.
    pub state: String,
    /// The routing score (lower is chosen first).
    pub score: f64,
}

/// `overview.cluster.summary`: totals over the healthy nodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterSummary {
    /// Nodes known.
    pub nodes: u64,
    /// Nodes healthy.
    pub healthy: u64,
    /// Connections.
    pub connections: u64,
    /// Distinct users online (summed per node).
    pub users_online: u64,
    /// Sends per second.
    pub msg_rate_in: f64,
    /// Copies per second.
    pub msg_rate_out: f64,
    /// Resident memory.
    pub rss_bytes: u64,
    /// Connections the healthy nodes can still take.
    pub headroom_connections: u64,
}
