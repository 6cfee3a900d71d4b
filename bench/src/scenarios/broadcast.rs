//! `im-bench broadcast`: group fan-out, the field reports' "broadcast storm" (ten groups, five
//! messages a second each) and the large-group case.
//!
//! `--groups G` groups of `--members M` users each, every member on its own connection.
//! Member 0 of each group is its sender: it creates the group (`GroupOp CREATE`, then
//! `JOIN`s, with all M members, in frames under the server's frame limit), then sends
//! `--rate R` messages per second (0: as fast as `--window` un-acked sends allow)
//! through the shared sending loop ([`super::sender`]). The server
//! fans each message out to the M - 1 other members (the sending connection gets its
//! SendAck instead).
//!
//! Members follow the group conversation like a client ([`super::follow`]): pushed
//! messages in seq order; on a push gap (a slow consumer's dropped pushes) or a
//! notify-and-pull hint (groups above the server's `flow.notify_group_threshold`: an
//! unsolicited `SyncResponse{more: true}` with req_id 0) they sync after their last seq.
//! `--pull` documents that the run expects notify-and-pull (the report says which mode the
//! members actually saw); members handle both either way. Every `--deliver-ack-every`
//! members send a cumulative DeliverAck, as a client's coalesced acks would, each member
//! at a phase of its own within the period (clients' timers are not in step); with
//! `--mark-read` they also mark the group read up to it (`MarkRead`), as an app showing
//! the conversation does: the read receipts' cost is the difference between runs with
//! and without it.
//!
//! Measured, after the warmup: delivery latency (the payload's send time to each
//! member's receipt, push or sync) P50/P95/P99/P999, deliveries per second (receipts in
//! the measured window), send-to-ack latency, the server's figures. Every acked message
//! must reach every member exactly once, in order.
//!
//! On a cluster, `--node-url` names the other nodes: members are spread over `--url` and
//! them round robin (every sender stays on `--url`), and each node's figures (with
//! `--node-admin-url`) join the report. One process may not hold every connection (its
//! descriptor limit): then several processes, each with its own groups, start sending at
//! the same `--start-at` and measure the same window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use im_proto::{Body, DeliverAck, MarkRead, MessageType};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::follow::{Follower, Via};
use super::sender::{self, SendCounts, ToOne};
use crate::admin::ServerFigures;
use crate::check::Verdict;
use crate::clock::Clock;
use crate::outbox::{Outbox, Pacer, SendSpec, Target as To};
use crate::report::{self, p99_text, Rate};
use crate::run::{
    figures_near_end, next_frame, ping, run_tag, spawn_each, Faults, Head, Problems, Report,
    RunArgs,
};
use crate::stats::{LatencyRecorder, LocalError, Summary};
use crate::target::ServerArgs;
use crate::target::{Session, Target};
use crate::util::parse_duration;
use crate::wire;
/// Histogram shards.
const SHARDS: usize = 64;

/// Flags of `im-bench broadcast`.
#[derive(Debug, Clone, Args)]
pub struct BroadcastArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Groups.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub groups: u32,
    /// Members per group, the sender included (one connection each).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..))]
    pub members: u32,
    /// Messages per second per group (0: as fast as the window allows).
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// Outstanding un-acked sends per group sender.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub window: u32,
    /// Payload size in bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub payload: u32,
    /// Expect notify-and-pull (groups above the server's notify_group_threshold):
    /// members sync on each hint. Without it, pushes are expected (members still sync on
    /// a hint or a push gap).
    #[arg(long)]
    pub pull: bool,
    /// Messages per sync page.
    #[arg(long, default_value_t = 1000)]
    pub sync_limit: u32,
    /// How often members send a cumulative DeliverAck (0: never).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub deliver_ack_every: Duration,
    /// With each DeliverAck, also mark the group read up to the same seq.
    #[arg(long)]
    pub mark_read: bool,
    /// A send with neither SendAck nor Error after this long is given up on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
    /// The cluster's other nodes, client WebSocket URLs (comma-separated or repeated):
    /// members are spread round robin over `--url` and these; every sender stays on
    /// `--url`.
    #[arg(
        long = "node-url",
        value_name = "URL",
        value_delimiter = ',',
        conflicts_with = "spawn"
    )]
    pub node_urls: Vec<String>,
    /// Admin APIs of the `--node-url` nodes in the same order (`http://HOST:PORT`, the
    /// `--admin-token` for all): their figures join the report.
    #[arg(
        long = "node-admin-url",
        value_name = "URL",
        value_delimiter = ',',
        requires = "node_urls"
    )]
    pub node_admin_urls: Vec<String>,
    /// Start sending at this wall-clock time (Unix seconds) once every connection is
    /// open, so that several im-bench processes measure the same window; a run that
    /// connects too late fails.
    #[arg(long, value_name = "UNIX_SECS")]
    pub start_at: Option<u64>,
}

