//! Bounds: one socket or one account cannot exhaust a node. Half-sent HTTP requests are
//! closed at the header timeout and hold connection slots meanwhile; sync pages stop at
//! a byte budget; every frame kind is rate-limited and a Batch is capped; DeliverAcks
//! name only real seqs; sessions per user are capped; short secrets are refused; the
//! database files are private; `X-Forwarded-For` counts only from trusted proxies.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use im_client::proto::ErrorCode;
use im_client::proto::{self, frame, Batch, Body, Frame};
use im_client::RawConn;

use crate::support::*;

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, a, b))
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Opens a socket from `from` and sends half a request line (the head never completes).
fn half_request(addr: SocketAddr, from: IpAddr) -> TcpStream {
    let mut s = connect_from(addr, from);
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgr").unwrap();
    s
}

/// Reads until the server closes the socket; returns what it sent and how long that took
/// (panics if it is still open after `limit`).
fn until_eof(s: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("socket still open after {limit:?}: {e}"),
        }
    }
    (String::from_utf8_lossy(&got).to_string(), start.elapsed())
}

#[test]
fn half_sent_requests_hold_slots_then_close_at_the_header_timeout() {
    let server = TestServer::start_with(&[
        ("IM_HTTP_HEADER_READ_TIMEOUT_SECS", "2"),
        ("IM_LIMITS_MAX_CONNECTIONS_PER_IP", "3"),
    ]);
    let attacker = ip(0, 7);
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| half_request(server.client_addr, attacker))
        .collect();
    // The half-sent requests hold the address's slots: the next socket is refused at once.
    let (head, _) = ws_upgrade_from(server.client_addr, attacker);
    assert_eq!(status_of(&head), 503, "{head}");
    assert!(head.contains("too many connections from this address"));
    // Each is closed by the header timeout (no answer: the head never completed).
    for s in &mut held {
        let (sent, _) = until_eof(s, Duration::from_secs(12));
        assert!(sent.is_empty() || sent.contains("408"), "{sent}");
    }
    // Counted (the count follows the close by a moment).
    let counted = |listener: &str| {
        server.metric(
            "im_http_rejected_total",
            &[("listener", listener), ("reason", "header_timeout")],
        )
    };
    wait_until("the 3 header timeouts to be counted", || {
        counted("client") == 3.0
    });
    // Their slots are free again.
    let (head, _s) = ws_upgrade_from(server.client_addr, attacker);
    assert_eq!(status_of(&head), 101, "{head}");

    // The admin listener: the same timeout, and an oversized head is refused.
    let mut admin = connect_from(server.admin_addr, ip(0, 1));
    admin.write_all(b"GET /healthz HTTP/1.1\r\nHo").unwrap();
    until_eof(&mut admin, Duration::from_secs(12));
    wait_until("the admin header timeout to be counted", || {
        counted("admin") == 1.0
    });
    let mut big = connect_from(server.admin_addr, ip(0, 1));
    let filler = "a".repeat(40 * 1024);
    let _ = write!(
        big,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n"
    );
    let (sent, _) = until_eof(&mut big, Duration::from_secs(12));
    assert!(sent.starts_with("HTTP/1.1 431"), "{sent}");
    // A kept-alive admin connection idle past the timeout is closed too.
    let mut idle = connect_from(server.admin_addr, ip(0, 1));
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (sent, _) = until_eof(&mut idle, Duration::from_secs(12));
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_client_connects_while_300_half_sent_requests_are_held() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_MAX_CONNECTIONS", "40"),
        ("IM_LIMITS_MAX_CONNECTIONS_PER_IP", "10"),
    ]);
    let addr = server.client_addr;
    // 300 sockets from one address, each with half a request line, all kept open.
    let held: Vec<TcpStream> = tokio::task::spawn_blocking(move || {
        (0..300).map(|_| half_request(addr, ip(0, 9))).collect()
    })
    .await
    .unwrap();
    eventually("the refusals of the held sockets", || {
        server.metric("im_connections_refused_total", &[("reason", "per_ip")]) >= 290.0
    })
    .await;
    // A real client still gets in and chats.
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;
    let ack = alice.send_text("bob", "still here").await.expect("send");
    let m = bob.next_message(WAIT).await.expect("delivered");
    assert_eq!(
        (m.seq, m.payload.as_ref()),
        (ack.seq, b"still here".as_ref())
    );
    assert_eq!(
        server.metric("im_connections_refused_total", &[("reason", "per_ip")]),
        290.0,
        "10 held sockets fit the per-address cap, the other 290 were refused"
    );
    drop(held);
}

