//! `GET /admin/v1/messages/{msg_id}/trace`: one message's stage timeline, this node's
//! part (`obs::trace`) and, in cluster mode, every other live node's
//! (`cluster::trace::gather`), and in multi-region mode the other regions' parts
//! (`cluster::region_trace::gather_regions`, at the same time), merged in time order
//! ([`merge`]), each stage named with its region.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use im_admin_api::{routes, valid_msg_id, MessageTrace, TraceStage};

use super::error;
use crate::cluster::trace::NodePart;
use crate::Node;

/// The trace route (behind the admin token, merged by `admin::router`).
pub fn routes() -> Router<Arc<Node>> {
    Router::new().route(routes::MESSAGE_TRACE, get(trace))
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
    let local = node.pipeline.region.as_ref().map(|m| m.local.clone());
    let mut parts = Vec::new();
    if let Some(p) = node.metrics.tracer.get(&msg_id) {
        parts.push(Located {
            region: local.clone(),
            part: NodePart {
                node: node.node_id.clone(),
                part: p,
            },
        });
    }
    let mut unanswered = Unanswered::default();
    if let Some(c) = &node.cluster {
        let (g, regions) = tokio::join!(
            crate::cluster::trace::gather(&c.link, &msg_id, c.link.trace_timeout),
            other_regions(&node, &c.link, &msg_id)
        );
        let here = g.parts.into_iter().map(|part| Located {
            region: local.clone(),
            part,
        });
        parts.extend(here);
        unanswered.nodes = g.unanswered;
        if let Some(r) = regions {
            let there = r.parts.into_iter().map(|(region, part)| Located {
                region: Some(region),
                part,
            });
            parts.extend(there);
            unanswered.nodes.extend(r.nodes_unanswered);
            unanswered.regions = r.regions_unanswered;
        }
    }
    match merge(&msg_id, parts, unanswered) {
        Some(t) => Json(t).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no node holds a trace of message {msg_id}"),
        ),
    }
}

/// Multi-region mode: the other regions' parts of `msg_id` (`None` with regions off).
async fn other_regions(
    node: &Node,
    link: &crate::cluster::Link,
    msg_id: &str,
) -> Option<crate::cluster::region_trace::RegionsGathered> {
    let map = node.pipeline.region.as_ref()?;
    let g = crate::cluster::region_trace::gather_regions(link, &map.local, &map.names, msg_id);
    Some(g.await)
}

/// One node's part with the region of the node (`None` with regions off).
#[derive(Debug)]
pub struct Located {
    /// The node's region.
    pub region: Option<String>,
    /// Its part.
    pub part: NodePart,
}

/// The nodes and regions asked that gave no usable answer in time.
#[derive(Debug, Default)]
pub struct Unanswered {
    /// Live nodes (of this region, or named by another region's answer).
    pub nodes: Vec<String>,
    /// Other regions.
    pub regions: Vec<String>,
}

/// The timeline of `msg_id` from the nodes' parts, stages by start time (offsets from
/// the first); `None` when there is no part.
pub fn merge(msg_id: &str, parts: Vec<Located>, unanswered: Unanswered) -> Option<MessageTrace> {
    if parts.is_empty() {
        return None;
    }
    let mut t = MessageTrace {
        msg_id: msg_id.to_owned(),
        nodes_unanswered: unanswered.nodes,
        regions_unanswered: unanswered.regions,
        ..MessageTrace::default()
    };
    let mut spans = Vec::new();
    for Located { region, part } in parts {
        let NodePart { node, part } = part;
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
        if let Some(r) = region.as_ref().filter(|r| !t.regions.contains(r)) {
            t.regions.push(r.clone());
        }
        spans.extend(
            part.spans
                .into_iter()
                .map(|s| (node.clone(), region.clone(), s)),
        );
    }
    spans.sort_by_key(|(_, _, s)| s.start_unix_ns);
    let first = spans.first().map_or(0, |(_, _, s)| s.start_unix_ns);
    t.started_unix_ms = first / 1_000_000;
    t.stages = spans
        .into_iter()
        .map(|(node, region, s)| TraceStage {
            node,
            stage: s.stage.name().to_owned(),
            start_offset_ns: u64::try_from(s.start_unix_ns.saturating_sub(first)).unwrap_or(0),
            duration_ns: s.duration_ns,
            recipient: s.recipient.map(|r| r.to_string()),
            region,
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
        assert!(merge("m", Vec::new(), Unanswered::default()).is_none());
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
        let at = |region: &str, part| Located {
            region: Some(region.to_owned()),
            part,
        };
        let unanswered = Unanswered {
            nodes: vec!["n3".into()],
            regions: vec!["c".into()],
        };
        let t = merge("m", vec![at("a", b), at("b", a)], unanswered).unwrap();
        assert_eq!(t.regions, ["a", "b"]);
        assert_eq!(t.regions_unanswered, ["c"]);
        assert_eq!(t.stages[0].region.as_deref(), Some("b"));
        assert_eq!(t.stages[2].region.as_deref(), Some("a"));
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
