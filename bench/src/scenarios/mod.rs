//! Scenarios, one module per traffic shape, and what they share: where the server is
//! ([`ServerArgs`]), how long to measure ([`RunArgs`]), the run's timeline ([`Clock`]),
//! run-wide counters (`counters!`), how connections that ended are counted
//! ([`Disconnects`]), the protocol heartbeat ([`ping`]), a one-to-one pair's end of run
//! ([`Pair`]), and the report skeleton: every report is a [`Report`] of the scenario's
//! own fields ([`ReportBody`]) and one shared [`Tail`], printed by [`finish`].
//!
//! - [`chat`]: one-to-one durable chat, N sender/receiver pairs (closed loop or `--rate`).
//! - [`idle`]: a connect ramp to N idle connections with heartbeats; memory per
//!   connection from the server's admin API.
//! - [`broadcast`]: G groups of M members, R messages/s per group, push or notify-and-pull.
//! - [`mix`]: one-to-one traffic with a message size mix over zipf-hot conversations.
//! - [`roundtrip`]: send, SendAck, deliver, DeliverAck and the reply, timed end to end.
//! - [`abuse`]: chat alone, then under hostile clients (slowloris, Batch floods of every
//!   frame kind, a giant sync backlog, bad logins, never-reading connections); fails when
//!   the honest P99 under attack passes a multiple of the baseline.
//! - [`chaos`]: chat under disconnect injection (kill, reconnect, sync), a one-off
//!   reconnect storm, and malformed frames (each must get BAD_FRAME and leave the
//!   connection working).
//!
//! Every scenario checks delivery while it loads ([`crate::check`]) and fails (exit 1)
//! on any loss, duplicate, reordering, or a server that exited during the run.

/// Declares a scenario's run-wide counters: a `#[derive(Default)]` struct of
/// [`crate::stats::Counter`]s that every task bumps, and a plain `Copy` struct of the
/// same names holding their totals (serializable, e.g. flattened into a report), taken
/// with `snapshot()`.
///
/// ```ignore
/// counters! {
///     /// What chat's tasks count.
///     struct Counts => Totals {
///         /// Messages received by receivers.
///         delivered,
///     }
/// }
/// ```
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $totals:ident {
            $( $(#[$fmeta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: $crate::stats::Counter, )*
        }

        /// Totals of the counters, at one instant.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        $vis struct $totals {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $name {
            /// Every counter's total now.
            #[allow(dead_code)]
            pub fn snapshot(&self) -> $totals {
                $totals { $( $field: self.$field.get(), )* }
            }
        }
    };
}

/// Wires a scenario module: its [`ReportBody`] (which parts of the shared tail its report
/// carries; the text form is the module's `render`) and its entry point `run` (open the
/// target, the module's `run_against`, then [`finish`]). `target` and `json` name where in
/// the module's args the target options and the `--json` flag are.
macro_rules! scenario {
    (
        $what:literal, $args:ty => $body:ty,
        correctness: $correctness:ty, server: $server:ty,
        target: $($target:ident).+, json: $($json:ident).+ $(,)?
    ) => {
        impl $crate::scenarios::ReportBody for $body {
            type Correctness = $correctness;
            type Server = $server;
            fn render(r: &$crate::scenarios::Report<Self>) -> String {
                render(r)
            }
        }

        #[doc = concat!("Runs the ", $what, " scenario.")]
        pub async fn run(args: $args) -> anyhow::Result<$crate::Outcome> {
            let mut target = $crate::target::Target::open(&args.$($target).+).await?;
            let result = run_against(&args, &mut target).await;
            $crate::scenarios::finish(target, result, args.$($json).+).await
        }
    };
}

pub mod abuse;
pub mod broadcast;
pub mod chaos;
pub mod chat;
pub mod follow;
pub mod idle;
pub mod mix;
pub mod peers;
pub mod roundtrip;
pub mod sender;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use clap::{Args, Subcommand};
use im_client::{ClientError, RawConn, RawEvent};
use im_proto::Ping;
use serde::Serialize;
use tokio::time::Instant;

use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::report;
use crate::spawn::ServerLog;
use crate::stats::{ErrorCounts, LocalError};
use crate::target::Target;
use crate::util::{parse_duration, parse_key_val};
use crate::Outcome;
/// JWT secret a spawned server is given, and the default `--secret`.
pub const DEFAULT_SECRET: &str = "im-bench-secret-of-at-least-32-bytes";

/// The scenarios `im-bench` can run. A flag given twice keeps its last value (so the
/// command line overrides a `--config` file); repeatable flags accumulate.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// One-to-one durable chat: sender s{i} sends to receiver r{i}; measures
    /// send-to-SendAck and send-to-deliver latency and checks exactly-once delivery.
    #[command(args_override_self = true)]
    Chat(chat::ChatArgs),
    /// N connections ramped over T seconds, logged in and heartbeating; connect/login
    /// latency, heartbeat round trips and the server's memory per connection.
    #[command(args_override_self = true)]
    Idle(idle::IdleArgs),
    /// G groups of M members, R messages/s per group, full fan-out (push, or
    /// notify-and-pull with --pull); delivery latency and deliveries/s.
    #[command(args_override_self = true)]
    Broadcast(broadcast::BroadcastArgs),
    /// One-to-one traffic with a message size mix (text/image/file) over zipf-hot
    /// conversations, at a total rate.
    #[command(args_override_self = true)]
    Mix(mix::MixArgs),
    /// Pairs exchanging messages: send, SendAck, deliver, DeliverAck and the reply,
    /// timed end to end; stored cursors checked after the run.
    #[command(args_override_self = true)]
    Roundtrip(roundtrip::RoundtripArgs),
    /// Chat under fire: x% of connections killed at random (reconnect + sync timed as
    /// time to recover), an optional reconnect storm (a fraction of all connections
    /// reset at once), y% malformed frames (each must get BAD_FRAME).
    #[command(args_override_self = true)]
    Chaos(chaos::ChaosArgs),
    /// Honest chat alone, then under attack (slowloris, DeliverAck/Sync/GroupOp floods in
    /// Batch frames, a giant sync backlog, expired and forged logins, never-reading
    /// connections); fails on any lost acked message or an honest P99 above
    /// --max-p99-ratio times the baseline.
    #[command(args_override_self = true)]
    Abuse(abuse::AbuseArgs),
    /// The same idle, broadcast and pairs loads against im-server, an MQTT broker
    /// (`--protocol mqtt-ws`) or nats-server (`--protocol nats-ws`), with the server's
    /// CPU and RSS from /proc (`--server-pid`), for side-by-side comparisons.
    #[command(subcommand)]
    Peer(crate::peer::PeerScenario),
}

