//! Live tail: an in-memory ring of the recent log events of filtered users, and the
//! subscribers that stream them (`GET /admin/v1/logs/tail`). Owns [`Tail`] (the ring,
//! bounded to `log.tail_ring_events`, and at most `log.max_tails` subscribers, each with
//! a bounded channel whose overflow is dropped and counted, never waited for) and
//! [`TailLayer`], the `tracing` layer that files events in it.
//!
//! An event is kept when it belongs to a uid under a filter (`logfilter`) and is at or
//! above that filter's level. Its uid is, in this order: the [`logfilter::as_uid`] scope
//! it was emitted in (the writer's and router's per-message events), its own `uid` field
//! (e.g. the admin API's `log filter set`), the connection it was emitted on. The layer
//! sits behind the outputs' `DiagFilter`, so it sees only events that reach the log files
//! (a `debug!` with a `uid` field outside a scope or connection does not); with no filter set it returns after one
//! relaxed load. Kept events carry their level, target, message, fields (at most
//! [`MAX_FIELDS`], each value cut at [`MAX_VALUE_CHARS`]) and a wall-clock timestamp.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::logfilter::{self, LogFilters};

/// Most fields kept per event (more are left out).
pub const MAX_FIELDS: usize = 32;
/// Longest field value or message kept, in characters (longer ones are cut, with `…`).
pub const MAX_VALUE_CHARS: usize = 2048;
/// Events each subscriber's channel holds before newer ones are dropped for it.
pub const SUBSCRIBER_QUEUE: usize = 1024;

/// One kept event.
#[derive(Debug, Clone, PartialEq)]
pub struct TailEvent {
    /// Position in the ring's history (1, 2, ...): gaps in one subscriber's stream are
    /// events of other users or dropped ones.
    pub seq: u64,
    /// Wall-clock time, Unix milliseconds.
    pub ts_ms: i64,
    /// Level rank: 1 (error) to 5 (trace).
    pub level: u8,
    /// The event's target (module path).
    pub target: &'static str,
    /// The user it belongs to.
    pub uid: Arc<str>,
    /// The message.
    pub message: String,
    /// The other fields, by name.
    pub fields: Map<String, Value>,
}

impl TailEvent {
    /// The level's name (`error` .. `trace`).
    pub fn level_name(&self) -> &'static str {
        logfilter::level_name(self.level)
    }
}

/// Too many tails are open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} log tails are open already (log.max_tails): close one or retry later")]
pub struct TailBusy(pub usize);

struct Ring {
    events: VecDeque<Arc<TailEvent>>,
    next_seq: u64,
}

struct Sub {
    id: u64,
    uid: Arc<str>,
    max_rank: u8,
    tx: mpsc::Sender<Arc<TailEvent>>,
    dropped: Arc<AtomicU64>,
}

/// The ring of recent events and the open subscriptions.
pub struct Tail {
    filters: Arc<LogFilters>,
    capacity: usize,
    max_subscribers: usize,
    queue: usize,
    /// Lock order: `ring`, then `subs`.
    ring: Mutex<Ring>,
    subs: Mutex<Vec<Sub>>,
    next_id: AtomicU64,
    kept: metrics::Counter,
    dropped: metrics::Counter,
    subscribers: metrics::Gauge,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tail {
    /// A ring of `capacity` events for the users `filters` has, serving at most
    /// `max_subscribers` tails at once, each with a queue of `queue` events.
    pub fn new(
        filters: Arc<LogFilters>,
        capacity: usize,
        max_subscribers: usize,
        queue: usize,
    ) -> Arc<Tail> {
        Arc::new(Tail {
            filters,
            capacity: capacity.max(1),
            max_subscribers,
            queue: queue.max(1),
            ring: Mutex::new(Ring {
                events: VecDeque::new(),
                next_seq: 1,
            }),
            subs: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            kept: metrics::counter!("im_log_tail_events_total"),
            dropped: metrics::counter!("im_log_tail_dropped_total"),
            subscribers: metrics::gauge!("im_log_tail_subscribers"),
        })
    }

    /// The ring's capacity in events (`log.tail_ring_events`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most tails at once (`log.max_tails`).
    pub fn max_subscribers(&self) -> usize {
        self.max_subscribers
    }

    /// Tails open now.
    pub fn subscribers(&self) -> usize {
        lock(&self.subs).len()
    }

    /// Events in the ring now.
    pub fn len(&self) -> usize {
        lock(&self.ring).events.len()
    }

    /// True when the ring holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files one event (its `seq` is assigned here) and hands it to each subscriber of
    /// its uid whose level it meets; a full subscriber queue drops it, counted.
    pub fn push(&self, mut ev: TailEvent) {
        let mut ring = lock(&self.ring);
        ev.seq = ring.next_seq;
        ring.next_seq += 1;
        let ev = Arc::new(ev);
        if ring.events.len() >= self.capacity {
            ring.events.pop_front();
        }
        ring.events.push_back(ev.clone());
        self.kept.increment(1);
        let subs = lock(&self.subs);
        for s in subs.iter() {
            if *s.uid == *ev.uid && ev.level <= s.max_rank && s.tx.try_send(ev.clone()).is_err() {
                s.dropped.fetch_add(1, Ordering::Relaxed);
                self.dropped.increment(1);
            }
        }
    }

    /// Opens a tail of `uid`'s events at or above `max_rank` (1 error .. 5 trace), with
    /// up to `backlog` of the ring's latest matching events first (no event is both in
    /// the backlog and the live part, none falls between them).
    pub fn subscribe(
        self: &Arc<Self>,
        uid: &str,
        max_rank: u8,
        backlog: usize,
    ) -> Result<Subscription, TailBusy> {
        let ring = lock(&self.ring);
        let mut subs = lock(&self.subs);
        if subs.len() >= self.max_subscribers {
            return Err(TailBusy(self.max_subscribers));
        }
        let mut past: Vec<Arc<TailEvent>> = ring
            .events
            .iter()
            .rev()
            .filter(|e| *e.uid == *uid && e.level <= max_rank)
            .take(backlog)
            .cloned()
            .collect();
        past.reverse();
        let (tx, rx) = mpsc::channel(self.queue);
        let dropped = Arc::new(AtomicU64::new(0));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        subs.push(Sub {
            id,
            uid: Arc::from(uid),
            max_rank,
            tx,
            dropped: dropped.clone(),
        });
        self.subscribers.set(subs.len() as f64);
        Ok(Subscription {
            tail: self.clone(),
            id,
            rx,
            dropped,
            backlog: past,
        })
    }

    fn unsubscribe(&self, id: u64) {
        let mut subs = lock(&self.subs);
        subs.retain(|s| s.id != id);
        self.subscribers.set(subs.len() as f64);
    }
}

/// One open tail; closing it (dropping it) removes the subscriber.
pub struct Subscription {
    tail: Arc<Tail>,
    id: u64,
    rx: mpsc::Receiver<Arc<TailEvent>>,
    dropped: Arc<AtomicU64>,
    backlog: Vec<Arc<TailEvent>>,
}

impl Subscription {
    /// The ring's matching events from before the subscription (taken once).
    pub fn take_backlog(&mut self) -> Vec<Arc<TailEvent>> {
        std::mem::take(&mut self.backlog)
    }

