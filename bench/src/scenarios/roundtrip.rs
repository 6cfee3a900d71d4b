//! `im-bench roundtrip`: the full round trip of a conversation turn, timed end to end
//! (the field reports: "a one-way load test is self-deception: send, receive, ack").
//!
//! `--pairs P` pairs of users `a{i}`, `b{i}`. One exchange: `a` sends a message (t0);
//! the server commits it and acks `a` (t1) and pushes it to `b` (t2); `b` acknowledges
//! it with a DeliverAck (t3) and sends a reply; `a` receives the reply (t5) and
//! DeliverAcks it, then starts the next exchange (after `--think`). One exchange is in
//! flight per pair, so P is the concurrency. Timed: send->SendAck (t1-t0),
//! send->deliver (t2-t0), send->DeliverAck written (t3-t0), the reply's send->deliver,
//! and the round trip t5-t0: two durable commits, two pushes, two DeliverAcks.
//!
//! Both directions are checked for exactly-once, in-order delivery. After the run
//! every user reconnects and sends a SyncRequest with no cursors, so the server syncs
//! after its *stored* cursors: what comes back from the other party was delivered but
//! its DeliverAck did not move the cursor (reported as cursor lag; DeliverAcks are
//! advisory, so this is informational, not a failure). The user's own messages come
//! back too (the cursor is per conversation and nothing acks one's own sends); they are
//! not counted.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use im_client::{RawConn, RawEvent};
use im_proto::{Body, DeliverAck, MessageType, SyncRequest};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::check::{check, Verdict};
use crate::clock::Clock;
use crate::outbox::{Outbox, SendSpec, Target as To};
use crate::report::{self, p99_text};
use crate::run::{
    figures_near_end, keep_alive, next_frame, run_tag, spawn_each, Faults, Head, Pair, Problems,
    Report, RunArgs,
};
use crate::stats::{LatencyRecorder, LocalError, Summary};
use crate::target::ServerArgs;
use crate::target::{Session, Target};
use crate::util::parse_duration;
use crate::wire;

/// Histogram shards.
const SHARDS: usize = 16;
/// How often a task wakes to check timeouts and heartbeats.
const TICK: Duration = Duration::from_millis(100);
/// req_id of the cursor-check sync.
const CHECK_REQ: u64 = 7;

/// Flags of `im-bench roundtrip`.
#[derive(Debug, Clone, Args)]
pub struct RoundtripArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Pairs (2 connections each); one exchange in flight per pair.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub pairs: u32,
    /// Pause between the end of one exchange and the next.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub think: Duration,
    /// Payload bytes of both messages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub payload: u32,
    /// An exchange not completed in this long is abandoned (counted) and the next begins.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Skip the stored-cursor check after the run.
    #[arg(long)]
    pub no_cursor_check: bool,
    /// Connect the `b` users to this node (`ws://.../ws`) instead of `--url`: in a cluster,
    /// every push then crosses nodes (cross-node latency against a same-node run).
    #[arg(long, value_name = "WS_URL")]
    pub peer_url: Option<String>,
}

/// Run-wide state shared by every task.
struct Ctx {
    clock: Clock,
    tag: String,
    run_id: u64,
    payload: usize,
    think: Duration,
    timeout: Duration,
    drain: Duration,
    ack: LatencyRecorder,
    deliver: LatencyRecorder,
    deliver_ack: LatencyRecorder,
    reply_deliver: LatencyRecorder,
    round_trip: LatencyRecorder,
    count: Counts,
    faults: Faults,
}

counters! {
    /// What both sides count.
    struct Counts => Totals {
        exchanges, exchanges_measured, abandoned, deliver_acks,
    }
}

impl Ctx {
    fn a(&self, i: usize) -> String {
        format!("t{}-a{i}", self.tag)
    }
    fn b(&self, i: usize) -> String {
        format!("t{}-b{i}", self.tag)
    }
}

/// The two sides' end-of-run handshake: each is the other's sender.
#[derive(Default)]
struct Ends {
    a: Pair,
    b: Pair,
}

/// What one side saw: seqs it was acked, seqs delivered to it, misrouted deliveries.
#[derive(Debug, Default)]
struct Side {
    acked: Vec<u64>,
    delivered: Vec<u64>,
    wrong: u64,
}

/// The final report of a roundtrip run.
pub type RoundtripReport = Report<RoundtripBody>;

