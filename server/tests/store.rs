//! The store test suite, run unchanged against both backends: a real SQLite file in a
//! temp dir, and the real Postgres (`IM_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), each test in a fresh schema.

use std::sync::Arc;

use bytes::Bytes;
use im_proto::group_op::{Kind, Op, Role};
use im_proto::Message as _;
use im_server::store::{
    CursorUpdate, FlagsUpdate, GroupRequest, ListAfter, NewMessage, PgStore, ReadUpdate,
    SqliteStore, Store, StoreError,
};

#[path = "common/pg.rs"]
mod pg;
use pg::fresh_schema;

/// A store of each backend, freshly created.
async fn stores() -> Vec<(Arc<dyn Store>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("im.db"), true, 2)
        .await
        .expect("sqlite store");
    let pg = PgStore::connect_with(fresh_schema().await, 4)
        .await
        .expect("pg store");
    vec![(Arc::new(sqlite), Some(dir)), (Arc::new(pg), None)]
}

/// `user`'s default device has everything of `conv` up to `seq`.
fn delivered(user: &str, conv: &str, seq: u64) -> CursorUpdate {
    CursorUpdate {
        user_id: user.into(),
        device_id: "default".into(),
        conversation_id: conv.into(),
        seq,
    }
}

fn msg(conv: &str, sender: &str, cmid: &str, body: &str) -> NewMessage {
    let direct = conv
        .strip_prefix("u:")
        .and_then(|r| r.split_once(':'))
        .map(|(a, b)| (a.to_owned(), b.to_owned()));
    NewMessage {
        conversation_id: conv.into(),
        sender: sender.into(),
        client_msg_id: cmid.into(),
        msg_type: 0,
        payload: Bytes::from(body.to_owned()),
        msg_id: uuid::Uuid::now_v7().simple().to_string(),
        direct,
        reference: None,
        traced: false,
    }
}

#[tokio::test]
async fn seqs_are_gapless_per_conversation_across_batches() {
    for (s, _dir) in stores().await {
        let batch = vec![
            msg("u:a:b", "a", "1", "x"),
            msg("u:a:c", "a", "2", "x"),
            msg("u:a:b", "b", "3", "x"),
        ];
        let r = s.commit_batch(&batch, &[]).await.unwrap();
        assert_eq!(
            r.iter().map(|c| c.seq).collect::<Vec<_>>(),
            [1, 1, 2],
            "{}",
            s.backend()
        );
        let r = s
            .commit_batch(
                &[msg("u:a:b", "a", "4", "x"), msg("u:a:b", "a", "", "no id")],
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            r.iter().map(|c| c.seq).collect::<Vec<_>>(),
            [3, 4],
            "{}",
            s.backend()
        );
        assert!(r.iter().all(|c| !c.duplicate));
    }
}

#[tokio::test]
async fn duplicates_are_stored_once_within_and_across_batches() {
    for (s, _dir) in stores().await {
        let first = msg("u:a:b", "a", "same", "x");
        let r = s
            .commit_batch(&[first.clone(), msg("u:a:b", "a", "same", "x")], &[])
            .await
            .unwrap();
        assert!(!r[0].duplicate && r[1].duplicate, "{}: {r:?}", s.backend());
        assert_eq!(r[0].msg_id, r[1].msg_id);
        assert_eq!(r[0].seq, r[1].seq);
        let again = s
            .commit_batch(&[msg("u:a:b", "a", "same", "x")], &[])
            .await
            .unwrap();
        assert!(again[0].duplicate);
        assert_eq!(again[0].msg_id, first.msg_id);
        assert_eq!(again[0].seq, 1);
        // The same client_msg_id from another sender is a different message.
        let other = s
            .commit_batch(&[msg("u:a:b", "b", "same", "x")], &[])
            .await
            .unwrap();
        assert!(!other[0].duplicate);
        assert_eq!(other[0].seq, 2);
        let (all, more) = s.sync("b", &[], 100).await.unwrap();
        assert_eq!(all.len(), 2, "{}", s.backend());
        assert!(!more);
    }
}

#[tokio::test]
async fn a_client_msg_id_is_a_key_per_conversation() {
    for (s, _dir) in stores().await {
        let r = s
            .commit_batch(
                &[
                    msg("u:a:b", "a", "same", "to b"),
                    msg("u:a:c", "a", "same", "to c"),
                ],
                &[],
            )
            .await
            .unwrap();
        assert!(r.iter().all(|c| !c.duplicate), "{}: {r:?}", s.backend());
        let later = s
            .commit_batch(&[msg("u:a:d", "a", "same", "to d")], &[])
            .await
            .unwrap();
        assert!(!later[0].duplicate);
        assert_eq!(later[0].conversation_id, "u:a:d");
        let (d_sees, _) = s.sync("d", &[], 100).await.unwrap();
        assert_eq!(&d_sees[0].payload[..], b"to d");
    }
}

#[tokio::test]
async fn concurrent_duplicates_on_two_nodes_fail_no_batch() {
    // Two Postgres stores on one schema: two nodes committing the same key at once.
    let opts = fresh_schema().await;
    let a = Arc::new(PgStore::connect_with(opts.clone(), 4).await.unwrap());
    let b = Arc::new(PgStore::connect_with(opts, 4).await.unwrap());
    for round in 0..20 {
        let key = format!("k{round}");
        let batch = |sender_extra: &str| {
            vec![
                msg("u:x:y", "x", &key, "dup"),
                msg(
                    "u:p:q",
                    sender_extra,
                    &format!("{key}-{sender_extra}"),
                    "other",
                ),
            ]
        };
        let (ba, bb) = (batch("p"), batch("q"));
        let (ra, rb) = tokio::join!(a.commit_batch(&ba, &[]), b.commit_batch(&bb, &[]));
        let (ra, rb) = (ra.expect("node a's batch"), rb.expect("node b's batch"));
        assert_eq!(
            [ra[0].duplicate, rb[0].duplicate]
                .iter()
                .filter(|d| **d)
                .count(),
            1,
            "exactly one loses: {ra:?} {rb:?}"
        );
        assert_eq!(ra[0].msg_id, rb[0].msg_id);
        assert!(!ra[1].duplicate && !rb[1].duplicate);
    }
}

