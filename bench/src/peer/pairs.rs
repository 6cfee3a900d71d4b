//! `peer pairs`: P senders each at R msg/s to their own receiver; send-to-ack and
//! send-to-deliver latency and the server's CPU per message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use tokio::task::JoinSet;

use super::conn::Dest;
use super::proc::{cost, cost_lines, per, sample_window, server_pid, ServerCost};
use super::traffic::{open_all, opener, receive, send_loop, Delivery, Receivers};
use super::{CommonArgs, Protocol};
use crate::clock::Clock;
use crate::report::{line, summary_line};
use crate::run::{run_tag, Absent, Report, ReportBody, Tail};
use crate::stats::{LatencyRecorder, Summary};
use crate::target::Target;

/// `peer pairs`'s flags.
#[derive(Debug, Clone, Args)]
pub struct PairsArgs {
    /// Sender/receiver pairs.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub pairs: u32,
    /// Messages per second per sender.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// How the senders' ticks fall within each period.
    #[arg(long, value_enum, default_value_t = Arrivals::Even)]
    pub arrivals: Arrivals,
    /// Common flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Where each sender's sends fall within the period `1 / rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Spread evenly over the whole period: sender `i` of `n` at `period × i / n`, so the
    /// server sees one arrival every `period / n`, as real users' sends arrive.
    Even,
    /// Every sender within the first tenth of the period (`period × (i % 1000) / 1000`
    /// with 100 senders): one burst per period, which the persistence batch turns into one
    /// commit. Kept to compare with figures measured before the even default.
    Burst,
}

impl Arrivals {
    /// Sender `i` of `n`'s slot, as `send_loop` takes it.
    fn slot(self, i: u32, n: u32) -> (u32, u32) {
        match self {
            Arrivals::Even => (i, n),
            Arrivals::Burst => (i % 1000, 1000),
        }
    }
}

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
    /// How the sends fell within each period.
    pub arrivals: Arrivals,
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
            "peer pairs ({:?}): {} pairs x {} msg/s ({:?} arrivals), {} sent in the window\n",
            r.protocol, r.pairs, r.rate, r.arrivals, r.sent_in_window
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

/// Runs the mode against `target`.
pub(super) async fn run(
    args: &PairsArgs,
    target: &mut Target,
) -> anyhow::Result<Report<PairsReport>> {
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
            args.arrivals.slot(i as u32, args.pairs),
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
            arrivals: args.arrivals,
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
