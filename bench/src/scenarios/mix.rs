//! `im-bench mix`: one-to-one traffic shaped like production (the field reports' mix: "short
//! text 80%, images 15%, files 5%", and "a few hot conversations carry most messages").
//!
//! `--users U` connections (one user each) and `--conversations C` one-to-one
//! conversations between random pairs of them. A dispatcher schedules `--rate R`
//! messages per second in total; each picks a conversation by a Zipf law over
//! conversation ranks (`--zipf S`: rank k has weight 1/(k+1)^S, 0 = uniform), a
//! direction (either party sends), and a size class from `--mix` (default
//! `text:80:50-200,image:15:10000-50000,file:5:50000-60000`: name (text, image or file,
//! which sets the message type), weight, and the payload size range in bytes, drawn
//! uniformly). The server's default `limits.max_frame_bytes` is 64 KiB, hence files of
//! 50-60 KB; raise it (`--server-env IM_LIMITS_MAX_FRAME_BYTES=...`) for larger ones.
//! The sending user's connection writes the Send (at most `--window` un-acked; a job
//! that finds the window full, or the connection's queue full, is skipped and counted).
//!
//! Beside the messages, the users act as a chat app does (`--read-share`,
//! `--typing-share`, `--list-rate`): a receiver marks the conversation read after a share
//! of the messages it gets (an app on screen does, one in the background does not; the
//! default 0.6; at most one MarkRead per 100 ms per connection, as apps coalesce them), a share of the sends is preceded by a typing signal (default 0.3; at
//! most one a second per connection, as apps throttle them), and
//! users open their conversation list (default one call per 20 messages, at random
//! users). Read receipts and typing signals pushed back are counted; a refused MarkRead,
//! Typing or ListConversations fails the run.
//!
//! Groups and a cluster (the field report's headline: one-to-one and groups on several
//! nodes): `--groups G --group-members M` creates G groups of M distinct random users
//! before the run, and `--group-share S` sends that share of the messages to a group (a
//! uniformly chosen one, from a random member, same size mix) instead of a conversation;
//! the server pushes each to the other M - 1 members. `--node-url` names more nodes of the
//! same cluster: user `i` connects to node `i % nodes` (`--url` is node 0), so most
//! conversations and every group span nodes.
//!
//! Measured per class: send-to-ack and send-to-deliver latency; the same over all
//! messages, and for group messages alone; overall: acked messages and payload bytes per
//! second, how concentrated the traffic was, the conversation-list round trip, and the
//! server's figures. Every acked message must be delivered exactly once, in order, to its
//! recipient (to every other member of a group; on a cluster, where a group's pushes from
//! senders on different nodes may arrive out of order, they are put in seq order first,
//! as the client SDK does, and counted).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use im_proto::{Body, ConversationRef, ListConversations, MarkRead, MessageType, Typing};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ledger::{self, Ending, Expect, Ledger};
use crate::clock::Clock;
use crate::outbox::{Outbox, Pacer, SendSpec, Target as To};
use crate::report::{self, fmt_bytes, p99_text};
use crate::run::{
    figures_near_end, keep_alive, next_frame, run_tag, Faults, Head, Problems, Report, RunArgs,
    Tail,
};
use crate::stats::{Counter, LatencyRecorder, LocalError, Summary};
use crate::target::ServerArgs;
use crate::target::{Session, Target};
use crate::util::{parse_duration, Zipf};
use crate::wire;

/// Histogram shards per class and kind.
const SHARDS: usize = 16;
/// Jobs queued per user connection before the dispatcher skips.
const JOB_QUEUE: usize = 256;
/// How often a user connection checks ack timeouts and heartbeats.
const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// Shortest interval between two MarkReads of one connection: an app marks what is on
/// screen read as messages arrive, coalesced (well under `limits.mark_read_rate_per_sec`).
const READ_EVERY: Duration = Duration::from_millis(100);
/// req_ids of the app actions (MarkRead, Typing, ListConversations) start here, far
/// above the outbox's message numbers.
const ACTION_REQ: u64 = 1 << 60;
/// The default `--mix`.
pub const DEFAULT_MIX: &str = "text:80:50-200,image:15:10000-50000,file:5:50000-60000";

/// One message size class of `--mix`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeClass {
    /// `text`, `image` or `file`.
    pub name: String,
    /// Relative weight.
    pub weight: f64,
    /// Smallest payload, bytes (at least 8).
    pub min: usize,
    /// Largest payload, bytes.
    pub max: usize,
    /// The message type it is sent as.
    #[serde(skip)]
    pub msg_type: MessageType,
}

/// The size classes of `--mix`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mix(pub Vec<SizeClass>);

