//! Access control against a hostile account: group roles and kinds, history visibility
//! by membership interval, server-only SYSTEM messages, idempotency per conversation,
//! sessions bounded by their tokens, and revocation.

use std::time::Duration;

use im_client::proto::{
    frame, group_op::Kind, group_op::Op, group_op::Role, Body, ChatMessage, Cursor, ErrorCode,
    GroupEvent, GroupOp, Message as _, MessageType, Send as SendFrame, SyncRequest,
};
use im_client::{Client, ClientConfig, RawConn};

use crate::support::*;

/// A GroupOp of `op` on `group` naming `members`; the answer.
async fn op(c: &mut RawConn, req_id: u64, op: Op, group: &str, members: &[&str]) -> Body {
    group_request(
        c,
        req_id,
        GroupOp {
            op: op as i32,
            group_id: group.into(),
            members: members.iter().map(|m| m.to_string()).collect(),
            ..Default::default()
        },
    )
    .await
}

/// Each `(op, target)` on group `board`, as requests `first..`, is refused with `code`.
async fn all_refused(c: &mut RawConn, first: u64, ops: &[(Op, &str)], code: ErrorCode) {
    for (i, (o, target)) in ops.iter().enumerate() {
        let body = op(c, first + i as u64, *o, "board", &[target]).await;
        assert!(refused_with(&body, code), "{o:?} {target}: {body:?}");
    }
}

fn refused_with(body: &Body, code: ErrorCode) -> bool {
    matches!(body, Body::Error(e) if e.code == code as i32)
}

/// A sync naming one conversation with an explicit cursor.
async fn sync_from(c: &mut RawConn, req_id: u64, conv: &str, after: u64) -> Body {
    let sync = SyncRequest {
        cursors: vec![Cursor {
            conversation_id: conv.into(),
            after_seq: after,
        }],
        limit: 1000,
        ..Default::default()
    };
    request(c, req_id, Body::Sync(sync)).await
}

fn synced_in(body: Body, conv: &str) -> Vec<ChatMessage> {
    match body {
        Body::SyncResp(r) => r
            .messages
            .into_iter()
            .filter(|m| m.conversation_id == conv)
            .collect(),
        other => panic!("expected SyncResponse, got {other:?}"),
    }
}

