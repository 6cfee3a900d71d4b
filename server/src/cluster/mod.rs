//! Cluster: what ties this node to the others when `nats_url` is set. Postgres (the
//! shared store) holds messages, cursors and groups; NATS holds the rest, on existing
//! engines only (no home-made consensus or gossip):
//! - the node registry, KV bucket `<prefix>-nodes` (max age = `cluster.ttl_secs`): every
//!   node puts its load report each `cluster.report_interval_ms`; a node whose report is
//!   older than 2.5 intervals is *lost* (out of `/v1/route`, logged at WARN and counted)
//!   until it reports again, and one silent past the TTL gets no pushes (`registry`);
//! - presence, KV bucket `<prefix>-presence`: a key per user and node while the user is
//!   connected there; every node watches it into a local map (`presence`);
//! - delivery, subject `<prefix>.node.<id>`: after commit, the router publishes one
//!   envelope per other node that has recipients online (`relay`); this node's
//!   subscription pushes what arrives to its own sessions. Subject `<prefix>.all`
//!   carries resync notices to every node;
//! - admin queries, subject `<prefix>.query.<id>`: request/reply between nodes for the
//!   cluster-wide admin answers (`query`).
//! - traces, subject `<prefix>.trace.<id>`: each node answers requests for its part of a
//!   message's trace (`trace`), which the node serving the admin request gathers.
//!
//! Both buckets are memory-backed JetStream streams on purpose: they hold only soft
//! state that the nodes themselves rebuild within a report interval (each report is
//! re-put every interval, each node knows its own online users), so disk writes on the
//! NATS server per login and logout buy nothing, and a file-backed copy would bring back
//! the presence of nodes that died while NATS was down. What makes that safe is the
//! healing here: when NATS comes back (the client reconnects on its own; its connection
//! events drive this) or a KV operation finds its stream missing, the supervisor task
//! recreates the buckets, restarts the watches (their consumers went with the old
//! streams, and a new stream numbers its entries from 1 again), republishes this node's
//! report and every online user's presence, and then sends a resync notice: every node
//! gives each of its sessions a sync hint and drops its group cache, since pushes and
//! group notices published while the link was down are lost (core NATS keeps nothing
//! for later). A publish that fails (or is skipped while NATS is down) leads to the
//! same notice once the link works, and a node that comes back after being lost gets
//! one of its own (its users may have had no pushes while it was out). While the link is down or being rebuilt,
//! [`Cluster::degraded`] names why, and `/readyz` answers 503.
//!
//! The router calls [`Link`] through its own `pipeline::route::Peers` trait (presence
//! up/down, the forward plan, publishing), so it knows nothing of this module; the tasks
//! here call the router (local delivery, sync hints, presence republishing) and the
//! membership cache (eviction on a group change made elsewhere). Cross-node pushes of
//! one conversation from several origin nodes may arrive out of seq order; the SDK
//! holds a message above a gap until its sync fills it, so the application still sees
//! seq order.

pub mod presence;
pub mod query;
pub mod registry;
pub mod relay;
pub mod trace;
pub mod trust;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::obs::runtime::{spawn, Task};
use crate::pipeline::route::{Forward, Peers, Router};
use crate::store::membership::Relations;
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

/// A node is lost when its last report is this many report intervals old.
const STALE_REPORTS: f64 = 2.5;
/// Longest wait for one publish to be handed to NATS before it counts as failed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// Least time between two resyncs (and between watch restarts).
const RETRY: Duration = Duration::from_secs(1);
/// Longest reconnect backoff to NATS (the client's own default is 4 s).
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The KV side of the link, as [`Health::kv`] holds it.
const KV_OK: u8 = 0;
const KV_RESYNCING: u8 = 1;
const KV_MISSING: u8 = 2;
const KV_ERROR: u8 = 3;

/// A change of this node's presence, or a retry of the writes that failed.
enum PresenceOp {
    /// `user` has this many connections here (0: none any more).
    Set(String, u32),
    /// Write again what failed (after a resync).
    Retry,
}

/// Health of the link, shared by the connection's event callback and the tasks.
struct Health {
    /// `KV_*`: whether the buckets answer.
    kv: AtomicU8,
    /// NATS dropped the connection and it has not come back yet.
    was_down: AtomicBool,
    /// A publish was skipped or failed: the others get a resync notice.
    missed: AtomicBool,
    /// Publishes are failing (logged once per run of failures).
    publish_failing: AtomicBool,
    /// Something needs a resync (reconnect, a missing bucket, a failed watch).
    kick: Notify,
    link_up: metrics::Gauge,
    reconnects: metrics::Counter,
}

impl Health {
    fn new() -> Self {
        let h = Health {
            kv: AtomicU8::new(KV_OK),
            was_down: AtomicBool::new(false),
            missed: AtomicBool::new(false),
            publish_failing: AtomicBool::new(false),
            kick: Notify::new(),
            link_up: metrics::gauge!("im_cluster_link_up"),
            reconnects: metrics::counter!("im_cluster_reconnects_total"),
        };
        h.link_up.set(1.0);
        h.reconnects.absolute(0);
        h
    }

