//! `[store]`: store tuning (SQLite durability, pools, timeouts, the health probe, the
//! free-space floor), with its defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

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
    /// SQLite's memory for all its connections together (page caches first): above it
    /// SQLite reuses cache pages instead of growing (its soft heap limit; 0: no limit,
    /// SQLite's 2 MB cache per connection). SQLite only.
    pub sqlite_memory_mib: u32,
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
            sqlite_memory_mib: 8,
        }
    }
}

impl StoreConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(self.sqlite_synchronous.as_str(), "full" | "normal") {
            return Err(invalid(
                "store.sqlite_synchronous",
                &self.sqlite_synchronous,
                "use \"full\" or \"normal\"",
            ));
        }
        range("store.pool_size", self.pool_size, 1, 1024)?;
        range(
            "store.acquire_timeout_ms",
            self.acquire_timeout_ms,
            50,
            600_000,
        )?;
        range(
            "store.statement_timeout_ms",
            self.statement_timeout_ms,
            0,
            3_600_000,
        )?;
        range(
            "store.unavailable_after_ms",
            self.unavailable_after_ms,
            100,
            600_000,
        )?;
        range(
            "store.probe_interval_ms",
            self.probe_interval_ms,
            50,
            600_000,
        )?;
        range("store.min_free_disk_mb", self.min_free_disk_mb, 0, 1 << 30)?;
        range(
            "store.sqlite_memory_mib",
            self.sqlite_memory_mib,
            0,
            1 << 20,
        )?;
        Ok(())
    }
}
