//! `im-bench peer <idle|broadcast|pairs> --protocol im|mqtt-ws|nats-ws`: the same three
//! traffic shapes against im-server, an MQTT 3.1.1 broker (Mosquitto) or nats-server,
//! each over WebSocket, so one machine can compare them side by side
//! (`bench/scripts/peers.sh`).
//!
//! - `idle`: N connections opened and authenticated (im: logged in; MQTT: CONNACK;
//!   NATS: CONNECT answered), each subscribed to its own topic, held; the server's RSS
//!   growth divided by N.
//! - `broadcast`: one topic/subject (im: one group) with M subscribers, one sender at R
//!   msg/s (MQTT QoS 0, NATS PUB, im group Send); delivery latency from the payload's
//!   timestamp, deliveries/s, and an exactly-once check by the payload's sequence
//!   number (losses are a failure only for im; QoS 0 and NATS core may drop, and their
//!   losses are reported).
//! - `pairs`: P senders each at R msg/s to its own receiver (MQTT QoS 1 with PUBACK;
//!   NATS PUB then PING, its PONG as the ack; im one-to-one Send and SendAck, receivers
//!   DeliverAck); send-to-ack and send-to-deliver latency.
//!
//! The server's CPU (utime + stime over the measured window) and RSS (at the end) come
//! from `/proc/<pid>/stat` and `/proc/<pid>/status` of `--server-pid` (or the `--spawn`ed
//! im-server), giving server CPU per delivery and per message. Module map: [`mqtt`] and
//! [`nats`] (the packets, by hand), [`conn`] (one connection of any protocol).

pub mod conn;
pub mod mqtt;
pub mod nats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::clock::Clock;
use crate::report::{fmt_bytes, line, summary_line};
use crate::run::{finish, run_tag, Absent, Report, ReportBody, RunArgs, Tail};
use crate::stats::{LatencyRecorder, Summary};
use crate::target::ServerArgs;
use crate::target::{source_ips, Target};
use crate::Outcome;
use conn::{Dest, Event, Opener, PeerConn};

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux).
const USER_HZ: u64 = 100;
/// Connections opened at the same time.
const CONNECT_CONCURRENCY: usize = 64;
/// Keepalive interval of an idle connection (below im's and MQTT's timeouts).
const KEEPALIVE: Duration = Duration::from_secs(10);
/// Payload header: send time (µs, u64 LE), sequence number (u64 LE), sender (u32 LE).
pub const PAYLOAD_HEADER: usize = 20;
/// Highest sequence number a receiver tracks (bounds its memory).
const MAX_SEQ: u64 = 10_000_000;

/// The protocol the peer scenarios speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// im-server's protobuf protocol (`im.v1`).
    Im,
    /// MQTT 3.1.1 over WebSocket (subprotocol `mqtt`), e.g. Mosquitto.
    MqttWs,
    /// The NATS client protocol over WebSocket, e.g. nats-server's `websocket` block.
    NatsWs,
}

impl Protocol {
    /// The fan-out topic/subject of run `tag` (im: a group id).
    fn fanout(self, tag: &str) -> String {
        match self {
            Protocol::Im => format!("pb{tag}"),
            Protocol::MqttWs => format!("bench/{tag}/b"),
            Protocol::NatsWs => format!("bench.{tag}.b"),
        }
    }

    /// The topic/subject of receiver `name`, connection `i` (im: the user id).
    fn own(self, tag: &str, name: &str, i: usize) -> String {
        match self {
            Protocol::Im => name.to_owned(),
            Protocol::MqttWs => format!("bench/{tag}/p/{i}"),
            Protocol::NatsWs => format!("bench.{tag}.p.{i}"),
        }
    }

    /// Whether the fan-out path may drop messages by design (QoS 0, NATS core).
    fn lossy_fanout(self) -> bool {
        self != Protocol::Im
    }

    /// Whether the pairs path may drop messages by design (NATS core).
    fn lossy_pairs(self) -> bool {
        self == Protocol::NatsWs
    }
}

/// `im-bench peer ...`.
#[derive(Debug, Args)]
pub struct PeerArgs {
    /// The scenario.
    #[command(subcommand)]
    pub scenario: PeerScenario,
}

/// The peer scenarios.
#[derive(Debug, Subcommand)]
pub enum PeerScenario {
    /// N idle authenticated connections; the server's RSS per connection.
    #[command(args_override_self = true)]
    Idle(IdleArgs),
    /// One topic with M subscribers and a sender at R msg/s; delivery latency,
    /// deliveries/s, server CPU per delivery.
    #[command(args_override_self = true)]
    Broadcast(BroadcastArgs),
    /// P pairs, each sender at R msg/s to its receiver; send-to-ack latency, server CPU
    /// per message.
    #[command(args_override_self = true)]
    Pairs(PairsArgs),
}

