//! The writer task ([`Writer`]): each round gathers a batch from the queue
//! ([`Writer::gather`]), then commits it kind by kind under the guard (the
//! `commit_*` steps, each through [`Writer::write`]: one bounded write whose outcome
//! the store's health records), answers the requesters and hands the committed messages
//! to the router, in commit order. How requesters are answered is `super::answer`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_proto::ErrorCode;
use tokio::sync::{mpsc, oneshot};

use super::answer::{acked, done_all, failed, refuse, refuse_all};
use super::cursors::{Cursors, CURSORS_PER_COMMIT};
use super::guard::set_fault_gauges;
use super::{Guard, HideReq, LastCommitted, PersistReq, Refusal, StateReq, WriteReq, WriterQueue};
use crate::config::Persist;
use crate::obs::{Metrics, Stage};
use crate::route::receipts::ReadEvent;
use crate::route::{Delivery, Recipients};
use crate::store::membership::{self, Relations};
use crate::store::{
    Fault, FlagsUpdate, GroupOutcome, GroupRequest, GroupState, HiddenMessage, NewMessage,
    ReadMoved, ReadUpdate, Store, StoreError,
};

/// What the writer is wired to (`Pipeline::spawn_with` builds it).
pub struct Wiring {
    /// The store every write goes to.
    pub store: Arc<dyn Store>,
    /// The membership cache the writer patches after each group change and rechecks
    /// group messages against.
    pub relations: Arc<Relations>,
    /// The router's channel: committed messages and group events, in commit order.
    pub router: mpsc::Sender<Vec<Delivery>>,
    /// The receipt task's channel: read cursors a commit moved.
    pub receipts: Option<mpsc::Sender<ReadEvent>>,
    /// Batch size and wait (`persist.*`).
    pub cfg: Persist,
    /// The time bound and the commit fault.
    pub guard: Guard,
    /// The node's metrics.
    pub metrics: Metrics,
}

/// A group change waiting for its commit, with where its outcome goes.
type GroupChange = (
    String,
    GroupRequest,
    oneshot::Sender<Result<GroupState, StoreError>>,
);
/// A presence setting waiting for its commit, with where its outcome goes.
type PresenceSetting = (String, bool, oneshot::Sender<Result<(), StoreError>>);

/// One round's requests, sorted by kind. Every list is emptied by the round; the
/// delivery cursors stay when their commit fails (or the store is failing) and go with
/// the next batch.
#[derive(Default)]
struct Round {
    sends: Vec<PersistReq>,
    cursors: Cursors,
    states: Vec<StateReq>,
    groups: Vec<GroupChange>,
    flushes: Vec<oneshot::Sender<()>>,
    hides: Vec<HideReq>,
    presence: Vec<PresenceSetting>,
}

impl Round {
    /// Files one request under its kind (cursors: the furthest seq per cursor).
    fn take(&mut self, req: WriteReq) {
        match req {
            WriteReq::Message(m) => self.sends.push(m),
            WriteReq::Cursor(c) => self.cursors.add(c),
            WriteReq::State(r) => self.states.push(r),
            WriteReq::Group {
                group_id,
                req,
                reply,
            } => self.groups.push((group_id, req, reply)),
            WriteReq::Flush(reply) => self.flushes.push(reply),
            WriteReq::Hide(h) => self.hides.push(h),
            WriteReq::SetPresence {
                user_id,
                hidden,
                reply,
            } => self.presence.push((user_id, hidden, reply)),
        }
    }

    /// Only delivery cursors so far: nothing anyone waits on.
    fn only_cursors(&self) -> bool {
        !self.cursors.is_empty()
            && self.sends.is_empty()
            && self.groups.is_empty()
            && self.states.is_empty()
            && self.hides.is_empty()
            && self.presence.is_empty()
            && self.flushes.is_empty()
    }

    /// Nothing to write (a flush alone writes nothing).
    fn has_no_write(&self) -> bool {
        self.sends.is_empty()
            && self.cursors.is_empty()
            && self.groups.is_empty()
            && self.states.is_empty()
            && self.hides.is_empty()
            && self.presence.is_empty()
    }

    /// Answers every request of the round but the cursors without writing: the store
    /// is failing (`fault`) and this is not the probe interval's one try.
    fn refuse(&mut self, fault: Fault, guard: &Guard) {
        refuse(&mut self.sends, fault, guard);
        refuse_all(
            &mut self.states,
            &Refusal::store(StoreError::Unavailable(fault.name())),
        );
        for (_, _, reply) in self.groups.drain(..) {
            let _ = reply.send(Err(StoreError::Unavailable(fault.name())));
        }
        refuse_all(
            &mut self.hides,
            &Refusal::store_unavailable(fault.name(), 1000),
        );
        for (_, _, reply) in self.presence.drain(..) {
            let _ = reply.send(Err(StoreError::Unavailable(fault.name())));
        }
        self.answer_flushes();
    }

