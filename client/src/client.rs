//! `Client`: the SDK handle (connect, send, group ops, sync, ping, history, recall,
//! edit, delete-for-me, events, close).
//!
//! The handle is cheap to share (`&self` everywhere, `Send + Sync`); a background task
//! (see `driver`) owns the socket. Incoming messages are consumed with
//! [`Client::next_event`]: one exactly-once stream of [`Event`]s, each conversation in
//! seq order, fed by live `Deliver` pushes and by syncs (explicit or background).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use im_proto::{
    group_op, send, Body, ChatMessage, ConversationList, ErrorCode, GroupOp, GroupOpOk,
    ListConversations, MarkRead, MessageType, Ping, Pong, PresenceSubscribe, SendAck,
    SetConversationFlags, SetPresence, Typing,
};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::backoff::overload_delay;
use crate::config::ClientConfig;
use crate::driver::{Command, Driver, Shared};
use crate::error::ClientError;
use crate::event::Event;
use crate::raw::RawConn;

/// How long [`Client::close`] waits for the task to flush and close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// One-to-one, to this user id.
    User(String),
    /// To all members of this group id.
    Group(String),
}

impl Target {
    /// The conversation id this target maps to, seen from user `me`.
    pub fn conversation_id(&self, me: &str) -> String {
        match self {
            Target::User(u) => im_proto::direct_conversation(me, u),
            Target::Group(g) => im_proto::group_conversation(g),
        }
    }

    fn into_proto(self) -> send::Target {
        match self {
            Target::User(u) => send::Target::ToUser(u),
            Target::Group(g) => send::Target::GroupId(g),
        }
    }
}

