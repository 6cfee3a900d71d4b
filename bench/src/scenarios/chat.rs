//! `im-bench chat`: one-to-one durable chat.
//!
//! Sender `s{i}` sends TEXT messages to receiver `r{i}`, keeping up to `--window`
//! un-acked sends in flight ([`crate::outbox::Outbox`]: unique client_msg_ids, req_id =
//! message number, OVERLOADED / RATE_LIMITED retried with the same client_msg_id). With
//! `--rate R` the senders together send R messages per second, evenly spaced (each
//! sender R/N per second, staggered), still capped by the window: this is the mode for
//! "the highest rate at which P99 send-to-ack stays under a target". Receivers read
//! Deliver frames. Measured, after the warmup: send-to-SendAck latency per message,
//! send-to-deliver latency (the payload carries the send time), acked messages per
//! second and errors by code.
//!
//! When the measured time is over, senders stop sending and wait (up to `--drain`) for
//! outstanding acks; each receiver then waits until it has seen its sender's highest
//! acked seq. The [`crate::check`] verdict over all pairs decides the exit code.
//!
//! Hot path: one allocation per Send (the frame, see [`crate::wire`]); per-task state
//! is the outbox and a vector of seqs for the checker; histograms are sharded so tasks
//! rarely contend. The sending loop is [`super::sender`], shared with other scenarios.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use im_proto::{Body, Frame, MessageType, Ping, SendAck};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::sender::{self, Hooks};
use super::{figures_near_end, finish, Clock, Disconnects, RunArgs, ServerArgs};
use crate::admin::ServerFigures;
use crate::check::{check, Verdict};
use crate::conn::{Conn, Event};
use crate::outbox::{Outbox, Pacer, Pending, Refused, SendSpec, Target as To};
use crate::report::{self, p99_text, Rate};
use crate::spawn::ServerLog;
use crate::stats::{ErrorCounts, LatencyRecorder, LocalError, Summary};
use crate::target::{Session, Target};
use crate::util::{fmt_us, parse_duration};
use crate::Outcome;

/// Histogram shards per latency kind.
const SHARDS: usize = 16;
/// How often an idle receiver wakes to check heartbeats and the end of the drain.
const RECEIVER_TICK: Duration = Duration::from_millis(100);

/// Flags of `im-bench chat`.
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Sender/receiver pairs (2 connections each).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub senders: u32,
    /// Outstanding un-acked sends per sender.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub window: u32,
    /// Total send rate over all senders, messages per second (0: as fast as the window
    /// allows).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Payload size in bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub payload: u32,
    /// A send with neither SendAck nor Error after this long is counted as ack_timeout
    /// and given up on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
}

/// Run-wide state shared by every task.
struct Ctx {
    clock: Clock,
    window: usize,
    payload: usize,
    /// Sends per second per sender (`None`: closed loop).
    rate_per_sender: Option<f64>,
    senders: usize,
    ack_timeout: Duration,
    drain: Duration,
    run_id: u64,
    ack_latency: LatencyRecorder,
    deliver_latency: LatencyRecorder,
    /// Acks received at any time (progress line).
    acked_all: AtomicU64,
    /// Acks received in the measured window (throughput).
    acked_measured: AtomicU64,
    /// Send frames written, retries included.
    sent: AtomicU64,
    /// OVERLOADED / RATE_LIMITED retries.
    retries: AtomicU64,
    /// SendAcks with duplicate=true.
    duplicate_acks: AtomicU64,
    /// Acks that came after their send was given up on.
    late_acks: AtomicU64,
    /// Sends still un-acked when the drain ended.
    unacked_at_end: AtomicU64,
    /// Scheduled sends dropped because a sender was more than a second behind `--rate`.
    rate_skipped: AtomicU64,
    /// Messages received by receivers.
    delivered: AtomicU64,
    errors: ErrorCounts,
    disconnects: Disconnects,
}

/// What a sender tells its receiver about the end of the run.
#[derive(Default)]
struct Pair {
    /// Highest seq acked to the sender.
    max_acked: AtomicU64,
    /// The sender has stopped (drained or failed): `max_acked` is final.
    sender_done: AtomicBool,
}

impl Pair {
    /// Whether a receiver whose highest delivered seq is `last` has everything it waits for.
    fn caught_up(&self, last: u64) -> bool {
        self.sender_done.load(Ordering::Acquire) && last >= self.max_acked.load(Ordering::Acquire)
    }
}

