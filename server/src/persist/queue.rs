//! The writer's bounded queue: the requests it takes ([`WriteReq`] and the request
//! types inside it), the submitting side ([`PersistHandle`]) and the writer's end, and
//! [`LastCommitted`], the last seqs the writer committed, which DeliverAck checks read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::flow::Outbound;
use crate::obs::trace::Trace;
use crate::obs::Metrics;
use crate::route::Recipients;
use crate::store::{
    CursorUpdate, FlagsUpdate, GroupRequest, GroupState, HiddenMessage, NewMessage, ReadUpdate,
    StoreError,
};

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
    /// A MarkRead or SetConversationFlags; answered `Done` once committed.
    State(StateReq),
    /// A DeleteForMe: committed with the others of its round, then answered `Done` (or
    /// an `Error`) on the origin connection.
    Hide(HideReq),
    /// A user hides (or shows again) their presence (`SetPresence`).
    SetPresence {
        /// The user.
        user_id: String,
        /// Hidden from now on.
        hidden: bool,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// A MarkRead or SetConversationFlags waiting for its commit (`pipeline::reads`).
pub struct StateReq {
    /// The read cursor to move (MarkRead).
    pub read: Option<ReadUpdate>,
    /// The flags to set (SetConversationFlags).
    pub flags: Option<FlagsUpdate>,
    /// The request's req_id, echoed on `Done`.
    pub req_id: u64,
    /// The requesting connection.
    pub origin: Arc<Outbound>,
}

/// A validated DeleteForMe waiting for its commit.
pub struct HideReq {
    /// What to hide, for whom.
    pub hidden: HiddenMessage,
    /// The request's req_id, echoed on the reply.
    pub req_id: u64,
    /// The requesting connection.
    pub origin: Arc<Outbound>,
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
    /// The message's trace, when it is traced (`obs::trace`).
    pub trace: Option<Box<Trace>>,
}

/// Conversations [`LastCommitted`] remembers before it starts over.
const LAST_COMMITTED_MAX: usize = 65_536;

/// The last seq this node's writer committed in each conversation it wrote to lately
/// (bounded: it starts over at `LAST_COMMITTED_MAX` conversations). A DeliverAck's seq is
/// checked here before the store is asked: a recipient acks what was just committed, so
/// the check costs a map lookup instead of a store read per ack. Only the writer records.
#[derive(Default)]
pub struct LastCommitted(std::sync::Mutex<HashMap<String, u64>>);

impl LastCommitted {
    /// The last seq committed here in `conversation_id`, if remembered.
    pub fn get(&self, conversation_id: &str) -> Option<u64> {
        self.0.lock().ok()?.get(conversation_id).copied()
    }

    pub(super) fn record(&self, committed: &[crate::store::Committed]) {
        let Ok(mut m) = self.0.lock() else {
            return;
        };
        for c in committed.iter().filter(|c| c.seq > 0) {
            if let Some(last) = m.get_mut(c.conversation_id.as_str()) {
                *last = (*last).max(c.seq);
                continue;
            }
            if m.len() >= LAST_COMMITTED_MAX {
                m.clear();
            }
            m.insert(c.conversation_id.clone(), c.seq);
        }
    }
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
    last: Arc<LastCommitted>,
}

impl PersistHandle {
    /// Queues a request without waiting; fails when the queue is full (or the writer is gone).
    pub fn try_submit(&self, req: WriteReq) -> Result<(), QueueFull> {
        let r = self.tx.try_send(req).map_err(|_| QueueFull);
        self.metrics.persist_queue_depth.set(self.depth() as f64);
        r
    }

    /// Queues a request, waiting up to `within` for room (server-sent messages: the
    /// operator's request may wait where a client's Send is refused at once).
    pub async fn submit(&self, req: WriteReq, within: Duration) -> Result<(), QueueFull> {
        let r = match self.tx.try_send(req) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(req)) => {
                match tokio::time::timeout(within, self.tx.send(req)).await {
                    Ok(Ok(())) => Ok(()),
                    _ => Err(QueueFull),
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(QueueFull),
        };
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

    /// The last seq this node committed in `conversation_id`, if remembered.
    pub fn last_committed(&self, conversation_id: &str) -> Option<u64> {
        self.last.get(conversation_id)
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

/// The writer's end of the queue, for [`Writer`](super::Writer).
pub struct WriterQueue {
    pub(super) rx: mpsc::Receiver<WriteReq>,
    pub(super) last: Arc<LastCommitted>,
}

/// Creates the queue; its receiving end goes to [`Writer`](super::Writer).
pub fn queue(capacity: usize, metrics: Metrics) -> (PersistHandle, WriterQueue) {
    let (tx, rx) = mpsc::channel(capacity);
    let last = Arc::new(LastCommitted::default());
    (
        PersistHandle {
            tx,
            capacity,
            metrics,
            last: last.clone(),
        },
        WriterQueue { rx, last },
    )
}
