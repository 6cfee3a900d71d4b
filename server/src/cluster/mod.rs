//! Cluster: what ties this node to the others when `nats_url` is set (DESIGN.md section
//! 10). Postgres (the shared store) holds messages, cursors and groups; NATS holds the
//! rest, on existing engines only (no home-made consensus or gossip):
//! - the node registry, KV bucket `<prefix>-nodes` (max age = `cluster.ttl_secs`): every
//!   node puts its load report each `cluster.report_interval_ms`; a node silent past the
//!   TTL is out of rotation (`registry`);
//! - presence, KV bucket `<prefix>-presence`: a key per user and node while the user is
//!   connected there; every node watches it into a local map (`presence`);
//! - delivery, subject `<prefix>.node.<id>`: after commit, the router publishes one
//!   envelope per other node that has recipients online (`relay`); this node's
//!   subscription pushes what arrives to its own sessions.
//!
//! The router calls [`Link`] (presence up/down, the forward plan, publishing); the tasks
//! here call the router (local delivery) and the membership cache (eviction on a group
//! change made elsewhere). Cross-node pushes of one conversation from several origin
//! nodes may arrive out of seq order; the SDK holds a message above a gap until its sync
//! fills it, so the application still sees seq order.

pub mod presence;
pub mod registry;
pub mod relay;
pub mod trust;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::pipeline::relation::Relations;
use crate::pipeline::route::Router;
use presence::PresenceMap;
use registry::{LoadReport, Registry};
use relay::Envelope;
use trust::ClusterKey;

/// Errors setting up cluster mode; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// NATS did not answer.
    #[error("connecting to NATS at nats_url = {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// The client's message.
        message: String,
    },
    /// A JetStream KV bucket could not be created or opened.
    #[error(
        "NATS JetStream KV bucket {bucket}: {message} (is JetStream enabled, `nats-server -js`?)"
    )]
    Bucket {
        /// The bucket.
        bucket: String,
        /// The client's message.
        message: String,
    },
    /// Subscribing to this node's subject failed.
    #[error("subscribing to {subject}: {message}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's message.
        message: String,
    },
}

/// What the router uses of the cluster: presence changes out, forward plans, publishing.
pub struct Link {
    node_id: String,
    subject_prefix: String,
    client: async_nats::Client,
    /// Every node's last load report.
    pub registry: Arc<Registry>,
    /// Users on other nodes.
    pub presence: Arc<PresenceMap>,
    presence_tx: mpsc::UnboundedSender<(String, bool)>,
    forwarded: metrics::Counter,
    publish_errors: metrics::Counter,
    key: ClusterKey,
}

/// One message's cross-node part: the users to push to, per other node.
pub struct Forward {
    /// Node -> its recipients.
    pub targets: Vec<(Arc<str>, Vec<String>)>,
    /// The encoded Deliver frame (empty: a sync hint).
    pub frame: Bytes,
    /// One-to-one (critical) or group.
    pub direct: bool,
}

impl Link {
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// `user` now has a connection here (first one).
    pub fn user_up(&self, user: &str) {
        let _ = self.presence_tx.send((user.to_string(), true));
    }

    /// `user` has no connection here any more.
    pub fn user_down(&self, user: &str) {
        let _ = self.presence_tx.send((user.to_string(), false));
    }

    /// The cross-node part of a delivery to `users`: `None` when no other live node has
    /// any of them online.
    pub fn plan<'a>(
        &self,
        users: impl Iterator<Item = &'a str>,
        frame: &Bytes,
        direct: bool,
    ) -> Option<Forward> {
        let by = self
            .presence
            .by_node(users, |n| n != self.node_id && self.registry.alive(n));
        if by.is_empty() {
            return None;
        }
        Some(Forward {
            targets: by.into_iter().collect(),
            frame: frame.clone(),
            direct,
        })
    }

    fn subject(&self, node: &str) -> String {
        format!("{}{node}", self.subject_prefix)
    }

    /// Publishes a forward plan: one envelope per node.
    pub async fn forward(&self, f: Forward) {
        for (node, users) in f.targets {
            let env = Envelope {
                from: self.node_id.clone(),
                users,
                frame: f.frame.clone(),
                direct: f.direct,
                ..Default::default()
            };
            self.publish(&node, env).await;
        }
    }

    async fn publish(&self, node: &str, mut env: Envelope) {
        self.key.seal_envelope(&mut env);
        let bytes = Bytes::from(env.encode_to_vec());
        match self.client.publish(self.subject(node), bytes).await {
            Ok(()) => self.forwarded.increment(1),
            Err(e) => {
                self.publish_errors.increment(1);
                tracing::warn!(node, error = %e, "cluster publish failed");
            }
        }
    }

    /// Tells every other live node that a group's membership changed.
    pub async fn group_changed(&self, group_id: &str) {
        for node in self.registry.live_nodes() {
            if node != self.node_id {
                let env = Envelope {
                    from: self.node_id.clone(),
                    group_changed: group_id.to_string(),
                    ..Default::default()
                };
                self.publish(&node, env).await;
            }
        }
    }

    /// Whether the NATS connection is up.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}

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
}

