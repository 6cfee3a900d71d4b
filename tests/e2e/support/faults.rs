//! Helpers of the fault-injection suite (`tests/faults`): one case at a time, since
//! each changes machine state that the others would see.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use im_client::proto::{Body, ChatMessage};
use im_client::{RawConn, RawEvent};

use super::send_to_user;

static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of a fault case: no two cases break things at once. (A tokio
/// mutex: the guard lives across the case's awaits, and each test has its own runtime.)
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    EXCLUSIVE.lock().await
}

/// [`exclusive`] for a case that is a plain (non-async) test running its own runtimes.
pub fn exclusive_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    EXCLUSIVE.blocking_lock()
}

/// One acked Send, as its sender saw the SendAck.
#[derive(Debug, Clone)]
pub struct Acked {
    /// The sender.
    pub sender: String,
    /// The receiver.
    pub receiver: String,
    /// The idempotency key it was sent (and re-sent) with.
    pub client_msg_id: String,
    /// From the SendAck.
    pub conversation_id: String,
    /// From the SendAck.
    pub seq: u64,
}

/// One sender -> receiver pair of steady one-to-one traffic, each side on its own URL
/// (a node of a cluster, or the one server).
#[derive(Debug, Clone)]
pub struct Pair {
    /// The sending user.
    pub sender: String,
    /// The receiving user.
    pub receiver: String,
    /// Where the sender connects.
    pub sender_url: String,
    /// Where the receiver connects.
    pub receiver_url: String,
}

/// What the traffic saw, once stopped.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every SendAck, in the order they arrived.
    pub acked: Vec<Acked>,
    /// Per receiver, every pushed message (client_msg_id), in arrival order.
    pub pushed: HashMap<String, Vec<String>>,
    /// Error frames with a retry hint (the Send was re-sent with the same client_msg_id).
    pub retried: u64,
    /// Error frames without a retry hint, with their text.
    pub refused: Vec<String>,
    /// Times a sender or receiver lost its connection and connected again.
    pub reconnects: u64,
    /// The same, per user (each user is one sender or one receiver).
    pub reconnects_by_user: HashMap<String, u64>,
}

impl Outcome {
    fn reconnected(&mut self, user: &str) {
        self.reconnects += 1;
        *self.reconnects_by_user.entry(user.to_owned()).or_default() += 1;
    }
}

struct Shared {
    stop: AtomicBool,
    out: Mutex<Outcome>,
}

