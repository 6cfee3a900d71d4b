//! Route stage: the online-session registry (user -> connections on this node) and the
//! fan-out of committed messages. Each message is encoded once and the bytes are shared
//! by every recipient's outbound queue. In cluster mode the same bytes go once to each
//! other node with recipients online, through the [`Peers`] the router is given (the
//! cluster link implements it; the router knows only this trait, so the dependency runs
//! from the cluster to the router and not back), and envelopes from other nodes come
//! back in through [`Router::deliver_remote`].
//!
//! Log attribution: while a log filter is set (`obs::logfilter::filtered_uids`), each
//! delivery emits one `message routed` debug event per filtered sender or recipient,
//! attributed to that uid (so the user's filter and live tail show it); with no filter
//! set this costs one relaxed load per delivery.
//!
//! Per-user diagnosis: the same deliveries are filed in the rings of the tracked users
//! (`obs::users`: under a log filter or sampled), the sender's as `sent` and each
//! recipient's as `received`; [`UserDiag::tracking`] costs one relaxed load and an
//! integer test per delivery while nobody is tracked.
//!
//! Also here, on the delivery side: the presence subscriber table the router owns
//! ([`presence`]) and the read receipt task that pushes through it ([`receipts`]).

pub mod presence;
pub mod receipts;
pub mod recent;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use im_proto::{frame, Body, ChatMessage, Deliver};
use tokio::sync::mpsc;

use crate::flow::{hint_key, Outbound, Pushed, HINT_ALL};
use crate::obs::logfilter::{self, as_uid};
use crate::obs::trace::{Active, Trace, TraceContext};
use crate::obs::users::{Direction, Recorded, Tracking, UserDiag};
use crate::obs::{EndToEnd, Metrics, Stage};
use crate::store::membership::Members;
use presence::PresenceHub;
use recent::Recent;

/// Who receives a message.
#[derive(Debug, Clone)]
pub enum Recipients {
    /// Both parties of a one-to-one chat (all their devices).
    Direct(String, String),
    /// Every member of a group.
    Group(Members),
}

impl Recipients {
    /// Every recipient user id, once.
    pub fn users(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        let (a, b, group): (Option<&str>, Option<&str>, &[String]) = match self {
            Recipients::Direct(a, b) => (Some(a.as_str()), (a != b).then_some(b.as_str()), &[]),
            Recipients::Group(m) => (None, None, &m[..]),
        };
        a.into_iter()
            .chain(b)
            .chain(group.iter().map(String::as_str))
    }

    /// Whether `user` is among these recipients (a group's sorted member list is
    /// searched, not walked).
    pub fn includes(&self, user: &str) -> bool {
        match self {
            Recipients::Direct(a, b) => a == user || b == user,
            Recipients::Group(m) => crate::store::membership::is_in(m, user),
        }
    }

    /// The users among `sender` and these recipients that have a log filter in `levels`,
    /// each once with its level and role (`sender` first, then `recipient`s). A group
    /// larger than the filter set is searched from the filters' side (member lists are
    /// sorted).
    pub fn filtered(
        &self,
        sender: &str,
        levels: &HashMap<Arc<str>, u8>,
    ) -> Vec<(Arc<str>, u8, &'static str)> {
        let mut out = Vec::new();
        if let Some((k, l)) = levels.get_key_value(sender) {
            out.push((k.clone(), *l, "sender"));
        }
        let mut add = |k: &Arc<str>, l: u8| {
            if **k != *sender {
                out.push((k.clone(), l, "recipient"));
            }
        };
        match self {
            Recipients::Group(m) if levels.len() < m.len() => {
                for (k, l) in levels {
                    if crate::store::membership::is_in(m, k) {
                        add(k, *l);
                    }
                }
            }
            _ => {
                for u in self.users() {
                    if let Some((k, l)) = levels.get_key_value(u) {
                        add(k, *l);
                    }
                }
            }
        }
        out
    }
}

/// A committed message on its way to recipients.
pub struct Delivery {
    /// The message as stored.
    pub message: ChatMessage,
    /// Who gets it.
    pub recipients: Recipients,
    /// The sending connection, which gets a SendAck instead.
    pub origin_conn: u64,
    /// When its Send frame started decoding.
    pub started: Instant,
    /// Push no message, only a sync hint to the recipients (here and on other nodes): a
    /// Send answered as a duplicate, whose first commit may never have been pushed (its
    /// outcome was unknown to the node that made it, e.g. a COMMIT that timed out after
    /// the store had applied it). The recipients read the stored message by sync.
    pub hint_only: bool,
    /// The message's trace, when it is traced (`obs::trace`).
    pub trace: Option<Box<Trace>>,
}

