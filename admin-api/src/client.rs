//! The HTTP client of the admin API (feature `client`): one [`AdminClient`] per node,
//! plain HTTP with a bearer token, a timeout and a body-size cap on every request, each
//! answer decoded into this crate's types with errors naming the field; failures come
//! back as an [`ApiError`].

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::routes::{self, segments};
use crate::{
    Connection, ConnectionList, ErrorBody, GlobalLevel, HeapProfileBundle, Kicked, LogFilter,
    LogFilterRemoved, LogFilters, LogTailLine, Logs, Memory, MessageTrace, Overview, ParkedEvents,
    PostMessage, PostedMessages, ProfileBundle, Redeliver, Redelivered, Revoked, SetLogFilter,
    SetLogLevel, SlowConsumers, TestFired, Webhooks, IDEMPOTENCY_KEY, NO_SUCH_ROUTE,
};

/// Largest response body read from a node (a profile bundle with its SVG is the biggest).
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// Longest line of a log tail read from a node.
pub const MAX_TAIL_LINE_BYTES: usize = 1 << 20;
/// Extra time a CPU or heap capture may take past its `seconds` before the request gives up.
pub const PROFILE_SLACK: Duration = Duration::from_secs(30);

/// Why a request to a node failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The node URL given on the command line or in the config is not usable.
    #[error("bad node URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made or it broke (refused, reset, DNS).
    #[error("{0}")]
    Unreachable(String),
    /// The node did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The node answered `404 {"error":"no such route"}`: it does not have this route yet.
    #[error("{path}: not available on this node (404 no such route)")]
    RouteMissing {
        /// The path asked for.
        path: String,
    },
    /// Any other error status, with the node's `{"error": ...}` message.
    #[error("HTTP {status}: {message}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The node's error message (or the start of the body).
        message: String,
    },
    /// The body was larger than the cap.
    #[error("response larger than {limit} bytes")]
    TooLarge {
        /// The cap in bytes.
        limit: usize,
    },
    /// The body was not the JSON expected.
    #[error("unexpected response from {path}: {reason}")]
    Decode {
        /// The path asked for.
        path: String,
        /// The decoder's message, naming the field.
        reason: String,
    },
}

impl ApiError {
    /// True when the node itself could not be reached (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ApiError::Unreachable(_) | ApiError::Timeout(_))
    }

    /// True for the 404 a node gives for a route it does not have.
    pub fn is_route_missing(&self) -> bool {
        matches!(self, ApiError::RouteMissing { .. })
    }

    /// The HTTP status, when the node answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            ApiError::RouteMissing { .. } => Some(404),
            _ => None,
        }
    }
}

/// A client for one node's admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
    timeout: Duration,
}

/// Parses a node URL: `http://host:port[/prefix]`, or `host:port` (http assumed).
pub fn parse_base_url(url: &str) -> Result<Url, ApiError> {
    let bad = |reason: &str| ApiError::BadUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let text = url.trim();
    let text = if text.contains("://") {
        text.to_owned()
    } else {
        format!("http://{text}")
    };
    let parsed = Url::parse(&text).map_err(|e| bad(&e.to_string()))?;
    match parsed.scheme() {
        "http" => {}
        "https" => return Err(bad(
            "https is not supported: the admin listener speaks plain HTTP (tunnel it, e.g. ssh -L)",
        )),
        other => return Err(bad(&format!("scheme {other:?}: expected http"))),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("no query or fragment expected"));
    }
    Ok(parsed)
}

impl AdminClient {
    /// A client for the node at `url`, sending `token` as the bearer, each request
    /// bounded by `timeout` (a profile capture gets its length on top).
    pub fn new(url: &str, token: Option<String>, timeout: Duration) -> Result<Self, ApiError> {
        let base = parse_base_url(url)?;
        // In a build whose reqwest links rustls without a provider (the server's https
        // hooks), building a client needs a process default: ring (already set: fine).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(timeout)
            .no_proxy()
            .user_agent(concat!("im-admin-api/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ApiError::BadUrl {
                url: url.to_owned(),
                reason: format!("HTTP client: {e}"),
            })?;
        Ok(AdminClient {
            http,
            base,
            token,
            timeout,
        })
    }

