//! `im-bench abuse`: honest chat under hostile clients.
//!
//! First a giant sync backlog is prepared (`--backlog` messages of `--backlog-bytes` to one
//! victim user). Then the honest chat senders (the [`super::chat`] scenario, same flags)
//! run alone: the baseline. Then they run again while attackers hammer the same server:
//! - slowloris: `--slowloris` sockets that each send half a request line and wait, and
//!   open another when the server closes one;
//! - floods: `--flooders` connections per kind sending `Batch` frames of
//!   `--batch-frames` DeliverAcks (for made-up conversations), SyncRequests or GroupOps
//!   as fast as they can, reconnecting when closed;
//! - the giant backlog: `--backlog-syncers` connections paging through it again and again;
//! - bad logins: `--bad-logins-per-sec` connections logging in with expired and forged
//!   tokens;
//! - never-read: `--never-read` connections that ask for the backlog and never read.
//!
//! The report gives the honest send-to-ack P99 alone and under attack. The run fails on
//! any lost, duplicated or reordered acked message in either phase, or when the P99 under
//! attack is above `--max-p99-ratio` times the baseline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use im_client::{RawConn, RawEvent};
use im_proto::{frame, group_op, Batch, Body, Cursor, DeliverAck, Frame, GroupOp, SyncRequest};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use super::chat::{self, ChatArgs, ChatReport};
use crate::report::{line, summary_line};
use crate::run::{run_tag, Absent, Disconnects, Report, Tail};
use crate::target::{conn_options, Target, LOGIN_TIMEOUT};

/// Flags of `im-bench abuse`.
#[derive(Debug, Clone, Args)]
pub struct AbuseArgs {
    /// The honest traffic (and where the server is, and how long each phase runs).
    #[command(flatten)]
    pub chat: ChatArgs,
    /// Half-sent HTTP requests held open at once.
    #[arg(long, default_value_t = 200)]
    pub slowloris: u32,
    /// Flooding connections per frame kind (DeliverAck, Sync, GroupOp).
    #[arg(long, default_value_t = 2)]
    pub flooders: u32,
    /// Frames per flooding `Batch`.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_frames: u32,
    /// Messages in the giant sync backlog (0: none).
    #[arg(long, default_value_t = 1000)]
    pub backlog: u32,
    /// Bytes per backlog message.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u32).range(8..=65_000))]
    pub backlog_bytes: u32,
    /// Connections paging through the backlog again and again.
    #[arg(long, default_value_t = 4)]
    pub backlog_syncers: u32,
    /// Logins per second with expired or forged tokens.
    #[arg(long, default_value_t = 50)]
    pub bad_logins_per_sec: u32,
    /// Connections that ask for the backlog and never read.
    #[arg(long, default_value_t = 2)]
    pub never_read: u32,
    /// Fail when the honest P99 under attack is above this many times the baseline.
    #[arg(long, default_value_t = 2.0)]
    pub max_p99_ratio: f64,
}

counters! {
    /// What the attackers did, counted.
    pub struct AttackCounts => AttackTotals {
        /// Half-sent requests opened.
        slowloris_opened,
        /// ... of which the server closed (header timeout or refusal).
        slowloris_closed,
        /// Flooding `Batch` frames written.
        flood_batches,
        /// Backlog sync pages read.
        backlog_pages,
        /// Complete passes over the backlog.
        backlog_rounds,
        /// Logins tried with expired or forged tokens.
        bad_logins,
        /// ... refused by the server.
        bad_logins_refused,
        /// Never-reading connections opened.
        never_read_opened,
    }
}

/// The attack's figures in the report.
#[derive(Debug, Clone, Serialize)]
pub struct AttackFigures {
    /// The attackers' counts.
    #[serde(flatten)]
    pub counts: AttackTotals,
    /// Attacker connections the server closed, by close code and reason.
    pub closes: BTreeMap<String, u64>,
}

/// The final report of an abuse run: no delivery check of its own (each phase has
/// one) and no end-of-run server figures.
pub type AbuseReport = Report<AbuseBody>;

/// The abuse report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct AbuseBody {
    /// Always `"abuse"`.
    pub scenario: &'static str,
    /// The honest traffic alone.
    pub baseline: ChatReport,
    /// The honest traffic under attack.
    pub attacked: ChatReport,
    /// Under-attack P99 send-to-ack over the baseline's.
    pub p99_ratio: f64,
    /// The limit on `p99_ratio`.
    pub max_p99_ratio: f64,
    /// What the attackers did.
    pub attack: AttackFigures,
}

scenario! {
    "abuse", AbuseArgs => AbuseBody,
    correctness: Absent, server: Absent,
    target: chat.server, json: chat.run.json,
}

