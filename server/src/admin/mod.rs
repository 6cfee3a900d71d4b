//! Admin: the HTTP admin API on its own listener. Every route but
//! `/healthz` and `/readyz` needs `Authorization: Bearer <admin token>`; a missing or
//! wrong token gets 401 and is counted in `im_admin_unauthorized_total`. JSON shapes are
//! documented in `docs/admin-api.md` and kept stable: the console is built on them.
//! Every answer is one of `im_admin_api`'s types and every path one of its
//! `routes`, so the server, the console and the bench share one declaration.

pub mod diag;
pub mod homes;
pub mod messages;
pub mod trace;
pub mod users;
pub mod webhooks;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use im_admin_api::{
    routes, ClusterInfo, ClusterSummary, Connection, ConnectionList, ErrorBody, Group, GroupMember,
    Kicked, Memory, Overview, Refusals, Revoked, SlowConsumers,
};
use serde::Deserialize;

use crate::flow::{CloseReason, ConnState, Outbound};
use crate::Node;

/// The admin listener's routes.
pub fn router(node: Arc<Node>) -> Router {
    let protected = Router::new()
        .route(routes::METRICS, get(metrics))
        .route(routes::OVERVIEW, get(overview))
        .route(routes::CONNECTIONS, get(connections))
        .route(routes::CONNECTION, get(connection).delete(kick))
        .route(routes::SLOW_CONSUMERS, get(slow_consumers))
        .route(routes::MEMORY, get(memory))
        .route(routes::GROUP, get(group))
        .route(routes::REVOKE, post(revoke))
        .route(routes::RELOAD, post(reload))
        .route(routes::USER, get(users::get))
        .route(routes::MESSAGES, post(messages::post))
        .merge(diag::routes())
        .merge(trace::routes())
        .merge(webhooks::routes())
        .merge(homes::routes())
        .route_layer(middleware::from_fn_with_state(node.clone(), require_token));
    Router::new()
        .route(routes::HEALTHZ, get(|| async { "ok" }))
        .route(routes::READYZ, get(readyz))
        .merge(protected)
        .fallback(|| async { error(StatusCode::NOT_FOUND, im_admin_api::NO_SUCH_ROUTE) })
        .with_state(node)
}

/// A JSON error body: `{"error": "..."}` ([`ErrorBody`]).
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ErrorBody::new(message))).into_response()
}

async fn require_token(State(node): State<Arc<Node>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let metrics_open = node.config.admin_metrics_open && req.uri().path() == routes::METRICS;
    match given {
        _ if metrics_open => next.run(req).await,
        Some(t) if constant_time_eq(t.as_bytes(), node.secrets.admin_token.get().as_bytes()) => {
            next.run(req).await
        }
        _ => {
            metrics::counter!("im_admin_unauthorized_total").increment(1);
            let mut r = error(StatusCode::UNAUTHORIZED, "missing or invalid admin token");
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long `/readyz` waits for the store's answer before it says "not ready".
const READY_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// `/readyz` is unauthenticated, so it says only "ready", or "not ready: <reason>" with
/// one word (`draining`, `cluster`, a store fault such as `disk_full` or `store_down`,
/// `disk_low`, or `store` when the store does not answer its ping in time); details go to
/// the log. It answers within [`READY_STORE_TIMEOUT`] whatever the store does.
async fn readyz(State(node): State<Arc<Node>>) -> Response {
    let not_ready = |reason: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}"),
        )
            .into_response()
    };
    if node.draining.load(Ordering::Relaxed) {
        return not_ready("draining");
    }
    if node
        .cluster
        .as_ref()
        .is_some_and(|c| c.degraded().is_some())
    {
        return not_ready("cluster");
    }
    if let Some(reason) = node.pipeline.health.refusal() {
        return not_ready(reason);
    }
    match tokio::time::timeout(READY_STORE_TIMEOUT, node.store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready").into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readyz: the store's ping failed");
            not_ready("store")
        }
        Err(_) => {
            tracing::warn!("readyz: the store did not answer its ping within 1 s");
            not_ready("store")
        }
    }
}

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    match &node.prometheus {
        Some(h) => {
            let mut body = h.render();
            node.metrics.render_stages(&mut body);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
        }
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed",
        ),
    }
}