/// A logged-in connection to im-server with a background task; see the module docs.
pub struct Client {
    cmd: mpsc::UnboundedSender<Command>,
    events: Mutex<mpsc::UnboundedReceiver<Event>>,
    shared: Arc<Shared>,
    user_id: String,
    cfg: ClientConfig,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("user_id", &self.user_id)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects and logs in (`resume = false`), failing fast if that fails; then starts
    /// the background task. Must be called inside a Tokio runtime.
    pub async fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        let url = crate::route::target_url(&cfg, 0, None).await?;
        let opts = crate::RawConnOptions::new().tls(cfg.tls.clone());
        let mut conn =
            tokio::time::timeout(cfg.request_timeout, RawConn::connect_with(&url, &opts))
                .await
                .map_err(|_| ClientError::Timeout)??;
        let ok = conn
            .login_with(1, &cfg.token, &cfg.device_id, false, cfg.request_timeout)
            .await?;
        let shared = Arc::new(Shared::default());
        shared.set_session(&ok);
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let driver = Driver::new(cfg.clone(), cmd_rx, ev_tx, shared.clone(), 2, &ok);
        let task = tokio::spawn(driver.run(conn));
        Ok(Client {
            cmd: cmd_tx,
            events: Mutex::new(ev_rx),
            shared,
            user_id: ok.user_id,
            cfg,
            task,
        })
    }

    /// The user id the server logged us in as.
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// The node serving the current (or last) connection.
    pub fn node_id(&self) -> String {
        self.shared
            .session
            .lock()
            .map(|s| s.node_id.clone())
            .unwrap_or_else(|e| e.into_inner().node_id.clone())
    }

    /// The session id of the current (or last) connection.
    pub fn session_id(&self) -> String {
        self.shared
            .session
            .lock()
            .map(|s| s.session_id.clone())
            .unwrap_or_else(|e| e.into_inner().session_id.clone())
    }

    /// Whether the socket is up and logged in right now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected()
    }

    /// Sends a message and waits for its `SendAck` (the message is committed). Resends with
    /// the same `client_msg_id` (generated if `None`) after `OVERLOADED`, `RATE_LIMITED`, an
    /// `INTERNAL` that carries a retry hint (the store failed the batch: nothing was
    /// committed) and, with auto-reconnect, after a dropped connection, up to
    /// `max_send_retries` times.
    pub async fn send(
        &self,
        target: Target,
        msg_type: MessageType,
        payload: impl Into<Bytes>,
        client_msg_id: Option<String>,
    ) -> Result<SendAck, ClientError> {
        let msg = im_proto::Send {
            target: Some(target.into_proto()),
            r#type: msg_type as i32,
            payload: payload.into(),
            client_msg_id: client_msg_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        };
        self.acked_retried(Body::Send(msg)).await
    }

    /// Sends a text message to one user.
    pub async fn send_text(
        &self,
        to_user: impl Into<String>,
        text: impl Into<String>,
    ) -> Result<SendAck, ClientError> {
        let text: String = text.into();
        self.send(Target::User(to_user.into()), MessageType::Text, text, None)
            .await
    }

    /// One group operation (`members` as the server expects for `op`); see
    /// [`Client::group_request`] for the other fields (kind, role, ...).
    pub async fn group_op(
        &self,
        op: group_op::Op,
        group_id: impl Into<String>,
        members: Vec<String>,
    ) -> Result<GroupOpOk, ClientError> {
        self.group_request(GroupOp {
            op: op as i32,
            group_id: group_id.into(),
            members,
            ..Default::default()
        })
        .await
    }

    /// Sends a full `GroupOp` (e.g. CREATE of a PUBLIC group, SET_ROLE with its role) and
    /// returns the group's state after it.
    pub async fn group_request(&self, op: GroupOp) -> Result<GroupOpOk, ClientError> {
        match self.request(Body::GroupOp(op), false).await? {
            Body::GroupOpOk(ok) => Ok(ok),
            other => Err(unexpected("GroupOpOk", &other)),
        }
    }

    /// Fetches everything after the server's stored cursors (after the SDK's own for a
    /// conversation held above a gap; paged, 500 per page) and returns the messages it
    /// made available, in each conversation's seq order; they are also emitted as events.
    pub async fn sync(&self) -> Result<Vec<ChatMessage>, ClientError> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Command::Sync { reply: tx })
            .map_err(|_| ClientError::Disconnected)?;
        rx.await.map_err(|_| ClientError::Disconnected)?
    }

    /// Round-trips a `Ping` (the task also pings every `heartbeat_secs` on its own).
    pub async fn ping(&self) -> Result<Pong, ClientError> {
        let body = Body::Ping(Ping {
            client_time: im_proto::now_ms(),
        });
        match self.request(body, false).await? {
            Body::Pong(p) => Ok(p),
            other => Err(unexpected("Pong", &other)),
        }
    }

    /// The next event; `None` once the client has stopped and every event was taken.
    /// Cancel-safe. Events queue without bound until taken, so keep consuming them.
    pub async fn next_event(&self) -> Option<Event> {
        self.events.lock().await.recv().await
    }

    /// An event if one is ready now, without waiting.
    pub fn try_next_event(&self) -> Option<Event> {
        self.events.try_lock().ok()?.try_recv().ok()
    }

    /// The next `Event::Message` within `timeout`, skipping (dropping) other events.
    pub async fn next_message(&self, timeout: Duration) -> Result<ChatMessage, ClientError> {
        let wait = async {
            loop {
                match self.next_event().await {
                    Some(Event::Message(m)) => return Ok(m),
                    Some(_) => {}
                    None => return Err(ClientError::Disconnected),
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// One page of a conversation's history before `before_seq` (0: from the end),
    /// newest first, at most `limit` (0: the server's default); `more` is true when
    /// older messages remain. Messages carry their latest state (EDITED, RECALLED,
    /// HIDDEN). History is for display: it does not go through the event stream.
    pub async fn history(
        &self,
        conversation_id: impl Into<String>,
        before_seq: u64,
        limit: u32,
    ) -> Result<im_proto::HistoryPage, ClientError> {
        let body = Body::FetchHistory(im_proto::FetchHistory {
            conversation_id: conversation_id.into(),
            before_seq,
            limit,
        });
        match self.request(body, false).await? {
            Body::HistoryPage(p) => Ok(p),
            other => Err(unexpected("HistoryPage", &other)),
        }
    }

    /// Recalls the message at `seq` of the conversation (`msg_id`, when given, must be
    /// its id) and waits for the `SendAck` of the RECALL event; retried like
    /// [`Client::send`] with one client_msg_id.
    pub async fn recall(
        &self,
        conversation_id: impl Into<String>,
        seq: u64,
        msg_id: impl Into<String>,
    ) -> Result<SendAck, ClientError> {
        let recall = im_proto::Recall {
            conversation_id: conversation_id.into(),
            seq,
            msg_id: msg_id.into(),
            client_msg_id: uuid::Uuid::now_v7().to_string(),
        };
        self.acked_retried(Body::Recall(recall)).await
    }

    /// Replaces the payload of our message at `seq` of the conversation and waits for
    /// the `SendAck` of the EDIT event; retried like [`Client::send`].
    pub async fn edit(
        &self,
        conversation_id: impl Into<String>,
        seq: u64,
        msg_id: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Result<SendAck, ClientError> {
        let edit = im_proto::Edit {
            conversation_id: conversation_id.into(),
            seq,
            msg_id: msg_id.into(),
            payload: payload.into(),
            client_msg_id: uuid::Uuid::now_v7().to_string(),
        };
        self.acked_retried(Body::Edit(edit)).await
    }

    /// Hides the message at `seq` of the conversation for this user (all devices):
    /// sync and history return it as a HIDDEN tombstone from then on.
    pub async fn delete_for_me(
        &self,
        conversation_id: impl Into<String>,
        seq: u64,
    ) -> Result<(), ClientError> {
        let body = Body::DeleteForMe(im_proto::DeleteForMe {
            conversation_id: conversation_id.into(),
            seq,
        });
        match self.request(body, false).await? {
            Body::Done(_) => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    /// Sends a request answered by a `SendAck` (Send, Recall, Edit), resending the same
    /// frame (so the same client_msg_id) on the errors [`Client::send`] names.
    async fn acked_retried(&self, body: Body) -> Result<SendAck, ClientError> {
        let mut retries = 0u32;
        loop {
            let can_retry = retries < self.cfg.max_send_retries;
            match self.request(body.clone(), true).await {
                Ok(Body::SendAck(ack)) => return Ok(ack),
                Ok(other) => return Err(unexpected("SendAck", &other)),
                Err(ClientError::Server {
                    code: ErrorCode::Overloaded | ErrorCode::RateLimited,
                    retry_after_ms,
                    ..
                }) if can_retry => tokio::time::sleep(overload_delay(retry_after_ms)).await,
                Err(ClientError::Server {
                    code: ErrorCode::Internal,
                    retry_after_ms,
                    ..
                }) if can_retry && retry_after_ms > 0 => {
                    tokio::time::sleep(overload_delay(retry_after_ms)).await
                }
                Err(ClientError::Disconnected)
                    if can_retry && self.cfg.auto_reconnect && !self.cmd.is_closed() => {}
                Err(e) => return Err(e),
            }
            retries += 1;
        }
    }

    /// Flushes pending `DeliverAck`s, closes the connection and stops the task.
    /// Dropping the client does the same without waiting.
    pub async fn close(self) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Command::Close { done: tx }).is_ok() {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, rx).await;
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.task).await;
    }

    /// Watches the presence of `users` (replacing the previous set; empty: none), those
    /// the caller shares a conversation with; the others are ignored by the server.
    /// Their state and each change arrive as [`Event::Presence`].
    pub async fn subscribe_presence(&self, users: Vec<String>) -> Result<(), ClientError> {
        let body = Body::PresenceSubscribe(PresenceSubscribe { users });
        self.expect_done(body).await
    }

    /// Hides (or shows again) this user's presence: watchers see them offline.
    pub async fn set_presence_hidden(&self, hidden: bool) -> Result<(), ClientError> {
        self.expect_done(Body::SetPresence(SetPresence { hidden }))
            .await
    }

    /// Tells the conversation's other members (and this user's other devices) that
    /// this user is typing (`true`) or stopped (`false`); nothing is stored.
    pub async fn typing(
        &self,
        conversation_id: impl Into<String>,
        typing: bool,
    ) -> Result<(), ClientError> {
        let body = Body::Typing(Typing {
            conversation_id: conversation_id.into(),
            typing,
            user_id: String::new(),
        });
        self.expect_done(body).await
    }

    async fn expect_done(&self, body: Body) -> Result<(), ClientError> {
        match self.request(body, false).await? {
            Body::Done(_) => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    /// Sends one request and waits for its reply. `patient`: while the client is
    /// reconnecting, the request timeout does not run (it starts over once connected).
    /// Marks `conversation_id` read up to `seq` for this user (forward only; this
    /// device's read cursor too); returns once the server committed it. The other
    /// party (one-to-one) or the group's members get a `ReadReceipt`.
    pub async fn mark_read(
        &self,
        conversation_id: impl Into<String>,
        seq: u64,
    ) -> Result<(), ClientError> {
        let body = Body::MarkRead(MarkRead {
            conversation_id: conversation_id.into(),
            seq,
        });
        match self.request(body, false).await? {
            Body::Done(_) => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    /// One page of this user's conversations: pinned first, then by latest activity.
    /// `after` is the previous page's `next_after` ("" for the first page); `limit` 0
    /// asks for the server's default (50).
    pub async fn list_conversations(
        &self,
        after: impl Into<String>,
        limit: u32,
    ) -> Result<ConversationList, ClientError> {
        let body = Body::ListConversations(ListConversations {
            after: after.into(),
            limit,
        });
        match self.request(body, false).await? {
            Body::ConversationList(list) => Ok(list),
            other => Err(unexpected("ConversationList", &other)),
        }
    }

    /// Sets this user's muted and pinned flags on a conversation; returns once
    /// committed.
    pub async fn set_conversation_flags(
        &self,
        conversation_id: impl Into<String>,
        muted: bool,
        pinned: bool,
    ) -> Result<(), ClientError> {
        let body = Body::SetConversationFlags(SetConversationFlags {
            conversation_id: conversation_id.into(),
            muted,
            pinned,
        });
        match self.request(body, false).await? {
            Body::Done(_) => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    async fn request(&self, body: Body, patient: bool) -> Result<Body, ClientError> {
        let (tx, mut rx) = oneshot::channel();
        self.cmd
            .send(Command::Request { body, reply: tx })
            .map_err(|_| ClientError::Disconnected)?;
        loop {
            match tokio::time::timeout(self.cfg.request_timeout, &mut rx).await {
                Ok(Ok(result)) => return result,
                Ok(Err(_)) => return Err(ClientError::Disconnected),
                Err(_)
                    if patient
                        && self.cfg.auto_reconnect
                        && !self.is_connected()
                        && !self.cmd.is_closed() => {}
                Err(_) => return Err(ClientError::Timeout),
            }
        }
    }
}

fn unexpected(wanted: &str, got: &Body) -> ClientError {
    ClientError::Protocol(format!("expected {wanted}, got {got:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Client>();
    }

    #[test]
    fn target_conversation_ids() {
        assert_eq!(
            Target::User("alice".into()).conversation_id("bob"),
            "u:alice:bob"
        );
        assert_eq!(
            Target::Group("team".into()).conversation_id("bob"),
            "g:team"
        );
    }
}
