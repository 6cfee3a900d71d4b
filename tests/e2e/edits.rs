//! Message history and message changes (docs/history-and-edits.md): backward history
//! inside the reader's membership and under the page byte budget, recall and edit
//! (who may, the window, pushes to online members, the latest state for later
//! readers, the SDK's events) and delete-for-me.

use std::time::Duration;

use im_client::proto::{
    self, group_op, Body, ChatMessage, ErrorCode, GroupOp, HistoryPage, MessageState, MessageType,
};
use im_client::{Client, Event, RawConn};

use crate::support::*;

fn history(conv: &str, before_seq: u64, limit: u32) -> Body {
    Body::FetchHistory(proto::FetchHistory {
        conversation_id: conv.into(),
        before_seq,
        limit,
    })
}

fn recall(conv: &str, seq: u64, msg_id: &str, cmid: &str) -> Body {
    Body::Recall(proto::Recall {
        conversation_id: conv.into(),
        seq,
        msg_id: msg_id.into(),
        client_msg_id: cmid.into(),
    })
}

fn edit(conv: &str, seq: u64, payload: &[u8], cmid: &str) -> Body {
    Body::Edit(proto::Edit {
        conversation_id: conv.into(),
        seq,
        msg_id: String::new(),
        payload: payload.to_vec().into(),
        client_msg_id: cmid.into(),
    })
}

async fn page(c: &mut RawConn, req_id: u64, conv: &str, before: u64, limit: u32) -> HistoryPage {
    match request(c, req_id, history(conv, before, limit)).await {
        Body::HistoryPage(p) => p,
        other => panic!("history of {conv} before {before}: {other:?}"),
    }
}

async fn acked(c: &mut RawConn, req_id: u64, body: Body) -> proto::SendAck {
    match request(c, req_id, body).await {
        Body::SendAck(a) => a,
        other => panic!("expected a SendAck, got {other:?}"),
    }
}

