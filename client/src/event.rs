//! `Event`: what the app learns from [`crate::Client::next_event`], in the order it
//! happened, and how a message the tracker released becomes one. Both the handle and its
//! background task (`driver`) use it; neither owns it.

use im_proto::{ChatMessage, MessageType, Presence, ReadReceipt, Typing};

/// Something the app should know about, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A message not seen before by this client (live or from a sync).
    Message(ChatMessage),
    /// The connection dropped; with auto-reconnect on, a reconnect is under way.
    Disconnected {
        /// Why (close code and reason, or the transport error).
        reason: String,
    },
    /// Logged in again (`resume = true`); a sync for what was missed follows.
    Reconnected {
        /// The node now serving this client.
        node_id: String,
    },
    /// A watched user's presence ([`crate::Client::subscribe_presence`]): their state at the
    /// subscription, then each change. After a reconnect the SDK subscribes again to the
    /// last list given.
    Presence(Presence),
    /// Someone is typing (or stopped) in a conversation: ephemeral, never stored, not
    /// sent again after a reconnect.
    Typing(Typing),
    /// Someone read a conversation up to a seq (pushed; `user_id` empty and
    /// `read_count` set for a large group's counted receipt).
    ReadReceipt(ReadReceipt),
    /// A RECALL event (live or from a sync) at its own seq, in order: the message
    /// (`ref_seq`, `ref_msg_id`) of the conversation was recalled by `sender`.
    Recalled(ChatMessage),
    /// An EDIT event (live or from a sync) at its own seq, in order: the message
    /// (`ref_seq`, `ref_msg_id`) now reads `payload`.
    Edited(ChatMessage),
}

impl Event {
    /// The event for a message the tracker released: RECALL and EDIT events become
    /// [`Event::Recalled`] and [`Event::Edited`] (unless hidden for this user: a HIDDEN
    /// tombstone is always an [`Event::Message`]), everything else [`Event::Message`].
    pub(crate) fn of(m: ChatMessage) -> Event {
        let hidden = m.state == im_proto::MessageState::Hidden as i32;
        match MessageType::try_from(m.r#type) {
            Ok(MessageType::Recall) if !hidden => Event::Recalled(m),
            Ok(MessageType::Edit) if !hidden => Event::Edited(m),
            _ => Event::Message(m),
        }
    }
}
