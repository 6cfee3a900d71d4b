//! One-to-one chat and idempotent sends.

use bytes::Bytes;
use im_client::proto::{Body, MessageType};
use im_client::Target;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_chat_both_ways() {
    let server = TestServer::start();
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;

    let ack = alice.send_text("bob", "hi bob").await.expect("alice send");
    assert_eq!(ack.conversation_id, "u:alice:bob");
    assert_eq!(ack.seq, 1);
    assert!(!ack.duplicate);
    let got = bob.next_message(WAIT).await.expect("bob receives");
    assert_eq!(got.sender, "alice");
    assert_eq!(&got.payload[..], b"hi bob");
    assert_eq!(got.seq, 1);
    assert_eq!(got.msg_id, ack.msg_id);

    let ack = bob
        .send(
            Target::User("alice".into()),
            MessageType::Image,
            Bytes::from_static(b"\x89PNG..."),
            Some("bob-1".into()),
        )
        .await
        .expect("bob send");
    assert_eq!(ack.conversation_id, "u:alice:bob");
    assert_eq!(ack.seq, 2);
    let got = alice.next_message(WAIT).await.expect("alice receives");
    assert_eq!(got.sender, "bob");
    assert_eq!(got.r#type, MessageType::Image as i32);
    assert_eq!(got.client_msg_id, "bob-1");
    assert_eq!(got.seq, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_client_msg_id_is_stored_and_delivered_once() {
    let server = TestServer::start();
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;

    alice
        .send(&send_to_user(10, "bob", b"once", "m-1"))
        .await
        .unwrap();
    alice
        .send(&send_to_user(11, "bob", b"once", "m-1"))
        .await
        .unwrap();
    let mut acks = Vec::new();
    while acks.len() < 2 {
        let f = next_frame(&mut alice).await;
        if let Some(Body::SendAck(a)) = f.body {
            acks.push((f.req_id, a));
        }
    }
    acks.sort_by_key(|(r, _)| *r);
    let (first, second) = (&acks[0].1, &acks[1].1);
    assert!(!first.duplicate, "{first:?}");
    assert!(second.duplicate, "{second:?}");
    assert_eq!(first.msg_id, second.msg_id);
    assert_eq!(first.seq, second.seq);

    // A later resend (new batch) is a duplicate too.
    alice
        .send(&send_to_user(12, "bob", b"once", "m-1"))
        .await
        .unwrap();
    let f = next_frame(&mut alice).await;
    let Some(Body::SendAck(third)) = f.body else {
        panic!("{f:?}")
    };
    assert!(third.duplicate);
    assert_eq!(third.msg_id, first.msg_id);

    // Bob got it live exactly once, and the store holds it once.
    let f = next_frame(&mut bob).await;
    let Some(Body::Deliver(d)) = f.body else {
        panic!("{f:?}")
    };
    assert_eq!(d.messages.len(), 1);
    // A duplicate is never pushed again; its recipients get at most a sync hint (the
    // first commit's push is lost when its node could not know the commit went through).
    let mut hints = 0;
    while let Ok(ev) = bob
        .recv_timeout(std::time::Duration::from_millis(500))
        .await
    {
        let im_client::RawEvent::Frame(f) = ev else {
            panic!("bob's connection ended: {ev:?}")
        };
        match f.body {
            Some(Body::SyncResp(r)) if f.req_id == 0 && r.messages.is_empty() && r.more => {
                hints += 1
            }
            other => panic!("a duplicate was delivered: {other:?}"),
        }
    }
    assert!(hints <= 1, "one outstanding sync hint at most, got {hints}");
    let synced = raw_sync_all(&mut bob, 100).await;
    assert_eq!(synced.len(), 1, "{synced:?}");
    assert_eq!(synced[0].msg_id, first.msg_id);
}

/// `GET /v1/route` answers a browser of any origin (the web chat is served elsewhere):
/// every answer, a refusal too, carries `Access-Control-Allow-Origin: *`.
#[test]
fn route_answers_any_origin() {
    let server = TestServer::start();
    let (status, head, body) = http_bytes(server.client_addr, "GET", "/v1/route", None, b"");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("access-control-allow-origin: *"),
        "{head}"
    );
    assert!(body.contains(&server.client_addr.to_string()), "{body}");
    let (status, head, _) = http_bytes(
        server.client_addr,
        "GET",
        "/v1/route?avoid=a&avoid=b",
        None,
        b"",
    );
    assert_eq!(status, 400);
    assert!(
        head.to_ascii_lowercase()
            .contains("access-control-allow-origin: *"),
        "{head}"
    );
}
