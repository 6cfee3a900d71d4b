//! The report loop: each report interval this node puts its load report, then (while
//! the link works) sweeps the registry for nodes lost and back, logs and counts them,
//! sets the link gauges, and sends the resync notices owed (to a returning node, to a
//! node a delivery skipped, to all after failed publishes).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kv::{put_report, Buckets};
use super::link::Link;
use super::ReportFn;

/// Each report interval: this node's report, then (while the link works) the lost and
/// returning nodes, the link gauges and the resync notice owed for failed publishes.
pub(super) async fn report_loop(
    buckets: Arc<Buckets>,
    link: Arc<Link>,
    report: ReportFn,
    every: Duration,
) {
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
