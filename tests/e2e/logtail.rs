//! Live log tail (`GET /admin/v1/logs/tail`) against the real binary: a filtered user's
//! debug events, from their connection and from the shared writer and router, stream
//! over HTTP within a second of a send, and nothing of another user (filtered or not)
//! shows; the ring's backlog comes first; a stream outlives the header timeout; bad
//! parameters are refused by name; tails are capped; closing a tail frees its slot; a
//! draining node ends its tails.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use im_admin_api::client::{AdminClient, LogTail};
use im_admin_api::LogTailLine;
use im_client::proto::{frame, Body, DeliverAck};
use im_client::RawConn;

use crate::support::*;

type Lines = Arc<Mutex<Vec<(Instant, LogTailLine)>>>;

/// Reads `tail` into `lines` (with each line's arrival time) until it ends.
fn collect(mut tail: LogTail) -> (Lines, tokio::task::JoinHandle<()>) {
    let lines: Lines = Arc::default();
    let sink = lines.clone();
    let task = tokio::spawn(async move {
        while let Ok(Some(l)) = tail.next_line().await {
            sink.lock().unwrap().push((Instant::now(), l));
        }
    });
    (lines, task)
}

fn admin(server: &TestServer) -> AdminClient {
    AdminClient::new(
        &server.admin_addr.to_string(),
        Some(ADMIN_TOKEN.to_owned()),
        WAIT,
    )
    .expect("admin client")
}