/// What every peer scenario takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The server's protocol.
    #[arg(long, value_enum, default_value_t = Protocol::Im)]
    pub protocol: Protocol,
    /// The server process to read CPU and RSS from (`/proc/PID`); automatic with --spawn.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Payload bytes (at least the 20-byte header).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(20..=65536))]
    pub size: u32,
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `peer idle`.
#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    /// Connections.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub connections: u32,
    /// Common flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `peer broadcast`.
#[derive(Debug, Clone, Args)]
pub struct BroadcastArgs {
    /// Subscribers (the sender is one more connection).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub members: u32,
    /// Messages per second from the sender.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Common flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `peer pairs`.
#[derive(Debug, Clone, Args)]
pub struct PairsArgs {
    /// Sender/receiver pairs.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub pairs: u32,
    /// Messages per second per sender.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Common flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Runs a peer scenario.
pub async fn run(args: PeerArgs) -> anyhow::Result<Outcome> {
    let common = match &args.scenario {
        PeerScenario::Idle(a) => &a.common,
        PeerScenario::Broadcast(a) => &a.common,
        PeerScenario::Pairs(a) => &a.common,
    };
    let mut target = Target::open(&common.server).await?;
    let json = common.run.json;
    match args.scenario {
        PeerScenario::Idle(a) => {
            let r = idle(&a, &mut target).await;
            finish(target, r, json).await
        }
        PeerScenario::Broadcast(a) => {
            let r = broadcast(&a, &mut target).await;
            finish(target, r, json).await
        }
        PeerScenario::Pairs(a) => {
            let r = pairs(&a, &mut target).await;
            finish(target, r, json).await
        }
    }
}

// ---------------------------------------------------------------------------------
// /proc

/// One reading of a process: CPU time so far and resident set size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// utime + stime, microseconds.
    pub cpu_us: u64,
    /// VmRSS, bytes.
    pub rss_bytes: u64,
}

/// utime + stime in clock ticks from the text of `/proc/PID/stat`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields resume after
    // the last ')'. There, index 0 is field 3 (state), so utime (14) is index 11.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS in bytes from the text of `/proc/PID/status`.
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let ticks = parse_stat_ticks(&stat).context("parsing /proc/PID/stat")?;
    let rss_bytes = parse_status_rss(&status).context("no VmRSS in /proc/PID/status")?;
    Ok(ProcSample {
        cpu_us: ticks * (1_000_000 / USER_HZ),
        rss_bytes,
    })
}

/// The pid to sample: `--server-pid`, else the spawned server's.
fn server_pid(common: &CommonArgs, target: &Target) -> Option<u32> {
    let pid = common.server_pid.or_else(|| target.server_pid());
    if pid.is_none() {
        eprintln!("im-bench peer: no --server-pid: server CPU and RSS are not reported");
    }
    pid
}

fn sample_opt(pid: Option<u32>) -> Option<ProcSample> {
    let pid = pid?;
    match sample(pid) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("im-bench peer: warning: {e:#}");
            None
        }
    }
}

/// Samples `pid` at the start and at the end of the clock's measured window.
fn sample_window(
    pid: Option<u32>,
    clock: Clock,
) -> tokio::task::JoinHandle<(Option<ProcSample>, Option<ProcSample>)> {
    tokio::spawn(async move {
        tokio::time::sleep_until(clock.warmup_end).await;
        let a = sample_opt(pid);
        tokio::time::sleep_until(clock.end).await;
        (a, sample_opt(pid))
    })
}

/// The server's CPU over a window and its RSS at the end.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ServerCost {
    /// CPU microseconds used in the measured window.
    pub cpu_us: u64,
    /// CPU used as a share of one core over the window (1.0 = one core busy).
    pub cpu_cores: f64,
    /// RSS at the end of the window.
    pub rss_bytes: u64,
}

fn cost(window: (Option<ProcSample>, Option<ProcSample>), secs: f64) -> Option<ServerCost> {
    let (a, b) = (window.0?, window.1?);
    let cpu_us = b.cpu_us.saturating_sub(a.cpu_us);
    Some(ServerCost {
        cpu_us,
        cpu_cores: if secs > 0.0 {
            cpu_us as f64 / 1e6 / secs
        } else {
            0.0
        },
        rss_bytes: b.rss_bytes,
    })
}

/// `cpu_us / n`, `None` when either is missing or `n` is 0.
fn per(cost: Option<ServerCost>, n: u64) -> Option<f64> {
    let c = cost?;
    (n > 0).then(|| c.cpu_us as f64 / n as f64)
}

// ---------------------------------------------------------------------------------
// Payloads and the delivery check

