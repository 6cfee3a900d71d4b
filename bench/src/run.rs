//! The run skeleton every scenario shares: how long to measure ([`RunArgs`]), how
//! connections that ended are counted ([`Disconnects`]), the protocol heartbeat
//! ([`ping`]), a one-to-one pair's end of run ([`Pair`]), the server's figures near the
//! end ([`figures_near_end`]), the run's name tag ([`run_tag`]), and the report
//! skeleton: every report is a [`Report`] of the scenario's own fields ([`ReportBody`])
//! and one shared [`Tail`], printed by [`finish`]. It calls the lower modules (report,
//! target, stats) and none of the scenarios.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use clap::Args;
use im_client::{ClientError, RawConn, RawEvent};
use im_proto::Ping;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::clock::Clock;
use crate::report;
use crate::spawn::ServerLog;
use crate::stats::{ErrorCounts, LocalError};
use crate::target::Target;
use crate::util::parse_duration;
use crate::Outcome;

/// How long to run and how to report.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Measured time, after the warmup (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring starts; nothing sent or acked in it is counted.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// After the run, how long to wait for outstanding acks and, then, deliveries.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Print the final report as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Connections that ended unexpectedly, by close code and reason (or transport error).
#[derive(Debug, Default)]
pub struct Disconnects {
    by_reason: Mutex<BTreeMap<String, u64>>,
}

impl Disconnects {
    /// Counts a connection that ended (`ev` is the close event or the receive error) in
    /// `errors` (as `connection_closed` or `transport`) and by reason.
    pub fn record(&self, errors: &ErrorCounts, ev: Result<RawEvent, ClientError>) {
        let (kind, why) = match ev {
            Ok(RawEvent::Closed { code, reason }) => (
                LocalError::Closed,
                match code {
                    Some(c) => format!("close {c}: {reason}"),
                    None => format!("closed: {reason}"),
                },
            ),
            Ok(RawEvent::Frame(_) | RawEvent::WsPong(_)) => return,
            Err(e) => (LocalError::Transport, format!("transport: {e}")),
        };
        errors.local(kind);
        self.add(why);
    }

    /// Counts one ended connection under `why`.
    pub fn add(&self, why: String) {
        if let Ok(mut d) = self.by_reason.lock() {
            *d.entry(why).or_default() += 1;
        }
    }

    /// The counts by reason.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.by_reason.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

/// What goes wrong on a run's connections as it runs: errors by code and connections
/// that ended, by reason. Every scenario's run-wide state holds one; its [`Problems`]
/// close the report.
#[derive(Debug, Default)]
pub struct Faults {
    /// Errors by code.
    pub errors: ErrorCounts,
    /// Connections that ended, by reason.
    pub disconnects: Disconnects,
}

impl Faults {
    /// The errors and ended connections so far.
    pub fn problems(&self) -> Problems {
        Problems::of(&self.errors, &self.disconnects)
    }
}

/// What went wrong during a run: errors by code and ended connections by reason, the
/// last fields of every scenario's report body (flattened, so the JSON keeps its shape).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Problems {
    /// Errors by code.
    pub errors: BTreeMap<String, u64>,
    /// Connections that ended during the run, by reason.
    pub disconnects: BTreeMap<String, u64>,
}

impl Problems {
    /// The run's errors and ended connections now.
    pub fn of(errors: &ErrorCounts, disconnects: &Disconnects) -> Self {
        Problems {
            errors: errors.by_name(),
            disconnects: disconnects.snapshot(),
        }
    }

    /// Appends the report's error and disconnect lines to `s`.
    pub fn lines(&self, s: &mut String) {
        report::errors_lines(s, &self.errors, &self.disconnects);
    }
}

/// The first fields of every scenario's report: which scenario ran, against which
/// client endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Head {
    /// The scenario's name, e.g. `"chat"`.
    pub scenario: &'static str,
    /// The client endpoint used.
    pub url: String,
}

impl Head {
    /// The head of a `scenario` run against `target`.
    pub fn new(scenario: &'static str, target: &Target) -> Self {
        Head {
            scenario,
            url: target.url.clone(),
        }
    }

    /// A report's text, starting with its first line: `im-bench SCENARIO: WHAT`, the
    /// measured and warmup seconds, the endpoint.
    pub fn text(&self, measured: f64, warmup: f64, what: impl std::fmt::Display) -> String {
        format!(
            "im-bench {}: {what}, {measured:.1}s measured after {warmup:.1}s warmup, {}\n",
            self.scenario, self.url
        )
    }
}

/// A report field that some scenarios have and others leave out of their JSON.
pub trait Slot: Serialize {
    /// Whether the field is left out.
    fn absent(&self) -> bool {
        false
    }
}

/// A [`Tail`] field this scenario's report does not have (not serialized).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Absent;