    /// The next live event (`None` never happens while the tail exists).
    pub async fn recv(&mut self) -> Option<Arc<TailEvent>> {
        self.rx.recv().await
    }

    /// The next live event if one is queued.
    pub fn try_recv(&mut self) -> Option<Arc<TailEvent>> {
        self.rx.try_recv().ok()
    }

    /// Events dropped for this subscriber since the last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.tail.unsubscribe(self.id);
    }
}

/// The layer that files filtered users' events in a [`Tail`]; installed behind the
/// outputs' `DiagFilter`.
pub struct TailLayer {
    tail: Arc<Tail>,
}

impl TailLayer {
    /// A layer filing into `tail`.
    pub fn new(tail: Arc<Tail>) -> Self {
        TailLayer { tail }
    }
}

/// Cuts `s` at [`MAX_VALUE_CHARS`] characters.
fn cut(mut s: String) -> String {
    if let Some((i, _)) = s.char_indices().nth(MAX_VALUE_CHARS) {
        s.truncate(i);
        s.push('…');
    }
    s
}

/// Collects an event's message, `uid` field and other fields.
#[derive(Default)]
struct Collect {
    message: String,
    uid: Option<String>,
    fields: Map<String, Value>,
}

impl Collect {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => {
                self.message = match value {
                    Value::String(s) => s,
                    v => v.to_string(),
                }
            }
            "uid" => {
                self.uid = Some(match value {
                    Value::String(s) => s,
                    v => v.to_string(),
                })
            }
            name if self.fields.len() < MAX_FIELDS => {
                self.fields.insert(name.to_owned(), value);
            }
            _ => {}
        }
    }
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(cut(value.to_owned())));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(cut(format!("{value:?}"))));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(
            field,
            serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number),
        );
    }
}