    /// The NATS client's connection events.
    fn on_event(&self, event: async_nats::Event) {
        match event {
            async_nats::Event::Disconnected => {
                self.was_down.store(true, Relaxed);
                self.link_up.set(0.0);
                tracing::warn!(
                    "NATS connection lost: cross-node pushes pause; sends are still acked and their receivers sync once the link is back"
                );
            }
            async_nats::Event::Connected => {
                if self.was_down.swap(false, Relaxed) {
                    self.reconnects.increment(1);
                    self.kv.store(KV_RESYNCING, Relaxed);
                    tracing::warn!("NATS connection back: resyncing the cluster state");
                    self.kick.notify_one();
                }
            }
            async_nats::Event::ServerError(e) => tracing::warn!(error = %e, "NATS server error"),
            other => tracing::debug!(event = %other, "NATS connection event"),
        }
    }

    /// A KV operation failed (`error`): the buckets need a resync.
    fn kv_failed(&self, error: &str) {
        let missing = {
            let e = error.to_ascii_lowercase();
            e.contains("not found") || e.contains("no responders")
        };
        self.kv
            .store(if missing { KV_MISSING } else { KV_ERROR }, Relaxed);
        self.kick.notify_one();
    }
}

/// What the router uses of the cluster: presence changes out, forward plans, publishing.
pub struct Link {
    node_id: String,
    subject_prefix: String,
    all_subject: String,
    client: async_nats::Client,
    /// Every node's last load report.
    pub registry: Arc<Registry>,
    /// Users on other nodes.
    pub presence: Arc<PresenceMap>,
    presence_tx: mpsc::UnboundedSender<PresenceOp>,
    forwarded: metrics::Counter,
    publish_errors: metrics::Counter,
    /// `cluster.drop_group_notices` (fault injection for tests).
    drop_group_notices: bool,
    health: Arc<Health>,
    key: ClusterKey,
    /// Nodes that presence names for a recipient but that looked dead when a delivery
    /// was planned, so the delivery was not forwarded to them: each gets a resync notice
    /// as soon as it reports again (a node that was frozen, or whose reports this node
    /// saw late), whatever the lost/back sweep made of the gap. Bounded by
    /// [`MAX_OWED_RESYNCS`].
    owed: Mutex<HashSet<Arc<str>>>,
    /// The cluster prefix, for the trace subjects (`trace::subject`).
    trace_prefix: String,
    /// `cluster.trace_timeout_ms`: how long a trace request waits for the other nodes.
    pub trace_timeout: Duration,
}

/// Most nodes remembered as owed a resync (presence names only nodes that wrote to the
/// cluster's buckets; past this, the oldest knowledge is dropped, not the node's users'
/// messages, which stay stored and come with their next sync).
const MAX_OWED_RESYNCS: usize = 1024;

