//! The sender of one endpoint: claims due events (a lease per claim, so in a cluster
//! each event is sent by one node and a dead node's events are taken over when the
//! lease ends), POSTs each signed, at most `webhooks.concurrency` at a time, each
//! within `webhooks.timeout_ms`, and records the outcomes in batches: delivered (2xx,
//! the row goes), retried after a full-jitter exponential backoff, or parked once the
//! event is older than `webhooks.max_age_secs`. It runs beside the message path and
//! shares nothing with it but the store.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::task::JoinSet;

use super::{Endpoint, Webhooks};
use crate::config;
use crate::hooks::sign::{HEADER_EVENT_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use crate::store::outbox::{Claimed, Outcome};

/// The wait between claims when nothing is due (a new event wakes the sender sooner).
const IDLE: Duration = Duration::from_millis(200);
/// A claim's lease beyond the request timeout, ms (covers recording the outcome; after
/// it another node may send the event again).
const LEASE_SLACK_MS: i64 = 10_000;

/// A failed request.
#[derive(Debug)]
pub(super) struct Failure {
    /// The HTTP status (0: no answer).
    pub status: u16,
    /// What went wrong.
    pub error: String,
}

/// Events claimed ahead per request slot (claims and outcome writes come in batches).
const PREFETCH: usize = 4;
/// Longest wait before outcomes are written, so they are written in batches.
const SETTLE_EVERY: Duration = Duration::from_millis(50);

/// Runs endpoint `e`'s sender until aborted: at most `concurrency` requests in flight,
/// up to `PREFETCH` times as many events claimed ahead (their lease covers the wait), the
/// outcomes written in batches. After `concurrency` failures in a row the endpoint counts
/// as down: no claims for a backoff (doubling per trip, capped at
/// `webhooks.retry_max_ms`), so a dead endpoint costs a few store writes a second.
pub(super) async fn run(hooks: Arc<Webhooks>, e: Arc<Endpoint>) {
    let cfg = hooks.config.clone();
    let limit = cfg.concurrency as usize;
    let ahead = limit * PREFETCH;
    let lease = i64::from(cfg.timeout_ms) * (1 + PREFETCH as i64) + LEASE_SLACK_MS;
    let mut queue: std::collections::VecDeque<Claimed> = std::collections::VecDeque::new();
    let mut inflight: JoinSet<Outcome> = JoinSet::new();
    let mut outcomes = Vec::new();
    let mut settle_at: Option<Instant> = None;
    let mut idle = false;
    let mut health = Health::default();
    loop {
        let paused = health.paused();
        if queue.len() < limit && !idle && paused.is_none() {
            let want = (ahead + limit).saturating_sub(queue.len() + inflight.len()) as u32;
            match hooks
                .store
                .events_claim(&e.name, &hooks.node_id, lease, want)
                .await
            {
                Ok(claimed) => {
                    idle = claimed.is_empty();
                    queue.extend(claimed);
                }
                Err(err) => {
                    tracing::warn!(endpoint = %e.name, error = %err, "claiming webhook events failed");
                    idle = true;
                }
            }
        }
        while inflight.len() < limit && paused.is_none() {
            let Some(c) = queue.pop_front() else { break };
            inflight.spawn(attempt(e.clone(), cfg.clone(), c));
        }
        let wait = match settle_at {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => paused.unwrap_or(IDLE).min(IDLE),
        };
        let sleeping = idle || paused.is_some() || settle_at.is_some() || inflight.is_empty();
        tokio::select! {
            Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                if let Ok(o) = done {
                    outcomes.push(o);
                }
                while let Some(done) = inflight.try_join_next() {
                    if let Ok(o) = done {
                        outcomes.push(o);
                    }
                }
            }
            _ = e.wake.notified(), if idle && paused.is_none() => idle = false,
            _ = tokio::time::sleep(wait), if sleeping => idle = false,
        }
        if !outcomes.is_empty() {
            let due = *settle_at.get_or_insert_with(|| Instant::now() + SETTLE_EVERY);
            let drained = inflight.is_empty() && queue.is_empty();
            if outcomes.len() >= ahead || Instant::now() >= due || drained {
                health.record(&outcomes, &cfg);
                settle(&hooks, &e, &mut outcomes).await;
                settle_at = None;
                idle = false;
            }
        }
        if paused.is_some() && !queue.is_empty() {
            // Down: give the claimed events back at once (due again after the pause).
            let back: Vec<Outcome> = queue
                .drain(..)
                .map(|c| Outcome::Retry {
                    id: c.id,
                    next_ms: im_proto::now_ms() + paused.map_or(0, |p| p.as_millis() as i64),
                    error: "the endpoint is paused after repeated failures".into(),
                })
                .collect();
            let mut back = back;
            settle(&hooks, &e, &mut back).await;
        }
    }
}

/// Whether an endpoint looks down: failures in a row, and the pause they caused.
#[derive(Default)]
struct Health {
    streak: usize,
    trips: u32,
    until: Option<Instant>,
}

