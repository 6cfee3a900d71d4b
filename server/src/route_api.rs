//! `GET /v1/route`, on the client listener: which node a new client connection should
//! go to. In cluster mode the least-loaded live node of the cluster registry (skipping
//! the ones the client asks to avoid), falling back to this node unless it is draining;
//! on a single node, this node unless it is draining. In multi-region mode the answer
//! also names this region and lists every region's entry point (from the config), so
//! clients can probe them and join the nearest. A refusal is 503 with
//! `Retry-After` and the admin API's error body (`admin::error`). Every answer carries
//! `Access-Control-Allow-Origin: *`, so that a web app served from another origin can
//! ask too: the answer is a public node address, and the request carries no credentials.
//! It only reads the
//! registry that `cluster` keeps, so it lives apart from the cluster link: `cluster`
//! calls neither this module nor the admin API.

use std::sync::Arc;

use crate::cluster::registry::Registry;

/// State of `GET /v1/route` (on the client listener, in single-node mode too).
#[derive(Clone)]
pub struct RouteApi {
    /// This node's id.
    pub node_id: String,
    /// This node's client WebSocket URL.
    pub ws_url: String,
    /// The cluster registry (`None`: single node, the answer is always this node).
    pub registry: Option<Arc<Registry>>,
    /// This node is shutting down.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// Multi-region mode: this node's region (empty: one region).
    pub region: String,
    /// Multi-region mode: every region and its entry point (empty: one region).
    pub regions: Arc<[im_admin_api::RouteRegion]>,
}

/// `GET /v1/route[?avoid=ID,ID]`: the least-loaded healthy node for a new connection.
pub fn router(state: RouteApi) -> axum::Router {
    axum::Router::new()
        .route(
            im_admin_api::routes::ROUTE,
            axum::routing::get(route_handler),
        )
        .with_state(state)
}

#[derive(serde::Deserialize)]
struct RouteQuery {
    #[serde(default)]
    avoid: String,
}

async fn route_handler(
    state: axum::extract::State<RouteApi>,
    q: Result<axum::extract::Query<RouteQuery>, axum::extract::rejection::QueryRejection>,
) -> axum::response::Response {
    let mut response = route_answer(state, q);
    response.headers_mut().insert(
        axum::http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
        axum::http::HeaderValue::from_static("*"),
    );
    response
}

fn route_answer(
    axum::extract::State(api): axum::extract::State<RouteApi>,
    q: Result<axum::extract::Query<RouteQuery>, axum::extract::rejection::QueryRejection>,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let q = match q {
        Ok(q) => q.0,
        Err(e) => return crate::admin::error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let avoid: Vec<&str> = q.avoid.split(',').filter(|s| !s.is_empty()).collect();
    let chosen = match &api.registry {
        Some(r) => r.choose(&avoid).map(|n| (n.node_id, n.ws_url)).or_else(|| {
            // Every other node is avoided or down: this one, if it can take it.
            let me = !api.draining.load(std::sync::atomic::Ordering::Relaxed);
            me.then(|| (api.node_id.clone(), api.ws_url.clone()))
        }),
        None if api.draining.load(std::sync::atomic::Ordering::Relaxed) => None,
        None => Some((api.node_id.clone(), api.ws_url.clone())),
    };
    match chosen {
        Some((node_id, ws_url)) => axum::Json(im_admin_api::RouteAnswer {
            node_id,
            ws_url,
            region: api.region.clone(),
            regions: api.regions.to_vec(),
        })
        .into_response(),
        None => {
            let mut r = crate::admin::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no healthy node can take a connection",
            );
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            r
        }
    }
}
