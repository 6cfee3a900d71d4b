//! The webhook routes of the admin API: the endpoints with their queues and figures,
//! the parked events, redelivery and the test-fire. 404 when no endpoint is configured.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use im_admin_api::{routes, Redeliver, Redelivered};
use serde::Deserialize;

use super::error;
use crate::hooks::webhooks::{WebhookError, Webhooks};
use crate::Node;

/// Most parked events one page lists.
const PARKED_MAX: u32 = 1000;
/// Most ids one redeliver names; the largest body it accepts.
const REDELIVER_IDS: usize = 10_000;
const REDELIVER_BYTES: usize = 256 * 1024;

/// The routes.
pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route(routes::WEBHOOKS, get(list))
        .route(routes::WEBHOOKS_PARKED, get(parked))
        .route(routes::WEBHOOKS_REDELIVER, post(redeliver))
        .route(routes::WEBHOOK_TEST, post(test))
}

/// The node's webhooks, or the 404 answer when none are configured.
fn configured(node: &Node) -> Result<&Arc<Webhooks>, Box<Response>> {
    node.webhooks.as_ref().ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "no webhook endpoint is configured",
        ))
    })
}

fn failed(e: WebhookError) -> Response {
    match e {
        WebhookError::NoEndpoint(_) => error(StatusCode::NOT_FOUND, e.to_string()),
        e => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn list(State(node): State<Arc<Node>>) -> Response {
    match configured(&node) {
        Ok(w) => Json(w.view()).into_response(),
        Err(r) => *r,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParkedQuery {
    #[serde(default)]
    endpoint: String,
    limit: Option<String>,
}

async fn parked(State(node): State<Arc<Node>>, Query(q): Query<ParkedQuery>) -> Response {
    let w = match configured(&node) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let limit = match q.limit.as_deref().map(str::parse::<u32>) {
        None => 100,
        Some(Ok(n)) if (1..=PARKED_MAX).contains(&n) => n,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("limit: use 1-{PARKED_MAX}"),
            )
        }
    };
    match w.parked(&q.endpoint, limit).await {
        Ok(p) => Json(p).into_response(),
        Err(e) => failed(e),
    }
}

async fn redeliver(State(node): State<Arc<Node>>, body: Body) -> Response {
    let w = match configured(&node) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let bytes = match axum::body::to_bytes(body, REDELIVER_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body: larger than {REDELIVER_BYTES} bytes"),
            )
        }
    };
    let req: Redeliver = if bytes.is_empty() {
        Redeliver::default()
    } else {
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(de) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
        }
    };
    if req.ids.len() > REDELIVER_IDS {
        return error(
            StatusCode::BAD_REQUEST,
            format!("ids: at most {REDELIVER_IDS}"),
        );
    }
    match w.redeliver(&req.endpoint, &req.ids).await {
        Ok(queued) => Json(Redelivered { queued }).into_response(),
        Err(e) => failed(e),
    }
}

async fn test(State(node): State<Arc<Node>>, Path(name): Path<String>) -> Response {
    let w = match configured(&node) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    match w.test_fire(&name).await {
        Ok(t) => Json(t).into_response(),
        Err(e) => failed(e),
    }
}
