//! Pipeline: the stages a logged-in client's frame goes through after decode: auth (the
//! session), validate, relation, then the hand-off of every write to the writer
//! (`persist`), which commits and hands the result to the router (`route`). Group operations are checked
//! for shape and rate here; who may do what is decided by the store in the change's
//! transaction (`store::access`).
//! [`Pipeline::handle`] is called by the gateway's read loop, one frame at a time per
//! connection; replies and pushes leave through the connection's [`Outbound`].

pub mod announce;
mod edits;
pub mod live;
pub mod reads;

pub use crate::persist::Refusal;
// The old paths of the router and the membership cache, for `cluster` until it names
// `crate::route` and `crate::store::membership` itself.
pub use crate::route;
pub use crate::store::membership as relation;

use std::sync::Arc;
use std::time::{Duration, Instant};

use im_proto::{
    frame, group_op, parse_conversation, send, Body, ConversationRef, DeliverAck, ErrorCode, Frame,
    GroupOp, GroupOpOk, MessageType, Pong, Send, SyncRequest, SyncResponse,
};

use crate::config::Limits;
use crate::flow::Outbound;
use crate::obs::runtime::{spawn, Task};
use crate::obs::{Metrics, Stage};
use crate::persist::{self, PersistHandle, PersistReq, WriteReq};
use crate::route::{receipts, Recipients};
use crate::store::membership::Relations;
use crate::store::{CursorUpdate, GroupRequest, NewMessage, Store, StoreHealth};

/// Longest accepted client_msg_id, in bytes.
pub const MAX_CLIENT_MSG_ID: usize = 128;
/// Most cursors one SyncRequest may carry.
pub const MAX_SYNC_CURSORS: usize = 10_000;
/// Default page size when SyncRequest.limit is 0.
pub const DEFAULT_SYNC_LIMIT: u32 = 200;

/// A logged-in connection as the pipeline sees it.
pub struct Session {
    /// The authenticated user.
    pub user_id: String,
    /// The logged-in device (`Login.device_id`, `"default"` when empty): the owner of
    /// the delivered and read cursors this connection moves and syncs from.
    pub device_id: String,
    /// Its outbound queue.
    pub out: Arc<Outbound>,
    /// Its Send rate limit.
    pub sends: std::sync::Mutex<TokenBucket>,
    /// Its DeliverAck, SyncRequest and GroupOp rate limits.
    limits: std::sync::Mutex<FrameBuckets>,
    /// Last seqs of conversations this session has seen (DeliverAck checks), bounded.
    last_seqs: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Its MarkRead, ListConversations and SetConversationFlags rate limits.
    reads: std::sync::Mutex<reads::ReadBuckets>,
    /// Its PresenceSubscribe, SetPresence and Typing rate limits (`pipeline::live`).
    live: std::sync::Mutex<live::LiveBuckets>,
}

/// The per-connection token buckets of the frame kinds other than Send and Ping.
#[derive(Debug)]
struct FrameBuckets {
    acks: TokenBucket,
    syncs: TokenBucket,
    group_ops: TokenBucket,
}

/// Most conversations a session remembers the last seq of (then the memory starts over).
const LAST_SEQS_MAX: usize = 1024;

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket; `rate` 0 means unlimited.
    pub fn new(rate: u32, burst: u32) -> Self {
        TokenBucket {
            rate: rate as f64,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            at: Instant::now(),
        }
    }

    /// Takes a token; on refusal returns the milliseconds until one is available.
    pub fn take(&mut self, now: Instant) -> Result<(), u32> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - self.tokens) / self.rate) * 1000.0).ceil().max(1.0) as u32)
        }
    }
}

impl Session {
    /// A session for `user_id` on `out`, with the configured send limit.
    pub fn new(user_id: String, out: Arc<Outbound>, limits: &Limits) -> Self {
        Session {
            user_id,
            device_id: reads::DEFAULT_DEVICE.to_owned(),
            out,
            sends: std::sync::Mutex::new(TokenBucket::new(
                limits.send_rate_per_sec,
                limits.send_burst,
            )),
            limits: std::sync::Mutex::new(FrameBuckets {
                acks: TokenBucket::new(limits.deliver_ack_rate_per_sec, limits.deliver_ack_burst),
                syncs: TokenBucket::new(limits.sync_rate_per_sec, limits.sync_burst),
                group_ops: TokenBucket::new(limits.group_op_rate_per_sec, limits.group_op_burst),
            }),
            last_seqs: std::sync::Mutex::new(std::collections::HashMap::new()),
            reads: std::sync::Mutex::new(reads::ReadBuckets::new(limits)),
            live: std::sync::Mutex::new(live::LiveBuckets::new(limits)),
        }
    }

