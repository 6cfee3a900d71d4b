//! Test helpers, in one place: start the real `im-server` binary on free ports with a
//! temp data dir, make tokens, connect raw and SDK clients, scrape the admin API.

#![allow(dead_code)]

pub mod cluster;
pub mod deploy;
pub mod faults;
pub mod nats;
pub mod receiver;
pub mod regions;
pub mod tls;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use im_client::proto::{self, frame, Body, Frame, Login};
use im_client::{Client, ClientConfig, RawConn, RawEvent};

/// The JWT secret every test server uses.
pub const SECRET: &str = "e2e-test-secret-of-at-least-32-bytes";
/// The admin token every test server uses.
pub const ADMIN_TOKEN: &str = "e2e-admin-token-of-at-least-32-bytes";
/// How long a test waits for anything before failing.
pub const WAIT: Duration = Duration::from_secs(15);

/// A running `im-server` child process.
pub struct TestServer {
    child: Child,
    /// Client listener.
    pub client_addr: SocketAddr,
    /// Admin listener.
    pub admin_addr: SocketAddr,
    /// Its data dir (kept across restarts by [`TestServer::restart`]).
    pub data_dir: PathBuf,
    tmp_keep: Arc<tempfile::TempDir>,
    log: Arc<Mutex<String>>,
    env: Vec<(String, String)>,
    /// The binary and its arguments (the one under test, none by default).
    cmd: (PathBuf, Vec<String>),
}

/// Ports [`spare_port`] hands out: below the kernel's ephemeral range (32768-60999 by
/// default) and clear of the bench scripts' fixed ports (17070-17091, 27070 up).
const SPARE_PORTS: std::ops::Range<u32> = 18_000..27_000;

/// A loopback port for a child process (nats-server, nginx, prometheus) to listen on.
///
/// Not one from `bind(0)`: that comes from the ephemeral range, and between its release
/// and the child's bind any process's outgoing connection could take it as its source
/// port, which now and then left a nats-server unable to listen on a busy machine. These
/// come from [`SPARE_PORTS`], where no connection's source port falls; each is handed out
/// once per process (starting at an offset of the process id, so test processes running
/// side by side start apart), and only if it binds now.
pub fn spare_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = SPARE_PORTS.end - SPARE_PORTS.start;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    for _ in 0..span {
        let port = SPARE_PORTS.start + NEXT.fetch_add(1, Ordering::AcqRel) % span;
        let port = u16::try_from(port).expect("SPARE_PORTS fits in u16");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no spare port left in {SPARE_PORTS:?}");
}

/// A token for `user` valid for `ttl`, signed with the test secret.
pub fn token_with_ttl(user: &str, ttl: Duration) -> String {
    im_server::auth::TokenKeys::new(SECRET.as_bytes())
        .issue(user, ttl)
        .expect("token")
}

