//! Multi-region home moves (docs/multi-region.md "Losing a region, moving a home,
//! reconciliation"): the map of moved homes on `region::RegionMap` (`region::Homes`)
//! kept current by polling `conversation_homes`; the operator's move ([`move_home`],
//! from the admin API; the old home's side of it on `im-region.<home>.home`); the
//! start-up gate (a node refuses Sends of its own homes until it has read every other
//! region's stream to its end once: `region::Homes::ready`); and reconciliation: the messages a region committed
//! above a move's fence, set aside by `store::homes`, re-sent to the new home with
//! their original msg_id (`im-region.<home>.reconcile`), which commits each once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;

use crate::config::Config;
use crate::pipeline::Pipeline;
use crate::region::{RegionMap, FORWARD_TIMEOUT, SIG_HEADER};
use crate::store::homes::{HomeStore, MoveReq, Moved};
use crate::store::repl::Record;
use crate::store::Store;

/// How often a node reads new `conversation_homes` rows (and retries the gate and the
/// re-sends).
const POLL: Duration = Duration::from_millis(500);
/// Most rows one poll reads.
const POLL_ROWS: u32 = 10_000;
/// Set-aside messages re-sent per round.
const RESEND_BATCH: u32 = 100;
/// How long a move waits for this region to apply the old home's seqs up to the fence.
const CATCH_UP: Duration = Duration::from_secs(10);

/// The subject where region `home`'s nodes take re-sent (reconciled) messages.
pub fn reconcile_subject(home: &str) -> String {
    format!("im-region.{home}.reconcile")
}

/// The subject where region `home`'s nodes take "stop being the home" requests.
pub fn stop_subject(home: &str) -> String {
    format!("im-region.{home}.home")
}

/// Why an operator's move was not made.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The request was wrong (the message says how).
    #[error("{0}")]
    Bad(String),
    /// The old home did not confirm (not forced) or the store refused: 409.
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// A move as the admin API reports it: the conversation, its home, epoch and fence,
/// and how many messages this region set aside.
pub type MoveDone = (String, String, u64, u64, u64);

