//! Route: asks a node's `GET /v1/route` which node a new connection should go to (the
//! least-loaded healthy node of the cluster) before connecting and before every
//! reconnect. A plain HTTP/1.1 GET over a TCP socket: the SDK needs no HTTP client crate.
//! When the answer lists regions, `regions` picks the nearest healthy one.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::regions::{Probe, RegionBook, RouteRegion, MAX_PROBED};
use crate::ClientError;

/// Largest route answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// The node `/v1/route` chose.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Route {
    /// Its id.
    pub node_id: String,
    /// Its WebSocket URL.
    pub ws_url: String,
    /// Multi-region mode: the answering region (empty otherwise).
    #[serde(default)]
    pub region: String,
    /// Multi-region mode: every region's entry point (empty otherwise).
    #[serde(default)]
    pub regions: Vec<RouteRegion>,
}

/// The URL to connect to: the node `/v1/route` chooses when `route_urls` are set (falling
/// back to `cfg.url` if none answers and it is set), else `cfg.url`.
pub(crate) async fn target_url(
    cfg: &crate::ClientConfig,
    attempt: usize,
    avoid: Option<&str>,
) -> Result<String, ClientError> {
    if cfg.route_urls.is_empty() {
        return Ok(cfg.url.clone());
    }
    let timeout = cfg.request_timeout.min(Duration::from_secs(3));
    // Regions probed already: straight to the nearest one that answers.
    if cfg.probe_regions && !cfg.regions.order().is_empty() {
        let r = nearest(&cfg.regions, None, avoid, timeout).await;
        if let Ok(r) = r {
            return Ok(r.ws_url);
        }
    }
    let first = resolve(&cfg.route_urls, attempt, avoid, timeout).await;
    let first = match first {
        Ok(r) if cfg.probe_regions && !r.regions.is_empty() => {
            nearest(&cfg.regions, Some(r), avoid, timeout).await
        }
        other => other,
    };
    match first {
        Ok(r) => Ok(r.ws_url),
        Err(e) if !cfg.url.is_empty() => {
            tracing::debug!(error = %e, "no route answer; using the configured url");
            Ok(cfg.url.clone())
        }
        Err(e) => Err(e),
    }
}

/// Asks each of `route_urls` in turn, starting at `start` (so successive calls spread over
/// the seeds), until one answers; `avoid` is a node to leave out (the one just lost).
pub async fn resolve(
    route_urls: &[String],
    start: usize,
    avoid: Option<&str>,
    timeout: Duration,
) -> Result<Route, ClientError> {
    let mut last = ClientError::Route("no route_urls configured".into());
    for i in 0..route_urls.len() {
        let base = &route_urls[(start + i) % route_urls.len()];
        match tokio::time::timeout(timeout, ask(base, avoid)).await {
            Ok(Ok(r)) => return Ok(r),
            Ok(Err(e)) => last = e,
            Err(_) => last = ClientError::Route(format!("{base}: timed out")),
        }
    }
    Err(last)
}

/// Probes every region concurrently (each within `timeout`); nearest first, the ones
/// that did not answer last, in list order.
pub async fn probe(regions: &[RouteRegion], timeout: Duration) -> Vec<Probe> {
    let tasks = regions.iter().take(MAX_PROBED).map(|r| async move {
        let t0 = Instant::now();
        let ok = matches!(
            tokio::time::timeout(timeout, ask(&r.route_url, None)).await,
            Ok(Ok(_))
        );
        Probe {
            name: r.name.clone(),
            route_url: r.route_url.clone(),
            rtt: ok.then(|| t0.elapsed()),
        }
    });
    let mut probes = futures_util::future::join_all(tasks).await;
    probes.sort_by_key(|p| p.rtt.unwrap_or(Duration::MAX));
    probes
}

