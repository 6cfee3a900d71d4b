//! Reducer: applies key actions ([`AppState::apply`]) and API results
//! ([`AppState::on_update`]) to the state, and names the side effects the app runs
//! ([`Command`]) and the polls it makes ([`Plan`]).

use std::path::PathBuf;
use std::time::Instant;

use super::form::parse_in;
use super::*;
use crate::action::Action;
use crate::api::{
    ApiError, ConnectionList, Kicked, LogFilters, LogTailLine, Logs, Memory, MessageTrace,
    Overview, ParkedEvents, PostedMessages, Redelivered, Revoked, SlowConsumers, TestFired,
    UserDiag, Webhooks,
};

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
    /// Capture a heap profile and save it.
    HeapProfile {
        /// Node index.
        node: usize,
        /// Sampling window.
        seconds: u64,
        /// Folder for the files.
        dir: PathBuf,
    },
    /// `POST /admin/v1/messages`: a SYSTEM message to a group.
    Announce {
        /// Node index.
        node: usize,
        /// The group.
        group_id: String,
        /// The text.
        text: String,
    },
    /// `GET /admin/v1/logs/tail`: open the live tail of `uid` (closing any other).
    StartTail {
        /// Node index.
        node: usize,
        /// The user.
        uid: String,
        /// The tail's generation, echoed on its updates.
        generation: u64,
    },
    /// Close the open tail.
    StopTail,
    /// `GET /admin/v1/messages/{msg_id}/trace`.
    FetchTrace {
        /// Node index.
        node: usize,
        /// The message.
        msg_id: String,
    },
    /// `POST /admin/v1/webhooks/{name}/test`.
    TestFire {
        /// Node index.
        node: usize,
        /// The endpoint.
        name: String,
    },
    /// `POST /admin/v1/webhooks/parked/redeliver` for one endpoint.
    Redeliver {
        /// Node index.
        node: usize,
        /// The endpoint.
        name: String,
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
    /// A CPU capture finished (and was saved, or not).
    Profile(Result<ProfileResult, ApiError>),
    /// Lines of a live tail.
    TailLines {
        /// The tail's generation.
        generation: u64,
        /// The lines, in order.
        lines: Vec<LogTailLine>,
    },
    /// A live tail ended: the node closed it (`Ok`) or it failed.
    TailEnded {
        /// The tail's generation.
        generation: u64,
        /// How.
        result: Result<(), ApiError>,
    },
    /// A heap capture finished (and was saved, or not).
    HeapProfile(Result<ProfileResult, ApiError>),
    /// The Users view's poll of one user's diagnosis.
    User {
        /// The user asked about.
        uid: String,
        /// The answer (404: nothing known of the user).
        result: Result<UserDiag, ApiError>,
    },
    /// A message trace was fetched (or not).
    Trace {
        /// The message asked for.
        msg_id: String,
        /// The result.
        result: Result<MessageTrace, ApiError>,
    },
    /// Webhooks poll.
    Webhooks(Result<Webhooks, ApiError>),
    /// Parked webhook events poll.
    Parked(Result<ParkedEvents, ApiError>),
    /// A test-fire finished (or not).
    TestFired {
        /// The endpoint.
        name: String,
        /// The result.
        result: Result<TestFired, ApiError>,
    },
    /// A redelivery finished (or not).
    Redelivered {
        /// The endpoint.
        name: String,
        /// The result.
        result: Result<Redelivered, ApiError>,
    },
    /// An announcement was posted (or not).
    Announced {
        /// The group.
        group_id: String,
        /// The result.
        result: Result<PostedMessages, ApiError>,
    },
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
    /// The diagnosis of this user (Users view).
    pub user: Option<String>,
    /// The webhook endpoints and parked events (Webhooks view).
    pub webhooks: bool,
    /// Bumped to ask for an immediate poll.
    pub generation: u64,
}