/// One group's shared state.
struct Group {
    id: String,
    conversation: String,
    /// Seq of the group's last membership event: members follow from there.
    version: u64,
    /// Highest seq acked to the sender; final once `done` is true.
    max_acked: AtomicU64,
    done: watch::Sender<bool>,
}

impl Group {
    fn caught_up(&self, last: u64) -> bool {
        *self.done.borrow() && last >= self.max_acked.load(Ordering::Acquire)
    }
}

/// Run-wide state shared by every task.
struct Ctx {
    clock: Clock,
    run_id: u64,
    window: usize,
    payload: usize,
    rate: f64,
    drain: Duration,
    ack_timeout: Duration,
    sync_limit: u32,
    deliver_ack_every: Option<Duration>,
    mark_read: bool,
    ack_latency: LatencyRecorder,
    delivery_latency: LatencyRecorder,
    send: SendCounts,
    count: Counts,
    faults: Faults,
}

counters! {
    /// What the members count.
    struct Counts => Totals {
        deliveries, deliveries_measured, pushed, synced, syncs, hints, deliver_acks,
        mark_reads,
    }
}

sender::run_counts!(Ctx);

/// One node of a cluster run (`--node-url`): where it is, the connections the run
/// opened to it, its figures near the end of the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct NodeShare {
    /// The node's client endpoint.
    pub url: String,
    /// Connections opened to it (senders and members).
    pub connections: u64,
    /// Its figures (`None` without its admin API).
    pub server: Option<ServerFigures>,
}

/// The final report of a broadcast run.
pub type BroadcastReport = Report<BroadcastBody>;

/// The broadcast report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct BroadcastBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Groups.
    pub groups: u32,
    /// Members per group (sender included).
    pub members: u32,
    /// Messages/s per group asked for (0: closed loop).
    pub rate_per_group: f64,
    /// Window per sender.
    pub window: u32,
    /// Payload bytes.
    pub payload_bytes: u32,
    /// `push` or `pull`, as asked with `--pull`.
    pub expected_mode: &'static str,
    /// What members saw: `push`, `pull` (hints), or `mixed`.
    pub observed_mode: &'static str,
    /// DeliverAck period (0: none), seconds.
    pub deliver_ack_every_secs: f64,
    /// Measured seconds.
    pub duration_secs: f64,
    /// Warmup seconds.
    pub warmup_secs: f64,
    /// Send frames written, retries included.
    pub sent_frames: u64,
    /// OVERLOADED / RATE_LIMITED retries.
    pub retries: u64,
    /// Acks in the measured window.
    pub acked: u64,
    /// Acked messages per second (all groups).
    pub acked_per_sec: f64,
    /// Deliveries received in the measured window (push or sync).
    pub deliveries: u64,
    /// Deliveries per second over the measured window.
    pub deliveries_per_sec: f64,
    /// Deliveries over the whole run.
    pub deliveries_total: u64,
    /// Of those, pushed.
    pub pushed: u64,
    /// Of those, read by sync.
    pub synced: u64,
    /// Sync requests sent by members.
    pub sync_requests: u64,
    /// Notify-and-pull hints received.
    pub hints: u64,
    /// DeliverAcks sent.
    pub deliver_acks: u64,
    /// MarkReads sent (`--mark-read`).
    pub mark_reads: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// Acks that came after their send was given up on.
    pub late_acks: u64,
    /// SendAcks flagged duplicate.
    pub duplicate_acks: u64,
    /// Scheduled sends skipped because a sender fell a second behind `--rate`.
    pub rate_skipped: u64,
    /// Send-to-SendAck latency (µs), messages sent in the measured window.
    pub send_to_ack_us: Summary,
    /// Send to each member's receipt (µs), messages sent in the measured window.
    pub delivery_us: Summary,
    /// Errors by code and connections that ended during the run, by reason.
    #[serde(flatten)]
    pub problems: Problems,
    /// With `--node-url`: every node, `--url` first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeShare>,
}

