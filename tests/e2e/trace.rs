//! Message traces (`GET /admin/v1/messages/{msg_id}/trace`) against the real binary: a
//! filtered sender's message has every stage, the recipient's queue_wait and write
//! included; so has a message a filtered user receives (found from its tail line); `obs.trace_sample_rate = 1` traces everyone's; a message across two nodes
//! over the real NATS has stages from both node ids; a bad id is a 400 that says what an
//! id is, an unknown one a 404, and no token a 401.

use im_admin_api::MessageTrace;

use crate::support::cluster::TestCluster;
use crate::support::*;

const STAGES: [&str; 6] = [
    "decode",
    "validate",
    "relation",
    "persist_wait",
    "persist_commit",
    "route",
];

/// Sends one message from `from` to `to` and returns its msg_id once `to` has it.
async fn send_one(
    from: &mut im_client::RawConn,
    to: &mut im_client::RawConn,
    to_user: &str,
    cmid: &str,
) -> String {
    from.send(&send_to_user(1, to_user, b"hello", cmid))
        .await
        .unwrap();
    let ack = acks(from, 1).await.remove(0).1;
    let pushed = next_chat_frame(to).await;
    match pushed.body {
        Some(im_client::proto::Body::Deliver(d)) => {
            assert_eq!(d.messages[0].msg_id, ack.msg_id)
        }
        other => panic!("expected the push, got {other:?}"),
    }
    ack.msg_id
}