impl Link {
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// `user` now has a connection here (first one).
    pub fn user_up(&self, user: &str) {
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), 1));
    }

    /// `user` has no connection here any more.
    pub fn user_down(&self, user: &str) {
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), 0));
    }

    /// The cross-node part of a delivery to `users`: `None` when no other live node has
    /// any of them online.
    pub fn plan<'a>(
        &self,
        users: impl Iterator<Item = &'a str>,
        frame: &Bytes,
        direct: bool,
    ) -> Option<Forward> {
        let by = self.presence.by_node(users, |n| {
            if n == self.node_id {
                return false;
            }
            let alive = self.registry.alive(n);
            if !alive {
                self.owe_resync(n);
            }
            alive
        });
        if by.is_empty() {
            return None;
        }
        Some(Forward {
            targets: by.into_iter().collect(),
            frame: frame.clone(),
            direct,
            trace: None,
        })
    }

    /// Remembers that `node` missed a forward and needs a resync notice once it is alive.
    fn owe_resync(&self, node: &str) {
        if let Ok(mut owed) = self.owed.lock() {
            if owed.len() >= MAX_OWED_RESYNCS {
                owed.clear();
            }
            if !owed.contains(node) {
                owed.insert(Arc::from(node));
            }
        }
    }

    /// The owed nodes that are alive again, taken out of the set.
    fn take_owed_alive(&self) -> Vec<Arc<str>> {
        let Ok(mut owed) = self.owed.lock() else {
            return Vec::new();
        };
        let back: Vec<Arc<str>> = owed
            .iter()
            .filter(|n| self.registry.alive(n))
            .cloned()
            .collect();
        for n in &back {
            owed.remove(n);
        }
        back
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
                trace: f.trace.as_ref().map(relay::TraceCtx::from),
                ..Default::default()
            };
            self.publish(self.subject(&node), env, true).await;
        }
    }

    /// Publishes `env` on `subject` (counted as forwarded when `count`). Skipped while
    /// NATS is disconnected: the client would queue it behind the reconnect and stall
    /// the router. A skipped or failed publish leads to a resync notice once the link
    /// works, so its receivers sync what it carried.
    async fn publish(&self, subject: String, mut env: Envelope, count: bool) -> bool {
        let error = if self.connected() {
            self.key.seal_envelope(&mut env);
            let bytes = Bytes::from(env.encode_to_vec());
            match tokio::time::timeout(PUBLISH_TIMEOUT, self.client.publish(subject, bytes)).await {
                Ok(Ok(())) => {
                    if count {
                        self.forwarded.increment(1);
                    }
                    if self.health.publish_failing.swap(false, Relaxed) {
                        tracing::info!("cluster publishes work again");
                    }
                    return true;
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("timed out".to_owned()),
            }
        } else {
            None
        };
        self.publish_errors.increment(1);
        self.health.missed.store(true, Relaxed);
        if let Some(error) = error {
            if !self.health.publish_failing.swap(true, Relaxed) {
                tracing::warn!(
                    error,
                    "cluster publish failed; the other nodes get a resync notice once it works"
                );
            }
        }
        false
    }

    /// `user` has `devices` connections here (0: none).
    pub fn user_devices(&self, user: &str, devices: usize) {
        let n = u32::try_from(devices).unwrap_or(u32::MAX);
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), n));
    }

    /// `user`'s connections on the other live nodes.
    pub fn remote_devices(&self, user: &str) -> u32 {
        self.presence
            .devices(user, |n| n != self.node_id && self.registry.alive(n))
    }

    /// Publishes an ephemeral plan (typing): one envelope per node, marked so the
    /// receiver skips slow connections. A failed publish is counted, not resynced.
    pub async fn forward_ephemeral(&self, f: Forward) {
        if !self.connected() {
            self.publish_errors.increment(1);
            return;
        }
        for (node, users) in f.targets {
            let mut env = Envelope {
                from: self.node_id.clone(),
                users,
                frame: f.frame.clone(),
                ephemeral: true,
                ..Default::default()
            };
            self.key.seal_envelope(&mut env);
            let bytes = Bytes::from(env.encode_to_vec());
            let sent = tokio::time::timeout(
                PUBLISH_TIMEOUT,
                self.client.publish(self.subject(&node), bytes),
            )
            .await;
            match sent {
                Ok(Ok(())) => self.forwarded.increment(1),
                _ => self.publish_errors.increment(1),
            }
        }
    }

    /// Tells every other live node that `user` now hides (or shows) their presence.
    pub async fn presence_hidden(&self, user: &str, hidden: bool) {
        self.broadcast(Envelope {
            from: self.node_id.clone(),
            presence_user: user.to_owned(),
            presence_hidden: hidden,
            ..Default::default()
        })
        .await;
    }

    /// Tells every other live node that a group's membership changed (at `version`).
    pub async fn group_changed(&self, group_id: &str, version: u64) {
        self.broadcast(Envelope {
            from: self.node_id.clone(),
            group_changed: group_id.to_owned(),
            group_version: version,
            ..Default::default()
        })
        .await;
    }

    /// Tells every other live node that a user's tokens up to `at` are revoked.
    pub async fn revoked(&self, user: &str, at: i64) {
        self.broadcast(Envelope {
            from: self.node_id.clone(),
            revoked_user: user.to_owned(),
            revoked_at: at,
            ..Default::default()
        })
        .await;
    }

    async fn broadcast(&self, env: Envelope) {
        for node in self.registry.live_nodes() {
            if node != self.node_id {
                self.publish(self.subject(&node), env.clone(), true).await;
            }
        }
    }

    /// Asks `node` (or every node, `None`) to give all its sessions a sync hint.
    async fn send_resync(&self, node: Option<&str>) -> bool {
        let env = Envelope {
            from: self.node_id.clone(),
            resync: true,
            ..Default::default()
        };
        let subject = node.map_or_else(|| self.all_subject.clone(), |n| self.subject(n));
        self.publish(subject, env, false).await
    }

    /// Whether the NATS connection is up.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Why the cluster link is not fully working, in one word: `nats_down` (not
    /// connected), `resyncing` (reconnected, state being rebuilt), `kv_missing` (a bucket
    /// is gone), `kv_error` (a bucket fails otherwise); `None` when it works.
    pub fn degraded(&self) -> Option<&'static str> {
        if !self.connected() {
            return Some("nats_down");
        }
        match self.health.kv.load(Relaxed) {
            KV_OK => None,
            KV_RESYNCING => Some("resyncing"),
            KV_MISSING => Some("kv_missing"),
            _ => Some("kv_error"),
        }
    }
}

/// The router's view of the other nodes is this link.
impl Peers for Link {
    fn user_up(&self, user: &str) {
        Link::user_up(self, user);
    }

