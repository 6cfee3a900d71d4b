//! Route stage: the online-session registry (user -> connections on this node) and the
//! fan-out of committed messages. Each message is encoded once and the bytes are shared
//! by every recipient's outbound queue.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use im_proto::{frame, Body, ChatMessage, Deliver};
use tokio::sync::mpsc;

use super::relation::Members;
use crate::flow::{Outbound, Pushed};
use crate::obs::{EndToEnd, Metrics, Stage};

/// Who receives a message.
#[derive(Debug, Clone)]
pub enum Recipients {
    /// Both parties of a one-to-one chat (all their devices).
    Direct(String, String),
    /// Every member of a group.
    Group(Members),
}

/// A committed message on its way to recipients.
pub struct Delivery {
    /// The message as stored.
    pub message: ChatMessage,
    /// Who gets it.
    pub recipients: Recipients,
    /// The sending connection, which gets a SendAck instead.
    pub origin_conn: u64,
    /// When its Send frame started decoding.
    pub started: Instant,
}

/// Online sessions of this node; the one owner of that map.
pub struct Router {
    sessions: RwLock<HashMap<String, Vec<Arc<Outbound>>>>,
    metrics: Metrics,
    notify_threshold: usize,
    hint: bytes::Bytes,
    hints: metrics::Counter,
}

impl Router {
    /// An empty registry; groups above `notify_threshold` members get sync hints.
    pub fn new(metrics: Metrics, notify_threshold: u32) -> Self {
        let hint = im_proto::encode(&frame(
            0,
            Body::SyncResp(im_proto::SyncResponse {
                messages: Vec::new(),
                more: true,
            }),
        ));
        Router {
            sessions: RwLock::new(HashMap::new()),
            metrics,
            notify_threshold: notify_threshold as usize,
            hint,
            hints: metrics::counter!("im_sync_hints_total"),
        }
    }

    /// Notify-and-pull: a sync hint to every online member but the sender.
    fn hint_members(&self, members: &[String], origin_conn: u64) {
        let mut sent = 0;
        if let Ok(sessions) = self.sessions.read() {
            for out in members.iter().filter_map(|m| sessions.get(m)).flatten() {
                if out.conn_id != origin_conn && out.hint_sync(&self.hint) {
                    sent += 1;
                }
            }
        }
        self.hints.increment(sent);
    }

    /// Registers a logged-in connection for `user`.
    pub fn register(&self, user: &str, out: Arc<Outbound>) {
        if let Ok(mut s) = self.sessions.write() {
            s.entry(user.to_string()).or_default().push(out);
        }
    }

    /// Removes a connection of `user`.
    pub fn unregister(&self, user: &str, conn_id: u64) {
        if let Ok(mut s) = self.sessions.write() {
            if let Some(list) = s.get_mut(user) {
                list.retain(|o| o.conn_id != conn_id);
                if list.is_empty() {
                    s.remove(user);
                }
            }
        }
    }

    /// Connections `user` has on this node.
    pub fn online(&self, user: &str) -> usize {
        self.sessions
            .read()
            .map(|s| s.get(user).map_or(0, Vec::len))
            .unwrap_or(0)
    }

    /// Users online on this node.
    pub fn users_online(&self) -> usize {
        self.sessions.read().map(|s| s.len()).unwrap_or(0)
    }

    /// Fans out one committed message: encode once, push the shared bytes to every
    /// recipient connection but the sender's own.
    pub fn deliver(&self, d: Delivery) {
        let t = Instant::now();
        if let Recipients::Group(members) = &d.recipients {
            if members.len() > self.notify_threshold {
                self.hint_members(members, d.origin_conn);
                self.metrics.stage_since(Stage::Route, t);
                return;
            }
        }
        let direct = matches!(d.recipients, Recipients::Direct(..));
        let bytes = im_proto::encode(&frame(
            0,
            Body::Deliver(Deliver {
                messages: vec![d.message],
            }),
        ));
        self.metrics.encoded.increment(1);
        self.metrics.stage_since(Stage::Encode, t);
        let t = Instant::now();
        let e2e = EndToEnd::new(d.started);
        let mut queued = 0u64;
        if let Ok(sessions) = self.sessions.read() {
            let mut push_to = |user: &str| {
                for out in sessions.get(user).into_iter().flatten() {
                    if out.conn_id != d.origin_conn
                        && out.push_traced(bytes.clone(), direct, Some(&e2e)) == Pushed::Queued
                    {
                        queued += 1;
                    }
                }
            };
            match &d.recipients {
                Recipients::Direct(a, b) => {
                    push_to(a);
                    if a != b {
                        push_to(b);
                    }
                }
                Recipients::Group(members) => members.iter().for_each(|m| push_to(m)),
            }
        }
        self.metrics.delivered.increment(queued);
        self.metrics
            .totals
            .messages_out
            .fetch_add(queued, std::sync::atomic::Ordering::Relaxed);
        self.metrics.stage_since(Stage::Route, t);
        e2e.done(&self.metrics);
    }

    /// The router task: delivers committed batches in commit order.
    pub async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Vec<Delivery>>) {
        while let Some(batch) = rx.recv().await {
            for d in batch {
                self.deliver(d);
            }
        }
    }
}
