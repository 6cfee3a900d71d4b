//! Groups: create, join, leave, and fan-out to every member once, in seq order (the
//! access rules themselves are in `access.rs`).

use std::collections::HashMap;

use im_client::proto::{group_op, Body, GroupOp};
use im_client::RawConn;

use crate::support::*;

async fn group_op(
    c: &mut RawConn,
    req_id: u64,
    op: group_op::Op,
    group: &str,
    members: &[String],
) -> Body {
    group_request(
        c,
        req_id,
        GroupOp {
            op: op as i32,
            group_id: group.into(),
            members: members.to_vec(),
            ..Default::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_of_50_gets_every_message_once_in_seq_order() {
    let server = TestServer::start();
    let users: Vec<String> = (0..50).map(|i| format!("u{i:02}")).collect();
    let mut conns = Vec::new();
    for u in &users {
        conns.push(server.raw(u).await);
    }
    let body = group_op(&mut conns[0], 2, group_op::Op::Create, "team", &users[1..]).await;
    let Body::GroupOpOk(ok) = body else {
        panic!("{body:?}")
    };
    assert_eq!(ok.members, 50);
    let v = ok.version;

    // Five senders, 20 messages each, sent concurrently.
    const SENDERS: usize = 5;
    const EACH: usize = 20;
    let mut receivers = conns.split_off(SENDERS);
    let mut senders = conns;
    let send_tasks: Vec<_> = senders
        .drain(..)
        .enumerate()
        .map(|(i, mut c)| {
            tokio::spawn(async move {
                for n in 0..EACH {
                    let payload = format!("s{i}-{n}");
                    c.send(&send_to_group(
                        100 + n as u64,
                        "team",
                        payload.as_bytes(),
                        &payload,
                    ))
                    .await
                    .unwrap();
                }
                // Collect acks and the others' messages.
                let mut acks = 0;
                let mut got = Vec::new();
                while acks < EACH || got.len() < (SENDERS - 1) * EACH {
                    let f = next_frame(&mut c).await;
                    match f.body {
                        Some(Body::SendAck(_)) => acks += 1,
                        Some(Body::Deliver(d)) => got.extend(chat_only(d.messages)),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                got
            })
        })
        .collect();
    let recv_tasks: Vec<_> = receivers
        .drain(..)
        .map(|mut c| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.len() < SENDERS * EACH {
                    let f = next_frame(&mut c).await;
                    match f.body {
                        Some(Body::Deliver(d)) => got.extend(chat_only(d.messages)),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                // Nothing more may arrive (no duplicates).
                assert!(c
                    .recv_timeout(std::time::Duration::from_millis(300))
                    .await
                    .is_err());
                got
            })
        })
        .collect();

    let mut by_seq: HashMap<u64, String> = HashMap::new();
    for t in recv_tasks {
        let got = t.await.expect("receiver");
        let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
        let expected: Vec<u64> = (v + 1..=v + (SENDERS * EACH) as u64).collect();
        assert_eq!(seqs, expected, "every message once, in seq order");
        for m in got {
            assert_eq!(m.conversation_id, "g:team");
            let p = String::from_utf8(m.payload.to_vec()).unwrap();
            let prev = by_seq.insert(m.seq, p.clone());
            assert!(
                prev.is_none() || prev.as_deref() == Some(p.as_str()),
                "seq {} differs between members",
                m.seq
            );
        }
    }
    for t in send_tasks {
        let got = t.await.expect("sender");
        let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            seqs, sorted,
            "sender's view is in seq order without duplicates"
        );
        assert_eq!(seqs.len(), (SENDERS - 1) * EACH);
    }
    // Each sender's messages keep their send order within the conversation.
    for i in 0..SENDERS {
        let mut mine: Vec<(u64, usize)> = by_seq
            .iter()
            .filter_map(|(seq, p)| {
                let (s, n) = p.strip_prefix('s')?.split_once('-')?;
                (s.parse::<usize>().ok()? == i).then(|| (*seq, n.parse().unwrap()))
            })
            .collect();
        mine.sort();
        let order: Vec<usize> = mine.iter().map(|x| x.1).collect();
        assert_eq!(order, (0..EACH).collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_leave_and_membership_rules() {
    let server = TestServer::start();
    let mut a = server.raw("ann").await;
    let mut b = server.raw("ben").await;

    let body = group_request(
        &mut a,
        2,
        GroupOp {
            op: group_op::Op::Create as i32,
            group_id: "club".into(),
            kind: group_op::Kind::Public as i32,
            ..Default::default()
        },
    )
    .await;
    let Body::GroupOpOk(ok) = body else {
        panic!("{body:?}")
    };
    assert_eq!((ok.members, ok.role), (1, group_op::Role::Owner as i32));
    assert_eq!(ok.kind, group_op::Kind::Public as i32);
    // Creating it again fails.
    let body = group_op(&mut b, 3, group_op::Op::Create, "club", &[]).await;
    assert!(
        matches!(body, Body::Error(ref e) if e.code == 2),
        "{body:?}"
    );
    // Joining a missing group is NOT_FOUND.
    let body = group_op(&mut b, 4, group_op::Op::Join, "nope", &[]).await;
    assert!(
        matches!(body, Body::Error(ref e) if e.code == 7),
        "{body:?}"
    );
    // A non-member may not add others (nor sneak in with them).
    let body = group_op(&mut b, 40, group_op::Op::Join, "club", &["cat".into()]).await;
    assert!(
        matches!(body, Body::Error(ref e) if e.code == 5),
        "{body:?}"
    );

    a.send(&send_to_group(5, "club", b"before ben", "a-1"))
        .await
        .unwrap();
    let f = next_chat_frame(&mut a).await;
    assert!(
        matches!(f.body, Some(Body::SendAck(ref k)) if k.seq == ok.version + 1),
        "{f:?}"
    );

    // Anyone may join a public group.
    let body = group_op(&mut b, 6, group_op::Op::Join, "club", &[]).await;
    let Body::GroupOpOk(joined) = body else {
        panic!("{body:?}")
    };
    assert_eq!(
        (joined.members, joined.role),
        (2, group_op::Role::Member as i32)
    );
    a.send(&send_to_group(7, "club", b"after ben", "a-2"))
        .await
        .unwrap();
    let f = next_chat_frame(&mut b).await;
    let Some(Body::Deliver(d)) = f.body else {
        panic!("{f:?}")
    };
    assert_eq!(&d.messages[0].payload[..], b"after ben");
    assert_eq!(d.messages[0].seq, joined.version + 1);
    // A new member's sync starts at its join event, not at the group's history.
    let synced = raw_sync_all(&mut b, 100).await;
    assert!(synced.iter().all(|m| m.seq >= joined.version), "{synced:?}");

    let body = group_op(&mut b, 8, group_op::Op::Leave, "club", &[]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.members == 1 && ok.role == 0),
        "{body:?}"
    );
    b.send(&send_to_group(9, "club", b"not a member", "b-1"))
        .await
        .unwrap();
    let f = next_chat_frame(&mut b).await;
    assert!(
        matches!(f.body, Some(Body::Error(ref e)) if e.code == 5),
        "{f:?}"
    );
}
