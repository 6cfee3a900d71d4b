//! Message history and message changes (docs/history-and-edits.md): `FetchHistory`
//! (backward pages of one conversation inside the reader's membership, rendered with
//! each message's latest state), `Recall` and `Edit` (authorized here against the
//! original, then committed as RECALL / EDIT events through the Send path: the writer's
//! batch, SendAck, push to the members, other nodes included) and `DeleteForMe`
//! (through the writer into `hidden_messages`, answered `Done`).
//!
//! Rate limits: FetchHistory takes a token of the connection's SyncRequest bucket
//! (`limits.sync_rate_per_sec` / `sync_burst`); Recall, Edit and DeleteForMe take one of
//! its Send bucket (`limits.send_rate_per_sec` / `send_burst`), since each is one write.

use std::time::Instant;

use im_proto::{
    group_op::Role, parse_conversation, Body, ConversationRef, DeleteForMe, Edit, ErrorCode,
    FetchHistory, HistoryPage, MessageState, MessageType, Recall,
};

use super::{FrameKind, Pipeline, Refusal, Session, DEFAULT_SYNC_LIMIT, MAX_CLIENT_MSG_ID};
use crate::persist::{HideReq, PersistReq, WriteReq};
use crate::route::Recipients;
use crate::store::membership;
use crate::store::{HiddenMessage, MessageMeta, MessageRef, NewMessage};

/// Longest msg_id a Recall or Edit may name, in bytes.
const MAX_MSG_ID: usize = 128;

/// A Recall or Edit as the shared path handles it.
struct Change {
    kind: MessageType,
    conversation_id: String,
    seq: u64,
    msg_id: String,
    payload: bytes::Bytes,
    client_msg_id: String,
}

impl Change {
    fn verb(&self) -> &'static str {
        if self.kind == MessageType::Recall {
            "recall"
        } else {
            "edit"
        }
    }
}

fn forbidden(message: impl Into<String>) -> Refusal {
    Refusal::code(ErrorCode::Forbidden, message, Some("forbidden"))
}

fn not_member(conversation_id: &str) -> Refusal {
    Refusal::code(
        ErrorCode::NotMember,
        format!("not a member of {conversation_id}"),
        Some("not_member"),
    )
}

