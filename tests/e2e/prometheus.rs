//! A real Prometheus against a real node: the `prometheus` server binary scrapes the
//! node's admin `/metrics` every two seconds (with the admin bearer token) into its own TSDB
//! in a temp dir and evaluates `dashboards/alerts.yml` every second, while the test
//! drives what an operator would see: chat traffic (SDK clients, one-to-one and a
//! group), a bad frame and a refused login, a dozen group members that never read
//! (slow consumers), and a persistence backlog (a small queue behind a Postgres store
//! whose `messages` table another session keeps locked, so every commit waits).
//!
//! Then, through Prometheus's HTTP API: the alerts for those conditions go pending or
//! firing (`/api/v1/alerts`), and every query of every panel of every dashboard in
//! `dashboards/` (Grafana's variables filled in as Grafana would) returns data from the
//! TSDB (`/api/v1/query`). Panels and alerts are read from the files, so new ones are
//! covered without touching this test.
//!
//! Needs the `prometheus` binary (Debian package `prometheus`; `IM_TEST_PROMETHEUS_BIN`
//! names another) and the local Postgres. Without the binary the test is skipped with a
//! message, except under CI (`CI` set), where it fails.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use im_client::proto::{Body, ErrorCode, MessageType};
use im_client::{RawConn, RawEvent, Target};
use serde_json::Value;

use crate::dashboards::{dashboards, panels, repo};
use crate::support::cluster::pg_url;
use crate::support::*;

/// How long any one condition (Prometheus ready, an alert, a drained queue) may take.
const DEADLINE: Duration = Duration::from_secs(90);
/// Members of the storm group that never read: over the `ImSlowConsumersRising` floor
/// of 10 slow consumers.
const STALLED: usize = 12;
/// The persistence queue: above `ImPersistBacklogHigh`'s 10,000.
const QUEUE_CAPACITY: u64 = 11_000;

/// Alerts the scenario must drive to pending or firing: (alert, what causes it).
const EXPECTED_ALERTS: &[(&str, &str)] = &[
    ("ImSlowConsumersRising", "12 group members that never read"),
    (
        "ImPersistBacklogGrowing",
        "sends queued behind the locked table",
    ),
    ("ImPersistBacklogHigh", "the queue filled past 10,000"),
    (
        "ImPersistOverloaded",
        "sends refused while the queue is full",
    ),
    (
        "ImPersistCommitSlow",
        "each commit waits for the table lock",
    ),
    (
        "ImEndToEndLatencyHigh",
        "messages wait seconds in the queue",
    ),
    ("ImStageLatencyHigh", "persist_wait: the queue itself"),
];

/// Panels allowed to have no data in this run: (dashboard file, panel title, reason).
/// Keep it short; each needs a reason a reviewer agrees with.
const NO_DATA_OK: &[(&str, &str, &str)] = &[
    (
        "im-overview.json",
        "Replication lag (seconds)",
        REGIONS_ONLY,
    ),
    (
        "im-overview.json",
        "Replication lag (messages)",
        REGIONS_ONLY,
    ),
    ("im-overview.json", "Region link up", REGIONS_ONLY),
];

/// Why the Regions row has no data here: this run is one node of one region; the series
/// are scraped from a node of two regions in `dashboards.rs`.
const REGIONS_ONLY: &str = "multi-region mode only (dashboards.rs scrapes them from two regions)";

// ---------------------------------------------------------------------------------------
// The Prometheus process

/// The `prometheus` server binary: `IM_TEST_PROMETHEUS_BIN`, else `prometheus` on PATH.
/// None (skip) when it is missing outside CI; under CI a missing binary fails the test.
fn prometheus_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("IM_TEST_PROMETHEUS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prometheus"));
    let install = "install the Debian package `prometheus` (`apt-get install prometheus`, which \
                   .ci/run does) or set IM_TEST_PROMETHEUS_BIN";
    let program = bin.to_string_lossy();
    tool_available(&program, &["--version"], install).then_some(bin)
}

