//! State: everything the console knows, as plain data, and the functions that change it.
//! API responses come in through [`AppState::on_update`], key actions through
//! [`AppState::apply`] (which returns the side effects to run as [`Command`]s), time
//! through [`AppState::tick`]. Nothing here does I/O or reads a clock, so it is tested
//! directly and the views render from it alone.
//!
//! Split by concern: [`nav`] (sort keys, the table filter), [`node`] (what is known
//! about each node), [`form`] (the popup forms), [`reducer`] (key actions and API results
//! in, commands out), [`trace`] (the Trace view's message). This file holds the console-wide state they change.

mod form;
mod nav;
mod node;
mod reducer;
#[cfg(test)]
mod tests;
mod trace;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::api::{Connection, LogTailLine};

pub use crate::screen::View;
pub use form::{Field, Form, FormKind, ProfileSettings, HEAP_SECONDS_DEFAULT};
pub use nav::{matches_filter, SortKey};
pub use node::{
    display_user, ClusterSummary, Fetched, Health, History, NodeState, ProfileKind, ProfileResult,
    ProfileState, SlowEvent, SlowState, TopRow,
};
pub use reducer::{Command, Plan, Update};
pub use trace::{line_msg_id, valid_msg_id, TraceState, TraceStatus};

/// Samples kept per series for the sparklines (10 minutes at one per second).
pub const HISTORY_LEN: usize = 600;
/// Rows asked for in the connections table (server-side sorted, then filtered here).
pub const CONNECTIONS_LIMIT: u32 = 2000;
/// Parked webhook events listed in the Webhooks view.
pub const PARKED_LIMIT: u32 = 100;
/// Rows asked for in the memory view's "largest queues" table.
pub const TOP_QUEUED_LIMIT: u32 = 20;
/// Slow-consumer events kept.
pub const SLOW_EVENTS_LEN: usize = 50;
/// How long an info message stays on the status line.
pub const INFO_TTL: Duration = Duration::from_secs(10);
/// Lines a live tail keeps; older ones scroll away.
pub const TAIL_LINES: usize = 2000;
/// Lines of the node's ring a tail starts with.
pub const TAIL_BACKLOG: u32 = 200;
/// Conversations asked for in the Users view's backlog.
pub const USER_BACKLOG: u32 = 50;
/// Recent messages asked for in the Users view.
pub const USER_MESSAGES: u32 = 20;
/// Levels offered for a per-uid log filter.
pub const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];

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

/// Where a live tail stands.
#[derive(Debug, Clone, PartialEq)]
pub enum TailStatus {
    /// Asked for; no line yet.
    Opening,
    /// Lines are coming.
    Live,
    /// Closed by the operator.
    Stopped,
    /// The node ended it or it failed (why).
    Ended(String),
}

/// The live tail of one filtered user on one node (Logs view; one at a time).
#[derive(Debug, Clone, PartialEq)]
pub struct TailState {
    /// Node index.
    pub node: usize,
    /// The user.
    pub uid: String,
    /// Tells this tail's results from an earlier one's.
    pub generation: u64,
    /// The latest lines (events and `dropped` markers), oldest first.
    pub lines: VecDeque<LogTailLine>,
    /// Events the node dropped for this tail because it fell behind, in all.
    pub dropped: u64,
    /// Event lines received in all.
    pub received: u64,
    /// Where it stands.
    pub status: TailStatus,
    /// Lines scrolled back from the newest (0: following).
    pub scroll: usize,
}

impl TailState {
    /// True while lines may still come.
    pub fn is_open(&self) -> bool {
        matches!(self.status, TailStatus::Opening | TailStatus::Live)
    }
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
    /// The profile the Profile view shows and captures (`t` toggles CPU / heap).
    pub profile_kind: ProfileKind,
    /// Set by `q`.
    pub quit: bool,
    /// The time views measure ages against (set by `tick` and every update).
    pub now: Instant,
    /// Bumped by `r` to poll now.
    pub refresh_generation: u64,
    /// The live log tail, if one was opened.
    pub tail: Option<TailState>,
    /// Bumped for every tail opened.
    pub tail_generation: u64,
    /// The user the Users view shows (typed after `/` there).
    pub user: Option<String>,
    /// The message the Trace view shows, if one was asked for.
    pub trace: Option<TraceState>,
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
            profile_kind: ProfileKind::Cpu,
            quit: false,
            now,
            refresh_generation: 0,
            tail: None,
            tail_generation: 0,
            user: None,
            trace: None,
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
            View::Users => p.user = self.user.clone(),
            View::Webhooks => p.webhooks = true,
            View::Overview | View::Latency | View::Profile | View::Trace => {}
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

    /// The searched user's sessions as the selected node answered them (Users view),
    /// when the answer is about that user.
    pub fn visible_user_sessions(&self) -> Vec<&crate::api::UserSession> {
        self.user_answer()
            .map_or_else(Vec::new, |u| u.sessions.iter().collect())
    }

    /// The selected node's answer about the searched user, if it has one.
    pub fn user_answer(&self) -> Option<&crate::api::UserDiag> {
        let uid = self.user.as_deref()?;
        self.node()?.user.data.as_ref().filter(|u| u.user_id == uid)
    }

    /// The selected node's webhook endpoints, in config order (Webhooks view).
    pub fn visible_endpoints(&self) -> Vec<&crate::api::WebhookEndpoint> {
        self.node()
            .and_then(|n| n.webhooks.data.as_ref())
            .map_or_else(Vec::new, |w| w.endpoints.iter().collect())
    }

    /// The index of the console's node whose id is `node_id`.
    pub fn node_index_of(&self, node_id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.overview
                .data
                .as_ref()
                .is_some_and(|o| o.node_id == node_id)
        })
    }

    /// The shown profile's top functions (CPU or heap, filtered by `/` text).
    pub fn visible_top(&self) -> Vec<&TopRow> {
        let Some(ProfileState::Done(r)) = self.node().map(|n| n.profile_of(self.profile_kind))
        else {
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
            View::Users => self.visible_user_sessions().len(),
            View::Webhooks => self.visible_endpoints().len(),
            View::Overview | View::Latency | View::Memory | View::Trace => 0,
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
