//! Persist stage: the dedicated writer that owns every store mutation. Sends, cursor
//! updates and group changes arrive on one bounded queue; sends are committed in groups
//! (a batch closes at `persist.batch_max` messages or after `persist.batch_wait_ms`), and
//! only then are SendAcks queued and the messages handed to the router, in commit order.
//! Just before a batch commits, each group message's sender and recipients are checked
//! again against the membership cache, which this writer patches after every group
//! change it commits: a member removed after their Send was validated gets NOT_MEMBER,
//! and nobody removed before the commit receives the message. A group change's SYSTEM
//! event goes to the members after the change and to those it removed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_proto::{frame, Body, ChatMessage, ErrorCode, SendAck};
use tokio::sync::{mpsc, oneshot};

use super::relation::Relations;
use super::route::{Delivery, Recipients};
use crate::config::Persist;
use crate::flow::Outbound;
use crate::obs::{Metrics, Stage};
use crate::store::{CursorUpdate, GroupRequest, GroupState, NewMessage, Store, StoreError};

/// One request to the writer.
pub enum WriteReq {
    /// A validated Send.
    Message(PersistReq),
    /// A DeliverAck cursor.
    Cursor(CursorUpdate),
    /// A group operation; the reply carries the group's state after it.
    Group {
        /// The group.
        group_id: String,
        /// The operation.
        req: GroupRequest,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<GroupState, StoreError>>,
    },
    /// Answered once everything queued before it is committed.
    Flush(oneshot::Sender<()>),
}

/// A validated Send waiting for its commit.
pub struct PersistReq {
    /// What to store.
    pub message: NewMessage,
    /// The Send's req_id, echoed on the SendAck.
    pub req_id: u64,
    /// The sender's connection.
    pub origin: Arc<Outbound>,
    /// Who receives it once committed.
    pub recipients: Recipients,
    /// When the Send frame started decoding.
    pub started: Instant,
    /// When it entered the queue.
    pub enqueued: Instant,
}

/// The persistence queue refused a request: answer OVERLOADED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// The submitting side of the persistence queue.
#[derive(Clone)]
pub struct PersistHandle {
    tx: mpsc::Sender<WriteReq>,
    capacity: usize,
    metrics: Metrics,
}

impl PersistHandle {
    /// Queues a request without waiting; fails when the queue is full (or the writer is gone).
    pub fn try_submit(&self, req: WriteReq) -> Result<(), QueueFull> {
        let r = self.tx.try_send(req).map_err(|_| QueueFull);
        self.metrics.persist_queue_depth.set(self.depth() as f64);
        r
    }

    /// Waits until everything queued so far is committed (shutdown).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(WriteReq::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Requests waiting in the queue.
    pub fn depth(&self) -> usize {
        self.capacity - self.tx.capacity()
    }

    /// Queue capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// Creates the queue; the receiver goes to [`run_writer`].
pub fn queue(capacity: usize, metrics: Metrics) -> (PersistHandle, mpsc::Receiver<WriteReq>) {
    let (tx, rx) = mpsc::channel(capacity);
    (
        PersistHandle {
            tx,
            capacity,
            metrics,
        },
        rx,
    )
}

/// The writer task. Ends when every [`PersistHandle`] is dropped and the queue is empty,
/// after committing what it holds.
pub async fn run_writer(
    store: Arc<dyn Store>,
    relations: Arc<Relations>,
    mut rx: mpsc::Receiver<WriteReq>,
    router: mpsc::Sender<Vec<Delivery>>,
    cfg: Persist,
    metrics: Metrics,
) {
    let batch_max = cfg.batch_max as usize;
    let wait = Duration::from_millis(cfg.batch_wait_ms as u64);
    let mut sends: Vec<PersistReq> = Vec::with_capacity(batch_max);
    let mut cursors: HashMap<(String, String), u64> = HashMap::new();
    let mut groups = Vec::new();
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut take = |req: WriteReq, sends: &mut Vec<PersistReq>| match req {
            WriteReq::Message(m) => sends.push(m),
            WriteReq::Cursor(c) => {
                let seq = cursors.entry((c.user_id, c.conversation_id)).or_insert(0);
                *seq = (*seq).max(c.seq);
            }
            WriteReq::Group {
                group_id,
                req,
                reply,
            } => groups.push((group_id, req, reply)),
            WriteReq::Flush(reply) => flushes.push(reply),
        };
        take(first, &mut sends);
        let deadline = tokio::time::Instant::now() + wait;
        while sends.len() < batch_max {
            match rx.try_recv() {
                Ok(r) => take(r, &mut sends),
                Err(_) if wait.is_zero() || sends.is_empty() => break,
                Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(r)) => take(r, &mut sends),
                    _ => break,
                },
            }
        }
        metrics.persist_queue_depth.set(rx.len() as f64);
        let cursor_updates: Vec<CursorUpdate> = cursors
            .drain()
            .map(|((user_id, conversation_id), seq)| CursorUpdate {
                user_id,
                conversation_id,
                seq,
            })
            .collect();
        if !sends.is_empty() || !cursor_updates.is_empty() {
            if relations.verifies_versions() {
                refresh_stale(&*store, &relations, &sends).await;
            }
            recheck_groups(&relations, &mut sends);
            commit(&*store, &mut sends, &cursor_updates, &router, &metrics).await;
        }
        for (group_id, req, reply) in groups.drain(..) {
            let result = store.group_change(&group_id, &req).await;
            let result = match result {
                Ok(outcome) => {
                    group_committed(&relations, &router, &group_id, &outcome).await;
                    Ok(outcome.state)
                }
                Err(e) => Err(e),
            };
            let _ = reply.send(result);
        }
        for reply in flushes.drain(..) {
            let _ = reply.send(());
        }
    }
    tracing::info!("persistence writer stopped");
}

