//! Event webhooks: what the node tells the application's backend (offline push,
//! messages, edits, recalls, presence, group changes), at least once and never slowing
//! the message path. This module owns the running state ([`Webhooks`]: the endpoints
//! with their signers, HTTP clients and figures, the outbox bound) and the admin
//! operations; `expand` turns committed messages of the outbox into per-endpoint events
//! (`message.offline` per offline recipient, with the collapse window), `send` delivers
//! them (bounded concurrency, timeout, retries with full-jitter backoff, parking),
//! `event` builds the JSON bodies. The durable queues are the store's
//! (`store::outbox`). Design and contract: docs/webhooks.md.

mod event;
mod expand;
mod send;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::config::{self, Config};
use crate::hooks::sign::Signer;
use crate::store::outbox::{NewEvent, OutboxCounts};
use crate::store::{Store, StoreError};

pub use expand::OnlineFn;

/// Presence events queued for the outbox at most (past it they are dropped, counted).
const PRESENCE_QUEUE: usize = 65_536;

/// Errors from starting the webhooks.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// An endpoint's secret file could not be used.
    #[error("config key `webhooks.endpoints[{index}].secret_file`: {message}")]
    Secret {
        /// The endpoint's index.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error("webhook HTTP client: {0}")]
    Client(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No endpoint has that name.
    #[error("no webhook endpoint named {0:?}")]
    NoEndpoint(String),
}

/// One endpoint as the node runs it.
pub struct Endpoint {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// The event kinds it gets.
    pub events: Vec<String>,
    signer: Signer,
    client: reqwest::Client,
    /// Its figures.
    pub stats: Stats,
    /// Wakes its sender (new events stored).
    wake: Notify,
}

/// One endpoint's figures since this node started.
#[derive(Default)]
pub struct Stats {
    /// Delivered.
    pub delivered: AtomicU64,
    /// Failed attempts.
    pub failed: AtomicU64,
    /// Parked.
    pub parked: AtomicU64,
    /// The last error (escaped) and when, ms.
    pub last_error: Mutex<(String, i64)>,
    /// Attempts and failures per 10-second slot of the last minute.
    window: Mutex<[(i64, u64, u64); 6]>,
}

impl Stats {
    /// Records an attempt's result.
    fn attempt(&self, ok: bool, error: Option<&str>) {
        let now = im_proto::now_ms();
        let slot = now / 10_000;
        if let Ok(mut w) = self.window.lock() {
            let s = &mut w[(slot % 6) as usize];
            if s.0 != slot {
                *s = (slot, 0, 0);
            }
            s.1 += 1;
            s.2 += u64::from(!ok);
        }
        if ok {
            self.delivered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let (Some(e), Ok(mut last)) = (error, self.last_error.lock()) {
            *last = (escape(e), now);
        }
    }

    /// Failed attempts over all attempts in the last minute, 0..1.
    pub fn failure_rate(&self) -> f64 {
        let now_slot = im_proto::now_ms() / 10_000;
        let (mut all, mut failed) = (0u64, 0u64);
        if let Ok(w) = self.window.lock() {
            for s in w.iter().filter(|s| now_slot - s.0 < 6) {
                all += s.1;
                failed += s.2;
            }
        }
        if all == 0 {
            0.0
        } else {
            failed as f64 / all as f64
        }
    }
}

/// `text` with control characters escaped (`obs::textlog`), cut to 300 bytes.
fn escape(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut cut = text.len().min(300);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let _ = crate::obs::textlog::Escaper(&mut out).write_str(&text[..cut]);
    out
}

/// The running webhooks of a node.
pub struct Webhooks {
    /// `[webhooks]`.
    pub config: config::Webhooks,
    /// This node's id (in every event and the lease owner).
    pub node_id: String,
    store: Arc<dyn Store>,
    /// The endpoints, in config order.
    pub endpoints: Vec<Arc<Endpoint>>,
    /// The outbox is at its bound: new events are stored parked.
    full: AtomicBool,
    counts: Mutex<OutboxCounts>,
    presence_tx: mpsc::Sender<(String, bool, i64)>,
    presence_rx: Mutex<Option<mpsc::Receiver<(String, bool, i64)>>>,
    presence_dropped: AtomicU64,
    last_count: AtomicI64,
}

impl Webhooks {
    /// The node's webhooks, or `None` when no endpoint is configured (then nothing
    /// runs and the message path writes nothing for them).
    pub fn new(
        config: &Config,
        node_id: &str,
        store: Arc<dyn Store>,
    ) -> Result<Option<Arc<Webhooks>>, WebhookError> {
        let w = &config.webhooks;
        if w.endpoints.is_empty() {
            return Ok(None);
        }
        let mut endpoints = Vec::with_capacity(w.endpoints.len());
        for (index, e) in w.endpoints.iter().enumerate() {
            endpoints.push(Arc::new(endpoint(index, e, w)?));
        }
        let (presence_tx, presence_rx) = mpsc::channel(PRESENCE_QUEUE);
        Ok(Some(Arc::new(Webhooks {
            config: w.clone(),
            node_id: node_id.to_owned(),
            store,
            endpoints,
            full: AtomicBool::new(false),
            counts: Mutex::default(),
            presence_tx,
            presence_rx: Mutex::new(Some(presence_rx)),
            presence_dropped: AtomicU64::new(0),
            last_count: AtomicI64::new(0),
        })))
    }

    /// Starts the tasks: the expander (when an endpoint wants message events), the
    /// presence writer, one sender per endpoint, the counter. They run until aborted.
    pub fn spawn(self: &Arc<Self>, online: OnlineFn) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.config.wants_messages() {
            tasks.push(tokio::spawn(expand::run(self.clone(), online)));
        }
        if let Some(rx) = self.presence_rx.lock().ok().and_then(|mut r| r.take()) {
            tasks.push(tokio::spawn(self.clone().presence_loop(rx)));
        }
        for e in &self.endpoints {
            tasks.push(tokio::spawn(send::run(self.clone(), e.clone())));
        }
        tasks.push(tokio::spawn(self.clone().count_loop()));
        tasks
    }

    /// Whether any endpoint wants `kind`.
    pub fn wants(&self, kind: &str) -> bool {
        self.endpoints
            .iter()
            .any(|e| e.events.iter().any(|k| k == kind))
    }

    /// A user's first connection here opened (`online`) or their last one closed: a
    /// `user.online` / `user.offline` event, queued for the outbox without waiting
    /// (dropped, counted in `im_webhook_presence_dropped_total`, when the queue is full).
    pub fn presence(&self, user: &str, online: bool) {
        let kind = if online {
            "user.online"
        } else {
            "user.offline"
        };
        if !self.wants(kind) {
            return;
        }
        let sent = self
            .presence_tx
            .try_send((user.to_owned(), online, im_proto::now_ms()));
        if sent.is_err() {
            self.presence_dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("im_webhook_presence_dropped_total").increment(1);
        }
    }

    /// Writes queued presence events to the outbox, in batches.
    async fn presence_loop(self: Arc<Self>, mut rx: mpsc::Receiver<(String, bool, i64)>) {
        let mut batch = Vec::new();
        while rx.recv_many(&mut batch, 512).await > 0 {
            let mut events = Vec::new();
            for (user, online, at) in batch.drain(..) {
                let kind = if online {
                    "user.online"
                } else {
                    "user.offline"
                };
                let body = event::user(&self.node_id, kind, &user, at);
                self.events_for(kind, &body, at, at, &mut events);
            }
            self.store_events(&events).await;
        }
    }

    /// Adds the event `body` (of `kind`) for every endpoint that wants it.
    fn events_for(
        &self,
        kind: &str,
        body: &event::Body,
        at: i64,
        due: i64,
        out: &mut Vec<NewEvent>,
    ) {
        for e in self
            .endpoints
            .iter()
            .filter(|e| e.events.iter().any(|k| k == kind))
        {
            out.push(self.new_event(&e.name, body.fresh(), at, due));
        }
    }

    /// One event row for endpoint `name`.
    fn new_event(&self, name: &str, body: event::Body, at: i64, due: i64) -> NewEvent {
        NewEvent {
            endpoint: name.to_owned(),
            event_id: body.id().to_owned(),
            kind: body.kind().to_owned(),
            body: body.json(),
            created_ms: at,
            next_ms: due,
            parked: self.full.load(Ordering::Relaxed),
        }
    }

    /// Stores events (retrying a failing store for a while: they exist nowhere else).
    async fn store_events(&self, events: &[NewEvent]) {
        if events.is_empty() {
            return;
        }
        for attempt in 0..30u32 {
            match self.store.outbox_expand(&[], events, &[]).await {
                Ok(_) => {
                    self.wake(events);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "storing webhook events failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        metrics::counter!("im_webhook_presence_dropped_total").increment(events.len() as u64);
    }

    /// Wakes the senders of the endpoints `events` are for.
    fn wake(&self, events: &[NewEvent]) {
        for e in &self.endpoints {
            if events.iter().any(|n| n.endpoint == e.name && !n.parked) {
                e.wake.notify_one();
            }
        }
    }

    /// Every second: the outbox's counts, the queue gauges, the bound.
    async fn count_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let counts = match self.store.outbox_counts().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "counting the webhook outbox failed");
                    continue;
                }
            };
            self.apply_counts(counts);
        }
    }

    /// Sets the gauges and the bound's state from `counts`.
    fn apply_counts(&self, counts: OutboxCounts) {
        let total = counts.events() + counts.sources;
        let max = u64::from(self.config.outbox_max);
        let full = total >= max;
        if self.full.swap(full, Ordering::Relaxed) != full {
            if full {
                tracing::error!(
                    total,
                    max,
                    "webhook outbox at webhooks.outbox_max: new events are stored parked"
                );
            } else {
                tracing::warn!(total, "webhook outbox below its bound again");
            }
        }
        metrics::gauge!("im_webhook_outbox_events").set(total as f64);
        metrics::gauge!("im_webhook_outbox_max").set(max as f64);
        for e in &self.endpoints {
            let (queued, parked) = counts
                .endpoints
                .iter()
                .find(|(n, _, _)| *n == e.name)
                .map_or((0, 0), |(_, q, p)| (*q, *p));
            metrics::gauge!("im_webhook_queued", "endpoint" => e.name.clone()).set(queued as f64);
            metrics::gauge!("im_webhook_parked", "endpoint" => e.name.clone()).set(parked as f64);
        }
        self.last_count.store(im_proto::now_ms(), Ordering::Relaxed);
        if let Ok(mut c) = self.counts.lock() {
            *c = counts;
        }
    }

    /// The admin API's view of the endpoints and the outbox.
    pub fn view(&self) -> im_admin_api::Webhooks {
        let counts = self.counts.lock().map(|c| c.clone()).unwrap_or_default();
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| {
                let (queued, parked) = counts
                    .endpoints
                    .iter()
                    .find(|(n, _, _)| *n == e.name)
                    .map_or((0, 0), |(_, q, p)| (*q, *p));
                let (last_error, last_error_at) = e
                    .stats
                    .last_error
                    .lock()
                    .map(|l| l.clone())
                    .unwrap_or_default();
                im_admin_api::WebhookEndpoint {
                    name: e.name.clone(),
                    url: config::redact_url(&e.url),
                    events: e.events.clone(),
                    queued,
                    parked,
                    delivered: e.stats.delivered.load(Ordering::Relaxed),
                    failed: e.stats.failed.load(Ordering::Relaxed),
                    failure_rate: e.stats.failure_rate(),
                    last_error,
                    last_error_at,
                }
            })
            .collect();
        im_admin_api::Webhooks {
            endpoints,
            outbox_pending: counts.sources,
            outbox_events: counts.events(),
            outbox_max: u64::from(self.config.outbox_max),
            outbox_full: self.full.load(Ordering::Relaxed),
        }
    }

    /// Parked events, oldest first (`endpoint` "": all), at most `limit`.
    pub async fn parked(
        &self,
        endpoint: &str,
        limit: u32,
    ) -> Result<im_admin_api::ParkedEvents, WebhookError> {
        let rows = self.store.events_parked(endpoint, limit + 1).await?;
        let more = rows.len() > limit as usize;
        let events = rows
            .into_iter()
            .take(limit as usize)
            .map(|r| im_admin_api::ParkedEvent {
                id: r.id,
                endpoint: r.endpoint,
                event_id: r.event_id,
                kind: r.kind,
                created_ms: r.created_ms,
                attempts: r.attempts,
                last_error: escape(&r.last_error),
            })
            .collect();
        Ok(im_admin_api::ParkedEvents { events, more })
    }

    /// Queues parked events again, due now with a new retry age.
    pub async fn redeliver(&self, endpoint: &str, ids: &[i64]) -> Result<u64, WebhookError> {
        if !endpoint.is_empty() && !self.endpoints.iter().any(|e| e.name == endpoint) {
            return Err(WebhookError::NoEndpoint(endpoint.to_owned()));
        }
        let queued = self.store.events_redeliver(endpoint, ids).await?;
        for e in &self.endpoints {
            e.wake.notify_one();
        }
        Ok(queued)
    }

    /// Sends a `webhook.test` event to endpoint `name` now (not queued).
    pub async fn test_fire(&self, name: &str) -> Result<im_admin_api::TestFired, WebhookError> {
        let e = self
            .endpoints
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| WebhookError::NoEndpoint(name.to_owned()))?;
        let body = event::test(&self.node_id, im_proto::now_ms());
        let started = std::time::Instant::now();
        let sent = send::post(e, body.id(), body.json().as_bytes(), &self.config).await;
        let (status, error) = match sent {
            Ok(status) => (status, String::new()),
            Err(send::Failure { status, error }) => (status, escape(&error)),
        };
        Ok(im_admin_api::TestFired {
            event_id: body.id().to_owned(),
            status,
            error,
            took_ms: started.elapsed().as_millis() as u64,
        })
    }
}

