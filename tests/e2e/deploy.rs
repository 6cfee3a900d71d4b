//! Deployment: chat through Debian's nginx running the repository's site file
//! (docs/deploy/nginx.conf: TLS termination, the WebSocket upgrade, /v1/route), and the
//! Debian package (packaging/): its contents, its unit, and the packaged binary run with
//! the packaged config.

use std::net::SocketAddr;
use std::process::Command;

use crate::support::deploy::Nginx;
use crate::support::tls::{openssl_available, Pki, Wss};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_through_nginx_tls_termination() {
    if !openssl_available()
        || !tool_available("nginx", &["-v"], "apt-get install nginx")
        || !tool_available("curl", &["--version"], "apt-get install curl")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(&tmp.path().join("pki"));
    let (cert, key) = pki.issue("proxy");
    let server = TestServer::start_with(&[
        ("IM_BEHIND_TLS", "true"),
        ("IM_LIMITS_TRUSTED_PROXIES", "127.0.0.1"),
    ]);
    let nginx = Nginx::start(&tmp.path().join("nginx"), server.client_addr, &cert, &key);
    let front: SocketAddr = ([127, 0, 0, 1], nginx.port).into();

    let mut alice = Wss::login(front, &pki.ca, "alice").await;
    let mut bob = Wss::login(front, &pki.ca, "bob").await;
    assert_eq!(alice.chat(10, "bob", "through the proxy").await, 1);
    assert_eq!(
        bob.expect_message("through the proxy").await.sender,
        "alice"
    );
    assert_eq!(bob.chat(11, "alice", "and back through it").await, 2);
    alice.expect_message("and back through it").await;

    // /v1/route answers through the proxy; anything else of the listener is not public.
    let curl = |path: &str| {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&pki.ca)
            .args(["--resolve", &format!("localhost:{}:127.0.0.1", nginx.port)])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("https://localhost:{}{path}", nginx.port))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let route = curl("/v1/route");
    assert!(
        route.ends_with("\n200") && route.contains("ws_url"),
        "{route}"
    );
    assert!(curl("/metrics").ends_with("\n404"));
}
