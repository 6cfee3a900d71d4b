//! Node data: what the console knows about one node (health, the latest answers, the
//! sparkline history, slow-consumer events, the CPU and heap profiles) and the sums across nodes.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use super::{HISTORY_LEN, SLOW_EVENTS_LEN};
use crate::api::{
    ApiError, ConnectionList, HeapTopFunction, LogFilters, Logs, Memory, Overview, ParkedEvents,
    SlowConsumers, TopFunction, UserDiag, Webhooks,
};

/// A fetched resource: the last good value, and the last error if the latest fetch failed.
#[derive(Debug, Clone)]
pub struct Fetched<T> {
    /// Last good value (kept when a later fetch fails, shown as stale).
    pub data: Option<T>,
    /// Error of the latest fetch, `None` if it succeeded.
    pub error: Option<ApiError>,
    /// When `data` arrived.
    pub at: Option<Instant>,
}

impl<T> Default for Fetched<T> {
    fn default() -> Self {
        Fetched {
            data: None,
            error: None,
            at: None,
        }
    }
}

impl<T> Fetched<T> {
    /// Records a fetch result.
    pub fn set(&mut self, result: Result<T, ApiError>, now: Instant) {
        match result {
            Ok(v) => {
                self.data = Some(v);
                self.error = None;
                self.at = Some(now);
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// Whether a node answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// No answer yet.
    Connecting,
    /// The last overview poll succeeded.
    Up,
    /// The node cannot be reached (refused, reset, timeout) since `since`.
    Unreachable {
        /// The transport error.
        error: String,
        /// When it was first seen unreachable in this stretch.
        since: Instant,
    },
    /// The node answers, but with an error (e.g. 401: wrong token).
    Failing {
        /// The error.
        error: String,
    },
}

impl Health {
    /// Short label for tables and the header.
    pub fn label(&self) -> &'static str {
        match self {
            Health::Connecting => "connecting",
            Health::Up => "up",
            Health::Unreachable { .. } => "unreachable",
            Health::Failing { .. } => "error",
        }
    }
}

/// Client-side series of one node's overview samples, for sparklines.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Connections.
    pub connections: VecDeque<u64>,
    /// Messages in per second (rounded).
    pub msg_in: VecDeque<u64>,
    /// Messages out per second (rounded).
    pub msg_out: VecDeque<u64>,
    /// Persistence backlog.
    pub backlog: VecDeque<u64>,
    /// Slow consumers.
    pub slow: VecDeque<u64>,
    /// jemalloc allocated bytes.
    pub allocated: VecDeque<u64>,
    /// Process RSS bytes.
    pub rss: VecDeque<u64>,
}

fn push(series: &mut VecDeque<u64>, v: u64) {
    if series.len() == HISTORY_LEN {
        series.pop_front();
    }
    series.push_back(v);
}

impl History {
    /// Appends one overview sample to every series.
    pub fn record(&mut self, o: &Overview) {
        push(&mut self.connections, o.connections);
        push(&mut self.msg_in, o.msg_rate_in.max(0.0).round() as u64);
        push(&mut self.msg_out, o.msg_rate_out.max(0.0).round() as u64);
        push(&mut self.backlog, o.persist_backlog);
        push(&mut self.slow, o.slow_consumers);
        push(
            &mut self.allocated,
            o.memory.as_ref().map_or(0, |m| m.allocated),
        );
        push(&mut self.rss, o.process.rss_bytes);
    }
}

/// Something that happened to a slow consumer, seen between two polls.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowEvent {
    /// When the console saw it.
    pub at: Instant,
    /// What happened.
    pub text: String,
}

/// Slow consumers of one node, with growth between polls.
#[derive(Debug, Clone, Default)]
pub struct SlowState {
    /// The latest response.
    pub fetched: Fetched<SlowConsumers>,
    /// Queue growth in bytes per second since the previous poll, by conn id.
    pub growth: HashMap<u64, f64>,
    /// Queued bytes per conn id at the previous poll.
    prev: HashMap<u64, (u64, String)>,
    /// `(marked_total, disconnects_total)` at the previous poll.
    prev_totals: Option<(u64, u64)>,
    /// `(marked_total, disconnects_total)` when the console first saw the node.
    pub first_totals: Option<(u64, u64)>,
    /// Marked and disconnected since the previous poll.
    pub last_delta: (u64, u64),
    /// Recent events, newest last.
    pub events: VecDeque<SlowEvent>,
}

