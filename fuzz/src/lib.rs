//! Shared harness of the fuzz targets (`fuzz_targets/`): the structured inputs of the
//! `protocol` target (sequences of raw and structured WebSocket messages), the real
//! node parts it runs them against (a `Pipeline` on a temp SQLite store, built once per
//! process and rebuilt every [`REBUILD_EVERY`] inputs so the database stays small), and
//! the invariants checked after every step. Nothing is mocked: only the socket is absent.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use im_proto::{Body, ErrorCode, Frame, Message as _};
use im_server::auth::TokenKeys;
use im_server::config::Config;
use im_server::flow::{CloseReason, Outbound, OutboundRx};
use im_server::gateway::protocol::{Input, Protocol, Step};
use im_server::gateway::{Connections, Gateway};
use im_server::obs::Metrics;
use im_server::pipeline::Pipeline;

/// User ids the structured inputs pick from (valid tokens exist for each).
pub const USERS: [&str; 4] = ["alice", "bob", "carol", "dave"];
/// Group ids the structured inputs pick from.
pub const GROUPS: [&str; 3] = ["g1", "g2", "crowd"];
/// Inputs run against one store before the world is rebuilt (bounds its size).
pub const REBUILD_EVERY: u64 = 20_000;
const SECRET: &[u8] = b"fuzz-secret";

/// The fuzzed node's config: small limits, so short inputs reach every close decision.
pub fn fuzz_config(dir: &Path) -> Config {
    let mut c = Config::default();
    c.data_dir = dir.to_path_buf();
    c.log.files = false;
    c.store.sqlite_synchronous = "normal".into();
    c.store.pool_size = 1;
    c.persist.batch_wait_ms = 0;
    c.persist.queue_capacity = 64;
    c.limits.max_frame_bytes = 1024;
    c.limits.max_bad_frames = 3;
    c.limits.send_rate_per_sec = 1;
    c.limits.send_burst = 4;
    c.limits.ping_rate_per_sec = 1;
    c.limits.ping_burst = 3;
    c.limits.deliver_ack_rate_per_sec = 1;
    c.limits.deliver_ack_burst = 3;
    c.limits.sync_rate_per_sec = 1;
    c.limits.sync_burst = 3;
    c.limits.max_batch_frames = 24;
    c.limits.max_rate_limited = 4;
    c.limits.rate_limited_window_secs = 3600;
    c.limits.sync_limit_max = 20;
    c.limits.max_group_members = 8;
    c.limits.group_op_rate_per_sec = 1;
    c.limits.group_op_burst = 4;
    c.limits.max_groups_per_user = 3;
    c.flow.notify_group_threshold = 2;
    c
}

/// A name from the pools or any string.
#[derive(Arbitrary, Debug, Clone)]
pub enum Name {
    /// `USERS` then `GROUPS`, by index (wrapping).
    Pool(u8),
    /// Anything.
    Raw(String),
}

impl Name {
    fn get(&self) -> String {
        match self {
            Name::Pool(i) => {
                let i = *i as usize % (USERS.len() + GROUPS.len());
                USERS
                    .iter()
                    .chain(GROUPS.iter())
                    .nth(i)
                    .map_or("", |s| s)
                    .to_string()
            }
            Name::Raw(s) => s.clone(),
        }
    }
}

/// A Login token.
#[derive(Arbitrary, Debug, Clone)]
pub enum Tok {
    /// A valid token for `USERS[i]`.
    Valid(u8),
    /// Signed with another secret.
    Forged,
    /// Anything.
    Raw(String),
}

/// A string field: short, arbitrary, or long (over the length limits).
#[derive(Arbitrary, Debug, Clone)]
pub enum Str {
    /// `c<n>`.
    Short(u8),
    /// Anything.
    Raw(String),
    /// `n` bytes of `x`.
    Long(u16),
}

impl Str {
    fn get(&self) -> String {
        match self {
            Str::Short(n) => format!("c{n}"),
            Str::Raw(s) => s.clone(),
            Str::Long(n) => "x".repeat(*n as usize % 600),
        }
    }
}

/// A conversation id.
#[derive(Arbitrary, Debug, Clone)]
pub enum Conv {
    /// `u:<a>:<b>` (sorted).
    Direct(Name, Name),
    /// `g:<id>`.
    Group(Name),
    /// Anything.
    Raw(String),
}

