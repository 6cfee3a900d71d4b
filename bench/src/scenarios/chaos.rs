//! `im-bench chaos`: one-to-one chat while connections are killed and malformed frames
//! are thrown in (the field reports: "randomly kill 2% of connections and watch how fast they
//! recover"; "1% illegal packets").
//!
//! Pairs as in `chat` (sender `s{i}` -> receiver `r{i}`, `--window` in flight, or
//! `--rate`), with two kinds of injection:
//!
//! - **Disconnects.** Every `--kill-every`, `--kill-percent` of all connections, picked
//!   at random, are killed: TCP reset, no close frame, as a phone losing its network
//!   does. After `--reconnect-delay` the victim reconnects and logs in. A receiver then
//!   syncs after its last seq ([`super::follow`]); it has recovered when the sync has
//!   no more pages. A sender resends every un-acked message with its client_msg_id
//!   (the server answers a committed one with `duplicate = true` and its original seq);
//!   it has recovered when all of them are acked. Time to reconnect (kill to LoginOk)
//!   and time to recover (kill to recovered) are reported. Kills stop at the end of the
//!   measured window, so the drain is clean.
//! - **Malformed frames.** After a send, with probability `--bad-percent`, a sender also
//!   writes a malformed frame ([`crate::wire::BadFrame`]: undecodable bytes, a
//!   truncated frame, an overlong varint, a frame without a body, a send without a
//!   target). Each must be answered with `Error BAD_FRAME` and leave the connection
//!   working. At most `--max-bad-per-conn` go to one connection (the server closes a
//!   connection after `limits.max_bad_frames`, default 10).
//!
//! - **Reconnect storm** (`--storm-fraction F`, once, at `--storm-at`, by default the
//!   middle of the measured window): `F` of all connections (pairs and the
//!   `--idle-connections`, picked at random) are reset at the same instant and all
//!   reconnect at once, with no delay or stagger, then recover as above; an idle
//!   connection recovers when its sync after the reconnect is answered. Reported apart:
//!   storm size, storm-instant to LoginOk and to recovered (median, p99, max; the max
//!   is the time until all had reconnected, or recovered).
//!
//! - **Slow receivers** (`--slow-receivers N`): the first N receivers read their pushes
//!   at most `--slow-read-bytes-per-sec` bytes of payload a second until the end of the
//!   measured window (an app in the background on a poor network), then at full speed.
//!   They keep heartbeating while they pause, as a client's timer does. The server
//!   marks them slow and, past its hard mark or a stuck write, closes them (4008): that
//!   close is expected, counted apart, and the receiver reconnects and syncs like a
//!   killed one. A close the receiver never sees (the server could not write its close
//!   frame, and the reader, far behind, got a reset) counts as expected only while the
//!   server's own count of slow-consumer closes covers it. Their delivery latency is
//!   reported apart from the others'.
//! - **Size mix** (`--mix`, as in `mix`): each send draws its type and payload size from
//!   the classes instead of the fixed `--payload`.
//!
//! [`run_observed`] hands a [`Live`] view of the run's histograms and counters to a
//! caller that samples them while the run goes on (`soak`).
//!
//! It fails on any loss, duplicate or reordering (pushes and syncs merged, as a client
//! sees them), on a BAD_FRAME missing, on a connection the server closed, on a victim
//! that could not reconnect, or on a storm victim that had not recovered by the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use futures_util::FutureExt;
use hdrhistogram::Histogram;
use im_client::{ClientError, RawConn, RawEvent};
use im_proto::{Body, ErrorCode, Frame, MessageType, SendAck, SyncRequest};
use rand::seq::index::sample;
use rand::Rng;
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::follow::Follower;
use super::mix::{parse_mix, Mix, SizeClass};
use super::sender::{self, Ended, Hooks, RunCounts, SendCounts};
use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::clock::Clock;
use crate::outbox::{Outbox, Pacer, Pending, Refused, SendSpec, Target as To};
use crate::report::{self, p99_text};
use crate::run::{
    figures_near_end, keep_alive, ping, run_tag, spawn_each, Faults, Head, Pair, Problems, Report,
    RunArgs, Tail,
};
use crate::stats::{LatencyRecorder, LocalError, Summary};
use crate::target::ServerArgs;
use crate::target::{Dialer, Session, Target};
use crate::util::{fmt_us, max_open_files, parse_duration};
use crate::wire::{self, BadFrame};
/// Histogram shards.
const SHARDS: usize = 16;
/// First req_id of malformed frames that carry one (far from message numbers).
const BAD_REQ_BASE: u64 = 1 << 62;
/// Pause between failed reconnect attempts.
const RETRY_CONNECT: Duration = Duration::from_millis(200);
/// How long a finished sender waits for BAD_FRAME replies still in flight.
const BAD_REPLY_WAIT: Duration = Duration::from_secs(2);
/// How often a receiver wakes for heartbeats and the end check.
const RECEIVER_TICK: Duration = Duration::from_millis(100);
/// req_id of an idle connection's sync after a reconnect.
const IDLE_SYNC_REQ: u64 = 7;
/// File descriptors the bench keeps for itself beyond its connections.
const SPARE_FDS: u64 = 64;
/// The server's close code for a slow consumer (hard mark or stuck write).
const SLOW_CLOSE: u16 = 4008;

/// Parses a fraction in 0..=1.
fn parse_fraction(text: &str) -> Result<f64, String> {
    let f: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{text} is not between 0 and 1"))
    }
}

/// Flags of `im-bench chaos`.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Sender/receiver pairs (2 connections each).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub senders: u32,
    /// Outstanding un-acked sends per sender.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub window: u32,
    /// Total send rate, messages per second (0: as fast as the window allows).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub payload: u32,
    /// Percent of all connections killed in each round.
    #[arg(long, default_value_t = 2.0)]
    pub kill_percent: f64,
    /// Time between kill rounds.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub kill_every: Duration,
    /// How long a killed client waits before reconnecting.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub reconnect_delay: Duration,
    /// Percent of sends followed by a malformed frame.
    #[arg(long, default_value_t = 1.0)]
    pub bad_percent: f64,
    /// Most malformed frames sent on one connection (the server closes a connection
    /// after `limits.max_bad_frames` of them).
    #[arg(long, default_value_t = 10)]
    pub max_bad_per_conn: u32,
    /// A send with neither SendAck nor Error after this long is given up on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
    /// Extra logged-in idle connections (one user each): they heartbeat, can be killed
    /// like the others, and sync after a reconnect.
    #[arg(long, default_value_t = 0)]
    pub idle_connections: u32,
    /// Reconnect storm: this fraction (0..1) of all connections is reset at one
    /// instant and reconnects at once, with no delay (0: no storm).
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    pub storm_fraction: f64,
    /// When the storm hits, from the start of the warmup (default: the middle of the
    /// measured window).
    #[arg(long, value_parser = parse_duration)]
    pub storm_at: Option<Duration>,
    /// Size classes NAME:WEIGHT:MIN-MAX,... as in `mix` (default: every send `--payload`
    /// bytes of text).
    #[arg(long, value_parser = parse_mix)]
    pub mix: Option<Mix>,
    /// Receivers (the first N) that read slowly until the end of the measured window.
    #[arg(long, default_value_t = 0)]
    pub slow_receivers: u32,
    /// How fast a slow receiver reads: payload bytes per second.
    #[arg(long, default_value_t = 16384.0)]
    pub slow_read_bytes_per_sec: f64,
}

