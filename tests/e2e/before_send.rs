//! The before-send hook against the real binary and a real HTTP receiver that verifies
//! every signature: allow (delivered, the request carries the message), reject (the
//! sender gets REJECTED_BY_HOOK with the hook's reason, nothing is stored), replace (the
//! recipient and the history get the new payload), a timeout with `fail_open`
//! (delivered) and with `fail_closed` (refused OVERLOADED, saying why), and the circuit
//! breaker: it opens after the configured failures (the hook is no longer called, the
//! metric and the overview say open) and closes after the receiver recovers.

use std::time::Duration;

use im_admin_api::Overview;
use im_client::proto::{self, Body, ErrorCode};
use im_client::RawConn;

use crate::obs::promtool_check;
use crate::support::receiver::{Receiver, Reply};
use crate::support::*;

const HOOK_SECRET: &str = "before-send-hook-secret-of-32-bytes-at-least";

/// A node whose before-send hook is `receiver`, with extra `IM_HOOKS_BEFORE_SEND_*` settings.
fn node_with_hook(receiver: &Receiver, extra: &[(&str, &str)]) -> TestServer {
    let url = receiver.url("/before-send");
    let mut env = vec![
        ("IM_HOOKS_BEFORE_SEND_URL", url.as_str()),
        ("IM_HOOKS_BEFORE_SEND_SECRET", HOOK_SECRET),
    ];
    env.extend_from_slice(extra);
    TestServer::start_with(&env)
}

fn answer(body: &str) -> Reply {
    Reply {
        body: body.into(),
        ..Reply::default()
    }
}

/// Sends `f` and returns the reply to its req_id (a SendAck or an Error).
async fn send_reply(c: &mut RawConn, f: proto::Frame) -> Body {
    let req_id = f.req_id;
    c.send(&f).await.unwrap();
    loop {
        let got = next_frame(c).await;
        if got.req_id == req_id {
            if let Some(b @ (Body::SendAck(_) | Body::Error(_))) = got.body {
                return b;
            }
        }
    }
}

fn overview(server: &TestServer) -> Overview {
    let (status, body) = server.admin_get("/admin/v1/overview");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("overview JSON")
}

fn hook_metric(server: &TestServer, name: &str, outcome: Option<&str>) -> f64 {
    let mut labels = vec![("hook", "before_send")];
    if let Some(o) = outcome {
        labels.push(("outcome", o));
    }
    server.metric(name, &labels)
}

