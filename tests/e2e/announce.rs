//! Server-sent messages (`POST /admin/v1/messages`) against the real binary: SYSTEM
//! messages to a user (pushed online, synced offline), to a group and to a list; a bot's
//! message; idempotency by `Idempotency-Key`; refusals naming the field; the reserved
//! sender; and the `device` of each connection in the connections views.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use im_client::proto::{self, Body, MessageType};
use im_client::RawConn;
use serde_json::Value;

use crate::support::*;

/// `POST /admin/v1/messages` with `body`, an optional Idempotency-Key and the admin token
/// (or `token`); returns (status, lower-cased head, JSON body or Null).
fn post(
    addr: SocketAddr,
    token: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> (u16, String, Value) {
    let mut s = std::net::TcpStream::connect(addr).expect("admin connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /admin/v1/messages HTTP/1.1\r\nHost: {addr}\r\n{auth}{key}Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").expect("response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head = head.to_ascii_lowercase();
    let rest = if head.contains("transfer-encoding: chunked") {
        // One chunk is all these small answers take.
        rest.split_once("\r\n")
            .map(|(_, r)| r.rsplit_once("\r\n0").map_or(r, |x| x.0))
            .unwrap_or(rest)
            .to_owned()
    } else {
        rest.to_owned()
    };
    (
        status,
        head,
        serde_json::from_str(&rest).unwrap_or(Value::Null),
    )
}

fn admin_post(s: &TestServer, key: Option<&str>, body: &str) -> (u16, Value) {
    let (status, _, v) = post(s.admin_addr, Some(ADMIN_TOKEN), key, body);
    (status, v)
}

/// The results of a 200 answer as (conversation, msg_id, seq, duplicate).
fn results(v: &Value) -> Vec<(String, String, u64, bool)> {
    v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {v}"))
        .iter()
        .map(|r| {
            (
                r["conversation_id"].as_str().unwrap().to_owned(),
                r["msg_id"].as_str().unwrap().to_owned(),
                r["seq"].as_u64().unwrap(),
                r["duplicate"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The next pushed message that is not a membership event (those have an empty sender).
async fn next_pushed(c: &mut RawConn) -> proto::ChatMessage {
    loop {
        let f = next_frame(c).await;
        if let Some(Body::Deliver(d)) = f.body {
            if let Some(m) = d.messages.into_iter().find(|m| !m.sender.is_empty()) {
                return m;
            }
        }
    }
}

#[tokio::test]
async fn system_message_to_a_user_online_and_offline_is_idempotent() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let body = r#"{"to_user": "alice", "kind": "system", "payload": "maintenance at 22:00"}"#;
    let (status, v) = admin_post(&s, Some("k-1"), body);
    assert_eq!(status, 200, "{v}");
    let first = results(&v);
    assert_eq!(first.len(), 1);
    let (conv, msg_id, seq, dup) = first[0].clone();
    assert_eq!((conv.as_str(), seq, dup), ("u:alice:system", 1, false));

    // Online: pushed at once, SYSTEM from the reserved sender, payload as given.
    let m = next_pushed(&mut alice).await;
    assert_eq!(m.sender, "system");
    assert_eq!(m.r#type, MessageType::System as i32);
    assert_eq!(&m.payload[..], b"maintenance at 22:00");
    assert_eq!((m.msg_id.as_str(), m.seq), (msg_id.as_str(), 1));
    assert_eq!(m.client_msg_id, "k-1");

    // The same key again: the first commit, marked duplicate; nothing new is stored.
    let (status, v) = admin_post(&s, Some("k-1"), body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(results(&v), vec![(conv.clone(), msg_id.clone(), 1, true)]);
    // A new key is a new message at the next seq.
    let (status, v) = admin_post(
        &s,
        Some("k-2"),
        r#"{"to_user": "alice", "kind": "system", "payload_base64": "AAEC"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(results(&v)[0].2, 2);
    let synced: Vec<_> = raw_sync_all(&mut alice, 100)
        .await
        .into_iter()
        .filter(|m| m.conversation_id == conv)
        .collect();
    assert_eq!(
        synced.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [1, 2],
        "one stored message per key"
    );
    assert_eq!(&synced[1].payload[..], &[0, 1, 2]);

    // Offline: bob reads it by sync when he comes.
    let (status, v) = admin_post(
        &s,
        None,
        r#"{"to_user": "bob", "kind": "system", "payload": "welcome"}"#,
    );
    assert_eq!(status, 200, "{v}");
    let mut bob = s.raw("bob").await;
    let got = raw_sync_all(&mut bob, 100).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].conversation_id.as_str(), got[0].sender.as_str()),
        ("u:bob:system", "system")
    );
    assert_eq!(&got[0].payload[..], b"welcome");
    assert_eq!(
        s.metric(
            "im_admin_messages_total",
            &[("kind", "system"), ("target", "user")]
        ),
        4.0
    );
}

#[tokio::test]
async fn group_list_and_bot_messages() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let mut bob = s.raw("bob").await;
    create_group(&mut alice, "ops", vec!["bob".into()]).await;

    // SYSTEM to the group: every member gets it.
    let (status, v) = admin_post(
        &s,
        Some("g-1"),
        r#"{"group_id": "ops", "kind": "system", "payload": "deploy"}"#,
    );
    assert_eq!(status, 200, "{v}");
    let r = results(&v);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0.as_str(), r[0].3), ("g:ops", false));
    for c in [&mut alice, &mut bob] {
        let m = next_pushed(c).await;
        assert_eq!(
            (m.sender.as_str(), m.r#type, m.seq),
            ("system", MessageType::System as i32, r[0].2)
        );
        assert_eq!(&m.payload[..], b"deploy");
    }
    let (status, v) = admin_post(
        &s,
        Some("g-1"),
        r#"{"group_id": "ops", "kind": "system", "payload": "deploy"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        results(&v),
        vec![(r[0].0.clone(), r[0].1.clone(), r[0].2, true)]
    );

    // A bot outside the group is refused; once a member it posts as itself (TEXT).
    let bot_body = r#"{"group_id": "ops", "kind": "bot", "from": "helper-bot", "payload": "hi"}"#;
    let (status, v) = admin_post(&s, None, bot_body);
    assert_eq!(status, 403, "{v}");
    group_op_ok(
        &mut alice,
        7,
        proto::group_op::Op::Add,
        "ops",
        vec!["helper-bot".into()],
    )
    .await;
    let (status, v) = admin_post(&s, None, bot_body);
    assert_eq!(status, 200, "{v}");
    for c in [&mut alice, &mut bob] {
        let m = next_pushed(c).await;
        assert_eq!(
            (m.sender.as_str(), m.r#type, &m.payload[..]),
            ("helper-bot", MessageType::Text as i32, &b"hi"[..])
        );
    }

    // A list: one message per user, in the list's order; online users get the push.
    let (status, v) = admin_post(
        &s,
        Some("l-1"),
        r#"{"users": ["carol", "alice", "bob"], "kind": "system", "payload": "survey"}"#,
    );
    assert_eq!(status, 200, "{v}");
    let convs: Vec<String> = results(&v).into_iter().map(|r| r.0).collect();
    assert_eq!(convs, ["u:carol:system", "u:alice:system", "u:bob:system"]);
    for c in [&mut alice, &mut bob] {
        let m = next_pushed(c).await;
        assert_eq!(
            (m.sender.as_str(), &m.payload[..]),
            ("system", &b"survey"[..])
        );
    }
    let (_, v) = admin_post(
        &s,
        Some("l-1"),
        r#"{"users": ["carol", "alice", "bob"], "kind": "system", "payload": "survey"}"#,
    );
    assert!(results(&v).iter().all(|r| r.3), "{v}");
    // A bot's direct message to a user.
    let (status, v) = admin_post(
        &s,
        None,
        r#"{"to_user": "carol", "kind": "bot", "from": "helper-bot", "payload": "psst"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(results(&v)[0].0, "u:carol:helper-bot");
    let mut carol = s.raw("carol").await;
    let got = raw_sync_all(&mut carol, 100).await;
    assert_eq!(got.len(), 2, "{got:?}");
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field() {
    let s = TestServer::start();
    let big = "x".repeat(64 * 1024);
    let oversized = format!(r#"{{"to_user": "alice", "kind": "system", "payload": "{big}"}}"#);
    let many: Vec<String> = (0..1001).map(|i| format!("\"u{i}\"")).collect();
    let many = format!(
        r#"{{"users": [{}], "kind": "system", "payload": "x"}}"#,
        many.join(",")
    );
    for (body, field) in [
        (
            r#"{"to_user": "alice", "kind": "system", "payload": "x", "extra": 1}"#,
            "extra",
        ),
        (
            r#"{"to_user": "alice", "group_id": "g", "kind": "system", "payload": "x"}"#,
            "to_user",
        ),
        (
            r#"{"to_user": "al ice", "kind": "system", "payload": "x"}"#,
            "to_user",
        ),
        (
            r#"{"to_user": "system", "kind": "system", "payload": "x"}"#,
            "to_user",
        ),
        (
            r#"{"to_user": "alice", "kind": "bot", "from": "b:1", "payload": "x"}"#,
            "from",
        ),
        (
            r#"{"to_user": "alice", "kind": "shout", "payload": "x"}"#,
            "kind",
        ),
        (
            r#"{"users": ["a", "a"], "kind": "system", "payload": "x"}"#,
            "users",
        ),
        (
            r#"{"group_id": "bad/id", "kind": "system", "payload": "x"}"#,
            "group_id",
        ),
        (oversized.as_str(), "payload"),
        (many.as_str(), "users"),
        ("not json", "body"),
    ] {
        let (status, v) = admin_post(&s, None, body);
        assert_eq!(status, 400, "{}: {v}", &body[..body.len().min(80)]);
        let e = v["error"].as_str().unwrap_or_default();
        assert!(e.contains(field), "{field}: {e}");
    }
    let (status, v) = admin_post(
        &s,
        Some("a b"),
        r#"{"to_user": "alice", "kind": "system", "payload": "x"}"#,
    );
    assert_eq!(status, 400, "{v}");
    let (status, v) = admin_post(
        &s,
        None,
        r#"{"group_id": "nope", "kind": "system", "payload": "x"}"#,
    );
    assert_eq!(status, 404, "{v}");
    let body = r#"{"to_user": "alice", "kind": "system", "payload": "x"}"#;
    let (status, head, _) = post(s.admin_addr, None, None, body);
    assert_eq!(status, 401);
    assert!(head.contains("www-authenticate"), "{head}");
    let (status, _, _) = post(s.admin_addr, Some("wrong-token"), None, body);
    assert_eq!(status, 401);
    // Nothing was written by any of them.
    let mut alice = s.raw("alice").await;
    assert!(raw_sync_all(&mut alice, 100).await.is_empty());

    // Nobody logs in as the reserved sender or writes to it.
    let mut sys = s.raw_anonymous().await;
    sys.send(&login_frame(&s.token("system"))).await.unwrap();
    let f = next_frame(&mut sys).await;
    assert!(
        matches!(&f.body, Some(Body::Error(e)) if e.code == proto::ErrorCode::Unauthenticated as i32),
        "{f:?}"
    );
    alice
        .send(&send_to_user(5, "system", b"hello?", "c-1"))
        .await
        .unwrap();
    let f = next_frame(&mut alice).await;
    assert!(
        matches!(&f.body, Some(Body::Error(e)) if e.code == proto::ErrorCode::Forbidden as i32),
        "{f:?}"
    );
}

#[tokio::test]
async fn the_store_refusing_writes_is_503_with_retry_after() {
    // A free-space floor no disk has: the store refuses writes from the first sample.
    let s = TestServer::start_with(&[("IM_STORE_MIN_FREE_DISK_MB", "100000000")]);
    let body = r#"{"to_user": "alice", "kind": "system", "payload": "x"}"#;
    let mut last = (0, String::new());
    for _ in 0..100 {
        let (status, head, _) = post(s.admin_addr, Some(ADMIN_TOKEN), Some("k"), body);
        last = (status, head);
        if status == 503 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(last.0, 503, "{}", last.1);
    assert!(last.1.contains("retry-after:"), "{}", last.1);
}

#[tokio::test]
async fn connections_show_the_device() {
    let s = TestServer::start();
    let _raw = s.raw("alice").await; // device "test-device"
    let _sdk = s.client("bob").await; // the SDK's default device id
    let mut plain = s.raw_anonymous().await;
    plain.login(&s.token("carol"), "", false).await.unwrap();
    let (status, body) = s.admin_get("/admin/v1/connections?sort=user");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let rows: Vec<(String, String, u64)> = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["user_id"].as_str().unwrap().to_owned(),
                c["device"].as_str().unwrap().to_owned(),
                c["conn_id"].as_u64().unwrap(),
            )
        })
        .collect();
    let devices: Vec<(&str, &str)> = rows
        .iter()
        .map(|(u, d, _)| (u.as_str(), d.as_str()))
        .collect();
    assert_eq!(
        devices,
        [
            ("alice", "test-device"),
            ("bob", "default"),
            ("carol", "default")
        ]
    );
    let (status, body) = s.admin_get(&format!("/admin/v1/connections/{}", rows[0].2));
    assert_eq!(status, 200, "{body}");
    let one: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (one["user_id"].as_str(), one["device"].as_str()),
        (Some("alice"), Some("test-device"))
    );
    let (status, _) = s.admin_get("/admin/v1/connections/999999");
    assert_eq!(status, 404);
    let (status, _) = s.admin_get("/admin/v1/connections/x");
    assert_eq!(status, 400);
}

/// Cluster mode: a message posted on node 0 reaches a user online on node 1 (SDK) through
/// the existing cross-node path, and the answer is the same on a retry from node 1.
#[tokio::test]
async fn cluster_message_reaches_a_user_on_another_node() {
    let c = cluster::TestCluster::start(2, &[]).await;
    let client = im_client::Client::connect(im_client::ClientConfig::new(
        c.nodes[1].ws_url(),
        c.nodes[1].token("alice"),
    ))
    .await
    .expect("client connect");
    c.wait_for(0, "node 0 to see alice on node 1", |o| {
        o["cluster"]["users_on_other_nodes"] == 1
    })
    .await;
    let body = r#"{"to_user": "alice", "kind": "system", "payload": "cross-node"}"#;
    let (status, v) = admin_post(&c.nodes[0], Some("x-1"), body);
    assert_eq!(status, 200, "{v}");
    let first = results(&v);
    let m = client.next_message(WAIT).await.expect("the push");
    assert_eq!(
        (m.sender.as_str(), m.r#type, &m.payload[..], m.seq),
        (
            "system",
            MessageType::System as i32,
            &b"cross-node"[..],
            first[0].2
        )
    );
    let (status, v) = admin_post(&c.nodes[1], Some("x-1"), body);
    assert_eq!(status, 200, "{v}");
    let again = results(&v);
    assert_eq!(
        (&again[0].1, again[0].2, again[0].3),
        (&first[0].1, first[0].2, true)
    );
    drop(client);
    c.cleanup().await;
}