    fn user_down(&self, user: &str) {
        Link::user_down(self, user);
    }

    fn plan(
        &self,
        users: &mut dyn Iterator<Item = &str>,
        frame: &Bytes,
        direct: bool,
    ) -> Option<Forward> {
        Link::plan(self, users, frame, direct)
    }

    fn forward(&self, f: Forward) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(Link::forward(self, f))
    }

    fn user_devices(&self, user: &str, devices: usize) {
        Link::user_devices(self, user, devices);
    }

    fn remote_devices(&self, user: &str) -> u32 {
        Link::remote_devices(self, user)
    }

    fn forward_ephemeral(&self, f: Forward) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(Link::forward_ephemeral(self, f))
    }

    fn presence_hidden(&self, user: &str, hidden: bool) -> futures_util::future::BoxFuture<'_, ()> {
        let user = user.to_owned();
        Box::pin(async move { Link::presence_hidden(self, &user, hidden).await })
    }
}

/// Cluster mode of one node: the NATS connection, the buckets and the background tasks.
pub struct Cluster {
    /// What the router uses.
    pub link: Arc<Link>,
    js: jetstream::Context,
    buckets: Arc<Buckets>,
    presence_rx: Mutex<Option<mpsc::UnboundedReceiver<PresenceOp>>>,
    report_interval: Duration,
}

/// Builds this node's load report on each tick.
pub type ReportFn = Arc<dyn Fn() -> LoadReport + Send + Sync>;

/// Applies a revocation notice from another node: (user, revoked_at).
pub type RevokedFn = Arc<dyn Fn(&str, i64) + Send + Sync>;