#[tokio::test]
async fn sync_follows_stored_cursors_overrides_and_limits() {
    for (s, _dir) in stores().await {
        let mut batch = Vec::new();
        for i in 0..5 {
            batch.push(msg("u:a:b", "a", &format!("ab{i}"), &format!("ab{i}")));
            batch.push(msg("u:b:c", "c", &format!("bc{i}"), &format!("bc{i}")));
        }
        batch.push(msg("u:a:c", "a", "ac", "not for b"));
        s.commit_batch(&batch, &[]).await.unwrap();

        let (page, more) = s.sync("b", &[], 3).await.unwrap();
        assert!(more, "{}", s.backend());
        let keys: Vec<(String, u64)> = page
            .iter()
            .map(|m| (m.conversation_id.clone(), m.seq))
            .collect();
        assert_eq!(
            keys,
            [
                ("u:a:b".into(), 1),
                ("u:a:b".into(), 2),
                ("u:a:b".into(), 3)
            ]
        );
        let (page, more) = s.sync("b", &[("u:a:b".into(), 3)], 100).await.unwrap();
        assert!(!more);
        assert_eq!(page.len(), 2 + 5, "{}: {page:?}", s.backend());
        assert!(page.iter().all(|m| m.conversation_id != "u:a:c"));

        // Cursors move forward only; sync then starts after them.
        let cur = |seq| CursorUpdate {
            user_id: "b".into(),
            device_id: "default".into(),
            conversation_id: "u:a:b".into(),
            seq,
        };
        s.commit_batch(&[], &[cur(4)]).await.unwrap();
        s.commit_batch(&[], &[cur(2)]).await.unwrap();
        assert_eq!(s.cursor("b", "u:a:b").await.unwrap(), 4);
        let (page, _) = s.sync("b", &[], 100).await.unwrap();
        let ab: Vec<u64> = page
            .iter()
            .filter(|m| m.conversation_id == "u:a:b")
            .map(|m| m.seq)
            .collect();
        assert_eq!(ab, [5]);
        assert_eq!(&page[0].payload[..], b"ab4");
        assert_eq!(page[0].client_msg_id, "ab4");
    }
}

fn group_req(op: Op, actor: &str, users: &[&str], max_members: u32) -> GroupRequest {
    GroupRequest {
        actor: actor.into(),
        op,
        users: users.iter().map(|u| u.to_string()).collect(),
        kind: Kind::Private,
        role: Role::Member,
        members_can_invite: false,
        max_members,
        max_groups_per_user: 0,
    }
}

#[tokio::test]
async fn groups_roles_events_and_membership_intervals() {
    for (s, _dir) in stores().await {
        let change = |op, actor: &'static str, users: &'static [&'static str], max| {
            let s = s.clone();
            async move {
                s.group_change("g1", &group_req(op, actor, users, max))
                    .await
            }
        };
        let created = change(Op::Create, "a", &["b", "b"], 10).await.unwrap();
        assert_eq!(created.state.members, 2);
        assert_eq!(created.state.role, Role::Owner);
        assert_eq!(created.state.version, 1, "the CREATE event is seq 1");
        let event = created.event.expect("a SYSTEM event");
        assert_eq!(event.r#type, im_proto::MessageType::System as i32);
        let ev = im_proto::GroupEvent::decode(&event.payload[..]).unwrap();
        assert_eq!((ev.op, ev.actor.as_str()), (Op::Create as i32, "a"));
        assert_eq!(ev.users, ["a", "b"]);
        assert!(matches!(
            change(Op::Create, "x", &[], 10).await,
            Err(StoreError::GroupExists(_))
        ));
        assert!(matches!(
            s.group_change("nope", &group_req(Op::Add, "a", &["x"], 10))
                .await,
            Err(StoreError::GroupNotFound(_))
        ));
        // Private: no self-join, and plain members may not add.
        assert!(matches!(
            change(Op::Join, "x", &[], 10).await,
            Err(StoreError::Forbidden(_))
        ));
        assert!(matches!(
            change(Op::Add, "b", &["x"], 10).await,
            Err(StoreError::Forbidden(_))
        ));
        s.commit_batch(
            &[
                msg("g:g1", "a", "g-1", "early"),
                msg("g:g1", "b", "g-2", "early"),
            ],
            &[],
        )
        .await
        .unwrap();
        let added = change(Op::Add, "a", &["c"], 10).await.unwrap();
        assert_eq!((added.state.members, added.state.version), (3, 4));
        assert_eq!(added.added, ["c"]);
        let noop = change(Op::Add, "a", &["c", "b"], 10).await.unwrap();
        assert!(noop.event.is_none() && noop.added.is_empty());
        s.commit_batch(&[msg("g:g1", "a", "g-3", "late")], &[])
            .await
            .unwrap();
        // c reads from its join event (seq 4), even when asking from 0.
        for cursors in [vec![], vec![("g:g1".to_owned(), 0)]] {
            let (c_sees, _) = s.sync("c", &cursors, 100).await.unwrap();
            assert_eq!(
                c_sees.iter().map(|m| m.seq).collect::<Vec<_>>(),
                [4, 5],
                "{}",
                s.backend()
            );
        }
        let (b_sees, _) = s.sync("b", &[("g:g1".to_owned(), 0)], 100).await.unwrap();
        assert_eq!(b_sees.len(), 5);

        assert!(matches!(
            s.group_change("g1", &group_req(Op::Add, "a", &["d", "e"], 4))
                .await,
            Err(StoreError::GroupFull(..))
        ));
        // c leaves (seq 6), a message it must not read (7), c is added again (8).
        let left = change(Op::Leave, "c", &[], 10).await.unwrap();
        assert_eq!(left.removed, ["c"]);
        assert!(matches!(
            change(Op::Leave, "c", &[], 10).await,
            Err(StoreError::NotMember(_))
        ));
        s.commit_batch(&[msg("g:g1", "a", "g-4", "gap")], &[])
            .await
            .unwrap();
        change(Op::Add, "a", &["c"], 10).await.unwrap();
        let (c_sees, _) = s.sync("c", &[("g:g1".to_owned(), 0)], 100).await.unwrap();
        assert_eq!(
            c_sees.iter().map(|m| m.seq).collect::<Vec<_>>(),
            [4, 5, 6, 8],
            "the gap stays hidden ({})",
            s.backend()
        );
        // Roles: an admin cannot remove the owner; a ban holds.
        let mut promote = group_req(Op::SetRole, "a", &["b"], 10);
        promote.role = Role::Admin;
        s.group_change("g1", &promote).await.unwrap();
        assert!(matches!(
            change(Op::Remove, "b", &["a"], 10).await,
            Err(StoreError::Forbidden(_))
        ));
        let banned = change(Op::Ban, "b", &["c"], 10).await.unwrap();
        assert_eq!(banned.removed, ["c"]);
        assert!(matches!(
            change(Op::Add, "a", &["c"], 10).await,
            Err(StoreError::Forbidden(_))
        ));
        let (members, version) = s.group_members("g1").await.unwrap().unwrap();
        assert_eq!(members, ["a", "b"]);
        assert_eq!(version, banned.state.version);
        let info = s.group_info("g1", 10).await.unwrap().unwrap();
        assert_eq!(info.members, [("a".into(), "owner"), ("b".into(), "admin")]);
        assert_eq!(info.banned, ["c"]);
        // Dissolve: the group is gone.
        let gone = change(Op::Dissolve, "a", &[], 10).await.unwrap();
        assert!(gone.dissolved);
        assert!(s.group_members("g1").await.unwrap().is_none());
        assert!(s.group_members("nope").await.unwrap().is_none());
        s.ping().await.unwrap();
    }
}

#[tokio::test]
async fn revocations_persist() {
    for (s, _dir) in stores().await {
        s.revoke("u1", 100).await.unwrap();
        s.revoke("u1", 50).await.unwrap();
        s.revoke("u2", 7).await.unwrap();
        let mut r = s.revocations().await.unwrap();
        r.sort();
        assert_eq!(r, [("u1".to_owned(), 100), ("u2".to_owned(), 7)]);
    }
}

#[tokio::test]
async fn large_batches_and_payloads_round_trip() {
    for (s, _dir) in stores().await {
        let batch: Vec<NewMessage> = (0..1200)
            .map(|i| {
                let mut m = msg("u:x:y", "x", &format!("big{i}"), "");
                m.payload = Bytes::from(vec![(i % 251) as u8; 1 + (i % 7) * 1000]);
                m
            })
            .collect();
        let r = s.commit_batch(&batch, &[]).await.unwrap();
        assert_eq!(r.last().unwrap().seq, 1200, "{}", s.backend());
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let (page, more) = s.sync("y", &[("u:x:y".into(), after)], 500).await.unwrap();
            after = page.last().map_or(after, |m| m.seq);
            all.extend(page);
            if !more {
                break;
            }
        }
        assert_eq!(all.len(), 1200);
        for (i, m) in all.iter().enumerate() {
            assert_eq!(m.payload.len(), 1 + (i % 7) * 1000);
            assert!(m.payload.iter().all(|b| *b == (i % 251) as u8));
        }
    }
}