/// The trace of `msg_id` on `server`, once it holds the recipient's write (the part is
/// filed when the last copy is written).
async fn trace_with_write(server: &TestServer, msg_id: &str, recipient: &str) -> MessageTrace {
    let path = format!("/admin/v1/messages/{msg_id}/trace");
    let mut last = String::new();
    for _ in 0..50 {
        let (status, body) = server.admin_get(&path);
        if status == 200 {
            let t: MessageTrace = serde_json::from_str(&body).expect("trace JSON");
            if t.stages
                .iter()
                .any(|s| s.stage == "write" && s.recipient.as_deref() == Some(recipient))
            {
                return t;
            }
        }
        last = format!("{status} {body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no trace of {msg_id} with {recipient}'s write: {last}");
}

fn names(t: &MessageTrace) -> Vec<&str> {
    t.stages.iter().map(|s| s.stage.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_senders_message_has_every_stage() {
    let server = TestServer::start();
    let (status, resp) = server.admin_json(
        "PUT",
        "/admin/v1/log-filters/alice",
        r#"{"level":"debug","ttl_secs":600}"#,
    );
    assert_eq!(status, 200, "{resp}");
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    let msg_id = send_one(&mut alice, &mut bob, "bob", "c1").await;
    let t = trace_with_write(&server, &msg_id, "bob").await;
    assert_eq!(t.msg_id, msg_id);
    assert_eq!(t.sender, "alice");
    assert_eq!(t.conversation, "u:alice:bob");
    assert_eq!(t.seq, 1);
    assert_eq!(t.recipients_omitted, 0);
    let got = names(&t);
    for stage in STAGES.iter().chain(&["queue_wait", "write"]) {
        assert!(got.contains(stage), "{stage} missing from {got:?}");
    }
    let node = &t.nodes[0];
    assert!(t.stages.iter().all(|s| &s.node == node));
    let qw = t.stages.iter().find(|s| s.stage == "queue_wait").unwrap();
    assert_eq!(qw.recipient.as_deref(), Some("bob"));
    assert_eq!(t.stages[0].stage, "decode");
    assert_eq!(t.stages[0].start_offset_ns, 0);
    assert!(t
        .stages
        .windows(2)
        .all(|w| w[0].start_offset_ns <= w[1].start_offset_ns));

    // Neither carol nor dave is filtered and nothing is sampled: not traced.
    let mut carol = server.raw("carol").await;
    let mut dave = server.raw("dave").await;
    let other = send_one(&mut carol, &mut dave, "dave", "c2").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (status, body) = server.admin_get(&format!("/admin/v1/messages/{other}/trace"));
    assert_eq!(status, 404, "{body}");
    assert!(server.metric("im_traces_recorded_total", &[]) >= 1.0);
}

/// What the console's `m` does on a line of a filtered user's live tail: the msg_id of a
/// message that user received (from an unfiltered sender, directly or in a group) names
/// a trace the node holds, with the filtered recipient's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_recipients_tail_line_opens_its_trace() {
    use std::sync::{Arc, Mutex};
    let server = TestServer::start();
    let (status, resp) = server.admin_json(
        "PUT",
        "/admin/v1/log-filters/alice",
        r#"{"level":"debug","ttl_secs":600}"#,
    );
    assert_eq!(status, 200, "{resp}");
    let client = im_admin_api::client::AdminClient::new(
        &server.admin_addr.to_string(),
        Some(ADMIN_TOKEN.to_owned()),
        WAIT,
    )
    .expect("admin client");
    let mut tail = client
        .log_tail("alice", Some("debug"), 100)
        .await
        .expect("tail opens");
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(l)) = tail.next_line().await {
            if let Some(id) = l.fields.get("msg_id").and_then(|v| v.as_str()) {
                sink.lock().unwrap().push(id.to_owned());
            }
        }
    });

    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    let direct = send_one(&mut bob, &mut alice, "alice", "d1").await;

    let mut carol = server.raw("carol").await;
    create_group(&mut carol, "team", vec!["alice".into(), "bob".into()]).await;
    carol
        .send(&send_to_group(3, "team", b"to the team", "g1"))
        .await
        .unwrap();
    let group = acks(&mut carol, 1).await.remove(0).1.msg_id;

    for (msg_id, sender) in [(&direct, "bob"), (&group, "carol")] {
        eventually("the received message's line in alice's tail", || {
            lines.lock().unwrap().iter().any(|id| id == msg_id)
        })
        .await;
        let t = trace_with_write(&server, msg_id, "alice").await;
        assert_eq!(t.sender, sender);
        let got = names(&t);
        for stage in STAGES {
            assert!(got.contains(&stage), "{stage} missing from {got:?}");
        }
    }
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_rate_one_traces_everyone_and_bad_requests_are_refused() {
    let server = TestServer::start_with(&[("IM_OBS_TRACE_SAMPLE_RATE", "1")]);
    let mut carol = server.raw("carol").await;
    let mut dave = server.raw("dave").await;
    let a = send_one(&mut carol, &mut dave, "dave", "s1").await;
    let b = send_one(&mut dave, &mut carol, "carol", "s2").await;
    let ta = trace_with_write(&server, &a, "dave").await;
    let tb = trace_with_write(&server, &b, "carol").await;
    assert_eq!((ta.sender.as_str(), tb.sender.as_str()), ("carol", "dave"));
    for t in [&ta, &tb] {
        let got = names(t);
        for stage in STAGES {
            assert!(got.contains(&stage), "{stage} missing from {got:?}");
        }
    }

    for id in [
        "xyz",
        "0123456789abcdef0123456789abcdeg",
        "0123456789abcdef",
    ] {
        let (status, body) = server.admin_get(&format!("/admin/v1/messages/{id}/trace"));
        assert_eq!(status, 400, "{id}: {body}");
        assert!(body.contains("32 hex digits"), "{body}");
    }
    let (status, body) =
        server.admin_get("/admin/v1/messages/0123456789abcdef0123456789abcdef/trace");
    assert_eq!(status, 404, "{body}");
    let (status, _) = http(
        server.admin_addr,
        "GET",
        &format!("/admin/v1/messages/{a}/trace"),
        None,
    );
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_across_two_nodes_has_stages_from_both() {
    let c = TestCluster::start(
        2,
        &[(
            "IM_CLUSTER_KEY",
            "trace-test-cluster-key-of-32-bytes-or-more",
        )],
    )
    .await;
    for node in &c.nodes {
        let (status, resp) = node.admin_json(
            "PUT",
            "/admin/v1/log-filters/erin",
            r#"{"level":"debug","ttl_secs":600}"#,
        );
        assert_eq!(status, 200, "{resp}");
    }
    let mut erin = c.nodes[0].raw("erin").await;
    let mut frank = c.nodes[1].raw("frank").await;
    c.wait_presence(&[0, 1], 2).await;
    let msg_id = send_one(&mut erin, &mut frank, "frank", "x1").await;
    // Asked on the sender's node: its own part and node 1's, over NATS.
    let t = trace_with_write(&c.nodes[0], &msg_id, "frank").await;
    let ids: std::collections::BTreeSet<&str> = t.stages.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(ids, ["n0", "n1"].into_iter().collect(), "{t:?}");
    let on = |node: &str| -> Vec<&str> {
        t.stages
            .iter()
            .filter(|s| s.node == node)
            .map(|s| s.stage.as_str())
            .collect()
    };
    for stage in STAGES {
        assert!(on("n0").contains(&stage), "{stage} missing on n0: {t:?}");
    }
    for stage in ["route", "queue_wait", "write"] {
        assert!(on("n1").contains(&stage), "{stage} missing on n1: {t:?}");
    }
    assert!(t.nodes_unanswered.is_empty(), "{t:?}");
    // Asked on the other node: the same timeline.
    let t1 = trace_with_write(&c.nodes[1], &msg_id, "frank").await;
    assert_eq!(t1.stages.len(), t.stages.len());
    assert_eq!(c.nodes[0].metric("im_trace_bad_replies_total", &[]), 0.0);
    drop((erin, frank));
    c.cleanup().await;
}