    /// Answers the flushes: everything queued before them is done.
    fn answer_flushes(&mut self) {
        for reply in self.flushes.drain(..) {
            let _ = reply.send(());
        }
    }
}

/// The writer task: the one owner of the message path's store writes. Built from its
/// [`Wiring`] and the queue's end, then [`Writer::run`] until the queue closes.
///
/// No Send is acked unless its batch committed: a failed or abandoned commit answers
/// every Send of the batch with a retry hint (the same client_msg_id finds the message
/// if the commit landed after all). A fault of the store itself (disk full, I/O error,
/// read-only, no answer: [`crate::store::health::classify`]) also turns the node read-only for Sends
/// until a write succeeds again; meanwhile one write is tried per `probe_interval`.
pub struct Writer {
    store: Arc<dyn Store>,
    relations: Arc<Relations>,
    router: mpsc::Sender<Vec<Delivery>>,
    receipts: Option<mpsc::Sender<ReadEvent>>,
    guard: Guard,
    metrics: Metrics,
    rx: mpsc::Receiver<WriteReq>,
    last: Arc<LastCommitted>,
    receipts_dropped: metrics::Counter,
    batch_max: usize,
    wait: Duration,
    /// How long a round of delivery cursors alone waits for a write to ride with.
    cursor_wait: Duration,
    /// When the fault in force started (for the log line when it clears).
    fault_since: Option<Instant>,
    /// When the store was last written to (a failing store gets one try per interval).
    last_try: Instant,
    round: Round,
}

impl Writer {
    /// A writer on `queue`'s end, wired to `w`.
    pub fn new(w: Wiring, queue: WriterQueue) -> Self {
        let batch_max = w.cfg.batch_max as usize;
        let beside = w.store.commits_side_by_side();
        Writer {
            store: w.store,
            relations: w.relations,
            router: w.router,
            receipts: w.receipts,
            guard: w.guard,
            metrics: w.metrics,
            rx: queue.rx,
            last: queue.last,
            receipts_dropped: metrics::counter!("im_receipts_dropped_total"),
            batch_max,
            wait: Duration::from_millis(w.cfg.batch_wait_ms as u64),
            cursor_wait: Duration::from_millis(w.cfg.cursor_wait_ms as u64),
            fault_since: None,
            last_try: Instant::now(),
            round: Round {
                sends: Vec::with_capacity(batch_max),
                cursors: Cursors::new(beside),
                ..Round::default()
            },
        }
    }

    /// The writer task. Ends when every [`PersistHandle`](super::PersistHandle) is
    /// dropped and the queue is empty, after committing what it holds.
    pub async fn run(mut self) {
        set_fault_gauges(None);
        loop {
            let Some(first) = self.first().await else {
                break;
            };
            if let Some(first) = first {
                self.gather(first).await;
            }
            self.metrics.persist_queue_depth.set(self.rx.len() as f64);
            if !self.may_write().await {
                continue;
            }
            self.commit_messages().await;
            self.commit_cursors_beside().await;
            self.commit_states().await;
            self.commit_groups().await;
            self.commit_hides().await;
            self.commit_presence().await;
            if !self.round.flushes.is_empty() {
                self.drain_cursors().await;
            }
            self.round.answer_flushes();
        }
        self.drain_cursors().await;
        tracing::info!("persistence writer stopped");
    }

    /// The round's first request: `None` when the queue is closed and empty,
    /// `Some(None)` when a failing store's probe interval passed with no request, when
    /// delivery cursors are left over and nothing is queued, or when the cursors'
    /// commit beside ended (its outcome recorded; the next share starts).
    async fn first(&mut self) -> Option<Option<WriteReq>> {
        if self.round.cursors.running() {
            tokio::select! {
                r = self.rx.recv() => return r.map(Some),
                outcome = self.round.cursors.finished() => {
                    self.record(outcome);
                    return Some(None);
                }
            }
        }
        // Cursors left over from the last commit (more than one commit carries) go now.
        if !self.round.cursors.is_empty() && self.guard.health.fault().is_none() {
            return Some(self.rx.try_recv().ok());
        }
        if self.guard.health.fault().is_none() {
            return self.rx.recv().await.map(Some);
        }
        match tokio::time::timeout(self.guard.probe_interval, self.rx.recv()).await {
            Ok(Some(r)) => Some(Some(r)),
            Ok(None) => None,
            Err(_) => Some(None),
        }
    }

