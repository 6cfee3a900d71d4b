//! Presence and typing (docs/presence-and-typing.md) against the real binary: presence
//! online, offline, device counts and last seen; hidden presence; strangers cannot be
//! watched; typing reaches the other member and the sender's other devices, is never
//! stored and is rate-limited; across two nodes of a cluster, presence and typing.

use std::time::Instant;

use im_client::proto::{self, frame, Body, ErrorCode, Frame, Presence, Typing};
use im_client::{Event, RawConn};

use crate::support::cluster::TestCluster;
use crate::support::*;

/// Subscribes `c` to `users`; panics unless answered Done.
async fn subscribe(c: &mut RawConn, req_id: u64, users: &[&str]) {
    let body = Body::PresenceSubscribe(proto::PresenceSubscribe {
        users: users.iter().map(|u| (*u).to_owned()).collect(),
    });
    c.send(&frame(req_id, body)).await.unwrap();
    let f = next_frame(c).await;
    assert_eq!(f.req_id, req_id, "{f:?}");
    assert!(matches!(f.body, Some(Body::Done(_))), "{f:?}");
}

/// The next Presence push (other frames are skipped).
async fn next_presence(c: &mut RawConn) -> Presence {
    loop {
        let f = next_frame(c).await;
        if let Some(Body::Presence(p)) = f.body {
            return p;
        }
    }
}

/// `watched`'s last two connections close, `second` then `last`: `watcher` sees one device,
/// then offline. Returns the offline presence and the time just before the last one left.
async fn last_two_leave(watcher: &mut RawConn, second: RawConn, last: RawConn) -> (Presence, i64) {
    drop(second);
    let p = next_presence(watcher).await;
    assert!(p.online && p.devices == 1, "{p:?}");
    let before = proto::now_ms();
    drop(last);
    let p = next_presence(watcher).await;
    assert!(!p.online && p.devices == 0, "{p:?}");
    (p, before)
}

fn presences(frames: &[Frame]) -> Vec<&Presence> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Presence(p)) => Some(p),
            _ => None,
        })
        .collect()
}

fn typings(frames: &[Frame]) -> Vec<&Typing> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Typing(t)) => Some(t),
            _ => None,
        })
        .collect()
}

/// `from` sends one message to `to` (so a direct conversation exists between them).
async fn chat(c: &mut RawConn, to: &str, id: &str) {
    c.send(&send_to_user(77, to, b"hi", id)).await.unwrap();
    acks(c, 1).await;
}

async fn set_hidden(c: &mut RawConn, req_id: u64, hidden: bool) {
    let body = request(c, req_id, Body::SetPresence(proto::SetPresence { hidden })).await;
    assert!(matches!(body, Body::Done(_)), "{body:?}");
}

fn typing_frame(req_id: u64, conv: &str, typing: bool) -> Frame {
    frame(
        req_id,
        Body::Typing(Typing {
            conversation_id: conv.into(),
            typing,
            user_id: String::new(),
        }),
    )
}

#[tokio::test]
async fn presence_follows_devices_and_keeps_last_seen() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    chat(&mut alice, "bob", "m1").await;

    subscribe(&mut alice, 10, &["bob"]).await;
    let p = next_presence(&mut alice).await;
    assert_eq!(p.user_id, "bob");
    assert!(!p.online && p.devices == 0 && p.last_seen == 0, "{p:?}");

    let bob1 = s.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1 && p.last_seen > 0, "{p:?}");
    let bob2 = s.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 2, "{p:?}");

    let (p, before) = last_two_leave(&mut alice, bob2, bob1).await;
    assert!(
        p.last_seen >= before - 1000 && p.last_seen <= proto::now_ms(),
        "{p:?}"
    );
    let last_seen = p.last_seen;

    // The last seen time outlives the disconnect: a new subscriber gets it.
    let mut alice2 = s.raw("alice").await;
    subscribe(&mut alice2, 11, &["bob"]).await;
    let p = next_presence(&mut alice2).await;
    assert!(!p.online && p.last_seen == last_seen, "{p:?}");

    // Unsubscribing stops the pushes.
    subscribe(&mut alice, 12, &[]).await;
    let _bob = s.raw("bob").await;
    let p = next_presence(&mut alice2).await;
    assert!(p.online, "{p:?}");
    assert!(presences(&frames_before_pong(&mut alice, 13).await).is_empty());
}

