//! Live diagnosis: CPU profiles under traffic (SVG naming im-server functions, memory
//! given back after a capture,
//! a pprof protobuf with samples, one capture at a time), per-uid debug filters that
//! show one user's handling (their connection's, and the writer's and router's events
//! about their messages) in the JSON log file and not another's, TTL expiry, the
//! runtime global level, and the log files listing.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_client::proto::{frame, Body, DeliverAck, SyncRequest};

use crate::support::*;

/// The few fields of pprof's `Profile` (profile.proto) the test needs.
#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

/// Keeps `pairs` sender/receiver pairs busy until `stop` is set.
pub(crate) fn traffic(
    server: &TestServer,
    pairs: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    let mut tasks = Vec::new();
    for p in 0..pairs {
        let url = server.ws_url();
        let (from, to) = (format!("load{p}"), format!("sink{p}"));
        let (tok_from, tok_to) = (server.token(&from), server.token(&to));
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut rx = im_client::RawConn::connect(&url).await.unwrap();
            rx.login(&tok_to, "d", false).await.unwrap();
            let drain = tokio::spawn(async move {
                while let Ok(im_client::RawEvent::Frame(_)) = rx.recv_timeout(WAIT).await {}
            });
            let mut tx = im_client::RawConn::connect(&url).await.unwrap();
            tx.login(&tok_from, "d", false).await.unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..20 {
                    n += 1;
                    tx.send(&send_to_user(n, &to, b"profile me", &format!("m{n}")))
                        .await
                        .unwrap();
                }
                let mut got = 0;
                while got < 20 {
                    match tx.recv_timeout(WAIT).await {
                        Ok(im_client::RawEvent::Frame(f)) => {
                            if matches!(f.body, Some(Body::SendAck(_) | Body::Error(_))) {
                                got += 1;
                            }
                        }
                        other => panic!("sender lost its connection: {other:?}"),
                    }
                }
                // Stay under the default per-connection send rate.
                tokio::time::sleep(Duration::from_millis(45)).await;
            }
            drain.abort();
            n
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profile_during_traffic() {
    let server = TestServer::start();
    let admin = server.admin_addr;
    let get = move |path: &str| http_bytes(admin, "GET", path, Some(ADMIN_TOKEN), b"");

    // Bad parameters are refused before anything is captured, naming the parameter.
    for (q, name) in [
        ("seconds=0", "seconds"),
        ("seconds=301", "seconds"),
        ("frequency=0", "frequency"),
        ("frequency=5000", "frequency"),
        ("seconds=x", "seconds"),
        ("format=png", "format"),
    ] {
        let (status, _, body) = get(&format!("/admin/v1/profile/cpu?{q}"));
        let body = String::from_utf8_lossy(&body).to_string();
        assert_eq!(status, 400, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains(name), "{q}: {body}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&server, 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A 2 s SVG capture; a second capture while it runs gets 409.
    let svg = tokio::task::spawn_blocking(move || {
        get("/admin/v1/profile/cpu?seconds=2&frequency=499&format=svg")
    });
    // It holds the one capture slot once it has logged its start.
    eventually("the SVG capture to start", || {
        server.log().contains("CPU profile capture started")
    })
    .await;
    let (status, _, body) = get("/admin/v1/profile/cpu?seconds=1&format=pprof");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 409, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "a CPU profile is already being captured");
    let (status, head, body) = svg.await.unwrap();
    let svg = String::from_utf8(body).unwrap();
    assert_eq!(status, 200, "{svg}");
    assert!(head.contains("content-type: image/svg+xml"), "{head}");
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("im_server::"),
        "the flamegraph names no im-server function"
    );

    // A pprof capture: gzip of a Profile protobuf with samples naming im-server code.
    let (status, head, body) = get("/admin/v1/profile/cpu?seconds=2&format=pprof");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .expect("pprof output is gzip");
    let profile = <Profile as prost::Message>::decode(&raw[..]).expect("a Profile protobuf");
    assert!(!profile.sample.is_empty(), "no samples");
    assert!(profile.sample.iter().all(|s| s.value.len() == 2));
    // A sample taken where no frame chain could be walked has no locations; they are rare.
    let walked = profile
        .sample
        .iter()
        .filter(|s| !s.location_id.is_empty())
        .count();
    assert!(
        walked * 2 > profile.sample.len(),
        "{walked} of {} samples have a stack",
        profile.sample.len()
    );
    assert!(profile.string_table.first().is_some_and(|s| s.is_empty()));
    assert!(
        profile
            .string_table
            .iter()
            .any(|s| s.contains("im_server::")),
        "no im-server function in the string table"
    );

    // A bundle: both files and the top functions.
    let (status, _, body) = get("/admin/v1/profile/cpu?seconds=1&format=bundle");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (b["seconds"].as_u64(), b["frequency"].as_u64()),
        (Some(1), Some(99))
    );
    let top = b["top"].as_array().unwrap();
    assert!(!top.is_empty() && top.len() <= 30, "{body}");
    assert!(top
        .iter()
        .all(|t| t["self_samples"].as_u64().unwrap() <= t["total_samples"].as_u64().unwrap()));
    let total: u64 = top
        .iter()
        .map(|t| t["self_samples"].as_u64().unwrap())
        .sum();
    assert!(total <= b["samples"].as_u64().unwrap());
    assert!(b["svg"].as_str().unwrap().contains("<svg"));
    use base64::Engine;
    let gz = base64::engine::general_purpose::STANDARD
        .decode(b["pprof_gz_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");

    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for t in load {
        sent += t.await.unwrap();
    }
    assert!(sent > 100, "traffic ran: {sent}");
    assert_eq!(server.metric("im_profiles_captured_total", &[]), 3.0);
}

/// Every JSON line of the server's log files.
fn log_lines(data_dir: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(data_dir.join("logs")) else {
        return out;
    };
    let mut names: Vec<_> = dir.map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for line in text.lines() {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{p:?}: {e}: {line}"));
            out.push(v);
        }
    }
    out
}

