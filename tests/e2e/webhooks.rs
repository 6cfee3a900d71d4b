//! Event webhooks end to end: the real server POSTs signed events to a real HTTP
//! receiver (`support::receiver`, which verifies every signature). Offline push with
//! its collapse window, no push for an online user, a receiver down under load (none
//! lost, repeats only with the same event id), events queued across a SIGKILL, a slow
//! receiver beside message delivery, parking and redelivery through the admin API.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use im_client::RawConn;

use crate::support::receiver::{Received, Receiver, Reply};
use crate::support::*;

/// The endpoint secret of these tests.
const HOOK_SECRET: &str = "webhook-secret-of-at-least-32-bytes!";

/// A config file with one endpoint `push` at `url` getting `events`, and `extra` lines
/// of the `[webhooks]` section.
fn config(url: &str, events: &[&str], extra: &str) -> String {
    let events: Vec<String> = events.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        "[webhooks]\n{extra}\n[[webhooks.endpoints]]\nname = \"push\"\nurl = \"{url}\"\n\
         secret = \"{HOOK_SECRET}\"\nevents = [{}]\n",
        events.join(", ")
    )
}

/// The received events of `kind`, as JSON.
fn of_kind(got: &[Received], kind: &str) -> Vec<serde_json::Value> {
    got.iter()
        .map(Received::json)
        .filter(|j| j["kind"] == kind)
        .collect()
}

/// Every request carried a valid signature, and its `X-IM-Event-Id` is its body's id.
fn all_signed(got: &[Received]) {
    for r in got {
        assert!(
            r.signature_ok,
            "a request failed the signature check: {r:?}"
        );
        assert_eq!(
            r.event_id.as_deref(),
            r.json()["id"].as_str(),
            "X-IM-Event-Id differs from the body's id"
        );
    }
}

/// Sends `n` messages from `from` to `to`, returning their msg_ids (acked).
async fn send_n(c: &mut RawConn, to: &str, n: u64, tag: &str) -> Vec<String> {
    for i in 0..n {
        let id = format!("{tag}{i}");
        c.send(&send_to_user(i + 1, to, id.as_bytes(), &id))
            .await
            .expect("send");
    }
    acks(c, n as usize)
        .await
        .into_iter()
        .map(|(_, a)| a.msg_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_recipient_gets_one_push_per_window_online_one_none() {
    let rx = Receiver::start(HOOK_SECRET).await;
    let server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &["message.offline", "message.created", "user.online"],
            "offline_window_ms = 3000",
        ),
        &[],
    );
    let mut alice = server.raw("alice").await;
    // Three messages to bob, who is offline: the first pushes at once; the other two
    // are merged into one push at the window's end, carrying the last.
    let ids = send_n(&mut alice, "bob", 3, "a").await;
    let first = rx
        .wait_until(WAIT, "the first message.offline", |g| {
            !of_kind(g, "message.offline").is_empty()
        })
        .await;
    let push = &of_kind(&first, "message.offline")[0];
    assert_eq!(push["user_id"], "bob");
    assert_eq!(push["unread"], 1);
    assert_eq!(push["message"]["seq"], 1);
    assert_eq!(push["message"]["msg_id"], ids[0].as_str());
    assert_eq!(push["message"]["sender"], "alice");
    assert_eq!(push["message"]["conversation_id"], "u:alice:bob");
    let got = rx
        .wait_until(WAIT, "the merged message.offline", |g| {
            of_kind(g, "message.offline").len() >= 2
        })
        .await;
    let merged = &of_kind(&got, "message.offline")[1];
    assert_eq!(merged["message"]["seq"], 3, "{merged}");
    assert_eq!(merged["unread"], 3);
    assert_eq!(merged["merged"], 1);
    assert!(
        merged["time"].as_i64().unwrap() - push["time"].as_i64().unwrap() < 3000,
        "both made within the window"
    );
    // Bob comes online: his next message makes no push.
    let _bob = server.raw("bob").await;
    rx.wait_until(WAIT, "user.online for bob", |g| {
        of_kind(g, "user.online")
            .iter()
            .any(|e| e["user_id"] == "bob")
    })
    .await;
    let more = send_n(&mut alice, "bob", 1, "b").await;
    let got = rx
        .wait_until(WAIT, "message.created of the 4th", |g| {
            of_kind(g, "message.created")
                .iter()
                .any(|e| e["message"]["msg_id"] == more[0].as_str())
        })
        .await;
    // The expander made the created and (had there been one) the offline event of the
    // 4th in one transaction; let a window's worth pass for a merged one too.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(rx.received().len() >= got.len());
    let got = rx.received();
    let pushes = of_kind(&got, "message.offline");
    assert_eq!(pushes.len(), 2, "exactly two pushes: {pushes:?}");
    assert_eq!(of_kind(&got, "message.created").len(), 4);
    all_signed(&got);
    let ids: HashSet<&str> = got.iter().filter_map(|r| r.event_id.as_deref()).collect();
    assert_eq!(ids.len(), got.len(), "every event has its own id");
}