impl Pipeline {
    /// FetchHistory: a page of the conversation before `before_seq`, newest first,
    /// inside the caller's membership intervals, under the sync page's count and byte
    /// bounds.
    pub(super) async fn on_fetch_history(
        &self,
        s: &Session,
        req_id: u64,
        req: FetchHistory,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::FetchHistory, &self.limits)?;
        if !self.can_read(&s.user_id, &req.conversation_id).await? {
            return Err(not_member(&req.conversation_id));
        }
        let limit = match req.limit {
            0 => DEFAULT_SYNC_LIMIT.min(self.limits.sync_limit_max),
            n => n.min(self.limits.sync_limit_max),
        };
        let (messages, more) = self
            .store
            .history_page(
                &s.user_id,
                &req.conversation_id,
                req.before_seq,
                limit,
                self.sync_page_bytes,
            )
            .await
            .map_err(Refusal::store)?;
        s.answer(req_id, Body::HistoryPage(HistoryPage { messages, more }))
    }

    /// Recall: the sender within `limits.recall_window_secs`, group owners and admins
    /// at any time.
    pub(super) async fn on_recall(
        &self,
        s: &Session,
        req_id: u64,
        r: Recall,
        started: Instant,
    ) -> Result<(), Refusal> {
        let change = Change {
            kind: MessageType::Recall,
            conversation_id: r.conversation_id,
            seq: r.seq,
            msg_id: r.msg_id,
            payload: bytes::Bytes::new(),
            client_msg_id: r.client_msg_id,
        };
        self.on_change(s, req_id, change, started).await
    }

    /// Edit: the sender only, within `limits.edit_window_secs` (0: any time).
    pub(super) async fn on_edit(
        &self,
        s: &Session,
        req_id: u64,
        e: Edit,
        started: Instant,
    ) -> Result<(), Refusal> {
        let change = Change {
            kind: MessageType::Edit,
            conversation_id: e.conversation_id,
            seq: e.seq,
            msg_id: e.msg_id,
            payload: e.payload,
            client_msg_id: e.client_msg_id,
        };
        self.on_change(s, req_id, change, started).await
    }

    /// The shared path of Recall and Edit: shape, who reads the conversation (the
    /// recipients, as for a Send), the original and the rule, then the writer's queue.
    async fn on_change(
        &self,
        s: &Session,
        req_id: u64,
        c: Change,
        started: Instant,
    ) -> Result<(), Refusal> {
        let verb = c.verb();
        s.take(
            if verb == "recall" {
                FrameKind::Recall
            } else {
                FrameKind::Edit
            },
            &self.limits,
        )?;
        if let Some(reason) = self.health.refusal() {
            return Err(Refusal::store_unavailable(reason, self.unhealthy_retry_ms));
        }
        if c.client_msg_id.len() > MAX_CLIENT_MSG_ID {
            return Err(Refusal::bad(format!(
                "client_msg_id longer than {MAX_CLIENT_MSG_ID} bytes"
            )));
        }
        if c.msg_id.len() > MAX_MSG_ID {
            return Err(Refusal::bad(format!(
                "msg_id longer than {MAX_MSG_ID} bytes"
            )));
        }
        if c.seq == 0 {
            return Err(Refusal::bad(format!("{verb} needs the message's seq")));
        }
        // Multi-region mode: only the home commits the conversation's events.
        let Some(c) = self.change_elsewhere(s, req_id, c) else {
            return Ok(());
        };
        let (recipients, direct, group) = match parse_conversation(&c.conversation_id) {
            Some(ConversationRef::Direct(a, b)) => {
                if a != s.user_id && b != s.user_id {
                    return Err(not_member(&c.conversation_id));
                }
                (
                    Recipients::Direct(a.to_owned(), b.to_owned()),
                    Some((a.to_owned(), b.to_owned())),
                    None,
                )
            }
            Some(ConversationRef::Group(g)) => {
                let members = self.group_members(g).await?;
                if !membership::is_in(&members, &s.user_id) {
                    return Err(not_member(&c.conversation_id));
                }
                (Recipients::Group(members), None, Some(g.to_owned()))
            }
            None => {
                return Err(Refusal::bad(format!(
                    "invalid conversation id {:?}",
                    c.conversation_id
                )))
            }
        };
        let meta = self
            .store
            .message_meta(&s.user_id, &c.conversation_id, c.seq)
            .await
            .map_err(Refusal::store)?;
        let Some(meta) = meta else {
            return Err(Refusal::code(
                ErrorCode::NotFound,
                format!("no message at seq {} in {}", c.seq, c.conversation_id),
                None,
            ));
        };
        if !c.msg_id.is_empty() && c.msg_id != meta.msg_id {
            return Err(Refusal::code(
                ErrorCode::NotFound,
                format!(
                    "seq {} of {} is not message {}",
                    c.seq, c.conversation_id, c.msg_id
                ),
                None,
            ));
        }
        if let Err(refusal) = self.may_change(s, &c, &meta, group.as_deref()).await {
            // A retry of a change that committed (the original is recalled now, or the
            // window passed since) is answered by the writer as a duplicate.
            let retried = !c.client_msg_id.is_empty()
                && self
                    .store
                    .find_client_msg(&c.conversation_id, &s.user_id, &c.client_msg_id)
                    .await
                    .map_err(Refusal::store)?
                    .is_some();
            if !retried {
                return Err(refusal);
            }
        }
        self.metrics.message_received(c.kind as i32);
        let req = PersistReq {
            message: NewMessage {
                conversation_id: c.conversation_id,
                sender: s.user_id.clone(),
                client_msg_id: c.client_msg_id,
                msg_type: c.kind as i32,
                payload: c.payload,
                msg_id: uuid::Uuid::now_v7().simple().to_string(),
                direct,
                reference: Some(Box::new(MessageRef {
                    seq: c.seq,
                    msg_id: meta.msg_id,
                })),
                traced: false,
            },
            req_id,
            origin: s.out.clone(),
            recipients,
            started,
            enqueued: Instant::now(),
            trace: None,
        };
        self.submit(WriteReq::Message(req))
    }

    /// Whether the caller may recall or edit the message `meta` (FORBIDDEN when not).
    async fn may_change(
        &self,
        s: &Session,
        c: &Change,
        meta: &MessageMeta,
        group: Option<&str>,
    ) -> Result<(), Refusal> {
        let verb = c.verb();
        if let Ok(t @ (MessageType::System | MessageType::Recall | MessageType::Edit)) =
            MessageType::try_from(meta.msg_type)
        {
            return Err(forbidden(format!(
                "a {} message cannot be {verb}ed",
                t.as_str_name()
            )));
        }
        if meta.state == MessageState::Recalled as i32 {
            return Err(forbidden(format!("message {} was recalled", meta.msg_id)));
        }
        let window = match c.kind {
            MessageType::Recall => self.limits.recall_window_secs,
            _ => self.limits.edit_window_secs,
        };
        let age_ms = im_proto::now_ms().saturating_sub(meta.send_time);
        let in_window = window == 0 || age_ms <= i64::from(window) * 1000;
        let own = meta.sender == s.user_id;
        if own && in_window {
            return Ok(());
        }
        if c.kind == MessageType::Recall {
            if let Some(g) = group {
                let role = self
                    .store
                    .group_role(g, &s.user_id)
                    .await
                    .map_err(Refusal::store)?;
                if role.is_some_and(|r| r == Role::Owner as i32 || r == Role::Admin as i32) {
                    return Ok(());
                }
            }
        }
        Err(forbidden(if own {
            format!("the {verb} window of {window} s has passed")
        } else if c.kind == MessageType::Recall {
            "only the sender, or a group owner or admin, may recall a message".to_owned()
        } else {
            "only the sender may edit a message".to_owned()
        }))
    }

    /// DeleteForMe: hides a message the caller may read, for the caller only.
    pub(super) async fn on_delete_for_me(
        &self,
        s: &Session,
        req_id: u64,
        d: DeleteForMe,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::DeleteForMe, &self.limits)?;
        if !self.can_read(&s.user_id, &d.conversation_id).await? {
            return Err(not_member(&d.conversation_id));
        }
        let meta = self
            .store
            .message_meta(&s.user_id, &d.conversation_id, d.seq)
            .await
            .map_err(Refusal::store)?;
        if meta.is_none() {
            return Err(Refusal::code(
                ErrorCode::NotFound,
                format!("no message at seq {} in {}", d.seq, d.conversation_id),
                None,
            ));
        }
        // The router's recent window on this node stops serving the message as it was.
        self.router.recent().changed(&d.conversation_id, d.seq);
        let req = HideReq {
            hidden: HiddenMessage {
                user_id: s.user_id.clone(),
                conversation_id: d.conversation_id,
                seq: d.seq,
            },
            req_id,
            origin: s.out.clone(),
        };
        self.submit(WriteReq::Hide(req))
    }
}

impl Pipeline {
    /// Multi-region mode: forwards a Recall or Edit whose conversation is homed in
    /// another region there (`None`: it is on its way); hands it back when it is homed
    /// here or regions are off.
    fn change_elsewhere(&self, s: &Session, req_id: u64, c: Change) -> Option<Change> {
        let Some(map) = &self.region else {
            return Some(c);
        };
        let Some((home, entry)) = map.elsewhere(&c.conversation_id) else {
            return Some(c);
        };
        let to = super::send::Forward {
            conversation: c.conversation_id.clone(),
            home: home.to_owned(),
            entry: entry.to_owned(),
            metrics: self.metrics.clone(),
        };
        let body = if c.kind == MessageType::Recall {
            Body::Recall(Recall {
                conversation_id: c.conversation_id,
                seq: c.seq,
                msg_id: c.msg_id,
                client_msg_id: c.client_msg_id,
            })
        } else {
            Body::Edit(Edit {
                conversation_id: c.conversation_id,
                seq: c.seq,
                msg_id: c.msg_id,
                payload: c.payload,
                client_msg_id: c.client_msg_id,
            })
        };
        super::send::forward(map.clone(), self.store.clone(), s, req_id, body, to, None);
        None
    }
}
