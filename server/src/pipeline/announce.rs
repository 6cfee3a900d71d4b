//! Server-sent messages: a SYSTEM message (from the reserved sender [`SYSTEM_SENDER`]) or a
//! bot's message, written on the operator's behalf to a user, a group or a list of users
//! (`POST /admin/v1/messages`). Each target's message goes through the same persistence
//! writer and router as a client's Send: committed durably, deduplicated by (sender,
//! conversation, client_msg_id), then pushed to the recipients online (on other nodes
//! through the cluster link). The writer answers a Send on its origin connection's
//! queue; here that origin is a detached [`Outbound`] that no socket drains, which this
//! module reads the SendAcks (or the refusals) back from, so the writer and the Send
//! path are the same code for both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use im_proto::{Body, ErrorCode, Frame, Message as _, MessageType};

use super::{Pipeline, MAX_CLIENT_MSG_ID};
use crate::flow::{CloseReason, Outbound, OutboundRx};
use crate::persist::{PersistReq, WriteReq};
use crate::route::Recipients;
use crate::store::membership;
use crate::store::NewMessage;

/// The reserved sender of server-written SYSTEM messages to users and groups. No client
/// may log in as it (the login is refused) or write to it; membership events keep their
/// empty sender, so a SYSTEM message with this sender is an announcement whose payload
/// is the operator's, not a `GroupEvent`.
pub const SYSTEM_SENDER: &str = "system";

/// Most users one request may name.
pub const MAX_USERS: usize = 1000;

/// How long a request waits for room in a full persistence queue before it is refused.
const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// How long a request waits for its commits.
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// Who a server message goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One user: the one-to-one conversation between the sender and them.
    User(String),
    /// A group's conversation (its members receive it).
    Group(String),
    /// Each user of the list, one message per one-to-one conversation.
    Users(Vec<String>),
}

/// Who a server message is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Author {
    /// A SYSTEM message from [`SYSTEM_SENDER`].
    System,
    /// A TEXT message from this bot user (a group target needs the bot as a member).
    Bot(String),
}

/// One server message request, checked by [`Pipeline::post_server_message`].
#[derive(Debug, Clone)]
pub struct ServerMessage {
    /// The target.
    pub to: Target,
    /// The sender.
    pub from: Author,
    /// The payload.
    pub payload: Bytes,
    /// The idempotency key, stored as each message's client_msg_id (empty: none).
    pub key: String,
}

/// One committed message (one per target conversation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// Its conversation.
    pub conversation_id: String,
    /// Its message id (the first commit's, for a duplicate).
    pub msg_id: String,
    /// Its seq.
    pub seq: u64,
    /// True when the key had already been committed in this conversation.
    pub duplicate: bool,
}

/// Why a server message was not (entirely) posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// The request is malformed: the field it names, and why.
    Bad(&'static str, String),
    /// The group does not exist.
    NoGroup(String),
    /// The bot may not post there (not a member of the group).
    Forbidden(String),
    /// The store or the queue cannot take it now; retry (with the same key) after this.
    Unavailable(String, Duration),
    /// Something else failed.
    Internal(String),
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Bad(field, why) => write!(f, "{field}: {why}"),
            PostError::NoGroup(g) => write!(f, "no group {g}"),
            PostError::Forbidden(m) | PostError::Internal(m) => f.write_str(m),
            PostError::Unavailable(m, _) => f.write_str(m),
        }
    }
}

/// Whether a client may log in as `user` (not the reserved [`SYSTEM_SENDER`]).
pub fn may_log_in(user: &str) -> bool {
    user != SYSTEM_SENDER
}

/// Checks an idempotency key: at most [`MAX_CLIENT_MSG_ID`] bytes of visible ASCII.
pub fn valid_key(key: &str) -> bool {
    key.len() <= MAX_CLIENT_MSG_ID && key.bytes().all(|b| b.is_ascii_graphic())
}

impl Pipeline {
    /// The largest payload a server message to `target` may carry: what one client Send
    /// frame to it could carry under `limits.max_frame_bytes`, key included.
    fn max_server_payload(&self, target: &str, key: &str) -> usize {
        let send = im_proto::Send {
            target: Some(im_proto::send::Target::ToUser(target.to_owned())),
            r#type: MessageType::Text as i32,
            payload: Bytes::new(),
            client_msg_id: key.to_owned(),
        };
        let f = im_proto::frame(u64::MAX, Body::Send(send));
        // Room for the payload field's tag and its longest length prefix.
        (self.limits.max_frame_bytes as usize).saturating_sub(f.encoded_len() + 6)
    }