async fn overview(State(node): State<Arc<Node>>) -> Json<Overview> {
    // The sampler's figures, with the node's own fields and the live counts on top.
    let snap = node.snapshot();
    let [node_full, per_ip, draining] = node
        .metrics
        .totals
        .refused
        .each_ref()
        .map(|n| n.load(Ordering::Relaxed));
    Json(Overview {
        node_id: node.node_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        store: node.store.backend().to_owned(),
        probes: node.metrics.probes_enabled(),
        uptime_secs: node.started.elapsed().as_secs(),
        connections: node.conns.len() as u64,
        max_connections: node.max_connections as u64,
        max_connections_per_ip: node.config.limits.max_connections_per_ip.into(),
        // In the order of `obs::REFUSED_REASONS`.
        connections_refused: Refusals {
            node_full,
            per_ip,
            draining,
        },
        draining: node.draining.load(Ordering::Relaxed),
        store_refusal: node.pipeline.health.refusal().map(str::to_owned),
        persist_backlog: node.pipeline.persist.depth() as u64,
        persist_queue_capacity: node.pipeline.persist.capacity() as u64,
        cluster: cluster_view(&node),
        hooks: node
            .pipeline
            .before_send
            .iter()
            .map(|h| h.status())
            .collect(),
        regions: node
            .pipeline
            .region
            .as_ref()
            .map(|m| m.lag_view(node.started))
            .unwrap_or_default(),
        homes_moved: node
            .pipeline
            .region
            .as_ref()
            .map(|m| m.homes.moved() as u64),
        ..snap
    })
}

/// The overview's `cluster` object: every node of the registry and a summary (one node,
/// this one, in single-node mode).
fn cluster_view(node: &Node) -> ClusterInfo {
    let Some(c) = &node.cluster else {
        return ClusterInfo::default();
    };
    let nodes = c.link.registry.view();
    let healthy: Vec<_> = nodes.iter().filter(|n| n.healthy).collect();
    let sum_u = |f: fn(&crate::cluster::registry::LoadReport) -> u64| {
        healthy.iter().map(|n| f(&n.report)).sum::<u64>()
    };
    let sum_f = |f: fn(&crate::cluster::registry::LoadReport) -> f64| {
        healthy.iter().map(|n| f(&n.report)).sum::<f64>()
    };
    let summary = ClusterSummary {
        nodes: nodes.len() as u64,
        healthy: healthy.len() as u64,
        connections: sum_u(|r| r.connections),
        users_online: sum_u(|r| r.users_online),
        msg_rate_in: sum_f(|r| r.msg_rate_in),
        msg_rate_out: sum_f(|r| r.msg_rate_out),
        rss_bytes: sum_u(|r| r.rss_bytes),
        headroom_connections: sum_u(|r| r.headroom_connections),
    };
    ClusterInfo {
        enabled: true,
        node_id: Some(node.node_id.clone()),
        ttl_secs: Some(c.link.registry.ttl().as_secs()),
        users_on_other_nodes: Some(c.link.presence.len() as u64),
        nats_connected: Some(c.link.connected()),
        degraded: c.degraded().map(str::to_owned),
        nodes,
        summary: Some(summary),
    }
}