/// Patches the membership cache after a committed group change and hands its SYSTEM
/// event to the router.
async fn group_committed(
    relations: &Relations,
    router: &mpsc::Sender<Vec<Delivery>>,
    group_id: &str,
    outcome: &crate::store::GroupOutcome,
) {
    let Some(event) = &outcome.event else {
        return;
    };
    let version = outcome.state.version;
    let mut recipients: Vec<String> = if outcome.dissolved {
        relations.dissolved(group_id, version);
        Vec::new()
    } else {
        relations.apply(group_id, &outcome.added, &outcome.removed, version);
        match relations.members(group_id).await {
            Ok(Some(m)) => m.to_vec(),
            _ => Vec::new(),
        }
    };
    recipients.extend(outcome.removed.iter().cloned());
    recipients.sort_unstable();
    recipients.dedup();
    let delivery = Delivery {
        message: event.clone(),
        recipients: Recipients::Group(recipients.into()),
        origin_conn: 0,
        started: Instant::now(),
    };
    if router.send(vec![delivery]).await.is_err() {
        tracing::warn!("router is gone; the group event will reach members by sync");
    }
}

/// Cluster mode: compares the cached version of every group in the batch with the
/// store's and reads the stale ones again, so a change committed on another node
/// applies here even if its notice was lost (one indexed query per batch that has
/// group messages; a change committed between this read and the commit can still slip
/// through, within one batch).
async fn refresh_stale(store: &dyn Store, relations: &Relations, sends: &[PersistReq]) {
    let mut groups: Vec<&str> = sends
        .iter()
        .filter_map(
            |r| match im_proto::parse_conversation(&r.message.conversation_id) {
                Some(im_proto::ConversationRef::Group(g)) => Some(g),
                _ => None,
            },
        )
        .collect();
    if groups.is_empty() {
        return;
    }
    groups.sort_unstable();
    groups.dedup();
    let versions = match store.group_versions(&groups).await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "group version check failed; using the cache");
            return;
        }
    };
    let found: HashMap<&str, u64> = versions.iter().map(|(g, v)| (g.as_str(), *v)).collect();
    for g in groups {
        let stale = match (found.get(g), relations.version_of(g)) {
            (Some(stored), Some(cached)) => *stored > cached,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if stale {
            if let Err(e) = relations.reload(g).await {
                tracing::warn!(group = g, error = %e, "reloading a stale group failed");
            }
        }
    }
}

/// Checks each group message against the cached member list as it is now (this writer
/// applied every change of this node before this point): a sender who is no longer a
/// member is refused, and the recipients become the current members.
fn recheck_groups(relations: &Relations, sends: &mut Vec<PersistReq>) {
    sends.retain_mut(|req| {
        let Some(im_proto::ConversationRef::Group(g)) =
            im_proto::parse_conversation(&req.message.conversation_id)
        else {
            return true;
        };
        let Some(members) = relations.cached(g) else {
            return true;
        };
        if super::relation::is_in(&members, &req.message.sender) {
            req.recipients = Recipients::Group(members);
            return true;
        }
        let f = im_proto::error_frame(
            req.req_id,
            ErrorCode::NotMember,
            format!("not a member of group {g}"),
        );
        req.origin.push(im_proto::encode(&f), true);
        false
    });
}

async fn commit(
    store: &dyn Store,
    sends: &mut Vec<PersistReq>,
    cursors: &[CursorUpdate],
    router: &mpsc::Sender<Vec<Delivery>>,
    metrics: &Metrics,
) {
    let start = Instant::now();
    for s in sends.iter() {
        metrics.stage(Stage::PersistWait, start - s.enqueued);
    }
    let messages: Vec<NewMessage> = sends.iter().map(|s| s.message.clone()).collect();
    let result = store.commit_batch(&messages, cursors).await;
    metrics.stage_since(Stage::PersistCommit, start);
    metrics.persist_batch_size.record(sends.len() as f64);
    match result {
        Ok(committed) => {
            let mut deliveries = Vec::with_capacity(sends.len());
            for (req, c) in sends.drain(..).zip(committed) {
                let ack = im_proto::encode(&frame(
                    req.req_id,
                    Body::SendAck(SendAck {
                        client_msg_id: req.message.client_msg_id.clone(),
                        msg_id: c.msg_id.clone(),
                        conversation_id: c.conversation_id.clone(),
                        seq: c.seq,
                        server_time: c.server_time,
                        duplicate: c.duplicate,
                    }),
                ));
                req.origin.push(ack, true);
                if !c.duplicate {
                    let m = req.message;
                    deliveries.push(Delivery {
                        message: ChatMessage {
                            conversation_id: c.conversation_id,
                            sender: m.sender,
                            payload: m.payload,
                            send_time: c.server_time,
                            r#type: m.msg_type,
                            seq: c.seq,
                            msg_id: c.msg_id,
                            client_msg_id: m.client_msg_id,
                        },
                        recipients: req.recipients,
                        origin_conn: req.origin.conn_id,
                        started: req.started,
                    });
                }
            }
            if !deliveries.is_empty() && router.send(deliveries).await.is_err() {
                tracing::warn!("router is gone; committed messages will reach recipients by sync");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, batch = sends.len(), "commit failed; senders told to retry");
            for req in sends.drain(..) {
                let mut f = im_proto::error_frame(
                    req.req_id,
                    ErrorCode::Internal,
                    "store unavailable, retry with the same client_msg_id",
                );
                if let Some(Body::Error(err)) = f.body.as_mut() {
                    err.retry_after_ms = 500;
                }
                req.origin.push(im_proto::encode(&f), true);
            }
        }
    }
}
