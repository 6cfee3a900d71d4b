//! The once-a-second sampler: reads the allocator, the OS and the tokio runtime (with the
//! task monitors, `runtime`), turns running totals into
//! rates, computes stage percentiles over a recent window and the capacity headroom,
//! sets the gauges, runs the Prometheus upkeep, and publishes one [`Snapshot`] that the
//! admin API serves (so a request never does this work itself).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};

use super::alloc;
use super::capacity;
use super::latency::Counts;
use super::process;
use super::runtime::RuntimeSampler;
use super::{Metrics, Stage};

/// Window over which the overview's stage percentiles are computed.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Figures the sampler asks the node for.
pub trait Live: Send + Sync {
    /// Live connections.
    fn connections(&self) -> u64;
    /// Distinct users online.
    fn users_online(&self) -> u64;
    /// Connections above the soft mark, and bytes queued across connections.
    fn outbound(&self) -> (u64, u64);
    /// Persistence queue depth and capacity.
    fn persist_queue(&self) -> (u64, u64);
    /// The connection cap (0: none).
    fn max_connections(&self) -> u64 {
        0
    }
    /// The store's disk, where the node can see it (SQLite's data dir); measuring it
    /// also records it in the store's health (the free-space floor).
    fn disk(&self) -> Option<capacity::Disk> {
        None
    }
}

/// Latency of one stage over the window: the admin API's type (`overview.stages[]`).
pub use im_admin_api::StageLatency;

/// One sample of the node: the figures of `GET /admin/v1/overview` that the sampler
/// measures (the route fills in the node's own fields: id, version, caps, cluster).
pub type Snapshot = im_admin_api::Overview;

/// Sampler state between ticks.
pub struct Sampler {
    metrics: Metrics,
    live: Arc<dyn Live>,
    out: Arc<RwLock<Snapshot>>,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    started: Instant,
    baseline_rss: u64,
    conn_bytes_estimate: u64,
    memory_limit_override: u64,
    history: VecDeque<(Instant, Vec<Counts>)>,
    last: Option<(Instant, u64, u64, f64)>,
    runtime: RuntimeSampler,
}

impl Sampler {
    /// A sampler publishing into `out`. `memory_limit_override` (bytes, 0 = none) replaces
    /// the physical-memory fallback when no cgroup limit is set.
    pub fn new(
        metrics: Metrics,
        live: Arc<dyn Live>,
        out: Arc<RwLock<Snapshot>>,
        prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
        conn_bytes_estimate: u64,
        memory_limit_override: u64,
    ) -> Self {
        let started = Instant::now();
        let start_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        gauge!("process_start_time_seconds").set(start_unix);
        Sampler {
            metrics,
            live,
            out,
            prometheus,
            started,
            baseline_rss: process::read().rss_bytes,
            conn_bytes_estimate,
            memory_limit_override,
            history: VecDeque::new(),
            last: None,
            runtime: RuntimeSampler::new(),
        }
    }

