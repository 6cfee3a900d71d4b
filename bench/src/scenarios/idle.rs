//! `im-bench idle`: the connect ramp and idle connections with heartbeats (the field reports'
//! "90% of users are silent connections"), and what an idle connection costs the server.
//!
//! `--connections N` are opened over `--ramp T` (connection `i` is due at `i*T/N`, at
//! most `--max-inflight` handshakes at once), each from one of the loopback source
//! addresses ([`crate::target`]), logged in as its own user, then kept alive with a
//! protocol `Ping` (or a WebSocket ping, `--ping-kind ws`) every `--ping-interval`
//! (default: the server's `heartbeat_secs`), starting at a random offset so heartbeats
//! do not come in waves. At each `--checkpoints` count and at N the ramp pauses,
//! waits `--settle` (the server samples its RSS once a second) and reads the server's
//! figures from the admin API; memory per idle connection is `(RSS at n - RSS at 0) / n`.
//! Then the connections are held for `--duration`; on each heartbeat a connection also
//! sends, with probability `--send-prob`, a one-to-one message to another random online
//! connection, and those are checked for exactly-once, in-order delivery.
//!
//! Reported: ramp rate achieved, connect (TCP + WebSocket handshake) and login latency
//! percentiles, heartbeat round trips, the server's figures at 0, at each checkpoint, at
//! N and after the hold, the bench's own RSS, and the verdict. A connection that fails
//! to connect or is dropped during the run fails the scenario, as does any loss or
//! duplicate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use im_client::RawEvent;
use im_proto::{Body, MessageType};
use rand::Rng;
use serde::Serialize;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ledger::{self, Ending, Expect, Ledger};
use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::clock::Clock;
use crate::outbox::{Outbox, SendSpec, Target as To};
use crate::report::{self, fmt_bytes, p99_text, Rate};
use crate::run::{ping, run_tag, Absent, Faults, Head, Problems, Report, Tail};
use crate::stats::{LatencyRecorder, LocalError, Summary};
use crate::target::ServerArgs;
use crate::target::{Dialer, Target};
use crate::util::{fmt_us, max_open_files, parse_duration, self_rss_bytes};
use crate::wire;

/// Histogram shards per latency kind.
const SHARDS: usize = 32;
/// How often a connection checks ack timeouts and the end of the run.
const HOUSEKEEPING: Duration = Duration::from_millis(500);
/// How often the ramp checks whether pending handshakes have finished.
const POLL: Duration = Duration::from_millis(20);
/// File descriptors the bench keeps for itself beyond its connections.
const SPARE_FDS: u64 = 64;

/// The heartbeat a connection sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PingKind {
    /// `Frame{ping}`, answered by `Frame{pong}`.
    Protocol,
    /// A WebSocket ping control frame, answered by a pong.
    Ws,
}

/// Flags of `im-bench idle`.
#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Connections to open (one user each).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Time over which the connections are opened.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Most handshakes (connect + login) in flight at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_inflight: u32,
    /// How long the connections are held idle after the ramp.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// After the hold, how long to wait for outstanding acks and, then, deliveries.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Heartbeat interval (default: the server's `heartbeat_secs` from LoginOk).
    #[arg(long, value_parser = parse_duration)]
    pub ping_interval: Option<Duration>,
    /// Heartbeat kind.
    #[arg(long, value_enum, default_value_t = PingKind::Protocol)]
    pub ping_kind: PingKind,
    /// Connection counts at which to pause the ramp and read the server's memory, e.g.
    /// 1000,10000 (the full count is always read).
    #[arg(long, value_delimiter = ',')]
    pub checkpoints: Vec<u32>,
    /// Wait before each reading of the server's figures.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub settle: Duration,
    /// Chance that a heartbeat (during the hold) also sends a one-to-one message to
    /// another random connection.
    #[arg(long, default_value_t = 0.02)]
    pub send_prob: f64,
    /// Payload bytes of those messages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub payload: u32,
    /// A send with neither SendAck nor Error after this long is given up on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
    /// Print the final report as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Connecting: heartbeats only.
    Ramp,
    /// Holding: heartbeats and the occasional message.
    Hold,
    /// Over: drain, then close.
    Stop,
}

