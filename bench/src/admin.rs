//! The server's own figures, read from its admin API (`docs/admin-api.md`):
//! `GET /admin/v1/overview` (RSS, fds, CPU, rates, backlog, slow consumers, stage
//! latency, capacity headroom) and `GET /admin/v1/memory` (jemalloc, read fresh).
//!
//! Response types take only the fields the reports use, each `#[serde(default)]`, so a
//! server that adds fields (the API only ever adds) still parses.

use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Timeout of one admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A client for one node's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

/// One stage's latency as the overview reports it (microseconds, last window).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct StageLatency {
    /// Stage name (`persist_commit`, `end_to_end`, ...).
    pub stage: String,
    /// Samples in the window.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Process {
    rss_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    cpu_seconds: f64,
    cores: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Capacity {
    per_connection_bytes: u64,
    per_connection_measured: bool,
    headroom_connections: u64,
    headroom_msgs_per_sec: Option<f64>,
    limiting_resource: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Overview {
    connections: u64,
    users_online: u64,
    msg_rate_in: f64,
    msg_rate_out: f64,
    messages_in_total: u64,
    messages_out_total: u64,
    persist_backlog: u64,
    slow_consumers: u64,
    slow_consumer_disconnects: u64,
    outbound_queued_bytes: u64,
    cpu_busy: f64,
    process: Process,
    capacity: Capacity,
    stages: Vec<StageLatency>,
}

/// jemalloc figures from `GET /admin/v1/memory`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Jemalloc {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages.
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes mapped.
    pub mapped: u64,
    /// Bytes retained (unmapped but kept).
    pub retained: u64,
    /// Allocator metadata.
    pub metadata: u64,
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
    pub jemalloc: Option<Jemalloc>,
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
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the admin HTTP client")?;
        Ok(AdminClient {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http,
        })
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .with_context(|| format!("reading GET {url}"))?;
        if !status.is_success() {
            bail!(
                "GET {url}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            );
        }
        serde_json::from_slice(&body).with_context(|| format!("parsing GET {url}"))
    }

    /// Reads the overview and the memory route.
    pub async fn figures(&self) -> anyhow::Result<ServerFigures> {
        let o: Overview = self.get("/admin/v1/overview").await?;
        let jemalloc = self.get::<Jemalloc>("/admin/v1/memory").await.ok();
        Ok(ServerFigures {
            connections: o.connections,
            users_online: o.users_online,
            rss_bytes: o.process.rss_bytes,
            open_fds: o.process.open_fds,
            max_fds: o.process.max_fds,
            cpu_seconds: o.process.cpu_seconds,
            cpu_busy: o.cpu_busy,
            cores: o.process.cores,
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
            stages: o.stages,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overview_parses_the_documented_shape_and_tolerates_more() {
        let json = r#"{
          "node_id": "vm", "connections": 3, "users_online": 3, "msg_rate_in": 40.0,
          "persist_backlog": 0, "slow_consumers": 1, "cpu_busy": 0.5, "new_field": [1, 2],
          "stages": [{"stage": "end_to_end", "count": 40, "p50_us": 1.28, "p99_us": 3.07, "p999_us": 3.07}],
          "process": {"cpu_seconds": 0.14, "rss_bytes": 13910016, "open_fds": 19, "max_fds": 20000, "cores": 2},
          "capacity": {"per_connection_bytes": 32768, "per_connection_measured": false,
                       "headroom_connections": 18981, "headroom_msgs_per_sec": null,
                       "limiting_resource": "fds"}
        }"#;
        let o: Overview = serde_json::from_str(json).unwrap();
        assert_eq!(o.process.rss_bytes, 13_910_016);
        assert_eq!(o.capacity.headroom_connections, 18_981);
        assert_eq!(o.capacity.headroom_msgs_per_sec, None);
        assert_eq!(o.stages[0].p99_us, 3.07);
        assert_eq!(o.slow_consumers, 1);
        let empty: Overview = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.connections, 0);
    }
}