/// Builds endpoint `index` of the config: its secret (inline or from its file), its
/// HTTP client (timeout, no redirects, no proxy from the environment).
fn endpoint(
    index: usize,
    e: &config::Endpoint,
    w: &config::Webhooks,
) -> Result<Endpoint, WebhookError> {
    let secret = if e.secret_file.is_empty() {
        e.secret.clone()
    } else {
        let bad = |message: String| WebhookError::Secret { index, message };
        let path = std::path::Path::new(&e.secret_file);
        match crate::auth::read_secret(path) {
            Ok(Some(s)) if s.len() >= config::MIN_SECRET_BYTES => s,
            Ok(Some(s)) => {
                return Err(bad(format!(
                    "{}: the secret is {} bytes, at least {} are needed",
                    path.display(),
                    s.len(),
                    config::MIN_SECRET_BYTES
                )))
            }
            Ok(None) => return Err(bad(format!("{}: no such file", path.display()))),
            Err(err) => return Err(bad(err.to_string())),
        }
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(u64::from(w.timeout_ms)))
        .connect_timeout(Duration::from_millis(u64::from(w.timeout_ms)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(w.concurrency as usize)
        .user_agent(concat!("im-server/", env!("CARGO_PKG_VERSION")));
    let client = crate::hooks::tls::with_tls(client, &w.ca_file)
        .map_err(|err| WebhookError::Client(format!("webhooks.ca_file: {err}")))?
        .build()
        .map_err(|err| WebhookError::Client(err.to_string()))?;
    let stats = Stats::default();
    for (name, value) in [
        ("im_webhook_delivered_total", 0u64),
        ("im_webhook_failed_total", 0),
        ("im_webhook_parked_total", 0),
    ] {
        metrics::counter!(name, "endpoint" => e.name.clone()).absolute(value);
    }
    Ok(Endpoint {
        name: e.name.clone(),
        url: e.url.trim().to_owned(),
        events: e.events.clone(),
        signer: Signer::new(secret.as_bytes()),
        client,
        stats,
        wake: Notify::new(),
    })
}
