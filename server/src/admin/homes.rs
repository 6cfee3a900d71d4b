//! The home-move routes of the admin API (multi-region mode; docs/admin-api.md):
//! `GET /admin/v1/homes` (this node's view: ready, moved, reconciliation counts),
//! `GET /admin/v1/homes/{conversation}` (home, epoch, fence), `POST` on it (move the
//! conversation's home to this node's region, `region_home::move_home`) and
//! `POST /admin/v1/homes` (every conversation this region knows homed in `from`).
//! 404 with regions off; bodies at most [`BODY_BYTES`], unknown fields refused.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use im_admin_api::{routes, Home, Homes, HomesMoved, MoveHome, MoveHomes};
use serde::de::DeserializeOwned;

use super::error;
use crate::region::RegionMap;
use crate::region_home::{move_home, MoveError};
use crate::store::homes::HomeStore;
use crate::Node;

/// Largest request body.
pub const BODY_BYTES: usize = 4096;
/// Most conversations one bulk move looks at (it can be repeated: moved ones are skipped).
const BULK_MAX: usize = 100_000;
/// Conversations read per page of a bulk move.
const PAGE: u32 = 1000;
/// Errors a bulk move lists.
const ERRORS_LISTED: usize = 20;

/// The routes.
pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route(routes::HOMES, get(status).post(move_all))
        .route(routes::HOME, get(one).post(move_one))
}

/// The region map and the store's home side, or the 404 answer with regions off.
fn regions(node: &Node) -> Result<(&Arc<RegionMap>, &dyn HomeStore), Box<Response>> {
    let map = node.pipeline.region.as_ref();
    let homes = node.store.homes();
    match (map, homes) {
        (Some(m), Some(h)) => Ok((m, h)),
        _ => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "multi-region mode is off (no `region` set)",
        ))),
    }
}

/// A bounded JSON body, or the 413/400 answer naming the problem.
async fn body<T: DeserializeOwned>(body: Body) -> Result<T, Box<Response>> {
    let bytes = axum::body::to_bytes(body, BODY_BYTES).await.map_err(|_| {
        Box::new(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body: larger than {BODY_BYTES} bytes"),
        ))
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("body: {e}"))))
}

/// `GET /admin/v1/homes`.
async fn status(State(node): State<Arc<Node>>) -> Response {
    let (map, homes) = match regions(&node) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let (pending, reconciled, kept) = match homes.reconcile_counts().await {
        Ok(c) => c,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")),
    };
    Json(Homes {
        region: map.local.clone(),
        ready: map.homes.ready(),
        moved: map.homes.moved() as u64,
        reconcile_pending: pending,
        reconciled,
        reconcile_kept: kept,
    })
    .into_response()
}

/// `GET /admin/v1/homes/{conversation}`.
async fn one(State(node): State<Arc<Node>>, Path(conversation): Path<String>) -> Response {
    let (map, _) = match regions(&node) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if im_proto::parse_conversation(&conversation).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "not a conversation id (u:<a>:<b> or g:<group>)",
        );
    }
    let last = map.homes.terms(&conversation).last().copied();
    Json(Home {
        home: map.home(&conversation).to_owned(),
        epoch: last.map_or(0, |t| t.epoch),
        fence: last.map_or(0, |t| t.fence),
        conversation_id: conversation,
        set_aside: 0,
    })
    .into_response()
}

/// `POST /admin/v1/homes/{conversation}` [`MoveHome`].
async fn move_one(
    State(node): State<Arc<Node>>,
    Path(conversation): Path<String>,
    req: Body,
) -> Response {
    let (map, homes) = match regions(&node) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let req: MoveHome = match body(req).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if let Err(r) = here(map, &req.region) {
        return *r;
    }
    match move_home(map, homes, &conversation, req.force).await {
        Ok((conversation_id, home, epoch, fence, set_aside)) => Json(Home {
            conversation_id,
            home,
            epoch,
            fence,
            set_aside,
        })
        .into_response(),
        Err(e) => refused(e),
    }
}

/// 400 unless `region` is this node's (a move is made at its new home).
fn here(map: &RegionMap, region: &str) -> Result<(), Box<Response>> {
    if region == map.local {
        return Ok(());
    }
    let entry = map.names.iter().position(|n| n == region);
    let hint = entry.map_or_else(
        || format!("region {region:?} is not configured"),
        |i| {
            format!(
                "send it to a node of region {region} ({})",
                map.route_urls[i]
            )
        },
    );
    Err(Box::new(error(
        StatusCode::BAD_REQUEST,
        format!(
            "region: a move is made at the new home; this node is in region {}: {hint}",
            map.local
        ),
    )))
}

/// The answer of a move that was not made.
fn refused(e: MoveError) -> Response {
    let status = match &e {
        MoveError::Bad(_) => StatusCode::BAD_REQUEST,
        MoveError::Conflict(_) => StatusCode::CONFLICT,
        MoveError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

/// `POST /admin/v1/homes` [`MoveHomes`].
async fn move_all(State(node): State<Arc<Node>>, req: Body) -> Response {
    let (map, homes) = match regions(&node) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let req: MoveHomes = match body(req).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if let Err(r) = here(map, &req.to) {
        return *r;
    }
    if req.from == req.to || !map.names.contains(&req.from) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("from: {:?} is not another configured region", req.from),
        );
    }
    let mut out = HomesMoved::default();
    let (mut after, mut seen) = (String::new(), 0usize);
    while seen < BULK_MAX {
        let page = match homes.conversations_after(&after, PAGE).await {
            Ok(p) => p,
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")),
        };
        let Some(last) = page.last().cloned() else {
            break;
        };
        seen += page.len();
        for c in page.iter().filter(|c| map.home(c) == req.from) {
            match move_home(map, homes, c, req.force).await {
                Ok(_) => out.moved += 1,
                Err(e) => {
                    out.failed += 1;
                    if out.errors.len() < ERRORS_LISTED {
                        out.errors.push(format!("{c}: {e}"));
                    }
                }
            }
        }
        after = last;
    }
    tracing::warn!(from = %req.from, to = %req.to, forced = req.force, moved = out.moved,
        failed = out.failed, "bulk home move");
    Json(out).into_response()
}