/// `GET /v1/route[?avoid=ID,ID]`: the least-loaded healthy node for a new connection.
pub fn route_api(state: RouteApi) -> axum::Router {
    axum::Router::new()
        .route("/v1/route", axum::routing::get(route_handler))
        .with_state(state)
}

#[derive(serde::Deserialize)]
struct RouteQuery {
    #[serde(default)]
    avoid: String,
}

async fn route_handler(
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
        Some((node_id, ws_url)) => axum::Json(serde_json::json!({
            "node_id": node_id,
            "ws_url": ws_url,
        }))
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

/// Cluster mode of one node: the NATS connection, the buckets and the background tasks.
pub struct Cluster {
    /// What the router uses.
    pub link: Arc<Link>,
    nodes_kv: kv::Store,
    presence_kv: kv::Store,
    presence_rx: Mutex<Option<mpsc::UnboundedReceiver<(String, bool)>>>,
    report_interval: Duration,
}

/// Builds this node's load report on each tick.
pub type ReportFn = Arc<dyn Fn() -> LoadReport + Send + Sync>;

impl Cluster {
    /// Connects to NATS and opens (or creates) the registry and presence buckets.
    pub async fn connect(config: &Config, node_id: &str) -> Result<Cluster, ClusterError> {
        let url = config.nats_url.trim().to_string();
        let c = &config.cluster;
        let options = trust::connect_options(c, format!("im-server {node_id}"))
            .await
            .map_err(|e| ClusterError::Connect {
                url: crate::config::redact_url(&url),
                message: e.to_string(),
            })?;
        let client = options
            .connection_timeout(Duration::from_secs(5))
            .connect(url.as_str())
            .await
            .map_err(|e| ClusterError::Connect {
                url: crate::config::redact_url(&url),
                message: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        let ttl = Duration::from_secs(c.ttl_secs as u64);
        let nodes_kv = open_bucket(&js, format!("{}-nodes", c.prefix), ttl).await?;
        let presence_kv =
            open_bucket(&js, format!("{}-presence", c.prefix), Duration::ZERO).await?;
        let (presence_tx, presence_rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            node_id: node_id.to_string(),
            subject_prefix: format!("{}.node.", c.prefix),
            client,
            registry: Arc::new(Registry::new(ttl, c.cpu_weight)),
            presence: Arc::new(PresenceMap::default()),
            presence_tx,
            forwarded: metrics::counter!("im_cluster_forwarded_total"),
            publish_errors: metrics::counter!("im_cluster_publish_errors_total"),
            key: ClusterKey::new(&c.key),
        });
        link.forwarded.absolute(0);
        link.publish_errors.absolute(0);
        Ok(Cluster {
            link,
            nodes_kv,
            presence_kv,
            presence_rx: Mutex::new(presence_rx.into()),
            report_interval: Duration::from_millis(c.report_interval_ms as u64),
        })
    }

    /// Clears this node's stale presence keys (a previous run that was killed), subscribes
    /// to its subject and spawns the watchers, the reporter and the publishers.
    pub async fn start(
        &self,
        router: Arc<Router>,
        relations: Arc<Relations>,
        group_changes: mpsc::UnboundedReceiver<String>,
        report: ReportFn,
    ) -> Result<Vec<JoinHandle<()>>, ClusterError> {
        let link = self.link.clone();
        let removed = purge_node_keys(&self.presence_kv, &link.node_id).await;
        if removed > 0 {
            tracing::info!(
                removed,
                "cleared this node's presence keys from an earlier run"
            );
        }
        let subject = link.subject(&link.node_id);
        let sub =
            link.client
                .subscribe(subject.clone())
                .await
                .map_err(|e| ClusterError::Subscribe {
                    subject: subject.clone(),
                    message: e.to_string(),
                })?;
        // First report before anything else, so the node is routable at once.
        put_report(&self.nodes_kv, &link, &report()).await;
        let mut tasks = vec![
            tokio::spawn(inbound(sub, router, relations.clone(), link.key.clone())),
            tokio::spawn(watch_registry(
                self.nodes_kv.clone(),
                link.registry.clone(),
                link.key.clone(),
            )),
            tokio::spawn(watch_presence(
                self.presence_kv.clone(),
                link.presence.clone(),
                link.node_id.clone(),
            )),
            tokio::spawn(report_loop(
                self.nodes_kv.clone(),
                link.clone(),
                report,
                self.report_interval,
            )),
            tokio::spawn(group_notices(link.clone(), group_changes)),
        ];
        if let Some(rx) = self.presence_rx.lock().ok().and_then(|mut r| r.take()) {
            tasks.push(tokio::spawn(write_presence(
                self.presence_kv.clone(),
                link.node_id.clone(),
                rx,
            )));
        }
        Ok(tasks)
    }

    /// Publishes a report now (e.g. draining at the start of a shutdown).
    pub async fn report_now(&self, report: &LoadReport) {
        put_report(&self.nodes_kv, &self.link, report).await;
    }

    /// Leaves the cluster cleanly: drops this node's registry entry and presence keys.
    pub async fn leave(&self) {
        if let Err(e) = self.nodes_kv.delete(&self.link.node_id).await {
            tracing::warn!(error = %e, "could not remove this node from the registry");
        }
        purge_node_keys(&self.presence_kv, &self.link.node_id).await;
        let _ = self.link.client.flush().await;
    }
}

async fn open_bucket(
    js: &jetstream::Context,
    bucket: String,
    max_age: Duration,
) -> Result<kv::Store, ClusterError> {
    use jetstream::stream;
    let err = |message: String| ClusterError::Bucket {
        bucket: bucket.clone(),
        message,
    };
    // The KV stream layout, made by hand: the client's `create_key_value` first reads
    // account info fields that NATS servers before 2.10 do not send.
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: stream::StorageType::Memory,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .map_err(|e| err(e.to_string()))?;
    js.get_key_value(bucket.clone())
        .await
        .map_err(|e| err(e.to_string()))
}

/// Deletes every presence key of `node`; returns how many.
async fn purge_node_keys(kv: &kv::Store, node: &str) -> usize {
    let prefix = presence::node_prefix(node);
    let Ok(mut keys) = kv.keys().await else {
        return 0;
    };
    let mut mine = Vec::new();
    while let Some(Ok(k)) = keys.next().await {
        if k.starts_with(&prefix) {
            mine.push(k);
        }
    }
    for k in &mine {
        let _ = kv.delete(k).await;
    }
    mine.len()
}

async fn put_report(kv: &kv::Store, link: &Link, report: &LoadReport) {
    match link.key.seal_report(report) {
        Ok(value) => {
            if let Err(e) = kv.put(&link.node_id, value.into()).await {
                tracing::warn!(error = %e, "could not publish the load report");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not encode the load report"),
    }
}

async fn report_loop(kv: kv::Store, link: Arc<Link>, report: ReportFn, every: Duration) {
    let healthy = metrics::gauge!("im_cluster_nodes_healthy");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        put_report(&kv, &link, &report()).await;
        healthy.set(link.registry.live_nodes().len() as f64);
    }
}

/// Age of a KV entry from its server-side creation time.
fn entry_age(e: &kv::Entry) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let age = now - e.created.unix_timestamp_nanos();
    Duration::from_nanos(age.clamp(0, u64::MAX as i128) as u64)
}

/// Follows the registry bucket into `registry` (restarting the watch if it fails).
async fn watch_registry(kv: kv::Store, registry: Arc<Registry>, key: ClusterKey) {
    loop {
        match kv.watch_with_history(">").await {
            Ok(mut w) => {
                while let Some(item) = w.next().await {
                    let Ok(e) = item else { break };
                    match e.operation {
                        kv::Operation::Put => match key.open_report(&e.value) {
                            Some(r) if r.node_id == e.key => {
                                let instance = r.instance.clone();
                                if !registry.observe(r, entry_age(&e)) {
                                    tracing::warn!(node = %e.key, %instance, "ignoring a load report that conflicts with the live node's identity");
                                }
                            }
                            _ => {
                                tracing::debug!(key = %e.key, "ignoring a malformed, unsigned or badly signed load report")
                            }
                        },
                        kv::Operation::Delete | kv::Operation::Purge => registry.remove(&e.key),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "registry watch failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Follows the presence bucket into `map`, skipping this node's own keys.
async fn watch_presence(kv: kv::Store, map: Arc<PresenceMap>, me: String) {
    loop {
        match kv.watch_with_history(">").await {
            Ok(mut w) => {
                map.clear();
                while let Some(item) = w.next().await {
                    let Ok(e) = item else { break };
                    let Some((node, user)) = presence::parse_key(&e.key) else {
                        continue;
                    };
                    if node == me {
                        continue;
                    }
                    match e.operation {
                        kv::Operation::Put => map.put(&node, &user),
                        kv::Operation::Delete | kv::Operation::Purge => map.delete(&node, &user),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "presence watch failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Presence writes of one batch in flight at once.
const PRESENCE_WRITES_IN_FLIGHT: usize = 256;

/// Writes this node's presence changes, coalesced: of several changes of one user queued
/// together, only the last is written; a batch's writes are in flight together.
async fn write_presence(
    kv: kv::Store,
    me: String,
    mut rx: mpsc::UnboundedReceiver<(String, bool)>,
) {
    let errors = metrics::counter!("im_cluster_presence_errors_total");
    errors.absolute(0);
    let mut pending: HashMap<String, bool> = HashMap::new();
    while let Some((user, up)) = rx.recv().await {
        pending.insert(user, up);
        while let Ok((user, up)) = rx.try_recv() {
            pending.insert(user, up);
            if pending.len() >= 4096 {
                break;
            }
        }
        // Each user is in the batch once, so its writes can be in flight together (one
        // JetStream round trip per batch, not per user: a login burst would otherwise
        // leave the other nodes' presence maps seconds behind); the next batch waits.
        futures_util::stream::iter(pending.drain())
            .for_each_concurrent(PRESENCE_WRITES_IN_FLIGHT, |(user, up)| {
                let (kv, errors) = (&kv, &errors);
                let key = presence::key(&me, &user);
                async move {
                    let r = if up {
                        kv.put(&key, Bytes::new())
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    } else {
                        kv.delete(&key).await.map_err(|e| e.to_string())
                    };
                    if let Err(e) = r {
                        errors.increment(1);
                        tracing::warn!(user, error = %e, "presence update failed");
                    }
                }
            })
            .await;
    }
}

/// Publishes group-change notices made on this node to the others.
async fn group_notices(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<String>) {
    while let Some(group) = rx.recv().await {
        link.group_changed(&group).await;
    }
}

/// This node's subject: envelopes from the others, pushed to local sessions in arrival
/// order.
async fn inbound(
    mut sub: async_nats::Subscriber,
    router: Arc<Router>,
    relations: Arc<Relations>,
    key: ClusterKey,
) {
    let received = metrics::counter!("im_cluster_received_total");
    let bad = metrics::counter!("im_cluster_bad_envelopes_total");
    received.absolute(0);
    bad.absolute(0);
    while let Some(msg) = sub.next().await {
        let env = match Envelope::decode(msg.payload) {
            Ok(e) => e,
            Err(e) => {
                bad.increment(1);
                tracing::warn!(error = %e, "undecodable cluster envelope");
                continue;
            }
        };
        if !key.check_envelope(&env) {
            bad.increment(1);
            tracing::debug!(from = %env.from, "ignoring an unsigned or badly signed envelope");
            continue;
        }
        received.increment(1);
        if !env.group_changed.is_empty() {
            relations.evict(&env.group_changed);
            continue;
        }
        router.deliver_remote(&env.users, &env.frame, env.direct);
    }
}
