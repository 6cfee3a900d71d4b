//! The watchers: the registry bucket followed into the link's registry (signed,
//! identity-checked reports), the presence bucket into the link's presence map (other
//! nodes' keys only; each change told to the router). A watch that fails or ends asks
//! for a resync and starts again.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use futures_util::StreamExt;

use super::kv::Buckets;
use super::link::Link;
use super::{presence, RETRY};
use crate::route::Router;

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
pub(super) async fn watch_registry(buckets: Arc<Buckets>, link: Arc<Link>) {
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
pub(super) async fn watch_presence(buckets: Arc<Buckets>, link: Arc<Link>, router: Arc<Router>) {
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