/// The roundtrip report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct RoundtripBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Pairs.
    pub pairs: u32,
    /// Think time, seconds.
    pub think_secs: f64,
    /// Payload bytes.
    pub payload_bytes: u32,
    /// Measured seconds.
    pub duration_secs: f64,
    /// Warmup seconds.
    pub warmup_secs: f64,
    /// Exchanges completed in the measured window.
    pub exchanges: u64,
    /// Exchanges per second.
    pub exchanges_per_sec: f64,
    /// Exchanges abandoned after `--timeout`.
    pub abandoned: u64,
    /// DeliverAcks sent.
    pub deliver_acks: u64,
    /// Send to SendAck (µs).
    pub send_to_ack_us: Summary,
    /// Send to the peer's receipt (µs).
    pub send_to_deliver_us: Summary,
    /// Send to the peer's DeliverAck being written (µs).
    pub send_to_deliver_ack_us: Summary,
    /// The reply's send to receipt (µs).
    pub reply_send_to_deliver_us: Summary,
    /// Send to the reply's receipt: the full round trip (µs).
    pub round_trip_us: Summary,
    /// Users whose stored cursor was checked after the run.
    pub cursor_checked: u64,
    /// Of those, users whose stored cursor lagged behind what they had acknowledged.
    pub cursor_behind: u64,
    /// Messages the stored-cursor sync returned again.
    pub cursor_lag_messages: u64,
    /// Errors by code; connections that ended during the run, by reason.
    #[serde(flatten)]
    pub problems: Problems,
}

scenario! {
    "roundtrip", RoundtripArgs => RoundtripBody,
}

async fn run_against(args: &RoundtripArgs, target: &mut Target) -> anyhow::Result<RoundtripReport> {
    let n = args.pairs as usize;
    let run_id: u64 = rand::random();
    let tag = run_tag(run_id);
    let a_users: Vec<String> = (0..n).map(|i| format!("t{tag}-a{i}")).collect();
    let b_users: Vec<String> = (0..n).map(|i| format!("t{tag}-b{i}")).collect();
    let peer = match &args.peer_url {
        Some(url) => Some(
            Target::open(&ServerArgs {
                url: url.clone(),
                spawn: None,
                admin_url: None,
                admin_token: None,
                server_env: Vec::new(),
                ..args.server.clone()
            })
            .await?,
        ),
        None => None,
    };
    let b_target = peer.as_ref().unwrap_or(target);
    eprintln!(
        "im-bench roundtrip: connecting {n} pairs: a to {}, b to {}",
        target.url, b_target.url
    );
    let b_sessions = b_target.connect_all(&b_users, 0).await?;
    let a_sessions = target.connect_all(&a_users, n).await?;
    let clock = Clock::start(args.run.warmup, args.run.duration);
    let ctx = Arc::new(Ctx {
        clock,
        tag,
        run_id,
        payload: args.payload as usize,
        think: args.think,
        timeout: args.timeout,
        drain: args.run.drain,
        ack: LatencyRecorder::new(SHARDS),
        deliver: LatencyRecorder::new(SHARDS),
        deliver_ack: LatencyRecorder::new(SHARDS),
        reply_deliver: LatencyRecorder::new(SHARDS),
        round_trip: LatencyRecorder::new(SHARDS),
        count: Counts::default(),
        faults: Faults::default(),
    });
    let pairs: Vec<Arc<Ends>> = (0..n).map(|_| Arc::new(Ends::default())).collect();
    let mut tasks = spawn_each(b_sessions, |i, s| {
        side_b(ctx.clone(), pairs[i].clone(), i, s)
    });
    for (i, s) in a_sessions.into_iter().enumerate() {
        tasks.spawn(side_a(ctx.clone(), pairs[i].clone(), i, s));
    }
    let progress = report::spawn_rate_progress(clock, ctx.clone(), |ctx, rate, dt| {
        format!(
            "exchanges {:>7.0}/s  errors {:>5}  p99 round trip {}",
            rate.per_sec(ctx.count.exchanges.get(), dt),
            ctx.faults.errors.total(),
            p99_text(&ctx.round_trip.snapshot())
        )
    });
    let figures = figures_near_end(target, &clock);

    // sides[i] = (a, b).
    let mut sides: Vec<(Side, Side)> = (0..n).map(|_| (Side::default(), Side::default())).collect();
    while let Some(joined) = tasks.join_next().await {
        let (i, is_a, side) = joined.context("roundtrip task panicked")?;
        if is_a {
            sides[i].0 = side;
        } else {
            sides[i].1 = side;
        }
    }
    progress.abort();
    let server = figures.await.ok().flatten();
    let mut verdict = Verdict::default();
    for (mut a, mut b) in sides {
        verdict += check(&mut a.acked, &mut b.delivered, b.wrong);
        verdict += check(&mut b.acked, &mut a.delivered, a.wrong);
    }
    let (checked, behind, lag) = if args.no_cursor_check {
        (0, 0, 0)
    } else {
        cursor_check(target, &a_users, &b_users).await?
    };

    let secs = clock.measured_secs();
    let c = ctx.count.snapshot();
    let exchanges = c.exchanges_measured;
    let body = RoundtripBody {
        head: Head::new("roundtrip", target),
        pairs: args.pairs,
        think_secs: args.think.as_secs_f64(),
        payload_bytes: args.payload,
        duration_secs: secs,
        warmup_secs: args.run.warmup.as_secs_f64(),
        exchanges,
        exchanges_per_sec: clock.per_sec(exchanges),
        abandoned: c.abandoned,
        deliver_acks: c.deliver_acks,
        send_to_ack_us: Summary::of(&ctx.ack.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver.snapshot()),
        send_to_deliver_ack_us: Summary::of(&ctx.deliver_ack.snapshot()),
        reply_send_to_deliver_us: Summary::of(&ctx.reply_deliver.snapshot()),
        round_trip_us: Summary::of(&ctx.round_trip.snapshot()),
        cursor_checked: checked,
        cursor_behind: behind,
        cursor_lag_messages: lag,
        problems: ctx.faults.problems(),
    };
    Ok(Report::judged(body, verdict, server))
}

