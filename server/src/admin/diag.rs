//! Admin diagnosis routes: on-demand CPU and heap profiles, per-uid
//! log filters, the global log level, the log files with their compaction state, and the
//! live tail of a filtered user's events (a chunked NDJSON stream, [`tail`]).
//! Shapes are documented in `docs/admin-api.md` and declared in `im_admin_api`; bad input
//! is a 400 naming the parameter or field (a JSON body is read into its typed request,
//! which refuses unknown fields).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use base64::Engine;
use im_admin_api::{
    routes, GlobalLevel, HeapProfileBundle, LogFile, LogFilter, LogFilterRemoved, LogTailLine,
    LogWindow, Logs, ProfileBundle, SetLogFilter, SetLogLevel,
};
use serde::de::DeserializeOwned;

use super::error;
use crate::obs::compactor::{self, FileState, SystemClock};
use crate::obs::heap::{self, HeapError, HeapSlot};
use crate::obs::logfiles::{self, LogControl};
use crate::obs::logfilter::{self, FilterError, FilterInfo, LogFilters};
use crate::obs::profile::{self, CaptureSlot, Format, ProfileError};
use crate::obs::tail::{Subscription, TailEvent};
use crate::Node;

/// Default and bounds of a filter's `ttl_secs`.
const TTL_DEFAULT: u64 = 600;
const TTL_MAX: u64 = 86_400;

/// The diagnosis routes (merged into the token-protected router).
pub fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route(routes::PROFILE_CPU, get(cpu_profile))
        .route(routes::PROFILE_HEAP, get(heap_profile))
        .route(routes::LOG_FILTERS, get(list_filters))
        .route(routes::LOG_FILTER, put(set_filter).delete(remove_filter))
        .route(routes::LOG_LEVEL, put(set_level))
        .route(routes::LOGS, get(logs))
        .route(routes::LOGS_TAIL, get(tail))
}

/// A refused request, answered as `{"error": ...}` with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub StatusCode, pub String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn bad(message: impl Into<String>) -> Refused {
    Refused(StatusCode::BAD_REQUEST, message.into())
}

fn param(
    q: &HashMap<String, String>,
    name: &str,
    default: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<u32, Refused> {
    match q.get(name) {
        None => Ok(default),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(bad(format!(
                "{name}={v}: expected a whole number from {} to {}",
                range.start(),
                range.end()
            ))),
        },
    }
}

async fn cpu_profile(Query(q): Query<HashMap<String, String>>) -> Result<Response, Refused> {
    let seconds = param(&q, "seconds", 10, profile::SECONDS)?;
    let frequency = param(&q, "frequency", 99, profile::FREQUENCY)?;
    let format = format_param(&q)?;
    let slot = CaptureSlot::try_take().map_err(|e| Refused(StatusCode::CONFLICT, e.to_string()))?;
    tracing::info!(seconds, frequency, ?format, "CPU profile capture started");
    let r = match profile::capture(&slot, seconds, frequency, format).await {
        Ok(r) => r,
        Err(e @ ProfileError::Busy) => return Err(Refused(StatusCode::CONFLICT, e.to_string())),
        Err(e) => {
            tracing::warn!(error = %e, "CPU profile failed");
            return Err(Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
        }
    };
    drop(slot);
    tracing::info!(samples = r.samples, "CPU profile captured");
    Ok(match format {
        Format::Svg => svg_response(r.svg),
        Format::Pprof => pprof_response(r.pprof_gz, "cpu.pb.gz"),
        Format::Bundle => Json(ProfileBundle {
            seconds: seconds.into(),
            frequency: frequency.into(),
            samples: r.samples,
            top: r.top,
            svg: r.svg.unwrap_or_default(),
            pprof_gz_base64: base64::engine::general_purpose::STANDARD
                .encode(r.pprof_gz.unwrap_or_default()),
        })
        .into_response(),
    })
}

fn format_param(q: &HashMap<String, String>) -> Result<Format, Refused> {
    match q.get("format").map(String::as_str) {
        None => Ok(Format::Svg),
        Some(f) => Format::parse(f)
            .ok_or_else(|| bad(format!("format={f}: expected svg, pprof or bundle"))),
    }
}

fn svg_response(svg: Option<String>) -> Response {
    (
        [(header::CONTENT_TYPE, "image/svg+xml")],
        svg.unwrap_or_default(),
    )
        .into_response()
}

fn pprof_response(gz: Option<Vec<u8>>, filename: &'static str) -> Response {
    let disposition = format!("attachment; filename=\"{filename}\"");
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        gz.unwrap_or_default(),
    )
        .into_response()
}

