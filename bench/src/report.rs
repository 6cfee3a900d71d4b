//! The pieces of the text reports every scenario prints (latency summaries, errors,
//! disconnects, the correctness verdict, the server's figures and log) and the live
//! progress line, so that all scenarios read alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::clock::Clock;
use crate::spawn::ServerLog;
use crate::stats::Summary;
use crate::util::fmt_us;

/// Width of the label column.
const LABEL: usize = 16;

/// `label  p50 ..  p95 ..  p99 ..  p999 ..  max ..  (n=..)`.
pub fn summary_line(s: &mut String, label: &str, v: &Summary) {
    let _ = writeln!(
        s,
        "{label:<LABEL$} p50 {}  p95 {}  p99 {}  p999 {}  max {}  (n={})",
        fmt_us(v.p50),
        fmt_us(v.p95),
        fmt_us(v.p99),
        fmt_us(v.p999),
        fmt_us(v.max),
        v.count
    );
}

/// A line with a label and free text.
pub fn line(s: &mut String, label: &str, text: impl std::fmt::Display) {
    let _ = writeln!(s, "{label:<LABEL$} {text}");
}

/// Errors by code (`none` when empty), then one line per disconnect reason.
pub fn errors_lines(
    s: &mut String,
    errors: &BTreeMap<String, u64>,
    disconnects: &BTreeMap<String, u64>,
) {
    let text = if errors.is_empty() {
        "none".to_owned()
    } else {
        errors
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    line(s, "errors", text);
    for (why, count) in disconnects {
        let _ = writeln!(s, "  disconnected {count}x: {why}");
    }
}

/// The verdict line and its informational follow-up.
pub fn verdict_lines(s: &mut String, v: &Verdict, passed: bool, extra_info: &str) {
    line(
        s,
        "correctness",
        format!(
            "{}: {} acked, {} deliveries over {} conversations; missing {}, duplicates {}, not increasing {}, seq reused {}, wrong conversation {}",
            if passed { "PASS" } else { "FAIL" },
            v.acked,
            v.delivered,
            v.conversations,
            v.missing,
            v.duplicates,
            v.not_increasing,
            v.seq_reused,
            v.wrong_conversation
        ),
    );
    let mut info = format!(
        "(info: {} delivered but not acked, {} seq gaps",
        v.delivered_unacked, v.gaps
    );
    if v.push_gaps_synced > 0 || v.overlaps > 0 {
        let _ = write!(
            info,
            ", {} push gaps recovered by sync, {} overlaps skipped",
            v.push_gaps_synced, v.overlaps
        );
    }
    if !extra_info.is_empty() {
        let _ = write!(info, ", {extra_info}");
    }
    info.push(')');
    line(s, "", info);
}

/// Bytes in a unit suited to their size.
pub fn fmt_bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if f < KIB {
        format!("{b} B")
    } else if f < KIB * KIB {
        format!("{:.1} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.1} MiB", f / KIB / KIB)
    } else {
        format!("{:.2} GiB", f / KIB / KIB / KIB)
    }
}

/// The server's own figures (from its admin API), or why they are missing.
pub fn server_lines(s: &mut String, f: Option<&ServerFigures>) {
    let Some(f) = f else {
        line(
            s,
            "server",
            "figures unavailable (no admin API: use --spawn, or --admin-url and --admin-token)",
        );
        return;
    };
    line(
        s,
        "server",
        format!(
            "{} connections, rss {}, cpu busy {:.0}% of {} cores, {} of {} fds, msgs in {:.0}/s out {:.0}/s, persist backlog {}",
            f.connections,
            fmt_bytes(f.rss_bytes),
            f.cpu_busy * 100.0,
            f.cores,
            f.open_fds,
            f.max_fds,
            f.msg_rate_in,
            f.msg_rate_out,
            f.persist_backlog
        ),
    );
    line(
        s,
        "",
        format!(
            "capacity: {} per connection ({}), headroom {} more connections{}, limited by {}",
            fmt_bytes(f.per_connection_bytes),
            if f.per_connection_measured {
                "measured"
            } else {
                "estimate"
            },
            f.headroom_connections,
            f.headroom_msgs_per_sec
                .map(|m| format!(" / {m:.0} more msgs/s"))
                .unwrap_or_default(),
            f.limiting_resource
        ),
    );
    line(
        s,
        "",
        format!(
            "slow consumers {} (closed for it: {}), queued out {}",
            f.slow_consumers,
            f.slow_consumer_disconnects,
            fmt_bytes(f.outbound_queued_bytes)
        ),
    );
    if let Some(j) = &f.jemalloc {
        line(
            s,
            "",
            format!(
                "jemalloc: allocated {}, active {}, resident {}, retained {}, metadata {}",
                fmt_bytes(j.allocated),
                fmt_bytes(j.active),
                fmt_bytes(j.resident),
                fmt_bytes(j.retained),
                fmt_bytes(j.metadata)
            ),
        );
    }
    let stages: Vec<String> = ["persist_wait", "persist_commit", "queue_wait", "end_to_end"]
        .iter()
        .filter_map(|name| f.stage(name))
        .filter(|st| st.count > 0)
        .map(|st| {
            format!(
                "{} p50 {} p99 {}",
                st.stage,
                fmt_us(st.p50_us as u64),
                fmt_us(st.p99_us as u64)
            )
        })
        .collect();
    if !stages.is_empty() {
        line(
            s,
            "",
            format!("stages (server window): {}", stages.join(", ")),
        );
    }
}