scenario! {
    "broadcast", BroadcastArgs => BroadcastBody,
}

fn user(tag: &str, g: usize, k: usize) -> String {
    format!("b{tag}-{g}-{k}")
}

/// Deals `items` over `n` nodes round robin: item `i` goes to node `i % n`.
fn deal<T>(items: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let n = n.max(1);
    let mut hands: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        hands[i % n].push(item);
    }
    hands
}

/// The inverse of [`deal`]: the items back in their first order.
fn gather<T>(hands: Vec<Vec<T>>) -> Vec<T> {
    let total = hands.iter().map(Vec::len).sum();
    let mut iters: Vec<_> = hands.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        for it in &mut iters {
            if let Some(item) = it.next() {
                out.push(item);
            }
        }
    }
    out
}

/// Opens a target per `--node-url` (with its `--node-admin-url`, if given).
async fn other_nodes(args: &BroadcastArgs) -> anyhow::Result<Vec<Target>> {
    if args.node_admin_urls.len() > args.node_urls.len() {
        bail!(
            "{} --node-admin-url for {} --node-url",
            args.node_admin_urls.len(),
            args.node_urls.len()
        );
    }
    let mut nodes = Vec::with_capacity(args.node_urls.len());
    for (i, url) in args.node_urls.iter().enumerate() {
        let admin_url = args.node_admin_urls.get(i).cloned();
        if admin_url.is_some() && args.server.admin_token.is_none() {
            bail!("--node-admin-url needs --admin-token (or IM_BENCH_ADMIN_TOKEN)");
        }
        nodes.push(Target::open(&args.server.for_node(url, admin_url)).await?);
    }
    Ok(nodes)
}

/// Waits for `--start-at` (Unix seconds); fails if it has passed.
async fn wait_for_start(at: u64) -> anyhow::Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let at = Duration::from_secs(at);
    if now > at {
        bail!(
            "every connection was open {:.1}s after --start-at: start later",
            (now - at).as_secs_f64()
        );
    }
    eprintln!(
        "im-bench broadcast: starting in {:.1}s (--start-at)",
        (at - now).as_secs_f64()
    );
    tokio::time::sleep(at - now).await;
    Ok(())
}