#[tokio::test]
async fn only_users_sharing_a_conversation_can_be_watched() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let _carol = s.raw("carol").await; // a stranger, online
    let _dave = s.raw("dave").await; // in a group with alice
    create_group(&mut alice, "g-live", vec!["dave".into()]).await;
    chat(&mut alice, "bob", "m1").await;

    subscribe(&mut alice, 20, &["carol", "bob", "dave", "nobody"]).await;
    let got = frames_before_pong(&mut alice, 21).await;
    let mut seen: Vec<(&str, bool)> = presences(&got)
        .iter()
        .map(|p| (p.user_id.as_str(), p.online))
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, vec![("bob", false), ("dave", true)], "{got:?}");

    // The stranger's comings and goings are not pushed either.
    let carol2 = s.raw("carol").await;
    drop(carol2);
    let _bob = s.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert_eq!((p.user_id.as_str(), p.online), ("bob", true));
    let got = frames_before_pong(&mut alice, 22).await;
    assert!(presences(&got).is_empty(), "{got:?}");

    // Too many users at once is refused.
    let many: Vec<String> = (0..501).map(|i| format!("u{i}")).collect();
    let body = request(
        &mut alice,
        23,
        Body::PresenceSubscribe(proto::PresenceSubscribe { users: many }),
    )
    .await;
    assert!(
        matches!(body, Body::Error(ref e) if e.code == ErrorCode::BadFrame as i32),
        "{body:?}"
    );
}

#[tokio::test]
async fn hidden_presence_shows_offline_without_pushes() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    chat(&mut alice, "bob", "m1").await;
    let mut bob = s.raw("bob").await;
    subscribe(&mut alice, 30, &["bob"]).await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1);

    set_hidden(&mut bob, 31, true).await;
    let p = next_presence(&mut alice).await;
    assert!(!p.online && p.devices == 0 && p.last_seen == 0, "{p:?}");

    // While hidden: no pushes as devices come, and a new subscriber sees offline.
    let bob2 = s.raw("bob").await;
    let mut alice2 = s.raw("alice").await;
    subscribe(&mut alice2, 32, &["bob"]).await;
    let p = next_presence(&mut alice2).await;
    assert!(!p.online && p.devices == 0 && p.last_seen == 0, "{p:?}");
    let got = frames_before_pong(&mut alice, 33).await;
    assert!(presences(&got).is_empty(), "{got:?}");

    // Shown again: the real state.
    set_hidden(&mut bob, 34, false).await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 2, "{p:?}");
    let p = next_presence(&mut alice2).await;
    assert!(p.online && p.devices == 2, "{p:?}");
    drop(bob2);
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1, "{p:?}");
}

