//! Server-sent messages: the request body of `POST /admin/v1/messages` (a SYSTEM or a
//! bot message to a user, a group or a list of users) and its answer.

use serde::{Deserialize, Serialize};

/// The header whose value makes `POST /admin/v1/messages` idempotent: it is stored as
/// each message's client_msg_id, so a retry answers the first commit (`duplicate`).
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Who a server message is from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageKind {
    /// A SYSTEM message from the reserved sender `system`.
    #[default]
    System,
    /// A TEXT message from the bot user named by `from`.
    Bot,
}

/// Body of `POST /admin/v1/messages`: exactly one of `to_user`, `group_id` and `users`,
/// and exactly one of `payload` and `payload_base64`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    /// One user: the one-to-one conversation between the sender and them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_user: Option<String>,
    /// A group: its conversation, pushed to its members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// Up to 1,000 users, one message to each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<String>>,
    /// `system` or `bot`.
    pub kind: MessageKind,
    /// The bot's user id (`bot` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The payload as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload as standard base64 (binary payloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
}

/// One committed message (`results[]`), one per target conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PostedMessage {
    /// The conversation (`u:<a>:<b>` or `g:<group_id>`).
    pub conversation_id: String,
    /// The message id (the first commit's, for a duplicate).
    pub msg_id: String,
    /// Its seq in the conversation.
    pub seq: u64,
    /// True when this Idempotency-Key was already committed in this conversation.
    pub duplicate: bool,
}

/// `POST /admin/v1/messages` answer: the results in the order of the targets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PostedMessages {
    /// One entry per target.
    pub results: Vec<PostedMessage>,
}