/// Reconnects every user and syncs after the server's stored cursors: returns (users
/// checked, users with messages returned, messages returned).
async fn cursor_check(
    target: &Target,
    a: &[String],
    b: &[String],
) -> anyhow::Result<(u64, u64, u64)> {
    let users: Vec<String> = a.iter().chain(b).cloned().collect();
    let sessions = target.connect_all(&users, 2 * a.len()).await?;
    let mut set = JoinSet::new();
    for (s, me) in sessions.into_iter().zip(users) {
        set.spawn(async move {
            let mut conn = s.conn;
            let req = im_proto::frame(
                CHECK_REQ,
                Body::Sync(SyncRequest {
                    cursors: Vec::new(),
                    limit: 1000,
                    ..Default::default()
                }),
            );
            conn.send(&req)
                .await
                .context("sending the cursor-check sync")?;
            let deadline = Instant::now() + Duration::from_secs(10);
            let returned = loop {
                let ev = tokio::time::timeout_at(deadline, conn.recv())
                    .await
                    .context("no SyncResponse to the cursor check")??;
                match ev {
                    RawEvent::Frame(f) => match f.body {
                        // The user's own messages are not delivered to it, so no
                        // DeliverAck covers them: only the others' count.
                        Some(Body::SyncResp(r)) if f.req_id == CHECK_REQ => {
                            break r.messages.iter().filter(|m| m.sender != me).count() as u64
                        }
                        _ => {}
                    },
                    RawEvent::WsPong(_) => {}
                    RawEvent::Closed { code, reason } => {
                        anyhow::bail!("closed during the cursor check: {code:?} {reason}")
                    }
                }
            };
            let _ = conn.close().await;
            anyhow::Ok(returned)
        });
    }
    let (mut checked, mut behind, mut lag) = (0, 0, 0);
    while let Some(joined) = set.join_next().await {
        let returned = joined.context("cursor check panicked")??;
        checked += 1;
        behind += u64::from(returned > 0);
        lag += returned;
    }
    Ok((checked, behind, lag))
}

/// Writes a DeliverAck for `seq` in `conversation`.
async fn deliver_ack(
    conn: &mut RawConn,
    conversation: &str,
    seq: u64,
) -> Result<(), im_client::ClientError> {
    conn.send(&im_proto::frame(
        0,
        Body::DeliverAck(DeliverAck {
            conversation_id: conversation.to_owned(),
            seq,
        }),
    ))
    .await
}

impl Ctx {
    /// What a side sends to `peer` (text of the run's payload size), and its outbox.
    fn sending_to(&self, peer: String) -> (SendSpec, Outbox) {
        let spec = SendSpec {
            target: To::User(peer.into()),
            msg_type: MessageType::Text,
            payload_len: self.payload,
            tag: 0,
        };
        (spec, Outbox::new(self.run_id, self.timeout))
    }
}

