//! The background task behind [`crate::Client`]: it owns the socket, correlates replies
//! by `req_id`, turns `Deliver` and sync pages into exactly-once events, sends coalesced
//! `DeliverAck`s and heartbeats, reconnects (login with `resume = true`, then sync), and
//! with a token provider logs in again on the open connection before the token expires.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use im_proto::{
    Body, ChatMessage, Cursor, DeliverAck, ErrorCode, LoginOk, Ping, SendAck, SyncRequest,
    SyncResponse,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, trace, warn};

use crate::backoff::Backoff;
use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::event::Event;
use crate::raw::{RawConn, RawEvent};
use crate::tracker::SeqTracker;

/// Page size of every `SyncRequest`.
pub(crate) const SYNC_LIMIT: u32 = 500;
/// How long dirty conversations wait before their `DeliverAck` goes out.
const ACK_DELAY: Duration = Duration::from_millis(50);
/// Heartbeat used when the server announces none.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
/// Inbound silence (in heartbeats) after which the connection is taken as dead.
const DEAD_AFTER_HEARTBEATS: u32 = 3;
/// Period of the housekeeping pass (expired syncs, abandoned requests).
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// Housekeeping passes that may find seqs held above a hole (e.g. our own message
/// ahead of others' still in flight) before a background sync is started for them.
const HELD_PASSES: u8 = 2;
/// Most cursors one `SyncRequest` carries (the server refuses more than 10 000).
const MAX_SYNC_CURSORS: usize = 10_000;
/// How long shutdown waits for the close handshake.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// Wait before asking the token provider again after it (or the server) refused.
const REFRESH_RETRY: Duration = Duration::from_secs(1);

/// Reply channel of a plain request.
pub(crate) type Reply = oneshot::Sender<Result<Body, ClientError>>;
/// Reply channel of a sync.
pub(crate) type SyncReply = oneshot::Sender<Result<Vec<ChatMessage>, ClientError>>;

/// What the [`crate::Client`] handle asks of the task.
pub(crate) enum Command {
    /// Send `body` with a fresh req_id; the reply frame (or `Error`) completes `reply`.
    Request { body: Body, reply: Reply },
    /// Run a full (paged) sync; `reply` gets the newly seen messages.
    Sync { reply: SyncReply },
    /// Flush acks, close the socket and stop.
    Close { done: oneshot::Sender<()> },
}

/// Session facts shared with the handle.
#[derive(Debug, Default)]
pub(crate) struct Session {
    pub(crate) node_id: String,
    pub(crate) session_id: String,
}

/// State the handle reads without asking the task.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) session: Mutex<Session>,
    pub(crate) connected: AtomicBool,
}

impl Shared {
    pub(crate) fn set_session(&self, ok: &LoginOk) {
        let mut s = self.session.lock().unwrap_or_else(|e| e.into_inner());
        s.node_id = ok.node_id.clone();
        s.session_id = ok.session_id.clone();
    }

    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }
}

/// One sync in progress (one page outstanding).
///
/// A conversation with seqs held above a hole is read from the SDK's own cursor (the
/// last seq the app has), which overrides the server's stored cursor; a conversation
/// the SDK has no baseline for yet is read from the stored one. Either answer is
/// authoritative: the first seq a page returns for such a conversation follows
/// directly on the cursor used, and once the sync is complete every hole below the
/// seqs held when it started is settled. Any other conversation's page messages are
/// treated like live ones (held above a hole, filled by the next sync).
struct SyncJob {
    /// `None` for background syncs (gap fill, after reconnect).
    reply: Option<SyncReply>,
    /// Messages this sync made available to the app (for `reply`).
    collected: Vec<ChatMessage>,
    /// Cursors of every page: the SDK's own for `own`, then the last seq seen per
    /// conversation in this sync's pages.
    cursors: BTreeMap<String, u64>,
    /// Conversations read from the SDK's own cursor.
    own: HashSet<String>,
    /// Highest seq held per conversation when the sync started.
    held_at_start: BTreeMap<String, u64>,
    /// Conversations seen in this sync's pages.
    seen: HashSet<String>,
    /// Of those, the ones whose first page seq came from an authoritative cursor.
    settled: HashSet<String>,
    /// Conversations of the last page received (their cursors are kept first when
    /// there are too many to send).
    last_page: Vec<String>,
    sent_at: Instant,
    /// Once the server has rate-limited a page, the wait before each next page (its
    /// retry hint and a quarter more, doubled at each further refusal, at most 1 s), so
    /// the rest of the sync stays under the limit.
    pace: Duration,
}

