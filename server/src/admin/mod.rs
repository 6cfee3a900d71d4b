//! Admin: the HTTP admin API on its own listener (DESIGN.md section 6). Every route but
//! `/healthz` and `/readyz` needs `Authorization: Bearer <admin token>`; a missing or
//! wrong token gets 401 and is counted in `im_admin_unauthorized_total`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::Node;

/// The admin listener's routes.
pub fn router(node: Arc<Node>) -> Router {
    let protected = Router::new()
        .route("/metrics", get(metrics))
        .route("/admin/v1/overview", get(overview))
        .route_layer(middleware::from_fn_with_state(node.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .merge(protected)
        .with_state(node)
}

async fn require_token(State(node): State<Arc<Node>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), node.secrets.admin_token.as_bytes()) => {
            next.run(req).await
        }
        _ => {
            metrics::counter!("im_admin_unauthorized_total").increment(1);
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                Json(serde_json::json!({"error": "missing or invalid admin token"})),
            )
                .into_response()
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn readyz(State(node): State<Arc<Node>>) -> Response {
    if node.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    match node.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")).into_response(),
    }
}

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    match &node.prometheus {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed",
        )
            .into_response(),
    }
}

async fn overview(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "node_id": node.node_id,
        "uptime_secs": node.started.elapsed().as_secs(),
        "connections": node.conns.len(),
        "users_online": node.pipeline.router.users_online(),
        "persist_backlog": node.pipeline.persist.depth(),
        "store": node.store.backend(),
    }))
}
