//! State: everything the console knows, as plain data, and the functions that change it.
//! API responses come in through [`AppState::on_update`], key actions through
//! [`AppState::apply`] (which returns the side effects to run as [`Command`]s), time
//! through [`AppState::tick`]. Nothing here does I/O or reads a clock, so it is tested
//! directly and the views render from it alone.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::api::{
    ApiError, Connection, ConnectionList, Kicked, LogFilters, Logs, Memory, Overview, Revoked,
    SlowConsumers, TopFunction,
};
use crate::input::Action;

/// Samples kept per series for the sparklines (10 minutes at one per second).
pub const HISTORY_LEN: usize = 600;
/// Rows asked for in the connections table (server-side sorted, then filtered here).
pub const CONNECTIONS_LIMIT: u32 = 2000;
/// Rows asked for in the memory view's "largest queues" table.
pub const TOP_QUEUED_LIMIT: u32 = 20;
/// Slow-consumer events kept.
pub const SLOW_EVENTS_LEN: usize = 50;
/// How long an info message stays on the status line.
pub const INFO_TTL: Duration = Duration::from_secs(10);
/// Levels offered for a per-uid log filter.
pub const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];

/// The console's views, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    /// Node summary, rates, headroom gauges, stage latency.
    Overview,
    /// The connections table.
    Connections,
    /// Slow consumers and what the node did.
    Slow,
    /// Per-stage latency distribution.
    Latency,
    /// Allocator stats and per-connection memory.
    Memory,
    /// CPU profile capture.
    Profile,
    /// Per-uid log filters and log files.
    Logs,
}

impl View {
    /// All views in tab order (number keys 1..7).
    pub const ALL: [View; 7] = [
        View::Overview,
        View::Connections,
        View::Slow,
        View::Latency,
        View::Memory,
        View::Profile,
        View::Logs,
    ];

    /// Tab title.
    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Connections => "Connections",
            View::Slow => "Slow consumers",
            View::Latency => "Latency",
            View::Memory => "Memory",
            View::Profile => "Profile",
            View::Logs => "Logs",
        }
    }

    /// Position in [`View::ALL`].
    pub fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }

    /// The view after this one (wrapping).
    pub fn next(self) -> View {
        View::ALL[(self.index() + 1) % View::ALL.len()]
    }

    /// The view before this one (wrapping).
    pub fn prev(self) -> View {
        View::ALL[(self.index() + View::ALL.len() - 1) % View::ALL.len()]
    }
}

/// Sort columns of the connections table (the server's `sort` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SortKey {
    /// Connection id, ascending by default.
    ConnId,
    /// User id, ascending by default.
    User,
    /// Age, oldest first by default.
    Age,
    /// Queued bytes, largest first by default.
    Queued,
    /// Frames in, largest first by default.
    MsgsIn,
    /// Frames out, largest first by default.
    MsgsOut,
    /// State, ascending by default.
    State,
}

impl SortKey {
    /// Cycle order of `s`.
    pub const ALL: [SortKey; 7] = [
        SortKey::ConnId,
        SortKey::User,
        SortKey::Age,
        SortKey::Queued,
        SortKey::MsgsIn,
        SortKey::MsgsOut,
        SortKey::State,
    ];

    /// The server's name for this key.
    pub fn api_name(self) -> &'static str {
        match self {
            SortKey::ConnId => "conn_id",
            SortKey::User => "user",
            SortKey::Age => "age",
            SortKey::Queued => "queued",
            SortKey::MsgsIn => "msgs_in",
            SortKey::MsgsOut => "msgs_out",
            SortKey::State => "state",
        }
    }

    /// The next key in the cycle.
    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    /// The server's `sort` parameter for this key, reversed or not.
    pub fn param(self, reversed: bool) -> String {
        if reversed {
            format!("-{}", self.api_name())
        } else {
            self.api_name().to_owned()
        }
    }

    /// Orders rows the way the server does for this key (numbers largest first).
    pub fn sort(self, rows: &mut [&Connection], reversed: bool) {
        match self {
            SortKey::ConnId => rows.sort_by_key(|c| c.conn_id),
            SortKey::User => {
                rows.sort_by(|a, b| a.user_id.cmp(&b.user_id).then(a.conn_id.cmp(&b.conn_id)))
            }
            SortKey::Age => rows.sort_by(|a, b| b.age_secs.total_cmp(&a.age_secs)),
            SortKey::Queued => rows.sort_by_key(|c| std::cmp::Reverse(c.queued_bytes)),
            SortKey::MsgsIn => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_in)),
            SortKey::MsgsOut => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_out)),
            SortKey::State => {
                rows.sort_by(|a, b| a.state.cmp(&b.state).then(a.conn_id.cmp(&b.conn_id)))
            }
        }
        if reversed {
            rows.reverse();
        }
    }
}

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

/// A finished capture, as the console keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileResult {
    /// Capture length in seconds.
    pub seconds: f64,
    /// Sampling frequency in Hz.
    pub frequency: u64,
    /// Samples taken.
    pub samples: u64,
    /// Functions by samples.
    pub top: Vec<TopFunction>,
    /// Where the SVG was saved.
    pub svg_path: Option<PathBuf>,
    /// Where the pprof file was saved.
    pub pprof_path: Option<PathBuf>,
    /// Why saving failed, if it did.
    pub save_error: Option<String>,
}