/// Why the connected loop ended.
enum Stop {
    /// The handle closed or was dropped.
    Exit(Option<oneshot::Sender<()>>),
    /// The connection is gone.
    Lost(String),
}

/// How a reconnect attempt series ended.
enum Reconnect {
    Up(Box<RawConn>, LoginOk),
    Exit(Option<oneshot::Sender<()>>),
    Fatal(String),
}

/// The task's state.
pub(crate) struct Driver {
    cfg: ClientConfig,
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    ev_tx: mpsc::UnboundedSender<Event>,
    shared: Arc<Shared>,
    next_req_id: u64,
    pending: HashMap<u64, Reply>,
    syncs: HashMap<u64, SyncJob>,
    bg_running: bool,
    bg_wanted: bool,
    /// Consecutive housekeeping passes that found seqs held above a hole.
    held_passes: u8,
    /// Delivery cursors and the messages held above a hole (each conversation reaches
    /// the app in seq order).
    tracker: SeqTracker,
    ack_deadline: Option<Instant>,
    backlog: VecDeque<Command>,
    last_rx: Instant,
    heartbeat: Duration,
    /// When to fetch a fresh token (with a provider and a token that has `exp`).
    refresh_at: Option<Instant>,
    /// Fresh tokens from the provider task.
    token_tx: mpsc::UnboundedSender<Result<String, String>>,
    token_rx: mpsc::UnboundedReceiver<Result<String, String>>,
    /// The re-Login in flight: its req_id and token.
    refresh_req: Option<(u64, String)>,
    /// The users of the app's last `PresenceSubscribe`: subscriptions end with a
    /// connection, so they are sent again after a reconnect.
    presence_watch: Vec<String>,
}

impl Driver {
    /// A driver for a connection already logged in with `ok`; `next_req_id` follows the login's.
    pub(crate) fn new(
        cfg: ClientConfig,
        cmd_rx: mpsc::UnboundedReceiver<Command>,
        ev_tx: mpsc::UnboundedSender<Event>,
        shared: Arc<Shared>,
        next_req_id: u64,
        ok: &LoginOk,
    ) -> Self {
        let (token_tx, token_rx) = mpsc::unbounded_channel();
        Driver {
            cfg,
            cmd_rx,
            ev_tx,
            shared,
            next_req_id,
            pending: HashMap::new(),
            syncs: HashMap::new(),
            bg_running: false,
            bg_wanted: false,
            held_passes: 0,
            tracker: SeqTracker::default(),
            ack_deadline: None,
            backlog: VecDeque::new(),
            last_rx: Instant::now(),
            heartbeat: heartbeat_of(ok),
            refresh_at: None,
            token_tx,
            token_rx,
            refresh_req: None,
            presence_watch: Vec::new(),
        }
        .with_refresh_planned()
    }

    /// Plans the next token refresh: at two thirds of the current token's remaining life.
    fn with_refresh_planned(mut self) -> Self {
        self.plan_refresh();
        self
    }

    fn plan_refresh(&mut self) {
        self.refresh_at = None;
        if self.cfg.token_provider.is_none() {
            return;
        }
        let Some(exp) = crate::config::token_exp(&self.cfg.token) else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let left = Duration::from_secs(exp).saturating_sub(now);
        self.refresh_at = Some(Instant::now() + left * 2 / 3);
    }

    /// Asks the provider for a token on a task of its own (the loop never waits on it).
    fn start_refresh(&mut self) {
        self.refresh_at = None;
        let Some(provider) = self.cfg.token_provider.clone() else {
            return;
        };
        let tx = self.token_tx.clone();
        let timeout = self.cfg.request_timeout;
        tokio::spawn(async move {
            let r = match tokio::time::timeout(timeout, provider()).await {
                Ok(r) => r,
                Err(_) => Err("token provider timed out".to_owned()),
            };
            let _ = tx.send(r);
        });
    }