/// Run-wide state shared by every connection task.
struct Ctx {
    clock: Clock,
    dialer: Dialer,
    tag: String,
    run_id: u64,
    ping_interval: Option<Duration>,
    ping_kind: PingKind,
    send_prob: f64,
    payload: usize,
    ack_timeout: Duration,
    drain: Duration,
    phase: watch::Receiver<Phase>,
    online: Vec<AtomicBool>,
    connect_latency: LatencyRecorder,
    login_latency: LatencyRecorder,
    ping_rtt: LatencyRecorder,
    ack_latency: LatencyRecorder,
    deliver_latency: LatencyRecorder,
    count: Counts,
    expect: Expect,
    faults: Faults,
}

counters! {
    /// What the connections count.
    struct Counts => Totals {
        online_now, established, failed, dropped, pings, pongs, sent, acked, delivered,
        unacked_at_end,
    }
}

impl Ctx {
    fn user(&self, idx: usize) -> String {
        format!("i{}-{idx}", self.tag)
    }

    /// A random online connection other than `me`, if one is found quickly.
    fn random_peer(&self, me: usize) -> Option<usize> {
        let mut rng = rand::thread_rng();
        (0..16)
            .map(|_| rng.gen_range(0..self.online.len()))
            .find(|&j| j != me && self.online[j].load(Ordering::Relaxed))
    }

    fn settled(&self) -> u64 {
        self.count.established.get() + self.count.failed.get()
    }
}

/// The server's memory at one connection count.
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    /// Connections open (logged in) when read.
    pub connections: u64,
    /// The server's figures (`None` without an admin API).
    pub server: Option<ServerFigures>,
    /// `(server RSS now - server RSS at 0) / connections`, bytes.
    pub rss_per_connection: Option<f64>,
    /// `(jemalloc allocated now - at 0) / connections`, bytes.
    pub heap_per_connection: Option<f64>,
    /// The bench's own RSS, bytes.
    pub bench_rss_bytes: Option<u64>,
}

/// The final report of an idle run (its server figures are `after_hold`, in the body).
pub type IdleReport = Report<IdleBody>;

/// The idle report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct IdleBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Connections asked for.
    pub connections: u32,
    /// Connections that logged in.
    pub established: u64,
    /// Connections that failed to connect or log in.
    pub failed: u64,
    /// Connections dropped after login.
    pub dropped: u64,
    /// Loopback source addresses used (0: the OS chose).
    pub source_addresses: usize,
    /// Ramp asked for, seconds.
    pub ramp_secs: f64,
    /// Time the ramp took (pauses at checkpoints excluded), seconds.
    pub ramp_actual_secs: f64,
    /// Connections per second achieved over the ramp.
    pub ramp_rate: f64,
    /// Hold, seconds.
    pub hold_secs: f64,
    /// Heartbeat interval used, seconds.
    pub ping_interval_secs: f64,
    /// Heartbeat kind.
    pub ping_kind: PingKind,
    /// TCP connect + WebSocket handshake latency (µs).
    pub connect_us: Summary,
    /// Login to LoginOk latency (µs).
    pub login_us: Summary,
    /// Heartbeat round trips (µs).
    pub ping_rtt_us: Summary,
    /// Heartbeats sent.
    pub pings: u64,
    /// Heartbeat answers received.
    pub pongs: u64,
    /// Server figures before the first connection.
    pub baseline: Option<ServerFigures>,
    /// Readings during the ramp (`--checkpoints`) and at the full count.
    pub checkpoints: Vec<Checkpoint>,
    /// `(RSS at N - RSS at 0) / N`: the server's memory per idle connection, bytes.
    pub memory_per_connection_bytes: Option<f64>,
    /// Server figures after the hold (heartbeats and messages ran).
    pub after_hold: Option<ServerFigures>,
    /// Messages sent during the hold.
    pub messages_sent: u64,
    /// Messages acked.
    pub messages_acked: u64,
    /// Messages delivered.
    pub messages_delivered: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// Send-to-SendAck latency of those messages (µs).
    pub send_to_ack_us: Summary,
    /// Send-to-deliver latency of those messages (µs).
    pub send_to_deliver_us: Summary,
    /// Errors by code; connections that failed or ended, by reason.
    #[serde(flatten)]
    pub problems: Problems,
}