#[tokio::test]
async fn device_cursors_sync_each_device_from_its_own() {
    for (s, _dir) in stores().await {
        let b = s.backend();
        let batch: Vec<NewMessage> = (0..3)
            .map(|i| msg("u:a:b", "a", &format!("m{i}"), "x"))
            .collect();
        s.commit_batch(&batch, &[]).await.unwrap();
        let cur = |device: &str, seq| CursorUpdate {
            user_id: "b".into(),
            device_id: device.into(),
            conversation_id: "u:a:b".into(),
            seq,
        };
        // Two devices in one batch: each keeps its own, the user's is the furthest.
        s.commit_batch(&[], &[cur("phone", 3), cur("laptop", 1)])
            .await
            .unwrap();
        s.commit_batch(&[], &[cur("phone", 2)]).await.unwrap();
        assert_eq!(s.cursor("b", "u:a:b").await.unwrap(), 3, "{b}");
        assert_eq!(
            s.device_cursor("b", "phone", "u:a:b").await.unwrap(),
            (3, 0)
        );
        let seqs =
            |page: Vec<im_proto::ChatMessage>| -> Vec<u64> { page.iter().map(|m| m.seq).collect() };
        let (p, _) = s
            .sync_device("b", "phone", &[], 100, usize::MAX)
            .await
            .unwrap();
        assert!(p.is_empty(), "{b}: {p:?}");
        let (p, _) = s
            .sync_device("b", "laptop", &[], 100, usize::MAX)
            .await
            .unwrap();
        assert_eq!(seqs(p), [2, 3], "{b}");
        let (p, _) = s
            .sync_device("b", "tablet", &[], 100, usize::MAX)
            .await
            .unwrap();
        assert_eq!(seqs(p), [1, 2, 3], "{b}");
        // The request's cursors win over the device's.
        let (p, _) = s
            .sync_device("b", "phone", &[("u:a:b".into(), 1)], 100, usize::MAX)
            .await
            .unwrap();
        assert_eq!(seqs(p), [2, 3], "{b}");
    }
}