/// The route through the nearest region that answers, given the first answer `first`
/// (from a seed). Probes when the book is empty or stale and `first` lists regions.
async fn nearest(
    book: &RegionBook,
    first: Option<Route>,
    avoid: Option<&str>,
    timeout: Duration,
) -> Result<Route, ClientError> {
    let order = match book.fresh() {
        Some(o) => o,
        None => match first.as_ref().filter(|f| !f.regions.is_empty()) {
            Some(f) => {
                let probes = probe(&f.regions, timeout).await;
                tracing::debug!(?probes, "probed the regions");
                book.store(probes.clone());
                probes
            }
            None => Vec::new(),
        },
    };
    let mut last = ClientError::Route("no region answered".into());
    for p in &order {
        // The seed's answer already comes from this region: no second round trip.
        if let Some(f) = first
            .as_ref()
            .filter(|f| f.region == p.name && p.rtt.is_some())
        {
            return Ok(f.clone());
        }
        match tokio::time::timeout(timeout, ask(&p.route_url, avoid)).await {
            Ok(Ok(r)) => return Ok(r),
            Ok(Err(e)) => last = e,
            Err(_) => last = ClientError::Route(format!("{}: timed out", p.route_url)),
        }
    }
    first.ok_or(last)
}

/// One `GET {base}/v1/route`.
async fn ask(base: &str, avoid: Option<&str>) -> Result<Route, ClientError> {
    let err = |m: String| ClientError::Route(format!("{base}: {m}"));
    let host = base
        .strip_prefix("http://")
        .ok_or_else(|| err("route URLs must be http://HOST:PORT".into()))?
        .trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(err("route URLs must be http://HOST:PORT".into()));
    }
    let mut path = "/v1/route".to_owned();
    if let Some(a) = avoid.filter(|a| im_proto::valid_id(a)) {
        path.push_str("?avoid=");
        path.push_str(a);
    }
    let mut tcp = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| err(e.to_string()))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes())
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut buf = Vec::new();
    (&mut tcp)
        .take(MAX_ANSWER as u64)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| err(e.to_string()))?;
    parse_answer(&buf).map_err(err)
}

/// Status line, headers, body: the body of a 200 as a [`Route`].
fn parse_answer(buf: &[u8]) -> Result<Route, String> {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete HTTP answer")?;
    let head = std::str::from_utf8(&buf[..split]).map_err(|_| "answer head is not UTF-8")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .ok_or("no HTTP status")?
        .to_owned();
    let body = &buf[split + 4..];
    if status != "200" {
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err("chunked answers are not supported".into());
    }
    let r: Route = serde_json::from_slice(body).map_err(|e| format!("bad route answer: {e}"))?;
    if !(r.ws_url.starts_with("ws://") || r.ws_url.starts_with("wss://")) {
        return Err(format!("bad ws_url {:?}", r.ws_url));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_route_answer() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"node_id\":\"b\",\"ws_url\":\"ws://127.0.0.1:9/ws\"}";
        assert_eq!(
            parse_answer(ok).unwrap(),
            Route {
                node_id: "b".into(),
                ws_url: "ws://127.0.0.1:9/ws".into(),
                region: String::new(),
                regions: Vec::new(),
            }
        );
        let busy = b"HTTP/1.1 503 Service Unavailable\r\n\r\n{\"error\":\"no healthy node\"}";
        assert!(parse_answer(busy).unwrap_err().contains("503"));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        let bad = b"HTTP/1.1 200 OK\r\n\r\n{\"node_id\":\"b\",\"ws_url\":\"http://x\"}";
        assert!(parse_answer(bad).is_err());
    }

    #[tokio::test]
    async fn probes_sort_dead_regions_last_and_never_hang() {
        let dead = RouteRegion {
            name: "dead".into(),
            route_url: "http://127.0.0.1:1".into(),
        };
        let probes = probe(&[dead], Duration::from_secs(2)).await;
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].rtt, None);
        let book = RegionBook::default();
        book.store(probes);
        let r = nearest(&book, None, None, Duration::from_secs(1)).await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn resolve_tries_the_next_seed() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let n = s.read(&mut req).await.unwrap();
            assert!(std::str::from_utf8(&req[..n])
                .unwrap()
                .starts_with("GET /v1/route?avoid=a HTTP/1.1"));
            s.write_all(b"HTTP/1.1 200 OK\r\n\r\n{\"node_id\":\"c\",\"ws_url\":\"ws://h/ws\"}")
                .await
                .unwrap();
        });
        let dead = "http://127.0.0.1:1".to_owned();
        let r = resolve(&[dead, good], 0, Some("a"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(r.node_id, "c");
        assert!(resolve(&[], 0, None, Duration::from_secs(1)).await.is_err());
    }
}
