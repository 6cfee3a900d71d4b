//! The observability surface: stage probes move under traffic, gauges match reality,
//! the scrape passes `promtool check metrics`, kick closes the right connection, and
//! admin routes refuse a bad token.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_kick_and_admin_auth() {
    let server = TestServer::start_with(&[("IM_OBS_SAMPLE_INTERVAL_MS", "200")]);
    let mut a = server.raw("ana").await;
    let mut b = server.raw("bo").await;
    let mut c = server.raw("cy").await;

    create_group(&mut a, "ops", vec!["bo".into(), "cy".into()]).await;
    for i in 0..20u64 {
        a.send(&send_to_user(10 + i, "bo", b"hello", &format!("d{i}")))
            .await
            .unwrap();
        a.send(&send_to_group(100 + i, "ops", b"all", &format!("g{i}")))
            .await
            .unwrap();
    }
    assert_eq!(acks(&mut a, 40).await.len(), 40);
    for _ in 0..40 {
        next_chat_frame(&mut b).await;
    }
    for _ in 0..20 {
        next_chat_frame(&mut c).await;
    }

    // Every stage histogram moved.
    let stages = [
        "decode",
        "auth",
        "validate",
        "relation",
        "persist_wait",
        "persist_commit",
        "route",
        "encode",
        "queue_wait",
        "write",
        "end_to_end",
    ];
    eventually("every stage to record", || {
        let scrape = server.metrics();
        stages.iter().all(|s| {
            metric_value(&scrape, "im_stage_duration_seconds_count", &[("stage", s)]) > 0.0
        })
    })
    .await;
    let scrape = server.metrics();
    assert!(metric_value(&scrape, "im_messages_received_total", &[("type", "text")]) >= 40.0);
    assert!(metric_value(&scrape, "im_messages_delivered_total", &[]) >= 60.0);
    assert!(metric_value(&scrape, "im_persist_batch_size_count", &[]) >= 1.0);
    assert_eq!(metric_value(&scrape, "im_connections", &[]), 3.0);
    for name in [
        "im_connections_opened_total",
        "im_alloc_bytes",
        "im_capacity_headroom_connections",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
    ] {
        assert!(scrape.contains(name), "{name} missing from the scrape");
    }
    promtool_check(&scrape);

    // The overview agrees, with percentiles for the stages that ran.
    let (status, body) = server.admin_get("/admin/v1/overview");
    assert_eq!(status, 200, "{body}");
    let o: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(o["connections"], 3);
    eventually("the sampler to see traffic", || {
        let (_, body) = server.admin_get("/admin/v1/overview");
        let o: serde_json::Value = serde_json::from_str(&body).unwrap();
        o["stages"]
            .as_array()
            .unwrap()
            .iter()
            // Every stage ran but the before-send hook's (no hook is configured) and
            // the multi-region ones (no regions).
            .filter(|s| {
                let multi_region = ["region_forward", "apply_wait", "repl_publish", "repl_apply"];
                s["stage"] != "before_send" && !multi_region.iter().any(|m| s["stage"] == *m)
            })
            .all(|s| s["count"].as_u64().unwrap() > 0)
            && o["memory"]["allocated"].as_u64().unwrap_or(0) > 0
    })
    .await;

    // Connections list: three, sorted, filtered by user.
    let (status, body) = server.admin_get("/admin/v1/connections?sort=msgs_in&limit=2");
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["total"], 3);
    assert_eq!(list["connections"].as_array().unwrap().len(), 2);
    assert_eq!(
        list["connections"][0]["user_id"], "ana",
        "ana sent the most: {body}"
    );
    let (status, body) = server.admin_get("/admin/v1/connections?sort=bogus");
    assert_eq!(status, 400);
    assert!(body.contains("sort=bogus"), "{body}");
    let (_, body) = server.admin_get("/admin/v1/connections?user=cy");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["total"], 1);
    let cy_conn = list["connections"][0]["conn_id"].as_u64().unwrap();

    // Kick cy: cy's socket closes with 4002; the others are untouched.
    let (status, body) = http(
        server.admin_addr,
        "DELETE",
        &format!("/admin/v1/connections/{cy_conn}"),
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200, "{body}");
    let (code, _, _) = until_closed(&mut c).await;
    assert_eq!(code, Some(4002));
    eventually("im_connections to drop to 2", || {
        server.metric("im_connections", &[]) == 2.0
    })
    .await;
    a.send(&send_to_user(500, "bo", b"still", "after-kick"))
        .await
        .unwrap();
    assert_eq!(acks(&mut a, 1).await.len(), 1);
    let (status, _) = http(
        server.admin_addr,
        "DELETE",
        &format!("/admin/v1/connections/{cy_conn}"),
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 404);

    // Memory and slow consumers answer.
    let (status, body) = server.admin_get("/admin/v1/memory");
    assert_eq!(status, 200, "{body}");
    let m: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(m["resident"].as_u64().unwrap() > 0);
    // The node runs on SQLite: its page caches and statements are in the C heap.
    let sqlite = m["sqlite"].as_u64().unwrap();
    assert!(sqlite > 0, "{body}");
    assert!(m["c_heap"].as_u64().unwrap() >= sqlite, "{body}");
    // RSS split by what backs it: the heaps and stacks, and the binary's pages.
    let (anon, file) = (
        m["rss_anon"].as_u64().unwrap(),
        m["rss_file"].as_u64().unwrap(),
    );
    assert!(anon > 0 && file > 0, "{body}");
    let (status, body) = server.admin_get("/admin/v1/slow-consumers");
    assert_eq!(status, 200, "{body}");
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["total"], 0);
    assert_eq!(s["soft_mark_bytes"], 1 << 20);

    // Auth: health checks are open; everything else refuses a missing or wrong token.
    assert_eq!(http(server.admin_addr, "GET", "/healthz", None).0, 200);
    assert_eq!(http(server.admin_addr, "GET", "/readyz", None).0, 200);
    let before = server.metric("im_admin_unauthorized_total", &[]);
    for path in [
        "/metrics",
        "/admin/v1/overview",
        "/admin/v1/connections",
        "/admin/v1/slow-consumers",
        "/admin/v1/memory",
    ] {
        assert_eq!(
            http(server.admin_addr, "GET", path, None).0,
            401,
            "{path} without a token"
        );
        assert_eq!(
            http(server.admin_addr, "GET", path, Some("wrong")).0,
            401,
            "{path} with a wrong token"
        );
    }
    assert_eq!(
        http(
            server.admin_addr,
            "DELETE",
            "/admin/v1/connections/1",
            Some("wrong")
        )
        .0,
        401
    );
    let after = server.metric("im_admin_unauthorized_total", &[]);
    assert_eq!(after - before, 11.0);
    assert!(
        !server.log().contains(ADMIN_TOKEN),
        "the admin token leaked into the log"
    );
}