#[tokio::test]
async fn read_cursors_flags_and_the_conversation_list() {
    for (s, _dir) in stores().await {
        let b = s.backend();
        // a <-> b: two from b, one from a. a <-> c: one from c. A group g of a and b.
        s.commit_batch(
            &[msg("u:a:b", "b", "1", "b1"), msg("u:a:b", "b", "2", "b2")],
            &[],
        )
        .await
        .unwrap();
        s.commit_batch(&[msg("u:a:b", "a", "3", "a1")], &[])
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        s.commit_batch(&[msg("u:a:c", "c", "4", "c1")], &[])
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        s.group_change("g", &group_req(Op::Create, "b", &["a"], 10))
            .await
            .unwrap();
        let mut gm = msg("g:g", "b", "5", "hello group");
        gm.direct = None;
        s.commit_batch(&[gm], &[]).await.unwrap();

        let (list, next) = s.list_conversations("a", None, 10, 4).await.unwrap();
        assert!(next.is_none(), "{b}");
        let ids: Vec<&str> = list.iter().map(|c| c.conversation_id.as_str()).collect();
        assert_eq!(ids, ["g:g", "u:a:c", "u:a:b"], "{b}");
        let g = &list[0];
        assert_eq!(
            (g.name.as_str(), g.size, g.unread, g.last_seq),
            ("g", 2, 1, 2),
            "{b}"
        );
        assert_eq!(
            &g.last_message.as_ref().unwrap().payload[..],
            b"hell",
            "{b}"
        );
        let ab = &list[2];
        // a's own send read everything before it.
        assert_eq!((ab.read_seq, ab.unread, ab.peer_read_seq), (3, 0, 2), "{b}");
        assert_eq!(list[1].unread, 1, "{b}");

        // MarkRead forward only; the moved cursors come back.
        let read = |user: &str, device: &str, conv: &str, seq| ReadUpdate {
            user_id: user.into(),
            device_id: device.into(),
            conversation_id: conv.into(),
            seq,
        };
        let moved = s
            .commit_state(
                &[
                    read("a", "phone", "u:a:c", 1),
                    read("a", "laptop", "u:a:c", 1),
                ],
                &[],
            )
            .await
            .unwrap();
        assert_eq!(moved.len(), 1, "{b}: {moved:?}");
        assert_eq!((moved[0].user_id.as_str(), moved[0].seq), ("a", 1));
        assert!(s
            .commit_state(&[read("a", "phone", "u:a:b", 1)], &[])
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.device_cursor("a", "phone", "u:a:b").await.unwrap(),
            (0, 1),
            "{b}"
        );
        // Flags: pinned first, muted kept with its count.
        let flags = FlagsUpdate {
            user_id: "a".into(),
            conversation_id: "u:a:b".into(),
            muted: true,
            pinned: true,
        };
        s.commit_state(&[], &[flags]).await.unwrap();
        let (list, _) = s.list_conversations("a", None, 10, 100).await.unwrap();
        let ids: Vec<&str> = list.iter().map(|c| c.conversation_id.as_str()).collect();
        assert_eq!(ids, ["u:a:b", "g:g", "u:a:c"], "{b}");
        assert!(
            list[0].pinned && list[0].muted && list[0].read_seq == 3,
            "{b}"
        );
        assert_eq!(list[2].unread, 0, "{b}");

        // Paging: one at a time, each once, the same order.
        let mut after: Option<ListAfter> = None;
        let mut paged = Vec::new();
        loop {
            let (page, next) = s
                .list_conversations("a", after.as_ref(), 1, 0)
                .await
                .unwrap();
            paged.extend(page.into_iter().map(|c| c.conversation_id));
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(paged, ids, "{b}");

        // Read counts (large groups): b read by sending, a not yet.
        assert_eq!(
            s.read_count("g:g", 2).await.unwrap(),
            (1, "b".to_owned()),
            "{b}"
        );
        s.commit_state(&[read("a", "phone", "g:g", 2)], &[])
            .await
            .unwrap();
        assert_eq!(s.read_count("g:g", 2).await.unwrap().0, 2, "{b}");
        // A user with nothing lists nothing.
        assert!(s
            .list_conversations("z", None, 10, 10)
            .await
            .unwrap()
            .0
            .is_empty());
    }
}

/// A RECALL (4) or EDIT (5) event of `actor` naming (`seq`, `msg_id`).
fn change(
    conv: &str,
    actor: &str,
    cmid: &str,
    kind: i32,
    seq: u64,
    msg_id: &str,
    body: &str,
) -> NewMessage {
    NewMessage {
        msg_type: kind,
        reference: Some(Box::new(im_server::store::MessageRef {
            seq,
            msg_id: msg_id.into(),
        })),
        ..msg(conv, actor, cmid, body)
    }
}

fn seqs(page: &[im_proto::ChatMessage]) -> Vec<u64> {
    page.iter().map(|m| m.seq).collect()
}

#[tokio::test]
async fn history_pages_backwards_inside_membership_intervals() {
    use im_proto::group_op::Op;
    for (s, _dir) in stores().await {
        let b = s.backend();
        let gc = |op, actor: &'static str, users: &'static [&'static str]| {
            let s = s.clone();
            async move {
                s.group_change("h", &group_req(op, actor, users, 10))
                    .await
                    .unwrap()
            }
        };
        let say = |n: &str| msg("g:h", "a", n, n);
        gc(Op::Create, "a", &[]).await; // seq 1
        s.commit_batch(&[say("1"), say("2")], &[]).await.unwrap(); // 2, 3
        gc(Op::Add, "a", &["c"]).await; // 4: c joins
        s.commit_batch(&[say("3")], &[]).await.unwrap(); // 5
        gc(Op::Remove, "a", &["c"]).await; // 6: c leaves
        s.commit_batch(&[say("4"), say("5")], &[]).await.unwrap(); // 7, 8
        gc(Op::Add, "a", &["c"]).await; // 9: c is back
        s.commit_batch(&[say("6"), say("7")], &[]).await.unwrap(); // 10, 11

        // c: 11 10 9 | 6 5 4, never 7-8 (between intervals) nor 1-3 (before joining).
        let (p, more) = s.history_page("c", "g:h", 0, 4, usize::MAX).await.unwrap();
        assert_eq!(seqs(&p), [11, 10, 9, 6], "{b}");
        assert!(more, "{b}");
        let (p, more) = s.history_page("c", "g:h", 6, 4, usize::MAX).await.unwrap();
        assert_eq!(seqs(&p), [5, 4], "{b}");
        assert!(!more, "{b}: nothing before c's first join");
        // Exactly the rest: more is false even though the page is full.
        let (p, more) = s.history_page("c", "g:h", 6, 2, usize::MAX).await.unwrap();
        assert_eq!((seqs(&p), more), (vec![5, 4], false), "{b}");
        let (p, more) = s.history_page("c", "g:h", 9, 10, usize::MAX).await.unwrap();
        assert_eq!((seqs(&p), more), (vec![6, 5, 4], false), "{b}");
        // The owner reads everything.
        let (p, more) = s.history_page("a", "g:h", 3, 10, usize::MAX).await.unwrap();
        assert_eq!((seqs(&p), more), (vec![2, 1], false), "{b}");
        // A stranger reads nothing.
        let (p, more) = s.history_page("x", "g:h", 0, 10, usize::MAX).await.unwrap();
        assert!(p.is_empty() && !more, "{b}");

        // The byte budget: the first message always, then only what fits.
        let big = "x".repeat(1000);
        let batch: Vec<NewMessage> = (0..5)
            .map(|i| msg("u:a:b", "a", &format!("big{i}"), &big))
            .collect();
        s.commit_batch(&batch, &[]).await.unwrap();
        let (p, more) = s.history_page("b", "u:a:b", 0, 100, 2500).await.unwrap();
        assert_eq!((seqs(&p), more), (vec![5, 4], true), "{b}");
        let (p, more) = s.history_page("b", "u:a:b", 0, 100, 10).await.unwrap();
        assert_eq!((seqs(&p), more), (vec![5], true), "{b}");
    }
}

#[tokio::test]
async fn recall_edit_and_hide_render_in_sync_and_history() {
    use im_proto::MessageState;
    for (s, _dir) in stores().await {
        let b = s.backend();
        let sent = s
            .commit_batch(
                &[
                    msg("u:a:b", "a", "m1", "hello"),
                    msg("u:a:b", "a", "m2", "typo"),
                    msg("u:a:b", "b", "m3", "reply"),
                ],
                &[],
            )
            .await
            .unwrap();
        let id = |i: usize| sent[i].msg_id.clone();
        // Edit seq 2, then recall seq 1; the edit is retried (a duplicate changes nothing).
        let edit = change("u:a:b", "a", "e1", 5, 2, &id(1), "fixed");
        let r = s
            .commit_batch(
                &[edit.clone(), change("u:a:b", "a", "r1", 4, 1, &id(0), "")],
                &[],
            )
            .await
            .unwrap();
        assert_eq!((r[0].seq, r[1].seq), (4, 5), "{b}");
        let again = s.commit_batch(&[edit], &[]).await.unwrap();
        assert!(again[0].duplicate && again[0].seq == 4, "{b}");
        // b hides seq 3.
        s.hide_messages(&[im_server::store::HiddenMessage {
            user_id: "b".into(),
            conversation_id: "u:a:b".into(),
            seq: 3,
        }])
        .await
        .unwrap();

        for reader in ["a", "b"] {
            let (page, _) = s.sync(reader, &[], 100).await.unwrap();
            assert_eq!(seqs(&page), [1, 2, 3, 4, 5], "{b} {reader}: gapless");
            let (hist, more) = s
                .history_page(reader, "u:a:b", 0, 100, usize::MAX)
                .await
                .unwrap();
            assert!(!more);
            let mut hist = hist;
            hist.reverse();
            assert_eq!(hist, page, "{b} {reader}: sync and history render alike");
            assert_eq!(page[0].state, MessageState::Recalled as i32, "{b}");
            assert!(page[0].payload.is_empty(), "{b}");
            assert_eq!(page[1].state, MessageState::Edited as i32, "{b}");
            assert_eq!(&page[1].payload[..], b"fixed", "{b}");
            assert!(page[1].edit_time > 0, "{b}");
            let hidden = reader == "b";
            assert_eq!(
                page[2].state == MessageState::Hidden as i32,
                hidden,
                "{b} {reader}"
            );
            assert_eq!(page[2].payload.is_empty(), hidden, "{b} {reader}");
            assert_eq!(page[3].r#type, 5, "{b}");
            assert_eq!(
                (page[3].ref_seq, page[3].ref_msg_id.as_str()),
                (2, id(1).as_str())
            );
            assert_eq!(&page[3].payload[..], b"fixed");
            assert_eq!(page[4].r#type, 4, "{b}");
            assert_eq!(
                (page[4].ref_seq, page[4].ref_msg_id.as_str()),
                (1, id(0).as_str())
            );
        }
        // Recalling an edited message empties its EDIT events too.
        s.commit_batch(&[change("u:a:b", "a", "r2", 4, 2, &id(1), "")], &[])
            .await
            .unwrap();
        let (page, _) = s.sync("b", &[], 100).await.unwrap();
        assert_eq!(page[1].state, MessageState::Recalled as i32, "{b}");
        assert!(
            page[1].payload.is_empty() && page[3].payload.is_empty(),
            "{b}"
        );

        let meta = s.message_meta("b", "u:a:b", 2).await.unwrap().unwrap();
        assert_eq!((meta.sender.as_str(), meta.state), ("a", 2), "{b}");
        assert!(s.message_meta("b", "u:a:b", 99).await.unwrap().is_none());
        assert_eq!(
            s.find_client_msg("u:a:b", "a", "r2")
                .await
                .unwrap()
                .map(|x| x.0),
            Some(6),
            "{b}"
        );
    }
}

#[tokio::test]
async fn presence_peers_and_hidden_flags() {
    for (s, _dir) in stores().await {
        // a-b talk one-to-one; a, c and d share a group; e is a stranger to a.
        s.commit_batch(&[msg("u:a:b", "a", "p1", "hi")], &[])
            .await
            .unwrap();
        s.group_change("gp", &group_req(Op::Create, "a", &["c", "d"], 10))
            .await
            .unwrap();
        s.commit_batch(&[msg("u:e:f", "e", "p2", "hi")], &[])
            .await
            .unwrap();
        let peers = s
            .presence_peers("a", &["b", "c", "d", "e", "f", "zz"])
            .await
            .unwrap();
        assert_eq!(peers, vec!["b", "c", "d"], "{}", s.backend());
        assert_eq!(s.presence_peers("b", &["a", "c"]).await.unwrap(), vec!["a"]);
        // Leaving the group ends the sharing.
        s.group_change("gp", &group_req(Op::Leave, "d", &[], 10))
            .await
            .unwrap();
        assert_eq!(
            s.presence_peers("a", &["d"]).await.unwrap(),
            Vec::<String>::new()
        );

        assert!(s.presence_hidden(&["a", "b"]).await.unwrap().is_empty());
        s.set_presence_hidden("b", true).await.unwrap();
        s.set_presence_hidden("c", true).await.unwrap();
        s.set_presence_hidden("c", false).await.unwrap();
        assert_eq!(
            s.presence_hidden(&["a", "b", "c"]).await.unwrap(),
            vec!["b"]
        );
    }
}

#[tokio::test]
async fn user_backlog_lists_unread_per_conversation_largest_first() {
    for (s, _dir) in stores().await {
        let mut batch = Vec::new();
        for i in 0..5 {
            batch.push(msg("u:a:b", "a", &format!("ab{i}"), "x"));
        }
        for i in 0..2 {
            batch.push(msg("u:b:c", "c", &format!("bc{i}"), "x"));
        }
        // b's own message: b has read it, so it is no backlog of b's.
        batch.push(msg("u:b:d", "b", "bd0", "x"));
        batch.push(msg("u:a:c", "a", "ac", "not b's"));
        s.commit_batch(&batch, &[]).await.unwrap();
        s.group_change("g1", &group_req(Op::Create, "c", &["b"], 10))
            .await
            .unwrap();
        for i in 0..3 {
            s.commit_batch(&[msg("g:g1", "c", &format!("g{i}"), "x")], &[])
                .await
                .unwrap();
        }
        s.commit_batch(&[], &[delivered("b", "u:a:b", 1)])
            .await
            .unwrap();
        let backend = s.backend();
        let rows: Vec<(String, u64, u64)> = s
            .user_backlog("b", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.conversation_id, r.cursor, r.last_seq))
            .collect();
        // The group's cursor is set by the join; its CREATE event is seq 1.
        let group_cursor = s.cursor("b", "g:g1").await.unwrap();
        assert_eq!(
            rows,
            [
                ("u:a:b".to_owned(), 1, 5),
                ("g:g1".to_owned(), group_cursor, 4),
                ("u:b:c".to_owned(), 0, 2),
            ]
            .into_iter()
            .filter(|r| r.2 > r.1)
            .collect::<Vec<_>>()
            .into_iter()
            .fold(Vec::new(), |mut v, r| {
                v.push(r);
                v.sort_by(|a, b| (b.2 - b.1).cmp(&(a.2 - a.1)).then(a.0.cmp(&b.0)));
                v
            }),
            "{backend}"
        );
        assert_eq!(s.user_backlog("b", 1).await.unwrap().len(), 1, "{backend}");
        assert!(s.user_backlog("nobody", 10).await.unwrap().is_empty());
        // Fully delivered: no backlog.
        s.commit_batch(&[], &[delivered("b", "u:a:b", 5)])
            .await
            .unwrap();
        let convs: Vec<String> = s
            .user_backlog("b", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.conversation_id)
            .collect();
        assert!(!convs.contains(&"u:a:b".to_owned()), "{backend}: {convs:?}");
    }
}

/// A store opens a database a newer release has migrated further (its migrations only
/// add): the previous release must start during a rolling upgrade and after a rollback.
#[tokio::test]
async fn a_newer_releases_migration_does_not_stop_the_previous_release() {
    const NEWER: &str = "INSERT INTO _sqlx_migrations \
        (version, description, success, checksum, execution_time) \
        VALUES (99990001, 'a newer release', TRUE, $1, 1)";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("im.db");
    SqliteStore::open(&path, true, 2).await.expect("first open");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    sqlx::query(NEWER)
        .bind(vec![0u8; 48])
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let sqlite = SqliteStore::open(&path, true, 2)
        .await
        .expect("the previous release opens the newer SQLite schema");
    sqlite.probe_write().await.expect("and writes to it");

    let options = fresh_schema().await;
    PgStore::connect_with(options.clone(), 2)
        .await
        .expect("first connect");
    let pool = sqlx::PgPool::connect_with(options.clone()).await.unwrap();
    sqlx::query(NEWER)
        .bind(vec![0u8; 48])
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let pg = PgStore::connect_with(options, 2)
        .await
        .expect("the previous release opens the newer Postgres schema");
    pg.probe_write().await.expect("and writes to it");
}

/// A webhook event row for `endpoint`.
fn event(endpoint: &str, n: u32) -> im_server::store::outbox::NewEvent {
    let now = im_proto::now_ms();
    im_server::store::outbox::NewEvent {
        endpoint: endpoint.into(),
        event_id: format!("e{n}"),
        kind: "message.created".into(),
        body: format!("{{\"n\":{n}}}"),
        created_ms: now,
        next_ms: now,
        parked: false,
    }
}

#[tokio::test]
async fn the_webhook_outbox_is_written_with_the_commit_and_expanded_once() {
    use im_server::store::outbox::Outcome;
    for (store, _dir) in stores().await {
        let name = store.backend();
        // Off: a commit writes no outbox row.
        store
            .commit_batch(&[msg("u:a:b", "a", "w0", "x")], &[])
            .await
            .unwrap();
        assert_eq!(store.outbox_counts().await.unwrap().sources, 0, "{name}");
        // On: one row per message stored now (a duplicate adds none), with its message.
        store.set_webhook_outbox(true);
        let batch = [msg("u:a:b", "a", "w1", "x"), msg("u:a:b", "a", "w1", "x")];
        let done = store.commit_batch(&batch, &[]).await.unwrap();
        assert_eq!(store.outbox_counts().await.unwrap().sources, 1, "{name}");
        let claimed = store.outbox_claim("n1", 30_000, 10).await.unwrap();
        assert_eq!(claimed.len(), 1, "{name}");
        assert_eq!(claimed[0].msg_id, done[0].msg_id);
        assert_eq!((claimed[0].seq, claimed[0].sender.as_str()), (2, "a"));
        // Claimed rows are not claimed again while the lease holds.
        assert!(store
            .outbox_claim("n2", 30_000, 10)
            .await
            .unwrap()
            .is_empty());
        // Expanded: events stored, the outbox row gone, in one transaction.
        let ids = store
            .outbox_expand(&[claimed[0].id], &[event("push", 1), event("push", 2)], &[])
            .await
            .unwrap();
        assert_eq!(ids.len(), 2);
        let counts = store.outbox_counts().await.unwrap();
        assert_eq!(counts.sources, 0, "{name}");
        assert_eq!(counts.endpoints, vec![("push".to_owned(), 2, 0)], "{name}");
        // Events: claimed once, then delivered, retried or parked; parked ones redeliver.
        let got = store.events_claim("push", "n1", 30_000, 10).await.unwrap();
        assert_eq!(got.len(), 2, "{name}");
        assert!(store
            .events_claim("push", "n2", 30_000, 10)
            .await
            .unwrap()
            .is_empty());
        store
            .events_settle(&[
                Outcome::Delivered(got[0].id),
                Outcome::Park {
                    id: got[1].id,
                    error: "HTTP 500".into(),
                },
            ])
            .await
            .unwrap();
        let parked = store.events_parked("", 10).await.unwrap();
        assert_eq!(parked.len(), 1, "{name}");
        assert_eq!(
            (parked[0].attempts, parked[0].last_error.as_str()),
            (1, "HTTP 500")
        );
        assert_eq!(store.events_redeliver("push", &[]).await.unwrap(), 1);
        let again = store.events_claim("push", "n1", 30_000, 10).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].event_id, got[1].event_id, "{name}: same event id");
        store
            .events_settle(&[Outcome::Retry {
                id: again[0].id,
                next_ms: im_proto::now_ms() + 60_000,
                error: "timed out".into(),
            }])
            .await
            .unwrap();
        assert!(store
            .events_claim("push", "n1", 30_000, 10)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            store.outbox_counts().await.unwrap().endpoints,
            vec![("push".to_owned(), 1, 0)]
        );
    }
}