async fn run_against(args: &BroadcastArgs, target: &mut Target) -> anyhow::Result<BroadcastReport> {
    let (g_count, m) = (args.groups as usize, args.members as usize);
    let run_id: u64 = rand::random();
    let tag = run_tag(run_id);
    let others = other_nodes(args).await?;
    eprintln!(
        "im-bench broadcast: {g_count} groups x {m} members ({} connections) on {}{}",
        g_count * m,
        target.url,
        if others.is_empty() {
            String::new()
        } else {
            format!(" and {} more nodes", others.len())
        }
    );
    let sender_users: Vec<String> = (0..g_count).map(|g| user(&tag, g, 0)).collect();
    let mut sender_sessions = target.connect_all(&sender_users, 0).await?;
    let mut groups = Vec::with_capacity(g_count);
    for (g, s) in sender_sessions.iter_mut().enumerate() {
        let id = format!("b{tag}-{g}");
        let members = (0..m).map(|k| user(&tag, g, k)).collect();
        let version = crate::groups::create_group(&mut s.conn, &id, members).await?;
        groups.push(Arc::new(Group {
            version,
            conversation: im_proto::group_conversation(&id),
            id,
            max_acked: AtomicU64::new(0),
            done: watch::channel(false).0,
        }));
    }
    let member_users: Vec<String> = (0..g_count)
        .flat_map(|g| (1..m).map(move |k| (g, k)))
        .map(|(g, k)| user(&tag, g, k))
        .collect();
    eprintln!(
        "im-bench broadcast: groups created; connecting {} members",
        member_users.len()
    );
    // Members round robin over the nodes (the senders are on the first), all nodes at once.
    let nodes: Vec<&Target> = std::iter::once(&*target).chain(&others).collect();
    let hands = deal(member_users, nodes.len());
    let mut node_connections: Vec<u64> = hands.iter().map(|h| h.len() as u64).collect();
    node_connections[0] += g_count as u64;
    let opened = futures_util::future::try_join_all(
        nodes
            .iter()
            .zip(&hands)
            .map(|(node, users)| node.connect_all(users, g_count)),
    )
    .await?;
    let member_sessions = gather(opened);
    if let Some(at) = args.start_at {
        wait_for_start(at).await?;
    }

    let clock = Clock::start(args.run.warmup, args.run.duration);
    let ctx = Arc::new(Ctx {
        clock,
        run_id,
        window: args.window as usize,
        payload: args.payload as usize,
        rate: args.rate,
        drain: args.run.drain,
        ack_timeout: args.ack_timeout,
        sync_limit: args.sync_limit,
        deliver_ack_every: (!args.deliver_ack_every.is_zero()).then_some(args.deliver_ack_every),
        mark_read: args.mark_read,
        ack_latency: LatencyRecorder::new(SHARDS),
        delivery_latency: LatencyRecorder::new(SHARDS),
        send: SendCounts::default(),
        count: Counts::default(),
        faults: Faults::default(),
    });

    let mut member_tasks = JoinSet::new();
    for (idx, s) in member_sessions.into_iter().enumerate() {
        let g = idx / (m - 1);
        member_tasks.spawn(member(ctx.clone(), groups[g].clone(), g, idx, s));
    }
    let mut sender_tasks = spawn_each(sender_sessions, |g, s| {
        group_sender(ctx.clone(), groups[g].clone(), g, g_count, s)
    });
    let progress = {
        let ctx = ctx.clone();
        let (mut d, mut a, mut sy) = (Rate::default(), Rate::default(), Rate::default());
        report::spawn_progress(clock, move |dt| {
            format!(
                "sent {:>6.0} msg/s  deliveries {:>9.0}/s  syncs {:>7.0}/s  errors {:>5}  p99 delivery {}",
                a.per_sec(ctx.send.acked_all.get(), dt),
                d.per_sec(ctx.count.deliveries.get(), dt),
                sy.per_sec(ctx.count.syncs.get(), dt),
                ctx.faults.errors.total(),
                p99_text(&ctx.delivery_latency.snapshot()),
            )
        })
    };
    let figures = figures_near_end(target, &clock);
    let other_figures: Vec<_> = others
        .iter()
        .map(|node| figures_near_end(node, &clock))
        .collect();

    let mut acked_by_group: Vec<Vec<u64>> = vec![Vec::new(); g_count];
    while let Some(joined) = sender_tasks.join_next().await {
        let (g, mut acked) = joined.context("sender task panicked")?;
        acked.sort_unstable();
        acked_by_group[g] = acked;
    }
    let mut verdict = Verdict::default();
    let (mut saw_push, mut saw_hints) = (false, false);
    while let Some(joined) = member_tasks.join_next().await {
        let (g, follower) = joined.context("member task panicked")?;
        verdict += follower.verdict(&acked_by_group[g]);
        saw_push |= follower.pushed > 0;
        saw_hints |= follower.hints > 0;
    }
    progress.abort();
    let server = figures.await.ok().flatten();
    let mut nodes = Vec::new();
    if !others.is_empty() {
        nodes.push(NodeShare {
            url: target.url.clone(),
            connections: node_connections[0],
            server: server.clone(),
        });
        for ((node, f), connections) in others.iter().zip(other_figures).zip(&node_connections[1..])
        {
            nodes.push(NodeShare {
                url: node.url.clone(),
                connections: *connections,
                server: f.await.ok().flatten(),
            });
        }
    }

    let secs = clock.measured_secs();
    let (t, c) = (ctx.send.snapshot(), ctx.count.snapshot());
    let (acked, deliveries) = (t.acked_measured, c.deliveries_measured);
    let body = BroadcastBody {
        head: Head::new("broadcast", target),
        groups: args.groups,
        members: args.members,
        rate_per_group: args.rate,
        window: args.window,
        payload_bytes: args.payload,
        expected_mode: if args.pull { "pull" } else { "push" },
        observed_mode: match (saw_push, saw_hints) {
            (true, true) => "mixed",
            (false, true) => "pull",
            _ => "push",
        },
        deliver_ack_every_secs: args.deliver_ack_every.as_secs_f64(),
        duration_secs: secs,
        warmup_secs: args.run.warmup.as_secs_f64(),
        sent_frames: t.sent,
        retries: t.retries,
        acked,
        acked_per_sec: clock.per_sec(acked),
        deliveries,
        deliveries_per_sec: clock.per_sec(deliveries),
        deliveries_total: c.deliveries,
        pushed: c.pushed,
        synced: c.synced,
        sync_requests: c.syncs,
        hints: c.hints,
        deliver_acks: c.deliver_acks,
        mark_reads: c.mark_reads,
        unacked_at_end: t.unacked_at_end,
        late_acks: t.late_acks,
        duplicate_acks: t.duplicate_acks,
        rate_skipped: t.rate_skipped,
        send_to_ack_us: Summary::of(&ctx.ack_latency.snapshot()),
        delivery_us: Summary::of(&ctx.delivery_latency.snapshot()),
        problems: ctx.faults.problems(),
        nodes,
    };
    Ok(Report::judged(body, verdict, server))
}