#[tokio::test]
async fn allow_reject_and_replace() {
    let receiver = Receiver::start(HOOK_SECRET).await;
    let server = node_with_hook(&receiver, &[("IM_OBS_TRACE_SAMPLE_RATE", "1")]);
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;

    // Allow: stored and delivered as sent; the hook saw the message, signed.
    receiver.set_reply(answer(r#"{"action":"allow"}"#));
    let Body::SendAck(ack) =
        send_reply(&mut alice, send_to_user(10, "bob", b"hello bob", "c1")).await
    else {
        panic!("allow: expected a SendAck");
    };
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].signature_ok, "the server's signature verifies");
    assert_eq!(got[0].path, "/before-send");
    assert_eq!(got[0].event_id.as_deref(), Some(ack.msg_id.as_str()));
    let req = got[0].json();
    assert_eq!(req["sender"], "alice");
    assert_eq!(req["to_user"], "bob");
    assert_eq!(req["type"], "text");
    assert_eq!(req["text"], "hello bob");
    assert_eq!(req["client_msg_id"], "c1");
    assert_eq!(req["msg_id"], ack.msg_id.as_str());
    assert_eq!(req["conversation_id"], "u:alice:bob");
    let pushed = next_chat_frame(&mut bob).await;
    let Some(Body::Deliver(d)) = pushed.body else {
        panic!("expected the push, got {pushed:?}");
    };
    assert_eq!(&d.messages[0].payload[..], b"hello bob");
    // The hook's call is a stage of the message's trace, between relation and persist.
    let path = format!("/admin/v1/messages/{}/trace", ack.msg_id);
    eventually("the traced message's before_send stage", || {
        let (status, body) = server.admin_get(&path);
        status == 200
            && serde_json::from_str::<im_admin_api::MessageTrace>(&body)
                .is_ok_and(|t| t.stages.iter().any(|s| s.stage == "before_send"))
    })
    .await;

    // Reject: the sender gets the code and the hook's reason; nothing is stored.
    receiver.set_reply(answer(
        r#"{"action":"reject","reason":"links to that site are not allowed"}"#,
    ));
    let Body::Error(e) = send_reply(&mut alice, send_to_user(11, "bob", b"bad link", "c2")).await
    else {
        panic!("reject: expected an Error");
    };
    assert_eq!(e.code, ErrorCode::RejectedByHook as i32, "{e:?}");
    assert!(
        e.message.contains("links to that site are not allowed"),
        "{e:?}"
    );

    // Replace: what is stored and delivered is the hook's payload.
    receiver.set_reply(answer(r#"{"action":"replace","text":"hello [redacted]"}"#));
    let Body::SendAck(_) =
        send_reply(&mut alice, send_to_user(12, "bob", b"hello secret", "c3")).await
    else {
        panic!("replace: expected a SendAck");
    };
    let pushed = next_chat_frame(&mut bob).await;
    let Some(Body::Deliver(d)) = pushed.body else {
        panic!("expected the push, got {pushed:?}");
    };
    assert_eq!(&d.messages[0].payload[..], b"hello [redacted]");

    // The history holds the allowed and the replaced message, not the rejected one.
    let mut late = server.raw("bob").await;
    let history: Vec<Vec<u8>> = chat_only(raw_sync_all(&mut late, 100).await)
        .into_iter()
        .map(|m| m.payload.to_vec())
        .collect();
    assert_eq!(
        history,
        vec![b"hello bob".to_vec(), b"hello [redacted]".to_vec()]
    );
    assert_eq!(hook_metric(&server, "im_hook_calls_total", None), 3.0);
    // The rejected Send was never accepted into the pipeline.
    assert_eq!(
        server.metric("im_messages_received_total", &[("type", "text")]),
        2.0
    );
    for outcome in ["allow", "reject", "replace"] {
        assert_eq!(
            hook_metric(&server, "im_hook_outcomes_total", Some(outcome)),
            1.0,
            "{outcome}"
        );
    }
    // A group message names its group, not a recipient.
    receiver.set_reply(answer(r#"{"action":"allow"}"#));
    create_group(&mut alice, "team", vec!["bob".into()]).await;
    let Body::SendAck(_) =
        send_reply(&mut alice, send_to_group(13, "team", b"hi team", "c4")).await
    else {
        panic!("group allow: expected a SendAck");
    };
    let req = receiver
        .received()
        .last()
        .expect("the group Send's request")
        .json();
    assert_eq!(req["group_id"], "team");
    assert_eq!(req["conversation_id"], "g:team");
    assert!(req.get("to_user").is_none(), "{req}");

    let scrape = server.metrics();
    assert!(
        metric_value(
            &scrape,
            "im_stage_duration_seconds_count",
            &[("stage", "before_send")]
        ) >= 3.0
    );
    promtool_check(&scrape);
}

#[tokio::test]
async fn a_timeout_fails_open_or_closed_as_configured() {
    let receiver = Receiver::start(HOOK_SECRET).await;
    receiver.set_reply(Reply {
        body: r#"{"action":"reject","reason":"too late to count"}"#.into(),
        delay: Duration::from_millis(600),
        ..Reply::default()
    });

    // fail_open: delivered unchecked after the timeout.
    let open = node_with_hook(&receiver, &[("IM_HOOKS_BEFORE_SEND_TIMEOUT_MS", "100")]);
    let mut alice = open.raw("alice").await;
    let mut bob = open.raw("bob").await;
    let Body::SendAck(_) = send_reply(&mut alice, send_to_user(10, "bob", b"hi", "o1")).await
    else {
        panic!("fail_open: expected a SendAck");
    };
    let pushed = next_chat_frame(&mut bob).await;
    assert!(matches!(pushed.body, Some(Body::Deliver(_))), "{pushed:?}");
    assert_eq!(
        hook_metric(&open, "im_hook_outcomes_total", Some("timeout")),
        1.0
    );

    // fail_closed: refused with a retry hint and a message that says why.
    let closed = node_with_hook(
        &receiver,
        &[
            ("IM_HOOKS_BEFORE_SEND_TIMEOUT_MS", "100"),
            ("IM_HOOKS_BEFORE_SEND_ON_ERROR", "fail_closed"),
        ],
    );
    let mut alice = closed.raw("alice").await;
    let Body::Error(e) = send_reply(&mut alice, send_to_user(10, "bob", b"hi", "f1")).await else {
        panic!("fail_closed: expected an Error");
    };
    assert_eq!(e.code, ErrorCode::Overloaded as i32, "{e:?}");
    assert!(e.retry_after_ms > 0, "{e:?}");
    assert!(
        e.message.contains("before-send hook") && e.message.contains("timeout"),
        "{e:?}"
    );
    let mut bob = closed.raw("bob").await;
    assert!(chat_only(raw_sync_all(&mut bob, 100).await).is_empty());
}

#[tokio::test]
async fn the_breaker_opens_on_failures_and_closes_after_recovery() {
    let mut receiver = Receiver::start(HOOK_SECRET).await;
    receiver.set_reply(Reply {
        status: 500,
        body: "{}".into(),
        ..Reply::default()
    });
    let server = node_with_hook(
        &receiver,
        &[
            ("IM_HOOKS_BEFORE_SEND_BREAKER_FAILURES", "3"),
            ("IM_HOOKS_BEFORE_SEND_BREAKER_COOLDOWN_MS", "1000"),
        ],
    );
    let mut alice = server.raw("alice").await;
    assert_eq!(overview(&server).hooks[0].breaker, "closed");

    // Three failures (fail_open: each Send is still delivered) open the breaker.
    for i in 0..3u64 {
        let cmid = format!("a{i}");
        let Body::SendAck(_) =
            send_reply(&mut alice, send_to_user(10 + i, "bob", b"x", &cmid)).await
        else {
            panic!("fail_open: expected a SendAck");
        };
    }
    assert_eq!(receiver.received().len(), 3);
    assert_eq!(hook_metric(&server, "im_hook_breaker_state", None), 2.0);
    assert_eq!(
        hook_metric(&server, "im_hook_breaker_opened_total", None),
        1.0
    );
    let status = overview(&server).hooks.remove(0);
    assert_eq!(status.breaker, "open");
    assert_eq!(status.breaker_opened_total, 1);

    // Open: the hook is not called, the Sends go through unchecked and are counted.
    receiver.down();
    for i in 3..6u64 {
        let cmid = format!("a{i}");
        let Body::SendAck(_) =
            send_reply(&mut alice, send_to_user(10 + i, "bob", b"x", &cmid)).await
        else {
            panic!("open breaker, fail_open: expected a SendAck");
        };
    }
    assert_eq!(
        hook_metric(&server, "im_hook_outcomes_total", Some("breaker_open")),
        3.0
    );
    eventually("the breaker-opened log line", || {
        server.log().contains("before-send hook breaker opened")
    })
    .await;

    // The receiver recovers; after the cool-down one probe call closes the breaker.
    receiver.up().await;
    receiver.set_reply(answer(r#"{"action":"allow"}"#));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(overview(&server).hooks[0].breaker, "half_open");
    let Body::SendAck(_) = send_reply(&mut alice, send_to_user(20, "bob", b"y", "p1")).await else {
        panic!("probe: expected a SendAck");
    };
    assert_eq!(
        receiver.received().len(),
        4,
        "the probe call reached the hook"
    );
    assert_eq!(hook_metric(&server, "im_hook_breaker_state", None), 0.0);
    assert_eq!(overview(&server).hooks[0].breaker, "closed");
    let Body::SendAck(_) = send_reply(&mut alice, send_to_user(21, "bob", b"z", "p2")).await else {
        panic!("closed again: expected a SendAck");
    };
    assert_eq!(
        receiver.received().len(),
        5,
        "closed: every Send is asked again"
    );
    eventually("the breaker-closed log line", || {
        server.log().contains("before-send hook breaker closed")
    })
    .await;
}
