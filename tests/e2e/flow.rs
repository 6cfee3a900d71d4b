//! Flow control: slow consumers are marked then closed while others keep up, a full
//! persistence queue answers OVERLOADED without losing or doubling anything, group
//! fan-out encodes once, and Sends are rate limited.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use im_client::proto::{Body, ErrorCode};
use im_client::Target;

use crate::support::*;

fn rss_kib(pid_of: &TestServer) -> u64 {
    let (_, body) = pid_of.admin_get("/admin/v1/overview");
    let o: serde_json::Value = serde_json::from_str(&body).unwrap();
    o["process"]["rss_bytes"].as_u64().unwrap_or(0) / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_is_marked_slow_then_closed_and_others_get_everything() {
    let server = TestServer::start_with(&[
        ("IM_FLOW_WRITE_TIMEOUT_SECS", "2"),
        ("IM_FLOW_SOCKET_SEND_BUFFER_BYTES", "65536"),
        ("IM_LIMITS_SEND_RATE_PER_SEC", "0"),
        ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
    ]);
    let mut flooder = server.raw("flooder").await;
    let mut healthy = server.raw("healthy").await;
    let mut stalled = server.raw("stalled").await;
    let v = create_group(
        &mut flooder,
        "storm",
        vec!["healthy".into(), "stalled".into()],
    )
    .await;

    const N: usize = 600;
    let payload = vec![b'x'; 16 * 1024];
    let reader = tokio::spawn(async move {
        let mut seqs = Vec::new();
        while seqs.len() < N {
            let f = next_frame(&mut healthy).await;
            if let Some(Body::Deliver(d)) = f.body {
                seqs.extend(chat_only(d.messages).iter().map(|m| m.seq));
            }
        }
        seqs
    });
    let mut peak_rss = 0;
    let mut acked = 0;
    for i in 0..N {
        flooder
            .send(&send_to_group(
                10 + i as u64,
                "storm",
                &payload,
                &format!("f{i}"),
            ))
            .await
            .unwrap();
        if i % 50 == 49 {
            acked += acks(&mut flooder, 50).await.len();
            peak_rss = peak_rss.max(rss_kib(&server));
        }
    }
    assert_eq!(acked, N);
    let seqs = reader.await.unwrap();
    assert_eq!(
        seqs,
        (v + 1..=v + N as u64).collect::<Vec<_>>(),
        "the healthy member got everything in order"
    );

    // The stalled member was marked slow and then closed (write timeout or hard mark).
    let end = Instant::now() + WAIT;
    while server.metric("im_slow_consumer_disconnects_total", &[]) < 1.0 {
        assert!(
            Instant::now() < end,
            "the stalled reader was never disconnected"
        );
        peak_rss = peak_rss.max(rss_kib(&server));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = server.admin_get("/admin/v1/slow-consumers");
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(s["marked_total"].as_u64().unwrap() >= 1, "{body}");
    assert!(server.metric("im_messages_dropped_total", &[("reason", "slow_consumer")]) > 0.0);
    // ~10 MB went through; per-connection queues are bounded, so RSS stays far below that times members.
    assert!(peak_rss < 150 * 1024, "server RSS peaked at {peak_rss} KiB");

    // Its socket ends with the slow-consumer code once we read what was buffered.
    let mut code = None;
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        match stalled.recv_timeout(WAIT).await {
            Ok(im_client::RawEvent::Frame(_) | im_client::RawEvent::WsPong(_)) => {}
            Ok(im_client::RawEvent::Closed { code: c, .. }) => {
                code = c;
                break;
            }
            Err(_) => break,
        }
    }
    assert!(matches!(code, Some(4008) | None), "closed with {code:?}");

    // Reconnecting and syncing gets everything it missed.
    let mut back = server.raw("stalled").await;
    let got = raw_sync_all(&mut back, 100).await;
    let seqs: Vec<u64> = got
        .iter()
        .filter(|m| m.conversation_id == "g:storm")
        .map(|m| m.seq)
        .collect();
    assert_eq!(
        seqs,
        (1..=v + N as u64).collect::<Vec<_>>(),
        "sync fills everything in (from the CREATE event on)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_persistence_queue_answers_overloaded_and_nothing_is_lost_or_doubled() {
    let server = TestServer::start_with(&[
        ("IM_PERSIST_QUEUE_CAPACITY", "2"),
        ("IM_PERSIST_BATCH_MAX", "1"),
        ("IM_PERSIST_RETRY_AFTER_MS", "5"),
        ("IM_LIMITS_SEND_RATE_PER_SEC", "0"),
    ]);
    let mut sink = server.raw("sink").await;
    const SENDERS: usize = 4;
    const EACH: usize = 50;
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let mut cfg = im_client::ClientConfig::new(server.ws_url(), server.token(&format!("p{s}")));
        // Under a long overload the app keeps retrying (with the same client_msg_id).
        cfg.max_send_retries = 10_000;
        let c = im_client::Client::connect(cfg).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let sends = (0..EACH).map(|i| {
                c.send(
                    Target::User("sink".into()),
                    im_client::proto::MessageType::Text,
                    bytes::Bytes::from(format!("p{s}-{i}")),
                    Some(format!("p{s}-{i}")),
                )
            });
            let acks = futures_util::future::join_all(sends).await;
            acks.into_iter()
                .map(|a| a.expect("send eventually acked"))
                .collect::<Vec<_>>()
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await.unwrap().len();
    }
    assert_eq!(acked, SENDERS * EACH);
    assert!(
        server.metric("im_persist_overloaded_total", &[]) > 0.0,
        "the queue never filled; the test did not exercise OVERLOADED"
    );

    // Live: each message once.
    let mut seen = HashSet::new();
    while seen.len() < SENDERS * EACH {
        let f = next_frame(&mut sink).await;
        if let Some(Body::Deliver(d)) = f.body {
            for m in d.messages {
                assert!(
                    seen.insert(m.client_msg_id.clone()),
                    "delivered twice: {}",
                    m.client_msg_id
                );
            }
        }
    }
    assert!(
        sink.recv_timeout(Duration::from_millis(300)).await.is_err(),
        "extra deliveries"
    );
    // Stored: each message once.
    let mut fresh = server.raw("sink").await;
    let stored = raw_sync_all(&mut fresh, 1000).await;
    let ids: HashSet<&str> = stored.iter().map(|m| m.client_msg_id.as_str()).collect();
    assert_eq!(stored.len(), SENDERS * EACH);
    assert_eq!(ids.len(), SENDERS * EACH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1000_member_group_message_is_encoded_once() {
    let server = TestServer::start();
    let users: Vec<String> = (0..1000).map(|i| format!("m{i:04}")).collect();
    let mut conns = Vec::with_capacity(users.len());
    for u in &users {
        conns.push(server.raw(u).await);
    }
    let v = create_group(&mut conns[0], "big", users[1..].to_vec()).await;
    // The group's CREATE event (a SYSTEM message at seq v) is fanned out to all 1,000
    // members on its own; count from after it, or its deliveries race the figures.
    eventually("the CREATE event reaches every member", || {
        server.metric("im_messages_delivered_total", &[]) >= 1000.0
    })
    .await;
    let before_enc = server.metric("im_messages_encoded_total", &[]);
    let before_del = server.metric("im_messages_delivered_total", &[]);
    conns[0]
        .send(&send_to_group(5, "big", b"hello everyone", "big-1"))
        .await
        .unwrap();
    assert_eq!(acks(&mut conns[0], 1).await.len(), 1);
    for c in conns.iter_mut().skip(1) {
        let f = next_chat_frame(c).await;
        assert!(
            matches!(f.body, Some(Body::Deliver(ref d)) if d.messages[0].seq == v + 1),
            "{f:?}"
        );
    }
    assert_eq!(
        server.metric("im_messages_encoded_total", &[]) - before_enc,
        1.0
    );
    assert_eq!(
        server.metric("im_messages_delivered_total", &[]) - before_del,
        999.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_over_the_rate_limit_get_rate_limited() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_SEND_RATE_PER_SEC", "5"),
        ("IM_LIMITS_SEND_BURST", "5"),
    ]);
    let mut c = server.raw("chatty").await;
    for i in 0..20u64 {
        c.send(&send_to_user(i + 1, "quiet", b"x", &format!("r{i}")))
            .await
            .unwrap();
    }
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..20 {
        match next_frame(&mut c).await.body {
            Some(Body::SendAck(_)) => ok += 1,
            Some(Body::Error(e)) if e.code == ErrorCode::RateLimited as i32 => {
                assert!(e.retry_after_ms > 0);
                limited += 1
            }
            other => panic!("{other:?}"),
        }
    }
    assert!((5..=7).contains(&ok), "{ok} accepted");
    assert_eq!(ok + limited, 20);
    assert!(server.metric("im_bad_frames_total", &[("reason", "rate_limited")]) >= 13.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_groups_switch_to_notify_and_pull() {
    let server = TestServer::start_with(&[("IM_FLOW_NOTIFY_GROUP_THRESHOLD", "3")]);
    let mut owner = server.raw("boss").await;
    let mut raw_member = server.raw("r1").await;
    let sdk_member = server.client("r2").await;
    let v = create_group(
        &mut owner,
        "town",
        vec!["r1".into(), "r2".into(), "r3".into()],
    )
    .await;
    send_texts_to_group(&mut owner, "town", "t", 10).await;

    // The raw member gets one small hint (not the payloads) until it syncs.
    let f = next_frame(&mut raw_member).await;
    assert_eq!(f.req_id, 0);
    assert!(
        matches!(f.body, Some(Body::SyncResp(ref r)) if r.more && r.messages.is_empty()),
        "{f:?}"
    );
    assert!(
        raw_member
            .recv_timeout(Duration::from_millis(300))
            .await
            .is_err(),
        "hints are coalesced until the member syncs"
    );
    let got = raw_sync_all(&mut raw_member, 100).await;
    assert_eq!(
        got.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (1..=v + 10).collect::<Vec<_>>(),
        "the CREATE event, then the messages"
    );
    // After a sync, the next message hints again.
    owner
        .send(&send_to_group(50, "town", b"again", "t-again"))
        .await
        .unwrap();
    let f = next_frame(&mut raw_member).await;
    assert!(
        matches!(f.body, Some(Body::SyncResp(ref r)) if r.more),
        "{f:?}"
    );

    // The SDK follows hints by syncing: every message arrives once, in order.
    let mut seqs = Vec::new();
    while seqs.len() < (v + 11) as usize {
        seqs.push(sdk_member.next_message(WAIT).await.expect("sdk pulls").seq);
    }
    assert_eq!(seqs, (1..=v + 11).collect::<Vec<_>>());
    assert!(server.metric("im_sync_hints_total", &[]) >= 2.0);
    assert_eq!(
        server.metric("im_messages_encoded_total", &[]),
        0.0,
        "payloads were not pushed"
    );
}

/// The (seq, state, payload) of each message of a sync answer.
fn rendered(b: &Body) -> Vec<(u64, i32, Vec<u8>)> {
    match b {
        Body::SyncResp(r) => r
            .messages
            .iter()
            .map(|m| (m.seq, m.state, m.payload.to_vec()))
            .collect(),
        other => panic!("not a sync page: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_names_its_group_and_the_window_answers_as_the_store_would() {
    let server = TestServer::start_with(&[("IM_FLOW_NOTIFY_GROUP_THRESHOLD", "3")]);
    let mut owner = server.raw("boss").await;
    let mut r1 = server.raw("r1").await;
    let mut eve = server.raw("eve").await;
    let v = create_group(
        &mut owner,
        "town",
        vec!["r1".into(), "r2".into(), "r3".into()],
    )
    .await;
    send_texts_to_group(&mut owner, "town", "t", 5).await;

    // The hint names the group and the seq of the message that raised it (the CREATE
    // event's, v, when it came before the member read anything).
    let f = next_frame(&mut r1).await;
    match f.body {
        Some(Body::SyncResp(ref r)) if f.req_id == 0 => {
            assert_eq!((r.hint_conversation_id.as_str(), r.more), ("g:town", true));
            assert!(r.hint_seq >= v && r.hint_seq <= v + 5, "{r:?}");
        }
        other => panic!("not a hint: {other:?}"),
    }
    let from_window = |s: &TestServer| s.metric("im_syncs_from_window_total", &[]);

    // After the last membership change: from the window, the same as the store says.
    let window = sync_one(&mut r1, 20, "g:town", v).await;
    assert_eq!(from_window(&server), 1.0);
    let want: Vec<_> = (1..=5u64)
        .map(|i| (v + i, 0, format!("t{}", i - 1).into_bytes()))
        .collect();
    assert_eq!(rendered(&window), want);
    let stored: Vec<_> = raw_sync_all(&mut r1, 100)
        .await
        .into_iter()
        .filter(|m| m.seq > v)
        .collect();
    let Body::SyncResp(w) = &window else {
        unreachable!()
    };
    assert_eq!(w.messages, stored, "every field as the store renders it");

    // Before it (it could be before a member's join): the store, so the page also holds
    // the CREATE event.
    let all = sync_one(&mut r1, 21, "g:town", 0).await;
    assert_eq!(from_window(&server), 1.0);
    assert_eq!(rendered(&all).first().map(|m| m.0), Some(1));

    // A non-member is refused before any window is read.
    assert!(matches!(
        sync_one(&mut eve, 22, "g:town", v).await,
        Body::Error(e) if e.code == ErrorCode::NotMember as i32
    ));

    // An edit: the edited message reads its stored state (EDITED), not the window's.
    let edit = Body::Edit(im_client::proto::Edit {
        conversation_id: "g:town".into(),
        seq: v + 2,
        msg_id: String::new(),
        payload: b"t1 (edited)".to_vec().into(),
        client_msg_id: "e1".into(),
    });
    assert!(matches!(
        request(&mut owner, 30, edit).await,
        Body::SendAck(_)
    ));
    // The EDIT event's hint: it is in the window by now.
    let f = next_frame(&mut r1).await;
    assert!(
        matches!(f.body, Some(Body::SyncResp(ref r)) if r.hint_seq == v + 6),
        "{f:?}"
    );
    let after_edit = rendered(&sync_one(&mut r1, 31, "g:town", v + 1).await);
    assert_eq!(
        after_edit[0],
        (v + 2, 1, b"t1 (edited)".to_vec()),
        "{after_edit:?}"
    );
    assert_eq!(from_window(&server), 1.0, "read from the store");
    let later = sync_one(&mut r1, 32, "g:town", v + 5).await;
    assert_eq!(rendered(&later).len(), 1, "the EDIT event itself");
    assert_eq!(
        from_window(&server),
        2.0,
        "after the edited message: the window again"
    );

    // Delete-for-me: the hidden message reads as HIDDEN for its reader.
    let del = Body::DeleteForMe(im_client::proto::DeleteForMe {
        conversation_id: "g:town".into(),
        seq: v + 4,
    });
    assert!(matches!(request(&mut r1, 40, del).await, Body::Done(_)));
    let hidden = rendered(&sync_one(&mut r1, 41, "g:town", v + 3).await);
    assert_eq!(hidden[0], (v + 4, 3, Vec::new()), "{hidden:?}");
    assert_eq!(from_window(&server), 2.0);
}