/// Group `g`'s sender: sends at the group's rate until the end, drains, then tells the
/// members the highest acked seq. Returns the acked seqs.
async fn group_sender(
    ctx: Arc<Ctx>,
    group: Arc<Group>,
    g: usize,
    groups: usize,
    session: Session,
) -> (usize, Vec<u64>) {
    let clock = ctx.clock;
    let outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    let pacer = (ctx.rate > 0.0).then(|| Pacer::staggered(ctx.rate, g, groups, clock.base));
    let spec = SendSpec {
        target: To::Group(group.id.as_str().into()),
        msg_type: MessageType::Text,
        payload_len: ctx.payload,
        tag: 0,
    };
    let mut hooks = ToOne::new(ctx.counts(), clock, &ctx.ack_latency, g, spec).with_system_pushes();
    let mut conn =
        sender::run_to_one(session, outbox, pacer, ctx.window, ctx.drain, &mut hooks).await;
    group.max_acked.store(hooks.max_acked, Ordering::Release);
    group.done.send_replace(true);
    let _ = conn.close().await;
    (g, hooks.acked)
}

/// When member `idx` of group `g` sends its first DeliverAck: a phase of its own within
/// the period `every`, so the members' acks are spread over each period as real clients'
/// are (each acks on its own timer), not a burst of every member at once.
fn first_ack_after(every: Duration, g: usize, idx: usize) -> Duration {
    const PHASES: usize = 1000;
    let phase = (idx + g * 97) % PHASES + 1;
    every.mul_f64(phase as f64 / PHASES as f64)
}