    /// Takes a token of the frame kind's bucket (DeliverAck, Sync, GroupOp; others
    /// pass); the RATE_LIMITED refusal when it is empty.
    fn rate_limit(&self, body: &Body) -> Result<(), Refusal> {
        if !matches!(body, Body::DeliverAck(_) | Body::Sync(_) | Body::GroupOp(_)) {
            return Ok(());
        }
        let now = Instant::now();
        let Ok(mut b) = self.limits.lock() else {
            return Ok(());
        };
        let (taken, what) = match body {
            Body::DeliverAck(_) => (b.acks.take(now), "acking"),
            Body::Sync(_) => (b.syncs.take(now), "syncing"),
            _ => (b.group_ops.take(now), "changing groups"),
        };
        taken.map_err(|retry_after_ms| Refusal {
            code: ErrorCode::RateLimited,
            message: format!("{what} too fast"),
            retry_after_ms,
            bad_reason: Some("rate_limited"),
        })
    }

    fn reply(&self, f: &Frame) {
        self.out.push(im_proto::encode(f), true);
    }
}

/// Shared state of the stages after decode.
pub struct Pipeline {
    /// The store (reads; writes go through the persistence writer).
    pub store: Arc<dyn Store>,
    /// Group membership cache.
    pub relations: Arc<Relations>,
    /// The persistence queue.
    pub persist: PersistHandle,
    /// Online sessions and fan-out.
    pub router: Arc<route::Router>,
    /// Protocol limits.
    pub limits: Limits,
    /// retry_after_ms for OVERLOADED.
    pub retry_after_ms: u32,
    /// Whether the store takes writes now (its commit fault is the writer's, its disk
    /// floor the sampler's); Sends are refused while it does not.
    pub health: Arc<StoreHealth>,
    /// retry_after_ms for a Send refused by the store's health (the probe interval).
    pub unhealthy_retry_ms: u32,
    /// Byte budget of a sync page (`flow.sync_page_bytes`, capped by the soft mark).
    pub sync_page_bytes: usize,
    /// Metric handles.
    pub metrics: Metrics,
    /// The per-user diagnosis (`obs::users`): rings of tracked users, refusal counts.
    pub users: Arc<crate::obs::users::UserDiag>,
    /// Per-user GroupOp rate limits on this node.
    group_op_users: std::sync::Mutex<std::collections::HashMap<String, TokenBucket>>,
}

/// Users whose GroupOp buckets are kept before idle ones are dropped.
const GROUP_OP_USERS_MAX: usize = 100_000;

impl Pipeline {
    /// Builds the stages on `store` (membership cache, router task, persistence writer
    /// task) and spawns the tasks on the current tokio runtime, single node: for driving
    /// connections without a node (tests, `fuzz/`).
    pub fn spawn(
        store: Arc<dyn Store>,
        config: &crate::config::Config,
        metrics: Metrics,
    ) -> Arc<Self> {
        let relations = Arc::new(Relations::new(store.clone()));
        Self::spawn_with(store, relations, None, config, metrics).0
    }