/// Run-wide state shared by every task.
struct Ctx {
    clock: Clock,
    dialer: Dialer,
    tag: String,
    run_id: u64,
    window: usize,
    payload: usize,
    /// The size classes of `--mix` (empty: `payload` bytes of text).
    classes: Vec<SizeClass>,
    slow_receivers: usize,
    slow_read_bytes_per_sec: f64,
    rate_per_sender: Option<f64>,
    senders: usize,
    reconnect_delay: Duration,
    bad_ratio: f64,
    max_bad_per_conn: u32,
    ack_timeout: Duration,
    drain: Duration,
    /// One per connection: senders 0..n, receivers n..2n, idle connections after them.
    kills: Vec<Notify>,
    /// Set (before the kill notification) on the victims of the storm.
    storm_victim: Vec<AtomicBool>,
    /// The storm's instant, once it has hit.
    storm_at: OnceLock<Instant>,
    storm_reconnect: LatencyRecorder,
    storm_recover: LatencyRecorder,
    ack_latency: LatencyRecorder,
    deliver_latency: LatencyRecorder,
    /// The slow receivers' deliveries, kept out of `deliver_latency`.
    slow_deliver_latency: LatencyRecorder,
    reconnect_latency: LatencyRecorder,
    recover_latency: LatencyRecorder,
    send: SendCounts,
    count: Counts,
    faults: Faults,
}

counters! {
    /// What chaos counts besides the senders' [`SendCounts`].
    struct Counts => Totals {
        storm_reconnected, storm_recovered, storm_skipped, storm_resent, resent, delivered,
        kills_requested, kills_done, kills_ignored, reconnect_failures, never_reconnected,
        unexpected_disconnects, bad_sent, bad_answered, bad_killed, bad_unanswered,
        slow_closed, slow_unseen,
    }
}

sender::run_counts!(Ctx);

impl Ctx {
    fn sender_name(&self, i: usize) -> String {
        format!("c{}-s{i}", self.tag)
    }
    fn receiver_name(&self, i: usize) -> String {
        format!("c{}-r{i}", self.tag)
    }
    fn idle_name(&self, j: usize) -> String {
        format!("c{}-i{j}", self.tag)
    }

    /// After connection `idx` was told to die: when it was killed (the storm's instant
    /// for a storm victim, else now) and whether by the storm.
    fn killed(&self, idx: usize) -> Kill {
        if self.storm_victim[idx].swap(false, Ordering::AcqRel) {
            if let Some(&at) = self.storm_at.get() {
                return Kill { at, storm: true };
            }
        }
        Kill {
            at: Instant::now(),
            storm: false,
        }
    }

    /// Records that connection `idx` recovered from `kill` now.
    fn recovered(&self, idx: usize, kill: Kill) {
        let us = kill.at.elapsed().as_micros() as u64;
        self.recover_latency.record(idx, us);
        if kill.storm {
            self.storm_recover.record(idx, us);
            self.count.storm_recovered.inc();
        }
    }

    /// Resolves when connection `idx` is told to die, counting the kill as done. As
    /// cancel-safe as [`Notify::notified`], so it can race the connection's reads.
    async fn kill_notified(&self, idx: usize) {
        self.kills[idx].notified().await;
        self.count.kills_done.inc();
    }

    /// A connection ended unexpectedly (`ev`: the close or the error):
    /// counted by reason and as an unexpected disconnect.
    fn lost(&self, ev: Result<RawEvent, ClientError>) {
        self.faults.disconnects.record(&self.faults.errors, ev);
        self.count.unexpected_disconnects.inc();
    }

    /// Receiver `i`'s connection ended (`ev`): a slow receiver closed as a slow consumer
    /// is expected and counted apart; anything else is [`Ctx::lost`].
    ///
    /// A slow receiver whose connection ended with no close frame (reset, or the
    /// transport's end) is counted as an unseen close: a server that closes a stuck
    /// write cannot write the close frame either, and a reader that is megabytes behind
    /// gets a reset, not the 4008. The report holds these against the server's own
    /// count of slow-consumer closes ([`unexplained_slow_ends`]).
    fn receiver_lost(&self, i: usize, ev: Result<RawEvent, ClientError>) {
        if i >= self.slow_receivers {
            return self.lost(ev);
        }
        match &ev {
            Ok(RawEvent::Closed {
                code: Some(SLOW_CLOSE),
                ..
            }) => self.count.slow_closed.inc(),
            Ok(RawEvent::Closed { code: None, .. }) | Err(_) => {
                self.faults.disconnects.record(&self.faults.errors, ev);
                self.count.slow_unseen.inc();
            }
            Ok(_) => self.lost(ev),
        }
    }