/// The CPU profile of one node.
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
        /// Sampling frequency.
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

/// One field of a form.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Label shown left of the value.
    pub label: &'static str,
    /// Current text.
    pub value: String,
    /// When set, the value is picked from these with left/right instead of typed.
    pub choices: Option<&'static [&'static str]>,
}

/// What a form is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormKind {
    /// Add a per-uid log filter: uid, level, ttl.
    LogFilter,
    /// Start a CPU capture: seconds, frequency, folder.
    Profile,
    /// Set the node's global log level.
    GlobalLevel,
}

/// A small form in a popup.
#[derive(Debug, Clone, PartialEq)]
pub struct Form {
    /// What submitting does.
    pub kind: FormKind,
    /// The fields, top to bottom.
    pub fields: Vec<Field>,
    /// The field being edited.
    pub focus: usize,
    /// Validation error of the last submit.
    pub error: Option<String>,
}

impl Form {
    /// The log-filter form, empty uid, `debug`, 600 s.
    pub fn log_filter() -> Form {
        Form {
            kind: FormKind::LogFilter,
            fields: vec![
                Field {
                    label: "user id",
                    value: String::new(),
                    choices: None,
                },
                Field {
                    label: "level",
                    value: "debug".into(),
                    choices: Some(LEVELS),
                },
                Field {
                    label: "ttl (seconds)",
                    value: "600".into(),
                    choices: None,
                },
            ],
            focus: 0,
            error: None,
        }
    }

    /// The global-level form, prefilled with the level in force.
    pub fn global_level(current: &str) -> Form {
        Form {
            kind: FormKind::GlobalLevel,
            fields: vec![Field {
                label: "global level",
                value: current.to_owned(),
                choices: None,
            }],
            focus: 0,
            error: None,
        }
    }

    /// The capture form, prefilled from the last settings.
    pub fn profile(p: &ProfileSettings) -> Form {
        Form {
            kind: FormKind::Profile,
            fields: vec![
                Field {
                    label: "seconds",
                    value: p.seconds.to_string(),
                    choices: None,
                },
                Field {
                    label: "frequency (Hz)",
                    value: p.frequency.to_string(),
                    choices: None,
                },
                Field {
                    label: "save to folder",
                    value: p.dir.display().to_string(),
                    choices: None,
                },
            ],
            focus: 0,
            error: None,
        }
    }

    fn value(&self, i: usize) -> &str {
        self.fields.get(i).map_or("", |f| f.value.trim())
    }
}

/// The last CPU capture settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSettings {
    /// Capture length (1..=300 s).
    pub seconds: u64,
    /// Sampling frequency (1..=1000 Hz).
    pub frequency: u64,
    /// Folder the SVG and pprof files go to.
    pub dir: PathBuf,
}

impl Default for ProfileSettings {
    fn default() -> Self {
        ProfileSettings {
            seconds: 10,
            frequency: 99,
            dir: PathBuf::from("."),
        }
    }
}

/// What keys do right now.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Browsing.
    Normal,
    /// The help overlay.
    Help,
    /// Typing the table filter after `/`.
    Filter,
    /// Asking before kicking a connection.
    ConfirmKick {
        /// Node index.
        node: usize,
        /// The connection.
        conn: Connection,
    },
    /// Asking before revoking a user's tokens.
    ConfirmRevoke {
        /// Node index.
        node: usize,
        /// The user.
        user: String,
    },
    /// Choosing a node.
    NodePicker {
        /// Highlighted node.
        cursor: usize,
    },
    /// Filling in a form.
    Form(Form),
}

/// How bad a status-line message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Confirmation of something done.
    Info,
    /// Something did not work.
    Error,
}

/// The status line.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// The message.
    pub text: String,
    /// Info or error.
    pub level: Level,
    /// When it was set.
    pub at: Instant,
}

/// A side effect for the app to run; its result comes back as an [`Update`].
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `DELETE /admin/v1/connections/{conn_id}`.
    Kick {
        /// Node index.
        node: usize,
        /// Connection id.
        conn_id: u64,
    },
    /// `POST /admin/v1/users/{uid}/revoke`.
    Revoke {
        /// Node index.
        node: usize,
        /// User id.
        user: String,
    },
    /// `PUT /admin/v1/log-filters/{uid}`.
    SetLogFilter {
        /// Node index.
        node: usize,
        /// User id.
        uid: String,
        /// Level.
        level: String,
        /// TTL in seconds.
        ttl_secs: u64,
    },
    /// `DELETE /admin/v1/log-filters/{uid}`.
    DeleteLogFilter {
        /// Node index.
        node: usize,
        /// User id.
        uid: String,
    },
    /// `PUT /admin/v1/log-level`.
    SetGlobalLevel {
        /// Node index.
        node: usize,
        /// EnvFilter string.
        level: String,
    },
    /// Capture a CPU profile and save it.
    Profile {
        /// Node index.
        node: usize,
        /// Capture length.
        seconds: u64,
        /// Frequency.
        frequency: u64,
        /// Folder for the files.
        dir: PathBuf,
    },
    /// Poll everything now.
    Refresh,
}