/// Parses `--mix`: `NAME:WEIGHT:MIN-MAX` entries separated by commas; each name
/// (text, image, file) at most once.
pub fn parse_mix(text: &str) -> Result<Mix, String> {
    let mut out: Vec<SizeClass> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let fields: Vec<&str> = part.split(':').collect();
        let [name, weight, range] = fields[..] else {
            return Err(format!("{part:?}: expected NAME:WEIGHT:MIN-MAX"));
        };
        let msg_type = match name {
            "text" => MessageType::Text,
            "image" => MessageType::Image,
            "file" => MessageType::File,
            other => return Err(format!("unknown class {other:?} (text, image or file)")),
        };
        if out.iter().any(|c| c.name == name) {
            return Err(format!("class {name:?} given twice"));
        }
        let weight: f64 = weight
            .parse()
            .map_err(|_| format!("{part:?}: weight {weight:?} is not a number"))?;
        let (lo, hi) = range
            .split_once('-')
            .ok_or_else(|| format!("{part:?}: size {range:?} is not MIN-MAX"))?;
        let (min, max): (usize, usize) = match (lo.parse(), hi.parse()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return Err(format!("{part:?}: size {range:?} is not MIN-MAX in bytes")),
        };
        if !(weight >= 0.0 && weight.is_finite()) || min < wire::TIMESTAMP_LEN || max < min {
            return Err(format!(
                "{part:?}: need weight >= 0 and {} <= MIN <= MAX",
                wire::TIMESTAMP_LEN
            ));
        }
        out.push(SizeClass {
            name: name.to_owned(),
            weight,
            min,
            max,
            msg_type,
        });
    }
    if out.iter().map(|c| c.weight).sum::<f64>() <= 0.0 {
        return Err("the mix needs at least one class with a positive weight".into());
    }
    Ok(Mix(out))
}

/// Flags of `im-bench mix`.
#[derive(Debug, Clone, Args)]
pub struct MixArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Users (one connection each).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..))]
    pub users: u32,
    /// One-to-one conversations between random pairs of users (default: as many as users).
    #[arg(long)]
    pub conversations: Option<u32>,
    /// Zipf exponent of conversation popularity (0: uniform).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Total messages per second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Size classes: NAME:WEIGHT:MIN-MAX,... (bytes).
    #[arg(long, default_value = DEFAULT_MIX, value_parser = parse_mix)]
    pub mix: Mix,
    /// Most un-acked sends per connection.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub window: u32,
    /// A send with neither SendAck nor Error after this long is given up on.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ack_timeout: Duration,
    /// Share of delivered messages after which the receiver marks the conversation read.
    #[arg(long, default_value_t = 0.6, value_parser = parse_share)]
    pub read_share: f64,
    /// Share of sends preceded by a typing signal.
    #[arg(long, default_value_t = 0.3, value_parser = parse_share)]
    pub typing_share: f64,
    /// Conversation-list calls per second over all users (default: --rate / 20; 0: none).
    #[arg(long)]
    pub list_rate: Option<f64>,
    /// More nodes of the same cluster (WebSocket URLs, repeatable or comma-separated):
    /// user `i` connects to node `i % nodes`, `--url` being node 0.
    #[arg(
        long = "node-url",
        value_name = "URL",
        value_delimiter = ',',
        conflicts_with = "spawn"
    )]
    pub node_urls: Vec<String>,
    /// Groups among the users, created before the run (0: none).
    #[arg(long, default_value_t = 0)]
    pub groups: u32,
    /// Members of each group (distinct random users).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub group_members: u32,
    /// Share of the messages sent to a group instead of a one-to-one conversation.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub group_share: f64,
}

/// Parses a share between 0 and 1.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{text:?} is not a share between 0 and 1")),
    }
}

/// Latency and counts of one class.
struct ClassStats {
    ack: LatencyRecorder,
    deliver: LatencyRecorder,
    sent: Counter,
    acked: Counter,
    acked_bytes: Counter,
}

/// One group of the run.
#[derive(Debug)]
struct Group {
    /// Its id.
    id: Arc<str>,
    /// Its members' user indices, sorted.
    members: Vec<u32>,
}

/// What the dispatcher hands to a user connection.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// A message (after a typing signal when `typing`) to user `to`, or to group `to`
    /// when `group`.
    Send {
        to: u32,
        group: bool,
        class: u8,
        size: u32,
        typing: bool,
    },
    /// A conversation-list call.
    List,
}

/// Run-wide state shared by every task.
struct Ctx {
    clock: Clock,
    tag: String,
    run_id: u64,
    window: usize,
    ack_timeout: Duration,
    drain: Duration,
    classes: Vec<SizeClass>,
    stats: Vec<ClassStats>,
    read_share: f64,
    list: LatencyRecorder,
    /// Send-to-ack and send-to-deliver over every message.
    all: (LatencyRecorder, LatencyRecorder),
    /// The same over group messages.
    group: (LatencyRecorder, LatencyRecorder),
    groups: Vec<Group>,
    /// Group index by conversation id.
    group_of: HashMap<String, u32>,
    count: Counts,
    expect: Expect,
    faults: Faults,
}

counters! {
    /// What the dispatcher and the users count.
    struct Counts => Totals {
        acked_all, acked_measured, delivered, dispatched, skipped_queue, skipped_window,
        retries, unacked_at_end, reads_sent, receipts_received, typing_sent,
        typing_received, lists, action_errors, group_sent, group_acked, group_delivered,
    }
}

fn user_name(tag: &str, idx: usize) -> String {
    format!("x{tag}-{idx}")
}

