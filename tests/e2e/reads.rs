//! Devices and read state: per-device cursors and sync, a send from one device reaching
//! the user's others, MarkRead (forward only) and read receipts (one-to-one, small
//! groups per member, large groups counted, across nodes), the conversation list
//! (order, unread counts, flags, paging).

use std::collections::HashSet;
use std::time::Duration;

use im_client::proto::{self, frame, Body, ConversationSummary, ErrorCode};
use im_client::{Event, RawConn};

use crate::support::cluster::TestCluster;
use crate::support::*;

/// A raw connection of `user` logged in as `device`.
async fn device(s: &TestServer, user: &str, device: &str) -> RawConn {
    let mut c = RawConn::connect(&s.ws_url()).await.expect("connect");
    c.login(&s.token(user), device, false).await.expect("login");
    c
}

fn mark_read(conv: &str, seq: u64) -> Body {
    Body::MarkRead(proto::MarkRead {
        conversation_id: conv.into(),
        seq,
    })
}

/// MarkRead as request `req_id`; panics unless answered Done.
async fn mark_read_ok(c: &mut RawConn, req_id: u64, conv: &str, seq: u64) {
    let body = request(c, req_id, mark_read(conv, seq)).await;
    assert!(
        matches!(body, Body::Done(_)),
        "MarkRead {conv} {seq}: {body:?}"
    );
}

/// Every conversation of the connection's user, paging `limit` at a time.
async fn list_all(c: &mut RawConn, limit: u32) -> Vec<ConversationSummary> {
    let mut all = Vec::new();
    let mut after = String::new();
    for req_id in 7_000_000.. {
        let body = request(
            c,
            req_id,
            Body::ListConversations(proto::ListConversations {
                after: after.clone(),
                limit,
            }),
        )
        .await;
        let Body::ConversationList(page) = body else {
            panic!("expected ConversationList, got {body:?}")
        };
        assert!(page.conversations.len() <= limit.max(1) as usize);
        all.extend(page.conversations);
        if page.next_after.is_empty() {
            break;
        }
        after = page.next_after;
    }
    all
}

fn entry<'a>(list: &'a [ConversationSummary], conv: &str) -> &'a ConversationSummary {
    list.iter()
        .find(|c| c.conversation_id == conv)
        .unwrap_or_else(|| panic!("{conv} not listed in {list:?}"))
}

/// The next ReadReceipt on a raw connection (other frames skipped).
async fn next_receipt(c: &mut RawConn) -> proto::ReadReceipt {
    loop {
        if let Some(Body::ReadReceipt(r)) = next_frame(c).await.body {
            return r;
        }
    }
}