/// Path of the binary under test: `IM_TEST_SERVER_BIN` (to run a test against another
/// build, e.g. the one before a fix), else the one cargo built for this package's tests,
/// else (a test of another package, the console's) the one beside this test in
/// `target/<profile>/`, which `cargo test --workspace` builds.
pub fn server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("IM_TEST_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    if let Some(bin) = option_env!("CARGO_BIN_EXE_im-server") {
        return PathBuf::from(bin);
    }
    // target/<profile>/deps/<test>-HASH -> target/<profile>/im-server
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile> above the test binary")
        .join("im-server");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p im-server` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// Whether the external tool `program` runs (`program ARGS` starts and exits 0). A
/// missing tool skips its test with a note naming `install` outside CI; under CI (`CI`
/// set, as `.ci/run` does) it fails the test, so a green CI never hides a skipped check.
pub fn tool_available(program: &str, args: &[&str], install: &str) -> bool {
    let why = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => return true,
        Ok(out) => format!("exit {}", out.status),
        Err(e) => e.to_string(),
    };
    let msg = format!("`{program}` does not run ({why}): {install}");
    assert!(
        std::env::var_os("CI").is_none(),
        "{msg} (required under CI)"
    );
    eprintln!("{msg}; skipping");
    false
}

/// A whole number from the environment variable `name`, or `default` when unset or not
/// a number (sizes of tests that are also run bigger for measurements).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl TestServer {
    /// Starts a server with default config on free ports.
    pub fn start() -> TestServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `IM_*` env settings.
    pub fn start_with(env: &[(&str, &str)]) -> TestServer {
        let tmp = Arc::new(tempfile::tempdir().expect("temp dir"));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn(tmp, env, "127.0.0.1:0", (server_bin(), Vec::new()))
    }

    /// Starts a server with extra `IM_*` env settings and command-line arguments (e.g.
    /// `--config FILE`).
    pub fn start_with_args(env: &[(&str, &str)], args: &[&str]) -> TestServer {
        Self::start_binary(&server_bin(), args, env)
    }

    /// Starts `bin` with `args` (e.g. a packaged binary and `--config FILE`) and extra
    /// `IM_*` env settings; ports, data dir and secrets as in [`TestServer::start_with`].
    pub fn start_binary(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> TestServer {
        let tmp = Arc::new(tempfile::tempdir().expect("temp dir"));
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let args = args.iter().map(|a| a.to_string()).collect();
        Self::spawn(tmp, env, "127.0.0.1:0", (bin.to_owned(), args))
    }

    /// Starts a server with a TOML config file holding `toml` (for what env variables
    /// cannot say, e.g. the webhook endpoints) and extra `IM_*` env settings.
    pub fn start_with_config(toml: &str, env: &[(&str, &str)]) -> TestServer {
        let tmp = Arc::new(tempfile::tempdir().expect("temp dir"));
        let file = tmp.path().join("config.toml");
        std::fs::write(&file, toml).expect("writing the config file");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let args = vec!["--config".to_owned(), file.display().to_string()];
        Self::spawn(tmp, env, "127.0.0.1:0", (server_bin(), args))
    }

    fn spawn(
        tmp: Arc<tempfile::TempDir>,
        env: Vec<(String, String)>,
        listen: &str,
        cmd: (PathBuf, Vec<String>),
    ) -> TestServer {
        // A test may place the data dir elsewhere (a small tmpfs) with its own IM_DATA_DIR.
        let data_dir = env
            .iter()
            .find(|(k, _)| k == "IM_DATA_DIR")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| tmp.path().join("data"));
        let mut command = Command::new(&cmd.0);
        command
            .args(&cmd.1)
            .env("IM_LISTEN", listen)
            .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
            .env("IM_DATA_DIR", &data_dir)
            .env("IM_JWT_SECRET", SECRET)
            .env("IM_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("IM_LOG", "info")
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn im-server");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("listening client=") {
                    let _ = tx.send(line.clone());
                    sent = true;
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start; log:\n{}", log.lock().unwrap());
            }
        };
        let addr_of = |key: &str| -> SocketAddr {
            let rest = &line[line.find(key).expect("addr key") + key.len()..];
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        TestServer {
            child,
            client_addr: addr_of("client="),
            admin_addr: addr_of("admin="),
            data_dir,
            tmp_keep: tmp,
            log,
            env,
            cmd,
        }
    }

    /// Kills the server with SIGKILL and waits for it to die.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new process on the same data dir, env and client port (after a kill).
    pub fn restart(&mut self) {
        self.kill();
        let listen = self.client_addr.to_string();
        // Dropping the old value reaps the dead child; the temp dir is shared, so it stays.
        *self = Self::spawn(
            self.tmp_keep.clone(),
            self.env.clone(),
            &listen,
            self.cmd.clone(),
        );
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sigterm();
        self.child.wait().expect("wait")
    }

    /// Sends `signal` (a name `kill` takes: `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {}", self.child.id());
    }

    /// Waits until the process is stopped (state `T` in `/proc/PID/stat`) after a
    /// SIGSTOP: every thread has stopped, none can still answer.
    pub fn wait_stopped(&self) {
        let stat = format!("/proc/{}/stat", self.child.id());
        let end = Instant::now() + WAIT;
        loop {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            // "PID (comm) STATE ...": the state follows the last ')'.
            let stopped = state
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'));
            if stopped {
                return;
            }
            assert!(
                Instant::now() < end,
                "pid {} never stopped: {state}",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM and returns at once (graceful drain).
    pub fn sigterm(&self) {
        unsafe_sigterm(self.child.id());
    }

    /// Waits up to `limit` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's peak resident set so far (`VmHWM` of /proc/PID/status), in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmHWM in /proc/PID/status")
            * 1024
    }

    /// Waits until the store (the default SQLite database in the data dir) holds
    /// `user`'s cursor of `conversation` at `seq` or past it: the persistence writer
    /// commits a DeliverAck's cursor a moment after the read loop hands it in.
    pub async fn wait_cursor(&self, user: &str, conversation: &str, seq: u64) {
        use im_server::store::Store;
        let store = im_server::store::SqliteStore::open(&self.data_dir.join("im.db"), false, 1)
            .await
            .expect("open the store");
        let end = Instant::now() + WAIT;
        while store
            .cursor(user, conversation)
            .await
            .expect("read a cursor")
            < seq
        {
            assert!(
                Instant::now() < end,
                "timed out waiting for {user}'s cursor of {conversation} to reach {seq}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The read cursor of `user`'s `device` in `conversation`, from the store (the
    /// default SQLite database in the data dir).
    pub async fn store_device_read(&self, user: &str, device: &str, conversation: &str) -> u64 {
        use im_server::store::Store;
        let store = im_server::store::SqliteStore::open(&self.data_dir.join("im.db"), false, 1)
            .await
            .expect("open the store");
        store
            .device_cursor(user, device, conversation)
            .await
            .expect("read a device cursor")
            .1
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The client WebSocket URL.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.client_addr)
    }

    /// A token for `user`, signed with the test secret.
    pub fn token(&self, user: &str) -> String {
        token_with_ttl(user, Duration::from_secs(3600))
    }

    /// A token for `user` valid for `ttl`.
    pub fn token_ttl(&self, user: &str, ttl: Duration) -> String {
        token_with_ttl(user, ttl)
    }

    /// A raw connection, logged in as `user`.
    pub async fn raw(&self, user: &str) -> RawConn {
        let mut c = RawConn::connect(&self.ws_url()).await.expect("connect");
        c.login(&self.token(user), "test-device", false)
            .await
            .expect("login");
        c
    }

    /// A raw connection, not logged in.
    pub async fn raw_anonymous(&self) -> RawConn {
        RawConn::connect(&self.ws_url()).await.expect("connect")
    }

    /// An SDK client logged in as `user`.
    pub async fn client(&self, user: &str) -> Client {
        Client::connect(ClientConfig::new(self.ws_url(), self.token(user)))
            .await
            .expect("client connect")
    }

    /// GET an admin path with the admin token; returns (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http(self.admin_addr, "GET", path, Some(ADMIN_TOKEN))
    }

    /// The Prometheus scrape.
    pub fn metrics(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "metrics: {body}");
        body
    }

    /// Sum of a metric's samples whose label set contains every `labels` pair.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.metrics(), name, labels)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// Sums the samples of `name` in a Prometheus text scrape that carry every label pair.
pub fn metric_value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match key.find('{') {
                Some(i) => (&key[..i], &key[i..]),
                None => (key, ""),
            };
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// A TCP connection to `addr` from source address `from` (any 127.x address on Linux).
pub fn connect_from(addr: SocketAddr, from: std::net::IpAddr) -> std::net::TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::new(from, 0).into())
        .expect("bind source address");
    socket.connect(&addr.into()).expect("connect");
    let s: std::net::TcpStream = socket.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// A WebSocket upgrade request for `GET /ws` from source address `from`; returns the
/// response head and body as text, and the socket (kept open: it holds the connection).
pub fn ws_upgrade_from(addr: SocketAddr, from: std::net::IpAddr) -> (String, std::net::TcpStream) {
    ws_upgrade_with(addr, from, "")
}

/// As [`ws_upgrade_from`] with extra header lines (each ending in `\r\n`).
pub fn ws_upgrade_with(
    addr: SocketAddr,
    from: std::net::IpAddr,
    extra_headers: &str,
) -> (String, std::net::TcpStream) {
    let mut s = connect_from(addr, from);
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
    )
    .unwrap();
    // Read the head (and a short body, if any) without waiting for the socket to close.
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        let n = s.read(&mut buf).unwrap_or(0);
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if body.len() >= len {
                break;
            }
        }
        if n == 0 {
            break;
        }
    }
    (String::from_utf8_lossy(&raw).to_string(), s)
}