impl Conv {
    fn get(&self) -> String {
        match self {
            Conv::Direct(a, b) => im_proto::direct_conversation(&a.get(), &b.get()),
            Conv::Group(g) => im_proto::group_conversation(&g.get()),
            Conv::Raw(s) => s.clone(),
        }
    }
}

/// A Send's target.
#[derive(Arbitrary, Debug, Clone)]
pub enum Target {
    /// None set.
    Missing,
    /// `to_user`.
    User(Name),
    /// `group_id`.
    Group(Name),
}

/// A frame body, client kinds and server kinds (which a client must not send).
#[derive(Arbitrary, Debug, Clone)]
pub enum FBody {
    /// No body.
    Empty,
    /// Login.
    Login {
        /// Token.
        token: Tok,
        /// Device id.
        device_id: Str,
        /// Resume flag.
        resume: bool,
    },
    /// Send.
    Send {
        /// Target.
        target: Target,
        /// Message type (valid 0..=3).
        ty: i8,
        /// Payload.
        payload: Vec<u8>,
        /// Client message id.
        client_msg_id: Str,
    },
    /// DeliverAck.
    DeliverAck(Conv, u64),
    /// SyncRequest.
    Sync(Vec<(Conv, u64)>, u32),
    /// Ping.
    Ping(i64),
    /// GroupOp.
    GroupOp {
        /// Op (valid 0..=10: CREATE .. INFO).
        op: i8,
        /// Group id.
        group: Name,
        /// Members.
        members: Vec<Name>,
        /// Kind (valid 0..=1).
        kind: i8,
        /// Role for SET_ROLE (valid 0..=3).
        role: i8,
        /// Whether members may invite.
        members_can_invite: bool,
    },
    /// A server-only kind (LoginOk, Pong, Error, ...).
    Server(u8),
    /// A nested Batch.
    Batch(Vec<FFrame>),
    /// MarkRead.
    MarkRead(Conv, u64),
    /// ListConversations (after, limit).
    ListConversations(Str, u32),
    /// SetConversationFlags (muted, pinned).
    SetFlags(Conv, bool, bool),
    /// FetchHistory (before_seq, limit).
    History(Conv, u64, u32),
    /// Recall (seq, msg_id, client_msg_id).
    Recall(Conv, u64, Str, Str),
    /// Edit (seq, msg_id, payload, client_msg_id).
    Edit(Conv, u64, Str, Vec<u8>, Str),
    /// DeleteForMe.
    DeleteForMe(Conv, u64),
    /// PresenceSubscribe.
    Presence(Vec<Name>),
    /// SetPresence (hidden).
    SetPresence(bool),
    /// Typing.
    Typing(Conv, bool),
    /// A Batch packed with `n` copies of one frame kind (`kind` % 9: Send, DeliverAck,
    /// Sync, Ping, GroupOp, MarkRead, Typing, ListConversations, FetchHistory), some
    /// over `limits.max_batch_frames`.
    Flood {
        /// The frame kind.
        kind: u8,
        /// How many (0..=255).
        n: u8,
        /// The conversation or group the frames name.
        conv: Conv,
    },
}

/// A structured frame.
#[derive(Arbitrary, Debug, Clone)]
pub struct FFrame {
    /// req_id.
    pub req_id: u64,
    /// Body.
    pub body: FBody,
}

