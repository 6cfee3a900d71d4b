//! Message traces: the stage timeline of one message (by msg_id) on this node. A message
//! is traced when its sender or one of its recipients is under a per-uid log filter
//! (`logfilter`), or when it
//! falls in the sample (`obs.trace_sample_rate`); the decision is [`Tracer::begin`], one
//! relaxed load and, while a filter is set, one map lookup. A traced message carries an
//! `Option<Box<Trace>>` (None when not traced) through the same points the stage probes
//! record at: decode, validate, relation, persist_wait, persist_commit, route, then per
//! recipient copy (up to `obs.trace_max_recipients` recipients, the rest counted)
//! queue_wait and write. Once the last copy is written or dropped the node's part goes
//! into a bounded store (`obs.trace_store_size`, oldest evicted), where the admin API
//! and the other nodes' trace requests (`cluster::trace`) read it. A node that receives
//! the message from another records its own route/queue_wait/write part under the same
//! msg_id, from the [`TraceContext`] the relay envelope carries.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::logfilter;
use super::Stage;

/// One recorded stage of a message on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Which stage.
    pub stage: Stage,
    /// Wall-clock start, nanoseconds since the Unix epoch.
    pub start_unix_ns: i64,
    /// How long it took.
    pub duration_ns: u64,
    /// The recipient, for the per-recipient stages (queue_wait, write).
    pub recipient: Option<Arc<str>>,
}

/// What one node recorded of one message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Part {
    /// The message id (32 hex digits).
    pub msg_id: String,
    /// The sender's user id.
    pub sender: String,
    /// The conversation id.
    pub conversation: String,
    /// The message's seq in its conversation (0 until committed).
    pub seq: u64,
    /// The stages, in the order they were recorded.
    pub spans: Vec<Span>,
    /// Recipients past `obs.trace_max_recipients`, whose stages were not recorded.
    pub recipients_omitted: u64,
}

/// What travels with a traced message to another node: enough for that node to file
/// its stages under the same message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// The message id.
    pub msg_id: String,
    /// The sender.
    pub sender: String,
    /// The conversation.
    pub conversation: String,
    /// The seq.
    pub seq: u64,
}

/// The trace of one message in flight on this node (boxed, so an untraced message
/// carries one null pointer).
#[derive(Debug)]
pub struct Trace {
    part: Part,
    base: Instant,
    base_unix_ns: i64,
}

fn unix_ns_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Trace {
    /// A trace whose clock starts at `started` (the Send's decode start).
    pub fn new(sender: &str, started: Instant) -> Self {
        let now = Instant::now();
        let base_unix_ns = unix_ns_now()
            .saturating_sub(i64::try_from(ns(now.saturating_duration_since(started))).unwrap_or(0));
        Trace {
            part: Part {
                sender: sender.to_owned(),
                ..Part::default()
            },
            base: started,
            base_unix_ns,
        }
    }

    /// The part of a message another node traces, as its envelope said.
    pub fn remote(ctx: &TraceContext) -> Self {
        Trace {
            part: Part {
                msg_id: ctx.msg_id.clone(),
                sender: ctx.sender.clone(),
                conversation: ctx.conversation.clone(),
                seq: ctx.seq,
                ..Part::default()
            },
            base: Instant::now(),
            base_unix_ns: unix_ns_now(),
        }
    }

    fn unix_ns(&self, at: Instant) -> i64 {
        match at.checked_duration_since(self.base) {
            Some(d) => self.base_unix_ns.saturating_add(ns(d) as i64),
            None => self
                .base_unix_ns
                .saturating_sub(ns(self.base.saturating_duration_since(at)) as i64),
        }
    }

    /// Records `stage` from `start` to `end`.
    pub fn stage(&mut self, stage: Stage, start: Instant, end: Instant) {
        self.recipient_stage(stage, start, end, None);
    }

    fn recipient_stage(
        &mut self,
        stage: Stage,
        start: Instant,
        end: Instant,
        recipient: Option<Arc<str>>,
    ) {
        let span = Span {
            stage,
            start_unix_ns: self.unix_ns(start),
            duration_ns: ns(end.saturating_duration_since(start)),
            recipient,
        };
        self.part.spans.push(span);
    }

    /// Names the message (msg_id and conversation are known at validation).
    pub fn set_message(&mut self, msg_id: &str, conversation: &str) {
        msg_id.clone_into(&mut self.part.msg_id);
        conversation.clone_into(&mut self.part.conversation);
    }

    /// Records the committed seq (and the msg_id the store answered, the first
    /// commit's for a duplicate).
    pub fn set_committed(&mut self, msg_id: &str, seq: u64) {
        msg_id.clone_into(&mut self.part.msg_id);
        self.part.seq = seq;
    }

    /// What another node needs to file its part under this message.
    pub fn context(&self) -> TraceContext {
        TraceContext {
            msg_id: self.part.msg_id.clone(),
            sender: self.part.sender.clone(),
            conversation: self.part.conversation.clone(),
            seq: self.part.seq,
        }
    }

    /// The part recorded so far.
    pub fn part(&self) -> &Part {
        &self.part
    }

    /// The part recorded, for filing (a trace no copy shares: a forwarded request's,
    /// a replication publish's).
    pub fn into_part(self) -> Part {
        self.part
    }
}

