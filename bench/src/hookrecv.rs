//! A webhook receiver for `--webhook-receiver-delay-ms`: a minimal HTTP/1.1 server on a
//! loopback port that reads each request (head and `Content-Length` body), waits the
//! configured delay, answers `200 {}` and keeps the connection open; it counts requests.
//! It checks no signature: it stands for a backend's latency, not its logic. A spawned
//! server sends it `message.created` for every message (`target`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// Largest request body read.
const MAX_BODY: usize = 1 << 20;

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct HookReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests answered so far.
    pub answered: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl HookReceiver {
    /// Starts a receiver that answers each request after `delay`.
    pub async fn start(delay: Duration) -> anyhow::Result<HookReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook receiver")?;
        let addr = listener.local_addr()?;
        let answered = Arc::new(AtomicU64::new(0));
        let count = answered.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, delay, count.clone()));
            }
        });
        Ok(HookReceiver {
            addr,
            answered,
            task,
        })
    }
}

impl Drop for HookReceiver {
    fn drop(&mut self) {
        eprintln!(
            "im-bench: the webhook receiver answered {} requests",
            self.answered.load(Ordering::Relaxed)
        );
        self.task.abort();
    }
}

/// Serves one connection until it closes or sends something unreadable.
async fn serve(mut s: TcpStream, delay: Duration, count: Arc<AtomicU64>) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let Some(end) = read_head(&mut s, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0)
            .min(MAX_BODY);
        buf.drain(..end);
        while buf.len() < len {
            let mut chunk = [0u8; 8192];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..len);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let reply =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if s.write_all(reply).await.is_err() {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reads until `buf` holds a whole request head; its length (with the blank line).
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i + 4);
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 8192];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
