//! `peer broadcast`: one topic/subject (im: one group) with M subscribers and one sender
//! at R msg/s; delivery latency, deliveries/s, the server's CPU per delivery, and an
//! exactly-once check by sequence number (losses fail only im's run).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use tokio::task::JoinSet;

use super::conn::{Dest, PeerConn};
use super::proc::{cost, cost_lines, per, sample_window, server_pid, ServerCost};
use super::traffic::{open_all, opener, receive, send_loop, Delivery, Receivers};
use super::{CommonArgs, Protocol};
use crate::clock::Clock;
use crate::report::{line, summary_line};
use crate::run::{run_tag, Absent, Report, ReportBody, Tail};
use crate::stats::{LatencyRecorder, Summary};
use crate::target::Target;

/// `peer broadcast`'s flags.
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
    /// This generator's own CPU over the window (its readers decode every delivery):
    /// above ~1 core on a 2-core machine, it competes with the server.
    pub generator: Option<ServerCost>,
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
        if let Some(g) = r.generator {
            line(&mut s, "generator", format!("{:.3} cores", g.cpu_cores));
        }
        line(&mut s, "passed", r.tail.passed);
        s
    }
}

/// Runs the mode against `target`.
pub(super) async fn run(
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
    let own_window = sample_window(Some(std::process::id()), clock);
    let ack_latency = Arc::new(LatencyRecorder::new(1));
    let dest = Dest::Fanout(topic);
    let totals = send_loop(
        sender,
        (0, 1),
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
    let own = own_window.await.context("sampler panicked")?;
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
            generator: cost(own, clock.measured_secs()),
        },
        tail: Tail::new(Absent, passed, Absent),
    })
}