impl FFrame {
    /// The wire frame.
    pub fn build(&self, w: &World) -> Frame {
        use im_proto::*;
        let body = match &self.body {
            FBody::Empty => None,
            FBody::Login {
                token,
                device_id,
                resume,
            } => Some(Body::Login(Login {
                token: match token {
                    Tok::Valid(i) => w.tokens[*i as usize % w.tokens.len()].clone(),
                    Tok::Forged => w.forged.clone(),
                    Tok::Raw(s) => s.clone(),
                },
                device_id: device_id.get(),
                resume: *resume,
            })),
            FBody::Send {
                target,
                ty,
                payload,
                client_msg_id,
            } => Some(Body::Send(Send {
                target: match target {
                    Target::Missing => None,
                    Target::User(n) => Some(send::Target::ToUser(n.get())),
                    Target::Group(n) => Some(send::Target::GroupId(n.get())),
                },
                r#type: *ty as i32,
                payload: payload.clone().into(),
                client_msg_id: client_msg_id.get(),
            })),
            FBody::DeliverAck(c, seq) => Some(Body::DeliverAck(DeliverAck {
                conversation_id: c.get(),
                seq: *seq,
            })),
            FBody::Sync(cursors, limit) => Some(Body::Sync(SyncRequest {
                cursors: cursors
                    .iter()
                    .map(|(c, s)| Cursor {
                        conversation_id: c.get(),
                        after_seq: *s,
                    })
                    .collect(),
                limit: *limit,
                ..Default::default()
            })),
            FBody::Ping(t) => Some(Body::Ping(Ping { client_time: *t })),
            FBody::GroupOp {
                op,
                group,
                members,
                kind,
                role,
                members_can_invite,
            } => Some(Body::GroupOp(GroupOp {
                op: *op as i32,
                group_id: group.get(),
                members: members.iter().map(Name::get).collect(),
                kind: *kind as i32,
                role: *role as i32,
                members_can_invite: *members_can_invite,
            })),
            FBody::MarkRead(c, seq) => Some(Body::MarkRead(MarkRead {
                conversation_id: c.get(),
                seq: *seq,
            })),
            FBody::ListConversations(after, limit) => {
                Some(Body::ListConversations(ListConversations {
                    after: after.get(),
                    limit: *limit,
                }))
            }
            FBody::SetFlags(c, muted, pinned) => {
                Some(Body::SetConversationFlags(SetConversationFlags {
                    conversation_id: c.get(),
                    muted: *muted,
                    pinned: *pinned,
                }))
            }
            FBody::History(c, before_seq, limit) => Some(Body::FetchHistory(FetchHistory {
                conversation_id: c.get(),
                before_seq: *before_seq,
                limit: *limit,
            })),
            FBody::Recall(c, seq, msg_id, cmid) => Some(Body::Recall(Recall {
                conversation_id: c.get(),
                seq: *seq,
                msg_id: msg_id.get(),
                client_msg_id: cmid.get(),
            })),
            FBody::Edit(c, seq, msg_id, payload, cmid) => Some(Body::Edit(Edit {
                conversation_id: c.get(),
                seq: *seq,
                msg_id: msg_id.get(),
                payload: payload.clone().into(),
                client_msg_id: cmid.get(),
            })),
            FBody::DeleteForMe(c, seq) => Some(Body::DeleteForMe(DeleteForMe {
                conversation_id: c.get(),
                seq: *seq,
            })),
            FBody::Presence(users) => Some(Body::PresenceSubscribe(PresenceSubscribe {
                users: users.iter().map(Name::get).collect(),
            })),
            FBody::SetPresence(hidden) => Some(Body::SetPresence(SetPresence { hidden: *hidden })),
            FBody::Typing(c, typing) => Some(Body::Typing(Typing {
                conversation_id: c.get(),
                typing: *typing,
                user_id: String::new(),
            })),
            FBody::Server(k) => Some(match k % 11 {
                0 => Body::LoginOk(LoginOk::default()),
                1 => Body::Pong(Pong::default()),
                2 => Body::Error(Error::default()),
                3 => Body::Deliver(Deliver::default()),
                4 => Body::SendAck(SendAck::default()),
                5 => Body::ReadReceipt(ReadReceipt::default()),
                6 => Body::ConversationList(ConversationList::default()),
                7 => Body::HistoryPage(HistoryPage::default()),
                8 => Body::Done(Done::default()),
                9 => Body::Presence(Presence::default()),
                _ => Body::GroupOpOk(GroupOpOk::default()),
            }),
            FBody::Batch(frames) => Some(Body::Batch(Batch {
                frames: frames.iter().map(|f| f.build(w)).collect(),
            })),
            FBody::Flood { kind, n, conv } => {
                let one = |i: u64| -> Body {
                    match kind % 9 {
                        0 => Body::Send(Send {
                            target: Some(send::Target::ToUser(
                                USERS[i as usize % USERS.len()].into(),
                            )),
                            r#type: 0,
                            payload: Bytes::from_static(b"flood"),
                            client_msg_id: format!("f{}-{i}", self.req_id),
                        }),
                        1 => Body::DeliverAck(DeliverAck {
                            conversation_id: conv.get(),
                            seq: i,
                        }),
                        2 => Body::Sync(SyncRequest {
                            cursors: vec![],
                            limit: 5,
                            ..Default::default()
                        }),
                        3 => Body::Ping(Ping {
                            client_time: i as i64,
                        }),
                        5 => Body::MarkRead(MarkRead {
                            conversation_id: conv.get(),
                            seq: i,
                        }),
                        6 => Body::Typing(Typing {
                            conversation_id: conv.get(),
                            typing: i % 2 == 0,
                            user_id: String::new(),
                        }),
                        7 => Body::ListConversations(ListConversations {
                            after: String::new(),
                            limit: 5,
                        }),
                        8 => Body::FetchHistory(FetchHistory {
                            conversation_id: conv.get(),
                            before_seq: 0,
                            limit: 5,
                        }),
                        _ => Body::GroupOp(GroupOp {
                            op: group_op::Op::Join as i32,
                            group_id: GROUPS[i as usize % GROUPS.len()].into(),
                            ..Default::default()
                        }),
                    }
                };
                Some(Body::Batch(Batch {
                    frames: (0..u64::from(*n))
                        .map(|i| Frame {
                            req_id: self.req_id.wrapping_add(i),
                            body: Some(one(i)),
                        })
                        .collect(),
                }))
            }
        };
        Frame {
            req_id: self.req_id,
            body,
        }
    }
}