scenario! {
    "idle", IdleArgs => IdleBody,
    correctness: Verdict, server: Absent,
    target: server, json: json,
}

fn per_connection(now: u64, base: u64, conns: u64) -> Option<f64> {
    (conns > 0).then(|| (now as f64 - base as f64) / conns as f64)
}

async fn reading(
    target: &Target,
    connections: u64,
    baseline: Option<&ServerFigures>,
) -> Checkpoint {
    let server = match target.admin() {
        Some(a) => a.try_figures().await,
        None => None,
    };
    let rss_per_connection = match (&server, baseline) {
        (Some(s), Some(b)) => per_connection(s.rss_bytes, b.rss_bytes, connections),
        _ => None,
    };
    let heap_per_connection = match (&server, baseline) {
        (Some(s), Some(b)) => match (&s.jemalloc, &b.jemalloc) {
            (Some(j), Some(jb)) => per_connection(j.allocated, jb.allocated, connections),
            _ => None,
        },
        _ => None,
    };
    Checkpoint {
        connections,
        server,
        rss_per_connection,
        heap_per_connection,
        bench_rss_bytes: self_rss_bytes(),
    }
}

async fn run_against(args: &IdleArgs, target: &mut Target) -> anyhow::Result<IdleReport> {
    let n = args.connections as usize;
    if let Some(limit) = max_open_files() {
        if n as u64 + SPARE_FDS > limit {
            eprintln!(
                "im-bench idle: warning: {n} connections need about {} file descriptors; this process may open {limit} (RLIMIT_NOFILE)",
                n as u64 + SPARE_FDS
            );
        }
    }
    let mut checkpoints: Vec<u32> = args
        .checkpoints
        .iter()
        .copied()
        .filter(|&c| c > 0 && (c as usize) < n)
        .collect();
    checkpoints.sort_unstable();
    checkpoints.dedup();

    eprintln!(
        "im-bench idle: {n} connections over {:?} to {} from {} source addresses",
        args.ramp,
        target.url,
        target.source_count()
    );
    tokio::time::sleep(args.settle).await;
    let baseline = match target.admin() {
        Some(a) => a.try_figures().await,
        None => None,
    };
    let bench_rss_0 = self_rss_bytes();

    let (phase_tx, phase_rx) = watch::channel(Phase::Ramp);
    // The measured window (for message latencies) is set at the hold; until then the
    // clock only serves as time zero.
    let clock = Clock::start(Duration::ZERO, Duration::from_secs(365 * 24 * 3600));
    let run_id: u64 = rand::random();
    let ctx = Arc::new(Ctx {
        clock,
        dialer: target.dialer(),
        tag: run_tag(run_id),
        run_id,
        ping_interval: args.ping_interval,
        ping_kind: args.ping_kind,
        send_prob: args.send_prob.clamp(0.0, 1.0),
        payload: args.payload as usize,
        ack_timeout: args.ack_timeout,
        drain: args.drain,
        phase: phase_rx,
        online: (0..n).map(|_| AtomicBool::new(false)).collect(),
        connect_latency: LatencyRecorder::new(SHARDS),
        login_latency: LatencyRecorder::new(SHARDS),
        ping_rtt: LatencyRecorder::new(SHARDS),
        ack_latency: LatencyRecorder::new(SHARDS),
        deliver_latency: LatencyRecorder::new(SHARDS),
        count: Counts::default(),
        expect: Expect::new(n),
        faults: Faults::default(),
    });
    let progress = {
        let ctx = ctx.clone();
        let (mut conns, mut pings, mut acked) = (Rate::default(), Rate::default(), Rate::default());
        let phase = ctx.phase.clone();
        let label = move |_| match *phase.borrow() {
            Phase::Ramp => "ramp",
            Phase::Hold => "hold",
            Phase::Stop => "drain",
        };
        report::spawn_progress_phased(clock, label, move |dt| {
            let online = ctx.count.online_now.get();
            format!(
                "conns {online:>6}/{n} ({:>6.0}/s)  heartbeats {:>6.0}/s  msgs {:>5.0}/s  errors {:>5}  p99 connect {}  p99 heartbeat {}",
                conns.per_sec(ctx.count.established.get(), dt),
                pings.per_sec(ctx.count.pongs.get(), dt),
                acked.per_sec(ctx.count.acked.get(), dt),
                ctx.faults.errors.total(),
                p99_text(&ctx.connect_latency.snapshot()),
                p99_text(&ctx.ping_rtt.snapshot()),
            )
        })
    };

    // The ramp: connection i is due at i * ramp / n after the start, plus pauses.
    let limit = Arc::new(Semaphore::new(args.max_inflight as usize));
    let step = args.ramp.div_f64(n as f64);
    let ramp_start = Instant::now();
    let mut paused = Duration::ZERO;
    let mut readings = Vec::new();
    let mut next_checkpoint = checkpoints.iter().copied().peekable();
    let mut tasks = JoinSet::new();
    for idx in 0..n {
        tokio::time::sleep_until(ramp_start + step.mul_f64(idx as f64) + paused).await;
        let permit = limit
            .clone()
            .acquire_owned()
            .await
            .context("handshake limiter closed")?;
        let token = target.token(&ctx.user(idx))?;
        tasks.spawn(connection(ctx.clone(), idx, token, permit));
        if next_checkpoint.peek() == Some(&(idx as u32 + 1)) {
            next_checkpoint.next();
            let t = Instant::now();
            while ctx.settled() < idx as u64 + 1 {
                tokio::time::sleep(POLL).await;
            }
            tokio::time::sleep(args.settle).await;
            let open = ctx.count.online_now.get();
            let r = reading(target, open, baseline.as_ref()).await;
            eprintln!(
                "im-bench idle: checkpoint at {open} connections: {}",
                checkpoint_text(&r)
            );
            readings.push(r);
            paused += t.elapsed();
        }
    }
    while ctx.settled() < n as u64 {
        tokio::time::sleep(POLL).await;
    }
    let ramp_actual = ramp_start.elapsed().saturating_sub(paused);
    tokio::time::sleep(args.settle).await;
    let open = ctx.count.online_now.get();
    let at_n = reading(target, open, baseline.as_ref()).await;
    eprintln!(
        "im-bench idle: at {open} connections: {}",
        checkpoint_text(&at_n)
    );
    let memory_per_connection_bytes = at_n.rss_per_connection;
    readings.push(at_n);

    // The hold.
    let hold_start = Instant::now();
    let _ = phase_tx.send(Phase::Hold);
    tokio::time::sleep(args.duration).await;
    let after_hold = match target.admin() {
        Some(a) => a.try_figures().await,
        None => None,
    };
    let _ = phase_tx.send(Phase::Stop);
    let hold = hold_start.elapsed();

    let mut ledgers: Vec<Ledger> = (0..n).map(|_| Ledger::default()).collect();
    while let Some(joined) = tasks.join_next().await {
        let (idx, ledger) = joined.context("connection task panicked")?;
        ledgers[idx] = ledger;
    }
    progress.abort();
    let verdict = ledger::verdict(ledgers);
    if let (Some(b0), Some(last)) = (bench_rss_0, readings.last().and_then(|r| r.bench_rss_bytes)) {
        eprintln!(
            "im-bench idle: the bench itself: {} per connection",
            fmt_bytes(last.saturating_sub(b0) / n.max(1) as u64)
        );
    }

    let c = ctx.count.snapshot();
    let (failed, dropped, established) = (c.failed, c.dropped, c.established);
    let ramp_secs = ramp_actual.as_secs_f64();
    let body = IdleBody {
        head: Head::new("idle", target),
        connections: args.connections,
        established,
        failed,
        dropped,
        source_addresses: target.source_count(),
        ramp_secs: args.ramp.as_secs_f64(),
        ramp_actual_secs: ramp_secs,
        ramp_rate: if ramp_secs > 0.0 {
            established as f64 / ramp_secs
        } else {
            0.0
        },
        hold_secs: hold.as_secs_f64(),
        ping_interval_secs: args.ping_interval.map_or(-1.0, |d| d.as_secs_f64()),
        ping_kind: args.ping_kind,
        connect_us: Summary::of(&ctx.connect_latency.snapshot()),
        login_us: Summary::of(&ctx.login_latency.snapshot()),
        ping_rtt_us: Summary::of(&ctx.ping_rtt.snapshot()),
        pings: c.pings,
        pongs: c.pongs,
        baseline,
        checkpoints: readings,
        memory_per_connection_bytes,
        after_hold,
        messages_sent: c.sent,
        messages_acked: c.acked,
        messages_delivered: c.delivered,
        unacked_at_end: c.unacked_at_end,
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver_latency.snapshot()),
        problems: ctx.faults.problems(),
    };
    let passed = verdict.passed() && failed == 0 && dropped == 0;
    Ok(Report {
        body,
        tail: Tail::new(verdict, passed, Absent),
    })
}