    /// Samples every `every` until the task is dropped.
    pub async fn run(mut self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let snap = self.sample();
            if let Ok(mut o) = self.out.write() {
                *o = snap;
            }
        }
    }

    /// Takes one sample now.
    pub fn sample(&mut self) -> Snapshot {
        let now = Instant::now();
        let totals = &self.metrics.totals;
        let msgs_in = totals.messages_in.load(Relaxed);
        let msgs_out = totals.messages_out.load(Relaxed);
        let mut proc = process::read();
        if proc.memory_limit_source == "physical" && self.memory_limit_override > 0 {
            proc.memory_limit_bytes = self.memory_limit_override;
            proc.memory_limit_source = "config".to_owned();
        }
        let (rate_in, rate_out, busy) = match self.last {
            Some((t, i, o, cpu)) => {
                let dt = now.duration_since(t).as_secs_f64().max(1e-3);
                (
                    (msgs_in - i) as f64 / dt,
                    (msgs_out - o) as f64 / dt,
                    ((proc.cpu_seconds - cpu) / dt / proc.cores.max(1) as f64).clamp(0.0, 1.0),
                )
            }
            None => (0.0, 0.0, 0.0),
        };
        self.last = Some((now, msgs_in, msgs_out, proc.cpu_seconds));

        let counts = self.metrics.stage_counts();
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > WINDOW)
        {
            self.history.pop_front();
        }
        let empty = vec![Counts::default(); counts.len()];
        let base = self.history.front().map(|(_, c)| c).unwrap_or(&empty);
        let stages = Stage::ALL
            .iter()
            .zip(counts.iter().zip(base))
            .map(|(stage, (now_c, then_c))| {
                let w = now_c.since(then_c);
                StageLatency {
                    stage: stage.name().to_owned(),
                    count: w.total(),
                    p50_us: w.quantile_us(0.5),
                    p99_us: w.quantile_us(0.99),
                    p999_us: w.quantile_us(0.999),
                }
            })
            .collect();
        self.history.push_back((now, counts));

        let memory = alloc::read();
        let connections = self.live.connections();
        let (backlog, capacity_q) = self.live.persist_queue();
        let (slow_consumers, outbound_queued_bytes) = self.live.outbound();
        let headroom = capacity::compute(&capacity::Inputs {
            connections,
            rss_bytes: proc.rss_bytes,
            baseline_rss_bytes: self.baseline_rss,
            conn_bytes_estimate: self.conn_bytes_estimate,
            memory_limit_bytes: proc.memory_limit_bytes,
            open_fds: proc.open_fds,
            max_fds: proc.max_fds,
            cpu_busy: busy,
            msg_rate: rate_in + rate_out,
            max_connections: self.live.max_connections(),
            disk: self.live.disk(),
        });

        // Gauges.
        if let Some(m) = &memory {
            for (kind, v) in alloc::kinds(m) {
                gauge!("im_alloc_bytes", "kind" => kind).set(v as f64);
            }
        }
        gauge!("im_capacity_headroom_connections").set(headroom.headroom_connections as f64);
        for (res, v) in [
            ("memory", headroom.ratio_memory),
            ("fds", headroom.ratio_fds),
            ("cpu", headroom.ratio_cpu),
        ] {
            gauge!("im_capacity_headroom_ratio", "resource" => res).set(v);
        }
        if let (Some(d), Some(r)) = (headroom.disk_free_bytes, headroom.ratio_disk) {
            gauge!("im_capacity_headroom_ratio", "resource" => "disk").set(r);
            gauge!("im_store_disk_free_bytes").set(d as f64);
        }
        if let Some(v) = headroom.headroom_msgs_per_sec {
            gauge!("im_capacity_headroom_msgs_per_second").set(v);
        }
        gauge!("im_memory_per_connection_bytes").set(headroom.per_connection_bytes as f64);
        gauge!("im_users_online").set(self.live.users_online() as f64);
        gauge!("process_resident_memory_bytes").set(proc.rss_bytes as f64);
        counter!("process_cpu_seconds_total").absolute(proc.cpu_seconds as u64);
        gauge!("process_open_fds").set(proc.open_fds as f64);
        gauge!("process_max_fds").set(proc.max_fds as f64);
        self.metrics.persist_queue_depth.set(backlog as f64);
        let runtime = self.runtime.sample(now);
        if let Some(p) = &self.prometheus {
            p.run_upkeep();
        }

        Snapshot {
            uptime_secs: self.started.elapsed().as_secs(),
            connections,
            users_online: self.live.users_online(),
            msg_rate_in: rate_in,
            msg_rate_out: rate_out,
            messages_in_total: msgs_in,
            messages_out_total: msgs_out,
            persist_backlog: backlog,
            persist_queue_capacity: capacity_q,
            slow_consumers,
            slow_consumer_disconnects: totals.slow_disconnects.load(Relaxed),
            outbound_queued_bytes,
            latency_window_secs: WINDOW.as_secs(),
            stages,
            memory,
            process: proc,
            cpu_busy: busy,
            capacity: headroom,
            runtime,
            ..Snapshot::default()
        }
    }
}