impl<S: Subscriber> Layer<S> for TailLayer {
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let filters = &self.tail.filters;
        if !filters.any_filter() {
            return;
        }
        let meta = event.metadata();
        let rank = logfilter::rank(meta.level());
        let mut c = Collect::default();
        event.record(&mut c);
        // The scope of `as_uid` first, then the event's own `uid`, then its connection.
        let (uid, level): (Arc<str>, u8) = if let Some(a) = logfilter::attributed_uid() {
            a
        } else if let Some(u) = c.uid.take() {
            match filters.level_of(&u) {
                Some(l) => (Arc::from(u), l),
                None => return,
            }
        } else if let Some(conn) = logfilter::conn_uid() {
            conn
        } else {
            return;
        };
        if rank > level {
            return;
        }
        self.tail.push(TailEvent {
            seq: 0,
            ts_ms: im_proto::now_ms(),
            level: rank,
            target: meta.target(),
            uid,
            message: cut(c.message),
            fields: c.fields,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::logfilter::{DiagFilter, LevelSpec};
    use std::time::Duration;
    use tracing_subscriber::layer::SubscriberExt;

    fn event(uid: &str, level: u8, n: u64) -> TailEvent {
        let mut fields = Map::new();
        fields.insert("n".into(), Value::from(n));
        TailEvent {
            seq: 0,
            ts_ms: 0,
            level,
            target: "test",
            uid: Arc::from(uid),
            message: format!("event {n}"),
            fields,
        }
    }

    fn filters() -> Arc<LogFilters> {
        LogFilters::new(LevelSpec::parse("info").expect("info parses"), true, 16)
    }

    #[test]
    fn ring_is_bounded_and_backlog_matches_uid_and_level() {
        let tail = Tail::new(filters(), 4, 2, 8);
        for n in 0..6 {
            tail.push(event(if n % 2 == 0 { "alice" } else { "bob" }, 4, n));
        }
        tail.push(event("alice", 1, 6));
        assert_eq!(tail.len(), 4);
        // The ring holds events 3..=6: alice's are 4 (debug) and 6 (error).
        let mut s = tail.subscribe("alice", 5, 10).unwrap();
        let b: Vec<u64> = s.take_backlog().iter().map(|e| e.seq).collect();
        assert_eq!(b, [5, 7]);
        let mut warn = tail.subscribe("alice", 2, 10).unwrap();
        assert_eq!(warn.take_backlog().len(), 1);
        assert_eq!(tail.subscribe("alice", 5, 0).err(), Some(TailBusy(2)));
        drop(warn);
        let mut one = tail.subscribe("alice", 5, 1).unwrap();
        assert_eq!(one.take_backlog()[0].seq, 7);
        // Live: only alice's, at the subscriber's level.
        tail.push(event("bob", 4, 7));
        tail.push(event("alice", 4, 8));
        assert_eq!(s.try_recv().map(|e| e.seq), Some(9));
        assert!(s.try_recv().is_none());
        drop(one);
        drop(s);
        assert_eq!(tail.subscribers(), 0);
    }

    #[test]
    fn a_slow_subscriber_loses_events_counted_and_keeps_the_rest() {
        let tail = Tail::new(filters(), 100, 2, 8);
        let mut slow = tail.subscribe("alice", 5, 0).unwrap();
        let mut fast = tail.subscribe("alice", 5, 0).unwrap();
        let mut got_fast = 0;
        for n in 0..20 {
            tail.push(event("alice", 4, n));
            while fast.try_recv().is_some() {
                got_fast += 1;
            }
        }
        assert_eq!(got_fast, 20);
        assert_eq!(fast.take_dropped(), 0);
        let mut got = Vec::new();
        while let Some(e) = slow.try_recv() {
            got.push(e.seq);
        }
        assert_eq!(
            got,
            (1..=8).collect::<Vec<u64>>(),
            "the oldest 8 were queued"
        );
        assert_eq!(slow.take_dropped(), 12);
        assert_eq!(slow.take_dropped(), 0, "taken once");
        tail.push(event("alice", 4, 20));
        assert_eq!(slow.try_recv().map(|e| e.seq), Some(21));
    }

    #[test]
    fn the_layer_keeps_filtered_users_events_only() {
        let f = filters();
        let tail = Tail::new(f.clone(), 100, 2, 100);
        let sub = tracing_subscriber::registry().with(
            TailLayer::new(tail.clone())
                .with_filter(DiagFilter::new(f.clone()))
                .boxed(),
        );
        let _g = tracing::subscriber::set_default(sub);
        tracing::info!(uid = "alice", "before any filter");
        assert!(tail.is_empty(), "nothing kept while no filter is set");
        f.set("alice", 4, Duration::from_secs(60)).unwrap();
        f.set("carol", 2, Duration::from_secs(60)).unwrap();
        tracing::callsite::rebuild_interest_cache();
        tracing::info!(uid = "alice", n = 1u64, big = %"x".repeat(5000), "explicit");
        // A debug event outside a scope does not reach the outputs: not kept either.
        tracing::debug!(uid = "alice", "explicit, unscoped");
        tracing::debug!(uid = "bob", "not filtered");
        tracing::info!(uid = "carol", "below carol's warn");
        tracing::trace!(uid = "alice", "below alice's debug");
        let alice: Arc<str> = Arc::from("alice");
        logfilter::as_uid(&alice, 4, || tracing::debug!(role = "sender", "attributed"));
        tracing::debug!("no uid at all");
        let kept: Vec<(String, String)> = {
            let ring = lock(&tail.ring);
            ring.events
                .iter()
                .map(|e| (e.uid.to_string(), e.message.clone()))
                .collect()
        };
        assert_eq!(
            kept,
            [
                ("alice".to_owned(), "explicit".to_owned()),
                ("alice".to_owned(), "attributed".to_owned())
            ]
        );
        let ring = lock(&tail.ring);
        let first = &ring.events[0];
        assert_eq!(first.level_name(), "info");
        assert_eq!(first.fields["n"], Value::from(1u64));
        assert_eq!(
            first.fields["big"].as_str().map(|s| s.chars().count()),
            Some(MAX_VALUE_CHARS + 1)
        );
        assert_eq!(ring.events[1].fields["role"], "sender");
    }
}