/// One WebSocket-level event of a connection.
#[derive(Arbitrary, Debug, Clone)]
pub enum Msg {
    /// Arbitrary bytes as a binary message.
    Raw(Vec<u8>),
    /// A structured frame, encoded.
    Frame(FFrame),
    /// A structured frame, encoded, with one byte replaced.
    Mutated(FFrame, u16, u8),
    /// A text message.
    Text,
    /// A WebSocket ping or pong.
    Control,
    /// The socket layer's own size cap.
    Oversized,
    /// A binary message over `limits.max_frame_bytes` by this much (+1).
    Big(u16),
    /// The read timed out.
    Timeout,
    /// The client closed.
    Closed,
}

/// The real parts one fuzz process runs connections against.
pub struct World {
    rt: tokio::runtime::Runtime,
    /// The gateway state the protocol machines share.
    pub gw: Arc<Gateway>,
    tokens: Vec<String>,
    forged: String,
    _dir: tempfile::TempDir,
    runs: u64,
    next_conn: u64,
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

impl World {
    /// A fresh store in a temp dir (under /dev/shm when there is one), the pipeline's
    /// tasks on a current-thread runtime, and a gateway with the fuzz config.
    pub fn new() -> World {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("im-fuzz-")
            .tempdir_in(base)
            .expect("temp dir for the fuzz store");
        let config = fuzz_config(dir.path());
        config.validate().expect("fuzz config validates");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let metrics = Metrics::new(true);
        let pipeline = rt.block_on(async {
            let store = im_server::store::open(&config)
                .await
                .expect("fuzz store opens");
            Pipeline::spawn(store, &config, metrics.clone())
        });
        let keys = TokenKeys::new(SECRET);
        let tokens = USERS
            .iter()
            .map(|u| keys.issue(u, Duration::from_secs(10 * 365 * 86_400)))
            .collect::<Result<Vec<_>, _>>()
            .expect("tokens");
        let forged = TokenKeys::new(b"another secret")
            .issue("mallory", Duration::from_secs(3600))
            .expect("forged token");
        let gw = Gateway::new(
            pipeline,
            keys,
            config.limits.clone(),
            config.flow.clone(),
            "fuzz-node".into(),
            Arc::new(Connections::default()),
            metrics,
            Arc::new(AtomicBool::new(false)),
        );
        World {
            rt,
            gw,
            tokens,
            forged,
            _dir: dir,
            runs: 0,
            next_conn: 1,
        }
    }