/// The final report of a chat run (printed as text, or as JSON with `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatReport {
    /// Always `"chat"`.
    pub scenario: &'static str,
    /// The client endpoint used.
    pub url: String,
    /// Sender/receiver pairs.
    pub senders: u32,
    /// Outstanding sends per sender.
    pub window: u32,
    /// Target total rate (msgs/s; 0: closed loop).
    pub rate: f64,
    /// Payload bytes.
    pub payload_bytes: u32,
    /// Measured seconds (after warmup).
    pub duration_secs: f64,
    /// Warmup seconds.
    pub warmup_secs: f64,
    /// Acks received in the measured window.
    pub acked: u64,
    /// `acked / duration`.
    pub acked_per_sec: f64,
    /// Send frames written over the whole run, retries included.
    pub sent_frames: u64,
    /// Messages received by receivers over the whole run.
    pub delivered: u64,
    /// OVERLOADED / RATE_LIMITED retries.
    pub retries: u64,
    /// SendAcks flagged duplicate (should be 0: no message is sent twice after a commit).
    pub duplicate_acks: u64,
    /// Acks that arrived after the bench had given up on them.
    pub late_acks: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// Scheduled sends skipped because senders fell over a second behind `--rate`.
    pub rate_skipped: u64,
    /// Send-to-SendAck latency (µs) of messages first sent in the measured window.
    pub send_to_ack_us: Summary,
    /// Send-to-Deliver latency (µs) of messages first sent in the measured window.
    pub send_to_deliver_us: Summary,
    /// Errors by code (server codes upper case, bench-side ones lower case).
    pub errors: BTreeMap<String, u64>,
    /// Connections that ended during the run, by close code and reason (or error).
    pub disconnects: BTreeMap<String, u64>,
    /// The delivery check over all pairs.
    pub correctness: Verdict,
    /// Whether the check passed.
    pub passed: bool,
    /// The server's figures at the end of the measured window (admin API).
    pub server: Option<ServerFigures>,
    /// With `--spawn`: what the server logged at WARN/ERROR level.
    pub server_log: Option<ServerLog>,
    /// With `--spawn`: whether the server exited during the run (a failure).
    pub server_exited: bool,
}

impl_report!(ChatReport);

/// Runs the chat scenario.
pub async fn run(args: ChatArgs) -> anyhow::Result<Outcome> {
    let mut target = Target::open(&args.server).await?;
    let result = run_against(&args, &mut target).await;
    finish(target, result, args.run.json).await
}

