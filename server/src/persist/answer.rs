//! How the writer answers its requesters: the SendAcks of a committed batch and the
//! hand-off of its messages to the router (in commit order), and the refusals of what
//! was not committed (a failed commit, or a failing store's rounds that are not tried).

use std::collections::HashMap;
use std::sync::Arc;

use im_proto::{frame, Body, ChatMessage, ErrorCode, SendAck};
use tokio::sync::mpsc;

use super::{Guard, HideReq, PersistReq, Refusal, StateReq};
use crate::flow::Outbound;
use crate::obs::logfilter::{self, as_uid};
use crate::route::Delivery;
use crate::store::{health, Committed, Fault, StoreError};

/// A request answered on the connection that made it.
pub(super) trait Requested {
    /// The requesting connection.
    fn origin(&self) -> &Arc<Outbound>;
    /// The request's req_id, echoed on the answer.
    fn req_id(&self) -> u64;
}

macro_rules! requested {
    ($($t:ty),*) => {$(
        impl Requested for $t {
            fn origin(&self) -> &Arc<Outbound> {
                &self.origin
            }
            fn req_id(&self) -> u64 {
                self.req_id
            }
        }
    )*};
}
requested!(PersistReq, StateReq, HideReq);

/// Answers every request of `reqs` with `refusal`, emptying it.
pub(super) fn refuse_all<R: Requested>(reqs: &mut Vec<R>, refusal: &Refusal) {
    for r in reqs.drain(..) {
        r.origin()
            .push(im_proto::encode(&refusal.to_frame(r.req_id())), true);
    }
}

/// Answers every request of `reqs` `Done`, emptying it.
pub(super) fn done_all<R: Requested>(reqs: &mut Vec<R>) {
    for r in reqs.drain(..) {
        let done = frame(r.req_id(), Body::Done(im_proto::Done {}));
        r.origin().push(im_proto::encode(&done), true);
    }
}

/// Answers Sends the writer did not try, while the store is failing: OVERLOADED with
/// the probe interval as the retry hint.
pub(super) fn refuse(sends: &mut Vec<PersistReq>, fault: Fault, guard: &Guard) {
    if !sends.is_empty() {
        metrics::counter!("im_store_refused_sends_total", "reason" => fault.name())
            .increment(sends.len() as u64);
    }
    let retry = guard.probe_interval.as_millis().clamp(1, u32::MAX as u128) as u32;
    refuse_all(sends, &Refusal::store_unavailable(fault.name(), retry));
}

/// Answers the Sends of a batch whose commit failed: nothing of it is acked. A fault of
/// the store is OVERLOADED (the node refuses Sends until it heals); an error of this
/// batch alone is INTERNAL. Both carry a retry hint.
pub(super) fn failed(sends: &mut Vec<PersistReq>, e: &StoreError, guard: &Guard) {
    tracing::error!(error = %e, batch = sends.len(), "commit failed; senders told to retry");
    if let Some(levels) = logfilter::filtered_uids() {
        let batch = sends.len();
        for req in sends.iter() {
            let m = &req.message;
            for (uid, level, role) in req.recipients.filtered(&m.sender, &levels) {
                as_uid(&uid, level, || {
                    tracing::warn!(
                        uid = %uid,
                        role,
                        conversation = %m.conversation_id,
                        client_msg_id = %m.client_msg_id,
                        batch,
                        error = %e,
                        "message not committed; sender told to retry"
                    )
                });
            }
        }
    }
    match health::classify(e) {
        Some(fault) => refuse(sends, fault, guard),
        None => {
            let refusal = Refusal {
                code: ErrorCode::Internal,
                message: "store unavailable, retry with the same client_msg_id".into(),
                retry_after_ms: 500,
                bad_reason: None,
            };
            refuse_all(sends, &refusal);
        }
    }
}

/// Queues the SendAcks of a committed batch and hands its new messages to the router,
/// in commit order.
pub(super) async fn acked(
    sends: &mut Vec<PersistReq>,
    committed: Vec<Committed>,
    router: &mpsc::Sender<Vec<Delivery>>,
) {
    let mut deliveries = Vec::with_capacity(sends.len());
    let batch = sends.len();
    let filtered = logfilter::filtered_uids();
    for (mut req, c) in sends.drain(..).zip(committed) {
        if let Some(tr) = req.trace.as_deref_mut() {
            tr.set_committed(&c.msg_id, c.seq);
        }
        if let Some(levels) = &filtered {
            log_committed(&req, &c, batch, levels);
        }
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
        deliveries.push(delivery(req, c));
    }
    if !deliveries.is_empty() && router.send(deliveries).await.is_err() {
        tracing::warn!("router is gone; committed messages will reach recipients by sync");
    }
}

/// The `message committed` debug event, once per filtered sender or recipient.
fn log_committed(req: &PersistReq, c: &Committed, batch: usize, levels: &HashMap<Arc<str>, u8>) {
    for (uid, level, role) in req.recipients.filtered(&req.message.sender, levels) {
        as_uid(&uid, level, || {
            tracing::debug!(
                uid = %uid,
                role,
                conversation = %c.conversation_id,
                seq = c.seq,
                msg_id = %c.msg_id,
                client_msg_id = %req.message.client_msg_id,
                duplicate = c.duplicate,
                batch,
                since_queued_ms = req.enqueued.elapsed().as_secs_f64() * 1e3,
                "message committed"
            )
        });
    }
}

/// What the router gets of a committed Send: the message, or for a repeat only a sync
/// hint (the first commit may never have been pushed: a commit whose outcome its node
/// could not know, then a retry; the recipients sync it).
fn delivery(req: PersistReq, c: Committed) -> Delivery {
    let message = if c.duplicate {
        ChatMessage {
            conversation_id: c.conversation_id,
            seq: c.seq,
            msg_id: c.msg_id,
            ..ChatMessage::default()
        }
    } else {
        let m = req.message;
        let (ref_seq, ref_msg_id) = m
            .reference
            .map_or((0, String::new()), |r| (r.seq, r.msg_id));
        ChatMessage {
            conversation_id: c.conversation_id,
            sender: m.sender,
            payload: m.payload,
            send_time: c.server_time,
            r#type: m.msg_type,
            seq: c.seq,
            msg_id: c.msg_id,
            client_msg_id: m.client_msg_id,
            ref_seq,
            ref_msg_id,
            ..Default::default()
        }
    };
    Delivery {
        message,
        recipients: req.recipients,
        origin_conn: req.origin.conn_id,
        started: req.started,
        hint_only: c.duplicate,
        trace: req.trace,
    }
}