/// What the spawned server logged at WARN/ERROR level, and whether it exited.
pub fn server_log_lines(s: &mut String, log: Option<&ServerLog>, exited: bool) {
    if exited {
        line(
            s,
            "server exit",
            "FAIL: the spawned server exited during the run",
        );
    }
    if let Some(log) = log {
        line(
            s,
            "server log",
            format!("{} WARN, {} ERROR lines", log.warnings, log.errors),
        );
        for l in &log.samples {
            let _ = writeln!(s, "  {l}");
        }
    }
}

/// [`spawn_progress`] with one [`Rate`] kept for the line and the run's shared state
/// `ctx`: `text(ctx, rate, dt)` makes each line.
pub fn spawn_rate_progress<C, F>(
    clock: Clock,
    ctx: std::sync::Arc<C>,
    mut text: F,
) -> JoinHandle<()>
where
    C: Send + Sync + 'static,
    F: FnMut(&C, &mut Rate, f64) -> String + Send + 'static,
{
    let mut rate = Rate::default();
    spawn_progress(clock, move |dt| text(&ctx, &mut rate, dt))
}

/// Prints one progress line a second to stderr until the task is aborted:
/// `[  12s measure] <text>`, where `text` gets the seconds since the last line.
pub fn spawn_progress<F>(clock: Clock, text: F) -> JoinHandle<()>
where
    F: FnMut(f64) -> String + Send + 'static,
{
    spawn_progress_phased(clock, move |now| clock.phase(now), text)
}

/// As [`spawn_progress`], with the phase label from `phase`.
pub fn spawn_progress_phased<P, F>(clock: Clock, phase: P, mut text: F) -> JoinHandle<()>
where
    P: Fn(Instant) -> &'static str + Send + 'static,
    F: FnMut(f64) -> String + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick =
            tokio::time::interval_at(clock.base + Duration::from_secs(1), Duration::from_secs(1));
        let mut prev = clock.base;
        loop {
            let now: Instant = tick.tick().await;
            let dt = now.saturating_duration_since(prev).as_secs_f64().max(1e-3);
            prev = now;
            eprintln!(
                "[{:>4}s {:<7}] {}",
                now.saturating_duration_since(clock.base).as_secs(),
                phase(now),
                text(dt)
            );
        }
    })
}

/// A counter's rate since the last call (for progress lines).
#[derive(Debug, Default)]
pub struct Rate {
    prev: u64,
}

impl Rate {
    /// `(now - previous) / dt`.
    pub fn per_sec(&mut self, now: u64, dt: f64) -> f64 {
        let d = now.saturating_sub(self.prev);
        self.prev = now;
        d as f64 / dt
    }
}

/// p99 of a histogram for a progress line (`-` when empty).
pub fn p99_text(h: &hdrhistogram::Histogram<u64>) -> String {
    if h.is_empty() {
        "-".to_owned()
    } else {
        fmt_us(h.value_at_quantile(0.99))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_lines_format() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(2048), "2.0 KiB");
        assert_eq!(fmt_bytes(3 << 20), "3.0 MiB");
        let mut s = String::new();
        errors_lines(
            &mut s,
            &BTreeMap::new(),
            &BTreeMap::from([("close 4001: idle".to_owned(), 2)]),
        );
        assert!(s.starts_with("errors           none\n"), "{s:?}");
        assert!(s.contains("disconnected 2x: close 4001: idle"));
        let mut s = String::new();
        verdict_lines(&mut s, &Verdict::default(), true, "");
        assert!(s.contains("PASS: 0 acked"));
        let mut r = Rate::default();
        assert_eq!(r.per_sec(10, 2.0), 5.0);
        assert_eq!(r.per_sec(10, 1.0), 0.0);
    }
}
