//! Hardening: connection caps answered before the upgrade, the graceful SIGTERM drain
//! (nothing read is left unacked, everything acked is stored), and secrets kept out of
//! logs, the admin API and readable files.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use im_client::proto::{Body, SendAck};
use im_client::RawEvent;

use crate::support::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn connection_caps_refuse_with_503_and_free_slots_on_close() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_MAX_CONNECTIONS", "3"),
        ("IM_LIMITS_MAX_CONNECTIONS_PER_IP", "2"),
    ]);
    let addr = server.client_addr;
    let (a1, s_a1) = ws_upgrade_from(addr, ip(1));
    let (a2, _s_a2) = ws_upgrade_from(addr, ip(1));
    assert_eq!(status_of(&a1), 101, "{a1}");
    assert_eq!(status_of(&a2), 101, "{a2}");

    // A third from the same address: refused for the per-address cap.
    let (a3, _) = ws_upgrade_from(addr, ip(1));
    assert_eq!(status_of(&a3), 503, "{a3}");
    assert!(
        a3.contains("too many connections from this address"),
        "{a3}"
    );
    assert!(a3.to_ascii_lowercase().contains("retry-after: 1"), "{a3}");

    // Another address fits once, then the node is full.
    let (b1, _s_b1) = ws_upgrade_from(addr, ip(2));
    assert_eq!(status_of(&b1), 101, "{b1}");
    let (b2, _) = ws_upgrade_from(addr, ip(2));
    assert_eq!(status_of(&b2), 503, "{b2}");
    assert!(b2.contains("connection limit"), "{b2}");
    assert_eq!(
        server.metric("im_connections_refused_total", &[("reason", "per_ip")]),
        1.0
    );
    assert_eq!(
        server.metric("im_connections_refused_total", &[("reason", "node_full")]),
        1.0
    );
    // The gauge counts a connection once its upgraded task runs, just after the 101.
    wait_until("3 connections counted", || {
        server.metric("im_connections", &[]) == 3.0
    });
    let (_, body) = server.admin_get("/admin/v1/overview");
    let o: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(o["max_connections"], 3, "{body}");
    assert_eq!(o["max_connections_per_ip"], 2);
    assert_eq!(o["connections_refused"]["per_ip"], 1);
    assert_eq!(o["connections_refused"]["node_full"], 1);
    assert_eq!(o["draining"], false);

    // Closing one frees its slot: the refused address gets in.
    drop(s_a1);
    let mut admitted = None;
    for _ in 0..100 {
        let (b3, s) = ws_upgrade_from(addr, ip(2));
        if status_of(&b3) == 101 {
            admitted = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        admitted.is_some(),
        "the slot of a closed connection was not freed"
    );
    // Refusals are cheap and clean: the server still serves the admitted ones.
    assert_eq!(server.admin_get("/healthz").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drain_acks_every_read_send_and_stores_every_acked_one() {
    // Small batches make many commits, so the SIGTERM lands between them.
    let mut server = TestServer::start_with(&[
        ("IM_PERSIST_BATCH_MAX", "8"),
        ("IM_PERSIST_BATCH_WAIT_MS", "0"),
        ("IM_LIMITS_SEND_RATE_PER_SEC", "0"),
    ]);
    let acked_so_far = Arc::new(AtomicUsize::new(0));
    const SENDERS: usize = 4;
    const EACH: usize = 1500;
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let mut c = server.raw(&format!("drainer{s}")).await;
        let counter = acked_so_far.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let id = format!("d{s}-{i}");
                if c.send(&send_to_user(i as u64 + 1, "sink", id.as_bytes(), &id))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let mut acked: Vec<SendAck> = Vec::new();
            let close = loop {
                match c.recv_timeout(WAIT).await {
                    Ok(RawEvent::Frame(f)) => {
                        if let Some(Body::SendAck(a)) = f.body {
                            acked.push(a);
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(RawEvent::Closed { code, reason }) => break (code, reason),
                    Ok(RawEvent::WsPong(_)) => {}
                    Err(e) => break (None, e.to_string()),
                }
            };
            (acked, close)
        }));
    }
    let deadline = std::time::Instant::now() + WAIT;
    while acked_so_far.load(Ordering::Relaxed) < 200 {
        assert!(std::time::Instant::now() < deadline, "no acks arrived");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.sigterm();
    let at_sigterm = acked_so_far.load(Ordering::Relaxed);
    let mut acked = Vec::new();
    for t in tasks {
        let (a, (code, reason)) = t.await.unwrap();
        assert_eq!(
            code,
            Some(1001),
            "every client is told the server is going away (reason {reason:?})"
        );
        assert_eq!(reason, "server shutting down");
        acked.extend(a);
    }
    let status = server
        .wait_exit(Duration::from_secs(20))
        .expect("the server exits after the drain");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        at_sigterm < SENDERS * EACH,
        "all sends were acked before the SIGTERM; the drain caught none in flight"
    );
    let log = server.log();
    assert!(log.contains("draining"), "{log}");
    assert!(log.contains("committed=true"), "{log}");

    server.restart();
    let mut sink = server.raw("sink").await;
    let stored = raw_sync_all(&mut sink, 1000).await;
    let stored_ids: HashMap<&str, (&str, u64)> = stored
        .iter()
        .map(|m| {
            (
                m.client_msg_id.as_str(),
                (m.conversation_id.as_str(), m.seq),
            )
        })
        .collect();
    assert_eq!(stored_ids.len(), stored.len(), "a message is stored twice");
    // Every acked send is stored where its ack said...
    for a in &acked {
        assert_eq!(
            stored_ids.get(a.client_msg_id.as_str()),
            Some(&(a.conversation_id.as_str(), a.seq)),
            "acked {a:?} is not stored as acked"
        );
    }
    // ... and every send the server took in was acked before the close: the drain
    // commits first and closes after, so no sender is left guessing.
    let acked_ids: BTreeSet<&str> = acked.iter().map(|a| a.client_msg_id.as_str()).collect();
    let stored_set: BTreeSet<&str> = stored_ids.keys().copied().collect();
    let unacked: Vec<_> = stored_set.difference(&acked_ids).take(5).collect();
    assert!(
        unacked.is_empty(),
        "stored but never acked to the sender: {unacked:?} ({} stored, {} acked)",
        stored_set.len(),
        acked_ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_logs_and_the_admin_api() {
    // The most verbose level, every crate: whatever anything logs, the secrets must not
    // be in it.
    let mut server = TestServer::start_with(&[("IM_LOG", "trace")]);
    let token = server.token("alice");
    let mut alice = server.raw("alice").await;
    let mut bob = server.raw("bob").await;
    alice
        .send(&send_to_user(1, "bob", b"hello", "m1"))
        .await
        .unwrap();
    let _ = next_frame(&mut alice).await;
    let _ = next_frame(&mut bob).await;
    // A token signed with another secret, and a garbage one: refused, not echoed.
    let forged = im_server::auth::TokenKeys::new(b"another-secret")
        .issue("mallory", Duration::from_secs(60))
        .unwrap();
    for bad in [forged.as_str(), "not-a-jwt-GARBAGE-TOKEN"] {
        let mut c = server.raw_anonymous().await;
        c.send(&login_frame(bad)).await.unwrap();
        let (code, _, _) = until_closed(&mut c).await;
        assert_eq!(code, Some(1008));
    }
    // The admin API, with the right token and a wrong one.
    let mut served = String::new();
    for path in [
        "/admin/v1/overview",
        "/admin/v1/connections",
        "/admin/v1/slow-consumers",
        "/admin/v1/memory",
        "/admin/v1/log-filters",
        "/admin/v1/logs",
        "/metrics",
    ] {
        let (status, body) = server.admin_get(path);
        assert_eq!(status, 200, "{path}: {body}");
        served.push_str(&body);
        let (status, body) = http(server.admin_addr, "GET", path, Some("wrong-admin-token"));
        assert_eq!(status, 401);
        served.push_str(&body);
    }
    drop(alice);
    drop(bob);
    let status = server.terminate();
    assert!(status.success());

    let mut logged = server.log();
    let logs_dir = server.data_dir.join("logs");
    for entry in std::fs::read_dir(&logs_dir).expect("log dir") {
        let path = entry.unwrap().path();
        logged.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
    }
    assert!(
        logged.contains("logged in") || logged.contains("TRACE"),
        "the run logged at trace level"
    );
    let signature = |t: &str| t.rsplit('.').next().unwrap_or_default().to_owned();
    for (what, secret) in [
        ("the JWT secret", SECRET.to_owned()),
        ("the admin token", ADMIN_TOKEN.to_owned()),
        ("a client token", token.clone()),
        ("a client token's signature", signature(&token)),
        ("a forged token", forged.clone()),
        ("a garbage token", "not-a-jwt-GARBAGE-TOKEN".to_owned()),
    ] {
        let leak = logged.lines().find(|l| l.contains(&secret));
        assert!(leak.is_none(), "{what} is in the logs: {leak:?}");
        assert!(!served.contains(&secret), "{what} is in the admin API");
    }
}

#[test]
fn exposed_admin_listener_warns_unless_behind_tls() {
    let exposed = TestServer::start_with(&[("IM_ADMIN_LISTEN", "0.0.0.0:0")]);
    let log = exposed.log();
    assert!(
        log.contains("the admin listener is reachable from other hosts"),
        "{log}"
    );
    drop(exposed);
    let proxied =
        TestServer::start_with(&[("IM_ADMIN_LISTEN", "0.0.0.0:0"), ("IM_BEHIND_TLS", "true")]);
    assert!(!proxied.log().contains("reachable from other hosts"));
    let local = TestServer::start();
    assert!(!local.log().contains("reachable from other hosts"));
}

#[cfg(unix)]
#[test]
fn generated_secret_files_are_private_and_readable_ones_refused() {
    use std::os::unix::fs::PermissionsExt;
    // The server creates the secrets at its first start (`token` never does); it keeps
    // running to the end of the test, since its temp data dir goes with it.
    let server = TestServer::start_with(&[("IM_JWT_SECRET", ""), ("IM_ADMIN_TOKEN", "")]);
    let dir = server.data_dir.clone();
    let token = |dir: &std::path::Path| {
        std::process::Command::new(server_bin())
            .args(["token", "--user", "alice", "--data-dir"])
            .arg(dir)
            .env_remove("IM_JWT_SECRET")
            .env_remove("IM_ADMIN_TOKEN")
            .output()
            .expect("run im-server token")
    };
    let out = token(&dir);
    assert!(out.status.success(), "{out:?}");
    for name in ["jwt_secret", "admin_token"] {
        let mode = std::fs::metadata(dir.join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} has mode {mode:o}");
    }
    let secret = std::fs::read_to_string(dir.join("jwt_secret")).unwrap();
    std::fs::set_permissions(
        dir.join("jwt_secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = token(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("jwt_secret") && err.contains("chmod 600"),
        "{err}"
    );
    assert!(
        !err.contains(secret.trim()),
        "the refusal prints the secret"
    );
}