impl Cluster {
    /// Connects to NATS and opens (or creates) the registry and presence buckets.
    pub async fn connect(config: &Config, node_id: &str) -> Result<Cluster, ClusterError> {
        let url = config.nats_url.trim().to_owned();
        let c = &config.cluster;
        let health = Arc::new(Health::new());
        let events = health.clone();
        let options = trust::connect_options(c, format!("im-server {node_id}"))
            .await
            .map_err(|e| ClusterError::Connect {
                url: crate::config::redact_url(&url),
                message: e.to_string(),
            })?;
        let client = options
            .connection_timeout(Duration::from_secs(5))
            .reconnect_delay_callback(reconnect_delay)
            .event_callback(move |event| {
                let health = events.clone();
                async move { health.on_event(event) }
            })
            .connect(url.as_str())
            .await
            .map_err(|e| ClusterError::Connect {
                url: crate::config::redact_url(&url),
                message: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        let ttl = Duration::from_secs(c.ttl_secs as u64);
        let buckets = Arc::new(Buckets::open(&js, &c.prefix, ttl).await?);
        let (presence_tx, presence_rx) = mpsc::unbounded_channel();
        let report_interval = Duration::from_millis(c.report_interval_ms as u64);
        let link = Arc::new(Link {
            node_id: node_id.to_owned(),
            subject_prefix: format!("{}.node.", c.prefix),
            all_subject: format!("{}.all", c.prefix),
            client,
            registry: Arc::new(Registry::new(
                ttl,
                report_interval.mul_f64(STALE_REPORTS),
                c.cpu_weight,
            )),
            presence: Arc::new(PresenceMap::default()),
            presence_tx,
            forwarded: metrics::counter!("im_cluster_forwarded_total"),
            publish_errors: metrics::counter!("im_cluster_publish_errors_total"),
            drop_group_notices: c.drop_group_notices,
            health,
            key: ClusterKey::new(&c.key),
            owed: Mutex::new(HashSet::new()),
            trace_prefix: c.prefix.clone(),
            trace_timeout: Duration::from_millis(u64::from(c.trace_timeout_ms)),
        });
        link.forwarded.absolute(0);
        link.publish_errors.absolute(0);
        Ok(Cluster {
            link,
            js,
            buckets,
            presence_rx: Mutex::new(presence_rx.into()),
            report_interval,
        })
    }

    /// Why the cluster link is not fully working (see [`Link::degraded`]); `None` when
    /// it works.
    pub fn degraded(&self) -> Option<&'static str> {
        self.link.degraded()
    }

    /// Clears this node's stale presence keys (a previous run that was killed), subscribes
    /// to its subjects and spawns the watchers, the reporter, the publishers and the
    /// supervisor that heals the link.
    pub async fn start(
        &self,
        router: Arc<Router>,
        relations: Arc<Relations>,
        group_changes: mpsc::UnboundedReceiver<(String, u64)>,
        revoked: RevokedFn,
        report: ReportFn,
    ) -> Result<Vec<JoinHandle<()>>, ClusterError> {
        let link = self.link.clone();
        let removed = purge_node_keys(&self.buckets.presence(), &link.node_id).await;
        if removed > 0 {
            tracing::info!(
                removed,
                "cleared this node's presence keys from an earlier run"
            );
        }
        let mut subs = Vec::new();
        for subject in [link.subject(&link.node_id), link.all_subject.clone()] {
            let sub = link.client.subscribe(subject.clone()).await.map_err(|e| {
                ClusterError::Subscribe {
                    subject,
                    message: e.to_string(),
                }
            })?;
            subs.push(sub);
        }
        let trace_subject = trace::subject(&link.trace_prefix, &link.node_id);
        let trace_sub = link
            .client
            .subscribe(trace_subject.clone())
            .await
            .map_err(|e| ClusterError::Subscribe {
                subject: trace_subject,
                message: e.to_string(),
            })?;
        // First report before anything else, so the node is routable at once.
        if let Err(e) = put_report(&self.buckets.nodes(), &link, &report()).await {
            tracing::warn!(error = %e, "could not publish the first load report");
        }
        let mut tasks = vec![
            spawn(
                Task::ClusterInbound,
                inbound(
                    futures_util::stream::select_all(subs),
                    router.clone(),
                    relations.clone(),
                    revoked,
                    link.node_id.clone(),
                    link.key.clone(),
                ),
            ),
            spawn(
                Task::Cluster,
                report_loop(
                    self.buckets.clone(),
                    link.clone(),
                    report.clone(),
                    self.report_interval,
                ),
            ),
            spawn(Task::Cluster, group_notices(link.clone(), group_changes)),
            spawn(
                Task::Cluster,
                trace::serve(link.clone(), trace_sub, router.tracer().clone()),
            ),
        ];
        if let Some(rx) = self.presence_rx.lock().ok().and_then(|mut r| r.take()) {
            tasks.push(spawn(
                Task::Cluster,
                write_presence(self.buckets.clone(), link.clone(), rx),
            ));
        }
        let mut supervisor = Supervisor {
            js: self.js.clone(),
            buckets: self.buckets.clone(),
            link,
            router,
            relations,
            report,
            interval: self.report_interval,
            watchers: Watchers(Vec::new()),
            recreated: metrics::counter!("im_cluster_kv_recreated_total"),
            resyncs: metrics::counter!("im_cluster_resyncs_total"),
        };
        supervisor.recreated.absolute(0);
        supervisor.resyncs.absolute(0);
        supervisor.spawn_watchers();
        tasks.push(spawn(Task::Cluster, supervisor.run()));
        Ok(tasks)
    }

    /// Publishes a report now (e.g. draining at the start of a shutdown).
    pub async fn report_now(&self, report: &LoadReport) {
        if let Err(e) = put_report(&self.buckets.nodes(), &self.link, report).await {
            tracing::warn!(error = %e, "could not publish the load report");
        }
    }

    /// Leaves the cluster cleanly: drops this node's registry entry and presence keys.
    pub async fn leave(&self) {
        if let Err(e) = self.buckets.nodes().delete(&self.link.node_id).await {
            tracing::warn!(error = %e, "could not remove this node from the registry");
        }
        purge_node_keys(&self.buckets.presence(), &self.link.node_id).await;
        let _ = self.link.client.flush().await;
    }
}

/// The reconnect backoff: at once, then doubling from 100 ms up to [`RECONNECT_MAX`].
fn reconnect_delay(attempts: usize) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        n => Duration::from_millis(100u64 << (n - 2).min(8)).min(RECONNECT_MAX),
    }
}

/// The two KV buckets, re-opened after they are recreated.
struct Buckets {
    prefix: String,
    ttl: Duration,
    nodes: RwLock<kv::Store>,
    presence: RwLock<kv::Store>,
}

impl Buckets {
    async fn open(
        js: &jetstream::Context,
        prefix: &str,
        ttl: Duration,
    ) -> Result<Buckets, ClusterError> {
        let [(nodes, nodes_age), (presence, presence_age)] = bucket_specs(prefix, ttl);
        Ok(Buckets {
            prefix: prefix.to_owned(),
            ttl,
            nodes: RwLock::new(open_bucket(js, &nodes, nodes_age).await?.0),
            presence: RwLock::new(open_bucket(js, &presence, presence_age).await?.0),
        })
    }

    /// Creates whichever bucket is missing; returns how many were.
    async fn ensure(&self, js: &jetstream::Context) -> Result<u64, ClusterError> {
        let mut made = 0;
        let specs = bucket_specs(&self.prefix, self.ttl);
        for ((bucket, max_age), slot) in specs.iter().zip([&self.nodes, &self.presence]) {
            let (store, created) = open_bucket(js, bucket, *max_age).await?;
            made += u64::from(created);
            if let Ok(mut s) = slot.write() {
                *s = store;
            }
        }
        Ok(made)
    }

    fn nodes(&self) -> kv::Store {
        read_store(&self.nodes)
    }

    fn presence(&self) -> kv::Store {
        read_store(&self.presence)
    }
}