/// A trace shared by the copies of its message in the recipients' queues; the last
/// copy to go (written or dropped) files the part in the store.
pub struct Active {
    trace: Mutex<Trace>,
    tracer: Arc<Tracer>,
    recipients: AtomicUsize,
}

impl Active {
    /// Records a stage that is not per recipient (route).
    pub fn stage(&self, stage: Stage, start: Instant, end: Instant) {
        if let Ok(mut t) = self.trace.lock() {
            t.stage(stage, start, end);
        }
    }

    /// What another node needs to file its part under this message.
    pub fn context(&self) -> TraceContext {
        self.trace.lock().map(|t| t.context()).unwrap_or_default()
    }

    /// A copy for `recipient`'s queues, or `None` (counted) when the recipient cap is
    /// reached. Call once per recipient; every connection of theirs shares the copy.
    pub fn copy_for(self: &Arc<Self>, recipient: &str) -> Option<TraceCopy> {
        let max = self.tracer.max_recipients.load(Relaxed);
        if self.recipients.fetch_add(1, Relaxed) >= max {
            if let Ok(mut t) = self.trace.lock() {
                t.part.recipients_omitted += 1;
            }
            return None;
        }
        Some(TraceCopy {
            active: self.clone(),
            recipient: Arc::from(recipient),
        })
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let trace = match self.trace.get_mut() {
            Ok(t) => std::mem::take(&mut t.part),
            Err(p) => std::mem::take(&mut p.into_inner().part),
        };
        self.tracer.file(trace);
    }
}

/// One recipient's share of an [`Active`] trace, carried by each queued copy.
#[derive(Clone)]
pub struct TraceCopy {
    active: Arc<Active>,
    recipient: Arc<str>,
}

impl TraceCopy {
    /// Records a per-recipient stage (queue_wait, write).
    pub fn stage(&self, stage: Stage, start: Instant, end: Instant) {
        if let Ok(mut t) = self.active.trace.lock() {
            t.recipient_stage(stage, start, end, Some(self.recipient.clone()));
        }
    }
}