/// The other nodes, as the router sees them (cluster mode; the cluster link implements
/// it): presence changes out, the forward plan of a delivery, publishing that plan.
pub trait Peers: Send + Sync {
    /// `user` now has a connection here (the first one).
    fn user_up(&self, user: &str);
    /// `user` has no connection here any more.
    fn user_down(&self, user: &str);
    /// The cross-node part of a delivery of `frame` (empty: a sync hint) to `users`:
    /// `None` when no other live node has any of them online.
    fn plan(
        &self,
        users: &mut dyn Iterator<Item = &str>,
        frame: &Bytes,
        direct: bool,
    ) -> Option<Forward>;
    /// Publishes a forward plan: one envelope per node. The router awaits each before
    /// the next delivery, so every node receives this node's pushes in commit order.
    fn forward(&self, f: Forward) -> BoxFuture<'_, ()>;
    /// `user` now has `devices` connections here (0: none). The router calls it under
    /// its session lock at every change, so the counts go out in order.
    fn user_devices(&self, user: &str, devices: usize) {
        match devices {
            0 => self.user_down(user),
            _ => self.user_up(user),
        }
    }
    /// Connections `user` has on the other live nodes (presence).
    fn remote_devices(&self, _user: &str) -> u32 {
        0
    }
    /// Publishes an ephemeral plan (typing): the receiving nodes push it only to
    /// connections that are not slow, and a lost one is not resynced.
    fn forward_ephemeral(&self, f: Forward) -> BoxFuture<'_, ()> {
        self.forward(f)
    }
    /// Tells the other nodes that `user` now hides (or shows) their presence.
    fn presence_hidden(&self, _user: &str, _hidden: bool) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// One message's cross-node part: the users to push to, per other node.
pub struct Forward {
    /// Node -> its recipients.
    pub targets: Vec<(Arc<str>, Vec<String>)>,
    /// The encoded Deliver frame (empty: a sync hint).
    pub frame: Bytes,
    /// One-to-one (critical) or group.
    pub direct: bool,
    /// The message's trace context, when it is traced: the receiving nodes record
    /// their part under the same msg_id.
    pub trace: Option<TraceContext>,
    /// A large group's message: the receiving nodes file `frame` in their recent window
    /// and hint instead of pushing it.
    pub notify: bool,
}

/// Records the route stage (from `t`) of a traced delivery and hands its context to the
/// other nodes' part of it; the part here is filed once its last queued copy goes.
fn traced_route(
    trace: Option<Arc<Active>>,
    t: Instant,
    forward: Option<Forward>,
) -> Option<Forward> {
    let Some(active) = trace else {
        return forward;
    };
    active.stage(Stage::Route, t, Instant::now());
    forward.map(|mut f| {
        f.trace = Some(active.context());
        f
    })
}

/// An encoded notify-and-pull hint naming `conversation_id` and the `seq` of the message
/// that raised it (empty: every conversation).
fn hint_frame(conversation_id: &str, seq: u64) -> Bytes {
    im_proto::encode(&frame(
        0,
        Body::SyncResp(im_proto::SyncResponse {
            messages: Vec::new(),
            more: true,
            hint_conversation_id: conversation_id.to_owned(),
            hint_seq: seq,
        }),
    ))
}

/// An encoded Deliver frame of one message.
fn deliver_frame(m: ChatMessage) -> Bytes {
    im_proto::encode(&frame(0, Body::Deliver(Deliver { messages: vec![m] })))
}

/// The session registry: user id to that user's connections here. Hashed with a
/// per-process random seed (foldhash): a group fan-out looks up every member, and
/// SipHash was a third of a delivery's routing instructions.
type Sessions = HashMap<String, Vec<Arc<Outbound>>, foldhash::fast::RandomState>;