/// A result from a poller or a command, for one node.
#[derive(Debug, Clone)]
pub enum Update {
    /// Overview poll (boxed: it is by far the largest answer).
    Overview(Result<Box<Overview>, ApiError>),
    /// Connections poll.
    Connections(Result<ConnectionList, ApiError>),
    /// Slow-consumers poll.
    Slow(Result<SlowConsumers, ApiError>),
    /// Memory poll.
    Memory(Result<Memory, ApiError>),
    /// Largest-queues poll (memory view).
    TopQueued(Result<ConnectionList, ApiError>),
    /// Log filters poll.
    LogFilters(Result<LogFilters, ApiError>),
    /// Log files poll.
    Logs(Result<Logs, ApiError>),
    /// A kick finished.
    Kicked {
        /// The connection asked for.
        conn_id: u64,
        /// The result.
        result: Result<Kicked, ApiError>,
    },
    /// A revocation finished.
    Revoked {
        /// The user asked for.
        user: String,
        /// The result.
        result: Result<Revoked, ApiError>,
    },
    /// A filter was set (or not).
    FilterSet {
        /// User id.
        uid: String,
        /// Level.
        level: String,
        /// TTL.
        ttl_secs: u64,
        /// The result.
        result: Result<(), ApiError>,
    },
    /// A filter was removed (or not).
    FilterDeleted {
        /// User id.
        uid: String,
        /// The result.
        result: Result<(), ApiError>,
    },
    /// The global level was set (or not); `Ok` holds the level in force.
    GlobalLevelSet(Result<String, ApiError>),
    /// A capture finished (and was saved, or not).
    Profile(Result<ProfileResult, ApiError>),
}

/// What the pollers fetch for a node besides the overview.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Connections with this `sort` parameter.
    pub connections: Option<String>,
    /// Slow consumers.
    pub slow: bool,
    /// Memory stats and the largest queues.
    pub memory: bool,
    /// Log filters and log files.
    pub logs: bool,
    /// Bumped to ask for an immediate poll.
    pub generation: u64,
}

/// The whole console.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The nodes, in `--url` order.
    pub nodes: Vec<NodeState>,
    /// Index of the node the views show.
    pub selected: usize,
    /// The view shown.
    pub view: View,
    /// What keys do.
    pub mode: Mode,
    /// The status line.
    pub status: Option<Status>,
    /// Filter text of the current table (`/`).
    pub filter: String,
    /// Selected row per view.
    pub cursor: [usize; View::ALL.len()],
    /// Connections sort column.
    pub sort: SortKey,
    /// Connections sort reversed.
    pub sort_reversed: bool,
    /// Latency bars on a log scale (else linear).
    pub latency_log_scale: bool,
    /// Last capture settings.
    pub profile_settings: ProfileSettings,
    /// Set by `q`.
    pub quit: bool,
    /// The time views measure ages against (set by `tick` and every update).
    pub now: Instant,
    /// Bumped by `r` to poll now.
    pub refresh_generation: u64,
}

impl AppState {
    /// A console for these node URLs, at time `now`.
    pub fn new(urls: impl IntoIterator<Item = String>, now: Instant) -> Self {
        AppState {
            nodes: urls.into_iter().map(NodeState::new).collect(),
            selected: 0,
            view: View::Overview,
            mode: Mode::Normal,
            status: None,
            filter: String::new(),
            cursor: [0; View::ALL.len()],
            sort: SortKey::ConnId,
            sort_reversed: false,
            latency_log_scale: true,
            profile_settings: ProfileSettings::default(),
            quit: false,
            now,
            refresh_generation: 0,
        }
    }

    /// The node the views show.
    pub fn node(&self) -> Option<&NodeState> {
        self.nodes.get(self.selected)
    }

    fn node_mut(&mut self) -> Option<&mut NodeState> {
        self.nodes.get_mut(self.selected)
    }

    /// Sets an info message.
    pub fn info(&mut self, text: impl Into<String>) {
        self.status = Some(Status {
            text: text.into(),
            level: Level::Info,
            at: self.now,
        });
    }

    /// Sets an error message.
    pub fn error(&mut self, text: impl Into<String>) {
        self.status = Some(Status {
            text: text.into(),
            level: Level::Error,
            at: self.now,
        });
    }