/// A payload of `size` bytes: send time (µs from the run's base), sequence number,
/// sender index, then filler.
pub fn encode_payload(sent_us: u64, seq: u64, sender: u32, size: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(size.max(PAYLOAD_HEADER));
    p.extend_from_slice(&sent_us.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&sender.to_le_bytes());
    p.resize(size.max(PAYLOAD_HEADER), b'x');
    p
}

/// `(sent_us, seq, sender)` of a payload made by [`encode_payload`].
pub fn decode_payload(p: &[u8]) -> Option<(u64, u64, u32)> {
    let sent = u64::from_le_bytes(p.get(0..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(p.get(8..16)?.try_into().ok()?);
    let sender = u32::from_le_bytes(p.get(16..20)?.try_into().ok()?);
    Some((sent, seq, sender))
}

/// One receiver's view of one sender's sequence numbers (1, 2, ...).
#[derive(Debug, Default, Clone)]
pub struct SeqCheck {
    seen: Vec<bool>,
    /// Distinct sequence numbers received.
    pub distinct: u64,
    /// Copies of a sequence number already received.
    pub duplicates: u64,
    /// Arrivals below the highest received so far.
    pub reordered: u64,
    /// Payloads that do not parse or carry a sequence number out of range.
    pub bad: u64,
    /// Highest received.
    pub highest: u64,
}

impl SeqCheck {
    /// Takes one received sequence number.
    pub fn take(&mut self, seq: u64) {
        if seq == 0 || seq > MAX_SEQ {
            self.bad += 1;
            return;
        }
        let i = seq as usize;
        if self.seen.len() <= i {
            self.seen.resize(i + 1, false);
        }
        if self.seen[i] {
            self.duplicates += 1;
            return;
        }
        self.seen[i] = true;
        self.distinct += 1;
        if seq < self.highest {
            self.reordered += 1;
        }
        self.highest = self.highest.max(seq);
    }

    /// Messages of 1..=sent never received.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.distinct)
    }
}

/// The delivery check over all receivers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Delivery {
    /// Deliveries expected (messages sent × receivers each is for).
    pub expected: u64,
    /// Distinct deliveries.
    pub delivered: u64,
    /// Expected but never delivered.
    pub lost: u64,
    /// Delivered more than once.
    pub duplicates: u64,
    /// Delivered after a later message.
    pub reordered: u64,
    /// Payloads that did not parse, or from the wrong sender.
    pub bad: u64,
    /// Whether losses are a failure for this protocol and path.
    pub losses_fail: bool,
}

impl Delivery {
    fn add(&mut self, c: &SeqCheck, sent: u64) {
        self.expected += sent;
        self.delivered += c.distinct;
        self.lost += c.lost(sent);
        self.duplicates += c.duplicates;
        self.reordered += c.reordered;
        self.bad += c.bad;
    }

    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        self.duplicates == 0
            && self.reordered == 0
            && self.bad == 0
            && (self.lost == 0 || !self.losses_fail)
    }

    fn lines(&self, s: &mut String) {
        line(
            s,
            "delivery",
            format!(
                "{} of {} expected, lost {}{}, duplicates {}, reordered {}, bad {}",
                self.delivered,
                self.expected,
                self.lost,
                if self.losses_fail {
                    ""
                } else {
                    " (allowed: at-most-once)"
                },
                self.duplicates,
                self.reordered,
                self.bad
            ),
        );
    }
}

// ---------------------------------------------------------------------------------
// Connecting

fn opener(protocol: Protocol, target: &Target, sources: u32) -> Opener {
    Opener {
        protocol,
        url: target.url.clone(),
        addr: target.addr,
        sources: source_ips(target.addr, sources),
        dialer: target.dialer(),
    }
}

/// Opens one connection per name (connection numbers from `first`), each subscribed
/// to its topic from `topic(i)` at `qos`; returns them in order and the connect times.
async fn open_all(
    opener: &Opener,
    names: &[String],
    first: usize,
    topics: Vec<Option<String>>,
    qos: u8,
) -> anyhow::Result<(Vec<PeerConn>, Summary)> {
    let limit = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let times = Arc::new(LatencyRecorder::new(16));
    let mut set = JoinSet::new();
    for (i, (name, topic)) in names.iter().zip(topics).enumerate() {
        let (opener, name, limit, times) =
            (opener.clone(), name.clone(), limit.clone(), times.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let t0 = Instant::now();
            let mut c = opener
                .open(first + i, &name)
                .await
                .with_context(|| format!("opening {name}"))?;
            if let Some(t) = topic {
                c.subscribe(&t, qos)
                    .await
                    .with_context(|| format!("{name} subscribing to {t}"))?;
            }
            times.record(i, t0.elapsed().as_micros() as u64);
            anyhow::Ok((i, c))
        });
    }
    let mut slots: Vec<Option<PeerConn>> = (0..names.len()).map(|_| None).collect();
    let mut done = 0usize;
    while let Some(joined) = set.join_next().await {
        let (i, c) = joined.context("connect task panicked")??;
        slots[i] = Some(c);
        done += 1;
        if done.is_multiple_of(1000) {
            eprintln!("im-bench peer: {done}/{} connected", names.len());
        }
    }
    Ok((
        slots.into_iter().flatten().collect(),
        Summary::of(&times.snapshot()),
    ))
}