/// A minimal HTTP/1.1 request over loopback; returns (status, body).
pub fn http(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("admin connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits for the next frame on a raw connection (panics on close or timeout).
pub async fn next_frame(c: &mut RawConn) -> Frame {
    match c.recv_timeout(WAIT).await {
        Ok(RawEvent::Frame(f)) => f,
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// Pings and returns the frames that came before the Pong: what was queued for `c`
/// before the ping was handled.
pub async fn frames_before_pong(c: &mut RawConn, req_id: u64) -> Vec<Frame> {
    c.send(&frame(req_id, Body::Ping(proto::Ping { client_time: 1 })))
        .await
        .unwrap();
    let mut before = Vec::new();
    loop {
        let f = next_frame(c).await;
        if f.req_id == req_id && matches!(f.body, Some(Body::Pong(_))) {
            return before;
        }
        before.push(f);
    }
}

/// Waits for the close of a raw connection; returns (code, reason) and the frames before it.
pub async fn until_closed(c: &mut RawConn) -> (Option<u16>, String, Vec<Frame>) {
    let mut frames = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.recv_timeout(left).await {
            Ok(RawEvent::Frame(f)) => frames.push(f),
            Ok(RawEvent::Closed { code, reason }) => return (code, reason, frames),
            Ok(RawEvent::WsPong(_)) => {}
            Err(e) => panic!("expected close, got error {e} after {frames:?}"),
        }
    }
}

/// A Send frame to a user.
pub fn send_to_user(req_id: u64, to: &str, payload: &[u8], client_msg_id: &str) -> Frame {
    frame(
        req_id,
        Body::Send(proto::Send {
            target: Some(proto::send::Target::ToUser(to.into())),
            r#type: proto::MessageType::Text as i32,
            payload: payload.to_vec().into(),
            client_msg_id: client_msg_id.into(),
        }),
    )
}

/// A Send frame to a group.
pub fn send_to_group(req_id: u64, group: &str, payload: &[u8], client_msg_id: &str) -> Frame {
    frame(
        req_id,
        Body::Send(proto::Send {
            target: Some(proto::send::Target::GroupId(group.into())),
            r#type: proto::MessageType::Text as i32,
            payload: payload.to_vec().into(),
            client_msg_id: client_msg_id.into(),
        }),
    )
}

/// A Login frame.
pub fn login_frame(token: &str) -> Frame {
    frame(
        1,
        Body::Login(Login {
            token: token.into(),
            device_id: "d".into(),
            resume: false,
        }),
    )
}

/// One `only_cursors` sync of `conv` after `after` (a node may answer it from its window).
pub async fn sync_one(c: &mut RawConn, req_id: u64, conv: &str, after: u64) -> Body {
    let sync = proto::SyncRequest {
        cursors: vec![proto::Cursor {
            conversation_id: conv.into(),
            after_seq: after,
        }],
        limit: 100,
        only_cursors: true,
    };
    request(c, req_id, Body::Sync(sync)).await
}

/// Runs a full sync on a raw connection (empty cursors first, then paging); returns all messages.
pub async fn raw_sync_all(c: &mut RawConn, limit: u32) -> Vec<proto::ChatMessage> {
    let mut all: Vec<proto::ChatMessage> = Vec::new();
    let mut cursors: Vec<proto::Cursor> = Vec::new();
    let mut req_id = 9_000_000;
    loop {
        req_id += 1;
        c.send(&frame(
            req_id,
            Body::Sync(proto::SyncRequest {
                cursors: cursors.clone(),
                limit,
                ..Default::default()
            }),
        ))
        .await
        .unwrap();
        let resp = loop {
            let f = next_frame(c).await;
            if f.req_id == req_id {
                break f;
            }
        };
        let Some(Body::SyncResp(r)) = resp.body else {
            panic!("expected SyncResponse, got {resp:?}")
        };
        for m in &r.messages {
            match cursors
                .iter_mut()
                .find(|k| k.conversation_id == m.conversation_id)
            {
                Some(k) => k.after_seq = k.after_seq.max(m.seq),
                None => cursors.push(proto::Cursor {
                    conversation_id: m.conversation_id.clone(),
                    after_seq: m.seq,
                }),
            }
        }
        all.extend(r.messages);
        if !r.more {
            return all;
        }
        if cursors.is_empty() {
            panic!("more=true with no messages");
        }
    }
}

/// Path helper for files in a test server's data dir.
pub fn in_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Sends `n` texts to `group`, "{prefix}0" on (each its own client_msg_id, req_ids from
/// 10), and waits for their SendAcks.
pub async fn send_texts_to_group(c: &mut RawConn, group: &str, prefix: &str, n: u64) {
    for i in 0..n {
        let text = format!("{prefix}{i}");
        c.send(&send_to_group(10 + i, group, text.as_bytes(), &text))
            .await
            .unwrap();
    }
    assert_eq!(acks(c, n as usize).await.len(), n as usize);
}

/// Reads frames until `n` SendAcks have arrived; returns them (other frames are skipped).
pub async fn acks(c: &mut RawConn, n: usize) -> Vec<(u64, proto::SendAck)> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let f = next_frame(c).await;
        match f.body {
            Some(Body::SendAck(a)) => out.push((f.req_id, a)),
            Some(Body::Error(e)) => panic!("send refused: {e:?}"),
            _ => {}
        }
    }
    out
}

/// An HTTP/1.1 request with an optional body over loopback; returns (status, lower-cased
/// headers, raw body bytes). For binary responses and JSON request bodies.
pub fn http_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).expect("admin connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut body = raw[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if head.contains("transfer-encoding: chunked") {
        body = dechunk_bytes(&body);
    }
    (status, head, body)
}

