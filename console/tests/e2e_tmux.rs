//! End-to-end: the real `im-console` binary runs inside tmux against a real `im-server`
//! with WebSocket clients sending traffic, driven by `tmux send-keys` and read back with
//! `tmux capture-pane`. It checks that the overview shows the right connection count,
//! that a kick from the console closes the chosen connection with code 4002, that a
//! per-uid log filter set from the console shows up in `GET /admin/v1/log-filters`, that
//! the connections table shows each connection's device, that an announcement typed
//! into the console reaches the group as a SYSTEM message, that the Users view shows a
//! filtered user's session and sent messages, and that `q` quits.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_client::proto::{self, Body};
use im_client::{RawConn, RawEvent};

// The workspace's end-to-end helpers (start the real im-server on free ports with a temp
// data dir, mint tokens, call the admin API), shared with the server's own e2e suite.
#[path = "../../tests/e2e/support/mod.rs"]
mod support;

use support::{tool_available, TestServer, ADMIN_TOKEN};

/// How long any one step of the console may take.
const WAIT: Duration = Duration::from_secs(30);

/// The console in a tmux session on a private socket; the tmux server is killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        let socket = format!("im-console-e2e-{}", std::process::id());
        let t = Tmux { socket };
        let ok = t
            .cmd()
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
            ])
            .args(["-s", "console", command])
            .status()
            .unwrap_or_else(|e| {
                panic!("tmux not runnable ({e}): install it (apt-get install tmux)")
            });
        assert!(ok.success(), "tmux new-session failed");
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "console"])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Sends tmux key names one at a time (so Esc and a letter never merge into Alt-letter).
    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let ok = self
                .cmd()
                .args(["send-keys", "-t", "console", k])
                .status()
                .expect("send-keys");
            assert!(ok.success(), "send-keys {k}");
            std::thread::sleep(Duration::from_millis(120));
        }
    }

    /// Types text literally.
    fn type_text(&self, text: &str) {
        let ok = self
            .cmd()
            .args(["send-keys", "-t", "console", "-l", text])
            .status()
            .expect("send-keys -l");
        assert!(ok.success(), "send-keys -l {text}");
        std::thread::sleep(Duration::from_millis(120));
    }

    /// Waits until `pred` holds for the screen; fails with the last screen.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn alive(&self) -> bool {
        self.cmd()
            .args(["has-session", "-t", "console"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").stderr(Stdio::null()).status();
    }
}