/// Sends `n` messages of `size` bytes from `from` to `to` on a raw connection (acked).
async fn backlog(server: &TestServer, from: &str, to: &str, n: usize, size: usize) {
    let mut c = server.raw(from).await;
    let payload = vec![b'x'; size];
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        for i in chunk {
            c.send(&send_to_user(
                *i as u64 + 1,
                to,
                &payload,
                &format!("{from}-{i}"),
            ))
            .await
            .unwrap();
        }
        acks(&mut c, chunk.len()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_pages_stop_at_the_byte_budget_and_large_backlogs_sync_completely() {
    let server = TestServer::start_with(&[("IM_FLOW_SYNC_PAGE_BYTES", "262144")]);
    backlog(&server, "alice", "bob", 500, 9 * 1024).await;
    // One raw page at the SDK's page size: stopped by bytes, not by count.
    let mut raw = server.raw("bob").await;
    raw.send(&frame(
        7,
        Body::Sync(proto::SyncRequest {
            cursors: vec![],
            limit: 500,
            ..Default::default()
        }),
    ))
    .await
    .unwrap();
    let page = loop {
        let f = next_frame(&mut raw).await;
        if let (7, Some(Body::SyncResp(r))) = (f.req_id, f.body) {
            break r;
        }
    };
    let bytes: usize = page.messages.iter().map(|m| m.payload.len()).sum();
    assert!(page.more, "a partial page says more");
    assert!(
        !page.messages.is_empty() && bytes <= 256 * 1024,
        "{} messages, {bytes} bytes",
        page.messages.len()
    );
    assert!(page.messages.len() < 500);
    drop(raw);
    // The SDK pages through all of it.
    let bob = server.client("bob").await;
    let got = sdk_sync_all(&bob, 500).await;
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=500).collect::<Vec<u64>>());
    assert!(got.iter().all(|m| m.payload.len() == 9 * 1024));

    // A message larger than the budget still goes out, alone.
    let small = TestServer::start_with(&[("IM_FLOW_SYNC_PAGE_BYTES", "1024")]);
    backlog(&small, "carol", "dave", 3, 4000).await;
    let mut d = small.raw("dave").await;
    let all = raw_sync_all(&mut d, 500).await;
    assert_eq!(all.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_parallel_syncs_of_1000_x_60kb_complete_within_a_memory_ceiling() {
    let server = TestServer::start();
    backlog(&server, "sender", "reader", 1000, 60 * 1024).await;
    let before = server.peak_rss_bytes();
    let mut syncs = Vec::new();
    for _ in 0..8 {
        // Eight 60 MB syncs at once on a shared debug build: pages may be slow.
        let mut cfg = im_client::ClientConfig::new(server.ws_url(), server.token("reader"));
        cfg.request_timeout = Duration::from_secs(60);
        let c = im_client::Client::connect(cfg).await.expect("connect");
        syncs.push(tokio::spawn(async move {
            let got = sdk_sync_all(&c, 1000).await;
            c.close().await;
            got.len()
        }));
    }
    for s in syncs {
        assert_eq!(s.await.unwrap(), 1000, "every sync gets the whole backlog");
    }
    let peak = server.peak_rss_bytes();
    // Unbounded pages took ~500 MB for this; paged by bytes each sync holds a few
    // hundred KB at a time.
    const CEILING: u64 = 160 << 20;
    assert!(
        peak < CEILING,
        "peak RSS {} MB (before the syncs {} MB) is over {} MB",
        peak >> 20,
        before >> 20,
        CEILING >> 20
    );
}

fn batch(frames: Vec<Frame>) -> Frame {
    frame(0, Body::Batch(Batch { frames }))
}

fn errors(frames: &[Frame]) -> Vec<&proto::Error> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Error(e)) => Some(e),
            _ => None,
        })
        .collect()
}