fn dechunk_bytes(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..i]);
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        let rest = &body[i + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        body = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

impl TestServer {
    /// An admin request with a JSON body and the admin token; returns (status, body).
    pub fn admin_json(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let (status, _, b) = http_bytes(
            self.admin_addr,
            method,
            path,
            Some(ADMIN_TOKEN),
            body.as_bytes(),
        );
        (status, String::from_utf8_lossy(&b).to_string())
    }
}

/// Syncs an SDK client and returns the first `n` messages it hands to the app, in
/// order (a background sync may have delivered some before the explicit one).
pub async fn sdk_sync_all(c: &Client, n: usize) -> Vec<proto::ChatMessage> {
    c.sync().await.expect("sync");
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.push(c.next_message(WAIT).await.expect("a synced message"));
    }
    got
}

/// As [`eventually`], blocking (for tests without a runtime).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `f` until it returns true; panics naming `what` when [`WAIT`] runs out.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `group` with `owner`'s connection as creator (its owner) and `members`;
/// panics on refusal. Returns the group's version: the seq of its CREATE event, after
/// which the first chat message comes.
pub async fn create_group(owner: &mut RawConn, group: &str, members: Vec<String>) -> u64 {
    let ok = group_op_ok(owner, 2, proto::group_op::Op::Create, group, members).await;
    ok.version
}

