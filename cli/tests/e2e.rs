//! End-to-end: the real `im` binary against the real `im-server` binary. A message sent
//! with `im send` arrives in `im listen` (offline through the sync and live), groups are
//! created, changed, written to and read back, history pages, conversations count
//! unread messages until `im read`, and bad input (URL, token, server down, unknown
//! group, refused operations) exits non-zero with a clear sentence on stderr.
//!
//! The server binary is the one `cargo test --workspace` builds (a run of this package
//! alone needs `cargo build -p im-server` first; see `server_bin`).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// The workspace's end-to-end helpers (start the real im-server on free ports with a temp
// data dir, mint tokens), shared with the server's own e2e suite.
#[path = "../../tests/e2e/support/mod.rs"]
mod support;

use support::{TestServer, SECRET, WAIT};

/// What one run of `im` left behind.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `im` with the URL and a token for `user` in its environment (and nothing inherited
/// that could change what it does).
fn im(server: &TestServer, user: &str) -> Command {
    let mut c = bare_im();
    c.env("IM_URL", server.ws_url())
        .env("IM_TOKEN", server.token(user));
    c
}

/// `im` without URL or token.
fn bare_im() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_im"));
    for var in ["IM_URL", "IM_TOKEN", "IM_TOKEN_FILE", "IM_DEVICE"] {
        c.env_remove(var);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs `cmd` with `args` to the end (killed after [`WAIT`]).
fn run(mut cmd: Command, args: &[&str]) -> Run {
    let child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn im");
    finish(child, WAIT)
}

/// Waits for `child` within `limit` (killing it and failing past that).
fn finish(mut child: Child, limit: Duration) -> Run {
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).expect("read output");
            s
        })
    };
    let out = child.stdout.take().map(|o| read_all(Box::new(o)));
    let err = child.stderr.take().map(|e| read_all(Box::new(e)));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait im") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("im did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = |h: Option<std::thread::JoinHandle<String>>| {
        h.map(|h| h.join().expect("reader")).unwrap_or_default()
    };
    Run {
        code: status.code(),
        stdout: text(out),
        stderr: text(err),
    }
}

/// Runs and expects success, returning stdout.
fn ok(cmd: Command, args: &[&str]) -> String {
    let r = run(cmd, args);
    assert_eq!(r.code, Some(0), "im {args:?} failed: {r:?}");
    r.stdout
}

/// Runs and expects exit `code` with `needle` on stderr (and nothing on stdout).
fn fails(cmd: Command, args: &[&str], code: i32, needle: &str) -> Run {
    let r = run(cmd, args);
    assert_eq!(r.code, Some(code), "im {args:?}: {r:?}");
    assert!(
        r.stderr.contains("im: error:") || r.stderr.contains("error:"),
        "{r:?}"
    );
    assert!(r.stderr.contains(needle), "stderr lacks {needle:?}: {r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    r
}

/// A running `im listen`, its stdout lines collected on a thread.
struct Listener {
    child: Child,
    lines: mpsc::Receiver<String>,
    status: mpsc::Receiver<String>,
}

impl Listener {
    /// Starts `im listen ARGS` as `user` and waits until it says it is listening.
    fn start(server: &TestServer, user: &str, args: &[&str]) -> Listener {
        let mut child = im(server, user)
            .arg("listen")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn im listen");
        let stderr = child.stderr.take().expect("stderr");
        let (status_tx, status) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = status_tx.send(line);
            }
        });
        let first = status.recv_timeout(WAIT).expect("im listen said nothing");
        assert!(first.starts_with("im: listening as"), "{first}");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Listener {
            child,
            lines,
            status,
        }
    }

    /// The next line within [`WAIT`].
    fn line(&self) -> String {
        self.lines
            .recv_timeout(WAIT)
            .expect("a line from im listen")
    }

    /// The next stderr line within [`WAIT`].
    fn status(&self) -> String {
        self.status
            .recv_timeout(WAIT)
            .expect("a status line from im listen")
    }

    /// Sends SIGINT, as Ctrl-C does.
    fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -INT");
    }

    /// Waits for the process to exit by itself; its exit code.
    fn exit_code(mut self) -> Option<i32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s.code();
            }
            assert!(Instant::now() < deadline, "im listen did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `msg_id=ID seq=N conversation=C` -> (N, C).
fn ack_of(stdout: &str) -> (u64, String) {
    let field = |k: &str| {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {stdout:?}"))
            .to_owned()
    };
    assert!(!field("msg_id=").is_empty());
    (field("seq=").parse().expect("seq"), field("conversation="))
}

#[test]
fn a_message_sent_while_away_and_one_sent_live_reach_im_listen() {
    let server = TestServer::start();
    let sent = ok(
        im(&server, "alice"),
        &["send", "--to", "bob", "hello", "bob"],
    );
    assert_eq!(ack_of(&sent), (1, "u:alice:bob".to_owned()));

    // Offline: bob was not connected; the sync brings it.
    let bob = Listener::start(&server, "bob", &["--count", "2", "--json"]);
    let first: serde_json::Value = serde_json::from_str(&bob.line()).expect("json line");
    assert_eq!(first["kind"], "message");
    assert_eq!(first["text"], "hello bob");
    assert_eq!(first["sender"], "alice");
    assert_eq!(first["seq"], 1);

    // Live, with a terminal escape in it: JSON carries it escaped.
    ok(
        im(&server, "alice"),
        &["send", "--to", "bob", "red\u{1b}[31m"],
    );
    let line = bob.line();
    assert!(!line.contains('\u{1b}'), "raw escape in {line:?}");
    let second: serde_json::Value = serde_json::from_str(&line).expect("json line");
    assert_eq!(second["text"], "red\u{1b}[31m");
    assert_eq!(second["seq"], 2);
    assert_eq!(bob.exit_code(), Some(0), "--count 2 ends listen");

    // Text mode on another device: both again (that device's cursor is its own), and
    // the escape printed as text.
    let text = ok(
        im(&server, "bob"),
        &["--device", "laptop", "listen", "--count", "2"],
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].ends_with("u:alice:bob #1 alice: hello bob"),
        "{text}"
    );
    assert!(lines[1].ends_with("alice: red\\u{1b}[31m"), "{text}");
}