impl Health {
    /// How long claims still wait, if paused.
    fn paused(&mut self) -> Option<Duration> {
        let left = self.until?.checked_duration_since(Instant::now());
        if left.is_none() {
            self.until = None;
        }
        left
    }

    /// Counts outcomes; a success ends a pause streak, `concurrency` failures in a row
    /// start a pause.
    fn record(&mut self, outcomes: &[Outcome], cfg: &config::Webhooks) {
        for o in outcomes {
            match o {
                Outcome::Delivered(_) => {
                    self.streak = 0;
                    self.trips = 0;
                }
                _ => self.streak += 1,
            }
        }
        if self.streak >= cfg.concurrency as usize {
            self.streak = 0;
            self.trips = (self.trips + 1).min(30);
            let ms = u64::from(cfg.retry_base_ms)
                .saturating_mul(1 << self.trips)
                .min(u64::from(cfg.retry_max_ms));
            self.until = Some(Instant::now() + Duration::from_millis(ms));
        }
    }
}

/// Records outcomes (retrying the store; on a lasting failure the leases run out and
/// the events are sent again: at least once).
async fn settle(hooks: &Webhooks, e: &Endpoint, outcomes: &mut Vec<Outcome>) {
    for _ in 0..5 {
        match hooks.store.events_settle(outcomes).await {
            Ok(()) => {
                outcomes.clear();
                return;
            }
            Err(err) => {
                tracing::warn!(endpoint = %e.name, error = %err, "recording webhook outcomes failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    outcomes.clear();
}

/// One attempt at one event, and what becomes of it.
async fn attempt(e: Arc<Endpoint>, cfg: config::Webhooks, c: Claimed) -> Outcome {
    let started = Instant::now();
    let sent = post(&e, &c.event_id, c.body.as_bytes(), &cfg).await;
    metrics::histogram!("im_webhook_delivery_seconds", "endpoint" => e.name.clone())
        .record(started.elapsed().as_secs_f64());
    match sent {
        Ok(_) => {
            e.stats.attempt(true, None);
            metrics::counter!("im_webhook_delivered_total", "endpoint" => e.name.clone())
                .increment(1);
            Outcome::Delivered(c.id)
        }
        Err(f) => {
            e.stats.attempt(false, Some(&f.error));
            metrics::counter!("im_webhook_failed_total", "endpoint" => e.name.clone()).increment(1);
            let now = im_proto::now_ms();
            let error = super::escape(&f.error);
            if now - c.created_ms >= i64::from(cfg.max_age_secs) * 1000 {
                e.stats.parked.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("im_webhook_parked_total", "endpoint" => e.name.clone())
                    .increment(1);
                tracing::warn!(endpoint = %e.name, event_id = %c.event_id, kind = %c.kind,
                    attempts = c.attempts + 1, error = %error, "webhook event parked");
                Outcome::Park { id: c.id, error }
            } else {
                Outcome::Retry {
                    id: c.id,
                    next_ms: now + backoff_ms(&cfg, c.attempts),
                    error,
                }
            }
        }
    }
}

/// Full jitter: a uniform delay in 0..=min(max, base * 2^attempts), ms.
fn backoff_ms(cfg: &config::Webhooks, attempts: u32) -> i64 {
    let cap = u64::from(cfg.retry_base_ms)
        .saturating_mul(1u64 << attempts.min(30))
        .min(u64::from(cfg.retry_max_ms));
    rand::thread_rng().gen_range(0..=cap) as i64
}

/// POSTs one signed body; `Ok(status)` for a 2xx answer.
pub(super) async fn post(
    e: &Endpoint,
    event_id: &str,
    body: &[u8],
    cfg: &config::Webhooks,
) -> Result<u16, Failure> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let request = e
        .client
        .post(&e.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(HEADER_EVENT_ID, event_id)
        .header(HEADER_TIMESTAMP, ts.to_string())
        .header(HEADER_SIGNATURE, e.signer.sign(ts, body))
        .body(body.to_vec());
    let mut response = request.send().await.map_err(|err| Failure {
        status: 0,
        error: error_text(&err),
    })?;
    let status = response.status().as_u16();
    // Read (a bounded part of) the answer, so the connection can be reused.
    let mut head = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = (cfg.max_response_bytes as usize).saturating_sub(head.len());
        head.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room == 0 {
            break;
        }
    }
    if (200..300).contains(&status) {
        return Ok(status);
    }
    let text = String::from_utf8_lossy(&head[..head.len().min(200)]).into_owned();
    Err(Failure {
        status,
        error: format!("HTTP {status}: {text}"),
    })
}

/// A request error's text with its causes (reqwest's own text is terse).
fn error_text(err: &reqwest::Error) -> String {
    let mut text = if err.is_timeout() {
        "timed out".to_owned()
    } else if err.is_connect() {
        "connect failed".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_full_jitter() {
        let cfg = config::Webhooks {
            retry_base_ms: 100,
            retry_max_ms: 1000,
            ..Default::default()
        };
        for attempts in 0..40 {
            let d = backoff_ms(&cfg, attempts);
            assert!((0..=1000).contains(&d), "{attempts}: {d}");
            if attempts == 0 {
                assert!(d <= 100);
            }
        }
    }
}
