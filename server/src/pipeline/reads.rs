//! Read state: the handlers of MarkRead, ListConversations and SetConversationFlags,
//! the device a session belongs to, and the per-connection token buckets of those
//! frames. MarkRead and SetConversationFlags are authorized here (the caller may read
//! the conversation; a read seq lies within it) and committed by the persistence
//! writer, which answers `Done` after the commit; the list is read from the store
//! directly.

use im_proto::{
    frame, Body, ConversationList, ErrorCode, ListConversations, MarkRead, SetConversationFlags,
};

use super::{FrameKind, Pipeline, Refusal, Session};
use crate::persist::{StateReq, WriteReq};
use crate::store::{FlagsUpdate, ListAfter, ReadUpdate};

/// The device of a Login that names none.
pub const DEFAULT_DEVICE: &str = "default";
/// Page size of a ListConversations with limit 0 (capped by
/// `limits.list_conversations_limit_max`).
pub const DEFAULT_LIST_LIMIT: u32 = 50;
/// Longest accepted `ListConversations.after` token, in bytes.
pub const MAX_AFTER_TOKEN: usize = 256;

impl Session {
    /// This session as `device` of its user (empty: [`DEFAULT_DEVICE`]).
    pub fn on_device(mut self, device: &str) -> Self {
        self.device_id = if device.is_empty() {
            DEFAULT_DEVICE.to_owned()
        } else {
            device.to_owned()
        };
        self
    }
}

/// The opaque `after` token of a list page: `<pinned>.<last_time>.<conversation_id>`
/// in hex, so clients see one word.
pub fn encode_after(a: &ListAfter) -> String {
    let plain = format!(
        "{}.{}.{}",
        u8::from(a.pinned),
        a.last_time,
        a.conversation_id
    );
    plain.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Reads an `after` token back; `None` when it is not one this server made.
pub fn decode_after(token: &str) -> Option<ListAfter> {
    if token.len() > MAX_AFTER_TOKEN || !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let plain = String::from_utf8(bytes?).ok()?;
    let mut parts = plain.splitn(3, '.');
    let pinned = match parts.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let last_time = parts.next()?.parse().ok()?;
    let conversation_id = parts.next()?.to_owned();
    im_proto::parse_conversation(&conversation_id)?;
    Some(ListAfter {
        pinned,
        last_time,
        conversation_id,
    })
}

impl Pipeline {
    /// The NOT_MEMBER refusal unless `s` may read `conversation_id`.
    async fn may_read(&self, s: &Session, conversation_id: &str) -> Result<(), Refusal> {
        if self.can_read(&s.user_id, conversation_id).await? {
            Ok(())
        } else {
            Err(Refusal::code(
                ErrorCode::NotMember,
                format!("not a member of {conversation_id}"),
                Some("not_member"),
            ))
        }
    }

    /// MarkRead: authorized like a DeliverAck (readable conversation, seq from 1 to its
    /// last), then committed by the writer, which answers `Done` and hands a moved
    /// cursor to the receipts task.
    pub(super) async fn on_mark_read(
        &self,
        s: &Session,
        req_id: u64,
        m: MarkRead,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::MarkRead, &self.limits)?;
        self.may_read(s, &m.conversation_id).await?;
        if !self.seq_exists(s, &m.conversation_id, m.seq).await? {
            return Err(Refusal::bad(format!(
                "no seq {} in {}",
                m.seq, m.conversation_id
            )));
        }
        let req = StateReq {
            read: Some(ReadUpdate {
                user_id: s.user_id.clone(),
                device_id: s.device_id.clone(),
                conversation_id: m.conversation_id,
                seq: m.seq,
            }),
            flags: None,
            req_id,
            origin: s.out.clone(),
        };
        self.submit(WriteReq::State(req))
    }

    /// SetConversationFlags: the caller's muted and pinned flags of a conversation
    /// they may read, committed by the writer, which answers `Done`.
    pub(super) async fn on_set_flags(
        &self,
        s: &Session,
        req_id: u64,
        f: SetConversationFlags,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::SetFlags, &self.limits)?;
        self.may_read(s, &f.conversation_id).await?;
        let req = StateReq {
            read: None,
            flags: Some(FlagsUpdate {
                user_id: s.user_id.clone(),
                conversation_id: f.conversation_id,
                muted: f.muted,
                pinned: f.pinned,
            }),
            req_id,
            origin: s.out.clone(),
        };
        self.submit(WriteReq::State(req))
    }

    /// ListConversations: one page of the caller's conversations, read from the store.
    pub(super) async fn on_list_conversations(
        &self,
        s: &Session,
        req_id: u64,
        l: ListConversations,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::ListConversations, &self.limits)?;
        let after = if l.after.is_empty() {
            None
        } else {
            Some(decode_after(&l.after).ok_or_else(|| Refusal::bad("invalid after token"))?)
        };
        let max = self.limits.list_conversations_limit_max;
        let limit = match l.limit {
            0 => DEFAULT_LIST_LIMIT.min(max),
            n => n.min(max),
        };
        let (conversations, next) = self
            .store
            .list_conversations(
                &s.user_id,
                after.as_ref(),
                limit,
                self.limits.conversation_preview_bytes as usize,
            )
            .await
            .map_err(Refusal::store)?;
        s.reply(&frame(
            req_id,
            Body::ConversationList(ConversationList {
                conversations,
                next_after: next.as_ref().map(encode_after).unwrap_or_default(),
            }),
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_tokens_round_trip_and_refuse_garbage() {
        let a = ListAfter {
            pinned: true,
            last_time: 1_700_000_000_123,
            conversation_id: "u:a.b:c".into(),
        };
        let t = encode_after(&a);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()), "{t}");
        assert_eq!(decode_after(&t), Some(a));
        for bad in [
            "",
            "zz",
            "abc",
            &"00".repeat(200),
            &encode_after(&ListAfter {
                pinned: false,
                last_time: 1,
                conversation_id: "nope".into(),
            }),
        ] {
            assert_eq!(decode_after(bad), None, "{bad}");
        }
    }
}
