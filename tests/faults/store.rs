//! Store faults: the data dir's disk filled to ENOSPC (SQLite), free space under the
//! configured floor, and the Postgres service stopped and started under load.

use std::time::{Duration, Instant};

use crate::support::cluster::pg_url;
use crate::support::faults::{
    assert_stored_once, exclusive, pair_count, report, Acked, Outcome, Pair, PgService, Tmpfs,
    Traffic,
};
use crate::support::{http, raw_sync_all, TestServer};

fn pairs(server: &TestServer, n: usize) -> Vec<Pair> {
    (0..n)
        .map(|i| Pair {
            sender: format!("s{i}"),
            receiver: format!("r{i}"),
            sender_url: server.ws_url(),
            receiver_url: server.ws_url(),
        })
        .collect()
}

/// `/readyz` as (status, body), bounded by the caller's patience.
fn readyz(server: &TestServer) -> (u16, String) {
    http(server.admin_addr, "GET", "/readyz", None)
}

/// Polls `/readyz` until it answers `status`; returns the body it answered with, or
/// what it answered last when `limit` passed first (the caller asserts, after the checks
/// of the data).
async fn readyz_becomes(server: &TestServer, status: u16, limit: Duration) -> String {
    let end = Instant::now() + limit;
    loop {
        let (s, body) = readyz(server);
        if s == status || Instant::now() >= end {
            return if s == status {
                body
            } else {
                format!("still {s} {body}")
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Everything stored for the receivers of `acked`, read back by a full sync of each.
async fn synced(server: &TestServer, acked: &[Acked]) -> Vec<im_client::proto::ChatMessage> {
    let mut receivers: Vec<&str> = acked.iter().map(|a| a.receiver.as_str()).collect();
    receivers.sort_unstable();
    receivers.dedup();
    let mut all = Vec::new();
    for r in receivers {
        let mut c = server.raw(r).await;
        all.extend(raw_sync_all(&mut c, 1000).await);
    }
    all
}

/// Every acked message reached its (always online) receiver as a push.
fn assert_pushed(out: &Outcome) {
    let missing: Vec<&str> = out
        .acked
        .iter()
        .filter(|a| {
            !out.pushed
                .get(&a.receiver)
                .is_some_and(|got| got.contains(&a.client_msg_id))
        })
        .map(|a| a.client_msg_id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} acked messages never reached their online receiver, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_disk_full_then_freed_loses_no_acked_message() {
    let _x = exclusive().await;
    let disk = Tmpfs::mount(24);
    let data = disk.path().join("data");
    let data = data.to_string_lossy().into_owned();
    // The free-space floor off: this case is about the real ENOSPC.
    let mut server =
        TestServer::start_with(&[("IM_DATA_DIR", &data), ("IM_STORE_MIN_FREE_DISK_MB", "0")]);
    let traffic = Traffic::start(&pairs(&server, pair_count(8)), |u| server.token(u), 200);
    traffic.wait_acks(300, Duration::from_secs(20)).await;
    assert_eq!(readyz(&server).0, 200);

    disk.fill(0);
    // Sends keep coming for a while against the full disk.
    let full_body = readyz_becomes(&server, 503, Duration::from_secs(10)).await;
    let acked_full = traffic.acked();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acked_while_full = traffic.acked() - acked_full;

    disk.free();
    // Recovers by itself, no restart.
    let recovery = traffic.wait_acks(1, Duration::from_secs(30)).await;
    traffic.wait_acks(300, Duration::from_secs(30)).await;
    let healed_body = readyz_becomes(&server, 200, Duration::from_secs(30)).await;
    let out = traffic.stop(Duration::from_secs(2)).await;
    report("sqlite_disk_full", &out, recovery, &full_body);

    // Only what was durably committed survives a SIGKILL.
    server.restart();
    let stored = synced(&server, &out.acked).await;
    assert_stored_once(&out.acked, &stored);
    assert_pushed(&out);
    assert!(
        out.retried > 0,
        "the full disk was never noticed by a sender"
    );
    assert_eq!(full_body, "not ready: disk_full");
    assert_eq!(healed_body, "ready");
    assert!(
        acked_while_full < 50,
        "{acked_while_full} sends acked in 2 s against a full disk"
    );
    assert!(
        out.refused.is_empty(),
        "refused for good: {:?}",
        out.refused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_low_free_space_refuses_sends_before_the_disk_is_full() {
    let _x = exclusive().await;
    let disk = Tmpfs::mount(24);
    let data = disk.path().join("data");
    let data = data.to_string_lossy().into_owned();
    let server = TestServer::start_with(&[
        ("IM_DATA_DIR", &data),
        ("IM_STORE_MIN_FREE_DISK_MB", "8"),
        ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
    ]);
    let traffic = Traffic::start(&pairs(&server, pair_count(4)), |u| server.token(u), 100);
    traffic.wait_acks(100, Duration::from_secs(20)).await;

    disk.fill(4 << 20);
    assert_eq!(
        readyz_becomes(&server, 503, Duration::from_secs(10)).await,
        "not ready: disk_low"
    );
    let overview: serde_json::Value =
        serde_json::from_str(&server.admin_get("/admin/v1/overview").1).expect("overview");
    assert_eq!(
        overview["capacity"]["limiting_resource"], "disk",
        "{overview}"
    );
    let before = traffic.acked();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        traffic.acked(),
        before,
        "sends acked below the free-space floor"
    );
    assert!(
        disk.free_bytes() > 1 << 20,
        "the floor let the disk fill up"
    );

    disk.free();
    let recovery = traffic.wait_acks(1, Duration::from_secs(30)).await;
    traffic.wait_acks(100, Duration::from_secs(30)).await;
    assert_eq!(
        readyz_becomes(&server, 200, Duration::from_secs(10)).await,
        "ready"
    );
    let out = traffic.stop(Duration::from_secs(2)).await;
    report("sqlite_disk_low", &out, recovery, "not ready: disk_low");
    assert_stored_once(&out.acked, &synced(&server, &out.acked).await);
    assert_pushed(&out);
    assert!(out.retried > 0);
    assert!(
        !server.log().contains("disk is full"),
        "the floor should refuse before SQLite sees ENOSPC"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stopped_and_started_answers_and_recovers() {
    let _x = exclusive().await;
    let pg = PgService::local();
    let schema = format!("f_{}", uuid::Uuid::now_v7().simple());
    let admin = sqlx::PgPool::connect(&pg_url()).await.expect("Postgres");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("schema");
    admin.close().await;
    let db = format!("{}?options[search_path]={schema}", pg_url());
    let server = TestServer::start_with(&[
        ("IM_DATABASE_URL", &db),
        ("IM_STORE_UNAVAILABLE_AFTER_MS", "1000"),
    ]);
    let traffic = Traffic::start(&pairs(&server, pair_count(8)), |u| server.token(u), 100);
    traffic.wait_acks(300, Duration::from_secs(20)).await;

    pg.stop();
    let t = Instant::now();
    let (status, body) = readyz(&server);
    let readyz_took = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = traffic.acked();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked_while_down = traffic.acked() - before;
    pg.start();
    let recovery = traffic.wait_acks(1, Duration::from_secs(30)).await;
    traffic.wait_acks(300, Duration::from_secs(30)).await;
    assert_eq!(
        readyz_becomes(&server, 200, Duration::from_secs(30)).await,
        "ready"
    );
    let out = traffic.stop(Duration::from_secs(2)).await;
    report(
        "postgres_stopped",
        &out,
        recovery,
        &format!("{status} {body}"),
    );

    assert_stored_once(&out.acked, &synced(&server, &out.acked).await);
    assert_pushed(&out);
    assert_eq!(acked_while_down, 0, "acks while Postgres was down");
    assert!(
        out.retried > 0,
        "no sender was told to retry during the outage"
    );
    // Every Send got an answer: nobody waited out the 10 s reply timeout and reconnected.
    assert_eq!(
        out.reconnects, 0,
        "senders or receivers lost their connection"
    );
    // Either the ping timed out ("store") or the writer had already failed a commit.
    assert!(
        status == 503 && ["not ready: store", "not ready: store_down"].contains(&body.as_str()),
        "/readyz with Postgres down: {status} {body:?}"
    );
    assert!(
        readyz_took < Duration::from_secs(3),
        "/readyz took {readyz_took:?} with Postgres down"
    );
}
