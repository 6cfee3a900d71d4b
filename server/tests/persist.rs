//! The persistence writer's rounds, driven through a real pipeline: on a temp SQLite
//! store, when a round of delivery cursors alone commits (`persist.cursor_wait_ms`); on
//! the real Postgres, delivery cursors committed beside the messages, in shares.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use im_server::config::Config;
use im_server::obs::Metrics;
use im_server::persist::WriteReq;
use im_server::pipeline::Pipeline;
use im_server::store::{CursorUpdate, NewMessage, PgStore, Store};

#[path = "common/pg.rs"]
mod pg;

const CONV: &str = "u:alice:bob";

/// A pipeline on a fresh SQLite store with `cursor_wait_ms`, holding one message from
/// alice to bob (so bob has the conversation and a cursor in it).
async fn pipeline(cursor_wait_ms: u32) -> (Arc<Pipeline>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    config.persist.cursor_wait_ms = cursor_wait_ms;
    config.validate().expect("test config validates");
    let store = im_server::store::open(&config).await.expect("store");
    (spawn_with_message(store, &config).await, dir)
}

/// The pipeline on `store` after alice's first message to bob is committed.
async fn spawn_with_message(store: Arc<dyn Store>, config: &Config) -> Arc<Pipeline> {
    let message = NewMessage {
        conversation_id: CONV.into(),
        sender: "alice".into(),
        client_msg_id: "m1".into(),
        msg_type: 0,
        payload: Bytes::from_static(b"hi"),
        msg_id: uuid::Uuid::now_v7().simple().to_string(),
        direct: Some(("alice".into(), "bob".into())),
        reference: None,
        traced: false,
    };
    store
        .commit_batch(&[message], &[])
        .await
        .expect("a message");
    Pipeline::spawn(store, config, Metrics::new(true))
}

/// Bob's phone acks seq 1 through the writer's queue, as a DeliverAck does.
fn ack(p: &Pipeline) {
    ack_from(p, "phone");
}

/// Bob's `device` acks seq 1.
fn ack_from(p: &Pipeline, device: &str) {
    let cursor = CursorUpdate {
        user_id: "bob".into(),
        device_id: device.into(),
        conversation_id: CONV.into(),
        seq: 1,
    };
    assert!(p.persist.try_submit(WriteReq::Cursor(cursor)).is_ok());
}

/// The stored delivered cursor of bob's phone in the conversation.
async fn stored(p: &Pipeline) -> u64 {
    let cursors = p
        .store
        .device_delivered("bob", "phone")
        .await
        .expect("read");
    cursors
        .iter()
        .find(|(c, _)| c == CONV)
        .map_or(0, |(_, seq)| *seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_cursor_waits_for_a_write_and_rides_with_it() {
    // The longest wait the config allows, so the check below is well inside it.
    let (p, _dir) = pipeline(1_000).await;
    ack(&p);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(stored(&p).await, 0, "a cursor alone waits for company");
    // Any other request ends the wait: the cursor commits in its round.
    p.persist.flush().await;
    assert_eq!(
        stored(&p).await,
        1,
        "the flush's round committed the cursor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_cursor_commits_when_its_wait_ends() {
    for wait_ms in [0, 200] {
        let (p, _dir) = pipeline(wait_ms).await;
        ack(&p);
        let end = Instant::now() + Duration::from_secs(10);
        while stored(&p).await != 1 {
            assert!(Instant::now() < end, "wait {wait_ms} ms: never committed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_cursors_commit_beside_in_shares_and_a_flush_waits_for_all_of_them() {
    let options = pg::fresh_schema().await;
    let admin = sqlx::PgPool::connect_with(options.clone())
        .await
        .expect("pg pool");
    let store = PgStore::connect_with(options, 4).await.expect("pg store");
    assert!(store.commits_side_by_side());
    let p = spawn_with_message(Arc::new(store), &Config::default()).await;
    let stored = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM device_cursors WHERE user_id = 'bob' AND delivered_seq = 1",
        )
        .fetch_one(&admin)
        .await
        .expect("count")
    };
    // Two and a half shares' worth of devices at once: share after share commits
    // beside, with nothing else queued.
    for d in 0..2_500 {
        ack_from(&p, &format!("phone{d}"));
    }
    let end = Instant::now() + Duration::from_secs(20);
    while stored().await != 2_500 {
        assert!(
            Instant::now() < end,
            "only {} of 2,500 committed",
            stored().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A flush is answered once every cursor queued before it is committed.
    for d in 0..2_500 {
        ack_from(&p, &format!("tablet{d}"));
    }
    p.persist.flush().await;
    assert_eq!(
        stored().await,
        5_000,
        "every cursor before the flush answered"
    );
    assert_eq!(p.store.cursor("bob", CONV).await.expect("read"), 1);
}
