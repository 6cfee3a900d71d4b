//! The before-send hook: one signed HTTP POST to the application's backend per Send,
//! after validation and before the hand-off to the writer, answered allow, reject (the
//! sender gets `REJECTED_BY_HOOK` with the reason) or replace (the new payload is what is
//! stored and delivered). Every call runs under `hooks.before_send.timeout_ms`; a call
//! that fails (timeout, connection, status, a bad answer), or is not made because the
//! circuit breaker (`breaker`) is open or `max_in_flight` calls are out, is decided by
//! `on_error`: `fail_open` delivers the message unchecked, `fail_closed` refuses it with
//! a retry hint. Metrics `im_hook_*{hook="before_send"}`, breaker changes logged at WARN.
//!
//! The pipeline awaits the call inside the connection's frame loop, so one connection's
//! Sends are asked, stored and acked in the order they were sent; the cost is that a
//! connection handles one Send per hook round trip (docs/before-send.md).

pub mod breaker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use im_admin_api::{
    BeforeSendAction, BeforeSendAnswer, BeforeSendRequest, HookStatus, MAX_REASON_BYTES,
};
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use self::breaker::{Breaker, Change, Permit, State};
use super::sign::{Signer, HEADER_EVENT_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use crate::config::BeforeSendConfig;

/// The `hook` label of this hook's metrics.
pub const HOOK: &str = "before_send";

/// The `outcome` labels of `im_hook_outcomes_total`, in [`Outcome`] order.
pub const OUTCOMES: [&str; 9] = crate::obs::HOOK_OUTCOMES;

/// Most bytes of an answer read (an answer carries at most one replaced payload).
const ANSWER_OVERHEAD: usize = 16 * 1024;

/// How one Send's question ended (the index into [`OUTCOMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allow,
    Reject,
    Replace,
    Timeout,
    Error,
    Status,
    BadAnswer,
    BreakerOpen,
    Busy,
}

/// What the pipeline does with the Send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Store it as sent.
    Allow,
    /// Store this payload instead.
    Replace(Vec<u8>),
    /// Refuse it with `REJECTED_BY_HOOK` and this reason (bounded, may be empty).
    Reject(String),
    /// The hook could not answer and `on_error` is `fail_closed`: refuse it, retryable.
    Unavailable {
        /// Why, in a word (`timeout`, `error`, `status`, `bad_answer`, `breaker_open`, `busy`).
        why: &'static str,
        /// Retry hint, ms.
        retry_after_ms: u32,
    },
}

/// One Send as the hook is asked about it.
#[derive(Debug)]
pub struct Ask<'a> {
    /// The id the message gets if stored.
    pub msg_id: &'a str,
    /// Its conversation.
    pub conversation_id: &'a str,
    /// The sender.
    pub sender: &'a str,
    /// The sender's device.
    pub device_id: &'a str,
    /// One-to-one recipient.
    pub to_user: Option<&'a str>,
    /// Group.
    pub group_id: Option<&'a str>,
    /// The wire message type.
    pub msg_type: i32,
    /// The client's id of the send.
    pub client_msg_id: &'a str,
    /// The payload as sent.
    pub payload: &'a [u8],
}

/// Errors building the hook from its config.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The secret file could not be used.
    #[error("hooks.before_send.secret_file {path}: {message}")]
    SecretFile {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error("hooks.before_send: cannot build the HTTP client: {0}")]
    Client(String),
}

/// The hook's metric handles, looked up once.
struct HookMetrics {
    calls: Counter,
    latency: Histogram,
    outcomes: [Counter; OUTCOMES.len()],
    breaker_state: Gauge,
    breaker_opened: Counter,
    in_flight: Gauge,
}

/// Running totals for the overview.
#[derive(Default)]
struct Totals {
    calls: AtomicU64,
    failures: AtomicU64,
    skipped: AtomicU64,
    opened: AtomicU64,
}

/// The configured before-send hook of a node.
pub struct BeforeSend {
    client: reqwest::Client,
    url: String,
    endpoint: String,
    signer: Signer,
    timeout: Duration,
    fail_closed: bool,
    cooldown_ms: u32,
    max_payload: usize,
    breaker: Mutex<Breaker>,
    slots: Arc<tokio::sync::Semaphore>,
    max_in_flight: usize,
    metrics: HookMetrics,
    totals: Totals,
}

impl std::fmt::Debug for BeforeSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeSend")
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.timeout)
            .field("fail_closed", &self.fail_closed)
            .finish_non_exhaustive()
    }
}