/// Sends `body` as request `req_id` and returns the answer's body (frames in between,
/// e.g. pushes, are skipped).
pub async fn request(c: &mut RawConn, req_id: u64, body: Body) -> Body {
    c.send(&frame(req_id, body)).await.unwrap();
    loop {
        let f = next_frame(c).await;
        if f.req_id == req_id {
            return f.body.expect("a body");
        }
    }
}

/// Sends a GroupOp and returns its answer (frames in between, e.g. the group's own
/// SYSTEM events, are skipped).
pub async fn group_request(c: &mut RawConn, req_id: u64, op: proto::GroupOp) -> Body {
    request(c, req_id, Body::GroupOp(op)).await
}

/// Pings as request `req_id` and panics unless the very next frame is its Pong.
pub async fn ping_ok(c: &mut RawConn, req_id: u64) {
    c.send(&frame(req_id, Body::Ping(proto::Ping { client_time: 7 })))
        .await
        .unwrap();
    let f = next_frame(c).await;
    assert_eq!(f.req_id, req_id);
    assert!(
        matches!(f.body, Some(Body::Pong(ref p)) if p.client_time == 7),
        "{f:?}"
    );
}

/// A GroupOp with `op`, `group` and `members`; panics unless it is answered GroupOpOk.
pub async fn group_op_ok(
    c: &mut RawConn,
    req_id: u64,
    op: proto::group_op::Op,
    group: &str,
    members: Vec<String>,
) -> proto::GroupOpOk {
    let body = group_request(
        c,
        req_id,
        proto::GroupOp {
            op: op as i32,
            group_id: group.into(),
            members,
            ..Default::default()
        },
    )
    .await;
    match body {
        Body::GroupOpOk(ok) => ok,
        other => panic!("GroupOp {op:?} {group}: {other:?}"),
    }
}

/// Whether a frame is a push of membership events only (SYSTEM messages).
pub fn is_event_push(f: &Frame) -> bool {
    matches!(&f.body, Some(Body::Deliver(d))
        if d.messages.iter().all(|m| m.r#type == proto::MessageType::System as i32))
}

/// The next frame that is not a push of membership events.
pub async fn next_chat_frame(c: &mut RawConn) -> Frame {
    loop {
        let f = next_frame(c).await;
        if !is_event_push(&f) {
            return f;
        }
    }
}

/// The messages that are not membership events.
pub fn chat_only(msgs: Vec<proto::ChatMessage>) -> Vec<proto::ChatMessage> {
    msgs.into_iter()
        .filter(|m| m.r#type != proto::MessageType::System as i32)
        .collect()
}