async fn send_text(c: &mut RawConn, req_id: u64, group: &str, text: &str) -> u64 {
    let send = send_to_group(req_id, group, text.as_bytes(), text);
    match request(c, req_id, send.body.expect("a Send")).await {
        Body::SendAck(a) => a.seq,
        other => panic!("send {text}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_groups_refuse_uninvited_joins_and_roles_are_enforced_for_every_op() {
    let server = TestServer::start();
    let mut owner = server.raw("own").await;
    let mut admin = server.raw("adm").await;
    let mut member = server.raw("mem").await;
    let mut stranger = server.raw("eve").await;
    create_group(&mut owner, "board", vec!["adm".into(), "mem".into()]).await;
    let mut promote = GroupOp {
        op: Op::SetRole as i32,
        group_id: "board".into(),
        members: vec!["adm".into()],
        role: Role::Admin as i32,
        ..Default::default()
    };
    let body = group_request(&mut owner, 3, promote.clone()).await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    send_text(&mut owner, 4, "board", "secret plans").await;

    // The stranger: no join, no add, no info, no send, no sync of the history.
    let body = op(&mut stranger, 10, Op::Join, "board", &[]).await;
    assert!(refused_with(&body, ErrorCode::Forbidden), "{body:?}");
    let body = op(&mut stranger, 11, Op::Add, "board", &["eve"]).await;
    assert!(refused_with(&body, ErrorCode::NotMember), "{body:?}");
    let body = op(&mut stranger, 12, Op::Info, "board", &[]).await;
    assert!(refused_with(&body, ErrorCode::NotMember), "{body:?}");
    let body = sync_from(&mut stranger, 13, "g:board", 0).await;
    assert!(refused_with(&body, ErrorCode::NotMember), "{body:?}");
    let managing = [
        Op::Remove,
        Op::Ban,
        Op::Unban,
        Op::SetRole,
        Op::Transfer,
        Op::Dissolve,
    ];
    let on_mem = managing.map(|o| (o, "mem"));
    all_refused(&mut stranger, 20, &on_mem, ErrorCode::NotMember).await;

    // A plain member: everything but LEAVE and INFO is FORBIDDEN.
    let on_adm = managing.map(|o| (o, "adm"));
    all_refused(&mut member, 30, &on_adm, ErrorCode::Forbidden).await;
    all_refused(&mut member, 39, &[(Op::Add, "eve")], ErrorCode::Forbidden).await;
    let body = op(&mut member, 40, Op::Info, "board", &[]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.role == Role::Member as i32 && ok.members == 3),
        "{body:?}"
    );

    // An admin: no TRANSFER, no DISSOLVE, nothing against the owner, no OWNER role.
    let over_admin = [
        (Op::Transfer, "mem"),
        (Op::Dissolve, "mem"),
        (Op::Remove, "own"),
        (Op::Ban, "own"),
    ];
    all_refused(&mut admin, 50, &over_admin, ErrorCode::Forbidden).await;
    promote.members = vec!["mem".into()];
    promote.role = Role::Owner as i32;
    let body = group_request(&mut admin, 60, promote.clone()).await;
    assert!(refused_with(&body, ErrorCode::BadFrame), "{body:?}");
    // ... but an admin adds and removes members.
    let body = op(&mut admin, 61, Op::Add, "board", &["eve"]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.members == 4),
        "{body:?}"
    );
    let body = op(&mut admin, 62, Op::Remove, "board", &["eve"]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.members == 3),
        "{body:?}"
    );

    // The owner may not leave while others are in; transfers, then leaves.
    let body = op(&mut owner, 70, Op::Leave, "board", &[]).await;
    assert!(refused_with(&body, ErrorCode::Forbidden), "{body:?}");
    let body = op(&mut owner, 71, Op::Transfer, "board", &["adm"]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.role == Role::Admin as i32),
        "{body:?}"
    );
    let body = op(&mut admin, 72, Op::Info, "board", &[]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.role == Role::Owner as i32),
        "{body:?}"
    );
    // The operator's view.
    let (status, json) = server.admin_get("/admin/v1/groups/board");
    assert_eq!(status, 200, "{json}");
    let g: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(g["kind"], "private");
    assert_eq!(g["size"], 3);
    assert_eq!(g["members"][0]["user"], "adm");
    assert_eq!(g["members"][0]["role"], "owner");
    assert_eq!(g["members"][2]["role"], "admin");
    assert_eq!(server.admin_get("/admin/v1/groups/nope").0, 404);
    // Dissolve: the group is gone for everyone.
    let body = op(&mut admin, 73, Op::Dissolve, "board", &[]).await;
    assert!(
        matches!(body, Body::GroupOpOk(ref ok) if ok.members == 0),
        "{body:?}"
    );
    member
        .send(&send_to_group(74, "board", b"hello?", "m-1"))
        .await
        .unwrap();
    let f = next_chat_frame(&mut member).await;
    assert!(
        matches!(f.body, Some(Body::Error(ref e)) if e.code == ErrorCode::NotFound as i32),
        "{f:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_groups_read_from_the_join_and_a_rejoin_hides_the_gap() {
    let server = TestServer::start();
    let mut owner = server.raw("host").await;
    let body = group_request(
        &mut owner,
        2,
        GroupOp {
            op: Op::Create as i32,
            group_id: "plaza".into(),
            kind: Kind::Public as i32,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    send_text(&mut owner, 3, "plaza", "before-1").await;
    send_text(&mut owner, 4, "plaza", "before-2").await;

    let mut late = server.raw("late").await;
    let Body::GroupOpOk(joined) = op(&mut late, 5, Op::Join, "plaza", &[]).await else {
        panic!("join refused")
    };
    // An explicit cursor of 0 does not reach before the join.
    let seen = synced_in(sync_from(&mut late, 6, "g:plaza", 0).await, "g:plaza");
    assert_eq!(
        seen.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [joined.version],
        "only the join event: {seen:?}"
    );
    let in_group = send_text(&mut owner, 7, "plaza", "while-in").await;
    let Body::GroupOpOk(left) = op(&mut late, 8, Op::Leave, "plaza", &[]).await else {
        panic!("leave refused")
    };
    let gap = send_text(&mut owner, 9, "plaza", "gap").await;
    let Body::GroupOpOk(back) = op(&mut late, 10, Op::Join, "plaza", &[]).await else {
        panic!("rejoin refused")
    };
    let after = send_text(&mut owner, 11, "plaza", "after").await;
    let seen = synced_in(sync_from(&mut late, 12, "g:plaza", 0).await, "g:plaza");
    let seqs: Vec<u64> = seen.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        [joined.version, in_group, left.version, back.version, after],
        "the gap ({gap}) stays hidden"
    );
    assert!(seen.iter().all(|m| &m.payload[..] != b"gap"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_gets_nothing_more_and_a_ban_holds() {
    let server = TestServer::start();
    let mut owner = server.raw("boss").await;
    let mut kicked = server.raw("kicked").await;
    let mut other = server.raw("stays").await;
    let body = group_request(
        &mut owner,
        2,
        GroupOp {
            op: Op::Create as i32,
            group_id: "crew".into(),
            members: vec!["kicked".into(), "stays".into()],
            kind: Kind::Public as i32,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    let Body::GroupOpOk(removed) = op(&mut owner, 3, Op::Remove, "crew", &["kicked"]).await else {
        panic!("remove refused")
    };
    let after = send_text(&mut owner, 4, "crew", "after removal").await;
    // The other member gets it; the removed one gets its removal event and nothing more.
    let f = next_chat_frame(&mut other).await;
    assert!(
        matches!(f.body, Some(Body::Deliver(ref d)) if d.messages[0].seq == after),
        "{f:?}"
    );
    let mut pushed = Vec::new();
    while let Ok(im_client::RawEvent::Frame(f)) =
        kicked.recv_timeout(Duration::from_millis(500)).await
    {
        if let Some(Body::Deliver(d)) = f.body {
            pushed.extend(d.messages);
        }
    }
    assert!(
        pushed.iter().all(|m| m.seq <= removed.version),
        "{pushed:?}"
    );
    assert!(pushed.iter().any(|m| m.seq == removed.version));
    let body = sync_from(&mut kicked, 5, "g:crew", 0).await;
    assert!(refused_with(&body, ErrorCode::NotMember), "{body:?}");
    let all = raw_sync_all(&mut kicked, 100).await;
    assert!(all.iter().all(|m| m.seq <= removed.version), "{all:?}");
    kicked
        .send(&send_to_group(6, "crew", b"still here?", "k-1"))
        .await
        .unwrap();
    let f = next_chat_frame(&mut kicked).await;
    assert!(
        matches!(f.body, Some(Body::Error(ref e)) if e.code == ErrorCode::NotMember as i32),
        "{f:?}"
    );

    // A ban holds: no self-join of the public group, no re-add, until unbanned.
    let body = op(&mut owner, 7, Op::Ban, "crew", &["kicked"]).await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    let body = op(&mut kicked, 8, Op::Join, "crew", &[]).await;
    assert!(refused_with(&body, ErrorCode::Forbidden), "{body:?}");
    let body = op(&mut owner, 9, Op::Add, "crew", &["kicked"]).await;
    assert!(refused_with(&body, ErrorCode::Forbidden), "{body:?}");
    let (_, json) = server.admin_get("/admin/v1/groups/crew");
    assert!(json.contains("\"banned\":[\"kicked\"]"), "{json}");
    let body = op(&mut owner, 10, Op::Unban, "crew", &["kicked"]).await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    let body = op(&mut kicked, 11, Op::Join, "crew", &[]).await;
    assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_events_arrive_in_seq_order_for_every_member() {
    let server = TestServer::start();
    let mut a = server.raw("ev-a").await;
    let mut b = server.raw("ev-b").await;
    let mut c = server.raw("ev-c").await;
    create_group(&mut a, "evt", vec!["ev-b".into()]).await;
    let ops: Vec<(Op, &str)> = vec![
        (Op::Add, "ev-c"),
        (Op::SetRole, "ev-b"),
        (Op::Remove, "ev-c"),
        (Op::Add, "ev-c"),
    ];
    for (i, (o, who)) in ops.iter().enumerate() {
        let body = group_request(
            &mut a,
            10 + i as u64,
            GroupOp {
                op: *o as i32,
                group_id: "evt".into(),
                members: vec![who.to_string()],
                role: Role::Admin as i32,
                ..Default::default()
            },
        )
        .await;
        assert!(matches!(body, Body::GroupOpOk(_)), "{o:?}: {body:?}");
        send_text(&mut a, 20 + i as u64, "evt", &format!("m{i}")).await;
    }
    let decode = |m: &ChatMessage| -> (Op, String, Vec<String>) {
        assert_eq!(m.r#type, MessageType::System as i32);
        assert_eq!(m.sender, "", "server-authored");
        let e = GroupEvent::decode(&m.payload[..]).expect("a GroupEvent");
        (Op::try_from(e.op).unwrap(), e.actor, e.users)
    };
    // b was in throughout: its pushes came in seq order...
    let mut pushed = Vec::new();
    while pushed.len() < 9 {
        if let Some(Body::Deliver(d)) = next_frame(&mut b).await.body {
            pushed.extend(d.messages.into_iter().map(|m| m.seq));
        }
    }
    assert_eq!(pushed, (1..=9).collect::<Vec<_>>());
    // ... and its sync has every event, in seq order, with the messages between.
    let seen = synced_in(sync_from(&mut b, 30, "g:evt", 0).await, "g:evt");
    assert_eq!(
        seen.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (1..=9).collect::<Vec<_>>()
    );
    let events: Vec<_> = seen
        .iter()
        .filter(|m| m.r#type == MessageType::System as i32)
        .map(decode)
        .collect();
    let expected: Vec<(Op, String, Vec<String>)> = [
        (Op::Create, vec!["ev-a", "ev-b"]),
        (Op::Add, vec!["ev-c"]),
        (Op::SetRole, vec!["ev-b"]),
        (Op::Remove, vec!["ev-c"]),
        (Op::Add, vec!["ev-c"]),
    ]
    .into_iter()
    .map(|(o, u)| {
        (
            o,
            "ev-a".to_owned(),
            u.into_iter().map(String::from).collect(),
        )
    })
    .collect();
    assert_eq!(events, expected);
    // c sees its two intervals: add (2) .. remove (6), and from the re-add (8).
    let seen = synced_in(sync_from(&mut c, 31, "g:evt", 0).await, "g:evt");
    assert_eq!(
        seen.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [2, 3, 4, 5, 6, 8, 9]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_send_system_and_message_ids_are_keys_per_conversation() {
    let server = TestServer::start();
    let mut a = server.raw("sys-a").await;
    let mut b = server.raw("sys-b").await;
    let mut c = server.raw("sys-c").await;
    a.send(&frame(
        3,
        Body::Send(SendFrame {
            target: Some(im_client::proto::send::Target::ToUser("sys-b".into())),
            r#type: MessageType::System as i32,
            payload: b"your account is locked, click here".to_vec().into(),
            client_msg_id: "phish".into(),
        }),
    ))
    .await
    .unwrap();
    let f = next_frame(&mut a).await;
    assert!(
        matches!(f.body, Some(Body::Error(ref e)) if e.code == ErrorCode::Forbidden as i32 && e.message.contains("SYSTEM")),
        "{f:?}"
    );
    // The same client_msg_id to b, then to c: both are new messages, both delivered.
    a.send(&send_to_user(4, "sys-b", b"to b", "same-id"))
        .await
        .unwrap();
    a.send(&send_to_user(5, "sys-c", b"to c", "same-id"))
        .await
        .unwrap();
    let got = acks(&mut a, 2).await;
    assert!(got.iter().all(|(_, k)| !k.duplicate), "{got:?}");
    for (conn, text) in [(&mut b, &b"to b"[..]), (&mut c, &b"to c"[..])] {
        let f = next_frame(conn).await;
        assert!(
            matches!(f.body, Some(Body::Deliver(ref d)) if &d.messages[0].payload[..] == text),
            "{f:?}"
        );
    }
    // Within one conversation it still deduplicates.
    a.send(&send_to_user(6, "sys-c", b"to c", "same-id"))
        .await
        .unwrap();
    let again = acks(&mut a, 1).await;
    assert!(again[0].1.duplicate);
    // Nothing SYSTEM was stored for b.
    let stored = raw_sync_all(&mut b, 100).await;
    assert!(stored
        .iter()
        .all(|m| m.r#type != MessageType::System as i32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_at_its_token_expiry_unless_refreshed() {
    let server = TestServer::start_with(&[("IM_LIMITS_TOKEN_LEEWAY_SECS", "0")]);
    let short = server.token_ttl("brief", Duration::from_secs(2));
    let mut c = server.raw_anonymous().await;
    c.login(&short, "d", false).await.expect("login");
    let mut refreshed = server.raw_anonymous().await;
    refreshed
        .login(
            &server.token_ttl("longer", Duration::from_secs(2)),
            "d",
            false,
        )
        .await
        .expect("login");
    refreshed
        .send(&login_frame(
            &server.token_ttl("longer", Duration::from_secs(60)),
        ))
        .await
        .unwrap();
    assert!(matches!(
        next_frame(&mut refreshed).await.body,
        Some(Body::LoginOk(_))
    ));
    // Another user's token on an open connection is refused.
    let mut swap = server.raw("swapper").await;
    swap.send(&login_frame(&server.token("someone-else")))
        .await
        .unwrap();
    let (code, _, frames) = until_closed(&mut swap).await;
    assert_eq!(code, Some(1008), "{frames:?}");

    let (code, reason, frames) = until_closed(&mut c).await;
    assert_eq!((code, reason.as_str()), (Some(4003), "token expired"));
    assert!(
        frames.iter().any(|f| matches!(&f.body, Some(Body::Error(e)) if e.code == ErrorCode::Unauthenticated as i32)),
        "{frames:?}"
    );
    // The refreshed session is still up past the first token's expiry.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ping_ok(&mut refreshed, 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_closes_sessions_and_refuses_old_tokens_across_a_restart() {
    let mut server = TestServer::start();
    let old = server.token("victim");
    let mut first = server.raw("victim").await;
    let mut second = server.raw("victim").await;
    let mut bystander = server.raw("bystander").await;
    let (status, body) = server.admin_json("POST", "/admin/v1/users/victim/revoke", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"closed\":2"), "{body}");
    for c in [&mut first, &mut second] {
        let (code, reason, _) = until_closed(c).await;
        assert_eq!((code, reason.as_str()), (Some(4003), "token revoked"));
    }
    ping_ok(&mut bystander, 3).await;
    let refused = |server: &TestServer, token: String| {
        let url = server.ws_url();
        async move {
            let mut c = RawConn::connect(&url).await.unwrap();
            c.login(&token, "d", false).await.is_err()
        }
    };
    assert!(
        refused(&server, old.clone()).await,
        "the old token is refused"
    );
    server.restart();
    assert!(
        refused(&server, old.clone()).await,
        "still refused after a restart"
    );
    // A token issued after the revocation works.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut fresh = server.raw("victim").await;
    ping_ok(&mut fresh, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_refreshes_its_token_across_an_expiry_with_no_loss() {
    let server = TestServer::start_with(&[("IM_LIMITS_TOKEN_LEEWAY_SECS", "0")]);
    let issued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let provider = {
        let issued = issued.clone();
        let make = move || token_with_ttl("reader", Duration::from_secs(3));
        move || {
            issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let t = make();
            async move { Ok::<String, String>(t) }
        }
    };
    let cfg = ClientConfig::new(
        server.ws_url(),
        token_with_ttl("reader", Duration::from_secs(3)),
    )
    .with_token_provider(provider);
    let reader = Client::connect(cfg).await.expect("connect");
    let mut writer = server.raw("writer").await;
    // Eight seconds of messages: well past two token lifetimes.
    let mut sent = Vec::new();
    for i in 0..16u64 {
        let text = format!("m{i}");
        writer
            .send(&send_to_user(10 + i, "reader", text.as_bytes(), &text))
            .await
            .unwrap();
        sent.push(text);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(acks(&mut writer, 16).await.len(), 16);
    let mut got = Vec::new();
    while got.len() < sent.len() {
        let m = reader.next_message(WAIT).await.expect("a message");
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(got, sent, "every message once, in order");
    assert!(
        issued.load(std::sync::atomic::Ordering::Relaxed) >= 2,
        "the provider was asked again before each expiry"
    );
    assert_eq!(
        server.metric(
            "im_connections_closed_total",
            &[("reason", "token expired")]
        ),
        0.0,
        "the session never ran past its token"
    );
    assert!(reader.is_connected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_ops_are_rate_limited_per_connection_and_user_and_creations_are_capped() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_GROUP_OP_RATE_PER_SEC", "1"),
        ("IM_LIMITS_GROUP_OP_BURST", "2"),
        ("IM_LIMITS_MAX_GROUPS_PER_USER", "2"),
    ]);
    let mut a = server.raw("maker").await;
    for (i, g) in ["cap1", "cap2"].into_iter().enumerate() {
        let body = op(&mut a, 2 + i as u64, Op::Create, g, &[]).await;
        assert!(matches!(body, Body::GroupOpOk(_)), "{body:?}");
    }
    let body = op(&mut a, 4, Op::Create, "cap3", &[]).await;
    let Body::Error(e) = body else {
        panic!("{body:?}")
    };
    assert_eq!(e.code, ErrorCode::RateLimited as i32);
    assert!(e.retry_after_ms > 0, "{e:?}");
    // The user's bucket is shared by their connections on the node.
    let mut again = server.raw("maker").await;
    let body = op(&mut again, 5, Op::Info, "cap1", &[]).await;
    assert!(refused_with(&body, ErrorCode::RateLimited), "{body:?}");
    // Once the bucket refills, the third creation meets the per-user cap.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let body = op(&mut a, 6, Op::Create, "cap3", &[]).await;
    assert!(refused_with(&body, ErrorCode::Forbidden), "{body:?}");
}