    /// The node's base URL, as shown in the console.
    pub fn base_url(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// `GET /admin/v1/overview`.
    pub async fn overview(&self) -> Result<Overview, ApiError> {
        self.get(routes::OVERVIEW, &[], &[]).await
    }

    /// `GET /admin/v1/connections?sort=&limit=`.
    pub async fn connections(&self, sort: &str, limit: u32) -> Result<ConnectionList, ApiError> {
        let limit = limit.to_string();
        self.get(
            routes::CONNECTIONS,
            &[],
            &[("sort", sort), ("limit", &limit)],
        )
        .await
    }

    /// `DELETE /admin/v1/connections/{conn_id}`: the client gets close code 4002.
    pub async fn kick(&self, conn_id: u64) -> Result<Kicked, ApiError> {
        let id = conn_id.to_string();
        let path = segments(routes::CONNECTION, &[&id]);
        self.call(Method::DELETE, &path, &[], None::<()>, self.timeout)
            .await
    }

    /// `POST /admin/v1/users/{uid}/revoke`: closes every session of the user (close code
    /// 4003) and refuses the tokens issued so far.
    pub async fn revoke(&self, uid: &str) -> Result<Revoked, ApiError> {
        let path = segments(routes::REVOKE, &[uid]);
        self.call(Method::POST, &path, &[], None::<()>, self.timeout)
            .await
    }

    /// `GET /admin/v1/users/{uid}?backlog=&messages=`: the user's diagnosis, cluster-wide.
    pub async fn user(
        &self,
        uid: &str,
        backlog: u32,
        messages: u32,
    ) -> Result<crate::UserDiag, ApiError> {
        let (b, m) = (backlog.to_string(), messages.to_string());
        self.get(routes::USER, &[uid], &[("backlog", &b), ("messages", &m)])
            .await
    }

    /// `GET /admin/v1/slow-consumers`.
    pub async fn slow_consumers(&self) -> Result<SlowConsumers, ApiError> {
        self.get(routes::SLOW_CONSUMERS, &[], &[]).await
    }

    /// `GET /admin/v1/memory`.
    pub async fn memory(&self) -> Result<Memory, ApiError> {
        self.get(routes::MEMORY, &[], &[]).await
    }

    /// `GET /admin/v1/log-filters`.
    pub async fn log_filters(&self) -> Result<LogFilters, ApiError> {
        self.get(routes::LOG_FILTERS, &[], &[]).await
    }

    /// `PUT /admin/v1/log-filters/{uid}` with `{"level", "ttl_secs"}`.
    pub async fn set_log_filter(
        &self,
        uid: &str,
        level: &str,
        ttl_secs: u64,
    ) -> Result<LogFilter, ApiError> {
        let body = SetLogFilter {
            level: level.to_owned(),
            ttl_secs: Some(ttl_secs),
        };
        let path = segments(routes::LOG_FILTER, &[uid]);
        self.call(Method::PUT, &path, &[], Some(body), self.timeout)
            .await
    }

    /// `DELETE /admin/v1/log-filters/{uid}`.
    pub async fn delete_log_filter(&self, uid: &str) -> Result<LogFilterRemoved, ApiError> {
        let path = segments(routes::LOG_FILTER, &[uid]);
        self.call(Method::DELETE, &path, &[], None::<()>, self.timeout)
            .await
    }

    /// `PUT /admin/v1/log-level` with `{"level"}` (an EnvFilter string); returns the level in force.
    pub async fn set_global_level(&self, level: &str) -> Result<GlobalLevel, ApiError> {
        let body = SetLogLevel {
            level: level.to_owned(),
        };
        let path = segments(routes::LOG_LEVEL, &[]);
        self.call(Method::PUT, &path, &[], Some(body), self.timeout)
            .await
    }

    /// `GET /admin/v1/logs`.
    pub async fn logs(&self) -> Result<Logs, ApiError> {
        self.get(routes::LOGS, &[], &[]).await
    }

    /// `GET /admin/v1/logs/tail?uid=&level=&backlog=`: opens the live tail of a user who
    /// has a log filter. The answer's head must come within the timeout; the stream then
    /// lasts until the node ends it or the [`LogTail`] is dropped.
    pub async fn log_tail(
        &self,
        uid: &str,
        level: Option<&str>,
        backlog: u32,
    ) -> Result<LogTail, ApiError> {
        let backlog = backlog.to_string();
        let mut query = vec![("uid", uid), ("backlog", backlog.as_str())];
        if let Some(l) = level {
            query.push(("level", l));
        }
        let url = self.url(&segments(routes::LOGS_TAIL, &[]), &query)?;
        let path = url.path().to_owned();
        let mut req = self.http.get(url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let timeout = self.timeout;
        let resp = tokio::time::timeout(timeout, req.send())
            .await
            .map_err(|_| ApiError::Timeout(timeout))?
            .map_err(|e| transport(e, timeout))?;
        let status = resp.status();
        if !status.is_success() {
            let body = tokio::time::timeout(timeout, resp.bytes())
                .await
                .map_err(|_| ApiError::Timeout(timeout))?
                .map_err(|e| transport(e, timeout))?;
            let body = &body[..body.len().min(MAX_TAIL_LINE_BYTES)];
            return Err(status_error(status, body, &path));
        }
        Ok(LogTail {
            resp,
            buf: Vec::new(),
            path,
        })
    }

    /// `GET /admin/v1/profile/cpu?seconds=&frequency=&format=bundle`: blocks for the
    /// capture; 409 means another capture is running on the node.
    pub async fn profile(&self, seconds: u64, frequency: u64) -> Result<ProfileBundle, ApiError> {
        let (s, f) = (seconds.to_string(), frequency.to_string());
        let timeout = self.timeout + Duration::from_secs(seconds) + PROFILE_SLACK;
        let path = segments(routes::PROFILE_CPU, &[]);
        self.call(
            Method::GET,
            &path,
            &[("seconds", &s), ("frequency", &f), ("format", "bundle")],
            None::<()>,
            timeout,
        )
        .await
    }

    /// `GET /admin/v1/profile/heap?seconds=&format=bundle`: blocks for the sampling window;
    /// 409 means another heap capture is running on the node, 503 that it has no profiler.
    pub async fn heap_profile(&self, seconds: u64) -> Result<HeapProfileBundle, ApiError> {
        let s = seconds.to_string();
        let timeout = self.timeout + Duration::from_secs(seconds) + PROFILE_SLACK;
        let path = segments(routes::PROFILE_HEAP, &[]);
        self.call(
            Method::GET,
            &path,
            &[("seconds", &s), ("format", "bundle")],
            None::<()>,
            timeout,
        )
        .await
    }

    /// `GET /admin/v1/connections/{conn_id}`.
    pub async fn connection(&self, conn_id: u64) -> Result<Connection, ApiError> {
        let id = conn_id.to_string();
        self.get(routes::CONNECTION, &[&id], &[]).await
    }

    /// `POST /admin/v1/messages`: a SYSTEM or bot message to a user, a group or a list of
    /// users; `idempotency_key` (recommended) makes a retry answer the first commit.
    pub async fn post_message(
        &self,
        body: &PostMessage,
        idempotency_key: Option<&str>,
    ) -> Result<PostedMessages, ApiError> {
        let path = segments(routes::MESSAGES, &[]);
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| (IDEMPOTENCY_KEY, k))
            .into_iter()
            .collect();
        self.request(Method::POST, &path, &[], &headers, Some(body), self.timeout)
            .await
    }

    /// `GET /admin/v1/messages/{msg_id}/trace`: the message's merged stage timeline
    /// (404 when no node holds a trace of it).
    pub async fn message_trace(&self, msg_id: &str) -> Result<MessageTrace, ApiError> {
        self.get(routes::MESSAGE_TRACE, &[msg_id], &[]).await
    }

    /// `GET /admin/v1/webhooks` (404 when the node has no webhook endpoint).
    pub async fn webhooks(&self) -> Result<Webhooks, ApiError> {
        self.get(routes::WEBHOOKS, &[], &[]).await
    }

    /// `GET /admin/v1/webhooks/parked?endpoint=&limit=`.
    pub async fn webhooks_parked(
        &self,
        endpoint: &str,
        limit: u32,
    ) -> Result<ParkedEvents, ApiError> {
        let limit = limit.to_string();
        self.get(
            routes::WEBHOOKS_PARKED,
            &[],
            &[("endpoint", endpoint), ("limit", &limit)],
        )
        .await
    }

    /// `POST /admin/v1/webhooks/parked/redeliver`: queues parked events again.
    pub async fn webhooks_redeliver(&self, body: &Redeliver) -> Result<Redelivered, ApiError> {
        let path = segments(routes::WEBHOOKS_REDELIVER, &[]);
        self.call(Method::POST, &path, &[], Some(body), self.timeout)
            .await
    }

    /// `POST /admin/v1/webhooks/{name}/test`: a `webhook.test` event sent now.
    pub async fn webhook_test(&self, name: &str) -> Result<TestFired, ApiError> {
        let path = segments(routes::WEBHOOK_TEST, &[name]);
        self.call(Method::POST, &path, &[], None::<()>, self.timeout)
            .await
    }

    /// `GET` of `route` with its parameters `args` and the `query` pairs.
    pub async fn get<T: DeserializeOwned>(
        &self,
        route: &str,
        args: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, ApiError> {
        let path = segments(route, args);
        self.call(Method::GET, &path, query, None::<()>, self.timeout)
            .await
    }

    /// Builds the URL from path segments (each percent-encoded), sends, reads the body
    /// under the cap and decodes it, mapping every failure to an [`ApiError`].
    async fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<B>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        self.request(method, segments, query, &[], body, timeout)
            .await
    }

    /// As [`AdminClient::call`], with extra request `headers`.
    async fn request<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: Option<B>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = self.url(segments, query)?;
        let path = url.path().to_owned();
        let mut req = self.http.request(method, url).timeout(timeout);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let read = async {
            let mut resp = req.send().await.map_err(|e| transport(e, timeout))?;
            let status = resp.status();
            let mut buf = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, timeout))? {
                if buf.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(ApiError::TooLarge {
                        limit: MAX_BODY_BYTES,
                    });
                }
                buf.extend_from_slice(&chunk);
            }
            Ok((status, buf))
        };
        // reqwest's timeout covers the body too; this bounds anything it might miss.
        let (status, buf) = tokio::time::timeout(timeout + Duration::from_secs(1), read)
            .await
            .map_err(|_| ApiError::Timeout(timeout))??;
        if !status.is_success() {
            return Err(status_error(status, &buf, &path));
        }
        let de = &mut serde_json::Deserializer::from_slice(&buf);
        serde_path_to_error::deserialize(de).map_err(|e| ApiError::Decode {
            path,
            reason: e.to_string(),
        })
    }
}