/// Everything an attacker task needs.
#[derive(Clone)]
struct Attack {
    addr: SocketAddr,
    url: Arc<str>,
    stop: Arc<AtomicBool>,
    counts: Arc<AttackCounts>,
    /// Attacker connections ended by the server, by close code and reason.
    closes: Arc<Disconnects>,
    secret: Arc<str>,
    victim: Arc<str>,
    tag: Arc<str>,
    batch_frames: usize,
}

impl Attack {
    /// Counts an attacker connection the server ended.
    fn closed(&self, why: String) {
        self.closes.add(why);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// A logged-in attacker connection (from the default source address).
    async fn login(&self, token: &str) -> Option<RawConn> {
        let mut c = RawConn::connect_with(&self.url, &conn_options(self.addr, None))
            .await
            .ok()?;
        c.login_with(1, token, "abuse", false, LOGIN_TIMEOUT)
            .await
            .ok()?;
        Some(c)
    }

    /// Reads what the server sent until `quiet` passes with nothing; false when the
    /// connection ended (counted by reason).
    async fn drain(&self, c: &mut RawConn, quiet: Duration) -> bool {
        loop {
            match tokio::time::timeout(quiet, c.recv()).await {
                Err(_) => return true,
                Ok(Ok(RawEvent::Closed { code, reason })) => {
                    self.closed(format!("close {}: {reason}", code.unwrap_or(0)));
                    return false;
                }
                Ok(Err(e)) => {
                    self.closed(format!("transport: {e}"));
                    return false;
                }
                Ok(Ok(_)) => {}
            }
        }
    }
}

async fn run_against(args: &AbuseArgs, target: &mut Target) -> anyhow::Result<AbuseReport> {
    let tag = run_tag(rand::random());
    let attack = Attack {
        addr: target.addr,
        url: target.url.clone().into(),
        stop: Arc::new(AtomicBool::new(false)),
        counts: Arc::new(AttackCounts::default()),
        closes: Arc::new(Disconnects::default()),
        secret: args.chat.server.secret.clone().into(),
        victim: format!("abuse-victim-{tag}").into(),
        tag: tag.clone().into(),
        batch_frames: args.batch_frames as usize,
    };
    if args.backlog > 0 {
        eprintln!(
            "im-bench abuse: preparing a backlog of {} x {} bytes",
            args.backlog, args.backlog_bytes
        );
        prepare_backlog(target, &attack, args.backlog, args.backlog_bytes as usize).await?;
    }
    eprintln!("im-bench abuse: baseline (honest chat alone)");
    let baseline = chat::run_against(&args.chat, target).await?;
    eprintln!("im-bench abuse: under attack");
    let mut tasks = JoinSet::new();
    for i in 0..args.slowloris {
        tasks.spawn(slowloris(attack.clone(), i));
    }
    for kind in 0..3u8 {
        for i in 0..args.flooders {
            let user = format!("abuse-f{kind}-{i}-{tag}");
            let token = target.token(&user)?;
            tasks.spawn(flooder(attack.clone(), user, token, kind));
        }
    }
    if args.backlog > 0 {
        for _ in 0..args.backlog_syncers {
            tasks.spawn(backlog_syncer(
                attack.clone(),
                target.token(&attack.victim)?,
            ));
        }
        for _ in 0..args.never_read {
            tasks.spawn(never_read(attack.clone(), target.token(&attack.victim)?));
        }
    }
    if args.bad_logins_per_sec > 0 {
        tasks.spawn(bad_logins(attack.clone(), args.bad_logins_per_sec));
    }
    // Let the attack build up before the honest traffic starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attacked = chat::run_against(&args.chat, target).await;
    attack.stop.store(true, Ordering::Relaxed);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let attacked = attacked?;

    let base = baseline.send_to_ack_us.p99.max(1) as f64;
    let p99_ratio = attacked.send_to_ack_us.p99 as f64 / base;
    let passed = baseline.tail.passed && attacked.tail.passed && p99_ratio <= args.max_p99_ratio;
    Ok(Report {
        body: AbuseBody {
            scenario: "abuse",
            p99_ratio,
            max_p99_ratio: args.max_p99_ratio,
            attack: AttackFigures {
                counts: attack.counts.snapshot(),
                closes: attack.closes.snapshot(),
            },
            baseline,
            attacked,
        },
        tail: Tail::new(Absent, passed, Absent),
    })
}

/// Sends the backlog to the victim (windows of 100, waiting for the acks; RATE_LIMITED
/// and OVERLOADED are retried after their hint).
async fn prepare_backlog(target: &Target, a: &Attack, n: u32, bytes: usize) -> anyhow::Result<()> {
    let token = target.token(&format!("abuse-src-{}", a.tag))?;
    let Some(mut c) = a.login(&token).await else {
        anyhow::bail!("the backlog sender could not log in");
    };
    let payload = vec![b'b'; bytes];
    let send = |i: u32| {
        frame(
            u64::from(i) + 10,
            Body::Send(im_proto::Send {
                target: Some(im_proto::send::Target::ToUser(a.victim.to_string())),
                r#type: im_proto::MessageType::Text as i32,
                payload: payload.clone().into(),
                client_msg_id: format!("backlog-{}-{i}", a.tag),
            }),
        )
    };
    let mut next = 0;
    while next < n {
        let end = (next + 100).min(n);
        let mut open: std::collections::BTreeSet<u32> = (next..end).collect();
        for i in next..end {
            c.send(&send(i)).await?;
        }
        while !open.is_empty() {
            let ev = tokio::time::timeout(Duration::from_secs(30), c.recv()).await;
            let f = match ev {
                Ok(Ok(RawEvent::Frame(f))) => f,
                Ok(Ok(_)) => continue,
                other => anyhow::bail!("the backlog sender lost its connection: {other:?}"),
            };
            let i = f.req_id.saturating_sub(10) as u32;
            match f.body {
                Some(Body::SendAck(_)) => {
                    open.remove(&i);
                }
                Some(Body::Error(e)) if open.contains(&i) => {
                    tokio::time::sleep(Duration::from_millis(u64::from(e.retry_after_ms.max(10))))
                        .await;
                    c.send(&send(i)).await?;
                }
                _ => {}
            }
        }
        next = end;
    }
    let _ = c.close().await;
    Ok(())
}

/// One socket at a time: half a request line, then wait for the server to close it.
async fn slowloris(a: Attack, i: u32) {
    // Spread the opens over a second.
    tokio::time::sleep(Duration::from_millis(u64::from(i % 1000))).await;
    while !a.stopped() {
        let Ok(mut s) = tokio::net::TcpStream::connect(a.addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        a.counts.slowloris_opened.inc();
        if s.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgr")
            .await
            .is_err()
        {
            continue;
        }
        let mut buf = [0u8; 512];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        a.counts.slowloris_closed.inc();
    }
}

/// Batches of one frame kind (0: DeliverAcks for made-up conversations, 1: syncs,
/// 2: group joins), as fast as the connection takes them; reconnects when closed.
async fn flooder(a: Attack, user: String, token: String, kind: u8) {
    let n = a.batch_frames;
    let mut req = 0u64;
    while !a.stopped() {
        let Some(mut c) = a.login(&token).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        loop {
            if a.stopped() {
                return;
            }
            let frames: Vec<Frame> = (0..n)
                .map(|j| {
                    req += 1;
                    let body = match kind {
                        0 => Body::DeliverAck(DeliverAck {
                            conversation_id: im_proto::direct_conversation(
                                &user,
                                &format!("ghost-{j}-{}", a.tag),
                            ),
                            seq: req,
                        }),
                        1 => Body::Sync(SyncRequest {
                            cursors: vec![],
                            limit: 1000,
                            ..Default::default()
                        }),
                        _ => Body::GroupOp(GroupOp {
                            op: group_op::Op::Join as i32,
                            group_id: format!("abuse-g{}-{}", req % 64, a.tag),
                            ..Default::default()
                        }),
                    };
                    frame(req, body)
                })
                .collect();
            if c.send(&frame(0, Body::Batch(Batch { frames })))
                .await
                .is_err()
            {
                break;
            }
            a.counts.flood_batches.inc();
            if !a.drain(&mut c, Duration::from_millis(5)).await {
                break;
            }
        }
    }
}

/// Pages through the victim's backlog again and again.
async fn backlog_syncer(a: Attack, token: String) {
    while !a.stopped() {
        let Some(mut c) = a.login(&token).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut cursors: BTreeMap<String, u64> = BTreeMap::new();
        let mut req = 100u64;
        'pages: while !a.stopped() {
            req += 1;
            let cur = cursors
                .iter()
                .map(|(k, v)| Cursor {
                    conversation_id: k.clone(),
                    after_seq: *v,
                })
                .collect();
            let sync = SyncRequest {
                cursors: cur,
                limit: 1000,
                ..Default::default()
            };
            if c.send(&frame(req, Body::Sync(sync))).await.is_err() {
                break;
            }
            loop {
                let ev = tokio::time::timeout(Duration::from_secs(30), c.recv()).await;
                match ev {
                    Ok(Ok(RawEvent::Frame(f))) if f.req_id == req => match f.body {
                        Some(Body::SyncResp(r)) => {
                            a.counts.backlog_pages.inc();
                            for m in &r.messages {
                                let s = cursors.entry(m.conversation_id.clone()).or_default();
                                *s = (*s).max(m.seq);
                            }
                            if !r.more || r.messages.is_empty() {
                                a.counts.backlog_rounds.inc();
                                cursors.clear();
                            }
                            continue 'pages;
                        }
                        Some(Body::Error(e)) => {
                            let wait = u64::from(e.retry_after_ms.clamp(1, 1000));
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                            continue 'pages;
                        }
                        _ => {}
                    },
                    Ok(Ok(RawEvent::Closed { code, reason })) => {
                        a.closed(format!("close {}: {reason}", code.unwrap_or(0)));
                        break 'pages;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) | Err(_) => break 'pages,
                }
            }
        }
    }
}

/// Logs in as the victim, asks for its backlog many times and never reads; starts over
/// every few seconds.
async fn never_read(a: Attack, token: String) {
    while !a.stopped() {
        let Some(mut c) = a.login(&token).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        a.counts.never_read_opened.inc();
        for r in 0..50u64 {
            let sync = SyncRequest {
                cursors: vec![],
                limit: 1000,
                ..Default::default()
            };
            let sent = tokio::time::timeout(
                Duration::from_secs(1),
                c.send(&frame(1000 + r, Body::Sync(sync))),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        c.abort();
    }
}

/// A token for `user` signed with `secret` and expired an hour ago (empty if it cannot
/// be signed: the login is refused all the same).
fn expired_token(secret: &str, user: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .saturating_sub(3600);
    let claims = im_token::Claims {
        sub: user.to_owned(),
        exp,
        iat: 0,
    };
    im_token::TokenKeys::new(secret.as_bytes())
        .sign(&claims)
        .unwrap_or_default()
}

/// Logins with expired and forged tokens at `per_sec`.
async fn bad_logins(a: Attack, per_sec: u32) {
    let forged = im_token::TokenKeys::new(b"not-the-server-secret-at-all-0000")
        .issue("mallory", Duration::from_secs(3600))
        .unwrap_or_default();
    let expired = expired_token(&a.secret, "mallory");
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(per_sec)));
    let mut n = 0u64;
    while !a.stopped() {
        tick.tick().await;
        n += 1;
        let token = if n.is_multiple_of(2) {
            forged.clone()
        } else {
            expired.clone()
        };
        let a = a.clone();
        tokio::spawn(async move {
            let Ok(mut c) = RawConn::connect_with(&a.url, &conn_options(a.addr, None)).await else {
                return;
            };
            a.counts.bad_logins.inc();
            let refused = c
                .login_with(1, &token, "abuse", false, Duration::from_secs(5))
                .await
                .is_err();
            if refused {
                a.counts.bad_logins_refused.inc();
            }
            c.abort();
        });
    }
}

/// The text report.
fn render(r: &AbuseReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "im-bench abuse: honest chat alone, then under attack");
    summary_line(&mut s, "baseline ack", &r.baseline.send_to_ack_us);
    summary_line(&mut s, "attacked ack", &r.attacked.send_to_ack_us);
    line(
        &mut s,
        "p99 ratio",
        format!("{:.2} (limit {:.2})", r.p99_ratio, r.max_p99_ratio),
    );
    line(
        &mut s,
        "throughput",
        format!(
            "{:.0} msg/s alone, {:.0} msg/s under attack",
            r.baseline.acked_per_sec, r.attacked.acked_per_sec
        ),
    );
    let a = &r.attack.counts;
    line(
        &mut s,
        "attack",
        format!(
            "slowloris {} opened / {} closed by the server; {} flood batches; backlog {} pages, {} rounds; bad logins {} ({} refused); never-read {}",
            a.slowloris_opened,
            a.slowloris_closed,
            a.flood_batches,
            a.backlog_pages,
            a.backlog_rounds,
            a.bad_logins,
            a.bad_logins_refused,
            a.never_read_opened
        ),
    );
    for (why, n) in &r.attack.closes {
        let _ = writeln!(s, "  attacker closed {n}x: {why}");
    }
    for (label, c) in [("baseline", &r.baseline), ("attacked", &r.attacked)] {
        line(
            &mut s,
            label,
            format!(
                "{}: {} acked, missing {}, duplicates {}, not increasing {}",
                if c.tail.passed { "PASS" } else { "FAIL" },
                c.tail.correctness.acked,
                c.tail.correctness.missing,
                c.tail.correctness.duplicates,
                c.tail.correctness.not_increasing
            ),
        );
    }
    r.tail.server_log_lines(&mut s);
    line(
        &mut s,
        "result",
        if r.tail.passed { "PASS" } else { "FAIL" },
    );
    s
}