/// One connection as the admin API lists it.
fn connection_of(o: &Outbound) -> Connection {
    Connection {
        conn_id: o.conn_id,
        user_id: o.user().unwrap_or_default(),
        remote: o.remote.clone(),
        age_secs: o.opened.elapsed().as_secs_f64(),
        queued_bytes: o.queued_bytes() as u64,
        msgs_in: o.frames_in.load(Ordering::Relaxed),
        msgs_out: o.frames_out.load(Ordering::Relaxed),
        state: match o.state() {
            ConnState::Handshake => "handshake",
            ConnState::Active => "active",
            ConnState::Slow => "slow",
            ConnState::Closing => "closing",
        }
        .to_owned(),
        device: o.device().unwrap_or_default(),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    sort: Option<String>,
    limit: Option<String>,
    user: Option<String>,
}

/// Sort keys of `GET /admin/v1/connections` (`-` prefix reverses; numbers sort largest first).
pub const SORT_KEYS: &[&str] = &[
    "conn_id", "user", "age", "queued", "msgs_in", "msgs_out", "state",
];

fn list(
    node: &Node,
    q: &ListQuery,
    only_slow: bool,
) -> Result<(Vec<Connection>, usize), Box<Response>> {
    let limit = match q.limit.as_deref() {
        None => 100,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=100_000).contains(&n) => n,
            _ => {
                return Err(Box::new(error(
                    StatusCode::BAD_REQUEST,
                    format!("limit={l}: expected a whole number from 1 to 100000"),
                )))
            }
        },
    };
    let sort = q.sort.as_deref().unwrap_or("conn_id");
    let (reverse, key) = match sort.strip_prefix('-') {
        Some(k) => (true, k),
        None => (false, sort),
    };
    if !SORT_KEYS.contains(&key) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("sort={sort}: expected one of {}", SORT_KEYS.join(", ")),
        )));
    }
    let mut rows: Vec<Connection> = node
        .conns
        .snapshot()
        .iter()
        .filter(|o| !only_slow || o.state() == ConnState::Slow)
        .map(|o| connection_of(o))
        .filter(|c| q.user.as_deref().is_none_or(|u| c.user_id == u))
        .collect();
    let total = rows.len();
    match key {
        "user" => rows.sort_by(|a, b| a.user_id.cmp(&b.user_id).then(a.conn_id.cmp(&b.conn_id))),
        "age" => rows.sort_by(|a, b| b.age_secs.total_cmp(&a.age_secs)),
        "queued" => rows.sort_by_key(|c| std::cmp::Reverse(c.queued_bytes)),
        "msgs_in" => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_in)),
        "msgs_out" => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_out)),
        "state" => rows.sort_by(|a, b| a.state.cmp(&b.state).then(a.conn_id.cmp(&b.conn_id))),
        _ => rows.sort_by_key(|c| c.conn_id),
    }
    if reverse {
        rows.reverse();
    }
    rows.truncate(limit);
    Ok((rows, total))
}

async fn connections(State(node): State<Arc<Node>>, Query(q): Query<ListQuery>) -> Response {
    match list(&node, &q, false) {
        Ok((rows, total)) => Json(ConnectionList {
            total: total as u64,
            connections: rows,
        })
        .into_response(),
        Err(r) => *r,
    }
}

async fn connection(State(node): State<Arc<Node>>, Path(conn_id): Path<String>) -> Response {
    let Ok(id) = conn_id.parse::<u64>() else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("conn_id {conn_id:?} is not a number"),
        );
    };
    match node.conns.get(id) {
        Some(o) => Json(connection_of(&o)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no connection {id}")),
    }
}

async fn kick(State(node): State<Arc<Node>>, Path(conn_id): Path<String>) -> Response {
    let Ok(id) = conn_id.parse::<u64>() else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("conn_id {conn_id:?} is not a number"),
        );
    };
    if node.conns.close(
        id,
        CloseReason::new(CloseReason::KICKED, "kicked by operator"),
    ) {
        tracing::info!(conn_id = id, "connection kicked by operator");
        Json(Kicked { kicked: id }).into_response()
    } else {
        error(StatusCode::NOT_FOUND, format!("no connection {id}"))
    }
}

/// Most members and bans one group answer lists.
const GROUP_LIST_MAX: u32 = 1000;

async fn group(State(node): State<Arc<Node>>, Path(group_id): Path<String>) -> Response {
    if !im_proto::valid_id(&group_id) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("group id {group_id:?} is not valid"),
        );
    }
    match node.store.group_info(&group_id, GROUP_LIST_MAX).await {
        Ok(Some(g)) => Json(Group {
            group_id: g.group_id,
            kind: g.kind.to_owned(),
            members_can_invite: g.members_can_invite,
            created_by: g.created_by,
            created_at_ms: g.created_at,
            version: g.version,
            dissolved: g.dissolved,
            size: g.size.into(),
            members: g
                .members
                .into_iter()
                .map(|(user, role)| GroupMember {
                    user,
                    role: role.to_owned(),
                })
                .collect(),
            banned: g.banned,
            listed_max: GROUP_LIST_MAX,
        })
        .into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no group {group_id}")),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")),
    }
}