/// Online sessions of this node; the one owner of that map.
pub struct Router {
    sessions: RwLock<Sessions>,
    metrics: Metrics,
    notify_threshold: usize,
    /// The hint that names no conversation (sync everything).
    hint: Bytes,
    hints: metrics::Counter,
    /// The newest messages of the large groups routed here (`route::recent`).
    recent: Recent,
    link: Option<Arc<dyn Peers>>,
    /// Presence subscriptions (`route::presence`).
    presence: PresenceHub,
    /// Typing pushes skipped for slow connections.
    typing_skipped_slow: metrics::Counter,
    /// The per-user diagnosis rings (`obs::users`).
    users: Arc<UserDiag>,
    /// Told when a user's first connection here opens (true) or their last closes
    /// (false): the webhooks' `user.online` / `user.offline`.
    presence_hook: std::sync::OnceLock<PresenceHook>,
}

/// What the router tells of a user's first connection here opening (true) or their
/// last closing (false).
pub type PresenceHook = Arc<dyn Fn(&str, bool) + Send + Sync>;

impl Router {
    /// An empty registry; groups above `notify_threshold` members get sync hints; with a
    /// `link`, recipients on other nodes get the message through it.
    pub fn new(metrics: Metrics, notify_threshold: u32, link: Option<Arc<dyn Peers>>) -> Self {
        let hint = hint_frame("", 0);
        Router {
            sessions: RwLock::new(Sessions::default()),
            metrics,
            notify_threshold: notify_threshold as usize,
            hint,
            hints: metrics::counter!("im_sync_hints_total"),
            recent: Recent::default(),
            link,
            presence: PresenceHub::new(),
            typing_skipped_slow: {
                let c = metrics::counter!("im_typing_skipped_slow_total");
                c.absolute(0);
                c
            },
            users: UserDiag::new(32, 0, 1000),
            presence_hook: std::sync::OnceLock::new(),
        }
    }

    /// Sets the hook told of users' first and last connections here (once).
    pub fn set_presence_hook(&self, hook: PresenceHook) {
        let _ = self.presence_hook.set(hook);
    }

    /// The router with `users` as its per-user diagnosis (instead of the default one).
    pub fn with_users(mut self, users: Arc<UserDiag>) -> Self {
        self.users = users;
        self
    }

    /// The per-user diagnosis the router files deliveries in.
    pub fn users(&self) -> &Arc<UserDiag> {
        &self.users
    }

    /// The user's connections on this node, newest last.
    pub fn sessions_of(&self, user: &str) -> Vec<Arc<Outbound>> {
        self.sessions
            .read()
            .map(|s| s.get(user).cloned().unwrap_or_default())
            .unwrap_or_default()
    }

    /// The newest messages of the large groups routed here, which syncs read.
    pub fn recent(&self) -> &Recent {
        &self.recent
    }

    /// Notify-and-pull: a sync hint (`frame`, pending key `key`) to every online member
    /// but the sender.
    fn hint_members(&self, members: &[String], origin_conn: u64, frame: &Bytes, key: u64) {
        if let Ok(sessions) = self.sessions.read() {
            self.hint(
                members.iter().filter_map(|m| sessions.get(m)).flatten(),
                origin_conn,
                frame,
                key,
            );
        }
    }

    /// A sync hint naming `m`'s conversation and seq to `users`' sessions here but
    /// `origin_conn`.
    fn hint_message(&self, users: &[String], origin_conn: u64, m: &ChatMessage) {
        let frame = hint_frame(&m.conversation_id, m.seq);
        self.hint_members(users, origin_conn, &frame, hint_key(&m.conversation_id));
    }

    /// A sync hint to every session here: pushes from other nodes may have been lost
    /// while the cluster link was down (so the recent windows start over). Returns how
    /// many were queued.
    pub fn hint_all(&self) -> u64 {
        self.recent.clear();
        match self.sessions.read() {
            Ok(sessions) => self.hint(sessions.values().flatten(), 0, &self.hint, HINT_ALL),
            Err(_) => 0,
        }
    }