/// One Batch of `n` copies of `body` from a fresh connection of `user`; returns the close.
async fn flood(
    server: &TestServer,
    user: &str,
    n: usize,
    body: Body,
) -> (Option<u16>, String, Vec<Frame>) {
    let mut c = server.raw(user).await;
    let frames = (0..n)
        .map(|i| frame(100 + i as u64, body.clone()))
        .collect();
    c.send(&batch(frames)).await.unwrap();
    until_closed(&mut c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_frame_kind_is_rate_limited_one_by_one_inside_a_batch() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_DELIVER_ACK_RATE_PER_SEC", "1"),
        ("IM_LIMITS_DELIVER_ACK_BURST", "2"),
        ("IM_LIMITS_SYNC_RATE_PER_SEC", "1"),
        ("IM_LIMITS_SYNC_BURST", "2"),
        ("IM_LIMITS_GROUP_OP_RATE_PER_SEC", "1"),
        ("IM_LIMITS_GROUP_OP_BURST", "2"),
        ("IM_LIMITS_MAX_RATE_LIMITED", "3"),
        ("IM_LIMITS_MAX_BATCH_FRAMES", "20"),
    ]);
    // A real conversation to ack in.
    backlog(&server, "peer", "acker", 1, 10).await;
    let cases = [
        (
            "acker",
            Body::DeliverAck(proto::DeliverAck {
                conversation_id: proto::direct_conversation("acker", "peer"),
                seq: 1,
            }),
            "deliver_ack",
        ),
        (
            "syncer",
            Body::Sync(proto::SyncRequest {
                cursors: vec![],
                limit: 10,
                ..Default::default()
            }),
            "sync",
        ),
        (
            "grouper",
            Body::GroupOp(proto::GroupOp {
                op: proto::group_op::Op::Join as i32,
                group_id: "g-flood".into(),
                ..Default::default()
            }),
            "group_op",
        ),
    ];
    for (user, body, label) in cases {
        let (code, reason, frames) = flood(&server, user, 20, body).await;
        assert_eq!(code, Some(1008), "{label}: {reason}: {frames:?}");
        assert_eq!(reason, format!("{label} flood"));
        let limited: Vec<_> = errors(&frames)
            .into_iter()
            .filter(|e| e.code == ErrorCode::RateLimited as i32)
            .collect();
        assert_eq!(limited.len(), 4, "{label}: 3 tolerated, the 4th closes");
        assert!(limited.iter().all(|e| e.retry_after_ms > 0));
        assert_eq!(
            server.metric("im_flood_disconnects_total", &[("frame", label)]),
            1.0
        );
    }
    // The Batch cap: 21 frames are refused whole, none handled.
    let mut c = server.raw("batcher").await;
    let pings: Vec<Frame> = (0..21)
        .map(|i| frame(i + 1, Body::Ping(proto::Ping { client_time: 1 })))
        .collect();
    c.send(&batch(pings.clone())).await.unwrap();
    let f = next_frame(&mut c).await;
    match f.body {
        Some(Body::Error(e)) => {
            assert_eq!(e.code, ErrorCode::BadFrame as i32);
            assert!(
                e.message.contains("over the 20 frame limit"),
                "{}",
                e.message
            );
        }
        other => panic!("expected the batch refusal, got {other:?}"),
    }
    // 20 fit.
    c.send(&batch(pings[..5].to_vec())).await.unwrap();
    for _ in 0..5 {
        assert!(matches!(next_frame(&mut c).await.body, Some(Body::Pong(_))));
    }
    assert_eq!(
        server.metric("im_bad_frames_total", &[("reason", "batch_too_large")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliver_ack_for_a_made_up_conversation_or_seq_writes_nothing() {
    let server = TestServer::start();
    backlog(&server, "amy", "ben", 3, 10).await;
    let real = proto::direct_conversation("amy", "ben");
    let mut ben = server.raw("ben").await;
    let ack = |conv: &str, seq: u64| {
        frame(
            0,
            Body::DeliverAck(proto::DeliverAck {
                conversation_id: conv.into(),
                seq,
            }),
        )
    };
    for (conv, seq) in [
        (proto::direct_conversation("ben", "ghost"), 5),
        (real.clone(), 4),
        (real.clone(), 0),
    ] {
        ben.send(&ack(&conv, seq)).await.unwrap();
        // (A push of the backlog may still come first.)
        let e = loop {
            match next_frame(&mut ben).await.body {
                Some(Body::Error(e)) => break e,
                Some(Body::Deliver(_)) => {}
                other => panic!("ack {conv} {seq}: {other:?}"),
            }
        };
        assert_eq!(e.code, ErrorCode::BadFrame as i32, "{conv} {seq}");
        assert!(e.message.contains("no seq"), "{}", e.message);
    }
    // An ack within the conversation is stored.
    ben.send(&ack(&real, 2)).await.unwrap();
    let db = server.data_dir.join("im.db");
    let store = im_server::store::SqliteStore::open(&db, false, 1)
        .await
        .expect("open the store");
    use im_server::store::Store;
    let end = Instant::now() + WAIT;
    while store.cursor("ben", &real).await.unwrap() != 2 {
        assert!(Instant::now() < end, "the valid ack was not stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ghost = proto::direct_conversation("ben", "ghost");
    assert_eq!(store.cursor("ben", &ghost).await.unwrap(), 0);
    assert_eq!(store.last_seq(&ghost).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_per_user_are_capped() {
    let server = TestServer::start_with(&[("IM_LIMITS_MAX_SESSIONS_PER_USER", "2")]);
    let first = server.raw("sam").await;
    let _second = server.raw("sam").await;
    let mut third = RawConn::connect(&server.ws_url()).await.unwrap();
    third
        .send(&login_frame(&server.token("sam")))
        .await
        .unwrap();
    let (code, reason, frames) = until_closed(&mut third).await;
    assert_eq!((code, reason.as_str()), (Some(1008), "too many sessions"));
    let e = errors(&frames);
    assert!(
        e.len() == 1 && e[0].message.contains("limits.max_sessions_per_user"),
        "{frames:?}"
    );
    // Another user is not affected; a closed session frees its place.
    let _other = server.raw("tom").await;
    drop(first);
    let end = Instant::now() + WAIT;
    loop {
        let mut c = RawConn::connect(&server.ws_url()).await.unwrap();
        if c.login(&server.token("sam"), "d", false).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < end,
            "the closed session's place was not freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn short_secrets_are_refused_naming_the_key() {
    for (var, key) in [
        ("IM_JWT_SECRET", "jwt_secret"),
        ("IM_ADMIN_TOKEN", "admin_token"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(server_bin())
            .env("IM_DATA_DIR", dir.path().join("data"))
            .env("IM_LISTEN", "127.0.0.1:0")
            .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
            .env("IM_JWT_SECRET", SECRET)
            .env("IM_ADMIN_TOKEN", ADMIN_TOKEN)
            .env(var, "short-SECRET-x")
            .output()
            .expect("run im-server");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(key) && err.contains("at least 32 bytes"),
            "{var}: {err}"
        );
        assert!(
            !err.contains("short-SECRET-x"),
            "the refusal prints the secret"
        );
    }
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_and_database_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::start();
    backlog(&server, "a", "b", 1, 10).await;
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&server.data_dir), 0o700, "data dir");
    for name in ["im.db", "im.db-wal", "im.db-shm"] {
        assert_eq!(mode(&server.data_dir.join(name)), 0o600, "{name}");
    }
}

#[test]
fn forwarded_for_counts_only_from_trusted_proxies() {
    let proxy = ip(0, 50);
    let server = TestServer::start_with(&[
        ("IM_LIMITS_MAX_CONNECTIONS_PER_IP", "1"),
        ("IM_LIMITS_TRUSTED_PROXIES", &proxy.to_string()),
    ]);
    let addr = server.client_addr;
    let xff = |client: &str| format!("X-Forwarded-For: {client}\r\n");
    // Through the proxy, the per-address cap counts the forwarded client.
    let (a, _sa) = ws_upgrade_with(addr, proxy, &xff("10.1.1.1"));
    assert_eq!(status_of(&a), 101, "{a}");
    let (b, _sb) = ws_upgrade_with(addr, proxy, &xff("10.1.1.2"));
    assert_eq!(status_of(&b), 101, "{b}");
    let (c, _) = ws_upgrade_with(addr, proxy, &xff("10.1.1.1"));
    assert_eq!(status_of(&c), 503, "{c}");
    // From anyone else the header is ignored: the socket's address is what counts.
    let direct = ip(0, 51);
    let (d, _sd) = ws_upgrade_with(addr, direct, &xff("10.9.9.1"));
    assert_eq!(status_of(&d), 101, "{d}");
    let (e, _) = ws_upgrade_with(addr, direct, &xff("10.9.9.2"));
    assert_eq!(
        status_of(&e),
        503,
        "a spoofed header must not lift the cap: {e}"
    );
    assert_eq!(
        server.metric("im_connections_refused_total", &[("reason", "per_ip")]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cluster_key_forged_reports_and_envelopes_are_ignored() {
    use crate::support::cluster::{nats_url, TestCluster};
    use im_server::cluster::registry::LoadReport;
    use im_server::cluster::relay::Envelope;
    use im_server::cluster::trust::ClusterKey;
    const KEY: &str = "cluster-key-for-the-bounds-test-000";
    let c = TestCluster::start(2, &[("IM_CLUSTER_KEY", KEY)]).await;
    // Signed envelopes cross between nodes.
    let bob = c.nodes[1].client("bob").await;
    let alice = c.nodes[0].client("alice").await;
    c.wait_presence(&[0, 1], 2).await;
    alice.send_text("bob", "signed").await.expect("send");
    assert_eq!(
        bob.next_message(WAIT).await.unwrap().payload.as_ref(),
        b"signed"
    );

    let nats = async_nats::connect(nats_url()).await.expect("NATS");
    let js = async_nats::jetstream::new(nats.clone());
    let kv = js
        .get_key_value(format!("{}-nodes", c.prefix))
        .await
        .expect("registry bucket");
    let evil = |id: &str| LoadReport {
        node_id: id.into(),
        ws_url: "ws://evil.example/ws".into(),
        ..Default::default()
    };
    // Unsigned, and signed with another key: both ignored.
    let unsigned = ClusterKey::new("").seal_report(&evil("evil1")).unwrap();
    kv.put("evil1", unsigned.into()).await.unwrap();
    let wrong = ClusterKey::new("another-key-of-at-least-32-bytes-xx")
        .seal_report(&evil("evil2"))
        .unwrap();
    kv.put("evil2", wrong.into()).await.unwrap();
    // A forged delivery to bob on n1.
    let forged = Envelope {
        from: "n0".into(),
        users: vec!["bob".into()],
        frame: proto::encode(&frame(
            0,
            Body::Deliver(proto::Deliver {
                messages: vec![proto::ChatMessage {
                    conversation_id: proto::direct_conversation("alice", "bob"),
                    sender: "alice".into(),
                    payload: b"forged".to_vec().into(),
                    seq: 2,
                    ..Default::default()
                }],
            }),
        )),
        direct: true,
        ..Default::default()
    };
    use prost::Message as _;
    nats.publish(
        format!("{}.node.n1", c.prefix),
        forged.encode_to_vec().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let (_, body) = http(c.nodes[0].client_addr, "GET", "/v1/route?avoid=n0,n1", None);
        assert!(
            !body.contains("evil"),
            "a forged node was routed to: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..2 {
        let o = c.overview(i);
        assert!(
            !o["cluster"].to_string().contains("evil"),
            "{}",
            o["cluster"]
        );
    }
    assert!(
        bob.next_message(Duration::from_millis(500)).await.is_err(),
        "the forged envelope was delivered"
    );
    assert!(c.nodes[1].metric("im_cluster_bad_envelopes_total", &[]) >= 1.0);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_paces_a_rate_limited_sync_instead_of_flooding() {
    // One message per page, 2 pages of burst then 20/s; 3 refusals tolerated.
    let server = TestServer::start_with(&[
        ("IM_FLOW_SYNC_PAGE_BYTES", "1024"),
        ("IM_LIMITS_SYNC_RATE_PER_SEC", "20"),
        ("IM_LIMITS_SYNC_BURST", "2"),
        ("IM_LIMITS_MAX_RATE_LIMITED", "3"),
    ]);
    backlog(&server, "pam", "quinn", 30, 2000).await;
    let quinn = server.client("quinn").await;
    let got = sdk_sync_all(&quinn, 30).await;
    assert_eq!(
        got.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (1..=30).collect::<Vec<u64>>()
    );
    assert!(quinn.is_connected(), "the sync was closed as a flood");
    assert_eq!(
        server.metric("im_flood_disconnects_total", &[("frame", "sync")]),
        0.0
    );
    assert!(server.metric("im_bad_frames_total", &[("reason", "rate_limited")]) >= 1.0);
}