/// Side `a{i}`: runs exchanges until the end, then waits for `b` to finish and for
/// every reply `b` was acked.
async fn side_a(ctx: Arc<Ctx>, pair: Arc<Ends>, i: usize, session: Session) -> (usize, bool, Side) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let conv = im_proto::direct_conversation(&ctx.a(i), &ctx.b(i));
    let (spec, mut outbox) = ctx.sending_to(ctx.b(i));
    let mut side = Side::default();
    let mut max_acked = 0;
    // The exchange in flight: (t0, acked, replied).
    let mut current: Option<(Instant, bool, bool)> = None;
    let mut next_start = Instant::now();
    let mut last_tx = Instant::now();
    let mut last_reply = 0u64;
    let drain_deadline = clock.end + ctx.drain;
    let hard_deadline = clock.end + ctx.drain * 2;
    let mut tick = tokio::time::interval(TICK);

    loop {
        let now = Instant::now();
        if let Some((t0, _, _)) = current {
            if now - t0 >= ctx.timeout {
                ctx.count.abandoned.inc();
                current = None;
                next_start = now;
            }
        }
        if current.is_none() && now < clock.end && now >= next_start {
            let frame = outbox.start(spec.clone(), now, clock.us(now));
            if conn.send_bytes(frame).await.is_err() {
                ctx.faults.errors.local(LocalError::Transport);
                break;
            }
            current = Some((now, false, false));
            last_tx = now;
        }
        let a_finished = now >= clock.end && (current.is_none() || now >= drain_deadline);
        if a_finished && !pair.a.done() {
            pair.a.sender_finished(max_acked);
        }
        if a_finished && (pair.b.caught_up(last_reply) || now >= hard_deadline) {
            break;
        }
        tokio::select! {
            biased;
            f = next_frame(&mut conn, &ctx.faults) => {
                let Some(f) = f else { break };
                let now = Instant::now();
                match f.body {
                    Some(Body::SendAck(ack)) => {
                        if let Some(p) = outbox.take(f.req_id) {
                            if clock.measured(p.first_sent) {
                                ctx.ack.record(i, (now - p.first_sent).as_micros() as u64);
                            }
                        }
                        if !ack.duplicate {
                            side.acked.push(ack.seq);
                        }
                        max_acked = max_acked.max(ack.seq);
                        if let Some(c) = current.as_mut() {
                            c.1 = true;
                        }
                    }
                    Some(Body::Deliver(d)) => {
                        let now_us = clock.us(now);
                        for m in &d.messages {
                            if m.conversation_id != conv {
                                side.wrong += 1;
                                continue;
                            }
                            side.delivered.push(m.seq);
                            last_reply = last_reply.max(m.seq);
                            if let Some(sent_us) = wire::payload_timestamp(&m.payload) {
                                if clock.measured_us(sent_us) {
                                    ctx.reply_deliver.record(i, now_us.saturating_sub(sent_us));
                                }
                            }
                            if deliver_ack(&mut conn, &conv, m.seq).await.is_err() {
                                ctx.faults.errors.local(LocalError::Transport);
                            }
                            ctx.count.deliver_acks.inc();
                            last_tx = now;
                            if let Some(c) = current.as_mut() {
                                c.2 = true;
                            }
                        }
                    }
                    Some(Body::Error(e)) => {
                        ctx.faults.errors.server(e.code);
                        outbox.refused(f.req_id, &e, now);
                    }
                    Some(Body::Pong(_)) => {}
                    _ => ctx.faults.errors.local(LocalError::Unexpected),
                }
                if let Some((t0, true, true)) = current {
                    current = None;
                    ctx.count.exchanges.inc();
                    if clock.measured(t0) {
                        ctx.count.exchanges_measured.inc();
                        ctx.round_trip.record(i, (now - t0).as_micros() as u64);
                    }
                    next_start = now + ctx.think;
                }
            }
            () = tokio::time::sleep_until(next_start), if current.is_none() && next_start > now && now < clock.end => {}
            _ = tick.tick() => {
                let now = Instant::now();
                for frame in outbox.due_retries(now) {
                    let _ = conn.send_bytes(frame).await;
                }
                outbox.expired(now);
                if keep_alive(&mut conn, now, &mut last_tx, heartbeat, &ctx.faults).await.is_err() {
                    break;
                }
            }
        }
    }
    if !pair.a.done() {
        pair.a.sender_finished(max_acked);
    }
    let _ = conn.close().await;
    (i, true, side)
}

