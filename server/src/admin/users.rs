//! The per-user diagnosis route, `GET /admin/v1/users/{uid}?backlog=N&messages=M`
//! ("why is this user not getting messages?"): the user's sessions, unread backlog per
//! conversation, refusals, log filter and recent messages. In cluster mode the node
//! asks every other live node for its part (`cluster::query`) and merges them; a node
//! that does not answer within `cluster.query_timeout_ms` is listed in
//! `missing_nodes`. The backlog is read once from the store, which the nodes share.
//! [`local_part`] is this node's part, also what it answers the other nodes with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use im_admin_api::users::{BACKLOG_DEFAULT, BACKLOG_MAX, MESSAGES_DEFAULT};
use im_admin_api::{Backlog, UserDiag, UserLogFilter, UserNode, UserSession};

use super::{connection_of, error};
use crate::obs::logfiles;
use crate::Node;

/// This node's part of `uid`'s diagnosis, with at most `messages` recent messages.
pub fn local_part(node: &Node, uid: &str, messages: usize) -> UserNode {
    let users = &node.pipeline.users;
    let messages = messages.min(users.ring_size());
    let sessions = node
        .pipeline
        .router
        .sessions_of(uid)
        .iter()
        .map(|o| {
            let c = connection_of(o);
            UserSession {
                node: node.node_id.clone(),
                conn_id: c.conn_id,
                device: c.device,
                age_secs: (c.age_secs * 10.0).round() / 10.0,
                remote: c.remote,
                queued_bytes: c.queued_bytes,
                state: c.state,
                msgs_in: c.msgs_in,
                msgs_out: c.msgs_out,
            }
        })
        .collect();
    let log_filter = logfiles::control().and_then(|c| {
        c.filters.level_of(uid)?;
        c.filters
            .list()
            .into_iter()
            .find(|f| f.uid == uid)
            .map(|f| UserLogFilter {
                node: node.node_id.clone(),
                level: f.level.to_owned(),
                remaining_secs: f.remaining_secs,
            })
    });
    let figures = users.figures(uid, &node.node_id, messages);
    UserNode {
        node_id: node.node_id.clone(),
        user_id: uid.to_owned(),
        sessions,
        refusals: figures.refusals,
        rate_limited: figures.rate_limited,
        floods: figures.floods,
        log_filter,
        tracked: users.tracked(uid),
        messages: figures.messages,
        ring_size: u32::try_from(users.ring_size()).unwrap_or(u32::MAX),
    }
}

/// `?name=` as a whole number in `range`, `default` when absent; else a 400 naming it.
fn param(
    q: &HashMap<String, String>,
    name: &str,
    default: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<u32, Box<Response>> {
    match q.get(name) {
        None => Ok(default.clamp(*range.start(), *range.end())),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{name}={v}: expected a whole number from {} to {}",
                    range.start(),
                    range.end()
                ),
            ))),
        },
    }
}

/// `GET /admin/v1/users/{uid}`.
pub async fn get(
    State(node): State<Arc<Node>>,
    Path(uid): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !im_proto::valid_id(&uid) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("uid {uid:?} is not a valid user id (1-64 characters of A-Z a-z 0-9 _ . @ -)"),
        );
    }
    let ring = u32::try_from(node.pipeline.users.ring_size()).unwrap_or(u32::MAX);
    let backlog_limit = match param(&q, "backlog", BACKLOG_DEFAULT, 1..=BACKLOG_MAX) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let messages_limit = match param(&q, "messages", MESSAGES_DEFAULT, 0..=ring) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    if let Some(k) = q
        .keys()
        .find(|k| !matches!(k.as_str(), "backlog" | "messages"))
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{k}: unknown parameter (expected backlog, messages)"),
        );
    }
    let mut answer = UserDiag {
        user_id: uid.clone(),
        node_id: node.node_id.clone(),
        cluster: node.cluster.is_some(),
        backlog_limit,
        messages_limit,
        ..Default::default()
    };
    let mut parts = vec![local_part(&node, &uid, messages_limit as usize)];
    let remote = async {
        match &node.cluster {
            Some(c) => {
                let timeout = Duration::from_millis(node.config.cluster.query_timeout_ms.into());
                c.link.query_user(&uid, messages_limit, timeout).await
            }
            None => (Vec::new(), Vec::new()),
        }
    };
    let (backlog, (others, missing)) =
        tokio::join!(node.store.user_backlog(&uid, backlog_limit), remote);
    parts.extend(others);
    answer.missing_nodes = missing;
    answer.merge(parts);
    match backlog {
        Ok(rows) => {
            answer.backlog = rows
                .into_iter()
                .map(|r| Backlog {
                    unread: r.last_seq.saturating_sub(r.cursor),
                    conversation_id: r.conversation_id,
                    cursor: r.cursor,
                    last_seq: r.last_seq,
                })
                .collect();
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")),
    }
    let known = !answer.sessions.is_empty()
        || !answer.backlog.is_empty()
        || !answer.refusals.is_empty()
        || answer.floods > 0
        || !answer.log_filters.is_empty()
        || !answer.messages.is_empty()
        || !answer.missing_nodes.is_empty();
    if !known {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "nothing known of user {uid}: no session, no unread conversation, no refusal, \
                 no log filter, no recorded message"
            ),
        );
    }
    Json(answer).into_response()
}
