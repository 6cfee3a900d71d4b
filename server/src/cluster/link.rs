//! The link: this node's side of the NATS connection as the router and the cluster's
//! tasks use it. `Link` implements the router's `Peers` (presence changes out, the
//! forward plan from the presence map and the registry, publishing one signed envelope
//! per receiving node), broadcasts group-change, revocation and presence-hidden notices
//! to every live node, sends resync notices (to nodes owed one, or to all), and says
//! why it is `degraded`. `Health` is the link's state as the NATS connection events and
//! the KV operations report it; it kicks the supervisor (`cluster::supervise`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use prost::Message as _;
use tokio::sync::{mpsc, Notify};

use super::presence::PresenceMap;
use super::registry::Registry;
use super::relay::{self, Envelope};
use super::trust::ClusterKey;
use super::PUBLISH_TIMEOUT;
use crate::route::{Forward, Peers};

/// The KV side of the link, as [`Health::kv`] holds it.
pub(super) const KV_OK: u8 = 0;
pub(super) const KV_RESYNCING: u8 = 1;
pub(super) const KV_MISSING: u8 = 2;
pub(super) const KV_ERROR: u8 = 3;

/// A change of this node's presence, or a retry of the writes that failed.
pub(super) enum PresenceOp {
    /// `user` has this many connections here (0: none any more).
    Set(String, u32),
    /// Write again what failed (after a resync).
    Retry,
}

/// Health of the link, shared by the connection's event callback and the tasks.
pub(super) struct Health {
    /// `KV_*`: whether the buckets answer.
    pub(super) kv: AtomicU8,
    /// NATS dropped the connection and it has not come back yet.
    was_down: AtomicBool,
    /// A publish was skipped or failed: the others get a resync notice.
    pub(super) missed: AtomicBool,
    /// Publishes are failing (logged once per run of failures).
    publish_failing: AtomicBool,
    /// Something needs a resync (reconnect, a missing bucket, a failed watch).
    pub(super) kick: Notify,
    pub(super) link_up: metrics::Gauge,
    pub(super) reconnects: metrics::Counter,
}

impl Health {
    pub(super) fn new() -> Self {
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
    pub(super) fn on_event(&self, event: async_nats::Event) {
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
    pub(super) fn kv_failed(&self, error: &str) {
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
    pub(super) node_id: String,
    pub(super) subject_prefix: String,
    pub(super) all_subject: String,
    pub(super) client: async_nats::Client,
    /// Every node's last load report.
    pub registry: Arc<Registry>,
    /// Users on other nodes.
    pub presence: Arc<PresenceMap>,
    pub(super) presence_tx: mpsc::UnboundedSender<PresenceOp>,
    pub(super) forwarded: metrics::Counter,
    pub(super) publish_errors: metrics::Counter,
    /// `cluster.drop_group_notices` (fault injection for tests).
    pub(super) drop_group_notices: bool,
    pub(super) health: Arc<Health>,
    pub(super) key: ClusterKey,
    /// Nodes that presence names for a recipient but that looked dead when a delivery
    /// was planned, so the delivery was not forwarded to them: each gets a resync notice
    /// as soon as it reports again (a node that was frozen, or whose reports this node
    /// saw late), whatever the lost/back sweep made of the gap. Bounded by
    /// [`MAX_OWED_RESYNCS`].
    pub(super) owed: Mutex<HashSet<Arc<str>>>,
    /// The cluster prefix, for the trace subjects (`trace::subject`).
    pub(super) trace_prefix: String,
    /// `cluster.trace_timeout_ms`: how long a trace request waits for the other nodes.
    pub trace_timeout: Duration,
}

/// Most nodes remembered as owed a resync (presence names only nodes that wrote to the
/// cluster's buckets; past this, the oldest knowledge is dropped, not the node's users'
/// messages, which stay stored and come with their next sync).
const MAX_OWED_RESYNCS: usize = 1024;

impl Link {
    /// The NATS connection (multi-region forwarding shares it).
    pub fn nats_client(&self) -> async_nats::Client {
        self.client.clone()
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Remembers that `node` missed a forward and needs a resync notice once it is alive.
    pub(super) fn owe_resync(&self, node: &str) {
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
    pub(super) fn take_owed_alive(&self) -> Vec<Arc<str>> {
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

    pub(super) fn subject(&self, node: &str) -> String {
        format!("{}{node}", self.subject_prefix)
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
    pub(super) async fn send_resync(&self, node: Option<&str>) -> bool {
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
    /// `user` now has a connection here (first one).
    fn user_up(&self, user: &str) {
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), 1));
    }

    /// `user` has no connection here any more.
    fn user_down(&self, user: &str) {
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), 0));
    }

    /// The cross-node part of a delivery to `users`: `None` when no other live node has
    /// any of them online.
    fn plan(
        &self,
        users: &mut dyn Iterator<Item = &str>,
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
            notify: false,
        })
    }

    /// Publishes a forward plan: one envelope per node.
    fn forward(&self, f: Forward) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            for (node, users) in f.targets {
                let env = Envelope {
                    from: self.node_id.clone(),
                    users,
                    frame: f.frame.clone(),
                    direct: f.direct,
                    trace: f.trace.as_ref().map(relay::TraceCtx::from),
                    notify: f.notify,
                    ..Default::default()
                };
                self.publish(self.subject(&node), env, true).await;
            }
        })
    }

    /// `user` has `devices` connections here (0: none).
    fn user_devices(&self, user: &str, devices: usize) {
        let n = u32::try_from(devices).unwrap_or(u32::MAX);
        let _ = self.presence_tx.send(PresenceOp::Set(user.to_owned(), n));
    }

    /// `user`'s connections on the other live nodes.
    fn remote_devices(&self, user: &str) -> u32 {
        self.presence
            .devices(user, |n| n != self.node_id && self.registry.alive(n))
    }

    /// Publishes an ephemeral plan (typing): one envelope per node, marked so the
    /// receiver skips slow connections. A failed publish is counted, not resynced.
    fn forward_ephemeral(&self, f: Forward) -> BoxFuture<'_, ()> {
        Box::pin(async move {
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
                let subject = self.subject(&node);
                let sent =
                    tokio::time::timeout(PUBLISH_TIMEOUT, self.client.publish(subject, bytes));
                match sent.await {
                    Ok(Ok(())) => self.forwarded.increment(1),
                    _ => self.publish_errors.increment(1),
                }
            }
        })
    }

    /// Tells every other live node that `user` now hides (or shows) their presence.
    fn presence_hidden(&self, user: &str, hidden: bool) -> BoxFuture<'_, ()> {
        let env = Envelope {
            from: self.node_id.clone(),
            presence_user: user.to_owned(),
            presence_hidden: hidden,
            ..Default::default()
        };
        Box::pin(self.broadcast(env))
    }
}

/// Publishes group-change notices made on this node to the others (unless
/// `cluster.drop_group_notices`, a fault injection for tests, drops them).
pub(super) async fn group_notices(link: Arc<Link>, mut rx: mpsc::UnboundedReceiver<(String, u64)>) {
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