impl Ctx {
    fn user(&self, idx: usize) -> String {
        user_name(&self.tag, idx)
    }

    fn class_of(&self, t: i32) -> Option<usize> {
        self.classes.iter().position(|c| c.msg_type as i32 == t)
    }

    /// The group of a group conversation, when `idx` is one of its members.
    fn group_of_member(&self, conversation: &str, idx: usize) -> Option<&Group> {
        let g = self
            .groups
            .get(*self.group_of.get(conversation)? as usize)?;
        g.members.binary_search(&(idx as u32)).is_ok().then_some(g)
    }
}

/// The `group` section of a mix report.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// Groups.
    pub groups: u32,
    /// Members per group.
    pub members: u32,
    /// Share of the messages sent to groups.
    pub share: f64,
    /// Group messages written (first attempts).
    pub sent: u64,
    /// Group messages acked in the measured window.
    pub acked: u64,
    /// Group messages delivered to members over the run (one per member).
    pub delivered: u64,
    /// On a cluster: group pushes that arrived below the seq before them (put back in
    /// order for the check, as the client SDK does; see docs/cluster.md).
    pub pushes_reordered: u64,
    /// Send-to-SendAck latency of group messages (µs), measured window.
    pub send_to_ack_us: Summary,
    /// Send-to-deliver latency of group messages, each member's receipt (µs).
    pub send_to_deliver_us: Summary,
}

/// One class in the report.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    /// The class as configured.
    #[serde(flatten)]
    pub class: SizeClass,
    /// Sends written (first attempts).
    pub sent: u64,
    /// Acked in the measured window.
    pub acked: u64,
    /// Send-to-SendAck latency (µs), measured window.
    pub send_to_ack_us: Summary,
    /// Send-to-deliver latency (µs), measured window.
    pub send_to_deliver_us: Summary,
}

/// The final report of a mix run.
pub type MixReport = Report<MixBody>;

/// The mix report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct MixBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Users (connections).
    pub users: u32,
    /// Conversations.
    pub conversations: u32,
    /// Zipf exponent.
    pub zipf: f64,
    /// Share of the traffic the law gives the hottest 1% of conversations.
    pub zipf_top1pct_share: f64,
    /// Share of dispatched messages that went to the 10 busiest conversations.
    pub top10_share_observed: f64,
    /// Target total rate, msgs/s.
    pub rate: f64,
    /// Measured seconds.
    pub duration_secs: f64,
    /// Warmup seconds.
    pub warmup_secs: f64,
    /// Messages dispatched to connections.
    pub dispatched: u64,
    /// Jobs skipped: the sender's queue was full.
    pub skipped_queue: u64,
    /// Jobs skipped: the sender's window was full.
    pub skipped_window: u64,
    /// Retries after OVERLOADED / RATE_LIMITED.
    pub retries: u64,
    /// Acked in the measured window.
    pub acked: u64,
    /// Acked messages per second.
    pub acked_per_sec: f64,
    /// Acked payload bytes per second.
    pub acked_bytes_per_sec: f64,
    /// Messages delivered over the run.
    pub delivered: u64,
    /// Sends never acked when the drain ended.
    pub unacked_at_end: u64,
    /// MarkRead frames sent, and read receipts pushed back.
    pub reads_sent: u64,
    /// ReadReceipt pushes received.
    pub receipts_received: u64,
    /// Typing signals sent.
    pub typing_sent: u64,
    /// Typing pushes received.
    pub typing_received: u64,
    /// Conversation-list calls answered.
    pub lists: u64,
    /// ListConversations request-to-reply latency (µs), measured window.
    pub list_us: Summary,
    /// MarkRead, Typing or ListConversations refused (fails the run).
    pub action_errors: u64,
    /// Per class.
    pub classes: Vec<ClassReport>,
    /// Nodes the users were spread over (`--url`, then `--node-url`).
    pub urls: Vec<String>,
    /// Send-to-SendAck latency over every message (µs), measured window.
    pub send_to_ack_us: Summary,
    /// Send-to-deliver latency over every delivery (µs), measured window.
    pub send_to_deliver_us: Summary,
    /// Group traffic (with `--groups`).
    pub group: GroupReport,
    /// Errors by code; connections that ended during the run, by reason.
    #[serde(flatten)]
    pub problems: Problems,
}

scenario! {
    "mix", MixArgs => MixBody,
}

