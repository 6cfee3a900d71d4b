//! Native TLS on both listeners: wss:// chat with a client trusting only the test CA,
//! the admin API over https (curl), the bounded and counted handshake, and a certificate
//! replaced on disk: new connections get the new one, open ones keep chatting, and a bad
//! replacement keeps the good one.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::tls::{
    cert_der, install, openssl_available, tls_connect, tls_server, Pki, Wss,
};
use crate::support::*;

/// `curl --cacert` on an admin path over https: (status, body).
fn curl_admin(server: &TestServer, ca: &Path, path: &str) -> (u16, String) {
    let url = format!("https://localhost:{}{path}", server.admin_addr.port());
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args([
            "--resolve",
            &format!("localhost:{}:127.0.0.1", server.admin_addr.port()),
        ])
        .args(["-H", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .args(["-w", "\n%{http_code}", &url])
        .output()
        .expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_chat_and_https_admin_with_bounded_handshakes() {
    if !openssl_available() || !tool_available("curl", &["--version"], "apt-get install curl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let server = tls_server(&pki, &[("IM_TLS_HANDSHAKE_TIMEOUT_SECS", "1")]);

    let mut alice = Wss::login(server.client_addr, &pki.ca, "alice").await;
    let mut bob = Wss::login(server.client_addr, &pki.ca, "bob").await;
    assert_eq!(alice.chat(10, "bob", "hello over tls").await, 1);
    let m = bob.expect_message("hello over tls").await;
    assert_eq!(m.sender, "alice");
    assert_eq!(bob.chat(11, "alice", "and back").await, 2);
    alice.expect_message("and back").await;

    // The admin API answers over https to a client trusting the CA...
    let (status, body) = curl_admin(&server, &pki.ca, "/healthz");
    assert_eq!(status, 200, "{body}");
    // ...and nothing over plain HTTP on the same port.
    let mut plain = std::net::TcpStream::connect(server.admin_addr).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    let _ = plain.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP must not be served on a TLS listener"
    );

    // A socket that never starts its handshake is closed after the timeout.
    let mut idle = std::net::TcpStream::connect(server.client_addr).unwrap();
    idle.set_read_timeout(Some(WAIT)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = idle.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the server closes a silent socket without a byte");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "closed by the 1 s handshake timeout"
    );
    // A client that does not trust the server's CA fails its handshake.
    let other = Pki::new(&tmp.path().join("other"));
    assert!(tls_connect(server.client_addr, &other.ca).await.is_err());

    let (status, scrape) = curl_admin(&server, &pki.ca, "/metrics");
    assert_eq!(status, 200);
    let ok = |l: &str| metric_value(&scrape, "im_tls_handshakes_total", &[("listener", l)]);
    assert!(ok("client") >= 2.0, "two wss clients: {}", ok("client"));
    assert!(ok("admin") >= 2.0, "two curl requests: {}", ok("admin"));
    let failed = |r: &str| {
        metric_value(
            &scrape,
            "im_tls_handshake_failures_total",
            &[("listener", "client"), ("reason", r)],
        )
    };
    assert!(
        failed("timeout") >= 1.0,
        "the silent socket counts as a timeout"
    );
    assert!(
        failed("error") >= 1.0,
        "the untrusting client counts as an error"
    );
    assert_eq!(
        metric_value(
            &scrape,
            "im_tls_reloads_total",
            &[("listener", "admin"), ("result", "error")]
        ),
        0.0,
        "the reload series are exported at 0"
    );
    assert!(
        scrape.contains("im_tls_reloads_total{"),
        "exported before any reload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_serves_new_handshakes_and_keeps_open_connections() {
    if !openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let server = tls_server(&pki, &[]);
    let (live_cert, live_key) = (pki.dir.join("server.pem"), pki.dir.join("server.key"));
    let first = cert_der(&live_cert);

    let mut alice = Wss::login(server.client_addr, &pki.ca, "alice").await;
    let mut bob = Wss::login(server.client_addr, &pki.ca, "bob").await;
    assert_eq!(alice.peer_cert, first);
    assert_eq!(alice.chat(10, "bob", "before").await, 1);
    bob.expect_message("before").await;

    // A new pair replaces the files (key first, then the certificate).
    let (cert, key) = pki.issue("second");
    let second = cert_der(&cert);
    assert_ne!(first, second);
    install(&key, &live_key);
    install(&cert, &live_cert);
    let deadline = Instant::now() + WAIT;
    let mut carol = loop {
        let c = Wss::login(server.client_addr, &pki.ca, "carol").await;
        if c.peer_cert == second {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no new connection saw the new certificate"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The connections opened on the old certificate are still up and chatting.
    assert_eq!(alice.chat(11, "bob", "after the swap").await, 2);
    bob.expect_message("after the swap").await;
    assert_eq!(carol.chat(12, "bob", "from carol").await, 1);
    bob.expect_message("from carol").await;

    // A bad replacement (not a certificate) is refused: the good one stays.
    std::fs::write(
        pki.dir.join("junk.pem"),
        b"-----BEGIN CERTIFICATE-----\n\x1b[31mjunk\n",
    )
    .unwrap();
    // (The swap above may have logged a refusal already: a key newer than its certificate
    // for a moment. Count from here.)
    let refusals = || server.log().matches("tls certificate not reloaded").count();
    let before = refusals();
    install(&pki.dir.join("junk.pem"), &live_cert);
    wait_until("the bad certificate is refused in the log", || {
        refusals() > before
    });
    let dave = Wss::login(server.client_addr, &pki.ca, "dave").await;
    assert_eq!(
        dave.peer_cert, second,
        "the last good certificate is still served"
    );
    assert!(
        !server.log().contains('\x1b'),
        "the log carries no raw control character"
    );
    assert_eq!(alice.chat(13, "bob", "still here").await, 3);
    bob.expect_message("still here").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_at_once_and_never_ends_the_node() {
    if !openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    // The file watch is an hour away: only the signal can load the new pair in time.
    let mut server = tls_server(&pki, &[("IM_TLS_RELOAD_INTERVAL_SECS", "3600")]);
    let mut alice = Wss::login(server.client_addr, &pki.ca, "alice").await;
    let (cert, key) = pki.issue("second");
    install(&key, &pki.dir.join("server.key"));
    install(&cert, &pki.dir.join("server.pem"));
    server.signal("HUP");
    wait_until("SIGHUP reloads the certificate", || {
        server.log().contains("tls certificate reloaded")
    });
    let mut bob = Wss::login(server.client_addr, &pki.ca, "bob").await;
    assert_eq!(bob.peer_cert, cert_der(&cert));
    assert_eq!(alice.chat(10, "bob", "after the reload").await, 1);
    bob.expect_message("after the reload").await;
    assert!(
        server.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP ended the node"
    );

    // A node without TLS logs the signal and keeps running (systemctl reload is harmless).
    let mut plain = TestServer::start();
    plain.signal("HUP");
    wait_until("the plain node logs SIGHUP", || {
        plain.log().contains("SIGHUP: no TLS listener")
    });
    assert!(
        plain.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP ended the node"
    );
    let mut carol = plain.raw("carol").await;
    ping_ok(&mut carol, 5).await;
}

/// The server's CPU time so far (user + system), from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The server's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Pairs x messages one-to-one over `wss` (or plain `ws` with `tls` unset): the server's
/// CPU per message (send, ack, deliver) and the wall time.
async fn cost_per_message(
    server: &TestServer,
    ca: Option<&Path>,
    round: u64,
    pairs: usize,
    n: u64,
) -> (f64, f64) {
    let cpu0 = cpu_secs(server.pid());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..pairs {
        let (from, to) = (format!("s{p}"), format!("r{p}"));
        match ca {
            Some(ca) => {
                let mut s = Wss::login(server.client_addr, ca, &from).await;
                let mut r = Wss::login(server.client_addr, ca, &to).await;
                tasks.push(tokio::spawn(async move {
                    for i in 0..n {
                        s.chat(100 + i, &to, &format!("m{round}-{i}")).await;
                    }
                }));
                tasks.push(tokio::spawn(async move {
                    r.expect_message(&format!("m{round}-{}", n - 1)).await;
                }));
            }
            None => {
                let mut s = server.raw(&from).await;
                let mut r = server.raw(&to).await;
                tasks.push(tokio::spawn(async move {
                    for i in 0..n {
                        let m = format!("m{round}-{i}");
                        s.send(&send_to_user(100 + i, &to, m.as_bytes(), &m))
                            .await
                            .unwrap();
                        acks(&mut s, 1).await;
                    }
                }));
                tasks.push(tokio::spawn(async move {
                    let last = format!("m{round}-{}", n - 1);
                    loop {
                        if let Some(im_client::proto::Body::Deliver(d)) =
                            next_frame(&mut r).await.body
                        {
                            if d.messages.iter().any(|m| m.payload[..] == *last.as_bytes()) {
                                break;
                            }
                        }
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let msgs = (pairs as u64 * n) as f64;
    (
        (cpu_secs(server.pid()) - cpu0) / msgs * 1e6,
        start.elapsed().as_secs_f64(),
    )
}

/// A measurement, not a check (BENCHMARKS.md, "TLS"): run it against a release build,
/// `IM_TEST_SERVER_BIN=target/release/im-server cargo test -p im-server --test e2e
/// tls_cost -- --ignored --nocapture`. Prints the server's CPU per TLS handshake, the
/// handshake rate of one client, and the server's CPU per one-to-one message over wss://
/// against ws://.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn tls_cost() {
    if !openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let tls = tls_server(&pki, &[]);
    let plain = TestServer::start();
    let handshakes = env_u64("IM_TEST_TLS_HANDSHAKES", 2000);
    let cpu0 = cpu_secs(tls.pid());
    let start = Instant::now();
    for _ in 0..handshakes {
        let s = tls_connect(tls.client_addr, &pki.ca)
            .await
            .expect("handshake");
        drop(s);
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_secs(tls.pid()) - cpu0;
    println!(
        "tls handshakes: {handshakes} sequential from one client in {wall:.2} s ({:.0}/s); \
         server CPU {:.0} µs per handshake (so ~{:.0} handshakes/s per core)",
        handshakes as f64 / wall,
        cpu / handshakes as f64 * 1e6,
        handshakes as f64 / cpu
    );
    let idle = env_u64("IM_TEST_TLS_IDLE", 1000);
    let (rss_ws, rss_wss) = (rss_bytes(plain.pid()), rss_bytes(tls.pid()));
    let mut open_ws = Vec::new();
    let mut open_wss = Vec::new();
    for i in 0..idle {
        open_ws.push(plain.raw(&format!("idle{i}")).await);
        open_wss.push(Wss::login(tls.client_addr, &pki.ca, &format!("idle{i}")).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per = |now: u64, before: u64| (now.saturating_sub(before)) as f64 / idle as f64 / 1024.0;
    println!(
        "idle connections: {idle} logged in on each: ws {:.1} KiB, wss {:.1} KiB of server RSS each",
        per(rss_bytes(plain.pid()), rss_ws),
        per(rss_bytes(tls.pid()), rss_wss)
    );
    drop((open_ws, open_wss));
    let (pairs, n) = (10, env_u64("IM_TEST_TLS_MESSAGES", 500));
    for round in 0..3 {
        let (ws, ws_wall) = cost_per_message(&plain, None, round, pairs, n).await;
        let (wss, wss_wall) = cost_per_message(&tls, Some(&pki.ca), round, pairs, n).await;
        println!(
            "round {round}: server CPU per 1:1 message (send, ack, deliver), {pairs} pairs x {n}: \
             ws {ws:.1} µs ({ws_wall:.1} s), wss {wss:.1} µs ({wss_wall:.1} s), +{:.1} µs",
            wss - ws
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_chats_over_wss_trusting_a_ca_file() {
    if !openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let server = tls_server(&pki, &[]);
    let url = format!("wss://localhost:{}/ws", server.client_addr.port());
    let tls = im_client::TlsConfig::from_ca_file(&pki.ca).expect("the CA file");
    let connect = |user: &str, tls: Option<im_client::TlsConfig>| {
        let mut cfg = im_client::ClientConfig::new(url.clone(), server.token(user));
        cfg.tls = tls;
        im_client::Client::connect(cfg)
    };
    let alice = connect("alice", Some(tls.clone()))
        .await
        .expect("alice over wss");
    let bob = connect("bob", Some(tls)).await.expect("bob over wss");
    let ack = alice.send_text("bob", "sdk over tls").await.expect("send");
    assert_eq!(ack.seq, 1);
    let got = bob.next_message(WAIT).await.expect("bob receives");
    assert_eq!(&got.payload[..], b"sdk over tls");

    // The public roots do not include the test CA: refused, with the reason.
    let e = connect("carol", None)
        .await
        .expect_err("an untrusted certificate");
    assert!(e.to_string().contains("certificate"), "{e}");
    // A CA file that is not one is named in the error.
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let e = im_client::TlsConfig::from_ca_file(&junk).expect_err("no certificate");
    assert!(e.to_string().contains("junk.pem"), "{e}");
}

/// Runs the server with `env` expecting it to stop at start-up; returns its stderr.
fn refused_start(dir: &Path, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(server_bin())
        .env("IM_LISTEN", "127.0.0.1:0")
        .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
        .env("IM_DATA_DIR", dir.join("data"))
        .env("IM_JWT_SECRET", SECRET)
        .env("IM_ADMIN_TOKEN", ADMIN_TOKEN)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn im-server");
    let end = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("the server started with {env:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

#[test]
fn bad_tls_files_stop_start_up_naming_the_keys_and_tls_silences_the_exposure_warning() {
    if !openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let (cert, _) = pki.issue("one");
    let (_, other_key) = pki.issue("two");
    let (cert_s, key_s) = (cert.to_str().unwrap(), other_key.to_str().unwrap());
    let err = refused_start(tmp.path(), &[("IM_TLS_CERT_FILE", cert_s)]);
    assert!(
        err.contains("tls.key_file") && err.contains("must be set"),
        "{err}"
    );
    let err = refused_start(
        tmp.path(),
        &[("IM_TLS_CERT_FILE", cert_s), ("IM_TLS_KEY_FILE", key_s)],
    );
    assert!(
        err.contains("`tls.cert_file`") && err.contains("`tls.key_file`"),
        "{err}"
    );
    let err = refused_start(
        tmp.path(),
        &[
            ("IM_TLS_ADMIN_CERT_FILE", "/nonexistent/cert.pem"),
            ("IM_TLS_ADMIN_KEY_FILE", key_s),
        ],
    );
    assert!(
        err.contains("`tls.admin_cert_file` = /nonexistent/cert.pem"),
        "{err}"
    );

    // An admin listener on every address but serving TLS itself: no clear-text warning.
    let server = tls_server(&pki, &[("IM_ADMIN_LISTEN", "0.0.0.0:0")]);
    assert!(
        !server.log().contains("reachable from other hosts"),
        "{}",
        server.log()
    );
}