    /// Runs one connection through `msgs` and checks the invariants (panics on a breach).
    pub fn run(&mut self, msgs: &[Msg]) {
        self.runs += 1;
        let conn_id = self.next_conn;
        self.next_conn += 1;
        let flow = &self.gw.flow;
        let (out, rx) = Outbound::new(
            conn_id,
            "fuzz".into(),
            flow.soft_mark_bytes,
            flow.hard_mark_bytes,
            self.gw.metrics.clone(),
        );
        let mut m = Model::new(rx, out.clone(), &self.gw);
        let mut p = Protocol::new(self.gw.clone(), out.clone());
        let inputs: Vec<(Option<Input>, Expect)> = msgs.iter().map(|msg| self.input(msg)).collect();
        let rt = &self.rt;
        let logged_in = rt.block_on(async {
            for (input, expect) in inputs {
                let before = p.user().is_some();
                let step = match input {
                    Some(input) => p.on_message(input).await,
                    None => Step::Close(p.on_timeout()),
                };
                // Let the writer and router run (acks, deliveries) between steps.
                tokio::task::yield_now().await;
                let after = p.user().is_some();
                m.check(&expect, before, after, &step);
                if let Step::Close(reason) = step {
                    out.close(reason);
                    break;
                }
                if out.close_reason().is_some() {
                    break;
                }
            }
            let logged_in = p.user().is_some();
            out.close(CloseReason::new(1000, "input over"));
            p.end();
            logged_in
        });
        m.drain(logged_in);
        for u in USERS {
            assert_eq!(
                self.gw.pipeline.router.online(u),
                0,
                "{u} still registered after the connection ended"
            );
        }
        out.finish();
        if self.runs % REBUILD_EVERY == 0 {
            *self = World::new();
        }
    }

    fn input(&self, msg: &Msg) -> (Option<Input>, Expect) {
        let max = self.gw.limits.max_frame_bytes as usize;
        let binary = |b: Vec<u8>| {
            let e = if b.len() > max {
                Expect::TooLarge
            } else {
                match Frame::decode(b.as_slice()) {
                    Ok(f) => Expect::Frame {
                        pings: count_pings(&f, self.gw.limits.max_batch_frames as usize),
                    },
                    Err(_) => Expect::DecodeError,
                }
            };
            (Some(Input::Binary(Bytes::from(b))), e)
        };
        match msg {
            Msg::Raw(b) => binary(b.clone()),
            Msg::Frame(f) => binary(im_proto::encode(&f.build(self)).to_vec()),
            Msg::Mutated(f, at, byte) => {
                let mut b = im_proto::encode(&f.build(self)).to_vec();
                if !b.is_empty() {
                    let i = *at as usize % b.len();
                    b[i] = *byte;
                }
                binary(b)
            }
            Msg::Text => (Some(Input::Text), Expect::Text),
            Msg::Control => (Some(Input::Control), Expect::Nothing),
            Msg::Oversized => (
                Some(Input::Oversized("message too long".into())),
                Expect::TooLarge,
            ),
            Msg::Big(n) => (
                Some(Input::Binary(Bytes::from(vec![0u8; max + 1 + *n as usize]))),
                Expect::TooLarge,
            ),
            Msg::Timeout => (None, Expect::Timeout),
            Msg::Closed => (Some(Input::Closed), Expect::ClientClosed),
        }
    }
}

/// Pings a decoded frame carries (a batch's direct frames; none when the batch is over
/// the `max_batch` cap, which refuses it whole).
fn count_pings(f: &Frame, max_batch: usize) -> usize {
    match &f.body {
        Some(Body::Ping(_)) => 1,
        Some(Body::Batch(b)) if b.frames.len() > max_batch => 0,
        Some(Body::Batch(b)) => b
            .frames
            .iter()
            .filter(|f| matches!(f.body, Some(Body::Ping(_))))
            .count(),
        _ => 0,
    }
}

/// The RATE_LIMITED message of each frame kind and the close reason of its flood.
const FLOODS: [(&str, &str); 15] = [
    ("pinging too fast", "ping flood"),
    ("sending too fast", "send flood"),
    ("recalling too fast", "send flood"),
    ("editing too fast", "send flood"),
    ("deleting too fast", "send flood"),
    ("acking too fast", "deliver_ack flood"),
    ("syncing too fast", "sync flood"),
    ("fetching history too fast", "sync flood"),
    ("changing groups too fast", "group_op flood"),
    ("marking read too fast", "mark_read flood"),
    ("listing conversations too fast", "conversations flood"),
    ("setting conversation flags too fast", "conversations flood"),
    ("subscribing to presence too fast", "presence flood"),
    ("setting presence too fast", "presence flood"),
    ("typing notices too fast", "typing flood"),
];

/// The close reasons of [`FLOODS`], each once: refusals are counted per reason (the
/// server counts per frame kind, and several refusal texts share one).
const FLOOD_REASONS: [&str; 9] = [
    "ping flood",
    "send flood",
    "deliver_ack flood",
    "sync flood",
    "group_op flood",
    "mark_read flood",
    "conversations flood",
    "presence flood",
    "typing flood",
];

/// What the harness knows about an input before the machine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// A binary message within the size limit that decodes.
    Frame { pings: usize },
    /// A binary message within the size limit that does not decode.
    DecodeError,
    /// Over a size limit.
    TooLarge,
    /// A text message.
    Text,
    /// A WebSocket ping or pong.
    Nothing,
    /// The read timed out.
    Timeout,
    /// The client closed.
    ClientClosed,
}