#[tokio::test]
async fn typing_reaches_members_and_is_never_stored() {
    let s = TestServer::start();
    let mut alice = s.raw("alice").await;
    let mut alice_phone = s.raw("alice").await;
    let mut bob = s.raw("bob").await;
    let mut carol = s.raw("carol").await;
    chat(&mut alice, "bob", "m1").await;
    let conv = proto::direct_conversation("alice", "bob");

    alice.send(&typing_frame(40, &conv, true)).await.unwrap();
    let f = next_frame(&mut alice).await;
    assert!(
        matches!(f.body, Some(Body::Done(_))) && f.req_id == 40,
        "{f:?}"
    );
    for c in [&mut bob, &mut alice_phone] {
        let got = frames_before_pong(c, 41).await;
        let t = typings(&got);
        assert_eq!(t.len(), 1, "{got:?}");
        assert_eq!(
            (
                t[0].conversation_id.as_str(),
                t[0].typing,
                t[0].user_id.as_str()
            ),
            (conv.as_str(), true, "alice")
        );
    }
    // Not to the typing connection itself, nor to anyone else.
    assert!(typings(&frames_before_pong(&mut alice, 42).await).is_empty());
    assert!(typings(&frames_before_pong(&mut carol, 43).await).is_empty());

    // A stranger may not type in the conversation.
    let body = request(
        &mut carol,
        44,
        Body::Typing(Typing {
            conversation_id: conv.clone(),
            typing: true,
            user_id: String::new(),
        }),
    )
    .await;
    assert!(
        matches!(body, Body::Error(ref e) if e.code == ErrorCode::NotMember as i32),
        "{body:?}"
    );

    // Groups: every other member's connections.
    create_group(&mut alice, "g-typing", vec!["bob".into()]).await;
    let body = request(
        &mut bob,
        45,
        Body::Typing(Typing {
            conversation_id: "g:g-typing".into(),
            typing: true,
            user_id: "forged".into(),
        }),
    )
    .await;
    assert!(matches!(body, Body::Done(_)), "{body:?}");
    let got = frames_before_pong(&mut alice, 46).await;
    let t = typings(&got);
    assert_eq!(t.len(), 1, "{got:?}");
    assert_eq!((t[0].user_id.as_str(), t[0].typing), ("bob", true));

    // Nothing of it is stored: a full sync holds the chat message and the group's
    // event only, and the conversation's last seq did not move.
    let mut fresh = s.raw("bob").await;
    let msgs = raw_sync_all(&mut fresh, 100).await;
    let direct: Vec<_> = msgs.iter().filter(|m| m.conversation_id == conv).collect();
    assert_eq!(direct.len(), 1, "{msgs:?}");
    assert_eq!(direct[0].seq, 1);
    assert_eq!(chat_only(msgs.clone()).len(), 1, "{msgs:?}");
    assert!(s.metric("im_typing_total", &[]) >= 2.0);
}

#[tokio::test]
async fn typing_is_rate_limited() {
    let s = TestServer::start_with(&[
        ("IM_LIMITS_TYPING_RATE_PER_SEC", "1"),
        ("IM_LIMITS_TYPING_BURST", "2"),
    ]);
    let mut alice = s.raw("alice").await;
    chat(&mut alice, "bob", "m1").await;
    let conv = proto::direct_conversation("alice", "bob");
    for i in 0..2 {
        let body = request(
            &mut alice,
            50 + i,
            typing_frame(0, &conv, true).body.unwrap(),
        )
        .await;
        assert!(matches!(body, Body::Done(_)), "{body:?}");
    }
    let body = request(&mut alice, 60, typing_frame(0, &conv, true).body.unwrap()).await;
    match body {
        Body::Error(e) => {
            assert_eq!(e.code, ErrorCode::RateLimited as i32, "{e:?}");
            assert!(e.retry_after_ms > 0 && e.retry_after_ms <= 1000, "{e:?}");
        }
        other => panic!("expected RATE_LIMITED, got {other:?}"),
    }
}

#[tokio::test]
async fn sdk_gets_presence_and_typing_events() {
    let s = TestServer::start();
    let alice = s.client("alice").await;
    alice.send_text("bob", "hi").await.unwrap();
    let bob = s.client("bob").await;
    alice.subscribe_presence(vec!["bob".into()]).await.unwrap();
    let conv = proto::direct_conversation("alice", "bob");
    bob.typing(conv.clone(), true).await.unwrap();
    bob.set_presence_hidden(true).await.unwrap();
    let end = Instant::now() + WAIT;
    let (mut online, mut hidden, mut typed) = (false, false, false);
    while !(online && hidden && typed) {
        let left = end.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, alice.next_event())
            .await
            .expect("events in time")
            .expect("an event");
        match ev {
            Event::Presence(p) if p.user_id == "bob" && p.online => online = true,
            Event::Presence(p) if p.user_id == "bob" && online => hidden = !p.online,
            Event::Typing(t) if t.conversation_id == conv && t.user_id == "bob" => typed = true,
            _ => {}
        }
    }
    // The SDK did not take the pushes for errors: it still works.
    alice.ping().await.unwrap();
}