/// Name and max age of the registry and the presence bucket.
fn bucket_specs(prefix: &str, ttl: Duration) -> [(String, Duration); 2] {
    [
        (format!("{prefix}-nodes"), ttl),
        (format!("{prefix}-presence"), Duration::ZERO),
    ]
}

fn read_store(slot: &RwLock<kv::Store>) -> kv::Store {
    match slot.read() {
        Ok(s) => s.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

/// Opens a bucket, creating its stream when it does not exist (first start, or NATS
/// lost it); the flag says whether it was created.
async fn open_bucket(
    js: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
) -> Result<(kv::Store, bool), ClusterError> {
    use jetstream::stream;
    let err = |message: String| ClusterError::Bucket {
        bucket: bucket.to_owned(),
        message,
    };
    let name = format!("KV_{bucket}");
    let created = match js.get_stream(&name).await {
        Ok(_) => false,
        Err(e) => {
            let missing = matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND);
            if !missing {
                return Err(err(e.to_string()));
            }
            // The KV stream layout, made by hand: the client's `create_key_value` first
            // reads account info fields that NATS servers before 2.10 do not send.
            js.get_or_create_stream(stream::Config {
                name,
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
            true
        }
    };
    let kv = js
        .get_key_value(bucket)
        .await
        .map_err(|e| err(e.to_string()))?;
    Ok((kv, created))
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

/// Puts this node's load report, signed with the cluster key when one is set.
async fn put_report(kv: &kv::Store, link: &Link, report: &LoadReport) -> Result<(), String> {
    let value = link.key.seal_report(report).map_err(|e| e.to_string())?;
    match tokio::time::timeout(PUBLISH_TIMEOUT * 5, kv.put(&link.node_id, value.into())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Each report interval: this node's report, then (while the link works) the lost and
/// returning nodes, the link gauges and the resync notice owed for failed publishes.
async fn report_loop(buckets: Arc<Buckets>, link: Arc<Link>, report: ReportFn, every: Duration) {
    let healthy = metrics::gauge!("im_cluster_nodes_healthy");
    let live = metrics::gauge!("im_cluster_nodes_live");
    let lost = metrics::counter!("im_cluster_nodes_lost_total");
    let back = metrics::counter!("im_cluster_nodes_returned_total");
    lost.absolute(0);
    back.absolute(0);
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if link.connected() {
            match put_report(&buckets.nodes(), &link, &report()).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("load reports are published again");
                }
                Ok(()) => {}
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "could not publish the load report");
                    }
                    failing = true;
                    link.health.kv_failed(&e);
                }
            }
        }
        healthy.set(link.registry.live_nodes().len() as f64);
        let degraded = link.degraded();
        link.health
            .link_up
            .set(if degraded.is_some() { 0.0 } else { 1.0 });
        if degraded.is_some() {
            // Everyone's reports look late from here: judge nobody until it is back.
            continue;
        }
        let sweep = link.registry.sweep_at(Instant::now());
        live.set(sweep.live as f64);
        let stale_ms = link.registry.stale_after().as_millis() as u64;
        for node in sweep.lost.iter().filter(|n| **n != link.node_id) {
            lost.increment(1);
            tracing::warn!(
                node = %node,
                stale_ms,
                "cluster node lost: no load report for over {stale_ms} ms; out of rotation"
            );
        }
        for node in sweep.back.iter().filter(|n| **n != link.node_id) {
            back.increment(1);
            tracing::warn!(node = %node, "cluster node back: reporting again");
            // Its users had no pushes while it was out: have them sync.
            link.send_resync(Some(node)).await;
        }
        for node in link.take_owed_alive() {
            if sweep.back.iter().any(|b| **b == *node) {
                continue; // just notified above
            }
            tracing::info!(
                node = %node,
                "cluster node reporting again after a delivery skipped it: resync notice"
            );
            if !link.send_resync(Some(&node)).await {
                link.owe_resync(&node);
            }
        }
        if link.health.missed.swap(false, Relaxed) && !link.send_resync(None).await {
            link.health.missed.store(true, Relaxed);
        }
    }
}

/// Aborts its tasks when dropped (the watches of the current buckets).
struct Watchers(Vec<JoinHandle<()>>);

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Heals the link: on a reconnect or a KV failure, rebuilds this node's part of the
/// cluster state and has every node's sessions sync (see the module header).
struct Supervisor {
    js: jetstream::Context,
    buckets: Arc<Buckets>,
    link: Arc<Link>,
    router: Arc<Router>,
    relations: Arc<Relations>,
    report: ReportFn,
    interval: Duration,
    watchers: Watchers,
    recreated: metrics::Counter,
    resyncs: metrics::Counter,
}

