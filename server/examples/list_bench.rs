//! Conversation list latency on a real SQLite store: one user with 10,000
//! conversations (direct ones and groups, some pinned, some read, a few messages each),
//! then `Store::list_conversations` timed for the first page, a page from the middle
//! and a walk through every page; prints the median and p90 of each.
//!
//! `cargo run --release -p im-server --example list_bench [-- CONVERSATIONS [RUNS]]`
//! (`LIST_BENCH_DB=PATH` keeps the database at PATH, which must not exist yet).

use std::time::{Duration, Instant};

use bytes::Bytes;
use im_proto::group_op::{Kind, Op, Role};
use im_server::store::{
    FlagsUpdate, GroupRequest, ListAfter, NewMessage, ReadUpdate, SqliteStore, Store,
};

const USER: &str = "me";
const PAGE: u32 = 50;
const PREVIEW: usize = 256;

fn direct(peer: &str, sender: &str, n: usize) -> NewMessage {
    NewMessage {
        conversation_id: im_proto::direct_conversation(USER, peer),
        sender: sender.to_owned(),
        client_msg_id: format!("{peer}-{sender}-{n}"),
        msg_type: 0,
        payload: Bytes::from(vec![b'x'; 400]),
        msg_id: uuid::Uuid::now_v7().simple().to_string(),
        direct: Some((USER.to_owned(), peer.to_owned())),
        reference: None,
        traced: false,
    }
}

fn stats(mut d: Vec<Duration>) -> String {
    d.sort();
    let ms = |x: Duration| x.as_secs_f64() * 1000.0;
    format!(
        "median {:.2} ms, p90 {:.2} ms, min {:.2} ms ({} runs)",
        ms(d[d.len() / 2]),
        ms(d[d.len() * 9 / 10]),
        ms(d[0]),
        d.len()
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(51), |a| a.parse())?;
    // LIST_BENCH_DB=PATH keeps the database there (to look at the query plans).
    let dir = tempfile::tempdir()?;
    let path = std::env::var("LIST_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().join("im.db"));
    let store = SqliteStore::open(&path, false, 2).await?;

    let t = Instant::now();
    let groups = total / 10;
    let directs = total - groups;
    // Direct conversations: two messages from the peer, one from the user.
    let peers: Vec<String> = (0..directs).map(|i| format!("peer{i:05}")).collect();
    for chunk in peers.chunks(150) {
        let mut batch = Vec::new();
        for p in chunk {
            batch.push(direct(p, p, 0));
            batch.push(direct(p, p, 1));
            batch.push(direct(p, USER, 2));
            batch.push(direct(p, p, 3));
        }
        store.commit_batch(&batch, &[]).await?;
    }
    // Groups of 20 members: the user joins each, then a few messages.
    for g in 0..groups {
        let id = format!("grp{g:05}");
        let members: Vec<String> = (0..19).map(|i| format!("m{}", (g + i) % 500)).collect();
        let mut users = members.clone();
        users.push(USER.to_owned());
        let req = GroupRequest {
            actor: members[0].clone(),
            op: Op::Create,
            users: users[1..].to_vec(),
            kind: Kind::Private,
            role: Role::Member,
            members_can_invite: false,
            max_members: 1000,
            max_groups_per_user: 0,
        };
        store.group_change(&id, &req).await?;
        let batch: Vec<NewMessage> = (0..3)
            .map(|n| NewMessage {
                conversation_id: im_proto::group_conversation(&id),
                sender: members[n].clone(),
                client_msg_id: format!("{id}-{n}"),
                msg_type: 0,
                payload: Bytes::from(vec![b'g'; 200]),
                msg_id: uuid::Uuid::now_v7().simple().to_string(),
                direct: None,
                reference: None,
                traced: false,
            })
            .collect();
        store.commit_batch(&batch, &[]).await?;
    }
    // Some read, some pinned and muted.
    let reads: Vec<ReadUpdate> = peers
        .iter()
        .step_by(3)
        .map(|p| ReadUpdate {
            user_id: USER.to_owned(),
            device_id: "default".to_owned(),
            conversation_id: im_proto::direct_conversation(USER, p),
            seq: 4,
        })
        .collect();
    let flags: Vec<FlagsUpdate> = peers
        .iter()
        .step_by(500)
        .map(|p| FlagsUpdate {
            user_id: USER.to_owned(),
            conversation_id: im_proto::direct_conversation(USER, p),
            muted: true,
            pinned: true,
        })
        .collect();
    store.commit_state(&reads, &flags).await?;
    println!(
        "filled {total} conversations of {USER:?} ({directs} direct, {groups} groups) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Warm-up, and the middle page's start.
    let mut after: Option<ListAfter> = None;
    let mut pages = 0;
    let mut seen = 0;
    let mut middle = None;
    let mut walk = Vec::new();
    loop {
        let t = Instant::now();
        let (page, next) = store
            .list_conversations(USER, after.as_ref(), PAGE, PREVIEW)
            .await?;
        walk.push(t.elapsed());
        pages += 1;
        seen += page.len();
        if pages == total / PAGE as usize / 2 {
            middle = next.clone();
        }
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, total, "every conversation once");
    let mut first = Vec::new();
    let mut mid = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let (page, _) = store.list_conversations(USER, None, PAGE, PREVIEW).await?;
        first.push(t.elapsed());
        assert_eq!(page.len(), PAGE as usize);
        let t = Instant::now();
        store
            .list_conversations(USER, middle.as_ref(), PAGE, PREVIEW)
            .await?;
        mid.push(t.elapsed());
    }
    println!("first page of {PAGE}: {}", stats(first));
    println!("middle page of {PAGE}: {}", stats(mid));
    println!("walk of {pages} pages, per page: {}", stats(walk));
    Ok(())
}