    /// A token from the provider: log in with it on the open connection.
    async fn on_token(
        &mut self,
        conn: &mut RawConn,
        token: Result<String, String>,
    ) -> Result<(), Stop> {
        match token {
            Ok(token) => {
                let id = self.alloc_req_id();
                let login = im_proto::frame(
                    id,
                    Body::Login(im_proto::Login {
                        token: token.clone(),
                        device_id: self.cfg.device_id.clone(),
                        resume: true,
                    }),
                );
                conn.send(&login).await.map_err(lost)?;
                self.refresh_req = Some((id, token));
            }
            Err(e) => {
                warn!(error = %e, "token provider failed; retrying");
                self.refresh_at = Some(Instant::now() + REFRESH_RETRY);
            }
        }
        Ok(())
    }

    /// Runs until the handle closes (or drops), or the connection is lost for good.
    pub(crate) async fn run(mut self, mut conn: RawConn) {
        let mut resync = false;
        loop {
            match self.run_connected(&mut conn, resync).await {
                Stop::Exit(done) => {
                    self.shutdown(&mut conn).await;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    return;
                }
                Stop::Lost(reason) => {
                    debug!(%reason, "connection lost");
                    self.on_lost(reason);
                    if !self.cfg.auto_reconnect {
                        return;
                    }
                    match self.reconnect().await {
                        Reconnect::Up(c, ok) => {
                            conn = *c;
                            self.refresh_req = None;
                            self.plan_refresh();
                            self.heartbeat = heartbeat_of(&ok);
                            self.shared.set_session(&ok);
                            let _ = self.ev_tx.send(Event::Reconnected {
                                node_id: ok.node_id,
                            });
                            resync = true;
                        }
                        Reconnect::Exit(done) => {
                            if let Some(done) = done {
                                let _ = done.send(());
                            }
                            return;
                        }
                        Reconnect::Fatal(reason) => {
                            warn!(%reason, "giving up reconnecting");
                            let _ = self.ev_tx.send(Event::Disconnected { reason });
                            return;
                        }
                    }
                }
            }
        }
    }

    fn alloc_req_id(&mut self) -> u64 {
        let id = self.next_req_id;
        self.next_req_id += 1;
        id
    }