#[test]
fn listen_rides_out_a_server_restart_and_stops_on_ctrl_c() {
    let mut server = TestServer::start();
    let bob = Listener::start(&server, "bob", &[]);
    server.restart();
    let lost = bob.status();
    assert!(lost.starts_with("im: connection lost"), "{lost}");
    let mut back = bob.status();
    while !back.starts_with("im: reconnected") {
        back = bob.status();
    }
    ok(
        im(&server, "alice"),
        &["send", "--to", "bob", "after the restart"],
    );
    let line = bob.line();
    assert!(line.ends_with("alice: after the restart"), "{line}");
    bob.interrupt();
    assert_eq!(bob.exit_code(), Some(0), "Ctrl-C is a normal stop");
}

#[test]
fn listen_ends_with_the_login_refusal_when_its_token_expires() {
    let server = TestServer::start_with(&[("IM_LIMITS_TOKEN_LEEWAY_SECS", "0")]);
    let child = im(&server, "bob")
        .env("IM_TOKEN", server.token_ttl("bob", Duration::from_secs(2)))
        .arg("listen")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn im listen");
    let r = finish(child, WAIT);
    assert_eq!(r.code, Some(4), "{r:?}");
    assert!(r.stderr.contains("im: connection lost"), "{r:?}");
    assert!(
        r.stderr.contains("refused the login: invalid token"),
        "{r:?}"
    );
}

#[test]
fn edits_and_recalls_are_acked_and_shown_in_history() {
    let server = TestServer::start();
    ok(im(&server, "alice"), &["send", "--to", "bob", "frist"]);
    ok(im(&server, "alice"), &["send", "--to", "bob", "oops"]);
    let edited = ok(im(&server, "alice"), &["edit", "u:alice:bob", "1", "first"]);
    assert_eq!(ack_of(&edited), (3, "u:alice:bob".to_owned()));
    let recalled = ok(im(&server, "alice"), &["recall", "u:alice:bob", "2"]);
    assert_eq!(ack_of(&recalled), (4, "u:alice:bob".to_owned()));

    let history = ok(im(&server, "bob"), &["history", "--with", "alice"]);
    assert!(
        history.contains("u:alice:bob #1 alice: first [edited]"),
        "{history}"
    );
    assert!(
        history.contains("u:alice:bob #2 alice: [recalled]"),
        "{history}"
    );
    assert!(history.contains("#3 alice: [edited #1] first"), "{history}");
    assert!(history.contains("#4 alice: [recalled #2]"), "{history}");
    let list = ok(im(&server, "bob"), &["conversations"]);
    assert!(list.trim_end().ends_with("#4 alice: [recalled]"), "{list}");
    fails(
        im(&server, "bob"),
        &["edit", "u:alice:bob", "1", "mine now"],
        5,
        "FORBIDDEN",
    );
}

