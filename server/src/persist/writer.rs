//! The writer task: gathers a batch from the queue, commits it under the guard, then
//! answers and hands the committed messages to the router (see the module above).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_proto::{frame, Body, ChatMessage, ErrorCode, SendAck};
use tokio::sync::mpsc;

use super::guard::set_fault_gauges;
use super::{Guard, HideReq, PersistReq, Refusal, StateReq, WriteReq, WriterQueue};
use crate::config::Persist;
use crate::obs::logfilter::{self, as_uid};
use crate::obs::{Metrics, Stage};
use crate::route::receipts::ReadEvent;
use crate::route::{Delivery, Recipients};
use crate::store::membership::{self, Relations};
use crate::store::{
    health, CursorUpdate, Fault, FlagsUpdate, HiddenMessage, NewMessage, ReadUpdate, Store,
    StoreError,
};

/// The writer task. Ends when every [`PersistHandle`] is dropped and the queue is empty,
/// after committing what it holds.
///
/// No Send is acked unless its batch committed: a failed or abandoned commit answers
/// every Send of the batch with a retry hint (the same client_msg_id finds the message
/// if the commit landed after all). A fault of the store itself (disk full, I/O error,
/// read-only, no answer: [`health::classify`]) also turns the node read-only for Sends
/// until a write succeeds again; meanwhile one write is tried per `probe_interval`.
#[allow(clippy::too_many_arguments)]
pub async fn run_writer(
    store: Arc<dyn Store>,
    relations: Arc<Relations>,
    queue: WriterQueue,
    router: mpsc::Sender<Vec<Delivery>>,
    cfg: Persist,
    guard: Guard,
    metrics: Metrics,
    receipts: Option<mpsc::Sender<ReadEvent>>,
) {
    set_fault_gauges(None);
    let WriterQueue { mut rx, last } = queue;
    let receipts_dropped = metrics::counter!("im_receipts_dropped_total");
    let batch_max = cfg.batch_max as usize;
    let wait = Duration::from_millis(cfg.batch_wait_ms as u64);
    let mut sends: Vec<PersistReq> = Vec::with_capacity(batch_max);
    let mut cursors: HashMap<(String, String, String), u64> = HashMap::new();
    let mut states: Vec<StateReq> = Vec::new();
    let mut groups = Vec::new();
    let mut flushes = Vec::new();
    let mut hides: Vec<HideReq> = Vec::new();
    let mut presence_settings = Vec::new();
    let mut fault_since: Option<Instant> = None;
    let mut last_try = Instant::now();
    loop {
        // While the store is failing, wake up each probe interval even with no request.
        let first = if guard.health.fault().is_some() {
            match tokio::time::timeout(guard.probe_interval, rx.recv()).await {
                Ok(Some(r)) => Some(r),
                Ok(None) => break,
                Err(_) => None,
            }
        } else {
            match rx.recv().await {
                Some(r) => Some(r),
                None => break,
            }
        };
        let mut take = |req: WriteReq, sends: &mut Vec<PersistReq>| match req {
            WriteReq::Message(m) => sends.push(m),
            WriteReq::Cursor(c) => {
                let seq = cursors
                    .entry((c.user_id, c.device_id, c.conversation_id))
                    .or_insert(0);
                *seq = (*seq).max(c.seq);
            }
            WriteReq::State(r) => states.push(r),
            WriteReq::Group {
                group_id,
                req,
                reply,
            } => groups.push((group_id, req, reply)),
            WriteReq::Flush(reply) => flushes.push(reply),
            WriteReq::Hide(h) => hides.push(h),
            WriteReq::SetPresence {
                user_id,
                hidden,
                reply,
            } => presence_settings.push((user_id, hidden, reply)),
        };
        if let Some(first) = first {
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
        }
        metrics.persist_queue_depth.set(rx.len() as f64);

        // A failing store gets one write per probe interval; everything else is
        // answered at once (Sends: OVERLOADED; cursors wait in the map).
        if let Some(fault) = guard.health.fault() {
            if last_try.elapsed() < guard.probe_interval {
                refuse(&mut sends, fault, &guard);
                refuse_states(
                    &mut states,
                    &Refusal::store(StoreError::Unavailable(fault.name())),
                );
                for (_, _, reply) in groups.drain(..) {
                    let _ = reply.send(Err(StoreError::Unavailable(fault.name())));
                }
                refuse_hides(&mut hides, &Refusal::store_unavailable(fault.name(), 1000));
                for (_, _, reply) in presence_settings.drain(..) {
                    let _ = reply.send(Err(StoreError::Unavailable(fault.name())));
                }
                for reply in flushes.drain(..) {
                    let _ = reply.send(());
                }
                continue;
            }
            last_try = Instant::now();
            if sends.is_empty()
                && cursors.is_empty()
                && groups.is_empty()
                && states.is_empty()
                && hides.is_empty()
                && presence_settings.is_empty()
            {
                let probe = guard.bounded(store.probe_write()).await;
                guard.record(probe.as_ref().map(|_| ()), &mut fault_since);
            }
        }

        let cursor_updates: Vec<CursorUpdate> = cursors
            .drain()
            .map(
                |((user_id, device_id, conversation_id), seq)| CursorUpdate {
                    user_id,
                    device_id,
                    conversation_id,
                    seq,
                },
            )
            .collect();
        if !sends.is_empty() || !cursor_updates.is_empty() {
            last_try = Instant::now();
            if relations.verifies_versions() {
                // A read past the write bound is given up: the cache stands for this batch.
                let refresh = refresh_stale(&*store, &relations, &sends);
                let _ = tokio::time::timeout(guard.unavailable_after, refresh).await;
            }
            recheck_groups(&relations, &mut sends);
            let start = Instant::now();
            for s in sends.iter() {
                metrics.stage(Stage::PersistWait, start - s.enqueued);
            }
            let messages: Vec<NewMessage> = sends.iter().map(|s| s.message.clone()).collect();
            let result = guard
                .bounded(store.commit_batch(&messages, &cursor_updates))
                .await;
            metrics.stage_since(Stage::PersistCommit, start);
            let end = Instant::now();
            for s in sends.iter_mut() {
                if let Some(tr) = s.trace.as_deref_mut() {
                    tr.stage(Stage::PersistWait, s.enqueued, start);
                    tr.stage(Stage::PersistCommit, start, end);
                }
            }
            metrics.persist_batch_size.record(sends.len() as f64);
            guard.record(result.as_ref().map(|_| ()), &mut fault_since);
            match result {
                Ok(committed) => {
                    last.record(&committed);
                    acked(&mut sends, committed, &router).await
                }
                Err(e) => {
                    // Cursors are kept for the next batch; Sends are told to retry.
                    for c in cursor_updates {
                        let seq = cursors
                            .entry((c.user_id, c.device_id, c.conversation_id))
                            .or_insert(0);
                        *seq = (*seq).max(c.seq);
                    }
                    failed(&mut sends, &e, &guard);
                }
            }
        }
        if !states.is_empty() {
            let reads: Vec<ReadUpdate> = states.iter().filter_map(|r| r.read.clone()).collect();
            let flags: Vec<FlagsUpdate> = states.iter().filter_map(|r| r.flags.clone()).collect();
            let result = guard.bounded(store.commit_state(&reads, &flags)).await;
            guard.record(result.as_ref().map(|_| ()), &mut fault_since);
            match result {
                Ok(moved) => {
                    // The connection whose MarkRead moved each cursor (the last one).
                    let mut origin: HashMap<(&str, &str), u64> = HashMap::new();
                    for r in &states {
                        if let Some(u) = &r.read {
                            origin.insert(
                                (u.user_id.as_str(), u.conversation_id.as_str()),
                                r.origin.conn_id,
                            );
                        }
                    }
                    if let Some(tx) = &receipts {
                        for m in moved {
                            let origin_conn = origin
                                .get(&(m.user_id.as_str(), m.conversation_id.as_str()))
                                .copied()
                                .unwrap_or(0);
                            if tx
                                .try_send(ReadEvent {
                                    moved: m,
                                    origin_conn,
                                })
                                .is_err()
                            {
                                receipts_dropped.increment(1);
                            }
                        }
                    }
                    for r in states.drain(..) {
                        let done =
                            im_proto::encode(&frame(r.req_id, Body::Done(im_proto::Done {})));
                        r.origin.push(done, true);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, requests = states.len(), "read state commit failed");
                    let mut refusal = Refusal::store(e);
                    if refusal.retry_after_ms == 0 {
                        refusal.retry_after_ms = 500;
                    }
                    refuse_states(&mut states, &refusal);
                }
            }
        }
        for (group_id, req, reply) in groups.drain(..) {
            let result = guard.bounded(store.group_change(&group_id, &req)).await;
            guard.record(result.as_ref().map(|_| ()), &mut fault_since);
            let result = match result {
                Ok(outcome) => {
                    group_committed(&relations, &router, &group_id, &outcome).await;
                    Ok(outcome.state)
                }
                Err(e) => Err(e),
            };
            let _ = reply.send(result);
        }
        if !hides.is_empty() {
            let rows: Vec<HiddenMessage> = hides.iter().map(|h| h.hidden.clone()).collect();
            let result = guard.bounded(store.hide_messages(&rows)).await;
            guard.record(result.as_ref().map(|_| ()), &mut fault_since);
            match result {
                Ok(()) => {
                    for h in hides.drain(..) {
                        let done = frame(h.req_id, Body::Done(im_proto::Done {}));
                        h.origin.push(im_proto::encode(&done), true);
                    }
                }
                Err(e) => refuse_hides(&mut hides, &Refusal::store(e)),
            }
        }
        for (user_id, hidden, reply) in presence_settings.drain(..) {
            let result = guard
                .bounded(store.set_presence_hidden(&user_id, hidden))
                .await;
            guard.record(result.as_ref().map(|_| ()), &mut fault_since);
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
        hint_only: false,
        trace: None,
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
        // SYSTEM messages are the server's own (clients cannot send them): no sender check.
        let system = req.message.msg_type == im_proto::MessageType::System as i32;
        if system || membership::is_in(&members, &req.message.sender) {
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

/// Answers the DeleteForMe requests of a round that was not committed.
fn refuse_hides(hides: &mut Vec<HideReq>, refusal: &Refusal) {
    for h in hides.drain(..) {
        h.origin
            .push(im_proto::encode(&refusal.to_frame(h.req_id)), true);
    }
}

/// Answers Sends the writer did not try, while the store is failing: OVERLOADED with
/// the probe interval as the retry hint.
fn refuse(sends: &mut Vec<PersistReq>, fault: Fault, guard: &Guard) {
    if !sends.is_empty() {
        metrics::counter!("im_store_refused_sends_total", "reason" => fault.name())
            .increment(sends.len() as u64);
    }
    let retry = guard.probe_interval.as_millis().clamp(1, u32::MAX as u128) as u32;
    let refusal = Refusal::store_unavailable(fault.name(), retry);
    for req in sends.drain(..) {
        req.origin
            .push(im_proto::encode(&refusal.to_frame(req.req_id)), true);
    }
}

/// Answers MarkReads and SetConversationFlags that were not committed with `refusal`.
fn refuse_states(states: &mut Vec<StateReq>, refusal: &Refusal) {
    for r in states.drain(..) {
        r.origin
            .push(im_proto::encode(&refusal.to_frame(r.req_id)), true);
    }
}

/// Answers the Sends of a batch whose commit failed: nothing of it is acked. A fault of
/// the store is OVERLOADED (the node refuses Sends until it heals); an error of this
/// batch alone is INTERNAL. Both carry a retry hint.
fn failed(sends: &mut Vec<PersistReq>, e: &StoreError, guard: &Guard) {
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
            for req in sends.drain(..) {
                req.origin
                    .push(im_proto::encode(&refusal.to_frame(req.req_id)), true);
            }
        }
    }
}

/// Queues the SendAcks of a committed batch and hands its new messages to the router,
/// in commit order.
async fn acked(
    sends: &mut Vec<PersistReq>,
    committed: Vec<crate::store::Committed>,
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
        if c.duplicate {
            // The first commit of this message may never have been pushed (a commit whose
            // outcome its node could not know, then a retry): the recipients sync it.
            deliveries.push(Delivery {
                message: ChatMessage {
                    conversation_id: c.conversation_id,
                    seq: c.seq,
                    msg_id: c.msg_id,
                    ..ChatMessage::default()
                },
                recipients: req.recipients,
                origin_conn: req.origin.conn_id,
                started: req.started,
                hint_only: true,
                trace: req.trace,
            });
        } else {
            let m = req.message;
            let (ref_seq, ref_msg_id) = m
                .reference
                .map_or((0, String::new()), |r| (r.seq, r.msg_id));
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
                    ref_seq,
                    ref_msg_id,
                    ..Default::default()
                },
                recipients: req.recipients,
                origin_conn: req.origin.conn_id,
                started: req.started,
                hint_only: false,
                trace: req.trace,
            });
        }
    }
    if !deliveries.is_empty() && router.send(deliveries).await.is_err() {
        tracing::warn!("router is gone; committed messages will reach recipients by sync");
    }
}
