//! `GET /admin/v1/messages/{msg_id}/trace`: one message's stage timeline, this node's
//! part (`obs::trace`) and, in cluster mode, every other live node's
//! (`cluster::trace::gather`), merged in time order ([`merge`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use im_admin_api::{routes, MessageTrace, TraceStage};

use super::error;
use crate::cluster::trace::NodePart;
use crate::Node;

/// The trace route (behind the admin token, merged by `admin::router`).
pub fn routes() -> Router<Arc<Node>> {
    Router::new().route(routes::MESSAGE_TRACE, get(trace))
}

/// Whether `id` is a msg_id: 32 hex digits.
pub fn valid_msg_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn trace(State(node): State<Arc<Node>>, Path(msg_id): Path<String>) -> Response {
    if !valid_msg_id(&msg_id) {
        let shown: String = msg_id.chars().take(64).collect();
        return error(
            StatusCode::BAD_REQUEST,
            format!("msg_id {shown:?} is not valid: it must be 32 hex digits"),
        );
    }
    let msg_id = msg_id.to_ascii_lowercase();
    let mut parts = Vec::new();
    if let Some(p) = node.metrics.tracer.get(&msg_id) {
        parts.push(NodePart {
            node: node.node_id.clone(),
            part: p,
        });
    }
    let mut unanswered = Vec::new();
    if let Some(c) = &node.cluster {
        let g = crate::cluster::trace::gather(&c.link, &msg_id, c.link.trace_timeout).await;
        parts.extend(g.parts);
        unanswered = g.unanswered;
    }
    match merge(&msg_id, parts, unanswered) {
        Some(t) => Json(t).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no node holds a trace of message {msg_id}"),
        ),
    }
}

/// The timeline of `msg_id` from the nodes' parts, stages by start time (offsets from
/// the first); `None` when there is no part.
pub fn merge(msg_id: &str, parts: Vec<NodePart>, unanswered: Vec<String>) -> Option<MessageTrace> {
    if parts.is_empty() {
        return None;
    }
    let mut t = MessageTrace {
        msg_id: msg_id.to_owned(),
        nodes_unanswered: unanswered,
        ..MessageTrace::default()
    };
    let mut spans = Vec::new();
    for NodePart { node, part } in parts {
        if t.sender.is_empty() {
            t.sender = part.sender;
        }
        if t.conversation.is_empty() {
            t.conversation = part.conversation;
        }
        t.seq = t.seq.max(part.seq);
        t.recipients_omitted += part.recipients_omitted;
        if !t.nodes.contains(&node) {
            t.nodes.push(node.clone());
        }
        spans.extend(part.spans.into_iter().map(|s| (node.clone(), s)));
    }
    spans.sort_by_key(|(_, s)| s.start_unix_ns);
    let first = spans.first().map_or(0, |(_, s)| s.start_unix_ns);
    t.started_unix_ms = first / 1_000_000;
    t.stages = spans
        .into_iter()
        .map(|(node, s)| TraceStage {
            node,
            stage: s.stage.name().to_owned(),
            start_offset_ns: u64::try_from(s.start_unix_ns.saturating_sub(first)).unwrap_or(0),
            duration_ns: s.duration_ns,
            recipient: s.recipient.map(|r| r.to_string()),
        })
        .collect();
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::trace::{Part, Span};
    use crate::obs::Stage;

    fn span(stage: Stage, start: i64, recipient: Option<&str>) -> Span {
        Span {
            stage,
            start_unix_ns: start,
            duration_ns: 10,
            recipient: recipient.map(Arc::from),
        }
    }

    #[test]
    fn ids_are_32_hex_digits() {
        assert!(valid_msg_id("0123456789abcdef0123456789ABCDEF"));
        assert!(!valid_msg_id("0123456789abcdef0123456789abcde"));
        assert!(!valid_msg_id("0123456789abcdef0123456789abcdeg"));
        assert!(!valid_msg_id(""));
    }

    #[test]
    fn parts_merge_in_time_order() {
        assert!(merge("m", Vec::new(), Vec::new()).is_none());
        let a = NodePart {
            node: "n1".into(),
            part: Part {
                msg_id: "m".into(),
                sender: "alice".into(),
                conversation: "u:alice:bob".into(),
                seq: 4,
                spans: vec![
                    span(Stage::Decode, 1_000, None),
                    span(Stage::Route, 5_000, None),
                ],
                recipients_omitted: 0,
            },
        };
        let b = NodePart {
            node: "n2".into(),
            part: Part {
                msg_id: "m".into(),
                spans: vec![span(Stage::Write, 6_000, Some("bob"))],
                recipients_omitted: 2,
                ..Part::default()
            },
        };
        let t = merge("m", vec![b, a], vec!["n3".into()]).unwrap();
        assert_eq!(t.sender, "alice");
        assert_eq!(t.seq, 4);
        assert_eq!(t.recipients_omitted, 2);
        assert_eq!(t.nodes_unanswered, ["n3"]);
        let order: Vec<(&str, &str, u64)> = t
            .stages
            .iter()
            .map(|s| (s.node.as_str(), s.stage.as_str(), s.start_offset_ns))
            .collect();
        assert_eq!(
            order,
            [
                ("n1", "decode", 0),
                ("n1", "route", 4_000),
                ("n2", "write", 5_000)
            ]
        );
        assert_eq!(t.stages[2].recipient.as_deref(), Some("bob"));
    }
}