async fn run_against(args: &MixArgs, target: &mut Target) -> anyhow::Result<MixReport> {
    let n = args.users as usize;
    let c = args.conversations.unwrap_or(args.users).max(1) as usize;
    if args.rate <= 0.0 {
        bail!("--rate must be positive");
    }
    let classes = args.mix.0.clone();
    if let Some(big) = classes.iter().find(|c| c.max > 64 * 1024 - 128) {
        eprintln!(
            "im-bench mix: note: class {} goes up to {} B; the server's default max frame is 64 KiB (IM_LIMITS_MAX_FRAME_BYTES)",
            big.name, big.max
        );
    }
    if args.group_share > 0.0 && args.groups == 0 {
        bail!("--group-share needs --groups");
    }
    if args.groups > 0 && args.group_members > args.users {
        bail!("--group-members is more than --users");
    }
    let run_id: u64 = rand::random();
    let tag = run_tag(run_id);
    let users: Vec<String> = (0..n).map(|i| user_name(&tag, i)).collect();
    let mut urls = vec![target.url.clone()];
    urls.extend(args.node_urls.iter().cloned());
    eprintln!(
        "im-bench mix: connecting {n} users ({c} conversations, zipf {}) to {}",
        args.zipf,
        urls.join(", ")
    );
    let mut sessions = connect_spread(args, target, &users).await?;
    let mut rng = StdRng::seed_from_u64(run_id);
    let mut groups = Vec::with_capacity(args.groups as usize);
    for g in 0..args.groups {
        let id: Arc<str> = format!("m{tag}-{g}").into();
        let mut members =
            rand::seq::index::sample(&mut rng, n, args.group_members as usize).into_vec();
        // The first member, on its own connection, creates the group.
        let owner = members[0];
        let names = members.iter().map(|&i| users[i].clone()).collect();
        crate::groups::create_group(&mut sessions[owner].conn, &id, names)
            .await
            .with_context(|| format!("creating group {id}"))?;
        members.sort_unstable();
        groups.push(Group {
            id,
            members: members.into_iter().map(|i| i as u32).collect(),
        });
    }
    if !groups.is_empty() {
        eprintln!(
            "im-bench mix: {} groups of {} members created",
            groups.len(),
            args.group_members
        );
    }
    let group_of = groups
        .iter()
        .enumerate()
        .map(|(k, g)| (im_proto::group_conversation(&g.id), k as u32))
        .collect();
    let clock = Clock::start(args.run.warmup, args.run.duration);
    let pairs: Vec<(u32, u32)> = (0..c)
        .map(|_| {
            let a = rng.gen_range(0..n as u32);
            let b = (a + rng.gen_range(1..n as u32)) % n as u32;
            (a, b)
        })
        .collect();
    let ctx = Arc::new(Ctx {
        clock,
        tag,
        run_id,
        window: args.window as usize,
        ack_timeout: args.ack_timeout,
        drain: args.run.drain,
        stats: classes
            .iter()
            .map(|_| ClassStats {
                ack: LatencyRecorder::new(SHARDS),
                deliver: LatencyRecorder::new(SHARDS),
                sent: Counter::default(),
                acked: Counter::default(),
                acked_bytes: Counter::default(),
            })
            .collect(),
        classes,
        read_share: args.read_share,
        list: LatencyRecorder::new(SHARDS),
        all: (LatencyRecorder::new(SHARDS), LatencyRecorder::new(SHARDS)),
        group: (LatencyRecorder::new(SHARDS), LatencyRecorder::new(SHARDS)),
        groups,
        group_of,
        count: Counts::default(),
        expect: Expect::new(n),
        faults: Faults::default(),
    });

    let mut queues = Vec::with_capacity(n);
    let mut tasks = JoinSet::new();
    for (idx, s) in sessions.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(JOB_QUEUE);
        queues.push(tx);
        tasks.spawn(user(ctx.clone(), idx, s, rx));
    }
    let zipf = Zipf::new(c, args.zipf);
    let top1 = zipf.top_share(c.div_ceil(100));
    let shape = Shape {
        rate: args.rate,
        group_share: args.group_share,
        typing_share: args.typing_share,
        list_rate: args.list_rate.unwrap_or(args.rate / 20.0).max(0.0),
    };
    let dispatcher = tokio::spawn(dispatch(ctx.clone(), queues, pairs, zipf, shape));
    let progress =
        report::spawn_rate_progress(clock, ctx.clone(), |ctx, rate, dt| {
            format!(
            "acked {:>8.0} msg/s  errors {:>5}  skipped {:>6}  p99 send->ack text {} / image {}",
            rate.per_sec(ctx.count.acked_all.get(), dt),
            ctx.faults.errors.total(),
            ctx.count.skipped_queue.get() + ctx.count.skipped_window.get(),
            ctx.stats.first().map_or("-".into(), |s| p99_text(&s.ack.snapshot())),
            ctx.stats.get(1).map_or("-".into(), |s| p99_text(&s.ack.snapshot())),
        )
        });
    let figures = figures_near_end(target, &clock);

    let counts = dispatcher.await.context("dispatcher panicked")?;
    let mut ledgers: Vec<Ledger> = (0..n).map(|_| Ledger::default()).collect();
    while let Some(joined) = tasks.join_next().await {
        let (idx, ledger) = joined.context("user task panicked")?;
        ledgers[idx] = ledger;
    }
    progress.abort();
    // On a cluster a group's pushes from senders on different nodes may arrive out of
    // order; the client SDK puts them back in seq order, and so does the check.
    let mut group_reordered = 0;
    if !args.node_urls.is_empty() {
        for l in &mut ledgers {
            group_reordered += l.sort_deliveries(|c| ctx.group_of.contains_key(c));
        }
    }
    let verdict = ledger::verdict(ledgers);
    let server = figures.await.ok().flatten();

    let mut sorted = counts;
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = sorted.iter().sum();
    let top10: u64 = sorted.iter().take(10).sum();
    let secs = clock.measured_secs();
    let t = ctx.count.snapshot();
    let acked = t.acked_measured;
    let body = MixBody {
        head: Head::new("mix", target),
        users: args.users,
        conversations: c as u32,
        zipf: args.zipf,
        zipf_top1pct_share: top1,
        top10_share_observed: if total > 0 {
            top10 as f64 / total as f64
        } else {
            0.0
        },
        rate: args.rate,
        duration_secs: secs,
        warmup_secs: args.run.warmup.as_secs_f64(),
        dispatched: t.dispatched,
        skipped_queue: t.skipped_queue,
        skipped_window: t.skipped_window,
        retries: t.retries,
        acked,
        acked_per_sec: clock.per_sec(acked),
        acked_bytes_per_sec: clock.per_sec(ctx.stats.iter().map(|s| s.acked_bytes.get()).sum()),
        delivered: t.delivered,
        unacked_at_end: t.unacked_at_end,
        reads_sent: t.reads_sent,
        receipts_received: t.receipts_received,
        typing_sent: t.typing_sent,
        typing_received: t.typing_received,
        lists: t.lists,
        list_us: Summary::of(&ctx.list.snapshot()),
        action_errors: t.action_errors,
        classes: ctx
            .classes
            .iter()
            .zip(&ctx.stats)
            .map(|(c, s)| ClassReport {
                class: c.clone(),
                sent: s.sent.get(),
                acked: s.acked.get(),
                send_to_ack_us: Summary::of(&s.ack.snapshot()),
                send_to_deliver_us: Summary::of(&s.deliver.snapshot()),
            })
            .collect(),
        urls,
        send_to_ack_us: Summary::of(&ctx.all.0.snapshot()),
        send_to_deliver_us: Summary::of(&ctx.all.1.snapshot()),
        group: GroupReport {
            groups: args.groups,
            members: args.group_members,
            share: args.group_share,
            sent: t.group_sent,
            acked: t.group_acked,
            delivered: t.group_delivered,
            pushes_reordered: group_reordered,
            send_to_ack_us: Summary::of(&ctx.group.0.snapshot()),
            send_to_deliver_us: Summary::of(&ctx.group.1.snapshot()),
        },
        problems: ctx.faults.problems(),
    };
    let passed = verdict.passed() && t.action_errors == 0;
    Ok(Report {
        body,
        tail: Tail::new(verdict, passed, server),
    })
}