/// Where the server under test is.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Client WebSocket endpoint of a running server.
    #[arg(long, default_value = "ws://127.0.0.1:7070/ws")]
    pub url: String,
    /// Start this im-server binary instead (loopback, ephemeral ports, temp data dir),
    /// and kill it at the end.
    #[arg(long, value_name = "PATH_TO_IM_SERVER", conflicts_with = "url")]
    pub spawn: Option<PathBuf>,
    /// JWT secret used to mint client tokens (a spawned server gets the same one).
    #[arg(long, env = "IM_BENCH_SECRET", default_value = DEFAULT_SECRET, hide_env_values = true)]
    pub secret: String,
    /// Extra environment for the spawned server, e.g. IM_PERSIST_BATCH_MAX=64 (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = parse_key_val)]
    pub server_env: Vec<(String, String)>,
    /// Admin API of a running server (`http://HOST:PORT`), for its figures (automatic
    /// with --spawn).
    #[arg(long, conflicts_with = "spawn")]
    pub admin_url: Option<String>,
    /// Admin bearer token for --admin-url.
    #[arg(long, env = "IM_BENCH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Loopback source addresses to spread connections over (127.0.0.2 onwards, at
    /// most 254); 0 lets the OS choose. Ignored for a server that is not on loopback.
    #[arg(long, default_value_t = 254, value_parser = clap::value_parser!(u32).range(0..=254))]
    pub sources: u32,
}

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

/// Runs one scenario.
pub async fn run(scenario: Scenario) -> anyhow::Result<Outcome> {
    match scenario {
        Scenario::Chat(args) => chat::run(args).await,
        Scenario::Idle(args) => idle::run(args).await,
        Scenario::Broadcast(args) => broadcast::run(args).await,
        Scenario::Mix(args) => mix::run(args).await,
        Scenario::Roundtrip(args) => roundtrip::run(args).await,
        Scenario::Chaos(args) => chaos::run(args).await,
        Scenario::Abuse(args) => abuse::run(args).await,
        Scenario::Peer(scenario) => crate::peer::run(crate::peer::PeerArgs { scenario }).await,
    }
}

/// A run's timeline: time zero of payload timestamps, the end of the warmup and the end
/// of the measured window.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Time zero (payload timestamps count microseconds from here).
    pub base: Instant,
    /// Measuring starts here.
    pub warmup_end: Instant,
    /// Measuring (and sending) stops here.
    pub end: Instant,
}

impl Clock {
    /// A timeline starting now: `warmup`, then `duration` measured.
    pub fn start(warmup: Duration, duration: Duration) -> Clock {
        let base = Instant::now();
        Clock {
            base,
            warmup_end: base + warmup,
            end: base + warmup + duration,
        }
    }

    /// Microseconds from the base to `t`.
    pub fn us(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_micros() as u64
    }

    /// Microseconds from the base to now.
    pub fn now_us(&self) -> u64 {
        self.us(Instant::now())
    }

    /// Whether `t` is in the measured window.
    pub fn measured(&self, t: Instant) -> bool {
        t >= self.warmup_end && t < self.end
    }

    /// Whether a payload timestamp (µs from the base) is in the measured window.
    pub fn measured_us(&self, us: u64) -> bool {
        (self.us(self.warmup_end)..self.us(self.end)).contains(&us)
    }

    /// `warmup`, `measure` or `drain`, for the progress line.
    pub fn phase(&self, now: Instant) -> &'static str {
        if now < self.warmup_end {
            "warmup"
        } else if now < self.end {
            "measure"
        } else {
            "drain"
        }
    }

    /// Measured seconds.
    pub fn measured_secs(&self) -> f64 {
        (self.end - self.warmup_end).as_secs_f64()
    }

    /// `n` per measured second (0 for an empty window).
    pub fn per_sec(&self, n: u64) -> f64 {
        let secs = self.measured_secs();
        if secs > 0.0 {
            n as f64 / secs
        } else {
            0.0
        }
    }
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

/// Sends a protocol Ping (the server answers Pong, and counts it as activity).
pub async fn ping(conn: &mut RawConn) -> Result<(), ClientError> {
    let client_time = im_proto::now_ms();
    conn.send(&im_proto::frame(
        0,
        im_proto::Body::Ping(Ping { client_time }),
    ))
    .await
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

    counters! {
        /// Test counters.
        struct Counts => Totals {
            /// One.
            a,
            /// Two.
            b,
        }
    }

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
    fn counters_snapshot_their_totals() {
        let c = Counts::default();
        c.a.inc();
        c.b.add(5);
        c.b.sub(2);
        assert_eq!(c.snapshot(), Totals { a: 1, b: 3 });
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
