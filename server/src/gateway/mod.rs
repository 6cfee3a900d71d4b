//! Gateway: the client listener. Accepts WebSocket upgrades on `GET /ws` with bounded
//! buffers (tungstenite's defaults would cost 128 KiB per connection), owns the table of
//! live connections, and runs each connection: the socket IO in `conn` (read and write
//! loops), the per-connection state machine in [`protocol`] (decode, login, limits,
//! errors, close decisions), which is driven without a socket by tests and the fuzzer.

mod conn;
pub mod protocol;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::auth::TokenKeys;
use crate::config::{Flow, Limits};
use crate::flow::{CloseReason, Outbound};
use crate::obs::Metrics;
use crate::pipeline::Pipeline;

/// Every live connection of this node, by conn id (the one owner of that table).
#[derive(Default)]
pub struct Connections {
    map: Mutex<HashMap<u64, Arc<Outbound>>>,
}

impl Connections {
    /// Adds a connection.
    pub fn insert(&self, out: Arc<Outbound>) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(out.conn_id, out);
        }
    }

    /// Removes a connection.
    pub fn remove(&self, conn_id: u64) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&conn_id);
        }
    }

    /// A snapshot of all connections.
    pub fn snapshot(&self) -> Vec<Arc<Outbound>> {
        self.map
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of live connections.
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes one connection; false when it is not here.
    pub fn close(&self, conn_id: u64, reason: CloseReason) -> bool {
        let out = self.map.lock().ok().and_then(|m| m.get(&conn_id).cloned());
        match out {
            Some(o) => {
                o.close(reason);
                true
            }
            None => false,
        }
    }

    /// Closes every connection (shutdown).
    pub fn close_all(&self, reason: CloseReason) {
        for o in self.snapshot() {
            o.close(reason.clone());
        }
    }
}

/// Shared state of the client listener.
pub struct Gateway {
    /// Stages after decode.
    pub pipeline: Arc<Pipeline>,
    /// Token verification.
    pub keys: TokenKeys,
    /// Protocol limits.
    pub limits: Limits,
    /// Flow control settings.
    pub flow: Flow,
    /// This node's id (sent in LoginOk).
    pub node_id: String,
    /// Live connections.
    pub conns: Arc<Connections>,
    /// Metric handles.
    pub metrics: Metrics,
    /// Set while shutting down: new upgrades are refused.
    pub draining: Arc<AtomicBool>,
    next_id: AtomicU64,
}

impl Gateway {
    /// Builds the gateway state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pipeline: Arc<Pipeline>,
        keys: TokenKeys,
        limits: Limits,
        flow: Flow,
        node_id: String,
        conns: Arc<Connections>,
        metrics: Metrics,
        draining: Arc<AtomicBool>,
    ) -> Arc<Self> {
        Arc::new(Gateway {
            pipeline,
            keys,
            limits,
            flow,
            node_id,
            conns,
            metrics,
            draining,
            next_id: AtomicU64::new(1),
        })
    }

    /// The client listener's routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/ws", get(upgrade))
            .with_state(self.clone())
    }
}

async fn upgrade(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    ws: WebSocketUpgrade,
) -> Response {
    if gw.draining.load(Ordering::Relaxed) {
        return (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "node is draining; reconnect elsewhere",
        )
            .into_response();
    }
    let max = gw.limits.max_frame_bytes as usize;
    // tungstenite rejects beyond 4x the limit; between 1x and 4x we answer TOO_LARGE ourselves.
    ws.read_buffer_size(gw.flow.ws_read_buffer_bytes as usize)
        .write_buffer_size(gw.flow.ws_write_buffer_bytes as usize)
        .max_write_buffer_size((gw.flow.hard_mark_bytes as usize).max(max * 4 + 1))
        .max_message_size(max * 4)
        .max_frame_size(max * 4)
        .on_upgrade(move |socket| {
            let conn_id = gw.next_id.fetch_add(1, Ordering::Relaxed);
            conn::serve(gw, socket, conn_id, remote)
        })
}