/// A member: follows the group conversation until it has everything acked to the
/// sender (or the drain runs out). Returns its group and follower.
async fn member(
    ctx: Arc<Ctx>,
    group: Arc<Group>,
    g: usize,
    idx: usize,
    session: Session,
) -> (usize, Follower) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let mut follower = Follower::new(group.conversation.clone(), group.version, ctx.sync_limit);
    let mut done_rx = group.done.subscribe();
    let hard_deadline = clock.end + ctx.drain * 2;
    let mut last_tx = Instant::now();
    let mut next_ack = ctx
        .deliver_ack_every
        .map(|d| Instant::now() + first_ack_after(d, g, idx));
    let mut acked_cursor = 0u64;

    loop {
        if let Some(req) = follower.sync_request() {
            if conn.send(&req).await.is_err() {
                ctx.faults.errors.local(LocalError::Transport);
                break;
            }
            ctx.count.syncs.inc();
            last_tx = Instant::now();
        }
        if follower.settled() && group.caught_up(follower.last()) {
            break;
        }
        let mut wake = (last_tx + heartbeat / 2).min(hard_deadline);
        if let Some(at) = next_ack {
            wake = wake.min(at);
        }
        tokio::select! {
            biased;
            f = next_frame(&mut conn, &ctx.faults) => {
                let Some(f) = f else { break };
                let now_us = clock.now_us();
                let hints = follower.hints;
                let mine = follower.on_frame(&f, |m, via| {
                    ctx.count.deliveries.inc();
                    match via {
                        Via::Push => ctx.count.pushed.inc(),
                        Via::Sync => ctx.count.synced.inc(),
                    }
                    if clock.measured_us(now_us) {
                        ctx.count.deliveries_measured.inc();
                    }
                    if let Some(sent_us) = wire::payload_timestamp(&m.payload) {
                        if clock.measured_us(sent_us) {
                            ctx.delivery_latency.record(idx, now_us.saturating_sub(sent_us));
                        }
                    }
                });
                ctx.count.hints.add(follower.hints - hints);
                if !mine {
                    ctx.faults.errors.stray(&f);
                }
            }
            _ = done_rx.changed(), if !*done_rx.borrow() => {}
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if now >= hard_deadline {
                    break;
                }
                if next_ack.is_some_and(|at| now >= at) {
                    next_ack = ctx.deliver_ack_every.map(|d| now + d);
                    if follower.last() > acked_cursor {
                        acked_cursor = follower.last();
                        let ack = im_proto::frame(0, Body::DeliverAck(DeliverAck {
                            conversation_id: group.conversation.clone(),
                            seq: acked_cursor,
                        }));
                        if conn.send(&ack).await.is_err() {
                            ctx.faults.errors.local(LocalError::Transport);
                            break;
                        }
                        ctx.count.deliver_acks.inc();
                        if ctx.mark_read {
                            let read = im_proto::frame(0, Body::MarkRead(MarkRead {
                                conversation_id: group.conversation.clone(),
                                seq: acked_cursor,
                            }));
                            if conn.send(&read).await.is_err() {
                                ctx.faults.errors.local(LocalError::Transport);
                                break;
                            }
                            ctx.count.mark_reads.inc();
                        }
                        last_tx = now;
                    }
                }
                if now >= last_tx + heartbeat / 2 {
                    if ping(&mut conn).await.is_err() {
                        ctx.faults.errors.local(LocalError::Transport);
                        break;
                    }
                    last_tx = now;
                }
            }
        }
    }
    let _ = conn.close().await;
    (g, follower)
}

