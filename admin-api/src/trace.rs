//! Message traces: the answer of `GET /admin/v1/messages/{msg_id}/trace`, one message's
//! stage timeline merged from every node that recorded part of it.

use serde::{Deserialize, Serialize};

/// Whether `id` is a msg_id: 32 hex digits (what the trace route, the nodes answering a
/// trace query and the console accept).
pub fn valid_msg_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// One stage of a traced message on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceStage {
    /// The node that recorded it.
    pub node: String,
    /// Stage name: decode, validate, relation, before_send, persist_wait,
    /// persist_commit, route, queue_wait or write; in multi-region mode also
    /// region_forward, apply_wait (the forwarding node), repl_publish (the home's
    /// publisher) and repl_apply (another region's applier).
    pub stage: String,
    /// Start, in nanoseconds after the trace's first stage started.
    pub start_offset_ns: u64,
    /// Duration in nanoseconds.
    pub duration_ns: u64,
    /// The recipient, for the per-recipient stages (queue_wait, write).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    /// Multi-region mode: the region of the node that recorded it (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// `GET /admin/v1/messages/{msg_id}/trace` answer: the merged timeline, in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageTrace {
    /// The message id (32 hex digits).
    pub msg_id: String,
    /// The sender's user id.
    pub sender: String,
    /// The conversation id.
    pub conversation: String,
    /// The message's seq in its conversation.
    pub seq: u64,
    /// Wall-clock start of the first stage, milliseconds since the Unix epoch.
    pub started_unix_ms: i64,
    /// The nodes whose parts are merged here.
    pub nodes: Vec<String>,
    /// Live nodes asked that sent no usable answer in time (their part may be missing).
    pub nodes_unanswered: Vec<String>,
    /// Every stage, by start time.
    pub stages: Vec<TraceStage>,
    /// Recipients past the per-message cap whose stages were not recorded.
    pub recipients_omitted: u64,
    /// Multi-region mode: the regions whose parts are merged here (this one first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Multi-region mode: the other regions asked that sent no usable answer in time
    /// (unreachable, or no node answered), whose parts may be missing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions_unanswered: Vec<String>,
}