impl AdminClient {
    /// The URL of path `segments` (each percent-encoded) with the `query` pairs.
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Result<Url, ApiError> {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| ApiError::BadUrl {
                url: self.base.to_string(),
                reason: "cannot be a base".into(),
            })?;
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }
}

/// An open log tail ([`AdminClient::log_tail`]): its lines as they come.
pub struct LogTail {
    resp: reqwest::Response,
    buf: Vec<u8>,
    path: String,
}

impl LogTail {
    /// The next line (keep-alive blank lines skipped); `Ok(None)` once the node has
    /// ended the stream. A line longer than [`MAX_TAIL_LINE_BYTES`] is an error.
    pub async fn next_line(&mut self) -> Result<Option<LogTailLine>, ApiError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                let de = &mut serde_json::Deserializer::from_slice(line);
                return serde_path_to_error::deserialize(de).map(Some).map_err(|e| {
                    ApiError::Decode {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    }
                });
            }
            if self.buf.len() > MAX_TAIL_LINE_BYTES {
                return Err(ApiError::TooLarge {
                    limit: MAX_TAIL_LINE_BYTES,
                });
            }
            match self.resp.chunk().await {
                Ok(Some(c)) => self.buf.extend_from_slice(&c),
                Ok(None) => return Ok(None),
                Err(e) => return Err(transport(e, Duration::ZERO)),
            }
        }
    }
}