// ---------------------------------------------------------------------------------
// idle

/// The `peer idle` report.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    /// `peer-idle`.
    pub scenario: &'static str,
    /// The protocol.
    pub protocol: Protocol,
    /// Connections asked for.
    pub connections: u32,
    /// Connections still open at the end.
    pub open_at_end: u64,
    /// Connect + authenticate + subscribe time per connection, µs.
    pub connect: Summary,
    /// Server RSS before connecting.
    pub rss_before: Option<u64>,
    /// Server RSS at the end of the hold.
    pub rss_after: Option<u64>,
    /// (rss_after - rss_before) / connections.
    pub rss_per_connection: Option<u64>,
    /// Server CPU over the hold (keepalives only).
    pub server: Option<ServerCost>,
}

impl ReportBody for IdleReport {
    type Correctness = Absent;
    type Server = Absent;
    fn render(r: &Report<Self>) -> String {
        let mut s = format!(
            "peer idle ({:?}): {} connections, {} open at the end\n",
            r.protocol, r.connections, r.open_at_end
        );
        summary_line(&mut s, "connect", &r.connect);
        if let (Some(a), Some(b), Some(p)) = (r.rss_before, r.rss_after, r.rss_per_connection) {
            line(
                &mut s,
                "server rss",
                format!(
                    "{} -> {}: {} per connection",
                    fmt_bytes(a),
                    fmt_bytes(b),
                    fmt_bytes(p)
                ),
            );
        }
        if let Some(c) = r.server {
            line(
                &mut s,
                "server cpu",
                format!("{:.3} cores while idle", c.cpu_cores),
            );
        }
        line(&mut s, "passed", r.tail.passed);
        s
    }
}

async fn idle(args: &IdleArgs, target: &mut Target) -> anyhow::Result<Report<IdleReport>> {
    let c = &args.common;
    let pid = server_pid(c, target);
    let tag = run_tag(rand::random());
    let n = args.connections as usize;
    eprintln!(
        "im-bench peer idle: {n} {:?} connections to {}",
        c.protocol, target.url
    );
    let before = sample_opt(pid);
    let names: Vec<String> = (0..n).map(|i| format!("i{tag}-{i}")).collect();
    let topics = names
        .iter()
        .enumerate()
        .map(|(i, name)| (c.protocol != Protocol::Im).then(|| c.protocol.own(&tag, name, i)))
        .collect();
    let op = opener(c.protocol, target, c.server.sources);
    let (conns, connect) = open_all(&op, &names, 0, topics, 0).await?;
    let clock = Clock::start(c.run.warmup, c.run.duration);
    let window = sample_window(pid, clock);
    let open = Arc::new(AtomicU64::new(conns.len() as u64));
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for mut conn in conns {
        let (open, stop, stopped) = (open.clone(), stop.clone(), stopped.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(KEEPALIVE);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                if stopped.load(Ordering::Acquire) {
                    break;
                }
                tokio::select! {
                    ev = conn.recv() => if let Event::Closed(why) = ev {
                        eprintln!("im-bench peer idle: a connection closed: {why}");
                        open.fetch_sub(1, Ordering::Relaxed);
                        return;
                    },
                    _ = tick.tick() => if conn.keepalive().await.is_err() {
                        open.fetch_sub(1, Ordering::Relaxed);
                        return;
                    },
                    _ = stop.notified() => break,
                }
            }
            conn.close().await;
        });
    }
    let samples = window.await.context("sampler panicked")?;
    let open_at_end = open.load(Ordering::Relaxed);
    stopped.store(true, Ordering::Release);
    stop.notify_waiters();
    while tasks.join_next().await.is_some() {}
    let server = cost(samples, clock.measured_secs());
    let rss_after = samples.1.map(|s| s.rss_bytes);
    let rss_before = before.map(|s| s.rss_bytes);
    let rss_per_connection = match (rss_before, rss_after) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) / n as u64),
        _ => None,
    };
    let passed = open_at_end == n as u64;
    Ok(Report {
        body: IdleReport {
            scenario: "peer-idle",
            protocol: c.protocol,
            connections: args.connections,
            open_at_end,
            connect,
            rss_before,
            rss_after,
            rss_per_connection,
            server,
        },
        tail: Tail::new(Absent, passed, Absent),
    })
}

// ---------------------------------------------------------------------------------
// broadcast and pairs: the receiving side