/// Sends at about `rate` messages a second for `secs` from `senders` users to
/// `recipient` (offline); returns every acked msg_id.
async fn load(server: &TestServer, senders: usize, rate: u64, secs: u64) -> Vec<String> {
    let mut tasks = Vec::new();
    let per_sender = rate / senders as u64;
    for s in 0..senders {
        let mut c = server.raw(&format!("load{s}")).await;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let tick = Duration::from_millis(100);
            let per_tick = (per_sender / 10).max(1);
            let end = Instant::now() + Duration::from_secs(secs);
            let mut next = Instant::now();
            let mut req = 0u64;
            while Instant::now() < end {
                for _ in 0..per_tick {
                    req += 1;
                    let id = format!("s{s}-{req}");
                    c.send(&send_to_user(req, "sink", id.as_bytes(), &id))
                        .await
                        .expect("send");
                }
                for (_, a) in acks(&mut c, per_tick as usize).await {
                    ids.push(a.msg_id);
                }
                next += tick;
                tokio::time::sleep_until(next.into()).await;
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a sender"));
    }
    all
}

/// Every message's `message.created` arrived, each message under one event id, and
/// each event id always with the same body.
fn check_once_per_message(got: &[Received], acked: &[String]) {
    all_signed(got);
    let mut event_of: HashMap<String, String> = HashMap::new();
    let mut body_of: HashMap<String, Vec<u8>> = HashMap::new();
    for r in got {
        let j = r.json();
        let id = j["id"].as_str().unwrap().to_owned();
        let msg = j["message"]["msg_id"].as_str().unwrap().to_owned();
        if let Some(prev) = body_of.insert(id.clone(), r.body.clone()) {
            assert_eq!(prev, r.body, "event {id} repeated with another body");
        }
        if let Some(prev) = event_of.insert(msg.clone(), id.clone()) {
            assert_eq!(prev, id, "message {msg} came under two event ids");
        }
    }
    let missing: Vec<&String> = acked
        .iter()
        .filter(|m| !event_of.contains_key(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "{} events lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_down_under_load_loses_nothing() {
    let secs = env_u64("IM_TEST_WEBHOOK_DOWN_SECS", 30);
    let mut rx = Receiver::start(HOOK_SECRET).await;
    let server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &["message.created"],
            "retry_base_ms = 200\nretry_max_ms = 2000\nconcurrency = 16",
        ),
        &[],
    );
    let run = {
        let started = Instant::now();
        let sending = load(&server, 10, 500, secs + 6);
        tokio::pin!(sending);
        let mut acked = None;
        // Down after 3 s, up `secs` later, while the load runs.
        tokio::select! {
            a = &mut sending => acked = Some(a),
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
        rx.down();
        if acked.is_none() {
            tokio::select! {
                a = &mut sending => acked = Some(a),
                _ = tokio::time::sleep(Duration::from_secs(secs)) => {}
            }
        }
        rx.up().await;
        let acked = match acked {
            Some(a) => a,
            None => sending.await,
        };
        (acked, started.elapsed())
    };
    let (acked, took) = run;
    assert!(
        acked.len() as u64 >= 400 * secs,
        "only {} sent in {took:?}",
        acked.len()
    );
    let want: HashSet<&str> = acked.iter().map(String::as_str).collect();
    let got = rx
        .wait_until(Duration::from_secs(120), "every message's event", |g| {
            let seen: HashSet<String> = g
                .iter()
                .filter_map(|r| r.json()["message"]["msg_id"].as_str().map(str::to_owned))
                .collect();
            want.iter().all(|m| seen.contains(*m))
        })
        .await;
    check_once_per_message(&got, &acked);
    assert!(server.metric("im_webhook_failed_total", &[("endpoint", "push")]) > 0.0);
    assert!(
        server.metric("im_webhook_delivered_total", &[("endpoint", "push")]) >= acked.len() as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_queued_at_a_sigkill_are_delivered_after_restart() {
    let mut rx = Receiver::start(HOOK_SECRET).await;
    rx.down();
    let mut server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &["message.created", "message.offline"],
            "retry_base_ms = 100\nretry_max_ms = 500",
        ),
        &[],
    );
    let mut alice = server.raw("alice").await;
    let ids = send_n(&mut alice, "bob", 50, "k").await;
    // The expander has stored every event (50 created, 1+1 offline) before the kill.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = server.admin_get("/admin/v1/webhooks");
        let v: serde_json::Value = serde_json::from_str(&body).expect("webhooks JSON");
        if v["outbox_pending"] == 0 && v["outbox_events"].as_u64().unwrap_or(0) >= 51 {
            break;
        }
        assert!(Instant::now() < deadline, "events not stored: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(alice);
    server.kill();
    rx.up().await;
    server.restart();
    let got = rx
        .wait_until(WAIT, "the 50 events after the restart", |g| {
            of_kind(g, "message.created").len() >= 50 && !of_kind(g, "message.offline").is_empty()
        })
        .await;
    let created: Vec<Received> = got
        .iter()
        .filter(|r| r.json()["kind"] == "message.created")
        .cloned()
        .collect();
    check_once_per_message(&created, &ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_does_not_hold_messages_back() {
    let rx = Receiver::start(HOOK_SECRET).await;
    rx.set_reply(Reply {
        delay: Duration::from_secs(10),
        ..Reply::default()
    });
    let server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &["message.created"],
            "concurrency = 2\ntimeout_ms = 20000",
        ),
        &[],
    );
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    // 200 messages while the receiver takes 10 s per event: all acked and delivered.
    let ids = send_n(&mut alice, "bob", 200, "s").await;
    let mut delivered = HashSet::new();
    while delivered.len() < ids.len() {
        let f = next_chat_frame(&mut bob).await;
        if let Some(im_client::proto::Body::Deliver(d)) = f.body {
            for m in d.messages {
                delivered.insert(m.msg_id);
            }
        }
    }
    assert_eq!(delivered, ids.iter().cloned().collect());
    // Meanwhile the events wait in the outbox (counted each second), and the receiver
    // has had at most 2 requests at once.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = server.admin_get("/admin/v1/webhooks");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["endpoints"][0]["queued"].as_u64().unwrap_or(0) > 150 {
            break;
        }
        assert!(Instant::now() < deadline, "events not queued: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(rx.received().len() <= 2, "{} requests", rx.received().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_events_park_and_redeliver_through_the_admin_api() {
    let rx = Receiver::start(HOOK_SECRET).await;
    rx.set_reply(Reply {
        status: 500,
        body: "{\"error\":\"down\\nfor maintenance\"}".into(),
        ..Reply::default()
    });
    let server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &["message.created"],
            "max_age_secs = 1\nretry_base_ms = 100\nretry_max_ms = 300",
        ),
        &[],
    );
    let mut alice = server.raw("alice").await;
    let ids = send_n(&mut alice, "bob", 2, "p").await;
    let deadline = Instant::now() + WAIT;
    let parked = loop {
        let (status, body) = server.admin_get("/admin/v1/webhooks/parked?endpoint=push");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["events"].as_array().map_or(0, Vec::len) == 2 {
            break v;
        }
        assert!(Instant::now() < deadline, "not parked: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let error = parked["events"][0]["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("HTTP 500") && !error.contains('\n'),
        "{error}"
    );
    assert_eq!(
        server.metric("im_webhook_parked_total", &[("endpoint", "push")]),
        2.0
    );
    let first_ids: HashSet<String> = rx
        .received()
        .iter()
        .filter_map(|r| r.event_id.clone())
        .collect();
    assert_eq!(first_ids.len(), 2);

    // The test-fire reports the endpoint's answer.
    let (status, body) = server.admin_json("POST", "/admin/v1/webhooks/push/test", "");
    assert_eq!(status, 200, "{body}");
    let fired: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(fired["status"], 500, "{body}");
    let (status, _) = server.admin_json("POST", "/admin/v1/webhooks/nope/test", "");
    assert_eq!(status, 404);
    let (status, body) = server.admin_json(
        "POST",
        "/admin/v1/webhooks/parked/redeliver",
        "{\"endpont\":\"push\"}",
    );
    assert_eq!(status, 400, "a misspelt field is refused: {body}");

    rx.set_reply(Reply::default());
    let before = rx.received().len();
    let (status, body) = server.admin_json(
        "POST",
        "/admin/v1/webhooks/parked/redeliver",
        "{\"endpoint\":\"push\"}",
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"queued\":2"), "{body}");
    let got = rx
        .wait_until(WAIT, "both redelivered", |g| g.len() >= before + 2)
        .await;
    // The redelivered events carry their first ids.
    for r in &got[before..] {
        assert!(
            first_ids.contains(r.event_id.as_deref().unwrap()),
            "a new id on redelivery"
        );
        let msg = r.json()["message"]["msg_id"].as_str().unwrap().to_owned();
        assert!(ids.contains(&msg));
    }
    let (_, body) = server.admin_get("/admin/v1/webhooks/parked");
    assert!(body.contains("\"events\":[]"), "{body}");
    let (_, body) = server.admin_get("/admin/v1/webhooks");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["endpoints"][0]["name"], "push");
    assert!(v["endpoints"][0]["failed"].as_u64().unwrap() >= 2, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_queued_events_are_delivered_by_another() {
    let mut rx = Receiver::start(HOOK_SECRET).await;
    rx.down();
    let c = cluster::TestCluster::start_with_config(
        2,
        &config(
            &rx.url("/hook"),
            &["message.created"],
            "retry_base_ms = 100\nretry_max_ms = 500\ntimeout_ms = 1000",
        ),
        &[],
    )
    .await;
    let mut c = c;
    let mut alice = c.nodes[0].raw("alice").await;
    let ids = send_n(&mut alice, "bob", 40, "c").await;
    // Both nodes expand and send; the events are stored before node 0 dies.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = c.nodes[0].admin_get("/admin/v1/webhooks");
        let v: serde_json::Value = serde_json::from_str(&body).expect("webhooks JSON");
        if v["outbox_pending"] == 0 && v["outbox_events"].as_u64().unwrap_or(0) >= 40 {
            break;
        }
        assert!(Instant::now() < deadline, "events not stored: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(alice);
    c.nodes[0].kill();
    rx.up().await;
    let got = rx
        .wait_until(Duration::from_secs(60), "the 40 events from node 1", |g| {
            let seen: HashSet<String> = g
                .iter()
                .filter_map(|r| r.json()["message"]["msg_id"].as_str().map(str::to_owned))
                .collect();
            ids.iter().all(|m| seen.contains(m))
        })
        .await;
    check_once_per_message(&got, &ids);
    assert!(
        c.nodes[1].metric("im_webhook_delivered_total", &[("endpoint", "push")]) >= 40.0,
        "node 1 delivered them"
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_recalls_group_changes_and_presence_make_their_events() {
    use im_client::proto::{self, Body};
    let rx = Receiver::start(HOOK_SECRET).await;
    let server = TestServer::start_with_config(
        &config(
            &rx.url("/hook"),
            &[
                "message.edited",
                "message.recalled",
                "group.changed",
                "user.online",
                "user.offline",
                "message.offline",
            ],
            "offline_window_ms = 0",
        ),
        &[],
    );
    let mut alice = server.raw("alice").await;
    create_group(&mut alice, "club", vec!["carol".into()]).await;
    let conv = "u:alice:bob";
    let sent = send_n(&mut alice, "bob", 2, "x").await;
    let edited = request(
        &mut alice,
        50,
        Body::Edit(proto::Edit {
            conversation_id: conv.into(),
            seq: 1,
            msg_id: String::new(),
            payload: b"changed".to_vec().into(),
            client_msg_id: "e1".into(),
        }),
    )
    .await;
    assert!(matches!(edited, Body::SendAck(_)), "{edited:?}");
    let recalled = request(
        &mut alice,
        51,
        Body::Recall(proto::Recall {
            conversation_id: conv.into(),
            seq: 2,
            msg_id: sent[1].clone(),
            client_msg_id: "r1".into(),
        }),
    )
    .await;
    assert!(matches!(recalled, Body::SendAck(_)), "{recalled:?}");
    drop(alice);
    let got = rx
        .wait_until(WAIT, "every kind", |g| {
            [
                "message.edited",
                "message.recalled",
                "group.changed",
                "user.online",
                "user.offline",
            ]
            .iter()
            .all(|k| !of_kind(g, k).is_empty())
                && of_kind(g, "message.offline").len() >= 2
        })
        .await;
    all_signed(&got);
    let e = &of_kind(&got, "message.edited")[0];
    assert_eq!(e["message"]["ref_msg_id"], sent[0].as_str());
    assert_eq!(e["message"]["msg_type"], "edit");
    let r = &of_kind(&got, "message.recalled")[0];
    assert_eq!(r["message"]["ref_msg_id"], sent[1].as_str());
    let g = &of_kind(&got, "group.changed")[0];
    assert_eq!(g["message"]["conversation_id"], "g:club");
    assert_eq!(g["message"]["msg_type"], "system");
    let online = &of_kind(&got, "user.online")[0];
    assert_eq!(online["user_id"], "alice");
    let offline = &of_kind(&got, "user.offline")[0];
    assert_eq!(offline["user_id"], "alice");
    // Pushes are for TEXT, IMAGE and FILE only: the two sends, not the edit or recall,
    // and with the window off each fires (bob, offline, twice; carol never: the group
    // had no message).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pushes = of_kind(&rx.received(), "message.offline");
    assert_eq!(pushes.len(), 2, "{pushes:?}");
    assert!(pushes.iter().all(|p| p["user_id"] == "bob"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_endpoint_gets_events_when_its_ca_is_trusted() {
    if !tls::openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = tls::Pki::new(&tmp.path().join("pki"));
    let (cert, key) = pki.issue("receiver");
    let rx = Receiver::start_tls(HOOK_SECRET, &cert, &key).await;
    let url = rx.url("/hook");
    assert!(url.starts_with("https://"), "{url}");
    // Trusting the test CA through webhooks.ca_file: events arrive signed, over TLS.
    let ca_line = format!("ca_file = \"{}\"", pki.ca.display());
    let server = TestServer::start_with_config(&config(&url, &["message.created"], &ca_line), &[]);
    let mut alice = server.raw("alice").await;
    let ids = send_n(&mut alice, "bob", 3, "t").await;
    let got = rx
        .wait_until(WAIT, "3 message.created over https", |g| {
            of_kind(g, "message.created").len() >= 3
        })
        .await;
    all_signed(&got);
    let sent: HashSet<String> = of_kind(&got, "message.created")
        .iter()
        .filter_map(|e| e["message"]["msg_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(sent, ids.iter().cloned().collect());
    let (status, body) = server.admin_json("POST", "/admin/v1/webhooks/push/test", "");
    assert_eq!(status, 200, "{body}");
    let fired: serde_json::Value = serde_json::from_str(&body).expect("test-fire JSON");
    assert_eq!(fired["status"], 200, "{body}");
    drop(server);

    // Without the CA the receiver's certificate is refused: no answer, nothing received.
    let before = rx.received().len();
    let server = TestServer::start_with_config(&config(&url, &["message.created"], ""), &[]);
    let (status, body) = server.admin_json("POST", "/admin/v1/webhooks/push/test", "");
    assert_eq!(status, 200, "{body}");
    let fired: serde_json::Value = serde_json::from_str(&body).expect("test-fire JSON");
    assert_eq!(fired["status"], 0, "{body}");
    assert!(
        !fired["error"].as_str().unwrap_or_default().is_empty(),
        "{body}"
    );
    assert_eq!(
        rx.received().len(),
        before,
        "an untrusted TLS peer got a request"
    );

    // A ca_file that is not a certificate stops the start, naming the key.
    let bad = tmp.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").expect("write");
    let cfg = config(
        &url,
        &["message.created"],
        &format!("ca_file = \"{}\"", bad.display()),
    );
    let file = tmp.path().join("bad-ca.toml");
    std::fs::write(&file, cfg).expect("write config");
    let mut child = std::process::Command::new(server_bin())
        .arg("--config")
        .arg(&file)
        .env("IM_DATA_DIR", tmp.path().join("data"))
        .env("IM_LISTEN", "127.0.0.1:0")
        .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
        .env("IM_JWT_SECRET", SECRET)
        .env("IM_ADMIN_TOKEN", ADMIN_TOKEN)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run im-server");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with a bad webhooks.ca_file");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(err.contains("webhooks.ca_file"), "{err}");
}