    /// As [`Pipeline::spawn`] with a given membership cache and, in cluster mode, the
    /// router's link to the other nodes; also returns the writer task (`Node::start`).
    pub fn spawn_with(
        store: Arc<dyn Store>,
        relations: Arc<Relations>,
        link: Option<Arc<dyn route::Peers>>,
        config: &crate::config::Config,
        metrics: Metrics,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let users = crate::obs::users::UserDiag::new(
            config.obs.user_diag_ring,
            config.obs.user_diag_sample_every,
            config.obs.user_diag_max_users,
        );
        let router = Arc::new(
            route::Router::new(metrics.clone(), config.flow.notify_group_threshold, link)
                .with_users(users.clone()),
        );
        let (route_tx, route_rx) = tokio::sync::mpsc::channel(1024);
        spawn(Task::Router, router.clone().run(route_rx));
        let (persist, persist_rx) =
            persist::queue(config.persist.queue_capacity as usize, metrics.clone());
        let guard = persist::Guard::new(&config.store);
        let health = guard.health.clone();
        let (receipts_tx, receipts_rx) = receipts::channel(&config.receipts);
        spawn(
            Task::Receipts,
            receipts::run(
                receipts_rx,
                store.clone(),
                relations.clone(),
                router.clone(),
                config.receipts.clone(),
            ),
        );
        let wiring = persist::Wiring {
            store: store.clone(),
            relations: relations.clone(),
            router: route_tx,
            receipts: Some(receipts_tx),
            cfg: config.persist.clone(),
            guard,
            metrics: metrics.clone(),
        };
        let writer = spawn(Task::Writer, persist::Writer::new(wiring, persist_rx).run());
        let pipeline = Arc::new(Pipeline {
            store,
            relations,
            persist,
            router,
            limits: config.limits.clone(),
            retry_after_ms: config.persist.retry_after_ms,
            health,
            unhealthy_retry_ms: config.store.probe_interval_ms,
            sync_page_bytes: config.flow.sync_page_budget(),
            metrics,
            users,
            group_op_users: Default::default(),
        });
        (pipeline, writer)
    }

    /// Handles one frame from a logged-in session. `started` is when its decode began.
    pub async fn handle(&self, s: &Session, f: Frame, started: Instant) -> Result<(), Refusal> {
        let t = Instant::now();
        let req_id = f.req_id;
        let Some(body) = f.body else {
            return Err(Refusal::bad("frame has no body"));
        };
        s.rate_limit(&body)?;
        self.metrics.stage_since(Stage::Auth, t);
        match body {
            Body::Send(send) => self.on_send(s, req_id, send, started).await,
            Body::DeliverAck(ack) => self.on_deliver_ack(s, ack).await,
            Body::Sync(req) => self.on_sync(s, req_id, req).await,
            Body::Ping(p) => {
                s.reply(&frame(
                    req_id,
                    Body::Pong(Pong {
                        client_time: p.client_time,
                        server_time: im_proto::now_ms(),
                    }),
                ));
                Ok(())
            }
            Body::GroupOp(op) => self.on_group_op(s, req_id, op).await,
            Body::MarkRead(m) => self.on_mark_read(s, req_id, m).await,
            Body::ListConversations(l) => self.on_list_conversations(s, req_id, l).await,
            Body::SetConversationFlags(f) => self.on_set_flags(s, req_id, f).await,
            Body::FetchHistory(h) => self.on_fetch_history(s, req_id, h).await,
            Body::Recall(r) => self.on_recall(s, req_id, r, started).await,
            Body::Edit(e) => self.on_edit(s, req_id, e, started).await,
            Body::DeleteForMe(d) => self.on_delete_for_me(s, req_id, d).await,
            Body::PresenceSubscribe(p) => self.on_presence_subscribe(s, req_id, p).await,
            Body::SetPresence(p) => self.on_set_presence(s, req_id, p).await,
            Body::Typing(t) => self.on_typing(s, req_id, t).await,
            Body::Login(_) => Err(Refusal::bad("already logged in")),
            Body::Batch(_) => Err(Refusal::bad("nested batch")),
            _ => Err(Refusal::bad("not a client frame")),
        }
    }