/// One chat run against an open target (also the honest traffic of `abuse`).
pub(crate) async fn run_against(
    args: &ChatArgs,
    target: &mut Target,
) -> anyhow::Result<ChatReport> {
    let n = args.senders as usize;
    let receivers: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let senders: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    eprintln!(
        "im-bench chat: connecting {n} receivers and {n} senders to {}",
        target.url
    );
    // Receivers first, so every message has an online recipient.
    let receiver_sessions = target.connect_all(&receivers, 0).await?;
    let sender_sessions = target.connect_all(&senders, n).await?;

    let clock = Clock::start(args.run.warmup, args.run.duration);
    let ctx = Arc::new(Ctx {
        clock,
        window: args.window as usize,
        payload: args.payload as usize,
        rate_per_sender: (args.rate > 0.0).then(|| args.rate / n as f64),
        senders: n,
        ack_timeout: args.ack_timeout,
        drain: args.run.drain,
        run_id: rand::random(),
        ack_latency: LatencyRecorder::new(SHARDS),
        deliver_latency: LatencyRecorder::new(SHARDS),
        acked_all: AtomicU64::new(0),
        acked_measured: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        duplicate_acks: AtomicU64::new(0),
        late_acks: AtomicU64::new(0),
        unacked_at_end: AtomicU64::new(0),
        rate_skipped: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        errors: ErrorCounts::default(),
        disconnects: Disconnects::default(),
    });

    let pairs: Vec<Arc<Pair>> = (0..n).map(|_| Arc::new(Pair::default())).collect();
    let mut receiver_tasks = JoinSet::new();
    for (i, s) in receiver_sessions.into_iter().enumerate() {
        receiver_tasks.spawn(receiver(ctx.clone(), pairs[i].clone(), i, s));
    }
    let mut sender_tasks = JoinSet::new();
    for (i, s) in sender_sessions.into_iter().enumerate() {
        sender_tasks.spawn(sender(ctx.clone(), pairs[i].clone(), i, s));
    }
    let progress = {
        let ctx = ctx.clone();
        let mut rate = Rate::default();
        report::spawn_progress(clock, move |dt| {
            format!(
                "acked {:>9.0} msg/s  errors {:>6}  p99 send->ack {}",
                rate.per_sec(ctx.acked_all.load(Ordering::Relaxed), dt),
                ctx.errors.total(),
                p99_text(&ctx.ack_latency.snapshot())
            )
        })
    };
    let figures = figures_near_end(target, &clock);

    let mut acked_by_pair: Vec<Vec<u64>> = vec![Vec::new(); n];
    while let Some(joined) = sender_tasks.join_next().await {
        let (i, acked) = joined.context("sender task panicked")?;
        acked_by_pair[i] = acked;
    }
    let mut verdict = Verdict::default();
    while let Some(joined) = receiver_tasks.join_next().await {
        let (i, mut delivered, wrong) = joined.context("receiver task panicked")?;
        verdict += check(&mut acked_by_pair[i], &mut delivered, wrong);
    }
    progress.abort();
    let server = figures.await.ok().flatten();

    let secs = clock.measured_secs();
    let acked = ctx.acked_measured.load(Ordering::Relaxed);
    Ok(ChatReport {
        scenario: "chat",
        url: target.url.clone(),
        senders: args.senders,
        window: args.window,
        rate: args.rate,
        payload_bytes: args.payload,
        duration_secs: secs,
        warmup_secs: args.run.warmup.as_secs_f64(),
        acked,
        acked_per_sec: if secs > 0.0 { acked as f64 / secs } else { 0.0 },
        sent_frames: ctx.sent.load(Ordering::Relaxed),
        delivered: ctx.delivered.load(Ordering::Relaxed),
        retries: ctx.retries.load(Ordering::Relaxed),
        duplicate_acks: ctx.duplicate_acks.load(Ordering::Relaxed),
        late_acks: ctx.late_acks.load(Ordering::Relaxed),
        unacked_at_end: ctx.unacked_at_end.load(Ordering::Relaxed),
        rate_skipped: ctx.rate_skipped.load(Ordering::Relaxed),
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver_latency.snapshot()),
        errors: ctx.errors.by_name(),
        disconnects: ctx.disconnects.snapshot(),
        passed: verdict.passed(),
        correctness: verdict,
        server,
        server_log: None,
        server_exited: false,
    })
}

/// The chat sender's view of the sending loop: counts, latencies, acked seqs.
struct ChatHooks<'a> {
    ctx: &'a Ctx,
    i: usize,
    spec: SendSpec,
    acked: Vec<u64>,
    max_acked: u64,
}