async fn heap_profile(Query(q): Query<HashMap<String, String>>) -> Result<Response, Refused> {
    let seconds = param(&q, "seconds", 10, heap::SECONDS)?;
    let format = format_param(&q)?;
    if !heap::available() {
        return Err(Refused(
            StatusCode::SERVICE_UNAVAILABLE,
            HeapError::Unavailable.to_string(),
        ));
    }
    let slot = HeapSlot::try_take().map_err(|e| Refused(StatusCode::CONFLICT, e.to_string()))?;
    tracing::info!(seconds, ?format, "heap profile capture started");
    let r = match heap::capture(&slot, seconds, format).await {
        Ok(r) => r,
        Err(e @ HeapError::Busy) => return Err(Refused(StatusCode::CONFLICT, e.to_string())),
        Err(e @ HeapError::Unavailable) => {
            return Err(Refused(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
        }
        Err(e) => {
            tracing::warn!(error = %e, "heap profile failed");
            return Err(Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
        }
    };
    drop(slot);
    tracing::info!(
        inuse_bytes = r.inuse_bytes,
        stacks = r.stacks,
        "heap profile captured"
    );
    Ok(match format {
        Format::Svg => svg_response(r.svg),
        Format::Pprof => pprof_response(r.pprof_gz, "heap.pb.gz"),
        Format::Bundle => Json(HeapProfileBundle {
            seconds: seconds.into(),
            sample_interval_bytes: 1 << heap::LG_SAMPLE,
            inuse_bytes: r.inuse_bytes,
            stacks: r.stacks,
            top: r.top,
            svg: r.svg.unwrap_or_default(),
            pprof_gz_base64: base64::engine::general_purpose::STANDARD
                .encode(r.pprof_gz.unwrap_or_default()),
        })
        .into_response(),
    })
}

fn control() -> Result<Arc<LogControl>, Refused> {
    logfiles::control().ok_or_else(|| {
        Refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "logging is not managed by this process".into(),
        )
    })
}

async fn list_filters() -> Result<Response, Refused> {
    let c = control()?;
    Ok(Json(im_admin_api::LogFilters {
        global_level: c.filters.global_level(),
        uid_filters_enabled: Some(c.filters.uid_enabled()),
        filters: c.filters.list().into_iter().map(filter_view).collect(),
    })
    .into_response())
}

/// Reads a JSON object body into its typed request. The error names what is wrong: the
/// field (its path) for a bad or unknown one, `body` when it is not a JSON object.
pub(super) fn body<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refused> {
    let value = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return Err(bad("body: expected a JSON object")),
        Err(e) => return Err(bad(format!("body: not JSON: {e}"))),
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            bad(format!("body: {inner}"))
        } else {
            bad(format!("{path}: {inner}"))
        }
    })
}

/// A filter as the admin API shows it.
fn filter_view(f: FilterInfo) -> LogFilter {
    LogFilter {
        uid: f.uid,
        level: f.level.to_owned(),
        ttl_secs: f.ttl_secs,
        remaining_secs: f.remaining_secs,
    }
}

async fn set_filter(Path(uid): Path<String>, body: Bytes) -> Result<Response, Refused> {
    let c = control()?;
    let info = put_filter(&c.filters, &uid, &body)?;
    tracing::info!(uid = %uid, level = info.level, ttl_secs = info.ttl_secs, "log filter set");
    Ok(Json(filter_view(info)).into_response())
}