#[test]
fn groups_are_created_changed_written_to_and_read_back() {
    let server = TestServer::start();
    let created = ok(
        im(&server, "alice"),
        &["group", "create", "team", "--member", "bob"],
    );
    assert_eq!(
        created.trim(),
        "team: 2 members, private, your role: owner, version 1"
    );
    let added = ok(im(&server, "alice"), &["group", "add", "team", "carol"]);
    assert!(added.starts_with("team: 3 members"), "{added}");
    ok(
        im(&server, "alice"),
        &["group", "set-role", "team", "bob", "admin"],
    );

    let sent = ok(im(&server, "carol"), &["send", "--group", "team", "hi all"]);
    let (seq, conversation) = ack_of(&sent);
    assert_eq!(conversation, "g:team");

    let history = ok(im(&server, "bob"), &["history", "--group", "team"]);
    let lines: Vec<&str> = history.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("*: alice created the group with bob")),
        "{history}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with("*: alice added carol")),
        "{history}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with("*: alice made bob admin")),
        "{history}"
    );
    let last = lines.last().expect("a line");
    assert!(
        last.ends_with(&format!("g:team #{seq} carol: hi all")),
        "{history}"
    );

    let info = ok(im(&server, "bob"), &["--json", "group", "info", "team"]);
    let info: serde_json::Value = serde_json::from_str(&info).expect("json");
    assert_eq!(info["members"], 3);
    assert_eq!(info["role"], "admin");

    // Refusals exit 5 with the server's code; a stray argument is a usage error.
    let refused: [(&str, &[&str], i32, &str); 4] = [
        ("dave", &["send", "--group", "team", "x"], 5, "NOT_MEMBER"),
        ("bob", &["group", "dissolve", "team"], 5, "FORBIDDEN"),
        ("dave", &["group", "info", "nosuch"], 5, "NOT_FOUND"),
        ("alice", &["group", "join", "team", "extra"], 2, "error:"),
    ];
    for (user, args, code, needle) in refused {
        fails(im(&server, user), args, code, needle);
    }

    ok(im(&server, "alice"), &["group", "transfer", "team", "bob"]);
    let gone = ok(im(&server, "bob"), &["group", "dissolve", "team"]);
    assert!(gone.contains("your role: none"), "{gone}");
}

#[test]
fn history_pages_back_with_before() {
    let server = TestServer::start();
    for i in 1..=5 {
        ok(
            im(&server, "alice"),
            &["send", "--to", "bob", &format!("m{i}")],
        );
    }
    let page = |args: &[&str]| {
        let mut all = vec!["history", "--with", "alice"];
        all.extend_from_slice(args);
        let r = run(im(&server, "bob"), &all);
        assert_eq!(r.code, Some(0), "{r:?}");
        let texts: Vec<String> = r
            .stdout
            .lines()
            .map(|l| l.rsplit(": ").next().unwrap_or_default().to_owned())
            .collect();
        (texts, r.stderr)
    };
    let (newest, hint) = page(&["--limit", "2"]);
    assert_eq!(newest, ["m4", "m5"]);
    assert!(hint.contains("--before 4"), "{hint}");
    let (older, hint) = page(&["--limit", "2", "--before", "4"]);
    assert_eq!(older, ["m2", "m3"]);
    assert!(hint.contains("--before 2"), "{hint}");
    let (oldest, hint) = page(&["--limit", "2", "--before", "2"]);
    assert_eq!(oldest, ["m1"]);
    assert!(!hint.contains("--before"), "{hint}");
}