impl BeforeSend {
    /// The hook of `cfg` (validated), or `None` when no hook is configured. A replaced
    /// payload may be at most `max_payload` bytes (the client's own bound).
    pub fn from_config(
        cfg: &BeforeSendConfig,
        max_payload: usize,
    ) -> Result<Option<Arc<Self>>, HookError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let secret = if cfg.secret_file.trim().is_empty() {
            cfg.secret.clone()
        } else {
            read_secret_file(cfg.secret_file.trim())?
        };
        let timeout = Duration::from_millis(cfg.timeout_ms.into());
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .connect_timeout(timeout)
            .pool_max_idle_per_host(cfg.max_in_flight as usize)
            .pool_idle_timeout(Duration::from_secs(60));
        let client = crate::hooks::tls::with_tls(client, &cfg.ca_file)
            .map_err(|e| HookError::Client(format!("hooks.before_send.ca_file: {e}")))?
            .build()
            .map_err(|e| HookError::Client(e.to_string()))?;
        let url = cfg.url.trim().to_owned();
        let label = |c: &'static str| counter!(c, "hook" => HOOK);
        let metrics = HookMetrics {
            calls: label("im_hook_calls_total"),
            latency: histogram!("im_hook_latency_seconds", "hook" => HOOK),
            outcomes: OUTCOMES
                .map(|o| counter!("im_hook_outcomes_total", "hook" => HOOK, "outcome" => o)),
            breaker_state: gauge!("im_hook_breaker_state", "hook" => HOOK),
            breaker_opened: label("im_hook_breaker_opened_total"),
            in_flight: gauge!("im_hook_in_flight", "hook" => HOOK),
        };
        gauge!("im_hook_configured", "hook" => HOOK).set(1.0);
        Ok(Some(Arc::new(BeforeSend {
            client,
            endpoint: endpoint_of(&url),
            url,
            signer: Signer::new(secret.as_bytes()),
            timeout,
            fail_closed: cfg.fails_closed(),
            cooldown_ms: cfg.breaker_cooldown_ms,
            max_payload,
            breaker: Mutex::new(Breaker::new(
                cfg.breaker_failures,
                Duration::from_millis(cfg.breaker_window_ms.into()),
                Duration::from_millis(cfg.breaker_cooldown_ms.into()),
            )),
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight as usize)),
            max_in_flight: cfg.max_in_flight as usize,
            metrics,
            totals: Totals::default(),
        })))
    }

    /// Asks the hook about one Send and says what to do with it.
    pub async fn check(&self, ask: &Ask<'_>) -> Verdict {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return self.not_asked(Outcome::Busy);
        };
        let permit = self.lock().permit(Instant::now());
        let probe = match permit {
            Permit::Call => false,
            Permit::Probe => {
                self.set_state(State::HalfOpen);
                true
            }
            Permit::Refused => return self.not_asked(Outcome::BreakerOpen),
        };
        self.metrics.in_flight.increment(1.0);
        self.totals.calls.fetch_add(1, Ordering::Relaxed);
        self.metrics.calls.increment(1);
        // Settles the call when it ends, or when the Send is dropped mid-call (the
        // connection closed): a probe must never stay out for ever.
        let mut settle = Settle {
            hook: self,
            probe,
            ok: false,
            _slot: slot,
        };
        let started = Instant::now();
        let result = self.call(ask).await;
        self.metrics.latency.record(started.elapsed().as_secs_f64());
        settle.ok = result.is_ok();
        drop(settle);
        match result {
            Ok(verdict) => {
                let outcome = match verdict {
                    Verdict::Allow => Outcome::Allow,
                    Verdict::Replace(_) => Outcome::Replace,
                    _ => Outcome::Reject,
                };
                self.metrics.outcomes[outcome as usize].increment(1);
                verdict
            }
            Err((outcome, detail)) => {
                self.totals.failures.fetch_add(1, Ordering::Relaxed);
                self.metrics.outcomes[outcome as usize].increment(1);
                tracing::debug!(
                    hook = HOOK,
                    outcome = OUTCOMES[outcome as usize],
                    detail = %detail,
                    msg_id = ask.msg_id,
                    "before-send hook call failed"
                );
                self.on_error(outcome)
            }
        }
    }

    /// The hook's state for the overview.
    pub fn status(&self) -> HookStatus {
        let state = self.lock().state(Instant::now());
        HookStatus {
            hook: HOOK.to_owned(),
            endpoint: self.endpoint.clone(),
            on_error: if self.fail_closed {
                "fail_closed"
            } else {
                "fail_open"
            }
            .to_owned(),
            breaker: state.name().to_owned(),
            breaker_opened_total: self.totals.opened.load(Ordering::Relaxed),
            calls_total: self.totals.calls.load(Ordering::Relaxed),
            failures_total: self.totals.failures.load(Ordering::Relaxed),
            skipped_total: self.totals.skipped.load(Ordering::Relaxed),
            in_flight: (self.max_in_flight - self.slots.available_permits().min(self.max_in_flight))
                as u64,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Breaker> {
        // The breaker's state stays consistent whatever a panicking holder did.
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A Send the hook was not asked about (`breaker_open`, `busy`).
    fn not_asked(&self, outcome: Outcome) -> Verdict {
        self.totals.skipped.fetch_add(1, Ordering::Relaxed);
        self.metrics.outcomes[outcome as usize].increment(1);
        self.on_error(outcome)
    }

    fn on_error(&self, outcome: Outcome) -> Verdict {
        if !self.fail_closed {
            return Verdict::Allow;
        }
        Verdict::Unavailable {
            why: OUTCOMES[outcome as usize],
            retry_after_ms: match outcome {
                Outcome::BreakerOpen => self.cooldown_ms,
                _ => 1000,
            },
        }
    }

    fn set_state(&self, state: State) {
        self.metrics.breaker_state.set(state.gauge());
    }

    fn on_change(&self, change: Change) {
        match change {
            Change::None => {}
            Change::Opened => {
                self.totals.opened.fetch_add(1, Ordering::Relaxed);
                self.metrics.breaker_opened.increment(1);
                self.set_state(State::Open);
                tracing::warn!(
                    hook = HOOK,
                    endpoint = %self.endpoint,
                    on_error = if self.fail_closed { "fail_closed" } else { "fail_open" },
                    cooldown_ms = self.cooldown_ms,
                    "before-send hook breaker opened: the hook keeps failing and is not called until a probe succeeds"
                );
            }
            Change::Closed => {
                self.set_state(State::Closed);
                tracing::info!(
                    hook = HOOK,
                    endpoint = %self.endpoint,
                    "before-send hook breaker closed: the probe call succeeded"
                );
            }
        }
    }

    /// One signed POST and its answer, under the timeout.
    async fn call(&self, ask: &Ask<'_>) -> Result<Verdict, (Outcome, String)> {
        let body = serde_json::to_vec(&request_of(ask))
            .map_err(|e| (Outcome::Error, format!("encoding the request: {e}")))?;
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let sig = self.signer.sign(ts, &body);
        let send = async {
            let resp = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(HEADER_EVENT_ID, ask.msg_id)
                .header(HEADER_TIMESTAMP, ts.to_string())
                .header(HEADER_SIGNATURE, sig)
                .body(body)
                .send()
                .await
                .map_err(|e| (Outcome::Error, e.to_string()))?;
            let status = resp.status();
            if status != reqwest::StatusCode::OK {
                return Err((Outcome::Status, format!("HTTP {status}")));
            }
            read_bounded(resp, self.max_payload * 2 + ANSWER_OVERHEAD).await
        };
        let bytes = tokio::time::timeout(self.timeout, send)
            .await
            .map_err(|_| {
                (
                    Outcome::Timeout,
                    format!("no answer within {:?}", self.timeout),
                )
            })??;
        let answer: BeforeSendAnswer = serde_json::from_slice(&bytes)
            .map_err(|e| (Outcome::BadAnswer, format!("answer: {e}")))?;
        verdict_of(answer, self.max_payload).map_err(|e| (Outcome::BadAnswer, e))
    }
}

/// The request body of `ask`.
fn request_of(ask: &Ask<'_>) -> BeforeSendRequest {
    let msg_type = im_proto::MessageType::try_from(ask.msg_type)
        .map(|t| t.as_str_name().to_ascii_lowercase())
        .unwrap_or_default();
    BeforeSendRequest {
        msg_id: ask.msg_id.to_owned(),
        conversation_id: ask.conversation_id.to_owned(),
        sender: ask.sender.to_owned(),
        device_id: ask.device_id.to_owned(),
        to_user: ask.to_user.map(str::to_owned),
        group_id: ask.group_id.map(str::to_owned),
        msg_type,
        client_msg_id: ask.client_msg_id.to_owned(),
        payload_b64: base64::engine::general_purpose::STANDARD.encode(ask.payload),
        text: std::str::from_utf8(ask.payload).ok().map(str::to_owned),
        received_at_ms: u64::try_from(im_proto::now_ms()).unwrap_or_default(),
    }
}

/// What an answer means, checked: a replaced payload within `max_payload`, the reason cut
/// to [`MAX_REASON_BYTES`].
fn verdict_of(answer: BeforeSendAnswer, max_payload: usize) -> Result<Verdict, String> {
    match answer.action {
        BeforeSendAction::Allow => Ok(Verdict::Allow),
        BeforeSendAction::Reject => Ok(Verdict::Reject(bounded_reason(
            answer.reason.as_deref().unwrap_or_default(),
        ))),
        BeforeSendAction::Replace => {
            let payload = match (answer.payload_b64, answer.text) {
                (Some(b64), _) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| format!("replace: payload_b64 is not base64: {e}"))?,
                (None, Some(text)) => text.into_bytes(),
                (None, None) => return Err("replace without payload_b64 or text".into()),
            };
            if payload.len() > max_payload {
                return Err(format!(
                    "replace: payload of {} bytes is over the {max_payload}-byte limit",
                    payload.len()
                ));
            }
            Ok(Verdict::Replace(payload))
        }
    }
}

/// `reason` cut to at most [`MAX_REASON_BYTES`] at a character boundary, control
/// characters replaced by spaces (it reaches the sender's screen and the log).
pub fn bounded_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_REASON_BYTES));
    for c in reason.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_REASON_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// The answer's body, refusing one over `cap` bytes.