async fn sync_empty_cursors(c: &mut RawConn, req_id: u64) -> proto::SyncResponse {
    match request(
        c,
        req_id,
        Body::Sync(proto::SyncRequest {
            cursors: Vec::new(),
            limit: 100,
            ..Default::default()
        }),
    )
    .await
    {
        Body::SyncResp(r) => r,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_of_one_user_sync_independently() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    for i in 0..3 {
        alice
            .send(&send_to_user(10 + i, "bob", b"hi", &format!("a-{i}")))
            .await
            .unwrap();
    }
    acks(&mut alice, 3).await;
    let conv = proto::direct_conversation("alice", "bob");
    let mut phone = device(&s, "bob", "phone").await;
    let mut laptop = device(&s, "bob", "laptop").await;

    let got = raw_sync_all(&mut phone, 100).await;
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), [1, 2, 3]);
    phone
        .send(&frame(
            20,
            Body::DeliverAck(proto::DeliverAck {
                conversation_id: conv.clone(),
                seq: 3,
            }),
        ))
        .await
        .unwrap();
    // The user's cursor (the furthest of their devices) follows the phone's ack.
    s.wait_cursor("bob", &conv, 3).await;
    let after_ack = sync_empty_cursors(&mut phone, 21).await;
    assert!(after_ack.messages.is_empty(), "{after_ack:?}");
    // The laptop acked nothing: it still gets everything by sync.
    let got = raw_sync_all(&mut laptop, 100).await;
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), [1, 2, 3]);
    // An old client (no device id) is the default device, with cursors of its own.
    let mut old = device(&s, "bob", "").await;
    assert_eq!(raw_sync_all(&mut old, 100).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_from_one_device_reaches_the_others_and_counts_as_read() {
    let s = TestServer::start();
    let mut phone = device(&s, "alice", "phone").await;
    let mut laptop = device(&s, "alice", "laptop").await;
    let mut bob = s.raw("bob").await;
    let conv = proto::direct_conversation("alice", "bob");

    phone
        .send(&send_to_user(1, "bob", b"from the phone", "p-1"))
        .await
        .unwrap();
    let ack = acks(&mut phone, 1).await.remove(0).1;
    let f = next_frame(&mut laptop).await;
    let Some(Body::Deliver(d)) = f.body else {
        panic!("{f:?}")
    };
    assert_eq!(
        (d.messages[0].seq, d.messages[0].sender.as_str()),
        (ack.seq, "alice")
    );
    assert!(matches!(
        next_frame(&mut bob).await.body,
        Some(Body::Deliver(_))
    ));
    // The sending connection got the SendAck, not the push.
    let before = frames_before_pong(&mut phone, 2).await;
    assert!(
        !before
            .iter()
            .any(|f| matches!(f.body, Some(Body::Deliver(_)))),
        "{before:?}"
    );

    // A group message too, to the other device by push and by sync.
    create_group(&mut phone, "team", vec!["bob".into()]).await;
    phone
        .send(&send_to_group(3, "team", b"to the team", "p-2"))
        .await
        .unwrap();
    let gack = acks(&mut phone, 1).await.remove(0).1;
    loop {
        let f = next_chat_frame(&mut laptop).await;
        if let Some(Body::Deliver(d)) = f.body {
            if d.messages.iter().any(|m| m.msg_id == gack.msg_id) {
                break;
            }
        }
    }
    let mut tablet = device(&s, "alice", "tablet").await;
    let synced = chat_only(raw_sync_all(&mut tablet, 100).await);
    let ids: HashSet<&str> = synced.iter().map(|m| m.msg_id.as_str()).collect();
    assert!(ids.contains(ack.msg_id.as_str()) && ids.contains(gack.msg_id.as_str()));

    // Her own messages are read for her, unread for bob.
    let list = list_all(&mut laptop, 50).await;
    let direct = entry(&list, &conv);
    assert_eq!((direct.unread, direct.read_seq), (0, ack.seq), "{direct:?}");
    let group = entry(&list, "g:team");
    assert_eq!((group.unread, group.read_seq), (0, gack.seq), "{group:?}");
    let list = list_all(&mut bob, 50).await;
    assert_eq!(entry(&list, &conv).unread, 1);
    assert_eq!(entry(&list, &conv).peer_read_seq, ack.seq);
    assert_eq!(entry(&list, "g:team").unread, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_read_is_forward_only_and_sends_one_to_one_receipts() {
    let s = TestServer::start();
    let alice = s.client("alice").await;
    let mut bob = device(&s, "bob", "phone").await;
    let mut bob2 = device(&s, "bob", "laptop").await;
    let conv = proto::direct_conversation("alice", "bob");
    for i in 0..3 {
        alice.send_text("bob", format!("m{i}")).await.unwrap();
    }

    mark_read_ok(&mut bob, 5, &conv, 2).await;
    // The other party (SDK event) and the reader's other device get the receipt.
    let receipt = loop {
        match tokio::time::timeout(WAIT, alice.next_event()).await {
            Ok(Some(Event::ReadReceipt(r))) => break r,
            Ok(Some(_)) => {}
            other => panic!("no receipt: {other:?}"),
        }
    };
    assert_eq!(
        (
            receipt.conversation_id.as_str(),
            receipt.user_id.as_str(),
            receipt.seq
        ),
        (conv.as_str(), "bob", 2)
    );
    assert!(receipt.read_time > 0);
    let r2 = next_receipt(&mut bob2).await;
    assert_eq!((r2.user_id.as_str(), r2.seq), ("bob", 2));
    // Not the connection that marked it.
    let before = frames_before_pong(&mut bob, 6).await;
    assert!(
        !before
            .iter()
            .any(|f| matches!(f.body, Some(Body::ReadReceipt(_)))),
        "{before:?}"
    );

    // Backwards is a no-op (Done, no receipt, the cursor stays).
    mark_read_ok(&mut bob, 7, &conv, 1).await;
    let list = list_all(&mut bob, 10).await;
    assert_eq!(
        (entry(&list, &conv).read_seq, entry(&list, &conv).unread),
        (2, 1)
    );
    assert_eq!(s.store_device_read("bob", "phone", &conv).await, 2);
    assert_eq!(s.store_device_read("bob", "laptop", &conv).await, 0);
    // The SDK sees bob's cursor as the peer's.
    let page = alice.list_conversations("", 0).await.unwrap();
    assert_eq!(page.conversations[0].peer_read_seq, 2);
    assert_eq!(page.conversations[0].unread, 0);

    // Refusals: past the last seq, seq 0, a conversation of others, a bad id.
    for (req_id, conv, seq, code) in [
        (8, conv.as_str(), 4, ErrorCode::BadFrame),
        (9, conv.as_str(), 0, ErrorCode::BadFrame),
        (10, "u:alice:carol", 1, ErrorCode::NotMember),
        (11, "g:nope", 1, ErrorCode::NotMember),
        (12, "x", 1, ErrorCode::BadFrame),
    ] {
        match request(&mut bob, req_id, mark_read(conv, seq)).await {
            Body::Error(e) => assert_eq!(e.code, code as i32, "{conv} {seq}: {e:?}"),
            other => panic!("{conv} {seq}: {other:?}"),
        }
    }
    // The SDK's mark_read (of bob's answer: her own messages are read already).
    bob.send(&send_to_user(13, "alice", b"answer", "b-1"))
        .await
        .unwrap();
    let answer = acks(&mut bob, 1).await.remove(0).1.seq;
    alice.mark_read(&conv, answer).await.unwrap();
    let r = next_receipt(&mut bob2).await;
    assert_eq!((r.user_id.as_str(), r.seq), ("alice", answer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_groups_get_per_member_receipts() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let mut bob = s.raw("bob").await;
    let mut carol = s.raw("carol").await;
    create_group(&mut alice, "trio", vec!["bob".into(), "carol".into()]).await;
    alice
        .send(&send_to_group(3, "trio", b"hello", "a-1"))
        .await
        .unwrap();
    let seq = acks(&mut alice, 1).await.remove(0).1.seq;
    mark_read_ok(&mut bob, 4, "g:trio", seq).await;
    for c in [&mut alice, &mut carol] {
        let r = next_receipt(c).await;
        assert_eq!(
            (
                r.conversation_id.as_str(),
                r.user_id.as_str(),
                r.seq,
                r.read_count
            ),
            ("g:trio", "bob", seq, 0)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_groups_get_one_counted_receipt_for_the_sender() {
    let s = TestServer::start_with(&[
        ("IM_RECEIPTS_GROUP_MEMBER_MAX", "2"),
        ("IM_RECEIPTS_COALESCE_MS", "200"),
    ]);
    let mut alice = s.raw("alice").await;
    let mut bob = s.raw("bob").await;
    let mut carol = s.raw("carol").await;
    create_group(&mut alice, "big", vec!["bob".into(), "carol".into()]).await;
    alice
        .send(&send_to_group(3, "big", b"hello", "a-1"))
        .await
        .unwrap();
    let seq = acks(&mut alice, 1).await.remove(0).1.seq;
    mark_read_ok(&mut bob, 4, "g:big", seq).await;
    mark_read_ok(&mut carol, 4, "g:big", seq).await;
    // alice (the sender, who read it by sending) sees the count reach 3; every counted
    // receipt names nobody.
    loop {
        let r = next_receipt(&mut alice).await;
        assert_eq!((r.user_id.as_str(), r.seq), ("", seq), "{r:?}");
        assert!((2..=3).contains(&r.read_count), "{r:?}");
        if r.read_count == 3 {
            break;
        }
    }
    // The readers get no receipts.
    for c in [&mut bob, &mut carol] {
        let before = frames_before_pong(c, 50).await;
        assert!(
            !before
                .iter()
                .any(|f| matches!(f.body, Some(Body::ReadReceipt(_)))),
            "{before:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_orders_pinned_then_recent_and_counts_unread() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let mut bob = s.raw("bob").await;
    let mut carol = s.raw("carol").await;
    let ab = proto::direct_conversation("alice", "bob");
    let ac = proto::direct_conversation("alice", "carol");
    bob.send(&send_to_user(1, "alice", b"b1", "b-1"))
        .await
        .unwrap();
    bob.send(&send_to_user(2, "alice", b"b2", "b-2"))
        .await
        .unwrap();
    acks(&mut bob, 2).await;
    tokio::time::sleep(Duration::from_millis(5)).await; // distinct last_time (ms)
    carol
        .send(&send_to_user(1, "alice", &[b'x'; 1000], "c-1"))
        .await
        .unwrap();
    acks(&mut carol, 1).await;

    let list = list_all(&mut alice, 50).await;
    let order: Vec<&str> = list.iter().map(|c| c.conversation_id.as_str()).collect();
    assert_eq!(order, [ac.as_str(), ab.as_str()]);
    let c = entry(&list, &ac);
    assert_eq!(
        (c.name.as_str(), c.size, c.unread, c.last_seq),
        ("carol", 2, 1, 1)
    );
    let last = c.last_message.as_ref().expect("a last message");
    assert_eq!(last.payload.len(), 256, "the preview is cut");
    assert_eq!(entry(&list, &ab).unread, 2);

    // Pinned first whatever the activity; muted keeps its count.
    let flags = |conv: &str, muted, pinned| {
        Body::SetConversationFlags(proto::SetConversationFlags {
            conversation_id: conv.into(),
            muted,
            pinned,
        })
    };
    assert!(matches!(
        request(&mut alice, 5, flags(&ab, true, true)).await,
        Body::Done(_)
    ));
    let list = list_all(&mut alice, 50).await;
    let order: Vec<&str> = list.iter().map(|c| c.conversation_id.as_str()).collect();
    assert_eq!(order, [ab.as_str(), ac.as_str()]);
    let b = entry(&list, &ab);
    assert!(b.pinned && b.muted && b.unread == 2, "{b:?}");
    // Reads and own sends zero the count.
    mark_read_ok(&mut alice, 6, &ab, 1).await;
    alice
        .send(&send_to_user(7, "carol", b"back", "a-1"))
        .await
        .unwrap();
    acks(&mut alice, 1).await;
    let list = list_all(&mut alice, 50).await;
    assert_eq!(entry(&list, &ab).unread, 1);
    assert_eq!(entry(&list, &ac).unread, 0);
    // Flags only on a conversation the caller may read.
    match request(&mut bob, 8, flags(&ac, true, false)).await {
        Body::Error(e) => assert_eq!(e.code, ErrorCode::NotMember as i32),
        other => panic!("{other:?}"),
    }
    match request(
        &mut alice,
        9,
        Body::ListConversations(proto::ListConversations {
            after: "not-a-token".into(),
            limit: 0,
        }),
    )
    .await
    {
        Body::Error(e) => assert_eq!(e.code, ErrorCode::BadFrame as i32),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_with_after_lists_every_conversation_once() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let n = 23;
    for i in 0..n {
        alice
            .send(&send_to_user(
                i + 1,
                &format!("user{i}"),
                b"hi",
                &format!("a-{i}"),
            ))
            .await
            .unwrap();
    }
    acks(&mut alice, n as usize).await;
    create_group(&mut alice, "g1", vec![]).await;
    let pinned = proto::direct_conversation("alice", "user3");
    let body = request(
        &mut alice,
        100,
        Body::SetConversationFlags(proto::SetConversationFlags {
            conversation_id: pinned.clone(),
            muted: false,
            pinned: true,
        }),
    )
    .await;
    assert!(matches!(body, Body::Done(_)));
    let list = list_all(&mut alice, 5).await;
    let ids: Vec<&str> = list.iter().map(|c| c.conversation_id.as_str()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(
        (ids.len(), unique.len()),
        (n as usize + 1, n as usize + 1),
        "{ids:?}"
    );
    assert_eq!(ids[0], pinned);
    // After the pinned one, by last activity, newest first.
    let times: Vec<i64> = list[1..].iter().map(|c| c.last_time).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let g = entry(&list, "g:g1");
    assert_eq!(
        (g.kind, g.name.as_str(), g.size),
        (proto::ConversationKind::Group as i32, "g1", 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_reaches_the_reader_on_another_node() {
    let c = TestCluster::start(2, &[]).await;
    let mut alice = c.nodes[0].raw("alice").await;
    let mut bob = c.nodes[1].raw("bob").await;
    for (i, others) in [(0, 1), (1, 1)] {
        c.wait_for(i, "presence", |o| {
            o["cluster"]["users_on_other_nodes"] == others
        })
        .await;
    }
    alice
        .send(&send_to_user(1, "bob", b"hello", "a-1"))
        .await
        .unwrap();
    let seq = acks(&mut alice, 1).await.remove(0).1.seq;
    mark_read_ok(
        &mut bob,
        2,
        &proto::direct_conversation("alice", "bob"),
        seq,
    )
    .await;
    let r = next_receipt(&mut alice).await;
    assert_eq!((r.user_id.as_str(), r.seq), ("bob", seq));
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_state_frames_are_rate_limited() {
    let s = TestServer::start_with(&[
        ("IM_LIMITS_LIST_CONVERSATIONS_RATE_PER_SEC", "1"),
        ("IM_LIMITS_LIST_CONVERSATIONS_BURST", "1"),
    ]);
    let mut alice = s.raw("alice").await;
    let list = || Body::ListConversations(proto::ListConversations::default());
    assert!(matches!(
        request(&mut alice, 1, list()).await,
        Body::ConversationList(_)
    ));
    match request(&mut alice, 2, list()).await {
        Body::Error(e) => {
            assert_eq!(e.code, ErrorCode::RateLimited as i32);
            assert!(e.retry_after_ms > 0);
        }
        other => panic!("{other:?}"),
    }
}
