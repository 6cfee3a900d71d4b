//! A mock admin API node for the console's tests: a loopback HTTP/1.1 server that answers
//! each `(method, path)` with queued replies (the last one repeats), e.g. the recorded
//! fixtures, with an optional delay or a broken answer.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One canned answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Close the connection without answering.
    pub hang_up: bool,
    /// Claimed Content-Length (None: the real length).
    pub content_length: Option<usize>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            body: body.into(),
            delay: Duration::ZERO,
            hang_up: false,
            content_length: None,
        }
    }
}

type Routes = Arc<Mutex<HashMap<(String, String), VecDeque<Reply>>>>;

/// A running mock node.
pub struct MockNode {
    /// Its base URL.
    pub url: String,
    routes: Routes,
    /// Requests seen, as `METHOD /path?query` plus the body.
    pub seen: Arc<Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The text of a fixture file.
pub fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

impl MockNode {
    /// Starts a mock node on a free loopback port.
    pub async fn start() -> MockNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let routes: Routes = Arc::default();
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let (r, s) = (routes.clone(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(sock, r.clone(), s.clone()));
            }
        });
        MockNode {
            url,
            routes,
            seen,
            task,
        }
    }

    /// Queues `reply` for `method path` (path without the query).
    pub fn reply(&self, method: &str, path: &str, reply: Reply) {
        self.routes
            .lock()
            .unwrap()
            .entry((method.to_owned(), path.to_owned()))
            .or_default()
            .push_back(reply);
    }

    /// Queues a fixture file as the answer.
    pub fn fixture(&self, method: &str, path: &str, status: u16, name: &str) {
        self.reply(method, path, Reply::json(status, fixture(name)));
    }

    /// Queues the recorded answer of each read the console polls (overview, connections,
    /// slow consumers, memory, log filters, logs), one of each.
    pub fn recorded_reads(&self) {
        for (path, name) in [
            ("/admin/v1/overview", "overview.json"),
            ("/admin/v1/connections", "connections.json"),
            ("/admin/v1/slow-consumers", "slow_consumers_1.json"),
            ("/admin/v1/memory", "memory.json"),
            ("/admin/v1/log-filters", "log_filters.json"),
            ("/admin/v1/logs", "logs.json"),
        ] {
            self.fixture("GET", path, 200, name);
        }
    }
}

async fn serve(
    mut sock: tokio::net::TcpStream,
    routes: Routes,
    seen: Arc<Mutex<Vec<(String, String)>>>,
) {
    loop {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.lines();
        let mut first = lines.next().unwrap_or("").split_whitespace();
        let method = first.next().unwrap_or("").to_owned();
        let target = first.next().unwrap_or("").to_owned();
        let len: usize = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
        seen.lock()
            .unwrap()
            .push((format!("{method} {target}"), body));
        let path = target.split('?').next().unwrap_or("").to_owned();
        let reply = {
            let mut r = routes.lock().unwrap();
            match r.get_mut(&(method.clone(), path)) {
                Some(q) if q.len() > 1 => q.pop_front(),
                Some(q) => q.front().cloned(),
                None => None,
            }
        }
        .unwrap_or_else(|| Reply::json(404, &br#"{"error":"no such route"}"#[..]));
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        if reply.hang_up {
            return;
        }
        let head = format!(
            "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            reply.status,
            reply.content_length.unwrap_or(reply.body.len())
        );
        if sock.write_all(head.as_bytes()).await.is_err()
            || sock.write_all(&reply.body).await.is_err()
        {
            return;
        }
    }
}
