//! `peer idle`: N connections opened and authenticated, each subscribed to its own
//! topic, held; the server's RSS growth divided by N.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use super::conn::Event;
use super::proc::{cost, sample_opt, sample_window, server_pid, ServerCost};
use super::traffic::{open_all, opener, KEEPALIVE};
use super::{CommonArgs, Protocol};
use crate::clock::Clock;
use crate::report::{fmt_bytes, line, summary_line};
use crate::run::{run_tag, Absent, Report, ReportBody, Tail};
use crate::stats::Summary;
use crate::target::Target;

/// `peer idle`'s flags.
#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    /// Connections.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub connections: u32,
    /// Common flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

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

/// Runs the mode against `target`.
pub(super) async fn run(
    args: &IdleArgs,
    target: &mut Target,
) -> anyhow::Result<Report<IdleReport>> {
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