    /// The loop over one live connection.
    async fn run_connected(&mut self, conn: &mut RawConn, resync: bool) -> Stop {
        self.shared.connected.store(true, Ordering::Release);
        self.last_rx = Instant::now();
        // Requests queued while reconnecting (including resent sends) go first.
        while let Some(cmd) = self.backlog.pop_front() {
            if let Err(stop) = self.handle_command(conn, cmd).await {
                return stop;
            }
        }
        if resync {
            self.bg_wanted = true;
            if let Err(stop) = self.resubscribe_presence(conn).await {
                return stop;
            }
        }
        let hb = self.heartbeat;
        let mut heartbeat = tokio::time::interval_at(Instant::now() + hb, hb);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut housekeeping =
            tokio::time::interval_at(Instant::now() + HOUSEKEEPING, HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            if let Err(stop) = self.after_event(conn).await {
                return stop;
            }
            let ack_at = self.ack_deadline;
            let ack_due = async move {
                match ack_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let refresh_at = self.refresh_at;
            let refresh_due = async move {
                match refresh_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let step = tokio::select! {
                _ = refresh_due => {
                    self.start_refresh();
                    Ok(())
                }
                Some(token) = self.token_rx.recv() => self.on_token(conn, token).await,
                cmd = self.cmd_rx.recv() => match cmd {
                    None => Err(Stop::Exit(None)),
                    Some(cmd) => self.handle_command(conn, cmd).await,
                },
                ev = conn.recv() => match ev {
                    Ok(RawEvent::Frame(f)) => {
                        self.last_rx = Instant::now();
                        self.handle_frame(conn, f).await
                    }
                    // Never sent: the SDK does not ask for pongs.
                    Ok(RawEvent::WsPong(_)) => Ok(()),
                    Ok(RawEvent::Closed { code, reason }) => Err(Stop::Lost(match code {
                        Some(code) => format!("closed by server (code {code}): {reason}"),
                        None => format!("connection closed: {reason}"),
                    })),
                    Err(e) => Err(Stop::Lost(e.to_string())),
                },
                _ = heartbeat.tick() => self.on_heartbeat(conn).await,
                _ = ack_due => self.flush_acks(conn).await,
                _ = housekeeping.tick() => {
                    self.housekeeping();
                    Ok(())
                }
            };
            if let Err(stop) = step {
                return stop;
            }
        }
    }

    /// Work due after any event: start a wanted background sync, arm the ack timer.
    async fn after_event(&mut self, conn: &mut RawConn) -> Result<(), Stop> {
        if self.bg_wanted && !self.bg_running {
            self.bg_wanted = false;
            self.bg_running = true;
            self.start_sync(conn, None).await?;
        }
        if self.ack_deadline.is_none() && self.tracker.has_dirty() {
            self.ack_deadline = Some(Instant::now() + ACK_DELAY);
        }
        Ok(())
    }

    async fn handle_command(&mut self, conn: &mut RawConn, cmd: Command) -> Result<(), Stop> {
        match cmd {
            Command::Close { done } => Err(Stop::Exit(Some(done))),
            Command::Request { body, reply } => {
                if reply.is_closed() {
                    return Ok(()); // the caller gave up (timeout) while it was queued
                }
                if let Body::PresenceSubscribe(p) = &body {
                    self.presence_watch.clone_from(&p.users);
                }
                let id = self.alloc_req_id();
                self.pending.insert(id, reply);
                conn.send(&im_proto::frame(id, body)).await.map_err(lost)
            }
            Command::Sync { reply } => {
                if reply.is_closed() {
                    return Ok(());
                }
                self.start_sync(conn, Some(reply)).await
            }
        }
    }

    /// After a reconnect: watches again the users the app last subscribed to (the
    /// server's `Done` finds no waiting request and is dropped; a refusal is logged).
    async fn resubscribe_presence(&mut self, conn: &mut RawConn) -> Result<(), Stop> {
        if self.presence_watch.is_empty() {
            return Ok(());
        }
        let users = self.presence_watch.clone();
        let id = self.alloc_req_id();
        let body = Body::PresenceSubscribe(im_proto::PresenceSubscribe { users });
        conn.send(&im_proto::frame(id, body)).await.map_err(lost)
    }

    /// Sends the first page request: the SDK's own cursor for every conversation held
    /// above a hole that it has a baseline for; the server's stored cursors for the rest.
    async fn start_sync(
        &mut self,
        conn: &mut RawConn,
        reply: Option<SyncReply>,
    ) -> Result<(), Stop> {
        let mut job = SyncJob {
            reply,
            collected: Vec::new(),
            cursors: BTreeMap::new(),
            own: HashSet::new(),
            held_at_start: BTreeMap::new(),
            seen: HashSet::new(),
            settled: HashSet::new(),
            last_page: Vec::new(),
            sent_at: Instant::now(),
            pace: Duration::ZERO,
        };
        for (conv, delivered, top) in self.tracker.holes() {
            if delivered > 0 && job.own.len() < MAX_SYNC_CURSORS {
                job.cursors.insert(conv.clone(), delivered);
                job.own.insert(conv.clone());
            }
            job.held_at_start.insert(conv, top);
        }
        self.send_sync_page(conn, job).await
    }

    /// Sends the next page request of `job` with its cursors.
    async fn send_sync_page(&mut self, conn: &mut RawConn, mut job: SyncJob) -> Result<(), Stop> {
        if !job.pace.is_zero() {
            tokio::time::sleep(job.pace).await;
        }
        let pick = |(c, s): (&String, &u64)| Cursor {
            conversation_id: c.clone(),
            after_seq: *s,
        };
        let cursors: Vec<Cursor> = if job.cursors.len() <= MAX_SYNC_CURSORS {
            job.cursors.iter().map(pick).collect()
        } else {
            // Very many conversations: the own cursors and the last page's (the server
            // goes on in conversation order from there).
            job.cursors
                .iter()
                .filter(|(c, _)| job.own.contains(*c) || job.last_page.contains(c))
                .take(MAX_SYNC_CURSORS)
                .map(pick)
                .collect()
        };
        let id = self.alloc_req_id();
        job.sent_at = Instant::now();
        self.syncs.insert(id, job);
        let req = SyncRequest {
            cursors,
            limit: SYNC_LIMIT,
            ..Default::default()
        };
        conn.send(&im_proto::frame(id, Body::Sync(req)))
            .await
            .map_err(lost)
    }

    async fn handle_frame(&mut self, conn: &mut RawConn, f: im_proto::Frame) -> Result<(), Stop> {
        let id = f.req_id;
        match f.body {
            None => trace!(req_id = id, "empty frame"),
            Some(Body::Deliver(d)) => {
                for m in d.messages {
                    let (conv, seq) = (m.conversation_id.clone(), m.seq);
                    let arrival = self.tracker.arrive(m);
                    if arrival.gap {
                        trace!(conversation = %conv, seq, "live message above a hole: held");
                        self.bg_wanted = true;
                    }
                    self.emit(arrival.ready, None);
                }
            }
            // An unsolicited SyncResponse{more} is the server's notify-and-pull hint
            // (large groups): new messages wait in the store, fetch them by sync.
            Some(Body::SyncResp(resp)) if id == 0 => {
                if resp.more {
                    self.bg_wanted = true;
                }
            }
            Some(Body::SyncResp(resp)) => {
                if let Some(job) = self.syncs.remove(&id) {
                    self.on_sync_page(conn, job, resp).await?;
                } else {
                    trace!(req_id = id, "sync page for an expired sync");
                }
            }
            Some(Body::ReadReceipt(r)) if id == 0 => {
                let _ = self.ev_tx.send(Event::ReadReceipt(r));
            }
            // Presence and typing pushes go to the app as they are.
            Some(Body::Presence(p)) if id == 0 => {
                let _ = self.ev_tx.send(Event::Presence(p));
            }
            Some(Body::Typing(t)) if id == 0 => {
                let _ = self.ev_tx.send(Event::Typing(t));
            }
            Some(Body::SendAck(ack)) => {
                self.note_own(&ack);
                self.complete(id, Ok(Body::SendAck(ack)));
            }
            Some(Body::LoginOk(_)) if self.refresh_req.as_ref().is_some_and(|r| r.0 == id) => {
                if let Some((_, token)) = self.refresh_req.take() {
                    self.cfg.token = token;
                }
                debug!("session extended with a fresh token");
                self.plan_refresh();
            }
            Some(Body::Error(e)) => {
                if self.refresh_req.as_ref().is_some_and(|r| r.0 == id) {
                    self.refresh_req = None;
                    warn!(code = e.code, message = %e.message, "fresh token refused");
                    self.refresh_at = Some(Instant::now() + REFRESH_RETRY);
                } else if let Some(job) = self.syncs.remove(&id) {
                    self.on_sync_error(conn, job, ClientError::from_server(e))
                        .await?;
                } else if id != 0 && self.pending.contains_key(&id) {
                    self.complete(id, Err(ClientError::from_server(e)));
                } else {
                    warn!(req_id = id, code = e.code, message = %e.message, "error from server");
                }
            }
            Some(body) => self.complete(id, Ok(body)),
        }
        Ok(())
    }

    /// Our own message is known to us from its ack: never emit it, but it takes its place
    /// in the conversation's order (a hole below it is filled by the live pushes in
    /// flight, or by a housekeeping sync).
    fn note_own(&mut self, ack: &SendAck) {
        let arrival = self.tracker.own(&ack.conversation_id, ack.seq);
        self.emit(arrival.ready, None);
    }

    /// Hands `msgs` (in order) to the app, and to `collect` when a sync reply waits.
    fn emit(&mut self, msgs: Vec<ChatMessage>, mut collect: Option<&mut Vec<ChatMessage>>) {
        for m in msgs {
            if let Some(c) = collect.as_deref_mut() {
                c.push(m.clone());
            }
            let _ = self.ev_tx.send(Event::of(m));
        }
    }

    fn complete(&mut self, id: u64, result: Result<Body, ClientError>) {
        match self.pending.remove(&id) {
            Some(tx) => {
                let _ = tx.send(result);
            }
            None => trace!(req_id = id, "reply without a waiting request"),
        }
    }

    async fn on_sync_page(
        &mut self,
        conn: &mut RawConn,
        mut job: SyncJob,
        resp: SyncResponse,
    ) -> Result<(), Stop> {
        let page_len = resp.messages.len();
        let mut page_convs: Vec<String> = Vec::new();
        for m in resp.messages {
            let conv = m.conversation_id.clone();
            if page_convs.last() != Some(&conv) {
                page_convs.push(conv.clone());
            }
            if job.seen.insert(conv.clone()) {
                // First seq of this conversation in the sync. Read from our own cursor, or
                // from the stored one while we have no baseline, it follows directly on
                // that cursor: the seqs between are not there for this user.
                if job.own.contains(&conv) || self.tracker.delivered(&conv) == 0 {
                    job.settled.insert(conv.clone());
                    let ready = self.tracker.settle(&conv, m.seq.saturating_sub(1));
                    self.emit(ready, job.reply.is_some().then_some(&mut job.collected));
                }
            }
            let seq = job.cursors.entry(conv).or_insert(0);
            *seq = (*seq).max(m.seq);
            let arrival = self.tracker.arrive(m);
            if arrival.gap {
                // Read from a stored cursor that is ahead of what the app has (another
                // device acked it): fill from our own cursor next time.
                self.bg_wanted = true;
            }
            self.emit(
                arrival.ready,
                job.reply.is_some().then_some(&mut job.collected),
            );
        }
        if resp.more && page_len > 0 {
            job.last_page = page_convs;
            return self.send_sync_page(conn, job).await;
        }
        if !resp.more {
            // Complete: every seq held when the sync started was committed before it
            // read, so a conversation read from an authoritative cursor has no hole left
            // below those (what was missing is not there for this user).
            for (conv, top) in std::mem::take(&mut job.held_at_start) {
                let authoritative = job.own.contains(&conv)
                    || job.settled.contains(&conv)
                    || (!job.seen.contains(&conv) && self.tracker.delivered(&conv) == 0);
                if authoritative {
                    let ready = self.tracker.settle(&conv, top);
                    self.emit(ready, job.reply.is_some().then_some(&mut job.collected));
                }
            }
        }
        let collected = std::mem::take(&mut job.collected);
        self.finish_sync(job, Ok(collected));
        Ok(())
    }

    /// A sync page was refused. `NOT_MEMBER` for a conversation we named (a group left
    /// while seqs were held there): its hole can no longer be filled, so what is held is
    /// released in order, and the page is asked again without it. Otherwise the sync fails.
    async fn on_sync_error(
        &mut self,
        conn: &mut RawConn,
        mut job: SyncJob,
        err: ClientError,
    ) -> Result<(), Stop> {
        // Paging faster than the server's sync rate limit: wait as told, ask again, and
        // keep that pace for the rest of the sync (refusals in a row would close it as a
        // flood).
        if let ClientError::Server {
            code: ErrorCode::RateLimited,
            retry_after_ms,
            ..
        } = &err
        {
            let wait = Duration::from_millis(u64::from(*retry_after_ms).clamp(1, 1000));
            // The hint is the wait for one token, which may be partly refilled: each
            // further refusal doubles the pace, so it passes the server's rate soon.
            job.pace = (job.pace * 2)
                .max(wait + wait / 4)
                .min(Duration::from_secs(1));
            debug!(
                pace_ms = job.pace.as_millis() as u64,
                "sync page rate limited: pacing"
            );
            return self.send_sync_page(conn, job).await;
        }
        let named = match &err {
            ClientError::Server {
                code: ErrorCode::NotMember,
                message,
                ..
            } => job
                .cursors
                .keys()
                .find(|c| message.ends_with(&format!(" {c}")))
                .cloned(),
            _ => None,
        };
        let Some(conv) = named else {
            self.finish_sync(job, Err(err));
            return Ok(());
        };
        debug!(conversation = %conv, "not a member any more: giving up its hole");
        job.cursors.remove(&conv);
        job.own.remove(&conv);
        job.held_at_start.remove(&conv);
        let top = self
            .tracker
            .holes()
            .into_iter()
            .find(|(c, _, _)| *c == conv)
            .map_or(0, |(_, _, top)| top);
        let ready = self.tracker.settle(&conv, top);
        self.emit(ready, job.reply.is_some().then_some(&mut job.collected));
        self.send_sync_page(conn, job).await
    }

    fn finish_sync(&mut self, job: SyncJob, result: Result<Vec<ChatMessage>, ClientError>) {
        match job.reply {
            Some(reply) => {
                let _ = reply.send(result);
            }
            None => {
                self.bg_running = false;
                if let Err(e) = result {
                    // Holes left are retried by housekeeping.
                    debug!(error = %e, "background sync failed");
                }
            }
        }
    }

    async fn flush_acks(&mut self, conn: &mut RawConn) -> Result<(), Stop> {
        self.ack_deadline = None;
        let acks = self.tracker.take_acks();
        if acks.is_empty() {
            return Ok(());
        }
        trace!(count = acks.len(), "sending DeliverAcks");
        let frames = acks.into_iter().map(|(conversation_id, seq)| {
            im_proto::frame(
                0,
                Body::DeliverAck(DeliverAck {
                    conversation_id,
                    seq,
                }),
            )
        });
        conn.send_all(frames).await.map_err(lost)
    }

    async fn on_heartbeat(&mut self, conn: &mut RawConn) -> Result<(), Stop> {
        if self.last_rx.elapsed() > self.heartbeat * DEAD_AFTER_HEARTBEATS {
            return Err(Stop::Lost(format!(
                "no frame from the server for {:?}",
                self.last_rx.elapsed()
            )));
        }
        // The pong carries a req_id nobody waits for: `complete` drops it.
        let id = self.alloc_req_id();
        let ping = Ping {
            client_time: im_proto::now_ms(),
        };
        conn.send(&im_proto::frame(id, Body::Ping(ping)))
            .await
            .map_err(lost)
    }

    /// Drops requests whose caller gave up, fails sync pages past the request timeout,
    /// and starts a background sync for seqs held above a hole for a while.
    fn housekeeping(&mut self) {
        self.pending.retain(|_, tx| !tx.is_closed());
        if self.tracker.has_held() {
            self.held_passes += 1;
            if self.held_passes >= HELD_PASSES {
                self.held_passes = 0;
                self.bg_wanted = true;
            }
        } else {
            self.held_passes = 0;
        }
        let timeout = self.cfg.request_timeout;
        let expired: Vec<u64> = self
            .syncs
            .iter()
            .filter(|(_, j)| j.sent_at.elapsed() > timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(job) = self.syncs.remove(&id) {
                self.finish_sync(job, Err(ClientError::Timeout));
            }
        }
    }

    /// Connection gone: tell the app, fail what was in flight (sends are resent by `Client::send`).
    fn on_lost(&mut self, reason: String) {
        self.shared.connected.store(false, Ordering::Release);
        let _ = self.ev_tx.send(Event::Disconnected { reason });
        for (_, tx) in self.pending.drain() {
            let _ = tx.send(Err(ClientError::Disconnected));
        }
        for (_, job) in std::mem::take(&mut self.syncs) {
            self.finish_sync(job, Err(ClientError::Disconnected));
        }
        self.bg_running = false;
        self.bg_wanted = false;
        self.ack_deadline = None;
    }

    /// Reconnects with backoff; commands that arrive meanwhile are kept for afterwards.
    async fn reconnect(&mut self) -> Reconnect {
        let mut backoff = Backoff::new(self.cfg.reconnect_min, self.cfg.reconnect_max);
        let mut attempts = 0usize;
        let lost_node = self
            .shared
            .session
            .lock()
            .map(|s| s.node_id.clone())
            .unwrap_or_default();
        loop {
            let lost_node = lost_node.clone();
            let delay = tokio::time::sleep(backoff.next_delay());
            tokio::pin!(delay);
            loop {
                tokio::select! {
                    _ = &mut delay => break,
                    cmd = self.cmd_rx.recv() => if let Some(exit) = self.hold(cmd) {
                        return exit;
                    },
                }
            }
            let req_id = self.alloc_req_id();
            attempts += 1;
            // A fresh token for the new connection (the old one may have expired).
            if let Some(provider) = self.cfg.token_provider.clone() {
                match tokio::time::timeout(self.cfg.request_timeout, provider()).await {
                    Ok(Ok(token)) => self.cfg.token = token,
                    Ok(Err(e)) => warn!(error = %e, "token provider failed; using the last token"),
                    Err(_) => warn!("token provider timed out; using the last token"),
                }
            }
            let cfg = self.cfg.clone();
            let attempt = async move {
                // Ask the cluster where to go, leaving out the node just lost.
                let avoid = (!lost_node.is_empty()).then_some(lost_node.as_str());
                let url = crate::route::target_url(&cfg, attempts, avoid).await?;
                connect_and_login(
                    url,
                    cfg.tls.clone(),
                    cfg.token.clone(),
                    cfg.device_id.clone(),
                    req_id,
                    cfg.request_timeout,
                )
                .await
            };
            tokio::pin!(attempt);
            let result = loop {
                tokio::select! {
                    r = &mut attempt => break r,
                    cmd = self.cmd_rx.recv() => if let Some(exit) = self.hold(cmd) {
                        return exit;
                    },
                }
            };
            match result {
                Ok((conn, ok)) => {
                    debug!(node_id = %ok.node_id, "reconnected");
                    return Reconnect::Up(Box::new(conn), ok);
                }
                Err(ClientError::Server {
                    code: ErrorCode::Unauthenticated,
                    message,
                    ..
                }) => return Reconnect::Fatal(format!("login refused: {message}")),
                Err(e) => debug!(error = %e, "reconnect attempt failed"),
            }
        }
    }

    /// While disconnected: queue a command, or say how to exit.
    fn hold(&mut self, cmd: Option<Command>) -> Option<Reconnect> {
        match cmd {
            None => Some(Reconnect::Exit(None)),
            Some(Command::Close { done }) => Some(Reconnect::Exit(Some(done))),
            Some(cmd) => {
                self.backlog.push_back(cmd);
                None
            }
        }
    }

    /// Best-effort: flush acks, close the socket.
    async fn shutdown(&mut self, conn: &mut RawConn) {
        self.shared.connected.store(false, Ordering::Release);
        let work = async {
            let _ = self.flush_acks(conn).await;
            let _ = conn.close().await;
        };
        let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, work).await;
    }
}

fn lost(e: ClientError) -> Stop {
    Stop::Lost(e.to_string())
}

fn heartbeat_of(ok: &LoginOk) -> Duration {
    match ok.heartbeat_secs {
        0 => DEFAULT_HEARTBEAT,
        s => Duration::from_secs(u64::from(s)),
    }
}

/// Opens a connection and logs in with `resume = true` (for reconnects), within `timeout`.
async fn connect_and_login(
    url: String,
    tls: Option<crate::TlsConfig>,
    token: String,
    device_id: String,
    req_id: u64,
    timeout: Duration,
) -> Result<(RawConn, LoginOk), ClientError> {
    let deadline = Instant::now() + timeout;
    let opts = crate::RawConnOptions::new().tls(tls);
    let mut conn = tokio::time::timeout_at(deadline, RawConn::connect_with(&url, &opts))
        .await
        .map_err(|_| ClientError::Timeout)??;
    let left = deadline.saturating_duration_since(Instant::now());
    let ok = conn
        .login_with(req_id, &token, &device_id, true, left)
        .await?;
    Ok((conn, ok))
}