/// `PUT /admin/v1/log-filters/{uid}` applied to `filters`: checks the uid and the JSON
/// body ([`SetLogFilter`]), then sets the filter (400 or 409 otherwise).
pub fn put_filter(filters: &LogFilters, uid: &str, body: &[u8]) -> Result<FilterInfo, Refused> {
    if !im_proto::valid_id(uid) {
        return Err(bad(format!(
            "uid {uid:?}: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
        )));
    }
    let req: SetLogFilter = self::body(body)?;
    let levels = logfilter::UID_LEVELS.join(", ");
    let level = logfilter::parse_uid_level(&req.level)
        .ok_or_else(|| bad(format!("level {:?}: expected one of {levels}", req.level)))?;
    let ttl = match req.ttl_secs {
        None => TTL_DEFAULT,
        Some(n) if (1..=TTL_MAX).contains(&n) => n,
        Some(n) => {
            return Err(bad(format!(
                "ttl_secs {n}: expected a whole number from 1 to {TTL_MAX}"
            )))
        }
    };
    filters
        .set(uid, level, Duration::from_secs(ttl))
        .map_err(|e| match e {
            FilterError::TooMany(_) | FilterError::Disabled => {
                Refused(StatusCode::CONFLICT, e.to_string())
            }
        })
}

async fn remove_filter(Path(uid): Path<String>) -> Result<Response, Refused> {
    let c = control()?;
    if c.filters.remove(&uid) {
        tracing::info!(uid = %uid, "log filter removed");
        Ok(Json(LogFilterRemoved { removed: uid }).into_response())
    } else {
        Err(Refused(
            StatusCode::NOT_FOUND,
            format!("no log filter for {uid:?}"),
        ))
    }
}

async fn set_level(body: Bytes) -> Result<Response, Refused> {
    let c = control()?;
    let shown = put_level(&c.filters, &body)?;
    tracing::info!(level = %shown, "global log level changed");
    Ok(Json(GlobalLevel {
        global_level: shown,
    })
    .into_response())
}

/// `PUT /admin/v1/log-level` applied to `filters`: checks the JSON body ([`SetLogLevel`])
/// and sets the global level; returns the level as shown (400 otherwise).
pub fn put_level(filters: &LogFilters, body: &[u8]) -> Result<String, Refused> {
    let req: SetLogLevel = self::body(body)?;
    filters
        .set_global_level(&req.level)
        .map_err(|e| bad(format!("level: {e}")))
}

async fn logs() -> Result<Response, Refused> {
    let c = control()?;
    let files = match &c.dir {
        Some(dir) => compactor::list(dir, &c.prefix).map_err(|e| {
            Refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("listing {}: {e}", dir.display()),
            )
        })?,
        None => Vec::new(),
    };
    let now = compactor::Clock::now(&SystemClock);
    let s = &c.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Json(Logs {
        dir: c.dir.as_ref().map(|d| d.display().to_string()),
        files: files
            .into_iter()
            .map(|f| LogFile {
                name: f.name,
                size_bytes: f.size_bytes,
                state: match f.state {
                    FileState::Active => "active",
                    FileState::Rotated => "rotated",
                    FileState::Compressed => "compressed",
                }
                .to_owned(),
                modified_ms: f.modified_ms as i64,
            })
            .collect(),
        window: LogWindow {
            start: c.window.start.to_string(),
            end: c.window.end.to_string(),
        },
        in_window: c.window.contains(now.time()),
        idle: s.idle.load(Ordering::Relaxed),
        next_window_start_ms: Some(c.window.next_start(now).timestamp_millis()),
        retention_hours: c.retention_hours.into(),
        written_bytes_total: load(&s.written),
        compressed_bytes_total: load(&s.compressed),
        compressed_files_total: load(&s.compressed_files),
        deleted_files_total: load(&s.deleted_files),
        dropped_lines_total: c.dropped_lines(),
    })
    .into_response())
}

/// Backlog lines sent when the request does not say.
const TAIL_BACKLOG_DEFAULT: u32 = 100;
/// How often an idle tail checks for drops and the node's drain.
const TAIL_TICK: Duration = Duration::from_secs(1);
/// Ticks without a line after which a blank keep-alive line is sent.
const TAIL_KEEPALIVE_TICKS: u32 = 5;
/// Bytes gathered into one chunk of the stream, at most (past it the chunk is sent).
const TAIL_CHUNK_BYTES: usize = 64 * 1024;

/// What `GET /admin/v1/logs/tail` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailQuery {
    /// The user.
    pub uid: String,
    /// Least severe level shown (rank, 1 error .. 5 trace).
    pub level: u8,
    /// Ring events sent first.
    pub backlog: u32,
}