    /// How long slow receiver `i` waits after reading `bytes` of payload (zero for the
    /// others; never past the end of the measured window, after which it reads at full
    /// speed).
    fn slow_pause(&self, i: usize, bytes: usize) -> Duration {
        let left = self.clock.end.saturating_duration_since(Instant::now());
        if i >= self.slow_receivers {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(bytes as f64 / self.slow_read_bytes_per_sec).min(left)
    }

    /// The next send of sender `i`: a class of `--mix` drawn by weight with a size in
    /// its range, or `payload` bytes of text.
    fn next_spec(&self, base: &SendSpec) -> SendSpec {
        if self.classes.is_empty() {
            return base.clone();
        }
        let mut rng = rand::thread_rng();
        let total: f64 = self.classes.iter().map(|c| c.weight).sum();
        let mut pick = rng.gen::<f64>() * total;
        let c = self
            .classes
            .iter()
            .find(|c| {
                pick -= c.weight;
                pick < 0.0
            })
            .unwrap_or(&self.classes[self.classes.len() - 1]);
        SendSpec {
            msg_type: c.msg_type,
            payload_len: rng.gen_range(c.min..=c.max),
            ..base.clone()
        }
    }

    /// Connection `idx` is gone (killed or lost): drops its socket and reconnects it as
    /// `user` (`conn` is `None` if it never came back); returns the kill it recovers from.
    async fn replace(&self, idx: usize, user: &str, conn: &mut Option<RawConn>) -> Kill {
        let kill = self.killed(idx);
        if let Some(old) = conn.take() {
            old.abort();
        }
        *conn = self.reconnect(idx, user, kill).await;
        kill
    }

    /// Reconnects connection `idx` as `user` after `kill`: waits the reconnect delay
    /// (none after the storm), retries until the drain is over. `None`: it never came
    /// back.
    async fn reconnect(&self, idx: usize, user: &str, kill: Kill) -> Option<RawConn> {
        if !kill.storm {
            tokio::time::sleep(self.reconnect_delay).await;
        }
        let token = self.dialer_token(user)?;
        let give_up = self.clock.end + self.drain;
        loop {
            match self.dialer.open(idx, &token).await {
                Ok((session, _)) => {
                    let us = kill.at.elapsed().as_micros() as u64;
                    self.reconnect_latency.record(idx, us);
                    if kill.storm {
                        self.storm_reconnect.record(idx, us);
                        self.count.storm_reconnected.inc();
                    }
                    // Kills that landed while reconnecting are dropped, not stored.
                    if self.kills[idx].notified().now_or_never().is_some() {
                        self.count.kills_ignored.inc();
                        if self.storm_victim[idx].swap(false, Ordering::AcqRel) {
                            self.count.storm_skipped.inc();
                        }
                    }
                    return Some(session.conn);
                }
                Err(e) => {
                    self.count.reconnect_failures.inc();
                    self.faults
                        .disconnects
                        .add(format!("reconnect failed: {e}"));
                    if Instant::now() >= give_up {
                        self.count.never_reconnected.inc();
                        return None;
                    }
                    tokio::time::sleep(RETRY_CONNECT).await;
                }
            }
        }
    }

    fn dialer_token(&self, user: &str) -> Option<String> {
        match self.dialer.token(user) {
            Ok(t) => Some(t),
            Err(e) => {
                self.faults.disconnects.add(format!("token: {e:#}"));
                self.count.never_reconnected.inc();
                None
            }
        }
    }
}

/// A running chaos run seen from outside: its clock, cumulative latency histograms and
/// counters, read while it goes on.
#[derive(Clone)]
pub struct Live(Arc<Ctx>);

/// A chaos run's counters at one instant (cumulative since the start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LiveCounts {
    /// Send frames written (resends and retries included).
    pub sent: u64,
    /// SendAcks received.
    pub acked: u64,
    /// Messages received by receivers (push or sync).
    pub delivered: u64,
    /// Connections killed.
    pub kills: u64,
    /// Slow receivers closed by the server (4008).
    pub slow_closed: u64,
    /// Slow receivers whose connection ended with no close frame.
    pub slow_unseen: u64,
    /// Connections that ended unexpectedly.
    pub unexpected_disconnects: u64,
}

impl Live {
    /// The run's clock.
    pub fn clock(&self) -> Clock {
        self.0.clock
    }

    /// Send-to-SendAck latency (µs) so far, first attempt to ack, measured window.
    pub fn ack_latency(&self) -> Histogram<u64> {
        self.0.ack_latency.snapshot()
    }

    /// Send-to-receipt latency (µs) so far, measured window (slow receivers left out).
    pub fn deliver_latency(&self) -> Histogram<u64> {
        self.0.deliver_latency.snapshot()
    }

    /// The counters now.
    pub fn counts(&self) -> LiveCounts {
        let (t, c) = (self.0.send.snapshot(), self.0.count.snapshot());
        LiveCounts {
            sent: t.sent,
            acked: t.acked_all,
            delivered: c.delivered,
            kills: c.kills_done,
            slow_closed: c.slow_closed,
            slow_unseen: c.slow_unseen,
            unexpected_disconnects: c.unexpected_disconnects,
        }
    }
}

/// When a connection was killed and whether by the storm.
#[derive(Debug, Clone, Copy)]
struct Kill {
    at: Instant,
    storm: bool,
}

/// The final report of a chaos run.
pub type ChaosReport = Report<ChaosBody>;

/// The chaos report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Pairs.
    pub senders: u32,
    /// Extra idle connections.
    pub idle_connections: u32,
    /// Window per sender.
    pub window: u32,
    /// Target total rate (0: closed loop).
    pub rate: f64,
    /// Measured seconds.
    pub duration_secs: f64,
    /// Warmup seconds.
    pub warmup_secs: f64,
    /// Percent of connections killed per round.
    pub kill_percent: f64,
    /// Seconds between rounds.
    pub kill_every_secs: f64,
    /// Percent of sends followed by a malformed frame.
    pub bad_percent: f64,
    /// The reconnect storm (`None` without `--storm-fraction`).
    pub storm: Option<StormReport>,
    /// Kills asked for (the storm's included).
    pub kills_requested: u64,
    /// Connections killed.
    pub kills: u64,
    /// Kills that landed while the victim was already reconnecting (dropped).
    pub kills_ignored: u64,
    /// Reconnect attempts that failed (retried).
    pub reconnect_failures: u64,
    /// Victims that never came back (a failure).
    pub never_reconnected: u64,
    /// Connections the server closed, or that broke, without being killed (a failure).
    pub unexpected_disconnects: u64,
    /// Kill to LoginOk on the new connection (µs).
    pub reconnect_us: Summary,
    /// Kill to recovered: synced up (receivers) or every un-acked send acked (senders) (µs).
    pub recover_us: Summary,
    /// Sends written again on a new connection.
    pub resent: u64,
    /// SendAcks flagged duplicate (resends of messages committed before the kill).
    pub duplicate_acks: u64,
    /// Receivers that read slowly (`--slow-receivers`).
    pub slow_receivers: u32,
    /// Their read rate, payload bytes per second.
    pub slow_read_bytes_per_sec: f64,
    /// Times the server closed a slow receiver as a slow consumer (4008); each reconnected.
    pub slow_closed: u64,
    /// Times a slow receiver's connection ended with no close frame; each reconnected.
    pub slow_closed_unseen: u64,
    /// Of those, how many the server's count of slow-consumer closes does not explain
    /// (a failure); every one when the server's figures are not known.
    pub slow_closed_unexplained: u64,
    /// Size classes of `--mix` (empty: every send `--payload` bytes).
    pub mix: Vec<SizeClass>,
    /// Malformed frames sent.
    pub bad_frames_sent: u64,
    /// BAD_FRAME errors received for them.
    pub bad_frames_answered: u64,
    /// Malformed frames whose answer was lost to a kill.
    pub bad_frames_killed: u64,
    /// Malformed frames never answered on a live connection (a failure).
    pub bad_frames_unanswered: u64,
    /// Acks in the measured window.
    pub acked: u64,
    /// Acked messages per second.
    pub acked_per_sec: f64,
    /// Send frames written, retries and resends included.
    pub sent_frames: u64,
    /// OVERLOADED / RATE_LIMITED retries.
    pub retries: u64,
    /// Messages received by receivers (push or sync).
    pub delivered: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// Send-to-SendAck latency (µs), first attempt to ack.
    pub send_to_ack_us: Summary,
    /// Send-to-receipt latency (µs), push or sync (the slow receivers' apart).
    pub send_to_deliver_us: Summary,
    /// The slow receivers' send-to-receipt latency (µs).
    pub slow_send_to_deliver_us: Summary,
    /// Errors by code (BAD_FRAME includes the injected ones); connections that ended, by
    /// reason (kills not included).
    #[serde(flatten)]
    pub problems: Problems,
}

