//! The server's own figures, read from its admin API (`docs/admin-api.md`) with
//! `im_admin_api`'s client and types: `GET /admin/v1/overview` (RSS, fds, CPU, rates,
//! backlog, slow consumers, stage latency, capacity headroom) and `GET /admin/v1/memory`
//! (jemalloc, read fresh), and on demand CPU and heap profiles (`/admin/v1/profile/*`,
//! as bundles). The answer types are `#[serde(default)]`, so a server that
//! adds fields (the API only ever adds) still parses.

use std::time::Duration;

use anyhow::Context;
use im_admin_api::client;
pub use im_admin_api::{AllocStats, HeapProfileBundle, ProfileBundle, StageLatency};
use serde::Serialize;

/// Timeout of one admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A client for one node's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    api: client::AdminClient,
}

/// The server's figures at one moment.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ServerFigures {
    /// Live connections.
    pub connections: u64,
    /// Users with at least one connection.
    pub users_online: u64,
    /// Process resident set size.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// RLIMIT_NOFILE.
    pub max_fds: u64,
    /// Process CPU seconds since start.
    pub cpu_seconds: f64,
    /// CPU busy ratio of the cores available (0..1) over the last sample interval.
    pub cpu_busy: f64,
    /// Cores available.
    pub cores: u64,
    /// Messages in per second (last interval).
    pub msg_rate_in: f64,
    /// Messages out per second (last interval).
    pub msg_rate_out: f64,
    /// Messages received since start.
    pub messages_in_total: u64,
    /// Messages delivered since start.
    pub messages_out_total: u64,
    /// Persistence queue depth.
    pub persist_backlog: u64,
    /// Connections marked slow now.
    pub slow_consumers: u64,
    /// Connections closed for being slow since start.
    pub slow_consumer_disconnects: u64,
    /// Bytes queued for writing over all connections.
    pub outbound_queued_bytes: u64,
    /// The server's memory per connection (measured once enough are connected).
    pub per_connection_bytes: u64,
    /// Whether `per_connection_bytes` is measured rather than the configured estimate.
    pub per_connection_measured: bool,
    /// How many more connections the node can take.
    pub headroom_connections: u64,
    /// How many more messages per second it can take (`None`: too idle to tell).
    pub headroom_msgs_per_sec: Option<f64>,
    /// The resource that limits the headroom.
    pub limiting_resource: String,
    /// jemalloc figures (`None` if the memory route failed).
    pub jemalloc: Option<AllocStats>,
    /// The memory route read whole (`None` if it failed): with the memory outside
    /// jemalloc (SQLite's, the C heap).
    pub memory: Option<im_admin_api::Memory>,
    /// Per-stage latency over the server's window.
    pub stages: Vec<StageLatency>,
}

impl ServerFigures {
    /// The latency of one stage, if the server reported it.
    pub fn stage(&self, name: &str) -> Option<&StageLatency> {
        self.stages.iter().find(|s| s.stage == name)
    }
}

impl AdminClient {
    /// A client for the admin API at `base` (`http://HOST:PORT`) with bearer `token`.
    pub fn new(base: &str, token: &str) -> anyhow::Result<AdminClient> {
        let api = client::AdminClient::new(base, Some(token.to_owned()), REQUEST_TIMEOUT)
            .context("building the admin HTTP client")?;
        Ok(AdminClient { api })
    }

    /// Reads the overview and the memory route.
    pub async fn figures(&self) -> anyhow::Result<ServerFigures> {
        let url = self.api.base_url();
        let o = self
            .api
            .overview()
            .await
            .with_context(|| format!("GET {url}/admin/v1/overview"))?;
        let memory = self.api.memory().await.ok();
        let jemalloc = memory.as_ref().map(|m| m.alloc());
        Ok(ServerFigures {
            connections: o.connections,
            users_online: o.users_online,
            rss_bytes: o.process.rss_bytes,
            open_fds: o.process.open_fds,
            max_fds: o.process.max_fds,
            cpu_seconds: o.process.cpu_seconds,
            cpu_busy: o.cpu_busy,
            cores: o.process.cores.into(),
            msg_rate_in: o.msg_rate_in,
            msg_rate_out: o.msg_rate_out,
            messages_in_total: o.messages_in_total,
            messages_out_total: o.messages_out_total,
            persist_backlog: o.persist_backlog,
            slow_consumers: o.slow_consumers,
            slow_consumer_disconnects: o.slow_consumer_disconnects,
            outbound_queued_bytes: o.outbound_queued_bytes,
            per_connection_bytes: o.capacity.per_connection_bytes,
            per_connection_measured: o.capacity.per_connection_measured,
            headroom_connections: o.capacity.headroom_connections,
            headroom_msgs_per_sec: o.capacity.headroom_msgs_per_sec,
            limiting_resource: o.capacity.limiting_resource,
            jemalloc,
            memory,
            stages: o.stages,
        })
    }

    /// A CPU profile of `seconds` at `frequency` Hz (`GET /admin/v1/profile/cpu`, bundle).
    pub async fn cpu_profile(&self, seconds: u64, frequency: u64) -> anyhow::Result<ProfileBundle> {
        let url = self.api.base_url();
        self.api
            .profile(seconds, frequency)
            .await
            .with_context(|| format!("GET {url}/admin/v1/profile/cpu"))
    }

    /// A heap profile sampling for `seconds` (`GET /admin/v1/profile/heap`, bundle).
    pub async fn heap_profile(&self, seconds: u64) -> anyhow::Result<HeapProfileBundle> {
        let url = self.api.base_url();
        self.api
            .heap_profile(seconds)
            .await
            .with_context(|| format!("GET {url}/admin/v1/profile/heap"))
    }

    /// Like [`AdminClient::figures`], but a failure becomes a warning on stderr and `None`.
    pub async fn try_figures(&self) -> Option<ServerFigures> {
        match self.figures().await {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("im-bench: warning: reading the server's figures: {e:#}");
                None
            }
        }
    }
}