/// The text form of a report.
pub fn render(r: &BroadcastReport) -> String {
    let mut s = String::new();
    s.push_str(&r.head.text(
        r.duration_secs,
        r.warmup_secs,
        format_args!(
            "{} groups x {} members, {} per group (window {}), payload {} B, {} expected / {} observed",
            r.groups,
            r.members,
            if r.rate_per_group > 0.0 {
            format!("{} msg/s", r.rate_per_group)
        } else {
            "as fast as acks allow".to_owned()
        },
            r.window,
            r.payload_bytes,
            r.expected_mode,
            r.observed_mode
        ),
    ));
    report::line(
        &mut s,
        "throughput",
        format!(
            "{:.0} deliveries/s ({} in the measured window), {:.1} acked msgs/s ({} acked; {} send frames, {} retries)",
            r.deliveries_per_sec, r.deliveries, r.acked_per_sec, r.acked, r.sent_frames, r.retries
        ),
    );
    report::summary_line(&mut s, "delivery", &r.delivery_us);
    report::summary_line(&mut s, "send->ack", &r.send_to_ack_us);
    report::line(
        &mut s,
        "members",
        format!(
            "{} received in total: {} pushed, {} by sync ({} sync requests, {} hints); {} DeliverAcks, {} MarkReads",
            r.deliveries_total, r.pushed, r.synced, r.sync_requests, r.hints, r.deliver_acks, r.mark_reads
        ),
    );
    if r.expected_mode != r.observed_mode {
        report::line(
            &mut s,
            "",
            format!(
                "note: {} was expected but members saw {} (the server's flow.notify_group_threshold decides)",
                r.expected_mode, r.observed_mode
            ),
        );
    }
    for node in &r.nodes {
        let figures = match &node.server {
            Some(f) => format!(
                ": CPU {:.0}% of {} cores, RSS {:.0} MiB, {:.0} msgs out/s",
                f.cpu_busy * 100.0,
                f.cores,
                f.rss_bytes as f64 / (1024.0 * 1024.0),
                f.msg_rate_out
            ),
            None => String::new(),
        };
        report::line(
            &mut s,
            "node",
            format!("{} ({} connections){figures}", node.url, node.connections),
        );
    }
    r.problems.lines(&mut s);
    r.tail.verdict_lines(
        &mut s,
        &format!(
            "{} unacked at end, {} late acks, {} duplicate acks{}",
            r.unacked_at_end,
            r.late_acks,
            r.duplicate_acks,
            if r.rate_skipped > 0 {
                format!(", {} scheduled sends skipped", r.rate_skipped)
            } else {
                String::new()
            }
        ),
    );
    r.tail.with_server_lines(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        let parsed = crate::parse_scenario(&[
            "broadcast",
            "--groups",
            "1",
            "--members",
            "5000",
            "--rate",
            "0",
            "--pull",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Broadcast(a) = parsed else {
            panic!("not broadcast")
        };
        assert_eq!((a.groups, a.members, a.rate, a.pull), (1, 5000, 0.0, true));
        assert_eq!(a.deliver_ack_every, Duration::from_secs(1));
        assert!(crate::parse_scenario(&["broadcast", "--members", "1"]).is_err());
        assert_eq!(user("ab", 2, 3), "bab-2-3");
    }

    #[test]
    fn members_ack_at_phases_spread_over_the_period() {
        let every = Duration::from_secs(1);
        let firsts: Vec<Duration> = (0..1000).map(|i| first_ack_after(every, 0, i)).collect();
        assert!(firsts.iter().all(|d| !d.is_zero() && *d <= every));
        let early = firsts.iter().filter(|d| **d <= every / 10).count();
        assert!(
            (90..=110).contains(&early),
            "{early} of 1000 in the first tenth"
        );
        assert_ne!(first_ack_after(every, 1, 0), first_ack_after(every, 0, 0));
    }

    #[test]
    fn members_are_dealt_round_robin_and_gathered_back_in_order() {
        let hands = deal((0..10).collect(), 3);
        assert_eq!(hands, vec![vec![0, 3, 6, 9], vec![1, 4, 7], vec![2, 5, 8]]);
        assert_eq!(gather(hands), (0..10).collect::<Vec<_>>());
        // One node keeps everything; more nodes than members leaves some empty.
        assert_eq!(deal(vec![1, 2], 1), vec![vec![1, 2]]);
        let hands = deal(vec![1, 2], 4);
        assert_eq!(hands, vec![vec![1], vec![2], vec![], vec![]]);
        assert_eq!(gather(hands), vec![1, 2]);
        assert_eq!(gather::<u8>(deal(Vec::new(), 3)), Vec::<u8>::new());
    }

    #[test]
    fn cluster_flags_parse() {
        let parsed = crate::parse_scenario(&[
            "broadcast",
            "--url",
            "ws://127.0.0.1:1/ws",
            "--node-url",
            "ws://127.0.0.1:2/ws,ws://127.0.0.1:3/ws",
            "--node-url",
            "ws://127.0.0.1:4/ws",
            "--node-admin-url",
            "http://127.0.0.1:5",
            "--start-at",
            "1800000000",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Broadcast(a) = parsed else {
            panic!("not broadcast")
        };
        assert_eq!(a.node_urls.len(), 3);
        assert_eq!(a.node_admin_urls, vec!["http://127.0.0.1:5".to_owned()]);
        assert_eq!(a.start_at, Some(1_800_000_000));
        // Other nodes make no sense beside a spawned server, admin URLs none without nodes.
        assert!(crate::parse_scenario(&[
            "broadcast",
            "--spawn",
            "im-server",
            "--node-url",
            "ws://127.0.0.1:2/ws"
        ])
        .is_err());
        assert!(
            crate::parse_scenario(&["broadcast", "--node-admin-url", "http://127.0.0.1:5"])
                .is_err()
        );
    }
}