#[tokio::test]
async fn two_nodes_claim_disjoint_events_and_take_over_after_the_lease() {
    // Two Postgres stores on one schema: two nodes sharing the outbox.
    let opts = fresh_schema().await;
    let a = Arc::new(PgStore::connect_with(opts.clone(), 4).await.unwrap());
    let b = Arc::new(PgStore::connect_with(opts, 4).await.unwrap());
    let events: Vec<_> = (0..200).map(|n| event("push", n)).collect();
    a.outbox_expand(&[], &events, &[]).await.unwrap();
    let (ra, rb) = tokio::join!(
        a.events_claim("push", "a", 1_000, 150),
        b.events_claim("push", "b", 1_000, 150)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.len() + rb.len(), 200, "{} + {}", ra.len(), rb.len());
    let ids: std::collections::HashSet<i64> = ra.iter().chain(&rb).map(|c| c.id).collect();
    assert_eq!(ids.len(), 200, "no event claimed by both");
    // Node a dies with its claims: once the lease ends, b takes them.
    assert!(b
        .events_claim("push", "b", 1_000, 500)
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let taken = b.events_claim("push", "b", 30_000, 500).await.unwrap();
    assert_eq!(taken.len(), 200, "a's and b's own expired leases");
}

#[tokio::test]
async fn the_sqlite_log_is_checkpointed_by_its_own_thread_not_by_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("im.db");
    let store = SqliteStore::open(&path, true, 2).await.unwrap();
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let before = size();
    // About 100 pages: far below SQLite's automatic checkpoint (1,000 pages), which
    // would leave them in the log.
    let body = "x".repeat(3000);
    for i in 0..10 {
        let batch: Vec<NewMessage> = (0..12)
            .map(|j| msg("u:a:b", "a", &format!("c{i}-{j}"), &body))
            .collect();
        store.commit_batch(&batch, &[]).await.unwrap();
    }
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while size() < before + 300_000 {
        assert!(
            std::time::Instant::now() < end,
            "the database file never took the log's pages ({} -> {} bytes)",
            before,
            size()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The SQLite log stays bounded under commits that never pause: the checkpointer's
/// PASSIVE passes never reach the log's end while commits keep coming, so past
/// `RESTART_FRAMES` it runs a RESTART checkpoint and the next commit starts the log
/// again from its beginning (`journal_size_limit` then cuts the file back). Without it
/// the `-wal` file grows by every byte committed.
#[tokio::test]
async fn the_sqlite_log_stays_bounded_under_commits_that_never_pause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("im.db");
    let store = SqliteStore::open(&path, false, 2).await.unwrap();
    let wal = dir.path().join("im.db-wal");
    let wal_size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    // 100 MiB of messages, committed back to back in about 3.5 s (at the pace of a
    // busy node, so the checkpointer's 250 ms passes see the log grow).
    let body = "x".repeat(3000);
    let mut largest = 0;
    for i in 0..350 {
        let batch: Vec<NewMessage> = (0..100)
            .map(|j| msg("u:a:b", "a", &format!("w{i}-{j}"), &body))
            .collect();
        store.commit_batch(&batch, &[]).await.unwrap();
        largest = largest.max(wal_size());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        largest < 60 << 20,
        "the log grew to {largest} bytes over 100 MiB of commits"
    );
}

/// Two Postgres stores on fresh schemas: two regions' databases.
async fn two_regions() -> (PgStore, PgStore) {
    let a = PgStore::connect_with(fresh_schema().await, 4)
        .await
        .unwrap();
    let b = PgStore::connect_with(fresh_schema().await, 4)
        .await
        .unwrap();
    (a, b)
}

/// Multi-region replication's store side (Postgres): the home's commits write outbox
/// rows in their own transactions, read back as records in commit order (a group's
/// SYSTEM event with the group's state); another region applies them only in seq order,
/// once, with the origin ids, and reads them like its own.
#[tokio::test]
async fn region_outbox_records_apply_in_seq_order_once() {
    use im_server::store::repl::Applied;
    let (home, copy) = two_regions().await;
    let (h, c) = (home.replication().unwrap(), copy.replication().unwrap());
    // Off: no rows.
    home.commit_batch(&[msg("u:al:bo", "al", "m0", "before")], &[])
        .await
        .unwrap();
    assert_eq!(h.outbox_len().await.unwrap(), 0);
    h.set_region_outbox(true);
    let sent = home
        .commit_batch(
            &[
                msg("u:al:bo", "al", "m1", "one"),
                msg("u:al:bo", "bo", "m2", "two"),
            ],
            &[],
        )
        .await
        .unwrap();
    home.group_change("crew", &group_req(Op::Create, "al", &["bo"], 100))
        .await
        .unwrap();
    let edit = change("u:al:bo", "al", "e1", 5, 2, &sent[0].msg_id, "one, fixed");
    home.commit_batch(&[edit], &[]).await.unwrap();
    let recs = h.outbox_take("a", 100).await.unwrap();
    let keys: Vec<String> = recs.iter().map(|r| r.msg_id_header()).collect();
    assert_eq!(
        keys,
        ["a:u:al:bo:2", "a:u:al:bo:3", "a:g:crew:1", "a:u:al:bo:4"],
        "commit order"
    );
    let group = recs[2]
        .group
        .as_ref()
        .expect("the group's state on its event");
    assert_eq!((group.version, group.members.len()), (1, 2));
    // The copy has seq 1 from elsewhere (a region's first record of a conversation is
    // its seq 1); here the pre-region message is given as a hole.
    let first = im_server::store::repl::Record {
        seq: 1,
        hole: true,
        msg_id: String::new(),
        group: None,
        ..recs[0].clone()
    };
    assert_eq!(
        c.apply(&recs[0]).await.unwrap(),
        Applied::Gap(0),
        "seq 2 waits"
    );
    assert_eq!(c.apply(&first).await.unwrap(), Applied::Hole);
    for r in &recs {
        assert_eq!(c.apply(r).await.unwrap(), Applied::Stored, "{}", r.seq);
        assert_eq!(c.apply(r).await.unwrap(), Applied::Duplicate, "{}", r.seq);
    }
    h.outbox_done(&recs.iter().map(|r| r.outbox_id).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(h.outbox_len().await.unwrap(), 0);
    // The copy reads them with the origin ids and seqs, the edit applied.
    let (page, _) = copy
        .history_page("bo", "u:al:bo", 0, 10, 1 << 20)
        .await
        .unwrap();
    let got: Vec<(u64, String)> = page.iter().map(|m| (m.seq, m.msg_id.clone())).collect();
    assert_eq!(
        got,
        [
            (4, recs[3].msg_id.clone()),
            (3, sent[1].msg_id.clone()),
            (2, sent[0].msg_id.clone()),
        ]
    );
    assert_eq!(&page[2].payload[..], b"one, fixed");
    assert_eq!(page[2].state, im_proto::MessageState::Edited as i32);
    let (members, version) = copy.group_members("crew").await.unwrap().expect("group");
    assert_eq!((members.len(), version), (2, 1));
    assert_eq!(copy.last_seq("u:al:bo").await.unwrap(), Some(4));
    // One holder of a role's lock at a time; it goes with its session.
    let key = im_proto::now_ms();
    let first = h.lead(key).await.unwrap().expect("free");
    assert!(h.lead(key).await.unwrap().is_none(), "held");
    drop(first);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.lead(key).await.unwrap().is_none() {
        assert!(
            std::time::Instant::now() < end,
            "the lock went with its session"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Home moves' store side (Postgres): a forced move at the new home fences at its
/// applied seq and publishes the move; the old home, recording it, sets aside what it
/// committed above the fence (as records to re-send), drops their outbox rows and
/// moves its applied seq back, so the new home's records apply from the fence on.
#[tokio::test]
async fn a_home_move_fences_and_sets_aside_what_is_above_the_fence() {
    use im_server::store::homes::{MoveReq, Moved};
    use im_server::store::repl::Applied;
    let (old, new) = two_regions().await;
    let (o, n) = (old.replication().unwrap(), new.replication().unwrap());
    let (oh, nh) = (old.homes().unwrap(), new.homes().unwrap());
    o.set_region_outbox(true);
    n.set_region_outbox(true);
    let conv = "u:al:bo";
    let sent = old
        .commit_batch(
            &[msg(conv, "al", "m1", "one"), msg(conv, "bo", "m2", "two")],
            &[],
        )
        .await
        .unwrap();
    let recs = o.outbox_take("a", 100).await.unwrap();
    o.outbox_done(&recs.iter().map(|r| r.outbox_id).collect::<Vec<_>>())
        .await
        .unwrap();
    for r in &recs {
        assert_eq!(n.apply(r).await.unwrap(), Applied::Stored);
    }
    // The old home acks two more that never reach the new one.
    old.commit_batch(
        &[
            msg(conv, "al", "m3", "three"),
            msg(conv, "al", "m4", "four"),
        ],
        &[],
    )
    .await
    .unwrap();
    let forced = MoveReq {
        epoch: 1,
        region: "b",
        fence: None,
        resend: false,
        publish: true,
        local: "b",
    };
    let Moved::Done(row, 0) = nh.record_move(conv, forced.clone()).await.unwrap() else {
        panic!("moved with nothing set aside");
    };
    assert_eq!((row.moved.epoch, row.moved.fence), (1, 2));
    assert!(matches!(
        nh.record_move(
            conv,
            MoveReq {
                epoch: 1,
                region: "a",
                ..forced.clone()
            }
        )
        .await
        .unwrap(),
        Moved::Stale(1)
    ));
    let published = n.outbox_take("b", 100).await.unwrap();
    let m = published[0].home.as_ref().expect("the move is published");
    assert_eq!((m.epoch, m.region.as_str(), m.fence), (1, "b", 2));
    assert_eq!(published[0].msg_id_header(), "b:u:al:bo:home1");
    let rows = nh.homes_after(0, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    // The old home learns it: its seqs 3 and 4 go aside, to be re-sent.
    let learnt = MoveReq {
        epoch: 1,
        region: "b",
        fence: Some(2),
        resend: true,
        publish: false,
        local: "a",
    };
    let Moved::Done(_, aside) = oh.record_move(conv, learnt.clone()).await.unwrap() else {
        panic!("recorded");
    };
    assert_eq!(aside, 2);
    assert_eq!(
        o.outbox_len().await.unwrap(),
        0,
        "their outbox rows dropped"
    );
    let Moved::Done(_, again) = oh.record_move(conv, learnt).await.unwrap() else {
        panic!("a redelivered move is recorded once");
    };
    assert_eq!(again, 0);
    let pending = oh.reconcile_take(10).await.unwrap();
    let seqs: Vec<(u64, String)> = pending
        .iter()
        .map(|(_, r)| (r.seq, r.sender.clone()))
        .collect();
    assert_eq!(seqs, [(3, "al".to_owned()), (4, "al".to_owned())]);
    // The new home's seq 3 applies at the old home now.
    let mut next = recs[1].clone();
    next.seq = 3;
    next.msg_id = "new3".into();
    assert_eq!(o.apply(&next).await.unwrap(), Applied::Stored);
    oh.reconcile_done(pending[0].0, 9).await.unwrap();
    assert_eq!(oh.reconcile_counts().await.unwrap(), (1, 1, 0));
    assert_eq!(nh.seq_of(conv, &sent[0].msg_id, 0).await.unwrap(), Some(1));
    assert_eq!(nh.seq_of(conv, &sent[0].msg_id, 1).await.unwrap(), None);
}

/// A batch applied in one transaction (multi-region replication): each record under its
/// own savepoint, so a duplicate is a no-op, a gap changes nothing, a record the store
/// fails (a malformed payload; a group state Postgres refuses, which aborts the
/// statement) is rolled back alone, and the good records around them commit, in seq
/// order only. A malformed EDIT never blanks the message it names.
#[tokio::test]
async fn region_batch_apply_isolates_failures_and_keeps_seq_order() {
    use im_server::store::repl::{Applied, Record};
    let (home, copy) = two_regions().await;
    let (h, c) = (home.replication().unwrap(), copy.replication().unwrap());
    h.set_region_outbox(true);
    let sent = home
        .commit_batch(
            &[
                msg("u:al:bo", "al", "b1", "one"),
                msg("u:al:bo", "bo", "b2", "two"),
                msg("u:al:bo", "al", "b3", "three"),
                msg("u:al:bo", "bo", "b4", "four"),
                msg("u:al:cy", "al", "c1", "c one"),
                msg("u:al:cy", "cy", "c2", "c two"),
            ],
            &[],
        )
        .await
        .unwrap();
    home.group_change("crew", &group_req(Op::Create, "al", &["bo"], 100))
        .await
        .unwrap();
    let edit = change("u:al:bo", "al", "e1", 5, 1, &sent[0].msg_id, "one, fixed");
    home.commit_batch(&[edit], &[]).await.unwrap();
    let recs = h.outbox_take("a", 100).await.unwrap();
    let by = |conv: &str, seq: u64| -> Record {
        recs.iter()
            .find(|r| r.conversation_id == conv && r.seq == seq)
            .unwrap_or_else(|| panic!("{conv} {seq}"))
            .clone()
    };
    let bad_payload = |r: Record| Record {
        payload: "not base64!".into(),
        ..r
    };
    let mut bad_group = by("g:crew", 1);
    if let Some(g) = bad_group.group.as_mut() {
        // The same member twice: the members' primary key refuses it.
        let first = g.members[0].clone();
        g.members.push(first);
    }
    let batch = vec![
        by("u:al:bo", 1),
        by("u:al:bo", 1),
        bad_payload(by("u:al:cy", 1)),
        by("u:al:cy", 2),
        bad_group,
        by("u:al:bo", 2),
        by("u:al:bo", 4),
        by("u:al:bo", 3),
        by("g:crew", 1),
        by("u:al:bo", 4),
        bad_payload(by("u:al:bo", 5)),
    ];
    let got = c.apply_batch(&batch).await.expect("the batch commits");
    let outcomes: Vec<Option<Applied>> = got.iter().map(|r| r.as_ref().ok().copied()).collect();
    assert_eq!(
        outcomes,
        [
            Some(Applied::Stored),
            Some(Applied::Duplicate),
            None,
            Some(Applied::Gap(0)),
            None,
            Some(Applied::Stored),
            Some(Applied::Gap(2)),
            Some(Applied::Stored),
            Some(Applied::Stored),
            Some(Applied::Stored),
            None,
        ]
    );
    assert_eq!(copy.last_seq("u:al:bo").await.unwrap(), Some(4));
    assert_eq!(
        copy.last_seq("u:al:cy").await.unwrap_or(None).unwrap_or(0),
        0
    );
    let (members, version) = copy.group_members("crew").await.unwrap().expect("group");
    assert_eq!((members.len(), version), (2, 1));
    let (page, _) = copy
        .history_page("bo", "u:al:bo", 0, 10, 1 << 20)
        .await
        .unwrap();
    let got: Vec<(u64, String)> = page.iter().map(|m| (m.seq, m.msg_id.clone())).collect();
    let want: Vec<(u64, String)> = (1..=4)
        .rev()
        .map(|s| (s, by("u:al:bo", s).msg_id))
        .collect();
    assert_eq!(got, want, "each seq once, in order");
    // The record of seq 1 was read at publish, after the edit: it carries the edited
    // text; the malformed EDIT record did not blank it.
    assert_eq!(&page[3].payload[..], b"one, fixed", "not blanked");
    let (cy, _) = copy
        .history_page("cy", "u:al:cy", 0, 10, 1 << 20)
        .await
        .unwrap();
    assert!(cy.is_empty(), "the failed seq 1 and the gap after it");
    // The rest, redelivered, apply in order; the good edit changes the message.
    let rest = [by("u:al:cy", 1), by("u:al:cy", 2), by("u:al:bo", 5)];
    let got = c.apply_batch(&rest).await.unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Ok(Applied::Stored))),
        "{got:?}"
    );
    let (page, _) = copy
        .history_page("bo", "u:al:bo", 0, 10, 1 << 20)
        .await
        .unwrap();
    let first = page.iter().find(|m| m.seq == 1).expect("seq 1");
    assert_eq!(&first.payload[..], b"one, fixed");
    // A batch whose commit fails applies nothing: not tested here (needs a failing
    // commit); the single-record apply keeps its outcomes.
    assert_eq!(
        c.apply(&by("u:al:bo", 5)).await.unwrap(),
        Applied::Duplicate
    );
}

/// Cursors replicate by max: the delivered and read cursors a region moves are written
/// to its cursor outbox in the moving transaction (several moves of one key are one
/// row), taken and applied elsewhere by max (never back, idempotent), and the read
/// cursors that moved there are returned for the receipts.
#[tokio::test]
async fn region_cursors_replicate_by_max() {
    let (here, there) = two_regions().await;
    let (h, t) = (here.replication().unwrap(), there.replication().unwrap());
    let read = |seq| ReadUpdate {
        user_id: "bo".into(),
        device_id: "phone".into(),
        conversation_id: "u:al:bo".into(),
        seq,
    };
    // Off: nothing in the outbox.
    here.commit_state(&[read(1)], &[]).await.unwrap();
    assert!(h.cursors_take(100).await.unwrap().is_empty());
    h.set_region_outbox(true);
    here.commit_state(&[read(2)], &[]).await.unwrap();
    here.commit_state(&[read(3)], &[]).await.unwrap();
    let delivered = CursorUpdate {
        user_id: "bo".into(),
        device_id: "phone".into(),
        conversation_id: "u:al:bo".into(),
        seq: 4,
    };
    here.commit_batch(&[msg("u:al:cy", "al", "x", "x")], &[delivered])
        .await
        .unwrap();
    let mut moves = h.cursors_take(100).await.unwrap();
    moves.sort_by_key(|m| m.kind);
    let got: Vec<(i32, u64)> = moves.iter().map(|m| (m.kind, m.seq)).collect();
    assert_eq!(got, [(0, 4), (1, 3)], "one row per key, the furthest move");
    // Applied elsewhere: the cursors move there, the read one is returned once.
    let moved = t.apply_cursors(&moves).await.unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!((moved[0].user_id.as_str(), moved[0].seq), ("bo", 3));
    assert!(
        t.apply_cursors(&moves).await.unwrap().is_empty(),
        "idempotent"
    );
    assert_eq!(
        there.device_cursor("bo", "phone", "u:al:bo").await.unwrap(),
        (4, 3)
    );
    assert_eq!(there.cursor("bo", "u:al:bo").await.unwrap(), 4);
    // Never back: an older move changes nothing.
    let older: Vec<_> = moves
        .iter()
        .map(|m| im_server::store::repl_cursors::CursorMove {
            seq: 1,
            ..m.clone()
        })
        .collect();
    assert!(t.apply_cursors(&older).await.unwrap().is_empty());
    assert_eq!(
        there.device_cursor("bo", "phone", "u:al:bo").await.unwrap(),
        (4, 3)
    );
    // Published: forgotten, unless the cursor moved further meanwhile.
    here.commit_state(&[read(5)], &[]).await.unwrap();
    h.cursors_done(&moves).await.unwrap();
    let left = h.cursors_take(100).await.unwrap();
    let got: Vec<(i32, u64)> = left.iter().map(|m| (m.kind, m.seq)).collect();
    assert_eq!(got, [(1, 5)]);
}