/// Revokes every token of a user issued up to now: recorded in the store (kept across
/// restarts), refused at login on every node, and every session of the user closed
/// (4003 "token revoked") here and, in cluster mode, on the other nodes.
async fn revoke(State(node): State<Arc<Node>>, Path(uid): Path<String>) -> Response {
    if !im_proto::valid_id(&uid) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("user id {uid:?} is not valid"),
        );
    }
    let at = (im_proto::now_ms() / 1000).max(0);
    if let Err(e) = node.store.revoke(&uid, at).await {
        return error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}"));
    }
    node.secrets.keys.revocations.revoke(&uid, at);
    let closed = node.conns.close_user(
        &uid,
        CloseReason::new(CloseReason::TOKEN_EXPIRED, "token revoked"),
    );
    if let Some(c) = &node.cluster {
        c.link.revoked(&uid, at).await;
    }
    tracing::info!(user = %uid, revoked_at = at, closed, "tokens revoked by operator");
    Json(Revoked {
        user: uid,
        revoked_at: at,
        closed: closed as u64,
    })
    .into_response()
}

/// Reads the token keys and the admin token again (as SIGHUP does); a failed reload
/// keeps the old ones and answers why.
async fn reload(State(node): State<Arc<Node>>) -> Response {
    let n = node.clone();
    match tokio::task::spawn_blocking(move || n.reload_secrets()).await {
        Ok(Ok(r)) => Json(im_admin_api::SecretsReloaded {
            signing_kid: r.signing_kid.unwrap_or_default(),
            kids: r.kids,
            admin_token_changed: r.admin_token_changed,
        })
        .into_response(),
        Ok(Err(e)) => error(
            StatusCode::BAD_REQUEST,
            format!("not reloaded, the old secrets stay in force: {e}"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("reload: {e}")),
    }
}

async fn slow_consumers(State(node): State<Arc<Node>>, Query(q): Query<ListQuery>) -> Response {
    let q = ListQuery {
        sort: q.sort.or(Some("queued".into())),
        ..q
    };
    match list(&node, &q, true) {
        Ok((rows, total)) => {
            let t = &node.metrics.totals;
            Json(SlowConsumers {
                total: total as u64,
                soft_mark_bytes: node.config.flow.soft_mark_bytes,
                hard_mark_bytes: node.config.flow.hard_mark_bytes,
                write_timeout_secs: node.config.flow.write_timeout_secs.into(),
                marked_total: t.slow_marked.load(Ordering::Relaxed),
                disconnects_total: t.slow_disconnects.load(Ordering::Relaxed),
                slow_consumers: rows,
            })
            .into_response()
        }
        Err(r) => *r,
    }
}

async fn memory(State(node): State<Arc<Node>>) -> Response {
    let snap = node.snapshot();
    let Some(m) = crate::obs::alloc::read() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "allocator stats unavailable",
        );
    };
    let rss_parts = crate::obs::process::rss_parts();
    let rss = rss_parts.map_or(snap.process.rss_bytes, |(anon, file)| anon + file);
    let rss_parts = rss_parts.unwrap_or((0, 0));
    Json(Memory {
        allocated: m.allocated,
        active: m.active,
        resident: m.resident,
        mapped: m.mapped,
        retained: m.retained,
        metadata: m.metadata,
        fragmentation: m.active.saturating_sub(m.allocated),
        dirty: m.resident.saturating_sub(m.active + m.metadata),
        rss,
        rss_anon: rss_parts.0,
        rss_file: rss_parts.1,
        sqlite: crate::obs::alloc::sqlite_used(),
        c_heap: crate::obs::alloc::c_heap().unwrap_or(0),
        connections: node.conns.len() as u64,
        per_connection_bytes: snap.capacity.per_connection_bytes,
        per_connection_measured: snap.capacity.per_connection_measured,
    })
    .into_response()
}
