//! Deployment: chat through Debian's nginx running the repository's site file
//! (docs/deploy/nginx.conf: TLS termination, the WebSocket upgrade, /v1/route), and the
//! Debian package (packaging/): its contents, its unit, and the packaged binary run with
//! the packaged config.

use std::net::SocketAddr;
use std::process::Command;

use crate::support::deploy::{repo_root, Nginx};
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

/// Runs a command, panicking with its stderr when it fails; returns its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_package_builds_verifies_and_its_binary_chats_with_its_config() {
    if !tool_available("dpkg-deb", &["--version"], "apt-get install dpkg")
        || !tool_available("systemd-analyze", &["--version"], "apt-get install systemd")
        || !tool_available("objdump", &["--version"], "apt-get install binutils")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let deb = run(Command::new(repo_root().join("packaging/build-deb"))
        .arg("--binary")
        .arg(server_bin())
        .arg("--out")
        .arg(&out)
        .args(["--compress", "none"]));
    let deb = std::path::PathBuf::from(deb.trim());
    assert!(deb.starts_with(&out) && deb.exists(), "{deb:?}");

    let info = run(Command::new("dpkg-deb").arg("--info").arg(&deb));
    for want in [
        "Package: im-server",
        "Depends: libc6 (>= ",
        "adduser",
        "postinst",
        "conffiles",
    ] {
        assert!(
            info.contains(want),
            "dpkg-deb --info lacks {want:?}:\n{info}"
        );
    }
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for (path, mode) in [
        ("./usr/bin/im-server", "-rwxr-xr-x root/root"),
        ("./etc/im/im.toml", "-rw-r--r-- root/root"),
        (
            "./usr/lib/systemd/system/im-server.service",
            "-rw-r--r-- root/root",
        ),
        (
            "./usr/lib/sysctl.d/60-im-server.conf",
            "-rw-r--r-- root/root",
        ),
        (
            "./usr/share/doc/im-server/deploy.md",
            "-rw-r--r-- root/root",
        ),
        (
            "./usr/share/doc/im-server/copyright",
            "-rw-r--r-- root/root",
        ),
        (
            "./usr/share/doc/im-server/runbooks/kernel-limits.md",
            "-rw-r--r-- root/root",
        ),
    ] {
        let line = contents.lines().find(|l| l.ends_with(&format!(" {path}")));
        let line = line.unwrap_or_else(|| panic!("{path} not in the package:\n{contents}"));
        assert!(line.starts_with(mode), "{path}: {line}");
    }
    let control = tmp.path().join("control");
    run(Command::new("dpkg-deb")
        .arg("--control")
        .arg(&deb)
        .arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/im/im.toml");
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh").arg("-n").arg(control.join(script)));
    }
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(postinst.contains("adduser --system") && postinst.contains("/var/lib/im"));

    // The unit, verified in a temp root holding the package's files (so neither the
    // binary nor the im user need to exist on this machine), plus the targets and
    // /bin/kill its dependencies and ExecReload= name. No warning is accepted.
    let root = tmp.path().join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/kill", root.join("bin/kill")).unwrap();
    for entry in std::fs::read_dir("/usr/lib/systemd/system").unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "target") {
            std::fs::copy(
                &p,
                root.join("usr/lib/systemd/system")
                    .join(p.file_name().unwrap()),
            )
            .unwrap();
        }
    }
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("/usr/lib/systemd/system/im-server.service")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    let unit =
        std::fs::read_to_string(root.join("usr/lib/systemd/system/im-server.service")).unwrap();
    for want in [
        "User=im",
        "ExecStart=/usr/bin/im-server --config /etc/im/im.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "LimitNOFILE=1048576",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/im /var/log/im",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.lines().any(|l| l == want), "the unit lacks {want}");
    }

    // The packaged config is one the server accepts (`token` loads and checks it); an
    // unknown key in it is refused by name.
    let bin = root.join("usr/bin/im-server");
    let config = root.join("etc/im/im.toml");
    let token = run(Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .args(["token", "--user", "probe"])
        .env("IM_JWT_SECRET", SECRET));
    assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");
    let bad = tmp.path().join("bad.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&bad, format!("bogus_key = 1\n{text}")).unwrap();
    let refused = Command::new(&bin)
        .arg("--config")
        .arg(&bad)
        .args(["token", "--user", "probe"])
        .env("IM_JWT_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("bogus_key"));

    // The packaged binary with the packaged config, its paths moved into the temp dir:
    // two clients log in and chat, and the JSON log lands in the configured log dir.
    let logs = tmp.path().join("logs");
    let logs_env = logs.to_str().unwrap();
    let server = TestServer::start_binary(
        &bin,
        &["--config", config.to_str().unwrap()],
        &[("IM_LOG_DIR", logs_env)],
    );
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;
    let ack = alice
        .send_text("bob", "from the package")
        .await
        .expect("send");
    assert_eq!(ack.seq, 1);
    let got = bob.next_message(WAIT).await.expect("bob receives");
    assert_eq!(&got.payload[..], b"from the package");
    wait_until("the JSON log file in the log dir", || {
        std::fs::read_dir(&logs).is_ok_and(|d| d.count() > 0)
    });
}