/// The harness's view of one connection: what it has been sent and what came back.
struct Model {
    rx: OutboundRx,
    out: Arc<Outbound>,
    max_bad: u32,
    max_rate_limited: u32,
    ping_burst: u32,
    ping_rate: u32,
    started: Instant,
    bad_frames: u32,
    /// RATE_LIMITED refusals by frame kind, in the order of [`FLOOD_REASONS`].
    limited: [u32; FLOOD_REASONS.len()],
    pings: usize,
    pongs: usize,
}

impl Model {
    fn new(rx: OutboundRx, out: Arc<Outbound>, gw: &Gateway) -> Self {
        Model {
            rx,
            out,
            max_bad: gw.limits.max_bad_frames,
            max_rate_limited: gw.limits.max_rate_limited,
            ping_burst: gw.limits.ping_burst,
            ping_rate: gw.limits.ping_rate_per_sec,
            started: Instant::now(),
            bad_frames: 0,
            limited: [0; FLOOD_REASONS.len()],
            pings: 0,
            pongs: 0,
        }
    }

    /// Takes what the machine queued, decoded, and updates the counts.
    fn drain(&mut self, logged_in: bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Ok(f) = self.rx.frames.try_recv() {
            self.out.written(f.bytes.len());
            let frame = Frame::decode(f.bytes.as_ref()).expect("the server's own frames decode");
            match &frame.body {
                Some(Body::Error(e)) => {
                    if e.code == ErrorCode::BadFrame as i32 {
                        self.bad_frames += 1;
                    }
                    if e.code == ErrorCode::RateLimited as i32 {
                        assert!(e.retry_after_ms > 0, "RATE_LIMITED without a retry hint");
                        let kind = FLOODS
                            .iter()
                            .find(|(m, _)| *m == e.message)
                            .and_then(|(_, r)| FLOOD_REASONS.iter().position(|x| x == r));
                        match kind {
                            Some(k) => self.limited[k] += 1,
                            // The session cap (a refused login) is the one other.
                            None => assert!(
                                e.message.contains("sessions"),
                                "RATE_LIMITED with message {:?}",
                                e.message
                            ),
                        }
                    }
                }
                Some(Body::Pong(_)) => self.pongs += 1,
                Some(Body::Deliver(im_proto::Deliver { messages }))
                | Some(Body::SyncResp(im_proto::SyncResponse { messages, .. }))
                    if messages.iter().any(|m| {
                        m.r#type == im_proto::MessageType::System as i32 && !m.sender.is_empty()
                    }) =>
                {
                    panic!("a SYSTEM message not written by the server: {frame:?}")
                }
                Some(
                    Body::LoginOk(_)
                    | Body::SendAck(_)
                    | Body::Deliver(_)
                    | Body::SyncResp(_)
                    | Body::GroupOpOk(_)
                    | Body::Done(_)
                    | Body::ConversationList(_)
                    | Body::HistoryPage(_)
                    | Body::ReadReceipt(_)
                    | Body::Presence(_)
                    | Body::Typing(_),
                ) => assert!(logged_in, "a reply before login: {frame:?}"),
                other => panic!("the server sent a client-only frame: {other:?}"),
            }
            frames.push(frame);
        }
        frames
    }

    fn is_error(f: &Frame, code: ErrorCode) -> bool {
        matches!(&f.body, Some(Body::Error(e)) if e.code == code as i32)
    }