/// Debug lines from the message path, as (uid, message).
fn debug_events(data_dir: &Path) -> Vec<(String, String)> {
    log_lines(data_dir)
        .into_iter()
        .filter(|v| v["level"] == "DEBUG")
        .map(|v| {
            (
                // The connection span's uid, or (writer and router events) the event's own.
                v["span"]["uid"]
                    .as_str()
                    .or(v["fields"]["uid"].as_str())
                    .unwrap_or("")
                    .to_owned(),
                v["fields"]["message"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// One exchange on the message path for each of the two users: sends, acks, sync,
/// deliver acks.
async fn exchange(a: &mut im_client::RawConn, b: &mut im_client::RawConn, tag: &str) {
    for (from, to, who) in [(&mut *a, "bob", "a"), (&mut *b, "alice", "b")] {
        for n in 0..3 {
            from.send(&send_to_user(
                10 + n,
                to,
                b"hi",
                &format!("{tag}-{who}-{n}"),
            ))
            .await
            .unwrap();
        }
        acks(from, 3).await;
    }
    for c in [&mut *a, &mut *b] {
        let msgs = raw_sync_all(c, 100).await;
        let last = msgs.last().expect("synced messages");
        c.send(&frame(
            77,
            Body::DeliverAck(DeliverAck {
                conversation_id: last.conversation_id.clone(),
                seq: last.seq,
            }),
        ))
        .await
        .unwrap();
        c.send(&frame(
            78,
            Body::Sync(SyncRequest {
                cursors: vec![],
                limit: 1,
                ..Default::default()
            }),
        ))
        .await
        .unwrap();
    }
}

pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_uid_log_filter_shows_one_user_until_its_ttl() {
    let server = TestServer::start();
    let mut a = server.raw("alice").await;
    let mut b = server.raw("bob").await;
    let dir = server.data_dir.clone();

    // Bad bodies are refused, naming the field.
    for (body, name) in [
        (r#"{"level":"loud"}"#, "level"),
        (r#"{"ttl_secs":5}"#, "level"),
        (r#"{"level":"debug","ttl_secs":0}"#, "ttl_secs"),
        (r#"{"level":"debug","ttl_secs":86401}"#, "ttl_secs"),
        (r#"{"level":"debug","ttl":5}"#, "ttl"),
        ("not json", "body"),
    ] {
        let (status, resp) = server.admin_json("PUT", "/admin/v1/log-filters/alice", body);
        assert_eq!(status, 400, "{body}: {resp}");
        let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
        assert!(
            v["error"].as_str().unwrap().contains(name),
            "{body}: {resp}"
        );
    }
    let (status, _) = server.admin_json("DELETE", "/admin/v1/log-filters/alice", "");
    assert_eq!(status, 404);

    // Before any filter: no debug lines at all (global level info).
    exchange(&mut a, &mut b, "before").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(debug_events(&dir).is_empty(), "{:?}", debug_events(&dir));

    // Debug for alice, with a short TTL.
    let (status, resp) = server.admin_json(
        "PUT",
        "/admin/v1/log-filters/alice",
        r#"{"level":"debug","ttl_secs":4}"#,
    );
    assert_eq!(status, 200, "{resp}");
    let f: serde_json::Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(
        (
            f["uid"].as_str(),
            f["level"].as_str(),
            f["ttl_secs"].as_u64()
        ),
        (Some("alice"), Some("debug"), Some(4))
    );
    let (status, resp) = server.admin_get("/admin/v1/log-filters");
    assert_eq!(status, 200);
    let l: serde_json::Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(l["global_level"], "info");
    assert_eq!(l["filters"].as_array().unwrap().len(), 1, "{resp}");
    let remaining = l["filters"][0]["remaining_secs"].as_f64().unwrap();
    assert!(remaining > 0.0 && remaining <= 4.0, "{resp}");
    assert_eq!(server.metric("im_log_filters_active", &[]), 1.0);

    exchange(&mut a, &mut b, "during").await;
    eventually("alice's debug events in the log file", || {
        let ev = debug_events(&dir);
        [
            "send accepted",
            "sync served",
            "deliver ack",
            "message committed",
            "message routed",
        ]
        .iter()
        .all(|m| ev.iter().any(|(u, msg)| u == "alice" && msg == m))
    })
    .await;
    let ev = debug_events(&dir);
    assert!(
        ev.iter().all(|(u, _)| u == "alice"),
        "debug events for someone other than alice: {ev:?}"
    );
    // Stderr carries them too, with the connection span.
    assert!(server.log().contains("uid=\"alice\"") || server.log().contains("uid=alice"));

    // After the TTL the filter is gone and alice is back to info.
    eventually("the filter to expire", || {
        let (_, resp) = server.admin_get("/admin/v1/log-filters");
        let l: serde_json::Value = serde_json::from_str(&resp).unwrap();
        l["filters"].as_array().unwrap().is_empty()
    })
    .await;
    assert_eq!(server.metric("im_log_filters_active", &[]), 0.0);
    let before = debug_events(&dir).len();
    exchange(&mut a, &mut b, "after").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        debug_events(&dir).len(),
        before,
        "debug events after the TTL"
    );

    // DELETE removes a filter at once.
    let (status, _) = server.admin_json("PUT", "/admin/v1/log-filters/bob", r#"{"level":"trace"}"#);
    assert_eq!(status, 200);
    let (status, resp) = server.admin_json("DELETE", "/admin/v1/log-filters/bob", "");
    assert_eq!((status, resp.as_str()), (200, r#"{"removed":"bob"}"#));

    // The global level changes at runtime: now bob's handling shows at debug too.
    let (status, resp) = server.admin_json("PUT", "/admin/v1/log-level", r#"{"level":"verbose"}"#);
    assert_eq!(status, 400, "{resp}");
    assert!(resp.contains("level"), "{resp}");
    let (status, resp) = server.admin_json("PUT", "/admin/v1/log-level", r#"{"level":"debug"}"#);
    assert_eq!(status, 200, "{resp}");
    exchange(&mut a, &mut b, "global").await;
    eventually("bob's debug events under a global debug level", || {
        debug_events(&dir)
            .iter()
            .any(|(u, m)| u == "bob" && m == "send accepted")
    })
    .await;
    let (status, _) = server.admin_json("PUT", "/admin/v1/log-level", r#"{"level":"info"}"#);
    assert_eq!(status, 200);
    let (_, resp) = server.admin_get("/admin/v1/log-filters");
    assert!(resp.contains(r#""global_level":"info""#), "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_files_are_listed_with_window_and_totals() {
    let server = TestServer::start_with(&[
        ("IM_LOG_WINDOW_START", "22:30"),
        ("IM_LOG_WINDOW_END", "01:15"),
    ]);
    let _a = server.raw("ana").await;
    eventually("bytes written to the log file", || {
        server.metric("im_log_bytes_written_total", &[]) > 0.0
    })
    .await;
    let (status, body) = server.admin_get("/admin/v1/logs");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["dir"].as_str().unwrap().ends_with("logs"), "{body}");
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{body}");
    assert_eq!(files[0]["state"], "active");
    assert!(files[0]["name"].as_str().unwrap().starts_with("im-server."));
    assert!(files[0]["size_bytes"].as_u64().unwrap() > 0);
    assert!(files[0]["modified_ms"].as_u64().unwrap() > 0);
    assert_eq!(v["window"]["start"], "22:30");
    assert_eq!(v["window"]["end"], "01:15");
    assert!(v["in_window"].is_boolean());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let next = v["next_window_start_ms"].as_u64().unwrap();
    assert!(next > now_ms && next <= now_ms + 24 * 3600 * 1000, "{body}");
    assert_eq!(v["retention_hours"], 168);
    assert!(v["written_bytes_total"].as_u64().unwrap() > 0);
    assert_eq!(v["compressed_bytes_total"], 0);
}

#[test]
fn bad_log_config_names_the_key() {
    for (key, value, name) in [
        ("IM_LOG_ROTATION", "weekly", "log.rotation"),
        ("IM_LOG_WINDOW_START", "3am", "log.window_start"),
        ("IM_LOG", "loud", "log.level"),
        ("IM_LOG_RETENTION_HOURS", "0", "log.retention_hours"),
    ] {
        let out = std::process::Command::new(server_bin())
            .env(
                "IM_DATA_DIR",
                std::env::temp_dir().join("im-e2e-bad-log-config"),
            )
            .env(key, value)
            .env("IM_LISTEN", "127.0.0.1:0")
            .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}={value}: {err}");
        assert!(
            err.contains(name) && err.contains(value),
            "{key}={value}: {err}"
        );
    }
}

/// jemalloc's allocated bytes as the sampler last published them, read after two of its
/// ticks so that the figure postdates whatever happened before the call.
async fn allocated_now(server: &TestServer) -> f64 {
    tokio::time::sleep(Duration::from_millis(2200)).await;
    server.metric("im_alloc_bytes", &[("kind", "allocated")])
}

/// The resident set of the server process, bytes (`/proc/<pid>/status` VmRSS).
fn rss_bytes(server: &TestServer) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib * 1024
}

/// One bundle capture of `seconds` (every rendering symbolizes the samples).
async fn bundle_capture(admin: std::net::SocketAddr) {
    let (status, _, body) = tokio::task::spawn_blocking(move || {
        http_bytes(
            admin,
            "GET",
            "/admin/v1/profile/cpu?seconds=1&format=bundle",
            Some(ADMIN_TOKEN),
            b"",
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// A capture's memory goes back: the symbol cache the rendering filled is freed and the
/// freed pages purged, so what
/// stays is pprof-rs's own sample table (a fixed ~18 MiB it keeps for the next capture),
/// and further captures add nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profile_leaves_no_lasting_memory() {
    const MIB: f64 = 1024.0 * 1024.0;
    let server = TestServer::start();
    let admin = server.admin_addr;
    let before = allocated_now(&server).await;
    let rss_before = rss_bytes(&server) as f64;
    assert!(before > 0.0, "no allocator figure in the scrape");
    bundle_capture(admin).await;
    let first = allocated_now(&server).await;
    bundle_capture(admin).await;
    bundle_capture(admin).await;
    let after = allocated_now(&server).await;
    // The freed pages are purged when the report is done, not over jemalloc's decay time.
    let rss_after = rss_bytes(&server) as f64;
    eprintln!(
        "allocated {:.1} -> {:.1} -> {:.1} MiB, RSS {:.1} -> {:.1} MiB",
        before / MIB,
        first / MIB,
        after / MIB,
        rss_before / MIB,
        rss_after / MIB
    );
    assert!(
        first - before < 24.0 * MIB,
        "a CPU capture left {:.1} MiB allocated ({:.1} -> {:.1} MiB)",
        (first - before) / MIB,
        before / MIB,
        first / MIB
    );
    assert!(
        after - first < 4.0 * MIB,
        "each CPU capture keeps more: {:.1} -> {:.1} MiB after two more",
        first / MIB,
        after / MIB
    );
    assert!(
        rss_after - rss_before < 48.0 * MIB,
        "CPU captures left the RSS at {:.1} MiB (from {:.1} MiB)",
        rss_after / MIB,
        rss_before / MIB
    );
}