/// The reconnect storm's figures.
#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    /// Fraction of all connections reset.
    pub fraction: f64,
    /// When it hit, seconds from the start of the warmup.
    pub at_secs: f64,
    /// All connections of the run (pairs and idle).
    pub connections: u64,
    /// Connections reset at once (the storm's size).
    pub victims: u64,
    /// Of them: senders.
    pub victim_senders: u64,
    /// Of them: receivers.
    pub victim_receivers: u64,
    /// Of them: idle connections.
    pub victim_idle: u64,
    /// Victims that were already down (reconnecting after an earlier kill).
    pub skipped: u64,
    /// Victims that logged in again.
    pub reconnected: u64,
    /// Victims that recovered (synced up, or every un-acked send acked).
    pub recovered: u64,
    /// Sends the victim senders wrote again on their new connection.
    pub resent: u64,
    /// Storm instant to LoginOk on the new connection (µs); `max` is the time until all
    /// had reconnected.
    pub reconnect_us: Summary,
    /// Storm instant to recovered (µs); `max` is the time until all had recovered.
    pub recover_us: Summary,
    /// Whether every victim reconnected and recovered.
    pub passed: bool,
}

scenario! {
    "chaos", ChaosArgs => ChaosBody,
}

async fn run_against(args: &ChaosArgs, target: &mut Target) -> anyhow::Result<ChaosReport> {
    run_observed(args, target, |_| {}).await
}

/// A chaos run that hands `observe` a [`Live`] view of it once the connections are open
/// and the clock has started.
pub async fn run_observed(
    args: &ChaosArgs,
    target: &mut Target,
    observe: impl FnOnce(Live),
) -> anyhow::Result<ChaosReport> {
    let n = args.senders as usize;
    let m = args.idle_connections as usize;
    let total = 2 * n + m;
    let storm_offset = storm_offset(args)?;
    announce(args, target, total, storm_offset);
    let run_id: u64 = rand::random();
    let tag = run_tag(run_id);
    let names = |kind: &str, k: usize| -> Vec<String> {
        (0..k).map(|i| format!("c{tag}-{kind}{i}")).collect()
    };
    let receiver_sessions = target.connect_all(&names("r", n), n).await?;
    let sender_sessions = target.connect_all(&names("s", n), 0).await?;
    let idle_sessions = target.connect_all(&names("i", m), 2 * n).await?;
    let clock = Clock::start(args.run.warmup, args.run.duration);
    let ctx = Arc::new(new_ctx(args, target, clock, tag, run_id, total));
    observe(Live(ctx.clone()));

    let pairs: Vec<Arc<Pair>> = (0..n).map(|_| Arc::new(Pair::default())).collect();
    let mut receiver_tasks = spawn_each(receiver_sessions, |i, s| {
        receiver(ctx.clone(), pairs[i].clone(), i, s)
    });
    let mut sender_tasks = spawn_each(sender_sessions, |i, s| {
        chaos_sender(ctx.clone(), pairs[i].clone(), i, s)
    });
    let (idle_stop, idle_stop_rx) = watch::channel(false);
    let mut idle_tasks = spawn_each(idle_sessions, |j, s| {
        idle_conn(ctx.clone(), j, s, idle_stop_rx.clone())
    });
    let killer = tokio::spawn(killer(ctx.clone(), args.kill_percent, args.kill_every));
    let storm = (args.storm_fraction > 0.0).then(|| {
        let at = clock.base + storm_offset;
        tokio::spawn(storm(ctx.clone(), at, args.storm_fraction))
    });
    let progress = spawn_progress(&ctx);
    let figures = figures_near_end(target, &clock);

    let mut acked_by_pair: Vec<Vec<u64>> = vec![Vec::new(); n];
    while let Some(joined) = sender_tasks.join_next().await {
        let (i, mut acked) = joined.context("sender task panicked")?;
        acked.sort_unstable();
        acked_by_pair[i] = acked;
    }
    let mut verdict = Verdict::default();
    while let Some(joined) = receiver_tasks.join_next().await {
        let (i, follower) = joined.context("receiver task panicked")?;
        verdict += follower.verdict(&acked_by_pair[i]);
    }
    let _ = idle_stop.send(true);
    while let Some(joined) = idle_tasks.join_next().await {
        joined.context("idle connection task panicked")?;
    }
    killer.abort();
    let storm_victims = match storm {
        Some(h) => {
            h.abort();
            h.await.ok()
        }
        None => None,
    };
    progress.abort();
    let server = figures.await.ok().flatten();
    let storm = (args.storm_fraction > 0.0)
        .then(|| storm_report(args, &ctx, storm_offset, total, storm_victims));
    Ok(report(args, target, &ctx, storm, verdict, server))
}

/// When the storm strikes: `--storm-at`, else half way through the measured window; it
/// must fall before the end of the run.
fn storm_offset(args: &ChaosArgs) -> anyhow::Result<Duration> {
    let end = args.run.warmup + args.run.duration;
    let offset = args
        .storm_at
        .unwrap_or(args.run.warmup + args.run.duration / 2);
    if args.storm_fraction > 0.0 && offset >= end {
        anyhow::bail!("--storm-at {offset:?} is not before the end of the run ({end:?})");
    }
    Ok(offset)
}

/// Says what the run will do (and warns when the open-files limit looks too low for
/// `total` connections).
fn announce(args: &ChaosArgs, target: &Target, total: usize, storm_offset: Duration) {
    if let Some(limit) = max_open_files() {
        if total as u64 + SPARE_FDS > limit {
            eprintln!(
                "im-bench chaos: warning: {total} connections need about {} file descriptors; this process may open {limit} (RLIMIT_NOFILE)",
                total as u64 + SPARE_FDS
            );
        }
    }
    let storm = if args.storm_fraction > 0.0 {
        format!(
            ", a storm of {:.0}% at {storm_offset:?}",
            args.storm_fraction * 100.0
        )
    } else {
        String::new()
    };
    eprintln!(
        "im-bench chaos: {} pairs and {} idle connections, killing {}% of connections every {:?}, {}% malformed frames{storm}, on {}",
        args.senders, args.idle_connections, args.kill_percent, args.kill_every, args.bad_percent, target.url
    );
}

