//! `im-bench chat`: one-to-one durable chat.
//!
//! Sender `s{i}` sends TEXT messages to receiver `r{i}`, keeping up to `--window`
//! un-acked sends in flight; every Send has a unique client_msg_id and its frame's
//! `req_id` is the sender's message number, so acks and errors map back without a
//! lookup table. Receivers read Deliver frames. Measured, after the warmup:
//! send-to-SendAck latency per message, send-to-deliver latency (the payload carries
//! the send time), acked messages per second and errors by code. `OVERLOADED` is retried
//! with the same client_msg_id after `retry_after_ms`, latency still counted from the
//! first attempt.
//!
//! When the measured time is over, senders stop sending and wait (up to `--drain`) for
//! outstanding acks; each receiver then waits until it has seen its sender's highest
//! acked seq. The [`crate::check`] verdict over all pairs decides the exit code.
//!
//! Hot path: one allocation per Send (the frame, see [`crate::wire`]); per-task state
//! is a small vector of pending sends and a vector of seqs for the checker; histograms
//! are sharded so tasks rarely contend.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use im_client::{RawConn, RawEvent};
use im_proto::{Body, ErrorCode, Ping};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::{RunArgs, ServerArgs};
use crate::check::{check, Verdict};
use crate::spawn::ServerLog;
use crate::stats::{ErrorCounts, LatencyRecorder, LocalError, Summary};
use crate::target::{Session, Target};
use crate::util::{fmt_us, parse_duration};
use crate::{wire, Outcome};

/// Histogram shards per latency kind.
const SHARDS: usize = 16;
/// How often a sender checks for ack timeouts and heartbeats.
const SENDER_HOUSEKEEPING: Duration = Duration::from_millis(250);
/// How often an idle receiver wakes to check heartbeats and the end of the drain.
const RECEIVER_TICK: Duration = Duration::from_millis(100);
/// Smallest wait before retrying an `OVERLOADED` send.
const MIN_RETRY: Duration = Duration::from_millis(1);

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
    /// Time zero of payload timestamps.
    base: Instant,
    /// Measuring starts here.
    warmup_end: Instant,
    /// Measuring (and sending) stops here.
    end: Instant,
    warmup_end_us: u64,
    end_us: u64,
    window: usize,
    payload: usize,
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
    /// OVERLOADED retries.
    retries: AtomicU64,
    /// SendAcks with duplicate=true.
    duplicate_acks: AtomicU64,
    /// Acks that came after their send was given up on.
    late_acks: AtomicU64,
    /// Sends still un-acked when the drain ended.
    unacked_at_end: AtomicU64,
    /// Messages received by receivers.
    delivered: AtomicU64,
    errors: ErrorCounts,
}

impl Ctx {
    fn us_since_base(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_micros() as u64
    }

    fn measured(&self, t: Instant) -> bool {
        t >= self.warmup_end && t < self.end
    }
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

/// One send waiting for its ack.
struct Pending {
    /// Message number (also the frame's req_id).
    n: u64,
    /// When the first attempt was written.
    first_sent: Instant,
    /// Payload timestamp of the first attempt.
    first_sent_us: u64,
    /// When the last attempt was written (ack timeout runs from here).
    last_sent: Instant,
    /// Set after OVERLOADED: when to resend.
    retry_at: Option<Instant>,
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
    /// OVERLOADED retries.
    pub retries: u64,
    /// SendAcks flagged duplicate (should be 0: no message is sent twice after a commit).
    pub duplicate_acks: u64,
    /// Acks that arrived after the bench had given up on them.
    pub late_acks: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// Send-to-SendAck latency (µs) of messages first sent in the measured window.
    pub send_to_ack_us: Summary,
    /// Send-to-Deliver latency (µs) of messages first sent in the measured window.
    pub send_to_deliver_us: Summary,
    /// Errors by code (server codes upper case, bench-side ones lower case).
    pub errors: BTreeMap<String, u64>,
    /// The delivery check over all pairs.
    pub correctness: Verdict,
    /// Whether the check passed.
    pub passed: bool,
    /// With `--spawn`: what the server logged at WARN/ERROR level.
    pub server_log: Option<ServerLog>,
}

/// Runs the chat scenario.
pub async fn run(args: ChatArgs) -> anyhow::Result<Outcome> {
    let mut target = Target::open(&args.server).await?;
    let result = run_against(&args, &mut target).await;
    let server_log = target.close().await;
    let mut report = result?;
    report.server_log = server_log;
    if args.run.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.passed {
        Outcome::Pass
    } else {
        Outcome::Fail
    })
}

