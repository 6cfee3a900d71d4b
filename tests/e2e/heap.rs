//! Heap profiles of the live node: a capture during traffic answers a pprof that
//! `go tool pprof` reads and that names im-server allocation sites, an SVG and a bundle;
//! bad parameters are refused naming them, one heap capture runs at a time while a CPU
//! capture can run beside it, and an abandoned capture frees its slot.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::diag::{eventually, traffic};
use crate::support::*;

/// `go tool pprof ARGS FILE`'s standard output (the caller checks first that Go runs:
/// `.ci/run` installs Debian's golang-go).
fn go_pprof(args: &[&str], file: &std::path::Path, tmp: &std::path::Path) -> String {
    let out = std::process::Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // Offline and self-contained: no symbol server, caches in the test's dir.
        .env("PPROF_TMPDIR", tmp)
        .env("PPROF_BINARY_PATH", tmp)
        .env("GOCACHE", tmp.join("gocache"))
        .env("HOME", tmp)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `go tool pprof` ({e}): apt-get install golang-go"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_profile_during_traffic() {
    let server = TestServer::start();
    let admin = server.admin_addr;
    let get = move |path: &str| http_bytes(admin, "GET", path, Some(ADMIN_TOKEN), b"");

    // Bad parameters are refused before anything is sampled, naming the parameter.
    for (q, name) in [
        ("seconds=0", "seconds"),
        ("seconds=61", "seconds"),
        ("seconds=-1", "seconds"),
        ("seconds=x", "seconds"),
        ("format=png", "format"),
    ] {
        let (status, _, body) = get(&format!("/admin/v1/profile/heap?{q}"));
        let body = String::from_utf8_lossy(&body).to_string();
        assert_eq!(status, 400, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains(name), "{q}: {body}");
    }
    // The admin token is required, as on every admin route.
    let (status, _, _) = http_bytes(admin, "GET", "/admin/v1/profile/heap?seconds=1", None, b"");
    assert_eq!(status, 401);

    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&server, 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A 10 s pprof capture; connections opened during the window stay open past it, so
    // their state (~18 KB each) is live when the heap is dumped.
    let pprof =
        tokio::task::spawn_blocking(move || get("/admin/v1/profile/heap?seconds=10&format=pprof"));
    eventually("the heap capture to start", || {
        server.log().contains("heap profile capture started")
    })
    .await;
    // A second heap capture meanwhile gets 409.
    let (status, _, body) = get("/admin/v1/profile/heap?seconds=1&format=svg");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 409, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "a heap profile is already being captured");
    // A CPU capture does not wait for the heap one (they share nothing).
    let (status, _, body) = get("/admin/v1/profile/cpu?seconds=1&format=svg");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let mut idle = Vec::new();
    for i in 0..400 {
        let mut c = im_client::RawConn::connect(&server.ws_url()).await.unwrap();
        c.login(&server.token(&format!("idle{i}")), "d", false)
            .await
            .unwrap();
        idle.push(c);
    }

    let (status, head, body) = pprof.await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    assert!(head.contains("heap.pb.gz"), "{head}");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .expect("pprof output is gzip");

    // Go's pprof reads it, offline, and names im-server functions on the sampled stacks.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("heap.pb.gz");
    std::fs::write(&file, &body).unwrap();
    if tool_available("go", &["version"], "apt-get install golang-go") {
        let top = go_pprof(&["-top", "-nodecount=500"], &file, dir.path());
        assert!(top.contains("inuse_space"), "{top}");
        assert!(
            top.lines().any(|l| l.contains("im_server::")),
            "go tool pprof -top names no im_server function:\n{top}"
        );
        // jemalloc's own frames are cut off the leaf end: none is left on a sampled stack.
        assert!(!top.contains("prof_backtrace"), "{top}");
        let raw_report = go_pprof(&["-raw"], &file, dir.path());
        assert!(
            raw_report.contains("im_server::"),
            "no im_server frame on a sampled stack:\n{raw_report}"
        );
    }

    // An SVG and a bundle after it (the slot is free again).
    let (status, head, body) = get("/admin/v1/profile/heap?seconds=1&format=svg");
    let svg = String::from_utf8(body).unwrap();
    assert_eq!(status, 200, "{svg}");
    assert!(head.contains("content-type: image/svg+xml"), "{head}");
    assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
    let (status, _, body) = get("/admin/v1/profile/heap?seconds=2&format=bundle");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 200, "{body}");
    let b: im_admin_api::HeapProfileBundle = serde_json::from_str(&body).unwrap();
    assert_eq!((b.seconds, b.sample_interval_bytes), (2, 1 << 19));
    assert!(b.top.len() <= 30, "{body}");
    assert!(b.top.iter().all(|t| t.self_bytes <= t.total_bytes));
    let self_sum: u64 = b.top.iter().map(|t| t.self_bytes).sum();
    assert!(self_sum <= b.inuse_bytes, "{self_sum} > {}", b.inuse_bytes);
    assert!(b.svg.contains("<svg"));
    use base64::Engine;
    let gz = base64::engine::general_purpose::STANDARD
        .decode(&b.pprof_gz_base64)
        .unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");

    // A client that gives up mid-window frees the slot (sampling is switched off with it):
    // a 60 s capture whose connection closes after its start does not hold off the next.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        write!(
            s,
            "GET /admin/v1/profile/heap?seconds=60 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
        )
        .unwrap();
        eventually("the abandoned capture to start", || {
            server.log().matches("heap profile capture started").count() == 4
        })
        .await;
    }
    let mut status = 0;
    let end = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < end {
        status = get("/admin/v1/profile/heap?seconds=1&format=svg").0;
        if status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status, 200, "the abandoned capture still holds the slot");

    drop(idle);
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for t in load {
        sent += t.await.unwrap();
    }
    assert!(sent > 100, "traffic ran: {sent}");
    assert_eq!(server.metric("im_heap_profiles_captured_total", &[]), 4.0);
    assert_eq!(server.metric("im_profiles_captured_total", &[]), 1.0);
}