async fn refused(c: &mut RawConn, req_id: u64, body: Body) -> ErrorCode {
    match request(c, req_id, body).await {
        Body::Error(e) => ErrorCode::try_from(e.code).unwrap(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn say(c: &mut RawConn, req_id: u64, group: &str, text: &str) -> proto::SendAck {
    c.send(&send_to_group(req_id, group, text.as_bytes(), text))
        .await
        .unwrap();
    acks(c, 1).await.remove(0).1
}

async fn set_role(c: &mut RawConn, req_id: u64, group: &str, user: &str, role: group_op::Role) {
    let body = group_request(
        c,
        req_id,
        GroupOp {
            op: group_op::Op::SetRole as i32,
            group_id: group.into(),
            members: vec![user.into()],
            role: role as i32,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
}

/// The SDK's next event that is not a membership event, within the test wait.
async fn next_app_event(c: &Client) -> Event {
    let wait = async {
        loop {
            match c.next_event().await.expect("client running") {
                Event::Message(m) if m.r#type == MessageType::System as i32 => {}
                e => return e,
            }
        }
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .expect("an event in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_back_to_the_join_and_skips_between_intervals() {
    let server = TestServer::start();
    let mut a = server.raw("a").await;
    let mut c = server.raw("c").await;
    let mut x = server.raw("x").await;
    create_group(&mut a, "h", vec![]).await; // 1
    say(&mut a, 10, "h", "before-1").await; // 2
    say(&mut a, 11, "h", "before-2").await; // 3
    let join = group_op_ok(&mut a, 12, group_op::Op::Add, "h", vec!["c".into()])
        .await
        .version; // 4
    say(&mut a, 13, "h", "in-1").await; // 5
    let left = group_op_ok(&mut a, 14, group_op::Op::Remove, "h", vec!["c".into()])
        .await
        .version; // 6
    say(&mut a, 15, "h", "between-1").await; // 7
    say(&mut a, 16, "h", "between-2").await; // 8
    let back = group_op_ok(&mut a, 17, group_op::Op::Add, "h", vec!["c".into()])
        .await
        .version; // 9
    let last = say(&mut a, 18, "h", "in-2").await.seq; // 10
    assert_eq!((join, left, back, last), (4, 6, 9, 10));

    // c pages back 2 at a time: 10 9 | 6 5 | 4, then nothing older.
    let mut got = Vec::new();
    let mut before = 0;
    let mut pages = 0;
    loop {
        let p = page(&mut c, 100 + pages, "g:h", before, 2).await;
        pages += 1;
        assert!(p.messages.len() <= 2);
        let seqs: Vec<u64> = p.messages.iter().map(|m| m.seq).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] > w[1]),
            "newest first: {seqs:?}"
        );
        got.extend(seqs);
        if !p.more {
            break;
        }
        before = *got.last().expect("a page with more has messages");
        assert!(pages < 10, "paging does not end: {got:?}");
    }
    assert_eq!(got, [10, 9, 6, 5, 4], "inside c's intervals only");
    assert_eq!(pages, 3, "the last page says more=false");
    // The owner reads it all, with the payloads.
    let all = page(&mut a, 200, "g:h", 0, 0).await;
    assert_eq!(all.messages.len(), 10);
    assert!(!all.more);
    assert_eq!(&all.messages[2].payload[..], b"between-2");

    // Refusals as sync's: a non-member, a malformed conversation id.
    assert_eq!(
        refused(&mut x, 300, history("g:h", 0, 10)).await,
        ErrorCode::NotMember
    );
    assert_eq!(
        refused(&mut x, 301, history("u:a:c", 0, 10)).await,
        ErrorCode::NotMember
    );
    assert_eq!(
        refused(&mut x, 302, history("nonsense", 0, 10)).await,
        ErrorCode::BadFrame
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_stop_at_the_byte_budget() {
    let server = TestServer::start_with(&[("IM_FLOW_SYNC_PAGE_BYTES", "20000")]);
    let mut a = server.raw("a").await;
    let mut b = server.raw("b").await;
    let body = vec![b'x'; 5000];
    for i in 0..10u64 {
        a.send(&send_to_user(10 + i, "b", &body, &format!("m{i}")))
            .await
            .unwrap();
    }
    acks(&mut a, 10).await;
    let first = page(&mut b, 100, "u:a:b", 0, 100).await;
    assert!(first.more, "10 x 5000 bytes do not fit 20000");
    assert!(
        (1..10).contains(&first.messages.len()),
        "{}",
        first.messages.len()
    );
    let bytes: usize = first.messages.iter().map(|m| m.payload.len()).sum();
    assert!(bytes <= 20_000, "{bytes} bytes in one page");
    assert_eq!(first.messages[0].seq, 10);
    // Paging on reads the rest, each once.
    let mut seqs: Vec<u64> = first.messages.iter().map(|m| m.seq).collect();
    let mut more = first.more;
    let mut req = 101;
    while more {
        let p = page(&mut b, req, "u:a:b", *seqs.last().unwrap(), 100).await;
        req += 1;
        seqs.extend(p.messages.iter().map(|m| m.seq));
        more = p.more;
    }
    assert_eq!(seqs, (1..=10).rev().collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_and_edit_reach_online_members_and_later_readers() {
    let server = TestServer::start();
    // b is online with the SDK before the group exists; c reads everything later.
    let b = server.client("b").await;
    let mut a = server.raw("a").await;
    create_group(&mut a, "team", vec!["b".into(), "c".into()]).await; // 1
    let conv = "g:team";
    let original = say(&mut a, 10, "team", "oops").await; // 2
    let Event::Message(m) = next_app_event(&b).await else {
        panic!("the message first")
    };
    assert_eq!((m.seq, &m.payload[..]), (2, &b"oops"[..]));

    // The sender recalls it (inside the default 120 s window).
    let r = acked(&mut a, 11, recall(conv, 2, &original.msg_id, "r-1")).await;
    assert_eq!((r.seq, r.duplicate), (3, false));
    let Event::Recalled(ev) = next_app_event(&b).await else {
        panic!("b is told of the recall")
    };
    assert_eq!((ev.seq, ev.ref_seq), (3, 2));
    assert_eq!(
        (ev.sender.as_str(), ev.ref_msg_id.as_str()),
        ("a", original.msg_id.as_str())
    );
    assert!(ev.payload.is_empty());
    assert_eq!(ev.r#type, MessageType::Recall as i32);
    // A retry is the same event; a second recall is refused.
    let again = acked(&mut a, 12, recall(conv, 2, "", "r-1")).await;
    assert_eq!((again.seq, again.duplicate), (3, true));
    assert_eq!(
        refused(&mut a, 13, recall(conv, 2, "", "r-2")).await,
        ErrorCode::Forbidden
    );

    // The sender edits a message.
    say(&mut a, 14, "team", "teh typo").await; // 4
    let Event::Message(m) = next_app_event(&b).await else {
        panic!("the second message")
    };
    assert_eq!(m.seq, 4);
    let e = acked(&mut a, 15, edit(conv, 4, b"the typo", "e-1")).await;
    assert_eq!(e.seq, 5);
    let Event::Edited(ev) = next_app_event(&b).await else {
        panic!("b is told of the edit")
    };
    assert_eq!(
        (ev.seq, ev.ref_seq, &ev.payload[..]),
        (5, 4, &b"the typo"[..])
    );

    // c syncs later (SDK): every seq once, in order, with the latest state.
    let c = server.client("c").await;
    let synced = c.sync().await.expect("sync");
    let seqs: Vec<u64> = synced.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(next_app_event(&c).await);
    }
    let [Event::Message(m2), Event::Recalled(m3), Event::Message(m4), Event::Edited(m5)] =
        &events[..]
    else {
        panic!("c's events: {events:?}")
    };
    assert_eq!(m2.state, MessageState::Recalled as i32);
    assert!(m2.payload.is_empty(), "a recalled payload is gone");
    assert_eq!(m3.ref_seq, 2);
    assert_eq!(m4.state, MessageState::Edited as i32);
    assert_eq!(&m4.payload[..], b"the typo");
    assert!(m4.edit_time >= m4.send_time);
    assert_eq!((m5.ref_seq, &m5.payload[..]), (4, &b"the typo"[..]));
    // The DeliverAck covers the events too.
    server.wait_cursor("c", conv, 5).await;
    server.wait_cursor("b", conv, 5).await;

    // History renders the same.
    let mut raw_c = server.raw("c").await;
    let h = page(&mut raw_c, 20, conv, 0, 0).await;
    let rendered: Vec<(u64, i32)> = h.messages.iter().map(|m| (m.seq, m.state)).collect();
    assert_eq!(
        rendered,
        [
            (5, MessageState::Original as i32),
            (4, MessageState::Edited as i32),
            (3, MessageState::Original as i32),
            (2, MessageState::Recalled as i32),
            (1, MessageState::Original as i32),
        ]
    );
    b.close().await;
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_recall_and_edit() {
    let server = TestServer::start_with(&[("IM_LIMITS_RECALL_WINDOW_SECS", "1")]);
    let mut owner = server.raw("owner").await;
    let mut admin = server.raw("admin").await;
    let mut m1 = server.raw("m1").await;
    let mut m2 = server.raw("m2").await;
    let mut x = server.raw("x").await;
    create_group(
        &mut owner,
        "g",
        vec!["admin".into(), "m1".into(), "m2".into()],
    )
    .await; // 1
    set_role(&mut owner, 3, "g", "admin", group_op::Role::Admin).await; // 2
    let conv = "g:g";
    let s1 = say(&mut m1, 10, "g", "one").await.seq; // 3
    let s2 = say(&mut m1, 11, "g", "two").await.seq; // 4
    let s3 = say(&mut m1, 12, "g", "three").await.seq; // 5
    let s4 = say(&mut m1, 13, "g", "four").await.seq; // 6

    // Another member may neither recall nor edit m1's message; a stranger is no member.
    assert_eq!(
        refused(&mut m2, 20, recall(conv, s1, "", "")).await,
        ErrorCode::Forbidden
    );
    assert_eq!(
        refused(&mut m2, 21, edit(conv, s1, b"mine now", "")).await,
        ErrorCode::Forbidden
    );
    assert_eq!(
        refused(&mut x, 22, recall(conv, s1, "", "")).await,
        ErrorCode::NotMember
    );
    // No such message, a wrong msg_id, a SYSTEM event, a plain Send of type RECALL.
    assert_eq!(
        refused(&mut m1, 23, recall(conv, 999, "", "")).await,
        ErrorCode::NotFound
    );
    assert_eq!(
        refused(&mut m1, 24, recall(conv, s1, "not-its-id", "")).await,
        ErrorCode::NotFound
    );
    assert_eq!(
        refused(&mut owner, 25, recall(conv, 1, "", "")).await,
        ErrorCode::Forbidden
    );
    let Some(Body::Send(mut forged)) = send_to_group(26, "g", b"", "forged").body else {
        unreachable!()
    };
    forged.r#type = MessageType::Recall as i32;
    assert_eq!(
        refused(&mut m1, 26, Body::Send(forged)).await,
        ErrorCode::Forbidden
    );
    // The sender edits (no edit window by default), inside the recall window too.
    acked(&mut m1, 27, edit(conv, s1, b"one!", "")).await;
    acked(&mut m1, 28, recall(conv, s2, "", "")).await;

    // Past the 1 s window the sender may not recall; the owner and an admin may.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        refused(&mut m1, 30, recall(conv, s3, "", "")).await,
        ErrorCode::Forbidden
    );
    acked(&mut admin, 31, recall(conv, s3, "", "")).await;
    acked(&mut owner, 32, recall(conv, s4, "", "")).await;
    // Editing stays the sender's alone, and an edit event is no message to edit.
    acked(&mut m1, 33, edit(conv, s1, b"one!!", "")).await;
    assert_eq!(
        refused(&mut owner, 34, edit(conv, s1, b"owner's", "")).await,
        ErrorCode::Forbidden
    );
    let h = page(&mut m2, 40, conv, 0, 0).await;
    let at = |seq: u64| h.messages.iter().find(|m| m.seq == seq).unwrap().clone();
    assert_eq!(&at(s1).payload[..], b"one!!");
    assert_eq!(at(s1).state, MessageState::Edited as i32);
    for s in [s2, s3, s4] {
        assert_eq!(at(s).state, MessageState::Recalled as i32, "seq {s}");
        assert!(at(s).payload.is_empty());
    }
    let edit_event = h
        .messages
        .iter()
        .find(|m| m.r#type == MessageType::Edit as i32)
        .unwrap()
        .seq;
    assert_eq!(
        refused(&mut m1, 41, edit(conv, edit_event, b"x", "")).await,
        ErrorCode::Forbidden
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_for_me_hides_for_that_user_only() {
    let server = TestServer::start();
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    let mut eve = server.raw("eve").await;
    for i in 0..3u64 {
        alice
            .send(&send_to_user(
                10 + i,
                "bob",
                format!("m{i}").as_bytes(),
                &format!("m{i}"),
            ))
            .await
            .unwrap();
    }
    acks(&mut alice, 3).await;
    let conv = "u:alice:bob";
    let del = |seq| {
        Body::DeleteForMe(proto::DeleteForMe {
            conversation_id: conv.into(),
            seq,
        })
    };
    assert!(matches!(request(&mut bob, 20, del(2)).await, Body::Done(_)));
    assert!(matches!(request(&mut bob, 21, del(2)).await, Body::Done(_)));
    assert_eq!(refused(&mut eve, 22, del(2)).await, ErrorCode::NotMember);
    assert_eq!(refused(&mut bob, 23, del(9)).await, ErrorCode::NotFound);

    let rendered = |msgs: &[ChatMessage]| -> Vec<(u64, i32, Vec<u8>)> {
        let mut v: Vec<_> = msgs
            .iter()
            .map(|m| (m.seq, m.state, m.payload.to_vec()))
            .collect();
        v.sort();
        v
    };
    let hidden = MessageState::Hidden as i32;
    let original = MessageState::Original as i32;
    let for_bob = vec![
        (1, original, b"m0".to_vec()),
        (2, hidden, Vec::new()),
        (3, original, b"m2".to_vec()),
    ];
    // Bob's history and a sync on another of his connections: the tombstone at seq 2.
    assert_eq!(
        rendered(&page(&mut bob, 30, conv, 0, 0).await.messages),
        for_bob
    );
    let mut bob2 = server.raw("bob").await;
    assert_eq!(rendered(&raw_sync_all(&mut bob2, 100).await), for_bob);
    // Alice still sees it.
    let h = page(&mut alice, 31, conv, 0, 0).await;
    assert_eq!(
        rendered(&h.messages)[1],
        (2, original, b"m1".to_vec()),
        "the other party keeps it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_and_edit_reach_members_on_another_node() {
    let c = cluster::TestCluster::start(2, &[]).await;
    let mut sam = c.nodes[0].raw("sam").await;
    let mut rita = c.nodes[1].raw("rita").await;
    for i in 0..2 {
        c.wait_for(i, "presence", |o| o["cluster"]["users_on_other_nodes"] == 1)
            .await;
    }
    sam.send(&send_to_user(1, "rita", b"draft", "s-1"))
        .await
        .unwrap();
    let sent = acks(&mut sam, 1).await.remove(0).1;
    let conv = sent.conversation_id.clone();
    let pushed = |f: proto::Frame| match f.body {
        Some(Body::Deliver(mut d)) => d.messages.remove(0),
        other => panic!("expected a push, got {other:?}"),
    };
    assert_eq!(pushed(next_frame(&mut rita).await).seq, sent.seq);
    let e = acked(&mut sam, 2, edit(&conv, sent.seq, b"final", "s-2")).await;
    let ev = pushed(next_frame(&mut rita).await);
    assert_eq!(
        (ev.seq, ev.r#type, ev.ref_seq, &ev.payload[..]),
        (e.seq, MessageType::Edit as i32, sent.seq, &b"final"[..])
    );
    let r = acked(&mut sam, 3, recall(&conv, sent.seq, &sent.msg_id, "s-3")).await;
    let ev = pushed(next_frame(&mut rita).await);
    assert_eq!(
        (ev.seq, ev.r#type, ev.ref_msg_id.as_str()),
        (r.seq, MessageType::Recall as i32, sent.msg_id.as_str())
    );
    // Read back on the other node (Postgres): recalled, and the edit's text is gone too.
    let h = page(&mut rita, 4, &conv, 0, 0).await;
    let states: Vec<(u64, i32, usize)> = h
        .messages
        .iter()
        .map(|m| (m.seq, m.state, m.payload.len()))
        .collect();
    assert_eq!(
        states,
        [
            (r.seq, MessageState::Original as i32, 0),
            (e.seq, MessageState::Recalled as i32, 0),
            (sent.seq, MessageState::Recalled as i32, 0),
        ]
    );
    c.cleanup().await;
}