/// Steady one-to-one traffic over raw connections, one Send in flight per sender, until
/// [`Traffic::stop`]. A Send refused with a retry hint, or whose connection dies before
/// its reply, is re-sent with the same client_msg_id (on a new connection if need be),
/// the way a careful client does; receivers only read pushes.
pub struct Traffic {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Starts every pair; `token` makes a token for a user; each sender sends
    /// `per_sec` messages a second at most.
    pub fn start(pairs: &[Pair], token: impl Fn(&str) -> String, per_sec: u32) -> Traffic {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            out: Mutex::new(Outcome::default()),
        });
        let mut tasks = Vec::new();
        for p in pairs {
            tasks.push(tokio::spawn(receive(
                shared.clone(),
                p.receiver.clone(),
                p.receiver_url.clone(),
                token(&p.receiver),
            )));
            tasks.push(tokio::spawn(send(
                shared.clone(),
                p.clone(),
                token(&p.sender),
                Duration::from_millis(1000 / u64::from(per_sec.max(1))),
            )));
        }
        Traffic { shared, tasks }
    }

    /// SendAcks so far.
    pub fn acked(&self) -> usize {
        self.shared.out.lock().unwrap().acked.len()
    }

    /// Waits until `more` acks beyond the current count have arrived (the node takes
    /// sends again) and returns how long that took; panics after `limit`.
    pub async fn wait_acks(&self, more: usize, limit: Duration) -> Duration {
        let start = self.acked();
        let t = Instant::now();
        while self.acked() < start + more {
            assert!(
                t.elapsed() < limit,
                "no {more} new acks within {limit:?} (had {start})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        t.elapsed()
    }

    /// Stops the senders (each finishes the Send in flight), waits `settle` for the
    /// last pushes, stops the receivers and returns what was seen.
    pub async fn stop(self, settle: Duration) -> Outcome {
        self.shared.stop.store(true, Ordering::Relaxed);
        let (receivers, senders): (Vec<_>, Vec<_>) = self
            .tasks
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        for (_, t) in senders {
            let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
        }
        tokio::time::sleep(settle).await;
        for (_, t) in receivers {
            t.abort();
        }
        std::mem::take(&mut *self.shared.out.lock().unwrap())
    }
}

async fn login(url: &str, token: &str) -> Option<RawConn> {
    let mut c = RawConn::connect(url).await.ok()?;
    c.login(token, "faults", false).await.ok()?;
    Some(c)
}

async fn receive(shared: Arc<Shared>, user: String, url: String, token: String) {
    loop {
        let Some(mut c) = login(&url, &token).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while let Ok(RawEvent::Frame(f)) = c.recv().await {
            if let Some(Body::Deliver(d)) = f.body {
                let mut out = shared.out.lock().unwrap();
                let got = out.pushed.entry(user.clone()).or_default();
                got.extend(d.messages.into_iter().map(|m| m.client_msg_id));
            }
        }
        shared.out.lock().unwrap().reconnected(&user);
    }
}

async fn send(shared: Arc<Shared>, p: Pair, token: String, every: Duration) {
    let mut conn: Option<RawConn> = None;
    let mut n = 0u64;
    let mut req_id = 100u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            conn = login(&p.sender_url, &token).await;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        };
        let cmid = format!("{}-{n}", p.sender);
        req_id += 1;
        let reply = match c
            .send(&send_to_user(req_id, &p.receiver, cmid.as_bytes(), &cmid))
            .await
        {
            Ok(()) => reply_to(c, req_id).await,
            Err(_) => None,
        };
        match reply {
            Some(Body::SendAck(a)) => {
                shared.out.lock().unwrap().acked.push(Acked {
                    sender: p.sender.clone(),
                    receiver: p.receiver.clone(),
                    client_msg_id: cmid,
                    conversation_id: a.conversation_id,
                    seq: a.seq,
                });
                n += 1;
                tokio::time::sleep(every).await;
            }
            Some(Body::Error(e)) if e.retry_after_ms > 0 => {
                shared.out.lock().unwrap().retried += 1;
                tokio::time::sleep(Duration::from_millis(u64::from(e.retry_after_ms))).await;
            }
            Some(Body::Error(e)) => {
                shared.out.lock().unwrap().refused.push(e.message);
                n += 1;
            }
            _ => {
                // No reply: the connection died or hangs. Reconnect and re-send the same key.
                conn = None;
                shared.out.lock().unwrap().reconnected(&p.sender);
            }
        }
    }
}

/// The reply to `req_id` (pushes before it are skipped); `None` when the connection
/// closes or nothing comes within 10 s.
async fn reply_to(c: &mut RawConn, req_id: u64) -> Option<Body> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match c.recv_timeout(left).await {
            Ok(RawEvent::Frame(f)) if f.req_id == req_id => return f.body,
            Ok(RawEvent::Frame(_)) => {}
            _ => return None,
        }
    }
}

