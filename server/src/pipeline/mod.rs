//! Pipeline: the stages a logged-in client's frame goes through after decode: auth (the
//! session), validate, relation, then the hand-off of every write to the writer
//! (`persist`), which commits and hands the result to the router (`route`). Group operations are checked
//! for shape and rate here; who may do what is decided by the store in the change's
//! transaction (`store::access`).
//! [`Pipeline::handle`] is called by the gateway's read loop, one frame at a time per
//! connection; replies and pushes leave through the connection's [`Outbound`].

pub mod announce;
mod edits;
mod groups;
pub mod limits;
pub mod live;
pub mod reads;
mod reconcile;
mod send;
mod sync;

pub use crate::persist::Refusal;
pub use limits::{FrameKind, TokenBucket};

use std::sync::Arc;
use std::time::{Duration, Instant};

use im_proto::{frame, parse_conversation, Body, ConversationRef, ErrorCode, Frame, Pong};

use crate::config::Limits;
use crate::flow::Outbound;
use crate::hooks::before_send::BeforeSend;
use crate::obs::runtime::{spawn, Task};
use crate::obs::{Metrics, Stage};
use crate::persist::{self, PersistHandle, WriteReq};
use crate::route::{self, receipts};
use crate::store::membership::{Members, Relations};
use crate::store::{Store, StoreHealth};
use limits::Buckets;

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
    /// Its rate limits: a token bucket per bucket-owning [`FrameKind`] it has used.
    buckets: Buckets,
    /// Last seqs of conversations this session has seen (DeliverAck checks), bounded.
    last_seqs: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Multi-region: a forwarded request whose forwarding region traces it; its Send is
    /// traced here whatever this node's sampling says.
    pub trace_forced: bool,
}

impl Session {
    /// A session for `user_id` on `out` (its rate limits are the node's, applied as
    /// it takes tokens: [`Session::take`]).
    pub fn new(user_id: String, out: Arc<Outbound>) -> Self {
        Session {
            user_id,
            device_id: reads::DEFAULT_DEVICE.to_owned(),
            out,
            buckets: Buckets::default(),
            last_seqs: std::sync::Mutex::new(std::collections::HashMap::new()),
            trace_forced: false,
        }
    }

    fn reply(&self, f: &Frame) {
        self.out.push(im_proto::encode(f), true);
    }

    /// Replies `body` to request `req_id`: the handler is done.
    fn answer(&self, req_id: u64, body: Body) -> Result<(), Refusal> {
        self.reply(&frame(req_id, body));
        Ok(())
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
    /// Multi-region mode: the conversations' homes (`None`: one region, no check).
    pub region: Option<Arc<crate::region::RegionMap>>,
    /// The before-send hook, when one is configured (`hooks.before_send.url`): asked about
    /// each Send after relation, before the hand-off to the writer.
    pub before_send: Option<Arc<BeforeSend>>,
    /// Per-user GroupOp rate limits on this node.
    group_op_users: std::sync::Mutex<std::collections::HashMap<String, TokenBucket>>,
    /// The receipts task's queue (`route::receipts`): read cursors moved here by another
    /// region (multi-region replication) are handed to it like the writer's.
    pub receipts: tokio::sync::mpsc::Sender<receipts::ReadEvent>,
}

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
        Self::spawn_with(store, relations, None, None, config, metrics).0
    }

    /// As [`Pipeline::spawn`] with a given membership cache and, in cluster mode, the
    /// router's link to the other nodes and the before-send hook; also returns the writer
    /// task (`Node::start`).
    pub fn spawn_with(
        store: Arc<dyn Store>,
        relations: Arc<Relations>,
        link: Option<Arc<dyn route::Peers>>,
        before_send: Option<Arc<BeforeSend>>,
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
            receipts: Some(receipts_tx.clone()),
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
            region: crate::region::RegionMap::from_config(config),
            before_send,
            group_op_users: Default::default(),
            receipts: receipts_tx,
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
        // DeliverAck, SyncRequest and GroupOp take their token here; the other kinds
        // in their handlers, after the checks that come first.
        if let Some(kind @ (FrameKind::DeliverAck | FrameKind::Sync | FrameKind::GroupOp)) =
            FrameKind::of(&body)
        {
            s.take(kind, &self.limits)?;
        }
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

    /// Hands `req` to the writer without waiting; a full queue is refused OVERLOADED
    /// with the retry hint (a Send's or read state's also counted in
    /// `im_persist_overloaded_total`).
    fn submit(&self, req: WriteReq) -> Result<(), Refusal> {
        let (counted, message) = match &req {
            WriteReq::Message(_) => (
                true,
                "persistence queue full, retry with the same client_msg_id",
            ),
            WriteReq::State(_) => (true, "persistence queue full, retry"),
            _ => (false, "persistence queue full"),
        };
        if self.persist.try_submit(req).is_ok() {
            return Ok(());
        }
        if counted {
            self.metrics.persist_overloaded.increment(1);
        }
        Err(Refusal {
            code: ErrorCode::Overloaded,
            message: message.into(),
            retry_after_ms: self.retry_after_ms,
            bad_reason: None,
        })
    }

    /// Hands a change to the writer and waits for its outcome (at most 30 s: then
    /// INTERNAL `<what> timed out`).
    async fn submit_and_wait<T>(
        &self,
        req: WriteReq,
        rx: tokio::sync::oneshot::Receiver<Result<T, crate::store::StoreError>>,
        what: &str,
    ) -> Result<T, Refusal> {
        self.submit(req)?;
        match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(result)) => result.map_err(Refusal::store),
            _ => Err(Refusal::code(
                ErrorCode::Internal,
                format!("{what} timed out"),
                None,
            )),
        }
    }

    /// The members of group `g`; NOT_FOUND when there is no such group.
    async fn group_members(&self, g: &str) -> Result<Members, Refusal> {
        let members = self.relations.members(g).await.map_err(Refusal::store)?;
        members
            .ok_or_else(|| Refusal::code(ErrorCode::NotFound, format!("group {g} not found"), None))
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
}