/// One connection: connect, log in, heartbeat (and now and then send) until the stop,
/// drain its acks, wait for what it is owed, close. Returns its index and ledger.
async fn connection(
    ctx: Arc<Ctx>,
    idx: usize,
    token: String,
    permit: OwnedSemaphorePermit,
) -> (usize, Ledger) {
    let mut ledger = Ledger::default();
    let (session, times) = match ctx.dialer.open(idx, &token).await {
        Ok(s) => s,
        Err(e) => {
            drop(permit);
            ctx.count.failed.inc();
            ctx.faults.errors.local(LocalError::Transport);
            ctx.faults
                .disconnects
                .add(format!("connect/login failed: {e}"));
            ctx.expect.absent();
            return (idx, ledger);
        }
    };
    drop(permit);
    ctx.connect_latency
        .record(idx, times.connect.as_micros() as u64);
    ctx.login_latency
        .record(idx, times.login.as_micros() as u64);
    ctx.count.established.inc();
    ctx.online[idx].store(true, Ordering::Relaxed);
    ctx.count.online_now.inc();

    let me = ctx.user(idx);
    let clock = ctx.clock;
    let mut conn = session.conn;
    let interval = ctx.ping_interval.unwrap_or(session.heartbeat);
    let mut next_ping = Instant::now() + interval.mul_f64(rand::random::<f64>());
    let mut ping_sent: Option<Instant> = None;
    let mut outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    let mut phase_rx = ctx.phase.clone();
    let mut ending = Ending::new(idx, ctx.drain, &ctx.count.unacked_at_end, &ctx.expect);
    let mut next_housekeeping = Instant::now() + HOUSEKEEPING;

    loop {
        let now = Instant::now();
        let phase = *phase_rx.borrow_and_update();
        if ending.done(now, phase == Phase::Stop, outbox.len(), &ledger) {
            break;
        }
        for frame in outbox.due_retries(now) {
            if conn.send_bytes(frame).await.is_err() {
                break;
            }
        }
        let mut wake = next_ping.min(next_housekeeping);
        if let Some(at) = outbox.next_retry() {
            wake = wake.min(at);
        }
        tokio::select! {
            biased;
            ev = conn.recv() => {
                let f = match ev {
                    Ok(RawEvent::Frame(f)) => f,
                    Ok(RawEvent::WsPong(sent_us)) => {
                        ctx.count.pongs.inc();
                        ctx.ping_rtt.record(idx, clock.now_us().saturating_sub(sent_us));
                        continue;
                    }
                    other => {
                        ctx.count.dropped.inc();
                        ctx.faults.disconnects.record(&ctx.faults.errors, other);
                        break;
                    }
                };
                let now = Instant::now();
                match f.body {
                    Some(Body::Pong(_)) => {
                        ctx.count.pongs.inc();
                        if let Some(t) = ping_sent.take() {
                            ctx.ping_rtt.record(idx, (now - t).as_micros() as u64);
                        }
                    }
                    Some(Body::SendAck(ack)) => {
                        ctx.count.acked.inc();
                        if let Some(p) = outbox.take(f.req_id) {
                            ctx.ack_latency.record(idx, (now - p.first_sent).as_micros() as u64);
                            if !ack.duplicate {
                                ledger.acked(p.spec.tag, &ack.conversation_id, ack.seq);
                            }
                        }
                    }
                    Some(Body::Deliver(d)) => {
                        let now_us = clock.us(now);
                        for m in &d.messages {
                            if ledger.delivered(&me, m) {
                                ctx.count.delivered.inc();
                                if let Some(sent_us) = wire::payload_timestamp(&m.payload) {
                                    ctx.deliver_latency.record(idx, now_us.saturating_sub(sent_us));
                                }
                            }
                        }
                    }
                    Some(Body::Error(e)) => {
                        ctx.faults.errors.server(e.code);
                        outbox.refused(f.req_id, &e, now);
                    }
                    _ => ctx.faults.errors.local(LocalError::Unexpected),
                }
            }
            _ = phase_rx.changed(), if phase != Phase::Stop => {}
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if now >= next_ping {
                    next_ping += interval;
                    if next_ping < now {
                        next_ping = now + interval;
                    }
                    let sent = match ctx.ping_kind {
                        PingKind::Protocol => {
                            ping_sent = Some(now);
                            ping(&mut conn).await
                        }
                        PingKind::Ws => conn.ws_ping(clock.us(now)).await,
                    };
                    if sent.is_err() {
                        ctx.faults.errors.local(LocalError::Transport);
                    }
                    ctx.count.pings.inc();
                    if phase == Phase::Hold && rand::random::<f64>() < ctx.send_prob {
                        if let Some(peer) = ctx.random_peer(idx) {
                            let spec = SendSpec {
                                target: To::User(ctx.user(peer).into()),
                                msg_type: MessageType::Text,
                                payload_len: ctx.payload,
                                tag: peer as u32,
                            };
                            let frame = outbox.start(spec, now, clock.us(now));
                            if conn.send_bytes(frame).await.is_ok() {
                                ctx.count.sent.inc();
                            }
                        }
                    }
                }
                if now >= next_housekeeping {
                    next_housekeeping = now + HOUSEKEEPING;
                    for _ in outbox.expired(now) {
                        ctx.faults.errors.local(LocalError::AckTimeout);
                    }
                }
            }
        }
    }
    ending.publish(outbox.len(), &ledger);
    ctx.online[idx].store(false, Ordering::Relaxed);
    ctx.count.online_now.sub(1);
    let _ = conn.close().await;
    (idx, ledger)
}