impl SlowState {
    fn event(&mut self, at: Instant, text: String) {
        if self.events.len() == SLOW_EVENTS_LEN {
            self.events.pop_front();
        }
        self.events.push_back(SlowEvent { at, text });
    }

    /// Records a poll: growth per connection, and what changed since the last one.
    pub fn record(&mut self, result: Result<SlowConsumers, ApiError>, now: Instant) {
        let dt = self
            .fetched
            .at
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
            .filter(|d| *d > 0.0);
        let s = match result {
            Ok(s) => s,
            Err(e) => {
                self.fetched.error = Some(e);
                return;
            }
        };
        self.growth.clear();
        let mut seen = HashMap::new();
        for c in &s.slow_consumers {
            match (self.prev.get(&c.conn_id), dt) {
                (Some((q, _)), Some(dt)) => {
                    self.growth
                        .insert(c.conn_id, (c.queued_bytes as f64 - *q as f64) / dt);
                }
                (None, _) if self.prev_totals.is_some() => self.event(
                    now,
                    format!(
                        "conn {} ({}) marked slow, {} queued",
                        c.conn_id,
                        display_user(&c.user_id),
                        crate::fmt::bytes(c.queued_bytes)
                    ),
                ),
                _ => {}
            }
            seen.insert(c.conn_id, (c.queued_bytes, c.user_id.clone()));
        }
        let totals = (s.marked_total, s.disconnects_total);
        if let Some((m0, d0)) = self.prev_totals {
            let delta = (totals.0.saturating_sub(m0), totals.1.saturating_sub(d0));
            self.last_delta = delta;
            let gone: Vec<(u64, String)> = self
                .prev
                .iter()
                .filter(|(id, _)| !seen.contains_key(id))
                .map(|(id, (_, u))| (*id, u.clone()))
                .collect();
            let mut gone = gone;
            gone.sort();
            for (id, user) in gone {
                let what = if delta.1 > 0 {
                    "left the list; the node disconnected slow consumers"
                } else {
                    "left the list (drained below the soft mark, or closed)"
                };
                self.event(now, format!("conn {id} ({}) {what}", display_user(&user)));
            }
            if delta.1 > 0 {
                self.event(
                    now,
                    format!(
                        "node disconnected {} slow consumer(s) (hard mark or write timeout)",
                        delta.1
                    ),
                );
            }
        } else {
            self.first_totals = Some(totals);
        }
        self.prev_totals = Some(totals);
        self.prev = seen;
        self.fetched.set(Ok(s), now);
    }
}

/// Shows an empty user id (not logged in yet) as `-`.
pub fn display_user(u: &str) -> &str {
    if u.is_empty() {
        "-"
    } else {
        u
    }
}

/// Which profiler the Profile view shows and captures with (`t` toggles).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProfileKind {
    /// CPU samples (`GET /admin/v1/profile/cpu`).
    #[default]
    Cpu,
    /// In-use heap bytes (`GET /admin/v1/profile/heap`).
    Heap,
}

impl ProfileKind {
    /// `CPU` or `heap`, as titles say it.
    pub fn label(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "CPU",
            ProfileKind::Heap => "heap",
        }
    }

    /// The other one.
    pub fn toggled(self) -> ProfileKind {
        match self {
            ProfileKind::Cpu => ProfileKind::Heap,
            ProfileKind::Heap => ProfileKind::Cpu,
        }
    }
}

/// One function of a profile's top list: samples (CPU) or in-use bytes (heap).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopRow {
    /// Demangled name.
    pub function: String,
    /// Samples or bytes with this function innermost.
    pub self_value: u64,
    /// Samples or bytes with this function anywhere on the stack.
    pub total_value: u64,
}

impl From<TopFunction> for TopRow {
    fn from(t: TopFunction) -> Self {
        TopRow {
            function: t.function,
            self_value: t.self_samples,
            total_value: t.total_samples,
        }
    }
}

impl From<HeapTopFunction> for TopRow {
    fn from(t: HeapTopFunction) -> Self {
        TopRow {
            function: t.function,
            self_value: t.self_bytes,
            total_value: t.total_bytes,
        }
    }
}