#[test]
fn conversations_count_unread_until_read() {
    let server = TestServer::start();
    for text in ["one", "two", "three"] {
        ok(im(&server, "alice"), &["send", "--to", "bob", text]);
    }
    ok(im(&server, "carol"), &["send", "--to", "bob", "hey"]);
    let list = ok(im(&server, "bob"), &["conversations"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(lines[0].contains("1 unread  u:bob:carol"), "{list}");
    assert!(lines[0].ends_with("carol: hey"), "{list}");
    assert!(lines[1].contains("3 unread  u:alice:bob"), "{list}");

    let read = ok(im(&server, "bob"), &["read", "u:alice:bob", "2"]);
    assert_eq!(read.trim(), "read u:alice:bob up to #2");
    let json = ok(
        im(&server, "bob"),
        &["--json", "conversations", "--limit", "5"],
    );
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let alice = rows
        .iter()
        .find(|r| r["conversation"] == "u:alice:bob")
        .expect("row");
    assert_eq!(alice["unread"], 1);
    assert_eq!(alice["read_seq"], 2);
    fails(
        im(&server, "bob"),
        &["read", "alice", "2"],
        2,
        "u:USER_A:USER_B",
    );
}

#[test]
fn bad_input_exits_non_zero_with_a_clear_message() {
    let server = TestServer::start();
    let mut bad_url = im(&server, "alice");
    bad_url.env("IM_URL", "http://127.0.0.1:7070/ws");
    fails(bad_url, &["whoami"], 2, "expected ws://HOST:PORT/PATH");

    let mut no_token = bare_im();
    no_token.env("IM_URL", server.ws_url());
    fails(no_token, &["whoami"], 2, "no token");
    fails(
        im(&server, "alice"),
        &["--token-file", "/nonexistent/token", "whoami"],
        2,
        "cannot read the token file /nonexistent/token",
    );

    fails(
        im(&server, "alice"),
        &["--token", "not-a-jwt", "whoami"],
        4,
        "refused the login: invalid token",
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let expired = im_server::auth::TokenKeys::new(SECRET.as_bytes())
        .sign(&im_server::auth::Claims {
            sub: "alice".into(),
            exp: now - 3600,
            iat: now - 7200,
        })
        .expect("sign");
    fails(
        im(&server, "alice"),
        &["--token", &expired, "send", "--to", "bob", "x"],
        4,
        "ExpiredSignature",
    );

    // Server down: a port nothing listens on; the message names the URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("ws://127.0.0.1:{port}/ws");
    let mut down = im(&server, "alice");
    down.env("IM_URL", &url);
    let r = fails(down, &["send", "--to", "bob", "x"], 3, &url);
    assert!(r.stderr.contains("refused"), "{r:?}");

    // A socket that takes the connection and never answers: --timeout ends the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut hung = im(&server, "alice");
    hung.env(
        "IM_URL",
        format!("ws://{}/ws", silent.local_addr().expect("addr")),
    );
    fails(hung, &["--timeout", "500ms", "whoami"], 3, "no answer from");

    let usage: [(&[&str], &str); 4] = [
        (&["send", "--to", "bad id", "x"], "1 to 64"),
        (&["--timeout", "5x", "whoami"], "unknown unit"),
        (&["--url", "ws://[::1/ws", "whoami"], "unclosed ["),
        (&["--device", "", "whoami"], "1 to 128"),
    ];
    for (args, needle) in usage {
        fails(im(&server, "alice"), args, 2, needle);
    }

    let who = ok(im(&server, "alice"), &["whoami"]);
    assert!(who.starts_with("alice (node "), "{who}");
}

#[test]
fn a_token_file_and_stdin_text_work() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{}\n", server.token("alice"))).expect("write token");
    let mut cmd = bare_im();
    cmd.env("IM_URL", server.ws_url())
        .arg("--token-file")
        .arg(&file)
        .args(["send", "--to", "bob", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"from a pipe\n").expect("write");
    }
    let r = finish(child, WAIT);
    assert_eq!(r.code, Some(0), "{r:?}");
    let history = ok(im(&server, "bob"), &["history", "--with", "alice"]);
    assert!(
        history.trim_end().ends_with("alice: from a pipe"),
        "{history}"
    );
}

#[test]
fn send_and_history_over_wss_with_a_ca_file() {
    if !support::tls::openssl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = support::tls::Pki::new(&tmp.path().join("pki"));
    let server = support::tls::tls_server(&pki, &[]);
    let url = format!("wss://localhost:{}/ws", server.client_addr.port());
    let ca = pki.ca.to_str().unwrap();
    let over_tls = |user: &str| {
        let mut c = bare_im();
        c.env("IM_URL", &url).env("IM_TOKEN", server.token(user));
        c
    };
    ok(
        over_tls("alice"),
        &["--ca", ca, "send", "--to", "bob", "over tls"],
    );
    let history = ok(over_tls("bob"), &["--ca", ca, "history", "--with", "alice"]);
    assert!(history.contains("over tls"), "{history}");
    // Without the CA the server's certificate is not trusted: a clear failure.
    let r = run(over_tls("bob"), &["whoami"]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("certificate"), "{r:?}");
    let r = run(over_tls("bob"), &["--ca", "/nonexistent/ca.pem", "whoami"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("/nonexistent/ca.pem"), "{r:?}");
}