/// The run's shared state, for `total` connections.
fn new_ctx(
    args: &ChaosArgs,
    target: &Target,
    clock: Clock,
    tag: String,
    run_id: u64,
    total: usize,
) -> Ctx {
    let n = args.senders as usize;
    Ctx {
        clock,
        dialer: target.dialer(),
        tag,
        run_id,
        window: args.window as usize,
        payload: args.payload as usize,
        classes: args.mix.clone().map(|m| m.0).unwrap_or_default(),
        slow_receivers: (args.slow_receivers as usize).min(n),
        slow_read_bytes_per_sec: args.slow_read_bytes_per_sec.max(1.0),
        rate_per_sender: (args.rate > 0.0).then(|| args.rate / n as f64),
        senders: n,
        reconnect_delay: args.reconnect_delay,
        bad_ratio: (args.bad_percent / 100.0).clamp(0.0, 1.0),
        max_bad_per_conn: args.max_bad_per_conn,
        ack_timeout: args.ack_timeout,
        drain: args.run.drain,
        kills: (0..total).map(|_| Notify::new()).collect(),
        storm_victim: (0..total).map(|_| AtomicBool::new(false)).collect(),
        storm_at: OnceLock::new(),
        storm_reconnect: LatencyRecorder::new(SHARDS),
        storm_recover: LatencyRecorder::new(SHARDS),
        ack_latency: LatencyRecorder::new(SHARDS),
        deliver_latency: LatencyRecorder::new(SHARDS),
        slow_deliver_latency: LatencyRecorder::new(SHARDS),
        reconnect_latency: LatencyRecorder::new(SHARDS),
        recover_latency: LatencyRecorder::new(SHARDS),
        send: SendCounts::default(),
        count: Counts::default(),
        faults: Faults::default(),
    }
}

/// The progress line: acks, kills, the storm's returns, bad frames, errors, P99s.
fn spawn_progress(ctx: &Arc<Ctx>) -> tokio::task::JoinHandle<()> {
    report::spawn_rate_progress(ctx.clock, ctx.clone(), |ctx, rate, dt| {
        format!(
            "acked {:>8.0} msg/s  kills {:>5}  storm back {:>5}/{:<5}  bad frames {:>5}  errors {:>6}  p99 recover {}  p99 send->ack {}",
            rate.per_sec(ctx.send.acked_all.get(), dt),
            ctx.count.kills_done.get(),
            ctx.count.storm_recovered.get(),
            ctx.count.storm_reconnected.get(),
            ctx.count.bad_sent.get(),
            ctx.faults.errors.total(),
            p99_text(&ctx.recover_latency.snapshot()),
            p99_text(&ctx.ack_latency.snapshot()),
        )
    })
}

/// What the storm did, from its victims (senders, receivers, idle connections hit) and
/// the run's counts; it passed when every victim came back and recovered.
fn storm_report(
    args: &ChaosArgs,
    ctx: &Ctx,
    storm_offset: Duration,
    total: usize,
    victims: Option<(u64, u64, u64)>,
) -> StormReport {
    let c = ctx.count.snapshot();
    let (senders_hit, receivers_hit, idle_hit) = victims.unwrap_or_default();
    let victims = senders_hit + receivers_hit + idle_hit;
    let (skipped, reconnected, recovered) =
        (c.storm_skipped, c.storm_reconnected, c.storm_recovered);
    StormReport {
        fraction: args.storm_fraction,
        at_secs: storm_offset.as_secs_f64(),
        connections: total as u64,
        victims,
        victim_senders: senders_hit,
        victim_receivers: receivers_hit,
        victim_idle: idle_hit,
        skipped,
        reconnected,
        recovered,
        resent: c.storm_resent,
        reconnect_us: Summary::of(&ctx.storm_reconnect.snapshot()),
        recover_us: Summary::of(&ctx.storm_recover.snapshot()),
        passed: victims > 0 && reconnected + skipped == victims && recovered == reconnected,
    }
}

/// Of `unseen` slow-receiver ends without a close frame, how many the server's count of
/// slow-consumer closes (`server_slow_closes`, `None` when unknown) does not explain once
/// the `seen` 4008 closes are taken from it.
fn unexplained_slow_ends(seen: u64, unseen: u64, server_slow_closes: Option<u64>) -> u64 {
    let explained = server_slow_closes.map_or(0, |n| n.saturating_sub(seen));
    unseen.saturating_sub(explained)
}

/// The final report: the run's figures, the delivery verdict, and whether everything
/// passed (delivery, every killed connection back, every bad frame answered, the storm).
fn report(
    args: &ChaosArgs,
    target: &Target,
    ctx: &Ctx,
    storm: Option<StormReport>,
    verdict: Verdict,
    server: Option<ServerFigures>,
) -> ChaosReport {
    let (t, c) = (ctx.send.snapshot(), ctx.count.snapshot());
    let clock = ctx.clock;
    let storm_ok = storm.as_ref().is_none_or(|s| s.passed);
    let body = ChaosBody {
        head: Head::new("chaos", target),
        senders: args.senders,
        idle_connections: args.idle_connections,
        storm,
        window: args.window,
        rate: args.rate,
        duration_secs: clock.measured_secs(),
        warmup_secs: args.run.warmup.as_secs_f64(),
        kill_percent: args.kill_percent,
        kill_every_secs: args.kill_every.as_secs_f64(),
        bad_percent: args.bad_percent,
        kills_requested: c.kills_requested,
        kills: c.kills_done,
        kills_ignored: c.kills_ignored,
        reconnect_failures: c.reconnect_failures,
        never_reconnected: c.never_reconnected,
        unexpected_disconnects: c.unexpected_disconnects,
        reconnect_us: Summary::of(&ctx.reconnect_latency.snapshot()),
        recover_us: Summary::of(&ctx.recover_latency.snapshot()),
        resent: c.resent,
        duplicate_acks: t.duplicate_acks,
        slow_receivers: ctx.slow_receivers as u32,
        slow_read_bytes_per_sec: ctx.slow_read_bytes_per_sec,
        slow_closed: c.slow_closed,
        slow_closed_unseen: c.slow_unseen,
        slow_closed_unexplained: unexplained_slow_ends(
            c.slow_closed,
            c.slow_unseen,
            server.as_ref().map(|f| f.slow_consumer_disconnects),
        ),
        mix: ctx.classes.clone(),
        bad_frames_sent: c.bad_sent,
        bad_frames_answered: c.bad_answered,
        bad_frames_killed: c.bad_killed,
        bad_frames_unanswered: c.bad_unanswered,
        acked: t.acked_measured,
        acked_per_sec: clock.per_sec(t.acked_measured),
        sent_frames: t.sent,
        retries: t.retries,
        delivered: c.delivered,
        unacked_at_end: t.unacked_at_end,
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.deliver_latency.snapshot()),
        slow_send_to_deliver_us: Summary::of(&ctx.slow_deliver_latency.snapshot()),
        problems: ctx.faults.problems(),
    };
    let passed = verdict.passed()
        && c.never_reconnected == 0
        && c.unexpected_disconnects == 0
        && body.slow_closed_unexplained == 0
        && c.bad_unanswered == 0
        && storm_ok;
    Report {
        body,
        tail: Tail::new(verdict, passed, server),
    }
}