/// Maps a transport error, naming the root cause (e.g. "Connection refused").
fn transport(e: reqwest::Error, timeout: Duration) -> ApiError {
    if e.is_timeout() {
        return ApiError::Timeout(timeout);
    }
    // reqwest's own text repeats the URL; the root cause ("Connection refused") says it all.
    let mut root = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        root = s.to_string();
        source = s.source();
    }
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "reading the response"
    } else if e.is_request() {
        "sending the request"
    } else {
        "transport"
    };
    ApiError::Unreachable(format!("{what}: {root}"))
}

/// Turns an error status and its `{"error": ...}` body into an [`ApiError`].
fn status_error(status: StatusCode, body: &[u8], path: &str) -> ApiError {
    let message = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) if !b.error.is_empty() => b.error,
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let mut short: String = text.chars().take(200).collect();
            if short.len() < text.len() {
                short.push('…');
            }
            if short.is_empty() {
                status.canonical_reason().unwrap_or("error").to_owned()
            } else {
                short
            }
        }
    };
    if status == StatusCode::NOT_FOUND && message == NO_SUCH_ROUTE {
        return ApiError::RouteMissing {
            path: path.to_owned(),
        };
    }
    ApiError::Status {
        status: status.as_u16(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            parse_base_url("127.0.0.1:7071").unwrap().as_str(),
            "http://127.0.0.1:7071/"
        );
        assert_eq!(
            parse_base_url("http://h:1/im/").unwrap().as_str(),
            "http://h:1/im/"
        );
        assert!(parse_base_url("https://h:1").is_err());
        assert!(parse_base_url("ftp://h").is_err());
        assert!(parse_base_url("http://h:1/?a=b").is_err());
    }

    #[test]
    fn error_bodies() {
        let e = status_error(StatusCode::NOT_FOUND, br#"{"error":"no such route"}"#, "/x");
        assert!(e.is_route_missing());
        let e = status_error(
            StatusCode::NOT_FOUND,
            br#"{"error":"no connection 9"}"#,
            "/x",
        );
        assert_eq!(
            e,
            ApiError::Status {
                status: 404,
                message: "no connection 9".into()
            }
        );
        let e = status_error(StatusCode::BAD_GATEWAY, b"", "/x");
        assert_eq!(e.to_string(), "HTTP 502: Bad Gateway");
    }
}