thread_local! {
    /// The sampler's xorshift state, per thread (seeded lazily).
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// A fast pseudo-random u64 (xorshift64*), good enough to pick a sample.
#[inline]
fn next_random() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        if x == 0 {
            x = ((unix_ns_now() as u64) ^ (r as *const Cell<u64> as u64)) | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// The sample threshold for a rate in 0..=1 (0: none, `u64::MAX`: all).
fn threshold(rate: f64) -> u64 {
    if rate <= 0.0 || rate.is_nan() {
        0
    } else if rate >= 1.0 {
        u64::MAX
    } else {
        (rate * u64::MAX as f64) as u64
    }
}

struct Store {
    parts: HashMap<String, Part>,
    order: VecDeque<String>,
}

/// The node's tracing decision, settings and store of completed parts (one per
/// process's `Metrics`, shared by every clone).
pub struct Tracer {
    threshold: AtomicU64,
    max_recipients: AtomicUsize,
    capacity: AtomicUsize,
    node: RwLock<Arc<str>>,
    store: Mutex<Store>,
    recorded: metrics::Counter,
}

/// Default `obs.trace_max_recipients`.
pub const DEFAULT_MAX_RECIPIENTS: usize = 64;
/// Default `obs.trace_store_size`.
pub const DEFAULT_STORE_SIZE: usize = 1024;

impl Default for Tracer {
    fn default() -> Self {
        let recorded = metrics::counter!("im_traces_recorded_total");
        recorded.absolute(0);
        Tracer {
            threshold: AtomicU64::new(0),
            max_recipients: AtomicUsize::new(DEFAULT_MAX_RECIPIENTS),
            capacity: AtomicUsize::new(DEFAULT_STORE_SIZE),
            node: RwLock::new(Arc::from("")),
            store: Mutex::new(Store {
                parts: HashMap::new(),
                order: VecDeque::new(),
            }),
            recorded,
        }
    }
}

impl Tracer {
    /// Applies the settings: this node's id, the sample rate (0..=1), the recipient cap
    /// and the store's size.
    pub fn configure(&self, node: &str, sample_rate: f64, max_recipients: usize, store: usize) {
        if let Ok(mut n) = self.node.write() {
            *n = Arc::from(node);
        }
        self.threshold.store(threshold(sample_rate), Relaxed);
        self.max_recipients.store(max_recipients, Relaxed);
        self.capacity.store(store.max(1), Relaxed);
    }

    /// This node's id, as its parts name it.
    pub fn node(&self) -> Arc<str> {
        self.node
            .read()
            .map_or_else(|_| Arc::from(""), |n| n.clone())
    }

    /// Whether a message from `sender` is traced: in the sample, or the sender is under
    /// a log filter. With sampling off and no filter set, one relaxed load of each.
    #[inline]
    pub fn wants(&self, sender: &str) -> bool {
        self.wants_message(sender, |_| false)
    }

    /// Whether a message from `sender` is traced: in the sample, or its sender or one of
    /// its recipients (`receives(uid)`, asked only of the filtered uids) is under a log
    /// filter. A filtered user's tail shows the messages they receive as well as those
    /// they send, and either line's trace must be found. With sampling off and no filter
    /// set, one relaxed load of each.
    #[inline]
    pub fn wants_message(&self, sender: &str, receives: impl Fn(&str) -> bool) -> bool {
        let t = self.threshold.load(Relaxed);
        if t != 0 && (t == u64::MAX || next_random() < t) {
            return true;
        }
        match logfilter::filtered_uids() {
            None => false,
            Some(levels) => levels.contains_key(sender) || levels.keys().any(|uid| receives(uid)),
        }
    }

    /// A new trace for a message from `sender` whose decode began at `started`, when
    /// [`Tracer::wants`] it; `None` otherwise.
    #[inline]
    pub fn begin(&self, sender: &str, started: Instant) -> Option<Box<Trace>> {
        self.begin_message(sender, |_| false, started)
    }

    /// A new trace for a message from `sender` to the users `receives` accepts, whose
    /// decode began at `started`, when [`Tracer::wants_message`] it; `None` otherwise.
    #[inline]
    pub fn begin_message(
        &self,
        sender: &str,
        receives: impl Fn(&str) -> bool,
        started: Instant,
    ) -> Option<Box<Trace>> {
        if self.wants_message(sender, receives) {
            Some(Box::new(Trace::new(sender, started)))
        } else {
            None
        }
    }

    /// Shares a trace among the copies of its message; the part is filed when the last
    /// holder lets go.
    pub fn activate(self: &Arc<Self>, trace: Trace) -> Arc<Active> {
        Arc::new(Active {
            trace: Mutex::new(trace),
            tracer: self.clone(),
            recipients: AtomicUsize::new(0),
        })
    }

    /// Files a finished part (merged with one already held for the same message).
    pub fn file(&self, part: Part) {
        if part.msg_id.is_empty() {
            return;
        }
        let cap = self.capacity.load(Relaxed);
        let Ok(mut store) = self.store.lock() else {
            return;
        };
        if let Some(held) = store.parts.get_mut(&part.msg_id) {
            held.spans.extend(part.spans);
            held.recipients_omitted += part.recipients_omitted;
            held.seq = held.seq.max(part.seq);
        } else {
            store.order.push_back(part.msg_id.clone());
            store.parts.insert(part.msg_id.clone(), part);
            while store.order.len() > cap {
                if let Some(old) = store.order.pop_front() {
                    store.parts.remove(&old);
                }
            }
        }
        drop(store);
        self.recorded.increment(1);
    }

    /// This node's part of `msg_id`, if held.
    pub fn get(&self, msg_id: &str) -> Option<Part> {
        self.store.lock().ok()?.parts.get(msg_id).cloned()
    }

    /// Parts held.
    pub fn held(&self) -> usize {
        self.store.lock().map_or(0, |s| s.parts.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tracer(cap: usize, max_recipients: usize) -> Arc<Tracer> {
        let t = Arc::new(Tracer::default());
        t.configure("n1", 0.0, max_recipients, cap);
        t
    }

    #[test]
    fn sampling_follows_the_rate() {
        let t = tracer(4, 4);
        assert!(!t.wants("u1"));
        t.configure("n1", 1.0, 4, 4);
        assert!(t.wants("u1"));
        t.configure("n1", 0.5, 4, 4);
        let hits = (0..10_000).filter(|_| t.wants("u1")).count();
        assert!((4_000..6_000).contains(&hits), "{hits}");
    }

    #[test]
    fn a_part_is_filed_when_the_last_copy_goes() {
        let t = tracer(4, 1);
        let started = Instant::now();
        let mut trace = Box::new(Trace::new("alice", started));
        trace.set_message("m1", "u:alice:bob");
        trace.stage(Stage::Validate, started, started + Duration::from_micros(3));
        trace.set_committed("m1", 7);
        let active = t.activate(*trace);
        let bob = active.copy_for("bob").expect("under the cap");
        assert!(active.copy_for("carol").is_none());
        active.stage(Stage::Route, started, started + Duration::from_micros(1));
        drop(active);
        assert!(t.get("m1").is_none(), "a copy is still queued");
        bob.stage(Stage::Write, started, started + Duration::from_micros(2));
        drop(bob);
        let part = t.get("m1").expect("filed");
        assert_eq!(part.seq, 7);
        assert_eq!(part.recipients_omitted, 1);
        assert_eq!(part.spans.len(), 3);
        assert_eq!(part.spans[2].recipient.as_deref(), Some("bob"));
        assert_eq!(part.spans[2].duration_ns, 2_000);
    }

    #[test]
    fn the_store_evicts_the_oldest() {
        let t = tracer(2, 1);
        for id in ["a", "b", "c"] {
            t.file(Part {
                msg_id: id.into(),
                ..Part::default()
            });
        }
        assert!(t.get("a").is_none());
        assert!(t.get("b").is_some() && t.get("c").is_some());
        assert_eq!(t.held(), 2);
    }
}