async fn run_against(args: &ChatArgs, target: &mut Target) -> anyhow::Result<ChatReport> {
    let n = args.senders as usize;
    let receivers: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let senders: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    eprintln!(
        "im-bench chat: connecting {n} receivers and {n} senders to {}",
        target.url
    );
    // Receivers first, so every message has an online recipient.
    let receiver_sessions = target.connect_all(&receivers).await?;
    let sender_sessions = target.connect_all(&senders).await?;

    let base = Instant::now();
    let warmup_end = base + args.run.warmup;
    let end = warmup_end + args.run.duration;
    let ctx = Arc::new(Ctx {
        base,
        warmup_end,
        end,
        warmup_end_us: args.run.warmup.as_micros() as u64,
        end_us: (args.run.warmup + args.run.duration).as_micros() as u64,
        window: args.window as usize,
        payload: args.payload as usize,
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
        delivered: AtomicU64::new(0),
        errors: ErrorCounts::default(),
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
    let progress = tokio::spawn(progress(ctx.clone()));

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
    if !target.server_alive() {
        eprintln!("im-bench: the spawned server exited during the run");
    }

    let secs = args.run.duration.as_secs_f64();
    let acked = ctx.acked_measured.load(Ordering::Relaxed);
    Ok(ChatReport {
        scenario: "chat",
        url: target.url.clone(),
        senders: args.senders,
        window: args.window,
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
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver_latency.snapshot()),
        errors: ctx.errors.by_name(),
        passed: verdict.passed(),
        correctness: verdict,
        server_log: None,
    })
}

/// Writes one Send attempt for message `n`.
async fn write_send(
    ctx: &Ctx,
    conn: &mut RawConn,
    to: &str,
    n: u64,
    sent_us: u64,
) -> Result<(), im_client::ClientError> {
    let id = wire::client_msg_id(ctx.run_id, n);
    let frame = wire::encode_send(n, to, &id, ctx.payload, sent_us);
    conn.send_bytes(frame).await?;
    ctx.sent.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sender `s{i}`: keeps `window` sends in flight until the end, then drains. Returns
/// the seqs it was acked.
async fn sender(ctx: Arc<Ctx>, pair: Arc<Pair>, i: usize, session: Session) -> (usize, Vec<u64>) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let to = format!("r{i}");
    let mut pending: Vec<Pending> = Vec::with_capacity(ctx.window);
    let mut acked: Vec<u64> = Vec::with_capacity(1024);
    let mut max_acked = 0u64;
    let mut next_n = 1u64;
    let mut last_tx = Instant::now();
    let mut next_housekeeping = last_tx + SENDER_HOUSEKEEPING;
    let drain_deadline = ctx.end + ctx.drain;
    let sleep = tokio::time::sleep_until(next_housekeeping);
    tokio::pin!(sleep);
    let mut wake = Some(next_housekeeping);

    'run: loop {
        let now = Instant::now();
        let sending = now < ctx.end;
        if !sending && (pending.is_empty() || now >= drain_deadline) {
            break;
        }
        // Retries that are due, then new messages up to the window.
        for p in pending.iter_mut() {
            if p.retry_at.is_some_and(|at| at <= now) {
                if write_send(&ctx, &mut conn, &to, p.n, p.first_sent_us)
                    .await
                    .is_err()
                {
                    ctx.errors.local(LocalError::Transport);
                    break 'run;
                }
                ctx.retries.fetch_add(1, Ordering::Relaxed);
                p.retry_at = None;
                p.last_sent = Instant::now();
                last_tx = p.last_sent;
            }
        }
        while sending && pending.len() < ctx.window {
            let n = next_n;
            next_n += 1;
            let t = Instant::now();
            let t_us = ctx.us_since_base(t);
            if write_send(&ctx, &mut conn, &to, n, t_us).await.is_err() {
                ctx.errors.local(LocalError::Transport);
                break 'run;
            }
            pending.push(Pending {
                n,
                first_sent: t,
                first_sent_us: t_us,
                last_sent: t,
                retry_at: None,
            });
            last_tx = t;
        }

        let mut want = next_housekeeping.min(if sending { ctx.end } else { drain_deadline });
        for at in pending.iter().filter_map(|p| p.retry_at) {
            want = want.min(at);
        }
        if wake != Some(want) {
            sleep.as_mut().reset(want);
            wake = Some(want);
        }

        tokio::select! {
            biased;
            ev = conn.recv() => {
                let f = match ev {
                    Ok(RawEvent::Frame(f)) => f,
                    Ok(RawEvent::Closed { .. }) => {
                        ctx.errors.local(LocalError::Closed);
                        break 'run;
                    }
                    Err(_) => {
                        ctx.errors.local(LocalError::Transport);
                        break 'run;
                    }
                };
                let now = Instant::now();
                let slot = pending.iter().position(|p| p.n == f.req_id);
                match f.body {
                    Some(Body::SendAck(ack)) => {
                        ctx.acked_all.fetch_add(1, Ordering::Relaxed);
                        if ctx.measured(now) {
                            ctx.acked_measured.fetch_add(1, Ordering::Relaxed);
                        }
                        if ack.duplicate {
                            ctx.duplicate_acks.fetch_add(1, Ordering::Relaxed);
                        } else {
                            acked.push(ack.seq);
                        }
                        max_acked = max_acked.max(ack.seq);
                        match slot {
                            Some(idx) => {
                                let p = pending.swap_remove(idx);
                                if ctx.measured(p.first_sent) {
                                    let us = now.saturating_duration_since(p.first_sent);
                                    ctx.ack_latency.record(i, us.as_micros() as u64);
                                }
                            }
                            None => {
                                ctx.late_acks.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Some(Body::Error(e)) => {
                        ctx.errors.server(e.code);
                        if let Some(idx) = slot {
                            if e.code == ErrorCode::Overloaded as i32 {
                                let wait = Duration::from_millis(u64::from(e.retry_after_ms));
                                pending[idx].retry_at = Some(now + wait.max(MIN_RETRY));
                            } else {
                                pending.swap_remove(idx);
                            }
                        }
                    }
                    Some(Body::Pong(_)) => {}
                    _ => ctx.errors.local(LocalError::Unexpected),
                }
            }
            () = &mut sleep => {
                // The sleep is spent: force a reset on the next turn.
                wake = None;
                let now = Instant::now();
                if now >= next_housekeeping {
                    next_housekeeping = now + SENDER_HOUSEKEEPING;
                    let before = pending.len();
                    pending.retain(|p| {
                        p.retry_at.is_some() || now.saturating_duration_since(p.last_sent) < ctx.ack_timeout
                    });
                    for _ in pending.len()..before {
                        ctx.errors.local(LocalError::AckTimeout);
                    }
                    if now.saturating_duration_since(last_tx) >= heartbeat / 2 {
                        if ping(&mut conn).await.is_err() {
                            ctx.errors.local(LocalError::Transport);
                            break 'run;
                        }
                        last_tx = now;
                    }
                }
            }
        }
    }

    ctx.unacked_at_end
        .fetch_add(pending.len() as u64, Ordering::Relaxed);
    pair.max_acked.store(max_acked, Ordering::Release);
    pair.sender_done.store(true, Ordering::Release);
    let _ = conn.close().await;
    (i, acked)
}

async fn ping(conn: &mut RawConn) -> Result<(), im_client::ClientError> {
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
    let expected = im_proto::direct_conversation(&format!("r{i}"), &format!("s{i}"));
    let mut seqs: Vec<u64> = Vec::with_capacity(1024);
    let mut last = 0u64;
    let mut wrong = 0u64;
    let mut last_tx = Instant::now();
    // Senders give up at end + drain; deliveries then get one more drain.
    let hard_deadline = ctx.end + ctx.drain * 2;
    let mut tick = tokio::time::interval(RECEIVER_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            biased;
            ev = conn.recv() => {
                let f = match ev {
                    Ok(RawEvent::Frame(f)) => f,
                    Ok(RawEvent::Closed { .. }) => {
                        ctx.errors.local(LocalError::Closed);
                        break;
                    }
                    Err(_) => {
                        ctx.errors.local(LocalError::Transport);
                        break;
                    }
                };
                match f.body {
                    Some(Body::Deliver(d)) => {
                        let now_us = ctx.us_since_base(Instant::now());
                        for m in &d.messages {
                            if m.conversation_id != expected {
                                wrong += 1;
                                continue;
                            }
                            seqs.push(m.seq);
                            last = m.seq;
                            if let Some(sent_us) = wire::payload_timestamp(&m.payload) {
                                if (ctx.warmup_end_us..ctx.end_us).contains(&sent_us) {
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

/// Prints one line a second to stderr until aborted: acked msgs/s in the last second,
/// errors so far, p99 send-to-ack so far (measured window only).
async fn progress(ctx: Arc<Ctx>) {
    let mut tick =
        tokio::time::interval_at(ctx.base + Duration::from_secs(1), Duration::from_secs(1));
    let mut prev = 0u64;
    let mut prev_t = ctx.base;
    loop {
        let now = tick.tick().await;
        let acked = ctx.acked_all.load(Ordering::Relaxed);
        let rate = (acked - prev) as f64 / now.saturating_duration_since(prev_t).as_secs_f64();
        (prev, prev_t) = (acked, now);
        let phase = if now <= ctx.warmup_end {
            "warmup"
        } else if now <= ctx.end {
            "measure"
        } else {
            "drain"
        };
        let h = ctx.ack_latency.snapshot();
        let p99 = if h.is_empty() {
            "-".to_string()
        } else {
            fmt_us(h.value_at_quantile(0.99))
        };
        eprintln!(
            "[{:>4}s {phase:<7}] acked {rate:>9.0} msg/s  errors {:>6}  p99 send->ack {p99}",
            now.saturating_duration_since(ctx.base).as_secs(),
            ctx.errors.total(),
        );
    }
}

/// The text form of a report.
pub fn render(r: &ChatReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let a = &r.send_to_ack_us;
    let d = &r.send_to_deliver_us;
    let _ = writeln!(
        s,
        "im-bench chat: {} senders -> {} receivers, window {}, payload {} B, {:.1}s measured after {:.1}s warmup, {}",
        r.senders, r.senders, r.window, r.payload_bytes, r.duration_secs, r.warmup_secs, r.url
    );
    let _ = writeln!(
        s,
        "throughput       {:.0} acked msgs/s ({} acked in the measured window; {} send frames, {} retries, {} delivered in total)",
        r.acked_per_sec, r.acked, r.sent_frames, r.retries, r.delivered
    );
    let _ = writeln!(
        s,
        "send->ack        p50 {}  p95 {}  p99 {}  p999 {}  max {}  (n={})",
        fmt_us(a.p50),
        fmt_us(a.p95),
        fmt_us(a.p99),
        fmt_us(a.p999),
        fmt_us(a.max),
        a.count
    );
    let _ = writeln!(
        s,
        "send->deliver    p50 {}  p99 {}  max {}  (n={})",
        fmt_us(d.p50),
        fmt_us(d.p99),
        fmt_us(d.max),
        d.count
    );
    let errors = if r.errors.is_empty() {
        "none".to_string()
    } else {
        r.errors
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(s, "errors           {errors}");
    let c = &r.correctness;
    let _ = writeln!(
        s,
        "correctness      {}: {} acked, {} deliveries over {} conversations; missing {}, duplicates {}, not increasing {}, seq reused {}, wrong conversation {}",
        if r.passed { "PASS" } else { "FAIL" },
        c.acked,
        c.delivered,
        c.conversations,
        c.missing,
        c.duplicates,
        c.not_increasing,
        c.seq_reused,
        c.wrong_conversation
    );
    let _ = writeln!(
        s,
        "                 (info: {} delivered but not acked, {} seq gaps, {} unacked at end, {} late acks, {} duplicate acks)",
        c.delivered_unacked, c.gaps, r.unacked_at_end, r.late_acks, r.duplicate_acks
    );
    if let Some(log) = &r.server_log {
        let _ = writeln!(
            s,
            "server log       {} WARN, {} ERROR lines",
            log.warnings, log.errors
        );
        for line in &log.samples {
            let _ = writeln!(s, "  {line}");
        }
    }
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
        ])
        .unwrap();
        let crate::scenarios::Scenario::Chat(a) = cli.scenario;
        assert_eq!(a.senders, 200);
        assert_eq!(a.window, 4);
        assert_eq!(a.payload, 100);
        assert_eq!(a.run.duration, Duration::from_secs(3));
        assert_eq!(a.run.warmup, Duration::from_secs(2));
        assert_eq!(a.server.secret, crate::scenarios::DEFAULT_SECRET);
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