/// Every `every` until the end of the measured window, kills `percent`% of the
/// connections, picked at random.
async fn killer(ctx: Arc<Ctx>, percent: f64, every: Duration) {
    let total = ctx.kills.len();
    let per_round = ((total as f64 * percent / 100.0).round() as usize).min(total);
    if per_round == 0 || every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval_at(ctx.clock.base + every, every);
    loop {
        let now = tick.tick().await;
        if now >= ctx.clock.end {
            return;
        }
        let victims = sample(&mut rand::thread_rng(), total, per_round);
        for v in victims.iter() {
            ctx.kills[v].notify_one();
        }
        ctx.count.kills_requested.add(per_round as u64);
    }
}

/// The reconnect storm: at `at`, marks `fraction` of all connections, picked at random,
/// as storm victims and tells them all to die at once. Returns how many victims were
/// senders, receivers and idle connections.
async fn storm(ctx: Arc<Ctx>, at: Instant, fraction: f64) -> (u64, u64, u64) {
    let total = ctx.kills.len();
    let size = ((total as f64 * fraction).round() as usize).min(total);
    tokio::time::sleep_until(at).await;
    let victims = sample(&mut rand::thread_rng(), total, size).into_vec();
    let _ = ctx.storm_at.set(Instant::now());
    for &v in &victims {
        ctx.storm_victim[v].store(true, Ordering::Release);
    }
    for &v in &victims {
        ctx.kills[v].notify_one();
    }
    ctx.count.kills_requested.add(size as u64);
    let n = ctx.senders;
    let count =
        |r: std::ops::Range<usize>| victims.iter().filter(|&&v| r.contains(&v)).count() as u64;
    (count(0..n), count(n..2 * n), count(2 * n..total))
}

/// The chaos sender's view of the sending loop.
struct ChaosHooks<'a> {
    ctx: &'a Ctx,
    i: usize,
    spec: SendSpec,
    acked: Vec<u64>,
    max_acked: u64,
    /// Malformed frames sent on this connection, and those not yet answered.
    bad_on_conn: u32,
    bad_outstanding: u64,
    next_bad: u64,
    /// After a kill: the kill, and the sends that were un-acked then.
    recovering: Option<(Kill, Vec<u64>)>,
}

impl ChaosHooks<'_> {
    fn check_recovered(&mut self) {
        if let Some((kill, waiting)) = &self.recovering {
            if waiting.is_empty() {
                self.ctx.recovered(self.i, *kill);
                self.recovering = None;
            }
        }
    }

    fn settle(&mut self, n: u64) {
        if let Some((_, waiting)) = &mut self.recovering {
            waiting.retain(|&w| w != n);
        }
        self.check_recovered();
    }
}

impl Hooks for ChaosHooks<'_> {
    fn counts(&self) -> RunCounts<'_> {
        self.ctx.counts()
    }

    fn next(&mut self) -> Option<SendSpec> {
        Some(self.ctx.next_spec(&self.spec))
    }

    fn after_send(&mut self) -> Option<Vec<u8>> {
        let ctx = self.ctx;
        if self.bad_on_conn >= ctx.max_bad_per_conn || rand::random::<f64>() >= ctx.bad_ratio {
            return None;
        }
        let kind = BadFrame::ALL[(self.next_bad % BadFrame::ALL.len() as u64) as usize];
        let req_id = BAD_REQ_BASE + self.next_bad;
        self.next_bad += 1;
        self.bad_on_conn += 1;
        self.bad_outstanding += 1;
        ctx.count.bad_sent.inc();
        Some(wire::bad_frame(kind, req_id))
    }

    fn acked(&mut self, ack: &SendAck, pending: Option<Pending>, now: Instant) {
        let ctx = self.ctx;
        ctx.send.acked(&ctx.clock, now, ack.duplicate);
        let Some(p) = pending else { return };
        // A duplicate ack answers a resend whose first ack died with a killed
        // connection: its seq is the original one, recorded now for the first time.
        self.acked.push(ack.seq);
        self.max_acked = self.max_acked.max(ack.seq);
        if ctx.clock.measured(p.first_sent) {
            let us = now.saturating_duration_since(p.first_sent).as_micros() as u64;
            ctx.ack_latency.record(self.i, us);
        }
        self.settle(p.n);
    }

    fn refused(&mut self, e: &im_proto::Error, outcome: Refused) {
        self.ctx.faults.errors.server(e.code);
        if let Refused::Failed(p) = outcome {
            self.settle(p.n);
        }
    }

    fn timed_out(&mut self, p: Pending) {
        self.ctx.faults.errors.local(LocalError::AckTimeout);
        self.settle(p.n);
    }

    fn other(&mut self, f: Frame, _now: Instant) -> Vec<Vec<u8>> {
        self.ctx.faults.errors.stray(&f);
        if let Some(Body::Error(e)) = &f.body {
            let injected = f.req_id == 0 || f.req_id >= BAD_REQ_BASE;
            if e.code == ErrorCode::BadFrame as i32 && injected && self.bad_outstanding > 0 {
                self.bad_outstanding -= 1;
                self.ctx.count.bad_answered.inc();
            }
        }
        Vec::new()
    }
}

/// Sender `s{i}` under fire: the shared sending loop; on a kill, reconnect, resend
/// what was un-acked, go on.
async fn chaos_sender(
    ctx: Arc<Ctx>,
    pair: Arc<Pair>,
    i: usize,
    session: Session,
) -> (usize, Vec<u64>) {
    let Session { conn, heartbeat } = session;
    let mut conn = Some(conn);
    let clock = ctx.clock;
    let me = ctx.sender_name(i);
    let mut outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    let mut pacer = ctx
        .rate_per_sender
        .map(|r| Pacer::staggered(r, i, ctx.senders, clock.base));
    let mut hooks = ChaosHooks {
        ctx: &ctx,
        i,
        spec: SendSpec {
            target: To::User(ctx.receiver_name(i).into()),
            msg_type: MessageType::Text,
            payload_len: ctx.payload,
            tag: 0,
        },
        acked: Vec::with_capacity(1024),
        max_acked: 0,
        bad_on_conn: 0,
        bad_outstanding: 0,
        next_bad: 0,
        recovering: None,
    };
    while let Some(mut c) = conn.take() {
        let cfg = sender::Loop {
            kill: Some(&ctx.kills[i]),
            ..sender::Loop::new(clock, ctx.window, pacer.as_mut(), ctx.drain, heartbeat)
        };
        let ended = sender::run(&mut c, &mut outbox, cfg, &mut hooks).await;
        let kill = ctx.killed(i);
        match ended {
            Ended::Finished => {
                wait_bad_replies(&mut c, &mut hooks).await;
                ctx.count.bad_unanswered.add(hooks.bad_outstanding);
                let _ = c.close().await;
                break;
            }
            Ended::Killed => {
                c.abort();
                ctx.count.kills_done.inc();
            }
            Ended::Disconnected => ctx.count.unexpected_disconnects.inc(),
        }
        ctx.count.bad_killed.add(hooks.bad_outstanding);
        hooks.bad_outstanding = 0;
        hooks.bad_on_conn = 0;
        let waiting: Vec<u64> = outbox.pending().iter().map(|p| p.n).collect();
        let Some(mut fresh) = ctx.reconnect(i, &me, kill).await else {
            break;
        };
        hooks.recovering = Some((kill, waiting));
        let now = Instant::now();
        let mut ok = true;
        for frame in outbox.resend_all(now) {
            if fresh.send_bytes(frame).await.is_err() {
                ok = false;
                break;
            }
            ctx.count.resent.inc();
            if kill.storm {
                ctx.count.storm_resent.inc();
            }
            ctx.send.sent.inc();
        }
        hooks.check_recovered();
        if !ok {
            ctx.count.unexpected_disconnects.inc();
        }
        conn = Some(fresh);
    }
    ctx.send.unacked_at_end.add(outbox.len() as u64);
    pair.sender_finished(hooks.max_acked);
    (i, hooks.acked)
}

