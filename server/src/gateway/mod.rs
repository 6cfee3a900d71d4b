//! Gateway: the client listener. Accepts WebSocket upgrades on `GET /ws` with bounded
//! buffers (tungstenite's defaults would cost 128 KiB per connection), owns the table of
//! live connections, and runs each connection: the socket IO in `conn` (read and write
//! loops), the per-connection state machine in [`protocol`] (decode, login, limits,
//! errors, close decisions), which is driven without a socket by tests and the fuzzer.
//! Sockets read through a per-thread buffer ([`pooled`]), so no connection holds read
//! room of its own beyond tungstenite's small buffer.

mod conn;
pub mod pooled;
pub mod protocol;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;

use crate::auth::TokenKeys;
use crate::config::{Flow, Limits};
use crate::flow::{CloseReason, Outbound};
use crate::obs::Metrics;
use crate::pipeline::Pipeline;

/// Every live connection of this node, by conn id (the one owner of that table), and
/// the admission counts behind the connection caps (total and per source address).
#[derive(Default)]
pub struct Connections {
    map: Mutex<HashMap<u64, Arc<Outbound>>>,
    /// The table's size after each change, for [`Connections::until_empty`].
    count: tokio::sync::watch::Sender<usize>,
    admitted: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, u32>>,
}

/// Why a new connection was refused before the upgrade (label `reason` of
/// `im_connections_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The node is shutting down.
    Draining,
    /// The node holds `limits.max_connections` already.
    NodeFull,
    /// The source address holds `limits.max_connections_per_ip` already.
    PerIp,
}

impl Refused {
    /// Every refusal, for metrics present from the start.
    pub const ALL: [Refused; 3] = [Refused::Draining, Refused::NodeFull, Refused::PerIp];

    /// The metric label.
    pub const fn label(self) -> &'static str {
        match self {
            Refused::Draining => "draining",
            Refused::NodeFull => "node_full",
            Refused::PerIp => "per_ip",
        }
    }

    /// What the client is told (HTTP 503 body).
    pub const fn message(self) -> &'static str {
        match self {
            Refused::Draining => "node is draining; reconnect elsewhere",
            Refused::NodeFull => "node is at its connection limit; retry later or elsewhere",
            Refused::PerIp => "too many connections from this address",
        }
    }
}

/// A slot under the connection caps, held from admission until the connection ends
/// (or the socket closes without an upgrade); dropping it frees the slot. A slot
/// counts against the node's total, the per-address cap, or both.
pub struct Admission {
    conns: Arc<Connections>,
    ip: Option<IpAddr>,
    total: bool,
}

/// A connection's slot under the caps, as a request extension: `listen` inserts it at
/// accept, the `/ws` handler takes it into the upgraded connection; otherwise it is
/// freed when the socket closes.
#[derive(Clone, Default)]
pub struct Slot(Arc<Mutex<Option<Admission>>>);

impl Slot {
    /// A slot holding `admission`.
    pub fn new(admission: Admission) -> Self {
        Slot(Arc::new(Mutex::new(Some(admission))))
    }

    /// Takes the slot (once per connection).
    pub fn take(&self) -> Option<Admission> {
        self.0.lock().ok().and_then(|mut a| a.take())
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.total {
            self.conns.admitted.fetch_sub(1, Ordering::Relaxed);
        }
        let Some(ip) = self.ip else {
            return;
        };
        if let Ok(mut m) = self.conns.per_ip.lock() {
            if let Some(n) = m.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        }
    }
}