/// Checks the tail's query: `uid` (required, a valid id), `level` (one of the filter
/// levels, default trace: everything the filter keeps), `backlog` (0 to the ring's
/// capacity); any other parameter is refused by name.
pub fn tail_query(q: &HashMap<String, String>, ring: usize) -> Result<TailQuery, Refused> {
    if let Some(k) = q
        .keys()
        .find(|k| !matches!(k.as_str(), "uid" | "level" | "backlog"))
    {
        return Err(bad(format!(
            "{k}: unknown parameter (expected uid, level, backlog)"
        )));
    }
    let uid = q
        .get("uid")
        .ok_or_else(|| bad("uid: required (the user to tail, e.g. ?uid=alice)"))?;
    if !im_proto::valid_id(uid) {
        return Err(bad(format!(
            "uid {uid:?}: use 1-64 characters of A-Z a-z 0-9 _ . @ -"
        )));
    }
    let level = match q.get("level") {
        None => 5,
        Some(l) => logfilter::parse_uid_level(l).ok_or_else(|| {
            bad(format!(
                "level {l:?}: expected one of {}",
                logfilter::UID_LEVELS.join(", ")
            ))
        })?,
    };
    let max = u32::try_from(ring).unwrap_or(u32::MAX);
    let backlog = param(q, "backlog", TAIL_BACKLOG_DEFAULT.min(max), 0..=max)?;
    Ok(TailQuery {
        uid: uid.clone(),
        level,
        backlog,
    })
}

/// One event as its NDJSON line (with the newline).
fn tail_line(e: &TailEvent, backlog: bool, out: &mut Vec<u8>) {
    let line = LogTailLine {
        dropped: None,
        seq: e.seq,
        ts_ms: e.ts_ms,
        level: e.level_name().to_owned(),
        target: e.target.to_owned(),
        uid: e.uid.to_string(),
        message: e.message.clone(),
        fields: e
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        backlog,
    };
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}

/// The `{"dropped": N}` line, when events were dropped since the last one.
fn dropped_line(sub: &Subscription, out: &mut Vec<u8>) {
    let n = sub.take_dropped();
    if n > 0 {
        out.extend_from_slice(format!("{{\"dropped\":{n}}}\n").as_bytes());
    }
}

/// The state of one tail's stream.
struct TailStream {
    sub: Subscription,
    backlog: std::vec::IntoIter<Arc<TailEvent>>,
    tick: tokio::time::Interval,
    idle_ticks: u32,
    draining: Arc<std::sync::atomic::AtomicBool>,
}

impl TailStream {
    /// The next chunk: backlog lines first, then live events (each chunk what is queued,
    /// up to [`TAIL_CHUNK_BYTES`]), a dropped count when there is one, a blank line after
    /// a quiet spell; `None` (the end) once the node drains.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let mut out = Vec::new();
        for e in self.backlog.by_ref() {
            tail_line(&e, true, &mut out);
            if out.len() >= TAIL_CHUNK_BYTES {
                return Some(out.into());
            }
        }
        if !out.is_empty() {
            return Some(out.into());
        }
        loop {
            if self.draining.load(Ordering::Relaxed) {
                return None;
            }
            tokio::select! {
                e = self.sub.recv() => {
                    let e = e?;
                    tail_line(&e, false, &mut out);
                    while out.len() < TAIL_CHUNK_BYTES {
                        match self.sub.try_recv() {
                            Some(e) => tail_line(&e, false, &mut out),
                            None => break,
                        }
                    }
                    dropped_line(&self.sub, &mut out);
                }
                _ = self.tick.tick() => {
                    dropped_line(&self.sub, &mut out);
                    self.idle_ticks += 1;
                    if out.is_empty() && self.idle_ticks >= TAIL_KEEPALIVE_TICKS {
                        out.push(b'\n');
                    }
                }
            }
            if !out.is_empty() {
                self.idle_ticks = 0;
                return Some(out.into());
            }
        }
    }
}

