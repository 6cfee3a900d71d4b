//! Multi-region replication (docs/multi-region.md): the publisher, which drains this
//! region's `region_outbox` (written in the home's commit transactions, `store::repl`)
//! in commit order into this region's JetStream stream `<prefix>-repl-<region>`
//! (placed in the region's own NATS cluster) with `Nats-Msg-Id =
//! <region>:<conversation>:<seq>`, deleting rows only after JetStream acked them, and
//! then the cursor moves of `region_cursor_outbox` (`store::repl_cursors`) as one
//! message per batch (header `Im-Repl-Kind: cursors`); and one applier per other region,
//! a durable pull consumer `<prefix>-apply-<region>` on that region's stream read by a
//! continuous pull (pull requests always outstanding, so a record does not wait for a
//! pull to cross the gateway), which applies each batch that arrived in one store
//! transaction through `store::repl` (the next seq of its conversation only, each
//! record under a savepoint: older ones are acked as duplicates, a gap or a failed
//! record is answered with a delayed NAK so JetStream redelivers it), acks, and then
//! pushes the stored messages to the recipients connected in this region through the
//! router (the ordinary delivery path); cursor batches are applied by max and the read
//! cursors that moved go to the receipts task. One node per region runs each role: the
//! holder of a Postgres advisory lock on the region's own database. Lag and link-state
//! gauges per region pair, from the consumer's counts taken every second, and the pairs
//! in the admin overview (through `region::RegionMap::lags`). Every record carries the
//! region list's digest (`region_list`); a record from a region whose list differs is
//! not applied (NAKed until the lists agree). Before a record is applied the epoch
//! fencing rule of home moves (`region_fence`) admits it; a home move's record is
//! recorded there. A traced record (`Record::traced`) gets its publish and its apply
//! recorded in the message's trace (`obs::trace`), and its push traced. Started only
//! when `region` is set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::obs::trace::{Trace, TraceContext};
use crate::obs::{Metrics, Stage};
use crate::region::{Lag, RegionMap};
use crate::region_fence::Admit;
use crate::route::receipts::ReadEvent;
use crate::route::{Delivery, Recipients, Router};
use crate::store::membership::Relations;
use crate::store::repl::{Applied, Record, Replication};
use crate::store::repl_cursors::{CursorBatch, CursorMove};
use crate::store::Store;