impl Slot for Absent {
    fn absent(&self) -> bool {
        true
    }
}

impl Slot for Verdict {}

impl Slot for Option<ServerFigures> {}

/// What every report ends with (flattened into its JSON after the scenario's own
/// fields): the delivery check, the verdict, the server's figures near the end of the
/// measured window, and, with `--spawn`, what the server logged and whether it exited.
/// A scenario without a check or without end-of-run figures sets `C` or `S` to
/// [`Absent`].
#[derive(Debug, Clone, Serialize)]
pub struct Tail<C: Slot = Verdict, S: Slot = Option<ServerFigures>> {
    /// The delivery check.
    #[serde(skip_serializing_if = "Slot::absent")]
    pub correctness: C,
    /// Whether every check passed.
    pub passed: bool,
    /// The server's figures near the end of the measured window (admin API).
    #[serde(skip_serializing_if = "Slot::absent")]
    pub server: S,
    /// With `--spawn`: what the server logged at WARN/ERROR level.
    pub server_log: Option<ServerLog>,
    /// With `--spawn`: whether the server exited during the run (a failure).
    pub server_exited: bool,
}

impl<C: Slot, S: Slot> Tail<C, S> {
    /// A tail before [`finish`] has looked at the spawned server.
    pub fn new(correctness: C, passed: bool, server: S) -> Self {
        Tail {
            correctness,
            passed,
            server,
            server_log: None,
            server_exited: false,
        }
    }

    /// The spawned server's lines of the text report.
    pub fn server_log_lines(&self, s: &mut String) {
        report::server_log_lines(s, self.server_log.as_ref(), self.server_exited);
    }
}

impl<S: Slot> Tail<Verdict, S> {
    /// The verdict lines of the text report (`extra`: scenario figures for the info line).
    pub fn verdict_lines(&self, s: &mut String, extra: &str) {
        report::verdict_lines(s, &self.correctness, self.passed, extra);
    }
}

impl<C: Slot> Tail<C, Option<ServerFigures>> {
    /// The server's figures in the text report.
    pub fn server_lines(&self, s: &mut String) {
        report::server_lines(s, self.server.as_ref());
    }

    /// `s` with the report's closing lines: the server's figures, then what a spawned
    /// server logged.
    pub fn with_server_lines(&self, mut s: String) -> String {
        self.server_lines(&mut s);
        self.server_log_lines(&mut s);
        s
    }
}

/// A scenario's own report fields, which come before the shared [`Tail`].
pub trait ReportBody: Serialize + Sized {
    /// The tail's `correctness`: [`Verdict`], or [`Absent`].
    type Correctness: Slot;
    /// The tail's `server`: `Option<ServerFigures>`, or [`Absent`].
    type Server: Slot;
    /// The text form of the whole report.
    fn render(r: &Report<Self>) -> String;
}

/// A scenario's final report: its own fields, then the shared tail (one JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct Report<B: ReportBody> {
    /// The scenario's own fields.
    #[serde(flatten)]
    pub body: B,
    /// The verdict and the server's fate.
    #[serde(flatten)]
    pub tail: Tail<B::Correctness, B::Server>,
}

impl<B: ReportBody<Correctness = Verdict, Server = Option<ServerFigures>>> Report<B> {
    /// A report that passes exactly when its delivery `verdict` does.
    pub fn judged(body: B, verdict: Verdict, server: Option<ServerFigures>) -> Self {
        let passed = verdict.passed();
        Report {
            body,
            tail: Tail::new(verdict, passed, server),
        }
    }
}

impl<B: ReportBody> std::ops::Deref for Report<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.body
    }
}

/// Stops the target, completes the report and prints it (text, or JSON with `json`);
/// the outcome is a failure if a check failed or the spawned server exited early.
pub async fn finish<B: ReportBody>(
    mut target: Target,
    result: anyhow::Result<Report<B>>,
    json: bool,
) -> anyhow::Result<Outcome> {
    let exited = !target.server_alive();
    if exited {
        eprintln!("im-bench: the spawned server exited during the run");
    }
    let log = target.close().await;
    let mut report = result?;
    report.tail.server_log = log;
    report.tail.server_exited = exited;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", B::render(&report));
    }
    Ok(if report.tail.passed && !exited {
        Outcome::Pass
    } else {
        Outcome::Fail
    })
}

/// Pings on `conn` when nothing was written since `last_tx` for half the `heartbeat`
/// (the server then keeps the connection), moving `last_tx` to `now`. A failed write is
/// counted in `faults` as a transport error, and returned.
pub async fn keep_alive(
    conn: &mut RawConn,
    now: Instant,
    last_tx: &mut Instant,
    heartbeat: Duration,
    faults: &Faults,
) -> Result<(), ClientError> {
    if now.saturating_duration_since(*last_tx) < heartbeat / 2 {
        return Ok(());
    }
    *last_tx = now;
    ping(conn)
        .await
        .inspect_err(|_| faults.errors.local(LocalError::Transport))
}