/// What the receivers share.
struct Receivers {
    clock: Clock,
    latency: LatencyRecorder,
    /// Deliveries that arrived in the measured window.
    in_window: AtomicU64,
    /// Final sequence number of each sender, once it stopped (0: still sending).
    final_seq: Vec<AtomicU64>,
    /// Senders that stopped.
    senders_done: AtomicU64,
}

/// Receives until the sender `sender` has stopped and this receiver has its last
/// message, or `deadline`. Returns the sender's index and the receiver's check.
async fn receive(
    mut conn: PeerConn,
    i: usize,
    sender: u32,
    shared: Arc<Receivers>,
    deadline: Instant,
) -> (u32, SeqCheck) {
    let mut check = SeqCheck::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_keepalive = Instant::now();
    loop {
        let fin = shared.final_seq[sender as usize].load(Ordering::Acquire);
        if fin > 0 && fin != u64::MAX && check.distinct >= fin {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            ev = conn.recv() => match ev {
                Event::Delivered(p) => {
                    let now = Instant::now();
                    match decode_payload(&p) {
                        Some((sent_us, seq, from)) if from == sender => {
                            check.take(seq);
                            if shared.clock.measured_us(sent_us) {
                                shared.latency.record(i, shared.clock.us(now).saturating_sub(sent_us));
                            }
                            if shared.clock.measured(now) {
                                shared.in_window.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => check.bad += 1,
                    }
                }
                Event::Acked(_) => {}
                Event::Closed(why) => {
                    eprintln!("im-bench peer: receiver {i} closed: {why}");
                    break;
                }
            },
            _ = tick.tick() => {
                if last_keepalive.elapsed() >= KEEPALIVE {
                    last_keepalive = Instant::now();
                    if conn.keepalive().await.is_err() {
                        break;
                    }
                }
                // A sender that stopped with nothing sent.
                if shared.final_seq[sender as usize].load(Ordering::Acquire) == u64::MAX {
                    break;
                }
            }
        }
    }
    conn.close().await;
    (sender, check)
}

/// What a sender counted.
#[derive(Debug, Default)]
struct SenderTotals {
    sent: u64,
    sent_in_window: u64,
    acked_in_window: u64,
    unacked: u64,
}

/// Sends at `rate` to `dest` until the clock's end, then waits up to `drain` for acks.
#[allow(clippy::too_many_arguments)]
async fn send_loop(
    mut conn: PeerConn,
    idx: u32,
    dest: Dest,
    rate: f64,
    size: usize,
    ack: bool,
    clock: Clock,
    drain: Duration,
    ack_latency: Arc<LatencyRecorder>,
    shared: Arc<Receivers>,
) -> SenderTotals {
    let mut t = SenderTotals::default();
    let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
    // Spread senders over one period so they do not all fire at once.
    let offset = period.mul_f64(f64::from(idx % 1000) / 1000.0);
    let mut tick = tokio::time::interval_at(clock.base + offset, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut outstanding: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut last_keepalive = Instant::now();
    let drain_end = clock.end + drain;
    loop {
        let now = Instant::now();
        let sending = now < clock.end;
        if !sending && (outstanding.is_empty() || now >= drain_end) {
            break;
        }
        tokio::select! {
            biased;
            ev = conn.recv() => match ev {
                Event::Acked(k) => {
                    if let Some((sent_us, measured)) = outstanding.remove(&k) {
                        let now = Instant::now();
                        if measured {
                            ack_latency.record(idx as usize, clock.us(now).saturating_sub(sent_us));
                        }
                        if clock.measured(now) {
                            t.acked_in_window += 1;
                        }
                    }
                }
                Event::Delivered(_) => {}
                Event::Closed(why) => {
                    eprintln!("im-bench peer: sender {idx} closed: {why}");
                    break;
                }
            },
            _ = tick.tick(), if sending => {
                let now = Instant::now();
                let seq = t.sent + 1;
                let sent_us = clock.us(now);
                let p = encode_payload(sent_us, seq, idx, size);
                match conn.publish(&dest, p, ack).await {
                    Ok(key) => {
                        t.sent = seq;
                        let measured = clock.measured(now);
                        if measured {
                            t.sent_in_window += 1;
                        }
                        if ack || matches!(conn, PeerConn::Im { .. }) {
                            outstanding.insert(key, (sent_us, measured));
                        }
                    }
                    Err(e) => {
                        eprintln!("im-bench peer: sender {idx}: {e:#}");
                        break;
                    }
                }
                if last_keepalive.elapsed() >= KEEPALIVE && !ack {
                    last_keepalive = Instant::now();
                    let _ = conn.keepalive().await;
                }
            }
            _ = tokio::time::sleep_until(drain_end), if !sending => {}
        }
    }
    t.unacked = outstanding.len() as u64;
    let fin = if t.sent == 0 { u64::MAX } else { t.sent };
    shared.final_seq[idx as usize].store(fin, Ordering::Release);
    shared.senders_done.fetch_add(1, Ordering::Relaxed);
    conn.close().await;
    t
}

// ---------------------------------------------------------------------------------
// broadcast

/// The `peer broadcast` report.
#[derive(Debug, Clone, Serialize)]
pub struct BroadcastReport {
    /// `peer-broadcast`.
    pub scenario: &'static str,
    /// The protocol.
    pub protocol: Protocol,
    /// Subscribers.
    pub members: u32,
    /// Messages per second asked for.
    pub rate: f64,
    /// Messages sent in the measured window.
    pub sent_in_window: u64,
    /// Deliveries that arrived in the measured window, per second.
    pub deliveries_per_sec: f64,
    /// Publish-to-delivery latency of messages sent in the window, µs.
    pub delivery_latency: Summary,
    /// Send-to-ack latency (im SendAck; none for QoS 0 and NATS), µs.
    pub ack_latency: Summary,
    /// The delivery check.
    pub delivery: Delivery,
    /// Server CPU and RSS.
    pub server: Option<ServerCost>,
    /// Server CPU µs per delivery in the window.
    pub cpu_us_per_delivery: Option<f64>,
    /// Server CPU µs per message sent in the window.
    pub cpu_us_per_message: Option<f64>,
}

impl ReportBody for BroadcastReport {
    type Correctness = Absent;
    type Server = Absent;
    fn render(r: &Report<Self>) -> String {
        let mut s = format!(
            "peer broadcast ({:?}): {} subscribers, {} msg/s, {} sent in the window\n",
            r.protocol, r.members, r.rate, r.sent_in_window
        );
        line(
            &mut s,
            "deliveries/s",
            format!("{:.0}", r.deliveries_per_sec),
        );
        summary_line(&mut s, "delivery latency", &r.delivery_latency);
        if r.ack_latency.count > 0 {
            summary_line(&mut s, "ack latency", &r.ack_latency);
        }
        r.delivery.lines(&mut s);
        cost_lines(
            &mut s,
            r.server,
            r.cpu_us_per_delivery,
            r.cpu_us_per_message,
        );
        line(&mut s, "passed", r.tail.passed);
        s
    }
}

fn cost_lines(
    s: &mut String,
    c: Option<ServerCost>,
    per_delivery: Option<f64>,
    per_msg: Option<f64>,
) {
    if let Some(c) = c {
        line(
            s,
            "server",
            format!(
                "{:.3} cores, rss {}; cpu per delivery {} µs, per message {} µs",
                c.cpu_cores,
                fmt_bytes(c.rss_bytes),
                per_delivery.map_or("-".into(), |v| format!("{v:.1}")),
                per_msg.map_or("-".into(), |v| format!("{v:.1}")),
            ),
        );
    }
}

async fn broadcast(
    args: &BroadcastArgs,
    target: &mut Target,
) -> anyhow::Result<Report<BroadcastReport>> {
    let c = &args.common;
    if !(args.rate > 0.0 && args.rate <= 100_000.0) {
        bail!("--rate must be in (0, 100000]");
    }
    let pid = server_pid(c, target);
    let tag = run_tag(rand::random());
    let m = args.members as usize;
    let topic = c.protocol.fanout(&tag);
    eprintln!(
        "im-bench peer broadcast: {m} {:?} subscribers of {topic}, {} msg/s, on {}",
        c.protocol, args.rate, target.url
    );
    let op = opener(c.protocol, target, c.server.sources);
    let sender_name = format!("s{tag}");
    let (mut senders, _) =
        open_all(&op, std::slice::from_ref(&sender_name), 0, vec![None], 0).await?;
    let mut sender = senders.pop().context("no sender connection")?;
    let names: Vec<String> = (0..m).map(|i| format!("m{tag}-{i}")).collect();
    if let PeerConn::Im { conn, .. } = &mut sender {
        let mut members = vec![sender_name.clone()];
        members.extend(names.iter().cloned());
        crate::groups::create_group(conn, &topic, members).await?;
    }
    let topics = (0..m)
        .map(|_| (c.protocol != Protocol::Im).then(|| topic.clone()))
        .collect();
    let (members, _) = open_all(&op, &names, 1, topics, 0).await?;
    eprintln!("im-bench peer broadcast: subscribed; sending");
    let clock = Clock::start(c.run.warmup, c.run.duration);
    let shared = Arc::new(Receivers {
        clock,
        latency: LatencyRecorder::new(64),
        in_window: AtomicU64::new(0),
        final_seq: vec![AtomicU64::new(0)],
        senders_done: AtomicU64::new(0),
    });
    let deadline = clock.end + c.run.drain * 2;
    let mut rx = JoinSet::new();
    for (i, conn) in members.into_iter().enumerate() {
        rx.spawn(receive(conn, i, 0, shared.clone(), deadline));
    }
    let window = sample_window(pid, clock);
    let ack_latency = Arc::new(LatencyRecorder::new(1));
    let dest = Dest::Fanout(topic);
    let totals = send_loop(
        sender,
        0,
        dest,
        args.rate,
        c.size as usize,
        false,
        clock,
        c.run.drain,
        ack_latency.clone(),
        shared.clone(),
    )
    .await;
    let samples = window.await.context("sampler panicked")?;
    let mut delivery = Delivery {
        losses_fail: !c.protocol.lossy_fanout(),
        ..Delivery::default()
    };
    while let Some(joined) = rx.join_next().await {
        let (_, check) = joined.context("receiver panicked")?;
        delivery.add(&check, totals.sent);
    }
    let server = cost(samples, clock.measured_secs());
    let in_window = shared.in_window.load(Ordering::Relaxed);
    let passed = delivery.passed() && totals.sent > 0;
    Ok(Report {
        body: BroadcastReport {
            scenario: "peer-broadcast",
            protocol: c.protocol,
            members: args.members,
            rate: args.rate,
            sent_in_window: totals.sent_in_window,
            deliveries_per_sec: clock.per_sec(in_window),
            delivery_latency: Summary::of(&shared.latency.snapshot()),
            ack_latency: Summary::of(&ack_latency.snapshot()),
            delivery,
            server,
            cpu_us_per_delivery: per(server, in_window),
            cpu_us_per_message: per(server, totals.sent_in_window),
        },
        tail: Tail::new(Absent, passed, Absent),
    })
}

// ---------------------------------------------------------------------------------
// pairs

/// The `peer pairs` report.
#[derive(Debug, Clone, Serialize)]
pub struct PairsReport {
    /// `peer-pairs`.
    pub scenario: &'static str,
    /// The protocol.
    pub protocol: Protocol,
    /// Pairs.
    pub pairs: u32,
    /// Messages per second per sender.
    pub rate: f64,
    /// Messages sent in the measured window.
    pub sent_in_window: u64,
    /// Acks that arrived in the measured window, per second.
    pub acks_per_sec: f64,
    /// Deliveries that arrived in the measured window, per second.
    pub deliveries_per_sec: f64,
    /// Send-to-ack latency, µs.
    pub ack_latency: Summary,
    /// Send-to-delivery latency, µs.
    pub delivery_latency: Summary,
    /// Sends never acked by the end of the drain.
    pub unacked: u64,
    /// The delivery check.
    pub delivery: Delivery,
    /// Server CPU and RSS.
    pub server: Option<ServerCost>,
    /// Server CPU µs per acked message in the window (its delivery included).
    pub cpu_us_per_message: Option<f64>,
}

impl ReportBody for PairsReport {
    type Correctness = Absent;
    type Server = Absent;
    fn render(r: &Report<Self>) -> String {
        let mut s = format!(
            "peer pairs ({:?}): {} pairs x {} msg/s, {} sent in the window\n",
            r.protocol, r.pairs, r.rate, r.sent_in_window
        );
        line(
            &mut s,
            "acks/s, deliveries/s",
            format!("{:.0}, {:.0}", r.acks_per_sec, r.deliveries_per_sec),
        );
        summary_line(&mut s, "ack latency", &r.ack_latency);
        summary_line(&mut s, "delivery latency", &r.delivery_latency);
        line(&mut s, "unacked", r.unacked);
        r.delivery.lines(&mut s);
        cost_lines(&mut s, r.server, None, r.cpu_us_per_message);
        line(&mut s, "passed", r.tail.passed);
        s
    }
}

async fn pairs(args: &PairsArgs, target: &mut Target) -> anyhow::Result<Report<PairsReport>> {
    let c = &args.common;
    if !(args.rate > 0.0 && args.rate <= 100_000.0) {
        bail!("--rate must be in (0, 100000]");
    }
    let pid = server_pid(c, target);
    let tag = run_tag(rand::random());
    let p = args.pairs as usize;
    eprintln!(
        "im-bench peer pairs: {p} {:?} pairs x {} msg/s on {}",
        c.protocol, args.rate, target.url
    );
    let op = opener(c.protocol, target, c.server.sources);
    let rnames: Vec<String> = (0..p).map(|i| format!("r{tag}-{i}")).collect();
    let snames: Vec<String> = (0..p).map(|i| format!("s{tag}-{i}")).collect();
    let dests: Vec<String> = rnames
        .iter()
        .enumerate()
        .map(|(i, n)| c.protocol.own(&tag, n, i))
        .collect();
    let topics = dests
        .iter()
        .map(|d| (c.protocol != Protocol::Im).then(|| d.clone()))
        .collect();
    let (mut receivers, _) = open_all(&op, &rnames, 0, topics, 1).await?;
    for r in &mut receivers {
        r.set_ack_deliveries(true);
    }
    let (senders, _) = open_all(&op, &snames, p, vec![None; p], 0).await?;
    let clock = Clock::start(c.run.warmup, c.run.duration);
    let shared = Arc::new(Receivers {
        clock,
        latency: LatencyRecorder::new(64),
        in_window: AtomicU64::new(0),
        final_seq: (0..p).map(|_| AtomicU64::new(0)).collect(),
        senders_done: AtomicU64::new(0),
    });
    let deadline = clock.end + c.run.drain * 2;
    let mut rx = JoinSet::new();
    for (i, conn) in receivers.into_iter().enumerate() {
        rx.spawn(receive(conn, i, i as u32, shared.clone(), deadline));
    }
    let window = sample_window(pid, clock);
    let ack_latency = Arc::new(LatencyRecorder::new(64));
    let mut tx = JoinSet::new();
    for (i, (conn, dest)) in senders.into_iter().zip(dests).enumerate() {
        tx.spawn(send_loop(
            conn,
            i as u32,
            Dest::One(dest),
            args.rate,
            c.size as usize,
            true,
            clock,
            c.run.drain,
            ack_latency.clone(),
            shared.clone(),
        ));
    }
    let (mut sent_in_window, mut acked_in_window, mut unacked) = (0, 0, 0);
    while let Some(joined) = tx.join_next().await {
        let t = joined.context("sender panicked")?;
        sent_in_window += t.sent_in_window;
        acked_in_window += t.acked_in_window;
        unacked += t.unacked;
    }
    let samples = window.await.context("sampler panicked")?;
    let mut delivery = Delivery {
        losses_fail: !c.protocol.lossy_pairs(),
        ..Delivery::default()
    };
    while let Some(joined) = rx.join_next().await {
        let (sender, check) = joined.context("receiver panicked")?;
        // What this receiver's sender sent (u64::MAX: nothing).
        let fin = match shared.final_seq[sender as usize].load(Ordering::Acquire) {
            u64::MAX => 0,
            n => n,
        };
        delivery.add(&check, fin);
    }
    let server = cost(samples, clock.measured_secs());
    let in_window = shared.in_window.load(Ordering::Relaxed);
    let passed =
        delivery.passed() && sent_in_window > 0 && (unacked == 0 || c.protocol.lossy_pairs());
    Ok(Report {
        body: PairsReport {
            scenario: "peer-pairs",
            protocol: c.protocol,
            pairs: args.pairs,
            rate: args.rate,
            sent_in_window,
            acks_per_sec: clock.per_sec(acked_in_window),
            deliveries_per_sec: clock.per_sec(in_window),
            ack_latency: Summary::of(&ack_latency.snapshot()),
            delivery_latency: Summary::of(&shared.latency.snapshot()),
            unacked,
            delivery,
            server,
            cpu_us_per_message: per(server, acked_in_window),
        },
        tail: Tail::new(Absent, passed, Absent),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse_even_with_odd_command_names() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 37 0 0 20 0 4 0 12345 1000000 500 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(287));
        assert_eq!(parse_stat_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_stat_ticks("no parenthesis"), None);
        let status = "Name:\tmosquitto\nVmPeak:\t  9000 kB\nVmRSS:\t   11680 kB\nThreads:\t1\n";
        assert_eq!(parse_status_rss(status), Some(11680 * 1024));
        assert_eq!(parse_status_rss("Name:\tx\n"), None);
        assert_eq!(parse_status_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(sample(u32::MAX).is_err());
    }

    #[test]
    fn payloads_carry_time_seq_and_sender() {
        let p = encode_payload(123_456, 42, 7, 64);
        assert_eq!(p.len(), 64);
        assert_eq!(decode_payload(&p), Some((123_456, 42, 7)));
        assert_eq!(encode_payload(1, 2, 3, 0).len(), PAYLOAD_HEADER);
        assert_eq!(decode_payload(&p[..19]), None);
    }

    #[test]
    fn the_sequence_check_counts_losses_duplicates_and_reordering() {
        let mut c = SeqCheck::default();
        for seq in [1, 2, 4, 3, 4, 0, MAX_SEQ + 1] {
            c.take(seq);
        }
        assert_eq!((c.distinct, c.duplicates, c.reordered, c.bad), (4, 1, 1, 2));
        assert_eq!(c.lost(6), 2);
        let mut d = Delivery {
            losses_fail: false,
            ..Delivery::default()
        };
        let mut clean = SeqCheck::default();
        clean.take(1);
        d.add(&clean, 2);
        assert_eq!((d.expected, d.delivered, d.lost), (2, 1, 1));
        assert!(d.passed(), "losses are allowed for at-most-once");
        d.losses_fail = true;
        assert!(!d.passed());
        d.add(&c, 6);
        d.losses_fail = false;
        assert!(!d.passed(), "duplicates always fail");
    }
}