/// Checks the store against the acks: every acked message is stored exactly once, at
/// its acked seq, as `synced` (everything a full sync returns to its receivers) shows.
pub fn assert_stored_once(acked: &[Acked], synced: &[ChatMessage]) {
    let mut by_key: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
    for m in synced {
        by_key
            .entry(m.client_msg_id.as_str())
            .or_default()
            .push((m.conversation_id.as_str(), m.seq));
    }
    let mut lost = Vec::new();
    for a in acked {
        match by_key.get(a.client_msg_id.as_str()).map(Vec::as_slice) {
            Some([(conv, seq)]) => assert!(
                *conv == a.conversation_id && *seq == a.seq,
                "{} acked at {}#{} but stored at {conv}#{seq}",
                a.client_msg_id,
                a.conversation_id,
                a.seq
            ),
            Some(more) => panic!("{} stored {} times: {more:?}", a.client_msg_id, more.len()),
            None => lost.push(a.client_msg_id.as_str()),
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acked messages are not stored, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
}

/// A small tmpfs mounted on a temp dir (the test runs as root), unmounted on drop: a disk
/// that can be filled to ENOSPC and freed again.
pub struct Tmpfs {
    dir: tempfile::TempDir,
    filler: std::path::PathBuf,
}

impl Tmpfs {
    /// Mounts `mib` MiB.
    pub fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().expect("temp dir");
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (the fault suite runs as root in CI): {status}"
        );
        let filler = dir.path().join("filler");
        Tmpfs { dir, filler }
    }

    /// The mount point.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Free bytes on it.
    pub fn free_bytes(&self) -> u64 {
        let out = std::process::Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(self.path())
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df output")
    }

    /// Writes a filler file until only `leave` bytes are free (0: until ENOSPC).
    pub fn fill(&self, leave: u64) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.filler)
            .expect("filler");
        let chunk = vec![0x55u8; 64 * 1024];
        loop {
            let free = self.free_bytes();
            if free <= leave {
                break;
            }
            let n = (free - leave).min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n]).and_then(|_| f.flush()).is_err() {
                break; // ENOSPC
            }
        }
    }

    /// Removes the filler file.
    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// The machine's Postgres service, stopped for a fault case and always started again
/// (also when the test panics), through the service's own control script.
pub struct PgService {
    version: String,
}

impl PgService {
    /// The local cluster (`pg_lsclusters`' first version, cluster `main`).
    pub fn local() -> PgService {
        let version = std::fs::read_dir("/etc/postgresql")
            .expect("/etc/postgresql: the local Postgres service")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .min()
            .expect("a Postgres version under /etc/postgresql");
        PgService { version }
    }

    fn ctl(&self, action: &str) {
        let mut cmd = std::process::Command::new("pg_ctlcluster");
        cmd.args(["--skip-systemctl-redirect", &self.version, "main", action]);
        if action == "stop" {
            cmd.args(["-m", "fast"]);
        }
        let status = cmd.status().expect("run pg_ctlcluster");
        assert!(status.success(), "pg_ctlcluster {action}: {status}");
    }

    /// Stops the service (fast shutdown: open sessions are cut).
    pub fn stop(&self) {
        self.ctl("stop");
    }

    /// Starts it and waits until it accepts connections.
    pub fn start(&self) {
        self.ctl("start");
        let end = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect("127.0.0.1:5432").is_err() {
            assert!(Instant::now() < end, "Postgres did not come back");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PgService {
    fn drop(&mut self) {
        if std::net::TcpStream::connect("127.0.0.1:5432").is_err() {
            self.start();
        }
    }
}

/// Pairs of senders and receivers a fault case runs: `IM_FAULTS_PAIRS`, else `default`
/// (CI runs the default; BENCHMARKS.md's figures come from larger runs).
pub fn pair_count(default: usize) -> usize {
    super::env_u64("IM_FAULTS_PAIRS", default as u64) as usize
}

/// One line a fault case prints for BENCHMARKS.md (`--nocapture` shows it).
pub fn report(case: &str, out: &Outcome, recovery: Duration, seen: &str) {
    eprintln!(
        "fault report: case={case} acked={} lost=0 retried={} refused={} reconnects={} recovery_ms={} seen={seen:?}",
        out.acked.len(),
        out.retried,
        out.refused.len(),
        out.reconnects,
        recovery.as_millis()
    );
}

/// The runtime an async fault case runs on, inside a plain `#[test]` that holds
/// [`exclusive`] outside it (a std lock must not be held across an await).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
