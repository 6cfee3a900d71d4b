//! The fixed micro-workload of the CI performance gate (`.ci/perf-gate`, README
//! "Performance gate"): the server's in-process message path on a deterministic message
//! mix, with no socket, no store and no runtime, so that `valgrind --tool=callgrind`
//! counts the same instructions on every run.
//!
//! Per message: decode the client's `Send` frame (`Frame::decode`, as
//! `gateway::protocol` does), encode and queue the `SendAck` to the sender and hand the
//! committed message to the real `route::Router` (as the writer, `persist`,
//! does after a commit), which encodes it once and pushes the shared bytes into each
//! recipient's `flow::Outbound`. After every commit batch each connection's queue is
//! drained the way the write loop does (`OutboundRx::fill`, `flow::coalesce`, i.e.
//! `im_proto::encode_batch`, `Outbound::batch_written`), minus the socket write.
//!
//! Only `workload` is meant to be counted (`--toggle-collect=*perf_gate::workload*`);
//! the set-up (sessions, the pre-encoded inbound frames) is outside it. Changing any
//! constant here changes the count: update the baseline on purpose when you do.

use std::sync::Arc;
use std::time::Instant;

use im_proto::{frame, send, Body, ChatMessage, Frame, Message, MessageType, SendAck};
use im_server::config::Config;
use im_server::flow::{self, OutFrame, Outbound, OutboundRx};
use im_server::obs::Metrics;
use im_server::route::{Delivery, Recipients, Router};
use im_server::store::membership::Members;

// The server's allocator: allocation is a good part of the path being counted.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Users, one connection each.
const USERS: usize = 600;
/// The group is the first `GROUP_MEMBERS` users (below the notify-and-pull threshold,
/// so its messages are fanned out as payloads).
const GROUP_MEMBERS: usize = 500;
/// One-to-one messages.
const DIRECT_MESSAGES: usize = 3000;
/// Every `GROUP_EVERY`-th message goes to the group instead.
const GROUP_EVERY: usize = 30;
/// Messages per commit batch; the queues are drained after each batch.
const COMMIT_BATCH: usize = 32;
/// Seed of the message mix.
const SEED: u64 = 0x1d_5eed_2026;

/// splitmix64: a fixed, dependency-free generator, so the mix never changes with a
/// crate upgrade.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (modulo bias is irrelevant here).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// Payload size of a message: 80% text of 50-200 B, 15% 10-50 KB, 5% 50 KB up to just
/// under the default 64 KiB frame limit.
fn payload_len(rng: &mut Rng) -> usize {
    match rng.range(0, 99) {
        0..=79 => rng.range(50, 200),
        80..=94 => rng.range(10_000, 50_000),
        _ => rng.range(50_001, 65_000),
    }
}

/// One inbound frame as a client sends it, and who sent it.
struct Inbound {
    sender: usize,
    bytes: bytes::Bytes,
}

/// One logged-in connection.
struct Conn {
    user: String,
    out: Arc<Outbound>,
    rx: OutboundRx,
}

/// What the workload did, checked against what it should have done.
#[derive(Debug, Default)]
struct Totals {
    frames: u64,
    writes: u64,
    batches: u64,
    bytes: u64,
}