impl Connections {
    /// Takes a slot for a new connection from `ip`, or says which cap refuses it
    /// (`max_total` and `max_per_ip` of 0 mean no cap; `ip` `None`: no per-address count).
    pub fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
        max_total: usize,
        max_per_ip: u32,
    ) -> Result<Admission, Refused> {
        let mut per_ip = self.per_ip.lock().map_err(|_| Refused::NodeFull)?;
        if max_total > 0 && self.admitted.load(Ordering::Relaxed) >= max_total {
            return Err(Refused::NodeFull);
        }
        if let Some(ip) = ip {
            let n = per_ip.entry(ip).or_insert(0);
            if max_per_ip > 0 && *n >= max_per_ip {
                return Err(Refused::PerIp);
            }
            *n += 1;
        }
        self.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(Admission {
            conns: self.clone(),
            ip,
            total: true,
        })
    }

    /// Takes a per-address slot only (the client behind a trusted proxy, whose socket
    /// already holds a slot of the node's total).
    pub fn admit_ip(self: &Arc<Self>, ip: IpAddr, max_per_ip: u32) -> Result<Admission, Refused> {
        let mut per_ip = self.per_ip.lock().map_err(|_| Refused::NodeFull)?;
        let n = per_ip.entry(ip).or_insert(0);
        if max_per_ip > 0 && *n >= max_per_ip {
            return Err(Refused::PerIp);
        }
        *n += 1;
        Ok(Admission {
            conns: self.clone(),
            ip: Some(ip),
            total: false,
        })
    }

    /// Connections holding a slot (admitted, including those still upgrading).
    pub fn admitted(&self) -> usize {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Adds a connection.
    pub fn insert(&self, out: Arc<Outbound>) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(out.conn_id, out);
            self.count.send_replace(m.len());
        }
    }

    /// Removes a connection.
    pub fn remove(&self, conn_id: u64) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&conn_id);
            self.count.send_replace(m.len());
        }
    }

    /// Resolves once no connection is left (at once when there is none).
    pub async fn until_empty(&self) {
        let mut count = self.count.subscribe();
        // The sender lives in `self`, so the wait ends only with an empty table.
        let _ = count.wait_for(|n| *n == 0).await;
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

    /// Closes every connection of `user`; returns how many.
    pub fn close_user(&self, user: &str, reason: CloseReason) -> usize {
        let mine: Vec<Arc<Outbound>> = self
            .snapshot()
            .into_iter()
            .filter(|o| o.user().as_deref() == Some(user))
            .collect();
        for o in &mine {
            o.close(reason.clone());
        }
        mine.len()
    }

    /// One connection, when it is here.
    pub fn get(&self, conn_id: u64) -> Option<Arc<Outbound>> {
        self.map.lock().ok().and_then(|m| m.get(&conn_id).cloned())
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
    /// Most connections at once (`limits.max_connections`, resolved; 0: no cap).
    pub max_connections: usize,
    /// The graceful-shutdown phase every connection watches ([`Drain`]).
    pub drain: tokio::sync::watch::Sender<Drain>,
    /// Peers whose `X-Forwarded-For` names the client (`limits.trusted_proxies`).
    pub trusted_proxies: Vec<IpAddr>,
    /// Read loops still taking frames (the drain waits for 0 before the last commit).
    reading: tokio::sync::watch::Sender<usize>,
    next_id: AtomicU64,
}

/// Counts a running read loop in [`Gateway::reading`] while alive.
pub(crate) struct Reading<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Graceful-shutdown phases, in order ([`Gateway::drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drain {
    /// Serving.
    Running,
    /// Read loops stop taking frames; connections stay open so that acks of what is
    /// already in the pipeline still reach their senders.
    StopReading,
    /// The last batch is committed: each connection flushes its queue and closes with
    /// 1001 "server shutting down".
    Close,
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
            flow,
            node_id,
            conns,
            metrics,
            max_connections: limits.max_connections_resolved(),
            trusted_proxies: limits
                .trusted_proxies
                .iter()
                .filter_map(|p| p.trim().parse().ok())
                .collect(),
            limits,
            draining,
            drain: tokio::sync::watch::channel(Drain::Running).0,
            reading: tokio::sync::watch::Sender::new(0),
            next_id: AtomicU64::new(1),
        })
    }

    /// Moves every connection to a later shutdown phase.
    pub fn set_drain(&self, phase: Drain) {
        self.drain.send_if_modified(|p| {
            let later = phase > *p;
            if later {
                *p = phase;
            }
            later
        });
    }

    /// Read loops still taking frames.
    pub fn reading(&self) -> usize {
        *self.reading.borrow()
    }

    /// Resolves once no read loop is taking frames (at once when none is).
    pub async fn readers_stopped(&self) {
        let mut reading = self.reading.subscribe();
        // The sender lives in `self`, so the wait ends only when the count is 0.
        let _ = reading.wait_for(|n| *n == 0).await;
    }

    /// A read loop starts; it is counted in [`Gateway::reading`] until the guard drops.
    pub(crate) fn start_reading(&self) -> Reading<'_> {
        self.reading.send_modify(|n| *n += 1);
        Reading(&self.reading)
    }

    /// The client listener's routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/ws", get(upgrade))
            .with_state(self.clone())
    }

    /// Admission at accept for a socket from `peer`: a slot of the node's total and of
    /// the peer's per-address cap (a trusted proxy's address has none: its clients are
    /// counted by the address it forwards), or why not.
    pub fn admit_peer(&self, peer: IpAddr) -> Result<Admission, Refused> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(Refused::Draining);
        }
        let trusted = self.trusted_proxies.contains(&peer);
        self.conns.admit(
            (!trusted).then_some(peer),
            self.max_connections,
            self.limits.max_connections_per_ip,
        )
    }

    /// The client's address: the socket peer, or, when the peer is a trusted proxy, the
    /// last address of `X-Forwarded-For` that is not itself a trusted proxy.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        if !self.trusted_proxies.contains(&peer) {
            return None;
        }
        let mut hops: Vec<IpAddr> = Vec::new();
        for v in headers.get_all("x-forwarded-for") {
            let Ok(v) = v.to_str() else {
                return None;
            };
            for hop in v.split(',') {
                hops.push(hop.trim().parse().ok()?);
            }
        }
        hops.into_iter()
            .rev()
            .find(|ip| !self.trusted_proxies.contains(ip))
    }
}

fn refusal(gw: &Gateway, r: Refused) -> Response {
    gw.metrics.connection_refused(r.label());
    // Clean and cheap: no upgrade, a reason, and when to come back.
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::RETRY_AFTER, "1")],
        r.message(),
    )
        .into_response()
}

async fn upgrade(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    slot: Option<Extension<Slot>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if gw.draining.load(Ordering::Relaxed) {
        return refusal(&gw, Refused::Draining);
    }
    // The socket's slot, taken at accept (a router served without the accept loop,
    // e.g. in a test, admits here).
    let taken = slot.and_then(|Extension(s)| s.take());
    let admission = match taken {
        Some(a) => a,
        None => match gw.admit_peer(peer.ip()) {
            Ok(a) => a,
            Err(r) => return refusal(&gw, r),
        },
    };
    // Behind a trusted proxy the per-address cap counts the forwarded client.
    let (remote, client_slot) = match gw.client_ip(peer.ip(), &headers) {
        Some(ip) => match gw.conns.admit_ip(ip, gw.limits.max_connections_per_ip) {
            Ok(a) => (SocketAddr::new(ip, peer.port()), Some(a)),
            Err(r) => return refusal(&gw, r),
        },
        None => (peer, None),
    };
    let max = gw.limits.max_frame_bytes as usize;
    // tungstenite rejects beyond 4x the limit; between 1x and 4x we answer TOO_LARGE ourselves.
    ws.read_buffer_size(gw.flow.ws_read_buffer_bytes as usize)
        .write_buffer_size(gw.flow.ws_write_buffer_bytes as usize)
        .max_write_buffer_size((gw.flow.hard_mark_bytes as usize).max(max * 4 + 1))
        .max_message_size(max * 4)
        .max_frame_size(max * 4)
        .on_upgrade(move |socket| {
            let conn_id = gw.next_id.fetch_add(1, Ordering::Relaxed);
            conn::start(gw, socket, conn_id, remote, (admission, client_slot));
            std::future::ready(())
        })
}