    /// Posts a server message: checks it, commits one message per target conversation
    /// through the persistence writer (durable before this returns) and lets the router
    /// push it. Answers in the order of the targets.
    pub async fn post_server_message(&self, m: ServerMessage) -> Result<Vec<Posted>, PostError> {
        let (sender, msg_type) = author(&m.from)?;
        if !valid_key(&m.key) {
            return Err(PostError::Bad(
                "Idempotency-Key",
                format!("expected at most {MAX_CLIENT_MSG_ID} bytes of visible ASCII"),
            ));
        }
        let targets = self.targets(&m.to, &sender, msg_type).await?;
        // Multi-region mode: only a conversation's home commits it.
        if let Some((conv, (home, entry))) = self.region.as_ref().and_then(|map| {
            targets
                .iter()
                .find_map(|(c, _, _)| map.elsewhere(c).map(|h| (c, h)))
        }) {
            return Err(PostError::Bad(
                "to",
                format!(
                    "conversation {conv} is homed in region {home} ({entry}): \
                     post it through that region's admin API"
                ),
            ));
        }
        let longest = match &m.to {
            Target::User(u) | Target::Group(u) => u.as_str(),
            Target::Users(users) => users
                .iter()
                .fold("", |l, u| if u.len() > l.len() { u } else { l }),
        };
        let max = self.max_server_payload(longest, &m.key);
        if m.payload.len() > max {
            return Err(PostError::Bad(
                "payload",
                format!(
                    "{} bytes is over the {max} byte limit (limits.max_frame_bytes)",
                    m.payload.len()
                ),
            ));
        }
        if let Some(reason) = self.health.refusal() {
            return Err(PostError::Unavailable(
                format!("store unavailable ({reason})"),
                Duration::from_millis(self.unhealthy_retry_ms.into()),
            ));
        }
        let (origin, mut answers) = Outbound::new(
            0,
            "admin".to_owned(),
            u64::MAX / 4,
            u64::MAX / 2,
            self.metrics.clone(),
        );
        let _release = Detached(origin.clone());
        let n = targets.len();
        let message = |conversation_id, direct| NewMessage {
            conversation_id,
            sender: sender.clone(),
            client_msg_id: m.key.clone(),
            msg_type: msg_type as i32,
            payload: m.payload.clone(),
            msg_id: uuid::Uuid::now_v7().simple().to_string(),
            direct,
            reference: None,
            traced: false,
        };
        self.submit_all(targets, message, &origin).await?;
        read_answers(&origin, &mut answers, n).await
    }

    /// One message per target conversation: (conversation, recipients, direct parties).
    async fn targets(
        &self,
        to: &Target,
        sender: &str,
        msg_type: MessageType,
    ) -> Result<Vec<Planned>, PostError> {
        match to {
            Target::User(u) => {
                user_ok("to_user", u)?;
                Ok(vec![direct(sender, u)])
            }
            Target::Users(users) => users_targets(users, sender),
            Target::Group(g) => {
                if !im_proto::valid_id(g) {
                    return Err(PostError::Bad(
                        "group_id",
                        format!("{g:?} is not a valid group id (1-64 of A-Z a-z 0-9 _ . @ -)"),
                    ));
                }
                let members = self
                    .relations
                    .members(g)
                    .await
                    .map_err(|e| PostError::Unavailable(format!("store: {e}"), QUEUE_WAIT))?
                    .ok_or_else(|| PostError::NoGroup(g.clone()))?;
                if msg_type != MessageType::System && !membership::is_in(&members, sender) {
                    return Err(PostError::Forbidden(format!(
                        "bot {sender} is not a member of group {g}"
                    )));
                }
                Ok(vec![(
                    im_proto::group_conversation(g),
                    Recipients::Group(members),
                    None,
                )])
            }
        }
    }

    /// Queues one message per target on `origin` (waiting up to [`QUEUE_WAIT`] each for
    /// room in the writer's queue), numbered 1.. in the order of the targets.
    async fn submit_all(
        &self,
        targets: Vec<Planned>,
        message: impl Fn(String, Option<(String, String)>) -> NewMessage,
        origin: &Arc<Outbound>,
    ) -> Result<(), PostError> {
        let n = targets.len();
        let started = Instant::now();
        for (i, (conversation_id, recipients, direct)) in targets.into_iter().enumerate() {
            let req = PersistReq {
                message: message(conversation_id, direct),
                req_id: i as u64 + 1,
                origin: origin.clone(),
                recipients,
                started,
                enqueued: Instant::now(),
                trace: None,
            };
            let queued = self
                .persist
                .submit(WriteReq::Message(req), QUEUE_WAIT)
                .await;
            if queued.is_err() {
                self.metrics.persist_overloaded.increment(1);
                let retry = Duration::from_millis(self.retry_after_ms.into());
                return Err(PostError::Unavailable(
                    format!(
                        "persistence queue full after {i} of {n} messages; retry with the same Idempotency-Key"
                    ),
                    retry,
                ));
            }
        }
        Ok(())
    }
}

/// A planned message: its conversation, recipients and direct parties.
type Planned = (String, Recipients, Option<(String, String)>);