    /// Queues the hint `frame` on each of `outs` but `origin_conn` (one pending per
    /// session and conversation).
    fn hint<'a>(
        &self,
        outs: impl Iterator<Item = &'a Arc<Outbound>>,
        origin_conn: u64,
        frame: &Bytes,
        key: u64,
    ) -> u64 {
        let mut sent = 0;
        for out in outs {
            if out.conn_id != origin_conn && out.hint_sync(frame, key) {
                sent += 1;
            }
        }
        self.hints.increment(sent);
        sent
    }

    /// Announces every user online here to the cluster again (after the cluster link
    /// was re-established: the presence bucket may have been lost). Done under the
    /// session lock, so a logout racing with it is announced after it.
    pub fn republish_presence(&self) -> usize {
        let (Some(link), Ok(sessions)) = (&self.link, self.sessions.read()) else {
            return 0;
        };
        for (user, outs) in sessions.iter() {
            link.user_devices(user, outs.len());
        }
        sessions.len()
    }

    /// Registers a logged-in connection for `user`.
    pub fn register(&self, user: &str, out: Arc<Outbound>) {
        self.try_register(user, out, 0);
    }

    /// Registers a logged-in connection for `user` unless it holds `max` already (0:
    /// no cap); false when refused.
    pub fn try_register(&self, user: &str, out: Arc<Outbound>, max: usize) -> bool {
        match self.sessions.write() {
            Ok(mut s) => {
                let list = s.entry(user.to_owned()).or_default();
                if max > 0 && list.len() >= max {
                    return false;
                }
                list.push(out);
                if let Some(link) = &self.link {
                    link.user_devices(user, list.len());
                }
                if list.len() == 1 {
                    if let Some(hook) = self.presence_hook.get() {
                        hook(user, true);
                    }
                }
            }
            Err(_) => return true,
        }
        self.presence_changed(user);
        true
    }

    /// Removes a connection of `user`.
    pub fn unregister(&self, user: &str, conn_id: u64) {
        self.presence.drop_conn(conn_id);
        let mut changed = false;
        if let Ok(mut s) = self.sessions.write() {
            if let Some(list) = s.get_mut(user) {
                let before = list.len();
                list.retain(|o| o.conn_id != conn_id);
                let n = list.len();
                if n == 0 {
                    s.remove(user);
                }
                if n != before {
                    changed = true;
                    if let Some(link) = &self.link {
                        link.user_devices(user, n);
                    }
                    if n == 0 {
                        if let Some(hook) = self.presence_hook.get() {
                            hook(user, false);
                        }
                    }
                }
            }
        }
        if changed {
            self.presence_changed(user);
        }
    }

    /// The node's message tracer (`obs::trace`), which the cluster's trace requests read.
    pub fn tracer(&self) -> &Arc<crate::obs::trace::Tracer> {
        &self.metrics.tracer
    }

    /// Connections `user` has on this node.
    pub fn online(&self, user: &str) -> usize {
        self.sessions
            .read()
            .map(|s| s.get(user).map_or(0, Vec::len))
            .unwrap_or(0)
    }

    /// Users online on this node.
    pub fn users_online(&self) -> usize {
        self.sessions.read().map(|s| s.len()).unwrap_or(0)
    }

    /// Fans out one committed message: encode once, push the shared bytes to every
    /// recipient connection here but the sender's own; returns the part for other nodes.
    pub fn deliver(&self, mut d: Delivery) -> Option<Forward> {
        let t = Instant::now();
        if let Some(levels) = logfilter::filtered_uids() {
            self.log_routed(&d, &levels);
        }
        if let Some(tracking) = self.users.tracking() {
            self.record_routed(&d, &tracking);
        }
        let trace = d.trace.take().map(|tr| self.metrics.tracer.activate(*tr));
        if d.hint_only {
            let users: Vec<String> = d.recipients.users().map(str::to_owned).collect();
            let forward = self.hint_instead(&users, &d.message, d.origin_conn, t);
            return traced_route(trace, t, forward);
        }
        if let Recipients::Group(members) = &d.recipients {
            if members.len() > self.notify_threshold {
                let forward = self.notify(members, &d.message, d.origin_conn, t);
                return traced_route(trace, t, forward);
            }
        }
        let direct = matches!(d.recipients, Recipients::Direct(..));
        let bytes = im_proto::encode(&frame(
            0,
            Body::Deliver(Deliver {
                messages: vec![d.message],
            }),
        ));
        self.metrics.encoded.increment(1);
        self.metrics.stage_since(Stage::Encode, t);
        let t = Instant::now();
        let e2e = EndToEnd::new(d.started);
        self.push_users(
            d.recipients.users(),
            &bytes,
            direct,
            d.origin_conn,
            Some(&e2e),
            trace.as_ref(),
        );
        let forward = self
            .link
            .as_ref()
            .and_then(|l| l.plan(&mut d.recipients.users(), &bytes, direct));
        self.metrics.stage_since(Stage::Route, t);
        e2e.done(&self.metrics);
        traced_route(trace, t, forward)
    }

    /// One `message routed` event per filtered sender or recipient of `d`, attributed
    /// to that uid: what the message is and how it reaches them from here.
    fn log_routed(&self, d: &Delivery, levels: &HashMap<Arc<str>, u8>) {
        let concerned = d.recipients.filtered(&d.message.sender, levels);
        if concerned.is_empty() {
            return;
        }
        let how = if d.hint_only {
            "sync_hint"
        } else if matches!(&d.recipients, Recipients::Group(m) if m.len() > self.notify_threshold) {
            "sync_hint_large_group"
        } else {
            "push"
        };
        let recipients = d.recipients.users().count();
        for (uid, level, role) in concerned {
            let conns_here = self.online(&uid);
            as_uid(&uid, level, || {
                tracing::debug!(
                    uid = %uid,
                    role,
                    conversation = %d.message.conversation_id,
                    seq = d.message.seq,
                    msg_id = %d.message.msg_id,
                    how,
                    recipients,
                    conns_here,
                    "message routed"
                )
            });
        }
    }

    /// Files `d` in the rings of its tracked sender (`sent`) and recipients (`received`).
    fn record_routed(&self, d: &Delivery, tracking: &Tracking<'_>) {
        let m = &d.message;
        let stages = vec![("read_to_route", d.started.elapsed().as_secs_f64() * 1e3)];
        if !m.sender.is_empty() && tracking.tracked(&m.sender) {
            self.users.record(
                &m.sender,
                Recorded {
                    direction: Direction::Sent,
                    msg_id: m.msg_id.clone(),
                    conversation_id: m.conversation_id.clone(),
                    seq: m.seq,
                    how: "committed",
                    sessions: u32::try_from(self.online(&m.sender)).unwrap_or(u32::MAX),
                    stages: stages.clone(),
                },
            );
        }
        let hint = d.hint_only
            || matches!(&d.recipients, Recipients::Group(g) if g.len() > self.notify_threshold);
        for uid in d.recipients.users() {
            if uid == m.sender || !tracking.tracked(uid) {
                continue;
            }
            let sessions = self.online(uid);
            let how = match (sessions, hint) {
                (0, _) => "not_here",
                (_, true) => "sync_hint",
                _ => "push",
            };
            self.users.record(
                uid,
                Recorded {
                    direction: Direction::Received,
                    msg_id: m.msg_id.clone(),
                    conversation_id: m.conversation_id.clone(),
                    seq: m.seq,
                    how,
                    sessions: u32::try_from(sessions).unwrap_or(u32::MAX),
                    stages: stages.clone(),
                },
            );
        }
    }

    /// Files a delivery from another node in the rings of its tracked `users` here (the
    /// frame is decoded only when one of them is tracked).
    fn record_remote(&self, users: &[String], frame: &Bytes, tracking: &Tracking<'_>) {
        let mut decoded = false;
        let mut message: Option<ChatMessage> = None;
        for uid in users.iter().filter(|u| tracking.tracked(u)) {
            if !decoded {
                decoded = true;
                message = (!frame.is_empty())
                    .then(|| <im_proto::Frame as im_proto::Message>::decode(frame.as_ref()).ok())
                    .flatten()
                    .and_then(|f| match f.body {
                        Some(Body::Deliver(d)) => d.messages.into_iter().next(),
                        _ => None,
                    });
            }
            let m = &message;
            let sessions = self.online(uid);
            let (msg_id, conversation_id, seq) = m.as_ref().map_or_else(
                || (String::new(), String::new(), 0),
                |m| (m.msg_id.clone(), m.conversation_id.clone(), m.seq),
            );
            self.users.record(
                uid,
                Recorded {
                    direction: Direction::Received,
                    msg_id,
                    conversation_id,
                    seq,
                    how: if frame.is_empty() {
                        "sync_hint"
                    } else {
                        "push"
                    },
                    sessions: u32::try_from(sessions).unwrap_or(u32::MAX),
                    stages: Vec::new(),
                },
            );
        }
    }

    /// A sync hint naming `m`'s conversation instead of the message: to `users`'
    /// sessions here but `origin_conn`, and (the empty frame of the returned plan, a hint
    /// for every conversation) on the nodes that have the others.
    fn hint_instead(
        &self,
        users: &[String],
        m: &ChatMessage,
        origin_conn: u64,
        t: Instant,
    ) -> Option<Forward> {
        self.hint_message(users, origin_conn, m);
        let forward = self
            .link
            .as_ref()
            .and_then(|l| l.plan(&mut users.iter().map(String::as_str), &Bytes::new(), false));
        self.metrics.stage_since(Stage::Route, t);
        forward
    }

    /// A large group's message (notify-and-pull): filed in the recent window, then a
    /// hint naming it to the members' sessions here but `origin_conn`; the returned
    /// plan carries the message to the nodes that have the others, marked `notify`.
    fn notify(
        &self,
        members: &[String],
        m: &ChatMessage,
        origin_conn: u64,
        t: Instant,
    ) -> Option<Forward> {
        self.recent.file(m);
        self.hint_message(members, origin_conn, m);
        let forward = self.link.as_ref().and_then(|l| {
            let bytes = deliver_frame(m.clone());
            l.plan(&mut members.iter().map(String::as_str), &bytes, false)
        });
        self.metrics.stage_since(Stage::Route, t);
        forward.map(|f| Forward { notify: true, ..f })
    }

    /// A large group's message from another node (an envelope marked `notify`): each
    /// message of the Deliver `frame` is filed in the recent window and hinted to this
    /// node's sessions of `users`. A frame that does not decode hints everything.
    pub fn notify_remote(&self, users: &[String], frame: &Bytes) {
        let t = Instant::now();
        match <im_proto::Frame as prost::Message>::decode(frame.clone())
            .ok()
            .and_then(|f| f.body)
        {
            Some(Body::Deliver(d)) => {
                for m in &d.messages {
                    self.recent.file(m);
                    self.hint_message(users, 0, m);
                }
            }
            _ => self.hint_members(users, 0, &self.hint, HINT_ALL),
        }
        self.metrics.stage_since(Stage::Route, t);
    }

    /// Pushes `bytes` to every connection here of `users` but `origin_conn`; counts them.
    fn push_users<'a>(
        &self,
        users: impl Iterator<Item = &'a str>,
        bytes: &Bytes,
        critical: bool,
        origin_conn: u64,
        e2e: Option<&Arc<EndToEnd>>,
        trace: Option<&Arc<Active>>,
    ) {
        let mut queued = 0u64;
        if let Ok(sessions) = self.sessions.read() {
            for (user, conns) in users.filter_map(|u| sessions.get(u).map(|c| (u, c))) {
                let copy = match trace {
                    Some(a) if conns.iter().any(|o| o.conn_id != origin_conn) => a.copy_for(user),
                    _ => None,
                };
                for out in conns {
                    if out.conn_id != origin_conn
                        && out.push_with_trace(bytes.clone(), critical, e2e, copy.as_ref())
                            == Pushed::Queued
                    {
                        queued += 1;
                    }
                }
            }
        }
        self.metrics.delivered.increment(queued);
        self.metrics
            .totals
            .messages_out
            .fetch_add(queued, std::sync::atomic::Ordering::Relaxed);
    }

    /// Delivers an envelope from another node to this node's sessions of `users`: the
    /// encoded frame, or a sync hint when `frame` is empty.
    pub fn deliver_remote(
        &self,
        users: &[String],
        frame: &Bytes,
        direct: bool,
        trace: Option<&TraceContext>,
    ) {
        let t = Instant::now();
        let trace = trace.map(|c| self.metrics.tracer.activate(Trace::remote(c)));
        if let Some(levels) = logfilter::filtered_uids() {
            for u in users {
                if let Some((uid, level)) = levels.get_key_value(u.as_str()) {
                    let conns_here = self.online(uid);
                    as_uid(uid, *level, || {
                        tracing::debug!(
                            uid = %uid,
                            role = "recipient",
                            how = if frame.is_empty() { "sync_hint" } else { "push" },
                            conns_here,
                            "message from another node routed"
                        )
                    });
                }
            }
        }
        if let Some(tracking) = self.users.tracking() {
            self.record_remote(users, frame, &tracking);
        }
        if frame.is_empty() {
            self.hint_members(users, 0, &self.hint, HINT_ALL);
        } else {
            self.push_users(
                users.iter().map(String::as_str),
                frame,
                direct,
                0,
                None,
                trace.as_ref(),
            );
        }
        self.metrics.stage_since(Stage::Route, t);
        if let Some(a) = trace {
            a.stage(Stage::Route, t, Instant::now());
        }
    }

    /// Pushes an encoded frame that is not a message (a read receipt) to every
    /// connection here of `users` but `origin_conn`, as a non-critical frame; returns
    /// the part for other nodes, which [`Router::forward`] publishes.
    pub fn push_frame(&self, users: &[String], bytes: &Bytes, origin_conn: u64) -> Option<Forward> {
        if let Ok(sessions) = self.sessions.read() {
            for out in users.iter().filter_map(|u| sessions.get(u)).flatten() {
                if out.conn_id != origin_conn {
                    out.push(bytes.clone(), false);
                }
            }
        }
        self.link
            .as_ref()
            .and_then(|l| l.plan(&mut users.iter().map(String::as_str), bytes, false))
    }

    /// Publishes a forward plan through the cluster link (nothing on a single node).
    pub async fn forward(&self, f: Forward) {
        if let Some(link) = &self.link {
            link.forward(f).await;
        }
    }

    /// Connections `user` has on every live node (here and, through presence, the
    /// others).
    pub fn devices(&self, user: &str) -> u32 {
        let here = self.online(user) as u32;
        here + self.link.as_ref().map_or(0, |l| l.remote_devices(user))
    }

    /// `user`'s connections here or on another node changed: their presence
    /// subscribers are told what they now see (`route::presence`).
    pub fn presence_changed(&self, user: &str) {
        self.presence.changed(user, |u| self.devices(u));
    }

    /// Replaces the presence subscriptions of connection `out` with `targets` (user,
    /// hidden) and pushes their current state; returns how many it watches.
    pub fn presence_subscribe(&self, out: &Arc<Outbound>, targets: Vec<(String, bool)>) -> usize {
        self.presence.subscribe(out, targets, |u| self.devices(u))
    }

    /// `user` hides (or shows) their presence: subscribers here see the change.
    pub fn presence_hidden(&self, user: &str, hidden: bool) {
        self.presence.set_hidden(user, hidden, |u| self.devices(u));
    }

    /// Tells the other nodes that `user` hides (or shows) their presence.
    pub async fn publish_presence_hidden(&self, user: &str, hidden: bool) {
        if let Some(link) = &self.link {
            link.presence_hidden(user, hidden).await;
        }
    }

    /// The presence subscriber table.
    pub fn presence_hub(&self) -> &PresenceHub {
        &self.presence
    }

    /// Pushes an ephemeral frame (typing) to every connection here of `users` but
    /// `origin_conn`, skipping connections above their low mark (counted); then
    /// publishes it to the other nodes that have any of `users`. Returns how many
    /// connections here got it.
    pub async fn deliver_ephemeral(
        &self,
        users: &[String],
        bytes: &Bytes,
        origin_conn: u64,
    ) -> u64 {
        let queued = self.push_ephemeral(users, bytes, origin_conn);
        if let Some(link) = &self.link {
            if let Some(f) = link.plan(&mut users.iter().map(String::as_str), bytes, false) {
                link.forward_ephemeral(f).await;
            }
        }
        queued
    }

    /// Pushes an ephemeral frame from another node to this node's sessions of `users`
    /// that are not slow.
    pub fn deliver_ephemeral_remote(&self, users: &[String], bytes: &Bytes) {
        self.push_ephemeral(users, bytes, 0);
    }

    fn push_ephemeral(&self, users: &[String], bytes: &Bytes, origin_conn: u64) -> u64 {
        let (mut queued, mut skipped) = (0u64, 0u64);
        if let Ok(sessions) = self.sessions.read() {
            for out in users.iter().filter_map(|u| sessions.get(u)).flatten() {
                if out.conn_id == origin_conn {
                    continue;
                }
                if out.above_low_mark() {
                    skipped += 1;
                } else if out.push(bytes.clone(), false) == Pushed::Queued {
                    queued += 1;
                } else {
                    skipped += 1;
                }
            }
        }
        self.typing_skipped_slow.increment(skipped);
        queued
    }

    /// The router task: delivers committed batches in commit order.
    pub async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Vec<Delivery>>) {
        while let Some(batch) = rx.recv().await {
            for d in batch {
                if let (Some(f), Some(link)) = (self.deliver(d), &self.link) {
                    link.forward(f).await;
                }
            }
        }
    }
}