/// After the last ack: reads until every malformed frame of this connection has its
/// BAD_FRAME (or a short timeout).
async fn wait_bad_replies(conn: &mut RawConn, hooks: &mut ChaosHooks<'_>) {
    let deadline = Instant::now() + BAD_REPLY_WAIT;
    while hooks.bad_outstanding > 0 {
        match tokio::time::timeout_at(deadline, conn.recv()).await {
            Ok(Ok(RawEvent::Frame(f))) => {
                hooks.other(f, Instant::now());
            }
            Ok(Ok(RawEvent::WsPong(_))) => {}
            _ => return,
        }
    }
}

/// Receiver `r{i}` under fire: follows the conversation by pushes and syncs; on a kill,
/// reconnects and syncs after its last seq.
async fn receiver(ctx: Arc<Ctx>, pair: Arc<Pair>, i: usize, session: Session) -> (usize, Follower) {
    let heartbeat = session.heartbeat;
    let mut conn = Some(session.conn);
    let clock = ctx.clock;
    let idx = ctx.senders + i;
    let me = ctx.receiver_name(i);
    let conv = im_proto::direct_conversation(&ctx.sender_name(i), &me);
    let mut follower = Follower::new(conv, 0, 1000);
    let hard_deadline = clock.end + ctx.drain * 2;
    let mut last_tx = Instant::now();
    let mut recovering: Option<Kill> = None;
    let mut tick = tokio::time::interval(RECEIVER_TICK);

    while let Some(c) = conn.as_mut() {
        if let Some(req) = follower.sync_request() {
            if c.send(&req).await.is_err() {
                ctx.faults.errors.local(LocalError::Transport);
            }
            last_tx = Instant::now();
        }
        if let Some(kill) = recovering {
            if follower.settled() {
                ctx.recovered(idx, kill);
                recovering = None;
            }
        }
        if follower.settled() && pair.caught_up(follower.last()) {
            break;
        }
        let lost = tokio::select! {
            biased;
            () = ctx.kill_notified(idx) => true,
            ev = c.recv() => {
                match ev {
                    Ok(RawEvent::Frame(f)) => {
                        let now_us = clock.now_us();
                        let mut bytes = 0;
                        let mine = follower.on_frame(&f, |m, _via| {
                            bytes += m.payload.len();
                            ctx.count.delivered.inc();
                            if let Some(sent_us) = wire::payload_timestamp(&m.payload) {
                                if clock.measured_us(sent_us) {
                                    let us = now_us.saturating_sub(sent_us);
                                    if i < ctx.slow_receivers {
                                        ctx.slow_deliver_latency.record(idx, us);
                                    } else {
                                        ctx.deliver_latency.record(idx, us);
                                    }
                                }
                            }
                        });
                        if !mine {
                            ctx.faults.errors.stray(&f);
                        }
                        let pause = ctx.slow_pause(i, bytes);
                        if !pause.is_zero() {
                            slow_read_pause(c, pause, &mut last_tx, heartbeat, &ctx.faults).await;
                        }
                        false
                    }
                    Ok(RawEvent::WsPong(_)) => false,
                    other => {
                        ctx.receiver_lost(i, other);
                        true
                    }
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= hard_deadline {
                    break;
                }
                // A failed ping is counted; the read that follows sees the connection end.
                let _ = keep_alive(c, now, &mut last_tx, heartbeat, &ctx.faults).await;
                false
            }
        };
        if lost {
            let kill = ctx.replace(idx, &me, &mut conn).await;
            follower.reconnected();
            recovering = Some(kill);
        }
    }
    if let Some(mut c) = conn {
        let _ = c.close().await;
    }
    (i, follower)
}

/// A slow receiver's pause after a read: `pause` without reading, heartbeating all the
/// while as a client's own timer does (a client that reads slowly still pings; without
/// that the server closes it as idle, not as a slow consumer).
async fn slow_read_pause(
    conn: &mut RawConn,
    pause: Duration,
    last_tx: &mut Instant,
    heartbeat: Duration,
    faults: &Faults,
) {
    let end = Instant::now() + pause;
    loop {
        let now = Instant::now();
        // A failed ping is counted; the read that follows sees the connection end.
        let _ = keep_alive(conn, now, last_tx, heartbeat, faults).await;
        if now >= end {
            return;
        }
        tokio::time::sleep((end - now).min(RECEIVER_TICK)).await;
    }
}

/// Idle connection `j` (connection `2 * senders + j`): heartbeats until `stop`; on a
/// kill, reconnects and syncs, and has recovered when the sync is answered.
async fn idle_conn(ctx: Arc<Ctx>, j: usize, session: Session, mut stop: watch::Receiver<bool>) {
    let heartbeat = session.heartbeat;
    let mut conn = Some(session.conn);
    let idx = 2 * ctx.senders + j;
    let me = ctx.idle_name(j);
    let hard_deadline = ctx.clock.end + ctx.drain * 2;
    // Heartbeats at a random offset, so that they do not come in waves.
    let mut next_ping = Instant::now() + (heartbeat / 2).mul_f64(rand::random::<f64>());
    let mut recovering: Option<Kill> = None;
    while let Some(c) = conn.as_mut() {
        if *stop.borrow() && recovering.is_none() {
            break;
        }
        let lost = tokio::select! {
            biased;
            () = ctx.kill_notified(idx) => true,
            ev = c.recv() => match ev {
                Ok(RawEvent::Frame(f)) => {
                    match f.body {
                        Some(Body::SyncResp(r)) if f.req_id == IDLE_SYNC_REQ => {
                            // An idle user has no conversations: nothing to page through.
                            if !r.messages.is_empty() {
                                ctx.faults.errors.local(LocalError::Unexpected);
                            }
                            if let Some(kill) = recovering.take() {
                                ctx.recovered(idx, kill);
                            }
                        }
                        Some(Body::Error(e)) => {
                            ctx.faults.errors.server(e.code);
                            if f.req_id == IDLE_SYNC_REQ && recovering.is_some() {
                                // The sync was refused (e.g. OVERLOADED): ask again.
                                if c.send(&idle_sync()).await.is_err() {
                                    ctx.faults.errors.local(LocalError::Transport);
                                }
                            }
                        }
                        Some(Body::Pong(_)) => {}
                        _ => ctx.faults.errors.local(LocalError::Unexpected),
                    }
                    false
                }
                Ok(RawEvent::WsPong(_)) => false,
                other => {
                    ctx.lost(other);
                    true
                }
            },
            _ = stop.changed(), if !*stop.borrow() => false,
            () = tokio::time::sleep_until(next_ping) => {
                let now = Instant::now();
                if now >= hard_deadline {
                    break;
                }
                next_ping = now + heartbeat / 2;
                if ping(c).await.is_err() {
                    ctx.faults.errors.local(LocalError::Transport);
                }
                false
            }
        };
        if lost {
            let kill = ctx.replace(idx, &me, &mut conn).await;
            if let Some(c) = conn.as_mut() {
                if c.send(&idle_sync()).await.is_err() {
                    ctx.faults.errors.local(LocalError::Transport);
                }
            }
            recovering = Some(kill);
        }
    }
    if let Some(mut c) = conn {
        let _ = c.close().await;
    }
}

/// An idle connection's sync after a reconnect: all of its conversations after the
/// stored cursors.
fn idle_sync() -> Frame {
    im_proto::frame(
        IDLE_SYNC_REQ,
        Body::Sync(SyncRequest {
            cursors: Vec::new(),
            limit: 0,
            ..Default::default()
        }),
    )
}

/// The text form of a report.
pub fn render(r: &ChaosReport) -> String {
    let mut s = String::new();
    s.push_str(&r.head.text(
        r.duration_secs,
        r.warmup_secs,
        format_args!(
            "{} pairs{}, {}, killing {}% of connections every {:.1}s, {}% malformed frames",
            r.senders,
            if r.idle_connections > 0 {
                format!(" and {} idle connections", r.idle_connections)
            } else {
                String::new()
            },
            if r.rate > 0.0 {
                format!("rate {:.0} msg/s (window {})", r.rate, r.window)
            } else {
                format!("window {}", r.window)
            },
            r.kill_percent,
            r.kill_every_secs,
            r.bad_percent
        ),
    ));
    report::line(
        &mut s,
        "throughput",
        format!(
            "{:.0} acked msgs/s ({} acked in the window; {} send frames, {} resent after reconnects, {} duplicate acks, {} retries)",
            r.acked_per_sec, r.acked, r.sent_frames, r.resent, r.duplicate_acks, r.retries
        ),
    );
    report::summary_line(&mut s, "send->ack", &r.send_to_ack_us);
    report::summary_line(&mut s, "send->deliver", &r.send_to_deliver_us);
    report::line(
        &mut s,
        "kills",
        format!(
            "{} killed ({} asked, {} landed mid-reconnect); {} reconnect attempts failed, {} never came back; {} unexpected disconnects",
            r.kills, r.kills_requested, r.kills_ignored, r.reconnect_failures, r.never_reconnected, r.unexpected_disconnects
        ),
    );
    report::summary_line(&mut s, "reconnect", &r.reconnect_us);
    report::summary_line(&mut s, "recover", &r.recover_us);
    if let Some(st) = &r.storm {
        storm_lines(&mut s, st);
    }
    if r.slow_receivers > 0 {
        report::line(
            &mut s,
            "slow receivers",
            format!(
                "{} reading {:.0} B/s of payload; closed as slow consumers {} times, ended without a close frame {} times ({} not explained by the server's slow-consumer closes), each reconnected",
                r.slow_receivers,
                r.slow_read_bytes_per_sec,
                r.slow_closed,
                r.slow_closed_unseen,
                r.slow_closed_unexplained
            ),
        );
        report::summary_line(&mut s, "  send->deliver", &r.slow_send_to_deliver_us);
    }
    report::line(
        &mut s,
        "bad frames",
        format!(
            "{} sent, {} answered BAD_FRAME, {} answers lost to kills, {} unanswered",
            r.bad_frames_sent, r.bad_frames_answered, r.bad_frames_killed, r.bad_frames_unanswered
        ),
    );
    r.problems.lines(&mut s);
    r.tail
        .verdict_lines(&mut s, &format!("{} unacked at end", r.unacked_at_end));
    if r.never_reconnected > 0
        || r.unexpected_disconnects > 0
        || r.slow_closed_unexplained > 0
        || r.bad_frames_unanswered > 0
    {
        report::line(
            &mut s,
            "",
            "FAIL: a connection broke without a kill, a victim never came back, or a malformed frame got no BAD_FRAME",
        );
    }
    if r.storm.as_ref().is_some_and(|st| !st.passed) {
        report::line(
            &mut s,
            "",
            "FAIL: the storm did not hit, or not every victim reconnected and recovered",
        );
    }
    r.tail.with_server_lines(s)
}

/// The storm's lines of the text report.
fn storm_lines(s: &mut String, st: &StormReport) {
    report::line(
        s,
        "storm",
        format!(
            "{} of {} connections ({:.0}%) reset at once at {:.1}s ({} senders, {} receivers, {} idle; {} already down); {} reconnected, {} recovered, {} sends resent",
            st.victims,
            st.connections,
            st.fraction * 100.0,
            st.at_secs,
            st.victim_senders,
            st.victim_receivers,
            st.victim_idle,
            st.skipped,
            st.reconnected,
            st.recovered,
            st.resent
        ),
    );
    report::summary_line(s, "storm reconnect", &st.reconnect_us);
    report::summary_line(s, "storm recover", &st.recover_us);
    report::line(
        s,
        "",
        format!(
            "all reconnected {} after the storm, all recovered {}",
            fmt_us(st.reconnect_us.max),
            fmt_us(st.recover_us.max)
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storm_flags_parse() {
        let parsed = crate::parse_scenario(&[
            "chaos",
            "--senders",
            "1000",
            "--idle-connections",
            "8000",
            "--storm-fraction",
            "0.2",
            "--storm-at",
            "5s",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Chaos(a) = parsed else {
            panic!("not chaos")
        };
        assert_eq!((a.senders, a.idle_connections), (1000, 8000));
        assert_eq!(a.storm_fraction, 0.2);
        assert_eq!(a.storm_at, Some(Duration::from_secs(5)));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
        assert!(parse_fraction("x").is_err());
        assert_eq!(parse_fraction("0"), Ok(0.0));
    }

    #[test]
    fn a_slow_receivers_unseen_close_needs_the_servers_count() {
        // Two ends without a close frame, one 4008 seen: the server must have closed
        // three slow consumers for all of them to be explained.
        assert_eq!(unexplained_slow_ends(1, 2, Some(3)), 0);
        assert_eq!(unexplained_slow_ends(1, 2, Some(2)), 1);
        assert_eq!(unexplained_slow_ends(1, 2, Some(0)), 2);
        assert_eq!(unexplained_slow_ends(0, 2, None), 2);
        assert_eq!(unexplained_slow_ends(0, 0, None), 0);
    }
}