/// The sender and message type of an author.
fn author(from: &Author) -> Result<(String, MessageType), PostError> {
    match from {
        Author::System => Ok((SYSTEM_SENDER.to_owned(), MessageType::System)),
        Author::Bot(b) if !im_proto::valid_id(b) => Err(PostError::Bad(
            "from",
            format!("{b:?} is not a valid user id (1-64 of A-Z a-z 0-9 _ . @ -)"),
        )),
        Author::Bot(b) if b == SYSTEM_SENDER => Err(PostError::Bad(
            "from",
            format!("{SYSTEM_SENDER:?} is reserved for kind \"system\""),
        )),
        Author::Bot(b) => Ok((b.clone(), MessageType::Text)),
    }
}

/// A target user id, named by `field` in the refusal: valid and not the system sender.
fn user_ok(field: &'static str, u: &str) -> Result<(), PostError> {
    if !im_proto::valid_id(u) {
        return Err(PostError::Bad(
            field,
            format!("{u:?} is not a valid user id (1-64 of A-Z a-z 0-9 _ . @ -)"),
        ));
    }
    if u == SYSTEM_SENDER {
        return Err(PostError::Bad(
            field,
            format!("{SYSTEM_SENDER:?} is the reserved sender"),
        ));
    }
    Ok(())
}

/// The targets of a user list: 1 to [`MAX_USERS`] valid, distinct users.
fn users_targets(users: &[String], sender: &str) -> Result<Vec<Planned>, PostError> {
    if users.is_empty() || users.len() > MAX_USERS {
        return Err(PostError::Bad(
            "users",
            format!("expected 1 to {MAX_USERS} user ids, got {}", users.len()),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(users.len());
    let mut targets = Vec::with_capacity(users.len());
    for (i, u) in users.iter().enumerate() {
        let field = "users";
        user_ok(field, u).map_err(|e| match e {
            PostError::Bad(f, why) => PostError::Bad(f, format!("[{i}]: {why}")),
            other => other,
        })?;
        if !seen.insert(u.as_str()) {
            return Err(PostError::Bad(field, format!("[{i}]: {u:?} listed twice")));
        }
        targets.push(direct(sender, u));
    }
    Ok(targets)
}

/// Reads the writer's answers to `n` messages back from their origin, within
/// [`COMMIT_WAIT`]: the SendAcks in the order of the targets, or the first refusal.
async fn read_answers(
    origin: &Outbound,
    answers: &mut OutboundRx,
    n: usize,
) -> Result<Vec<Posted>, PostError> {
    let mut results: Vec<Option<Posted>> = vec![None; n];
    let mut failure = None;
    let deadline = tokio::time::Instant::now() + COMMIT_WAIT;
    for _ in 0..n {
        let Ok(Some(f)) = tokio::time::timeout_at(deadline, answers.frames.recv()).await else {
            failure = Some(PostError::Internal(
                "no answer from the persistence writer in time".to_owned(),
            ));
            break;
        };
        origin.written(f.bytes.len());
        let Ok(frame) = Frame::decode(f.bytes) else {
            continue;
        };
        let i = (frame.req_id as usize).wrapping_sub(1);
        match frame.body {
            Some(Body::SendAck(a)) if i < n => {
                results[i] = Some(Posted {
                    conversation_id: a.conversation_id,
                    msg_id: a.msg_id,
                    seq: a.seq,
                    duplicate: a.duplicate,
                });
            }
            Some(Body::Error(e)) => {
                failure.get_or_insert(refused(e));
            }
            _ => {}
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| PostError::Internal("a commit went unanswered".to_owned())))
        .collect()
}

/// The request's answer to a message the writer refused.
fn refused(e: im_proto::Error) -> PostError {
    let retry = Duration::from_millis(e.retry_after_ms.max(1).into());
    match ErrorCode::try_from(e.code) {
        Ok(ErrorCode::NotMember) => PostError::Forbidden(e.message),
        Ok(ErrorCode::Overloaded | ErrorCode::Internal) => PostError::Unavailable(
            format!("{}; retry with the same Idempotency-Key", e.message),
            retry,
        ),
        _ => PostError::Internal(e.message),
    }
}

/// The one-to-one conversation of `sender` and `user`, its recipients and its parties.
fn direct(sender: &str, user: &str) -> Planned {
    (
        im_proto::direct_conversation(sender, user),
        Recipients::Direct(sender.to_owned(), user.to_owned()),
        Some((sender.to_owned(), user.to_owned())),
    )
}

/// The detached origin of one request: closed and released however the request ends,
/// so a late answer is neither queued nor counted.
struct Detached(Arc<Outbound>);

impl Drop for Detached {
    fn drop(&mut self) {
        self.0
            .close(CloseReason::new(CloseReason::GOING_AWAY, "request done"));
        self.0.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_logins() {
        assert!(valid_key(""));
        assert!(valid_key("0190a1b2-key"));
        assert!(!valid_key("has space"));
        assert!(!valid_key(&"k".repeat(MAX_CLIENT_MSG_ID + 1)));
        assert!(!may_log_in(SYSTEM_SENDER));
        assert!(may_log_in("alice"));
    }
}
