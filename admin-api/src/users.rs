//! The per-user diagnosis route (`GET /admin/v1/users/{uid}`): "why is this user not
//! getting messages?" answered cluster-wide: the user's sessions on every node, their
//! unread backlog per conversation, recent refusals, the log filter on them and the
//! messages they recently sent and received. [`UserNode`] is one node's part (what a
//! node answers a cluster query with); [`UserDiag`] is the merged answer.

use serde::{Deserialize, Serialize};

/// Default of `?backlog=` (conversations listed).
pub const BACKLOG_DEFAULT: u32 = 20;
/// Largest `?backlog=`.
pub const BACKLOG_MAX: u32 = 200;
/// Default of `?messages=` (recent messages listed; the largest is the ring size).
pub const MESSAGES_DEFAULT: u32 = 20;

/// `GET /admin/v1/users/{uid}`: the merged answer of every node that answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserDiag {
    /// The user asked about.
    pub user_id: String,
    /// The node that answered the request (and asked the others).
    pub node_id: String,
    /// Whether the answer covers a cluster (`false`: this node alone).
    pub cluster: bool,
    /// Nodes whose part is in this answer, this one first.
    pub nodes: Vec<String>,
    /// Live nodes that did not answer within `cluster.query_timeout_ms` (or answered
    /// something unusable): their sessions and messages are not in this answer.
    pub missing_nodes: Vec<String>,
    /// The user's sessions on every node that answered.
    pub sessions: Vec<UserSession>,
    /// Conversations with unread messages, largest backlog first, at most `backlog_limit`.
    pub backlog: Vec<Backlog>,
    /// The `?backlog=` limit applied.
    pub backlog_limit: u32,
    /// Refusals sent to the user's connections, per error code, summed over the nodes.
    pub refusals: Vec<UserRefusal>,
    /// RATE_LIMITED refusals (all frame kinds), summed over the nodes.
    pub rate_limited: u64,
    /// Connections of the user closed for flooding, summed over the nodes.
    pub floods: u64,
    /// The per-uid log filters on the user, one per node that has one.
    pub log_filters: Vec<UserLogFilter>,
    /// Whether any node records the user's messages (log filter or sampling).
    pub tracked: bool,
    /// The most recent messages sent and received by the user, newest first, at most
    /// `messages_limit` (empty while no node tracks the user).
    pub messages: Vec<UserMessage>,
    /// The `?messages=` limit applied.
    pub messages_limit: u32,
    /// Messages a node keeps per tracked user (`obs.user_diag_ring`).
    pub ring_size: u32,
}

/// One node's part of a [`UserDiag`] (also what a node answers a cluster query with).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserNode {
    /// The node.
    pub node_id: String,
    /// The user asked about.
    pub user_id: String,
    /// The user's sessions there.
    pub sessions: Vec<UserSession>,
    /// Refusals there, per error code.
    pub refusals: Vec<UserRefusal>,
    /// RATE_LIMITED refusals there.
    pub rate_limited: u64,
    /// Flood closes there.
    pub floods: u64,
    /// The per-uid log filter there, if any.
    pub log_filter: Option<UserLogFilter>,
    /// Whether the node records the user's messages.
    pub tracked: bool,
    /// Recent messages there, newest first.
    pub messages: Vec<UserMessage>,
    /// `obs.user_diag_ring` there.
    pub ring_size: u32,
}

/// One session of the user (the connections route's row, with its node).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserSession {
    /// The node holding the connection.
    pub node: String,
    /// Node-unique connection id (kick it on that node).
    pub conn_id: u64,
    /// The logged-in device.
    pub device: String,
    /// Seconds since accept.
    pub age_secs: f64,
    /// Remote address.
    pub remote: String,
    /// Bytes queued for writing.
    pub queued_bytes: u64,
    /// `handshake`, `active`, `slow` or `closing`.
    pub state: String,
    /// Frames received.
    pub msgs_in: u64,
    /// Frames written.
    pub msgs_out: u64,
}