    /// Fills the round after `first`: whatever is queued, then, while the batch has a
    /// Send and room (`persist.batch_max`), what arrives within `persist.batch_wait_ms`.
    /// A round of delivery cursors alone first waits for something to ride with.
    async fn gather(&mut self, first: WriteReq) {
        self.round.take(first);
        self.linger_cursors().await;
        let deadline = tokio::time::Instant::now() + self.wait;
        while self.round.sends.len() < self.batch_max {
            match self.rx.try_recv() {
                Ok(r) => self.round.take(r),
                Err(_) if self.wait.is_zero() || self.round.sends.is_empty() => break,
                Err(_) => match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(Some(r)) => self.round.take(r),
                    _ => break,
                },
            }
        }
    }

    /// While the round holds only delivery cursors, waits up to `persist.cursor_wait_ms`
    /// for any other request: at a steady one-to-one rate the DeliverAcks of one
    /// message then share the next Send's commit (one fsync, not two). Whatever
    /// arrives ends the wait at once, so nothing else waits for the cursors.
    async fn linger_cursors(&mut self) {
        if self.cursor_wait.is_zero() || self.round.cursors.beside() || !self.round.only_cursors() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.cursor_wait;
        while self.round.only_cursors() {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(r)) => self.round.take(r),
                _ => return,
            }
        }
    }

    /// Whether this round writes. A failing store gets one write per probe interval
    /// (the round's, or a probe when it has none); otherwise everything but the cursors
    /// is answered at once (Sends: OVERLOADED) and the round ends.
    async fn may_write(&mut self) -> bool {
        let Some(fault) = self.guard.health.fault() else {
            return true;
        };
        if self.last_try.elapsed() < self.guard.probe_interval {
            self.round.refuse(fault, &self.guard);
            return false;
        }
        self.last_try = Instant::now();
        if self.round.has_no_write() {
            let _ = self.write(self.store().probe_write()).await;
        }
        true
    }

    /// The one shape of every commit: `write` through the guard (bounded in time, its
    /// outcome recorded in the store's health).
    async fn write<T>(
        &mut self,
        write: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.guard.write(&mut self.fault_since, write).await
    }

    /// The store, for a write the caller hands to [`Writer::write`].
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Commits the batch's Sends and (unless they commit beside) a share of the delivery
    /// cursors in one transaction, then acks the Sends and hands the messages to the
    /// router; a failed commit acks nothing (the Sends are told to retry, the cursors
    /// wait for the next batch).
    async fn commit_messages(&mut self) {
        let cursors = self.round.cursors.for_messages();
        if self.round.sends.is_empty() && cursors.is_empty() {
            return;
        }
        self.last_try = Instant::now();
        self.recheck().await;
        let start = Instant::now();
        for s in &self.round.sends {
            self.metrics.stage(Stage::PersistWait, start - s.enqueued);
        }
        let messages: Vec<NewMessage> =
            self.round.sends.iter().map(|s| s.message.clone()).collect();
        let result = self
            .write(self.store().commit_batch(&messages, &cursors))
            .await;
        self.metrics.stage_since(Stage::PersistCommit, start);
        let end = Instant::now();
        let sends = &mut self.round.sends;
        for s in sends.iter_mut() {
            if let Some(tr) = s.trace.as_deref_mut() {
                tr.stage(Stage::PersistWait, s.enqueued, start);
                tr.stage(Stage::PersistCommit, start, end);
            }
        }
        self.metrics.persist_batch_size.record(sends.len() as f64);
        match result {
            Ok(committed) => {
                self.last.record(&committed);
                acked(sends, committed, &self.router).await
            }
            Err(e) => {
                self.round.cursors.restore(cursors);
                failed(&mut self.round.sends, &e, &self.guard);
            }
        }
    }

    /// Where cursors commit beside the messages: reaps the share that ended (its
    /// outcome recorded in the store's health) and starts the next. On a failing store
    /// this runs only in a round that may write, so a share is also the probe.
    async fn commit_cursors_beside(&mut self) {
        if self.round.cursors.ended() {
            let outcome = self.round.cursors.finished().await;
            self.record(outcome);
        }
        self.round.cursors.start(self.store.clone(), &self.guard);
    }

    /// Commits every delivery cursor waiting (a flush, or the writer's end): the share
    /// beside first, then the rest in shares, until one fails.
    async fn drain_cursors(&mut self) {
        if self.round.cursors.running() {
            let outcome = self.round.cursors.finished().await;
            self.record(outcome);
        }
        while !self.round.cursors.is_empty() {
            let share = self.round.cursors.take(CURSORS_PER_COMMIT);
            if let Err(e) = self.write(self.store().commit_batch(&[], &share)).await {
                tracing::warn!(error = %e, "delivery cursors left uncommitted");
                self.round.cursors.restore(share);
                return;
            }
        }
    }

    /// Records the outcome of a cursor commit beside in the store's health.
    fn record(&mut self, outcome: Option<Result<(), StoreError>>) {
        if let Some(outcome) = outcome {
            self.guard
                .record(outcome.as_ref().map(|_| ()), &mut self.fault_since);
        }
    }

    /// Brings the batch's group messages up to the membership cache as it is now (in
    /// cluster mode after reading stale groups again, within the write bound).
    async fn recheck(&mut self) {
        if self.relations.verifies_versions() {
            // A read past the write bound is given up: the cache stands for this batch.
            let refresh = refresh_stale(&*self.store, &self.relations, &self.round.sends);
            let _ = tokio::time::timeout(self.guard.unavailable_after, refresh).await;
        }
        recheck_groups(&self.relations, &mut self.round.sends);
    }

    /// Commits the round's MarkReads and conversation flags together, then answers each
    /// `Done` and hands the read cursors that moved to the receipt task.
    async fn commit_states(&mut self) {
        if self.round.states.is_empty() {
            return;
        }
        let states = &self.round.states;
        let reads: Vec<ReadUpdate> = states.iter().filter_map(|r| r.read.clone()).collect();
        let flags: Vec<FlagsUpdate> = states.iter().filter_map(|r| r.flags.clone()).collect();
        let result = self.write(self.store().commit_state(&reads, &flags)).await;
        match result {
            Ok(moved) => {
                self.receipts_for(moved);
                done_all(&mut self.round.states);
            }
            Err(e) => {
                tracing::warn!(error = %e, requests = self.round.states.len(), "read state commit failed");
                let mut refusal = Refusal::store(e);
                if refusal.retry_after_ms == 0 {
                    refusal.retry_after_ms = 500;
                }
                refuse_all(&mut self.round.states, &refusal);
            }
        }
    }

    /// Hands each read cursor that moved to the receipt task, with the connection whose
    /// MarkRead moved it (the last one); a full channel drops it (counted).
    fn receipts_for(&self, moved: Vec<ReadMoved>) {
        let Some(tx) = &self.receipts else {
            return;
        };
        let mut origin: HashMap<(&str, &str), u64> = HashMap::new();
        for r in &self.round.states {
            if let Some(u) = &r.read {
                origin.insert(
                    (u.user_id.as_str(), u.conversation_id.as_str()),
                    r.origin.conn_id,
                );
            }
        }
        for m in moved {
            let origin_conn = origin
                .get(&(m.user_id.as_str(), m.conversation_id.as_str()))
                .copied()
                .unwrap_or(0);
            let event = ReadEvent {
                moved: m,
                origin_conn,
            };
            if tx.try_send(event).is_err() {
                self.receipts_dropped.increment(1);
            }
        }
    }

    /// Commits the round's group changes one by one; each committed one patches the
    /// membership cache and sends its SYSTEM event before its requester hears back.
    async fn commit_groups(&mut self) {
        for (group_id, req, reply) in std::mem::take(&mut self.round.groups) {
            let result = self.write(self.store().group_change(&group_id, &req)).await;
            let result = match result {
                Ok(outcome) => {
                    group_committed(&self.relations, &self.router, &group_id, &outcome).await;
                    Ok(outcome.state)
                }
                Err(e) => Err(e),
            };
            let _ = reply.send(result);
        }
    }

    /// Commits the round's DeleteForMes together, then answers each `Done` (or the
    /// refusal).
    async fn commit_hides(&mut self) {
        if self.round.hides.is_empty() {
            return;
        }
        let rows: Vec<HiddenMessage> = self.round.hides.iter().map(|h| h.hidden.clone()).collect();
        let result = self.write(self.store().hide_messages(&rows)).await;
        match result {
            Ok(()) => done_all(&mut self.round.hides),
            Err(e) => refuse_all(&mut self.round.hides, &Refusal::store(e)),
        }
    }

    /// Commits the round's presence settings one by one, each answered with its outcome.
    async fn commit_presence(&mut self) {
        for (user_id, hidden, reply) in std::mem::take(&mut self.round.presence) {
            let result = self
                .write(self.store().set_presence_hidden(&user_id, hidden))
                .await;
            let _ = reply.send(result);
        }
    }
}

/// Patches the membership cache after a committed group change and hands its SYSTEM
/// event to the router.
async fn group_committed(
    relations: &Relations,
    router: &mpsc::Sender<Vec<Delivery>>,
    group_id: &str,
    outcome: &GroupOutcome,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_files_each_cursor_once_at_its_furthest_seq() {
        let mut r = Round::default();
        for seq in [3, 7, 5] {
            r.take(WriteReq::Cursor(crate::store::CursorUpdate {
                user_id: "u0".into(),
                device_id: "d".into(),
                conversation_id: "g:big".into(),
                seq,
            }));
        }
        assert!(r.only_cursors());
        let share = r.cursors.take(10);
        assert_eq!((share.len(), share[0].seq), (1, 7));
        assert!(r.has_no_write());
    }
}