/// The number after the Overview's `connections` label.
fn shown_connections(screen: &str) -> Option<u64> {
    let i = screen.find("│ connections ")?;
    screen[i + "│ connections ".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn send_frame(seq: u64, to: &str) -> proto::Frame {
    proto::frame(
        seq,
        Body::Send(proto::Send {
            target: Some(proto::send::Target::ToUser(to.into())),
            r#type: proto::MessageType::Text as i32,
            payload: format!("hello {seq}").into_bytes().into(),
            client_msg_id: format!("e2e-{seq}"),
        }),
    )
}

/// A logged-in client that sends to `to` every 20 ms (if given) and reads everything;
/// reports its close code on `closed`.
async fn client_task(
    mut conn: RawConn,
    to: Option<&'static str>,
    stop: Arc<AtomicBool>,
    closed: tokio::sync::oneshot::Sender<Option<u16>>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut seq = 1u64;
    let code = loop {
        if stop.load(Ordering::Relaxed) {
            break None;
        }
        tokio::select! {
            _ = tick.tick() => {
                if let Some(to) = to {
                    seq += 1;
                    // Bounded: a few thousand messages at most over the test.
                    if seq < 5000 && conn.send(&send_frame(seq, to)).await.is_err() {
                        break None;
                    }
                }
            }
            ev = conn.recv() => match ev {
                Ok(RawEvent::Frame(_) | RawEvent::WsPong(_)) => {}
                Ok(RawEvent::Closed { code, .. }) => break code,
                Err(_) => break None,
            },
        }
    };
    let _ = closed.send(code);
}

#[test]
fn console_drives_a_live_node() {
    if !tool_available("tmux", &["-V"], "apt-get install tmux") {
        return;
    }
    let server = TestServer::start_with(&[("IM_NODE_ID", "e2e-node")]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let ws = server.ws_url();
    let mut closed = Vec::new();
    for (user, to) in [
        ("alice", Some("bob")),
        ("bob", Some("alice")),
        ("carol", None),
    ] {
        let token = server.token(user);
        let conn = rt.block_on(async {
            let mut c = RawConn::connect(&ws).await.expect("connect");
            c.login(&token, "e2e", false).await.expect("login");
            c
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        rt.spawn(client_task(conn, to, stop.clone(), tx));
        closed.push((user, rx));
    }

    // dave owns the group the console announces to (with alice and bob in it).
    let mut dave = rt.block_on(async {
        let mut c = RawConn::connect(&ws).await.expect("connect");
        c.login(&server.token("dave"), "dave-phone", false)
            .await
            .expect("login");
        let op = proto::GroupOp {
            op: proto::group_op::Op::Create as i32,
            group_id: "ops".into(),
            members: vec!["alice".into(), "bob".into()],
            ..Default::default()
        };
        c.send(&proto::frame(7, Body::GroupOp(op))).await.unwrap();
        loop {
            match c.recv_timeout(WAIT).await {
                Ok(RawEvent::Frame(f)) if f.req_id == 7 => {
                    assert!(matches!(f.body, Some(Body::GroupOpOk(_))), "{f:?}");
                    break;
                }
                Ok(RawEvent::Frame(_)) => {}
                other => panic!("creating the group: {other:?}"),
            }
        }
        c
    });

    let console = env!("CARGO_BIN_EXE_im-console");
    let tmux = Tmux::start(&format!(
        "'{console}' --url http://{} --token {ADMIN_TOKEN} --interval-ms 500",
        server.admin_addr
    ));

    // 1. The overview shows the three connections (and the node agrees).
    let screen = tmux.wait_for("4 connections on the overview", |s| {
        shown_connections(s) == Some(4)
    });
    assert!(screen.contains("e2e-node"), "node id shown:\n{screen}");
    let (status, body) = server.admin_get("/admin/v1/overview");
    assert_eq!(status, 200, "{body}");
    let o: serde_json::Value = serde_json::from_str(&body).expect("overview json");
    assert_eq!(o["connections"], 4);

    // 2. Kick carol's connection from the Connections view.
    tmux.keys(&["2"]);
    tmux.wait_for("the connections table with each device", |s| {
        s.contains("carol")
            && s.contains("alice")
            && s.lines()
                .any(|l| l.contains("dave") && l.contains("dave-phone"))
    });
    tmux.keys(&["/"]);
    tmux.type_text("carol");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filtered table", |s| {
        s.contains("showing 1") && s.contains("carol")
    });
    tmux.keys(&["x"]);
    tmux.wait_for("the kick confirmation", |s| s.contains("Kick connection"));
    tmux.keys(&["y"]);
    tmux.wait_for("the kick result", |s| s.contains("kicked conn"));
    let (_, carol) = closed.remove(2);
    let code = rt
        .block_on(async { tokio::time::timeout(WAIT, carol).await })
        .expect("carol's connection closes")
        .expect("carol's task reports");
    assert_eq!(code, Some(4002), "carol sees close code 4002 (kicked)");
    tmux.keys(&["Escape"]);
    tmux.keys(&["1"]);
    tmux.wait_for("3 connections after the kick", |s| {
        shown_connections(s) == Some(3)
    });

    // 2b. An announcement to the group from the console: a SYSTEM message from `system`.
    tmux.keys(&["M"]);
    tmux.wait_for("the announce form", |s| {
        s.contains("announce a SYSTEM message")
    });
    tmux.type_text("ops");
    tmux.keys(&["Tab"]);
    tmux.type_text("hello from ops");
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the announce result", |s| s.contains("announced to ops"));
    assert!(
        screen.contains("seq 2"),
        "after the CREATE event:\n{screen}"
    );
    let got = rt.block_on(async {
        let req = proto::SyncRequest {
            cursors: vec![],
            limit: 100,
            ..Default::default()
        };
        dave.send(&proto::frame(8, Body::Sync(req))).await.unwrap();
        loop {
            match dave.recv_timeout(WAIT).await {
                Ok(RawEvent::Frame(f)) if f.req_id == 8 => match f.body {
                    Some(Body::SyncResp(r)) => break r.messages,
                    other => panic!("{other:?}"),
                },
                Ok(RawEvent::Frame(_)) => {}
                other => panic!("syncing: {other:?}"),
            }
        }
    });
    let m = got
        .iter()
        .find(|m| m.sender == "system")
        .unwrap_or_else(|| panic!("the announcement in dave's sync: {got:?}"));
    assert_eq!(
        (m.conversation_id.as_str(), m.r#type, &m.payload[..]),
        (
            "g:ops",
            proto::MessageType::System as i32,
            &b"hello from ops"[..]
        )
    );

    // 3. A per-uid log filter set from the Logs view reaches the node.
    let (status, body) = server.admin_get("/admin/v1/log-filters");
    assert_eq!(status, 200, "{body}");
    tmux.keys(&["7"]);
    tmux.wait_for("the log filters", |s| s.contains("per-uid log filters"));
    tmux.keys(&["a"]);
    tmux.wait_for("the filter form", |s| s.contains("add per-uid log filter"));
    tmux.type_text("alice");
    tmux.keys(&["Tab", "Tab", "BSpace", "BSpace", "BSpace"]);
    tmux.type_text("300");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filter confirmation", |s| s.contains("log filter set"));
    let (status, body) = server.admin_get("/admin/v1/log-filters");
    assert_eq!(status, 200, "{body}");
    let f: serde_json::Value = serde_json::from_str(&body).expect("filters json");
    let filters = f["filters"].as_array().expect("filters array");
    let alice = filters
        .iter()
        .find(|x| x["uid"] == "alice")
        .unwrap_or_else(|| panic!("alice's filter on the node: {body}"));
    assert_eq!(alice["level"], "debug");
    assert_eq!(alice["ttl_secs"], 300);
    tmux.wait_for("alice in the filters table", |s| {
        s.lines()
            .any(|l| l.contains("alice") && l.contains("debug"))
    });

    // 3b. The Users view: `/` and alice's id show her session and, with her log filter
    //     set just above, the messages she sends.
    tmux.keys(&["8"]);
    tmux.wait_for("the Users view's prompt", |s| s.contains("no user shown"));
    tmux.keys(&["/"]);
    tmux.type_text("alice");
    tmux.keys(&["Enter"]);
    tmux.wait_for("alice's session and her recorded messages", |s| {
        s.contains("sessions · 1")
            && s.lines()
                .any(|l| l.contains("e2e-node") && l.contains("active"))
            && s.lines()
                .any(|l| l.contains("sent") && l.contains("u:alice:bob"))
    });

    // 4. q quits (and the session ends with it).
    tmux.keys(&["q"]);
    let deadline = Instant::now() + WAIT;
    while tmux.alive() {
        assert!(Instant::now() < deadline, "console still running after q");
        std::thread::sleep(Duration::from_millis(100));
    }

    stop.store(true, Ordering::Relaxed);
    drop(rt);
    let log = server.log();
    assert!(!log.contains("panicked"), "server log:\n{log}");
}
