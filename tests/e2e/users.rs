//! The per-user diagnosis route, `GET /admin/v1/users/{uid}`, against the real binary:
//! a user's two sessions, their real unread backlog and, once under a log filter, the
//! messages they send and receive; refusals and rate-limit hits; sampled users; two nodes over the real
//! NATS merged into one answer (a stopped node listed as missing, forged queries
//! dropped and counted); bad input and no token.

use std::time::{Duration, Instant};

use im_admin_api::UserDiag;
use im_client::proto::{self, frame, Body, DeliverAck};
use im_client::RawConn;
use prost::Message as _;

use crate::support::*;

/// The user answer of `server`, parsed (panics on anything but 200).
fn user(server: &TestServer, uid: &str) -> UserDiag {
    let (status, body) = server.admin_get(&format!("/admin/v1/users/{uid}?messages=32"));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Polls the user answer until `f` holds; returns it.
async fn user_until(
    server: &TestServer,
    uid: &str,
    what: &str,
    f: impl Fn(&UserDiag) -> bool,
) -> UserDiag {
    let end = Instant::now() + WAIT;
    loop {
        let u = user(server, uid);
        if f(&u) {
            return u;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {u:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn login(server: &TestServer, uid: &str, device: &str) -> RawConn {
    let mut c = RawConn::connect(&server.ws_url()).await.expect("connect");
    c.login(&server.token(uid), device, false)
        .await
        .expect("login");
    c
}

/// Sends a Send and waits for its SendAck; returns it.
async fn send_acked(c: &mut RawConn, req_id: u64, to: &str, cmid: &str) -> proto::SendAck {
    match request(
        c,
        req_id,
        send_to_user(req_id, to, b"hi", cmid).body.expect("body"),
    )
    .await
    {
        Body::SendAck(a) => a,
        other => panic!("expected a SendAck, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_real_backlog_and_recorded_messages() {
    let server = TestServer::start();
    let mut phone = login(&server, "bob", "phone").await;
    let _laptop = login(&server, "bob", "laptop").await;
    let mut alice = login(&server, "alice", "web").await;

    // Five messages to bob, none acked yet; bob writes twice to carol (offline).
    for i in 0..5 {
        send_acked(&mut alice, 10 + i, "bob", &format!("a{i}")).await;
    }
    let u = user_until(&server, "bob", "bob's backlog of 5", |u| {
        u.backlog
            .iter()
            .any(|b| b.conversation_id == "u:alice:bob" && b.unread == 5)
    })
    .await;
    assert_eq!(u.sessions.len(), 2, "{u:#?}");
    let mut devices: Vec<&str> = u.sessions.iter().map(|s| s.device.as_str()).collect();
    devices.sort();
    assert_eq!(devices, ["laptop", "phone"]);
    assert!(u
        .sessions
        .iter()
        .all(|s| s.state == "active" && s.node == u.node_id));
    assert!(!u.cluster && u.missing_nodes.is_empty());
    // Not under a filter, not sampled: nothing recorded.
    assert!(!u.tracked && u.messages.is_empty(), "{u:#?}");

    // The backlog is the real unread count: what a sync from the stored cursors reads.
    let mut reader = login(&server, "bob", "reader").await;
    let unread = raw_sync_all(&mut reader, 100)
        .await
        .into_iter()
        .filter(|m| m.conversation_id == "u:alice:bob")
        .count();
    let b = &u.backlog[0];
    assert_eq!(
        (b.conversation_id.as_str(), b.unread),
        ("u:alice:bob", unread as u64)
    );
    assert_eq!((b.cursor, b.last_seq), (0, 5));
    // An ack of seq 2 leaves 3.
    let ack = DeliverAck {
        conversation_id: "u:alice:bob".into(),
        seq: 2,
    };
    phone.send(&frame(0, Body::DeliverAck(ack))).await.unwrap();
    server.wait_cursor("bob", "u:alice:bob", 2).await;
    let u = user(&server, "bob");
    assert_eq!(u.backlog[0].unread, 3, "{u:#?}");
    assert_eq!(u.sessions.len(), 3, "the reader is a session too");

    // Under a log filter, what bob sends and receives is recorded, with its timings.
    let (status, body) = server.admin_json(
        "PUT",
        "/admin/v1/log-filters/bob",
        r#"{"level":"debug","ttl_secs":600}"#,
    );
    assert_eq!(status, 200, "{body}");
    let mut sent = Vec::new();
    for i in 0..2 {
        sent.push(send_acked(&mut phone, 20 + i, "carol", &format!("b{i}")).await);
    }
    let got = send_acked(&mut alice, 30, "bob", "a5").await;
    let u = user_until(&server, "bob", "bob's three recorded messages", |u| {
        u.messages.len() >= 3
    })
    .await;
    assert!(u.tracked);
    assert_eq!(u.log_filters.len(), 1);
    assert_eq!(u.log_filters[0].level, "debug");
    for a in &sent {
        let m = u
            .messages
            .iter()
            .find(|m| m.msg_id == a.msg_id)
            .unwrap_or_else(|| panic!("sent {} in {u:#?}", a.msg_id));
        assert_eq!(m.direction, "sent");
        assert_eq!((m.conversation_id.as_str(), m.seq), ("u:bob:carol", a.seq));
        assert!(m
            .stages
            .iter()
            .any(|s| s.stage == "read_to_route" && s.ms >= 0.0));
    }
    let r = u
        .messages
        .iter()
        .find(|m| m.msg_id == got.msg_id)
        .unwrap_or_else(|| panic!("received {} in {u:#?}", got.msg_id));
    assert_eq!(
        (r.direction.as_str(), r.how.as_str(), r.seq),
        ("received", "push", 6)
    );
    assert_eq!(r.sessions, 3);
    // Newest first, cut to ?messages=.
    assert!(u.messages.windows(2).all(|w| w[0].at_ms >= w[1].at_ms));
    let (status, body) = server.admin_get("/admin/v1/users/bob?messages=1&backlog=1");
    assert_eq!(status, 200, "{body}");
    let one: UserDiag = serde_json::from_str(&body).unwrap();
    assert_eq!((one.messages.len(), one.backlog.len()), (1, 1));
    // Bob's own messages count as read: no backlog in u:bob:carol.
    assert!(u.backlog.iter().all(|b| b.conversation_id != "u:bob:carol"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_rate_limit_hits_are_counted_and_sampled_users_recorded() {
    // Every uid sampled: messages are recorded without a log filter.
    let server = TestServer::start_with(&[
        ("IM_LIMITS_PING_RATE_PER_SEC", "1"),
        ("IM_LIMITS_PING_BURST", "1"),
        ("IM_OBS_USER_DIAG_SAMPLE_EVERY", "1"),
    ]);
    let mut alice = login(&server, "alice", "web").await;
    create_group(&mut alice, "club", vec!["carol".into()]).await;
    let mut bob = login(&server, "bob", "phone").await;
    // Not a member of the group.
    match request(
        &mut bob,
        5,
        send_to_group(5, "club", b"let me in", "x").body.unwrap(),
    )
    .await
    {
        Body::Error(e) => assert_eq!(e.code, proto::ErrorCode::NotMember as i32),
        other => panic!("expected NOT_MEMBER, got {other:?}"),
    }
    // Pings past the bucket: RATE_LIMITED.
    let mut limited = 0;
    for i in 0..3 {
        let ping = Body::Ping(proto::Ping { client_time: 0 });
        if let Body::Error(e) = request(&mut bob, 100 + i, ping).await {
            assert_eq!(e.code, proto::ErrorCode::RateLimited as i32);
            limited += 1;
        }
    }
    assert!(limited >= 1);
    let u = user(&server, "bob");
    let code = |c: &str| u.refusals.iter().find(|r| r.code == c).map(|r| r.count);
    assert_eq!(code("NOT_MEMBER"), Some(1), "{u:#?}");
    assert_eq!(code("RATE_LIMITED"), Some(limited), "{u:#?}");
    assert_eq!(u.rate_limited, limited);
    assert_eq!(u.floods, 0);
    assert!(u.refusals.iter().all(|r| r.last_ms > 0));
    // Sampled, with no log filter: what alice sends bob is in both rings.
    let a = send_acked(&mut alice, 7, "bob", "s1").await;
    let u = user_until(&server, "bob", "bob's sampled message", |u| {
        u.messages.iter().any(|m| m.msg_id == a.msg_id)
    })
    .await;
    assert!(u.tracked && u.log_filters.is_empty(), "{u:#?}");
    let u = user(&server, "alice");
    assert!(
        u.messages
            .iter()
            .any(|m| m.msg_id == a.msg_id && m.direction == "sent"),
        "{u:#?}"
    );
    // Nothing is known of a user who never did anything: 404 naming them.
    let (status, body) = server.admin_get("/admin/v1/users/nobody");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("nobody"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uid_and_parameters_are_400_and_no_token_is_401() {
    let server = TestServer::start();
    for (path, name) in [
        ("/admin/v1/users/bad*uid", "uid"),
        (
            "/admin/v1/users/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "uid",
        ),
        ("/admin/v1/users/bob?backlog=0", "backlog"),
        ("/admin/v1/users/bob?backlog=201", "backlog"),
        ("/admin/v1/users/bob?messages=33", "messages"),
        ("/admin/v1/users/bob?messages=x", "messages"),
        ("/admin/v1/users/bob?limit=5", "limit"),
    ] {
        let (status, body) = server.admin_get(path);
        assert_eq!(status, 400, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"].as_str().unwrap_or("").contains(name),
            "{path}: {body}"
        );
    }
    let (status, body) = http(server.admin_addr, "GET", "/admin/v1/users/bob", None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = http(
        server.admin_addr,
        "GET",
        "/admin/v1/users/bob",
        Some("wrong-token-wrong-token-wrong-token"),
    );
    assert_eq!(status, 401, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_over_nats_merge_and_a_silent_node_is_missing() {
    use crate::support::cluster::{nats_url, TestCluster};
    use im_server::cluster::query::{QueryReply, QueryRequest};
    const KEY: &str = "cluster-key-for-the-users-test-0000";
    let c = TestCluster::start(
        2,
        &[
            ("IM_CLUSTER_KEY", KEY),
            ("IM_CLUSTER_QUERY_TIMEOUT_MS", "500"),
        ],
    )
    .await;
    let _on0 = login(&c.nodes[0], "bob", "phone").await;
    let _on1 = login(&c.nodes[1], "bob", "laptop").await;
    let mut alice = login(&c.nodes[1], "alice", "web").await;
    send_acked(&mut alice, 3, "bob", "m1").await;

    for asked in 0..2 {
        let u = user(&c.nodes[asked], "bob");
        assert!(u.cluster);
        assert_eq!(u.node_id, format!("n{asked}"));
        let mut nodes = u.nodes.clone();
        nodes.sort();
        assert_eq!(nodes, ["n0", "n1"], "{u:#?}");
        assert!(u.missing_nodes.is_empty(), "{u:#?}");
        let mut on: Vec<(String, String)> = u
            .sessions
            .iter()
            .map(|s| (s.node.clone(), s.device.clone()))
            .collect();
        on.sort();
        assert_eq!(
            on,
            [
                ("n0".to_owned(), "phone".to_owned()),
                ("n1".to_owned(), "laptop".to_owned())
            ]
        );
        // The backlog comes from the shared store once.
        assert_eq!(u.backlog.len(), 1, "{u:#?}");
        assert_eq!(u.backlog[0].unread, 1);
    }

    // A forged query (unsigned) to n1 gets no answer and is counted there.
    let nats = async_nats::connect(nats_url()).await.expect("NATS");
    let forged = QueryRequest {
        from: "n0".into(),
        to: "n1".into(),
        uid: "bob".into(),
        messages: 5,
        nonce: 1,
        ..Default::default()
    };
    let answer = tokio::time::timeout(
        Duration::from_millis(700),
        nats.request(
            format!("{}.query.n1", c.prefix),
            forged.encode_to_vec().into(),
        ),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(ref m)) if QueryReply::decode(m.payload.clone()).is_ok_and(|r| !r.body.is_empty())),
        "a forged query was answered"
    );
    eventually("the bad query counted on n1", || {
        c.nodes[1].metric("im_cluster_bad_queries_total", &[]) >= 1.0
    })
    .await;

    // A node that does not answer in time is listed as missing, not an error.
    c.nodes[1].signal("STOP");
    c.nodes[1].wait_stopped();
    let t = Instant::now();
    let u = user(&c.nodes[0], "bob");
    c.nodes[1].signal("CONT");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(u.missing_nodes, ["n1"], "{u:#?}");
    assert_eq!(u.nodes, ["n0"]);
    assert_eq!(u.sessions.len(), 1);
    assert_eq!(u.sessions[0].node, "n0");
    c.cleanup().await;
}