fn checkpoint_text(c: &Checkpoint) -> String {
    let Some(s) = &c.server else {
        return "no server figures".to_owned();
    };
    format!(
        "server rss {}, {} per connection over the baseline (heap {}), server's own estimate {}, headroom {} connections ({}); bench rss {}",
        fmt_bytes(s.rss_bytes),
        c.rss_per_connection
            .map_or("-".into(), |b| fmt_bytes(b.max(0.0) as u64)),
        c.heap_per_connection
            .map_or("-".into(), |b| fmt_bytes(b.max(0.0) as u64)),
        fmt_bytes(s.per_connection_bytes),
        s.headroom_connections,
        s.limiting_resource,
        c.bench_rss_bytes.map_or("-".into(), fmt_bytes),
    )
}

/// The text form of a report.
pub fn render(r: &IdleReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "im-bench idle: {} connections from {} source addresses, ramp {:.1}s, hold {:.1}s, {} heartbeats every {}, {}",
        r.connections,
        r.source_addresses,
        r.ramp_secs,
        r.hold_secs,
        match r.ping_kind {
            PingKind::Protocol => "protocol",
            PingKind::Ws => "websocket",
        },
        if r.ping_interval_secs < 0.0 {
            "heartbeat_secs".to_owned()
        } else {
            format!("{:.1}s", r.ping_interval_secs)
        },
        r.head.url
    );
    report::line(
        &mut s,
        "ramp",
        format!(
            "{} established, {} failed, {} dropped; {:.0} connections/s over {:.1}s",
            r.established, r.failed, r.dropped, r.ramp_rate, r.ramp_actual_secs
        ),
    );
    report::summary_line(&mut s, "connect", &r.connect_us);
    report::summary_line(&mut s, "login", &r.login_us);
    report::summary_line(&mut s, "heartbeat rtt", &r.ping_rtt_us);
    report::line(
        &mut s,
        "",
        format!("{} heartbeats sent, {} answered", r.pings, r.pongs),
    );
    if let Some(b) = &r.baseline {
        report::line(
            &mut s,
            "memory at 0",
            format!("server rss {}", fmt_bytes(b.rss_bytes)),
        );
    }
    for c in &r.checkpoints {
        report::line(
            &mut s,
            &format!("memory at {}", c.connections),
            checkpoint_text(c),
        );
    }
    report::line(
        &mut s,
        "per connection",
        match r.memory_per_connection_bytes {
            Some(b) => format!(
                "{} of server RSS per idle connection ((RSS at N - RSS at 0) / N)",
                fmt_bytes(b.max(0.0) as u64)
            ),
            None => "unknown (no admin API)".to_owned(),
        },
    );
    report::line(
        &mut s,
        "messages",
        format!(
            "{} sent, {} acked, {} delivered during the hold; send->ack p99 {}, send->deliver p99 {}",
            r.messages_sent,
            r.messages_acked,
            r.messages_delivered,
            fmt_us(r.send_to_ack_us.p99),
            fmt_us(r.send_to_deliver_us.p99)
        ),
    );
    r.problems.lines(&mut s);
    r.tail
        .verdict_lines(&mut s, &format!("{} unacked at end", r.unacked_at_end));
    if r.failed > 0 || r.dropped > 0 {
        report::line(
            &mut s,
            "",
            format!(
                "FAIL: {} connections failed and {} were dropped",
                r.failed, r.dropped
            ),
        );
    }
    report::server_lines(&mut s, r.after_hold.as_ref());
    r.tail.server_log_lines(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        let parsed = crate::parse_scenario(&[
            "idle",
            "--connections",
            "19000",
            "--checkpoints",
            "1000,10000",
            "--ping-kind",
            "ws",
            "--ramp",
            "60s",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Idle(a) = parsed else {
            panic!("not idle")
        };
        assert_eq!(a.connections, 19_000);
        assert_eq!(a.checkpoints, vec![1000, 10_000]);
        assert_eq!(a.ping_kind, PingKind::Ws);
        assert_eq!(a.ramp, Duration::from_secs(60));
        assert_eq!(a.ping_interval, None);
        assert_eq!(per_connection(3000, 1000, 1000), Some(2.0));
        assert_eq!(per_connection(3000, 1000, 0), None);
    }
}
