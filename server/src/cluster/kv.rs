//! The KV side of the link: the registry and presence buckets (memory-backed JetStream
//! streams, made by hand when missing and re-opened after NATS lost them), and what
//! this node writes to them: its load report, signed, and its users' presence,
//! coalesced per user and written again after a resync when a write failed.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::link::{Link, PresenceOp};
use super::registry::LoadReport;
use super::{presence, ClusterError, PUBLISH_TIMEOUT};
use std::sync::Arc;

/// The two KV buckets, re-opened after they are recreated.
pub(super) struct Buckets {
    prefix: String,
    ttl: Duration,
    nodes: RwLock<kv::Store>,
    presence: RwLock<kv::Store>,
}

impl Buckets {
    pub(super) async fn open(
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
    pub(super) async fn ensure(&self, js: &jetstream::Context) -> Result<u64, ClusterError> {
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

    pub(super) fn nodes(&self) -> kv::Store {
        read_store(&self.nodes)
    }

    pub(super) fn presence(&self) -> kv::Store {
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
pub(super) async fn purge_node_keys(kv: &kv::Store, node: &str) -> usize {
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
pub(super) async fn put_report(
    kv: &kv::Store,
    link: &Link,
    report: &LoadReport,
) -> Result<(), String> {
    let value = link.key.seal_report(report).map_err(|e| e.to_string())?;
    match tokio::time::timeout(PUBLISH_TIMEOUT * 5, kv.put(&link.node_id, value.into())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// Presence writes of one batch in flight at once.
const PRESENCE_WRITES_IN_FLIGHT: usize = 256;

/// Writes this node's presence changes, coalesced: of several changes of one user queued
/// together, only the last is written; a batch's writes are in flight together. Writes
/// that fail are kept and written again on [`PresenceOp::Retry`] (after a resync) unless
/// a newer change of that user came first.
pub(super) async fn write_presence(
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