impl Supervisor {
    async fn run(mut self) {
        let mut last: Option<Instant> = None;
        loop {
            self.link.health.kick.notified().await;
            if let Some(t) = last {
                tokio::time::sleep(RETRY.saturating_sub(t.elapsed())).await;
            }
            if !self.link.connected() {
                // The reconnect kicks again.
                continue;
            }
            last = Some(Instant::now());
            if let Err(e) = self.resync().await {
                tracing::warn!(error = %e, "cluster resync failed; retrying");
                self.link.health.kv_failed(&e);
            }
        }
    }

    fn spawn_watchers(&mut self) {
        self.watchers = Watchers(vec![
            spawn(
                Task::Cluster,
                watch_registry(self.buckets.clone(), self.link.clone()),
            ),
            spawn(
                Task::Cluster,
                watch_presence(self.buckets.clone(), self.link.clone(), self.router.clone()),
            ),
        ]);
    }

    async fn resync(&mut self) -> Result<(), String> {
        let link = self.link.clone();
        let health = &link.health;
        health.kv.store(KV_RESYNCING, Relaxed);
        let made = self
            .buckets
            .ensure(&self.js)
            .await
            .map_err(|e| e.to_string())?;
        if made > 0 {
            self.recreated.increment(made);
            tracing::warn!(
                buckets = made,
                "recreated the cluster KV buckets NATS had lost"
            );
        }
        self.spawn_watchers();
        put_report(&self.buckets.nodes(), &self.link, &(self.report)()).await?;
        let users = self.router.republish_presence();
        let _ = self.link.presence_tx.send(PresenceOp::Retry);
        // Give the other nodes' watches a report interval to see this node's report and
        // users before anyone syncs, so what they commit from then on is pushed here.
        tokio::time::sleep(self.interval).await;
        if !self.link.connected() {
            return Err("NATS connection lost during the resync".into());
        }
        if health
            .kv
            .compare_exchange(KV_RESYNCING, KV_OK, Relaxed, Relaxed)
            .is_err()
        {
            return Err("a cluster KV operation failed during the resync".into());
        }
        health.missed.store(false, Relaxed);
        health.link_up.set(1.0);
        if !self.link.send_resync(None).await {
            health.missed.store(true, Relaxed);
        }
        self.relations.evict_all();
        let hinted = self.router.hint_all();
        self.resyncs.increment(1);
        tracing::info!(
            users,
            hinted,
            "cluster state resynced; every node's sessions sync what the outage held back"
        );
        Ok(())
    }
}

/// A watch failed or ended: unless NATS is down (the reconnect handles that), the
/// buckets need a resync.
fn watch_failed(link: &Link, what: &str, error: &str) {
    if link.connected() {
        tracing::warn!(error, "{what} watch failed; resyncing");
        link.health.kv_failed(error);
    } else {
        tracing::debug!(error, "{what} watch failed while NATS is down");
    }
}