impl AppState {
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
            Mode::Filter if self.view == View::Users => self.apply_user_search(action),
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
            Action::PageDown | Action::PageUp | Action::Bottom if self.tail_shown() => {
                self.scroll_tail(action)
            }
            Action::PageDown => self.move_cursor(20),
            Action::PageUp => self.move_cursor(-20),
            Action::Top => self.cursor[self.view.index()] = 0,
            Action::Bottom => self.cursor[self.view.index()] = usize::MAX,
            Action::Tail if self.view == View::Logs => return self.toggle_tail(),
            Action::Add | Action::Redeliver if self.view == View::Webhooks => {
                return self.webhook_command(action == Action::Add)
            }
            Action::TraceMessage if self.view == View::Logs => return self.trace_from_tail(),
            Action::StartFilter if self.view == View::Trace => {
                let current = self.trace.as_ref().map_or("", |t| t.msg_id.as_str());
                self.mode = Mode::Form(Form::trace(current));
            }
            Action::Refresh if self.view == View::Trace && self.trace.is_some() => {
                let id = self
                    .trace
                    .as_ref()
                    .map(|t| t.msg_id.clone())
                    .unwrap_or_default();
                return self.open_trace(id);
            }
            Action::StartFilter => {
                if self.view == View::Users {
                    self.filter.clear();
                    self.mode = Mode::Filter;
                } else if matches!(
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
            Action::ToggleScale if self.view == View::Profile => {
                self.profile_kind = self.profile_kind.toggled();
                self.cursor[View::Profile.index()] = 0;
                self.info(format!(
                    "{} profile (t: {})",
                    self.profile_kind.label(),
                    self.profile_kind.toggled().label()
                ));
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
            Action::Revoke if self.view == View::Users => match self.user.clone() {
                Some(user) => {
                    self.mode = Mode::ConfirmRevoke {
                        node: self.selected,
                        user,
                    }
                }
                None => self.error("no user shown: press / and type a user id"),
            },
            Action::Add if self.view == View::Users => match self.user.clone() {
                Some(uid) => {
                    let mut form = Form::log_filter();
                    if let Some(f) = form.fields.first_mut() {
                        f.value = uid;
                    }
                    form.focus = 1;
                    self.mode = Mode::Form(form);
                }
                None => self.error("no user shown: press / and type a user id"),
            },
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
            Action::Announce => self.mode = Mode::Form(Form::announce()),
            Action::Add if self.view == View::Profile => self.start_profile_form(),
            Action::Submit if self.view == View::Profile => self.start_profile_form(),
            _ => {}
        }
        Vec::new()
    }

    /// Typing a user id after `/` in the Users view: enter looks it up, esc cancels.
    fn apply_user_search(&mut self, action: Action) -> Vec<Command> {
        match action {
            Action::Char(c) => self.filter.push(c),
            Action::Backspace => {
                self.filter.pop();
            }
            Action::Cancel => {
                self.filter.clear();
                return Vec::new();
            }
            Action::Submit => {
                let uid = self.filter.trim().to_owned();
                self.filter.clear();
                if uid.is_empty() {
                    self.error("user id is empty");
                } else if !valid_uid(&uid) {
                    self.error(format!(
                        "user id {uid:?}: 1-64 characters of A-Z a-z 0-9 _ . @ -"
                    ));
                } else {
                    for n in &mut self.nodes {
                        n.user = Fetched::default();
                    }
                    self.cursor[View::Users.index()] = 0;
                    self.info(format!("looking up {uid}…"));
                    self.user = Some(uid);
                }
                return Vec::new();
            }
            _ => {}
        }
        self.mode = Mode::Filter;
        Vec::new()
    }

    /// Asks before kicking the Users view's selected session, on the node that holds it.
    fn kick_user_session(&mut self) {
        let Some(s) = self
            .visible_user_sessions()
            .get(self.cursor())
            .map(|s| (*s).clone())
        else {
            self.error("no session selected");
            return;
        };
        let Some(node) = self.node_index_of(&s.node) else {
            self.error(format!(
                "session {} is on node {}, which this console does not watch (add its --url)",
                s.conn_id, s.node
            ));
            return;
        };
        let conn = Connection {
            conn_id: s.conn_id,
            user_id: self.user.clone().unwrap_or_default(),
            remote: s.remote,
            age_secs: s.age_secs,
            queued_bytes: s.queued_bytes,
            msgs_in: s.msgs_in,
            msgs_out: s.msgs_out,
            state: s.state,
            device: s.device,
        };
        self.mode = Mode::ConfirmKick { node, conn };
    }

    /// True when the Logs view shows a tail (of the selected node).
    pub fn tail_shown(&self) -> bool {
        self.view == View::Logs && self.tail.as_ref().is_some_and(|t| t.node == self.selected)
    }

    /// Page up / down through the tail's lines; `G` follows the newest again.
    fn scroll_tail(&mut self, action: Action) {
        let Some(t) = &mut self.tail else {
            return;
        };
        let max = t.lines.len().saturating_sub(1);
        t.scroll = match action {
            Action::PageUp => (t.scroll + 20).min(max),
            Action::PageDown => t.scroll.saturating_sub(20),
            _ => 0,
        };
    }

    /// `f` in the Logs view: stops the open tail, or opens one of the selected filter's
    /// user on this node.
    fn toggle_tail(&mut self) -> Vec<Command> {
        if let Some(t) = &mut self.tail {
            if t.is_open() && t.node == self.selected {
                t.status = TailStatus::Stopped;
                let uid = t.uid.clone();
                self.info(format!("live tail of {uid} stopped"));
                return vec![Command::StopTail];
            }
        }
        let Some(uid) = self
            .visible_log_filters()
            .get(self.cursor())
            .map(|f| f.uid.clone())
        else {
            self.error("no log filter selected: add one with a, then f tails its user");
            return Vec::new();
        };
        self.tail_generation += 1;
        let generation = self.tail_generation;
        let node = self.selected;
        self.tail = Some(TailState {
            node,
            uid: uid.clone(),
            generation,
            lines: VecDeque::new(),
            dropped: 0,
            received: 0,
            status: TailStatus::Opening,
            scroll: 0,
        });
        self.info(format!("opening the live tail of {uid}…"));
        vec![Command::StartTail {
            node,
            uid,
            generation,
        }]
    }

    /// Adds a tail's lines (when they are the open tail's).
    fn tail_lines(&mut self, generation: u64, lines: Vec<LogTailLine>) {
        let Some(t) = self.tail.as_mut().filter(|t| t.generation == generation) else {
            return;
        };
        if t.status == TailStatus::Opening {
            t.status = TailStatus::Live;
        }
        for l in lines {
            match l.dropped {
                Some(n) => t.dropped += n,
                None => t.received += 1,
            }
            t.lines.push_back(l);
            if t.scroll > 0 {
                t.scroll += 1;
            }
        }
        while t.lines.len() > TAIL_LINES {
            t.lines.pop_front();
        }
        t.scroll = t.scroll.min(t.lines.len().saturating_sub(1));
    }

    fn start_profile_form(&mut self) {
        let kind = self.profile_kind;
        if let Some(ProfileState::Running { .. }) = self.node().map(|n| n.profile_of(kind)) {
            self.error(format!(
                "a {} capture is already running on this node",
                kind.label()
            ));
            return;
        }
        self.mode = Mode::Form(match kind {
            ProfileKind::Cpu => Form::profile(&self.profile_settings),
            ProfileKind::Heap => Form::heap_profile(&self.profile_settings),
        });
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

    /// Webhooks view: test-fire (`c`) or redeliver the parked events of (`e`) the
    /// selected endpoint.
    fn webhook_command(&mut self, test: bool) -> Vec<Command> {
        let node = self.selected;
        let Some(name) = self
            .visible_endpoints()
            .get(self.cursor())
            .map(|e| e.name.clone())
        else {
            self.error("no webhook endpoint selected");
            return Vec::new();
        };
        if test {
            self.info(format!("sending a webhook.test event to {name}…"));
            vec![Command::TestFire { node, name }]
        } else {
            self.info(format!("queueing the parked events of {name} again…"));
            vec![Command::Redeliver { node, name }]
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
            View::Users => {
                self.kick_user_session();
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
                form.error = None;
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
            FormKind::Announce => {
                let group_id = form.value(0).to_owned();
                if group_id.is_empty() {
                    return Err("group id is empty".into());
                }
                if group_id.len() > 64
                    || !group_id.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-')
                    })
                {
                    return Err("group id: 1-64 of A-Z a-z 0-9 _ . @ -".into());
                }
                let text = form.value(1).to_owned();
                if text.is_empty() {
                    return Err("text is empty".into());
                }
                self.info(format!("announcing to {group_id}…"));
                Ok(vec![Command::Announce {
                    node,
                    group_id,
                    text,
                }])
            }
            FormKind::Trace => {
                let id = form.value(0).trim().to_owned();
                if !valid_msg_id(&id) {
                    return Err("msg_id must be 32 hex digits".into());
                }
                Ok(self.open_trace(id))
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
                    ..self.profile_settings.clone()
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
            FormKind::HeapProfile => {
                let seconds = parse_in(form.value(0), "seconds", 1, 60)?;
                let dir = form.value(1);
                if dir.is_empty() {
                    return Err("folder is empty".into());
                }
                let dir = PathBuf::from(dir);
                self.profile_settings.heap_seconds = seconds;
                self.profile_settings.dir = dir.clone();
                let now = self.now;
                if let Some(n) = self.node_mut() {
                    n.heap = ProfileState::Running {
                        started: now,
                        seconds,
                        frequency: 0,
                    };
                }
                self.info(format!("sampling the heap for {seconds}s…"));
                Ok(vec![Command::HeapProfile { node, seconds, dir }])
            }
        }
    }

    /// Records a poll or command result for node `node`.
    pub fn on_update(&mut self, node: usize, update: Update, now: Instant) {
        self.now = now;
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        let message = match update {
            Update::TailLines { generation, lines } => {
                self.tail_lines(generation, lines);
                None
            }
            Update::TailEnded { generation, result } => self.tail_ended(generation, result),
            Update::User { uid, result } => {
                if self.user.as_deref() != Some(uid.as_str()) {
                    return;
                }
                user_answer(n, &uid, result, now)
            }
            Update::Trace { msg_id, result } => {
                let message = trace_message(&msg_id, &result);
                self.trace_answer(&msg_id, result);
                Some(message)
            }
            other => node_update(n, other, now),
        };
        if let Some((level, text)) = message {
            match level {
                Level::Info => self.info(text),
                Level::Error => self.error(text),
            }
        }
    }

    /// The live tail `generation` ended (if it is still the open one): why, as a message.
    fn tail_ended(
        &mut self,
        generation: u64,
        result: Result<(), ApiError>,
    ) -> Option<(Level, String)> {
        let t = self.tail.as_mut().filter(|t| t.generation == generation)?;
        if !t.is_open() {
            return None;
        }
        let why = match result {
            Ok(()) => "the node closed the stream".to_owned(),
            Err(e) => e.to_string(),
        };
        let text = format!("live tail of {} ended: {why}", t.uid);
        t.status = TailStatus::Ended(why);
        Some((Level::Error, text))
    }
}

/// A user id as the server takes it: 1-64 characters of A-Z a-z 0-9 _ . @ -.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
}

/// A message the status line shows: its level and text.
type Message = (Level, String);

/// Records a node's own poll or command result (not the tail, user or trace ones); the
/// message to show, if any.
fn node_update(n: &mut NodeState, update: Update, now: Instant) -> Option<Message> {
    let name = n.name().to_owned();
    match update {
        Update::Overview(r) => {
            let message = overview_health(n, &name, &r, now);
            n.overview.set(r.map(|o| *o), now);
            return message;
        }
        Update::Connections(r) => n.connections.set(r, now),
        Update::Slow(r) => n.slow.record(r, now),
        Update::Memory(r) => n.memory.set(r, now),
        Update::TopQueued(r) => n.top_queued.set(r, now),
        Update::LogFilters(r) => n.log_filters.set(r, now),
        Update::Logs(r) => n.logs.set(r, now),
        Update::Profile(r) => {
            let (state, text) = profile_outcome(ProfileKind::Cpu, &name, r);
            n.profile = state;
            return Some(text);
        }
        Update::HeapProfile(r) => {
            let (state, text) = profile_outcome(ProfileKind::Heap, &name, r);
            n.heap = state;
            return Some(text);
        }
        Update::Kicked { conn_id, result } => return Some(kicked(n, &name, conn_id, result)),
        Update::Revoked { user, result } => return Some(revoked(n, &name, &user, result)),
        Update::Announced { group_id, result } => return Some(announced(&name, &group_id, result)),
        Update::Webhooks(r) => n.webhooks.set(r, now),
        Update::Parked(r) => n.parked.set(r, now),
        Update::TestFired { name: e, result } => return Some(test_fired(&name, &e, result)),
        Update::Redelivered { name: e, result } => return Some(redelivered(&name, &e, result)),
        other => return log_outcome(n, &name, other),
    }
    None
}

/// The message of a finished test-fire.
fn test_fired(node: &str, endpoint: &str, r: Result<TestFired, ApiError>) -> Message {
    match r {
        Ok(t) if t.error.is_empty() => (
            Level::Info,
            format!(
                "{node}: {endpoint} answered {} in {} ms",
                t.status, t.took_ms
            ),
        ),
        Ok(t) => (
            Level::Error,
            format!("{node}: {endpoint} test failed: {}", t.error),
        ),
        Err(e) => (Level::Error, format!("{node}: test-fire {endpoint}: {e}")),
    }
}

/// The message of a finished redelivery.
fn redelivered(node: &str, endpoint: &str, r: Result<Redelivered, ApiError>) -> Message {
    match r {
        Ok(r) => (
            Level::Info,
            format!(
                "{node}: {} parked events of {endpoint} queued again",
                r.queued
            ),
        ),
        Err(e) => (Level::Error, format!("{node}: redeliver {endpoint}: {e}")),
    }
}

/// The node's health after an overview poll, and the message when it changed (back up,
/// unreachable, failing).
fn overview_health(
    n: &mut NodeState,
    name: &str,
    r: &Result<Box<Overview>, ApiError>,
    now: Instant,
) -> Option<Message> {
    let mut message = None;
    match r {
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
            if let Health::Unreachable { error, .. } = &mut n.health {
                *error = e.to_string();
            } else {
                if n.health == Health::Up {
                    message = Some((Level::Error, format!("node {name} unreachable: {e}")));
                }
                n.health = Health::Unreachable {
                    error: e.to_string(),
                    since: now,
                };
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
    message
}

/// A kick answered: the connection leaves the table.
fn kicked(
    n: &mut NodeState,
    name: &str,
    conn_id: u64,
    result: Result<Kicked, ApiError>,
) -> Message {
    match result {
        Ok(_) => {
            if let Some(list) = &mut n.connections.data {
                list.connections.retain(|c| c.conn_id != conn_id);
            }
            let text = format!("kicked conn {conn_id} on {name} (close code 4002)");
            (Level::Info, text)
        }
        Err(e) => (Level::Error, format!("kick conn {conn_id} failed: {e}")),
    }
}

/// A revocation answered: the user's sessions leave the table.
fn revoked(
    n: &mut NodeState,
    name: &str,
    user: &str,
    result: Result<Revoked, ApiError>,
) -> Message {
    match result {
        Ok(r) => {
            if let Some(list) = &mut n.connections.data {
                list.connections.retain(|c| c.user_id != user);
            }
            let text = format!(
                "revoked {user} on {name}: {} sessions closed (4003), older tokens refused",
                r.closed
            );
            (Level::Info, text)
        }
        Err(e) => (Level::Error, format!("revoke {user} failed: {e}")),
    }
}

/// A log filter set or removed, or the global level changed: the node's table follows.
fn log_outcome(n: &mut NodeState, name: &str, update: Update) -> Option<Message> {
    let filters = n.log_filters.data.as_mut();
    Some(match update {
        Update::FilterSet {
            uid,
            level,
            ttl_secs,
            result,
        } => match result {
            Ok(()) => (
                Level::Info,
                format!("log filter set on {name}: {uid} at {level} for {ttl_secs}s"),
            ),
            Err(e) => (Level::Error, format!("set log filter {uid} failed: {e}")),
        },
        Update::FilterDeleted { uid, result } => match result {
            Ok(()) => {
                if let Some(f) = filters {
                    f.filters.retain(|f| f.uid != uid);
                }
                (
                    Level::Info,
                    format!("log filter for {uid} removed on {name}"),
                )
            }
            Err(e) => (Level::Error, format!("remove log filter {uid} failed: {e}")),
        },
        Update::GlobalLevelSet(r) => match r {
            Ok(level) => {
                let text = format!("global level on {name} is now {level}");
                if let Some(f) = filters {
                    f.global_level = level;
                }
                (Level::Info, text)
            }
            Err(e) => (Level::Error, format!("set global level failed: {e}")),
        },
        _ => return None,
    })
}

/// The user diagnosis of `uid` answered; a failure other than 404 is shown once, and no
/// stale answer about another user (or one that no longer exists) stays.
fn user_answer(
    n: &mut NodeState,
    uid: &str,
    result: Result<UserDiag, ApiError>,
    now: Instant,
) -> Option<Message> {
    let mut message = None;
    if let Err(e) = &result {
        let not_found = matches!(e, ApiError::Status { status: 404, .. });
        if n.user.error.as_ref().map(|x| x.to_string()) != Some(e.to_string()) && !not_found {
            let name = n.name();
            message = Some((Level::Error, format!("user {uid} on {name}: {e}")));
        }
        // An answer about another user is not this one's stale data.
        if not_found || n.user.data.as_ref().is_some_and(|d| d.user_id != uid) {
            n.user.data = None;
        }
    }
    n.user.set(result, now);
    message
}

/// What a trace answer says on the status line.
fn trace_message(msg_id: &str, result: &Result<MessageTrace, ApiError>) -> Message {
    match result {
        Ok(t) => (
            Level::Info,
            format!(
                "trace of {msg_id}: {} stages from {} node(s)",
                t.stages.len(),
                t.nodes.len()
            ),
        ),
        Err(e) => (Level::Error, format!("trace of {msg_id}: {e}")),
    }
}

/// What an announcement's answer says on the status line.
fn announced(name: &str, group_id: &str, result: Result<PostedMessages, ApiError>) -> Message {
    match result.map(|r| r.results.into_iter().next()) {
        Ok(Some(p)) => (
            Level::Info,
            format!(
                "announced to {group_id} on {name}: msg_id {} seq {}{}",
                p.msg_id,
                p.seq,
                if p.duplicate { " (duplicate)" } else { "" }
            ),
        ),
        Ok(None) => (
            Level::Error,
            format!("announce to {group_id}: the node answered no result"),
        ),
        Err(e) => (Level::Error, format!("announce to {group_id} failed: {e}")),
    }
}

/// A finished capture's state and status line.
fn profile_outcome(
    kind: ProfileKind,
    name: &str,
    r: Result<ProfileResult, ApiError>,
) -> (ProfileState, (Level, String)) {
    let label = kind.label();
    match r {
        Ok(p) => {
            let text = match (&p.save_error, &p.svg_path) {
                (Some(e), _) => (
                    Level::Error,
                    format!("{label} profile captured, not saved: {e}"),
                ),
                (None, Some(svg)) => (
                    Level::Info,
                    format!("{label} profile saved: {} (+ .pb.gz)", svg.display()),
                ),
                (None, None) => (Level::Info, format!("{label} profile captured")),
            };
            (ProfileState::Done(Box::new(p)), text)
        }
        Err(e) => {
            let text = match &e {
                ApiError::Status {
                    status: 409,
                    message,
                } => {
                    format!("a {label} capture is already running on {name} (409): {message}")
                }
                ApiError::Status {
                    status: 503,
                    message,
                } => format!("{name} cannot take {label} profiles (503): {message}"),
                ApiError::RouteMissing { .. } => {
                    format!("{name} has no {label} profile route yet (404 no such route)")
                }
                _ => format!("{label} profile on {name} failed: {e}"),
            };
            (ProfileState::Failed(text.clone()), (Level::Error, text))
        }
    }
}