fn main() {
    let config = Config::default();
    let _prometheus = im_server::obs::install_recorder();
    let metrics = Metrics::new(config.obs.probes);
    let router = Router::new(metrics.clone(), config.flow.notify_group_threshold, None);
    assert!(GROUP_MEMBERS <= config.flow.notify_group_threshold as usize);

    let mut conns: Vec<Conn> = (0..USERS)
        .map(|i| {
            let user = format!("user{i:04}");
            let (out, rx) = Outbound::new(
                i as u64 + 1,
                "perf-gate".into(),
                config.flow.soft_mark_bytes,
                config.flow.hard_mark_bytes,
                metrics.clone(),
            );
            out.set_user(&user);
            router.register(&user, out.clone());
            Conn { user, out, rx }
        })
        .collect();
    let mut members: Vec<String> = conns[..GROUP_MEMBERS]
        .iter()
        .map(|c| c.user.clone())
        .collect();
    members.sort();
    let members: Members = members.into();

    let mut rng = Rng(SEED);
    let total = DIRECT_MESSAGES + DIRECT_MESSAGES / (GROUP_EVERY - 1);
    let mut expected_frames = 0u64;
    let mut to_group = 0;
    let inbound: Vec<Inbound> = (0..total)
        .map(|i| {
            let group = i % GROUP_EVERY == GROUP_EVERY - 1;
            let (sender, target, len) = if group {
                let sender = rng.range(0, GROUP_MEMBERS - 1);
                let target = send::Target::GroupId("perf-group".into());
                (sender, target, rng.range(50, 200))
            } else {
                let sender = rng.range(0, USERS - 1);
                let to = (sender + rng.range(1, USERS - 1)) % USERS;
                let target = send::Target::ToUser(conns[to].user.clone());
                (sender, target, payload_len(&mut rng))
            };
            let payload: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            let bytes = im_proto::encode(&frame(
                i as u64 + 1,
                Body::Send(im_proto::Send {
                    target: Some(target),
                    r#type: MessageType::Text as i32,
                    payload: payload.into(),
                    client_msg_id: format!("c{i:08}"),
                }),
            ));
            // The sender's ack, plus one copy per other recipient.
            expected_frames += 1 + if group { GROUP_MEMBERS as u64 - 1 } else { 1 };
            to_group += usize::from(group);
            Inbound { sender, bytes }
        })
        .collect();

    let done = workload(
        &router,
        &mut conns,
        &members,
        &inbound,
        config.flow.coalesce_max_frames as usize,
        &metrics,
    );
    assert_eq!(done.frames, expected_frames, "frames written: {done:?}");
    for c in &conns {
        assert_eq!(c.out.queued_bytes(), 0, "{} has bytes left", c.user);
    }
    println!(
        "perf_gate: {total} messages ({} direct, {} to a group of {GROUP_MEMBERS}); \
         {} frames in {} writes ({} batches), {} bytes out",
        total - to_group,
        to_group,
        done.frames,
        done.writes,
        done.batches,
        done.bytes
    );
}

/// The counted part: decode, ack, route (encode once, fan out), drain and coalesce.
#[inline(never)]
fn workload(
    router: &Router,
    conns: &mut [Conn],
    members: &Members,
    inbound: &[Inbound],
    coalesce_max_frames: usize,
    metrics: &Metrics,
) -> Totals {
    let mut totals = Totals::default();
    let mut batch: Vec<OutFrame> = Vec::with_capacity(coalesce_max_frames);
    let mut seq = 0u64;
    for chunk in inbound.chunks(COMMIT_BATCH) {
        for m in chunk {
            let started = Instant::now();
            let f = Frame::decode(m.bytes.clone()).expect("workload frames decode");
            let Some(Body::Send(s)) = f.body else {
                panic!("workload frames are Sends");
            };
            let sender = &conns[m.sender];
            let (conversation_id, recipients) = match s.target {
                Some(send::Target::ToUser(to)) => (
                    im_proto::direct_conversation(&sender.user, &to),
                    Recipients::Direct(sender.user.clone(), to),
                ),
                Some(send::Target::GroupId(g)) => (
                    im_proto::group_conversation(&g),
                    Recipients::Group(members.clone()),
                ),
                None => panic!("workload Sends have a target"),
            };
            // What the store would assign.
            seq += 1;
            let msg_id = format!("{seq:032x}");
            let server_time = 1_700_000_000_000 + seq as i64;
            // As the writer (`persist`) after a commit: the ack, then the delivery.
            let ack = im_proto::encode(&frame(
                f.req_id,
                Body::SendAck(SendAck {
                    client_msg_id: s.client_msg_id.clone(),
                    msg_id: msg_id.clone(),
                    conversation_id: conversation_id.clone(),
                    seq,
                    server_time,
                    duplicate: false,
                }),
            ));
            sender.out.push(ack, true);
            let forward = router.deliver(Delivery {
                message: ChatMessage {
                    conversation_id,
                    sender: sender.user.clone(),
                    payload: s.payload,
                    send_time: server_time,
                    r#type: s.r#type,
                    seq,
                    msg_id,
                    client_msg_id: s.client_msg_id,
                    ..Default::default()
                },
                recipients,
                origin_conn: sender.out.conn_id,
                started,
                hint_only: false,
                trace: None,
            });
            assert!(forward.is_none(), "single node: nothing to forward");
        }
        // The write loops: each connection with frames queued drains them,
        // `coalesce_max_frames` per write (the socket write itself is left out).
        for c in conns.iter_mut() {
            while c.out.queued_bytes() > 0 {
                c.rx.fill(&mut batch, coalesce_max_frames);
                assert!(!batch.is_empty(), "queued bytes without frames");
                let (bytes, len) = flow::coalesce(&batch, metrics);
                totals.frames += batch.len() as u64;
                totals.writes += 1;
                totals.batches += u64::from(batch.len() > 1);
                totals.bytes += bytes.len() as u64;
                c.out.batch_written(&mut batch, len);
            }
        }
    }
    totals
}