/// A running `prometheus` server on a loopback port, with its config and TSDB in a temp
/// dir; killed (and reaped) on drop, so a failing test leaves no process behind.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `target`'s `/metrics` (job `im`, the admin token) every
    /// two seconds (a scrape may take that long on a loaded machine), with `dashboards/alerts.yml` evaluated every second.
    fn start(bin: &Path, target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = repo().join("dashboards/alerts.yml");
        let config = format!(
            "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 1s\n\
             \x20 external_labels:\n    runbook_base: {base}\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: im\n    authorization:\n      type: Bearer\n      \
             credentials: {token}\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rules = serde_json::to_string(&rules.to_string_lossy()).unwrap(),
            token = serde_json::to_string(ADMIN_TOKEN).unwrap(),
            base = serde_json::to_string(TEST_RUNBOOK_BASE).unwrap(),
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
        // A free port can be taken between our probe and Prometheus's bind: try again.
        let log_path = dir.path().join("prometheus.log");
        for attempt in 1..=5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], spare_port()));
            let log = std::fs::File::create(&log_path).expect("log file");
            let mut child = Command::new(bin)
                .arg(format!(
                    "--config.file={}",
                    dir.path().join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("tsdb").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
            let end = Instant::now() + DEADLINE;
            let exited = loop {
                if let Ok(Some(status)) = child.try_wait() {
                    break status;
                }
                if matches!(get(addr, "/-/ready"), Ok((200, _))) {
                    return Prometheus { child, addr, dir };
                }
                if Instant::now() >= end {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "prometheus is not ready after {DEADLINE:?}:\n{}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if !(log.contains("address already in use") && attempt < 5) {
                panic!("prometheus exited with {exited}:\n{log}");
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// What Prometheus has logged (warnings and errors).
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` on the HTTP API; the `data` of a `success` answer.
    fn api(&self, path: &str) -> Value {
        let (status, body) = get(self.addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: {status} is not JSON ({e}): {body}"));
        assert!(
            status == 200 && v["status"] == "success",
            "GET {path}: {status} {body}"
        );
        v["data"].clone()
    }

    /// An instant query at the current time: the `data` of the answer.
    fn query(&self, promql: &str) -> Value {
        self.api(&format!("/api/v1/query?query={}", urlencode(promql)))
    }

    /// The values of `label` over the series matching `selector` (Grafana's
    /// `label_values(selector, label)`), sorted.
    fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let data = self.api(&format!("/api/v1/series?match[]={}", urlencode(selector)));
        let mut out: Vec<String> = data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s[label].as_str().map(str::to_owned))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET (the answer ends with the connection, never chunked); returns
/// (status, body) or why it failed. Never panics: the alert watcher runs it in a thread.
fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query parameter value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Alerts, watched all along

/// The runbooks' base URL the test's Prometheus carries as its `runbook_base` label.
const TEST_RUNBOOK_BASE: &str = "https://git.example.test/im/-/blob/main/runbooks";

/// Polls `/api/v1/alerts` in a thread for the whole test and remembers, per alert name,
/// the furthest state seen (`pending`, then `firing`) and when it was first seen.
struct AlertWatcher {
    seen: Arc<Mutex<BTreeMap<String, (String, Duration)>>>,
    /// Alert name -> its `runbook_url` annotation as Prometheus rendered it.
    runbooks: Arc<Mutex<BTreeMap<String, String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AlertWatcher {
    fn start(addr: SocketAddr, t0: Instant) -> AlertWatcher {
        let seen: Arc<Mutex<BTreeMap<String, (String, Duration)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let runbooks: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (s, st, rb) = (seen.clone(), stop.clone(), runbooks.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if let Ok((200, body)) = get(addr, "/api/v1/alerts") {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    let mut seen = s.lock().unwrap();
                    for a in v["data"]["alerts"].as_array().into_iter().flatten() {
                        let (Some(name), Some(state)) =
                            (a["labels"]["alertname"].as_str(), a["state"].as_str())
                        else {
                            continue;
                        };
                        if let Some(url) = a["annotations"]["runbook_url"].as_str() {
                            rb.lock().unwrap().insert(name.to_owned(), url.to_owned());
                        }
                        let e = seen
                            .entry(name.to_owned())
                            .or_insert_with(|| (state.to_owned(), t0.elapsed()));
                        if state == "firing" {
                            e.0 = "firing".into();
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        AlertWatcher {
            seen,
            runbooks,
            stop,
            thread: Some(thread),
        }
    }

    /// Alert name -> the `runbook_url` Prometheus rendered for it.
    fn runbooks(&self) -> BTreeMap<String, String> {
        self.runbooks.lock().unwrap().clone()
    }

    /// Alert name -> (furthest state, first seen after the test's start).
    fn seen(&self) -> BTreeMap<String, (String, Duration)> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until every alert in `names` has been pending or firing.
    async fn wait_for(&self, names: &[&str], prom: &Prometheus) {
        let end = Instant::now() + DEADLINE;
        loop {
            let seen = self.seen();
            let missing: Vec<&&str> = names.iter().filter(|n| !seen.contains_key(**n)).collect();
            if missing.is_empty() {
                return;
            }
            if Instant::now() >= end {
                let rules = prom.api("/api/v1/rules");
                // What Prometheus holds now: a failing or slow scrape leaves the series stale.
                let now: Vec<(&str, Value)> = [
                    "up",
                    "scrape_duration_seconds",
                    "im_slow_consumers",
                    "delta(im_slow_consumers[15m])",
                    "im_connections",
                ]
                .into_iter()
                .map(|q| (q, prom.query(q)["result"].clone()))
                .collect();
                panic!(
                    "alerts {missing:?} never went pending within {DEADLINE:?}; seen: {seen:?}\n\
                     now: {now:?}\nrules: {rules}\nprometheus log:\n{}",
                    prom.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for AlertWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The slow store: another session holding the messages table

/// A Postgres schema of its own for the node, dropped on drop (a failing test too).
struct PgSchema {
    name: String,
}

impl PgSchema {
    async fn create() -> PgSchema {
        let name = format!(
            "t_{}",
            uuid::Uuid::now_v7().simple().to_string().to_lowercase()
        );
        let admin = sqlx::PgPool::connect(&pg_url())
            .await
            .unwrap_or_else(|e| panic!("Postgres at {} is required: {e}", pg_url()));
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&admin)
            .await
            .expect("create schema");
        admin.close().await;
        PgSchema { name }
    }

    /// The node's `database_url`: the test database with this schema first on the path.
    fn url(&self) -> String {
        format!("{}?options[search_path]={}", pg_url(), self.name)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime (or while a panic unwinds it): do the
        // async cleanup on a thread of its own with its own small runtime.
        let name = self.name.clone();
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(admin) = sqlx::PgPool::connect(&pg_url()).await {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .execute(&admin)
                        .await;
                    admin.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Holds `LOCK TABLE messages IN EXCLUSIVE MODE` (reads go on, inserts wait) for `hold`
/// at a time, letting go only for as long as the one commit queued behind it takes,
/// until `stop`: a store that commits about one batch per `hold`, like one stuck behind
/// a long migration or a runaway transaction. Returns the cycles held.
async fn hold_messages_lock(url: String, hold: Duration, stop: Arc<AtomicBool>) -> u64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to the node's schema");
    let mut cycles = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("LOCK TABLE messages IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .expect("lock messages");
        cycles += 1;
        let until = Instant::now() + hold;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tx.rollback().await.expect("rollback");
    }
    cycles
}

/// Sends small one-to-one messages to `to` as fast as the node reads them, 100 at a
/// time, reading whatever came back in between (acks, OVERLOADED) until `stop`.
/// Returns (sends, OVERLOADED answers).
async fn flood(mut c: RawConn, me: String, to: String, stop: Arc<AtomicBool>) -> (u64, u64) {
    let (mut sent, mut overloaded) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..100 {
            sent += 1;
            let f = send_to_user(sent, &to, b"backlog", &format!("{me}-{sent}"));
            if c.send(&f).await.is_err() {
                return (sent, overloaded);
            }
        }
        while let Ok(ev) = c.recv_timeout(Duration::from_millis(5)).await {
            match ev {
                RawEvent::Frame(f) => {
                    if matches!(f.body, Some(Body::Error(ref e)) if e.code == ErrorCode::Overloaded as i32)
                    {
                        overloaded += 1;
                    }
                }
                RawEvent::Closed { .. } => return (sent, overloaded),
                RawEvent::WsPong(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    (sent, overloaded)
}

/// Sends `payload` to the storm group about 25 times a second, reading its acks, until
/// `stop` or the connection closes.
async fn keep_storming(mut c: RawConn, payload: Vec<u8>, stop: Arc<AtomicBool>) {
    let mut i = 1_000u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let f = send_to_group(i, "prom-storm", &payload, &format!("k{i}"));
        if c.send(&f).await.is_err() {
            return;
        }
        while let Ok(ev) = c.recv_timeout(Duration::from_millis(40)).await {
            if matches!(ev, RawEvent::Closed { .. }) {
                return;
            }
        }
    }
}

/// Reads a raw connection until it closes or `stop`; returns the frames read.
async fn drain(mut c: RawConn, stop: Arc<AtomicBool>) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        match c.recv_timeout(Duration::from_millis(200)).await {
            Ok(RawEvent::Frame(_)) => n += 1,
            Ok(RawEvent::Closed { .. }) => break,
            _ => {}
        }
    }
    n
}

// ---------------------------------------------------------------------------------------
// Dashboard queries with Grafana's variables filled in

/// One panel query, ready to run.
struct PanelQuery {
    file: String,
    title: String,
    origin: String,
    promql: String,
}

/// Replaces `$name` and `${name}` (and `${name:format}`) in `expr` with `vars[name]`;
/// an unknown variable is an error naming it.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '$' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let (name, next) = if chars.get(i + 1) == Some(&'{') {
            let close = chars[i..]
                .iter()
                .position(|&c| c == '}')
                .ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
            let inner: String = chars[i + 2..i + close].iter().collect();
            let name = inner.split(':').next().unwrap_or_default().to_owned();
            (name, i + close + 1)
        } else {
            let mut j = i + 1;
            while j < chars.len() && ident(chars[j]) {
                j += 1;
            }
            (chars[i + 1..j].iter().collect(), j)
        };
        let value = vars
            .get(&name)
            .ok_or_else(|| format!("unknown variable ${name} in {expr}"))?;
        out.push_str(value);
        i = next;
    }
    Ok(out)
}

/// A value list as Grafana writes a multi-value variable into a Prometheus regex:
/// `(a|b)` with regex characters escaped (`\\.` inside the PromQL string).
fn regex_alternation(values: &[String]) -> String {
    let escaped: Vec<String> = values
        .iter()
        .map(|v| {
            v.chars()
                .map(|c| {
                    if "\\.+*?()|[]{}^$".contains(c) {
                        format!("\\\\{c}")
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        })
        .collect();
    if escaped.len() == 1 {
        escaped[0].clone()
    } else {
        format!("({})", escaped.join("|"))
    }
}

/// Every target expression of every panel of every dashboard, variables filled in:
/// query variables with every value Prometheus has for them (checked non-empty: the
/// dashboard's node picker shows this node), custom variables with all their values, or
/// one value per repeat of a panel repeated over the variable; Grafana's interval
/// variables with windows that cover the whole run.
fn panel_queries(prom: &Prometheus) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for (file, d) in dashboards() {
        let mut vars: BTreeMap<String, String> = [
            ("__rate_interval", "5m"),
            ("__interval", "1m"),
            ("__range", "5m"),
            ("__range_s", "300"),
            ("__interval_ms", "60000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut values_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().expect("variable name").to_owned();
            let values: Vec<String> = match v["type"].as_str() {
                Some("query") => {
                    let def = substitute(v["definition"].as_str().expect("definition"), &vars)
                        .unwrap_or_else(|e| panic!("{file} variable {name}: {e}"));
                    let inner = def
                        .strip_prefix("label_values(")
                        .and_then(|r| r.strip_suffix(')'))
                        .unwrap_or_else(|| panic!("{file} variable {name}: {def}"));
                    let (selector, label) = inner
                        .rsplit_once(',')
                        .unwrap_or_else(|| panic!("{file} variable {name}: {def}"));
                    let values = prom.label_values(selector.trim(), label.trim());
                    assert!(
                        !values.is_empty(),
                        "{file} variable {name}: {def} has no values in Prometheus"
                    );
                    values
                }
                Some("custom") => v["query"]
                    .as_str()
                    .expect("custom values")
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .collect(),
                Some("constant" | "textbox") => vec![v["query"].as_str().unwrap_or("").into()],
                other => panic!("{file} variable {name}: type {other:?} is not handled"),
            };
            vars.insert(name.clone(), regex_alternation(&values));
            values_of.insert(name, values);
        }
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            // A repeated panel is one copy per value of its variable.
            let repeats: Vec<BTreeMap<String, String>> = match p["repeat"].as_str() {
                Some(var) => values_of
                    .get(var)
                    .unwrap_or_else(|| panic!("{file} {title}: repeats unknown ${var}"))
                    .iter()
                    .map(|val| {
                        let mut v = vars.clone();
                        v.insert(var.to_owned(), regex_alternation(std::slice::from_ref(val)));
                        v
                    })
                    .collect(),
                None => vec![vars.clone()],
            };
            for t in p["targets"].as_array().into_iter().flatten() {
                let Some(expr) = t["expr"].as_str() else {
                    continue;
                };
                for v in &repeats {
                    let promql = substitute(expr, v)
                        .unwrap_or_else(|e| panic!("{file} panel {title:?}: {e}"));
                    let shown = substitute(&title, v).unwrap_or_else(|_| title.clone());
                    out.push(PanelQuery {
                        file: file.clone(),
                        title: title.clone(),
                        origin: format!(
                            "{file} panel {shown:?} target {}",
                            t["refId"].as_str().unwrap_or("?")
                        ),
                        promql,
                    });
                }
            }
        }
    }
    out
}

/// The values of an instant query's answer (vector or scalar).
fn values(data: &Value) -> Vec<f64> {
    let value = |v: &Value| v[1].as_str().and_then(|s| s.parse::<f64>().ok());
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| value(&s["value"]))
            .collect(),
        Some("scalar") => value(&data["result"]).into_iter().collect(),
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// The test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_sees_the_alerts_fire_and_every_panel_has_data() {
    let Some(bin) = prometheus_bin() else {
        return;
    };
    let t0 = Instant::now();
    let schema = PgSchema::create().await;
    let db = schema.url();
    let capacity = QUEUE_CAPACITY.to_string();
    let server = TestServer::start_with(&[
        ("IM_DATABASE_URL", &db),
        ("IM_PERSIST_QUEUE_CAPACITY", &capacity),
        // A commit waits for the lock (seconds), not abandoned as a store fault.
        ("IM_STORE_UNAVAILABLE_AFTER_MS", "60000"),
        ("IM_STORE_STATEMENT_TIMEOUT_MS", "60000"),
        ("IM_LIMITS_SEND_RATE_PER_SEC", "0"),
        ("IM_LIMITS_IDLE_TIMEOUT_SECS", "600"),
        // Stalled readers stay marked slow (not closed) for the whole run.
        ("IM_FLOW_SOFT_MARK_BYTES", "65536"),
        ("IM_FLOW_HARD_MARK_BYTES", "268435456"),
        ("IM_FLOW_WRITE_TIMEOUT_SECS", "600"),
        ("IM_FLOW_SOCKET_SEND_BUFFER_BYTES", "65536"),
        ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
    ]);
    let prom = Prometheus::start(&bin, server.admin_addr);
    let instance = server.admin_addr.to_string();
    let up = format!("up{{job=\"im\",instance=\"{instance}\"}}");
    let end = Instant::now() + DEADLINE;
    while values(&prom.query(&up)) != [1.0] {
        assert!(
            Instant::now() < end,
            "prometheus never scraped {instance}: {}\nlog:\n{}",
            prom.api("/api/v1/targets"),
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alerts = AlertWatcher::start(prom.addr, t0);

    // 1. Chat: SDK clients, one-to-one and in a group; a bad frame; a refused login.
    let mut owner = server.raw("prom-owner").await;
    let users = ["prom-a", "prom-b", "prom-c"];
    let mut clients = Vec::new();
    for u in users {
        clients.push(server.client(u).await);
    }
    create_group(
        &mut owner,
        "prom-team",
        users.iter().map(|u| u.to_string()).collect(),
    )
    .await;
    for round in 0..10 {
        for (i, c) in clients.iter().enumerate() {
            let to = users[(i + 1) % users.len()];
            c.send(
                Target::User(to.into()),
                MessageType::Text,
                format!("hi {round}"),
                None,
            )
            .await
            .expect("one-to-one send");
            c.send(
                Target::Group("prom-team".into()),
                MessageType::Text,
                format!("all {round}"),
                None,
            )
            .await
            .expect("group send");
        }
    }
    for c in &clients {
        // 10 one-to-one messages and 20 from the other two members of the group.
        for _ in 0..30 {
            c.next_message(WAIT).await.expect("a chat message");
        }
    }
    let mut bad = server.raw("prom-bad").await;
    bad.send_bytes(vec![0xff, 0xff, 0xff, 0xff, 0x0f])
        .await
        .unwrap();
    match next_frame(&mut bad).await.body {
        Some(Body::Error(e)) => assert_eq!(e.code, ErrorCode::BadFrame as i32),
        other => panic!("expected BAD_FRAME, got {other:?}"),
    }
    let mut forged = server.raw_anonymous().await;
    assert!(
        forged.login("not-a-token", "d", false).await.is_err(),
        "a forged token logs in"
    );
    until_closed(&mut forged).await;

    // 2. Slow consumers: members of a group that never read while it is flooded.
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        stalled.push(server.raw(&format!("prom-stalled-{i:02}")).await);
    }
    let mut storm = server.raw("prom-storm").await;
    let reader = server.raw("prom-reader").await;
    let mut members: Vec<String> = (0..STALLED)
        .map(|i| format!("prom-stalled-{i:02}"))
        .collect();
    members.push("prom-reader".into());
    create_group(&mut storm, "prom-storm", members).await;
    let stop_reader = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn(drain(reader, stop_reader.clone()));
    let payload = vec![b'x'; 16 * 1024];
    for i in 0..120u64 {
        storm
            .send(&send_to_group(
                10 + i,
                "prom-storm",
                &payload,
                &format!("s{i}"),
            ))
            .await
            .unwrap();
        if i % 20 == 19 {
            acks(&mut storm, 20).await;
        }
    }
    // Keep the group busy until every stalled reader is marked and Prometheus has seen
    // them: how much a stalled socket absorbs before its queue backs up depends on the
    // kernel's buffers, and a marked reader whose queue drains into them below half the
    // soft mark is unmarked until the next group message marks it again.
    let stop_storm = Arc::new(AtomicBool::new(false));
    let storm = tokio::spawn(keep_storming(storm, payload, stop_storm.clone()));
    let end = Instant::now() + DEADLINE;
    while server.metric("im_slow_consumers", &[]) < STALLED as f64 {
        assert!(
            Instant::now() < end,
            "only {} slow consumers; the node lists {}",
            server.metric("im_slow_consumers", &[]),
            server.admin_get("/admin/v1/slow-consumers").1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    alerts.wait_for(&["ImSlowConsumersRising"], &prom).await;
    let slow_at = t0.elapsed();
    stop_storm.store(true, Ordering::Relaxed);
    let _ = storm.await;

    // 3. A persistence backlog: the messages table locked by another session, so each
    //    commit waits seconds; flooders fill the queue and get OVERLOADED.
    let sink = server.raw("prom-sink").await;
    let stop_sink = Arc::new(AtomicBool::new(false));
    let sink = tokio::spawn(drain(sink, stop_sink.clone()));
    let stop_lock = Arc::new(AtomicBool::new(false));
    let lock = tokio::spawn(hold_messages_lock(
        db.clone(),
        Duration::from_secs(2),
        stop_lock.clone(),
    ));
    let stop_flood = Arc::new(AtomicBool::new(false));
    let mut flooders = Vec::new();
    for i in 0..2 {
        let me = format!("prom-flood-{i}");
        let c = server.raw(&me).await;
        flooders.push(tokio::spawn(flood(
            c,
            me,
            "prom-sink".into(),
            stop_flood.clone(),
        )));
    }
    let persistence: Vec<&str> = EXPECTED_ALERTS
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| *a != "ImSlowConsumersRising")
        .collect();
    alerts.wait_for(&persistence, &prom).await;
    let backlog_at = t0.elapsed();
    stop_flood.store(true, Ordering::Relaxed);
    let (mut sent, mut overloaded) = (0, 0);
    for f in flooders {
        let (s, o) = f.await.unwrap();
        sent += s;
        overloaded += o;
    }
    stop_lock.store(true, Ordering::Relaxed);
    let cycles = lock.await.unwrap();
    let end = Instant::now() + DEADLINE;
    while server.metric("im_persist_queue_depth", &[]) > 0.0 {
        assert!(Instant::now() < end, "the backlog never drained");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two more scrapes, so the drained queue is in the TSDB too.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 4. Every panel's query answers with data.
    let queries = panel_queries(&prom);
    assert!(queries.len() >= 40, "only {} panel queries", queries.len());
    let mut empty = Vec::new();
    for q in &queries {
        let vals = values(&prom.query(&q.promql));
        if vals.iter().any(|v| v.is_finite()) {
            continue;
        }
        if NO_DATA_OK
            .iter()
            .any(|(f, t, _)| q.file.ends_with(f) && *t == q.title)
        {
            continue;
        }
        empty.push(format!("{}: {} -> {vals:?}", q.origin, q.promql));
    }
    assert!(
        empty.is_empty(),
        "panel queries without data in Prometheus ({} of {}):\n  {}",
        empty.len(),
        queries.len(),
        empty.join("\n  ")
    );

    let seen = alerts.seen();
    eprintln!(
        "prometheus e2e: {:.1}s; slow consumers alerting at {slow_at:.1?}, backlog alerts at \
         {backlog_at:.1?}; {sent} flood sends, {overloaded} OVERLOADED, {cycles} lock cycles; \
         {} panel queries with data; alerts seen: {seen:?}",
        t0.elapsed().as_secs_f64(),
        queries.len()
    );
    for (alert, _) in EXPECTED_ALERTS {
        assert!(seen.contains_key(*alert), "{alert} was never pending");
    }
    // Each alert's runbook link, as Prometheus sends it on: absolute, from the base the
    // external label gives, to a page that exists.
    let runbooks = alerts.runbooks();
    for (alert, _) in EXPECTED_ALERTS {
        let url = runbooks
            .get(*alert)
            .unwrap_or_else(|| panic!("{alert} had no runbook_url: {runbooks:?}"));
        let page = url
            .strip_prefix(TEST_RUNBOOK_BASE)
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or_else(|| panic!("{alert}: {url} is not under {TEST_RUNBOOK_BASE}"));
        assert!(
            repo().join("runbooks").join(page).is_file(),
            "{alert}: {url} names no runbook page"
        );
    }
    stop_reader.store(true, Ordering::Relaxed);
    stop_sink.store(true, Ordering::Relaxed);
    let _ = reader.await;
    let _ = sink.await;
    drop(stalled);
    drop(alerts);
    drop(prom);
    drop(server);
    drop(schema);
}

#[test]
fn grafana_variables_are_substituted_like_grafana_does() {
    let vars: BTreeMap<String, String> = [
        ("instance", regex_alternation(&["127.0.0.1:7071".into()])),
        (
            "stage",
            regex_alternation(&["decode".into(), "write".into()]),
        ),
        ("__rate_interval", "5m".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(
        substitute(
            r#"rate(x{instance=~"$instance", stage=~"${stage}"}[$__rate_interval])"#,
            &vars
        )
        .unwrap(),
        r#"rate(x{instance=~"127\\.0\\.0\\.1:7071", stage=~"(decode|write)"}[5m])"#
    );
    assert!(substitute("x[$__nope]", &vars)
        .unwrap_err()
        .contains("$__nope"));
    assert_eq!(urlencode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
    let data: Value = serde_json::from_str(
        r#"{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]},{"metric":{},"value":[1,"2"]}]}"#,
    )
    .unwrap();
    assert_eq!(values(&data)[1], 2.0);
}