    /// The invariants after one step.
    fn check(&mut self, expect: &Expect, before: bool, after: bool, step: &Step) {
        let bad_before = self.bad_frames;
        let frames = self.drain(after);
        assert!(
            before || !after || matches!(expect, Expect::Frame { .. }),
            "logged in by {expect:?}"
        );
        assert!(!before || after, "logged out by {expect:?}");
        if !before {
            // Nothing but errors before login; a successful login answers LoginOk first
            // (once registered, deliveries of messages committed earlier may follow).
            if after {
                assert!(
                    matches!(
                        frames.first(),
                        Some(Frame {
                            body: Some(Body::LoginOk(_)),
                            ..
                        })
                    ),
                    "login answered {frames:?}"
                );
                assert!(
                    !frames
                        .iter()
                        .any(|f| matches!(f.body, Some(Body::Error(_)))),
                    "login answered {frames:?}"
                );
            } else {
                assert!(
                    frames
                        .iter()
                        .all(|f| matches!(f.body, Some(Body::Error(_)))),
                    "not logged in, got {frames:?}"
                );
            }
        }
        let close = match step {
            Step::Close(r) => Some(r.clone()),
            Step::Continue => None,
        };
        let code = close.as_ref().map(|r| r.code);
        let first_error = frames
            .iter()
            .find(|f| matches!(f.body, Some(Body::Error(_))));
        match expect {
            Expect::Text => {
                assert_eq!(code, Some(CloseReason::UNSUPPORTED), "text: {step:?}");
                assert!(first_error.is_some_and(|f| Self::is_error(f, ErrorCode::BadFrame)));
            }
            Expect::TooLarge => {
                assert_eq!(code, Some(CloseReason::TOO_BIG), "too large: {step:?}");
                assert!(first_error.is_some_and(|f| Self::is_error(f, ErrorCode::TooLarge)));
            }
            Expect::Timeout if !before => {
                assert_eq!(
                    close,
                    Some(CloseReason::new(CloseReason::POLICY, "login timeout"))
                );
                assert!(first_error.is_some_and(|f| Self::is_error(f, ErrorCode::Unauthenticated)));
            }
            Expect::Timeout => assert_eq!(code, Some(CloseReason::IDLE)),
            Expect::ClientClosed => assert_eq!(code, Some(1000)),
            Expect::Nothing => {
                assert_eq!(code, None, "a WebSocket ping closed the connection");
                assert!(first_error.is_none(), "a WebSocket ping got {frames:?}");
            }
            Expect::DecodeError => {
                assert_eq!(
                    self.bad_frames,
                    bad_before + 1,
                    "one BAD_FRAME per undecodable frame"
                );
            }
            Expect::Frame { pings } => {
                if !before && !after {
                    assert_eq!(
                        code,
                        Some(CloseReason::POLICY),
                        "no login, still open: {frames:?}"
                    );
                    assert_eq!(frames.len(), 1, "one error for a failed login: {frames:?}");
                }
                if before {
                    self.pings += pings;
                }
            }
        }
        // Bad frames: tolerated up to the limit, the next one closes, exactly.
        let too_many = close
            .as_ref()
            .is_some_and(|r| r.reason == "too many bad frames");
        if before && matches!(expect, Expect::Frame { .. } | Expect::DecodeError)
            || !before && matches!(expect, Expect::DecodeError)
        {
            assert_eq!(
                too_many,
                self.bad_frames > self.max_bad,
                "bad frames {} (max {}), close {close:?}",
                self.bad_frames,
                self.max_bad
            );
        }
        assert!(
            self.bad_frames <= self.max_bad + 1 || close.is_some(),
            "{} bad frames and still open",
            self.bad_frames
        );
        // Floods, every frame kind counted apart: the refusal past max_rate_limited
        // closes, exactly.
        let reason = close.as_ref().map(|r| r.reason);
        for (k, flood) in FLOOD_REASONS.iter().enumerate() {
            assert_eq!(
                reason == Some(*flood),
                self.limited[k] > self.max_rate_limited,
                "{flood}: {} refusals, close {close:?}",
                self.limited[k]
            );
            if reason == Some(*flood) {
                assert_eq!(code, Some(CloseReason::POLICY));
            }
        }
        // Pongs answer pings, within the bucket.
        assert!(
            self.pongs <= self.pings,
            "{} pongs for {} pings",
            self.pongs,
            self.pings
        );
        let refill = (self.started.elapsed().as_secs_f64() * self.ping_rate as f64).ceil() as usize;
        assert!(
            self.pongs <= self.ping_burst as usize + refill + 1,
            "{} pongs past the ping bucket",
            self.pongs
        );
    }
}