/// One conversation's unread backlog: the user's cursor against its last seq.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Backlog {
    /// The conversation.
    pub conversation_id: String,
    /// The user's delivered-up-to cursor (0: nothing acked).
    pub cursor: u64,
    /// The conversation's last seq.
    pub last_seq: u64,
    /// `last_seq - cursor`.
    pub unread: u64,
}

/// Refusals of one error code sent to the user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserRefusal {
    /// The error code's name (`NOT_MEMBER`, `RATE_LIMITED`, ...).
    pub code: String,
    /// How many.
    pub count: u64,
    /// The last one, unix milliseconds.
    pub last_ms: i64,
}

/// The per-uid log filter on the user on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserLogFilter {
    /// The node.
    pub node: String,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// Seconds until it expires.
    pub remaining_secs: f64,
}

/// One message the user sent or received, as a node recorded it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserMessage {
    /// `sent` or `received`.
    pub direction: String,
    /// The node that recorded it.
    pub node: String,
    /// The message id (empty for a push from another node that carried none).
    pub msg_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Its seq.
    pub seq: u64,
    /// When the node recorded it, unix milliseconds.
    pub at_ms: i64,
    /// How it reached the user's sessions on that node: `push`, `sync_hint`, `none`
    /// (no session there), or `committed` for a message sent.
    pub how: String,
    /// The user's sessions on that node it was queued to (received messages).
    pub sessions: u32,
    /// Per-stage timings known for it, in milliseconds.
    pub stages: Vec<StageTiming>,
}

/// One stage's time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageTiming {
    /// The stage (`read_to_commit`, `read_to_route`, ...).
    pub stage: String,
    /// Milliseconds.
    pub ms: f64,
}

impl UserDiag {
    /// Merges the nodes' parts (this node's first): sessions concatenated, refusals
    /// summed per code, messages newest first cut to `messages_limit`.
    pub fn merge(&mut self, parts: Vec<UserNode>) {
        for p in parts {
            self.nodes.push(p.node_id.clone());
            self.sessions.extend(p.sessions);
            for r in p.refusals {
                match self.refusals.iter_mut().find(|x| x.code == r.code) {
                    Some(x) => {
                        x.count += r.count;
                        x.last_ms = x.last_ms.max(r.last_ms);
                    }
                    None => self.refusals.push(r),
                }
            }
            self.rate_limited += p.rate_limited;
            self.floods += p.floods;
            if let Some(f) = p.log_filter {
                self.log_filters.push(f);
            }
            self.tracked |= p.tracked;
            self.messages.extend(p.messages);
            self.ring_size = self.ring_size.max(p.ring_size);
        }
        self.refusals
            .sort_by(|a, b| b.count.cmp(&a.count).then(a.code.cmp(&b.code)));
        self.messages
            .sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then(b.seq.cmp(&a.seq)));
        self.messages.truncate(self.messages_limit as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_merge() {
        let mut d = UserDiag {
            messages_limit: 2,
            ..Default::default()
        };
        let msg = |at_ms, node: &str| UserMessage {
            at_ms,
            node: node.into(),
            ..Default::default()
        };
        d.merge(vec![
            UserNode {
                node_id: "a".into(),
                refusals: vec![UserRefusal {
                    code: "NOT_MEMBER".into(),
                    count: 2,
                    last_ms: 5,
                }],
                messages: vec![msg(3, "a"), msg(1, "a")],
                ring_size: 32,
                ..Default::default()
            },
            UserNode {
                node_id: "b".into(),
                refusals: vec![UserRefusal {
                    code: "NOT_MEMBER".into(),
                    count: 1,
                    last_ms: 9,
                }],
                rate_limited: 4,
                tracked: true,
                messages: vec![msg(2, "b")],
                ..Default::default()
            },
        ]);
        assert_eq!(d.nodes, ["a", "b"]);
        assert_eq!((d.refusals[0].count, d.refusals[0].last_ms), (3, 9));
        assert_eq!(d.rate_limited, 4);
        assert!(d.tracked);
        let at: Vec<i64> = d.messages.iter().map(|m| m.at_ms).collect();
        assert_eq!(at, [3, 2]);
        assert_eq!(d.ring_size, 32);
    }
}