async fn read_bounded(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, (Outcome, String)> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err((Outcome::BadAnswer, format!("answer over {cap} bytes")));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| (Outcome::Error, e.to_string()))?
    {
        if out.len() + chunk.len() > cap {
            return Err((Outcome::BadAnswer, format!("answer over {cap} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// One call in flight: on drop it frees its slot and tells the breaker how it went.
struct Settle<'a> {
    hook: &'a BeforeSend,
    probe: bool,
    ok: bool,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.hook.metrics.in_flight.decrement(1.0);
        let change = self.hook.lock().record(Instant::now(), self.ok, self.probe);
        self.hook.on_change(change);
    }
}

/// `http://host:port` of `url`, without path or credentials (for the overview and logs).
fn endpoint_of(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    format!("http://{host}")
}

/// Reads a secret file: it must exist, be private (no group or world bits) and hold at
/// least 32 bytes once trimmed.
fn read_secret_file(path: &str) -> Result<String, HookError> {
    let err = |message: String| HookError::SecretFile {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| err(e.to_string()))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(err(format!(
                "has mode {mode:o}: it must not be readable by group or others (chmod 600)"
            )));
        }
    }
    let secret = text.trim().to_owned();
    if secret.len() < crate::config::MIN_SECRET_BYTES {
        return Err(err(format!(
            "holds {} bytes: a secret must be at least {} bytes",
            secret.len(),
            crate::config::MIN_SECRET_BYTES
        )));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_verdicts_within_bounds() {
        let a = |json: &str| serde_json::from_str::<BeforeSendAnswer>(json).unwrap();
        assert_eq!(
            verdict_of(a(r#"{"action":"allow"}"#), 10),
            Ok(Verdict::Allow)
        );
        assert_eq!(
            verdict_of(a(r#"{"action":"replace","text":"hi"}"#), 10),
            Ok(Verdict::Replace(b"hi".to_vec()))
        );
        assert_eq!(
            verdict_of(
                a(r#"{"action":"replace","payload_b64":"aGk=","text":"x"}"#),
                10
            ),
            Ok(Verdict::Replace(b"hi".to_vec()))
        );
        assert!(verdict_of(a(r#"{"action":"replace","text":"far too long"}"#), 10).is_err());
        assert!(verdict_of(a(r#"{"action":"replace"}"#), 10).is_err());
        assert!(verdict_of(a(r#"{"action":"replace","payload_b64":"@@"}"#), 10).is_err());
        let long = "é".repeat(400);
        let Ok(Verdict::Reject(r)) = verdict_of(
            a(&format!(r#"{{"action":"reject","reason":"{long}"}}"#)),
            10,
        ) else {
            panic!("expected a rejection");
        };
        assert!(r.len() <= MAX_REASON_BYTES && r.len() >= MAX_REASON_BYTES - 1);
        assert_eq!(bounded_reason("a\nb\u{1b}[31m"), "a b [31m");
    }

    #[test]
    fn a_secret_file_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hook_secret");
        std::fs::write(&path, format!("{}\n", "k".repeat(40))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = path.to_str().unwrap();
        let e = read_secret_file(p).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("secret_file"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file(p).unwrap(), "k".repeat(40));
        std::fs::write(&path, "short").unwrap();
        let e = read_secret_file(p).unwrap_err().to_string();
        assert!(e.contains("at least 32 bytes"), "{e}");
        assert!(read_secret_file("/nonexistent/secret").is_err());
    }

    #[test]
    fn the_endpoint_shows_no_path_or_credentials() {
        assert_eq!(endpoint_of("http://u:p@h:9/x?y"), "http://h:9");
        assert_eq!(endpoint_of("http://h:9"), "http://h:9");
    }
}
