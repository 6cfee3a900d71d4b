//! Measurement plumbing: latency histograms sharded across tasks (HdrHistogram,
//! microseconds, 3 significant digits), event counters, error counters by code, and the
//! percentile summaries the reports print.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use im_proto::{Body, ErrorCode, Frame};
use serde::Serialize;

/// Highest latency a histogram tracks exactly (60 s); larger values are clamped to it.
pub const MAX_TRACKED_US: u64 = 60_000_000;

fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("valid histogram bounds")
}

/// A latency histogram split into shards so many tasks can record with little lock
/// contention; each task records into the shard picked by its index.
pub struct LatencyRecorder {
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl std::fmt::Debug for LatencyRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyRecorder")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl LatencyRecorder {
    /// A recorder with `shards` shards (at least one).
    pub fn new(shards: usize) -> Self {
        LatencyRecorder {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(new_histogram()))
                .collect(),
        }
    }

    /// Records one latency in microseconds into shard `task % shards`.
    pub fn record(&self, task: usize, us: u64) {
        let shard = &self.shards[task % self.shards.len()];
        if let Ok(mut h) = shard.lock() {
            h.saturating_record(us.clamp(1, MAX_TRACKED_US));
        }
    }

    /// All shards merged into one histogram.
    pub fn snapshot(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for shard in &self.shards {
            if let Ok(h) = shard.lock() {
                // Same bounds on both sides: adding cannot fail.
                let _ = all.add(&*h);
            }
        }
        all
    }
}

/// One run-wide event count, bumped by many tasks (relaxed: only totals are read).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Counts one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Counts `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Takes `n` back (for a gauge such as open connections).
    pub fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Percentiles of one latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
}

impl Summary {
    /// Summarises a histogram (all zeros when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Failures observed by the bench itself, besides the server's `Error` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalError {
    /// No SendAck (nor Error) within the ack timeout.
    AckTimeout,
    /// The server closed the connection during the run.
    Closed,
    /// A WebSocket read or write failed.
    Transport,
    /// A frame the scenario did not expect (kind or conversation).
    Unexpected,
}

impl LocalError {
    const ALL: [LocalError; 4] = [
        LocalError::AckTimeout,
        LocalError::Closed,
        LocalError::Transport,
        LocalError::Unexpected,
    ];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            LocalError::AckTimeout => "ack_timeout",
            LocalError::Closed => "connection_closed",
            LocalError::Transport => "transport",
            LocalError::Unexpected => "unexpected_frame",
        }
    }
}

/// Server error codes are counted at indexes `0..SERVER_CODES` (by wire value), unknown
/// codes at `SERVER_CODES`, local errors after that.
const SERVER_CODES: usize = 9;

/// Error counters by kind, shared by all tasks of a run.
#[derive(Debug)]
pub struct ErrorCounts {
    counts: [AtomicU64; SERVER_CODES + 1 + LocalError::ALL.len()],
}

impl Default for ErrorCounts {
    fn default() -> Self {
        ErrorCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl ErrorCounts {
    /// Counts an `Error` frame with wire code `code`.
    pub fn server(&self, code: i32) {
        let idx = usize::try_from(code)
            .ok()
            .filter(|&c| c < SERVER_CODES)
            .unwrap_or(SERVER_CODES);
        self.counts[idx].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failure seen by the bench.
    pub fn local(&self, e: LocalError) {
        self.counts[SERVER_CODES + 1 + e as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a frame the scenario had no use for: an `Error` by its code, a `Pong`, a
    /// `Done` or an app push (read receipt, typing, presence) not at all, anything else
    /// as [`LocalError::Unexpected`].
    pub fn stray(&self, f: &Frame) {
        match &f.body {
            Some(Body::Error(e)) => self.server(e.code),
            Some(
                Body::Pong(_)
                | Body::Done(_)
                | Body::ReadReceipt(_)
                | Body::Typing(_)
                | Body::Presence(_),
            ) => {}
            _ => self.local(LocalError::Unexpected),
        }
    }

    /// Sum over all kinds.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Non-zero counts by name: server codes as in the contract (`OVERLOADED`, ...),
    /// local ones in lower case (`ack_timeout`, ...).
    pub fn by_name(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (idx, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let name = if idx < SERVER_CODES {
                ErrorCode::try_from(idx as i32)
                    .map(|c| c.as_str_name().to_owned())
                    .unwrap_or_else(|_| format!("code_{idx}"))
            } else if idx == SERVER_CODES {
                "UNKNOWN_CODE".to_owned()
            } else {
                LocalError::ALL[idx - SERVER_CODES - 1].name().to_owned()
            };
            out.insert(name, n);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_merge_into_one_summary() {
        let r = LatencyRecorder::new(4);
        for i in 0..1000u64 {
            r.record(i as usize, i + 1);
        }
        r.record(7, u64::MAX);
        let s = Summary::of(&r.snapshot());
        assert_eq!(s.count, 1001);
        assert!((495..=505).contains(&s.p50), "{s:?}");
        assert!(s.max >= MAX_TRACKED_US && s.max < MAX_TRACKED_US + MAX_TRACKED_US / 500);
        assert_eq!(Summary::of(&LatencyRecorder::new(1).snapshot()).count, 0);
    }

    #[test]
    fn errors_are_named_by_code() {
        let e = ErrorCounts::default();
        e.server(ErrorCode::Overloaded as i32);
        e.server(ErrorCode::Overloaded as i32);
        e.server(99);
        e.local(LocalError::AckTimeout);
        let names = e.by_name();
        assert_eq!(names.get("OVERLOADED"), Some(&2));
        assert_eq!(names.get("UNKNOWN_CODE"), Some(&1));
        assert_eq!(names.get("ack_timeout"), Some(&1));
        assert_eq!(e.total(), 4);
    }
}
