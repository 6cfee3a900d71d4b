//! `[log]`: the global level, rolling JSON files, per-uid filters and the off-peak
//! compactor, with their defaults and validation (the level spec and the window times
//! are checked by the `obs` parsers that use them), and the `obs::logfiles::LogOptions`
//! they become.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::check::{invalid, name_chars, range};
use super::ConfigError;

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
    /// Recent events of filtered users kept in memory for the live tail.
    pub tail_ring_events: u32,
    /// Most live tails (`GET /admin/v1/logs/tail`) open at once.
    pub max_tails: u32,
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
            tail_ring_events: 4096,
            max_tails: 8,
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
            tail_ring_events: self.tail_ring_events as usize,
            max_tails: self.max_tails as usize,
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

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        range("log.tail_ring_events", self.tail_ring_events, 16, 1_000_000)?;
        range("log.max_tails", self.max_tails, 1, 64)?;
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
