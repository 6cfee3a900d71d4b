//! Read receipts: the task that turns committed read cursors into `ReadReceipt` pushes.
//! The persistence writer hands it each user read cursor a MarkRead moved, through a
//! bounded channel (full: dropped and counted in `im_receipts_dropped_total`). Receipts
//! of one (conversation, reader) are coalesced for `receipts.coalesce_ms` and only the
//! latest seq goes out: one-to-one to both parties' sessions (the reader's other
//! devices included) but the marking connection; groups of at most
//! `receipts.group_member_max` members to every member's sessions; larger groups in
//! `count` mode get one receipt per conversation per window with the number of readers,
//! sent to the sender of the message at that seq only, and in `none` mode nothing.
//! Pushes reach other nodes through the router's forwarding, as message pushes do.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use im_proto::{frame, Body, ConversationRef, ReadReceipt};
use tokio::sync::mpsc;

use super::Router;
use crate::config::Receipts;
use crate::store::membership::Relations;
use crate::store::{ReadMoved, Store};

/// A committed read cursor on its way to the receipts task.
#[derive(Debug, Clone)]
pub struct ReadEvent {
    /// The reader's cursor as committed.
    pub moved: ReadMoved,
    /// The connection that sent the MarkRead (it gets no receipt of its own read).
    pub origin_conn: u64,
}

/// The bounded channel from the writer to [`run`].
pub fn channel(cfg: &Receipts) -> (mpsc::Sender<ReadEvent>, mpsc::Receiver<ReadEvent>) {
    mpsc::channel(cfg.queue_capacity.max(1) as usize)
}

/// The receipts task: gathers read events for one coalescing window, then pushes the
/// receipts. Ends when the writer's sender is gone.
pub async fn run(
    mut rx: mpsc::Receiver<ReadEvent>,
    store: Arc<dyn Store>,
    relations: Arc<Relations>,
    router: Arc<Router>,
    cfg: Receipts,
) {
    let window = Duration::from_millis(cfg.coalesce_ms.into());
    let sent = metrics::counter!("im_receipts_sent_total");
    let mut pending: HashMap<(String, String), ReadEvent> = HashMap::new();
    while let Some(first) = rx.recv().await {
        gather(&mut pending, first);
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some(e)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            gather(&mut pending, e);
        }
        let batch: Vec<ReadEvent> = pending.drain().map(|(_, e)| e).collect();
        let pushed = flush(batch, &*store, &relations, &router, &cfg).await;
        sent.increment(pushed);
    }
}

/// Keeps the latest seq per (conversation, reader).
fn gather(pending: &mut HashMap<(String, String), ReadEvent>, e: ReadEvent) {
    let key = (e.moved.conversation_id.clone(), e.moved.user_id.clone());
    match pending.get_mut(&key) {
        Some(old) if old.moved.seq >= e.moved.seq => {}
        Some(old) => *old = e,
        None => {
            pending.insert(key, e);
        }
    }
}

/// Pushes the receipts of one window; returns how many receipts (frames) went out.
async fn flush(
    batch: Vec<ReadEvent>,
    store: &dyn Store,
    relations: &Relations,
    router: &Router,
    cfg: &Receipts,
) -> u64 {
    let mut pushed = 0;
    // Large groups in count mode: the furthest read per conversation.
    let mut counted: HashMap<String, ReadEvent> = HashMap::new();
    for e in batch {
        let m = &e.moved;
        let users: Vec<String> = match im_proto::parse_conversation(&m.conversation_id) {
            Some(ConversationRef::Direct(a, b)) => vec![a.to_owned(), b.to_owned()],
            Some(ConversationRef::Group(g)) => {
                let members = match relations.members(g).await {
                    Ok(Some(members)) => members,
                    Ok(None) => continue,
                    Err(err) => {
                        tracing::debug!(group = g, error = %err, "receipt dropped: members unknown");
                        continue;
                    }
                };
                if members.len() <= cfg.group_member_max as usize {
                    members.to_vec()
                } else {
                    if cfg.counts_large_groups() {
                        match counted.get_mut(&m.conversation_id) {
                            Some(old) if old.moved.seq >= m.seq => {}
                            Some(old) => *old = e.clone(),
                            None => {
                                counted.insert(m.conversation_id.clone(), e.clone());
                            }
                        }
                    }
                    continue;
                }
            }
            None => continue,
        };
        let receipt = ReadReceipt {
            conversation_id: m.conversation_id.clone(),
            user_id: m.user_id.clone(),
            seq: m.seq,
            read_count: 0,
            read_time: m.read_time,
        };
        send(router, &users, receipt, e.origin_conn).await;
        pushed += 1;
    }
    for (conv, e) in counted {
        let (read_count, sender) = match store.read_count(&conv, e.moved.seq).await {
            Ok(r) => r,
            Err(err) => {
                tracing::debug!(conversation = %conv, error = %err, "counted receipt dropped");
                continue;
            }
        };
        if sender.is_empty() {
            continue;
        }
        let receipt = ReadReceipt {
            conversation_id: conv,
            user_id: String::new(),
            seq: e.moved.seq,
            read_count,
            read_time: e.moved.read_time,
        };
        send(router, &[sender], receipt, e.origin_conn).await;
        pushed += 1;
    }
    pushed
}

/// Encodes `receipt` once and pushes it to `users` here (but `origin_conn`) and on the
/// other nodes that have them online.
async fn send(router: &Router, users: &[String], receipt: ReadReceipt, origin_conn: u64) {
    let bytes = im_proto::encode(&frame(0, Body::ReadReceipt(receipt)));
    if let Some(f) = router.push_frame(users, &bytes, origin_conn) {
        router.forward(f).await;
    }
}