/// Runs `promtool check metrics` on a scrape (required under CI, skipped if absent elsewhere).
pub(crate) fn promtool_check(scrape: &str) {
    use std::io::Write;
    if !tool_available("promtool", &["--version"], "apt-get install prometheus") {
        return;
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SQLite's memory (`/admin/v1/memory`'s `sqlite`) on a node started with `env` after
/// ~6 MB of messages were written and read back by sync from three connections.
async fn sqlite_memory_after_reading_back(env: &[(&str, &str)]) -> u64 {
    let mut env = env.to_vec();
    env.push(("IM_LIMITS_SEND_RATE_PER_SEC", "0"));
    let server = TestServer::start_with(&env);
    let mut a = server.raw("sqa").await;
    let payload = vec![b'x'; 3000];
    for i in 0..2000u64 {
        a.send(&send_to_user(i + 1, "sqb", &payload, &format!("m{i}")))
            .await
            .unwrap();
        if i % 100 == 99 {
            assert_eq!(acks(&mut a, 100).await.len(), 100);
        }
    }
    for _ in 0..3 {
        let mut b = server.raw("sqb").await;
        assert_eq!(raw_sync_all(&mut b, 500).await.len(), 2000);
    }
    let (status, body) = server.admin_get("/admin/v1/memory");
    assert_eq!(status, 200, "{body}");
    let m: serde_json::Value = serde_json::from_str(&body).unwrap();
    m["sqlite"].as_u64().expect("sqlite bytes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_memory_stays_near_its_bound_under_reads() {
    let bounded = sqlite_memory_after_reading_back(&[("IM_STORE_SQLITE_MEMORY_MIB", "1")]).await;
    let unbounded = sqlite_memory_after_reading_back(&[("IM_STORE_SQLITE_MEMORY_MIB", "0")]).await;
    eprintln!("sqlite memory: bound 1 MiB {bounded} B, no bound {unbounded} B");
    assert!(bounded <= 2 << 20, "bounded to 1 MiB, holds {bounded} B");
    assert!(
        bounded < unbounded / 2,
        "bounded {bounded} B against {unbounded} B without a bound"
    );
}
