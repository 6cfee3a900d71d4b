//! `[obs]`: stage probes, task monitors and the sampler, with their defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::range;
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
}

impl Default for Obs {
    fn default() -> Self {
        Obs {
            probes: true,
            sample_interval_ms: 1000,
            conn_bytes_estimate: 32 * 1024,
            memory_limit_bytes: 0,
            task_monitors: true,
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
        Ok(())
    }
}
