//! Does a large group operation stall unrelated sends? Builds one group of `--members`
//! (default 98,000) members, then measures a victim's one-to-one send -> SendAck latency
//! (20 sends/s) for `--secs`, first alone, then while another account repeats a no-op
//! JOIN naming `--join` (default 7,000) users who are already members. Prints P50, P99
//! and max for both phases, and how the attacker's ops were answered.
//!
//! Run against a server started with the same JWT secret, e.g.
//! `IM_JWT_SECRET=stall-secret IM_LIMITS_MAX_FRAME_BYTES=1048576 im-server` and
//! `cargo run --release -p im-bench --example group_stall -- ws://127.0.0.1:7070/ws`.
//! The group is public (kind PUBLIC; older servers ignore the field) so that a member may
//! name others in a JOIN on servers with group roles too.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use im_client::RawConn;
use im_proto::{frame, group_op, Body, ErrorCode, GroupOp};

const SECRET: &str = "stall-secret";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn login(url: &str, user: &str) -> anyhow::Result<RawConn> {
    let token = im_token::TokenKeys::new(SECRET.as_bytes())
        .issue(user, Duration::from_secs(24 * 3600))
        .context("token")?;
    let mut c = RawConn::connect(url).await.context("connect")?;
    c.login(&token, "bench", false).await.context("login")?;
    Ok(c)
}

/// One GroupOp, retried after RATE_LIMITED; returns the member count.
async fn group_op(c: &mut RawConn, req: u64, op: GroupOp) -> anyhow::Result<u32> {
    loop {
        c.send(&frame(req, Body::GroupOp(op.clone()))).await?;
        loop {
            let f = match c.recv_timeout(Duration::from_secs(120)).await? {
                im_client::RawEvent::Frame(f) => f,
                other => bail!("connection ended: {other:?}"),
            };
            if f.req_id != req {
                continue;
            }
            match f.body {
                Some(Body::GroupOpOk(ok)) => return Ok(ok.members),
                Some(Body::Error(e)) if e.code == ErrorCode::RateLimited as i32 => {
                    tokio::time::sleep(Duration::from_millis(e.retry_after_ms.max(1) as u64)).await;
                    break;
                }
                other => bail!("group op refused: {other:?}"),
            }
        }
    }
}

/// Sends one DM per 50 ms for `secs`; returns the send -> ack latencies (µs).
async fn victim(c: &mut RawConn, secs: u64, tag: &str) -> anyhow::Result<Vec<u64>> {
    let mut lat = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut i = 0u64;
    while Instant::now() < end {
        i += 1;
        let id = format!("{tag}-{i}");
        let t = Instant::now();
        c.send(&frame(
            i,
            Body::Send(im_proto::Send {
                target: Some(im_proto::send::Target::ToUser("stall-peer".into())),
                r#type: 0,
                payload: b"ping".to_vec().into(),
                client_msg_id: id,
            }),
        ))
        .await?;
        loop {
            match c.recv_timeout(Duration::from_secs(60)).await? {
                im_client::RawEvent::Frame(f) if f.req_id == i => break,
                im_client::RawEvent::Frame(_) => {}
                other => bail!("victim connection ended: {other:?}"),
            }
        }
        lat.push(t.elapsed().as_micros() as u64);
        tokio::time::sleep(Duration::from_millis(50).saturating_sub(t.elapsed())).await;
    }
    Ok(lat)
}

fn summary(name: &str, mut v: Vec<u64>) {
    v.sort_unstable();
    let pick = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] as f64 / 1000.0;
    println!(
        "{name}: {} sends, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        v.len(),
        pick(0.5),
        pick(0.99),
        pick(1.0)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .filter(|a| a.starts_with("ws"))
        .unwrap_or_else(|| "ws://127.0.0.1:7070/ws".into());
    let members = arg("--members", 98_000) as usize;
    let join = arg("--join", 7_000) as usize;
    let secs = arg("--secs", 30);
    let group = format!("stall-{}", im_proto::now_ms());
    let users: Vec<String> = (0..members).map(|i| format!("m{i:06}")).collect();

    let mut owner = login(&url, "stall-owner").await?;
    let t = Instant::now();
    let mut n = 0;
    for (k, chunk) in users.chunks(5_000).enumerate() {
        let op = if k == 0 {
            group_op::Op::Create
        } else {
            group_op::Op::Join
        };
        n = group_op(
            &mut owner,
            10 + k as u64,
            GroupOp {
                op: op as i32,
                group_id: group.clone(),
                members: chunk.to_vec(),
                kind: group_op::Kind::Public as i32,
                ..Default::default()
            },
        )
        .await?;
    }
    println!(
        "group {group}: {n} members built in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let mut v = login(&url, "stall-victim").await?;
    let _peer = login(&url, "stall-peer").await?;
    summary("victim alone", victim(&mut v, secs.min(10), "alone").await?);

    // The attacker: a member (m000000) repeating a no-op JOIN of `join` existing members.
    let mut attacker = login(&url, "m000000").await?;
    let names: Vec<String> = users[..join].to_vec();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let g = group.clone();
    let attack = tokio::spawn(async move {
        let (mut ok, mut limited, mut other, mut req) = (0u64, 0u64, 0u64, 1_000u64);
        let mut slowest = Duration::ZERO;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            req += 1;
            let t = Instant::now();
            let op = GroupOp {
                op: group_op::Op::Join as i32,
                group_id: g.clone(),
                members: names.clone(),
                ..Default::default()
            };
            if attacker.send(&frame(req, Body::GroupOp(op))).await.is_err() {
                break;
            }
            loop {
                match attacker.recv_timeout(Duration::from_secs(120)).await {
                    Ok(im_client::RawEvent::Frame(f)) if f.req_id == req => {
                        match f.body {
                            Some(Body::GroupOpOk(_)) => ok += 1,
                            Some(Body::Error(e)) if e.code == ErrorCode::RateLimited as i32 => {
                                limited += 1
                            }
                            _ => other += 1,
                        }
                        break;
                    }
                    Ok(im_client::RawEvent::Frame(_)) => {}
                    _ => return (ok, limited, other, slowest),
                }
            }
            slowest = slowest.max(t.elapsed());
        }
        (ok, limited, other, slowest)
    });
    let lat = victim(&mut v, secs, "attacked").await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    summary("victim during no-op JOINs", lat);
    let (ok, limited, other, slowest) = attack.await?;
    println!(
        "attacker: {ok} JOINs answered GroupOpOk, {limited} RATE_LIMITED, {other} other; slowest answer {:.1} ms",
        slowest.as_secs_f64() * 1000.0
    );
    Ok(())
}