/// Opens the users' connections, user `i` to node `i % nodes` (`target` is node 0, then
/// `--node-url`); returns them in user order.
async fn connect_spread(
    args: &MixArgs,
    target: &Target,
    users: &[String],
) -> anyhow::Result<Vec<Session>> {
    let mut others = Vec::with_capacity(args.node_urls.len());
    for url in &args.node_urls {
        others.push(Target::open(&args.server.for_node(url, None)).await?);
    }
    let nodes = 1 + others.len();
    let mut slots: Vec<Option<Session>> = (0..users.len()).map(|_| None).collect();
    for k in 0..nodes {
        let node = if k == 0 { target } else { &others[k - 1] };
        let idxs: Vec<usize> = (k..users.len()).step_by(nodes).collect();
        let names: Vec<String> = idxs.iter().map(|&i| users[i].clone()).collect();
        let sessions = node.connect_all(&names, k * users.len()).await?;
        if sessions.len() != idxs.len() {
            bail!(
                "{}: {} of {} users connected",
                node.url,
                sessions.len(),
                idxs.len()
            );
        }
        for (i, s) in idxs.into_iter().zip(sessions) {
            slots[i] = Some(s);
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// The dispatcher's rates and shares.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rate: f64,
    group_share: f64,
    typing_share: f64,
    list_rate: f64,
}

/// Schedules the run's messages and list calls until the end; returns the count of
/// messages per conversation.
async fn dispatch(
    ctx: Arc<Ctx>,
    queues: Vec<mpsc::Sender<Job>>,
    pairs: Vec<(u32, u32)>,
    zipf: Zipf,
    shape: Shape,
) -> Vec<u64> {
    let clock = ctx.clock;
    let mut rng = StdRng::seed_from_u64(ctx.run_id ^ 0x5eed);
    let weights: Vec<f64> = ctx.classes.iter().map(|c| c.weight).collect();
    let total_weight: f64 = weights.iter().sum();
    let mut counts = vec![0u64; pairs.len()];
    let mut pacer = Pacer::new(shape.rate, clock.base);
    let mut lists = (shape.list_rate > 0.0).then(|| Pacer::new(shape.list_rate, clock.base));
    loop {
        let now = Instant::now();
        if now >= clock.end {
            break;
        }
        while lists.as_mut().is_some_and(|p| p.take(now)) {
            let who = rng.gen_range(0..queues.len());
            if queues[who].try_send(Job::List).is_err() {
                ctx.count.skipped_queue.inc();
            }
        }
        while pacer.take(now) {
            let to_group = shape.group_share > 0.0 && rng.gen::<f64>() < shape.group_share;
            let (from, to, conv) = if to_group {
                let g = rng.gen_range(0..ctx.groups.len());
                let members = &ctx.groups[g].members;
                (members[rng.gen_range(0..members.len())], g as u32, None)
            } else {
                let k = zipf.rank(rng.gen::<f64>());
                let (a, b) = pairs[k];
                let (from, to) = if rng.gen::<bool>() { (a, b) } else { (b, a) };
                (from, to, Some(k))
            };
            let mut pick = rng.gen::<f64>() * total_weight;
            let class = weights
                .iter()
                .position(|&w| {
                    pick -= w;
                    pick < 0.0
                })
                .unwrap_or(weights.len() - 1);
            let c = &ctx.classes[class];
            let size = rng.gen_range(c.min..=c.max) as u32;
            let job = Job::Send {
                to,
                group: to_group,
                class: class as u8,
                size,
                typing: !to_group && rng.gen::<f64>() < shape.typing_share,
            };
            match queues[from as usize].try_send(job) {
                Ok(()) => {
                    if let Some(k) = conv {
                        counts[k] += 1;
                    }
                    ctx.count.dispatched.inc();
                }
                Err(_) => {
                    ctx.count.skipped_queue.inc();
                }
            }
        }
        let mut next = pacer.next_at();
        if let Some(p) = &lists {
            next = next.min(p.next_at());
        }
        tokio::time::sleep_until(next.min(clock.end)).await;
    }
    counts
}

/// One user connection: sends the jobs it is given, records acks and deliveries, then
/// drains, publishes its acks, waits for what it is owed and closes.
async fn user(
    ctx: Arc<Ctx>,
    idx: usize,
    session: Session,
    mut jobs: mpsc::Receiver<Job>,
) -> (usize, Ledger) {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let clock = ctx.clock;
    let me = ctx.user(idx);
    let mut ledger = Ledger::default();
    let mut outbox = Outbox::new(ctx.run_id, ctx.ack_timeout);
    let mut sending = true;
    let mut ending = Ending::new(idx, ctx.drain, &ctx.count.unacked_at_end, &ctx.expect);
    let mut last_tx = Instant::now();
    let mut next_housekeeping = last_tx + HOUSEKEEPING;
    let mut rng = StdRng::seed_from_u64(ctx.run_id ^ (idx as u64).wrapping_mul(0x9e37_79b9));
    let mut actions = Actions::default();

    loop {
        let now = Instant::now();
        if ending.done(now, !sending, outbox.len(), &ledger) {
            break;
        }
        for frame in outbox.due_retries(now) {
            if conn.send_bytes(frame).await.is_err() {
                ctx.faults.errors.local(LocalError::Transport);
                break;
            }
            ctx.count.retries.inc();
            last_tx = now;
        }
        let mut wake = next_housekeeping;
        if let Some(at) = outbox.next_retry() {
            wake = wake.min(at);
        }
        tokio::select! {
            biased;
            f = next_frame(&mut conn, &ctx.faults) => {
                let Some(f) = f else { break };
                let now = Instant::now();
                match f.body {
                    Some(Body::SendAck(ack)) => {
                        ctx.count.acked_all.inc();
                        let Some(p) = outbox.take(f.req_id) else { continue };
                        let group = matches!(p.spec.target, To::Group(_));
                        if !ack.duplicate {
                            match ctx.groups.get(p.spec.tag as usize).filter(|_| group) {
                                // Owed to every other member.
                                Some(g) => {
                                    for &m in g.members.iter().filter(|&&m| m as usize != idx) {
                                        ledger.acked(m, &ack.conversation_id, ack.seq);
                                    }
                                }
                                None => ledger.acked(p.spec.tag, &ack.conversation_id, ack.seq),
                            }
                        }
                        let Some(class) = ctx.class_of(p.spec.msg_type as i32) else { continue };
                        let st = &ctx.stats[class];
                        if clock.measured(now) {
                            ctx.count.acked_measured.inc();
                            if group {
                                ctx.count.group_acked.inc();
                            }
                            st.acked.inc();
                            st.acked_bytes.add(p.spec.payload_len as u64);
                        }
                        if clock.measured(p.first_sent) {
                            let us = (now - p.first_sent).as_micros() as u64;
                            st.ack.record(idx, us);
                            ctx.all.0.record(idx, us);
                            if group {
                                ctx.group.0.record(idx, us);
                            }
                        }
                    }
                    Some(Body::Deliver(d)) => {
                        let now_us = clock.us(now);
                        let mut read: Option<(&str, u64)> = None;
                        for m in &d.messages {
                            let (mine, group) = match im_proto::parse_conversation(&m.conversation_id) {
                                Some(c @ ConversationRef::Direct(..)) => (c.is_direct_party(&me), false),
                                Some(ConversationRef::Group(_)) => {
                                    // Membership events of the run's groups are not messages.
                                    if ctx.class_of(m.r#type).is_none()
                                        && ctx.group_of.contains_key(&m.conversation_id)
                                    {
                                        continue;
                                    }
                                    (ctx.group_of_member(&m.conversation_id, idx).is_some(), true)
                                }
                                None => (false, false),
                            };
                            if !ledger.delivered_if(m, mine) {
                                continue;
                            }
                            ctx.count.delivered.inc();
                            if group {
                                ctx.count.group_delivered.inc();
                            }
                            if rng.gen::<f64>() < ctx.read_share {
                                read = Some((m.conversation_id.as_str(), m.seq));
                            }
                            let (Some(class), Some(sent_us)) =
                                (ctx.class_of(m.r#type), wire::payload_timestamp(&m.payload))
                            else {
                                continue;
                            };
                            if clock.measured_us(sent_us) {
                                let us = now_us.saturating_sub(sent_us);
                                ctx.stats[class].deliver.record(idx, us);
                                ctx.all.1.record(idx, us);
                                if group {
                                    ctx.group.1.record(idx, us);
                                }
                            }
                        }
                        if let Some((conversation_id, seq)) =
                            read.filter(|_| actions.read_due(now))
                        {
                            let f = actions.frame(Body::MarkRead(MarkRead {
                                conversation_id: conversation_id.to_owned(),
                                seq,
                            }), None);
                            if conn.send_bytes(f).await.is_err() {
                                ctx.faults.errors.local(LocalError::Transport);
                                break;
                            }
                            ctx.count.reads_sent.inc();
                        }
                    }
                    Some(Body::Error(e)) => {
                        ctx.faults.errors.server(e.code);
                        if f.req_id >= ACTION_REQ {
                            actions.answered(f.req_id);
                            ctx.count.action_errors.inc();
                        } else {
                            outbox.refused(f.req_id, &e, now);
                        }
                    }
                    Some(Body::Done(_)) => {
                        actions.answered(f.req_id);
                    }
                    Some(Body::ConversationList(_)) => {
                        if let Some(at) = actions.answered(f.req_id) {
                            ctx.count.lists.inc();
                            if clock.measured(at) {
                                ctx.list.record(idx, (now - at).as_micros() as u64);
                            }
                        }
                    }
                    Some(Body::ReadReceipt(_)) => ctx.count.receipts_received.inc(),
                    Some(Body::Typing(_)) => ctx.count.typing_received.inc(),
                    Some(Body::Pong(_)) => {}
                    _ => ctx.faults.errors.local(LocalError::Unexpected),
                }
            }
            job = jobs.recv(), if sending => {
                let Some(job) = job else {
                    sending = false;
                    continue;
                };
                let (to, group, class, size, typing) = match job {
                    Job::Send { to, group, class, size, typing } => (to, group, class, size, typing),
                    Job::List => {
                        let t = Instant::now();
                        let f = actions.frame(
                            Body::ListConversations(ListConversations {
                                after: String::new(),
                                limit: 20,
                            }),
                            Some(t),
                        );
                        if conn.send_bytes(f).await.is_err() {
                            ctx.faults.errors.local(LocalError::Transport);
                            break;
                        }
                        last_tx = t;
                        continue;
                    }
                };
                if outbox.len() >= ctx.window {
                    ctx.count.skipped_window.inc();
                    continue;
                }
                let target = match ctx.groups.get(to as usize).filter(|_| group) {
                    Some(g) => To::Group(g.id.clone()),
                    None => To::User(ctx.user(to as usize).into()),
                };
                // Apps throttle typing signals: at most one a second per connection.
                if let (true, To::User(peer)) = (typing, &target) {
                    if actions.typing_due(Instant::now()) {
                        let f = actions.frame(Body::Typing(Typing {
                            conversation_id: im_proto::direct_conversation(&me, peer),
                            typing: true,
                            user_id: String::new(),
                        }), None);
                        if conn.send_bytes(f).await.is_err() {
                            ctx.faults.errors.local(LocalError::Transport);
                            break;
                        }
                        ctx.count.typing_sent.inc();
                    }
                }
                let class_spec = &ctx.classes[class as usize];
                let spec = SendSpec {
                    target,
                    msg_type: class_spec.msg_type,
                    payload_len: size as usize,
                    tag: to,
                };
                let t = Instant::now();
                let frame = outbox.start(spec, t, clock.us(t));
                if conn.send_bytes(frame).await.is_err() {
                    ctx.faults.errors.local(LocalError::Transport);
                    break;
                }
                if group {
                    ctx.count.group_sent.inc();
                }
                ctx.stats[class as usize].sent.inc();
                last_tx = t;
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if now >= next_housekeeping {
                    next_housekeeping = now + HOUSEKEEPING;
                    for _ in outbox.expired(now) {
                        ctx.faults.errors.local(LocalError::AckTimeout);
                    }
                    if keep_alive(&mut conn, now, &mut last_tx, heartbeat, &ctx.faults).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
    ending.publish(outbox.len(), &ledger);
    let _ = conn.close().await;
    (idx, ledger)
}

/// The app actions a user connection has in flight (req_id -> when a timed one was sent).
#[derive(Debug, Default)]
struct Actions {
    next: u64,
    timed: Vec<(u64, Instant)>,
    last_typing: Option<Instant>,
    last_read: Option<Instant>,
}

impl Actions {
    /// Whether a typing signal may go now (one a second), recording it.
    fn typing_due(&mut self, now: Instant) -> bool {
        if self
            .last_typing
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return false;
        }
        self.last_typing = Some(now);
        true
    }

    /// Whether a MarkRead may go now (apps coalesce them: at most one per
    /// [`READ_EVERY`] per connection, naming the latest message read), recording it.
    fn read_due(&mut self, now: Instant) -> bool {
        if self
            .last_read
            .is_some_and(|t| now.saturating_duration_since(t) < READ_EVERY)
        {
            return false;
        }
        self.last_read = Some(now);
        true
    }

    /// The encoded frame of a new action; `timed` records when it was sent.
    fn frame(&mut self, body: Body, timed: Option<Instant>) -> Vec<u8> {
        self.next += 1;
        let req_id = ACTION_REQ + self.next;
        if let Some(at) = timed {
            // Bounded: an unanswered call is forgotten after 64 newer ones.
            if self.timed.len() >= 64 {
                self.timed.remove(0);
            }
            self.timed.push((req_id, at));
        }
        im_proto::encode(&im_proto::frame(req_id, body)).to_vec()
    }

    /// An answer to `req_id`: when it was sent, for a timed action.
    fn answered(&mut self, req_id: u64) -> Option<Instant> {
        let i = self.timed.iter().position(|(r, _)| *r == req_id)?;
        Some(self.timed.swap_remove(i).1)
    }
}

/// The text form of a report.
pub fn render(r: &MixReport) -> String {
    let mut s = String::new();
    s.push_str(&r.head.text(
        r.duration_secs,
        r.warmup_secs,
        format_args!(
            "{} users, {} conversations (zipf {}: hottest 1% get {:.0}% by the law, top 10 got {:.1}% observed), {:.0} msg/s",
            r.users,
            r.conversations,
            r.zipf,
            r.zipf_top1pct_share * 100.0,
            r.top10_share_observed * 100.0,
            r.rate
        ),
    ));
    report::line(
        &mut s,
        "throughput",
        format!(
            "{:.0} acked msgs/s, {}/s of payload ({} acked; {} dispatched, {} skipped: queue {}, window {}; {} retries)",
            r.acked_per_sec,
            fmt_bytes(r.acked_bytes_per_sec as u64),
            r.acked,
            r.dispatched,
            r.skipped_queue + r.skipped_window,
            r.skipped_queue,
            r.skipped_window,
            r.retries
        ),
    );
    for c in &r.classes {
        report::line(
            &mut s,
            &format!("{} {}-{} B", c.class.name, c.class.min, c.class.max),
            format!(
                "weight {}: {} sent, {} acked in the window",
                c.class.weight, c.sent, c.acked
            ),
        );
        report::summary_line(&mut s, "  send->ack", &c.send_to_ack_us);
        report::summary_line(&mut s, "  send->deliver", &c.send_to_deliver_us);
    }
    report::summary_line(&mut s, "all send->ack", &r.send_to_ack_us);
    report::summary_line(&mut s, "all send->deliver", &r.send_to_deliver_us);
    if r.group.groups > 0 {
        let g = &r.group;
        report::line(
            &mut s,
            "groups",
            format!(
                "{} of {} members, {:.0}% of messages: {} sent, {} acked in the window, {} delivered ({} pushes out of order)",
                g.groups, g.members, g.share * 100.0, g.sent, g.acked, g.delivered, g.pushes_reordered
            ),
        );
        report::summary_line(&mut s, "  send->ack", &g.send_to_ack_us);
        report::summary_line(&mut s, "  send->deliver", &g.send_to_deliver_us);
    }
    if r.urls.len() > 1 {
        report::line(&mut s, "nodes", r.urls.join(", "));
    }
    report::line(
        &mut s,
        "app actions",
        format!(
            "{} MarkRead sent, {} receipts received; {} typing sent, {} received; {} list calls; {} refused",
            r.reads_sent, r.receipts_received, r.typing_sent, r.typing_received, r.lists, r.action_errors
        ),
    );
    report::summary_line(&mut s, "  list round trip", &r.list_us);
    r.problems.lines(&mut s);
    r.tail
        .verdict_lines(&mut s, &format!("{} unacked at end", r.unacked_at_end));
    r.tail.with_server_lines(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_parse_and_validate() {
        let m = parse_mix(DEFAULT_MIX).unwrap().0;
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[1].name.as_str(), m[1].min, m[1].max),
            ("image", 10_000, 50_000)
        );
        assert_eq!(m[2].msg_type, MessageType::File);
        assert!(parse_mix("text:1:5-10").is_err(), "below the timestamp");
        assert!(parse_mix("text:1:100-50").is_err());
        assert!(parse_mix("video:1:10-20").is_err());
        assert!(parse_mix("text:1:10-20,text:1:10-20").is_err());
        assert!(parse_mix("text:0:10-20").is_err());
        assert!(parse_mix("text:x:10-20").is_err());
        assert!(parse_mix("text:1").is_err());
        assert_eq!(parse_mix("file:1:8-8").unwrap().0[0].max, 8);
    }
}
