//! The store test suite, run unchanged against both backends: a real SQLite file in a
//! temp dir, and the real Postgres (`IM_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), each test in a fresh schema.

use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use im_proto::group_op::{Kind, Op, Role};
use im_proto::Message as _;
use im_server::store::{
    CursorUpdate, GroupRequest, NewMessage, PgStore, SqliteStore, Store, StoreError,
};

fn pg_url() -> String {
    std::env::var("IM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

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

/// Connect options for a fresh Postgres schema (stale ones are dropped first).
async fn fresh_schema() -> sqlx::postgres::PgConnectOptions {
    let schema = format!(
        "t_{}",
        uuid::Uuid::now_v7().simple().to_string().to_lowercase()
    );
    let admin = sqlx::PgPool::connect(&pg_url())
        .await
        .unwrap_or_else(|e| panic!("Postgres at {} is required: {e}", pg_url()));
    drop_stale_schemas(&admin).await;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::postgres::PgConnectOptions::from_str(&pg_url())
        .unwrap()
        .options([("search_path", schema.as_str())])
}

/// Drops test schemas more than an hour old (their uuid v7 names carry the creation time).
async fn drop_stale_schemas(admin: &sqlx::PgPool) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 't\\_%'")
            .fetch_all(admin)
            .await
            .unwrap_or_default();
    let now_ms = im_proto::now_ms() as u64;
    for name in names {
        let created = name
            .get(2..14)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        if created.is_some_and(|ms| now_ms.saturating_sub(ms) > 3_600_000) {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .execute(admin)
                .await;
        }
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