    async fn on_send(
        &self,
        s: &Session,
        req_id: u64,
        send: Send,
        started: Instant,
    ) -> Result<(), Refusal> {
        let t = Instant::now();
        // One cheap check per message: None unless sampled or the sender is filtered.
        let mut trace = self.metrics.tracer.begin(&s.user_id, started);
        if let Some(tr) = trace.as_deref_mut() {
            tr.stage(Stage::Decode, started, t);
        }
        let limited = s.sends.lock().map(|mut b| b.take(t)).unwrap_or(Ok(()));
        if let Err(retry_after_ms) = limited {
            return Err(Refusal {
                code: ErrorCode::RateLimited,
                message: "sending too fast".into(),
                retry_after_ms,
                bad_reason: Some("rate_limited"),
            });
        }
        if let Some(reason) = self.health.refusal() {
            metrics::counter!("im_store_refused_sends_total", "reason" => reason).increment(1);
            return Err(Refusal::store_unavailable(reason, self.unhealthy_retry_ms));
        }
        match MessageType::try_from(send.r#type) {
            Err(_) => {
                return Err(Refusal::bad(format!(
                    "unknown message type {}",
                    send.r#type
                )))
            }
            Ok(MessageType::System) => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "SYSTEM messages are written by the server only",
                    Some("forbidden"),
                ))
            }
            Ok(MessageType::Recall | MessageType::Edit) => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "RECALL and EDIT events are made by the Recall and Edit frames",
                    Some("forbidden"),
                ))
            }
            Ok(_) => {}
        }
        if send.client_msg_id.len() > MAX_CLIENT_MSG_ID {
            return Err(Refusal::bad(format!(
                "client_msg_id longer than {MAX_CLIENT_MSG_ID} bytes"
            )));
        }
        let target = match send.target {
            Some(send::Target::ToUser(u)) if u == announce::SYSTEM_SENDER => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "the system sender takes no messages",
                    Some("forbidden"),
                ))
            }
            Some(send::Target::ToUser(u)) if im_proto::valid_id(&u) => send::Target::ToUser(u),
            Some(send::Target::GroupId(g)) if im_proto::valid_id(&g) => send::Target::GroupId(g),
            Some(_) => return Err(Refusal::bad("invalid to_user or group_id")),
            None => return Err(Refusal::bad("send needs to_user or group_id")),
        };
        self.metrics.stage_since(Stage::Validate, t);
        if let Some(tr) = trace.as_deref_mut() {
            tr.stage(Stage::Validate, t, Instant::now());
        }

        let t = Instant::now();
        let (conversation_id, recipients, direct) = match target {
            send::Target::ToUser(to) => (
                im_proto::direct_conversation(&s.user_id, &to),
                Recipients::Direct(s.user_id.clone(), to.clone()),
                Some((s.user_id.clone(), to)),
            ),
            send::Target::GroupId(g) => {
                let members = self.relations.members(&g).await.map_err(Refusal::store)?;
                let Some(members) = members else {
                    return Err(Refusal::code(
                        ErrorCode::NotFound,
                        format!("group {g} not found"),
                        None,
                    ));
                };
                if !relation::is_in(&members, &s.user_id) {
                    return Err(Refusal::code(
                        ErrorCode::NotMember,
                        format!("not a member of group {g}"),
                        Some("not_member"),
                    ));
                }
                (
                    im_proto::group_conversation(&g),
                    Recipients::Group(members),
                    None,
                )
            }
        };
        self.metrics.stage_since(Stage::Relation, t);
        self.metrics.message_received(send.r#type);
        let msg_id = uuid::Uuid::now_v7().simple().to_string();
        if let Some(tr) = trace.as_deref_mut() {
            tr.stage(Stage::Relation, t, Instant::now());
            tr.set_message(&msg_id, &conversation_id);
        }

        let req = PersistReq {
            message: NewMessage {
                conversation_id,
                sender: s.user_id.clone(),
                client_msg_id: send.client_msg_id,
                msg_type: send.r#type,
                payload: send.payload,
                msg_id,
                direct,
                reference: None,
            },
            req_id,
            origin: s.out.clone(),
            recipients,
            started,
            enqueued: Instant::now(),
            trace,
        };
        if self.persist.try_submit(WriteReq::Message(req)).is_err() {
            self.metrics.persist_overloaded.increment(1);
            return Err(
                self.overloaded("persistence queue full, retry with the same client_msg_id")
            );
        }
        Ok(())
    }

    /// The OVERLOADED refusal for a full persistence queue, with the retry hint.
    fn overloaded(&self, message: &str) -> Refusal {
        Refusal {
            code: ErrorCode::Overloaded,
            message: message.into(),
            retry_after_ms: self.retry_after_ms,
            bad_reason: None,
        }
    }

    /// Whether `user` may read `conversation_id`.
    async fn can_read(&self, user: &str, conversation_id: &str) -> Result<bool, Refusal> {
        match parse_conversation(conversation_id) {
            Some(c @ ConversationRef::Direct(..)) => Ok(c.is_direct_party(user)),
            Some(ConversationRef::Group(g)) => self
                .relations
                .is_member(g, user)
                .await
                .map_err(Refusal::store),
            None => Err(Refusal::bad(format!(
                "invalid conversation id {conversation_id:?}"
            ))),
        }
    }

    async fn on_deliver_ack(&self, s: &Session, ack: DeliverAck) -> Result<(), Refusal> {
        if !self.can_read(&s.user_id, &ack.conversation_id).await? {
            return Err(Refusal::code(
                ErrorCode::NotMember,
                format!("not a member of {}", ack.conversation_id),
                Some("not_member"),
            ));
        }
        // Only up to what the conversation holds: an ack for a conversation that does
        // not exist, or past its last seq, writes nothing.
        if !self.seq_exists(s, &ack.conversation_id, ack.seq).await? {
            return Err(Refusal::bad(format!(
                "no seq {} in {}",
                ack.seq, ack.conversation_id
            )));
        }
        // Cursors are advisory: if the queue is full this one is skipped and a later
        // (cumulative) ack carries it.
        let _ = self.persist.try_submit(WriteReq::Cursor(CursorUpdate {
            user_id: s.user_id.clone(),
            device_id: s.device_id.clone(),
            conversation_id: ack.conversation_id,
            seq: ack.seq,
        }));
        Ok(())
    }

    /// Whether `conversation_id` exists and holds `seq` (1 ..= its last seq); the last
    /// seq comes from what this node committed or from the store, and is remembered by
    /// the session while acks stay under it.
    async fn seq_exists(
        &self,
        s: &Session,
        conversation_id: &str,
        seq: u64,
    ) -> Result<bool, Refusal> {
        if seq == 0 {
            return Ok(false);
        }
        let known = s
            .last_seqs
            .lock()
            .ok()
            .and_then(|m| m.get(conversation_id).copied());
        if known.is_some_and(|last| seq <= last) {
            return Ok(true);
        }
        // What this node just committed (the usual case: an ack of a fresh delivery),
        // before a store read.
        let last = match self.persist.last_committed(conversation_id) {
            Some(last) if seq <= last => Some(last),
            _ => self
                .store
                .last_seq(conversation_id)
                .await
                .map_err(Refusal::store)?,
        };
        let Some(last) = last else {
            return Ok(false);
        };
        if let Ok(mut m) = s.last_seqs.lock() {
            if m.len() >= LAST_SEQS_MAX {
                m.clear();
            }
            m.insert(conversation_id.to_owned(), last);
        }
        Ok(seq <= last)
    }

    async fn on_sync(&self, s: &Session, req_id: u64, req: SyncRequest) -> Result<(), Refusal> {
        if req.cursors.len() > MAX_SYNC_CURSORS {
            return Err(Refusal::bad(format!(
                "more than {MAX_SYNC_CURSORS} cursors"
            )));
        }
        // Cleared before the read, so a message committed after it hints again.
        s.out.clear_sync_hint();
        let limit = match req.limit {
            0 => DEFAULT_SYNC_LIMIT.min(self.limits.sync_limit_max),
            n => n.min(self.limits.sync_limit_max),
        };
        let mut cursors = Vec::with_capacity(req.cursors.len());
        for c in req.cursors {
            if !self.can_read(&s.user_id, &c.conversation_id).await? {
                return Err(Refusal::code(
                    ErrorCode::NotMember,
                    format!("not a member of {}", c.conversation_id),
                    Some("not_member"),
                ));
            }
            cursors.push((c.conversation_id, c.after_seq));
        }
        let (messages, more) = self
            .store
            .sync_device(
                &s.user_id,
                &s.device_id,
                &cursors,
                limit,
                self.sync_page_bytes,
            )
            .await
            .map_err(Refusal::store)?;
        s.reply(&frame(
            req_id,
            Body::SyncResp(SyncResponse { messages, more }),
        ));
        Ok(())
    }

    /// Takes a GroupOp token from the user's bucket on this node (the connection's was
    /// taken with the frame, in [`Session::rate_limit`]).
    fn group_op_allowed(&self, s: &Session) -> Result<(), Refusal> {
        let now = Instant::now();
        let limited = |retry_after_ms| Refusal {
            code: ErrorCode::RateLimited,
            message: "changing groups too fast".into(),
            retry_after_ms,
            bad_reason: Some("rate_limited"),
        };
        let l = &self.limits;
        if l.group_op_rate_per_sec == 0 {
            return Ok(());
        }
        if let Ok(mut users) = self.group_op_users.lock() {
            if users.len() >= GROUP_OP_USERS_MAX && !users.contains_key(&s.user_id) {
                // Buckets idle long enough to be full again carry no state: drop them.
                let full = Duration::from_secs_f64(
                    l.group_op_burst as f64 / l.group_op_rate_per_sec.max(1) as f64,
                );
                users.retain(|_, b| now.saturating_duration_since(b.at) < full);
                if users.len() >= GROUP_OP_USERS_MAX {
                    return Err(limited(1000));
                }
            }
            users
                .entry(s.user_id.clone())
                .or_insert_with(|| TokenBucket::new(l.group_op_rate_per_sec, l.group_op_burst))
                .take(now)
                .map_err(limited)?;
        }
        Ok(())
    }

    async fn on_group_op(&self, s: &Session, req_id: u64, op: GroupOp) -> Result<(), Refusal> {
        let kind = group_op::Op::try_from(op.op)
            .map_err(|_| Refusal::bad(format!("unknown group op {}", op.op)))?;
        let group_kind = group_op::Kind::try_from(op.kind)
            .map_err(|_| Refusal::bad(format!("unknown group kind {}", op.kind)))?;
        let role = group_op::Role::try_from(op.role)
            .map_err(|_| Refusal::bad(format!("unknown role {}", op.role)))?;
        let group_id = if op.group_id.is_empty() && kind == group_op::Op::Create {
            format!("grp-{}", uuid::Uuid::now_v7().simple())
        } else if im_proto::valid_id(&op.group_id) {
            op.group_id
        } else {
            return Err(Refusal::bad("invalid group_id"));
        };
        if let Some(bad) = op.members.iter().find(|m| !im_proto::valid_id(m)) {
            return Err(Refusal::bad(format!("invalid member id {bad:?}")));
        }
        if op.members.len() > self.limits.max_group_members as usize {
            return Err(Refusal::bad(format!(
                "more than {} members",
                self.limits.max_group_members
            )));
        }
        self.group_op_allowed(s)?;
        // JOIN naming others is how older clients added members: it means ADD.
        let kind = match kind {
            group_op::Op::Join if op.members.iter().any(|m| *m != s.user_id) => group_op::Op::Add,
            k => k,
        };
        let req = GroupRequest {
            actor: s.user_id.clone(),
            op: kind,
            users: op.members,
            kind: group_kind,
            role,
            members_can_invite: op.members_can_invite,
            max_members: self.limits.max_group_members,
            max_groups_per_user: self.limits.max_groups_per_user,
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        let write = WriteReq::Group {
            group_id: group_id.clone(),
            req,
            reply,
        };
        if self.persist.try_submit(write).is_err() {
            return Err(self.overloaded("persistence queue full"));
        }
        let state = match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(result)) => result.map_err(Refusal::store)?,
            _ => {
                return Err(Refusal::code(
                    ErrorCode::Internal,
                    "group change timed out",
                    None,
                ))
            }
        };
        s.reply(&frame(
            req_id,
            Body::GroupOpOk(GroupOpOk {
                group_id,
                members: state.members,
                kind: state.kind as i32,
                role: state.role as i32,
                members_can_invite: state.members_can_invite,
                version: state.version,
            }),
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::TokenBucket;
    use std::time::{Duration, Instant};

    #[test]
    fn bucket_allows_burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        assert!((0..3).all(|_| b.take(t0).is_ok()));
        let wait = b.take(t0).unwrap_err();
        assert!((1..=100).contains(&wait), "{wait}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
        let mut free = TokenBucket::new(0, 1);
        assert!((0..1000).all(|_| free.take(t0).is_ok()));
    }
}
