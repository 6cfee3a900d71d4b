//! Multi-region replication (docs/multi-region.md): the publisher, which drains this
//! region's `region_outbox` (written in the home's commit transactions, `store::repl`)
//! in commit order into this region's JetStream stream `<prefix>-repl-<region>`
//! (placed in the region's own NATS cluster) with `Nats-Msg-Id =
//! <region>:<conversation>:<seq>`, deleting rows only after JetStream acked them; and
//! one applier per other region, a durable pull consumer `<prefix>-apply-<region>` on
//! that region's stream, which applies each record through `store::repl` (the next seq
//! of its conversation only: older ones are acked as duplicates, a gap is answered
//! with a delayed NAK so JetStream redelivers it) and then pushes it to the recipients
//! connected in this region through the router (the ordinary delivery path). One node
//! per region runs each role: the holder of a Postgres advisory lock on the region's
//! own database. Lag and link-state gauges per region pair, and the pairs in the admin overview
//! (through `region::RegionMap::lags`). Every record carries the region list's digest
//! (`region_list`); a record from a region whose list differs is not applied (NAKed
//! until the lists agree). A traced record (`Record::traced`) gets its publish and its
//! apply recorded in the message's trace (`obs::trace`), and its push traced.
//! Started only when `region` is set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures_util::StreamExt;
use tokio::task::JoinHandle;

use crate::obs::trace::{Trace, TraceContext};
use crate::obs::{Metrics, Stage};
use crate::region::{Lag, RegionMap};
use crate::region_fence::Admit;
use crate::route::{Delivery, Recipients, Router};
use crate::store::membership::Relations;
use crate::store::repl::{Applied, Record, Replication};
use crate::store::Store;

/// Records published per round (one outbox read, then every JetStream ack awaited).
const PUBLISH_BATCH: u32 = 256;
/// Most records one pull asks for.
const FETCH_BATCH: usize = 256;
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
                match self.publish_round().await {
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

    /// The applier of region `from`'s stream, forever.
    async fn apply_from(self: Arc<Self>, from: String) {
        let role = format!("apply-{from}");
        loop {
            let mut leader = self.lead(&role).await;
            let mut checked = Instant::now();
            let mut consumer = None;
            loop {
                if checked.elapsed() > Duration::from_secs(1) {
                    checked = Instant::now();
                    if !leader.alive().await {
                        break;
                    }
                }
                if consumer.is_none() {
                    match self.consumer(&from).await {
                        Ok(c) => consumer = Some(c),
                        Err(e) => {
                            tracing::debug!(from = %from, error = %e, "region stream not reachable");
                            self.lag(&from, |l| {
                                l.caught_up = false;
                                l.link_up = false;
                            });
                            self.export_lag(&from);
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    }
                }
                let Some(c) = &consumer else { continue };
                if let Err(e) = self.apply_round(&from, c).await {
                    tracing::debug!(from = %from, error = %e, "region replication fetch failed");
                    self.lag(&from, |l| {
                        l.caught_up = false;
                        l.link_up = false;
                    });
                    consumer = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                self.export_lag(&from);
            }
        }
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

    /// One pull of up to a second: applies each record as it comes, in order; then
    /// asks the consumer how far behind this region is.
    async fn apply_round(&self, from: &str, c: &consumer::PullConsumer) -> Result<(), String> {
        let mut batch = c
            .batch()
            .max_messages(FETCH_BATCH)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| e.to_string())?;
            let pending = m.info().map(|i| i.pending).unwrap_or(0);
            let done = self.apply_one(from, &m).await;
            self.lag(from, |l| {
                l.messages = pending;
                l.caught_up &= done && pending == 0;
            });
        }
        let mut c = c.clone();
        let info = tokio::time::timeout(Duration::from_secs(2), c.info())
            .await
            .map_err(|_| "consumer info timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let behind = info.num_pending + info.num_ack_pending as u64;
        metrics::gauge!("im_region_replication_held", "from" => from.to_owned(),
            "to" => self.map.local.clone())
        .set(info.num_ack_pending as f64);
        if info.num_ack_pending as i64 >= MAX_HELD {
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
        Ok(())
    }

    /// Applies one delivered record and acks it (or NAKs it for redelivery); whether
    /// it is done with (applied, a duplicate, or dropped as malformed).
    async fn apply_one(&self, from: &str, m: &jetstream::Message) -> bool {
        let sig = m
            .headers
            .as_ref()
            .and_then(|h| h.get(crate::region::SIG_HEADER))
            .map(|v| v.as_str());
        if !self.list_agrees(from, m).await {
            return false;
        }
        let rec: Option<Record> = serde_json::from_slice(&m.payload).ok();
        // A record is `from`'s own, of a conversation homed there (region lists that
        // disagree would let two regions write one conversation: dropped, loudly).
        let admit = match &rec {
            Some(r) if self.map.verify(&m.payload, sig) => {
                crate::region_fence::admit(&self.map, r, from)
            }
            _ => Admit::Foreign,
        };
        let rec = match (rec, admit) {
            (Some(r), Admit::Apply) => r,
            (Some(r), a @ (Admit::Move(_) | Admit::Fenced | Admit::Wait)) => {
                return self.apply_home(from, m, &r, a).await;
            }
            _ => {
                metrics::counter!("im_region_bad_records_total", "from" => from.to_owned())
                    .increment(1);
                tracing::warn!(from = %from, bytes = m.payload.len(),
                    "malformed, misplaced, unsigned or not homed there: replication record dropped");
                let _ = m.ack_with(AckKind::Term).await;
                return true;
            }
        };
        let fenced = match self.store.homes() {
            Some(h) => crate::region_fence::recheck_fence(&self.map, h, &rec).await,
            None => Ok(()),
        };
        let t = Instant::now();
        let outcome = match fenced {
            Ok(()) => self.repl().apply(&rec).await,
            Err(e) => Err(e),
        };
        let applied = (t, Instant::now());
        self.metrics.stage(Stage::ReplApply, applied.1 - applied.0);
        let labels = [("from", from.to_owned()), ("to", self.map.local.clone())];
        match outcome {
            Ok(Applied::Stored) => {
                metrics::counter!("im_region_applied_total", &labels).increment(1);
                self.lag(from, |l| l.applied += 1);
                self.push(&rec, applied).await;
                let _ = m.ack().await;
                true
            }
            Ok(Applied::Hole) => {
                let _ = m.ack().await;
                true
            }
            Ok(Applied::Duplicate) => {
                metrics::counter!("im_region_apply_duplicates_total", &labels).increment(1);
                let _ = m.ack().await;
                true
            }
            Ok(Applied::Gap(applied)) => {
                metrics::counter!("im_region_apply_gaps_total", &labels).increment(1);
                tracing::debug!(conversation = ?rec.conversation_id, seq = rec.seq, applied,
                    "replicated message waits for a gap");
                let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                false
            }
            Err(e) => {
                metrics::counter!("im_region_apply_errors_total", &labels).increment(1);
                tracing::warn!(error = %e, "applying a replicated message failed; it comes again");
                let _ = m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                false
            }
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

    /// A record the fencing rule holds back (`region_home::admit`): a home move is
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

/// The trace context of a traced record (its message, as the home committed it).
fn context(rec: &Record) -> TraceContext {
    TraceContext {
        msg_id: rec.msg_id.clone(),
        sender: rec.sender.clone(),
        conversation: rec.conversation_id.clone(),
        seq: rec.seq,
    }
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