    /// Advances the clock; info messages expire.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
        if let Some(s) = &self.status {
            if s.level == Level::Info && now.saturating_duration_since(s.at) > INFO_TTL {
                self.status = None;
            }
        }
    }

    /// What to poll for `node` besides its overview, given the view shown.
    pub fn plan(&self, node: usize) -> Plan {
        let mut p = Plan {
            generation: self.refresh_generation,
            ..Plan::default()
        };
        if node != self.selected {
            return p;
        }
        match self.view {
            View::Connections => p.connections = Some(self.sort.param(self.sort_reversed)),
            View::Slow => p.slow = true,
            View::Memory => p.memory = true,
            View::Logs => p.logs = true,
            View::Overview | View::Latency | View::Profile => {}
        }
        p
    }

    /// The connections table as shown: filtered by `/` text, sorted by the sort column.
    pub fn visible_connections(&self) -> Vec<&Connection> {
        let Some(list) = self.node().and_then(|n| n.connections.data.as_ref()) else {
            return Vec::new();
        };
        let mut rows: Vec<&Connection> = list
            .connections
            .iter()
            .filter(|c| matches_filter(c, &self.filter))
            .collect();
        self.sort.sort(&mut rows, self.sort_reversed);
        rows
    }

    /// The slow consumers as shown (filtered by `/` text, largest queue first).
    pub fn visible_slow(&self) -> Vec<&Connection> {
        let Some(s) = self.node().and_then(|n| n.slow.fetched.data.as_ref()) else {
            return Vec::new();
        };
        let mut rows: Vec<&Connection> = s
            .slow_consumers
            .iter()
            .filter(|c| matches_filter(c, &self.filter))
            .collect();
        SortKey::Queued.sort(&mut rows, false);
        rows
    }

    /// The log filters as shown (filtered by `/` text, by uid).
    pub fn visible_log_filters(&self) -> Vec<&crate::api::LogFilter> {
        let Some(f) = self.node().and_then(|n| n.log_filters.data.as_ref()) else {
            return Vec::new();
        };
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<_> = f
            .filters
            .iter()
            .filter(|f| needle.is_empty() || f.uid.to_lowercase().contains(&needle))
            .collect();
        rows.sort_by(|a, b| a.uid.cmp(&b.uid));
        rows
    }

    /// The profile's top functions as shown (filtered by `/` text).
    pub fn visible_top(&self) -> Vec<&TopFunction> {
        let Some(ProfileState::Done(r)) = self.node().map(|n| &n.profile) else {
            return Vec::new();
        };
        let needle = self.filter.to_lowercase();
        r.top
            .iter()
            .filter(|t| needle.is_empty() || t.function.to_lowercase().contains(&needle))
            .collect()
    }

    /// Rows in the current view's selectable list.
    fn rows_in_view(&self) -> usize {
        match self.view {
            View::Connections => self.visible_connections().len(),
            View::Slow => self.visible_slow().len(),
            View::Logs => self.visible_log_filters().len(),
            View::Profile => self.visible_top().len(),
            View::Overview | View::Latency | View::Memory => 0,
        }
    }

    /// The selected row of the current view, clamped to the rows there are.
    pub fn cursor(&self) -> usize {
        let n = self.rows_in_view();
        self.cursor[self.view.index()].min(n.saturating_sub(1))
    }

    fn move_cursor(&mut self, delta: isize) {
        let n = self.rows_in_view();
        let i = self.view.index();
        let cur = self.cursor[i].min(n.saturating_sub(1)) as isize;
        self.cursor[i] = (cur + delta).clamp(0, n.saturating_sub(1) as isize) as usize;
    }

    fn set_view(&mut self, v: View) {
        if v != self.view {
            self.view = v;
            self.filter.clear();
        }
    }

    fn select_node(&mut self, i: usize) {
        if i < self.nodes.len() && i != self.selected {
            self.selected = i;
            self.cursor = [0; View::ALL.len()];
            let name = self.nodes[i].name().to_owned();
            self.info(format!("node {name} ({}/{})", i + 1, self.nodes.len()));
        }
    }

    /// Applies one key action; returns the side effects to run.
    pub fn apply(&mut self, action: Action) -> Vec<Command> {
        let mode = std::mem::replace(&mut self.mode, Mode::Normal);
        match mode {
            Mode::Normal => self.apply_normal(action),
            Mode::Help => {
                if !matches!(
                    action,
                    Action::ToggleHelp | Action::Cancel | Action::Quit | Action::Submit
                ) {
                    self.mode = Mode::Help;
                }
                Vec::new()
            }
            Mode::Filter => {
                match action {
                    Action::Char(c) => self.filter.push(c),
                    Action::Backspace => {
                        self.filter.pop();
                    }
                    Action::Submit => {}
                    Action::Cancel => self.filter.clear(),
                    _ => {}
                }
                if !matches!(action, Action::Submit | Action::Cancel) {
                    self.mode = Mode::Filter;
                }
                self.cursor[self.view.index()] = 0;
                Vec::new()
            }
            Mode::ConfirmKick { node, conn } => match action {
                Action::Confirm | Action::Submit => {
                    self.info(format!(
                        "kicking conn {} ({})…",
                        conn.conn_id,
                        display_user(&conn.user_id)
                    ));
                    vec![Command::Kick {
                        node,
                        conn_id: conn.conn_id,
                    }]
                }
                Action::Cancel | Action::Quit => {
                    self.info("kick cancelled");
                    Vec::new()
                }
                _ => {
                    self.mode = Mode::ConfirmKick { node, conn };
                    Vec::new()
                }
            },
            Mode::ConfirmRevoke { node, user } => match action {
                Action::Confirm | Action::Submit => {
                    self.info(format!("revoking {user}…"));
                    vec![Command::Revoke { node, user }]
                }
                Action::Cancel | Action::Quit => {
                    self.info("revoke cancelled");
                    Vec::new()
                }
                _ => {
                    self.mode = Mode::ConfirmRevoke { node, user };
                    Vec::new()
                }
            },
            Mode::NodePicker { cursor } => {
                let n = self.nodes.len();
                match action {
                    Action::Down => {
                        self.mode = Mode::NodePicker {
                            cursor: (cursor + 1).min(n.saturating_sub(1)),
                        }
                    }
                    Action::Up => {
                        self.mode = Mode::NodePicker {
                            cursor: cursor.saturating_sub(1),
                        }
                    }
                    Action::Top => self.mode = Mode::NodePicker { cursor: 0 },
                    Action::Bottom => {
                        self.mode = Mode::NodePicker {
                            cursor: n.saturating_sub(1),
                        }
                    }
                    Action::Submit => self.select_node(cursor),
                    Action::PickNode(i) => self.select_node(i),
                    Action::Cancel | Action::NodePicker | Action::Quit => {}
                    _ => self.mode = Mode::NodePicker { cursor },
                }
                Vec::new()
            }
            Mode::Form(form) => self.apply_form(form, action),
        }
    }

    fn apply_normal(&mut self, action: Action) -> Vec<Command> {
        match action {
            Action::Quit => self.quit = true,
            Action::ToggleHelp => self.mode = Mode::Help,
            Action::NextView => self.set_view(self.view.next()),
            Action::PrevView => self.set_view(self.view.prev()),
            Action::GoView(v) => self.set_view(v),
            Action::NextNode if !self.nodes.is_empty() => {
                self.select_node((self.selected + 1) % self.nodes.len());
            }
            Action::PrevNode if !self.nodes.is_empty() => {
                let n = self.nodes.len();
                self.select_node((self.selected + n - 1) % n);
            }
            Action::NodePicker => {
                self.mode = Mode::NodePicker {
                    cursor: self.selected,
                }
            }
            Action::Down => self.move_cursor(1),
            Action::Up => self.move_cursor(-1),
            Action::PageDown => self.move_cursor(20),
            Action::PageUp => self.move_cursor(-20),
            Action::Top => self.cursor[self.view.index()] = 0,
            Action::Bottom => self.cursor[self.view.index()] = usize::MAX,
            Action::StartFilter => {
                if matches!(
                    self.view,
                    View::Connections | View::Slow | View::Logs | View::Profile
                ) {
                    self.mode = Mode::Filter;
                } else {
                    self.info(
                        "/ filters the tables of Connections, Slow consumers, Profile and Logs",
                    );
                }
            }
            Action::Cancel if !self.filter.is_empty() => {
                self.filter.clear();
                self.info("filter cleared");
            }
            Action::Sort if self.view == View::Connections => {
                self.sort = self.sort.next();
                self.sort_reversed = false;
                self.info(format!("sorted by {}", self.sort.api_name()));
            }
            Action::ReverseSort if self.view == View::Connections => {
                self.sort_reversed = !self.sort_reversed;
                self.info(format!(
                    "sorted by {}{}",
                    self.sort.api_name(),
                    if self.sort_reversed {
                        " (reversed)"
                    } else {
                        ""
                    }
                ));
            }
            Action::ToggleScale if self.view == View::Latency => {
                self.latency_log_scale = !self.latency_log_scale;
            }
            Action::Refresh => {
                self.refresh_generation += 1;
                self.info("refreshing…");
                return vec![Command::Refresh];
            }
            Action::Delete => return self.delete_selected(),
            Action::Revoke if matches!(self.view, View::Connections | View::Slow) => {
                self.revoke_selected()
            }
            Action::Add if self.view == View::Logs => {
                self.mode = Mode::Form(Form::log_filter());
            }
            Action::GlobalLevel if self.view == View::Logs => {
                let current = self
                    .node()
                    .and_then(|n| n.log_filters.data.as_ref())
                    .map_or("info".to_owned(), |f| f.global_level.clone());
                self.mode = Mode::Form(Form::global_level(&current));
            }
            Action::Add if self.view == View::Profile => self.start_profile_form(),
            Action::Submit if self.view == View::Profile => self.start_profile_form(),
            _ => {}
        }
        Vec::new()
    }

    fn start_profile_form(&mut self) {
        if let Some(ProfileState::Running { .. }) = self.node().map(|n| &n.profile) {
            self.error("a capture is already running on this node");
            return;
        }
        self.mode = Mode::Form(Form::profile(&self.profile_settings));
    }

    /// Asks before revoking the selected connection's user.
    fn revoke_selected(&mut self) {
        let rows = if self.view == View::Connections {
            self.visible_connections()
        } else {
            self.visible_slow()
        };
        let user = rows.get(self.cursor()).map(|c| c.user_id.clone());
        match user {
            Some(user) if !user.is_empty() => {
                self.mode = Mode::ConfirmRevoke {
                    node: self.selected,
                    user,
                };
            }
            Some(_) => self.error("the selected connection has not logged in"),
            None => self.error("no connection selected"),
        }
    }

    fn delete_selected(&mut self) -> Vec<Command> {
        let node = self.selected;
        let cursor = self.cursor();
        match self.view {
            View::Connections | View::Slow => {
                let rows = if self.view == View::Connections {
                    self.visible_connections()
                } else {
                    self.visible_slow()
                };
                match rows.get(cursor) {
                    Some(c) => {
                        let conn = (*c).clone();
                        self.mode = Mode::ConfirmKick { node, conn };
                    }
                    None => self.error("no connection selected"),
                }
                Vec::new()
            }
            View::Logs => match self.visible_log_filters().get(cursor) {
                Some(f) => {
                    let uid = f.uid.clone();
                    self.info(format!("removing log filter for {uid}…"));
                    vec![Command::DeleteLogFilter { node, uid }]
                }
                None => {
                    self.error("no log filter selected");
                    Vec::new()
                }
            },
            _ => Vec::new(),
        }
    }

    fn apply_form(&mut self, mut form: Form, action: Action) -> Vec<Command> {
        let n = form.fields.len();
        match action {
            Action::Cancel => return Vec::new(),
            Action::NextField | Action::Down => form.focus = (form.focus + 1) % n,
            Action::PrevField | Action::Up => form.focus = (form.focus + n - 1) % n,
            Action::Left | Action::Right => {
                if let Some(f) = form.fields.get_mut(form.focus) {
                    if let Some(choices) = f.choices {
                        let i = choices.iter().position(|c| *c == f.value).unwrap_or(0);
                        let j = if action == Action::Right {
                            (i + 1) % choices.len()
                        } else {
                            (i + choices.len() - 1) % choices.len()
                        };
                        f.value = choices[j].to_owned();
                    }
                }
            }
            Action::Char(c) => {
                if let Some(f) = form.fields.get_mut(form.focus) {
                    match f.choices {
                        // Typing the first letter of a choice picks it.
                        Some(choices) => {
                            if let Some(ch) = choices.iter().find(|x| x.starts_with(c)) {
                                f.value = (*ch).to_owned();
                            }
                        }
                        None => f.value.push(c),
                    }
                }
            }
            Action::Backspace => {
                if let Some(f) = form.fields.get_mut(form.focus) {
                    if f.choices.is_none() {
                        f.value.pop();
                    }
                }
            }
            Action::Submit => match self.submit(&form) {
                Ok(cmds) => return cmds,
                Err(e) => form.error = Some(e),
            },
            _ => {}
        }
        self.mode = Mode::Form(form);
        Vec::new()
    }

    fn submit(&mut self, form: &Form) -> Result<Vec<Command>, String> {
        let node = self.selected;
        match form.kind {
            FormKind::LogFilter => {
                let uid = form.value(0).to_owned();
                if uid.is_empty() {
                    return Err("user id is empty".into());
                }
                let level = form.value(1).to_owned();
                if !LEVELS.contains(&level.as_str()) {
                    return Err(format!("level must be one of {}", LEVELS.join(", ")));
                }
                let ttl_secs = parse_in(form.value(2), "ttl", 1, 7 * 24 * 3600)?;
                self.info(format!("setting log filter {uid}={level} for {ttl_secs}s…"));
                Ok(vec![Command::SetLogFilter {
                    node,
                    uid,
                    level,
                    ttl_secs,
                }])
            }
            FormKind::GlobalLevel => {
                let level = form.value(0).to_owned();
                if level.is_empty() {
                    return Err("level is empty".into());
                }
                self.info(format!("setting global level {level}…"));
                Ok(vec![Command::SetGlobalLevel { node, level }])
            }
            FormKind::Profile => {
                let seconds = parse_in(form.value(0), "seconds", 1, 300)?;
                let frequency = parse_in(form.value(1), "frequency", 1, 1000)?;
                let dir = form.value(2);
                if dir.is_empty() {
                    return Err("folder is empty".into());
                }
                let dir = PathBuf::from(dir);
                self.profile_settings = ProfileSettings {
                    seconds,
                    frequency,
                    dir: dir.clone(),
                };
                let now = self.now;
                if let Some(n) = self.node_mut() {
                    n.profile = ProfileState::Running {
                        started: now,
                        seconds,
                        frequency,
                    };
                }
                self.info(format!("capturing {seconds}s at {frequency} Hz…"));
                Ok(vec![Command::Profile {
                    node,
                    seconds,
                    frequency,
                    dir,
                }])
            }
        }
    }

    /// Records a poll or command result for node `node`.
    pub fn on_update(&mut self, node: usize, update: Update, now: Instant) {
        self.now = now;
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        let name = n.name().to_owned();
        let mut message: Option<(Level, String)> = None;
        match update {
            Update::Overview(r) => {
                match &r {
                    Ok(o) => {
                        n.history.record(o);
                        if matches!(
                            n.health,
                            Health::Unreachable { .. } | Health::Failing { .. }
                        ) {
                            message = Some((Level::Info, format!("node {name} is back")));
                        }
                        n.health = Health::Up;
                    }
                    Err(e) if e.is_unreachable() => {
                        if !matches!(n.health, Health::Unreachable { .. }) {
                            if n.health == Health::Up {
                                message =
                                    Some((Level::Error, format!("node {name} unreachable: {e}")));
                            }
                            n.health = Health::Unreachable {
                                error: e.to_string(),
                                since: now,
                            };
                        } else if let Health::Unreachable { error, .. } = &mut n.health {
                            *error = e.to_string();
                        }
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if n.health
                            != (Health::Failing {
                                error: text.clone(),
                            })
                        {
                            message = Some((Level::Error, format!("node {name}: {text}")));
                        }
                        n.health = Health::Failing { error: text };
                    }
                }
                n.overview.set(r.map(|o| *o), now);
            }
            Update::Connections(r) => n.connections.set(r, now),
            Update::Slow(r) => n.slow.record(r, now),
            Update::Memory(r) => n.memory.set(r, now),
            Update::TopQueued(r) => n.top_queued.set(r, now),
            Update::LogFilters(r) => n.log_filters.set(r, now),
            Update::Logs(r) => n.logs.set(r, now),
            Update::Kicked { conn_id, result } => {
                message = Some(match result {
                    Ok(_) => {
                        if let Some(list) = &mut n.connections.data {
                            list.connections.retain(|c| c.conn_id != conn_id);
                        }
                        (
                            Level::Info,
                            format!("kicked conn {conn_id} on {name} (close code 4002)"),
                        )
                    }
                    Err(e) => (Level::Error, format!("kick conn {conn_id} failed: {e}")),
                });
            }
            Update::Revoked { user, result } => {
                message = Some(match result {
                    Ok(r) => {
                        if let Some(list) = &mut n.connections.data {
                            list.connections.retain(|c| c.user_id != user);
                        }
                        (
                            Level::Info,
                            format!(
                                "revoked {user} on {name}: {} sessions closed (4003), older tokens refused",
                                r.closed
                            ),
                        )
                    }
                    Err(e) => (Level::Error, format!("revoke {user} failed: {e}")),
                });
            }
            Update::FilterSet {
                uid,
                level,
                ttl_secs,
                result,
            } => {
                message = Some(match result {
                    Ok(()) => (
                        Level::Info,
                        format!("log filter set on {name}: {uid} at {level} for {ttl_secs}s"),
                    ),
                    Err(e) => (Level::Error, format!("set log filter {uid} failed: {e}")),
                });
            }
            Update::FilterDeleted { uid, result } => {
                message = Some(match result {
                    Ok(()) => {
                        if let Some(f) = &mut n.log_filters.data {
                            f.filters.retain(|f| f.uid != uid);
                        }
                        (
                            Level::Info,
                            format!("log filter for {uid} removed on {name}"),
                        )
                    }
                    Err(e) => (Level::Error, format!("remove log filter {uid} failed: {e}")),
                });
            }
            Update::GlobalLevelSet(r) => {
                message = Some(match r {
                    Ok(level) => {
                        if let Some(f) = &mut n.log_filters.data {
                            f.global_level = level.clone();
                        }
                        (
                            Level::Info,
                            format!("global level on {name} is now {level}"),
                        )
                    }
                    Err(e) => (Level::Error, format!("set global level failed: {e}")),
                });
            }
            Update::Profile(r) => match r {
                Ok(p) => {
                    message = Some(match (&p.save_error, &p.svg_path) {
                        (Some(e), _) => (Level::Error, format!("profile captured, not saved: {e}")),
                        (None, Some(svg)) => (
                            Level::Info,
                            format!("profile saved: {} (+ .pb.gz)", svg.display()),
                        ),
                        (None, None) => (Level::Info, "profile captured".to_owned()),
                    });
                    n.profile = ProfileState::Done(Box::new(p));
                }
                Err(e) => {
                    let text = match &e {
                        ApiError::Status {
                            status: 409,
                            message,
                        } => {
                            format!("a capture is already running on {name} (409): {message}")
                        }
                        ApiError::RouteMissing { .. } => {
                            format!("{name} has no profile route yet (404 no such route)")
                        }
                        _ => format!("profile on {name} failed: {e}"),
                    };
                    message = Some((Level::Error, text.clone()));
                    n.profile = ProfileState::Failed(text);
                }
            },
        }
        if let Some((level, text)) = message {
            match level {
                Level::Info => self.info(text),
                Level::Error => self.error(text),
            }
        }
    }

    /// Totals across the nodes that are up, for the cluster summary row.
    pub fn cluster(&self) -> ClusterSummary {
        let mut s = ClusterSummary {
            nodes: self.nodes.len(),
            ..ClusterSummary::default()
        };
        for n in &self.nodes {
            let Some(o) = n.live_overview() else {
                continue;
            };
            s.up += 1;
            s.connections += o.connections;
            s.msg_rate_in += o.msg_rate_in;
            s.msg_rate_out += o.msg_rate_out;
            s.persist_backlog += o.persist_backlog;
            s.slow_consumers += o.slow_consumers;
            s.headroom_connections += o.capacity.headroom_connections;
        }
        s
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

/// Case-insensitive substring match on user, remote, state and conn id.
pub fn matches_filter(c: &Connection, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let f = filter.to_lowercase();
    c.user_id.to_lowercase().contains(&f)
        || c.remote.to_lowercase().contains(&f)
        || c.state.to_lowercase().contains(&f)
        || c.conn_id.to_string() == f
}

fn parse_in(text: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("{what} must be a whole number from {lo} to {hi}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: u64, user: &str, queued: u64) -> Connection {
        Connection {
            conn_id: id,
            user_id: user.into(),
            remote: format!("127.0.0.1:{}", 5000 + id),
            queued_bytes: queued,
            state: "active".into(),
            ..Connection::default()
        }
    }

    fn with_conns(rows: Vec<Connection>) -> AppState {
        let now = Instant::now();
        let mut s = AppState::new(["http://a:1".to_owned()], now);
        s.on_update(
            0,
            Update::Connections(Ok(ConnectionList {
                total: rows.len() as u64,
                connections: rows,
            })),
            now,
        );
        s.apply(Action::GoView(View::Connections));
        s
    }

    #[test]
    fn kick_needs_confirmation() {
        let mut s = with_conns(vec![conn(1, "alice", 0), conn(2, "bob", 0)]);
        s.apply(Action::Down);
        assert!(s.apply(Action::Delete).is_empty());
        assert!(matches!(&s.mode, Mode::ConfirmKick { conn, .. } if conn.conn_id == 2));
        assert!(
            s.apply(Action::Char('x')).is_empty(),
            "other keys keep asking"
        );
        assert_eq!(
            s.apply(Action::Confirm),
            vec![Command::Kick {
                node: 0,
                conn_id: 2
            }]
        );
        assert_eq!(s.mode, Mode::Normal);
        s.apply(Action::Delete);
        assert!(s.apply(Action::Cancel).is_empty());
        assert_eq!(s.mode, Mode::Normal);
    }

    #[test]
    fn revoke_needs_confirmation() {
        let mut s = with_conns(vec![conn(1, "alice", 0), conn(2, "bob", 0)]);
        s.apply(Action::Down);
        assert!(s.apply(Action::Revoke).is_empty());
        assert!(matches!(&s.mode, Mode::ConfirmRevoke { user, .. } if user == "bob"));
        assert!(s.apply(Action::Char('x')).is_empty());
        assert_eq!(
            s.apply(Action::Confirm),
            vec![Command::Revoke {
                node: 0,
                user: "bob".into()
            }]
        );
        assert_eq!(s.mode, Mode::Normal);
        s.apply(Action::Revoke);
        assert!(s.apply(Action::Cancel).is_empty());
        assert_eq!(s.mode, Mode::Normal);
    }

    #[test]
    fn filter_and_sort() {
        let mut s = with_conns(vec![
            conn(1, "alice", 10),
            conn(2, "bob", 30),
            conn(3, "carol", 20),
        ]);
        s.apply(Action::StartFilter);
        for c in "CAR".chars() {
            s.apply(Action::Char(c));
        }
        s.apply(Action::Submit);
        let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
        assert_eq!(ids, vec![3]);
        s.apply(Action::Cancel);
        for _ in 0..3 {
            s.apply(Action::Sort);
        }
        assert_eq!(s.sort, SortKey::Queued);
        let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
        assert_eq!(ids, vec![2, 3, 1]);
        s.apply(Action::ReverseSort);
        assert_eq!(s.plan(0).connections.as_deref(), Some("-queued"));
        let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
        assert_eq!(ids, vec![1, 3, 2]);
    }

    #[test]
    fn cursor_is_clamped() {
        let mut s = with_conns(vec![conn(1, "a", 0), conn(2, "b", 0)]);
        s.apply(Action::Bottom);
        assert_eq!(s.cursor(), 1);
        s.apply(Action::PageUp);
        assert_eq!(s.cursor(), 0);
    }

    #[test]
    fn log_filter_form_validates() {
        let now = Instant::now();
        let mut s = AppState::new(["http://a:1".to_owned()], now);
        s.apply(Action::GoView(View::Logs));
        s.apply(Action::Add);
        assert!(s.apply(Action::Submit).is_empty());
        assert!(matches!(&s.mode, Mode::Form(f) if f.error.is_some()));
        for c in "u42".chars() {
            s.apply(Action::Char(c));
        }
        s.apply(Action::NextField);
        s.apply(Action::Right); // debug -> info
        s.apply(Action::NextField);
        s.apply(Action::Backspace);
        s.apply(Action::Backspace);
        s.apply(Action::Backspace);
        for c in "60".chars() {
            s.apply(Action::Char(c));
        }
        assert_eq!(
            s.apply(Action::Submit),
            vec![Command::SetLogFilter {
                node: 0,
                uid: "u42".into(),
                level: "info".into(),
                ttl_secs: 60
            }]
        );
    }

    #[test]
    fn node_health_transitions() {
        let t0 = Instant::now();
        let mut s = AppState::new(["http://a:1".to_owned()], t0);
        s.on_update(0, Update::Overview(Ok(Box::default())), t0);
        assert_eq!(s.nodes[0].health, Health::Up);
        let e = ApiError::Unreachable("connection refused".into());
        s.on_update(0, Update::Overview(Err(e.clone())), t0);
        assert!(matches!(s.nodes[0].health, Health::Unreachable { .. }));
        assert_eq!(s.status.as_ref().map(|s| s.level), Some(Level::Error));
        assert_eq!(s.cluster().up, 0);
        s.on_update(0, Update::Overview(Ok(Box::default())), t0);
        assert_eq!(s.nodes[0].health, Health::Up);
        assert!(s.status.as_ref().is_some_and(|s| s.text.contains("back")));
        assert_eq!(s.nodes[0].history.connections.len(), 2);
    }

    #[test]
    fn slow_growth_and_events() {
        let t0 = Instant::now();
        let mut st = SlowState::default();
        let mk = |q: u64, marked: u64, disc: u64, rows: bool| SlowConsumers {
            marked_total: marked,
            disconnects_total: disc,
            slow_consumers: if rows { vec![conn(7, "r0", q)] } else { vec![] },
            ..SlowConsumers::default()
        };
        st.record(Ok(mk(1000, 1, 0, true)), t0);
        st.record(Ok(mk(3000, 1, 0, true)), t0 + Duration::from_secs(2));
        assert_eq!(st.growth.get(&7), Some(&1000.0));
        st.record(Ok(mk(0, 1, 1, false)), t0 + Duration::from_secs(3));
        assert_eq!(st.last_delta, (0, 1));
        let texts: Vec<&str> = st.events.iter().map(|e| e.text.as_str()).collect();
        assert!(texts[0].contains("conn 7 (r0) left the list"), "{texts:?}");
        assert!(texts[1].contains("disconnected 1"), "{texts:?}");
    }
}
