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
//! One file per job: `link` (the [`Link`] the router and the tasks use, its health),
//! `kv` (the buckets and what this node writes to them), `report` (the report loop),
//! `supervise` (the healing described above), `watch` (the registry and presence
//! watches) and `inbound` (envelopes from the other nodes); `registry`, `presence`,
//! `relay`, `query`, `trace` and `trust` are the pieces they share.
//!
//! The router calls [`Link`] through its own `route::Peers` trait (presence
//! up/down, the forward plan, publishing), so it knows nothing of this module; the tasks
//! here call the router (local delivery, sync hints, presence republishing) and the
//! membership cache (eviction on a group change made elsewhere). Cross-node pushes of
//! one conversation from several origin nodes may arrive out of seq order; the SDK
//! holds a message above a gap until its sync fills it, so the application still sees
//! seq order.

mod inbound;
mod kv;
mod link;
pub mod presence;
pub mod query;
pub mod region_trace;
pub mod registry;
pub mod relay;
mod report;
mod supervise;
pub mod trace;
pub mod trust;
mod watch;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::obs::runtime::{spawn, Task};
use crate::route::Router;
use crate::store::membership::Relations;
use kv::{purge_node_keys, put_report, Buckets};
pub use link::Link;
use link::{Health, PresenceOp};
use presence::PresenceMap;
use registry::{LoadReport, Registry};
use supervise::Supervisor;
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
        let prefix = config.cluster_prefix();
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
        let buckets = Arc::new(Buckets::open(&js, &prefix, ttl).await?);
        let (presence_tx, presence_rx) = mpsc::unbounded_channel();
        let report_interval = Duration::from_millis(c.report_interval_ms as u64);
        let link = Arc::new(Link {
            node_id: node_id.to_owned(),
            subject_prefix: format!("{}.node.", prefix),
            all_subject: format!("{}.all", prefix),
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
            trace_prefix: prefix.clone(),
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
        let subs = [link.subject(&link.node_id), link.all_subject.clone()];
        let mut inbox = Vec::new();
        for subject in subs {
            inbox.push(self.subscribe(subject).await?);
        }
        let trace_sub = self
            .subscribe(trace::subject(&link.trace_prefix, &link.node_id))
            .await?;
        // First report before anything else, so the node is routable at once.
        if let Err(e) = put_report(&self.buckets.nodes(), &link, &report()).await {
            tracing::warn!(error = %e, "could not publish the first load report");
        }
        let mut tasks = vec![
            spawn(
                Task::ClusterInbound,
                inbound::inbound(
                    futures_util::stream::select_all(inbox),
                    router.clone(),
                    relations.clone(),
                    revoked,
                    link.node_id.clone(),
                    link.key.clone(),
                ),
            ),
            spawn(
                Task::Cluster,
                report::report_loop(
                    self.buckets.clone(),
                    link.clone(),
                    report.clone(),
                    self.report_interval,
                ),
            ),
            spawn(
                Task::Cluster,
                link::group_notices(link.clone(), group_changes),
            ),
            spawn(
                Task::Cluster,
                trace::serve(link.clone(), trace_sub, router.tracer().clone()),
            ),
        ];
        if let Some(rx) = self.presence_rx.lock().ok().and_then(|mut r| r.take()) {
            tasks.push(spawn(
                Task::Cluster,
                kv::write_presence(self.buckets.clone(), link.clone(), rx),
            ));
        }
        let supervisor = Supervisor::start(self, router, relations, report);
        tasks.push(spawn(Task::Cluster, supervisor.run()));
        Ok(tasks)
    }

    /// A subscription to `subject` on the link's connection.
    async fn subscribe(&self, subject: String) -> Result<async_nats::Subscriber, ClusterError> {
        let client = &self.link.client;
        client
            .subscribe(subject.clone())
            .await
            .map_err(|e| ClusterError::Subscribe {
                subject,
                message: e.to_string(),
            })
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