/// Follows the registry bucket into the link's registry.
async fn watch_registry(buckets: Arc<Buckets>, link: Arc<Link>) {
    let registry = &link.registry;
    loop {
        let error = match buckets.nodes().watch_with_history(">").await {
            Ok(mut w) => loop {
                match w.next().await {
                    Some(Ok(e)) => match e.operation {
                        kv::Operation::Put => match link.key.open_report(&e.value) {
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
                        kv::Operation::Delete | kv::Operation::Purge => {
                            if registry.remove(&e.key) {
                                tracing::info!(node = %e.key, "cluster node left (clean shutdown)");
                            }
                        }
                    },
                    Some(Err(e)) => break e.to_string(),
                    None => break "the watch ended".to_owned(),
                }
            },
            Err(e) => e.to_string(),
        };
        watch_failed(&link, "registry", &error);
        tokio::time::sleep(RETRY).await;
    }
}

/// Follows the presence bucket into the link's map, skipping this node's own keys, and
/// tells the router of each change (presence subscriptions). The map is not cleared
/// when the watch restarts: the replay brings every key back, and a stale entry costs
/// at most a publish nobody on that node wants.
async fn watch_presence(buckets: Arc<Buckets>, link: Arc<Link>, router: Arc<Router>) {
    let map = &link.presence;
    loop {
        let error = match buckets.presence().watch_with_history(">").await {
            Ok(mut w) => loop {
                match w.next().await {
                    Some(Ok(e)) => {
                        let Some((node, user)) = presence::parse_key(&e.key) else {
                            continue;
                        };
                        if node == link.node_id {
                            continue;
                        }
                        match e.operation {
                            kv::Operation::Put => {
                                map.put_devices(&node, &user, presence::devices_of(&e.value))
                            }
                            kv::Operation::Delete | kv::Operation::Purge => {
                                map.delete(&node, &user)
                            }
                        }
                        router.presence_changed(&user);
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the watch ended".to_owned(),
                }
            },
            Err(e) => e.to_string(),
        };
        watch_failed(&link, "presence", &error);
        tokio::time::sleep(RETRY).await;
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

/// Presence writes of one batch in flight at once.
const PRESENCE_WRITES_IN_FLIGHT: usize = 256;

/// Writes this node's presence changes, coalesced: of several changes of one user queued
/// together, only the last is written; a batch's writes are in flight together. Writes
/// that fail are kept and written again on [`PresenceOp::Retry`] (after a resync) unless
/// a newer change of that user came first.
async fn write_presence(
    buckets: Arc<Buckets>,
    link: Arc<Link>,
    mut rx: mpsc::UnboundedReceiver<PresenceOp>,
) {
    let errors = metrics::counter!("im_cluster_presence_errors_total");
    errors.absolute(0);
    let mut pending: HashMap<String, u32> = HashMap::new();
    let mut failed: HashMap<String, u32> = HashMap::new();
    let take =
        |op: PresenceOp, pending: &mut HashMap<String, u32>, failed: &mut HashMap<String, u32>| {
            match op {
                PresenceOp::Set(user, up) => {
                    pending.insert(user, up);
                }
                PresenceOp::Retry => {
                    for (user, up) in failed.drain() {
                        pending.entry(user).or_insert(up);
                    }
                }
            }
        };
    while let Some(op) = rx.recv().await {
        take(op, &mut pending, &mut failed);
        while let Ok(op) = rx.try_recv() {
            take(op, &mut pending, &mut failed);
            if pending.len() >= 4096 {
                break;
            }
        }
        // Each user is in the batch once, so its writes can be in flight together (one
        // JetStream round trip per batch, not per user: a login burst would otherwise
        // leave the other nodes' presence maps seconds behind); the next batch waits.
        let kv = buckets.presence();
        let results: Vec<(String, u32, Result<(), String>)> =
            futures_util::stream::iter(pending.drain())
                .map(|(user, up)| {
                    let (kv, key) = (&kv, presence::key(&link.node_id, &user));
                    async move {
                        let r = if up > 0 {
                            kv.put(&key, Bytes::from(up.to_string()))
                                .await
                                .map(|_| ())
                                .map_err(|e| e.to_string())
                        } else {
                            kv.delete(&key).await.map_err(|e| e.to_string())
                        };
                        (user, up, r)
                    }
                })
                .buffer_unordered(PRESENCE_WRITES_IN_FLIGHT)
                .collect()
                .await;
        let mut last_error = None;
        for (user, up, r) in results {
            match r {
                Ok(()) => {
                    failed.remove(&user);
                }
                Err(e) => {
                    errors.increment(1);
                    failed.insert(user, up);
                    last_error = Some(e);
                }
            }
        }
        if let Some(e) = last_error {
            if link.connected() {
                tracing::warn!(
                    failed = failed.len(),
                    error = %e,
                    "presence updates failed; written again after the resync"
                );
                link.health.kv_failed(&e);
            }
        }
    }
}

/// Publishes group-change notices made on this node to the others (unless
/// `cluster.drop_group_notices`, a fault injection for tests, drops them).
async fn group_notices(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<(String, u64)>) {
    while let Some((group, version)) = rx.recv().await {
        if link.drop_group_notices {
            tracing::debug!(
                group,
                version,
                "group notice dropped (cluster.drop_group_notices)"
            );
            continue;
        }
        link.group_changed(&group, version).await;
    }
}

/// This node's subject and the all-nodes subject: envelopes from the others, pushed to
/// local sessions in arrival order; resync notices hint every session here.
async fn inbound(
    mut subs: impl futures_util::Stream<Item = async_nats::Message> + Unpin,
    router: Arc<Router>,
    relations: Arc<Relations>,
    revoked: RevokedFn,
    me: String,
    key: ClusterKey,
) {
    let received = metrics::counter!("im_cluster_received_total");
    let bad = metrics::counter!("im_cluster_bad_envelopes_total");
    received.absolute(0);
    bad.absolute(0);
    while let Some(msg) = subs.next().await {
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
        if env.resync {
            if env.from != me {
                relations.evict_all();
                let hinted = router.hint_all();
                tracing::info!(from = %env.from, hinted, "resync notice: every session here syncs");
            }
            continue;
        }
        if !env.group_changed.is_empty() {
            relations.evict(&env.group_changed, env.group_version);
            continue;
        }
        if !env.revoked_user.is_empty() {
            revoked(&env.revoked_user, env.revoked_at);
            continue;
        }
        if !env.presence_user.is_empty() {
            router.presence_hidden(&env.presence_user, env.presence_hidden);
            continue;
        }
        if env.ephemeral {
            router.deliver_ephemeral_remote(&env.users, &env.frame);
            continue;
        }
        let trace = if key.check_trace(&env) {
            env.trace.map(crate::obs::trace::TraceContext::from)
        } else {
            tracing::debug!(from = %env.from, "ignoring a badly signed trace context");
            None
        };
        router.deliver_remote(&env.users, &env.frame, env.direct, trace.as_ref());
    }
}