/// Records published per round (one outbox read, then every JetStream ack awaited).
const PUBLISH_BATCH: u32 = 256;
/// Most records one pull request asks for, and most records applied in one store
/// transaction.
const FETCH_BATCH: usize = 256;
/// How long one pull request of the continuous pull stays at the source.
const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// The idle heartbeat the source sends on an outstanding pull request.
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// The header that marks a message of a region's stream that is not a message record.
pub const KIND_HEADER: &str = "Im-Repl-Kind";
/// [`KIND_HEADER`]'s value on a batch of cursor moves.
pub const KIND_CURSORS: &str = "cursors";
/// Most records delivered and not yet acked per applier (JetStream holds the rest):
/// the bound on what a gap holds back.
pub const MAX_HELD: i64 = 1000;
/// How long JetStream waits for an ack before it redelivers.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// How long a record that waits for a gap (or a store that failed) waits before its
/// redelivery.
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// How long a record from a region whose list differs waits before its redelivery.
const LIST_RETRY_DELAY: Duration = Duration::from_secs(5);
/// How long JetStream remembers a `Nats-Msg-Id` (a republish within it is dropped).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long a region's stream keeps records (a region cut off for longer must be
/// rebuilt from a backup).
const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Most bytes of a published record (NATS' default `max_payload` is 1 MiB).
pub const MAX_RECORD_BYTES: usize = 900 * 1024;

/// A record's JSON. A group state too large for one record is left out (counted and
/// logged): the other regions keep the group's previous membership (docs/multi-region.md).
fn encode(rec: &Record) -> Result<Vec<u8>, String> {
    let body = serde_json::to_vec(rec).map_err(|e| e.to_string())?;
    if body.len() <= MAX_RECORD_BYTES || rec.group.is_none() {
        return Ok(body);
    }
    metrics::counter!("im_region_group_state_skipped_total").increment(1);
    tracing::warn!(
        conversation = ?rec.conversation_id,
        seq = rec.seq,
        bytes = body.len(),
        "a group's state is too large for one replication record; replicated without it"
    );
    let lean = Record {
        group: None,
        ..rec.clone()
    };
    serde_json::to_vec(&lean).map_err(|e| e.to_string())
}

/// The JetStream stream region `region` publishes its commits to.
pub fn stream_name(prefix: &str, region: &str) -> String {
    format!("{prefix}-repl-{region}")
}

/// The subject of that stream.
pub fn subject(prefix: &str, region: &str) -> String {
    format!("{prefix}.repl.{region}")
}

/// The durable consumer region `region` applies another region's stream with.
pub fn consumer_name(prefix: &str, region: &str) -> String {
    format!("{prefix}-apply-{region}")
}

/// What the replication tasks share.
pub struct Repl {
    map: Arc<RegionMap>,
    store: Arc<dyn Store>,
    router: Arc<Router>,
    relations: Arc<Relations>,
    js: jetstream::Context,
    /// The cluster prefix shared by every region (`cluster.prefix`).
    prefix: String,
    started: Instant,
    /// The receipts task: read cursors another region moved, once applied here.
    receipts: mpsc::Sender<ReadEvent>,
    /// The stage histograms and the message tracer.
    metrics: Metrics,
}

impl Repl {
    /// The replication of `map`'s region over `client`; `None` (logged) when the store
    /// cannot replicate (not Postgres: the config refuses that already).
    pub fn new(
        client: async_nats::Client,
        map: Arc<RegionMap>,
        store: Arc<dyn Store>,
        router: Arc<Router>,
        relations: Arc<Relations>,
        (prefix, metrics): (String, Metrics),
        receipts: mpsc::Sender<ReadEvent>,
    ) -> Option<Arc<Repl>> {
        let Some(r) = store.replication() else {
            tracing::error!("multi-region replication needs the Postgres store; not started");
            return None;
        };
        r.set_region_outbox(true);
        Some(Arc::new(Repl {
            map,
            store,
            router,
            relations,
            js: jetstream::new(client),
            prefix,
            started: Instant::now(),
            receipts,
            metrics,
        }))
    }

    /// Spawns the publisher and one applier per other region.
    pub fn spawn(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = vec![tokio::spawn(self.clone().publish())];
        for from in self.map.names.iter().filter(|n| **n != self.map.local) {
            tasks.push(tokio::spawn(self.clone().apply_from(from.clone())));
        }
        tasks
    }

    fn repl(&self) -> &dyn Replication {
        // `new` checked that the store has one.
        self.store
            .replication()
            .expect("a replicating store, checked by Repl::new")
    }

    /// The advisory lock key of role `role` in this region (the prefix keeps tests that
    /// share a database apart).
    fn lock_key(&self, role: &str) -> i64 {
        let text = format!("{}\n{}\n{role}", self.prefix, self.map.local);
        crate::region::weight("im-region-repl", &text) as i64
    }

    /// Waits until this node holds `role`'s lock; then the session that holds it.
    async fn lead(&self, role: &str) -> crate::store::repl::Leader {
        let key = self.lock_key(role);
        loop {
            match self.repl().lead(key).await {
                Ok(Some(l)) => {
                    tracing::info!(role, "this node runs region replication's role");
                    return l;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(role, error = %e, "region replication lock failed"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The publisher: this region's outbox into its stream, in order, forever.
    async fn publish(self: Arc<Self>) {
        let local = self.map.local.clone();
        loop {
            let mut leader = self.lead("publish").await;
            if let Err(e) = self.ensure_stream().await {
                tracing::warn!(error = %e, "region replication stream not ready");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            let mut checked = Instant::now();
            loop {
                if checked.elapsed() > Duration::from_secs(1) {
                    checked = Instant::now();
                    if !leader.alive().await {
                        break;
                    }
                    if let Ok(n) = self.repl().outbox_len().await {
                        metrics::gauge!("im_region_outbox_rows", "region" => local.clone())
                            .set(n as f64);
                    }
                }
                let round = match self.publish_round().await {
                    Ok(n) => self.publish_cursors().await.map(|c| n + c),
                    Err(e) => Err(e),
                };
                match round {
                    Ok(0) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Ok(_) => {}
                    Err(e) => {
                        metrics::counter!("im_region_publish_errors_total").increment(1);
                        tracing::warn!(error = %e, "region replication publish failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
    }

    /// Creates this region's stream if missing.
    async fn ensure_stream(&self) -> Result<(), String> {
        let local = &self.map.local;
        let config = stream::Config {
            name: stream_name(&self.prefix, local),
            subjects: vec![subject(&self.prefix, local)],
            max_age: MAX_AGE,
            duplicate_window: DUPLICATE_WINDOW,
            storage: stream::StorageType::File,
            num_replicas: 1,
            placement: Some(stream::Placement {
                cluster: Some(local.clone()),
                tags: Vec::new(),
            }),
            ..Default::default()
        };
        self.js
            .get_or_create_stream(config)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Publishes the oldest outbox rows and deletes them once every one is acked; how
    /// many rows went.
    async fn publish_round(&self) -> Result<usize, String> {
        let taken = Instant::now();
        let mut records = self
            .repl()
            .outbox_take(&self.map.local, PUBLISH_BATCH)
            .await
            .map_err(|e| e.to_string())?;
        crate::region_fence::stamp(&self.map, &mut records);
        if records.is_empty() {
            return Ok(0);
        }
        let subject = subject(&self.prefix, &self.map.local);
        let mut acks = Vec::with_capacity(records.len());
        for rec in &records {
            let body = encode(rec)?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", rec.msg_id_header().as_str());
            if let Some(sig) = self.map.sign(&body) {
                headers.insert(crate::region::SIG_HEADER, sig.as_str());
            }
            self.map.lists.headers(&mut headers);
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers, body.into())
                .await
                .map_err(|e| e.to_string())?;
            acks.push(ack);
        }
        let published = acks.len() as u64;
        let wait = async {
            for ack in acks {
                ack.await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .map_err(|_| "JetStream acks timed out".to_owned())??;
        let ids: Vec<i64> = records.iter().map(|r| r.outbox_id).collect();
        self.repl()
            .outbox_done(&ids)
            .await
            .map_err(|e| e.to_string())?;
        metrics::counter!("im_region_published_total", "region" => self.map.local.clone())
            .increment(published);
        self.published(&records, taken);
        Ok(records.len())
    }

    /// Records the publish stage of `records` (outbox read at `taken` to JetStream's
    /// ack) and files it in the traced ones' traces.
    fn published(&self, records: &[Record], taken: Instant) {
        let now = Instant::now();
        for rec in records {
            self.metrics.stage(Stage::ReplPublish, now - taken);
            if rec.traced {
                let mut t = Trace::remote(&context(rec));
                t.stage(Stage::ReplPublish, taken, now);
                self.metrics.tracer.file(t.into_part());
            }
        }
    }

    /// Publishes this region's unpublished cursor moves as one message (a batch of at
    /// most `repl_cursors::MAX_TAKE`) and forgets them once JetStream acked it; how
    /// many went. No `Nats-Msg-Id`: a republish is applied by max again, harmlessly.
    async fn publish_cursors(&self) -> Result<usize, String> {
        let moves = self
            .repl()
            .cursors_take(crate::store::repl_cursors::MAX_TAKE)
            .await
            .map_err(|e| e.to_string())?;
        if moves.is_empty() {
            return Ok(0);
        }
        let batch = CursorBatch {
            region: self.map.local.clone(),
            cursors: moves,
        };
        let body = serde_json::to_vec(&batch).map_err(|e| e.to_string())?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(KIND_HEADER, KIND_CURSORS);
        if let Some(sig) = self.map.sign(&body) {
            headers.insert(crate::region::SIG_HEADER, sig.as_str());
        }
        self.map.lists.headers(&mut headers);
        let subject = subject(&self.prefix, &self.map.local);
        let ack = self
            .js
            .publish_with_headers(subject, headers, body.into())
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(10), ack)
            .await
            .map_err(|_| "JetStream ack timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        self.repl()
            .cursors_done(&batch.cursors)
            .await
            .map_err(|e| e.to_string())?;
        let n = batch.cursors.len();
        metrics::counter!("im_region_cursors_published_total",
            "region" => self.map.local.clone())
        .increment(n as u64);
        Ok(n)
    }

    /// Applies a batch of `from`'s cursor moves (by max, in a transaction of its own),
    /// acks it and hands the read cursors that moved here to the receipts task. A
    /// malformed, misplaced or unsigned batch is dropped like a bad record.
    async fn apply_cursors(&self, from: &str, m: &jetstream::Message) {
        let batch: Option<CursorBatch> = serde_json::from_slice(&m.payload).ok();
        let Some(batch) = batch.filter(|b| {
            b.region == from
                && b.cursors.len() <= crate::store::repl_cursors::MAX_TAKE as usize
                && self.map.verify(&m.payload, signature(m))
        }) else {
            self.bad(from, m).await;
            return;
        };
        let moves: Vec<CursorMove> = batch.cursors;
        let labels = [("from", from.to_owned()), ("to", self.map.local.clone())];
        match self.repl().apply_cursors(&moves).await {
            Ok(moved) => {
                let _ = m.ack().await;
                metrics::counter!("im_region_cursors_applied_total", &labels)
                    .increment(moves.len() as u64);
                for moved in moved {
                    let event = ReadEvent {
                        moved,
                        origin_conn: 0,
                    };
                    if self.receipts.try_send(event).is_err() {
                        metrics::counter!("im_receipts_dropped_total").increment(1);
                    }
                }
            }
            Err(e) => {
                metrics::counter!("im_region_apply_errors_total", &labels).increment(1);
                tracing::warn!(error = %e, "applying replicated cursors failed; they come again");
                let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            }
        }
    }

    /// The applier of region `from`'s stream, forever: while this node holds the role,
    /// a continuous pull applied batch by batch, and the consumer's counts on a timer.
    async fn apply_from(self: Arc<Self>, from: String) {
        let role = format!("apply-{from}");
        loop {
            let mut leader = self.lead(&role).await;
            let watch = tokio::spawn(self.clone().watch(from.clone()));
            self.apply_led(&from, &mut leader).await;
            watch.abort();
        }
    }

    /// Applies `from`'s stream until this node loses the role.
    async fn apply_led(&self, from: &str, leader: &mut crate::store::repl::Leader) {
        let mut checked = Instant::now();
        let mut messages: Option<consumer::pull::Stream> = None;
        // Whether the last batch took longer than a heartbeat: a missed heartbeat
        // reported right after it is this node's delay, not the link's.
        let mut slow = false;
        loop {
            if checked.elapsed() > Duration::from_secs(1) {
                checked = Instant::now();
                if !leader.alive().await {
                    return;
                }
            }
            let Some(ms) = messages.as_mut() else {
                match self.pull(from).await {
                    Ok(m) => messages = Some(m),
                    Err(e) => {
                        tracing::debug!(from = %from, error = %e, "region stream not reachable");
                        self.link_down(from);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                continue;
            };
            let (batch, failed) = next_batch(ms, slow).await;
            let t = Instant::now();
            if !batch.is_empty() {
                self.apply_batch(from, batch).await;
            }
            slow = t.elapsed() > PULL_HEARTBEAT;
            if let Some(e) = failed {
                tracing::debug!(from = %from, error = %e, "region replication pull failed");
                self.link_down(from);
                messages = None;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            self.export_lag(from);
        }
    }

    /// Marks the link from `from` down (a pull or the consumer's counts failed).
    fn link_down(&self, from: &str) {
        self.lag(from, |l| {
            l.caught_up = false;
            l.link_up = false;
        });
        self.export_lag(from);
    }

    /// A continuous pull on this region's consumer of `from`'s stream: pull requests
    /// stay outstanding (a new one goes out when half of the last is delivered), so a
    /// record crosses the gateway once, without waiting for a pull of its own.
    async fn pull(&self, from: &str) -> Result<consumer::pull::Stream, String> {
        let c = self.consumer(from).await?;
        let stream = c
            .stream()
            .max_messages_per_batch(FETCH_BATCH)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages();
        tokio::time::timeout(Duration::from_secs(3), stream)
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())
    }

    /// The consumer's counts of `from`'s stream every second, while this node applies
    /// it: the lag gauges and the link state (a count that does not come back within
    /// 2 s marks the link down).
    async fn watch(self: Arc<Self>, from: String) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut consumer = None;
        loop {
            tick.tick().await;
            if consumer.is_none() {
                match self.consumer(&from).await {
                    Ok(c) => consumer = Some(c),
                    Err(_) => {
                        self.link_down(&from);
                        continue;
                    }
                }
            }
            let Some(c) = consumer.as_mut() else { continue };
            let info = tokio::time::timeout(Duration::from_secs(2), c.info()).await;
            match info {
                Ok(Ok(info)) => {
                    let (pending, held) = (info.num_pending, info.num_ack_pending);
                    self.counted(&from, pending, held);
                }
                _ => {
                    self.link_down(&from);
                    consumer = None;
                }
            }
        }
    }

    /// What the consumer's counts say: the link works, `pending + held` records are
    /// not applied yet.
    fn counted(&self, from: &str, pending: u64, held: usize) {
        let behind = pending + held as u64;
        metrics::gauge!("im_region_replication_held", "from" => from.to_owned(),
            "to" => self.map.local.clone())
        .set(held as f64);
        if held as i64 >= MAX_HELD {
            metrics::counter!("im_region_replication_held_full_total", "from" => from.to_owned())
                .increment(1);
        }
        self.lag(from, |l| {
            l.link_up = true;
            l.messages = behind;
            l.caught_up = behind == 0;
            if behind == 0 {
                l.caught_up_at = Some(Instant::now());
            }
        });
        self.export_lag(from);
    }

    /// This region's durable consumer on `from`'s stream (created when missing).
    async fn consumer(&self, from: &str) -> Result<consumer::PullConsumer, String> {
        tokio::time::timeout(Duration::from_secs(3), self.open_consumer(from))
            .await
            .map_err(|_| "timed out".to_owned())?
    }

    /// Looks up `from`'s stream and opens (or creates) this region's consumer on it.
    async fn open_consumer(&self, from: &str) -> Result<consumer::PullConsumer, String> {
        let stream = self
            .js
            .get_stream(stream_name(&self.prefix, from))
            .await
            .map_err(|e| e.to_string())?;
        let name = consumer_name(&self.prefix, &self.map.local);
        let config = consumer::pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: MAX_HELD,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        };
        stream
            .get_or_create_consumer(&name, config)
            .await
            .map_err(|e| e.to_string())
    }

    /// The record of a delivered message and what the fencing rule says of it
    /// (`region_fence::admit`), when it is one `from` may send: its own, of a
    /// conversation homed there at its epoch (region lists that disagree would let two
    /// regions write one conversation), signed, with a payload that decodes. Anything
    /// else is dropped, counted and logged, and terminated (never redelivered).
    async fn checked(&self, from: &str, m: &jetstream::Message) -> Option<(Record, Admit)> {
        let rec: Option<Record> = serde_json::from_slice(&m.payload).ok();
        let admitted = rec
            .filter(|r| r.payload_bytes().is_ok() && self.map.verify(&m.payload, signature(m)))
            .map(|r| {
                let admit = crate::region_fence::admit(&self.map, &r, from);
                (r, admit)
            });
        match admitted {
            Some((_, Admit::Foreign)) | None => {
                self.bad(from, m).await;
                None
            }
            Some(a) => Some(a),
        }
    }

    /// Whether `from`'s record `m` comes with `from`'s list agreeing with this region's
    /// (`region_list`); a record that does not is NAKed for a later redelivery.
    async fn list_agrees(&self, from: &str, m: &jetstream::Message) -> bool {
        use crate::region_list::Verdict;
        if self.map.lists.check_headers(from, m.headers.as_ref()) == Verdict::Agrees {
            return true;
        }
        let _ = m.ack_with(AckKind::Nak(Some(LIST_RETRY_DELAY))).await;
        false
    }

    /// Drops a bad record: counted, logged, terminated.
    async fn bad(&self, from: &str, m: &jetstream::Message) {
        metrics::counter!("im_region_bad_records_total", "from" => from.to_owned()).increment(1);
        tracing::warn!(from = %from, bytes = m.payload.len(),
            "malformed, misplaced, unsigned or not homed there: replication record dropped");
        let _ = m.ack_with(AckKind::Term).await;
    }

    /// Applies one pulled batch: its records in one store transaction, in delivery
    /// order (each under a savepoint); then acks or NAKs each, then pushes what was
    /// stored. Cursor batches are applied on their own (`apply_cursors`); a record the
    /// fencing rule holds back (a home move, a fenced or a waiting record) ends the run
    /// of records before it, which is applied first, so the order holds.
    async fn apply_batch(&self, from: &str, batch: Vec<jetstream::Message>) {
        let pending = batch
            .last()
            .and_then(|m| m.info().ok().map(|i| i.pending))
            .unwrap_or(0);
        let mut run = Vec::with_capacity(batch.len());
        let mut done = true;
        for m in batch {
            if !self.list_agrees(from, &m).await {
                done = false;
            } else if is_cursors(&m) {
                self.apply_cursors(from, &m).await;
            } else if let Some((rec, admit)) = self.checked(from, &m).await {
                if admit == Admit::Apply {
                    run.push((m, rec));
                } else {
                    done &= self.apply_run(from, std::mem::take(&mut run)).await;
                    done &= self.apply_home(from, &m, &rec, admit).await;
                }
            }
        }
        done &= self.apply_run(from, run).await;
        self.lag(from, |l| {
            l.messages = pending;
            l.caught_up &= done && pending == 0;
        });
    }

    /// Applies a run of admitted records in one store transaction (after the fence
    /// recheck of a moved conversation's), acks or NAKs each, then pushes what was
    /// stored; whether every one is done with.
    async fn apply_run(&self, from: &str, run: Vec<(jetstream::Message, Record)>) -> bool {
        let labels = [("from", from.to_owned()), ("to", self.map.local.clone())];
        let mut records = Vec::with_capacity(run.len());
        let mut delivered = Vec::with_capacity(run.len());
        let mut done = true;
        for (m, rec) in run {
            if let Err(e) = self.recheck(&rec).await {
                metrics::counter!("im_region_apply_errors_total", &labels).increment(1);
                tracing::warn!(error = %e, "rechecking a home move's fence failed; it comes again");
                let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                done = false;
                continue;
            }
            records.push(rec);
            delivered.push(m);
        }
        if records.is_empty() {
            return done;
        }
        let started = Instant::now();
        let outcomes = match self.repl().apply_batch(&records).await {
            Ok(o) => o,
            Err(e) => {
                metrics::counter!("im_region_apply_errors_total", &labels)
                    .increment(records.len() as u64);
                tracing::warn!(error = %e, records = records.len(),
                    "applying replicated records failed; they come again");
                for m in &delivered {
                    let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                }
                return false;
            }
        };
        let applied = (started, Instant::now());
        let mut stored = Vec::new();
        for ((m, rec), outcome) in delivered.iter().zip(records).zip(outcomes) {
            self.metrics.stage(Stage::ReplApply, applied.1 - applied.0);
            let settled = self.settle(&labels, &rec, outcome);
            done &= settled != Settled::Retry;
            let _ = if settled == Settled::Retry {
                m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await
            } else {
                m.ack().await
            };
            if settled == Settled::Stored {
                stored.push(rec);
            }
        }
        let n = stored.len() as u64;
        for rec in &stored {
            self.push(rec, applied).await;
        }
        self.lag(from, |l| l.applied += n);
        done
    }

    /// The fencing recheck of a moved conversation's record (`region_fence`).
    async fn recheck(&self, rec: &Record) -> Result<(), crate::store::StoreError> {
        match self.store.homes() {
            Some(h) => crate::region_fence::recheck_fence(&self.map, h, rec).await,
            None => Ok(()),
        }
    }

    /// A record the fencing rule holds back (`region_fence::admit`): a home move is
    /// recorded, a fenced record dropped (counted), one of an unknown epoch redelivered
    /// later; whether it is done with.
    async fn apply_home(
        &self,
        from: &str,
        m: &jetstream::Message,
        rec: &Record,
        admit: Admit,
    ) -> bool {
        let labels = [("from", from.to_owned()), ("to", self.map.local.clone())];
        match admit {
            Admit::Move(h) => {
                let applied = match self.store.homes() {
                    Some(homes) => {
                        crate::region_fence::apply_move(&self.map, homes, &rec.conversation_id, &h)
                            .await
                    }
                    None => Ok(()),
                };
                if let Err(e) = applied {
                    metrics::counter!("im_region_apply_errors_total", &labels).increment(1);
                    tracing::warn!(error = %e, "recording a home move failed; it comes again");
                    let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                    return false;
                }
            }
            Admit::Fenced => {
                metrics::counter!("im_region_fenced_total", &labels).increment(1);
                tracing::info!(from = %from, conversation = ?rec.conversation_id, seq = rec.seq,
                    epoch = rec.epoch, "a record of an older home epoch above its fence dropped");
            }
            _ => {
                metrics::counter!("im_region_apply_gaps_total", &labels).increment(1);
                let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                return false;
            }
        }
        let _ = m.ack().await;
        true
    }

    /// Counts one record's outcome and says what becomes of it.
    fn settle(
        &self,
        labels: &[(&'static str, String); 2],
        rec: &Record,
        outcome: Result<Applied, crate::store::StoreError>,
    ) -> Settled {
        match outcome {
            Ok(Applied::Stored) => {
                metrics::counter!("im_region_applied_total", labels).increment(1);
                Settled::Stored
            }
            Ok(Applied::Hole) => Settled::Done,
            Ok(Applied::Duplicate) => {
                metrics::counter!("im_region_apply_duplicates_total", labels).increment(1);
                Settled::Done
            }
            Ok(Applied::Gap(applied)) => {
                metrics::counter!("im_region_apply_gaps_total", labels).increment(1);
                tracing::debug!(conversation = ?rec.conversation_id, seq = rec.seq, applied,
                    "replicated message waits for a gap");
                Settled::Retry
            }
            Err(e) => {
                metrics::counter!("im_region_apply_errors_total", labels).increment(1);
                tracing::warn!(error = %e, conversation = ?rec.conversation_id, seq = rec.seq,
                    "applying a replicated message failed; it comes again");
                Settled::Retry
            }
        }
    }

    /// Pushes an applied message to its recipients connected in this region (the
    /// router's ordinary fan-out, to this node's sessions and the region's other nodes),
    /// traced from its apply (`applied`: start and end) when the record is.
    async fn push(&self, rec: &Record, applied: (Instant, Instant)) {
        let recipients = match im_proto::parse_conversation(&rec.conversation_id) {
            Some(im_proto::ConversationRef::Direct(a, b)) => {
                Recipients::Direct(a.to_owned(), b.to_owned())
            }
            Some(im_proto::ConversationRef::Group(g)) => {
                if let Some(s) = &rec.group {
                    self.relations.changed_elsewhere(g, s.version.max(0) as u64);
                }
                match self.relations.members(g).await {
                    Ok(Some(m)) => Recipients::Group(m),
                    _ => return,
                }
            }
            None => return,
        };
        let d = Delivery {
            message: rec.chat_message(),
            recipients,
            origin_conn: 0,
            started: Instant::now(),
            hint_only: false,
            trace: rec.traced.then(|| {
                let mut t = Box::new(Trace::remote(&context(rec)));
                t.stage(Stage::ReplApply, applied.0, applied.1);
                t
            }),
        };
        if let Some(f) = self.router.deliver(d) {
            self.router.forward(f).await;
        }
    }

    /// Changes the lag entry of `from`.
    fn lag(&self, from: &str, change: impl FnOnce(&mut Lag)) {
        if let Ok(mut lags) = self.map.lags.lock() {
            change(lags.entry(from.to_owned()).or_default());
        }
    }

    /// Sets the lag gauges of `from` -> this region.
    fn export_lag(&self, from: &str) {
        let Some(lag) = self.map.lags.lock().ok().and_then(|l| l.get(from).cloned()) else {
            return;
        };
        let labels = [("from", from.to_owned()), ("to", self.map.local.clone())];
        metrics::gauge!("im_region_replication_lag_messages", &labels).set(lag.messages as f64);
        metrics::gauge!("im_region_replication_lag_seconds", &labels)
            .set(lag.seconds(self.started));
        metrics::gauge!("im_region_link_up", &labels).set(if lag.link_up { 1.0 } else { 0.0 });
    }
}

/// What becomes of one applied record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Stored: acked, then pushed.
    Stored,
    /// A hole or a duplicate: acked.
    Done,
    /// A gap or a store error: NAKed, redelivered after [`RETRY_DELAY`].
    Retry,
}

/// The trace context of a traced record (its message, as the home committed it).
fn context(rec: &Record) -> TraceContext {
    TraceContext {
        msg_id: rec.msg_id.clone(),
        sender: rec.sender.clone(),
        conversation: rec.conversation_id.clone(),
        seq: rec.seq,
    }
}

/// The `Im-Region-Sig` header of a delivered message, if any.
fn signature(m: &jetstream::Message) -> Option<&str> {
    m.headers
        .as_ref()
        .and_then(|h| h.get(crate::region::SIG_HEADER))
        .map(|v| v.as_str())
}

/// Whether a delivered message is a batch of cursor moves (`KIND_HEADER`).
fn is_cursors(m: &jetstream::Message) -> bool {
    m.headers
        .as_ref()
        .and_then(|h| h.get(KIND_HEADER))
        .is_some_and(|v| v.as_str() == KIND_CURSORS)
}

/// The next batch of `ms`: waits up to a second for a first message, then takes what
/// has already arrived, up to [`FETCH_BATCH`] (no wait: under load the batch is what
/// arrived while the last one was applied). The error that ended it, if one did (the
/// messages before it are returned with it). A missed heartbeat right after a `slow`
/// batch is this node's delay and is passed over.
async fn next_batch(
    ms: &mut consumer::pull::Stream,
    mut slow: bool,
) -> (Vec<jetstream::Message>, Option<String>) {
    use futures_util::FutureExt as _;
    let mut batch = Vec::new();
    let first = loop {
        match tokio::time::timeout(Duration::from_secs(1), ms.next()).await {
            Err(_) => return (batch, None),
            Ok(None) => return (batch, Some("the pull ended".to_owned())),
            Ok(Some(Err(e)))
                if slow && e.kind() == consumer::pull::MessagesErrorKind::MissingHeartbeat =>
            {
                slow = false;
            }
            Ok(Some(Err(e))) => return (batch, Some(e.to_string())),
            Ok(Some(Ok(m))) => break m,
        }
    };
    batch.push(first);
    while batch.len() < FETCH_BATCH {
        match ms.next().now_or_never() {
            Some(Some(Ok(m))) => batch.push(m),
            Some(Some(Err(e))) => return (batch, Some(e.to_string())),
            Some(None) => return (batch, Some("the pull ended".to_owned())),
            None => break,
        }
    }
    (batch, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::repl::GroupSnapshot;

    fn record(members: usize) -> Record {
        Record {
            region: "a".into(),
            conversation_id: "g:crew".into(),
            seq: 7,
            msg_id: "m".into(),
            sender: String::new(),
            client_msg_id: None,
            msg_type: im_proto::MessageType::System as i32,
            payload: String::new(),
            send_time: 1,
            ref_seq: 0,
            ref_msg_id: None,
            state: 0,
            edit_time: 0,
            group: Some(GroupSnapshot {
                group_id: "crew".into(),
                created_by: "al".into(),
                created_at: 1,
                kind: 0,
                members_can_invite: 0,
                version: 7,
                dissolved: 0,
                size: members as i32,
                members: (0..members)
                    .map(|i| (format!("member{i:08}"), 1_733_500_000_000, 1))
                    .collect(),
                intervals: (0..members)
                    .map(|i| (format!("member{i:08}"), 7, None))
                    .collect(),
                bans: Vec::new(),
            }),
            hole: false,
            traced: false,
            epoch: 0,
            home: None,
            outbox_id: 1,
        }
    }

    #[test]
    fn a_record_keeps_its_group_state_unless_it_is_too_large() {
        let small = record(100);
        let back: Record = serde_json::from_slice(&encode(&small).unwrap()).unwrap();
        assert_eq!(back.group, small.group);
        assert_eq!(back.msg_id_header(), "a:g:crew:7");
        let large = record(50_000);
        let body = encode(&large).unwrap();
        assert!(body.len() <= MAX_RECORD_BYTES, "{}", body.len());
        let back: Record = serde_json::from_slice(&body).unwrap();
        assert_eq!((back.group, back.seq), (None, 7));
    }
}
