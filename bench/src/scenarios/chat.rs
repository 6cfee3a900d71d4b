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

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use im_proto::{Body, MessageType};
use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};

use super::sender::{self, SendCounts, ToOne};
use crate::check::{check, Verdict};
use crate::clock::Clock;
use crate::outbox::{Outbox, Pacer, SendSpec, Target as To};
use crate::report::{self, p99_text};
use crate::run::{
    figures_near_end, keep_alive, next_frame, spawn_each, Faults, Head, Pair, Problems, Report,
    RunArgs,
};
use crate::stats::{Counter, LatencyRecorder, Summary};
use crate::target::ServerArgs;
use crate::target::{Session, Target};
use crate::util::{fmt_us, parse_duration};

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
    send: SendCounts,
    /// Messages received by receivers.
    delivered: Counter,
    faults: Faults,
}

sender::run_counts!(Ctx);

/// The final report of a chat run (printed as text, or as JSON with `--json`).
pub type ChatReport = Report<ChatBody>;

/// The chat report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct ChatBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
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
    /// Errors by code (server codes upper case, bench-side ones lower case); connections
    /// that ended during the run, by close code and reason (or error).
    #[serde(flatten)]
    pub problems: Problems,
}

scenario! {
    "chat", ChatArgs => ChatBody,
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
        send: SendCounts::default(),
        delivered: Counter::default(),
        faults: Faults::default(),
    });

    let pairs: Vec<Arc<Pair>> = (0..n).map(|_| Arc::new(Pair::default())).collect();
    let mut receiver_tasks = spawn_each(receiver_sessions, |i, s| {
        receiver(ctx.clone(), pairs[i].clone(), i, s)
    });
    let mut sender_tasks = spawn_each(sender_sessions, |i, s| {
        sender(ctx.clone(), pairs[i].clone(), i, s)
    });
    let progress = report::spawn_rate_progress(clock, ctx.clone(), |ctx, rate, dt| {
        format!(
            "acked {:>9.0} msg/s  errors {:>6}  p99 send->ack {}",
            rate.per_sec(ctx.send.acked_all.get(), dt),
            ctx.faults.errors.total(),
            p99_text(&ctx.ack_latency.snapshot())
        )
    });
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
    let t = ctx.send.snapshot();
    let acked = t.acked_measured;
    let body = ChatBody {
        head: Head::new("chat", target),
        senders: args.senders,
        window: args.window,
        rate: args.rate,
        payload_bytes: args.payload,
        duration_secs: secs,
        warmup_secs: args.run.warmup.as_secs_f64(),
        acked,
        acked_per_sec: clock.per_sec(acked),
        sent_frames: t.sent,
        delivered: ctx.delivered.get(),
        retries: t.retries,
        duplicate_acks: t.duplicate_acks,
        late_acks: t.late_acks,
        unacked_at_end: t.unacked_at_end,
        rate_skipped: t.rate_skipped,
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver_latency.snapshot()),
        problems: ctx.faults.problems(),
    };
    Ok(Report::judged(body, verdict, server))
}

/// Sender `s{i}`: keeps up to `window` sends in flight (at `--rate`, if set) until the
/// end, then drains. Returns the seqs it was acked.
async fn sender(ctx: Arc<Ctx>, pair: Arc<Pair>, i: usize, session: Session) -> (usize, Vec<u64>) {
    let clock = ctx.clock;
    let outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    let pacer = ctx
        .rate_per_sender
        .map(|r| Pacer::staggered(r, i, ctx.senders, clock.base));
    let spec = SendSpec {
        target: To::User(format!("r{i}").into()),
        msg_type: MessageType::Text,
        payload_len: ctx.payload,
        tag: 0,
    };
    let mut hooks = ToOne::new(ctx.counts(), clock, &ctx.ack_latency, i, spec);
    let mut conn =
        sender::run_to_one(session, outbox, pacer, ctx.window, ctx.drain, &mut hooks).await;
    pair.sender_finished(hooks.max_acked);
    let _ = conn.close().await;
    (i, hooks.acked)
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
            f = next_frame(&mut conn, &ctx.faults) => {
                let Some(f) = f else { break };
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
                        ctx.delivered.add(d.messages.len() as u64);
                        if pair.caught_up(last) {
                            break;
                        }
                    }
                    _ => ctx.faults.errors.stray(&f),
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= hard_deadline || pair.caught_up(last) {
                    break;
                }
                if keep_alive(&mut conn, now, &mut last_tx, heartbeat, &ctx.faults).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = conn.close().await;
    (i, seqs, wrong)
}

/// The text form of a report.
pub fn render(r: &ChatReport) -> String {
    let mut s = String::new();
    let d = &r.send_to_deliver_us;
    let mode = if r.rate > 0.0 {
        format!("rate {:.0} msg/s (window {})", r.rate, r.window)
    } else {
        format!("window {}", r.window)
    };
    s.push_str(&r.head.text(
        r.duration_secs,
        r.warmup_secs,
        format_args!(
            "{} senders -> {} receivers, {mode}, payload {} B",
            r.senders, r.senders, r.payload_bytes
        ),
    ));
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
    r.problems.lines(&mut s);
    r.tail.verdict_lines(
        &mut s,
        &format!(
            "{} unacked at end, {} late acks, {} duplicate acks",
            r.unacked_at_end, r.late_acks, r.duplicate_acks
        ),
    );
    r.tail.with_server_lines(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults() {
        let parsed = crate::parse_scenario(&[
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
        let crate::scenarios::Scenario::Chat(a) = parsed else {
            panic!("not chat")
        };
        assert_eq!(a.senders, 200);
        assert_eq!(a.window, 4);
        assert_eq!(a.rate, 500.0);
        assert_eq!(a.payload, 100);
        assert_eq!(a.run.duration, Duration::from_secs(3));
        assert_eq!(a.run.warmup, Duration::from_secs(2));
        assert_eq!(a.server.secret, crate::target::DEFAULT_SECRET);
        assert_eq!(a.server.sources, 254);
        assert_eq!(
            a.server.server_env,
            vec![("IM_PERSIST_BATCH_MAX".into(), "64".into())]
        );
        assert!(crate::parse_scenario(&["chat", "--payload", "4"]).is_err());
        assert!(crate::parse_scenario(&["chat", "--url", "ws://x/ws", "--spawn", "p"]).is_err());
    }
}
