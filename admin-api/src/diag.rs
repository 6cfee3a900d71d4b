//! The diagnosis routes: per-uid log filters and the global log level (the two routes
//! with a JSON request body), the log files, the live tail of a filtered user's events,
//! and CPU and heap profile bundles.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One per-uid log level override (`log-filters.filters[]`, and the answer of
/// `PUT /admin/v1/log-filters/{uid}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFilter {
    /// The user id.
    pub uid: String,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The TTL it was set with, in seconds.
    pub ttl_secs: u64,
    /// Seconds until it expires.
    pub remaining_secs: f64,
}

/// `GET /admin/v1/log-filters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFilters {
    /// The node's global level.
    pub global_level: String,
    /// Whether per-uid filters are enabled on the node (`None`: the node does not say).
    pub uid_filters_enabled: Option<bool>,
    /// Active per-uid filters, sorted by uid.
    pub filters: Vec<LogFilter>,
}

/// Body of `PUT /admin/v1/log-filters/{uid}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLogFilter {
    /// Level to log this user at: `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// How long the filter lasts, 1..86400 seconds (`None` or null: the node's default, 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// `DELETE /admin/v1/log-filters/{uid}` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFilterRemoved {
    /// The uid whose filter was removed.
    pub removed: String,
}

/// Body of `PUT /admin/v1/log-level`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLogLevel {
    /// `LEVEL` or `LEVEL,target=LEVEL,...` (e.g. `info,im_server::store=debug`).
    pub level: String,
}

/// `PUT /admin/v1/log-level` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GlobalLevel {
    /// The global level now in force.
    pub global_level: String,
}

/// One log file (`logs.files[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogFile {
    /// File name inside the log dir.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// `active`, `rotated` or `compressed`.
    #[serde(deserialize_with = "crate::lenient_string")]
    pub state: String,
    /// Last modification, Unix milliseconds.
    pub modified_ms: i64,
}

/// The off-peak compression window (`logs.window`), local time `HH:MM`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogWindow {
    /// Start (e.g. `03:00`).
    #[serde(deserialize_with = "crate::lenient_string")]
    pub start: String,
    /// End.
    #[serde(deserialize_with = "crate::lenient_string")]
    pub end: String,
}

/// `GET /admin/v1/logs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Logs {
    /// Log directory on the node (`None` with `log.files = false`).
    pub dir: Option<String>,
    /// The files, by name.
    pub files: Vec<LogFile>,
    /// Off-peak compression window.
    pub window: LogWindow,
    /// Whether the node is inside the window now.
    pub in_window: bool,
    /// Whether the node counts as idle (compression may run outside the window).
    pub idle: bool,
    /// Next window start, Unix milliseconds.
    pub next_window_start_ms: Option<i64>,
    /// Files older than this are deleted.
    pub retention_hours: u64,
    /// Log bytes written since start.
    pub written_bytes_total: u64,
    /// Bytes the compressor read since start.
    pub compressed_bytes_total: u64,
    /// Files compressed since start.
    pub compressed_files_total: u64,
    /// Files deleted past retention since start.
    pub deleted_files_total: u64,
    /// Log lines dropped by the writer since start.
    pub dropped_lines_total: u64,
}

/// One line of `GET /admin/v1/logs/tail` (NDJSON, one JSON object a line; blank lines
/// are keep-alives). Either an event of the tailed user, or a `{"dropped": N}` line: N
/// events were lost at this point because the reader fell behind (the other fields
/// absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogTailLine {
    /// Events lost at this point of the stream; `None` on an event line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    /// The event's position in the node's tail ring (rises by one per kept event of any
    /// user; a jump is other users' events or dropped ones).
    pub seq: u64,
    /// When it was emitted, Unix milliseconds.
    pub ts_ms: i64,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    #[serde(deserialize_with = "crate::lenient_string")]
    pub level: String,
    /// The emitting module (e.g. `im_server::persist::writer`).
    #[serde(deserialize_with = "crate::lenient_string")]
    pub target: String,
    /// The user the event belongs to.
    #[serde(deserialize_with = "crate::lenient_string")]
    pub uid: String,
    /// The message.
    #[serde(deserialize_with = "crate::lenient_string")]
    pub message: String,
    /// The event's other fields, by name (numbers and bools as such, the rest text).
    pub fields: BTreeMap<String, serde_json::Value>,
    /// True for the ring's history sent first, false for live events.
    pub backlog: bool,
}

/// One function of a CPU profile's top list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopFunction {
    /// Demangled name, without the hash suffix.
    pub function: String,
    /// Samples with this function on top of the stack.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack.
    pub total_samples: u64,
}

/// `GET /admin/v1/profile/cpu?format=bundle`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileBundle {
    /// Capture length in seconds.
    pub seconds: u64,
    /// Sampling frequency in Hz.
    pub frequency: u64,
    /// Samples taken.
    pub samples: u64,
    /// Functions by self samples, largest first.
    pub top: Vec<TopFunction>,
    /// Flamegraph SVG.
    pub svg: String,
    /// gzipped pprof protobuf, base64.
    pub pprof_gz_base64: String,
}

/// One function of a heap profile's top list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeapTopFunction {
    /// Demangled name, without the hash suffix.
    pub function: String,
    /// In-use bytes allocated with this function as the allocation site: the innermost
    /// frame outside the Rust standard library.
    pub self_bytes: u64,
    /// In-use bytes allocated with this function anywhere on the stack.
    pub total_bytes: u64,
}

/// `GET /admin/v1/profile/heap?format=bundle`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeapProfileBundle {
    /// Sampling window in seconds.
    pub seconds: u64,
    /// Average bytes between samples (jemalloc's `2^lg_prof_sample`).
    pub sample_interval_bytes: u64,
    /// Estimated bytes still in use at the end of the window from allocations made during it.
    pub inuse_bytes: u64,
    /// Distinct allocation stacks sampled.
    pub stacks: u64,
    /// Functions by self bytes, largest first.
    pub top: Vec<HeapTopFunction>,
    /// Flamegraph SVG (widths are in-use bytes).
    pub svg: String,
    /// gzipped pprof protobuf (`inuse_space`, bytes), base64.
    pub pprof_gz_base64: String,
}