/// Sends a protocol Ping (the server answers Pong, and counts it as activity).
pub async fn ping(conn: &mut RawConn) -> Result<(), ClientError> {
    let client_time = im_proto::now_ms();
    conn.send(&im_proto::frame(
        0,
        im_proto::Body::Ping(Ping { client_time }),
    ))
    .await
}

/// The next frame of a scenario connection, WebSocket pongs skipped; `None` once the
/// connection ended, which is counted in `faults`. Cancel-safe (only
/// [`RawConn::recv`] is awaited), so it can race other branches of a `select!`.
pub async fn next_frame(conn: &mut RawConn, faults: &Faults) -> Option<im_proto::Frame> {
    loop {
        match conn.recv().await {
            Ok(RawEvent::Frame(f)) => return Some(f),
            Ok(RawEvent::WsPong(_)) => {}
            other => {
                faults.disconnects.record(&faults.errors, other);
                return None;
            }
        }
    }
}

/// Spawns `task(i, session)` for each session, in order.
pub fn spawn_each<S, T, F, Fut>(sessions: Vec<S>, mut task: F) -> JoinSet<T>
where
    F: FnMut(usize, S) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut set = JoinSet::new();
    for (i, s) in sessions.into_iter().enumerate() {
        set.spawn(task(i, s));
    }
    set
}

/// What a one-to-one sender tells its receiver about the end of the run.
#[derive(Debug, Default)]
pub struct Pair {
    /// Highest seq acked to the sender.
    pub max_acked: AtomicU64,
    /// The sender has stopped (drained or failed): `max_acked` is final.
    pub sender_done: AtomicBool,
}

impl Pair {
    /// The sender is done and its highest acked seq was `max_acked`.
    pub fn sender_finished(&self, max_acked: u64) {
        self.max_acked.store(max_acked, Ordering::Release);
        self.sender_done.store(true, Ordering::Release);
    }

    /// Whether the sender is done.
    pub fn done(&self) -> bool {
        self.sender_done.load(Ordering::Acquire)
    }

    /// Whether a receiver whose highest delivered seq is `last` has everything it waits for.
    pub fn caught_up(&self, last: u64) -> bool {
        self.sender_done.load(Ordering::Acquire) && last >= self.max_acked.load(Ordering::Acquire)
    }
}

/// Reads the server's figures (if it has a known admin API) shortly before the end of
/// the measured window, while the load is still on.
pub fn figures_near_end(
    target: &Target,
    clock: &Clock,
) -> tokio::task::JoinHandle<Option<ServerFigures>> {
    let admin = target.admin().cloned();
    let at = clock.end - ((clock.end - clock.warmup_end) / 2).min(Duration::from_millis(500));
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        match admin {
            Some(a) => a.try_figures().await,
            None => None,
        }
    })
}

/// A short random tag for this run's user and group names (8 hex digits), so that runs
/// against the same server never share conversations.
pub fn run_tag(run_id: u64) -> String {
    format!("{:08x}", (run_id >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Serialize)]
    struct Body {
        scenario: &'static str,
        n: u64,
    }

    impl ReportBody for Body {
        type Correctness = Verdict;
        type Server = Absent;
        fn render(r: &Report<Self>) -> String {
            format!("{} {}", r.scenario, r.tail.passed)
        }
    }

    #[derive(Debug, Clone, Serialize)]
    struct Bare;

    impl ReportBody for Bare {
        type Correctness = Absent;
        type Server = Option<ServerFigures>;
        fn render(_: &Report<Self>) -> String {
            String::new()
        }
    }

    #[test]
    fn the_tail_follows_the_body_and_leaves_out_absent_fields() {
        let r = Report {
            body: Body {
                scenario: "x",
                n: 1,
            },
            tail: Tail::new(Verdict::default(), true, Absent),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.starts_with(r#"{"scenario":"x","n":1,"correctness":{"#),
            "{json}"
        );
        assert!(
            json.ends_with(r#"},"passed":true,"server_log":null,"server_exited":false}"#),
            "{json}"
        );
        assert_eq!(Body::render(&r), "x true");
        let bare = Report {
            body: Bare,
            tail: Tail::new(Absent, false, None),
        };
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"passed":false,"server":null,"server_log":null,"server_exited":false}"#
        );
    }

    #[test]
    fn pair_is_caught_up_only_after_the_sender_is_done() {
        let p = Pair::default();
        p.max_acked.store(5, Ordering::Release);
        assert!(!p.caught_up(5));
        p.sender_finished(5);
        assert!(p.done());
        assert!(!p.caught_up(4));
        assert!(p.caught_up(5));
    }
}