impl Hooks for ChatHooks<'_> {
    fn next(&mut self) -> Option<SendSpec> {
        Some(self.spec.clone())
    }

    fn written(&mut self, retry: bool) {
        self.ctx.sent.fetch_add(1, Ordering::Relaxed);
        if retry {
            self.ctx.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn acked(&mut self, ack: &SendAck, pending: Option<Pending>, now: Instant) {
        let ctx = self.ctx;
        ctx.acked_all.fetch_add(1, Ordering::Relaxed);
        if ctx.clock.measured(now) {
            ctx.acked_measured.fetch_add(1, Ordering::Relaxed);
        }
        if ack.duplicate {
            ctx.duplicate_acks.fetch_add(1, Ordering::Relaxed);
        } else {
            self.acked.push(ack.seq);
        }
        self.max_acked = self.max_acked.max(ack.seq);
        match pending {
            Some(p) => {
                if ctx.clock.measured(p.first_sent) {
                    let us = now.saturating_duration_since(p.first_sent);
                    ctx.ack_latency.record(self.i, us.as_micros() as u64);
                }
            }
            None => {
                ctx.late_acks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn refused(&mut self, e: &im_proto::Error, _outcome: Refused) {
        self.ctx.errors.server(e.code);
    }

    fn timed_out(&mut self, _p: Pending) {
        self.ctx.errors.local(LocalError::AckTimeout);
    }

    fn other(&mut self, f: Frame, _now: Instant) -> Vec<Vec<u8>> {
        match f.body {
            Some(Body::Error(e)) => self.ctx.errors.server(e.code),
            Some(Body::Pong(_)) => {}
            _ => self.ctx.errors.local(LocalError::Unexpected),
        }
        Vec::new()
    }

    fn write_failed(&mut self, _e: &im_client::ClientError) {
        self.ctx.errors.local(LocalError::Transport);
    }

    fn ended(&mut self, ev: Result<Event, im_client::ClientError>) {
        self.ctx.disconnects.record(&self.ctx.errors, ev);
    }
}

/// Sender `s{i}`: keeps up to `window` sends in flight (at `--rate`, if set) until the
/// end, then drains. Returns the seqs it was acked.
async fn sender(ctx: Arc<Ctx>, pair: Arc<Pair>, i: usize, session: Session) -> (usize, Vec<u64>) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let mut outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    // Senders are staggered over one interval so that paced sends do not come in waves.
    let mut pacer = ctx.rate_per_sender.map(|r| {
        let offset = Duration::from_secs_f64(i as f64 / (ctx.senders as f64 * r));
        Pacer::new(r, clock.base + offset)
    });
    let mut hooks = ChatHooks {
        ctx: &ctx,
        i,
        spec: SendSpec {
            target: To::User(format!("r{i}").into()),
            msg_type: MessageType::Text,
            payload_len: ctx.payload,
            tag: 0,
        },
        acked: Vec::with_capacity(1024),
        max_acked: 0,
    };
    let cfg = sender::Loop {
        clock,
        window: ctx.window,
        pacer: pacer.as_mut(),
        drain: ctx.drain,
        heartbeat,
        kill: None,
    };
    sender::run(&mut conn, &mut outbox, cfg, &mut hooks).await;
    let ChatHooks {
        acked, max_acked, ..
    } = hooks;

    if let Some(p) = &pacer {
        ctx.rate_skipped.fetch_add(p.skipped(), Ordering::Relaxed);
    }
    ctx.unacked_at_end
        .fetch_add(outbox.len() as u64, Ordering::Relaxed);
    pair.max_acked.store(max_acked, Ordering::Release);
    pair.sender_done.store(true, Ordering::Release);
    let _ = conn.close().await;
    (i, acked)
}

/// Sends a protocol Ping (the server answers Pong, and counts it as activity).
pub async fn ping(conn: &mut Conn) -> Result<(), im_client::ClientError> {
    let client_time = im_proto::now_ms();
    conn.send(&im_proto::frame(0, Body::Ping(Ping { client_time })))
        .await
}

/// Receiver `r{i}`: records every delivered seq (arrival order) and send-to-deliver
/// latency, until its sender is done and it has the highest acked seq, or the drain
/// runs out. Returns the seqs and the count of deliveries from a foreign conversation.
async fn receiver(
    ctx: Arc<Ctx>,
    pair: Arc<Pair>,
    i: usize,
    session: Session,
) -> (usize, Vec<u64>, u64) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let expected = im_proto::direct_conversation(&format!("r{i}"), &format!("s{i}"));
    let mut seqs: Vec<u64> = Vec::with_capacity(1024);
    let mut last = 0u64;
    let mut wrong = 0u64;
    let mut last_tx = Instant::now();
    // Senders give up at end + drain; deliveries then get one more drain.
    let hard_deadline = clock.end + ctx.drain * 2;
    let mut tick = tokio::time::interval(RECEIVER_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            biased;
            ev = conn.recv() => {
                let f = match ev {
                    Ok(Event::Frame(f)) => f,
                    Ok(Event::WsPong(_)) => continue,
                    other => {
                        ctx.disconnects.record(&ctx.errors, other);
                        break;
                    }
                };
                match f.body {
                    Some(Body::Deliver(d)) => {
                        let now_us = clock.now_us();
                        for m in &d.messages {
                            if m.conversation_id != expected {
                                wrong += 1;
                                continue;
                            }
                            seqs.push(m.seq);
                            last = m.seq;
                            if let Some(sent_us) = crate::wire::payload_timestamp(&m.payload) {
                                if clock.measured_us(sent_us) {
                                    ctx.deliver_latency.record(i, now_us.saturating_sub(sent_us));
                                }
                            }
                        }
                        ctx.delivered.fetch_add(d.messages.len() as u64, Ordering::Relaxed);
                        if pair.caught_up(last) {
                            break;
                        }
                    }
                    Some(Body::Error(e)) => ctx.errors.server(e.code),
                    Some(Body::Pong(_)) => {}
                    _ => ctx.errors.local(LocalError::Unexpected),
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= hard_deadline || pair.caught_up(last) {
                    break;
                }
                if now.saturating_duration_since(last_tx) >= heartbeat / 2 {
                    if ping(&mut conn).await.is_err() {
                        ctx.errors.local(LocalError::Transport);
                        break;
                    }
                    last_tx = now;
                }
            }
        }
    }
    let _ = conn.close().await;
    (i, seqs, wrong)
}

/// The text form of a report.
pub fn render(r: &ChatReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let d = &r.send_to_deliver_us;
    let mode = if r.rate > 0.0 {
        format!("rate {:.0} msg/s (window {})", r.rate, r.window)
    } else {
        format!("window {}", r.window)
    };
    let _ = writeln!(
        s,
        "im-bench chat: {} senders -> {} receivers, {mode}, payload {} B, {:.1}s measured after {:.1}s warmup, {}",
        r.senders, r.senders, r.payload_bytes, r.duration_secs, r.warmup_secs, r.url
    );
    report::line(
        &mut s,
        "throughput",
        format!(
            "{:.0} acked msgs/s ({} acked in the measured window; {} send frames, {} retries, {} delivered in total{})",
            r.acked_per_sec,
            r.acked,
            r.sent_frames,
            r.retries,
            r.delivered,
            if r.rate_skipped > 0 {
                format!("; {} scheduled sends skipped: senders fell behind --rate", r.rate_skipped)
            } else {
                String::new()
            }
        ),
    );
    report::summary_line(&mut s, "send->ack", &r.send_to_ack_us);
    report::line(
        &mut s,
        "send->deliver",
        format!(
            "p50 {}  p99 {}  max {}  (n={})",
            fmt_us(d.p50),
            fmt_us(d.p99),
            fmt_us(d.max),
            d.count
        ),
    );
    report::errors_lines(&mut s, &r.errors, &r.disconnects);
    report::verdict_lines(
        &mut s,
        &r.correctness,
        r.passed,
        &format!(
            "{} unacked at end, {} late acks, {} duplicate acks",
            r.unacked_at_end, r.late_acks, r.duplicate_acks
        ),
    );
    report::server_lines(&mut s, r.server.as_ref());
    report::server_log_lines(&mut s, r.server_log.as_ref(), r.server_exited);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_parse_with_defaults() {
        let cli = crate::Cli::try_parse_from([
            "im-bench",
            "chat",
            "--spawn",
            "/bin/im-server",
            "--window",
            "4",
            "--server-env",
            "IM_PERSIST_BATCH_MAX=64",
            "--duration",
            "3s",
            "--rate",
            "500",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Chat(a) = cli.scenario else {
            panic!("not chat")
        };
        assert_eq!(a.senders, 200);
        assert_eq!(a.window, 4);
        assert_eq!(a.rate, 500.0);
        assert_eq!(a.payload, 100);
        assert_eq!(a.run.duration, Duration::from_secs(3));
        assert_eq!(a.run.warmup, Duration::from_secs(2));
        assert_eq!(a.server.secret, crate::scenarios::DEFAULT_SECRET);
        assert_eq!(a.server.sources, 254);
        assert_eq!(
            a.server.server_env,
            vec![("IM_PERSIST_BATCH_MAX".into(), "64".into())]
        );
        assert!(crate::Cli::try_parse_from(["im-bench", "chat", "--payload", "4"]).is_err());
        assert!(crate::Cli::try_parse_from([
            "im-bench",
            "chat",
            "--url",
            "ws://x/ws",
            "--spawn",
            "p"
        ])
        .is_err());
    }

    #[test]
    fn pair_is_caught_up_only_after_the_sender_is_done() {
        let p = Pair::default();
        p.max_acked.store(5, Ordering::Release);
        assert!(!p.caught_up(5));
        p.sender_done.store(true, Ordering::Release);
        assert!(!p.caught_up(4));
        assert!(p.caught_up(5));
    }
}