/// Side `b{i}`: DeliverAcks each message from `a` and replies to it; ends once `a` is
/// done, it has what `a` was acked and its own replies are acked.
async fn side_b(ctx: Arc<Ctx>, pair: Arc<Ends>, i: usize, session: Session) -> (usize, bool, Side) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let conv = im_proto::direct_conversation(&ctx.a(i), &ctx.b(i));
    let (spec, mut outbox) = ctx.sending_to(ctx.a(i));
    let mut side = Side::default();
    let mut max_acked = 0;
    let mut last = 0u64;
    let mut last_tx = Instant::now();
    let hard_deadline = clock.end + ctx.drain * 2;
    let mut tick = tokio::time::interval(TICK);

    loop {
        let now = Instant::now();
        if (pair.a.caught_up(last) && outbox.is_empty()) || now >= hard_deadline {
            break;
        }
        tokio::select! {
            biased;
            f = next_frame(&mut conn, &ctx.faults) => {
                let Some(f) = f else { break };
                let now = Instant::now();
                match f.body {
                    Some(Body::Deliver(d)) => {
                        let now_us = clock.us(now);
                        for m in &d.messages {
                            if m.conversation_id != conv {
                                side.wrong += 1;
                                continue;
                            }
                            side.delivered.push(m.seq);
                            last = last.max(m.seq);
                            let sent_us = wire::payload_timestamp(&m.payload);
                            if let Some(sent_us) = sent_us.filter(|&t| clock.measured_us(t)) {
                                ctx.deliver.record(i, now_us.saturating_sub(sent_us));
                            }
                            if deliver_ack(&mut conn, &conv, m.seq).await.is_err() {
                                ctx.faults.errors.local(LocalError::Transport);
                                continue;
                            }
                            ctx.count.deliver_acks.inc();
                            let t3 = Instant::now();
                            if let Some(sent_us) = sent_us.filter(|&t| clock.measured_us(t)) {
                                ctx.deliver_ack.record(i, clock.us(t3).saturating_sub(sent_us));
                            }
                            let frame = outbox.start(spec.clone(), t3, clock.us(t3));
                            if conn.send_bytes(frame).await.is_err() {
                                ctx.faults.errors.local(LocalError::Transport);
                            }
                            last_tx = t3;
                        }
                    }
                    Some(Body::SendAck(ack)) => {
                        outbox.take(f.req_id);
                        if !ack.duplicate {
                            side.acked.push(ack.seq);
                        }
                        max_acked = max_acked.max(ack.seq);
                    }
                    Some(Body::Error(e)) => {
                        ctx.faults.errors.server(e.code);
                        outbox.refused(f.req_id, &e, now);
                    }
                    Some(Body::Pong(_)) => {}
                    _ => ctx.faults.errors.local(LocalError::Unexpected),
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                for frame in outbox.due_retries(now) {
                    let _ = conn.send_bytes(frame).await;
                }
                for _ in outbox.expired(now) {
                    ctx.faults.errors.local(LocalError::AckTimeout);
                }
                if keep_alive(&mut conn, now, &mut last_tx, heartbeat, &ctx.faults).await.is_err() {
                    break;
                }
            }
        }
    }
    pair.b.sender_finished(max_acked);
    let _ = conn.close().await;
    (i, false, side)
}

/// The text form of a report.
pub fn render(r: &RoundtripReport) -> String {
    let mut s = String::new();
    s.push_str(&r.head.text(
        r.duration_secs,
        r.warmup_secs,
        format_args!(
            "{} pairs, one exchange in flight each, think {:.3}s, payload {} B",
            r.pairs, r.think_secs, r.payload_bytes
        ),
    ));
    report::line(
        &mut s,
        "throughput",
        format!(
            "{:.0} exchanges/s ({} in the measured window, {} abandoned; {} DeliverAcks)",
            r.exchanges_per_sec, r.exchanges, r.abandoned, r.deliver_acks
        ),
    );
    report::summary_line(&mut s, "send->ack", &r.send_to_ack_us);
    report::summary_line(&mut s, "send->deliver", &r.send_to_deliver_us);
    report::summary_line(&mut s, "send->dlvr-ack", &r.send_to_deliver_ack_us);
    report::summary_line(&mut s, "reply->deliver", &r.reply_send_to_deliver_us);
    report::summary_line(&mut s, "round trip", &r.round_trip_us);
    if r.cursor_checked > 0 {
        report::line(
            &mut s,
            "stored cursors",
            format!(
                "{} users re-synced after their stored cursors: {} behind, {} messages returned again",
                r.cursor_checked, r.cursor_behind, r.cursor_lag_messages
            ),
        );
    }
    r.problems.lines(&mut s);
    r.tail.verdict_lines(&mut s, "");
    r.tail.with_server_lines(s)
}
