//! Supervision: the task that heals the link. A reconnect or a KV failure kicks it; it
//! recreates the buckets NATS lost, restarts the watches, republishes this node's report
//! and its users' presence, waits a report interval, then sends every node a resync
//! notice and drops this node's group cache (see the `cluster` module header).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio::task::JoinHandle;

use super::kv::{put_report, Buckets};
use super::link::{Link, PresenceOp, KV_OK, KV_RESYNCING};
use super::watch::{watch_presence, watch_registry};
use super::{Cluster, ReportFn, RETRY};
use crate::obs::runtime::{spawn, Task};
use crate::route::Router;
use crate::store::membership::Relations;

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
pub(super) struct Supervisor {
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
    /// The supervisor of `cluster`'s started link, with the watches running.
    pub(super) fn start(
        cluster: &Cluster,
        router: Arc<Router>,
        relations: Arc<Relations>,
        report: ReportFn,
    ) -> Self {
        let mut supervisor = Supervisor {
            js: cluster.js.clone(),
            buckets: cluster.buckets.clone(),
            link: cluster.link.clone(),
            router,
            relations,
            report,
            interval: cluster.report_interval,
            watchers: Watchers(Vec::new()),
            recreated: metrics::counter!("im_cluster_kv_recreated_total"),
            resyncs: metrics::counter!("im_cluster_resyncs_total"),
        };
        supervisor.recreated.absolute(0);
        supervisor.resyncs.absolute(0);
        supervisor.spawn_watchers();
        supervisor
    }

    pub(super) async fn run(mut self) {
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