/// The SDK subscribes again after a reconnect: a watcher whose node restarted still
/// gets the watched user's presence without calling `subscribe_presence` again.
#[tokio::test]
async fn sdk_subscribes_again_after_a_reconnect() {
    let mut s = TestServer::start();
    let alice = s.client("alice").await;
    alice.send_text("bob", "hi").await.unwrap();
    alice.subscribe_presence(vec!["bob".into()]).await.unwrap();
    s.restart();
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, alice.next_event())
            .await
            .expect("reconnected in time")
            .expect("an event");
        if matches!(ev, Event::Reconnected { .. }) {
            break;
        }
    }
    // Bob comes online after alice's reconnect: only a subscription sent again by the
    // SDK makes that a Presence event for alice.
    let bob = s.client("bob").await;
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, alice.next_event())
            .await
            .expect("bob's presence after the reconnect")
            .expect("an event");
        if let Event::Presence(p) = ev {
            if p.user_id == "bob" && p.online {
                break;
            }
        }
    }
    bob.ping().await.unwrap();
}

/// Waits until node `i` sees `user` online on another node (its presence map).
async fn wait_remote(c: &TestCluster, i: usize, users: u64) {
    c.wait_for(i, "presence from the other node", |o| {
        o["cluster"]["users_on_other_nodes"] == users
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_and_typing_across_two_nodes() {
    let c = TestCluster::start(2, &[]).await;
    let (n0, n1) = (&c.nodes[0], &c.nodes[1]);
    let mut alice = n0.raw("alice").await;
    chat(&mut alice, "bob", "m1").await;
    let conv = proto::direct_conversation("alice", "bob");

    subscribe(&mut alice, 70, &["bob"]).await;
    let p = next_presence(&mut alice).await;
    assert!(!p.online && p.devices == 0, "{p:?}");

    // bob comes online on the other node: pushed; a second device there counts.
    let mut bob1 = n1.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1, "{p:?}");
    let bob2 = n1.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 2, "{p:?}");
    // and one on this node too: 3 on all nodes.
    let bob3 = n0.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 3, "{p:?}");
    // A new subscriber's first state counts every node's sessions.
    let mut alice2 = n0.raw("alice").await;
    subscribe(&mut alice2, 71, &["bob"]).await;
    let p = next_presence(&mut alice2).await;
    assert!(p.online && p.devices == 3, "{p:?}");
    drop(alice2);

    // Typing from node 0 reaches bob's sessions on node 1.
    let body = request(&mut alice, 72, typing_frame(0, &conv, true).body.unwrap()).await;
    assert!(matches!(body, Body::Done(_)), "{body:?}");
    let t = loop {
        let f = next_frame(&mut bob1).await;
        if let Some(Body::Typing(t)) = f.body {
            break t;
        }
    };
    assert_eq!((t.user_id.as_str(), t.typing), ("alice", true));

    // Going away on the other node: down to the local device, then offline.
    drop(bob3);
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 2, "{p:?}");
    let (p, before) = last_two_leave(&mut alice, bob2, bob1).await;
    assert!(p.last_seen >= before - 1000, "{p:?}");
    wait_remote(&c, 0, 0).await;

    // Hidden on node 1: the subscriber on node 0 sees offline, then the real state.
    let mut bob4 = n1.raw("bob").await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1, "{p:?}");
    set_hidden(&mut bob4, 73, true).await;
    let p = next_presence(&mut alice).await;
    assert!(!p.online && p.devices == 0 && p.last_seen == 0, "{p:?}");
    set_hidden(&mut bob4, 74, false).await;
    let p = next_presence(&mut alice).await;
    assert!(p.online && p.devices == 1, "{p:?}");
    c.cleanup().await;
}