/// The operator's move of `conversation` to this region (the new home): without
/// `force` the old home must confirm it stopped (and names its fence); with it the
/// fence is this region's applied seq. The move is recorded and published.
pub async fn move_home(
    map: &RegionMap,
    homes: &dyn HomeStore,
    conversation: &str,
    force: bool,
) -> Result<MoveDone, MoveError> {
    if im_proto::parse_conversation(conversation).is_none() {
        return Err(MoveError::Bad(format!(
            "{conversation:?} is not a conversation id (u:<a>:<b> or g:<group>)"
        )));
    }
    let old = map.home(conversation).to_owned();
    if old == map.local {
        return Err(MoveError::Bad(format!(
            "{conversation} is already homed in region {old}"
        )));
    }
    let epoch = map.homes.terms(conversation).last().map_or(0, |t| t.epoch) + 1;
    let fence = if force {
        None
    } else {
        Some(ask_stop(map, &old, conversation, epoch).await?)
    };
    let end = Instant::now() + CATCH_UP;
    loop {
        let req = MoveReq {
            epoch,
            region: &map.local,
            fence,
            resend: false,
            publish: true,
            local: &map.local,
        };
        match homes.record_move(conversation, req).await? {
            Moved::Done(row, aside) => {
                map.homes.learn(&map.names, conversation, &row.moved);
                metrics::counter!("im_region_home_moves_total", "forced" => force.to_string())
                    .increment(1);
                tracing::warn!(conversation = ?conversation, from = %old, epoch,
                    fence = row.moved.fence, forced = force, "conversation's home moved here");
                return Ok((
                    conversation.into(),
                    map.local.clone(),
                    epoch,
                    row.moved.fence,
                    aside,
                ));
            }
            Moved::Stale(newest) => {
                return Err(MoveError::Conflict(format!(
                    "{conversation} has epoch {newest} already; read it again and retry"
                )))
            }
            Moved::Behind(applied) if Instant::now() >= end => {
                return Err(MoveError::Conflict(format!(
                    "region {} has applied {conversation} to seq {applied}, below the fence {} \
                     region {old} gave; retry once replication caught up",
                    map.local,
                    fence.unwrap_or(0)
                )))
            }
            Moved::Behind(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Asks region `old` to stop being the home of `conversation` at `epoch`; its fence.
async fn ask_stop(
    map: &RegionMap,
    old: &str,
    conversation: &str,
    epoch: u64,
) -> Result<u64, MoveError> {
    let body = serde_json::json!({"conversation": conversation, "epoch": epoch,
        "region": map.local});
    let answer = request(map, stop_subject(old), body.to_string().into_bytes()).await;
    let unanswered = |why: String| {
        MoveError::Conflict(format!(
            "region {old}, the home of {conversation}, did not confirm the move ({why}); \
             if region {old} is lost, move it with \"force\": true"
        ))
    };
    let v = answer.map_err(unanswered)?;
    match v["fence"].as_u64() {
        Some(f) => Ok(f),
        None => Err(unanswered(
            v["error"].as_str().unwrap_or("no fence").to_owned(),
        )),
    }
}

/// A signed JSON request to another region; its JSON answer.
async fn request(
    map: &RegionMap,
    subject: String,
    body: Vec<u8>,
) -> Result<serde_json::Value, String> {
    let client = map.nats.get().ok_or("no NATS connection")?;
    let mut headers = async_nats::HeaderMap::new();
    if let Some(sig) = map.sign(&body) {
        headers.insert(SIG_HEADER, sig.as_str());
    }
    let m = tokio::time::timeout(
        FORWARD_TIMEOUT,
        client.request_with_headers(subject, headers, body.into()),
    )
    .await
    .map_err(|_| "timed out".to_owned())?
    .map_err(|e| e.to_string())?;
    if m.payload.len() > crate::region::MAX_FORWARD_BYTES {
        return Err(format!("answer of {} bytes", m.payload.len()));
    }
    serde_json::from_slice(&m.payload).map_err(|e| e.to_string())
}

/// What a node runs for home moves.
pub struct HomeTasks {
    /// The region map.
    pub map: Arc<RegionMap>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The pipeline (commits re-sent messages).
    pub pipeline: Arc<Pipeline>,
    /// The config (the session queue's marks).
    pub config: Arc<Config>,
    /// The cluster prefix shared by the regions.
    pub prefix: String,
    /// The NATS connection.
    pub client: async_nats::Client,
}

impl HomeTasks {
    /// Spawns the poller (map, gate, re-sends) and the two request handlers; none
    /// (and the gate open) when the store cannot replicate.
    pub fn spawn(self) -> Vec<tokio::task::JoinHandle<()>> {
        if self.store.replication().is_none() || self.store.homes().is_none() {
            self.map.homes.set_ready();
            return Vec::new();
        }
        let me = Arc::new(self);
        vec![
            tokio::spawn(me.clone().poll()),
            tokio::spawn(me.clone().serve(reconcile_subject(&me.map.local))),
            tokio::spawn(me.clone().serve(stop_subject(&me.map.local))),
        ]
    }

    fn homes(&self) -> Option<&dyn HomeStore> {
        self.store.homes()
    }

    /// Forever: new moves into the map, the start-up gate, the re-sends (on the node
    /// that holds the region's reconcile lock).
    async fn poll(self: Arc<Self>) {
        let js = jetstream::new(self.client.clone());
        let mut leader = None;
        loop {
            self.load().await;
            if !self.map.homes.ready() && self.caught_up(&js).await {
                self.load().await;
                self.map.homes.set_ready();
                tracing::info!("read every region's stream: serving this region's homes");
            }
            leader = self.resend_round(leader).await;
            tokio::time::sleep(POLL).await;
        }
    }

    /// Reads the moves recorded since the last read.
    async fn load(&self) {
        let Some(homes) = self.homes() else { return };
        let after = self.map.homes.cursor();
        match homes.homes_after(after, POLL_ROWS).await {
            Ok(rows) => {
                for r in &rows {
                    self.map
                        .homes
                        .learn(&self.map.names, &r.conversation_id, &r.moved);
                    self.map.homes.advance(r.id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading conversation_homes failed"),
        }
    }

    /// Whether this region's consumer of every other region's stream has nothing
    /// pending nor unacked (a stream that does not exist has published nothing).
    async fn caught_up(&self, js: &jetstream::Context) -> bool {
        let local = &self.map.local;
        for from in self.map.names.iter().filter(|n| *n != local) {
            let name = crate::region_repl::stream_name(&self.prefix, from);
            let stream =
                match tokio::time::timeout(Duration::from_secs(2), js.get_stream(name)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) if not_found(&e) => continue,
                    _ => return false,
                };
            let consumer = crate::region_repl::consumer_name(&self.prefix, local);
            let info = tokio::time::timeout(Duration::from_secs(2), stream.consumer_info(consumer));
            match info.await {
                Ok(Ok(i)) if i.num_pending == 0 && i.num_ack_pending == 0 => {}
                _ => return false,
            }
        }
        true
    }
}

/// Whether a stream lookup failed because there is no such stream.
fn not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

impl HomeTasks {
    /// One round of re-sends, on the holder of the region's reconcile lock (taken
    /// here when free); the lock's session for the next round.
    async fn resend_round(
        &self,
        leader: Option<crate::store::repl::Leader>,
    ) -> Option<crate::store::repl::Leader> {
        let repl = self.store.replication()?;
        let homes = self.store.homes()?;
        let alive = match leader {
            Some(mut l) => l.alive().await.then_some(l),
            None => None,
        };
        let leader = match alive {
            Some(l) => l,
            None => {
                let text = format!("{}\n{}\nreconcile", self.prefix, self.map.local);
                let key = crate::region::weight("im-region-repl", &text) as i64;
                repl.lead(key).await.ok().flatten()?
            }
        };
        let pending = match homes.reconcile_take(RESEND_BATCH).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "reading set-aside messages failed");
                return Some(leader);
            }
        };
        for (id, rec) in pending {
            if !self.resend(homes, id, &rec).await {
                break;
            }
        }
        Some(leader)
    }

    /// Re-sends one set-aside message to its conversation's home; whether it went.
    async fn resend(&self, homes: &dyn HomeStore, id: i64, rec: &Record) -> bool {
        let home = self.map.home(&rec.conversation_id).to_owned();
        if home == self.map.local {
            return false; // the move is not in this node's map yet
        }
        let body = match serde_json::to_vec(rec) {
            Ok(b) => b,
            Err(_) => return false,
        };
        let answer = request(&self.map, reconcile_subject(&home), body).await;
        let seq = match answer.as_ref().map(|v| v["seq"].as_u64()) {
            Ok(Some(seq)) => seq,
            other => {
                tracing::info!(home = %home, conversation = ?rec.conversation_id,
                    answer = ?other, "re-sending a set-aside message failed; retrying");
                return false;
            }
        };
        if let Err(e) = homes.reconcile_done(id, seq).await {
            tracing::warn!(error = %e, "marking a re-sent message failed; it goes again");
            return false;
        }
        metrics::counter!("im_region_reconciled_total").increment(1);
        tracing::warn!(conversation = ?rec.conversation_id, msg_id = %rec.msg_id,
            old_seq = rec.seq, new_seq = seq, home = %home,
            "reconciled: a message acked above a home move's fence, committed again at the new home");
        true
    }
}

/// Most requests one node handles at once on each subject.
const MAX_IN_FLIGHT: usize = 64;

impl HomeTasks {
    /// Takes requests on `subject` (a queue group of this region's nodes) until the
    /// subscription ends: re-sent messages or "stop being the home".
    async fn serve(self: Arc<Self>, subject: String) {
        let mut sub = match self
            .client
            .queue_subscribe(subject.clone(), "im-region-home".into())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(%subject, error = %e, "cannot take home-move requests");
                return;
            }
        };
        let resent = subject.ends_with(".reconcile");
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let sig = msg.headers.as_ref().and_then(|h| h.get(SIG_HEADER));
            if msg.payload.len() > crate::region::MAX_FORWARD_BYTES
                || !self.map.verify(&msg.payload, sig.map(|v| v.as_str()))
            {
                tracing::warn!(%subject, bytes = msg.payload.len(),
                    "home-move request too large or without a valid signature dropped");
                continue;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let answer = if resent {
                    me.take_resent(&msg.payload).await
                } else {
                    me.stop(&msg.payload).await
                };
                let body = answer.unwrap_or_else(|e| serde_json::json!({ "error": e }));
                let _ = me.client.publish(reply, body.to_string().into()).await;
                drop(permit);
            });
        }
    }

    /// Commits a re-sent message here, once: a msg_id already stored above this
    /// region's fence answers its seq.
    async fn take_resent(&self, payload: &[u8]) -> Result<serde_json::Value, String> {
        let rec: Record = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let conv = rec.conversation_id.as_str();
        let home = self.map.home(conv);
        let local = self.map.names.iter().position(|n| *n == self.map.local);
        let terms = self.map.homes.terms(conv);
        // Only a home taken over by a move takes re-sent messages (this node may not
        // know the move yet: the sender retries).
        if home != self.map.local || terms.last().map(|t| t.region) != local {
            return Err(format!(
                "{conv} is homed in region {home} (no move here known)"
            ));
        }
        if rec.hole || rec.home.is_some() || !im_proto::valid_id(&rec.sender) {
            return Err("not a message".into());
        }
        let above = terms
            .iter()
            .rev()
            .find(|t| Some(t.region) == local)
            .map_or(0, |t| t.fence);
        let homes = self.homes().ok_or("no replicating store")?;
        let stored = homes.seq_of(conv, &rec.msg_id, above).await;
        if let Some(seq) = stored.map_err(|e| e.to_string())? {
            return Ok(serde_json::json!({ "seq": seq, "duplicate": true }));
        }
        let marks = (
            self.config.flow.soft_mark_bytes,
            self.config.flow.hard_mark_bytes,
        );
        let seq = self.pipeline.commit_reconciled(&rec, marks).await?;
        Ok(serde_json::json!({ "seq": seq }))
    }

    /// The old home's side of a move that is not forced: records the move at its
    /// applied seq, which is the fence it answers; from then on it forwards.
    async fn stop(&self, payload: &[u8]) -> Result<serde_json::Value, String> {
        let v: serde_json::Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let (Some(conv), Some(epoch), Some(to)) = (
            v["conversation"].as_str(),
            v["epoch"].as_u64(),
            v["region"].as_str(),
        ) else {
            return Err("expected conversation, epoch and region".into());
        };
        if !self.map.names.iter().any(|n| n == to) || to == self.map.local {
            return Err(format!("region {to:?} cannot take {conv}"));
        }
        let terms = self.map.homes.terms(conv);
        let current = terms.last().map_or(0, |t| t.epoch);
        let done = terms.iter().find(|t| t.epoch == epoch);
        if let Some(t) = done.filter(|t| self.map.names[t.region] == to) {
            return Ok(serde_json::json!({ "fence": t.fence }));
        }
        if self.map.home(conv) != self.map.local || epoch != current + 1 {
            return Err(format!(
                "region {} is not the home of {conv} at epoch {current}",
                self.map.local
            ));
        }
        let homes = self.homes().ok_or("no replicating store")?;
        let req = MoveReq {
            epoch,
            region: to,
            fence: None,
            resend: true,
            publish: false,
            local: &self.map.local,
        };
        match homes
            .record_move(conv, req)
            .await
            .map_err(|e| e.to_string())?
        {
            Moved::Done(row, _) => {
                self.map.homes.learn(&self.map.names, conv, &row.moved);
                tracing::warn!(conversation = ?conv, to = %to, epoch, fence = row.moved.fence,
                    "this region stopped being a conversation's home");
                Ok(serde_json::json!({ "fence": row.moved.fence }))
            }
            Moved::Stale(newest) => Err(format!("{conv} has epoch {newest} already")),
            Moved::Behind(applied) => Err(format!("applied only to {applied}")),
        }
    }
}
