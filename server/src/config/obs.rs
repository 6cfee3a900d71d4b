//! `[obs]`: stage probes, task monitors, the sampler and message traces, with their
//! defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

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
    /// Task monitors on the long-lived tasks (`im_task_*`; off only to measure their cost).
    pub task_monitors: bool,
    /// Messages kept per tracked user in the per-user diagnosis ring (`obs::users`).
    pub user_diag_ring: u32,
    /// Track every Nth user id by hash in the per-user diagnosis (0: off; users under a
    /// log filter are tracked whatever this says).
    pub user_diag_sample_every: u32,
    /// Most users the per-user diagnosis keeps at once (the oldest goes first).
    pub user_diag_max_users: u32,
    /// Share of all messages traced (0..=1; 0: only filtered senders' messages).
    pub trace_sample_rate: f64,
    /// Recipients whose queue_wait and write a trace records (the rest are counted).
    pub trace_max_recipients: u32,
    /// Finished trace parts the node keeps (the oldest is evicted).
    pub trace_store_size: u32,
}

impl Default for Obs {
    fn default() -> Self {
        Obs {
            probes: true,
            sample_interval_ms: 1000,
            conn_bytes_estimate: 32 * 1024,
            memory_limit_bytes: 0,
            task_monitors: true,
            user_diag_ring: 32,
            user_diag_sample_every: 0,
            user_diag_max_users: 1000,
            trace_sample_rate: 0.0,
            trace_max_recipients: 64,
            trace_store_size: 1024,
        }
    }
}

impl Obs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "obs.sample_interval_ms",
            self.sample_interval_ms,
            100,
            60_000,
        )?;
        range(
            "obs.conn_bytes_estimate",
            self.conn_bytes_estimate,
            1,
            1 << 30,
        )?;
        range("obs.user_diag_ring", self.user_diag_ring, 1, 1024)?;
        range(
            "obs.user_diag_sample_every",
            self.user_diag_sample_every,
            0,
            1_000_000,
        )?;
        range(
            "obs.user_diag_max_users",
            self.user_diag_max_users,
            1,
            100_000,
        )?;
        if !(0.0..=1.0).contains(&self.trace_sample_rate) {
            return Err(invalid(
                "obs.trace_sample_rate",
                self.trace_sample_rate,
                "must be between 0 and 1 (e.g. 0.001 for one message in 1,000)",
            ));
        }
        range(
            "obs.trace_max_recipients",
            self.trace_max_recipients,
            0,
            256,
        )?;
        range("obs.trace_store_size", self.trace_store_size, 1, 1_000_000)?;
        Ok(())
    }
}