/// A finished capture, as the console keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileResult {
    /// CPU or heap.
    pub kind: ProfileKind,
    /// Capture length in seconds.
    pub seconds: f64,
    /// Sampling frequency in Hz (CPU; 0 for heap).
    pub frequency: u64,
    /// Samples taken (CPU) or allocation stacks sampled (heap).
    pub samples: u64,
    /// What the top list's shares are of: samples (CPU) or estimated in-use bytes (heap).
    pub total: u64,
    /// Functions by self samples or bytes.
    pub top: Vec<TopRow>,
    /// Where the SVG was saved.
    pub svg_path: Option<PathBuf>,
    /// Where the pprof file was saved.
    pub pprof_path: Option<PathBuf>,
    /// Why saving failed, if it did.
    pub save_error: Option<String>,
}

/// One profile (CPU or heap) of one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ProfileState {
    /// Nothing captured yet.
    #[default]
    Idle,
    /// A capture is running.
    Running {
        /// When the request went out.
        started: Instant,
        /// Capture length.
        seconds: u64,
        /// Sampling frequency (CPU; 0 for heap).
        frequency: u64,
    },
    /// The last capture finished.
    Done(Box<ProfileResult>),
    /// The last capture failed.
    Failed(String),
}

/// Everything known about one node.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// Base URL of its admin API.
    pub url: String,
    /// Whether it answers.
    pub health: Health,
    /// Latest overview.
    pub overview: Fetched<Overview>,
    /// Sparkline series.
    pub history: History,
    /// Connections table (server-sorted).
    pub connections: Fetched<ConnectionList>,
    /// Slow consumers.
    pub slow: SlowState,
    /// Allocator stats.
    pub memory: Fetched<Memory>,
    /// Connections with the largest queues.
    pub top_queued: Fetched<ConnectionList>,
    /// Per-uid log filters.
    pub log_filters: Fetched<LogFilters>,
    /// Log files.
    pub logs: Fetched<Logs>,
    /// CPU profile.
    pub profile: ProfileState,
    /// Heap profile.
    pub heap: ProfileState,
    /// The searched user's diagnosis as this node answered it (Users view).
    pub user: Fetched<UserDiag>,
    /// The webhook endpoints and the outbox (Webhooks view).
    pub webhooks: Fetched<Webhooks>,
    /// The parked webhook events (Webhooks view).
    pub parked: Fetched<ParkedEvents>,
}

impl NodeState {
    /// A node not heard from yet.
    pub fn new(url: impl Into<String>) -> Self {
        NodeState {
            url: url.into(),
            health: Health::Connecting,
            overview: Fetched::default(),
            history: History::default(),
            connections: Fetched::default(),
            slow: SlowState::default(),
            memory: Fetched::default(),
            top_queued: Fetched::default(),
            log_filters: Fetched::default(),
            logs: Fetched::default(),
            profile: ProfileState::Idle,
            heap: ProfileState::Idle,
            user: Fetched::default(),
            webhooks: Fetched::default(),
            parked: Fetched::default(),
        }
    }

    /// The profile of `kind`.
    pub fn profile_of(&self, kind: ProfileKind) -> &ProfileState {
        match kind {
            ProfileKind::Cpu => &self.profile,
            ProfileKind::Heap => &self.heap,
        }
    }

    /// The profile of `kind`, to change.
    pub fn profile_of_mut(&mut self, kind: ProfileKind) -> &mut ProfileState {
        match kind {
            ProfileKind::Cpu => &mut self.profile,
            ProfileKind::Heap => &mut self.heap,
        }
    }

    /// The node's id once known, else its URL without the scheme.
    pub fn name(&self) -> &str {
        match &self.overview.data {
            Some(o) if !o.node_id.is_empty() => &o.node_id,
            _ => self
                .url
                .strip_prefix("http://")
                .unwrap_or(&self.url)
                .trim_end_matches('/'),
        }
    }

    /// The overview, if the node is up now (stale data from a node that went away is not counted).
    pub fn live_overview(&self) -> Option<&Overview> {
        match self.health {
            Health::Up => self.overview.data.as_ref(),
            _ => None,
        }
    }
}

/// Sums over the nodes that answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterSummary {
    /// Nodes configured.
    pub nodes: usize,
    /// Nodes answering.
    pub up: usize,
    /// Connections.
    pub connections: u64,
    /// Messages in per second.
    pub msg_rate_in: f64,
    /// Messages out per second.
    pub msg_rate_out: f64,
    /// Persistence backlog.
    pub persist_backlog: u64,
    /// Slow consumers.
    pub slow_consumers: u64,
    /// More connections the answering nodes can take.
    pub headroom_connections: u64,
}