/// `GET /admin/v1/logs/tail`: streams the tailed user's events as NDJSON
/// ([`LogTailLine`]): first up to `backlog` of the ring's, then live ones, until the
/// client goes away or the node drains. The user must have a log filter (409 otherwise:
/// nothing of theirs is kept without one); at most `log.max_tails` at once (429). The
/// admin listener's header timeout does not apply once the answer has started.
async fn tail(
    State(node): State<Arc<Node>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, Refused> {
    let c = control()?;
    let tq = tail_query(&q, c.tail.capacity())?;
    if c.filters.level_of(&tq.uid).is_none() {
        return Err(Refused(
            StatusCode::CONFLICT,
            format!(
                "uid {:?} has no log filter: set one first (PUT /admin/v1/log-filters/{}); \
                 the tail shows only filtered users' events",
                tq.uid, tq.uid
            ),
        ));
    }
    let mut sub = c
        .tail
        .subscribe(&tq.uid, tq.level, tq.backlog as usize)
        .map_err(|e| Refused(StatusCode::TOO_MANY_REQUESTS, e.to_string()))?;
    tracing::info!(tail_of = %tq.uid, level = logfilter::level_name(tq.level), backlog = tq.backlog, "log tail opened");
    let mut tick = tokio::time::interval(TAIL_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = TailStream {
        backlog: sub.take_backlog().into_iter(),
        sub,
        tick,
        idle_ticks: 0,
        draining: node.draining.clone(),
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        let chunk = s.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), s))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::logfilter::LevelSpec;

    fn filters() -> Arc<LogFilters> {
        LogFilters::new(LevelSpec::parse("info").expect("info parses"), true, 4)
    }

    #[test]
    fn bad_bodies_are_refused_naming_the_field() {
        let f = filters();
        for (body, name) in [
            (r#"{"level":"loud"}"#, "level"),
            (r#"{"level":5}"#, "level"),
            (r#"{"ttl_secs":5}"#, "level"),
            (r#"{"level":"debug","ttl_secs":0}"#, "ttl_secs"),
            (r#"{"level":"debug","ttl_secs":1.5}"#, "ttl_secs"),
            (r#"{"level":"debug","ttl":5}"#, "ttl"),
            (r#"["debug", 5]"#, "body"),
            ("not json", "body"),
        ] {
            let r = put_filter(&f, "alice", body.as_bytes()).expect_err(body);
            assert_eq!(r.0, StatusCode::BAD_REQUEST, "{body}");
            assert!(r.1.contains(name), "{body}: {}", r.1);
        }
        let info = put_filter(&f, "alice", br#"{"level":"debug","ttl_secs":null}"#).unwrap();
        assert_eq!((info.level, info.ttl_secs), ("debug", TTL_DEFAULT));
        for body in [r#"{"level":"info","extra":1}"#, r#"{}"#, r#"{"level":3}"#] {
            let r = put_level(&f, body.as_bytes()).expect_err(body);
            assert_eq!(r.0, StatusCode::BAD_REQUEST, "{body}");
        }
        assert_eq!(put_level(&f, br#"{"level":"debug"}"#).unwrap(), "debug");
    }

    #[test]
    fn tail_queries_are_checked_naming_the_parameter() {
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            tail_query(&q(&[("uid", "alice")]), 4096).unwrap(),
            TailQuery {
                uid: "alice".into(),
                level: 5,
                backlog: 100
            }
        );
        assert_eq!(
            tail_query(&q(&[("uid", "a"), ("level", "warn"), ("backlog", "0")]), 50).unwrap(),
            TailQuery {
                uid: "a".into(),
                level: 2,
                backlog: 0
            }
        );
        assert_eq!(tail_query(&q(&[("uid", "a")]), 50).unwrap().backlog, 50);
        for (pairs, name) in [
            (vec![], "uid"),
            (vec![("uid", "a b")], "uid"),
            (vec![("uid", "")], "uid"),
            (vec![("uid", "a"), ("level", "loud")], "level"),
            (vec![("uid", "a"), ("backlog", "5000")], "backlog"),
            (vec![("uid", "a"), ("backlog", "-1")], "backlog"),
            (vec![("uid", "a"), ("since", "1")], "since"),
        ] {
            let r = tail_query(&q(&pairs), 4096).expect_err(name);
            assert_eq!(r.0, StatusCode::BAD_REQUEST);
            assert!(r.1.starts_with(name), "{pairs:?}: {}", r.1);
        }
    }
}