/// Reads frames until a Deliver arrives; acks its last message.
async fn receive_and_ack(c: &mut RawConn, req_id: u64) {
    loop {
        let f = next_frame(c).await;
        if let Some(Body::Deliver(d)) = f.body {
            let last = d.messages.last().expect("a delivered message");
            c.send(&frame(
                req_id,
                Body::DeliverAck(DeliverAck {
                    conversation_id: last.conversation_id.clone(),
                    seq: last.seq,
                }),
            ))
            .await
            .unwrap();
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tail_streams_one_filtered_user_and_nothing_of_others() {
    let server = TestServer::start_with(&[
        ("IM_HTTP_HEADER_READ_TIMEOUT_SECS", "1"),
        ("IM_LOG_MAX_TAILS", "2"),
    ]);
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    let mut carol = server.raw("carol").await;
    let tail_path = "/admin/v1/logs/tail";

    // Bad requests are refused naming the parameter; no token, no tail.
    for (query, status, name) in [
        ("", 400, "uid"),
        ("?uid=a%20b", 400, "uid"),
        ("?uid=alice&level=loud", 400, "level"),
        ("?uid=alice&backlog=x", 400, "backlog"),
        ("?uid=alice&since=5", 400, "since"),
        ("?uid=alice", 409, "no log filter"),
    ] {
        let (got, body) = http(
            server.admin_addr,
            "GET",
            &format!("{tail_path}{query}"),
            Some(ADMIN_TOKEN),
        );
        assert_eq!(got, status, "{query}: {body}");
        assert!(body.contains(name), "{query}: {body}");
    }
    let (got, _) = http(
        server.admin_addr,
        "GET",
        "/admin/v1/logs/tail?uid=alice",
        None,
    );
    assert_eq!(got, 401);

    // Debug filters for alice and carol; bob has none.
    for uid in ["alice", "carol"] {
        let (status, resp) = server.admin_json(
            "PUT",
            &format!("/admin/v1/log-filters/{uid}"),
            r#"{"level":"debug","ttl_secs":600}"#,
        );
        assert_eq!(status, 200, "{resp}");
    }

    // Something of alice's in the ring before the tail opens: it comes first, marked.
    alice
        .send(&send_to_user(1, "bob", b"early", "early-1"))
        .await
        .unwrap();
    acks(&mut alice, 1).await;
    receive_and_ack(&mut bob, 2).await;

    let client = admin(&server);
    let (lines, reader) = collect(
        client
            .log_tail("alice", Some("debug"), 100)
            .await
            .expect("tail opens"),
    );
    eventually("the backlog", || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(_, l)| l.backlog && l.message == "message committed")
    })
    .await;

    // Longer than the admin listener's header timeout (1 s): the stream stays open.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // alice sends: her first live debug event comes within a second.
    let sent = Instant::now();
    alice
        .send(&send_to_user(10, "bob", b"hi bob", "a-1"))
        .await
        .unwrap();
    acks(&mut alice, 1).await;
    eventually("alice's first live debug event", || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(at, l)| !l.backlog && l.level == "debug" && *at >= sent)
    })
    .await;
    // carol (filtered too) and bob (not filtered) send; alice receives bob's message.
    carol
        .send(&send_to_user(11, "bob", b"hi from carol", "c-1"))
        .await
        .unwrap();
    acks(&mut carol, 1).await;
    bob.send(&send_to_user(12, "alice", b"hi alice", "b-1"))
        .await
        .unwrap();
    acks(&mut bob, 1).await;
    receive_and_ack(&mut alice, 13).await;

    let has = |l: &LogTailLine, message: &str, role: Option<&str>| {
        !l.backlog
            && l.message == message
            && role.is_none_or(|r| l.fields.get("role").and_then(|v| v.as_str()) == Some(r))
    };
    eventually(
        "alice's debug events from her connection, the writer and the router",
        || {
            let l = lines.lock().unwrap();
            [
                ("send accepted", None),
                ("deliver ack", None),
                ("message committed", Some("sender")),
                ("message committed", Some("recipient")),
                ("message routed", Some("sender")),
                ("message routed", Some("recipient")),
            ]
            .iter()
            .all(|(m, r)| l.iter().any(|(_, x)| has(x, m, *r)))
        },
    )
    .await;
    let l = lines.lock().unwrap().clone();
    let first = l
        .iter()
        .find(|(at, x)| !x.backlog && x.level == "debug" && *at >= sent)
        .expect("a live debug event");
    let latency = first.0.duration_since(sent);
    println!(
        "first live debug event of alice ({:?}) {} ms after her send",
        first.1.message,
        latency.as_millis()
    );
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    for (_, x) in &l {
        assert_eq!(
            x.uid, "alice",
            "another user's event in alice's tail: {x:?}"
        );
        assert!(x.dropped.is_none(), "{x:?}");
        assert!(
            !x.fields.values().any(|v| v == "c-1"),
            "carol's message in alice's tail: {x:?}"
        );
    }
    // `IM_RECORD_TAIL=<file>` keeps these lines as NDJSON (the console's fixture).
    if let Some(path) = std::env::var_os("IM_RECORD_TAIL") {
        let text: String = l
            .iter()
            .map(|(_, x)| serde_json::to_string(x).expect("serializes") + "\n")
            .collect();
        std::fs::write(path, text).expect("write the recording");
    }
    let routed = l
        .iter()
        .find(|(_, x)| has(x, "message routed", Some("recipient")))
        .map(|(_, x)| x.clone())
        .unwrap();
    assert_eq!(routed.target, "im_server::route");
    assert_eq!(routed.fields["conns_here"], 1);
    assert!(routed.seq > 0 && routed.ts_ms > 0);

    // A second tail is allowed (log.max_tails = 2), a third is not.
    let (second, second_reader) = collect(client.log_tail("carol", None, 0).await.unwrap());
    let (status, body) = http(
        server.admin_addr,
        "GET",
        "/admin/v1/logs/tail?uid=carol",
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("log.max_tails"), "{body}");
    assert_eq!(server.metric("im_log_tail_subscribers", &[]), 2.0);

    // The client goes away: its slot is freed.
    second_reader.abort();
    drop(second);
    eventually("the closed tail's slot to be freed", || {
        server.metric("im_log_tail_subscribers", &[]) == 1.0
    })
    .await;
    assert!(server.metric("im_log_tail_events_total", &[]) > 0.0);

    // A draining node ends its tails (its shutdown is not held by them).
    let mut server = server;
    server.sigterm();
    tokio::time::timeout(WAIT, reader)
        .await
        .expect("the tail ends when the node drains")
        .unwrap();
    assert!(server.wait_exit(WAIT).is_some(), "the node exits");
}

/// A device id carrying a newline and a JSON-looking line, logged at debug for a filtered
/// user: the text log on stderr writes it escaped on the one line, never as a line of
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_text_escapes_a_forged_line_in_a_device_id() {
    let server = TestServer::start_with(&[]);
    let (status, resp) = server.admin_json(
        "PUT",
        "/admin/v1/log-filters/mallory",
        r#"{"level":"debug","ttl_secs":600}"#,
    );
    assert_eq!(status, 200, "{resp}");
    let forged = r#"{"level":"ERROR","forged":true}"#;
    let mut c = RawConn::connect(&server.ws_url()).await.expect("connect");
    c.login(&server.token("mallory"), &format!("dev\n{forged}"), false)
        .await
        .expect("login");
    c.send(&send_to_user(1, "bob", b"hi", "m-1")).await.unwrap();
    acks(&mut c, 1).await;

    eventually("the login's debug line", || server.log().contains(forged)).await;
    let log = server.log();
    assert!(
        !log.lines().any(|l| l.trim_start().starts_with(forged)),
        "a forged line in the text log:\n{log}"
    );
    assert!(log.contains(&format!("dev\\n{forged}")), "{log}");
}
