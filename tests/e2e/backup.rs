//! Online backups against the real binary: `im-server backup` runs as its own process
//! while raw clients send about 500 messages a second; the backup is restored with
//! `im-server restore` into a fresh data dir (a restore into the running node's data dir
//! is refused), a node started there serves, and it holds every message acked before
//! the backup began (compared by conversation and seq, from the acks recorded then).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// Senders, each to its own receiver, and the messages each sends a second.
const SENDERS: usize = 5;
const PER_SENDER_PER_SEC: u64 = 100;
/// Frames sent before waiting for their acks.
const BURST: u64 = 10;

type Acked = Arc<Mutex<Vec<(String, u64)>>>;

/// Runs `im-server <args>` on `data_dir` and returns its output.
fn im_server(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(server_bin())
        .env("IM_DATA_DIR", data_dir)
        .args(args)
        .output()
        .expect("run im-server")
}

/// Sends `PER_SENDER_PER_SEC` messages a second from `s{i}` to `r{i}` until `stop`,
/// recording each ack's (conversation, seq) in `acked`.
fn senders(
    server: &TestServer,
    acked: &Acked,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..SENDERS)
        .map(|i| {
            let (url, token) = (server.ws_url(), server.token(&format!("s{i}")));
            let (acked, stop) = (acked.clone(), stop.clone());
            tokio::spawn(async move {
                let mut c = im_client::RawConn::connect(&url).await.unwrap();
                c.login(&token, "d", false).await.unwrap();
                let to = format!("r{i}");
                let pace = Duration::from_millis(1000 * BURST / PER_SENDER_PER_SEC);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    for _ in 0..BURST {
                        n += 1;
                        c.send(&send_to_user(n, &to, b"backed up?", &format!("m{n}")))
                            .await
                            .unwrap();
                    }
                    for (_, ack) in acks(&mut c, BURST as usize).await {
                        acked.lock().unwrap().push((ack.conversation_id, ack.seq));
                    }
                    tokio::time::sleep(pace.saturating_sub(t.elapsed())).await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_backup_mid_traffic_restores_every_acked_message() {
    let server = TestServer::start();
    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = senders(&server, &acked, &stop);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // What was acked before the backup began must be in it.
    let before: Vec<(String, u64)> = acked.lock().unwrap().clone();
    assert!(before.len() > 500, "too little traffic: {}", before.len());
    let out_dir = tempfile::tempdir().unwrap();
    let dest = out_dir.path().join("im-backup.db");
    let (data_dir, d) = (server.data_dir.clone(), dest.clone());
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        im_server(&data_dir, &["backup", &d.to_string_lossy()])
    })
    .await
    .unwrap();
    let took = t.elapsed();
    let during = acked.lock().unwrap().len() - before.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a sender failed");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("backed up"), "{stdout}");
    let total = acked.lock().unwrap().len();
    eprintln!(
        "backup: {stdout}command {took:?} while {during} messages were acked; {} acked before, {total} in all",
        before.len()
    );

    // Not into the running node's data dir, whatever the flags.
    let out = im_server(
        &server.data_dir,
        &["restore", &dest.to_string_lossy(), "--force"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("a node is running on"), "{err}");

    // Into a fresh data dir; a node started there serves every message acked before.
    let fresh = tempfile::tempdir().unwrap();
    let fresh_data = fresh.path().join("data");
    let out = im_server(&fresh_data, &["restore", &dest.to_string_lossy()]);
    assert!(
        out.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = TestServer::start_with(&[("IM_DATA_DIR", &fresh_data.to_string_lossy())]);
    let mut held: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for i in 0..SENDERS {
        let mut r = restored.raw(&format!("r{i}")).await;
        for m in raw_sync_all(&mut r, 500).await {
            held.entry(m.conversation_id).or_default().insert(m.seq);
        }
    }
    let missing: Vec<&(String, u64)> = before
        .iter()
        .filter(|(conv, seq)| !held.get(conv).is_some_and(|s| s.contains(seq)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} messages acked before the backup are not in the restored node, e.g. {:?}",
        missing.len(),
        before.len(),
        &missing[..missing.len().min(5)]
    );
    let held_total: usize = held.values().map(BTreeSet::len).sum();
    assert!(
        held_total <= total,
        "more restored ({held_total}) than acked ({total})"
    );
}
